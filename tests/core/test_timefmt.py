"""snerd.core.timefmt: RFC 3339 parsing and formatting."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from snerd.core.timefmt import MAX_US, MIN_US, format_rfc3339, parse_rfc3339

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def us_of(dt: datetime) -> int:
    return (dt - EPOCH) // timedelta(microseconds=1)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1970-01-01T00:00:00Z", 0),
        ("2026-01-02T03:04:05Z", us_of(datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))),
        ("2026-01-02t03:04:05z", us_of(datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))),
        ("2026-01-02 03:04:05Z", us_of(datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))),
        ("2026-01-02T03:04:05+02:00", us_of(datetime(2026, 1, 2, 1, 4, 5, tzinfo=UTC))),
        ("2026-01-02T03:04:05-05:30", us_of(datetime(2026, 1, 2, 8, 34, 5, tzinfo=UTC))),
        ("2026-01-02T03:04:05-00:00", us_of(datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))),
        ("2026-01-02T03:04:05.5Z", us_of(datetime(2026, 1, 2, 3, 4, 5, 500000, tzinfo=UTC))),
        ("2026-01-02T03:04:05.123456Z", us_of(datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC))),
        # Nanoseconds are truncated, never rounded up.
        (
            "2026-01-02T03:04:05.123456999Z",
            us_of(datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)),
        ),
        ("1969-12-31T23:59:59.999999Z", -1),
        ("2024-02-29T00:00:00Z", us_of(datetime(2024, 2, 29, tzinfo=UTC))),
        ("2000-02-29T00:00:00Z", us_of(datetime(2000, 2, 29, tzinfo=UTC))),
        # A leap second counts as the next second, as in POSIX time.
        ("2016-12-31T23:59:60Z", us_of(datetime(2017, 1, 1, tzinfo=UTC))),
        ("0001-01-01T00:00:00Z", MIN_US),
        ("9999-12-31T23:59:59.999999Z", MAX_US),
    ],
)
def test_parse_accepts_rfc3339(text: str, expected: int) -> None:
    assert parse_rfc3339(text) == expected


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        # Python's isoformat() of a naive datetime: upstream ran these "now"; snerd refuses.
        ("2026-01-02T03:04:05", "no UTC offset; send RFC 3339 like 2026-01-02T03:04:05Z"),
        ("2026-01-02T03:04:05.1234567", "no UTC offset"),
        ("2026-13-02T03:04:05Z", "month 13 out of range"),
        ("2026-00-02T03:04:05Z", "month 0 out of range"),
        ("2026-02-29T03:04:05Z", "day 29 out of range for 2026-02"),
        ("1900-02-29T03:04:05Z", "day 29 out of range for 1900-02"),
        ("2026-04-31T03:04:05Z", "day 31 out of range for 2026-04"),
        ("2026-01-00T03:04:05Z", "day 0 out of range"),
        ("2026-01-02T24:04:05Z", "hour 24 out of range"),
        ("2026-01-02T03:60:05Z", "minute 60 out of range"),
        ("2026-01-02T03:04:61Z", "second 61 out of range"),
        ("0000-01-02T03:04:05Z", "year 0 out of range"),
        ("2026-01-02T03:04:05+24:00", "UTC offset hours 24 out of range"),
        ("2026-01-02T03:04:05+02:60", "UTC offset minutes 60 out of range"),
        ("2026-01-02T03:04:05+0200", "UTC offset must be Z or ±HH:MM"),
        ("2026-01-02T03:04:05 UTC", "unexpected text after the seconds"),
        ("2026-01-02T03:04Z", "seconds are required"),
        ("2026-01-02", "a date without a time"),
        ("2026-01-02T03:04:05.Z", "unexpected text after the seconds"),
        ("2026-01-02T03:04:05.1234567891Z", "at most 9 are allowed"),
        ("", "empty timestamp"),
        (" 2026-01-02T03:04:05Z", "whitespace"),
        ("tomorrow", "not an RFC 3339 timestamp"),
        ("٢٠٢٦-01-02T03:04:05Z", "not an RFC 3339 timestamp"),
        ("0001-01-01T00:00:00+00:01", "instant out of range"),
        ("9999-12-31T23:59:59-00:01", "instant out of range"),
    ],
)
def test_parse_rejects_with_reason(text: str, reason: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_rfc3339(text)
    assert reason in str(info.value)


def test_format_is_upstream_chrono_form() -> None:
    us = us_of(datetime(2026, 8, 17, 2, 31, 53, 237260, tzinfo=UTC))
    assert format_rfc3339(us) == "2026-08-17T02:31:53.237260Z"
    assert format_rfc3339(0) == "1970-01-01T00:00:00.000000Z"
    assert format_rfc3339(-1) == "1969-12-31T23:59:59.999999Z"
    assert format_rfc3339(MIN_US) == "0001-01-01T00:00:00.000000Z"
    assert format_rfc3339(MAX_US) == "9999-12-31T23:59:59.999999Z"


@pytest.mark.parametrize("us", [MIN_US - 1, MAX_US + 1, 10**30, -(10**30)])
def test_format_rejects_out_of_range(us: int) -> None:
    with pytest.raises(ValueError, match="outside years 1-9999"):
        format_rfc3339(us)


@given(st.integers(min_value=MIN_US, max_value=MAX_US))
def test_round_trip_from_microseconds(us: int) -> None:
    text = format_rfc3339(us)
    assert parse_rfc3339(text) == us
    assert len(text) == 27 and text.endswith("Z")


@given(
    st.datetimes(
        min_value=datetime(2, 1, 1),
        max_value=datetime(9998, 12, 31),
        timezones=st.builds(
            timezone,
            st.integers(min_value=-23 * 60 - 59, max_value=23 * 60 + 59).map(
                lambda m: timedelta(minutes=m)
            ),
        ),
    )
)
def test_parse_agrees_with_datetime_for_any_offset(dt: datetime) -> None:
    # Python writes the offset as ±HH:MM and the fraction as 6 digits (or none): valid RFC 3339.
    assert parse_rfc3339(dt.isoformat()) == us_of(dt)
    assert parse_rfc3339(dt.isoformat(sep=" ")) == us_of(dt)


@given(st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31)))
def test_naive_isoformat_is_always_refused(dt: datetime) -> None:
    with pytest.raises(ValueError, match="no UTC offset"):
        parse_rfc3339(dt.isoformat())
