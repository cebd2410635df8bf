"""Sliding 60-second rate windows, one per `rate_limit_group`.

This module owns the rule "at most `limit` dispatches of a group in any 60 s window". It must
never read a clock (every call carries `now_us`), persist anything, or decide what is dispatched:
the caller asks `allows`, dispatches, then `record`s; after a restart it `restore`s the dispatch
times it finds in the logs.

Why sliding and not upstream's fixed window (reference §4.4): a fixed window reset every 60 s
lets 2 x limit through around a boundary. Here a window is any half-open interval
`(a, a + 60 s]` of microseconds, and `allows(t)` is true only if adding a dispatch at `t` keeps
*every* window that contains `t` at or under `limit`. When all recorded times are at or before
`t` (one node, a clock that does not step back) that is the familiar check "fewer than `limit`
dispatches in `(t - 60 s, t]`", found by binary search. Restored times can lie after `t` (another
daemon's clock runs ahead, or this one stepped back); those later windows are checked too, so the
law holds across the whole queue either way.

Memory: each group keeps a sorted list of dispatch times. Times that can no longer share a window
with any query at or after the latest `now_us` seen (the high-water mark) are dropped, and of the
times at or before the high-water mark only the newest `cap` are kept, `cap` being the largest
limit asked for the group so far. Dropping more than that cannot change any answer for a query at
or after the high-water mark, and holds memory to about `limit` entries per group (plus any times
restored from ahead of this node's clock, until it catches up). The cost: a query whose `now_us`
is more than 60 s before the high-water mark (a clock stepped back) sees less history than it
would have, and `count` never reports more than `cap`.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["WINDOW_US", "RateWindows"]

#: The length of a rate window: one minute, in microseconds.
WINDOW_US = 60_000_000


@dataclass(slots=True, kw_only=True)
class _Group:
    # Dispatch times, ascending; duplicates allowed (two dispatches in the same microsecond).
    times: list[int] = field(default_factory=list)
    # The largest limit asked for this group; None before the first ask.
    cap: int | None = None
    # Restored times not yet merged into `times`: a log replay restores one record at a time,
    # and sorting on each would make loading quadratic. Merged by the next call that reads.
    pending: list[int] = field(default_factory=list)


class RateWindows:
    """Dispatch times per group and the sliding-window checks over them."""

    WINDOW_US = WINDOW_US

    __slots__ = ("_groups", "_high_water")

    def __init__(self) -> None:
        self._groups: dict[str, _Group] = {}
        self._high_water: int | None = None

    def allows(self, group: str, limit: int, now_us: int) -> bool:
        """Whether one more dispatch of `group` at `now_us` keeps every window within `limit`.

        Raises:
            ValueError: `limit` is less than 1.
        """
        state = self._touch(group, limit, now_us)
        return state is None or not _full_somewhere(state.times, limit, now_us)

    def record(self, group: str, now_us: int) -> None:
        """Note one dispatch of `group` at `now_us` (in or out of time order)."""
        state = self._groups.get(group)
        if state is None:
            state = self._groups[group] = _Group()
        _settle(state)
        bisect.insort(state.times, now_us)
        self._advance(now_us)
        self._prune(group, state)

    def next_allowed_us(self, group: str, limit: int, now_us: int) -> int:
        """The earliest time at or after `now_us` at which `allows` would be true.

        Raises:
            ValueError: `limit` is less than 1.
        """
        state = self._touch(group, limit, now_us)
        if state is None:
            return now_us
        times = state.times
        if not _full_somewhere(times, limit, now_us):
            return now_us
        # A time t becomes allowed only when some dispatch e leaves the last full window that
        # contained t - 1, i.e. at t = e + W; so only those instants need checking, in order.
        previous = None
        for e in times[bisect.bisect_right(times, now_us - WINDOW_US) :]:
            candidate = e + WINDOW_US
            if candidate == previous:
                continue
            previous = candidate
            if not _full_somewhere(times, limit, candidate):
                return candidate
        raise AssertionError("the window after the last dispatch is always open")

    def count(self, group: str, now_us: int) -> int:
        """Dispatches of `group` in `(now_us - 60 s, now_us]` (at most the group's cap)."""
        self._advance(now_us)
        state = self._groups.get(group)
        if state is None:
            return 0
        _settle(state)
        self._prune(group, state)
        if group not in self._groups:
            return 0
        return _count_in(state.times, now_us - WINDOW_US, now_us)

    def restore(self, group: str, times: Iterable[int]) -> None:
        """Add dispatch times read back from the logs, in any order.

        Cheap to call once per log record: the times are merged and pruned by the next call that
        reads the group.
        """
        state = self._groups.get(group)
        if state is None:
            state = self._groups[group] = _Group()
        state.pending.extend(times)
        if not state.times and not state.pending:
            del self._groups[group]

    def retained(self, group: str) -> int:
        """How many dispatch times are held for `group` (for memory checks and tests)."""
        state = self._groups.get(group)
        if state is None:
            return 0
        _settle(state)
        self._prune(group, state)
        return len(state.times)

    def _touch(self, group: str, limit: int, now_us: int) -> _Group | None:
        if limit < 1:
            raise ValueError(f"a rate limit must be at least 1, got {limit}")
        self._advance(now_us)
        state = self._groups.get(group)
        if state is None:
            return None
        if state.cap is None or limit > state.cap:
            state.cap = limit
        _settle(state)
        self._prune(group, state)
        return self._groups.get(group)

    def _advance(self, now_us: int) -> None:
        if self._high_water is None or now_us > self._high_water:
            self._high_water = now_us

    def _prune(self, group: str, state: _Group) -> None:
        high = self._high_water
        if high is None:
            return
        times = state.times
        # A time at or before high - W lies in no window (a, a + W] with a >= high - W, and every
        # window containing a query t >= high has such an a.
        del times[: bisect.bisect_right(times, high - WINDOW_US)]
        if state.cap is not None:
            # Of the times at or before `high`, only the newest `cap` can matter: a window that
            # reaches an older one also holds all `cap` newer ones, so it is full either way.
            at_or_before = bisect.bisect_right(times, high)
            if at_or_before > state.cap:
                del times[: at_or_before - state.cap]
        if not times:
            del self._groups[group]


def _settle(state: _Group) -> None:
    if state.pending:
        state.times.extend(state.pending)
        state.times.sort()
        state.pending.clear()


def _count_in(times: list[int], after: int, upto: int) -> int:
    """Number of times in the half-open interval (after, upto]."""
    return bisect.bisect_right(times, upto) - bisect.bisect_right(times, after)


def _full_somewhere(times: list[int], limit: int, t: int) -> bool:
    """Whether some window (a, a + W] containing `t` already holds `limit` or more times."""
    # The windows containing t are those with a in [t - W, t - 1]. Their counts change only
    # where a time leaves (a = e) or enters (a = e - W), so the largest count is at a = t - W or
    # at a = e - W for a time e in (t, t + W - 1].
    if _count_in(times, t - WINDOW_US, t) >= limit:
        return True
    start = bisect.bisect_right(times, t)
    stop = bisect.bisect_left(times, t + WINDOW_US)
    return any(_count_in(times, e - WINDOW_US, e) >= limit for e in times[start:stop])
