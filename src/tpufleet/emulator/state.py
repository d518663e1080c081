"""The emulator's state on disk, so separate CLI invocations (``emulate up`` in the background,
later ``status``, ``kill-host``, ``down``) act on the same fleet.

One JSON file, ``<state_dir>/fleet.json``, written atomically (temp file + rename); mutations hold
an exclusive ``flock`` on ``<state_dir>/fleet.lock``. Everything the fleet started is recorded as a
:class:`~tpufleet.emulator.procs.Session`, so ``down`` ends it by PID.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpufleet.emulator.procs import Session

STATE_FILE = "fleet.json"
LOCK_FILE = "fleet.lock"


@dataclass
class HostRecord:
    worker_id: int
    session: Session | None  # None while the host is down (killed or preempted)
    temp_dir: str = ""


@dataclass
class EmulatedSlice:
    name: str
    accelerator_type: str
    hosts: list[HostRecord] = field(default_factory=list)


@dataclass
class FleetState:
    fleet_id: str
    address: str  # the machine's IP as Ray sees it; every node and TPU_WORKER_HOSTNAMES use it
    gcs_port: int
    dashboard_port: int
    temp_dir: str  # short path under /tmp: Ray's unix socket paths must stay under 107 bytes
    cpus_per_host: int
    object_store_bytes: int
    log_monitor: bool
    head: Session | None = None
    slices: list[EmulatedSlice] = field(default_factory=list)
    next_host_seq: int = 0
    lean: bool = False  # hosts started by rayhost.py (see plan.lean_host_argv); False: plain `ray start`
    # The head's runtime env agent's port, which lean hosts use instead of one of their own (0: each
    # host runs its own, as a fleet saved before this field did).
    runtime_env_port: int = 0
    # Whether the head's log monitor forwards the hosts' output (``emulator.fleetlogs``), so that lean
    # hosts start none of their own.
    host_logs_on_head: bool = False

    @property
    def heads_runtime_env(self) -> bool:
        """Whether hosts use the head's runtime env agent instead of starting their own."""
        return self.lean and bool(self.runtime_env_port)

    @property
    def ray_address(self) -> str:
        return f"{self.address}:{self.gcs_port}"

    def slice(self, name: str) -> EmulatedSlice | None:
        return next((s for s in self.slices if s.name == name), None)

    def sessions(self) -> list[Session]:
        hosts = [h.session for s in self.slices for h in s.hosts if h.session]
        return ([self.head] if self.head else []) + hosts

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in vars(self).items() if k not in ("head", "slices")}
        data["head"] = self.head.to_dict() if self.head else None
        data["slices"] = [
            {
                "name": s.name,
                "accelerator_type": s.accelerator_type,
                "hosts": [
                    {
                        "worker_id": h.worker_id,
                        "session": h.session.to_dict() if h.session else None,
                        "temp_dir": h.temp_dir,
                    }
                    for h in s.hosts
                ],
            }
            for s in self.slices
        ]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FleetState:
        plain = {k: v for k, v in data.items() if k not in ("head", "slices")}
        state = cls(**plain)
        state.head = Session.from_dict(data["head"]) if data.get("head") else None
        state.slices = [
            EmulatedSlice(
                s["name"],
                s["accelerator_type"],
                [
                    HostRecord(
                        h["worker_id"],
                        Session.from_dict(h["session"]) if h.get("session") else None,
                        h.get("temp_dir", ""),
                    )
                    for h in s["hosts"]
                ],
            )
            for s in data.get("slices", [])
        ]
        return state


def load(state_dir: Path) -> FleetState | None:
    path = state_dir / STATE_FILE
    if not path.exists():
        return None
    return FleetState.from_dict(json.loads(path.read_text()))


def save(state_dir: Path, state: FleetState) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    tmp = state_dir / f".{STATE_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps(state.to_dict(), indent=2))
    tmp.replace(state_dir / STATE_FILE)


def remove(state_dir: Path) -> None:
    (state_dir / STATE_FILE).unlink(missing_ok=True)


@contextmanager
def locked(state_dir: Path) -> Iterator[None]:
    """Exclusive access to the state for one mutation (up, kill-host, restore, add, down)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / LOCK_FILE, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
