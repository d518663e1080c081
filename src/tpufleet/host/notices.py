"""Hosts' notices (``gcemetadata.HostNotice``) relayed to the control plane.

A GCE TPU VM's runner publishes what its metadata server announces in Ray's internal KV, under
``tpufleet:host-notice:<slice>:<worker>:<key>`` (:data:`KV_PREFIX`), as JSON (:func:`publish`); a
value that announces nothing again (``FALSE``, ``NONE``) deletes the entry, so a slice whose name
comes back is not noticed by an old entry. The control plane's GCE provider reads them
(:func:`published`, from a process connected to the fleet's Ray) as ``{slice: deadline}`` and
reports the deadline as the slice's ``preempt_deadline``: the same field an emulated notice
fills, so the loop handles both alike. A notice that does not end the host (a live migration) is
published, to be seen, but gives no deadline.

:class:`MemoryBoard` is the same relay in memory (the sandbox and tests): ``board.relay`` is a
watcher's relay and ``board.deadlines`` a provider's notice source.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from tpufleet.host.gcemetadata import HostNotice

__all__ = ["KV_PREFIX", "MemoryBoard", "deadlines", "decode", "encode", "publish", "published"]

log = logging.getLogger(__name__)

KV_PREFIX = "tpufleet:host-notice:"


def _key(n: HostNotice) -> str:
    return f"{KV_PREFIX}{n.slice_name}:{n.worker_id}:{n.key}"


def encode(n: HostNotice) -> str:
    return json.dumps(
        {"slice": n.slice_name, "worker": n.worker_id, "key": n.key, "value": n.value, "seen_at": n.seen_at}
    )


def decode(raw: str | bytes) -> HostNotice:
    """A published notice (ValueError when it is not one)."""
    try:
        d: dict[str, Any] = json.loads(raw)
        return HostNotice(
            str(d["slice"]), int(d["worker"]), str(d["key"]), str(d["value"]), float(d["seen_at"])
        )
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"not a host notice: {raw[:200]!r}") from err


def deadlines(notices: Iterable[HostNotice]) -> dict[str, float]:
    """``{slice: the earliest deadline any of its hosts announced}``; slices with none are left out."""
    out: dict[str, float] = {}
    for n in notices:
        d = n.deadline
        if d is not None and d < out.get(n.slice_name, float("inf")):
            out[n.slice_name] = d
    return out


def publish(
    notice: HostNotice,
    put: Callable[[str, str], object] | None = None,
    delete: Callable[[str], object] | None = None,
) -> None:
    """Put ``notice`` where the control plane reads it (Ray's KV; ``put``/``delete`` replace it), or
    delete its entry when it announces nothing."""
    if put is None or delete is None:
        from ray.experimental import internal_kv

        put = put or (lambda k, v: internal_kv._internal_kv_put(k, v, overwrite=True))
        delete = delete or internal_kv._internal_kv_del
    if notice.active:
        put(_key(notice), encode(notice))
    else:
        delete(_key(notice))


def published(
    keys: Callable[[str], Iterable[bytes | str]] | None = None,
    get: Callable[[bytes | str], bytes | str | None] | None = None,
) -> dict[str, float]:
    """``{slice: deadline}`` from every published notice (``keys``/``get`` replace Ray's KV); empty
    when this process is not connected to Ray."""
    if keys is None or get is None:
        ray = sys.modules.get("ray")  # a process connected to Ray has imported it: never import it here
        if ray is None or not ray.is_initialized():
            return {}
        from ray.experimental import internal_kv

        keys = keys or internal_kv._internal_kv_list
        get = get or internal_kv._internal_kv_get
    found = []
    for key in keys(KV_PREFIX):
        raw = get(key)
        if raw is None:
            continue  # deleted meanwhile
        try:
            found.append(decode(raw))
        except ValueError as err:
            log.warning("%s: %s", key, err)
    return deadlines(found)


class MemoryBoard:
    """The relay in memory: what :func:`publish` and :func:`published` do, without Ray."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._notices: dict[tuple[str, int, str], HostNotice] = {}
        self.relayed: list[HostNotice] = []  # every notice relayed, in order

    def relay(self, notice: HostNotice) -> None:
        with self._lock:
            self.relayed.append(notice)
            k = (notice.slice_name, notice.worker_id, notice.key)
            if notice.active:
                self._notices[k] = notice
            else:
                self._notices.pop(k, None)

    def deadlines(self) -> dict[str, float]:
        with self._lock:
            return deadlines(self._notices.values())
