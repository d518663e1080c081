"""Ray's own ``ray job`` CLI (the pinned Ray's) run as a user types it, against a control plane's
``/ray`` address: only the variables given reach it, none of this process's that would point it at
another cluster or hand it another token (an emulated fleet sets some)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

RAY_CLI = str(Path(sys.executable).parent / "ray")
RAY_CLIENT_VARS = (
    "RAY_ADDRESS",
    "RAY_API_SERVER_ADDRESS",
    "RAY_JOB_HEADERS",
    "RAY_AUTH_MODE",
    "RAY_AUTH_TOKEN",
    "RAY_AUTH_TOKEN_PATH",
)


def bearer(token: str) -> dict[str, str]:
    """``RAY_JOB_HEADERS`` with ``token``, as docs/ray-jobs.md has a user set it."""
    return {"RAY_JOB_HEADERS": json.dumps({"Authorization": f"Bearer {token}"})}


def ray_job(
    args: list[str], env: dict[str, str], *, cwd: Path | None = None, wait: bool = True, merge: bool = False
) -> Any:
    """``ray job ARGS`` with this process's environment less ``RAY_CLIENT_VARS``, plus ``env``: run
    to its end (120 s at most), or only started (``wait=False``: the ``Popen``). ``merge``: stderr
    into stdout."""
    full = {k: v for k, v in os.environ.items() if k not in RAY_CLIENT_VARS} | env
    err = subprocess.STDOUT if merge else subprocess.PIPE
    cmd = [RAY_CLI, "job", *args]
    if not wait:
        return subprocess.Popen(cmd, cwd=cwd, env=full, stdout=subprocess.PIPE, stderr=err, text=True)
    return subprocess.run(cmd, cwd=cwd, env=full, stdout=subprocess.PIPE, stderr=err, text=True, timeout=120)
