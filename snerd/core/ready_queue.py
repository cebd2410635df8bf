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
from collections import deque
from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

__all__ = ["DueQueue", "ReadyQueue"]

K = TypeVar("K", bound=Hashable)

# Rebuild the heap when it holds more than this many entries and more dead than live ones; below
# it, dead entries cost less than a rebuild.
_COMPACT_MIN = 64


class _Level(Generic[K]):
    """The entries of one urgency in a `ReadyQueue`: (seq, counter, key), lowest first.

    Tasks mostly arrive in `seq` order (the enqueue order), so entries pushed in order go to
    the back of a deque (no comparisons, popped from the front in O(1), however deep the
    queue); one pushed behind the last (a retry, a task made ready again) goes into a small
    heap beside it. The head is the lower of the two fronts."""

    __slots__ = ("dropped", "fifo", "last_seq", "side")

    def __init__(self) -> None:
        self.fifo: deque[tuple[int, int, K]] = deque()
        self.side: list[tuple[int, int, K]] = []
        #: The seq of the last entry appended to `fifo` (counters only grow, so an entry of
        #: that seq or more belongs after it).
        self.last_seq = -(1 << 63)
        #: Dead entries `head` dropped since the queue last counted them.
        self.dropped = 0

    def head(self, live: dict[K, int]) -> tuple[int, int, K] | None:
        """The lowest live entry (dropping dead ones in front of it, counted in `dropped`),
        or None."""
        fifo, side = self.fifo, self.side
        while fifo and live.get(fifo[0][2]) != fifo[0][1]:
            fifo.popleft()
            self.dropped += 1
        while side and live.get(side[0][2]) != side[0][1]:
            heapq.heappop(side)
            self.dropped += 1
        if fifo:
            if side and (side[0][0], side[0][1]) < (fifo[0][0], fifo[0][1]):
                return side[0]
            return fifo[0]
        return side[0] if side else None

    def take(self, entry: tuple[int, int, K]) -> None:
        """Remove `entry`, the head just returned by `head`."""
        if self.fifo and self.fifo[0] is entry:
            self.fifo.popleft()
        else:
            heapq.heappop(self.side)


class ReadyQueue(Generic[K]):
    """A max-priority queue on urgency, first in first out among equal urgency (by `seq`).

    One level per distinct urgency (`_Level`: a deque for entries pushed in `seq` order, a
    heap for the rest) and a heap of the urgencies: pushing and popping cost O(1) for the
    usual task, plus O(log u) in the number of distinct urgencies, not O(log n) in the
    queue's depth (a heap of 100,000 tasks took ~17 tuple comparisons a pop).
    """

    __slots__ = ("_counter", "_entries", "_levels", "_live", "_urgencies")

    def __init__(self) -> None:
        #: -urgency -> its level; the heap of the -urgency of every level with entries.
        self._levels: dict[float, _Level[K]] = {}
        self._urgencies: list[float] = []
        # key -> counter of its live entry; an entry whose counter differs is dead.
        # `counter` is unique per push, so ties never fall through to comparing keys.
        self._live: dict[K, int] = {}
        self._counter = 0
        #: Entries held, live and dead (for compaction).
        self._entries = 0

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
        counter = self._counter
        self._live[key] = counter
        # `+ 0.0` folds -0.0 into 0.0 so the two are one level.
        level_key = -(urgency + 0.0)
        level = self._levels.get(level_key)
        if level is None:  # (a level is in `_levels` exactly while in `_urgencies`)
            level = self._levels[level_key] = _Level()
            heapq.heappush(self._urgencies, level_key)
        if seq >= level.last_seq:
            level.fifo.append((seq, counter, key))
            level.last_seq = seq
        else:
            heapq.heappush(level.side, (seq, counter, key))
        self._entries += 1

    def push_run(self, keys: list[K], seqs: list[int], urgency: float) -> None:
        """`push(key, urgency, seq)` for each key and seq in turn, in one call (the committed
        run of plain enqueues, `Outcomes._enqueues_committed`). On an error the keys before the
        offending one are pushed, as with the calls one by one.

        Raises:
            ValueError: a key is already queued, or `urgency` is NaN.
        """
        if urgency != urgency:
            raise ValueError("urgency must not be NaN")
        if not keys:
            return
        live = self._live
        level_key = -(urgency + 0.0)
        level = self._levels.get(level_key)
        created = level is None
        if level is None:
            level = self._levels[level_key] = _Level()
            heapq.heappush(self._urgencies, level_key)
        fifo = level.fifo
        counter = self._counter
        last_seq = level.last_seq
        pushed = 0
        try:
            for key, seq in zip(keys, seqs, strict=True):
                if key in live:
                    raise ValueError(f"{key!r} is already in the ready queue")
                counter += 1
                live[key] = counter
                if seq >= last_seq:
                    fifo.append((seq, counter, key))
                    last_seq = seq
                else:
                    heapq.heappush(level.side, (seq, counter, key))
                pushed += 1
        finally:
            self._counter = counter
            level.last_seq = last_seq
            self._entries += pushed
            if created and not pushed:
                # (Nothing went in: a new level must not stay empty in `_levels`.)
                del self._levels[level_key]
                self._urgencies.remove(level_key)
                heapq.heapify(self._urgencies)

    def pop(self) -> K:
        """Remove and return the most urgent key (the earliest pushed among equals).

        Raises:
            IndexError: the queue is empty.
        """
        found = self._top()
        if found is None:
            raise IndexError("pop from an empty ReadyQueue")
        level, entry = found
        level.take(entry)
        self._entries -= 1
        key = entry[2]
        del self._live[key]
        return key

    def pop_many(self, n: int) -> list[K]:
        """Remove and return up to `n` keys, most urgent first: what `n` calls of `pop` would
        return (all of them when fewer are queued), in one call (`TaskBook.dispatch` filling
        free worker slots). Runs of entries pushed in `seq` order are taken from the front of
        their level's deque without a look at the heaps."""
        keys: list[K] = []
        live = self._live
        while len(keys) < n:
            found = self._top()
            if found is None:
                break
            level, entry = found
            level.take(entry)
            self._entries -= 1
            key = entry[2]
            del live[key]
            keys.append(key)
            if level.side:
                continue  # (the next may be in either: `_top` compares)
            # The top level stays the top while nothing is pushed; with its heap empty, its
            # next live entry is the next live one in its deque.
            fifo = level.fifo
            while fifo and len(keys) < n:
                _, counter, key = fifo.popleft()
                self._entries -= 1
                if live.get(key) == counter:
                    del live[key]
                    keys.append(key)
        return keys

    def peek(self) -> K | None:
        """The key `pop` would return, or None when empty."""
        found = self._top()
        return found[1][2] if found is not None else None

    def discard(self, key: K) -> bool:
        """Remove `key` if present; True if it was."""
        if self._live.pop(key, None) is None:
            return False
        self._maybe_compact()
        return True

    def __len__(self) -> int:
        return len(self._live)

    def queued(self) -> Iterator[K]:
        """The queued keys, in no particular order (for `invariants` checks)."""
        return iter(self._live)

    def __contains__(self, key: object) -> bool:
        return key in self._live

    def __repr__(self) -> str:
        return f"<ReadyQueue of {len(self._live)}>"

    def _top(self) -> tuple[_Level[K], tuple[int, int, K]] | None:
        """The most urgent level with a live entry, and that entry; levels found empty on the
        way leave the heap of urgencies."""
        urgencies, levels, live = self._urgencies, self._levels, self._live
        while urgencies:
            level = levels[urgencies[0]]
            entry = level.head(live)
            if level.dropped:
                self._entries -= level.dropped
                level.dropped = 0
            if entry is not None:
                return level, entry
            del levels[heapq.heappop(urgencies)]
        return None

    def _maybe_compact(self) -> None:
        if self._entries > _COMPACT_MIN and self._entries > 2 * len(self._live):
            live = self._live
            levels: dict[float, _Level[K]] = {}
            entries = 0
            for level_key, old in self._levels.items():
                kept = sorted(
                    e for e in [*old.fifo, *old.side] if live.get(e[2]) == e[1]
                )
                if not kept:
                    continue
                level = levels[level_key] = _Level()
                level.fifo.extend(kept)
                level.last_seq = kept[-1][0]
                entries += len(kept)
            self._levels = levels
            self._urgencies = list(levels)
            heapq.heapify(self._urgencies)
            self._entries = entries


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

    def queued(self) -> Iterator[K]:
        """The queued keys, in no particular order (for `invariants` checks)."""
        return iter(self._live)

    def __contains__(self, key: object) -> bool:
        return key in self._live

    def __repr__(self) -> str:
        return f"<DueQueue of {len(self._live)}>"
