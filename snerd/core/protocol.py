"""The SDK wire protocol: parse and validate inbound lines, build outbound messages.

This module owns the shape of every newline-delimited JSON message between an SDK and the
daemon (docs/protocol.md): inbound lines become typed commands (`Register`, `Enqueue`, `Result`,
`Progress`, `StatsRequested`, `Schedule`, `Cancel`, `Requeue`, `Pause`, `GetTask`, ...), which
are core events; outbound messages are built here as plain
dicts, `action` first, in the exact shapes upstream SDKs parse. It must never perform I/O, read a
clock or decide queue semantics: it answers "what did the SDK say, and is it well-formed?", and
nothing about what the queue does with it.

It stays one module (about 1,200 lines) because it is one vocabulary: every inbound command
and outbound message, the job-control ones included (their rules are `snerd.core.control`'s),
and the error texts SDKs match. A `schedule` line is parsed by the
enqueue's own parser (its template) plus `snerd.core.schedule.policies` for its own fields, so
the two cannot drift apart.

Errors are the SDK's fault, never the daemon's: anything wrong with a line raises
`ProtocolError`, whose `message` is the full text for an `error` message and whose `task_id` is
the line's task id whenever one can be found, even in a line that is otherwise garbage — upstream
sent parse errors without one, which left SDK enqueue calls waiting forever (reference §6.4 #25).

Two classes of error text, as upstream:

- `Invalid JSON: <detail>` — the line is not JSON, not an object, has an unknown `action`, or a
  field is missing or of the wrong type. Types are strict like serde: an integer field takes only
  a JSON integer (not `3.0`, not `"3"`, not `true`); a number field takes an integer or a float.
- `Failed to enqueue: <detail>` — a well-typed `enqueue` whose values make no sense (negative
  retries, an unparseable `execute_at` or `cron`, ...). Upstream silently changed the meaning of
  such tasks (ran them now, ran a cron once, deferred them forever); snerd refuses them.

Decisions where upstream had no rule:

- Unknown fields are ignored and `null` means absent, for optional fields. An empty string in an
  optional string field (`rate_limit_group`, `execute_at`, `cron`, `webhook_url`, `pool`) also
  means absent: SDKs that build JSON by string formatting send `""` for "unset", and upstream
  treated `""` as "no time"/"no cron" anyway (an unparseable value).
- Rate limiting needs both fields. `max_per_minute` without a `rate_limit_group` is refused
  (upstream ignored it silently: a limit the user asked for that would never apply); a group
  without `max_per_minute` is accepted and limits nothing, as upstream.
- `trigger_after_ids` keeps its order, drops repeated ids, refuses empty ids and the task's own.
- `webhook_url` must be an `http://` or `https://` URL the daemon can call: a host, a valid port,
  no user name, no whitespace, at most 2 KiB (`snerd.core.webhook_target`; anything else could
  only ever fail, or crash whoever calls it).
- `max_execution_seconds` must be at least 1 (upstream's 0 meant "time out at once").
- `result` is read leniently past its id and outcome, because a refused `result` leaves an attempt
  hanging: a non-string `error_msg` is kept as its JSON text. `status` wins over `success` when a
  line carries both. Its optional `result` field (a snerd extra: the handler's return value, any
  JSON value; `null` means none) is kept only on a success: on a failure it is ignored, not
  refused, for the same reason. How big a result may be is the node's rule (its setting
  `result_max_bytes`; `result_size` measures it): past it the attempt fails.
- Blank lines are skipped by upstream; `is_blank_line` says so, and the caller should skip them
  before `parse_line` (which would answer `Invalid JSON: empty line`); the node does.

Limits, so that whatever a line carries the daemon can hold it, store it and write it back:

- Nesting: at most `MAX_NESTING` (128) levels of arrays and objects, the line's own object
  counted, in any field, known or not. orjson reads 1024 levels but writes only 254, and the
  daemon writes inbound values back (the `progress` echo, a non-string `error_msg`): a line it
  could not write back would end the daemon at the echo. Upstream's parser stopped at 128 too.
- Sizes, in UTF-8 bytes: a task id (`task_id` of every action, each id in
  `trigger_after_ids`) at most `MAX_TASK_ID_BYTES`; a name (`task_type` of `enqueue` and
  `register`, `rate_limit_group`, `pool`) at most `MAX_NAME_BYTES`, since registered types are
  listed in membership.json, which is rewritten at every lease renewal; `trigger_after_ids` at
  most `MAX_PARENTS` ids; `cron` at most `MAX_CRON_CHARS` characters. Everything else is bounded
  by the line (`DEFAULT_MAX_LINE_BYTES`).
- Numbers: JSON has no NaN or infinity (orjson refuses them, and numbers that overflow a
  double); an integer beyond 64 bits is read as a float, so an integer field names it as such.
- Text: orjson refuses invalid UTF-8 and lone surrogates, so every string is encodable.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeAlias

import orjson

from snerd.core import dedupe
from snerd.core import fields as rule
from snerd.core import schedule as schedule_rules
from snerd.core.events import Event
from snerd.core.fields import I32_MAX as _I32_MAX
from snerd.core.fields import (
    MAX_CRON_CHARS,
    MAX_EXECUTION_SECONDS,
    MAX_NAME_BYTES,
    MAX_NESTING,
    MAX_PARENTS,
    MAX_RETRY_AFTER_HOURS,
    MAX_TASK_ID_BYTES,
    BadField,
)
from snerd.core.fields import nests_deeper as _nests_deeper
from snerd.core.fields import show as _show
from snerd.core.fields import utf8_size as _utf8_size
from snerd.core.slots import slot_constructor
from snerd.core.timefmt import format_rfc3339, parse_rfc3339

__all__ = [
    "DEFAULT_MAX_LINE_BYTES",
    "DEFAULT_RESULT_MAX_BYTES",
    "ENQUEUE_OPTIONS",
    "MAX_BATCH_TASKS",
    "MAX_CRON_CHARS",
    "MAX_EXECUTION_SECONDS",
    "MAX_NAME_BYTES",
    "MAX_NESTING",
    "MAX_PARENTS",
    "MAX_REGISTERED_TYPES",
    "MAX_RETRY_AFTER_HOURS",
    "MAX_TASK_ID_BYTES",
    "NO_SHARDS_OWNED",
    "SHUTTING_DOWN",
    "SNIFF_BYTES",
    "Cancel",
    "Command",
    "ControlCommand",
    "Enqueue",
    "EnqueueBatch",
    "GetTask",
    "Pause",
    "PlainEnqueue",
    "Progress",
    "ProtocolError",
    "Register",
    "Requeue",
    "Result",
    "StatsRequested",
    "Sweep",
    "ack_enqueued",
    "ack_lines",
    "ack_registered",
    "cancelled",
    "encode_message",
    "enqueue_command",
    "error",
    "execute",
    "failed_to_enqueue",
    "is_blank_line",
    "max_retries_reached",
    "membership",
    "parse_document",
    "parse_line",
    "paused",
    "plain_enqueue",
    "plain_result",
    "progress",
    "result_command",
    "result_size",
    "result_too_large",
    "retried",
    "sniff_task_id",
    "stats",
    "stop_attempt",
    "swept",
    "task_details",
    "timed_out",
    "too_many_task_types",
    "unknown_result",
    "validate_enqueue",
]

#: Longest inbound line accepted, newline excluded.
DEFAULT_MAX_LINE_BYTES = 64 * 1024 * 1024
#: The most enqueues one `enqueue_batch` line may carry (the SDK splits a longer list).
MAX_BATCH_TASKS = 10_000
#: Largest result a handler may return by default (SNERD_RESULT_MAX_BYTES): 256 KiB of its
#: compact JSON encoding, well within a line, yet small enough that a history of them stays
#: a modest log.
DEFAULT_RESULT_MAX_BYTES = 256 * 1024
# The limits of a task's values (MAX_TASK_ID_BYTES, MAX_NAME_BYTES, MAX_PARENTS, MAX_CRON_CHARS,
# MAX_NESTING, MAX_EXECUTION_SECONDS) are `snerd.core.fields`'s, which log records are held to.
#: Most task types one daemon has handlers for (`register`): each is listed in membership.json.
MAX_REGISTERED_TYPES = 1024

SHUTTING_DOWN = "[Snerd] Daemon is shutting down; enqueue rejected"
NO_SHARDS_OWNED = "[Snerd] No shards owned by this instance"

_ACTIONS = ("register", "enqueue", "result", "progress", "stats")
# How much of a bad value to echo back in an error: enough to recognize it, never megabytes.
_SHOW_MAX_CHARS = 200
#: Where to look for a task id in a line that does not parse: its first and its last
#: `SNIFF_BYTES` (dict-ordered SDKs put it near the front; Go's json.Marshal sorts keys, so it
#: comes after task_data).
SNIFF_BYTES = 64 * 1024
# The id's JSON string, escapes included; orjson decodes it. Text inside another JSON string
# cannot match, because there every quote is escaped.
_SNIFF_TASK_ID = re.compile(rb'"task_id"\s*:\s*("(?:[^"\\]|\\.)*")', re.DOTALL)
_BLANK = re.compile(rb"[ \t\r\n]*")


# --- inbound commands --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Register(Event):
    """The SDK has a handler for `task_type` (and wants its dead letters)."""

    task_type: str
    #: snerd extra: the SDK stops the handler when told `{"action":"cancel"}` (a running
    #: attempt whose task was cancelled). Upstream SDKs never say so and are never told.
    cancellable: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Enqueue(Event):
    """The SDK asks for a task to be stored and run. Validated: see `validate_enqueue`."""

    task_id: str
    task_type: str
    #: Opaque text, normally JSON; passed back verbatim in `execute`.
    task_data: str
    #: Retries after the first attempt: the task runs at most `1 + max_retries` times.
    max_retries: int
    retry_after_hours: float
    rate_limit_group: str | None = None
    max_per_minute: int | None = None
    auto_dedupe: bool = False
    urgency_score: float = 0.0
    #: `execute_at`, parsed: microseconds since the Unix epoch.
    execute_at_us: int | None = None
    #: Normalized by `snerd.core.cron.normalize_cron` (6 fields, seconds first).
    cron: str | None = None
    webhook_url: str | None = None
    max_execution_seconds: int | None = None
    pool: str | None = None
    trigger_after_ids: tuple[str, ...] = ()
    #: Dedupe by this key (per task type) instead of the payload (`snerd.core.dedupe`).
    unique_key: str | None = None
    #: How long a twin makes this enqueue a duplicate: `started`, `finished` or seconds.
    unique_until: str | int = "finished"
    #: snerd extra: the task's retry policy (`constant`, `exponential`); None: the daemon's.
    backoff: str | None = None
    #: snerd extra: the cap on an exponential retry delay, in seconds; None: 7 days.
    backoff_max_seconds: int | None = None

    @property
    def dedupes(self) -> bool:
        """The enqueue is checked for duplicates (`auto_dedupe` or a `unique_key`)."""
        return self.auto_dedupe or self.unique_key is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class EnqueueBatch(Event):
    """Many enqueues in one line: `{"action":"enqueue_batch","tasks":[...]}`, each item the
    fields of an `enqueue` (without its `action`), parsed alone. An item that does not parse
    is its own `ProtocolError` (with its task id when it has one, else its place: `tasks[3]`),
    refusing only itself; each other item is taken as an `enqueue` line is, and answered as
    one (`ack`, or `error` naming its id)."""

    items: tuple[Enqueue | ProtocolError, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Result(Event):
    """The SDK finished an attempt of `task_id`."""

    task_id: str
    success: bool
    error_msg: str | None = None
    #: snerd extra: the attempt number the SDK was given in `execute`, echoed back.
    attempt: int | None = None
    #: snerd extra: the handler's return value (any JSON value) on a success; None: none.
    result: Any = None
    #: snerd extra: False on a failure that must not be retried (`"retry": false`: the
    #: handler raised an error its SDK marks final): the task is dead-lettered now, whatever
    #: attempts it has left.
    retry: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class Progress(Event):
    """The SDK reports progress of a running task; `data` is any JSON value, passed on."""

    task_id: str
    data: Any


@dataclass(frozen=True, slots=True, kw_only=True)
class StatsRequested(Event):
    """The SDK asked for a `stats` message."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Schedule(Event):
    """Declare the schedule `name` (create it, or replace it where anything differs):
    `snerd.core.schedule`."""

    name: str
    #: What each run is enqueued with: `task_id` is the name, `cron` the normalized expression.
    template: Enqueue
    #: The same as the line gave it: its enqueue fields (nulls left out, `cron` normalized),
    #: which the schedule's record keeps.
    task: dict[str, Any]
    timezone: str | None = None
    misfire: str = "once"
    catch_up: int = 1
    overlap: str = "allow"


@dataclass(frozen=True, slots=True, kw_only=True)
class Unschedule(Event):
    """Remove the schedule `name` (its runs already enqueued go on)."""

    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Cancel(Event):
    """Cancel `task_id`: it never starts again; a running attempt is stopped
    (`snerd.core.control`)."""

    task_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Requeue(Event):
    """Put the dead-lettered (or cancelled) task `task_id` back in the queue, attempts reset
    (the `retry` action)."""

    task_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Pause(Event):
    """Pause (`paused`) or resume the dispatch of `task_type` (None: of the whole queue) on
    every daemon (the `pause` and `resume` actions)."""

    task_type: str | None
    paused: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Sweep(Event):
    """Act on the ended tasks of `task_type` (None: of every type) that finished before
    `before_us` (wall µs; None: whenever), in every shard: `purge` forgets the dead letters and
    cancelled tasks (the `purge` action); else the dead letters are put back in the queue,
    attempts reset (the `retry` action given a type instead of a task id)."""

    purge: bool
    task_type: str | None
    before_us: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class GetTask(Event):
    """Look `task_id` up wherever it is (the `get` action)."""

    task_id: str


#: The job-control commands (`snerd.core.control` holds their rules).
ControlCommand: TypeAlias = Cancel | Requeue | Pause | Sweep | GetTask

Command: TypeAlias = (
    Register
    | Enqueue
    | EnqueueBatch
    | Result
    | Progress
    | StatsRequested
    | Schedule
    | Unschedule
    | ControlCommand
)


class ProtocolError(Exception):
    """A line from the SDK was refused. Its fault, not the daemon's: answer with `error`.

    Attributes:
        task_id: the offending line's task id, when it had one (even if the rest was invalid).
        message: the full text for the `error` message (`Invalid JSON: ...`, `Failed to ...`).
    """

    def __init__(self, message: str, *, task_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.task_id = task_id

    def __repr__(self) -> str:
        return f"ProtocolError({self.message!r}, task_id={self.task_id!r})"


class ScheduleError(ProtocolError):
    """A `schedule` or `unschedule` line was refused: `Failed to schedule: <detail>`, answered
    with an `error` naming the schedule (`name`)."""

    def __init__(self, detail: str, *, name: str | None) -> None:
        super().__init__(f"Failed to schedule: {detail}")
        self.name = name


# --- known texts -------------------------------------------------------------------------------


def failed_to_enqueue(detail: str) -> str:
    """`Failed to enqueue: <detail>`, the text upstream SDKs show for a refused enqueue."""
    return f"Failed to enqueue: {detail}"


def unknown_result(task_id: str) -> str:
    """The text for a `result` that matches no running attempt (late, duplicate or bogus)."""
    return f"Received result for unknown/expired task_id {task_id}"


def result_size(value: Any) -> int:
    """The size of a result (`Result.result`): the bytes of its compact JSON encoding, which
    is what the tombstone stores."""
    return len(orjson.dumps(value))


def result_too_large(task_id: str, size: int, limit: int) -> str:
    """The error of an attempt whose result is past the limit (SNERD_RESULT_MAX_BYTES)."""
    return (
        f"task {task_id}: result of {size} bytes exceeds the limit of {limit} bytes "
        "(SNERD_RESULT_MAX_BYTES)"
    )


def too_many_task_types(task_type: str) -> str:
    """The text for a `register` of a new type when `MAX_REGISTERED_TYPES` are registered."""
    return (
        f"[Snerd] Cannot register task type '{_show(task_type)}': this daemon has handlers for "
        f"{MAX_REGISTERED_TYPES} task types, the limit"
    )


def timed_out(seconds: int) -> str:
    """The failure reason of an attempt that outlived its `max_execution_seconds`."""
    return f"Task execution timed out after {seconds} seconds"


# --- parsing -----------------------------------------------------------------------------------


def is_blank_line(line: bytes) -> bool:
    """True for an empty or whitespace-only line, which upstream skips without an answer."""
    return _BLANK.fullmatch(line) is not None


def parse_line(line: bytes, *, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> Command:
    """Parse and validate one line from the SDK (without its newline).

    Args:
        line: the raw bytes of the line.
        max_line_bytes: refuse longer lines.

    Returns:
        The command the line carries.

    Raises:
        ProtocolError: the line is invalid; `message` says why, `task_id` names the task when the
            line had a task id.
    """
    if len(line) > max_line_bytes:
        raise ProtocolError(
            f"Invalid JSON: line of {len(line)} bytes exceeds the limit of {max_line_bytes} bytes",
            task_id=sniff_task_id(line),
        )
    try:
        doc = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(_decode_error_text(line, exc), task_id=sniff_task_id(line)) from None
    return parse_document(doc)


def parse_document(doc: Any) -> Command:
    """`parse_line` for a line already decoded (by `orjson.loads`): the same command, or the
    same `ProtocolError`."""
    if not isinstance(doc, dict):
        raise ProtocolError(f"Invalid JSON: expected an object, got {_type_name(doc)}")

    action = doc.get("action")
    # The two lines that carry a queue's traffic take a fast path when they are plainly valid
    # (no field but known ones, each a scalar: nothing nested); anything else (including every
    # error) goes the long way below, which words the errors.
    if action == "enqueue":
        fast_enqueue = _plain_enqueue(doc)
        if fast_enqueue is not None:
            return fast_enqueue
    elif action == "result":
        fast_result = _plain_result(doc)
        if fast_result is not None:
            return fast_result
    raw_id = doc.get("task_id")
    fields = _Fields(doc, raw_id if isinstance(raw_id, str) else None)
    if action == "enqueue_batch":
        # (Before the depth check of the whole line: each item is checked alone, so an item
        # is held to the depth an enqueue line is, not two levels less.)
        return _parse_batch(fields)
    if _nests_deeper(doc, MAX_NESTING):
        raise fields.invalid(f"nested deeper than {MAX_NESTING} levels")
    if action is None:
        raise fields.invalid("missing field `action`")
    if not isinstance(action, str):
        raise fields.invalid(f"field `action` must be a string, got {_type_name(action)}")
    if action == "enqueue":
        return _parse_enqueue(fields)
    if action == "result":
        return _parse_result(fields)
    if action == "progress":
        return _parse_progress(fields)
    if action == "register":
        task_type = fields.required_str("task_type")
        if not task_type:
            raise fields.invalid("field `task_type` must not be empty")
        fields.check_size("task_type", task_type, MAX_NAME_BYTES)
        return Register(task_type=task_type, cancellable=fields.optional_bool("cancellable") or False)
    if action == "stats":
        return StatsRequested()
    if action == "schedule":
        return _parse_schedule(doc)
    if action == "unschedule":
        return Unschedule(name=_schedule_name(doc))
    if action == "purge" or (
        action == "retry" and "task_id" not in doc and ("task_type" in doc or "queue" in doc)
    ):
        return _parse_sweep(fields, purge=action == "purge")
    if action in ("cancel", "retry", "get"):
        task_id = fields.required_id()
        if action == "cancel":
            return Cancel(task_id=task_id)
        return Requeue(task_id=task_id) if action == "retry" else GetTask(task_id=task_id)
    if action in ("pause", "resume"):
        return Pause(task_type=_paused_type(fields), paused=action == "pause")
    raise fields.invalid(f"unknown action '{_show(action)}'")


def _parse_batch(fields: _Fields) -> EnqueueBatch:
    """An `enqueue_batch` line: its `tasks`, a list of 1 to `MAX_BATCH_TASKS` objects, each
    parsed as an `enqueue` line (`EnqueueBatch`)."""
    tasks = fields.doc.get("tasks")
    if not isinstance(tasks, list):
        raise fields.invalid(
            f"field `tasks` must be a list of enqueues, got {_type_name(tasks)}"
        )
    if not tasks:
        raise fields.invalid("field `tasks` must not be empty")
    if len(tasks) > MAX_BATCH_TASKS:
        raise fields.invalid(
            f"field `tasks` holds {len(tasks)} enqueues, more than {MAX_BATCH_TASKS}"
        )
    items: list[Enqueue | ProtocolError] = []
    for i, task in enumerate(tasks):
        try:
            if not isinstance(task, dict):
                raise ProtocolError(failed_to_enqueue(
                    f"each of `tasks` must be an object, got {_type_name(task)}"))
            action = task.get("action", "enqueue")
            if action != "enqueue":
                raise ProtocolError(
                    failed_to_enqueue(f"an item of `tasks` is an enqueue, not '{_show(str(action))}'"),
                    task_id=task.get("task_id") if isinstance(task.get("task_id"), str) else None,
                )
            command = parse_document({**task, "action": "enqueue"})
            assert isinstance(command, Enqueue)
            items.append(command)
        except ProtocolError as exc:
            if exc.task_id is None:
                exc = ProtocolError(f"{exc.message} (tasks[{i}])")
            items.append(exc)
    return EnqueueBatch(items=tuple(items))


def _parse_sweep(fields: _Fields, *, purge: bool) -> Sweep:
    """A `purge`, or a `retry` of a type's dead letters: `task_type` or `"queue": true` (as a
    pause names what it acts on), and `before` (RFC 3339, optional)."""
    task_type = _paused_type(fields)
    before = fields.optional_str("before")
    before_us = None
    if before is not None:
        try:
            before_us = parse_rfc3339(before)
        except ValueError as exc:
            raise fields.invalid(f"invalid before '{_show(before)}': {exc}") from None
        if before_us < 0:
            raise fields.invalid(f"invalid before '{_show(before)}': earlier than 1970")
    return Sweep(purge=purge, task_type=task_type, before_us=before_us)


def _paused_type(fields: _Fields) -> str | None:
    """The `task_type` of a `pause` or `resume` (or of a sweep), or None for `"queue": true`
    (all of them): exactly one of the two, so that a line missing its type never acts on
    everything."""
    whole = fields.optional_bool("queue")
    task_type = fields.doc.get("task_type")
    if whole:
        if task_type is not None:
            raise fields.invalid("give `task_type` or `\"queue\": true`, not both")
        return None
    if task_type is None:
        raise fields.invalid("missing field `task_type` (or `\"queue\": true` for every type)")
    task_type = fields.required_str("task_type")
    if not task_type:
        raise fields.invalid("field `task_type` must not be empty")
    fields.check_size("task_type", task_type, MAX_NAME_BYTES)
    return task_type


#: The fields of a `schedule` line that are not an enqueue's.
_SCHEDULE_ONLY = ("name", "timezone", "misfire", "catch_up", "overlap")


def _schedule_name(doc: dict[str, Any]) -> str:
    name = doc.get("name")
    if not isinstance(name, str) or not name:
        raise ScheduleError("missing field `name` (a non-empty string)", name=None)
    if _utf8_size(name) > schedule_rules.MAX_NAME_BYTES:
        raise ScheduleError(
            f"name is {_utf8_size(name)} bytes; the limit is {schedule_rules.MAX_NAME_BYTES}",
            name=name,
        )
    return name


def _parse_schedule(doc: dict[str, Any]) -> Schedule:
    """A `schedule` line: a name, the schedule's own fields, and the fields of an enqueue
    (without `task_id`, `execute_at` or `trigger_after_ids`; `cron` required), checked by the
    enqueue's rules."""
    name = _schedule_name(doc)
    for key in ("task_id", "execute_at", "trigger_after_ids"):
        if doc.get(key) is not None:
            raise ScheduleError(f"a schedule has no `{key}`", name=name)
    if not isinstance(doc.get("cron"), str) or not doc["cron"].strip():
        raise ScheduleError("missing field `cron`", name=name)
    enqueue = {k: v for k, v in doc.items() if k not in _SCHEDULE_ONLY}
    enqueue.update(action="enqueue", task_id=name)
    try:
        template = _parse_enqueue(_Fields(enqueue, name))
    except ProtocolError as exc:
        detail = exc.message.removeprefix(failed_to_enqueue("")).removeprefix("Invalid JSON: ")
        raise ScheduleError(detail, name=name) from None
    try:
        timezone, misfire, catch_up, overlap = schedule_rules.policies(doc)
    except ValueError as exc:
        raise ScheduleError(str(exc), name=name) from None
    task = {
        k: v
        for k, v in enqueue.items()
        if v is not None and k not in ("action", "task_id") and v != ""
    }
    task["cron"] = template.cron
    return Schedule(
        name=name,
        template=template,
        task=task,
        timezone=timezone,
        misfire=misfire,
        catch_up=catch_up,
        overlap=overlap,
    )


def validate_enqueue(cmd: Enqueue) -> None:
    """Check the invariants of an `Enqueue`, however it was built (parsed, or by the engine).

    Raises:
        ProtocolError: `Failed to enqueue: <reason>`, carrying `cmd.task_id`.
    """

    # The value rules are `snerd.core.fields`'s: a record read back from a log is held to them.
    try:
        rule.check_task_id("task_id", cmd.task_id)
        rule.check_not_empty("task_type", cmd.task_type)
        rule.check_name("task_type", cmd.task_type)
        if cmd.rate_limit_group is not None:
            rule.check_name("rate_limit_group", cmd.rate_limit_group)
        if cmd.pool is not None:
            rule.check_name("pool", cmd.pool)
        rule.check_max_retries("max_retries", cmd.max_retries)
        rule.check_retry_after_hours("retry_after_hours", cmd.retry_after_hours)
        rule.check_rate_limit(
            ("rate_limit_group", "max_per_minute"), cmd.rate_limit_group, cmd.max_per_minute
        )
        if cmd.max_execution_seconds is not None:
            rule.check_max_execution_seconds("max_execution_seconds", cmd.max_execution_seconds)
        rule.check_urgency("urgency_score", cmd.urgency_score)
        if cmd.cron is not None:
            normalized = rule.check_cron("cron", cmd.cron)
            if normalized != cmd.cron:
                raise BadField(
                    f"cron '{_show(cmd.cron)}' is not normalized (expected '{normalized}')"
                )
        if cmd.webhook_url is not None:
            rule.check_webhook_url("webhook_url", cmd.webhook_url)
        rule.check_parents("trigger_after_ids", cmd.task_id, cmd.trigger_after_ids)
        if cmd.unique_key is not None:
            rule.check_not_empty("unique_key", cmd.unique_key)
            rule.check_size("unique_key", cmd.unique_key, rule.MAX_TASK_ID_BYTES)
        rule.check_unique_until("unique_until", cmd.unique_until, cmd.dedupes)
        if cmd.backoff is not None:
            rule.check_backoff("backoff", cmd.backoff)
        if cmd.backoff_max_seconds is not None:
            rule.check_backoff_max_seconds("backoff_max_seconds", cmd.backoff_max_seconds)
    except BadField as bad:
        raise ProtocolError(failed_to_enqueue(bad.detail), task_id=cmd.task_id) from None


#: The optional `enqueue` fields, in the upstream SDK's argument order (after
#: `retry_after_hours`).
ENQUEUE_OPTIONS = (
    "rate_limit_group",
    "max_per_minute",
    "auto_dedupe",
    "urgency_score",
    "execute_at",
    "cron",
    "webhook_url",
    "max_execution_seconds",
    "pool",
    "trigger_after_ids",
    "unique_key",
    "unique_until",
    "backoff",
    "backoff_max_seconds",
)
#: `_plain_enqueue` takes only lines where all of them are absent or null.
_ENQUEUE_OPTIONAL = frozenset(ENQUEUE_OPTIONS)
#: Ids of at most this many characters are within `MAX_TASK_ID_BYTES` in any encoding (UTF-8
#: takes at most 4 bytes a character), so the fast path need not encode them to check; and so
#: for names and `MAX_NAME_BYTES`.
_PLAIN_ID_CHARS = MAX_TASK_ID_BYTES // 4
_PLAIN_NAME_CHARS = MAX_NAME_BYTES // 4
#: The fields of a plain enqueue: `action` and the five required ones. A line with any other
#: field than these and the optional ones goes the long way, which checks its nesting.
_PLAIN_ENQUEUE_FIELDS = 6


def _plain_enqueue(doc: dict[str, Any]) -> Enqueue | None:
    """The `Enqueue` of a plainly valid enqueue object — the required fields well-typed and in
    range, every optional one absent or null — or None: then `_parse_enqueue` decides (and
    words the error). The result is what `_parse_enqueue` returns for such an object."""
    plain = plain_enqueue(doc)
    return None if plain is None else enqueue_command(plain)


def enqueue_command(plain: PlainEnqueue) -> Enqueue:
    """The `Enqueue` that `parse_line` gives for the object `plain_enqueue` took `plain` from."""
    return _new_plain_enqueue(*plain)


def result_command(plain: PlainResult) -> Result:
    """The `Result` that `parse_line` gives for the object `plain_result` took `plain` from."""
    return _new_result(*plain)


#: What `plain_enqueue` gives: task_id, task_type, task_data, max_retries, retry_after_hours.
PlainEnqueue: TypeAlias = tuple[str, str, str, int, float]


def plain_enqueue(doc: dict[str, Any]) -> PlainEnqueue | None:
    """The five fields of a plainly valid enqueue object (see `_plain_enqueue`), or None.

    The node's batch path for the commonest line takes them without building an `Enqueue`;
    they are exactly the fields of the `Enqueue` that `parse_line` gives for the same object.
    """
    optional = _ENQUEUE_OPTIONAL.intersection(doc)
    if len(doc) != _PLAIN_ENQUEUE_FIELDS + len(optional):
        return None  # an unknown field (or a required one missing)
    for name in optional:
        if doc[name] is not None:
            return None
    task_id = doc.get("task_id")
    task_type = doc.get("task_type")
    task_data = doc.get("task_data")
    max_retries = doc.get("max_retries")
    hours = doc.get("retry_after_hours")
    if (
        type(task_id) is not str
        or not 0 < len(task_id) <= _PLAIN_ID_CHARS
        or type(task_type) is not str
        or not 0 < len(task_type) <= _PLAIN_NAME_CHARS
        or type(task_data) is not str
        or type(max_retries) is not int
        or not 0 <= max_retries <= _I32_MAX
    ):
        return None
    if type(hours) is int:
        if not 0 <= hours <= MAX_RETRY_AFTER_HOURS:
            return None
        hours = float(hours)
    elif type(hours) is float:
        if not 0.0 <= hours <= MAX_RETRY_AFTER_HOURS:  # NaN fails too
            return None
        hours += 0.0  # -0.0 -> 0.0, as `_parse_enqueue`
    else:
        return None
    return task_id, task_type, task_data, max_retries, hours


def _plain_result(doc: dict[str, Any]) -> Result | None:
    """The `Result` of a plainly valid result object (see `plain_result`), or None:
    `_parse_result` decides."""
    plain = plain_result(doc)
    return None if plain is None else result_command(plain)


#: What `plain_result` gives: task_id, success, error_msg, attempt.
PlainResult: TypeAlias = tuple[str, bool, str | None, int | None]


def plain_result(doc: dict[str, Any]) -> PlainResult | None:
    """The four fields of a plainly valid result object (string id and status, `error_msg` a
    string or absent, `attempt` a positive integer or absent), or None.

    The node's batch path for the commonest result, a success, takes them without building a
    `Result`; they are exactly the fields of the `Result` that `parse_line` gives for the same
    object."""
    fields = len(doc)
    # `action`, `task_id`, `status`, and `error_msg` and `attempt` when present: any other
    # field (which may be nested) sends the line the long way; so does a `result`, even null.
    if fields != 3 and fields != 3 + ("error_msg" in doc) + ("attempt" in doc):
        return None
    task_id = doc.get("task_id")
    status = doc.get("status")
    error_msg = doc.get("error_msg")
    attempt = doc.get("attempt")
    if (
        type(task_id) is not str
        or not 0 < len(task_id) <= _PLAIN_ID_CHARS
        or type(status) is not str
        or (error_msg is not None and type(error_msg) is not str)
        or (attempt is not None and (type(attempt) is not int or attempt < 1))
    ):
        return None
    return task_id, status == "success", error_msg, attempt


def _parse_enqueue(f: _Fields) -> Enqueue:
    # Types first, in field order, so the first wrong field is the one reported (as serde does).
    task_id = f.required_str("task_id")
    task_type = f.required_str("task_type")
    task_data = f.required_str("task_data")
    max_retries = f.required_int("max_retries")
    retry_after_hours = f.required_number("retry_after_hours")
    rate_limit_group = f.optional_str("rate_limit_group")
    max_per_minute = f.optional_int("max_per_minute")
    auto_dedupe = f.optional_bool("auto_dedupe")
    urgency_score = f.optional_number("urgency_score")
    execute_at = f.optional_str("execute_at")
    cron = f.optional_str("cron")
    webhook_url = f.optional_str("webhook_url")
    max_execution_seconds = f.optional_int("max_execution_seconds")
    pool = f.optional_str("pool")
    trigger_after_ids = f.optional_str_list("trigger_after_ids")
    unique_key = f.optional_str("unique_key")
    backoff = f.optional_str("backoff")
    backoff_max_seconds = f.optional_int("backoff_max_seconds")
    unique_until = f.doc.get("unique_until")
    if unique_until is None:
        unique_until = dedupe.FINISHED
    elif type(unique_until) is not str and type(unique_until) is not int:
        raise f.invalid(
            f"field `unique_until` must be a string or an integer, got {_type_name(unique_until)}"
        )

    cmd = Enqueue(
        task_id=task_id,
        task_type=task_type,
        task_data=task_data,
        max_retries=max_retries,
        # `+ 0.0` turns -0.0 into 0.0.
        retry_after_hours=retry_after_hours + 0.0,
        rate_limit_group=rate_limit_group,
        max_per_minute=max_per_minute,
        auto_dedupe=bool(auto_dedupe),
        urgency_score=0.0 if urgency_score is None else urgency_score + 0.0,
        webhook_url=webhook_url,
        max_execution_seconds=max_execution_seconds,
        pool=pool,
        # dict.fromkeys keeps the first occurrence of each id, in order.
        trigger_after_ids=tuple(dict.fromkeys(trigger_after_ids or ())),
        unique_key=unique_key,
        unique_until=unique_until,
        backoff=backoff or None,
        backoff_max_seconds=backoff_max_seconds,
    )
    # The plain fields first (empty id, negative retries, ...), then the two that need parsing.
    validate_enqueue(cmd)
    if execute_at is None and cron is None:
        return cmd

    def refuse(detail: str) -> ProtocolError:
        return ProtocolError(failed_to_enqueue(detail), task_id=task_id)

    execute_at_us = None
    if cron is not None:
        _check_cron_size(cron, refuse)
    if execute_at is not None:
        try:
            execute_at_us = parse_rfc3339(execute_at)
        except ValueError as exc:
            raise refuse(f"invalid execute_at '{_show(execute_at)}': {exc}") from None
    normalized_cron = None
    if cron is not None:
        try:
            normalized_cron = rule.check_cron("cron", cron)
        except BadField as bad:
            raise refuse(bad.detail) from None
    return replace(cmd, execute_at_us=execute_at_us, cron=normalized_cron)


def _parse_result(f: _Fields) -> Result:
    task_id = f.required_id()
    status = f.doc.get("status")
    if status is not None:
        if not isinstance(status, str):
            raise f.invalid(f"field `status` must be a string, got {_type_name(status)}")
        success = status == "success"
    else:
        flag = f.optional_bool("success")
        if flag is None:
            raise f.invalid("missing field `status`")
        success = flag
    raw_msg = f.doc.get("error_msg")
    if raw_msg is None or isinstance(raw_msg, str):
        error_msg = raw_msg
    else:
        # Lenient on purpose: refusing the line would leave the attempt waiting for a result.
        # (It can be written: `parse_document` refused a line nested deeper than orjson writes.)
        error_msg = orjson.dumps(raw_msg).decode()
    attempt = f.optional_int("attempt")
    if attempt is not None and attempt < 1:
        raise f.invalid(f"field `attempt` must be at least 1, got {attempt}")
    # A failure's result is ignored (see the module's header).
    result = f.doc.get("result") if success else None
    retry = f.optional_bool("retry")
    return Result(
        task_id=task_id, success=success, error_msg=error_msg, attempt=attempt, result=result,
        retry=retry is not False,
    )


def _parse_progress(f: _Fields) -> Progress:
    task_id = f.required_id()
    if "data" not in f.doc:
        raise f.invalid("missing field `data`")
    return Progress(task_id=task_id, data=f.doc["data"])


class _Fields:
    """Typed access to the fields of one inbound object, with serde-like error texts."""

    __slots__ = ("doc", "task_id")

    def __init__(self, doc: dict[str, Any], task_id: str | None) -> None:
        self.doc = doc
        self.task_id = task_id

    def invalid(self, detail: str) -> ProtocolError:
        return ProtocolError(f"Invalid JSON: {detail}", task_id=self.task_id)

    def _wrong_type(self, name: str, expected: str, value: Any) -> ProtocolError:
        return self.invalid(f"field `{name}` must be {expected}, got {_type_name(value)}")

    def _required(self, name: str) -> Any:
        value = self.doc.get(name)
        if value is None:
            # serde says "invalid type: null" for an explicit null in a required field; "missing"
            # is what the user needs to hear in both cases.
            raise self.invalid(f"missing field `{name}`")
        return value

    def required_str(self, name: str) -> str:
        value = self._required(name)
        if not isinstance(value, str):
            raise self._wrong_type(name, "a string", value)
        return value

    def required_id(self) -> str:
        """`task_id` of a `result` or `progress`: what an enqueue would accept as an id."""
        task_id = self.required_str("task_id")
        if not task_id:
            raise self.invalid("field `task_id` must not be empty")
        self.check_size("task_id", task_id, MAX_TASK_ID_BYTES)
        return task_id

    def check_size(self, name: str, text: str, limit: int) -> None:
        size = _utf8_size(text)
        if size > limit:
            raise self.invalid(f"field `{name}` is {size} bytes; the limit is {limit}")

    def optional_str(self, name: str) -> str | None:
        value = self.doc.get(name)
        if value is None:
            return None
        if not isinstance(value, str):
            raise self._wrong_type(name, "a string", value)
        return value or None

    def required_int(self, name: str) -> int:
        value = self._required(name)
        # bool is a subclass of int in Python; JSON true is not an integer.
        if not isinstance(value, int) or isinstance(value, bool):
            if isinstance(value, float) and value.is_integer() and abs(value) >= 2**63:
                # orjson reads an integer beyond 64 bits as a float: say which it was.
                raise self.invalid(
                    f"field `{name}` must be an integer within 64 bits, got {value:.6g}"
                )
            raise self._wrong_type(name, "an integer", value)
        return value

    def optional_int(self, name: str) -> int | None:
        return None if self.doc.get(name) is None else self.required_int(name)

    def required_number(self, name: str) -> float:
        value = self._required(name)
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise self._wrong_type(name, "a number", value)
        return float(value)

    def optional_number(self, name: str) -> float | None:
        return None if self.doc.get(name) is None else self.required_number(name)

    def optional_bool(self, name: str) -> bool | None:
        value = self.doc.get(name)
        if value is None:
            return None
        if not isinstance(value, bool):
            raise self._wrong_type(name, "a boolean", value)
        return value

    def optional_str_list(self, name: str) -> list[str] | None:
        value = self.doc.get(name)
        if value is None:
            return None
        if not isinstance(value, list):
            raise self._wrong_type(name, "an array of strings", value)
        for index, item in enumerate(value):
            if not isinstance(item, str):
                raise self.invalid(
                    f"field `{name}` must be an array of strings, "
                    f"got {_type_name(item)} at index {index}"
                )
        return value


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _check_cron_size(cron: str, refuse: Callable[[str], ProtocolError]) -> None:
    """Refuse (with `refuse(detail)`) a cron too long to be one (`snerd.core.fields`)."""
    try:
        rule.check_cron_size("cron", cron)
    except BadField as bad:
        raise refuse(bad.detail) from None


def _decode_error_text(line: bytes, exc: orjson.JSONDecodeError) -> str:
    if is_blank_line(line):
        return "Invalid JSON: empty line"
    try:
        line.decode("utf-8")
    except UnicodeDecodeError as bad:
        return f"Invalid JSON: invalid UTF-8 at byte {bad.start}"
    if str(exc).startswith("depth limit exceeded"):  # orjson's own limit, 1024 levels
        return f"Invalid JSON: nested deeper than {MAX_NESTING} levels"
    return f"Invalid JSON: {exc}"


def sniff_task_id(line: bytes) -> str | None:
    """Best-effort task id of a line that is too long or does not parse.

    Looks for `"task_id": "<id>"` in the first and the last `SNIFF_BYTES` of the line, so it
    stays cheap on a huge line and finds the id whether the SDK wrote it before or after
    `task_data`. (A shell that keeps only part of an over-long line keeps those two ends.)
    Returns None when there is no such id.
    """
    head = line[:SNIFF_BYTES]
    found = _SNIFF_TASK_ID.search(head)
    if found is None and len(line) > SNIFF_BYTES:
        found = _SNIFF_TASK_ID.search(line[-SNIFF_BYTES:])
    if found is None:
        return None
    try:
        task_id = orjson.loads(found[1])
    except orjson.JSONDecodeError:
        return None  # invalid UTF-8 or a broken escape: no id we could echo faithfully
    return task_id if isinstance(task_id, str) else None


# --- outbound messages -------------------------------------------------------------------------


def ack_registered(task_type: str) -> dict[str, Any]:
    """`{"action":"ack","message":"Registered handler for <type>"}`."""
    return {"action": "ack", "message": f"Registered handler for {task_type}"}


def already_pending(task_id: str, state: str) -> str:
    """The error of an enqueue whose id a live task has."""
    return failed_to_enqueue(
        f"task_id {task_id} is already pending ({state}); "
        "a task id can be reused once its task has finished"
    )


def ack_enqueued(
    task_id: str,
    shard: int,
    *,
    deduplicated: bool | None = False,
    duplicate_of: str | None = None,
) -> dict[str, Any]:
    """The enqueue ack, sent once the record is durable (or the task was deduplicated).

    `deduplicated` adds the snerd extras `"deduplicated": true` and `"duplicate_of"` (the
    twin's id), or `"deduplicated": null` when the shard's owner did not decide in time (an
    enqueue through an inbox); old SDKs ignore both.
    """
    msg: dict[str, Any] = {
        "action": "ack",
        "task_id": task_id,
        "message": "Enqueued successfully",
        "shard": f"shard-{shard}",
    }
    if deduplicated is None:
        msg["deduplicated"] = None
    elif deduplicated:
        msg["deduplicated"] = True
        if duplicate_of is not None:
            msg["duplicate_of"] = duplicate_of
    return msg


def ack_lines(task_ids: list[str], shard: int) -> bytes:
    """The lines of `ack_enqueued(task_id, shard)` for each task, framed as `encode_message`
    frames them, in one piece (the acks of a burst of enqueues, `effects.AckEnqueued`)."""
    head = b'{"action":"ack","task_id":'
    tail = b',"message":"Enqueued successfully","shard":"shard-%d"}\n' % shard
    return head + (tail + head).join(map(orjson.dumps, task_ids)) + tail


def scheduled(name: str, result: str, next_fire_us: int | None = None) -> dict[str, Any]:
    """The answer to a `schedule` or `unschedule`: `result` is `created`, `updated`,
    `unchanged` (with the next fire time), `removed`, `absent`, or `forwarded` (written to the
    inbox of the shard holding it, whose owner applies it)."""
    msg: dict[str, Any] = {"action": "scheduled", "name": name, "result": result}
    if next_fire_us is not None:
        msg["next_fire"] = format_rfc3339(next_fire_us)
    return msg


def schedule_error(name: str | None, message: str) -> dict[str, Any]:
    """`{"action":"error","name":NAME,"message":TEXT}` (`name` omitted when None)."""
    msg: dict[str, Any] = {"action": "error", "message": message}
    if name is not None:
        msg["name"] = name
    return msg


def cancelled(
    task_id: str, found: str, *, done: bool, shard: int | None, pending: bool = False
) -> dict[str, Any]:
    """The answer to a `cancel`: the state the task was `found` in (`snerd.core.control`),
    whether this cancel ended it (`cancelled`), its shard; `pending` when the command is
    durable but no owner has decided it yet (it is applied when one does)."""
    msg: dict[str, Any] = {
        "action": "cancelled",
        "task_id": task_id,
        "found": found,
        "cancelled": done,
        "shard": None if shard is None else f"shard-{shard}",
    }
    if pending:
        msg["pending"] = True
    return msg


def retried(
    task_id: str, found: str, *, done: bool, shard: int | None, pending: bool = False
) -> dict[str, Any]:
    """The answer to a `retry`, in the shape of `cancelled`'s (`retried`: it is queued again)."""
    msg = cancelled(task_id, found, done=done, shard=shard, pending=pending)
    msg["action"] = "retried"
    msg["retried"] = msg.pop("cancelled")
    return msg


def paused(task_type: str | None, is_paused: bool, shards: int, pending: list[int]) -> dict[str, Any]:
    """The answer to a `pause` or `resume`: applied on every shard but those `pending` (written
    to their inboxes; their owners apply it when they read them)."""
    return {
        "action": "paused",
        "task_type": task_type,
        "paused": is_paused,
        "shards": shards,
        "pending": [f"shard-{n}" for n in sorted(pending)],
    }


def swept(
    cmd: Sweep, count: int, shards: int, pending: list[int]
) -> dict[str, Any]:
    """The answer to a `purge` (`purged`) or a retry of a type's dead letters (`requeued`):
    how many tasks it acted on (`count`) in every shard but those `pending` (written to their
    inboxes; their owners act when they read them, and their tasks are not counted)."""
    return {
        "action": "purged" if cmd.purge else "requeued",
        "task_type": cmd.task_type,
        "before": None if cmd.before_us is None else format_rfc3339(cmd.before_us),
        "count": count,
        "shards": shards,
        "pending": [f"shard-{n}" for n in sorted(pending)],
    }


def task_details(task_id: str, details: Mapping[str, Any]) -> dict[str, Any]:
    """The answer to a `get`: `{"action":"task","task_id":ID, ...details}`
    (`snerd.core.story.details`), its shard named as every message names one (`"shard-N"`)."""
    msg = {"action": "task", "task_id": task_id, **details}
    shard = msg.get("shard")
    if isinstance(shard, int):
        msg["shard"] = f"shard-{shard}"
    return msg


def error(task_id: str | None, message: str) -> dict[str, Any]:
    """`{"action":"error","task_id":ID,"message":TEXT}`; `task_id` omitted when None."""
    if task_id is None:
        return {"action": "error", "message": message}
    return {"action": "error", "task_id": task_id, "message": message}


def execute(
    task_id: str,
    task_type: str,
    task_data: str,
    max_execution_seconds: int | None,
    attempt: int,
) -> dict[str, Any]:
    """Hand an attempt to the SDK. `max_execution_seconds` is omitted when None (upstream);
    `attempt` is a snerd extra the SDK may echo in its `result`."""
    msg: dict[str, Any] = {
        "action": "execute",
        "task_id": task_id,
        "task_type": task_type,
        "task_data": task_data,
    }
    if max_execution_seconds is not None:
        msg["max_execution_seconds"] = max_execution_seconds
    msg["attempt"] = attempt
    return msg


def stop_attempt(task_id: str, attempt: int) -> dict[str, Any]:
    """`{"action":"cancel","task_id","attempt"}`: stop the handler of a running attempt whose
    task was cancelled (sent only to an SDK that registered its type `cancellable`)."""
    return {"action": "cancel", "task_id": task_id, "attempt": attempt}


def max_retries_reached(task_id: str, task_type: str, task_data: str) -> dict[str, Any]:
    """The dead-letter notice for a task that used all its attempts."""
    return {
        "action": "max_retries_reached",
        "task_id": task_id,
        "task_type": task_type,
        "task_data": task_data,
    }


def progress(task_id: str, data: Any) -> dict[str, Any]:
    """The echo of an inbound `progress`, for the SDK's dashboard."""
    return {"action": "progress", "task_id": task_id, "data": data}


def stats(
    *,
    total_enqueued: int,
    total_executed: int,
    total_failed: int,
    total_dlq: int,
    queue_depth: int,
    uptime_secs: int,
    per_shard: Mapping[int, int],
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The reply to `stats`.

    Args:
        per_shard: depth of each owned shard, by shard number; listed in shard order.
        extra: snerd's additional fields (old SDKs ignore them), added after upstream's.
    """
    msg: dict[str, Any] = {
        "action": "stats",
        "total_enqueued": total_enqueued,
        "total_executed": total_executed,
        "total_failed": total_failed,
        "total_dlq": total_dlq,
        "queue_depth": queue_depth,
        "uptime_secs": uptime_secs,
        "per_shard": [
            {"shard": f"shard-{shard}", "depth": depth}
            for shard, depth in sorted(per_shard.items())
        ],
    }
    if extra:
        for key, value in extra.items():
            if key in msg:
                raise ValueError(f"stats extra field {key!r} would replace an upstream field")
            msg[key] = value
    return msg


def membership(queue: str, shards: int, owned: list[int], version: int) -> dict[str, Any]:
    """`{"action":"membership","queue","shards","owned":["shard-N"...],"version"}`; `owned` is
    listed in shard order."""
    return {
        "action": "membership",
        "queue": queue,
        "shards": shards,
        "owned": [f"shard-{n}" for n in sorted(owned)],
        "version": version,
    }


def encode_message(msg: dict[str, Any]) -> bytes:
    """One outbound line: compact JSON, key order kept (`action` first), then a newline.

    Raises:
        TypeError: `msg` holds something JSON cannot carry (orjson's error).
    """
    return orjson.dumps(msg, option=orjson.OPT_APPEND_NEWLINE)


#: `Enqueue(task_id=, task_type=, task_data=, max_retries=, retry_after_hours=)` with every other
#: field at its default, without the frozen dataclass's `__init__` (which sets each of the 15
#: fields with `object.__setattr__`: most of parsing a small enqueue).
_new_plain_enqueue = slot_constructor(
    Enqueue, "task_id", "task_type", "task_data", "max_retries", "retry_after_hours"
)
#: `Result(task_id=, success=, error_msg=, attempt=)`, the same way (a result per job).
_new_result = slot_constructor(Result, "task_id", "success", "error_msg", "attempt")
