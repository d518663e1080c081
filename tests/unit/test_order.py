"""``order.walk`` hands runs of idle items over as a walk of single items (``in_order``) would.

A seeded model of the policy's in-quota pass: each queue's items come in rising key order (priority,
then the queue's "share", which grows every time one of its items changes the state, then seq). An
item either changes the state when its turn comes ("place") or changes nothing ("defer"); what it
is depends on the state when its fate is decided, which is when the item before it in its queue had
its turn. The reference decides every item one at a time through ``in_order``; ``walk`` gets the
same queues with runs of alike items handed back as ``Idle``. Both must decide the same items in
the same state and hand them over in the same order.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from tpufleet.scheduler.order import Idle, in_order, walk


@dataclass(frozen=True)
class Item:
    id: str
    queue: int
    priority: int
    group: int  # items of one queue and group are alike: decided the same in the same state
    seq: int


class Model:
    """The state: a counter of changes, and each queue's share."""

    def __init__(self, rng_seed: int, queues: list[list[Item]]) -> None:
        self.seed = rng_seed
        self.changes = 0
        self.share = [0] * len(queues)
        self.log: list[tuple[str, int, str]] = []  # (item, changes when decided, what it did)

    def fate(self, item: Item) -> str:
        """Whether ``item`` places (changes the state) or defers, given the state now."""
        roll = random.Random(hash((self.seed, item.queue, item.group, self.changes))).random()
        return "place" if roll < 0.3 else "defer"

    def key(self, item: Item) -> tuple[int, int, int, str]:
        return (-item.priority, self.share[item.queue], item.seq, item.id)


def make_queues(seed: int) -> list[list[Item]]:
    rng = random.Random(seed)
    queues: list[list[Item]] = []
    seq = 0
    for q in range(rng.randint(1, 6)):
        items: list[Item] = []
        for _ in range(rng.randint(0, 40)):
            seq += rng.choice([1, 1, 2])
            last = items[-1] if items else None
            if last is not None and rng.random() < 0.8:
                items.append(Item(f"q{q}-{len(items)}", q, last.priority, last.group, seq))
            else:
                items.append(Item(f"q{q}-{len(items)}", q, rng.randint(0, 2), rng.randint(0, 3), seq))
        items.sort(key=lambda i: (-i.priority, i.seq))
        queues.append(items)
    return queues


def reference(seed: int) -> list[tuple[str, int, str]]:
    queues = make_queues(seed)
    model = Model(seed, queues)

    def settle(queue: list[Item], start: int, bound: object) -> tuple[int, tuple[Item, int, str]] | None:
        if start >= len(queue):
            return None
        item = queue[start]
        return start, (item, model.changes, model.fate(item))

    def key(decided: tuple[Item, int, str]) -> tuple[int, int, int, str]:
        return model.key(decided[0])

    for item, when, fate in in_order(enumerate(queues), key, settle):
        model.log.append((item.id, when, fate))
        if fate == "place":
            model.changes += 1
            model.share[item.queue] += 1
    return model.log


def walked(seed: int, cuts: list[int] | None = None) -> list[tuple[str, int, str]]:
    """The log of ``walk``; appends to ``cuts`` how many items each run cut short lost."""
    queues = make_queues(seed)
    model = Model(seed, queues)
    runs: dict[tuple[int, int], tuple[int, int]] = {}  # (queue, start) -> (changes then, end)

    def settle(
        queue: list[Item], start: int, bound: object
    ) -> tuple[int, tuple[Item, int, str]] | Idle | None:
        if start >= len(queue):
            return None
        item = queue[start]
        fate = model.fate(item)
        end = start + 1
        while (
            fate == "defer"
            and end < len(queue)
            and queue[end].group == item.group
            and (queue[end].priority == item.priority)
        ):
            end += 1
        if end == start + 1:
            return start, (item, model.changes, fate)
        runs[item.queue, start] = (model.changes, end)
        return Idle(start, end)

    def take(decided: tuple[Item, int, str]) -> bool:
        item, when, fate = decided
        model.log.append((item.id, when, fate))
        if fate == "place":
            model.changes += 1
            model.share[item.queue] += 1
        return fate == "place"

    def idle(queue: list[Item], start: int, end: int) -> None:
        when, decided_end = runs[queue[start].queue, start]
        if cuts is not None and end < decided_end:
            cuts.append(decided_end - end)
        model.log.extend((item.id, when, "defer") for item in queue[start:end])

    walk(
        queues,
        lambda decided: model.key(decided[0]),
        lambda queue, index: model.key(queue[index]),
        settle,
        take,
        idle,
    )
    return model.log


@pytest.mark.parametrize("seed", range(300))
def test_runs_are_handed_over_as_single_items_would_be(seed: int) -> None:
    expected = reference(seed)
    assert walked(seed) == expected
    assert len(expected) == sum(len(q) for q in make_queues(seed))


def test_the_model_has_runs_that_get_cut() -> None:
    """The seeds above hold runs that a change cuts short (else the test would prove little)."""
    cuts: list[int] = []
    for seed in range(300):
        walked(seed, cuts)
    assert len(cuts) > 50
