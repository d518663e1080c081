"""``tpufleet chaos --replicas``: the leader verdict on hand-made store records (``chaos/fencing.py``),
the plan's leader faults, and the options' one-line errors."""

from __future__ import annotations

import random

import pytest
from click.testing import CliRunner

from tpufleet.chaos import ChaosConfig, plan_faults
from tpufleet.chaos.fencing import AttemptTerms, Write, overlapping_leaders
from tpufleet.chaos.plan import HEAD_KILL, HOST_FAULTS, LEADER_FAULTS
from tpufleet.chaos.verdict import passed
from tpufleet.cli import command
from tpufleet.errors import TpufleetError


def terms(*spans: tuple[int, float, float]) -> list[Write]:
    """Writes of each ``(term, first, last)``: at its first and last time, ids in time order."""
    at = sorted((t, term) for term, first, last in spans for t in (first, last))
    return [Write(i + 1, term, t) for i, (t, term) in enumerate(at)]


def test_terms_one_after_another_pass() -> None:
    assert overlapping_leaders(terms((1, 0.0, 9.9), (2, 10.0, 19.0), (4, 25.0, 30.0))) == []
    assert overlapping_leaders([Write(1, 3, 5.0)]) == []  # one write, one term


def test_overlapping_spans_fail() -> None:
    found = overlapping_leaders(terms((1, 0.0, 12.0), (2, 10.0, 19.0)))
    assert {(f["term"], f["later_term"]) for f in found} == {(1, 2)}  # by the clock and by commit order
    assert (
        "term 1 wrote event 3 (" in found[0]["why"] and "not before term 2 began at 10.0" in found[0]["why"]
    )


def test_a_write_of_a_term_after_a_later_term_began_fails_even_far_later() -> None:
    writes = [*terms((1, 0.0, 5.0), (2, 10.0, 19.0), (3, 20.0, 30.0)), Write(99, 1, 31.0)]
    found = overlapping_leaders(writes)
    assert {(f["term"], f["later_term"]) for f in found} == {(1, 2), (1, 3)}
    assert any("event 99 of term 1 committed after" in f["why"] for f in found)


def test_commit_order_counts_even_when_the_clocks_agree() -> None:
    """A term's write committed (its event id) after a later term's write: caught by the ids."""
    writes = [Write(1, 1, 1.0), Write(2, 2, 5.0), Write(3, 1, 2.0)]
    found = overlapping_leaders(writes)
    assert [f["why"] for f in found] == ["event 3 of term 1 committed after event 2 of term 2"]


def test_an_attempt_ended_by_an_older_term_than_launched_it_fails() -> None:
    ok = [AttemptTerms("j1", 1, 1, 2), AttemptTerms("j2", 1, 2, None), AttemptTerms("j3", 1, None, 3)]
    assert overlapping_leaders(terms((1, 0.0, 1.0)), ok) == []
    found = overlapping_leaders([], [AttemptTerms("j4", 2, 3, 2)])
    assert [(f["term"], f["later_term"]) for f in found] == [(2, 3)] and "j4 attempt 2" in found[0]["why"]


def test_the_verdict_fails_on_overlapping_leaders_and_passes_without_the_key() -> None:
    clean = {"lost": [], "double_runs": [], "leaked_placement_groups": [], "leaked_processes": []}
    assert passed(clean) and passed({**clean, "overlapping_leaders": []})
    assert not passed({**clean, "overlapping_leaders": [{"term": 1, "later_term": 2, "why": "x"}]})


@pytest.mark.parametrize(
    ("cfg", "kinds", "head"),
    [
        (ChaosConfig(minutes=1, replicas=2, db="postgresql://x", sandbox="v4-16:2"), LEADER_FAULTS, False),
        (ChaosConfig(minutes=1, replicas=2, db="postgresql://x"), (*HOST_FAULTS, *LEADER_FAULTS), True),
    ],
)
def test_replicas_plan_every_leader_fault_seeded(
    cfg: ChaosConfig, kinds: tuple[str, ...], head: bool
) -> None:
    plan = plan_faults(cfg, random.Random(5))
    assert plan == plan_faults(cfg, random.Random(5))
    planned = [e.kind for e in plan]
    assert set(planned) - {HEAD_KILL} == set(kinds) and "control_plane_kill" not in planned
    assert (HEAD_KILL in planned) == head
    assert all(6.0 <= e.at <= 51.0 for e in plan if e.kind != HEAD_KILL)


PG = ["--replicas", "2", "--db", "postgresql://h/d"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--replicas", "2"], "--replicas 2 runs replicas on one PostgreSQL database: give --db"),
        (["--replicas", "2", "--db", "sqlite:///x.db"], "PostgreSQL database"),
        (["--db", "postgresql+psycopg://u@h/d"], "--db goes with --replicas N"),
        (["--sandbox", "v4-16:2"], "--sandbox goes with --replicas N"),
        (["--lease-seconds", "2"], "--lease-seconds goes with --replicas N"),
        ([*PG, "--sandbox", "v4-16:2", "--slices", "v4-8:1"], "not with --slices"),
        ([*PG, "--sandbox", "v9-16:2"], "v9"),
        ([*PG, "--server", "http://127.0.0.1:1"], "not with --server"),
    ],
)  # fmt: skip
def test_replica_options_are_checked_in_one_line_exit_2(args: list[str], says: str) -> None:
    result = CliRunner().invoke(command(), ["chaos", *args])  # `main` prints it in one line
    assert isinstance(result.exception, TpufleetError), result.output
    assert result.exception.exit_code == 2 and says in str(result.exception)
    assert "\n" not in str(result.exception)
