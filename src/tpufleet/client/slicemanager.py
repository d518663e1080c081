"""``SliceManager``: named TPU slice groups from Python, through the control plane.

    from tpufleet import SliceManager

    sm = SliceManager()  # TPUFLEET_SERVER / TPUFLEET_TOKEN, else the local admin token
    sm.create_slice("train", {"tpu_type": "v4-8", "num_slices": 2, "preemptible": True})
    sm.get_slice_utilization("train")          # {"utilization": 0.73, "holders": [...], ...}
    sm.delete_slice("train", force=False)      # drains: waits for the holder to finish
    sm.list_slices()

The config keys are exactly ``tpu_type`` (or ``generation`` + ``topology``), ``num_slices`` and
``preemptible``; an unknown key is a :class:`~tpufleet.errors.SpecError` naming the closest one,
raised before anything is sent. Every call needs the admin token. Errors are the server's
(:class:`~tpufleet.errors.TpufleetError`, the same message and exit code as the CLI).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from tpufleet.client import context
from tpufleet.client.context import Context
from tpufleet.client.http import API, DEFAULT_SERVER, Client, _seg
from tpufleet.control.store.slicegroups import slice_config
from tpufleet.errors import ClusterError, InputError

__all__ = ["SliceManager"]

_SETTLED = ("ACTIVE", "FAILED", "SUSPENDED")


def _remembered() -> Context:
    """What the CLI context file holds (``tpufleet serve`` writes its URL and admin token path
    there); an unreadable file is no context here (the CLI says what is wrong with it)."""
    try:
        return context.load()
    except InputError:
        return Context()


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _defaults(server: str | None, token: str | None) -> tuple[str, str | None]:
    """As the CLI finds them: the argument, else ``$TPUFLEET_SERVER``/``$TPUFLEET_TOKEN``, else what
    ``tpufleet serve`` remembered (its URL, and its admin token for that same URL), else
    http://127.0.0.1:8600 and the admin token in ``$TPUFLEET_STATE_DIR`` or ``~/.tpufleet``."""
    ctx = _remembered()
    server = server or os.environ.get("TPUFLEET_SERVER") or ctx.server or DEFAULT_SERVER
    token = token or os.environ.get("TPUFLEET_TOKEN")
    if not token and ctx.admin_token_path and server == ctx.server:
        token = _read(Path(ctx.admin_token_path))
    if not token:
        token = _read(Path(os.environ.get("TPUFLEET_STATE_DIR") or Path.home() / ".tpufleet") / "admin-token")
    return server, token


class SliceManager:
    def __init__(
        self,
        server: str | None = None,
        token: str | None = None,
        *,
        http: httpx.Client | None = None,
        timeout_s: float = 30.0,
        client: Client | None = None,
    ) -> None:
        """``client``: an existing :class:`Client` to talk through (the CLI's); else one for
        ``server`` and ``token``, found as the CLI finds them (:func:`_defaults`)."""
        if client is None:
            server, token = _defaults(server, token)
            client = Client(server, token, http=http, timeout_s=timeout_s)
        self.client = client

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> SliceManager:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def create_slice(
        self,
        name: str,
        config: Mapping[str, Any],
        *,
        tenant: str | None = None,
        wait: bool = False,
        timeout_s: float = 600.0,
    ) -> dict[str, Any]:
        """Ask for a slice group; with ``wait``, return once the provider says ACTIVE (or FAILED,
        SUSPENDED), a ClusterError after ``timeout_s``."""
        slice_config(config)  # an unknown key fails here, naming the closest
        body = {"name": name, "config": dict(config), "tenant": tenant}
        group = dict(self.client.request("POST", f"{API}/slice-groups", json=body))
        return self.wait(name, timeout_s) if wait else group

    def wait(self, name: str, timeout_s: float = 600.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            group = self.get_slice(name)
            if group["state"] in _SETTLED:
                return group
            if time.monotonic() > deadline:
                raise ClusterError(f"slice group {name} is still {group['state']} after {timeout_s:g} s")
            time.sleep(0.2)

    def get_slice(self, name: str) -> dict[str, Any]:
        return dict(self.client.request("GET", f"{API}/slice-groups/{_seg(name)}"))

    def delete_slice(self, name: str, force: bool = False) -> dict[str, Any]:
        """Drain and delete: the holder finishes first, or with ``force`` is preempted (checkpoint
        signal and grace, requeued without using a retry); then the slices are released."""
        params = {"force": "true"} if force else None
        return dict(self.client.request("DELETE", f"{API}/slice-groups/{_seg(name)}", params=params))

    def get_slice_utilization(self, name: str, window: str | float = "10m") -> dict[str, Any]:
        """Held fraction over the window (``"10m"``, ``"2h"``, or seconds) and who held it."""
        params = {"window": str(window)}
        return dict(self.client.request("GET", f"{API}/slice-groups/{_seg(name)}/utilization", params=params))

    def list_slices(self) -> list[dict[str, Any]]:
        return list(self.client.request("GET", f"{API}/slice-groups"))
