"""Walking per-tenant queues in a global order whose keys change as the walk goes (live fair share).

Each tenant's queue is already in its own order (priority, then seq). A heap holds the key of each
tenant's next item; a tenant's key is computed only when its next item is pushed, which is after
the tenant's previous item was processed, so admissions made on the way are seen by the order.

``settle(item)`` lets the caller decide an item the moment it reaches the front of its tenant's
queue, without a trip through the heap, when its fate cannot depend on what other tenants do
first (for example: its slice type has nothing left to give). That keeps a cycle over 100,000
queued jobs cheap when most of them can only wait.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import TypeVar

__all__ = ["in_order"]

T = TypeVar("T")
U = TypeVar("U")
K = TypeVar("K", bound=tuple[object, ...])


def in_order(
    queues: Iterable[tuple[Hashable, list[T]]],
    key: Callable[[U], K],
    settle: Callable[[T], U | None],
) -> Iterator[U]:
    """Yield what ``settle`` makes of the items of all ``queues``, smallest ``key`` first.

    ``settle(item)`` is called when the item reaches the front of its queue: None means the caller
    has decided it (it is skipped), anything else goes into the heap under ``key(it)``, which must
    be unique per item (include an id) so ties never compare further.
    """
    heap: list[tuple[K, int, list[T], U]] = []

    def push(queue: list[T], index: int) -> None:
        while index < len(queue):
            item = settle(queue[index])
            if item is not None:
                heapq.heappush(heap, (key(item), index, queue, item))
                return
            index += 1

    for _, queue in queues:
        push(queue, 0)
    while heap:
        _, index, queue, item = heapq.heappop(heap)
        yield item
        push(queue, index + 1)
