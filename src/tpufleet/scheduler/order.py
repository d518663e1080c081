"""Walking per-tenant queues in a global order whose keys change as the walk goes (live fair share).

Each tenant's queue is already in its own order (priority, then seq). A heap holds the key of each
tenant's next item; a tenant's key is computed only when its next item is pushed, which is after
the tenant's previous item was processed, so admissions made on the way are seen by the order.

``settle(queue, start)`` lets the caller decide items the moment they reach the front of their
tenant's queue, without a trip through the heap, while their fate cannot depend on what other
tenants do first (for example: their slice type has nothing left to give). That keeps a cycle over
100,000 queued jobs cheap when most of them can only wait; ``settle`` walks the run of such items
itself, so deciding one costs no call.

``walk`` does the same for a queue whose items come in runs that change nothing when their turn
comes (jobs deferred to a later pass): a run of such items takes one trip through the heap instead
of one per item, and is cut short the moment something changes the state its items were decided in.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Callable, Hashable, Iterable, Iterator
from itertools import count
from typing import Any, TypeVar

__all__ = ["Idle", "in_order", "walk"]

T = TypeVar("T")
U = TypeVar("U")
K = TypeVar("K", bound=tuple[object, ...])


def in_order(
    queues: Iterable[tuple[Hashable, list[T]]],
    key: Callable[[U], K],
    settle: Callable[[list[T], int, K | None], tuple[int, U] | None],
) -> Iterator[U]:
    """Yield what ``settle`` makes of the items of all ``queues``, smallest ``key`` first.

    ``settle(queue, start, bound)`` is called when ``queue[start]`` reaches the front of its queue.
    It decides items from ``start`` on (they are skipped) until one it cannot decide, and returns
    that one's index and what it made of it, which goes into the heap under ``key(it)``; None when
    it decided them all. Keys must be unique per item (include an id) so ties never compare further.

    ``bound`` is the smallest key of the other queues' front items, or None while the heap is still
    being filled (then nothing is known to come first). An item whose key is below ``bound`` is the
    very next one in the global order, so ``settle`` may handle it on the spot exactly as the
    consumer would when it is yielded; an item the heap would pop at once is yielded without the
    trip through the heap, for the same reason. Both keep the order, and so the result, exact: they
    only skip a push and a pop that would have been next to each other.
    """
    heap: list[tuple[K, int, list[T], U]] = []
    for _, queue in queues:
        found = settle(queue, 0, None)
        if found is not None:
            index, item = found
            heapq.heappush(heap, (key(item), index, queue, item))
    while heap:
        _, index, queue, item = heapq.heappop(heap)
        while True:
            yield item
            found = settle(queue, index + 1, heap[0][0] if heap else _TOP)
            if found is None:
                break
            index, item = found
            k = key(item)
            if heap and heap[0][0] < k:
                heapq.heappush(heap, (k, index, queue, item))
                break


class Idle:
    """``settle``'s answer for the items ``[start, end)`` of a queue, decided alike: when their turn
    comes they change nothing, and their fate holds while nothing else changes."""

    __slots__ = ("end", "start")

    def __init__(self, start: int, end: int) -> None:  # a plain class: made once per run, often
        self.start, self.end = start, end

    def __repr__(self) -> str:
        return f"Idle({self.start}, {self.end})"


def walk(
    queues: Iterable[list[T]],
    key: Callable[[U], K],
    item_key: Callable[[list[T], int], K],
    settle: Callable[[list[T], int, K | None], tuple[int, U] | Idle | None],
    take: Callable[[U], bool],
    idle: Callable[[list[T], int, int], None],
) -> None:
    """``in_order`` for queues with runs of items that change nothing; hands each item over in turn.

    ``settle(queue, start, bound)`` is called when ``queue[start]`` reaches the front of its queue,
    as for ``in_order``, and may also answer ``Idle(start, end)``: the items of that run are all
    decided as ``queue[start]`` was. Every item's fate is decided when the item before it in its
    queue had its turn; an item that comes back from ``settle`` gets its turn under ``key(it)``
    (``take(it)`` is called, True when it changed the state), a run gets its turn under the key of
    its last item (``item_key(queue, end - 1)``; ``idle(queue, start, end)`` is called). When
    ``take`` changes the state under key k, every run decided before the change is cut after its
    first item whose key is above k: the items up to that one were decided before the change, as
    item by item they would have been, and the rest are settled again, after the change, when that
    one's turn comes. Items in one run must share everything ``item_key`` compares but the last
    fields, which rise along the run. The result is the one a walk of single items would give: the
    same items decided in the same state, and ``take`` and ``idle`` called in the same order.
    """
    # A queue's cell: [queue, number of its one heap entry that still counts]. Entries of runs
    # cut short stay in the heap under their old key and are skipped when they come up.
    heap: list[tuple[K, int, list[Any], tuple[int, U] | Idle]] = []
    decided: list[tuple[list[Any], int, Idle]] = []  # runs decided since the state last changed
    numbers = count()
    stale = 0

    def push(cell: list[Any], k: K, what: tuple[int, U] | Idle) -> None:
        number = cell[1] = next(numbers)
        heapq.heappush(heap, (k, number, cell, what))
        if type(what) is Idle and what.end - what.start > 1:
            decided.append((cell, number, what))  # a run one may cut

    def cut(k: K) -> None:
        nonlocal stale
        for cell, number, run in decided:
            if cell[1] != number:
                continue  # its turn came already
            queue = cell[0]
            last = bisect_right(range(run.end), k, run.start, run.end, key=lambda i: item_key(queue, i))
            if last < run.end - 1:
                cell[1] = number = next(numbers)
                heapq.heappush(heap, (item_key(queue, last), number, cell, Idle(run.start, last + 1)))
                stale += 1
        decided.clear()

    def front(queue: list[T], start: int, bound: K | None) -> tuple[K, tuple[int, U] | Idle] | None:
        while True:
            found = settle(queue, start, bound)
            if not isinstance(found, Idle):
                return None if found is None else (key(found[1]), found)
            k = item_key(queue, found.end - 1)
            if bound is None or not k < bound:
                return k, found
            idle(queue, found.start, found.end)  # the whole run is next
            start = found.end

    for queue in queues:
        first = front(queue, 0, None)
        if first is not None:
            push([queue, -1], *first)
    while heap:
        k, number, cell, what = heapq.heappop(heap)
        if cell[1] != number:
            stale -= 1
            continue  # a run cut short went back in under an earlier key
        queue = cell[0]
        while True:
            if isinstance(what, Idle):
                idle(queue, what.start, what.end)
                start = what.end
            else:
                if take(what[1]) and decided:
                    cut(k)
                start = what[0] + 1
            while stale and heap[0][2][1] != heap[0][1]:
                heapq.heappop(heap)
                stale -= 1
            found = front(queue, start, heap[0][0] if heap else _TOP)
            if found is None:
                cell[1] = -1
                break
            k, what = found
            if heap and heap[0][0] < k:
                push(cell, k, what)
                break


class _Top(tuple):  # type: ignore[type-arg]
    """A bound above every key: the queue is the only one left."""

    __slots__ = ()

    def __gt__(self, other: object) -> bool:
        return True

    def __lt__(self, other: object) -> bool:
        return False


_TOP: Any = _Top()
