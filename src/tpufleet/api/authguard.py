"""Failed authentications: counted, logged without the token, and slowed per client address.

Every request on an authenticated route that fails to authenticate is

- **counted** in ``tpufleet_auth_failures_total{reason}`` (``GET /metrics``), ``reason`` from the
  closed set ``REASONS``: ``missing`` (no token), ``invalid`` (a malformed header or an unknown
  token), ``revoked``, ``scope`` (a token used outside its scope: a metrics token on another route,
  a jobs token on ``/metrics``);
- **logged** (logger ``tpufleet.api.auth``, WARNING): the client address, the method and route and
  the reason; never the token, nor its hash, nor any part of it;
- **slowed**: an address with ``max_failures`` failures other than ``scope`` (no token, or one
  that is wrong: ``scope`` is a valid token in the wrong place) within ``window_s`` gets 429 with
  ``Retry-After`` instead of 401 for every further failure, until the oldest of them is
  ``window_s`` old: a client that guesses or retries a bad token is told to back off. A valid token
  always passes: an address is often shared (a NAT, a proxy, every emulated host and user on one
  machine's loopback), and one tenant's bad tokens must not lock the others out. Tokens are 256
  random bits, so the limit bounds the noise and the log, not the odds of a guess. A 429 adds
  nothing to the count; another address is not affected. The table holds at most
  ``max_addresses`` addresses (the least recently failed ones are dropped first), each at most
  ``max_failures`` times: bounded memory whatever the flood.

The address is the TCP peer's (``request.client.host``): behind a proxy every caller shares the
proxy's, so put the limit there instead (docs/security.md).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from tpufleet.errors import TpufleetError

__all__ = ["REASONS", "AuthGuard", "TooManyFailures"]

REASONS = ("missing", "invalid", "revoked", "scope")
GUESSES = frozenset({"missing", "invalid", "revoked"})  # what counts towards the per-address limit
MAX_FAILURES = 10  # guesses from one address ...
WINDOW_S = 60.0  # ... within this many seconds, then 429 until the oldest is this old
MAX_ADDRESSES = 10_000

log = logging.getLogger("tpufleet.api.auth")


class TooManyFailures(TpufleetError):
    """429: too many failed authentications from this address; ``retry_after`` seconds."""

    http_status = 429

    def __init__(self, message: str, *, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class AuthGuard(Collector):
    """The per-address failure table and the failure counter (a prometheus ``Collector``).
    ``clock``: monotonic seconds (tests pass their own)."""

    def __init__(
        self,
        *,
        max_failures: int = MAX_FAILURES,
        window_s: float = WINDOW_S,
        max_addresses: int = MAX_ADDRESSES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_failures, self.window_s, self.max_addresses = max_failures, window_s, max_addresses
        self.clock = clock
        self.failures: dict[str, int] = dict.fromkeys(REASONS, 0)
        self._recent: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def check(self, address: str) -> None:
        """Raise :class:`TooManyFailures` while ``address`` is over the limit (called on a failure)."""
        with self._lock:
            times = self._recent.get(address)
            if times is None:
                return
            now = self.clock()
            while times and now - times[0] >= self.window_s:
                times.popleft()
            if not times:
                del self._recent[address]
                return
            if len(times) < self.max_failures:
                return
            wait = self.window_s - (now - times[0])
        raise TooManyFailures(
            f"too many failed authentications from {address[:64]} ({self.max_failures} in "
            f"{self.window_s:g} s); try again in {math.ceil(wait)} s with a valid token",
            retry_after=wait,
        )

    def failed(self, address: str, reason: str, method: str, path: str) -> None:
        """Count, log and (for a guess) remember one failure of ``address``."""
        reason = reason if reason in REASONS else "invalid"
        with self._lock:
            self.failures[reason] += 1
            if reason in GUESSES:
                times = self._recent.pop(address, None) or deque(maxlen=self.max_failures)
                times.append(self.clock())
                self._recent[address] = times  # the most recently failed last
                while len(self._recent) > self.max_addresses:
                    self._recent.popitem(last=False)
        log.warning("authentication failed: %s from %s on %s %s", reason, address[:64], method, _route(path))

    def collect(self) -> Iterable[CounterMetricFamily]:
        family = CounterMetricFamily(
            "tpufleet_auth_failures", "Failed authentications on the API, by reason", labels=["reason"]
        )
        with self._lock:
            counts = dict(self.failures)
        for reason in REASONS:
            family.add_metric([reason], counts[reason])
        yield family

    def registry(self) -> CollectorRegistry:
        """A registry of this guard alone (``GET /metrics`` serves it after the control plane's)."""
        out = CollectorRegistry(auto_describe=False)
        out.register(self)
        return out


def _route(path: str) -> str:
    """The path as logged: printable ASCII only, at most 120 characters."""
    clean = "".join(c if 32 < ord(c) < 127 else "?" for c in path)
    return clean if len(clean) <= 120 else clean[:117] + "..."
