"""How long a test lets a subprocess it starts run before calling it hung.

A guard against a hang, not a measure of speed (speed is measured in ``bench/``): in ``make test``
these subprocesses run niced beside two streams of emulated fleets, where a CLI start-up of about
1.5 CPU-seconds once took 61 s of wall. A guard near the normal time turns a slow hour into a
failure; this one fails only a process that is stuck."""

from __future__ import annotations

HANG_GUARD_S = 240
