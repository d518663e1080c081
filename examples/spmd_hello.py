"""SPMD hello: run this same program on every host of a slice (or of several slices).

Each host calls ``tpufleet.runtime.initialize_jax()`` (``jax.distributed.initialize()`` on real
TPUs; derived from the host contract on the emulator), then all devices of all hosts hold one row
each of a global array whose sum every host checks. The sum crosses hosts (ICI on a real slice, the
data-centre network between slices; gloo on the emulator).

Prints one JSON line and exits 0 when the global result is right, 1 otherwise::

    # on every host (tpufleet's executor, `ray.util.tpu.run_on_slice`, or gcloud ... --worker=all)
    python examples/spmd_hello.py
"""

from __future__ import annotations

import json
import sys

from tpufleet.runtime import initialize_jax

ROW = 4  # elements per device


def main() -> int:
    args = initialize_jax()
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    n = jax.device_count()
    mesh = jax.make_mesh((n,), ("d",))
    sharding = NamedSharding(mesh, P("d"))
    full = np.arange(n * ROW, dtype=np.float32).reshape(n, ROW)
    x = jax.make_array_from_callback(full.shape, sharding, lambda index: full[index])
    total = jax.jit(lambda a: a.sum(), out_shardings=NamedSharding(mesh, P()))(x)
    got = float(total.addressable_data(0))
    expected = float(full.sum())
    print(
        json.dumps(
            {
                "process_index": jax.process_index(),
                "process_count": jax.process_count(),
                "devices": n,
                "local_devices": jax.local_device_count(),
                "platform": jax.devices()[0].platform,
                "coordinator": args.coordinator_address if args else None,
                "sum": got,
                "expected": expected,
            }
        ),
        flush=True,
    )
    return 0 if got == expected else 1


if __name__ == "__main__":
    sys.exit(main())
