"""Fuzzing the SDK protocol: every inbound message, valid and hostile, against the core and a
real daemon.

The strategies draw lines of every action the protocol has (`register`, `enqueue`, `result`,
`progress`, `stats`), valid ones and ones broken in a known way: a field of the wrong type or
missing, a value out of range (negative, huge, beyond 64 bits, too long, too many), nesting
deeper than the limit, a NaN literal, bad UTF-8 or a lone surrogate, a line cut short, a JSON
value that is not an object, and raw bytes. Each broken line says what its error must contain
and which task id it must carry, so the tests check that every bad line is answered with an
error naming the problem, not merely that nothing crashed.

- Against the core (`tests/support/fakeshell.py`): no exception escapes the node, every message it
  sends can be written as JSON, every bad line gets its error; and replies keep the order
  docs/protocol.md promises.
- Against one real daemon process per test, fed many lines: it keeps answering (a `stats`
  after every batch), acked tasks are all in the log and survive a restart; then a replay of
  what was fed, mixed with plain enqueues, measures lines/s and the daemon's RSS.

Example counts come from the hypothesis profile (tests/conftest.py): `make fuzz` runs them
long.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from snerd.core import events as ev
from snerd.core import protocol as proto
from snerd.core.cron import normalize_cron
from snerd.core.node import NodeConfig, NodePhase
from snerd.core.retry import MAX_RETRY_AFTER_HOURS
from snerd.core.timefmt import MAX_US, MIN_US, format_rfc3339, parse_rfc3339
from snerd.queuedir import open_queue, scan_shard
from tests.support.daemon import Daemon
from tests.support.fakeshell import FakeShell

#: A long run (`make fuzz`) outlasts pytest-timeout's 300 s a test; the ci profile's do not.
pytestmark = pytest.mark.timeout(0 if settings().max_examples > 1000 else 300)

I32_MAX = 2**31 - 1
#: The line limit of the daemon under test: low, so over-long lines are cheap to make.
DAEMON_MAX_LINE = 256 * 1024

#: `Line.error_id` when the error may or may not carry an id (garbage where the id is unsure).
ANY_ID = "<any id>"


@dataclass(frozen=True)
class Line:
    """One line for the daemon, and what must come of it."""

    raw: bytes
    #: For a line that must be refused: a text its `error` contains. None: a valid line.
    refused_for: str | None = None
    #: The `task_id` that error carries (None: none), or `ANY_ID`.
    error_id: str | None = None
    #: What is wrong with it, or which valid message it is (for a failing example's report).
    why: str = ""

    def __repr__(self) -> str:
        raw = self.raw if len(self.raw) <= 300 else self.raw[:300] + b"..."
        return f"Line({self.why}: {raw!r})"


# --- values ----------------------------------------------------------------------------------

#: Text as a JSON string can carry it: any character but a lone surrogate.
text = st.text(alphabet=st.characters(exclude_categories=["Cs"]))
ids = st.one_of(
    text.filter(bool).map(lambda t: t[:40]),
    st.sampled_from(["t1", "t2", "job-1", "é" * 512, "x" * proto.MAX_TASK_ID_BYTES]),
)
names = st.one_of(
    text.filter(bool).map(lambda t: t[:20]),
    st.sampled_from(["email", "x" * proto.MAX_NAME_BYTES, "ü" * (proto.MAX_NAME_BYTES // 2)]),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    text.map(lambda t: t[:30]),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=12,
)
#: Values of each kind of field, and values of every other kind (a wrong type for it).
KINDS: dict[str, st.SearchStrategy[Any]] = {
    "str": text,
    "int": st.integers(-(2**63), 2**64 - 1),
    "number": st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(2**63), 2**63),
    "bool": st.booleans(),
    "str_list": st.lists(text, max_size=3),
    "array": st.lists(scalars, max_size=3),
    "object": st.dictionaries(text, scalars, max_size=3),
}


def wrong_for(kind: str) -> st.SearchStrategy[Any]:
    """A non-null value a field of `kind` refuses for its type."""
    refused = {
        "str": ("int", "number", "bool", "array", "object"),
        "int": ("str", "bool", "array", "object"),
        "number": ("str", "bool", "array", "object"),
        "bool": ("str", "int", "number", "array", "object"),
        "str_list": ("str", "int", "bool", "object"),
        "str_or_int": ("bool", "array", "object"),
    }[kind]
    values = st.one_of(*(KINDS[k] for k in refused))
    if kind == "int":
        values |= st.floats(allow_nan=False, allow_infinity=False)
    if kind == "str_list":  # an array with something else than a string in it
        values |= st.lists(text, max_size=2).flatmap(
            lambda items: st.integers(0, len(items)).map(lambda at: [*items[:at], 7, *items[at:]])
        )
    return values


#: Every field of each action: kind, and whether it is required.
FIELDS: dict[str, dict[str, tuple[str, bool]]] = {
    "register": {"task_type": ("str", True)},
    "enqueue": {
        "task_id": ("str", True),
        "task_type": ("str", True),
        "task_data": ("str", True),
        "max_retries": ("int", True),
        "retry_after_hours": ("number", True),
        "rate_limit_group": ("str", False),
        "max_per_minute": ("int", False),
        "auto_dedupe": ("bool", False),
        "urgency_score": ("number", False),
        "execute_at": ("str", False),
        "cron": ("str", False),
        "webhook_url": ("str", False),
        "max_execution_seconds": ("int", False),
        "pool": ("str", False),
        "trigger_after_ids": ("str_list", False),
        "unique_key": ("str", False),
        "unique_until": ("str_or_int", False),
        "backoff": ("str", False),
        "backoff_max_seconds": ("int", False),
    },
    # `success` is read only without `status`, `error_msg` takes any value: no type to break.
    "result": {"task_id": ("str", True), "status": ("str", True), "attempt": ("int", False),
               "retry": ("bool", False)},
    "progress": {"task_id": ("str", True)},
    "stats": {},
}


def test_the_fuzzed_actions_and_fields_are_the_protocols() -> None:
    assert tuple(FIELDS) == proto._ACTIONS
    assert tuple(FIELDS["enqueue"])[5:] == proto.ENQUEUE_OPTIONS


def rfc3339(us: int, offset_minutes: int) -> str:
    """`us` written with a UTC offset of `offset_minutes` (the same instant)."""
    local = format_rfc3339(us + offset_minutes * 60_000_000)  # ...Z, the local wall time
    sign = "+" if offset_minutes >= 0 else "-"
    hours, minutes = divmod(abs(offset_minutes), 60)
    return f"{local[:-1]}{sign}{hours:02d}:{minutes:02d}"


#: Instants whose local time under any offset stays within years 1-9999.
_DAY_US = 86_400 * 1_000_000
execute_ats = st.builds(
    rfc3339, st.integers(MIN_US + _DAY_US, MAX_US - _DAY_US), st.integers(-23 * 60, 23 * 60)
)
crons = st.sampled_from(
    [
        "* * * * *",
        "0 8 * * 1",
        "30s",
        "5m",
        "@daily",
        "*/5 * * * * *",
        "0 0 29 2 *",
        "1-59/7 * * * *",
    ]
)


@st.composite
def valid_docs(
    draw: st.DrawFn, enqueue_types: st.SearchStrategy[str], register_types: st.SearchStrategy[str]
) -> dict[str, Any]:
    """A valid message of any action (as a dict; optional fields absent, null or set)."""
    action = draw(st.sampled_from(proto._ACTIONS))
    doc: dict[str, Any] = {"action": action}
    if action == "register":
        doc["task_type"] = draw(register_types)
    elif action == "enqueue":
        task_id = draw(ids)
        doc |= {
            "task_id": task_id,
            "task_type": draw(enqueue_types),
            "task_data": draw(text | st.just("d" * 100_000) | json_values.map(_json_text)),
            "max_retries": draw(st.integers(0, I32_MAX)),
            "retry_after_hours": draw(
                st.floats(0, MAX_RETRY_AFTER_HOURS) | st.integers(0, int(MAX_RETRY_AFTER_HOURS))
            ),
        }
        options: dict[str, st.SearchStrategy[Any]] = {
            "rate_limit_group": names,
            "auto_dedupe": st.booleans(),
            "urgency_score": st.floats(allow_nan=False, allow_infinity=False),
            "execute_at": execute_ats,
            "cron": crons,
            "webhook_url": st.sampled_from(["https://example.com/hook", "http://example.org/"]),
            "max_execution_seconds": st.integers(1, proto.MAX_EXECUTION_SECONDS),
            "pool": names,
            "trigger_after_ids": st.lists(ids.filter(lambda i: i != task_id), max_size=4),
            "unique_key": names,
            "unique_until": st.sampled_from(["started", "finished"]) | st.integers(1, 604_800),
            "backoff": st.sampled_from(["constant", "exponential"]),
            "backoff_max_seconds": st.integers(1, proto.MAX_EXECUTION_SECONDS),
        }
        for name in draw(st.sets(st.sampled_from(sorted(options)))):
            doc[name] = draw(options[name] | st.none())
        if doc.get("unique_until") not in (None, "finished") and not doc.get("unique_key"):
            doc["auto_dedupe"] = True  # (a scope needs dedupe)
        if doc.get("rate_limit_group") is not None and draw(st.booleans()):
            doc["max_per_minute"] = draw(st.integers(1, I32_MAX))
        for name in draw(st.sets(st.sampled_from(["rate_limit_group", "pool", "cron"]))):
            doc.setdefault(name, "")  # "" means absent
    elif action == "result":
        doc["task_id"] = draw(ids)
        if draw(st.booleans()):
            doc["status"] = draw(st.sampled_from(["success", "error"]) | text)
        else:
            doc["success"] = draw(st.booleans())
        if draw(st.booleans()):
            doc["error_msg"] = draw(json_values)
        if draw(st.booleans()):
            doc["attempt"] = draw(st.integers(1, 2**64 - 1))
        if draw(st.booleans()):
            doc["result"] = draw(json_values | st.just(_nested(proto.MAX_NESTING - 1)))
    elif action == "progress":
        doc["task_id"] = draw(ids)
        doc["data"] = draw(json_values | st.just(_nested(proto.MAX_NESTING - 1)))
    # Unknown fields are ignored, whatever they hold (within the nesting limit).
    if draw(st.booleans()):
        doc |= draw(st.dictionaries(text.filter(lambda k: k not in doc), json_values, max_size=2))
    return doc


def _json_text(value: Any) -> str:
    return orjson.dumps(value).decode()


def _nested(depth: int) -> Any:
    """Arrays nested `depth` levels (`[]` is one)."""
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def _id_of(doc: dict[str, Any]) -> str | None:
    task_id = doc.get("task_id")
    return task_id if isinstance(task_id, str) else None


def _encode(doc: dict[str, Any]) -> bytes:
    """The line of `doc`, `task_id` first (where a truncated or garbled line still shows it)."""
    if "task_id" in doc:
        doc = {"task_id": doc["task_id"], **doc}
    return orjson.dumps(doc)


#: Values out of range for an enqueue field: (field, values, a text the error contains).
_OUT_OF_RANGE: list[tuple[str, st.SearchStrategy[Any], str]] = [
    ("task_id", st.just(""), "task_id must not be empty"),
    ("task_id", st.integers(1025, 3000).map(lambda n: "i" * n), "task_id is"),
    ("task_type", st.just(""), "task_type must not be empty"),
    ("task_type", st.integers(257, 5000).map(lambda n: "t" * n), "task_type is"),
    ("max_retries", st.integers(-(2**63), -1), "max_retries"),
    ("max_retries", st.integers(I32_MAX + 1, 2**64 - 1), "max_retries"),
    ("retry_after_hours", st.floats(max_value=-1e-300, allow_infinity=False), "retry_after_hours"),
    ("retry_after_hours", st.floats(MAX_RETRY_AFTER_HOURS * 1.01, 1e308), "retry_after_hours"),
    ("max_execution_seconds", st.integers(-(2**63), 0), "max_execution_seconds"),
    (
        "max_execution_seconds",
        st.integers(proto.MAX_EXECUTION_SECONDS + 1, 2**64 - 1),
        "max_execution_seconds",
    ),
    ("max_per_minute", st.integers(1, I32_MAX), "max_per_minute needs a rate_limit_group"),
    ("rate_limit_group", st.integers(257, 4000).map(lambda n: "g" * n), "rate_limit_group is"),
    ("pool", st.integers(257, 4000).map(lambda n: "p" * n), "pool is"),
    ("cron", text.filter(lambda t: t and not _parses(normalize_cron, t)), "cron"),
    ("cron", st.integers(1025, 5000).map(lambda n: "*" * n), "cron is"),
    ("execute_at", text.filter(lambda t: t and not _parses(parse_rfc3339, t)), "execute_at"),
    ("execute_at", st.sampled_from(["2026-01-02T03:04:05", "2026-13-01T00:00:00Z"]), "execute_at"),
    ("webhook_url", st.sampled_from(["ftp://h/x", "mailto:a@b.c", "javascript:1"]), "webhook_url"),
    ("trigger_after_ids", st.just(["a", ""]), "must not contain an empty id"),
    ("trigger_after_ids", st.just([f"p{i}" for i in range(proto.MAX_PARENTS + 1)]), "limit"),
    ("trigger_after_ids", st.just(["y" * 1025]), "trigger_after_ids holds an id"),
    ("backoff", st.sampled_from(["linear", "Exponential", "fibonacci"]), "backoff must be one of"),
    ("backoff_max_seconds", st.integers(-(2**63), 0), "backoff_max_seconds must be at least 1"),
]


def _parses(parse: Callable[[str], object], value: str) -> bool:
    try:
        parse(value)
    except ValueError:
        return False
    return True


@st.composite
def refused_lines(draw: st.DrawFn, valid: st.SearchStrategy[dict[str, Any]]) -> Line:
    """A line broken in one known way, and what its error must say."""
    doc = draw(valid)
    action = doc["action"]
    task_id = _id_of(doc)
    fields = FIELDS[action]
    how = draw(
        st.sampled_from(
            [
                "wrong type",
                "missing",
                "out of range",
                "too deep",
                "NaN",
                "big integer",
                "bad UTF-8",
                "cut short",
                "not an object",
                "bad action",
            ]
        )
    )
    if how == "wrong type" and fields:
        name = draw(st.sampled_from(sorted(fields)))
        doc[name] = draw(wrong_for(fields[name][0]))
        if name == "status":
            doc.pop("success", None)
        return Line(
            _encode(doc), f"field `{name}` must be", None if name == "task_id" else task_id, how
        )
    required = [name for name, (_, needed) in fields.items() if needed]
    if how == "missing" and required:
        name = draw(st.sampled_from(required))
        doc.pop(name, None)
        if name == "status":
            doc.pop("success", None)
        missing_id = None if name == "task_id" else task_id
        return Line(_encode(doc), f"missing field `{name}`", missing_id, how)
    if how == "out of range" and action == "enqueue":
        name, values, says = draw(st.sampled_from(_OUT_OF_RANGE))
        doc[name] = draw(values)
        if name == "max_per_minute":
            doc.pop("rate_limit_group", None)
        if name == "rate_limit_group":
            doc.pop("max_per_minute", None)
        return Line(_encode(doc), says, _id_of(doc), f"{how}: {name}")
    if how == "out of range" and action == "result":
        doc["attempt"] = draw(st.integers(-(2**63), 0))
        return Line(_encode(doc), "field `attempt` must be at least 1", task_id, how)
    if how == "out of range" and action in ("result", "progress", "register"):
        name = "task_type" if action == "register" else "task_id"
        limit = proto.MAX_NAME_BYTES if action == "register" else proto.MAX_TASK_ID_BYTES
        doc[name] = "z" * draw(st.integers(limit + 1, 3 * limit))
        return Line(_encode(doc), f"field `{name}` is", _id_of(doc), f"{how}: {name}")
    if how == "too deep":
        depth = draw(st.integers(proto.MAX_NESTING, 1500))
        where = draw(st.sampled_from([*fields, "data", "error_msg", "extra"]))
        doc[where] = "<<DEEP>>"  # (orjson writes no more than 254 levels: put it in by hand)
        raw = _encode(doc).replace(b'"<<DEEP>>"', b"[" * depth + b"]" * depth)
        refused_id = None if where == "task_id" else task_id
        return Line(raw, f"nested deeper than {proto.MAX_NESTING} levels", refused_id, how)
    if how in ("NaN", "big integer"):
        # JSON has no NaN or infinity; an integer beyond 64 bits is read as a float.
        literal = draw(
            st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"1e400"])
            if how == "NaN"
            else st.integers(2**64, 10**40).map(lambda n: str(n).encode())
        )
        number_fields = {"enqueue": "max_retries", "result": "attempt"}.get(action, "extra")
        doc[number_fields] = "<<NUMBER>>"
        raw = _encode(doc).replace(b'"<<NUMBER>>"', literal)
        if how == "big integer" and number_fields == "extra":
            return Line(raw, why="valid: a big integer is a float where nothing reads it")
        says = "Invalid JSON" if how == "NaN" else number_fields
        return Line(raw, says, task_id, f"{how} in {number_fields}")
    if how == "bad UTF-8":
        bad = draw(
            st.sampled_from(
                [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf8\x88\x80\x80\x80", b"\x80"]
            )
        )
        doc["extra"] = "<<BAD>>"
        raw = _encode(doc).replace(b"<<BAD>>", bad)
        return Line(raw, "invalid UTF-8", task_id, how)
    if how == "cut short":
        raw = _encode(doc)
        cut = draw(st.integers(1, len(raw) - 1))
        # The id survives a cut after it (it is the first field), not one inside it.
        id_end = len(_encode({"task_id": task_id})) - 1 if task_id is not None else None
        cut_id = task_id if id_end is not None and cut >= id_end else ANY_ID
        return Line(raw[:cut], "Invalid JSON", cut_id if task_id is not None else None, how)
    if how == "not an object":
        value = draw(st.lists(scalars, max_size=3) | scalars)
        return Line(orjson.dumps(value), "expected an object", None, how)
    # A bad action: missing, of another type, or unknown.
    bad_action = draw(st.none() | wrong_for("str") | text.filter(lambda t: t not in FIELDS))
    doc["action"] = bad_action
    says = (
        "missing field `action`"
        if bad_action is None
        else "field `action` must be a string"
        if not isinstance(bad_action, str)
        else "unknown action"
    )
    return Line(_encode(doc), says, task_id, f"bad action {bad_action!r:.30}")


def lines_for(
    enqueue_types: st.SearchStrategy[str], register_types: st.SearchStrategy[str]
) -> st.SearchStrategy[Line]:
    """Lines of every kind: valid, broken in a known way, or raw bytes."""
    valid = valid_docs(enqueue_types, register_types)
    garbage = st.binary(max_size=300).map(
        lambda raw: Line(raw.replace(b"\n", b" "), "Invalid JSON", ANY_ID, "bytes")
    )
    return st.one_of(
        valid.map(lambda doc: Line(_encode(doc), why=f"valid {doc['action']}")),
        refused_lines(valid),
        garbage,
    )


# --- against the core ------------------------------------------------------------------------

#: The core test's task types: the registered ones run at once, the others wait.
CORE_TYPES = st.sampled_from(["email", "report", "never-registered"])


def running_node(**config: Any) -> FakeShell:
    sh = FakeShell(NodeConfig(node_id="fuzz@pid-1-aa", **config))
    sh.start()
    assert sh.node.phase is NodePhase.RUNNING
    sh.register("email")
    sh.register("report")
    return sh


def check_replies(line: Line, replies: list[dict[str, Any]]) -> None:
    """What the node sent for one line: every message writable, and the error it must get."""
    for message in replies:
        proto.encode_message(message)  # a line the daemon could not write would end it
    errors = [m for m in replies if m["action"] == "error"]
    if line.refused_for is None:
        # Valid for the protocol; the queue may still refuse it (an id already pending...),
        # and then says which task.
        command = proto.parse_line(line.raw)
        for error in errors:
            assert error.get("task_id") == getattr(command, "task_id", None), error
        return
    if proto.is_blank_line(line.raw):
        assert replies == []
        return
    assert len(errors) == 1, (line, replies)
    (error,) = errors
    assert line.refused_for in error["message"], (line, error)
    if line.error_id is not ANY_ID:
        assert error.get("task_id") == line.error_id, (line, error)


@given(st.lists(lines_for(CORE_TYPES, CORE_TYPES), min_size=1, max_size=12))
def test_the_core_answers_every_line_with_a_writable_message_and_names_the_problem(
    lines: list[Line],
) -> None:
    sh = running_node()
    for line in lines:
        before = len(sh.sent)
        sh.feed(ev.LineReceived(line=line.raw))
        check_replies(line, sh.sent[before:])
    # Whatever came before, the node still answers.
    sh.line({"action": "stats"})
    assert sh.sent[-1]["action"] == "stats"


@given(
    value=json_values | st.just(_nested(proto.MAX_NESTING - 1)),
    limit=st.integers(1, 400),
    burst=st.booleans(),
)
def test_a_successs_result_is_stored_as_sent_or_fails_the_attempt_past_the_limit(
    value: Any, limit: int, burst: bool
) -> None:
    sh = running_node(result_max_bytes=limit)
    sh.enqueue("r", task_type="email", max_retries=0)
    line = orjson.dumps({"action": "result", "task_id": "r", "status": "success", "result": value})
    if burst:  # (the batch path of plain lines must send it the long way)
        sh.burst([ev.LinesReceived(lines=[line])])
    else:
        sh.feed(ev.LineReceived(line=line))
    (tomb,) = [r for r in sh.log_records() if r.get("deletedAt")]  # read back from the bytes
    size = len(orjson.dumps(value))
    if value is None:
        assert tomb["snerdOutcome"] == "completed" and "snerdResult" not in tomb
    elif size <= limit:
        assert tomb["snerdOutcome"] == "completed" and tomb["snerdResult"] == value
    else:
        assert tomb["snerdOutcome"] == "dead_letter" and "snerdResult" not in tomb
        assert tomb["LastErrorObj"] == proto.result_too_large("r", size, limit)


@given(st.lists(lines_for(CORE_TYPES, CORE_TYPES), min_size=1, max_size=30))
def test_a_burst_of_lines_gets_one_error_for_each_bad_line(lines: list[Line]) -> None:
    # As the daemon hands the node what arrived together (the batch path of plain lines).
    sh = running_node()
    before = len(sh.sent)
    sh.burst([ev.LinesReceived(lines=[line.raw for line in lines])])
    replies = sh.sent[before:]
    for message in replies:
        proto.encode_message(message)
    errors = [m for m in replies if m["action"] == "error"]
    for line in lines:
        if line.refused_for is None or proto.is_blank_line(line.raw):
            continue
        match = next(
            (
                e
                for e in errors
                if line.refused_for in e["message"]
                and (line.error_id is ANY_ID or e.get("task_id") == line.error_id)
            ),
            None,
        )
        assert match is not None, (line, errors)
        errors.remove(match)


# --- reply order (docs/protocol.md, "Reply order") -------------------------------------------


@st.composite
def tagged_lines(draw: st.DrawFn) -> list[tuple[str, bytes]]:
    """Lines each of whose replies can be told apart: (tag, line). Tags: `e<n>` a plain
    enqueue (ids in line order), `x<n>` an enqueue refused at once, `u<n>` a result for no
    running task, `p<n>` a progress, `r<n>` a register, `a<n>` an unknown action (its error
    has no task id), `s` a stats, `h` a point where held appends commit."""
    kinds = draw(st.lists(st.sampled_from("exuprash"), min_size=1, max_size=40))
    out: list[tuple[str, bytes]] = []
    for n, kind in enumerate(kinds):
        tag = f"{kind}{n}"
        doc: dict[str, Any]
        if kind == "e":
            doc = {"action": "enqueue", "task_id": tag, "task_type": "waits", "task_data": ""}
            doc |= {"max_retries": 0, "retry_after_hours": 0}
        elif kind == "x":
            doc = {"action": "enqueue", "task_id": tag, "task_type": "t", "task_data": ""}
            doc |= {"max_retries": -1, "retry_after_hours": 0}
        elif kind == "u":
            doc = {"action": "result", "task_id": tag, "status": "success"}
        elif kind == "p":
            doc = {"action": "progress", "task_id": tag, "data": n}
        elif kind == "r":
            doc = {"action": "register", "task_type": tag}
        elif kind == "a":
            doc = {"action": tag}
        elif kind == "s":
            doc = {"action": "stats"}
        else:
            out.append(("h", b""))
            continue
        out.append((tag if kind != "s" else "s", orjson.dumps(doc)))
    return out


def _tag_of(message: dict[str, Any]) -> str:
    if message["action"] == "stats":
        return "s"
    if "task_id" in message:
        return str(message["task_id"])
    text = str(message["message"])
    if message["action"] == "ack":  # Registered handler for r<n>
        return text.rsplit(" ", 1)[1]
    return text.split("'")[1]  # unknown action 'a<n>'


@given(tagged_lines(), st.integers(1, 4))
def test_replies_keep_the_documented_order(lines: list[tuple[str, bytes]], shards: int) -> None:
    """Enqueue acks wait for their append to commit (held here until an `h`), every other
    reply is sent as its line is handled: replies sent at once come in line order, acks of
    one shard's enqueues come in line order, and every ack or error names its line."""
    sh = FakeShell(NodeConfig(node_id="order@pid-1-aa", new_queue_shards=shards))
    sh.start()
    start = len(sh.sent)
    sh.hold_appends = True
    for tag, raw in lines:
        if tag == "h":
            sh.release_held()
            sh.hold_appends = True
        else:
            sh.line(raw)
    sh.release_held()
    replies = [m for m in sh.sent[start:] if m["action"] != "membership"]
    order = {tag: n for n, (tag, _) in enumerate(lines) if tag not in ("s", "h")}
    # One reply per line (a stats each), none lost, none doubled.
    tags = [_tag_of(m) for m in replies]
    assert sorted(tags) == sorted(tag for tag, _ in lines if tag != "h")
    acks = [m for m in replies if m["action"] == "ack" and "task_id" in m]
    at_once = [t for m, t in zip(replies, tags, strict=True) if m not in acks and t != "s"]
    assert at_once == sorted(at_once, key=order.__getitem__)
    for shard in range(shards):
        mine = [m["task_id"] for m in acks if m["shard"] == f"shard-{shard}"]
        assert mine == sorted(mine, key=order.__getitem__)
    # An id-less error answers a line with no task id: here, only the unknown actions.
    assert all(
        _tag_of(m)[0] == "a" for m in replies if m["action"] == "error" and "task_id" not in m
    )


def test_an_error_overtakes_the_ack_of_an_earlier_enqueue_and_names_its_line() -> None:
    """The case an SDK pairing errors with its oldest outstanding line got wrong."""
    sh = FakeShell(NodeConfig(node_id="order@pid-1-aa"))
    sh.start()
    sh.register("waits")
    start = len(sh.sent)
    sh.hold_appends = True
    sh.enqueue("first", "waits")
    sh.line(b'{"task_id":"second","action":"enqueue", oops')
    sh.line(b"[]")
    sh.release_held()
    assert sh.sent[start:] == [
        proto.error("second", sh.sent[start]["message"]),
        proto.error(None, "Invalid JSON: expected an object, got array"),
        proto.ack_enqueued("first", 0),
    ]


# --- against a real daemon -------------------------------------------------------------------


class DaemonThread:
    """One real daemon process, driven from the test's thread through a trio run of its own
    (`tests/support/daemon.py`), so that hypothesis can feed it many examples."""

    def __init__(self, directory: Path, env: dict[str, str]) -> None:
        self.directory = directory
        self.env = env
        self._token: trio.lowlevel.TrioToken | None = None
        self._started: queue.Queue[BaseException | None] = queue.Queue()
        self._stop: trio.Event | None = None
        self.daemon: Daemon | None = None
        self._thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True)

    def __enter__(self) -> DaemonThread:
        self._thread.start()
        failure = self._started.get(timeout=60)
        if failure is not None:
            raise failure
        return self

    def __exit__(self, *exc: object) -> None:
        if self._token is not None and self._stop is not None:
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(timeout=60)

    async def _main(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._token = trio.lowlevel.current_trio_token()
                self._stop = trio.Event()
                self.daemon = await Daemon.start(nursery, self.directory, env=self.env)
                self._started.put(None)
                await self._stop.wait()
                self.daemon.kill()
                nursery.cancel_scope.cancel()
        except BaseException as exc:  # reported to the test's thread
            self._started.put(exc)
            raise

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`await fn(*args)` in the daemon's trio run."""
        return trio.from_thread.run(fn, *args, trio_token=self._token)


@dataclass
class Ledger:
    """What the daemon answered, over a whole test."""

    #: Task ids acked as enqueued (not deduplicated).
    acked: set[str] = field(default_factory=set)
    lines: int = 0
    #: Garbage and valid lines fed so far, for the replay (bounded).
    fed: list[bytes] = field(default_factory=list)

    def take(self, messages: list[dict[str, Any]]) -> None:
        for m in messages:
            if m["action"] == "ack" and "task_id" in m and not m.get("deduplicated"):
                assert m["task_id"] not in self.acked, m  # acked twice: a live id was reused
                self.acked.add(m["task_id"])


_syncs = iter(range(1 << 62))


async def _feed_then_stats(daemon: Daemon, data: bytes) -> list[dict[str, Any]]:
    """Send `data`, a `stats` and a `progress` of a fresh id; every message up to the echo of
    that progress (lines fed may be `stats` too). The stats reply is the last message answered
    as its line was read; acks of enqueues may follow it, even the echo (each waits for its
    fsync: docs/protocol.md, "Reply order")."""
    sync = f"sync-{next(_syncs)}"
    tail = orjson.dumps({"action": "progress", "task_id": sync, "data": None})
    await daemon.send_raw(data + b'{"action":"stats"}\n' + tail + b"\n")
    out: list[dict[str, Any]] = []
    while True:
        message = await daemon.recv(timeout=60)
        if message["action"] == "progress" and message["task_id"] == sync:
            after = out[_last_stats(out) + 1 :]
            assert all(m["action"] == "ack" for m in after), after[:3]
            return out
        out.append(message)


def _last_stats(messages: list[dict[str, Any]]) -> int:
    """The index of the last `stats` reply in `messages` (there must be one)."""
    at = [n for n, m in enumerate(messages) if m["action"] == "stats"]
    assert at, messages[-3:]
    return at[-1]


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for row in status:
            if row.startswith("VmRSS:"):
                return int(row.split()[1])
    raise AssertionError("no VmRSS")


def _live_task_ids(directory: Path) -> set[str]:
    q = open_queue(str(directory))
    live: set[str] = set()
    for shard in range(q.shards):
        live |= set(scan_shard(q, shard).fold.live)
    return live


#: The daemon test's task types: enqueued types are never registered, so no task ever runs
#: or finishes, and every acked task must still be live at the end (no webhooks either).
DAEMON_ENQUEUE_TYPES = names.map(lambda n: f"q:{n[2:]}")  # (as long as `n`: within the limit)
DAEMON_REGISTER_TYPES = names.map(lambda n: f"r:{n[2:]}")


def _daemon_lines() -> st.SearchStrategy[Line]:
    over_long = st.sampled_from([b'{"task_id":"big-front","x":"', b'{"x":"']).map(
        lambda head: Line(
            head + b"o" * DAEMON_MAX_LINE + b'","task_id":"big-back"}',
            "exceeds the daemon's limit",
            "big-front" if b"big-front" in head else "big-back",
            "over-long",
        )
    )
    return st.one_of(
        lines_for(DAEMON_ENQUEUE_TYPES, DAEMON_REGISTER_TYPES).filter(
            lambda line: b'"webhook_url":"http' not in line.raw
        ),
        over_long,
    )


@pytest.mark.slow
def test_a_daemon_fed_hostile_lines_keeps_answering_and_loses_nothing_acked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "q"
    env = {"SNERD_MAX_LINE_BYTES": str(DAEMON_MAX_LINE), "SNERD_MAX_WORKERS": "4"}
    ledger = Ledger()
    with DaemonThread(directory, env) as d:
        assert d.daemon is not None
        daemon = d.daemon
        # Ready (while it starts, a progress is echoed at once but a stats is held).
        d.run(daemon.wait_for, lambda m: m["action"] == "membership" and m["owned"])
        rss_before = _rss_kib(daemon.proc.pid)
        started = time.monotonic()

        @given(st.lists(_daemon_lines(), min_size=1, max_size=25))
        def feed(batch: list[Line]) -> None:
            data = b"".join(line.raw + b"\n" for line in batch)
            replies = d.run(_feed_then_stats, daemon, data)
            ledger.take(replies)
            ledger.lines += len(batch) + 1
            if len(ledger.fed) < 50_000:
                ledger.fed += [line.raw for line in batch if len(line.raw) < 4096]
            # Every bad line's error came before the stats reply (sent at once, in order).
            errors = [m for m in replies if m["action"] == "error"]
            for line in batch:
                if line.refused_for is None or proto.is_blank_line(line.raw):
                    continue
                match = next(
                    (
                        e
                        for e in errors
                        if line.refused_for in e["message"]
                        and (line.error_id is ANY_ID or e.get("task_id") == line.error_id)
                    ),
                    None,
                )
                assert match is not None, (line, errors)
                errors.remove(match)
            assert daemon.alive

        feed()
        fuzz_s = time.monotonic() - started
        fuzz_lines = ledger.lines

        # The replay: what was fed, mixed with plain enqueues of fresh ids whose acks must come
        # back in line order (one shard), each exactly once.
        replay: list[bytes] = []
        plain: list[str] = []
        for n, raw in enumerate(ledger.fed * max(1, 20_000 // max(1, len(ledger.fed)))):
            replay.append(raw)
            if n % 2 == 0:
                plain.append(f"plain-{n}")
                replay.append(
                    orjson.dumps(
                        {
                            "action": "enqueue",
                            "task_id": plain[-1],
                            "task_type": "q:plain",
                            "task_data": "{}",
                            "max_retries": 0,
                            "retry_after_hours": 0,
                        }
                    )
                )
        started = time.monotonic()
        replies: list[dict[str, Any]] = []
        for chunk in _chunks(replay, 2000):
            replies += d.run(_feed_then_stats, daemon, b"".join(r + b"\n" for r in chunk))
        replay_s = time.monotonic() - started
        rss_after = _rss_kib(daemon.proc.pid)

        # Close stdin: the daemon drains, sends what is still owed, and exits 0.
        d.run(daemon.close_stdin)
        tail: list[dict[str, Any]] = []

        async def rest() -> None:
            while True:
                try:
                    tail.append(await daemon.recv(timeout=30))
                except EOFError:
                    return

        d.run(rest)
        assert d.run(daemon.wait) == 0
        ledger.take(replies + tail)
        answered = [
            m["task_id"]
            for m in replies + tail
            if m["action"] in ("ack", "error") and str(m.get("task_id")).startswith("plain-")
        ]
        assert answered == plain  # each once, in line order (one shard)

    live = _live_task_ids(directory)
    assert ledger.acked <= live, sorted(ledger.acked - live)[:5]
    with DaemonThread(directory, env) as d:
        assert d.daemon is not None
        d.run(d.daemon.wait_for, lambda m: m["action"] == "membership" and m["owned"])
        again = d.run(_feed_then_stats, d.daemon, b"")
        assert again[_last_stats(again)]["queue_depth"] == len(live)
    with capsys.disabled():
        print(
            f"\n[fuzz] daemon: {fuzz_lines} fuzzed lines in {fuzz_s:.1f} s "
            f"({fuzz_lines / fuzz_s:.0f} lines/s, hypothesis included); replay of "
            f"{len(replay)} lines in {replay_s:.2f} s ({len(replay) / replay_s:.0f} lines/s); "
            f"{len(ledger.acked)} tasks acked, all live after a restart; "
            f"RSS {rss_before / 1024:.1f} MiB -> {rss_after / 1024:.1f} MiB"
        )


def _chunks(items: list[bytes], size: int) -> Iterator[list[bytes]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


# --- enqueue_batch ---------------------------------------------------------------------------


@st.composite
def batch_items(draw: st.DrawFn) -> Any:
    """An item of an `enqueue_batch` line: a valid enqueue (without its action), a valid
    message of another action, an enqueue with a field missing or of the wrong type, or any
    JSON value."""
    kind = draw(st.sampled_from(["valid", "valid", "other", "broken", "value"]))
    if kind == "value":
        return draw(json_values)
    doc = draw(valid_docs(CORE_TYPES, CORE_TYPES))
    if kind == "other" or doc["action"] != "enqueue":
        return doc
    del doc["action"]
    if kind == "broken":
        name = draw(st.sampled_from(sorted(FIELDS["enqueue"])))
        if draw(st.booleans()):
            doc.pop(name, None)
        else:
            doc[name] = draw(wrong_for(FIELDS["enqueue"][name][0]))
    return doc


@given(st.lists(batch_items(), min_size=1, max_size=20))
def test_each_item_of_a_batch_is_answered_once_and_a_bad_one_refuses_only_itself(
    items: list[Any],
) -> None:
    sh = running_node()
    before = len(sh.sent)
    sh.burst([ev.LineReceived(line=orjson.dumps({"action": "enqueue_batch", "tasks": items}))])
    sh.node.invariants()
    replies = sh.sent[before:]
    for message in replies:
        proto.encode_message(message)
    answers = [m for m in replies if m["action"] in ("ack", "error")
               and not str(m.get("message", "")).startswith("Registered")]
    # One answer per item: the node parsed each alone (a refused item names its id, or its
    # place in the list when it has none).
    assert len(answers) == len(items), (items, answers)
    for i, item in enumerate(items):
        task_id = item.get("task_id") if isinstance(item, dict) else None
        if isinstance(task_id, str) and task_id:
            assert any(a.get("task_id") == task_id for a in answers), (item, answers)
        else:
            assert any(f"(tasks[{i}])" in a.get("message", "") for a in answers), (i, answers)
