"""The first program of every job process: ``python -m tpufleet.host.jobstart PATHS -- COMMAND``.

The runner starts it already inside the run's cgroup and as the tenant's identity (see
``contain.Box.preexec``). It makes the run's directories (``jobfiles.make_run_dirs``), unpacks the
uploaded package read from its standard input (so the bytes never touch a path another user could
reach), changes into the working directory and ``exec``s the job's command in its place (same pid,
so stop signals and ``PR_SET_PDEATHSIG`` apply to the command). Anything that goes wrong is one line
on the job's log and, as a shell would say it, exit code 126 for a program that is there but cannot
be executed (no permission, not an executable, a directory) and 127 for anything else: a missing
program, a NUL byte in an argument, an unsafe or damaged package ("tpufleet: cannot start this job:
the package ..."), never a traceback. The control plane fails a job whose every host exits 126 or
127 without retrying it (``scheduler/attempts.py``).
"""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path

from tpufleet.host.jobfiles import MAX_UNPACKED, JobFilesError, RunPaths, make_run_dirs, unpack
from tpufleet.host.sparewait import default_signals

CANNOT_START = 127
NOT_EXECUTABLE = 126
_NOT_EXECUTABLE_ERRNOS = frozenset({errno.EACCES, errno.ENOEXEC, errno.EISDIR, errno.EPERM})


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m tpufleet.host.jobstart PATHS_JSON -- COMMAND...", file=sys.stderr)
        return 2
    command = argv[2:]
    try:
        spec = json.loads(argv[0])
        paths = RunPaths(*(Path(spec[k]) for k in ("tenant", "checkpoint", "run", "workdir", "home")))
        make_run_dirs(paths)
        if spec.get("package"):
            unpack(sys.stdin.buffer.read(), paths.workdir, int(spec.get("max_unpacked") or MAX_UNPACKED))
    except Exception as exc:  # whatever it is, one line: no traceback, no path beyond the job's own
        return _cannot("this job", exc)
    try:
        _stdin_from_devnull()
        os.chdir(paths.workdir)
    except Exception as exc:
        return _cannot("this job", exc)
    try:
        default_signals()  # the command's, not Python's
        os.execvpe(command[0], command, os.environ.copy())
    except Exception as exc:  # OSError: no such program; ValueError: NUL bytes in argv or env
        code = _cannot(str(command[:1]), exc)
        return NOT_EXECUTABLE if isinstance(exc, OSError) and exc.errno in _NOT_EXECUTABLE_ERRNOS else code
    return CANNOT_START  # not reached: exec replaced this process


def _cannot(what: str, exc: Exception) -> int:
    said = str(exc) if isinstance(exc, (OSError, JobFilesError)) else f"{type(exc).__name__}: {exc}"
    print(f"tpufleet: cannot start {what}: {' '.join(said.split())[:500]}", flush=True)
    return CANNOT_START


def _stdin_from_devnull() -> None:
    fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(fd, 0)
    os.close(fd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
