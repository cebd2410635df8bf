"""snerd.core.protocol: inbound lines to commands, commands' validation, outbound messages."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from snerd.core import protocol as proto
from snerd.core.events import Event
from snerd.core.protocol import (
    Enqueue,
    Progress,
    ProtocolError,
    Register,
    Result,
    StatsRequested,
    parse_line,
)
from snerd.core.timefmt import parse_rfc3339


def line(**fields: Any) -> bytes:
    return orjson.dumps(fields)


def enqueue_fields(**overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "action": "enqueue",
        "task_id": "job-1",
        "task_type": "email",
        "task_data": '{"to":"a@b.c"}',
        "max_retries": 3,
        "retry_after_hours": 0.5,
    }
    fields.update(overrides)
    return {k: v for k, v in fields.items() if v is not _DROP}


_DROP = object()


def enqueue_line(**overrides: Any) -> bytes:
    return orjson.dumps(enqueue_fields(**overrides))


def enqueue_command(**overrides: Any) -> Enqueue:
    """The command `enqueue_line()` parses to, with `overrides`."""
    fields: dict[str, Any] = {
        "task_id": "job-1",
        "task_type": "email",
        "task_data": '{"to":"a@b.c"}',
        "max_retries": 3,
        "retry_after_hours": 0.5,
    }
    return Enqueue(**{**fields, **overrides})


#: The enqueue fields that may be left out: the upstream SDK's, in its order, then snerd's.
OPTIONAL_FIELDS = (
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


def refused(raw: bytes) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        parse_line(raw)
    return info.value


# --- well-formed lines ---------------------------------------------------------------------


def test_minimal_enqueue() -> None:
    cmd = parse_line(enqueue_line())
    assert cmd == enqueue_command()
    assert isinstance(cmd, Event)


def test_full_enqueue() -> None:
    cmd = parse_line(
        enqueue_line(
            rate_limit_group="api",
            max_per_minute=60,
            auto_dedupe=True,
            urgency_score=0.9,
            execute_at="2026-01-02T03:04:05+01:00",
            cron="0 8 * * 1",
            webhook_url="https://example.com/hook",
            max_execution_seconds=30,
            pool="urgent",
            trigger_after_ids=["a", "b", "a"],
        )
    )
    assert cmd == enqueue_command(
        rate_limit_group="api",
        max_per_minute=60,
        auto_dedupe=True,
        urgency_score=0.9,
        execute_at_us=parse_rfc3339("2026-01-02T02:04:05Z"),
        cron="0 0 8 * * 1",
        webhook_url="https://example.com/hook",
        max_execution_seconds=30,
        pool="urgent",
        trigger_after_ids=("a", "b"),
    )


def test_nulls_mean_absent_and_unknown_fields_are_ignored() -> None:
    cmd = parse_line(
        enqueue_line(
            **dict.fromkeys(OPTIONAL_FIELDS), future_field={"x": 1}, test_pause_heartbeat=1
        )
    )
    assert cmd == parse_line(enqueue_line())


def test_empty_optional_strings_mean_absent() -> None:
    cmd = parse_line(
        enqueue_line(rate_limit_group="", execute_at="", cron="", webhook_url="", pool="")
    )
    assert cmd == parse_line(enqueue_line())


def test_integers_are_accepted_for_number_fields() -> None:
    cmd = parse_line(enqueue_line(retry_after_hours=2, urgency_score=-3))
    assert isinstance(cmd, Enqueue)
    assert cmd.retry_after_hours == 2.0 and isinstance(cmd.retry_after_hours, float)
    assert cmd.urgency_score == -3.0 and isinstance(cmd.urgency_score, float)


def test_negative_zero_hours_is_zero() -> None:
    cmd = parse_line(enqueue_line(retry_after_hours=-0.0))
    assert isinstance(cmd, Enqueue)
    assert str(cmd.retry_after_hours) == "0.0"


def test_java_style_two_decimal_numbers() -> None:
    # Java's SDK formats numbers with %.2f and builds JSON by hand.
    raw = (
        b'{"action":"enqueue","task_id":"j","task_type":"t","task_data":"{}",'
        b'"max_retries":3,"retry_after_hours":0.00,"urgency_score":0.50}\r'
    )
    cmd = parse_line(raw)
    assert isinstance(cmd, Enqueue)
    assert cmd.retry_after_hours == 0.0 and cmd.urgency_score == 0.5


def test_register_and_stats() -> None:
    assert parse_line(b'{"action":"register","task_type":"email"}') == Register(task_type="email")
    assert parse_line(b'{"action":"stats"}') == StatsRequested()
    assert parse_line(b'{"action":"stats","extra":[1]}') == StatsRequested()


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"status": "success"}, Result(task_id="t", success=True)),
        (
            {"status": "error", "error_msg": "boom"},
            Result(task_id="t", success=False, error_msg="boom"),
        ),
        ({"status": "SUCCESS"}, Result(task_id="t", success=False)),
        ({"status": "failed", "error_msg": None}, Result(task_id="t", success=False)),
        ({"success": True}, Result(task_id="t", success=True)),
        ({"success": False, "error_msg": "x"}, Result(task_id="t", success=False, error_msg="x")),
        ({"status": "success", "success": False}, Result(task_id="t", success=True)),
        ({"status": None, "success": True}, Result(task_id="t", success=True)),
        ({"status": "success", "attempt": 2}, Result(task_id="t", success=True, attempt=2)),
        # Lenient: a non-string error_msg is kept as JSON text rather than losing the result.
        (
            {"status": "error", "error_msg": {"code": 7}},
            Result(task_id="t", success=False, error_msg='{"code":7}'),
        ),
    ],
)
def test_result_shapes(fields: dict[str, Any], expected: Result) -> None:
    assert parse_line(line(action="result", task_id="t", **fields)) == expected


@pytest.mark.parametrize("data", ["50%", {"step": 2, "of": 5}, [1, 2], 3.5, None, True])
def test_progress_passes_any_json_value_on(data: Any) -> None:
    assert parse_line(line(action="progress", task_id="t", data=data)) == Progress(
        task_id="t", data=data
    )


def test_blank_lines() -> None:
    assert proto.is_blank_line(b"")
    assert proto.is_blank_line(b"  \t\r")
    assert not proto.is_blank_line(b" {} ")
    err = refused(b"   ")
    assert err.message == "Invalid JSON: empty line"
    assert err.task_id is None


# --- malformed lines: text and task id -----------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "message", "task_id"),
    [
        (b"not json", "Invalid JSON: invalid literal", None),
        (b'{"task_id":"t1","action":"enqueue",', "Invalid JSON: unexpected end of data", "t1"),
        (b'{"action":"enqueue", "task_id" : "t2", oops}', "Invalid JSON: ", "t2"),
        (b'{"action":"x","task_id":"t3"} trailing', "Invalid JSON: unexpected content", "t3"),
        (b'{"task_id":"t4","retry_after_hours":1e999}', "Invalid JSON: number is infinity", "t4"),
        (b'{"task_id":"t5","task_data":"\xff"}', "Invalid JSON: invalid UTF-8 at byte 29", "t5"),
        (b'\xc3{"task_id":"t6"}', "Invalid JSON: invalid UTF-8 at byte 0", "t6"),
        (b'{"task_id":"esc\\"aped", bad', "Invalid JSON: ", 'esc"aped'),
        (b"[1, 2]", "Invalid JSON: expected an object, got array", None),
        (b'"text"', "Invalid JSON: expected an object, got string", None),
        (b"42", "Invalid JSON: expected an object, got integer", None),
        (b"null", "Invalid JSON: expected an object, got null", None),
        (b'{"task_id":"t7"}', "Invalid JSON: missing field `action`", "t7"),
        (b'{"action":null,"task_id":"t8"}', "Invalid JSON: missing field `action`", "t8"),
        (
            b'{"action":5,"task_id":"t9"}',
            "Invalid JSON: field `action` must be a string, got integer",
            "t9",
        ),
        (
            b'{"action":"shutdown","task_id":"t10"}',
            "Invalid JSON: unknown action 'shutdown'",
            "t10",
        ),
        (
            b'{"action":"test_pause_heartbeat"}',
            "Invalid JSON: unknown action 'test_pause_heartbeat'",
            None,
        ),
        (b'{"action":"Enqueue","task_id":"t11"}', "Invalid JSON: unknown action 'Enqueue'", "t11"),
        (b'{"action":"register"}', "Invalid JSON: missing field `task_type`", None),
        (
            b'{"action":"register","task_type":7}',
            "Invalid JSON: field `task_type` must be a string, got integer",
            None,
        ),
        (
            b'{"action":"register","task_type":""}',
            "Invalid JSON: field `task_type` must not be empty",
            None,
        ),
        (b'{"action":"result","status":"success"}', "Invalid JSON: missing field `task_id`", None),
        (
            b'{"action":"result","task_id":"","status":"success"}',
            "Invalid JSON: field `task_id` must not be empty",
            "",
        ),
        (b'{"action":"result","task_id":"r1"}', "Invalid JSON: missing field `status`", "r1"),
        (
            b'{"action":"result","task_id":"r2","status":true}',
            "Invalid JSON: field `status` must be a string, got boolean",
            "r2",
        ),
        (
            b'{"action":"result","task_id":"r3","success":"yes"}',
            "Invalid JSON: field `success` must be a boolean, got string",
            "r3",
        ),
        (
            b'{"action":"result","task_id":"r4","status":"success","attempt":0}',
            "Invalid JSON: field `attempt` must be at least 1, got 0",
            "r4",
        ),
        (
            b'{"action":"result","task_id":"r5","status":"success","attempt":"1"}',
            "Invalid JSON: field `attempt` must be an integer, got string",
            "r5",
        ),
        (
            b'{"action":"result","task_id":5,"status":"success"}',
            "Invalid JSON: field `task_id` must be a string, got integer",
            None,
        ),
        (b'{"action":"progress","task_id":"p1"}', "Invalid JSON: missing field `data`", "p1"),
        (
            b'{"action":"progress","task_id":"","data":"x"}',
            "Invalid JSON: field `task_id` must not be empty",
            "",
        ),
        (b'{"action":"progress","data":"x"}', "Invalid JSON: missing field `task_id`", None),
        (
            b'{"action":"register","task_type":"' + b"t" * 257 + b'"}',
            "Invalid JSON: field `task_type` is 257 bytes; the limit is 256",
            None,
        ),
        (
            b'{"action":"result","task_id":"' + b"r" * 1025 + b'","status":"success"}',
            "Invalid JSON: field `task_id` is 1025 bytes; the limit is 1024",
            "r" * 1025,
        ),
        (
            b'{"action":"progress","task_id":"' + b"p" * 1025 + b'","data":1}',
            "Invalid JSON: field `task_id` is 1025 bytes; the limit is 1024",
            "p" * 1025,
        ),
        # orjson reads an integer beyond 64 bits as a float.
        (
            enqueue_line()[:-1] + b',"max_retries":18446744073709551616}',
            "Invalid JSON: field `max_retries` must be an integer within 64 bits, got 1.84467e+19",
            "job-1",
        ),
        (
            b'{"action":"result","task_id":"r6","status":"success","attempt":-1e300}',
            "Invalid JSON: field `attempt` must be an integer within 64 bits, got -1e+300",
            "r6",
        ),
    ],
)
def test_malformed_lines(raw: bytes, message: str, task_id: str | None) -> None:
    err = refused(raw)
    assert err.message.startswith(message), err.message
    assert err.task_id == task_id
    assert str(err) == err.message


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("task_id", _DROP, "missing field `task_id`"),
        ("task_type", _DROP, "missing field `task_type`"),
        ("task_type", None, "missing field `task_type`"),
        ("task_data", _DROP, "missing field `task_data`"),
        ("task_data", {"to": "x"}, "field `task_data` must be a string, got object"),
        ("max_retries", _DROP, "missing field `max_retries`"),
        ("max_retries", "3", "field `max_retries` must be an integer, got string"),
        ("max_retries", 3.0, "field `max_retries` must be an integer, got float"),
        ("max_retries", True, "field `max_retries` must be an integer, got boolean"),
        ("max_retries", None, "missing field `max_retries`"),
        ("retry_after_hours", _DROP, "missing field `retry_after_hours`"),
        ("retry_after_hours", "0.5", "field `retry_after_hours` must be a number, got string"),
        ("retry_after_hours", False, "field `retry_after_hours` must be a number, got boolean"),
        ("rate_limit_group", 5, "field `rate_limit_group` must be a string, got integer"),
        ("max_per_minute", 1.5, "field `max_per_minute` must be an integer, got float"),
        ("auto_dedupe", "true", "field `auto_dedupe` must be a boolean, got string"),
        ("auto_dedupe", 1, "field `auto_dedupe` must be a boolean, got integer"),
        ("urgency_score", "high", "field `urgency_score` must be a number, got string"),
        ("urgency_score", True, "field `urgency_score` must be a number, got boolean"),
        ("execute_at", 1767323045, "field `execute_at` must be a string, got integer"),
        ("cron", ["* * * * *"], "field `cron` must be a string, got array"),
        ("webhook_url", {}, "field `webhook_url` must be a string, got object"),
        (
            "max_execution_seconds",
            2.5,
            "field `max_execution_seconds` must be an integer, got float",
        ),
        ("pool", 1, "field `pool` must be a string, got integer"),
        (
            "trigger_after_ids",
            "a",
            "field `trigger_after_ids` must be an array of strings, got string",
        ),
        (
            "trigger_after_ids",
            ["a", 2],
            "field `trigger_after_ids` must be an array of strings, got integer at index 1",
        ),
    ],
)
def test_enqueue_type_errors_carry_the_task_id(field: str, value: Any, expected: str) -> None:
    err = refused(enqueue_line(**{field: value}))
    assert err.message == f"Invalid JSON: {expected}"
    assert err.task_id == (None if field == "task_id" else "job-1")


@pytest.mark.parametrize(
    ("overrides", "detail"),
    [
        ({"task_id": ""}, "task_id must not be empty"),
        ({"task_id": "x" * 1025}, "task_id is 1025 bytes; the limit is 1024"),
        ({"task_id": "é" * 513}, "task_id is 1026 bytes; the limit is 1024"),
        ({"task_type": ""}, "task_type must not be empty"),
        ({"max_retries": -1}, "max_retries must be 0 or more, got -1"),
        ({"max_retries": 2**31}, "max_retries 2147483648 is too large (at most 2147483647)"),
        ({"retry_after_hours": -0.5}, "retry_after_hours must be 0 or more, got -0.5"),
        ({"retry_after_hours": 1e9}, "retry_after_hours 1000000000.0 is more than 100 years"),
        (
            {"rate_limit_group": "g", "max_per_minute": 0},
            "max_per_minute must be at least 1, got 0",
        ),
        (
            {"rate_limit_group": "g", "max_per_minute": -5},
            "max_per_minute must be at least 1, got -5",
        ),
        ({"max_per_minute": 10}, "max_per_minute needs a rate_limit_group to count dispatches in"),
        ({"max_per_minute": 10, "rate_limit_group": ""}, "max_per_minute needs a rate_limit_group"),
        ({"max_execution_seconds": 0}, "max_execution_seconds must be at least 1, got 0"),
        ({"max_execution_seconds": -1}, "max_execution_seconds must be at least 1, got -1"),
        (
            {"max_execution_seconds": 10**12},
            "max_execution_seconds 1000000000000 is more than 100 years",
        ),
        (
            {"execute_at": "2026-01-02T03:04:05"},
            "invalid execute_at '2026-01-02T03:04:05': no UTC offset; "
            "send RFC 3339 like 2026-01-02T03:04:05Z",
        ),
        (
            {"execute_at": "2026-13-01T00:00:00Z"},
            "invalid execute_at '2026-13-01T00:00:00Z': month 13 out of range",
        ),
        ({"execute_at": "tomorrow"}, "invalid execute_at 'tomorrow': not an RFC 3339 timestamp"),
        ({"cron": "0 8 * *"}, "invalid cron '0 8 * *': expected 5 fields"),
        ({"cron": "0s"}, "invalid cron '0s': '0s': the interval must be at least 1"),
        ({"cron": "0 25 * * *"}, "invalid cron '0 25 * * *': hour 25 out of range (0-23)"),
        ({"cron": "   "}, "invalid cron '   ': empty cron expression"),
        (
            {"webhook_url": "ftp://x"},
            "webhook_url must be an http:// or https:// URL, got scheme 'ftp'",
        ),
        ({"trigger_after_ids": ["a", "job-1"]}, "task job-1 cannot depend on itself"),
        ({"trigger_after_ids": ["a", ""]}, "trigger_after_ids must not contain an empty id"),
        # Sizes: a type name is listed in membership.json (rewritten at every renewal), a
        # group or pool name is in every record of its task.
        ({"task_type": "t" * 257}, "task_type is 257 bytes; the limit is 256"),
        ({"task_type": "é" * 129}, "task_type is 258 bytes; the limit is 256"),
        ({"rate_limit_group": "g" * 257}, "rate_limit_group is 257 bytes; the limit is 256"),
        ({"pool": "p" * 300}, "pool is 300 bytes; the limit is 256"),
        (
            {"trigger_after_ids": [f"p{i}" for i in range(1025)]},
            "trigger_after_ids has 1025 ids; the limit is 1024",
        ),
        (
            {"trigger_after_ids": ["a", "x" * 1025]},
            "trigger_after_ids holds an id of 1025 bytes; the limit is 1024",
        ),
        ({"cron": "1," * 600 + "1 * * * *"}, "cron is 1209 characters; the limit is 1024"),
    ],
)
def test_enqueue_semantic_errors(overrides: dict[str, Any], detail: str) -> None:
    err = refused(enqueue_line(**overrides))
    assert err.message.startswith(f"Failed to enqueue: {detail}"), err.message
    assert err.task_id == overrides.get("task_id", "job-1")


def test_bad_values_are_echoed_short() -> None:
    err = refused(enqueue_line(execute_at="x" * 10_000))
    assert len(err.message) < 400
    assert "…" in err.message


def test_long_action_is_echoed_short() -> None:
    err = refused(line(action="a" * 5000, task_id="t"))
    assert len(err.message) < 300
    assert err.task_id == "t"


def test_line_over_the_limit() -> None:
    raw = enqueue_line(task_data="x" * 500)
    err = refused_with_limit(raw, 100)
    assert err.message == (f"Invalid JSON: line of {len(raw)} bytes exceeds the limit of 100 bytes")
    assert err.task_id == "job-1"
    assert isinstance(parse_line(raw, max_line_bytes=len(raw)), Enqueue)


def refused_with_limit(raw: bytes, limit: int) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        parse_line(raw, max_line_bytes=limit)
    return info.value


def test_task_id_is_found_after_a_huge_payload() -> None:
    # Go's json.Marshal sorts keys: task_id comes after task_data.
    raw = b'{"action":"enqueue","task_data":"' + b"x" * 300_000 + b'","task_id":"go-1",'
    assert refused(raw).task_id == "go-1"
    assert proto.sniff_task_id(raw) == "go-1"


def test_sniff_ignores_task_id_text_inside_a_string() -> None:
    raw = b'{"task_data":"{\\"task_id\\":\\"inner\\"}", broken'
    assert proto.sniff_task_id(raw) is None


def test_sniff_refuses_invalid_utf8_ids() -> None:
    assert proto.sniff_task_id(b'{"task_id":"\xff\xfe", x') is None


def test_protocol_error_attributes() -> None:
    err = ProtocolError("Invalid JSON: x", task_id="t")
    assert err.message == "Invalid JSON: x"
    assert err.task_id == "t"
    assert ProtocolError("m").task_id is None
    assert "task_id='t'" in repr(err)


# --- validate_enqueue for commands built in process ------------------------------------------


#: A command built in process, valid as it is.
BUILT = Enqueue(task_id="a", task_type="t", task_data="", max_retries=0, retry_after_hours=0.0)


def test_validate_enqueue_accepts_a_well_formed_command() -> None:
    proto.validate_enqueue(BUILT)


@pytest.mark.parametrize(
    ("overrides", "detail"),
    [
        ({"retry_after_hours": float("nan")}, "finite"),
        ({"retry_after_hours": float("inf")}, "finite"),
        ({"urgency_score": float("nan")}, "urgency_score must be a finite number"),
        ({"cron": "5m"}, "is not normalized (expected '0 */5 * * * *')"),
        ({"cron": "nope"}, "invalid cron 'nope'"),
        ({"trigger_after_ids": ("b", "b")}, "must not repeat an id"),
    ],
)
def test_validate_enqueue_checks_commands_not_built_by_parse_line(
    overrides: dict[str, Any], detail: str
) -> None:
    with pytest.raises(ProtocolError) as info:
        proto.validate_enqueue(replace(BUILT, **overrides))
    assert info.value.message.startswith("Failed to enqueue: ")
    assert detail in info.value.message
    assert info.value.task_id == "a"


# --- properties: the task id survives any damage after it -----------------------------------

_JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
# Any id, quotes, backslashes and control characters included (they arrive JSON-escaped).
_IDS = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=30)


@given(
    task_id=_IDS,
    field=st.sampled_from(
        ["task_type", "task_data", "max_retries", "retry_after_hours", *OPTIONAL_FIELDS]
    ),
    value=st.one_of(
        _JSON_SCALARS,
        st.lists(st.integers(-(2**63), 2**63 - 1), max_size=2),
        st.dictionaries(st.text(max_size=3), st.integers(-5, 5), max_size=2),
    ),
)
def test_any_bad_field_value_keeps_the_task_id(task_id: str, field: str, value: Any) -> None:
    raw = enqueue_line(task_id=task_id, **{field: value})
    try:
        cmd = parse_line(raw)
    except ProtocolError as err:
        assert err.task_id == task_id
        assert err.message.startswith(("Invalid JSON: ", "Failed to enqueue: "))
    else:
        assert isinstance(cmd, Enqueue) and cmd.task_id == task_id


@given(task_id=_IDS, data=st.data())
def test_a_line_cut_anywhere_after_the_id_keeps_the_task_id(
    task_id: str, data: st.DataObject
) -> None:
    raw = enqueue_line(task_id=task_id)
    # `{"task_id":"<id>"}` minus its braces is exactly the text of the field in the line.
    id_end = raw.index(b'"task_id":') + len(orjson.dumps({"task_id": task_id})) - 2
    cut = data.draw(st.integers(min_value=id_end, max_value=len(raw) - 1))
    err = refused(raw[:cut])
    assert err.task_id == task_id
    assert err.message.startswith("Invalid JSON: ")


@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_crash(raw: bytes) -> None:
    try:
        parse_line(raw)
    except ProtocolError as err:
        assert err.message.startswith("Invalid JSON: ")


# --- outbound --------------------------------------------------------------------------------


def enc(msg: dict[str, Any]) -> bytes:
    return proto.encode_message(msg)


def test_ack_registered() -> None:
    assert enc(proto.ack_registered("email")) == (
        b'{"action":"ack","message":"Registered handler for email"}\n'
    )


def test_ack_enqueued() -> None:
    assert enc(proto.ack_enqueued("t1", 3)) == (
        b'{"action":"ack","task_id":"t1","message":"Enqueued successfully","shard":"shard-3"}\n'
    )
    assert enc(proto.ack_enqueued("t1", 0, deduplicated=True)) == (
        b'{"action":"ack","task_id":"t1","message":"Enqueued successfully","shard":"shard-0",'
        b'"deduplicated":true}\n'
    )


def test_error() -> None:
    assert enc(proto.error("t1", "boom")) == b'{"action":"error","task_id":"t1","message":"boom"}\n'
    assert enc(proto.error(None, "boom")) == b'{"action":"error","message":"boom"}\n'
    assert enc(proto.error("", "boom")) == b'{"action":"error","task_id":"","message":"boom"}\n'


def test_execute() -> None:
    assert enc(proto.execute("t1", "email", '{"a":1}', 30, 2)) == (
        b'{"action":"execute","task_id":"t1","task_type":"email","task_data":"{\\"a\\":1}",'
        b'"max_execution_seconds":30,"attempt":2}\n'
    )
    assert enc(proto.execute("t1", "email", "", None, 1)) == (
        b'{"action":"execute","task_id":"t1","task_type":"email","task_data":"","attempt":1}\n'
    )


def test_max_retries_reached_and_progress() -> None:
    assert enc(proto.max_retries_reached("t1", "email", "{}")) == (
        b'{"action":"max_retries_reached","task_id":"t1","task_type":"email","task_data":"{}"}\n'
    )
    assert enc(proto.progress("t1", {"pct": 50})) == (
        b'{"action":"progress","task_id":"t1","data":{"pct":50}}\n'
    )


def test_stats() -> None:
    counters: dict[str, Any] = {
        "total_enqueued": 5,
        "total_executed": 4,
        "total_failed": 1,
        "total_dlq": 0,
        "queue_depth": 2,
        "uptime_secs": 60,
        "per_shard": {1: 2, 0: 0},
    }
    assert enc(proto.stats(**counters, extra={"in_flight": 1})) == (
        b'{"action":"stats","total_enqueued":5,"total_executed":4,"total_failed":1,'
        b'"total_dlq":0,"queue_depth":2,"uptime_secs":60,'
        b'"per_shard":[{"shard":"shard-0","depth":0},{"shard":"shard-1","depth":2}],'
        b'"in_flight":1}\n'
    )
    with pytest.raises(ValueError, match="replace an upstream field"):
        proto.stats(**counters, extra={"queue_depth": 9})


def test_membership() -> None:
    assert enc(proto.membership("snerdmq-daemon", 4, [2, 0], 7)) == (
        b'{"action":"membership","queue":"snerdmq-daemon","shards":4,'
        b'"owned":["shard-0","shard-2"],"version":7}\n'
    )


def test_known_texts() -> None:
    assert proto.SHUTTING_DOWN == "[Snerd] Daemon is shutting down; enqueue rejected"
    assert proto.NO_SHARDS_OWNED == "[Snerd] No shards owned by this instance"
    assert proto.unknown_result("t9") == "Received result for unknown/expired task_id t9"
    assert proto.timed_out(30) == "Task execution timed out after 30 seconds"
    assert proto.failed_to_enqueue("disk full") == "Failed to enqueue: disk full"


def test_encoded_messages_parse_back_as_the_sdk_sees_them() -> None:
    msg = proto.execute("t\n1", 'ty"pe', "dåta\u2028", None, 1)
    raw = enc(msg)
    assert raw.endswith(b"\n") and raw.count(b"\n") == 1
    assert orjson.loads(raw) == msg
    assert next(iter(orjson.loads(raw))) == "action"


def test_sniff_decodes_escaped_ids() -> None:
    assert proto.sniff_task_id(b'{"task_id":"a\\"b\\u00e9\\n", broken') == 'a"b\u00e9\n'
    assert proto.sniff_task_id(b'{"task_id":"\\ud800", broken') is None


@given(
    task_id=st.text(min_size=1, max_size=40),
    task_type=st.text(min_size=1, max_size=20),
    task_data=st.text(max_size=60),
    max_retries=st.integers(min_value=0, max_value=2**31 - 1),
    hours=st.one_of(st.integers(0, 1000), st.floats(0, 1000, allow_nan=False)),
    nulls=st.lists(st.sampled_from(["urgency_score", "pool", "cron", "execute_at"]), max_size=3),
)
def test_the_fast_path_for_a_plain_enqueue_gives_what_the_full_parser_gives(
    task_id: str, task_type: str, task_data: str, max_retries: int, hours: float, nulls: list[str]
) -> None:
    doc: dict[str, Any] = {
        "action": "enqueue",
        "task_id": task_id,
        "task_type": task_type,
        "task_data": task_data,
        "max_retries": max_retries,
        "retry_after_hours": hours,
        **dict.fromkeys(nulls),
    }
    fast = proto._plain_enqueue(doc)
    assert fast is not None
    assert fast == proto._parse_enqueue(proto._Fields(doc, task_id))
    assert proto.parse_line(orjson.dumps(doc)) == fast


@given(
    task_id=st.text(min_size=1, max_size=40),
    status=st.text(max_size=10) | st.sampled_from(["success", "error"]),
    error_msg=st.none() | st.text(max_size=30),
    attempt=st.none() | st.integers(1, 2**31),
)
def test_the_fast_path_for_a_plain_result_gives_what_the_full_parser_gives(
    task_id: str, status: str, error_msg: str | None, attempt: int | None
) -> None:
    doc: dict[str, Any] = {"action": "result", "task_id": task_id, "status": status}
    if error_msg is not None:
        doc["error_msg"] = error_msg
    if attempt is not None:
        doc["attempt"] = attempt
    fast = proto._plain_result(doc)
    assert fast is not None
    assert fast == proto._parse_result(proto._Fields(doc, task_id))
    assert proto.parse_line(orjson.dumps(doc)) == fast


@given(
    ids=st.lists(st.text(min_size=1, max_size=20), min_size=1, max_size=5),
    shard=st.integers(0, 999),
)
def test_ack_lines_are_the_framed_acks_of_each_task(ids: list[str], shard: int) -> None:
    expected = b"".join(proto.encode_message(proto.ack_enqueued(i, shard)) for i in ids)
    assert proto.ack_lines(ids, shard) == expected


def test_the_optional_enqueue_fields_are_the_upstream_sdks() -> None:
    assert proto.ENQUEUE_OPTIONS == OPTIONAL_FIELDS


# --- nesting: a line the daemon accepts it can write back ------------------------------------


def nested(depth: int, kind: str = "array") -> bytes:
    """A JSON value of `depth` levels of arrays (or objects), innermost empty."""
    if kind == "array":
        return b"[" * depth + b"]" * depth
    return b'{"a":' * (depth - 1) + b"{}" + b"}" * (depth - 1)


#: Lines whose `X` is replaced by a value: the line nests one level more than the value.
NESTING_LINES = [
    (b'{"action":"progress","task_id":"p1","data":X}', "p1"),
    (b'{"action":"result","task_id":"r1","status":"error","error_msg":X}', "r1"),
    # Unknown fields are not written back, but a line is refused whichever field nests: the
    # plain fast paths must not take them.
    (b'{"action":"result","task_id":"r2","status":"success","extra":X}', "r2"),
    (enqueue_line()[:-1] + b',"extra":X}', "job-1"),
    (b'{"action":"register","task_type":"t","extra":X}', None),
    (b'{"action":"stats","extra":X}', None),
]


@pytest.mark.parametrize("kind", ["array", "object"])
@pytest.mark.parametrize(("template", "task_id"), NESTING_LINES)
def test_a_line_nested_deeper_than_the_limit_is_refused_with_its_task_id(
    template: bytes, task_id: str | None, kind: str
) -> None:
    deepest = proto.MAX_NESTING
    accepted = parse_line(template.replace(b"X", nested(deepest - 1, kind)))
    if isinstance(accepted, Progress):
        # What the daemon writes back: the echo nests exactly as deep as the line.
        echo = enc(proto.progress(accepted.task_id, accepted.data))
        assert orjson.loads(echo)["data"] == accepted.data
    if isinstance(accepted, Result) and accepted.error_msg is not None:
        assert accepted.error_msg.encode() == nested(deepest - 1, kind).replace(b" ", b"")
    # 254 was the one that ended the daemon; beyond 1023 orjson itself refuses the line.
    for depth in (deepest, 253, 254, 1023, 1024, 5000):
        err = refused(template.replace(b"X", nested(depth, kind)))
        assert err.message == f"Invalid JSON: nested deeper than {deepest} levels"
        assert err.task_id == task_id


def test_a_long_flat_array_is_not_too_deep() -> None:
    data = b"[" + b",".join([b"[1,2]"] * 100_000) + b"]"
    cmd = parse_line(b'{"action":"progress","task_id":"p","data":' + data + b"}")
    assert isinstance(cmd, Progress) and len(cmd.data) == 100_000


@pytest.mark.parametrize("value", [{"n": 1, "tags": ["a"]}, [1, 2], "done", 3, 2.5, True, False])
def test_a_success_carries_its_result(value: Any) -> None:
    got = parse_line(line(action="result", task_id="t", status="success", result=value))
    assert got == Result(task_id="t", success=True, result=value)


def test_a_result_of_null_or_absent_is_none_and_a_failures_is_ignored() -> None:
    for fields in ({}, {"result": None}):
        got = parse_line(line(action="result", task_id="t", status="success", **fields))
        assert got == Result(task_id="t", success=True)
    got = parse_line(line(action="result", task_id="t", status="error", result={"x": 1}))
    assert got == Result(task_id="t", success=False)


def test_a_line_with_a_result_takes_the_long_path() -> None:
    for extra in ({"result": 1}, {"result": None}, {"result": 1, "attempt": 2}):
        doc: dict[str, Any] = {"action": "result", "task_id": "t", "status": "success", **extra}
        assert proto.plain_result(doc) is None


def test_a_results_size_is_its_compact_json_and_too_large_names_both_numbers() -> None:
    assert proto.result_size({"a": [1, 2]}) == len(b'{"a":[1,2]}')
    assert proto.result_size("é") == 4  # UTF-8, with its quotes
    text = proto.result_too_large("job-1", 300_000, 262_144)
    assert text == (
        "task job-1: result of 300000 bytes exceeds the limit of 262144 bytes "
        "(SNERD_RESULT_MAX_BYTES)"
    )
