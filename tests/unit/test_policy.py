"""The scheduling policy, one rule per row: a fixture built fluently, and each job's expected fate.

Fates (``outcome``): ``admit`` (in quota), ``borrow`` (admitted beyond quota), ``preempt`` (a victim)
or the ``NotFitCode`` of the job's Wait. Jobs a row does not mention are not checked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from scheduler_builders import Fleet, outcome

from tpufleet.scheduler.policy import decide

W = "WAITING_FOR_FREE_SLICES"
HOL = "RESERVED_FOR_HEAD_OF_LINE"
PRE = "WAITING_FOR_PREEMPTION"
NOBORROW = "QUOTA_EXCEEDED_NO_BORROWING"


@dataclass(frozen=True)
class Case:
    name: str
    fleet: Callable[[], Fleet]
    expect: dict[str, str]


CASES = [
    # -- quota and borrowing ----------------------------------------------------------------------
    Case("in quota and free: admitted", lambda: Fleet().slices("v4-16", 2).tenant("a", v4=8).queued("q", "a"),
         {"q": "admit"}),
    Case("beyond quota, idle capacity: borrowed",
         lambda: Fleet().slices("v4-16", 2).tenant("a", v4=8).running("r", "a").queued("q", "a"),
         {"q": "borrow"}),
    Case("no quota for the generation at all: borrows",
         lambda: Fleet().slices("v4-16", 1).tenant("a", v6e=64).queued("q", "a"), {"q": "borrow"}),
    Case("in-quota job goes before an earlier borrower",
         lambda: Fleet().slices("v4-16", 1).tenant("a").tenant("b", v4=8).queued("qa", "a").queued("qb", "b"),
         {"qb": "admit", "qa": NOBORROW}),
    Case("in-quota job goes before a higher-priority borrower",
         lambda: Fleet().slices("v4-16", 1).tenant("a").tenant("b", v4=8)
         .queued("qa", "a", priority=10).queued("qb", "b"),
         {"qb": "admit", "qa": NOBORROW}),
    Case("borrowers take what in-quota jobs leave idle",
         lambda: Fleet().slices("v4-16", 3).tenant("a").tenant("b", v4=8)
         .queued("qa", "a", num_slices=2).queued("qb", "b"),
         {"qb": "admit", "qa": "borrow"}),
    Case("quota alias v5litepod means v5e",
         lambda: Fleet().slices("v5litepod-16", 2).tenant("a", v5litepod=16)
         .queued("q1", "a", "v5litepod-16").queued("q2", "a", "v5litepod-16"),
         {"q1": "admit", "q2": "borrow"}),
    Case("a tenant's small job does not take the quota headroom its earlier large job waits for",
         lambda: Fleet().slices("v4-16", 3).tenant("a", v4=16).running("r", "a")
         .queued("big", "a", num_slices=2).queued("small", "a"),
         {"big": "borrow", "small": NOBORROW}),
    # -- priority and fair share ------------------------------------------------------------------
    Case("higher priority first within a tenant",
         lambda: Fleet().slices("v4-16", 1).tenant("a", v4=64)
         .queued("low", "a").queued("high", "a", priority=5),
         {"high": "admit", "low": W}),
    Case("equal priority: the tenant below its share goes first, not the earlier job",
         lambda: Fleet().slices("v4-16", 2).tenant("a", v4=16).tenant("b", v4=16).running("r", "a")
         .queued("qa", "a").queued("qb", "b"),
         {"qb": "admit", "qa": W}),
    Case("weights scale the share: weight 3 at 50% ranks before weight 1 at 25%",
         lambda: Fleet().slices("v4-16", 3).tenant("a", v4=16, weight=3).tenant("b", v4=32)
         .running("ra", "a").running("rb", "b").queued("qb", "b").queued("qa", "a"),
         {"qa": "admit", "qb": W}),
    Case("borrowers are ordered by borrowed share over weight (Kueue DRS)",
         lambda: Fleet().slices("v4-16", 4).tenant("a", weight=4).tenant("b")
         .running("ra1", "a", borrowing=True).running("ra2", "a", borrowing=True)
         .running("rb", "b", borrowing=True).queued("qb", "b").queued("qa", "a"),
         {"qa": "borrow", "qb": NOBORROW}),
    Case("share is live within a cycle: two tenants alternate",
         lambda: Fleet().slices("v4-16", 4).tenant("a", v4=64).tenant("b", v4=64)
         .queued("a1", "a").queued("a2", "a").queued("a3", "a")
         .queued("b1", "b").queued("b2", "b").queued("b3", "b"),
         {"a1": "admit", "b1": "admit", "a2": "admit", "b2": "admit", "a3": W, "b3": W}),
    # -- preemption of borrowers ------------------------------------------------------------------
    Case("in-quota job reclaims a borrower of another tenant",
         lambda: Fleet().slices("v4-16", 2).tenant("prod", v4=16).tenant("res")
         .running("r1", "res", borrowing=True).queued("q", "prod", num_slices=2),
         {"r1": "preempt", "q": PRE}),
    Case("in-quota jobs are never preempted",
         lambda: Fleet().slices("v4-16", 2).tenant("prod", v4=16).tenant("res", v4=8)
         .running("r1", "res").queued("q", "prod", num_slices=2),
         {"r1": "-", "q": W}),
    Case("a borrower never preempts",
         lambda: Fleet().slices("v4-16", 2).tenant("prod").tenant("res")
         .running("r1", "res", borrowing=True).running("r2", "res", borrowing=True).queued("q", "prod"),
         {"r1": "-", "r2": "-", "q": NOBORROW}),
    Case("a borrower whose tenant is back within quota is not preempted",
         lambda: Fleet().slices("v4-16", 1).tenant("prod", v4=8).tenant("res", v4=8)
         .running("r1", "res", borrowing=True).queued("q", "prod"),
         {"r1": "-", "q": W}),
    Case("no preemption when even every borrower would not make room",
         lambda: Fleet().slices("v4-16", 3).tenant("prod", v4=24).tenant("res", v4=8)
         .running("in", "res").running("b1", "res", borrowing=True).queued("q", "prod", num_slices=3),
         {"b1": "-", "q": W}),
    Case("victim: lowest priority, then most recently admitted",
         lambda: Fleet().slices("v4-16", 3).tenant("prod", v4=8).tenant("res")
         .running("old", "res", borrowing=True).running("new", "res", borrowing=True)
         .running("vip", "res", borrowing=True, priority=5).queued("q", "prod"),
         {"new": "preempt", "old": "-", "vip": "-", "q": PRE}),
    Case("victims are minimal: one 2-slice borrower rather than two",
         lambda: Fleet().slices("v4-16", 3).tenant("prod", v4=16).tenant("res")
         .running("big", "res", num_slices=2, borrowing=True).running("small", "res", borrowing=True)
         .queued("q", "prod", num_slices=2),
         {"big": "preempt", "small": "-", "q": PRE}),
    Case("free slices count: only the shortfall is preempted",
         lambda: Fleet().slices("v4-16", 3).tenant("prod", v4=16).tenant("res")
         .running("b1", "res", borrowing=True).running("b2", "res", borrowing=True)
         .queued("q", "prod", num_slices=2),
         {"b2": "preempt", "b1": "-", "q": PRE}),
    Case("a preemption in progress is waited for, not repeated",
         lambda: Fleet().slices("v4-16", 2).tenant("prod", v4=8).tenant("res")
         .running("b1", "res", borrowing=True, preempting=True).running("b2", "res", borrowing=True)
         .queued("q", "prod"),
         {"b1": "-", "b2": "-", "q": PRE}),
    Case("slices being freed for one job are not reclaimed twice",
         lambda: Fleet().slices("v4-16", 2).tenant("prod", v4=16).tenant("res")
         .running("b1", "res", borrowing=True).running("b2", "res", borrowing=True)
         .queued("q1", "prod").queued("q2", "prod"),
         {"b2": "preempt", "b1": "preempt", "q1": PRE, "q2": PRE}),
    Case("the freed slices are reserved: a borrower cannot take them",
         lambda: Fleet().slices("v4-16", 3).tenant("prod", v4=16).tenant("res")
         .running("b1", "res", borrowing=True).running("b2", "res", borrowing=True)
         .queued("q", "prod", num_slices=2).queued("other", "res"),
         {"q": PRE, "other": HOL}),
    Case("a victim's slices beyond the need stay promised to its preemptor for the cycle",
         lambda: Fleet().slices("v4-16", 2).tenant("prod", v4=16).tenant("res")
         .running("b", "res", num_slices=2, borrowing=True).queued("q1", "prod").queued("q2", "prod"),
         {"b": "preempt", "q1": PRE, "q2": W}),
    # -- head of line -----------------------------------------------------------------------------
    Case("head of line reserves the free slices: a later small job waits",
         lambda: Fleet().slices("v4-16", 4).tenant("a", v4=64).tenant("b", v4=64)
         .running("r1", "b").running("r2", "b").queued("big", "a", num_slices=3).queued("small", "b"),
         {"big": W, "small": HOL}),
    Case("head of line does not hold other slice types",
         lambda: Fleet().slices("v4-16", 2).slices("v6e-4", 1).tenant("a", v4=64, v6e=64).running("r", "a")
         .queued("big", "a", num_slices=2).queued("other", "a", "v6e-4"),
         {"big": W, "other": "admit"}),
    Case("a small job ahead in order is not held back",
         lambda: Fleet().slices("v4-16", 2).tenant("a", v4=64).running("r", "a")
         .queued("big", "a", num_slices=2).queued("small", "a", priority=1),
         {"small": "admit", "big": W}),
    Case("behind a higher-priority head that cannot fit either (its tenant never preempts its own)",
         lambda: Fleet().slices("v4-16", 3).tenant("a", v4=64, preemption="never").running("r1", "a")
         .running("r2", "a")
         .queued("head", "a", num_slices=2, priority=5).queued("next", "a", num_slices=2),
         {"head": W, "next": "LOWER_PRIORITY_THAN_HEAD"}),
    Case("a borrowing head of line holds back later small borrowers",
         lambda: Fleet().slices("v4-16", 2).tenant("a").tenant("b").running("r", "b", borrowing=True)
         .queued("big", "a", num_slices=2).queued("small", "b"),
         {"big": NOBORROW, "small": HOL}),
    Case("last cycle's head of line keeps its place against an older job of a tenant at equal share",
         lambda: Fleet().slices("v4-16", 2).tenant("a", v4=64).tenant("b", v4=64)
         .queued("old", "a").queued("big", "b", num_slices=2, head_of_line=True),
         {"big": "admit", "old": W}),
    Case("without it the older job goes first",
         lambda: Fleet().slices("v4-16", 2).tenant("a", v4=64).tenant("b", v4=64)
         .queued("old", "a").queued("big", "b", num_slices=2),
         {"old": "admit", "big": W}),
    Case("a higher priority still goes before last cycle's head of line",
         lambda: Fleet().slices("v4-16", 2).tenant("a", v4=64).tenant("b", v4=64)
         .queued("big", "b", num_slices=2, head_of_line=True).queued("urgent", "a", priority=1),
         {"urgent": "admit", "big": W}),
    # -- the fleet --------------------------------------------------------------------------------
    Case("broken and draining slices are never assigned",
         lambda: Fleet().slices("v4-16", 3).broken("v4-16-0").draining("v4-16-1").tenant("a", v4=64)
         .queued("q1", "a").queued("q2", "a"),
         {"q1": "admit", "q2": W}),
    Case("more slices than are intact",
         lambda: Fleet().slices("v4-16", 3).broken("v4-16-0").tenant("a", v4=64)
         .queued("q", "a", num_slices=3),
         {"q": "NOT_ENOUGH_INTACT_SLICES"}),
    Case("more slices than the fleet has",
         lambda: Fleet().slices("v4-16", 2).tenant("a", v4=64).queued("q", "a", num_slices=3),
         {"q": "NO_SUCH_SLICES_IN_FLEET"}),
    Case("a type the fleet does not have",
         lambda: Fleet().slices("v4-16", 2).tenant("a", v6e=64).queued("q", "a", "v6e-16"),
         {"q": "NO_SUCH_SLICES_IN_FLEET"}),
    Case("unknown slice type", lambda: Fleet().slices("v4-16", 1).tenant("a").queued("q", "a", "v9-8"),
         {"q": "UNKNOWN_SLICE_TYPE"}),
    Case("num_slices below one",
         lambda: Fleet().slices("v4-16", 1).tenant("a").queued("q", "a", num_slices=0),
         {"q": "INVALID_NUM_SLICES"}),
    Case("unknown tenant", lambda: Fleet().slices("v4-16", 1).queued("q", "ghost"), {"q": "UNKNOWN_TENANT"}),
    Case("a permanent misfit does not block the queue",
         lambda: Fleet().slices("v4-16", 1).tenant("a", v4=8)
         .queued("bad", "a", num_slices=2).queued("ok", "a"),
         {"bad": "NO_SUCH_SLICES_IN_FLEET", "ok": "admit"}),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_rule(case: Case) -> None:
    decisions = decide(case.fleet().build())
    got = outcome(decisions)
    assert {job: got.get(job, "-") for job in case.expect} == case.expect
