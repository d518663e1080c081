"""One host of one attempt of a chaos job: ``python hostjob.py TOKEN SECONDS``.

What every job of the soak runs on each of its hosts (an SPMD job's command, started by path so
it needs nothing but the standard library; a Ray job's tasks run it in their Ray worker, see
``raydriver.py``). ``TOKEN`` is only there so the soak finds the job's processes in ``/proc``.

It writes a marker ``chaos-<attempt>-<slice>-<worker>.json`` in the job's
``TPUFLEET_CHECKPOINT_DIR`` when it starts (after reading the markers of the job's other attempts
that are still running), refreshes its heartbeat every 0.2 s while it runs ``SECONDS`` and records
its end. Two attempts of one job ran at the same time when a later attempt started before an
earlier one's last heartbeat: a double run (``verdict.py``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from typing import Any


def _running_elsewhere(directory: str, attempt: str) -> list[dict[str, Any]]:
    """The markers of the job's other attempts that have not recorded their end."""
    seen = []
    for name in sorted(os.listdir(directory)):
        if name.startswith("chaos-") and name.endswith(".json") and not name.startswith(f"chaos-{attempt}-"):
            try:
                with open(os.path.join(directory, name)) as fh:
                    marker = json.load(fh)
            except (OSError, ValueError):
                continue
            if marker.get("end") is None:
                seen.append({"marker": name, "beat": marker.get("beat")})
    return seen


def _write(path: str, record: dict[str, Any]) -> None:
    """Replace the marker at once (never half-written: a reader skips only a torn temporary)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(json.dumps(record))
    os.replace(tmp, path)


def main(argv: list[str], environ: Mapping[str, str] = os.environ) -> int:
    """``argv``: TOKEN SECONDS; ``environ``: the host's and the job's variables (this process's by
    default). Returns the exit code (0)."""
    directory = environ["TPUFLEET_CHECKPOINT_DIR"]
    attempt = environ["TPUFLEET_ATTEMPT"]
    slice_name, worker = environ.get("TPU_NAME", "-"), environ.get("TPU_WORKER_ID", "0")
    os.makedirs(directory, exist_ok=True)
    me = os.path.join(directory, f"chaos-{attempt}-{slice_name}-{worker}.json")
    now = time.time()
    seen = _running_elsewhere(directory, attempt)
    record: dict[str, Any] = {
        "attempt": int(attempt),
        "slice": slice_name,
        "worker": worker,
        "start": now,
        "beat": now,
        "end": None,
        "seen": seen,
    }
    _write(me, record)
    until = now + float(argv[1])
    while time.time() < until:
        time.sleep(0.2)
        record["beat"] = time.time()
        _write(me, record)
    record["end"] = record["beat"] = time.time()
    _write(me, record)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
