"""RFC 3339 timestamps <-> integer microseconds since the Unix epoch.

This module owns the one textual time format snerd speaks: `execute_at` on the wire and every
timestamp in a task record (`executeAt`, `retryAfterTime`, `deletedAt`, lease expiries). Inside
the core, time is always an `int` of microseconds since 1970-01-01T00:00:00Z (UTC, leap seconds
not counted, like POSIX time); only the edges convert.

It must never read a clock (`datetime.now`, `time.time`) or guess a time zone: a timestamp without
a UTC offset is an error, not "local time". Upstream silently turned an unparseable `execute_at`
into "now" (reference §4.5, e.g. Python's naive `datetime.isoformat()`); snerd refuses it with a
reason the SDK user can act on.

Accepted input (RFC 3339 §5.6, plus the `t`/space separator it explicitly permits):
`YYYY-MM-DD{T|t| }HH:MM:SS[.fraction]{Z|z|+HH:MM|-HH:MM}`, where the fraction has 1 to 9 digits
(nanoseconds at most; digits beyond microseconds are truncated, never rounded, so a time never
moves later than written). A leap second (`:60`) is accepted and, as in POSIX time, counts as
the first second of the next minute. Surrounding whitespace is not accepted.

Output is always UTC with `Z` and exactly six fractional digits (`2026-08-17T02:31:53.237260Z`),
the form upstream's chrono writes, so log records stay byte-compatible. A span of microseconds
reads as people say it (`format_span`: `12 s`, `5 min`, `1.5 h`, `2.0 days`) in what the
operator tools and the health judgement print.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

__all__ = [
    "MAX_US",
    "MIN_US",
    "format_rfc3339",
    "format_span",
    "parse_rfc3339",
    "parse_rfc3339_or_none",
]

# Naive datetimes on purpose: arithmetic between two naive values cannot raise for a tz reason,
# and the offset is applied as plain integer microseconds afterwards.
_EPOCH = datetime(1970, 1, 1)
_ONE_US = timedelta(microseconds=1)

#: 0001-01-01T00:00:00.000000Z, the earliest instant `format_rfc3339` can write.
MIN_US = (datetime(1, 1, 1) - _EPOCH) // _ONE_US
#: 9999-12-31T23:59:59.999999Z, the latest instant `format_rfc3339` can write.
MAX_US = (datetime(9999, 12, 31, 23, 59, 59, 999999) - _EPOCH) // _ONE_US

# re.ASCII: `\d` must not match other scripts' digits (Python's default would take "٢٠٢٦").
_SHAPE = re.compile(
    r"(?P<year>\d{4})-(?P<month>\d{2})-(?P<day>\d{2})"
    r"[Tt ]"
    r"(?P<hour>\d{2}):(?P<minute>\d{2}):(?P<second>\d{2})"
    r"(?:\.(?P<fraction>\d+))?"
    r"(?P<offset>[Zz]|[+-]\d{2}:\d{2})?",
    re.ASCII,
)
_OFFSET_LIKE = re.compile(r"[+-]\d{2}:?\d{2}|[+-]\d{2}", re.ASCII)


def parse_rfc3339(text: str) -> int:
    """Parse an RFC 3339 timestamp into microseconds since the Unix epoch.

    Args:
        text: e.g. `2026-01-02T03:04:05Z`, `2026-01-02 03:04:05.123456789+02:00`.

    Returns:
        Microseconds since 1970-01-01T00:00:00Z (negative before it).

    Raises:
        ValueError: the text is not RFC 3339 or names an impossible date or time; the message
            says which part is wrong (no offset, month out of range, ...), without the input.
    """
    m = _SHAPE.fullmatch(text)
    if m is None:
        raise ValueError(_shape_reason(text))
    if m["offset"] is None:
        raise ValueError("no UTC offset; send RFC 3339 like 2026-01-02T03:04:05Z")
    fraction = m["fraction"]
    if fraction is not None and len(fraction) > 9:
        raise ValueError(f"fractional seconds have {len(fraction)} digits; at most 9 are allowed")

    year, month, day = int(m["year"]), int(m["month"]), int(m["day"])
    hour, minute, second = int(m["hour"]), int(m["minute"]), int(m["second"])
    if year == 0:
        raise ValueError("year 0 out of range (1-9999)")
    if not 1 <= month <= 12:
        raise ValueError(f"month {month} out of range (1-12)")
    if not 1 <= day <= _days_in_month(year, month):
        raise ValueError(
            f"day {day} out of range for {year:04d}-{month:02d} (1-{_days_in_month(year, month)})"
        )
    if hour > 23:
        raise ValueError(f"hour {hour} out of range (0-23)")
    if minute > 59:
        raise ValueError(f"minute {minute} out of range (0-59)")
    # RFC 3339 §5.6 allows 60 for a leap second; POSIX time has no such second, so it is
    # counted as the next one (23:59:60 == 00:00:00), which is also what chrono's timestamp does
    # for the instant right after it.
    if second > 60:
        raise ValueError(f"second {second} out of range (0-60)")
    leap = second == 60

    micros = int((fraction or "0")[:6].ljust(6, "0"))
    local = datetime(year, month, day, hour, minute, 59 if leap else second, micros)
    us = (local - _EPOCH) // _ONE_US + (1_000_000 if leap else 0)

    offset = m["offset"]
    if offset not in ("Z", "z"):
        off_hours, off_minutes = int(offset[1:3]), int(offset[4:6])
        if off_hours > 23:
            raise ValueError(f"UTC offset hours {off_hours} out of range (0-23)")
        if off_minutes > 59:
            raise ValueError(f"UTC offset minutes {off_minutes} out of range (0-59)")
        off_us = (off_hours * 3600 + off_minutes * 60) * 1_000_000
        # local = utc + offset, so utc = local - offset.
        us = us - off_us if offset[0] == "+" else us + off_us
    # An offset (or a leap second) can push 0001-01-01 or 9999-12-31 past what can be written
    # back; refusing here keeps every parsed time formattable.
    if not MIN_US <= us <= MAX_US:
        raise ValueError("instant out of range (years 1-9999 in UTC)")
    return us


def format_rfc3339(us: int) -> str:
    """Format microseconds since the Unix epoch as RFC 3339 UTC.

    Args:
        us: microseconds since 1970-01-01T00:00:00Z, between `MIN_US` and `MAX_US`.

    Returns:
        `YYYY-MM-DDTHH:MM:SS.ffffffZ`, always six fractional digits.

    Raises:
        ValueError: `us` lies outside years 1-9999.
    """
    global _last_second
    second, micros = divmod(us, 1_000_000)
    cached = _last_second
    if cached[0] == second:
        # A whole second lies inside [MIN_US, MAX_US] or outside it, so the cached one (checked
        # when it was made) needs no range check.
        return f"{cached[1]}.{micros:06d}Z"
    if not MIN_US <= us <= MAX_US:
        raise ValueError(f"{us} microseconds is outside years 1-9999")
    t = _EPOCH + timedelta(seconds=second)
    head = f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:{t.second:02d}"
    _last_second = (second, head)
    return f"{head}.{micros:06d}Z"


#: The last whole second `format_rfc3339` formatted and its text up to the seconds. Timestamps
#: written together (an enqueue's `retryAfterTime` and `executeAt`, a burst of records) mostly
#: fall in one second, and the calendar arithmetic is most of the cost. One tuple, replaced
#: whole, so a reader never sees a second with another second's text.
#: The starting value matches no second (`divmod` of an int never gives 0.5).
_last_second: tuple[float, str] = (0.5, "")


def _days_in_month(year: int, month: int) -> int:
    if month == 2:
        leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
        return 29 if leap else 28
    return 30 if month in (4, 6, 9, 11) else 31


def _shape_reason(text: str) -> str:
    """Say why `text` does not have the RFC 3339 shape, as precisely as cheaply possible."""
    if not text:
        return "empty timestamp; send RFC 3339 like 2026-01-02T03:04:05Z"
    if text != text.strip():
        return "leading or trailing whitespace; send RFC 3339 like 2026-01-02T03:04:05Z"
    date_only = re.fullmatch(r"\d{4}-\d{2}-\d{2}", text, re.ASCII)
    if date_only:
        return "a date without a time; send RFC 3339 like 2026-01-02T03:04:05Z"
    # The common near-misses get their own words: an offset without the colon ("+0200"), or a
    # time without seconds ("2026-01-02T03:04Z").
    head = re.match(
        r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?P<rest>.*)", text, re.ASCII | re.S
    )
    if head is not None:
        rest = head["rest"]
        if _OFFSET_LIKE.fullmatch(rest):
            return "UTC offset must be Z or ±HH:MM (with a colon)"
        return "unexpected text after the seconds; expected Z or ±HH:MM"
    if re.match(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}(?:[Zz]|[+-]|$)", text, re.ASCII):
        return "seconds are required (HH:MM:SS)"
    return "not an RFC 3339 timestamp; send RFC 3339 like 2026-01-02T03:04:05Z"


def parse_rfc3339_or_none(value: object) -> int | None:
    """`parse_rfc3339(value)` for a value read from disk that may be anything: None when it is
    not a string or does not parse (readers that show what they found, never refuse it)."""
    if not isinstance(value, str):
        return None
    try:
        return parse_rfc3339(value)
    except ValueError:
        return None


def format_span(us: int) -> str:
    """A span (its sign dropped) as a person reads it: seconds below 2 min, minutes below 2 h,
    hours below 2 days, then days."""
    s = abs(us) / 1_000_000
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    if s < 172800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"
