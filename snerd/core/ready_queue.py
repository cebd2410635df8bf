"""Two heaps the scheduler is built on: what runs next, and what becomes due next.

`ReadyQueue` orders tasks that may run now: higher `urgency_score` first, and among equal
urgency the lower `seq` first (enqueue order, which upstream left undefined, reference §4.2).
`DueQueue` orders tasks that wait for a time (`execute_at`, a retry delay, a cron tick, a rate
limit): earliest due first, then lower `seq`.

This module owns only ordering. It must never decide what a key means, read a clock (the caller
passes `now_us`) or compare keys with each other: keys need only be hashable, so a task id, a
(shard, id) pair or any other handle works.

Both use lazy deletion (`discard` marks, `pop` skips), with `len()` exact at all times and the
heap rebuilt when dead entries outnumber live ones, so memory stays O(live) and every operation
is O(log n) amortized. A key is in a queue at most once: pushing a key that is already present is
a caller bug and raises (discard it first to move it).
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["DueQueue", "ReadyQueue"]

K = TypeVar("K", bound=Hashable)

# Rebuild the heap when it holds more than this many entries and more dead than live ones; below
# it, dead entries cost less than a rebuild.
_COMPACT_MIN = 64


class ReadyQueue(Generic[K]):
    """A max-heap on urgency, first in first out among equal urgency (by `seq`)."""

    __slots__ = ("_counter", "_heap", "_live")

    def __init__(self) -> None:
        # Entries are (-urgency, seq, counter, key): heapq is a min-heap, so urgency is negated.
        # `counter` is unique per push, so ties never fall through to comparing keys.
        self._heap: list[tuple[float, int, int, K]] = []
        # key -> counter of its live entry; a heap entry whose counter differs is dead.
        self._live: dict[K, int] = {}
        self._counter = 0

    def push(self, key: K, urgency: float, seq: int) -> None:
        """Add `key`.

        Args:
            key: not already in the queue.
            urgency: higher pops first; must not be NaN.
            seq: tie-break among equal urgency, lower pops first (the caller's enqueue order).

        Raises:
            ValueError: `key` is already queued, or `urgency` is NaN.
        """
        if key in self._live:
            raise ValueError(f"{key!r} is already in the ready queue")
        if urgency != urgency:  # NaN (the one value unequal to itself)
            # NaN compares false both ways and would silently corrupt the heap order.
            raise ValueError("urgency must not be NaN")
        self._counter += 1
        self._live[key] = self._counter
        # `+ 0.0` folds -0.0 into 0.0 so the two never differ in the tuple order.
        heapq.heappush(self._heap, (-(urgency + 0.0), seq, self._counter, key))

    def pop(self) -> K:
        """Remove and return the most urgent key (the earliest pushed among equals).

        Raises:
            IndexError: the queue is empty.
        """
        self._drop_dead_top()
        if not self._heap:
            raise IndexError("pop from an empty ReadyQueue")
        key = heapq.heappop(self._heap)[3]
        del self._live[key]
        return key

    def peek(self) -> K | None:
        """The key `pop` would return, or None when empty."""
        self._drop_dead_top()
        return self._heap[0][3] if self._heap else None

    def discard(self, key: K) -> bool:
        """Remove `key` if present; True if it was."""
        if self._live.pop(key, None) is None:
            return False
        self._maybe_compact()
        return True

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, key: object) -> bool:
        return key in self._live

    def __repr__(self) -> str:
        return f"<ReadyQueue of {len(self._live)}>"

    def _drop_dead_top(self) -> None:
        heap, live = self._heap, self._live
        while heap and live.get(heap[0][3]) != heap[0][2]:
            heapq.heappop(heap)

    def _maybe_compact(self) -> None:
        if len(self._heap) > _COMPACT_MIN and len(self._heap) > 2 * len(self._live):
            live = self._live
            self._heap = [e for e in self._heap if live.get(e[3]) == e[2]]
            heapq.heapify(self._heap)


class DueQueue(Generic[K]):
    """A min-heap on due time (microseconds), then `seq`."""

    __slots__ = ("_counter", "_heap", "_live")

    def __init__(self) -> None:
        # Entries are (due_us, seq, counter, key); see ReadyQueue for `counter` and `_live`.
        self._heap: list[tuple[int, int, int, K]] = []
        self._live: dict[K, int] = {}
        self._counter = 0

    def push(self, key: K, due_us: int, seq: int) -> None:
        """Add `key`, due at `due_us`.

        Raises:
            ValueError: `key` is already queued.
        """
        if key in self._live:
            raise ValueError(f"{key!r} is already in the due queue")
        self._counter += 1
        self._live[key] = self._counter
        heapq.heappush(self._heap, (due_us, seq, self._counter, key))

    def pop_due(self, now_us: int) -> list[K]:
        """Remove and return every key due at or before `now_us`, earliest first."""
        heap, live = self._heap, self._live
        due: list[K] = []
        while heap and heap[0][0] <= now_us:
            _, _, counter, key = heapq.heappop(heap)
            if live.get(key) == counter:
                del live[key]
                due.append(key)
        return due

    def next_due(self) -> int | None:
        """The earliest due time among queued keys, or None when empty."""
        heap, live = self._heap, self._live
        while heap and live.get(heap[0][3]) != heap[0][2]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def discard(self, key: K) -> bool:
        """Remove `key` if present; True if it was."""
        if self._live.pop(key, None) is None:
            return False
        if len(self._heap) > _COMPACT_MIN and len(self._heap) > 2 * len(self._live):
            live = self._live
            self._heap = [e for e in self._heap if live.get(e[3]) == e[2]]
            heapq.heapify(self._heap)
        return True

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, key: object) -> bool:
        return key in self._live

    def __repr__(self) -> str:
        return f"<DueQueue of {len(self._live)}>"
