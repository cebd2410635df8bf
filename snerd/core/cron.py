"""Cron expressions: validation, one normalized stored form, and the next fire time.

This module owns what a `cron` string on an enqueue means. It must never read a clock (the
caller passes the instant to search from), draw a random number, or accept an expression whose
meaning it would have to guess: anything it cannot read exactly is a `ValueError` with a reason,
where upstream silently turned it into a one-shot task (reference §4.6, §6.4).

Accepted input, after trimming surrounding whitespace:

- Standard 5-field cron, `minute hour day-of-month month day-of-week`, with day-of-week
  0-7 where **Sunday = 0** (and 7), as in Vixie cron and croniter. Upstream's `cron` crate used
  1-7 with Sunday = 1, so upstream ran `0 8 * * 1` on Sundays; snerd runs it on Mondays, as
  every crontab(5) user expects.
- 6-field cron with **seconds first**, `second minute hour day-of-month month day-of-week`, as
  upstream.
- The aliases `@yearly` `@annually` `@monthly` `@weekly` `@daily` `@midnight` `@hourly`.
- Upstream's shorthands `<N>s`, `<N>m`, `<N>h`, `<N>d` with N >= 1:
  `Ns` -> `*/N * * * * *`, `Nm` -> `0 */N * * * *`, `Nh` -> `0 0 */N * * *`,
  `Nd` -> `0 0 0 */N * *`. Like upstream these are cron steps, so they restart at each
  enclosing unit (`7s` fires at :00, :07, ... :56, then :00 again; `7d` on days 1, 8, 15, 22, 29
  of each month). A whole multiple of the next unit is carried up (`90m` is refused, but `120s`
  becomes `2m` and `48h` becomes `2d`); upstream wrote `*/120` into the seconds field, which
  fires once a minute, not every two. Any other N beyond the field (`90s`, `25h`, `32d`) cannot
  be said in cron and is refused.
- Field syntax is croniter's: `*`, lists `a,b`, ranges `a-b`, steps `*/n` `a-b/n` `a/n`,
  month and weekday names (`jan`, `mon-fri`), `?`, `L`, `nW`, `d#n`. croniter's hashed (`H`)
  and random (`R`) fields are refused: one is keyed by a job id snerd does not pass, the other
  would make the schedule non-deterministic.

The normalized stored form is always **6 fields, seconds first, lowercase, single spaces**
(`0 0 8 * * 1`); `next_fire` takes only that form. All times are UTC.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

__all__ = ["check_timezone", "last_fires", "next_fire", "normalize_cron"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_US = timedelta(microseconds=1)

# (name, lowest, highest) of each field of the normalized, seconds-first form.
_FIELDS = (
    ("second", 0, 59),
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day-of-month", 1, 31),
    ("month", 1, 12),
    ("day-of-week", 0, 7),
)

_ALIASES = {
    "@yearly": "0 0 0 1 1 *",
    "@annually": "0 0 0 1 1 *",
    "@monthly": "0 0 0 1 * *",
    "@weekly": "0 0 0 * * 0",
    "@daily": "0 0 0 * * *",
    "@midnight": "0 0 0 * * *",
    "@hourly": "0 0 * * * *",
}

_SHORTHAND = re.compile(r"(\d+)([smhd])", re.ASCII)
# croniter's own hashed/random item syntax (croniter.hash_expression_re), matched per list item.
_HASHED_OR_RANDOM = re.compile(r"[hr](?:\(\d+-\d+\))?(?:/\d+)?", re.ASCII)
# Items built only from numbers, `*`, ranges and steps; their numbers can be range-checked here
# with a message naming the field, before croniter sees them.
_PLAIN_ITEM = re.compile(r"(?:\*|\d+(?:-\d+)?)(?:/(\d+))?", re.ASCII)
_FIELD_SPLIT = re.compile(r"\S+", re.ASCII)


def normalize_cron(expr: str) -> str:
    """Validate a cron expression and return its normalized 6-field, seconds-first form.

    Args:
        expr: a 5-field or 6-field (seconds first) expression, an `@` alias, or a shorthand
            `<N>s|m|h|d`.

    Returns:
        The expression as 6 lowercase fields separated by single spaces, seconds first.

    Raises:
        ValueError: the expression is empty, has the wrong number of fields, contains a value
            out of range, uses unsupported syntax, or can never fire; the message says which.
    """
    text = expr.strip().lower()
    if not text:
        raise ValueError("empty cron expression")
    if text in _ALIASES:
        return _ALIASES[text]
    short = _SHORTHAND.fullmatch(text)
    if short is not None:
        return _from_shorthand(int(short[1]), short[2], text)
    if text.startswith("@"):
        raise ValueError(f"unknown cron alias {text!r}; known: {', '.join(_ALIASES)}")

    fields = _FIELD_SPLIT.findall(text)
    if len(fields) == 5:
        fields = ["0", *fields]
    elif len(fields) != 6:
        raise ValueError(
            f"expected 5 fields (minute hour day-of-month month day-of-week) or 6 with seconds "
            f"first, or a shorthand like 30s, 5m, 2h, 1d; got {len(fields)} field"
            f"{'' if len(fields) == 1 else 's'}"
        )
    for (name, low, high), field in zip(_FIELDS, fields, strict=True):
        _check_field(name, low, high, field)
    normalized = " ".join(fields)
    _check_with_croniter(normalized, fields)
    return normalized


def check_timezone(name: str) -> ZoneInfo:
    """The IANA time zone `name` (`Europe/Paris`, `UTC`), or a `ValueError` saying why not.
    (The zone's rules are read once, from the system's or the `tzdata` package's database.)"""
    if not name or len(name) > 255 or name.startswith(("/", ".")) or ".." in name:
        raise ValueError(f"timezone {name!r} is not an IANA time zone name")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(f"unknown timezone {name!r} (an IANA name, like Europe/Paris)") from None


def _start(after_us: int, timezone: str | None) -> datetime:
    start = _EPOCH + timedelta(seconds=after_us // 1_000_000)
    return start if timezone is None else start.astimezone(check_timezone(timezone))


def last_fires(
    expr_normalized: str, after_us: int, until_us: int, limit: int, timezone: str | None = None
) -> tuple[list[int], bool]:
    """The fire times in (`after_us`, `until_us`], at most the `limit` latest of them, oldest
    first, and whether there were more (older ones left out)."""
    if until_us <= after_us or limit <= 0:
        return [], until_us > after_us and next_fire(expr_normalized, after_us, timezone) <= until_us
    try:
        # A fire at exactly `until_us` counts: search back from just after it.
        it = croniter(
            expr_normalized, _start(until_us + 1_000_000, timezone), second_at_beginning=True
        )
        found: list[int] = []
        while len(found) <= limit:
            fire = it.get_prev(datetime)
            at = (fire - _EPOCH) // _ONE_US
            if at <= after_us:
                break
            if at <= until_us:
                found.append(at)
    except (OverflowError, ValueError) as exc:
        raise ValueError(f"cron {expr_normalized!r}: {exc}") from exc
    more = len(found) > limit
    return sorted(found[:limit]), more


def next_fire(expr_normalized: str, after_us: int, timezone: str | None = None) -> int:
    """The first fire time strictly after `after_us`, read in `timezone` (an IANA name; None:
    UTC). In a zone with daylight saving, a wall time the clocks skip fires at the end of the
    gap (`30 2 * * *` at 03:00 the night clocks go forward), and a wall time they repeat
    fires once, at its first occurrence, unless the hour field is `*` or a step (an hourly or
    more frequent schedule fires in both hours), as in Vixie cron.

    Missed runs are not replayed: whatever fired before `after_us` is skipped, and the answer is
    the next one after it.

    Args:
        expr_normalized: an expression as returned by `normalize_cron`.
        after_us: microseconds since the Unix epoch (UTC).

    Returns:
        Microseconds since the Unix epoch of the next fire (always a whole second).

    Raises:
        ValueError: the expression is not valid, or has no fire time within croniter's search
            horizon (50 years) or before year 9999.
    """
    # Fire times are whole seconds, so "strictly after after_us" is "strictly after the whole
    # second containing it": for after_us = S + f (0 <= f < 1 s), a fire t > S + f iff t > S.
    # Searching from S also keeps croniter's handling of sub-second starts out of the question.
    try:
        it = croniter(expr_normalized, _start(after_us, timezone), second_at_beginning=True)
        fire = it.get_next(datetime)
        if timezone is not None and _repeated(fire) and _fixed_hours(expr_normalized):
            fire = it.get_next(datetime)  # the wall time's second occurrence: fired already
    except (OverflowError, ValueError) as exc:
        # croniter's errors are ValueErrors; OverflowError is a search that ran past year 9999.
        raise ValueError(f"cron {expr_normalized!r} has no next fire time: {exc}") from exc
    if not isinstance(fire, datetime):  # pragma: no cover - croniter returns what it is asked
        raise TypeError(f"croniter returned {type(fire).__name__}, expected datetime")
    result = (fire - _EPOCH) // _ONE_US
    assert result > after_us, (expr_normalized, after_us, result)
    return result


def _repeated(fire: datetime) -> bool:
    """`fire` is the second occurrence of a wall time the clocks repeat (they went back)."""
    return fire.fold == 1 and fire.replace(fold=0).utcoffset() != fire.utcoffset()


def _fixed_hours(expr_normalized: str) -> bool:
    """The hour field names hours (`2`, `1,13`, `9-17`), no `*` or step."""
    hours = expr_normalized.split()[2]
    return "*" not in hours and "/" not in hours


def _from_shorthand(n: int, unit: str, text: str) -> str:
    if n == 0:
        raise ValueError(f"{text!r}: the interval must be at least 1")
    # Carry whole multiples up to the next unit; anything else that overflows its field cannot
    # be expressed as a cron step.
    if unit == "s":
        if n < 60:
            return f"*/{n} * * * * *"
        if n % 60 == 0:
            return _from_shorthand(n // 60, "m", text)
        raise ValueError(f"{text!r}: seconds shorthand must be 1-59 or a whole number of minutes")
    if unit == "m":
        if n < 60:
            return f"0 */{n} * * * *"
        if n % 60 == 0:
            return _from_shorthand(n // 60, "h", text)
        raise ValueError(f"{text!r}: minutes shorthand must be 1-59 or a whole number of hours")
    if unit == "h":
        if n < 24:
            return f"0 0 */{n} * * *"
        if n % 24 == 0:
            return _from_shorthand(n // 24, "d", text)
        raise ValueError(f"{text!r}: hours shorthand must be 1-23 or a whole number of days")
    if n <= 31:
        return f"0 0 0 */{n} * *"
    raise ValueError(f"{text!r}: days shorthand must be 1-31 (a day-of-month step)")


def _check_field(name: str, low: int, high: int, field: str) -> None:
    for item in field.split(","):
        if _HASHED_OR_RANDOM.fullmatch(item):
            raise ValueError(
                f"{name} field {field!r}: hashed (H) and random (R) values are not supported"
            )
        plain = _PLAIN_ITEM.fullmatch(item)
        if plain is None:
            continue  # names, L, W, #, ?: croniter validates these below
        step = plain[1]
        body = item.split("/", 1)[0]
        for number in re.findall(r"\d+", body, re.ASCII):
            if not low <= int(number) <= high:
                raise ValueError(f"{name} {int(number)} out of range ({low}-{high})")
        if step is not None and int(step) == 0:
            raise ValueError(f"{name} field {field!r}: a step must be at least 1")


def _check_with_croniter(normalized: str, fields: list[str]) -> None:
    try:
        # strict=True also refuses day/month pairs that never occur ("0 0 0 31 2 *"): such a
        # task would never run, and croniter would only say so after searching 50 years.
        croniter.expand(normalized, second_at_beginning=True, strict=True)
    except ValueError as whole:
        # croniter reports fields in its own internal order; find the field at fault by checking
        # each one alone, so the message names it the way the user wrote it.
        for i, ((name, _, _), field) in enumerate(zip(_FIELDS, fields, strict=True)):
            alone = ["*"] * 6
            alone[i] = field
            try:
                croniter.expand(" ".join(alone), second_at_beginning=True)
            except ValueError:
                raise ValueError(f"{name} field {field!r} is not valid cron syntax") from whole
        raise ValueError(f"cron expression {normalized!r} can never fire: {whole}") from whole
