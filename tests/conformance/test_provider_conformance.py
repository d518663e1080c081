"""One conformance suite for the provider seam (``tpufleet.provision.base``): the same tests against
every ``Provider``: memory (a fake clock), GCE through the real ``google-cloud-tpu`` client against
its loopback Cloud TPU API, KubeRay through the real ``kubernetes`` client against its loopback
Kubernetes API (tests/support/gce_api.py, kube_api.py), and the emulator on the shared emulated
fleet. What each provider must do alike (the rules in ``provision/base.py``): create is idempotent
by name, a group becomes ACTIVE with its slices' hosts READY, delete ends it (twice, or for a name
never made, is safe), a request it cannot make is FAILED with the provider's own words, a preempted
spot slice suspends its group, and a restarted provider takes back the groups the one before made.
Requests and states only one provider has are checked in that provider's own file
(tests/unit/test_provider_*.py, tests/integration/test_provider_emulator.py).

The ``Backend`` adapter is the outside world of each: ``settle()`` lets the cloud do what it was
asked (the clock moves on, the queued resource becomes ACTIVE with its nodes, KubeRay reconciles),
``preempt()`` takes a slice away, ``asked()`` counts the writes the provider sent. The emulator's
cases (marked ``integration``: they run in the shared fleet's stream) are those that launch no host:
a launch costs seconds of the fleet's time, and the emulator's lifecycle on a real fleet is
test_provider_emulator.py's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import gce_api
import kube_api
import pytest

from tpufleet import catalog
from tpufleet.control.cluster.memory import FakeClock
from tpufleet.provision.base import GroupState, GroupStatus, HostHealth, Provider, SliceRequest
from tpufleet.provision.memory import MemoryProvider

DELAY_S = 5.0  # the memory provider's time to make or delete a group


@dataclass
class Backend:
    kind: str
    provider: Provider
    settle: Callable[[], None]  # the cloud does what it was asked
    preempt: Callable[[str], None]  # a spot slice is taken away
    doom: Callable[[str, SliceRequest], SliceRequest]  # (words, request): a request that fails so
    asked: Callable[[], int | None] = lambda: None  # writes sent to the cloud (None: no cloud)
    restart: Callable[[], Provider] | None = None  # a new provider on the same cloud
    closing: list[Provider] = field(default_factory=list)

    def group(self, name: str, provider: Provider | None = None) -> GroupStatus | None:
        return next((g for g in (provider or self.provider).poll() if g.name == name), None)


def _memory() -> Iterator[Backend]:
    clock = FakeClock()
    p = MemoryProvider(clock=clock, delay_s=DELAY_S, delete_delay_s=DELAY_S)

    def preempt(slice_name: str) -> None:
        p.preempt(slice_name, notice_s=0)
        clock.advance(0)

    def doom(words: str, request: SliceRequest) -> SliceRequest:
        p.fail_next(words, accelerator_type=request.accelerator_type)
        return request

    yield Backend("memory", p, lambda: clock.advance(DELAY_S), preempt, doom)


def _gce() -> Iterator[Backend]:
    with gce_api.running() as api:

        def settle() -> None:
            for qr_id, qr in list(api.qrs.items()):
                if qr["state"]["state"] == "DELETING":
                    del api.qrs[qr_id]
                    for node_id in [n for n, v in api.nodes.items() if v["queuedResource"].endswith(qr_id)]:
                        del api.nodes[node_id]
                elif qr["state"]["state"] != "ACTIVE":
                    api.set_state(qr_id, "ACTIVE")
                    accelerator = qr["tpu"]["nodeSpec"][0]["node"]["acceleratorType"]
                    api.make_nodes(qr_id, hosts=catalog.slice_type(accelerator).hosts)

        def preempt(slice_name: str) -> None:
            api.nodes[slice_name]["state"] = "PREEMPTED"

        def doom(words: str, request: SliceRequest) -> SliceRequest:
            api.refuse = words  # the API answers every create 400 with these words
            return request

        yield Backend(
            "gce",
            gce_api.provider(api),
            settle,
            preempt,
            doom,
            asked=lambda: len(api.mutations()),
            restart=lambda: gce_api.provider(api),
        )


def _kuberay() -> Iterator[Backend]:
    with kube_api.running() as api:

        def preempt(slice_name: str) -> None:  # the node went: KubeRay deleted the replica's pods
            group, index = slice_name.rsplit("-", 1)
            for name, pod in list(api.pods.items()):
                labels = pod["metadata"]["labels"]
                if (labels["ray.io/group"], labels["ray.io/worker-group-replica-index"]) == (group, index):
                    del api.pods[name]

        def doom(words: str, request: SliceRequest) -> SliceRequest:
            return SliceRequest(request.name, "v5p-8")  # no worker group has it: the provider says so

        yield Backend(
            "kuberay",
            kube_api.provider(api),
            api.reconcile,
            preempt,
            doom,
            asked=lambda: len([p for p in api.patches() if "spec" in p[4]]),  # not the bookkeeping
            restart=lambda: kube_api.provider(api),
        )


def _emulator(request: pytest.FixtureRequest) -> Iterator[Backend]:
    from tpufleet.provision.emulator import EmulatorConfig, EmulatorProvider

    fleet: Any = request.getfixturevalue("fleet")
    # No capacity for v4-16: a group waits and nothing is launched on the shared fleet.
    p = EmulatorProvider(fleet.state_dir, EmulatorConfig(capacity={"v4-16": 0}), interval_s=0.1)

    def doom(words: str, request: SliceRequest) -> SliceRequest:
        p.fail_next(request.name, words)  # FAILED when admitted (no delay): before any launch
        return SliceRequest(request.name, "v6e-4")

    def nothing(*_: object) -> None:
        raise AssertionError("the emulator's cases launch nothing")

    yield Backend("emulator", p, lambda: p.tick(), nothing, doom)


BACKENDS = {"memory": _memory, "gce": _gce, "kuberay": _kuberay}
ALL = ["memory", "gce", "kuberay", pytest.param("emulator", marks=pytest.mark.integration)]
MAKE_SLICES = ["memory", "gce", "kuberay"]  # the cases that make hosts (see the module docstring)
RESTARTABLE = ["gce", "kuberay"]  # the memory provider's groups live in its process


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    made = _emulator(request) if request.param == "emulator" else BACKENDS[request.param]()
    backend = next(made)
    try:
        yield backend
    finally:
        for p in (backend.provider, *backend.closing):
            p.close()
        next(made, None)  # the loopback server stops


def _until(backend: Backend, name: str, done: Callable[[GroupStatus | None], bool]) -> GroupStatus | None:
    """The group once ``done``, letting the cloud act between polls."""
    for _ in range(200):
        g = backend.group(name)
        if done(g):
            return g
        backend.settle()
    raise AssertionError(f"{backend.kind}: group {name} never got there: {g}")


@pytest.mark.parametrize("backend", ALL, indirect=True)
def test_it_is_a_provider_and_create_is_idempotent_by_name(backend: Backend) -> None:
    assert isinstance(backend.provider, Provider) and backend.provider.kind == backend.kind
    assert backend.provider.poll() == []  # nothing of another's (a pool's own slices, the fleet's)
    request = SliceRequest("idem", "v4-16", spot=True)
    backend.provider.create(request)
    asked = backend.asked()
    backend.provider.create(request)  # a retried create: nothing more is asked
    assert backend.asked() == asked
    (g,) = backend.provider.poll()
    assert g.name == "idem" and g.state is not GroupState.FAILED, g
    backend.provider.delete("idem")
    _until(backend, "idem", lambda g: g is None or g.state is GroupState.DELETING)


@pytest.mark.parametrize("backend", MAKE_SLICES, indirect=True)
def test_a_group_becomes_active_with_every_host_of_its_slices_ready(backend: Backend) -> None:
    backend.provider.create(SliceRequest("pair", "v4-16", count=2, spot=True))
    g = backend.group("pair")
    assert g is not None and g.state in (GroupState.WAITING_FOR_RESOURCES, GroupState.PROVISIONING)
    backend.settle()
    g = backend.group("pair")
    assert g is not None and g.state is GroupState.ACTIVE, g
    assert len(g.slices) == 2 and len({s.name for s in g.slices}) == 2
    assert all(s.hosts == (HostHealth.READY, HostHealth.READY) for s in g.slices)  # v4-16: 2 hosts


@pytest.mark.parametrize("backend", MAKE_SLICES, indirect=True)
def test_delete_ends_the_group_and_is_safe_twice_and_for_a_name_never_made(backend: Backend) -> None:
    backend.provider.create(SliceRequest("gone", "v4-16", spot=True))
    backend.provider.create(SliceRequest("kept", "v4-16", spot=True))
    backend.settle()
    backend.provider.delete("gone")
    g = backend.group("gone")
    assert g is None or g.state is GroupState.DELETING, g
    backend.provider.delete("gone")
    backend.provider.delete("never-made")
    backend.settle()
    assert [g.name for g in backend.provider.poll()] == ["kept"]


@pytest.mark.parametrize("backend", ALL, indirect=True)
def test_a_request_it_cannot_make_is_failed_with_the_providers_words_then_deleted(backend: Backend) -> None:
    request = backend.doom("stockout: no capacity in the zone", SliceRequest("doomed", "v4-16"))
    backend.provider.create(request)
    g = _until(backend, "doomed", lambda g: g is not None and g.state is GroupState.FAILED)
    assert g is not None and g.message and g.slices == ()
    if backend.kind != "kuberay":  # KubeRay's words are its own: no worker group for the type
        assert "stockout: no capacity in the zone" in g.message
    asked = backend.asked()
    backend.provider.delete("doomed")  # nothing was made: nothing to ask the cloud
    backend.settle()
    assert _until(backend, "doomed", lambda g: g is None) is None
    assert backend.asked() == asked and backend.provider.poll() == []


@pytest.mark.parametrize("backend", MAKE_SLICES, indirect=True)
def test_a_preempted_spot_slice_suspends_its_group(backend: Backend) -> None:
    backend.provider.create(SliceRequest("spot", "v4-16", spot=True))
    backend.settle()
    g = backend.group("spot")
    assert g is not None and g.state is GroupState.ACTIVE
    backend.preempt(g.slices[0].name)
    g = backend.group("spot")
    assert g is not None and g.state is GroupState.SUSPENDED, g
    assert g.slices[0].hosts and all(h is HostHealth.PREEMPTED for h in g.slices[0].hosts)


@pytest.mark.parametrize("backend", RESTARTABLE, indirect=True)
def test_a_restarted_provider_takes_the_groups_back_as_they_were_and_deletes_them(backend: Backend) -> None:
    """After a restart the slice manager creates again the groups its store knows: a provider finds
    each as it was (GCE: the queued resource exists; KubeRay: its annotation) and can delete it."""
    requests = [SliceRequest("a", "v4-16", spot=True), SliceRequest("b", "v4-16", count=2, spot=True)]
    for r in requests:
        backend.provider.create(r)
    backend.settle()
    before = {g.name: (g.state, g.slices) for g in backend.provider.poll()}
    assert backend.restart is not None
    again = backend.restart()
    backend.closing.append(again)
    for r in requests:
        again.create(r)
    assert {g.name: (g.state, g.slices) for g in again.poll()} == before
    again.delete("b")
    backend.settle()
    assert [g.name for g in again.poll()] == ["a"]
