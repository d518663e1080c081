"""A GCE TPU VM's preemption and maintenance notices, watched on the metadata server.

GCE tells a VM before it takes it away: a spot VM's ``instance/preempted`` turns ``TRUE`` about
30 s before it stops (:data:`PREEMPT_NOTICE_S`), and ``instance/maintenance-event`` turns from
``NONE`` to ``TERMINATE_ON_HOST_MAINTENANCE`` (the VM will be stopped: a TPU VM cannot be live
migrated) or ``MIGRATE_ON_HOST_MAINTENANCE`` (it will be moved and live on). The runner of every
host of a GCE slice watches both (:func:`watch_from_env`) and hands each change to a relay
(``host/notices.py``), which the control plane reads as the provider's ``preempt_deadline``, the way
an emulated notice arrives: the holder's attempt gets SIGTERM at once and is requeued without
using a retry, and the autoscaler makes a replacement.

The metadata server's rules, kept here (https://cloud.google.com/compute/docs/metadata/querying-metadata):
every request carries ``Metadata-Flavor: Google`` (without it the server answers 403) and every
answer carries it too (an answer without it did not come from the metadata server and is refused);
``?wait_for_change=true&last_etag=E`` holds the request until the value's ETag differs from ``E``
(at once if it already does), ``timeout_sec`` bounds the wait, and the answer's ``ETag`` header is
the next request's ``last_etag``. The first read is a plain one, so a notice given before the runner
started is seen at once.

Where: only on a GCE VM, which the provider's startup script says by exporting
``TPUFLEET_GCE_VM=1`` (:data:`GCE_VM_VAR`) to the raylet and so to every runner; anywhere else
(the emulator, GKE, a laptop) nothing is started and the metadata server is never asked. Its
address is ``$GCE_METADATA_HOST`` (google-auth's convention, ``host[:port]``), by default
``metadata.google.internal``.

Nothing here is fatal to the runner: a failed request (the server away, a refusal, a reset) or
relay (Ray's KV away for a moment) is tried again after a pause that doubles from :data:`BACKOFF_S`
up to :data:`BACKOFF_CAP_S` and starts again at the first success; an answer that did not change
the ETag (the server's own timeout) is followed by a short pause, so a server that ignores
``wait_for_change`` cannot make a busy loop.
Cheap: two daemon threads, each blocked in one long-poll.
"""

from __future__ import annotations

import http.client
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlencode

__all__ = [
    "BACKOFF_CAP_S",
    "BACKOFF_S",
    "DEFAULT_HOST",
    "GCE_VM_VAR",
    "HOST_VAR",
    "KEYS",
    "MAINTENANCE",
    "MAINTENANCE_NOTICE_S",
    "PREEMPTED",
    "PREEMPT_NOTICE_S",
    "Backoff",
    "HostNotice",
    "MetadataError",
    "Watcher",
    "read",
    "watch_from_env",
]

log = logging.getLogger(__name__)

GCE_VM_VAR = "TPUFLEET_GCE_VM"  # "1" on a GCE TPU VM (the provider's startup script exports it)
HOST_VAR = "GCE_METADATA_HOST"  # google-auth's name for the metadata server's host[:port]
DEFAULT_HOST = "metadata.google.internal"
PREEMPTED = "instance/preempted"
MAINTENANCE = "instance/maintenance-event"
KEYS = (PREEMPTED, MAINTENANCE)
PREEMPT_NOTICE_S = 30.0  # GCE's notice to a preempted spot VM
MAINTENANCE_NOTICE_S = 60.0  # GCE's advance notice of a host maintenance event
WAIT_S = 60  # timeout_sec of one long-poll
BACKOFF_S = 1.0
BACKOFF_CAP_S = 60.0
SAME_ETAG_PAUSE_S = 1.0
_FLAVOR = ("Metadata-Flavor", "Google")
_QUIET = {PREEMPTED: "FALSE", MAINTENANCE: "NONE"}


class MetadataError(Exception):
    """The metadata server could not be read, refused, or answered as no metadata server does."""


@dataclass(frozen=True)
class HostNotice:
    """One host's value of one notice key, as last read; ``seen_at`` is when it was read."""

    slice_name: str
    worker_id: int
    key: str  # PREEMPTED or MAINTENANCE
    value: str  # "FALSE"/"TRUE"; "NONE"/"TERMINATE_ON_HOST_MAINTENANCE"/"MIGRATE_ON_HOST_MAINTENANCE"
    seen_at: float

    @property
    def active(self) -> bool:
        """Something is announced (not ``FALSE``/``NONE``)."""
        return self.value != _QUIET.get(self.key, "")

    @property
    def deadline(self) -> float | None:
        """When the host will be gone (seconds since the epoch), or None if it stays (no notice, or
        a live migration)."""
        if self.key == PREEMPTED and self.value == "TRUE":
            return self.seen_at + PREEMPT_NOTICE_S
        if self.key == MAINTENANCE and self.value.startswith("TERMINATE"):
            return self.seen_at + MAINTENANCE_NOTICE_S
        return None


def read(
    host: str, key: str, *, last_etag: str | None = None, wait_s: int = WAIT_S, timeout_s: float | None = None
) -> tuple[str, str]:
    """``(value, etag)`` of ``computeMetadata/v1/<key>`` on ``host``: at once without ``last_etag``,
    else once the ETag differs from it (or ``wait_s`` passed). Raises :class:`MetadataError`."""
    query = {"wait_for_change": "true", "last_etag": last_etag, "timeout_sec": str(wait_s)}
    path = f"/computeMetadata/v1/{key}" + (f"?{urlencode(query)}" if last_etag is not None else "")
    conn = http.client.HTTPConnection(host, timeout=timeout_s if timeout_s is not None else wait_s + 10)
    try:
        conn.request("GET", path, headers=dict([_FLAVOR]))
        resp = conn.getresponse()
        body = resp.read().decode("utf-8", "replace").strip()
        if resp.status != 200:
            raise MetadataError(f"metadata server {host}: {key} answered {resp.status}: {body[:200]}")
        if resp.getheader(_FLAVOR[0]) != _FLAVOR[1]:
            raise MetadataError(
                f"{host} is no metadata server: its answer for {key} lacks 'Metadata-Flavor: Google'"
            )
        return body, resp.getheader("ETag") or ""
    except (OSError, http.client.HTTPException) as err:
        raise MetadataError(f"metadata server {host}: {key}: {err}") from err
    finally:
        conn.close()


@dataclass
class Backoff:
    """Pauses between failed requests: ``base_s``, doubling up to ``cap_s``; :meth:`reset` on success."""

    base_s: float = BACKOFF_S
    cap_s: float = BACKOFF_CAP_S
    failures: int = 0

    def next(self) -> float:
        delay = min(self.cap_s, self.base_s * 2.0 ** min(self.failures, 30))
        self.failures += 1
        return delay

    def reset(self) -> None:
        self.failures = 0


class Watcher:
    """Watches :data:`KEYS` of one host and calls ``relay`` with a :class:`HostNotice` for the first
    value read and each change (see the module docstring). ``pause(seconds)`` waits and returns True
    when the watcher was stopped meanwhile (default: the stop event's wait); tests inject one that
    records the pauses."""

    def __init__(
        self,
        slice_name: str,
        worker_id: int,
        relay: Callable[[HostNotice], object],
        *,
        host: str = DEFAULT_HOST,
        clock: Callable[[], float] = time.time,
        pause: Callable[[float], bool] | None = None,
        backoff_s: float = BACKOFF_S,
        backoff_cap_s: float = BACKOFF_CAP_S,
        wait_s: int = WAIT_S,
        idle_s: float = SAME_ETAG_PAUSE_S,
    ) -> None:
        self.slice_name, self.worker_id, self.host = slice_name, worker_id, host
        self._relay, self._clock = relay, clock
        self._stop = threading.Event()
        self._pause = pause or self._stop.wait
        self._backoff = (backoff_s, backoff_cap_s)
        self._wait_s, self._idle_s = wait_s, idle_s
        self._lock = threading.Lock()
        self.failures = 0  # failed requests or relays, all keys together
        self.last_error = ""
        self._threads: list[threading.Thread] = []

    def start(self) -> Watcher:
        for key in KEYS:
            t = threading.Thread(target=self._watch, args=(key,), name=f"gce-notice:{key}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    @property
    def alive(self) -> bool:
        """Every key is still watched."""
        return bool(self._threads) and all(t.is_alive() for t in self._threads)

    def stop(self) -> None:
        """Stop at the end of the current request or pause (the threads are daemons)."""
        self._stop.set()

    def _watch(self, key: str) -> None:
        backoff = Backoff(*self._backoff)
        etag: str | None = None
        last: str | None = None
        while not self._stop.is_set():
            try:
                value, new_etag = read(self.host, key, last_etag=etag, wait_s=self._wait_s)
                if value != last and not self._stop.is_set():
                    self._hand_over(HostNotice(self.slice_name, self.worker_id, key, value, self._clock()))
                    last = value
            except Exception as err:  # the server, or the relay behind it, away: again after a pause
                with self._lock:
                    self.failures += 1
                    self.last_error = str(err)
                delay = backoff.next()
                log.warning("GCE notices: %s; again in %.0f s", err, delay)
                if self._pause(delay):
                    return
                continue  # a relay that failed is tried again: the old ETag answers at once
            backoff.reset()
            if new_etag == etag and self._pause(self._idle_s):
                return  # the server's own timeout (or no long-poll at all): never a busy loop
            etag = new_etag

    def _hand_over(self, notice: HostNotice) -> None:
        if notice.active:
            log.warning(
                "GCE notice on %s/%d: %s = %s", notice.slice_name, notice.worker_id, notice.key, notice.value
            )
        try:
            self._relay(notice)
        except Exception as err:
            raise MetadataError(f"could not relay {notice.key}={notice.value}: {err}") from err


def watch_from_env(
    relay: Callable[[HostNotice], object], environ: Mapping[str, str] | None = None
) -> Watcher | None:
    """Start a :class:`Watcher` for this host, relaying to ``relay`` (the runner's: ``notices.publish``,
    into Ray's KV for the control plane), when it is a GCE VM (``TPUFLEET_GCE_VM=1`` and the host
    contract's ``TPU_NAME``/``TPU_WORKER_ID``); None, and no request at all, anywhere else."""
    env = os.environ if environ is None else environ
    if env.get(GCE_VM_VAR) != "1":
        return None
    name, worker = env.get("TPU_NAME", ""), env.get("TPU_WORKER_ID", "0")
    if not name or not worker.isdigit():
        log.warning("%s=1 but no TPU_NAME/TPU_WORKER_ID: GCE notices are not watched", GCE_VM_VAR)
        return None
    host = env.get(HOST_VAR) or DEFAULT_HOST
    return Watcher(name, int(worker), relay, host=host).start()
