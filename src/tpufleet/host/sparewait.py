"""What a spare runs (``spare.py``): wait for its run on standard input, then ``exec`` it in place.

Run as ``python -I -S sparewait.py``: no site packages, no environment, and nothing imported
beyond ``os``, ``signal`` and ``resource``, so a spare costs a bare interpreter's start (about
10 ms of CPU) and nothing a job or the host's environment names runs in it.

What it reads (:func:`encode` writes it): 10 ASCII digits, the length of the body that follows;
the body is NUL-separated fields (no field can hold a NUL: the runner refuses those first, as
``subprocess`` does): the open-files limit's soft and hard values (empty: keep the current one),
``1`` or ``0`` (``0``: standard input becomes ``/dev/null``; ``1``: what the runner writes next,
the uploaded package, is the run's), the number of arguments, the arguments, then ``NAME=VALUE``
for each environment variable. End of input before a whole request: exit 0 (the runner retired
the spare). An exec that fails: one line ``tpufleet: cannot start this job: ...`` on its output
(the run's log) and exit 127, as ``jobstart`` says it.
"""

from __future__ import annotations

import os
import signal

HEADER = 10
CANNOT_START = 127


def encode(argv: list[bytes], env: dict[bytes, bytes], nofile: tuple[int, int] | None, stdin: bool) -> bytes:
    """The request for ``argv`` with ``env`` (already checked for NUL bytes), header included."""
    soft, hard = (b"%d" % nofile[0], b"%d" % nofile[1]) if nofile else (b"", b"")
    fields = [
        soft,
        hard,
        b"1" if stdin else b"0",
        b"%d" % len(argv),
        *argv,
        *(k + b"=" + v for k, v in env.items()),
    ]
    body = b"\0".join(fields)
    return b"%0*d" % (HEADER, len(body)) + body


def default_signals() -> None:
    """Python ignores SIGPIPE and SIGXFSZ from its start, and an exec hands ignored signals on: what
    is exec'd next gets the defaults a shell would give it (``yes | head`` ends ``yes`` by SIGPIPE).
    Here and in ``jobstart``, the two Python programs that exec a job's."""
    for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)


def _read(n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        part = os.read(0, n - len(data))
        if not part:
            return None
        data += part
    return data


def main() -> None:
    head = _read(HEADER)
    body = _read(int(head)) if head is not None and head.isdigit() else None
    if body is None:
        os._exit(0)
    try:
        soft, hard, stdin, argc, *rest = body.split(b"\0")
        argv = rest[: int(argc)]
        env = dict(item.split(b"=", 1) for item in rest[int(argc) :])
        if soft:
            import resource

            resource.setrlimit(resource.RLIMIT_NOFILE, (int(soft), int(hard)))
        if stdin != b"1":
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.close(null)
        default_signals()  # as subprocess's restore_signals does for a plain start
        os.execvpe(argv[0], argv, env)
    except Exception as exc:
        os.write(
            1, f"tpufleet: cannot start this job: {type(exc).__name__}: {exc}\n".encode(errors="replace")
        )
    os._exit(CANNOT_START)


if __name__ == "__main__":
    main()
