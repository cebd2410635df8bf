"""The protocol messages as the SDK writes and reads them (docs/protocol.md, "SDK → daemon"
and "Daemon → SDK"), as plain dicts.

Owns: the `enqueue` message both faces send (`build_enqueue_message`, with task data written
byte for byte as `json.dumps` writes it, which `auto_dedupe` fingerprints depend on), the
`schedule` and `unschedule` messages and the value a `scheduled` reply stands for
(`build_schedule_message`, `Scheduled`), the `result` message of one attempt and the
handler's return value it carries (`result_value`), task data as handlers get it
(`parse_task_data`), the value an `ack` stands for (`Enqueued`), and the text an exception is
reported as (`describe_error`).

Job control too (docs/protocol.md, "Job control"): the `cancel`, `retry`, `get`, `pause` and
`resume` lines (`control_message`, `pause_message`), the sweeps (a `purge`, a `retry` of a
type's dead letters: `sweep_message`), and the values their replies stand for (`Cancelled`,
`Retried`, `Paused`, `Swept`, `TaskDetails`), with the key that matches a reply to the calls
waiting for it (`reply_key`, `request_key`): the replies carry no request id, so a call is
matched by what it asked about (the task id; the type and the direction of a pause; the kind,
type and cutoff of a sweep).

It must never: check option values (the daemon does, so its error texts reach the caller
unchanged; only what JSON cannot carry is refused here), or do I/O. A handler's return value
is one exception: it is checked here against the daemon's size limit too, with the daemon's
own text (`snerd.core.protocol.result_too_large`), because a result the daemon would refuse
fails the attempt either way, and here it costs no round trip. A control line is another: it
is checked by the daemon's own parser before it is sent (`check_control_message`), because its
refusal could carry no id to match it by; the text raised is the parser's, to the letter.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import repeat
from json.encoder import (  # type: ignore[attr-defined]
    JSONEncoder,
    c_make_encoder,
    encode_basestring_ascii,
)
from operator import is_not
from typing import Any, TypeAlias

import orjson

from snerd.core.fields import MAX_NESTING, nests_deeper
from snerd.core.protocol import (
    ENQUEUE_OPTIONS,
    ProtocolError,
    failed_to_enqueue,
    parse_document,
    result_too_large,
)
from snerd.core.slots import slot_constructor
from snerd.core.timefmt import format_rfc3339, parse_rfc3339_or_none
from snerd.sdk.errors import ControlError, EnqueueError, ScheduleError

__all__ = [
    "ENQUEUE_ARGS",
    "FINISHED_STATES",
    "SCHEDULE_OPTIONS",
    "Cancelled",
    "Enqueued",
    "Paused",
    "ReplyKey",
    "Retried",
    "Scheduled",
    "Swept",
    "TaskDetails",
    "batch_message",
    "build_enqueue_message",
    "build_schedule_message",
    "build_unschedule_message",
    "cancelled_from_reply",
    "check_control_message",
    "control_message",
    "describe_error",
    "details_from_reply",
    "enqueue_call_message",
    "enqueued_from_ack",
    "json_text",
    "parse_task_data",
    "pause_message",
    "paused_from_reply",
    "reply_key",
    "request_key",
    "result_message",
    "result_value",
    "retried_from_reply",
    "scheduled_from_reply",
    "sweep_message",
    "swept_from_reply",
    "task_spec_message",
]


@dataclass(frozen=True, slots=True)
class Enqueued:
    """What an acknowledged enqueue returns: the record is durable (or was deduplicated)."""

    task_id: str
    #: The shard the task went to (`"shard-N"`), when the daemon says.
    shard: str | None = None
    #: True when dedupe (`auto_dedupe`, `unique_key`) dropped it as a duplicate of
    #: `duplicate_of`; None when another daemon owns its shard and did not decide in time
    #: (that daemon decides when it takes the task in).
    deduplicated: bool | None = False
    duplicate_of: str | None = None


#: `Enqueued(task_id, shard, deduplicated, duplicate_of)`, built without the frozen
#: `__init__`'s calls.
_new_enqueued = slot_constructor(Enqueued, "task_id", "shard", "deduplicated", "duplicate_of")


def enqueued_from_ack(task_id: str, message: dict[str, Any]) -> Enqueued:
    """What the daemon's `ack` of the enqueue of `task_id` says (a `shard`, `deduplicated` or
    `duplicate_of` of the wrong type is read as absent)."""
    shard = message.get("shard")
    deduplicated = message.get("deduplicated", False)
    of = message.get("duplicate_of")
    return _new_enqueued(
        task_id,
        shard if isinstance(shard, str) else None,
        deduplicated if deduplicated is None or deduplicated is True else False,
        of if isinstance(of, str) else None,
    )


#: A run of digits that may be an integer beyond 64 bits, which orjson would read as a float
#: where `json.loads` gives an int (a run inside a string also sends the text to `json.loads`).
_LONG_DIGITS = re.compile(r"[0-9]{19}")


def parse_task_data(raw: Any) -> Any:
    """Task data as handlers get it: JSON text parsed, anything else (or text that is not JSON)
    passed as it is, like upstream SDKs.

    The value is exactly `json.loads`'s: orjson parses the text when that is certain to give
    the same value (it refuses what `json.loads` alone accepts, NaN, Infinity, lone
    surrogates, deep nesting, and then `json.loads` decides), else `json.loads` does."""
    if isinstance(raw, str):
        if _LONG_DIGITS.search(raw) is None:
            try:
                return orjson.loads(raw)
            except ValueError:
                pass
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


#: `json.dumps`'s own C encoder with its default arguments, made once: `json.dumps` makes a
#: new one on every call, which is most of its cost for a small value. No cycle check; a
#: value it cannot encode goes to `json.dumps`, which says what is wrong.
_C_ENCODER = (
    None
    if c_make_encoder is None
    else c_make_encoder(
        None, JSONEncoder().default, encode_basestring_ascii, None, ": ", ", ", False, False, True
    )
)


def json_text(data: Any) -> str:
    """`json.dumps(data)`, exactly (default separators, ASCII only, NaN allowed), faster."""
    if _C_ENCODER is not None:
        try:
            return "".join(_C_ENCODER(data, 0))
        except (TypeError, ValueError, RecursionError):
            pass  # (a cycle ends in RecursionError without the check)
    return json.dumps(data)


def _format_execute_at(value: str | dt.datetime | dt.timedelta) -> str:
    """`execute_at` as the message carries it: RFC 3339 in UTC, a string as it is."""
    if isinstance(value, str):
        return value
    if isinstance(value, dt.timedelta):
        value = dt.datetime.now(dt.UTC) + value
    # A naive datetime is local time (datetime.astimezone's rule), never silently UTC.
    moment = value.astimezone(dt.UTC)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


def build_enqueue_message(
    task_id: str,
    task_type: str,
    data: Any,
    max_retries: int,
    retry_after_hours: float,
    options: Mapping[str, Any],
) -> dict[str, Any]:
    """The `enqueue` message, as the upstream Python SDK builds it.

    `options` are the other arguments of `QueueFace.enqueue` by name, in its order; those
    that are None are left out. `execute_at` is written as RFC 3339 (a datetime or a timedelta
    from now) and `trigger_after_ids` as a list. `data` is serialized with `json.dumps` and its
    default separators, exactly as upstream did, so `auto_dedupe` fingerprints match tasks
    enqueued by the upstream SDK. Values are not checked here: the daemon validates them, so
    the error texts are the daemon's. Except a NaN or an infinity, which JSON cannot carry
    (orjson writes null, which the daemon would read as "absent": urgency 0): refused here,
    in the daemon's words.

    Raises:
        EnqueueError: `retry_after_hours` or `urgency_score` is not finite.
    """
    for name, number in (
        ("retry_after_hours", retry_after_hours),
        ("urgency_score", options.get("urgency_score")),
    ):
        if type(number) is float and not math.isfinite(number):
            raise EnqueueError(
                failed_to_enqueue(f"{name} must be a finite number, got {number}"), task_id=task_id
            )
    message: dict[str, Any] = {
        "action": "enqueue",
        "task_id": task_id,
        "task_type": task_type,
        "task_data": json_text(data),
        "max_retries": max_retries,
        "retry_after_hours": retry_after_hours,
    }
    for key, value in options.items():
        if value is None:
            continue
        if key == "execute_at":
            value = _format_execute_at(value)
        elif key == "trigger_after_ids":
            value = list(value)
        message[key] = value
    return message


#: The arguments of `enqueue` by name: what each task of `enqueue_many` may hold.
ENQUEUE_ARGS = ("task_id", "task_type", "data", "max_retries", "retry_after_hours",
                *ENQUEUE_OPTIONS)
_ENQUEUE_ARGS = frozenset(ENQUEUE_ARGS)


def enqueue_call_message(
    task_id: str | None,
    task_type: str | None,
    data: Any,
    max_retries: int,
    retry_after_hours: float,
    given: tuple[Any, ...],
) -> dict[str, Any]:
    """The `enqueue` message of a call of `enqueue` (a face's or a producer's): `given` is
    its other arguments in `ENQUEUE_OPTIONS` order, those that are None left out; `task_id`
    made (uuid4 hex) when None.

    Raises:
        TypeError: no `task_type`.
        EnqueueError: as `build_enqueue_message`.
    """
    if task_type is None:
        raise TypeError("enqueue() needs a task_type")
    if task_id is None:
        task_id = uuid.uuid4().hex
    # (Most enqueues set none of them: no dict to build and walk then. By identity: a value
    # such as an array may not compare with None.)
    options = (
        dict(zip(ENQUEUE_OPTIONS, given, strict=True))
        if any(map(is_not, given, repeat(None)))
        else {}
    )
    return build_enqueue_message(task_id, task_type, data, max_retries, retry_after_hours,
                                 options)


def task_spec_message(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The `enqueue` message of one task of `enqueue_many`: `spec` holds `enqueue`'s
    arguments by name (`task_type` required; `task_id` made, uuid4 hex, when absent or None).

    Raises:
        TypeError: an argument `enqueue` does not have, or no `task_type` (a mistake in the
            calling code, raised before anything is sent).
        EnqueueError: as `build_enqueue_message` (this task only).
    """
    unknown = sorted(set(spec) - _ENQUEUE_ARGS)
    if unknown:
        raise TypeError(f"a task of enqueue_many() has an unexpected argument {unknown[0]!r}")
    if spec.get("task_type") is None:
        raise TypeError("each task of enqueue_many() needs a task_type")
    return enqueue_call_message(
        spec.get("task_id"), spec["task_type"], spec.get("data"), spec.get("max_retries", 3),
        spec.get("retry_after_hours", 0.0), tuple(spec.get(key) for key in ENQUEUE_OPTIONS),
    )


def batch_message(messages: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """One `enqueue_batch` line of `enqueue` messages (at most `MAX_BATCH_TASKS`)."""
    return {"action": "enqueue_batch",
            "tasks": [{k: v for k, v in m.items() if k != "action"} for m in messages]}


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)

#: The enqueue options a schedule's runs may carry (`QueueFace.schedule`'s keywords): all but
#: those that say when a task runs, which the schedule does.
SCHEDULE_OPTIONS = tuple(
    key for key in ENQUEUE_OPTIONS if key not in ("execute_at", "cron", "trigger_after_ids")
)


@dataclass(frozen=True, slots=True)
class Scheduled:
    """What the daemon answered a `schedule` or `unschedule`."""

    name: str
    #: `created`, `updated`, `unchanged`, `removed`, `absent`, or `forwarded` (another daemon
    #: owns the name's shard; it applies the declaration from its inbox).
    result: str
    #: The schedule's next tick (UTC), when the daemon said (not after `forwarded`,
    #: `removed` or `absent`).
    next_fire: dt.datetime | None = None


def scheduled_from_reply(message: dict[str, Any]) -> Scheduled:
    """What the daemon's `scheduled` reply says (a `next_fire` that is not RFC 3339 is read
    as absent)."""
    result = message.get("result")
    us = parse_rfc3339_or_none(message.get("next_fire"))
    at = None if us is None else _EPOCH + dt.timedelta(microseconds=us)
    return Scheduled(str(message.get("name")), result if isinstance(result, str) else "", at)


def build_schedule_message(
    name: str,
    cron: str,
    task_type: str,
    data: Any,
    max_retries: int,
    retry_after_hours: float,
    policy: Mapping[str, Any],
    options: Mapping[str, Any],
) -> dict[str, Any]:
    """The `schedule` message: the enqueue message of its runs (`build_enqueue_message`, so
    `data` is written as an enqueue's), without a task id, with the schedule's `name`, `cron`
    and `policy` (`timezone`, `misfire`, `catch_up`, `overlap`; None left out).

    Raises:
        ScheduleError: `retry_after_hours` or `urgency_score` is not finite.
    """
    try:
        message = build_enqueue_message(
            name, task_type, data, max_retries, retry_after_hours, options
        )
    except EnqueueError as exc:
        detail = exc.message.removeprefix(failed_to_enqueue(""))
        raise ScheduleError(f"Failed to schedule: {detail}", name=name) from None
    del message["task_id"]
    message.update(action="schedule", name=name, cron=cron)
    message.update((key, value) for key, value in policy.items() if value is not None)
    return message


def build_unschedule_message(name: str) -> dict[str, Any]:
    """The `unschedule` message."""
    return {"action": "unschedule", "name": name}


def result_message(
    task_id: str, error: str | None, attempt: int | None, value: Any = None, *,
    retry: bool = True,
) -> dict[str, Any]:
    """The `result` of one attempt: success when `error` is None, with the handler's return
    `value` unless it is None (`result_value` made it JSON); `attempt` echoed when the
    `execute` carried one; a failure with `retry` False is final (`"retry": false`)."""
    result: dict[str, Any] = {
        "action": "result",
        "task_id": task_id,
        "status": "success" if error is None else "error",
    }
    if error is not None:
        result["error_msg"] = error
        if not retry:
            result["retry"] = False
    elif value is not None:
        result["result"] = value
    if attempt is not None:
        result["attempt"] = attempt
    return result


def result_value(task_id: str, value: Any, max_bytes: int) -> tuple[Any, str | None]:
    """A handler's return value as the `result` carries it: (its JSON value, None), or (None,
    why the attempt fails instead): not JSON-serialisable, nested deeper than a line may be,
    or larger than `max_bytes` of compact JSON (the daemon's SNERD_RESULT_MAX_BYTES). The
    JSON value is a copy read back from its encoding, so what the handler keeps changing
    afterwards is not what is stored."""
    if value is None:
        return None, None
    try:
        encoded = orjson.dumps(value)
    except TypeError as exc:  # (orjson.JSONEncodeError is one)
        return None, f"task {task_id}: result is not JSON-serialisable: {exc}"
    copy = orjson.loads(encoded)
    # The `result` line's own object is a level: the value may nest one fewer.
    if type(copy) in (dict, list) and nests_deeper(copy, MAX_NESTING - 1):
        return None, f"task {task_id}: result is nested deeper than {MAX_NESTING - 1} levels"
    if len(encoded) > max_bytes:
        return None, result_too_large(task_id, len(encoded), max_bytes)
    return copy, None


def describe_error(exc: BaseException) -> str:
    """`"<ExceptionType>: <message>"` (the type alone when the message is empty), as a failed
    attempt's `error_msg` and the SDK's log lines carry it."""
    text = str(exc)
    name = type(exc).__name__
    described = f"{name}: {text}" if text else name
    # A lone surrogate (a file name decoded with surrogateescape, say) cannot be sent as JSON:
    # the result would never leave the SDK. It is written as its escape instead.
    return described.encode("utf-8", "backslashreplace").decode("utf-8")


# ---------------------------------------------------------------------- job control


@dataclass(frozen=True, slots=True)
class Cancelled:
    """What the daemon answered a `cancel`."""

    task_id: str
    #: The state the task was found in: `queued`, `delayed`, `blocked`, `running`,
    #: `retrying` (it is cancelled now), `succeeded`, `dead_letter`, `cancelled` (it had
    #: ended already), or `unknown` (no shard's owner holds it).
    found: str
    #: True when this cancel ended the task (a running attempt is ended too).
    cancelled: bool
    #: The shard that holds the task (`"shard-N"`), when one was found.
    shard: str | None = None
    #: True when no owner answered within the daemon's wait (SNERD_COMMAND_WAIT_MS): the
    #: command is durable in the owners' inboxes and is applied when one reads it.
    pending: bool = False


@dataclass(frozen=True, slots=True)
class Retried:
    """What the daemon answered a `retry`: `found` as `Cancelled.found`; `retried` is True
    when the task (a dead letter, or a cancelled task) is queued again, attempts reset."""

    task_id: str
    found: str
    retried: bool
    shard: str | None = None
    pending: bool = False


@dataclass(frozen=True, slots=True)
class Paused:
    """What the daemon answered a `pause` or `resume`."""

    #: The type paused or resumed; None for the whole queue.
    task_type: str | None
    #: True after a pause, False after a resume.
    paused: bool
    #: How many shards the queue has.
    shards: int
    #: Shards whose owner had not applied it within the daemon's wait (`"shard-N"`): it is
    #: durable in their inboxes and applied when they read them. Empty: applied everywhere.
    pending: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Swept:
    """What the daemon answered a purge or a retry of a type's dead letters."""

    #: `purged`, or `requeued` (dead letters put back in the queue).
    action: str
    #: The type swept; None for every type.
    task_type: str | None
    #: The cutoff: only tasks that finished before it (UTC); None: whenever.
    before: dt.datetime | None
    #: How many tasks it purged or put back, in the shards that applied it.
    count: int
    #: How many shards the queue has.
    shards: int
    #: Shards whose owner had not applied it within the daemon's wait (`"shard-N"`): it is
    #: durable in their inboxes and applied when they read them; their tasks are not in
    #: `count`. Empty: applied everywhere.
    pending: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TaskDetails:
    """What the daemon answered a `get`: one task as the queue's files tell it."""

    task_id: str
    #: False when no file holds a record of it (`state` is `unknown`).
    found: bool
    #: `queued`, `delayed`, `blocked`, `running`, `retrying`, `succeeded`, `dead_letter`,
    #: `cancelled`, `dropped` (an inbox copy its owner did not take in), `purged` (an ended
    #: task an operator's purge forgot), or `unknown`.
    state: str
    task_type: str | None = None
    #: The shard that holds it (`"shard-N"`).
    shard: str | None = None
    #: Attempts started since its enqueue (or its latest retry).
    attempts: int = 0
    max_retries: int | None = None
    last_error: str | None = None
    enqueued_at: dt.datetime | None = None
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    #: `completed`, `dead_letter` or `cancelled` once it ended; None while it lives.
    outcome: str | None = None
    #: The handler's return value, stored with its completion (see `has_result`).
    result: Any = None
    #: True when a result is stored (`result` may be a stored None).
    has_result: bool = False
    #: The latest progress its running attempt reported, when the daemon answering runs it.
    progress: Any = None

    @property
    def finished(self) -> bool:
        """True once the task has ended (succeeded, dead-lettered, cancelled, dropped or
        purged)."""
        return self.state in FINISHED_STATES


#: The states of a task that has ended: `result()` stops waiting at one of them.
FINISHED_STATES = frozenset({"succeeded", "dead_letter", "cancelled", "dropped", "purged"})

#: What matches a reply to the calls that wait for it: the reply's action and what it names
#: (a task id, or a type), and a pause's direction or a sweep's cutoff (RFC 3339, or None).
ReplyKey: TypeAlias = tuple[str, str | None, bool | str | None]


def control_message(action: str, task_id: Any) -> dict[str, Any]:
    """The `cancel`, `retry` or `get` line of `task_id`."""
    return {"action": action, "task_id": task_id}


def pause_message(task_type: Any, paused: bool, *, whole_queue: bool = False) -> dict[str, Any]:
    """The `pause` (or, `paused` False, `resume`) line of `task_type`, or of the whole queue
    (`"queue": true`). A `task_type` of None is sent as it is, for the parser to refuse: it
    never stands for the whole queue."""
    action = "pause" if paused else "resume"
    if whole_queue:
        return {"action": action, "queue": True}
    return {"action": action, "task_type": task_type}


def sweep_message(
    purge: bool, task_type: Any, before: dt.datetime | None, *, whole_queue: bool = False
) -> dict[str, Any]:
    """The `purge` (or, `purge` False, the `retry` of a type's dead letters) line of
    `task_type`, or of the whole queue (`"queue": true`), with its cutoff `before` (RFC 3339
    in UTC; a naive datetime is local time). A `task_type` of None is sent as it is, for the
    parser to refuse: it never stands for the whole queue."""
    message: dict[str, Any] = {"action": "purge" if purge else "retry"}
    if whole_queue:
        message["queue"] = True
    else:
        message["task_type"] = task_type
    if before is not None:
        moment = before.astimezone(dt.UTC)
        message["before"] = format_rfc3339((moment - _EPOCH) // dt.timedelta(microseconds=1))
    return message


def check_control_message(message: dict[str, Any]) -> None:
    """Check a control line with the daemon's parser before it is sent.

    Raises:
        ControlError: the daemon would refuse it; `message` is the daemon's text.
    """
    try:
        parse_document(message)
    except ProtocolError as exc:
        task_id = message.get("task_id")
        raise ControlError(
            exc.message, task_id=task_id if isinstance(task_id, str) else None
        ) from None


#: The reply each control action is answered with.
_REPLY_ACTION = {
    "cancel": "cancelled",
    "retry": "retried",
    "get": "task",
    "pause": "paused",
    "resume": "paused",
    "purge": "purged",
}


def _is_sweep(message: dict[str, Any]) -> bool:
    """A `purge`, or a `retry` naming a type (or the queue) instead of a task (the parser's
    rule, `snerd.core.protocol.parse_document`)."""
    return message.get("action") == "purge" or (
        message.get("action") == "retry"
        and "task_id" not in message
        and ("task_type" in message or "queue" in message)
    )


def _cutoff(value: Any) -> str | None:
    """A sweep's `before` as one spelling of its instant (None: none, or not a time)."""
    us = parse_rfc3339_or_none(value)
    return None if us is None else format_rfc3339(us)


def request_key(message: dict[str, Any]) -> ReplyKey:
    """The key of the reply that answers the control line `message` (checked already)."""
    action = message["action"]
    if _is_sweep(message):
        reply = "purged" if action == "purge" else "requeued"
        whole = message.get("queue") is True
        return reply, None if whole else message.get("task_type"), _cutoff(message.get("before"))
    reply = _REPLY_ACTION[action]
    if reply == "paused":
        return reply, message.get("task_type"), action == "pause"
    return reply, message["task_id"], False


def reply_key(message: dict[str, Any]) -> ReplyKey | None:
    """The key of a control reply from the daemon (None: not one, or malformed)."""
    action = message.get("action")
    if action == "paused":
        task_type = message.get("task_type")
        if task_type is not None and not isinstance(task_type, str):
            return None
        return action, task_type, message.get("paused") is True
    if action in ("purged", "requeued"):
        task_type = message.get("task_type")
        if task_type is not None and not isinstance(task_type, str):
            return None
        return action, task_type, _cutoff(message.get("before"))
    task_id = message.get("task_id")
    if action in ("cancelled", "retried", "task") and isinstance(task_id, str):
        return action, task_id, False
    return None


def _shard_name(value: Any) -> str | None:
    """A shard as the SDK reports it, `"shard-N"` (given so, or as the number N)."""
    if isinstance(value, str):
        return value
    if type(value) is int:
        return f"shard-{value}"
    return None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def cancelled_from_reply(message: dict[str, Any]) -> Cancelled:
    """What the daemon's `cancelled` reply says (fields of the wrong type read as absent)."""
    return Cancelled(
        str(message.get("task_id")),
        _text(message.get("found")) or "unknown",
        message.get("cancelled") is True,
        _shard_name(message.get("shard")),
        message.get("pending") is True,
    )


def retried_from_reply(message: dict[str, Any]) -> Retried:
    """What the daemon's `retried` reply says (fields of the wrong type read as absent)."""
    return Retried(
        str(message.get("task_id")),
        _text(message.get("found")) or "unknown",
        message.get("retried") is True,
        _shard_name(message.get("shard")),
        message.get("pending") is True,
    )


def paused_from_reply(message: dict[str, Any]) -> Paused:
    """What the daemon's `paused` reply says (fields of the wrong type read as absent)."""
    shards = message.get("shards")
    pending = message.get("pending")
    return Paused(
        _text(message.get("task_type")),
        message.get("paused") is True,
        shards if type(shards) is int else 0,
        tuple(s for s in pending if isinstance(s, str)) if isinstance(pending, list) else (),
    )


def swept_from_reply(message: dict[str, Any]) -> Swept:
    """What the daemon's `purged` or `requeued` reply says (fields of the wrong type read as
    absent)."""
    count, shards, pending = message.get("count"), message.get("shards"), message.get("pending")
    return Swept(
        str(message.get("action")),
        _text(message.get("task_type")),
        _moment(message.get("before")),
        count if type(count) is int else 0,
        shards if type(shards) is int else 0,
        tuple(s for s in pending if isinstance(s, str)) if isinstance(pending, list) else (),
    )


def _moment(value: Any) -> dt.datetime | None:
    """An RFC 3339 time as an aware UTC datetime (None: absent or not one)."""
    us = parse_rfc3339_or_none(value)
    return None if us is None else _EPOCH + dt.timedelta(microseconds=us)


def details_from_reply(message: dict[str, Any]) -> TaskDetails:
    """What the daemon's `task` reply (to a `get`) says (fields of the wrong type read as
    absent)."""
    attempts = message.get("attempts")
    max_retries = message.get("max_retries")
    return TaskDetails(
        task_id=str(message.get("task_id")),
        found=message.get("found") is True,
        state=_text(message.get("state")) or "unknown",
        task_type=_text(message.get("task_type")),
        shard=_shard_name(message.get("shard")),
        attempts=attempts if type(attempts) is int else 0,
        max_retries=max_retries if type(max_retries) is int else None,
        last_error=_text(message.get("last_error")),
        enqueued_at=_moment(message.get("enqueued_at")),
        started_at=_moment(message.get("started_at")),
        finished_at=_moment(message.get("finished_at")),
        outcome=_text(message.get("outcome")),
        result=message.get("result"),
        has_result=message.get("has_result") is True or message.get("result") is not None,
        progress=message.get("progress"),
    )
