"""The emulator provider's state machine (capacity, delay, failures, preemption notice), with a
fake clock and observed slices given by the test; the fleet side runs in
tests/integration/test_provider_emulator.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpufleet.errors import ConflictError, SpecError
from tpufleet.provision.base import GroupState, HostHealth, SliceRequest
from tpufleet.provision.emulator import EmulatorConfig, Launch, Machine, Reap, Remove, SliceSeen


def up(*names: str, hosts: int = 1) -> dict[str, SliceSeen]:
    return {n: SliceSeen(launched=True, alive=(True,) * hosts) for n in names}


def state(m: Machine, name: str) -> GroupState:
    return next(g.state for g in m.status({}) if g.name == name)


def test_delay_then_launch_then_active_once_every_host_is_up() -> None:
    m = Machine(EmulatorConfig(delay_s=10))
    m.create(SliceRequest("train", "v4-16", count=2))
    assert m.step(0, {}) == []
    assert state(m, "train") is GroupState.PROVISIONING
    assert m.step(9.9, {}) == []
    assert m.step(10, {}) == [Launch("train-0", "v4-16"), Launch("train-1", "v4-16")]
    half = {"train-0": SliceSeen(True, (True, True)), "train-1": SliceSeen(True, (True, False))}
    assert m.step(11, half) == []
    assert state(m, "train") is GroupState.PROVISIONING
    m.step(12, up("train-0", "train-1", hosts=2))
    (st,) = m.status(up("train-0", "train-1", hosts=2))
    assert st.state is GroupState.ACTIVE
    assert [s.name for s in st.slices] == ["train-0", "train-1"]
    assert st.slices[0].hosts == (HostHealth.READY, HostHealth.READY)


def test_beyond_capacity_a_request_waits_with_a_message_until_capacity_frees() -> None:
    m = Machine(EmulatorConfig(capacity={"v6e-4": 2}))
    m.create(SliceRequest("a", "v6e-4", count=2))
    m.create(SliceRequest("b", "v6e-4"))
    m.create(SliceRequest("c", "v4-8"))  # another type: not limited
    actions = m.step(0, {})
    assert Launch("c-0", "v4-8") in actions and Launch("b-0", "v6e-4") not in actions
    b = next(g for g in m.status({}) if g.name == "b")
    assert b.state is GroupState.WAITING_FOR_RESOURCES
    assert "no capacity for 1 x v6e-4: 2 of 2 slices in use" in b.message
    m.delete("a")
    assert m.step(1, up("a-0", "a-1")) == [Remove("a-0"), Remove("a-1")]
    assert state(m, "a") is GroupState.DELETING
    assert state(m, "b") is GroupState.WAITING_FOR_RESOURCES  # a deleting group still holds capacity
    assert m.step(2, {}) == [Launch("b-0", "v6e-4")]  # a's hosts are gone: a is dropped, b admitted
    assert [g.name for g in m.status({})] == ["b", "c"]


def test_injected_failure_shows_after_the_delay_and_only_as_often_as_asked() -> None:
    m = Machine(EmulatorConfig(delay_s=5))
    m.fail_next("v4-8", "stockout: no v4-8 in us-central2-b")
    m.create(SliceRequest("x", "v4-8"))
    m.step(0, {})
    assert state(m, "x") is GroupState.PROVISIONING
    assert m.step(5, {}) == []
    (st,) = m.status({})
    assert (st.state, st.message) == (GroupState.FAILED, "stockout: no v4-8 in us-central2-b")
    m.delete("x")
    m.step(6, {})
    m.create(SliceRequest("x", "v4-8"))  # the retry: the failure was for one request only
    m.step(7, {})
    assert m.step(12, {}) == [Launch("x-0", "v4-8")]


def test_configured_failures_apply_by_name_or_type() -> None:
    m = Machine(EmulatorConfig(failures={"doomed": "quota exceeded"}))
    m.create(SliceRequest("doomed", "v4-8"))
    m.create(SliceRequest("fine", "v4-8"))
    assert m.step(0, {}) == [Launch("fine-0", "v4-8")]
    assert {g.name: g.state for g in m.status({})} == {
        "doomed": GroupState.FAILED,
        "fine": GroupState.PROVISIONING,
    }


def test_a_slice_that_cannot_be_made_fails_its_group_and_undoes_the_rest() -> None:
    m = Machine()
    m.create(SliceRequest("g", "v4-8", count=2))
    m.step(0, {})
    assert m.fail("g-1", "the fleet already has a slice named g-1") == [Remove("g-0")]
    (st,) = m.status({})
    assert (st.state, st.message) == (GroupState.FAILED, "the fleet already has a slice named g-1")
    assert m.fail("g-1", "again") == []  # only a provisioning group fails


def test_hosts_that_never_join_fail_the_group_and_are_removed() -> None:
    m = Machine(EmulatorConfig(join_timeout_s=60))
    m.create(SliceRequest("slow", "v4-8"))
    m.step(0, {})
    assert m.step(60, {"slow-0": SliceSeen(True, (False,))}) == []
    assert m.step(61, {"slow-0": SliceSeen(True, (False,))}) == [Remove("slow-0")]
    (st,) = m.status({})
    assert st.state is GroupState.FAILED and "did not join Ray within 60s" in st.message


def test_notice_reports_the_deadline_then_reaps_then_suspends() -> None:
    m = Machine()
    m.create(SliceRequest("spot", "v4-16", spot=True))
    m.step(0, {})
    m.step(1, up("spot-0", hosts=2))
    noticed = {"spot-0": SliceSeen(True, (True, True), notice=31.0)}
    assert m.step(2, noticed) == []
    (st,) = m.status(noticed)
    assert st.state is GroupState.ACTIVE
    assert st.slices[0].preempt_deadline == 31.0
    assert st.slices[0].hosts == (HostHealth.READY, HostHealth.READY)
    assert m.step(31, noticed) == [Reap("spot-0")]
    gone = {"spot-0": SliceSeen(True, (False, False), notice=31.0, notice_done=True)}
    m.step(32, gone)
    (st,) = m.status(gone)
    assert st.state is GroupState.SUSPENDED and "spot-0 was preempted" in st.message
    assert st.slices[0].hosts == (HostHealth.PREEMPTED, HostHealth.PREEMPTED)
    assert st.slices[0].preempt_deadline is None


def test_a_dead_host_without_notice_is_repairing() -> None:
    m = Machine()
    m.create(SliceRequest("g", "v4-16"))
    m.step(0, {})
    m.step(1, up("g-0", hosts=2))
    hurt = {"g-0": SliceSeen(True, (True, False))}
    m.step(2, hurt)
    (st,) = m.status(hurt)
    assert st.state is GroupState.ACTIVE
    assert st.slices[0].hosts == (HostHealth.READY, HostHealth.REPAIRING)


def test_create_is_idempotent_by_name_and_refuses_a_different_request() -> None:
    m = Machine()
    m.create(SliceRequest("g", "v4-8"))
    m.create(SliceRequest("g", "v4-8"))
    assert len(m.status({})) == 1
    with pytest.raises(ConflictError, match="exists with another request"):
        m.create(SliceRequest("g", "v4-8", count=2))
    m.delete("g")
    m.delete("never-made")  # idempotent too
    assert m.step(0, {}) == []
    assert m.status({}) == []


@pytest.mark.parametrize(
    ("request_", "match"),
    [
        (SliceRequest("Bad_Name", "v4-8"), "lowercase letters"),
        (SliceRequest("ok", "v4-9"), "v4-8"),
        (SliceRequest("ok", "v4-8", count=0), "count must be >= 1"),
    ],
)
def test_bad_requests_are_spec_errors(request_: SliceRequest, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        Machine().create(request_)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--notice", "-1"], "--notice must be >= 0 seconds, got -1"),
        (["--notice", "5"], "no emulated fleet in"),
    ],
)
def test_preempt_with_notice_user_errors_exit_2(args: list[str], message: str, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from tpufleet.cli import command
    from tpufleet.errors import TpufleetError

    where = tmp_path / "none"
    result = CliRunner().invoke(
        command(), ["emulate", "preempt", "tpu-v4-16-0", *args, "--state-dir", str(where)]
    )
    assert isinstance(result.exception, TpufleetError), (result.output, result.exception)
    assert result.exception.exit_code == 2 and message in str(result.exception)
    assert not (where / "notices.json").exists()
