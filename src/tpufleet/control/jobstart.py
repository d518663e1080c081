"""The first program of every job process: ``python -m tpufleet.control.jobstart PATHS -- COMMAND``.

The runner starts it already inside the run's cgroup and as the tenant's identity (see
``contain.Box.preexec``). It makes the run's directories (``jobfiles.make_run_dirs``), unpacks the
uploaded package read from its standard input (so the bytes never touch a path another user could
reach), changes into the working directory and ``exec``s the job's command in its place (same pid,
so stop signals and ``PR_SET_PDEATHSIG`` apply to the command). Anything that goes wrong is one line
on the job's log and exit code 127: a missing program, a NUL byte in an argument, an unsafe package.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tpufleet.control.jobfiles import MAX_UNPACKED, JobFilesError, RunPaths, make_run_dirs, unpack

CANNOT_START = 127


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m tpufleet.control.jobstart PATHS_JSON -- COMMAND...", file=sys.stderr)
        return 2
    spec, command = json.loads(argv[0]), argv[2:]
    paths = RunPaths(*(Path(spec[k]) for k in ("tenant", "checkpoint", "run", "workdir", "home")))
    try:
        make_run_dirs(paths)
        if spec.get("package"):
            unpack(sys.stdin.buffer.read(), paths.workdir, int(spec.get("max_unpacked") or MAX_UNPACKED))
        _stdin_from_devnull()
        os.chdir(paths.workdir)
        os.execvpe(command[0], command, os.environ.copy())
    except (OSError, ValueError, JobFilesError) as exc:  # ValueError: NUL bytes in argv or env
        print(f"tpufleet: cannot start {command[:1]}: {exc}", flush=True)
        return CANNOT_START
    return CANNOT_START  # not reached: exec replaced this process


def _stdin_from_devnull() -> None:
    fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(fd, 0)
    os.close(fd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
