"""snerd.core.rate_limit: sliding 60-second windows per group."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snerd.core.rate_limit import WINDOW_US, RateWindows

S = 1_000_000  # one second in microseconds
T0 = 1_800_000_000 * S  # an arbitrary wall-clock origin


def test_window_is_one_minute() -> None:
    assert WINDOW_US == 60 * S
    assert RateWindows.WINDOW_US == WINDOW_US


def test_limit_is_enforced_within_a_minute() -> None:
    w = RateWindows()
    for i in range(3):
        assert w.allows("api", 3, T0 + i * S)
        w.record("api", T0 + i * S)
    assert not w.allows("api", 3, T0 + 10 * S)
    assert w.count("api", T0 + 10 * S) == 3


def test_window_is_half_open_and_slides() -> None:
    w = RateWindows()
    w.record("api", T0)
    # (now - 60 s, now]: at exactly T0 + 60 s the dispatch at T0 has left the window.
    assert w.count("api", T0 + WINDOW_US - 1) == 1
    assert not w.allows("api", 1, T0 + WINDOW_US - 1)
    assert w.allows("api", 1, T0 + WINDOW_US)
    assert w.count("api", T0 + WINDOW_US) == 0


def test_no_double_burst_at_a_fixed_window_boundary() -> None:
    # Upstream's fixed window let `limit` through at 0:59 and again at 1:00; a sliding one does not.
    w = RateWindows()
    for i in range(5):
        w.record("api", T0 + 59 * S + i)
    for i in range(5):
        assert not w.allows("api", 5, T0 + 61 * S + i)
    assert w.allows("api", 5, T0 + 119 * S)


def test_groups_are_independent() -> None:
    w = RateWindows()
    w.record("a", T0)
    assert not w.allows("a", 1, T0)
    assert w.allows("b", 1, T0)
    assert w.count("b", T0) == 0


def test_next_allowed_us() -> None:
    w = RateWindows()
    assert w.next_allowed_us("api", 2, T0) == T0
    w.record("api", T0)
    assert w.next_allowed_us("api", 2, T0 + S) == T0 + S
    w.record("api", T0 + 5 * S)
    # Full: the oldest of the two leaves at T0 + 60 s.
    assert w.next_allowed_us("api", 2, T0 + 6 * S) == T0 + WINDOW_US
    # With limit 1 the newest must leave too, at T0 + 65 s.
    assert w.next_allowed_us("api", 1, T0 + 6 * S) == T0 + 5 * S + WINDOW_US
    assert not w.allows("api", 2, T0 + WINDOW_US - 1)
    assert w.allows("api", 2, T0 + WINDOW_US)


def test_restore_accepts_out_of_order_times() -> None:
    w = RateWindows()
    w.restore("api", [T0 + 30 * S, T0, T0 + 10 * S])
    w.restore("api", [T0 + 20 * S])
    assert w.count("api", T0 + 30 * S) == 4
    assert not w.allows("api", 4, T0 + 30 * S)
    assert w.next_allowed_us("api", 4, T0 + 30 * S) == T0 + WINDOW_US
    assert w.allows("api", 5, T0 + 30 * S)


def test_restored_times_ahead_of_this_clock_still_count() -> None:
    # Another daemon's clock runs 30 s ahead: its dispatch at "T0 + 40 s" happened already.
    w = RateWindows()
    w.restore("api", [T0 + 40 * S])
    # (T0 - 10 s, T0 + 50 s] would hold it and a dispatch now: refused with limit 1.
    assert not w.allows("api", 1, T0 + 10 * S)
    assert w.allows("api", 2, T0 + 10 * S)
    # A dispatch now is fine once no minute can hold both: at T0 + 40 s - 60 s... in the past,
    # so the next chance is when the future one has left, at T0 + 100 s.
    assert w.next_allowed_us("api", 1, T0 + 10 * S) == T0 + 100 * S


def test_future_times_block_only_windows_they_share() -> None:
    w = RateWindows()
    w.restore("api", [T0 + 200 * S])
    # Far enough before it, no 60 s window holds both.
    assert w.allows("api", 1, T0)
    assert w.allows("api", 1, T0 + 140 * S)
    assert not w.allows("api", 1, T0 + 140 * S + 1)


def test_limit_must_be_positive() -> None:
    w = RateWindows()
    with pytest.raises(ValueError, match="at least 1"):
        w.allows("api", 0, T0)
    with pytest.raises(ValueError, match="at least 1"):
        w.next_allowed_us("api", -3, T0)


def test_old_entries_are_pruned() -> None:
    w = RateWindows()
    for i in range(100):
        w.record("api", T0 + i * S)
    assert w.retained("api") <= 60
    assert w.count("api", T0 + 1000 * S) == 0
    assert w.retained("api") == 0


def test_restore_of_a_long_history_is_cut_to_the_limit() -> None:
    w = RateWindows()
    # A log replay: a whole day of dispatches, fed one record at a time.
    for i in range(0, 86_400, 2):
        w.restore("api", [T0 + i * S])
    now = T0 + 86_400 * S
    assert not w.allows("api", 10, now)
    assert w.retained("api") <= 10
    assert w.next_allowed_us("api", 10, now) == T0 + 86_380 * S + WINDOW_US


def _windows_holding(times: list[int], t: int) -> list[int]:
    """Counts of every distinct 60 s window (a, a + W] containing t, for whole-second times."""
    return [sum(1 for e in times if a < e <= a + WINDOW_US) for a in range(t - WINDOW_US, t, S)]


def _brute_allows(times: list[int], limit: int, t: int) -> bool:
    return all(c < limit for c in _windows_holding(times, t))


_STEP = st.one_of(
    st.tuples(st.just("dispatch"), st.integers(min_value=0, max_value=40)),
    st.tuples(
        st.just("restore"),
        st.lists(st.integers(min_value=-150, max_value=150), min_size=1, max_size=4),
    ),
    st.tuples(st.just("next"), st.integers(min_value=0, max_value=40)),
)


@settings(max_examples=150, deadline=None)
@given(st.integers(min_value=1, max_value=4), st.lists(_STEP, max_size=40))
def test_windows_match_brute_force_and_never_overfill(
    limit: int, steps: list[tuple[str, object]]
) -> None:
    """Whatever is restored (even out of order, even ahead of this clock), `allows` and
    `next_allowed_us` agree with a brute-force check over the whole history, and a dispatch that
    was allowed never fills a window past `limit`."""
    w = RateWindows()
    history: list[int] = []
    now = T0
    for op, arg in steps:
        if op == "restore":
            assert isinstance(arg, list)
            restored = [now + x * S for x in arg]
            w.restore("g", restored)
            history.extend(restored)
            continue
        assert isinstance(arg, int)
        now += arg * S  # the node's clock only moves forward
        expected = _brute_allows(history, limit, now)
        if op == "next":
            nxt = w.next_allowed_us("g", limit, now)
            assert nxt >= now
            assert _brute_allows(history, limit, nxt)
            # Nothing earlier (in whole seconds, where every answer lies) is allowed.
            for t in range(now, nxt, S):
                assert not _brute_allows(history, limit, t)
            continue
        assert w.allows("g", limit, now) is expected
        if expected:
            w.record("g", now)
            history.append(now)
            assert max(_windows_holding(history, now)) <= limit


@settings(max_examples=100, deadline=None)
@given(
    st.integers(min_value=1, max_value=6),
    st.lists(st.integers(min_value=0, max_value=30 * S), max_size=80),
)
def test_memory_stays_within_the_limit(limit: int, gaps: list[int]) -> None:
    w = RateWindows()
    now = T0
    for gap in gaps:
        now += gap
        if w.allows("g", limit, now):
            w.record("g", now)
        assert w.retained("g") <= limit
        assert w.count("g", now) <= limit
