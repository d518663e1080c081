"""Walking per-tenant queues in a global order whose keys change as the walk goes (live fair share).

Each tenant's queue is already in its own order (priority, then seq). A heap holds the key of each
tenant's next item; a tenant's key is computed only when its next item is pushed, which is after
the tenant's previous item was processed, so admissions made on the way are seen by the order.

``settle(queue, start)`` lets the caller decide items the moment they reach the front of their
tenant's queue, without a trip through the heap, while their fate cannot depend on what other
tenants do first (for example: their slice type has nothing left to give). That keeps a cycle over
100,000 queued jobs cheap when most of them can only wait; ``settle`` walks the run of such items
itself, so deciding one costs no call.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Any, TypeVar

__all__ = ["in_order"]

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


class _Top(tuple):  # type: ignore[type-arg]
    """A bound above every key: the queue is the only one left."""

    __slots__ = ()

    def __gt__(self, other: object) -> bool:
        return True

    def __lt__(self, other: object) -> bool:
        return False


_TOP: Any = _Top()
