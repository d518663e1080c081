"""Seeing the fleet: metrics, goodput and cost (DESIGN.md, layer ``observe/``, above ``control/``).

- ``goodput.py``: a job's productive time over the time it held slices, with badput split into
  start-up, wasted progress, recovery and idle (pure).
- ``cost.py``: chip-seconds and dollars per tenant and job from the store's attempt records (pure
  arithmetic over ``control.usage`` reads and a ``pricing.PriceTable``).
- ``metrics.py``: the Prometheus collectors ``GET /metrics`` serves; :func:`collectors` lists the
  ones a control plane registers (add a device collector there).
- ``tpumetrics.py``, ``device.py``: TPU device numbers from the hosts (the device-metrics work);
  the hosts' side (libtpu's reader, the page's renderer, the GCE relay) is below ``control/``, in
  ``tpufleet/tpudevice.py`` and ``tpufleet/host/devicerelay.py``.
"""
