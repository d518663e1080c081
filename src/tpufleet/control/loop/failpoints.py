"""Failpoints: places in the loop where a ``tpufleet serve`` process can be made to die as
``kill -9`` kills it, for crash tests of the whole process (its replicas' takeovers above all:
``tests/integration/test_replicas_ray.py``), where a signal sent from outside cannot hit a chosen
instant.

``TPUFLEET_FAILPOINTS`` (read by ``serve``; empty or unset: none) is a comma-separated list of:

- ``after-write:KIND``: right after the loop's grouped write of KIND (``admit``, ``preempt``,
  ``stop``, ``launched``, ``running``, ``finish``) committed, before any of it is acted on;
- ``after-launch``: once an attempt's launch on the cluster returned and the cluster reports every
  host of it started (a launch returns with its start calls still on their way), before the loop
  records it: a launch that reached its hosts and was never recorded, which the next leader adopts;
- ``after-stop``: right after an attempt's stop on the cluster returned (every process ended),
  before its end is written: a stop on record, which the next leader issues again.

Reaching one sends this process SIGKILL at once: no handler, no cleanup, no flush, exactly what a
crash leaves. Nothing else changes with them, and no failpoint is ever set by default.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Collection

from tpufleet.errors import SpecError

__all__ = ["ENV", "READY_S", "WRITE_KINDS", "parse", "reach"]

ENV = "TPUFLEET_FAILPOINTS"
WRITE_KINDS = ("admit", "preempt", "stop", "launched", "running", "finish")
POINTS = ("after-launch", "after-stop", *(f"after-write:{k}" for k in WRITE_KINDS))

log = logging.getLogger(__name__)


def parse(text: str | None) -> frozenset[str]:
    """The failpoints ``text`` names (``TPUFLEET_FAILPOINTS``); SpecError naming the known ones."""
    points = frozenset(p.strip() for p in (text or "").split(",") if p.strip())
    unknown = sorted(points - set(POINTS))
    if unknown:
        raise SpecError(
            f"{ENV}: unknown failpoint {unknown[0][:60]!r}; "
            f"use a comma-separated list of {', '.join(POINTS)}",
            field=ENV,
        )
    return points


READY_S = 60.0  # the longest a failpoint waits for the instant it stands for (then it kills anyway)


def reach(points: Collection[str], point: str, ready: Callable[[], bool] | None = None) -> None:
    """At ``point``: if it is one of ``points``, die (SIGKILL to this process): at once, or once
    ``ready()`` says the instant the point stands for has come (at most ``READY_S`` later)."""
    if point not in points:
        return
    deadline = time.monotonic() + READY_S
    while ready is not None and time.monotonic() < deadline:
        try:
            if ready():
                break
        except Exception:  # a question the cluster cannot answer yet: ask again
            log.debug("failpoint %s: not ready", point, exc_info=True)
        time.sleep(0.05)
    log.critical("failpoint %s reached: this process kills itself (SIGKILL)", point)
    os.kill(os.getpid(), signal.SIGKILL)
