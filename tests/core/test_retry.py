"""snerd.core.retry: retry delays and the attempt budget."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from snerd.core.retry import (
    EXPONENTIAL_CAP_US,
    MAX_RETRY_AFTER_HOURS,
    POLICIES,
    attempts_allowed,
    retry_delay_us,
)

HOUR = 3600 * 1_000_000


def test_policies() -> None:
    assert POLICIES == ("constant", "exponential")


@pytest.mark.parametrize(
    ("hours", "expected"),
    [
        (0, 0),
        (0.0, 0),
        (1, HOUR),
        (0.5, HOUR // 2),
        # 0.1 h is 360 s exactly, though 0.1 * 3.6e9 is not exact in binary.
        (0.1, 360_000_000),
        (0.001, 3_600_000),
        (2.5e-10, 1),  # 0.9 us rounds to 1 us
    ],
)
def test_constant_is_retry_after_hours_every_time(hours: float, expected: int) -> None:
    for failures in (1, 2, 10, 10**9):
        assert retry_delay_us(retry_after_hours=hours, failures=failures) == expected


def test_exponential_first_retry_waits_exactly_the_base() -> None:
    assert retry_delay_us(retry_after_hours=1, failures=1, policy="exponential") == HOUR


def test_exponential_grows_within_its_bounds() -> None:
    for failures in range(2, 12):
        grown = min(EXPONENTIAL_CAP_US, HOUR * 2 ** (failures - 1))
        d = retry_delay_us(
            retry_after_hours=1, failures=failures, policy="exponential", task_id="t"
        )
        assert HOUR <= d <= grown


def test_exponential_is_capped_at_seven_days() -> None:
    assert EXPONENTIAL_CAP_US == 7 * 24 * HOUR
    for task in ("a", "b", "c", "d"):
        d = retry_delay_us(retry_after_hours=1, failures=10**9, policy="exponential", task_id=task)
        assert HOUR <= d <= EXPONENTIAL_CAP_US


def test_exponential_never_waits_less_than_a_base_longer_than_the_cap() -> None:
    thirty_days = 30 * 24
    d = retry_delay_us(retry_after_hours=thirty_days, failures=5, policy="exponential")
    assert d == thirty_days * HOUR


def test_exponential_with_zero_base_is_zero() -> None:
    assert retry_delay_us(retry_after_hours=0, failures=7, policy="exponential") == 0


def test_jitter_spreads_tasks_that_fail_together() -> None:
    delays = {
        retry_delay_us(retry_after_hours=1, failures=4, policy="exponential", task_id=f"t{i}")
        for i in range(200)
    }
    assert len(delays) > 150
    # Full jitter covers the whole span [1 h, 8 h], not a narrow band.
    assert min(delays) < 2 * HOUR
    assert max(delays) > 7 * HOUR


def test_jitter_depends_on_seed_and_failure_count() -> None:
    def d(seed: int, failures: int) -> int:
        return retry_delay_us(
            retry_after_hours=1,
            failures=failures,
            policy="exponential",
            jitter_seed=seed,
            task_id="same",
        )

    assert len({d(seed, 6) for seed in range(50)}) > 40
    assert d(7, 6) == d(7, 6)


@given(
    hours=st.floats(min_value=0, max_value=MAX_RETRY_AFTER_HOURS),
    failures=st.integers(min_value=1, max_value=10**12),
    seed=st.integers(min_value=0, max_value=2**64 - 1),
    task_id=st.text(max_size=40),
)
def test_exponential_is_bounded_and_deterministic(
    hours: float, failures: int, seed: int, task_id: str
) -> None:
    kwargs = {
        "retry_after_hours": hours,
        "failures": failures,
        "policy": "exponential",
        "jitter_seed": seed,
        "task_id": task_id,
    }
    d = retry_delay_us(**kwargs)  # type: ignore[arg-type]
    base = round(hours * HOUR)
    assert base <= d <= max(base, EXPONENTIAL_CAP_US)
    assert d <= base * 2 ** min(failures - 1, 64)
    assert retry_delay_us(**kwargs) == d  # type: ignore[arg-type]


@given(
    hours=st.floats(min_value=0, max_value=MAX_RETRY_AFTER_HOURS),
    failures=st.integers(min_value=1, max_value=10**12),
)
def test_constant_is_bounded_and_ignores_failures(hours: float, failures: int) -> None:
    d = retry_delay_us(retry_after_hours=hours, failures=failures)
    assert d == retry_delay_us(retry_after_hours=hours, failures=1)
    assert abs(d - hours * HOUR) <= 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"retry_after_hours": -1.0, "failures": 1}, "retry_after_hours"),
        ({"retry_after_hours": float("nan"), "failures": 1}, "retry_after_hours"),
        ({"retry_after_hours": float("inf"), "failures": 1}, "retry_after_hours"),
        ({"retry_after_hours": MAX_RETRY_AFTER_HOURS * 1.01, "failures": 1}, "retry_after_hours"),
        ({"retry_after_hours": True, "failures": 1}, "retry_after_hours"),
        ({"retry_after_hours": "1", "failures": 1}, "retry_after_hours"),
        ({"retry_after_hours": 1.0, "failures": 0}, "failures"),
        ({"retry_after_hours": 1.0, "failures": -3}, "failures"),
        ({"retry_after_hours": 1.0, "failures": True}, "failures"),
        ({"retry_after_hours": 1.0, "failures": 1.0}, "failures"),
        ({"retry_after_hours": 1.0, "failures": 1, "policy": "linear"}, "unknown retry policy"),
        (
            {"retry_after_hours": 1.0, "failures": 1, "policy": "exponential", "jitter_seed": -1},
            "jitter_seed",
        ),
        (
            {
                "retry_after_hours": 1.0,
                "failures": 1,
                "policy": "exponential",
                "jitter_seed": 2**64,
            },
            "jitter_seed",
        ),
    ],
)
def test_invalid_inputs_are_refused(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        retry_delay_us(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("max_retries", "attempts"), [(0, 1), (1, 2), (3, 4), (10**6, 10**6 + 1)])
def test_attempts_allowed_is_one_plus_max_retries(max_retries: int, attempts: int) -> None:
    assert attempts_allowed(max_retries) == attempts


@pytest.mark.parametrize("bad", [-1, True, 1.0])
def test_attempts_allowed_refuses_bad_input(bad: object) -> None:
    with pytest.raises(ValueError, match="max_retries"):
        attempts_allowed(bad)  # type: ignore[arg-type]


def test_a_tasks_cap_stops_the_growth_and_a_cap_below_the_base_is_the_base() -> None:
    from snerd.core.fields import BACKOFF_POLICIES
    from snerd.core.retry import POLICIES, task_backoff

    assert BACKOFF_POLICIES == POLICIES  # (the field rule spells the policies too)
    base_h = 1 / 3600  # 1 s
    cap = 10 * 1_000_000
    delays = [
        retry_delay_us(retry_after_hours=base_h, failures=n, policy="exponential",
                       task_id="t", cap_us=cap)
        for n in range(1, 40)
    ]
    assert max(delays) <= cap and min(delays) >= 1_000_000
    assert max(delays) > 5_000_000  # it grew up to near the cap
    below = retry_delay_us(retry_after_hours=1.0, failures=9, policy="exponential", cap_us=1)
    assert below == 3600 * 1_000_000
    assert task_backoff(None, None) is None
    assert task_backoff("exponential", None) == ("exponential", EXPONENTIAL_CAP_US)
    assert task_backoff(None, 5) == (None, 5_000_000)
