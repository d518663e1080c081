"""A run's first process, started before the run: the slow part of a start taken off the dispatch path.

Starting a run's process the plain way costs a fork of the runner (a Ray worker with hundreds of
MiB mapped) and the child's moves into the run's cgroups (v2, and the v1 ``pids`` directory), and
each move waits for an RCU grace period in the kernel (about 10 to 20 ms, unless the cgroup v2
hierarchy is mounted with ``favordynmods``). That was most of a host's start, and a host's start
is most of a job's dispatch. A runner made with ``spare=True`` (the executor's are) therefore
keeps one process started ahead, in cgroups of its own, in a session of its own, with
``PR_SET_PDEATHSIG`` and umask 077 set (``contain.Box.preexec``), running ``sparewait.py`` (the
standard library's ``os`` and ``signal`` only, no site packages, no environment) and waiting on a
pipe only the runner holds. A run that starts on the host takes it over (:meth:`Spare.become`):
the runner sends the run's argv, environment and open-files limit, and the spare lowers the
limit, restores the signals Python ignores, and ``exec``s the run's first program (bubblewrap or
``jobstart``) in place, so the run keeps the spare's pid, session and cgroups. Nothing of the job
runs before that exec.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from tpufleet.host import sparewait
from tpufleet.tpudevice import spare_argv

if TYPE_CHECKING:
    from tpufleet.host.contain import Box
    from tpufleet.host.runlimits import RunGuard


class Spare:
    """One process started ahead of a run, in ``box`` and ``guard``'s cgroups (made by the runner)."""

    def __init__(self, name: str, box: Box, guard: RunGuard, preexec: Callable[[], None]) -> None:
        self.name, self.box, self.guard = name, box, guard  # ``name``: its cgroups' (the sweep keeps it)
        # Started by a thread that outlives it: PR_SET_PDEATHSIG fires when the forking thread ends.
        self.proc = subprocess.Popen(
            spare_argv(sys.executable),  # how a host's device page tells it from a job's process
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,  # the run's output once it took the spare over
            stderr=subprocess.STDOUT,
            env={},
            start_new_session=True,
            preexec_fn=preexec,
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def become(
        self, argv: Sequence[str], env: Mapping[str, str], nofile: tuple[int, int] | None, stdin: bool
    ) -> None:
        """Hand the spare its run: it ``exec``s ``argv`` with ``env``. Raises ``ValueError`` for
        what ``subprocess`` would refuse (a NUL byte, ``=`` in a variable's name) before anything is
        sent, and ``OSError`` when the spare is gone (the caller starts the run the plain way)."""
        _check(argv, env)
        request = sparewait.encode(
            [os.fsencode(a) for a in argv],
            {os.fsencode(k): os.fsencode(v) for k, v in env.items()},
            nofile,
            stdin,
        )
        assert self.proc.stdin is not None
        self.proc.stdin.write(request)
        self.proc.stdin.flush()
        if not stdin:
            self.proc.stdin.close()

    def retire(self) -> None:
        """End the spare unused and remove its cgroups."""
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()  # it exits 0 at the end of its input
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.box.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.box.close()
        self.guard.close()


def _check(argv: Sequence[str], env: Mapping[str, str]) -> None:
    """What ``subprocess.Popen`` refuses before it starts anything, refused the same way."""
    if not argv:
        raise ValueError("no program to run")
    for arg in argv:
        if "\0" in arg:
            raise ValueError("embedded null byte")
    for key, value in env.items():
        if "\0" in key or "\0" in value:
            raise ValueError("embedded null byte")
        if not key or "=" in key:
            raise ValueError("illegal environment variable name")
