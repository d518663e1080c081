"""What a host's runner starts so the control plane can read the host's chips, whatever the host.

Three kinds of host, one path for the control plane (``tpudevice.publish``: the page's ``ip:port``
in Ray's internal KV, which ``observe/device.py`` reads):

- a GKE host has the TPU device plugin; the TPU webhook set ``$TPU_DEVICE_PLUGIN_ADDR``, and the
  runner publishes it;
- an emulated host has the same variable and also names, in ``$TPUFLEET_DEVICE_PAGE_HOOK``
  (``tpudevice.PAGE_HOOK_VAR``, set by the emulator when it starts the host's raylet), the function
  that serves its emulated plugin there; the runner publishes the address and calls that function
  with the host's environment. The host's code never imports the emulator: the host says what to
  start, as a real host's environment says where its plugin is;
- a GCE TPU VM has neither, and the runner starts the relay of libtpu's numbers
  (``devicerelay.py``), which publishes its own address.

Nothing here is fatal to the runner: a hook that cannot be loaded or fails is logged and skipped.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from tpufleet.host import devicerelay
from tpufleet.tpudevice import ADDR_VAR, PAGE_HOOK_VAR, publish

__all__ = ["load_hook", "serve_from_env"]

log = logging.getLogger(__name__)


def load_hook(spec: str) -> Callable[[Mapping[str, str]], Any]:
    """The function ``module:function`` names (ValueError if it names none)."""
    module, sep, name = spec.partition(":")
    if not (sep and module and name):
        raise ValueError(f"{PAGE_HOOK_VAR}={spec!r}: expected module:function")
    hook = getattr(importlib.import_module(module), name)
    if not callable(hook):
        raise ValueError(f"{PAGE_HOOK_VAR}={spec!r} names something that is not a function")
    return hook  # type: ignore[no-any-return]


def serve_from_env(environ: Mapping[str, str] | None = None) -> None:
    """Publish this host's device page and start what serves it (see the module docstring), from a
    process of the host connected to Ray (the runner actor)."""
    env = dict(os.environ if environ is None else environ)
    if ADDR_VAR in env:
        publish(env[ADDR_VAR])  # the GKE plugin's or the emulated one's address
    spec = env.get(PAGE_HOOK_VAR)
    if spec:
        try:
            load_hook(spec)(env)
        except Exception as err:  # the page is missing, the runner runs on
            log.warning("the host's device page hook %s did not start: %s", spec, err)
    devicerelay.serve_from_env(env)
