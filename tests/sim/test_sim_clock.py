"""The simulator's clock model: integer-exact drift, wall steps, restarts and the inverse."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from sim.clock import PPM, NodeClock

S = 1_000_000
T0 = 1_800_000_000 * S


def test_readings_at_creation_and_offset() -> None:
    c = NodeClock(t=T0, offset_us=-3 * S, drift_ppm=0, mono_origin=42)
    assert c.mono(T0) == 42
    assert c.wall(T0) == T0 - 3 * S
    assert c.offset_at(T0 + 10 * S) == -3 * S
    now = c.now(T0 + 5)
    assert (now.wall, now.mono) == (T0 - 3 * S + 5, 47)


def test_drift_is_integer_exact_and_applies_to_both_clocks() -> None:
    c = NodeClock(t=0, offset_us=0, drift_ppm=250, mono_origin=0)
    # 1 s true at +250 ppm: 1_000_250 µs node time, exactly, on both clocks.
    assert c.mono(S) == 1_000_250
    assert c.wall(S) == 1_000_250
    # Floor, never rounding up: 3 µs at +250 ppm is 3.00075 µs -> 3.
    assert c.mono(3) == 3
    # Far from the origin a float would lose microseconds; integers do not.
    t = 10**15 + 7
    assert c.mono(t) == t * (PPM + 250) // PPM
    slow = NodeClock(t=0, offset_us=0, drift_ppm=-100_000, mono_origin=5)
    assert slow.mono(10 * S) == 5 + 9 * S
    assert slow.wall(10 * S) == 9 * S


def test_wall_step_leaves_mono_alone() -> None:
    c = NodeClock(t=T0, offset_us=0, drift_ppm=100, mono_origin=7)
    t1 = T0 + 2 * S
    mono_before, wall_before = c.mono(t1), c.wall(t1)
    c.step(t1, -60 * S)
    assert c.mono(t1) == mono_before
    assert c.wall(t1) == wall_before - 60 * S
    assert c.steps == 1
    # After the step both keep running at the drifted rate from where they are.
    t2 = t1 + S
    assert c.mono(t2) == mono_before + 1_000_100
    assert c.wall(t2) == wall_before - 60 * S + 1_000_100
    with pytest.raises(AssertionError):
        c.wall(t1 - 1)  # before the step: history, not a function of t


def test_restart_gives_a_new_mono_origin_and_keeps_the_wall_clock() -> None:
    c = NodeClock(t=0, offset_us=5 * S, drift_ppm=0, mono_origin=1_000)
    wall = c.wall(10 * S)
    c.restart(10 * S, 3)
    assert c.mono(10 * S) == 3
    assert c.mono(11 * S) == 3 + S
    assert c.wall(10 * S) == wall
    with pytest.raises(AssertionError):
        c.mono(10 * S - 1)  # the new process did not exist yet


def test_set_drift_keeps_the_readings_continuous() -> None:
    c = NodeClock(t=0, offset_us=0, drift_ppm=0, mono_origin=0)
    c.set_drift(S, 500_000)
    assert c.mono(S) == S
    assert c.mono(3 * S) == S + 3 * S  # 2 s true at 1.5x
    assert c.drift_ppm == 500_000
    with pytest.raises(AssertionError):
        c.set_drift(4 * S, -PPM)  # a clock that stops is not a clock


def test_true_at_mono_below_the_anchor_is_the_anchor() -> None:
    c = NodeClock(t=T0, offset_us=0, drift_ppm=-50, mono_origin=100)
    assert c.true_at_mono(100) == T0
    assert c.true_at_mono(-5) == T0
    assert c.true_at_mono(101) > T0


def test_true_at_wall_inverts_wall() -> None:
    c = NodeClock(t=T0, offset_us=-S, drift_ppm=300, mono_origin=0)
    target = T0 + 10 * S
    t = c.true_at_wall(target)
    assert c.wall(t) >= target > c.wall(t - 1)


drifts = st.integers(min_value=-PPM + 1, max_value=PPM - 1)
small_drifts = st.integers(min_value=-1_000, max_value=1_000)


@given(
    drift=st.one_of(small_drifts, drifts),
    offset=st.integers(min_value=-(10**12), max_value=10**12),
    origin=st.integers(min_value=-(10**15), max_value=10**15),
    t0=st.integers(min_value=0, max_value=10**16),
    ahead=st.integers(min_value=1, max_value=10**13),
)
@example(drift=-PPM + 1, offset=0, origin=0, t0=0, ahead=1)
@example(drift=PPM - 1, offset=0, origin=0, t0=0, ahead=1)
@example(drift=1, offset=0, origin=0, t0=0, ahead=999_999)
def test_true_at_mono_is_the_exact_inverse(
    drift: int, offset: int, origin: int, t0: int, ahead: int
) -> None:
    c = NodeClock(t=t0, offset_us=offset, drift_ppm=drift, mono_origin=origin)
    m = origin + ahead
    t = c.true_at_mono(m)
    assert c.mono(t) >= m
    assert c.mono(t - 1) < m
    # And mono is non-decreasing around it (a fast or slow clock never ticks backwards).
    assert c.mono(t - 1) <= c.mono(t) <= c.mono(t + 1)


@given(
    drift=drifts,
    t0=st.integers(min_value=0, max_value=10**16),
    a=st.integers(min_value=0, max_value=10**12),
    b=st.integers(min_value=0, max_value=10**12),
    step=st.integers(min_value=-(10**12), max_value=10**12),
)
def test_mono_is_monotone_across_wall_steps(drift: int, t0: int, a: int, b: int, step: int) -> None:
    c = NodeClock(t=t0, offset_us=0, drift_ppm=drift, mono_origin=0)
    lo, hi = sorted((a, b))
    before = c.mono(t0 + lo)
    c.step(t0 + lo, step)
    assert c.mono(t0 + lo) == before
    assert c.mono(t0 + hi) >= before
    # The step re-anchored only the wall clock: mono is still one formula from creation.
    assert c.mono(t0 + hi) == hi * (PPM + drift) // PPM


def test_same_inputs_same_readings() -> None:
    def run() -> list[int]:
        c = NodeClock(t=T0, offset_us=123, drift_ppm=-77, mono_origin=9)
        out = [c.mono(T0 + 5 * S), c.wall(T0 + 5 * S)]
        c.step(T0 + 6 * S, 2 * S)
        c.restart(T0 + 7 * S, 11)
        out += [c.mono(T0 + 8 * S), c.wall(T0 + 8 * S), c.true_at_mono(11 + S)]
        return out

    assert run() == run()
