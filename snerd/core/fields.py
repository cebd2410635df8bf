"""The rule of each value a task carries, wherever it comes from: the wire or a log.

This module owns the limits and ranges of a task's values — its id and names, retry count and
budget, delay, rate, timeout, urgency, times, cron expression, webhook URL and parents — and
the texts that say what is wrong with one. Two readers ask it, and nothing else decides what
these values may be:

- the enqueue (`snerd.core.protocol.validate_enqueue`), before the ack, naming the value by
  its wire name (`max_retries`);
- the log reader (`snerd.core.records.check_record`), for every record read back from a shard
  log or an inbox, naming it by its record key (`maxRetries`): a record written by hand, by an
  older version or by someone else with write access to the directory is held to the rule
  the enqueue is held to, so whatever the core replays it can run.

Each check takes the value already of its JSON type (the caller checked that, as each words
its own type errors) and the name to call it by, and raises `BadField` with a sentence that
starts with that name ("max_retries must be 0 or more, got -1"). It returns what the caller
needs from it when there is something (a normalized cron expression); it never raises
anything else, and never reads a clock: a time is only checked to be one that can be written.

Pure: no I/O, no clock, no state but bounded caches of answers already given.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from snerd.core.cron import normalize_cron
from snerd.core.dedupe import FINISHED, MAX_UNIQUE_SECONDS, STARTED
from snerd.core.retry import MAX_RETRY_AFTER_HOURS
from snerd.core.timefmt import parse_rfc3339
from snerd.core.webhook_target import MAX_WEBHOOK_URL_BYTES, BadWebhookUrl, parse_webhook_url

__all__ = [
    "I32_MAX",
    "MAX_ATTEMPTS",
    "MAX_CRON_CHARS",
    "MAX_EXECUTION_SECONDS",
    "MAX_NAME_BYTES",
    "MAX_NESTING",
    "MAX_PARENTS",
    "MAX_RETRY_AFTER_HOURS",
    "MAX_TASK_ID_BYTES",
    "BadField",
    "adopt_cron",
    "check_cron",
    "check_cron_size",
    "check_max_execution_seconds",
    "check_max_per_minute",
    "check_max_retries",
    "check_name",
    "check_not_empty",
    "check_parents",
    "check_rate_limit",
    "check_retry_after_hours",
    "check_size",
    "check_task_id",
    "check_time",
    "check_urgency",
    "check_webhook_url",
    "nests_deeper",
    "show",
    "utf8_size",
    "whole_or_none",
]

#: Longest task id, in UTF-8 bytes. Ids are keys in memory, in every log record and in messages.
MAX_TASK_ID_BYTES = 1024
#: Longest task type, rate-limit group or pool name, in UTF-8 bytes (each registered type is in
#: membership.json, rewritten at every renewal; the others are in every record of their task).
MAX_NAME_BYTES = 256
#: Most ids in one `trigger_after_ids`.
MAX_PARENTS = 1024
#: Longest `cron`, in characters: six fields listing every value take about 500.
MAX_CRON_CHARS = 1024
#: Deepest nesting of arrays and objects in a line or a record, its own object being level 1.
#: What the daemon accepts it can write back: orjson writes at most 254 levels.
MAX_NESTING = 128
#: 100 years, like the longest `retry_after_hours` (`snerd.core.retry.MAX_RETRY_AFTER_HOURS`).
MAX_EXECUTION_SECONDS = int(MAX_RETRY_AFTER_HOURS * 3600)
#: Upstream parsed max_retries and max_per_minute as i32: a larger value is not something any
#: SDK can mean, and records written with it must stay readable by upstream tools.
I32_MAX = 2**31 - 1
#: The most attempts a task can make (`1 + max_retries`): the bound of an attempt number and
#: of a record's `retryCount` (a dead letter's counts every attempt).
MAX_ATTEMPTS = I32_MAX + 1

# How much of a bad value to echo back in an error: enough to recognize it, never megabytes.
_SHOW_MAX_CHARS = 200


class BadField(ValueError):
    """A value out of its range. `detail` is the sentence, starting with the value's name."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


def show(value: str) -> str:
    """A bad value as echoed in an error: cut short, so an error line never carries megabytes."""
    if len(value) <= _SHOW_MAX_CHARS:
        return value
    return value[:_SHOW_MAX_CHARS] + "…"


def utf8_size(text: str) -> int:
    """Bytes of `text` in UTF-8 (a lone surrogate, which no parsed line holds, as 3)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def check_size(name: str, text: str, limit: int) -> None:
    """At most `limit` UTF-8 bytes."""
    # Within `limit // 4` characters a text is within `limit` bytes in any encoding: most texts
    # need no encoding to check.
    if len(text) > limit // 4:
        size = utf8_size(text)
        if size > limit:
            raise BadField(f"{name} is {size} bytes; the limit is {limit}")


def check_not_empty(name: str, text: str) -> None:
    if not text:
        raise BadField(f"{name} must not be empty")


def check_task_id(name: str, text: str) -> None:
    """A task id: not empty, at most `MAX_TASK_ID_BYTES`."""
    check_not_empty(name, text)
    check_size(name, text, MAX_TASK_ID_BYTES)


def check_name(name: str, text: str) -> None:
    """A task type, rate-limit group or pool: at most `MAX_NAME_BYTES` (emptiness is the
    caller's: an empty group or pool means none)."""
    check_size(name, text, MAX_NAME_BYTES)


def check_max_retries(name: str, n: int) -> None:
    if n < 0:
        raise BadField(f"{name} must be 0 or more, got {n}")
    if n > I32_MAX:
        raise BadField(f"{name} {n} is too large (at most {I32_MAX})")


def check_retry_after_hours(name: str, hours: float) -> None:
    if not math.isfinite(hours):
        raise BadField(f"{name} must be a finite number, got {hours}")
    if hours < 0:
        raise BadField(f"{name} must be 0 or more, got {hours}")
    if hours > MAX_RETRY_AFTER_HOURS:
        raise BadField(f"{name} {hours} is more than 100 years")


def check_max_per_minute(name: str, n: int) -> None:
    if n < 1:
        raise BadField(f"{name} must be at least 1, got {n}")
    if n > I32_MAX:
        raise BadField(f"{name} {n} is too large (at most {I32_MAX})")


def check_rate_limit(names: tuple[str, str], group: str | None, max_per_minute: int | None) -> None:
    """`max_per_minute` without a group is refused: a limit the user asked for that would never
    apply. (`names`: what to call the group and the limit.)"""
    if max_per_minute is not None:
        check_max_per_minute(names[1], max_per_minute)
        if group is None:
            raise BadField(f"{names[1]} needs a {names[0]} to count dispatches in")


def check_max_execution_seconds(name: str, n: int) -> None:
    # Upstream's 0 meant "time out at once".
    if n < 1:
        raise BadField(f"{name} must be at least 1, got {n}")
    if n > MAX_EXECUTION_SECONDS:
        raise BadField(f"{name} {n} is more than 100 years")


#: The retry policies a task may name (`snerd.core.retry.POLICIES`; spelled here too so that
#: this module imports no rule it checks; `tests/core/test_retry.py` holds the two equal).
BACKOFF_POLICIES = ("constant", "exponential")


def check_backoff(name: str, policy: str) -> None:
    if policy not in BACKOFF_POLICIES:
        raise BadField(
            f"{name} must be one of {', '.join(BACKOFF_POLICIES)}, got '{show(policy)}'"
        )


def check_backoff_max_seconds(name: str, n: int) -> None:
    if n < 1:
        raise BadField(f"{name} must be at least 1, got {n}")
    if n > MAX_EXECUTION_SECONDS:
        raise BadField(f"{name} {n} is more than 100 years")


def check_urgency(name: str, score: float) -> None:
    if not math.isfinite(score):
        raise BadField(f"{name} must be a finite number, got {score}")


#: The form snerd and upstream write every time in (`format_rfc3339`).
_WRITTEN_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z", re.ASCII)
_fromisoformat = datetime.fromisoformat


def check_time(name: str, text: str) -> None:
    """A time `parse_rfc3339` reads (so one that can be written back, years 1-9999).

    A time in the form snerd writes is checked by the calendar alone, about 15 times faster
    than the parse (every record holds two or three): there `fromisoformat` accepts exactly
    the dates and times the parse accepts, except a leap second, which the parse then takes.
    The last time accepted is remembered: a record's times are often one time (an enqueue's
    `retryAfterTime` and `executeAt`)."""
    global _last_time
    if text == _last_time:
        return
    if _WRITTEN_TIME.fullmatch(text) is not None:
        try:
            _fromisoformat(text)
        except ValueError:
            pass
        else:
            _last_time = text
            return
    try:
        parse_rfc3339(text)
    except ValueError as exc:
        raise BadField(f"invalid {name} '{show(text)}': {exc}") from None
    _last_time = text


#: The last time `check_time` accepted. (One string, replaced whole: a reader in another
#: thread sees this one or the one before, both accepted.)
_last_time = "1970-01-01T00:00:00.000000Z"


def check_cron_size(name: str, text: str) -> None:
    """At most `MAX_CRON_CHARS`: croniter would take its time over a list of a million values,
    and the error would echo all of it."""
    if len(text) > MAX_CRON_CHARS:
        raise BadField(f"{name} is {len(text)} characters; the limit is {MAX_CRON_CHARS}")


def check_cron(name: str, text: str) -> str:
    """A cron expression as `snerd.core.cron.normalize_cron` reads it; its normalized form."""
    check_cron_size(name, text)
    normalized = _normalized_cron(text)
    if isinstance(normalized, BadField):
        raise BadField(f"invalid {name} '{show(text)}': {normalized.detail}")
    return normalized


def adopt_cron(name: str, text: str) -> str:
    """A cron expression stored in a record, in snerd's normalized form: `check_cron`, except
    that upstream's 7-field form (seconds first, a trailing year `*`) is read without the
    year, as upstream wrote it."""
    if len(text) <= MAX_CRON_CHARS:
        parts = text.split()
        if len(parts) == 7 and parts[-1] == "*":
            text = " ".join(parts[:6])
    return check_cron(name, text)


@functools.lru_cache(maxsize=256)
def _normalized_cron(text: str) -> str | BadField:
    # Cached: every record of a cron task carries its expression, and croniter takes tens of
    # microseconds to judge one.
    try:
        return normalize_cron(text)
    except ValueError as exc:
        return BadField(str(exc))


def check_webhook_url(name: str, url: str) -> None:
    """A URL the daemon can call (`snerd.core.webhook_target.parse_webhook_url`); the reason
    never quotes it."""
    # (Only a URL within the size limit is worth remembering; a longer one fails at once.)
    target = _webhook_target(url) if len(url) <= MAX_WEBHOOK_URL_BYTES else parse_webhook_url(url)
    if isinstance(target, BadWebhookUrl):
        raise BadField(name + target.reason.removeprefix("webhook_url"))


@functools.lru_cache(maxsize=256)
def _webhook_target(url: str) -> object:
    # Cached: every record of a webhook task carries its URL.
    return parse_webhook_url(url)


def check_unique_until(name: str, value: str | int, dedupes: bool) -> None:
    """`started`, `finished`, or whole seconds from 1 to a week; anything but `finished` (the
    default) only with dedupe on."""
    if type(value) is int:
        if not 1 <= value <= MAX_UNIQUE_SECONDS:
            raise BadField(
                f"{name} is {value} seconds; it must be from 1 to {MAX_UNIQUE_SECONDS} (a week)"
            )
    elif value not in (STARTED, FINISHED):
        raise BadField(
            f"{name} must be 'started', 'finished' or a number of seconds, got '{show(str(value))}'"
        )
    if value != FINISHED and not dedupes:
        raise BadField(f"{name} needs auto_dedupe or unique_key")


def check_parents(name: str, task_id: str, parents: Sequence[str]) -> None:
    """The ids a task waits for: at most `MAX_PARENTS`, each a task id, not the task's own,
    none twice."""
    if len(parents) > MAX_PARENTS:
        raise BadField(f"{name} has {len(parents)} ids; the limit is {MAX_PARENTS}")
    for parent in parents:
        if not parent:
            raise BadField(f"{name} must not contain an empty id")
        if parent == task_id:
            raise BadField(f"task {task_id} cannot depend on itself")
        size = utf8_size(parent)
        if size > MAX_TASK_ID_BYTES:
            raise BadField(f"{name} holds an id of {size} bytes; the limit is {MAX_TASK_ID_BYTES}")
    if len(set(parents)) != len(parents):
        raise BadField(f"{name} must not repeat an id")


def nests_deeper(doc: dict[str, Any] | list[Any], limit: int) -> bool:
    """True when arrays and objects nest more than `limit` levels in `doc` (level 1).

    Level by level, without recursion; a container's values are looked at in one C pass
    (`set(map(type, ...))`), so a long flat array costs little more than its parse did."""
    level: list[Any] = [doc]
    depth = 1
    while level:
        deeper: list[Any] = []
        for node in level:
            values = node.values() if type(node) is dict else node
            kinds = set(map(type, values))
            if dict in kinds or list in kinds:
                deeper += [v for v in values if type(v) is dict or type(v) is list]
        if deeper and depth == limit:
            return True
        depth += 1
        level = deeper
    return False


def whole_or_none(value: Any) -> int | None:
    """`value` when it is a JSON whole number (an int, not a bool), else None: how a reader
    that shows what it found takes a count from disk (a heartbeat's `beat`, a record's
    `retryCount`)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None
