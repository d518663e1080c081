"""A run's first process, started before the run: the slow part of a start taken off the dispatch path.

Starting a run's process the plain way costs a fork of the runner (a Ray worker with hundreds of
MiB mapped) and the child's moves into the run's cgroups (v2, and the v1 ``pids`` directory), and
each move waits for an RCU grace period in the kernel (about 10 to 20 ms, unless the cgroup v2
hierarchy is mounted with ``favordynmods``). That was most of a host's start, and a host's start
is most of a job's dispatch. A runner made with ``spare=True`` (the executor's are) therefore
keeps one process started ahead, in cgroups of its own, in a session of its own, with
``PR_SET_PDEATHSIG`` and umask 077 set (``contain.Box.preexec``), waiting on its standard input.
A run that starts on the host takes it over (:meth:`Spare.become`): the runner sends the run's
argv, environment and open-files limit, and the spare lowers the limit, restores the signals
Python ignores, and ``exec``s the run's first program (bubblewrap or ``jobstart``) in place, so
the run keeps the spare's pid, session and cgroups. Nothing of the job runs before that exec.

The spare is this file run as a script, ``python -I -S spare.py``: the standard library only, no
site packages, no environment, so nothing a job or the host's environment names runs in it.

What it reads: 10 ASCII digits, the length of the JSON that follows: ``{"argv": [...], "env":
{...}, "nofile": [soft, hard] or null, "stdin": bool}``. ``stdin`` false: its standard input
becomes ``/dev/null`` (true: what the runner writes next, the uploaded package, is the run's).
End of input before a whole request: it exits 0 (the runner retired it). An exec that fails:
one line ``tpufleet: cannot start this job: ...`` on its output (the run's log) and exit 127, as
``jobstart`` says it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tpufleet.host.contain import Box
    from tpufleet.host.runlimits import RunGuard

PROGRAM = os.path.abspath(__file__)
_HEADER = 10
CANNOT_START = 127


class Spare:
    """One process started ahead of a run, in ``box`` and ``guard``'s cgroups (made by the runner)."""

    def __init__(self, name: str, box: Box, guard: RunGuard, preexec: Callable[[], None]) -> None:
        from tpufleet.tpudevice import SPARE_MARK  # here: the spare itself imports nothing of tpufleet

        self.name, self.box, self.guard = name, box, guard  # ``name``: its cgroups' (the sweep keeps it)
        # Started by a thread that outlives it: PR_SET_PDEATHSIG fires when the forking thread ends.
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", PROGRAM, SPARE_MARK],  # the mark: a host's device page skips it
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
        body = json.dumps({"argv": list(argv), "env": dict(env), "nofile": nofile, "stdin": stdin}).encode()
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"%0*d" % (_HEADER, len(body)) + body)
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


def _read(n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        part = os.read(0, n - len(data))
        if not part:
            return None
        data += part
    return data


def _main() -> None:
    head = _read(_HEADER)
    body = _read(int(head)) if head is not None and head.isdigit() else None
    if body is None:
        os._exit(0)
    try:
        run = json.loads(body)
        if run["nofile"] is not None:
            import resource

            resource.setrlimit(resource.RLIMIT_NOFILE, tuple(run["nofile"]))
        if not run["stdin"]:
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.close(null)
        for sig in ("SIGPIPE", "SIGXFZ", "SIGXFSZ"):  # as subprocess's restore_signals does
            if hasattr(signal, sig):
                signal.signal(getattr(signal, sig), signal.SIG_DFL)
        os.execvpe(run["argv"][0], run["argv"], run["env"])
    except Exception as exc:
        os.write(
            1, f"tpufleet: cannot start this job: {type(exc).__name__}: {exc}\n".encode(errors="replace")
        )
    os._exit(CANNOT_START)


if __name__ == "__main__":
    _main()
