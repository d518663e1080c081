"""A GCE TPU VM's preemption and maintenance notices (``host/gcemetadata.py``, ``host/notices.py``),
watched on a metadata server of our own on 127.0.0.1 with the real header, ETag and
``wait_for_change`` semantics (``tests/support/gce_metadata.py``), and relayed into the control
plane's notice path: the GCE provider's ``preempt_deadline``, then the loop's SPOT stop (SIGTERM,
requeue without a retry, a replacement asked of the Cloud TPU API)."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import gce_api
import pytest
from gce_api import FakeTpuApi
from gce_metadata import MetadataServer
from requeues import Ends

from tpufleet import catalog
from tpufleet.control.cluster.memory import FakeClock, MemoryCluster
from tpufleet.control.loop.provisioner import ProvisionConfig, Provisioner
from tpufleet.control.loop.service import Service, ServiceConfig
from tpufleet.control.store.facade import Store
from tpufleet.control.store.values import JobRequest
from tpufleet.host import gcemetadata, notices
from tpufleet.host.gcemetadata import MAINTENANCE, PREEMPTED, HostNotice, MetadataError, Watcher
from tpufleet.provision.gce import GceConfig, GceProvider, make_client
from tpufleet.provision.memory import slice_info
from tpufleet.scheduler.autoscale import PoolView
from tpufleet.scheduler.policy import decide

LIMIT_S = 30.0  # how long a test waits for a thread before it fails (a hang guard, not a timing check)
IDLE_S = 0.5  # the watchers' pause after an unchanged answer: told apart from the backoff's pauses


@pytest.fixture
def metadata() -> Iterator[MetadataServer]:
    srv = MetadataServer()
    yield srv
    srv.close()


class Pauses:
    """The watcher's pause, recorded per key; it waits a little of each so failures stay cheap."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.seen: dict[str, list[float]] = {}

    def __call__(self, seconds: float) -> bool:
        key = threading.current_thread().name.removeprefix("gce-notice:")
        self.seen.setdefault(key, []).append(seconds)
        return self.stop.wait(min(seconds, 0.05))


def _until(what: Callable[[], object]) -> None:
    done = threading.Event()
    for _ in range(int(LIMIT_S / 0.02)):
        if what():
            return
        done.wait(0.02)
    raise AssertionError("never happened")


def _watch(host: str, board: notices.MemoryBoard, pauses: Pauses | None = None, **kw: float) -> Watcher:
    kw = {"wait_s": 5, **kw}
    return Watcher("spot-0", 1, board.relay, host=host, clock=lambda: 1000.0, pause=pauses, **kw).start()  # type: ignore[arg-type]


def _values(board: notices.MemoryBoard) -> list[tuple[str, str]]:
    return [(n.key, n.value) for n in board.relayed]


def test_false_to_true_relays_a_preemption_and_a_maintenance_event(metadata: MetadataServer) -> None:
    board = notices.MemoryBoard()
    w = _watch(metadata.host, board)
    try:
        _until(lambda: len(board.relayed) == 2)  # the first read of each key
        assert sorted(_values(board)) == [(MAINTENANCE, "NONE"), (PREEMPTED, "FALSE")]
        assert board.deadlines() == {}
        metadata.set(PREEMPTED, "TRUE")  # answers the watcher's held long-poll
        _until(lambda: len(board.relayed) == 3)
        assert board.relayed[-1] == HostNotice("spot-0", 1, PREEMPTED, "TRUE", 1000.0)
        assert board.deadlines() == {"spot-0": 1030.0}  # GCE's 30 s notice
        metadata.set(MAINTENANCE, "TERMINATE_ON_HOST_MAINTENANCE")
        _until(lambda: len(board.relayed) == 4)
        assert board.relayed[-1].value == "TERMINATE_ON_HOST_MAINTENANCE"
        assert board.relayed[-1].deadline == 1060.0
        metadata.set(PREEMPTED, "FALSE")
        metadata.set(MAINTENANCE, "MIGRATE_ON_HOST_MAINTENANCE")  # relayed, but the host stays
        _until(lambda: len(board.relayed) == 6)
        migrate = next(n for n in board.relayed if n.value == "MIGRATE_ON_HOST_MAINTENANCE")
        assert migrate.active and migrate.deadline is None
        assert board.deadlines() == {}
    finally:
        w.stop()
    assert metadata.refused == 0  # every request carried Metadata-Flavor: Google


def test_a_request_without_the_header_is_refused_and_an_answer_without_it_is_not_believed(
    metadata: MetadataServer,
) -> None:
    conn = http.client.HTTPConnection(metadata.host, timeout=10)
    conn.request("GET", "/computeMetadata/v1/instance/preempted")
    assert conn.getresponse().status == 403  # the server's rule, as on GCE
    conn.close()
    assert metadata.refused == 1
    assert gcemetadata.read(metadata.host, PREEMPTED)[0] == "FALSE"
    impostor = MetadataServer(impostor=True)  # answers 200 TRUE, but not as the metadata server
    impostor.set(PREEMPTED, "TRUE")
    board = notices.MemoryBoard()
    try:
        with pytest.raises(MetadataError, match=r"no metadata server.*Metadata-Flavor: Google"):
            gcemetadata.read(impostor.host, PREEMPTED)
        w = _watch(impostor.host, board, Pauses(), backoff_s=0.01, backoff_cap_s=0.04)
        _until(lambda: w.failures >= 4)
        w.stop()
        assert board.relayed == []
    finally:
        impostor.close()


def test_the_watcher_outlives_the_server_with_growing_pauses_and_relays_when_it_is_back(
    metadata: MetadataServer,
) -> None:
    board, pauses = notices.MemoryBoard(), Pauses()
    w = _watch(metadata.host, board, pauses, backoff_s=0.01, backoff_cap_s=0.08, idle_s=IDLE_S)
    port = metadata.server_address[1]
    again = None
    try:
        _until(lambda: len(board.relayed) == 2)
        metadata.close()  # gone: connections refused from now on
        _until(lambda: w.failures >= 12)
        assert w.alive and "metadata server 127.0.0.1" in w.last_error
        for key in (PREEMPTED, MAINTENANCE):  # every failure waited, each pause twice the last, capped
            backoff = [s for s in pauses.seen[key] if s != IDLE_S]
            assert backoff[:5] == [0.01, 0.02, 0.04, 0.08, 0.08]
        assert sum(s != IDLE_S for p in pauses.seen.values() for s in p) >= w.failures
        again = MetadataServer(port)
        again.set(PREEMPTED, "TRUE")
        _until(lambda: board.deadlines() == {"spot-0": 1030.0})
    finally:
        w.stop()
        if again is not None:
            again.close()


def test_a_relay_that_fails_is_tried_again_until_the_notice_is_handed_over(
    metadata: MetadataServer,
) -> None:
    board, pauses, refusals = notices.MemoryBoard(), Pauses(), [2]

    def flaky(notice: HostNotice) -> None:  # the control plane's side away for the first two tries
        if notice.key == PREEMPTED and notice.active and refusals[0] > 0:
            refusals[0] -= 1
            raise ConnectionError("Ray's GCS is away")
        board.relay(notice)

    metadata.set(PREEMPTED, "TRUE")
    w = Watcher("spot-0", 1, flaky, host=metadata.host, clock=lambda: 1000.0, pause=pauses, backoff_s=0.01)
    w.start()
    try:
        _until(lambda: board.deadlines() == {"spot-0": 1030.0})
    finally:
        w.stop()
    assert refusals == [0] and w.failures == 2 and "Ray's GCS is away" in w.last_error
    assert pauses.seen[PREEMPTED] == [0.01, 0.02]


def test_an_answer_that_changes_nothing_is_followed_by_a_pause(metadata: MetadataServer) -> None:
    board, pauses = notices.MemoryBoard(), Pauses()
    w = _watch(metadata.host, board, pauses, idle_s=IDLE_S, wait_s=0)  # the server's timeout: at once
    try:
        _until(lambda: len(pauses.seen.get(PREEMPTED, [])) >= 3)
    finally:
        w.stop()
    assert set(pauses.seen[PREEMPTED]) == {IDLE_S} and w.failures == 0
    assert _values(board).count((PREEMPTED, "FALSE")) == 1  # relayed once, not at every answer


def test_only_a_gce_vm_watches_and_it_asks_the_server_gce_metadata_host_names(
    metadata: MetadataServer,
) -> None:
    board = notices.MemoryBoard()
    env = {"GCE_METADATA_HOST": metadata.host, "TPU_NAME": "spot-0", "TPU_WORKER_ID": "1"}
    assert gcemetadata.watch_from_env(board.relay, env) is None  # the emulator, GKE, a laptop
    assert gcemetadata.watch_from_env(board.relay, {**env, "TPUFLEET_GCE_VM": "1", "TPU_NAME": ""}) is None
    assert metadata.answered + metadata.refused == 0  # never asked
    w = gcemetadata.watch_from_env(board.relay, {**env, "TPUFLEET_GCE_VM": "1"})
    assert w is not None and w.host == metadata.host
    try:
        _until(lambda: len(board.relayed) == 2)
    finally:
        w.stop()
    assert {(n.slice_name, n.worker_id) for n in board.relayed} == {("spot-0", 1)}


def test_published_notices_are_put_cleared_and_read_back_as_deadlines() -> None:
    kv: dict[str, str] = {}

    def get(key: bytes | str) -> str | None:
        return kv.get(key.decode() if isinstance(key, bytes) else key)

    def keys(prefix: str) -> list[str]:
        return [k for k in kv if k.startswith(prefix)]

    def put(key: str, value: str) -> None:
        kv[key] = value

    def publish(n: HostNotice) -> None:
        notices.publish(n, put, lambda key: kv.pop(key, None))

    publish(HostNotice("a-0", 0, PREEMPTED, "FALSE", 5.0))
    assert kv == {}
    publish(HostNotice("a-0", 1, PREEMPTED, "TRUE", 10.0))
    publish(HostNotice("a-0", 0, MAINTENANCE, "TERMINATE_ON_HOST_MAINTENANCE", 1.0))
    publish(HostNotice("b-0", 0, MAINTENANCE, "MIGRATE_ON_HOST_MAINTENANCE", 1.0))
    assert sorted(kv) == [
        "tpufleet:host-notice:a-0:0:instance/maintenance-event",
        "tpufleet:host-notice:a-0:1:instance/preempted",
        "tpufleet:host-notice:b-0:0:instance/maintenance-event",
    ]
    kv["tpufleet:host-notice:junk"] = "{"
    assert notices.published(keys, get) == {"a-0": 40.0}  # the earliest of its hosts'; b-0 stays
    publish(HostNotice("a-0", 0, MAINTENANCE, "NONE", 2.0))
    assert notices.published(keys, get) == {"a-0": 40.0}
    publish(HostNotice("a-0", 1, PREEMPTED, "FALSE", 12.0))
    assert notices.published(keys, get) == {}
    assert notices.published() == {}  # this process is not connected to Ray: nothing, no Ray import


# -- into the control plane ------------------------------------------------------------------------

SPOT = PoolView("v4-spot", "v4-8", min_slices=0, max_slices=2, spot=True)


class GceWorld:
    """The loop with the GCE provider against the loopback Cloud TPU API, on the sandbox cluster: a
    group the API reports ACTIVE joins the sandbox's fleet, as its TPU VMs would join Ray."""

    def __init__(
        self, store: Store, clock: FakeClock, tmp: Path, api: FakeTpuApi, board: notices.MemoryBoard
    ):
        self.store, self.clock, self.api = store, clock, api
        self.cluster = MemoryCluster.sandbox([], job_seconds=20, clock=clock)
        config = GceConfig(project="proj", zone="us-central2-b", ray_address="10.0.0.1:6379")
        self.provider = GceProvider(
            config,
            client=make_client(api.endpoint, anonymous=True),
            clock=clock,
            reclaim_interval_s=0,
            notices=board.deadlines,
        )
        prov = Provisioner(store, self.provider, ProvisionConfig(pools=(SPOT,), retry_after_s=10))
        service_config = ServiceConfig(stop_threads=0, preempt_grace_s=30, cancel_grace_s=10, fail_grace_s=5)
        self.service = Service(
            store, self.cluster, state_dir=tmp, decide=decide, config=service_config, provisioner=prov
        )
        store.tenants.create("a", {"v4": 64})

    def cycle(self) -> None:
        for qr in list(self.api.qrs):  # the API makes each requested slice; its hosts join Ray
            if qr not in {n["queuedResource"].rsplit("/", 1)[-1] for n in self.api.nodes.values()}:
                self.api.set_state(qr, "ACTIVE")
                self.api.make_nodes(qr, hosts=1)
                self.cluster.add_slices(
                    [slice_info(f"{qr}-0", catalog.slice_type("v4-8"), len(self.api.qrs))]
                )
        self.clock.advance(1.0)
        self.service.run_once()

    def until(self, what: Callable[[], bool]) -> None:
        for _ in range(200):
            if what():
                return
            self.cycle()
        raise AssertionError("never happened")


def test_a_relayed_gce_preemption_stops_the_job_requeues_it_without_a_retry_and_replaces_the_slice(
    store: Store, clock: FakeClock, tmp_path: Path, metadata: MetadataServer
) -> None:
    board = notices.MemoryBoard()
    with gce_api.running() as api:
        w = GceWorld(store, clock, tmp_path, api, board)
        try:
            request = JobRequest.build(
                command=("python", "t.py"), accelerator_type="v4-8", env={"TPUFLEET_SANDBOX_SECONDS": "100"}
            )
            job = store.jobs.submit("a", request).id
            w.until(lambda: store.jobs.get(job).state == "RUNNING")
            (first,) = store.jobs.get(job).slices
            assert [q["spot"] for q in api.qrs.values()] == [{}]  # a spot queued resource
            # The slice's host watches its metadata server; the relay is the control plane's board.
            watcher = Watcher(first, 0, board.relay, host=metadata.host, clock=clock, wait_s=5).start()
            try:
                _until(lambda: len(board.relayed) == 2)
                w.cycle()
                assert store.jobs.get(job).state == "RUNNING"  # no notice yet: nothing happens
                metadata.set(PREEMPTED, "TRUE")
                _until(lambda: board.deadlines() != {})
            finally:
                watcher.stop()
            ends = Ends.on(w.service, store)
            w.cycle()  # a second later the notice reaches the loop: SIGTERM to every process at once
            w.until(lambda: store.jobs.get(job).attempt == 2)
            j = ends.at_end(job)
            assert (j.state, j.reason_code, j.failures) == ("QUEUED", "PREEMPTED_BY_PROVIDER", 0)
            a1 = j.attempts[0]
            assert a1.state == "PREEMPTED" and f"preempts spot slice {first} in 29 s" in (a1.message or "")
            assert all(c["exit_code"] == -15 for c in a1.exit_codes)  # SIGTERM, before the deadline
            w.until(lambda: store.jobs.get(job).state == "RUNNING")
            (second,) = store.jobs.get(job).slices
            assert second != first and len(api.qrs) == 2  # a replacement was asked of the API
        finally:
            w.provider.close()
