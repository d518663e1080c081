"""A GCE VM's preemption notice, relayed through Ray end to end (issue 34, part 5): the runner actor
on an emulated host, told it is a GCE VM (``TPUFLEET_GCE_VM=1``) and where its metadata server is
(``GCE_METADATA_HOST``, a server of our own on 127.0.0.1 with the real header and ``wait_for_change``
semantics), watches the notice keys and publishes what they announce in the fleet's Ray KV; a process
connected to Ray reads it back as the slice's deadline (``notices.published``, what the GCE provider
reports as ``preempt_deadline``), and reads nothing once the notice is withdrawn. The watcher's rules
and the provider's handling are tested without Ray in ``tests/unit/test_gce_notices.py``."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import ray
from gce_metadata import MetadataServer
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from tpufleet.control.ray.client import RayExecutor
from tpufleet.host import gcemetadata, notices
from tpufleet.host.runner import NAMESPACE, RemoteRunner

pytestmark = pytest.mark.integration

DEADLINE_S = 60.0


def wait(what: str, ok: Callable[[], bool], show: Callable[[], object]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not ok():
        assert time.monotonic() < deadline, f"not within {DEADLINE_S:g} s: {what}; now {show()}"
        time.sleep(0.1)


@pytest.fixture
def metadata() -> Iterator[MetadataServer]:
    server = MetadataServer()
    yield server
    server.close()


def test_a_gce_hosts_runner_relays_its_preemption_notice_through_rays_kv(
    ray_client: object, metadata: MetadataServer
) -> None:
    info = next(s for s in RayExecutor().inventory() if s.accelerator_type == "v4-16")
    host = info.hosts[1]  # worker 1: a notice from any host is the slice's
    env = {gcemetadata.GCE_VM_VAR: "1", gcemetadata.HOST_VAR: metadata.host}
    runner: Any = RemoteRunner.options(
        name=f"test-gce-notices-{uuid.uuid4().hex[:8]}",
        namespace=NAMESPACE,
        scheduling_strategy=NodeAffinitySchedulingStrategy(host.node_id, soft=False),
        runtime_env={"env_vars": env},
    ).remote(info.name, 1)
    try:
        assert ray.get(runner.ping.remote(), timeout=60)["node_id"] == host.node_id
        wait("the runner asks the metadata server", lambda: metadata.answered >= 2, lambda: metadata.answered)
        assert notices.published() == {}  # FALSE and NONE announce nothing

        before = time.time()
        metadata.set(gcemetadata.PREEMPTED, "TRUE")
        wait("the notice in Ray's KV", lambda: info.name in notices.published(), notices.published)
        deadline = notices.published()[info.name]
        assert before + gcemetadata.PREEMPT_NOTICE_S <= deadline <= time.time() + gcemetadata.PREEMPT_NOTICE_S
        assert metadata.refused == 0  # every request carried Metadata-Flavor: Google

        metadata.set(gcemetadata.PREEMPTED, "FALSE")  # withdrawn (a slice whose name came back)
        wait("the notice gone from Ray's KV", lambda: notices.published() == {}, notices.published)
    finally:
        ray.kill(runner)
