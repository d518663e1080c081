"""Failpoints: places in the loop where a ``tpufleet serve`` process can be made to die as
``kill -9`` kills it, for crash tests of the whole process (its replicas' takeovers above all:
``tests/integration/test_replicas_ray.py``), where a signal sent from outside cannot hit a chosen
instant.

``TPUFLEET_FAILPOINTS`` (read by ``serve``; empty or unset: none) is a comma-separated list of:

- ``after-write:KIND``: right after the loop's grouped write of KIND (``admit``, ``preempt``,
  ``stop``, ``launched``, ``running``, ``finish``) committed, before any of it is acted on;
- ``after-launch``: right after an attempt's launch on the cluster returned (its hosts started),
  before the loop records it: a launch begun and never recorded, which the next leader adopts;
- ``after-stop``: right after an attempt's stop on the cluster returned (every process ended),
  before its end is written: a stop on record, which the next leader issues again.

Reaching one sends this process SIGKILL at once: no handler, no cleanup, no flush, exactly what a
crash leaves. Nothing else changes with them, and no failpoint is ever set by default.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Collection

from tpufleet.errors import SpecError

__all__ = ["ENV", "WRITE_KINDS", "parse", "reach"]

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


def reach(points: Collection[str], point: str) -> None:
    """At ``point``: if it is one of ``points``, die now (SIGKILL to this process)."""
    if point in points:
        log.critical("failpoint %s reached: this process kills itself (SIGKILL)", point)
        os.kill(os.getpid(), signal.SIGKILL)
