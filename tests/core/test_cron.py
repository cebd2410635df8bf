"""snerd.core.cron: normalization and next fire times."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from croniter import croniter
from hypothesis import given
from hypothesis import strategies as st

from snerd.core.cron import next_fire, normalize_cron
from snerd.core.timefmt import format_rfc3339, parse_rfc3339


def t(text: str) -> int:
    return parse_rfc3339(text)


@pytest.mark.parametrize(
    ("expr", "normalized"),
    [
        ("30s", "*/30 * * * * *"),
        ("1s", "*/1 * * * * *"),
        ("5m", "0 */5 * * * *"),
        ("2h", "0 0 */2 * * *"),
        ("1d", "0 0 0 */1 * *"),
        ("31d", "0 0 0 */31 * *"),
        # Whole multiples carry up to the next unit instead of overflowing the field.
        ("60s", "0 */1 * * * *"),
        ("120s", "0 */2 * * * *"),
        ("3600s", "0 0 */1 * * *"),
        ("60m", "0 0 */1 * * *"),
        ("24h", "0 0 0 */1 * *"),
        ("48h", "0 0 0 */2 * *"),
        ("007m", "0 */7 * * * *"),
        ("0 8 * * 1", "0 0 8 * * 1"),
        ("  */5   *  * * *\t", "0 */5 * * * *"),
        ("15 0 8 * * 1-5", "15 0 8 * * 1-5"),
        ("0 0 8 * * MON-FRI", "0 0 8 * * mon-fri"),
        ("0 0 1 JAN *", "0 0 0 1 jan *"),
        ("0 0 * * 7", "0 0 0 * * 7"),
        ("0 0 0 L * *", "0 0 0 l * *"),
        ("0 0 0 ? * 5#3", "0 0 0 ? * 5#3"),
        ("@daily", "0 0 0 * * *"),
        ("@HOURLY", "0 0 * * * *"),
        ("@weekly", "0 0 0 * * 0"),
        ("@monthly", "0 0 0 1 * *"),
        ("@yearly", "0 0 0 1 1 *"),
        ("@annually", "0 0 0 1 1 *"),
        ("@midnight", "0 0 0 * * *"),
    ],
)
def test_normalize(expr: str, normalized: str) -> None:
    assert normalize_cron(expr) == normalized
    # The normalized form is a fixed point.
    assert normalize_cron(normalized) == normalized


@pytest.mark.parametrize(
    ("expr", "reason"),
    [
        ("", "empty cron expression"),
        ("   ", "empty cron expression"),
        ("0s", "at least 1"),
        ("0m", "at least 1"),
        ("90s", "seconds shorthand must be 1-59"),
        ("90m", "minutes shorthand must be 1-59"),
        ("25h", "hours shorthand must be 1-23"),
        ("32d", "days shorthand must be 1-31"),
        ("5w", "got 1 field"),
        ("-5s", "got 1 field"),
        ("* * * *", "got 4 fields"),
        ("0 0 0 * * * 2026", "got 7 fields"),
        ("garbage", "got 1 field"),
        ("@fortnightly", "unknown cron alias"),
        ("61 * * * * *", "second 61 out of range (0-59)"),
        ("60 * * * *", "minute 60 out of range (0-59)"),
        ("0 24 * * *", "hour 24 out of range (0-23)"),
        ("0 0 32 * *", "day-of-month 32 out of range (1-31)"),
        ("0 0 0 * *", "day-of-month 0 out of range (1-31)"),
        ("0 0 1 13 *", "month 13 out of range (1-12)"),
        ("0 0 * * 8", "day-of-week 8 out of range (0-7)"),
        ("0 1-70 * * *", "hour 70 out of range"),
        ("*/0 * * * *", "minute field '*/0': a step must be at least 1"),
        ("0 0 * * funday", "day-of-week field 'funday' is not valid"),
        ("0 0 1 foo *", "month field 'foo' is not valid"),
        ("H * * * *", "hashed (H) and random (R)"),
        ("0 R * * *", "hashed (H) and random (R)"),
        ("0 0 31 2 *", "can never fire"),
    ],
)
def test_normalize_rejects_with_reason(expr: str, reason: str) -> None:
    with pytest.raises(ValueError) as info:
        normalize_cron(expr)
    assert reason in str(info.value)


def test_sunday_is_zero_and_seven_like_crontab() -> None:
    # 2026-01-03 is a Saturday. Upstream's cron crate read "0" as invalid and "1" as Sunday.
    after = t("2026-01-03T12:00:00Z")
    sunday = t("2026-01-04T08:00:00Z")
    monday = t("2026-01-05T08:00:00Z")
    assert next_fire(normalize_cron("0 8 * * 0"), after) == sunday
    assert next_fire(normalize_cron("0 8 * * 7"), after) == sunday
    assert next_fire(normalize_cron("0 8 * * 1"), after) == monday
    assert next_fire(normalize_cron("0 8 * * sun"), after) == sunday


def test_six_fields_are_seconds_first() -> None:
    after = t("2026-01-02T03:04:05Z")
    assert next_fire(normalize_cron("30 * * * * *"), after) == t("2026-01-02T03:04:30Z")
    assert next_fire(normalize_cron("0 30 * * * *"), after) == t("2026-01-02T03:30:00Z")


@pytest.mark.parametrize(
    ("expr", "after", "expected"),
    [
        ("30s", "2026-01-02T03:04:05Z", "2026-01-02T03:04:30Z"),
        ("30s", "2026-01-02T03:04:30Z", "2026-01-02T03:05:00Z"),
        ("5m", "2026-01-02T03:04:05Z", "2026-01-02T03:05:00Z"),
        ("2h", "2026-01-02T03:04:05Z", "2026-01-02T04:00:00Z"),
        ("1d", "2026-01-02T03:04:05Z", "2026-01-03T00:00:00Z"),
        ("@monthly", "2026-01-31T23:59:59.999999Z", "2026-02-01T00:00:00Z"),
        ("0 0 29 2 *", "2026-03-01T00:00:00Z", "2028-02-29T00:00:00Z"),
        ("0 0 * * *", "1969-12-31T12:00:00Z", "1970-01-01T00:00:00Z"),
    ],
)
def test_next_fire_examples(expr: str, after: str, expected: str) -> None:
    assert format_rfc3339(next_fire(normalize_cron(expr), t(after))) == format_rfc3339(t(expected))


def test_next_fire_is_strictly_after_even_on_an_exact_fire_time() -> None:
    every_10s = normalize_cron("10s")
    fire = t("2026-01-02T03:04:10Z")
    assert next_fire(every_10s, fire - 1) == fire
    assert next_fire(every_10s, fire) == fire + 10_000_000
    assert next_fire(every_10s, fire + 1) == fire + 10_000_000


def test_missed_runs_are_skipped() -> None:
    # A daemon down for three days asks once and gets the next fire, not three backlogged ones.
    daily = normalize_cron("0 9 * * *")
    assert next_fire(daily, t("2026-01-05T10:00:00Z")) == t("2026-01-06T09:00:00Z")


def test_next_fire_rejects_invalid_expression() -> None:
    with pytest.raises(ValueError):
        next_fire("not cron", 0)


def test_next_fire_past_year_9999_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        next_fire(normalize_cron("@yearly"), t("9999-06-01T00:00:00Z"))


_EXPRS = st.sampled_from(
    ["7s", "30s", "5m", "7m", "2h", "1d", "7d", "0 8 * * 1-5", "15 */10 * * * *", "0 0 0 L * *"]
)


@given(
    _EXPRS, st.integers(min_value=t("2000-01-01T00:00:00Z"), max_value=t("2090-01-01T00:00:00Z"))
)
def test_next_fire_is_the_first_matching_second_after(expr: str, after_us: int) -> None:
    norm = normalize_cron(expr)
    fire = next_fire(norm, after_us)
    assert fire > after_us
    assert fire % 1_000_000 == 0
    # Monotone: asking again from just before the answer gives the same answer; asking from it
    # gives a later one.
    assert next_fire(norm, fire - 1) == fire
    assert next_fire(norm, fire) > fire
    # Nothing fires in between: the fire before the answer is not after after_us.
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    previous = croniter(norm, epoch + timedelta(microseconds=fire), second_at_beginning=True)
    assert (previous.get_prev(datetime) - epoch) // timedelta(microseconds=1) <= after_us


@given(st.integers(min_value=1, max_value=59), st.integers(min_value=0, max_value=10**15))
def test_seconds_shorthand_fires_on_multiples_of_n_within_the_minute(n: int, after_us: int) -> None:
    fire = next_fire(normalize_cron(f"{n}s"), after_us)
    assert (fire // 1_000_000) % 60 % n == 0
    # And no earlier whole second after after_us matches.
    for s in range(after_us // 1_000_000 + 1, fire // 1_000_000):
        assert s % 60 % n != 0
