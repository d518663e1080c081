"""Spot preemption with notice, the way GCE does it: the hosts are told first, then they all die.

GCE gives a preempted spot TPU VM a notice (30 s on GCE VMs; the metadata key
``instance/preempted`` turns TRUE) before it stops every VM of the slice. Here:

1. :func:`announce` records the notice in ``<state_dir>/notices.json`` (so the CLI and a provider
   in another process agree) and asks Ray's GCS to drain every live host of the slice with reason
   ``DRAIN_NODE_REASON_PREEMPTION`` and the deadline: the same RPC as
   ``ray drain-node --reason=DRAIN_NODE_REASON_PREEMPTION --deadline-remaining-seconds S`` (Ray 2.60
   ``scripts.py``), which autoscaler v2 uses for preemptions. Ray then schedules nothing new there
   and, once the node dies, reports the death as a preemption (``AUTOSCALER_DRAIN_PREEMPTED``).
2. :func:`reap` (called by whoever watches: ``tpufleet emulate preempt --notice`` waiting out the
   notice with :func:`wait_out`, or the emulator provider's background loop) kills every host of
   each slice whose deadline has passed, all at once, and marks the notice done so a later
   ``restore`` is not undone. A slice the control plane had deleted before its deadline (as it
   should, reacting to the notice) has nothing left to kill: :func:`wait_out` says so.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpufleet.emulator import auth
from tpufleet.emulator import state as store
from tpufleet.emulator.raynodes import alive_slice_nodes
from tpufleet.emulator.raynodes import drain as drain_nodes
from tpufleet.errors import ClusterError, NotFoundError, SpecError

NOTICES_FILE = "notices.json"
GCE_NOTICE_S = 30.0  # GCE's preemption notice for spot VMs


@dataclass(frozen=True)
class Notice:
    slice_name: str
    deadline: float  # seconds since the epoch
    done: bool = False  # the hosts were killed


def read(state_dir: Path) -> dict[str, Notice]:
    """Every notice recorded for the fleet in ``state_dir`` (done ones included)."""
    path = Path(state_dir) / NOTICES_FILE
    try:
        raw: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    return {name: Notice(name, float(v["deadline"]), bool(v.get("done"))) for name, v in raw.items()}


def _write(state_dir: Path, notices: dict[str, Notice]) -> None:
    path = Path(state_dir) / NOTICES_FILE
    tmp = path.with_name(f".{NOTICES_FILE}.{os.getpid()}")
    tmp.write_text(
        json.dumps({n.slice_name: {"deadline": n.deadline, "done": n.done} for n in notices.values()})
    )
    tmp.replace(path)


def forget(state_dir: Path, slice_name: str) -> None:
    """Drop a slice's notice (the slice was deleted)."""
    with store.locked(Path(state_dir)):
        notices = read(state_dir)
        if notices.pop(slice_name, None) is not None:
            _write(state_dir, notices)


def drain(ray_address: str, slice_name: str, deadline: float, message: str) -> int:
    """Tell Ray every live host of ``slice_name`` is being preempted at ``deadline``; returns how many
    hosts accepted (``raynodes.drain``, the RPC ``ray drain-node`` sends)."""
    nodes = alive_slice_nodes(ray_address, slice_name)
    refused = drain_nodes(ray_address, nodes, "DRAIN_NODE_REASON_PREEMPTION", message, deadline)
    if refused:  # a preemption is not refusable: Ray says why it did anyway
        node_id, why = next(iter(refused.items()))
        raise ClusterError(f"Ray refused to drain {slice_name} node {node_id[:12]}: {why}")
    return len(nodes)


def announce(
    state_dir: Path, slice_name: str, notice_s: float = GCE_NOTICE_S, *, now: Callable[[], float] = time.time
) -> float:
    """Give ``slice_name`` a preemption notice of ``notice_s`` seconds; returns the deadline."""
    if notice_s < 0:
        raise SpecError(f"--notice must be >= 0 seconds, got {notice_s:g}")
    state_dir = Path(state_dir)
    with store.locked(state_dir):
        st = store.load(state_dir)
        if st is None:
            raise NotFoundError(f"no emulated fleet in {state_dir}; start one with `tpufleet emulate up`")
        if st.slice(slice_name) is None:
            names = ", ".join(s.name for s in st.slices) or "none"
            raise NotFoundError(f"no slice {slice_name!r} in this fleet; its slices: {names}")
        deadline = now() + notice_s
        # The hosts are told first; a provider that reads the notice may rely on that.
        auth.activate((state_dir / auth.TOKEN_FILE).absolute())
        drain(st.ray_address, slice_name, deadline, f"spot preemption of {slice_name} (tpufleet emulator)")
        notices = read(state_dir)
        notices[slice_name] = Notice(slice_name, deadline)
        _write(state_dir, notices)
    return deadline


def wait_out(
    state_dir: Path,
    slice_name: str,
    deadline: float,
    *,
    now: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Wait until an announced notice's ``deadline``, then kill the slice's hosts (:func:`reap`;
    interrupted or not, an announced preemption happens). Returns False when the slice had left
    the fleet by then: the control plane, acting on the notice, had it deleted; nothing was left
    to preempt."""
    state_dir = Path(state_dir)
    try:
        sleep(max(0.0, deadline - now()))
    finally:
        reap(state_dir, only=slice_name, now=lambda: max(now(), deadline))
    st = store.load(state_dir)
    return st is not None and st.slice(slice_name) is not None


def reap(state_dir: Path, *, now: Callable[[], float] = time.time, only: str | None = None) -> list[str]:
    """Kill every host of each slice whose notice has run out (all hosts of a slice together);
    returns the slices killed. ``only`` limits it to one slice."""
    from tpufleet.emulator.cluster import EmulatedFleet

    state_dir = Path(state_dir)
    due = [
        n
        for n in read(state_dir).values()
        if not n.done and n.deadline <= now() and (only is None or n.slice_name == only)
    ]
    fleet = EmulatedFleet.attach(state_dir) if due else None
    killed = []
    for n in due:
        st = store.load(state_dir)
        rec = st.slice(n.slice_name) if st else None
        if fleet is not None and rec is not None and any(h.session for h in rec.hosts):
            fleet.preempt(n.slice_name, wait=False)
            killed.append(n.slice_name)
        with store.locked(state_dir):
            notices = read(state_dir)
            if n.slice_name in notices:
                notices[n.slice_name] = Notice(n.slice_name, n.deadline, done=True)
                _write(state_dir, notices)
    return killed
