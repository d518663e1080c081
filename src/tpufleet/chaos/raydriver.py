"""The chaos soak's Ray job: ``python raydriver.py TOKEN SECONDS``, run by Ray's job submission.

It reserves the job's admitted slices with ``ray.util.tpu.SlicePlacementGroup``, as Ray Train
does, and runs one task per host on them; each task runs the host program (``hostjob.py``, found
next to this file) in the Ray worker on that host, whose environment has the host contract's
``TPU_NAME`` and ``TPU_WORKER_ID``; ``TPUFLEET_CHECKPOINT_DIR`` and ``TPUFLEET_ATTEMPT`` come with
the job's environment. Started by path, like the host program.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path
from typing import Any

HOSTJOB = str(Path(__file__).resolve().with_name("hostjob.py"))


def run_host(path: str, argv: list[str]) -> str:
    """One host's part, in a Ray worker: the host program's ``main(argv)``; returns ``slice/worker``."""
    runpy.run_path(path)["main"](argv)
    return os.environ.get("TPU_NAME", "-") + "/" + os.environ.get("TPU_WORKER_ID", "-")


def main(argv: list[str]) -> int:
    """``argv``: TOKEN SECONDS, handed to every host's program."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    from ray.util.tpu import SlicePlacementGroup

    ray.init()
    group = SlicePlacementGroup(
        topology=os.environ["TPUFLEET_TOPOLOGY"],
        accelerator_version=os.environ["TPUFLEET_ACCELERATOR_TYPE"].rsplit("-", 1)[0],
        num_slices=len(os.environ["TPUFLEET_SLICES"].split(",")),
    )
    reserved = group.placement_group
    assert reserved is not None  # made by the constructor
    ray.get(reserved.ready())
    host: Any = ray.remote(num_cpus=0)(run_host)
    ran = ray.get(
        [
            host.options(
                resources={"TPU": group.devices_per_host},
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    reserved, placement_group_bundle_index=i
                ),
            ).remote(HOSTJOB, argv)
            for i in range(group.num_bundles)
        ]
    )
    print("chaos: ran on", " ".join(sorted(ran)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
