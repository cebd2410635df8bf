"""The log record codec: checksums, upstream lines, scanning that never hides a line, and the
record rule (every key's type and range, shared with the enqueue)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from snerd.core import protocol as proto
from snerd.core import records
from snerd.core.effects import Location, NewRecord
from snerd.core.records import (
    CorruptRecord,
    decode_line,
    decode_line_at,
    decode_record,
    encode_record,
    merge_base,
    scan,
)

# A real upstream SnerdMQ line (reference §2.2): no checksum, upstream casing.
UPSTREAM = (
    b'{"taskId":"test_timeout_go_001","retryCount":0,"maxRetries":0,"retryAfterHours":0.0,'
    b'"retryAfterTime":"2026-08-17T02:31:53.237260Z","taskData":"{\\"msg\\":\\"go timeout\\"}",'
    b'"taskType":"timeout_task","executeAt":"2026-08-17T02:31:53.237260Z","maxExecutionSeconds":1}'
)


def task(i: int, **extra: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "taskId": f"t{i}",
        "retryCount": 0,
        "maxRetries": 3,
        "retryAfterHours": 0.0,
        "retryAfterTime": "2026-08-17T02:31:53.237260Z",
        "taskData": f'{{"n": {i}, "text": "h\\u00e9llo"}}',
        "taskType": "email",
        "executeAt": "2026-08-17T02:31:53.237260Z",
        "snerdNode": "host@1-ab12",
        "snerdEpoch": 2,
    }
    fields.update(extra)
    return fields


#: When the tombstones below finished.
DONE = "2026-08-17T02:31:54.000000Z"


# -- encode / decode --------------------------------------------------------------------------


def test_encoded_line_shape_and_checksum() -> None:
    fields = task(1)
    line = encode_record(fields)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    body = orjson.dumps(fields)
    # The checksum is inserted before the closing brace and covers everything before it.
    expected = body[:-1] + b',"snerdCrc":"' + xxhash.xxh3_64_hexdigest(body[:-1]).encode() + b'"}\n'
    assert line == expected
    parsed = orjson.loads(line)
    assert list(parsed)[-1] == "snerdCrc"
    assert len(parsed["snerdCrc"]) == 16
    assert decode_record(line[:-1]) == fields


def test_empty_object_round_trips() -> None:
    line = encode_record({})
    assert orjson.loads(line) == {"snerdCrc": xxhash.xxh3_64_hexdigest(b"{")}
    assert decode_line(line[:-1]) == {}
    with pytest.raises(CorruptRecord, match="a task record has no taskId"):
        decode_record(line[:-1])  # a line, but no record


def test_encode_refuses_a_checksum_key() -> None:
    with pytest.raises(ValueError):
        encode_record({"taskId": "a", "snerdCrc": "0" * 16})


def test_encode_refuses_lines_over_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(records, "LINE_LIMIT", 100)
    encode_record({"taskData": "x" * 10})
    with pytest.raises(ValueError, match="LINE_LIMIT"):
        encode_record({"taskData": "x" * 100})


def test_upstream_lines_without_checksum_are_accepted() -> None:
    fields = decode_record(UPSTREAM)
    assert fields["taskId"] == "test_timeout_go_001"
    assert fields["maxExecutionSeconds"] == 1
    assert "snerdCrc" not in fields
    # An upstream tombstone with the nested error object and raw UTF-8.
    tomb = (
        '{"taskId":"x","taskData":"é","LastJobError":{"error":"boom","retry_worthy":true},'
        '"deletedAt":"2026-08-17T02:31:53.237260Z"}'
    ).encode()
    assert decode_record(tomb)["LastJobError"] == {"error": "boom", "retry_worthy": True}


def test_upstream_record_ending_like_a_checksum_is_not_mistaken() -> None:
    # An 8-letter key with a 16-character value last: an upstream line, not a damaged snerd one.
    line = b'{"taskId":"a","taskData":"","taskType":"0123456789abcdef"}'
    assert decode_record(line) == {"taskId": "a", "taskData": "", "taskType": "0123456789abcdef"}


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"not json", "not JSON"),
        (b'{"taskId": "a"', "not JSON"),
        (b"[1, 2]", "not an object"),
        (b'"text"', "not an object"),
        (b'{"taskId":"\xff\xfe"}', "not JSON"),  # invalid UTF-8
        (b"", "not JSON"),
    ],
)
def test_decode_rejects_bad_lines(line: bytes, reason: str) -> None:
    with pytest.raises(CorruptRecord) as info:
        decode_record(line)
    assert reason in info.value.reason


def test_decode_rejects_a_bad_checksum() -> None:
    line = bytearray(encode_record(task(1))[:-1])
    line[12] ^= 0x01  # inside "t1"'s neighbourhood: the body, still valid JSON
    with pytest.raises(CorruptRecord, match="checksum"):
        decode_record(bytes(line))


def test_decode_rejects_a_damaged_checksum_key() -> None:
    line = encode_record(task(1))[:-1]
    damaged = line.replace(b'"snerdCrc"', b'"snerdCrC"')
    # Without care this would parse as an upstream line with an extra key.
    with pytest.raises(CorruptRecord):
        decode_record(damaged)


# -- properties ---------------------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=20,
)
record_fields = st.dictionaries(
    st.text().filter(lambda k: k != "snerdCrc"), json_values, max_size=8
)


@given(record_fields)
def test_any_json_object_round_trips(fields: dict[str, Any]) -> None:
    line = encode_record(fields)
    assert line.endswith(b"\n") and b"\n" not in line[:-1]
    assert decode_line(line[:-1]) == fields


def test_every_single_byte_flip_of_a_task_record_is_detected() -> None:
    # Exhaustive over one realistic line: every position, every non-zero XOR mask.
    line = encode_record(task(7, LastJobError={"error": "boom", "retry_worthy": True}))[:-1]
    for pos in range(len(line)):
        for mask in range(1, 256):
            flipped = bytearray(line)
            flipped[pos] ^= mask
            with pytest.raises(CorruptRecord):
                decode_record(bytes(flipped))


@settings(max_examples=150)
@given(record_fields, st.data())
def test_any_single_flipped_byte_is_detected(fields: dict[str, Any], data: st.DataObject) -> None:
    line = encode_record(fields)[:-1]
    pos = data.draw(st.integers(min_value=0, max_value=len(line) - 1), label="pos")
    mask = data.draw(st.integers(min_value=1, max_value=255), label="mask")
    flipped = bytearray(line)
    flipped[pos] ^= mask
    try:
        decoded = decode_line(bytes(flipped))
    except CorruptRecord:
        return
    # Not detected: then the flip must not have changed the meaning (e.g. the separator comma
    # is not needed to find the tail). Today every flip is detected; keep the law general.
    assert decoded == fields


@settings(max_examples=300)
@given(st.data())
def test_scan_never_hides_lines_after_a_damaged_one(data: st.DataObject) -> None:
    lines = [encode_record(task(i)) for i in range(3)]
    middle = bytearray(lines[1])
    pos = data.draw(st.integers(min_value=0, max_value=len(middle) - 1), label="pos")
    mask = data.draw(st.integers(min_value=1, max_value=255), label="mask")
    middle[pos] ^= mask
    buf = lines[0] + bytes(middle) + lines[2]
    result = scan(buf, base_offset=1000)
    by_id = {r.fields["taskId"]: r for r in result.records}
    first, last = by_id["t0"], by_id["t2"]
    assert (first.offset, first.length, first.fields) == (1000, len(lines[0]), task(0))
    assert last.fields == task(2)
    assert last.offset == 1000 + len(buf) - len(lines[2]) and last.length == len(lines[2])
    # The damaged line is either reported or (if the flip changed nothing) read as it was.
    if "t1" in by_id:
        assert by_id["t1"].fields == task(1)
    else:
        assert result.corrupt
    assert set(by_id) <= {"t0", "t1", "t2"}
    assert result.end == 1000 + len(buf)


# -- scan ----------------------------------------------------------------------------------------


def test_scan_offsets_blank_lines_and_torn_tail() -> None:
    a, b = encode_record(task(1)), encode_record(task(2))
    torn = encode_record(task(3))[:40]
    buf = a + b"\n  \n" + b + torn
    result = scan(buf, base_offset=10)
    assert [(r.offset, r.length) for r in result.records] == [
        (10, len(a)),
        (10 + len(a) + 4, len(b)),
    ]
    assert [r.fields["taskId"] for r in result.records] == ["t1", "t2"]
    assert result.corrupt == []
    # The fragment without a newline is not a record; `end` is where it starts.
    assert result.end == 10 + len(buf) - len(torn)


def test_scan_reports_corrupt_lines_and_goes_on() -> None:
    good1, good2 = encode_record(task(1)), encode_record(task(2))
    bad_utf8 = b'{"taskId":"x","taskData":"\xc3"}\n'  # a torn multi-byte character (bug 6.1.2)
    garbage = b"\x00\x00\x00\n"
    buf = good1 + bad_utf8 + garbage + good2
    result = scan(buf)
    assert [r.fields["taskId"] for r in result.records] == ["t1", "t2"]
    assert [off for off, _ in result.corrupt] == [len(good1), len(good1) + len(bad_utf8)]
    assert all(reason for _, reason in result.corrupt)
    assert result.end == len(buf)


def test_scan_salvages_a_record_glued_onto_a_torn_one() -> None:
    # Upstream bug 6.1.1: a crash left a partial record, and the next append was glued to it.
    partial = UPSTREAM[:50]
    whole = UPSTREAM.replace(b"test_timeout_go_001", b"second")
    buf = partial + whole + b"\n"
    result = scan(buf)
    assert result.corrupt == [(0, result.corrupt[0][1])]
    assert len(result.records) == 1
    rec = result.records[0]
    assert rec.fields["taskId"] == "second"
    assert (rec.offset, rec.length) == (len(partial), len(whole) + 1)
    assert buf[rec.offset : rec.offset + rec.length] == whole + b"\n"


def test_scan_of_nothing() -> None:
    assert scan(b"") == ([], [], 0)
    assert scan(b"partial", base_offset=5) == ([], [], 5)


# -- the last line of a file ---------------------------------------------------------------------


def test_a_last_line_that_lost_only_its_newline_holds_its_record() -> None:
    line = encode_record(task(1))
    tail = records.scan_tail(line[:-1], offset=100)
    assert [r.fields for r in tail.records] == [task(1)] and tail.corrupt == []
    # Located as it will be once its newline is written back; `end` is where the bytes end.
    assert (tail.records[0].offset, tail.records[0].length) == (100, len(line))
    assert tail.end == 100 + len(line) - 1
    assert records.scan_tail(UPSTREAM).records[0].fields["taskId"] == "test_timeout_go_001"
    assert scan(line + line[:-1], at_eof=True).records[1].fields == task(1)


@pytest.mark.parametrize(
    "fragment, reason",
    [
        (encode_record(task(1))[:-2], "not JSON"),  # the closing brace went too
        (encode_record(task(1))[:40], "not JSON"),
        (encode_record(task(1))[:-1].replace(b"t1", b"t2"), "checksum mismatch"),
        (b"   \r", None),  # blank: nothing to report, nothing kept
        (b"\0" * 30, "not JSON"),  # blocks never written (a power loss)
    ],
)
def test_a_last_line_holding_no_record_is_a_torn_write(fragment: bytes, reason: str | None) -> None:
    tail = records.scan_tail(fragment, offset=7)
    assert tail.records == [] and tail.end == 7
    if reason is None:
        assert tail.corrupt == []
    else:
        assert reason in tail.corrupt[0][1]
    assert scan(b"x\n" + fragment, at_eof=True).end == 2  # left unconsumed, to be cut


def test_a_last_line_longer_than_any_record_is_not_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(records, "LINE_LIMIT", 64)
    tail = records.scan_tail(b"{" + b" " * 100 + b"}")
    assert tail.records == [] and "longer than" in tail.corrupt[0][1]


#: Valid task records with keys nobody gives a meaning to (the rule allows them; each starts
#: with an "x", as no key snerd or upstream gives a meaning to does).
flat_fields = st.dictionaries(st.text().map(lambda k: "x" + k), json_scalars, max_size=8).map(
    lambda f: {**task(0), **f}
)


@given(flat_fields, st.data())
def test_no_strict_prefix_of_a_record_is_taken_for_one(
    fields: dict[str, Any], data: st.DataObject
) -> None:
    # A record is kept only whole: its checksum covers every byte before it, and no strict
    # prefix of a JSON object is one. (Flat records: a nested object keyed "taskId" could be
    # salvaged from a corrupt line, as from any line, `scan`.)
    line = encode_record(fields)[:-1]
    cut = data.draw(st.integers(min_value=0, max_value=len(line) - 1))
    assert records.scan_tail(line[:cut]).records == []
    assert [r.fields for r in records.scan_tail(line).records] == [fields]


@given(st.lists(flat_fields, min_size=1, max_size=5), st.data())
def test_restoring_the_newline_or_not_reads_the_same_records(
    fields: list[dict[str, Any]], data: st.DataObject
) -> None:
    # What `scan(at_eof=True)` reads from a file is what `scan` reads once the owner wrote the
    # newline back (`snerd.io.log.repair_tail`), or cut the line (when it holds no record).
    lines = [encode_record(f) for f in fields]
    buf = b"".join(lines)
    cut = data.draw(st.integers(min_value=len(buf) - len(lines[-1]), max_value=len(buf) - 1))
    torn = buf[:cut]
    read = scan(torn, at_eof=True)
    tail = records.scan_tail(torn[len(buf) - len(lines[-1]) :], offset=len(buf) - len(lines[-1]))
    repaired = torn + b"\n" if tail.records else buf[: len(buf) - len(lines[-1])]
    assert read.records == scan(repaired).records
    assert len(read.records) == len(fields) - (0 if cut == len(buf) - 1 else 1)


# -- the record rule ------------------------------------------------------------------------------


def _nested(depth: int) -> Any:
    """Arrays nested `depth` levels (`[]` is one)."""
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


NOW = "2026-08-17T02:31:53.237260Z"
#: One valid record of every kind, in the shapes the daemon and upstream write.
VALID = [
    task(1),  # an enqueue
    task(
        1,
        retryCount=1,
        LastErrorObj="SMTP 451",
        LastJobError={"error": "SMTP 451", "retry_worthy": True},
    ),
    task(
        2,
        rateLimitGroup="billing",
        maxPerMinute=30,
        autoDedupe=True,
        urgencyScore=0.9,
        payloadHash="bd899dc4be742db0",
        pool="slow",
        triggerAfterIds=["parent-1"],
        cronExpression="0 0 9 * * 1-5",
        webhookUrl="https://hooks.example.com/snerd?k=1",
        maxExecutionSeconds=120,
        snerdSeq=2,
        snerdVia="host-b@1-cd34",
        snerdReplayedAt=NOW,
    ),
    task(3, deletedAt=NOW, snerdOutcome="completed"),
    # A dead letter whose base record could not be read back: no payload, and none needed.
    {
        "taskId": "t4",
        "taskType": "email",
        "retryCount": 1,
        "maxRetries": 0,
        "deletedAt": NOW,
        "snerdOutcome": "dead_letter",
        "LastErrorObj": "x",
        "snerdNode": "n",
        "snerdEpoch": 2,
    },
    {
        "snerdKind": "dispatch",
        "task": "t1",
        "attempt": 1,
        "at": NOW,
        "group": "billing",
        "snerdNode": "n",
        "snerdEpoch": 1,
    },
    {"snerdKind": "claim", "epoch": 1, "node": "n", "at": NOW, "snerdNode": "n", "snerdEpoch": 1},
    {
        "snerdKind": "inbox",
        "node": "host-b@1-cd34",
        "offset": 1734,
        "snerdNode": "n",
        "snerdEpoch": 1,
    },
    {"snerdKind": "newer", "anything": {"it": ["likes"]}, "snerdEpoch": 1},  # skipped by readers
    # `null` is an absent key; an empty group, pool, cron or webhook URL is none, as on the wire.
    task(5, rateLimitGroup=None, maxPerMinute=None, urgencyScore=None, LastErrorObj=None),
    task(6, rateLimitGroup="", pool="", cronExpression="", webhookUrl=""),
    task(7, cronExpression="0 */5 * * * * *"),  # upstream's 7-field form
    task(8, retryAfterTime="2026-08-17T04:31:53+02:00", executeAt="2016-12-31T23:59:60Z"),
    task(9, extra=_nested(127)),  # the record's own object is level 1
    # A completed tombstone with its result: any JSON value, as it was stored.
    task(10, deletedAt=DONE, snerdOutcome="completed", snerdResult={"n": [1, 2.5, None, "x"]}),
    task(11, deletedAt=DONE, snerdOutcome="completed", snerdResult=_nested(127)),
    task(12, deletedAt=DONE, snerdOutcome="completed", snerdResult=False),
]


@pytest.mark.parametrize("fields", VALID, ids=lambda f: f.get("snerdKind") or f.get("taskId"))
def test_every_kind_of_record_the_daemon_and_upstream_write_passes(fields: dict[str, Any]) -> None:
    assert decode_record(encode_record(fields)[:-1]) == fields
    assert records.task_problem(fields) is None
    assert decode_record(UPSTREAM)["taskId"] == "test_timeout_go_001"
    assert records.task_problem(decode_record(UPSTREAM)) is None


#: (a record, why its line is corrupt): what makes a record one is broken. Every reason names
#: the record (its task id when it has one) and the key.
CORRUPT: list[tuple[dict[str, Any], str]] = [
    (task(1, taskId=7), "a task record has taskId 7, not a string"),
    ({**task(1), "taskId": None}, "a task record has no taskId"),
    ({k: v for k, v in task(1).items() if k != "taskId"}, "a task record has no taskId"),
    (task(1, taskId=""), "a task record: taskId must not be empty"),
    (task(1, taskId="x" * 1025), "'s record: taskId is 1025 bytes; the limit is 1024"),
    (task(1, taskType=["email"]), "task t1's record has taskType an array, not a string"),
    (task(1, deletedAt=1), "task t1's record has deletedAt 1, not a string"),
    (task(1, snerdEpoch=-1), "task t1's record: snerdEpoch must be 0 to 9007199254740991, got -1"),
    (task(1, snerdEpoch="2"), "task t1's record has snerdEpoch '2', not an integer"),
    (task(1, snerdEpoch=True), "task t1's record has snerdEpoch true, not an integer"),
    (task(1, snerdSeq=[]), "task t1's record has snerdSeq an array, not an integer"),
    (task(1, snerdNode=""), "task t1's record: snerdNode must not be empty"),
    (task(1, snerdKind=["dispatch"]), "a record has snerdKind an array, not a string"),
    (task(1, extra=_nested(128)), "task t1's record: extra is nested deeper than 128 levels"),
    (task(1, LastJobError={"a": _nested(200)}), "LastJobError is nested deeper than 128 levels"),
    (task(1, snerdResult=[_nested(128)]), "task t1's record: snerdResult is nested deeper than"),
    (task(1, taskId="a\nb", snerdNode=""), "task 'a\\nb''s record: snerdNode must not be empty"),
    ({"snerdKind": "dispatch", "attempt": 1}, "a dispatch record has no task"),
    ({"snerdKind": "dispatch", "task": "t1"}, "task t1's dispatch record has no attempt"),
    ({"snerdKind": "dispatch", "task": "t1", "attempt": 0}, "attempt must be 1 to 2147483648"),
    ({"snerdKind": "dispatch", "task": 5, "attempt": 1}, "a dispatch record has task 5, not a"),
    ({"snerdKind": "dispatch", "task": "t1", "attempt": 1, "at": "x"}, "invalid at 'x'"),
    ({"snerdKind": "dispatch", "task": "t1", "attempt": 1, "group": 2}, "has group 2, not a"),
    ({"snerdKind": "claim", "node": "n"}, "a claim record has no epoch"),
    ({"snerdKind": "claim", "epoch": -1, "node": "n"}, "a claim record: epoch must be 0 to"),
    ({"snerdKind": "claim", "epoch": 2**53, "node": "n"}, "epoch must be 0 to 9007199254740991"),
    ({"snerdKind": "claim", "epoch": 1, "node": 1}, "a claim record has node 1, not a string"),
    ({"snerdKind": "inbox", "node": "w", "offset": -5}, "an inbox record: offset must be 0 to"),
    ({"snerdKind": "inbox", "node": "", "offset": 5}, "an inbox record: node must not be empty"),
    ({"snerdKind": "inbox", "offset": 5}, "an inbox record has no node"),
    ({"snerdKind": "newer", "snerdEpoch": "1"}, "a newer record has snerdEpoch '1', not an"),
]


@pytest.mark.parametrize(
    ("fields", "reason"), CORRUPT, ids=lambda v: v if isinstance(v, str) else ""
)
def test_a_record_that_is_not_one_is_a_corrupt_line_naming_its_task_and_key(
    fields: dict[str, Any], reason: str
) -> None:
    line = encode_record(fields)
    with pytest.raises(CorruptRecord) as info:
        decode_record(line[:-1])
    assert reason in info.value.reason
    assert "\n" not in info.value.reason  # one line on stderr
    assert len(info.value.reason) < 400  # a bad value is shown cut short
    # In a log it is reported where it is, and hides nothing around it.
    good = encode_record(task(9))
    result = scan(good + line + good, base_offset=100)
    assert [r.fields["taskId"] for r in result.records] == ["t9", "t9"]
    assert result.corrupt == [(100 + len(good), info.value.reason)]


#: (a task record, why its task cannot run): a record, but one no enqueue would have taken.
UNRUNNABLE: list[tuple[dict[str, Any], str]] = [
    (
        task(1, maxExecutionSeconds="abc"),
        "task t1's record has maxExecutionSeconds 'abc', not an integer",
    ),
    (task(1, taskType=""), "task t1's record: taskType must not be empty"),
    (task(1, taskType="t" * 257), "task t1's record: taskType is 257 bytes; the limit is 256"),
    ({k: v for k, v in task(1).items() if k != "taskType"}, "task t1's record has no taskType"),
    (task(1, taskData={"to": "a"}), "task t1's record has taskData an object, not a string"),
    ({k: v for k, v in task(1).items() if k != "taskData"}, "task t1's record has no taskData"),
    (task(1, retryCount=-1), "task t1's record: retryCount must be 0 to 2147483648, got -1"),
    (task(1, retryCount=1.0), "task t1's record has retryCount 1.0, not an integer"),
    (task(1, retryCount=True), "task t1's record has retryCount true, not an integer"),
    (task(1, maxRetries="3"), "task t1's record has maxRetries '3', not an integer"),
    (task(1, maxRetries=-1), "task t1's record: maxRetries must be 0 or more, got -1"),
    (task(1, maxRetries=2**31), "maxRetries 2147483648 is too large (at most 2147483647)"),
    (task(1, maxRetries=2.0**70), "has maxRetries 1.1805916207174113e+21, not an integer"),
    (task(1, retryAfterHours="abc"), "task t1's record has retryAfterHours 'abc', not a number"),
    (task(1, retryAfterHours=-1), "task t1's record: retryAfterHours must be 0 or more, got -1"),
    (task(1, retryAfterHours=1e9), "retryAfterHours 1000000000.0 is more than 100 years"),
    (task(1, retryAfterTime="yesterday"), "task t1's record: invalid retryAfterTime 'yesterday'"),
    (task(1, retryAfterTime=5), "task t1's record has retryAfterTime 5, not a string"),
    (task(1, executeAt="2026-13-01T00:00:00Z"), "invalid executeAt '2026-13-01T00:00:00Z': month"),
    (task(1, executeAt="2026-01-01T00:00:00"), "invalid executeAt '2026-01-01T00:00:00': no UTC"),
    (task(1, executeAt="0000-01-01T00:00:00.000000Z"), "invalid executeAt"),
    (task(1, LastErrorObj={}), "task t1's record has LastErrorObj an object, not a string"),
    (task(1, LastJobError="boom"), "task t1's record has LastJobError 'boom', not an object"),
    (task(1, LastJobError={"error": 5}), "LastJobError has an error that is not a string"),
    (task(1, LastJobError={"retry_worthy": "yes"}), "LastJobError has a retry_worthy that is not"),
    (task(1, rateLimitGroup=5), "task t1's record has rateLimitGroup 5, not a string"),
    (task(1, rateLimitGroup="g" * 257), "rateLimitGroup is 257 bytes; the limit is 256"),
    (task(1, rateLimitGroup="g", maxPerMinute=0), "maxPerMinute must be at least 1, got 0"),
    (task(1, rateLimitGroup="g", maxPerMinute="x"), "has maxPerMinute 'x', not an integer"),
    (task(1, maxPerMinute=10), "maxPerMinute needs a rateLimitGroup to count dispatches in"),
    (task(1, rateLimitGroup="", maxPerMinute=10), "maxPerMinute needs a rateLimitGroup"),
    (task(1, autoDedupe="yes"), "task t1's record has autoDedupe 'yes', not a boolean"),
    (task(1, urgencyScore="high"), "task t1's record has urgencyScore 'high', not a number"),
    (task(1, payloadHash=["x"]), "task t1's record has payloadHash an array, not a string"),
    (task(1, payloadHash="XYZ"), "payloadHash must be 1 to 16 lowercase hex digits"),
    (task(1, pool={"name": "slow"}), "task t1's record has pool an object, not a string"),
    (task(1, pool="p" * 300), "task t1's record: pool is 300 bytes; the limit is 256"),
    (task(1, triggerAfterIds="p1"), "has triggerAfterIds 'p1', not an array of strings"),
    (task(1, triggerAfterIds=["p1", 2]), "has triggerAfterIds an array, not an array of strings"),
    (task(1, triggerAfterIds=["t1"]), "task t1's record: task t1 cannot depend on itself"),
    (task(1, triggerAfterIds=["a", ""]), "triggerAfterIds must not contain an empty id"),
    (task(1, triggerAfterIds=["a", "a"]), "triggerAfterIds must not repeat an id"),
    (task(1, triggerAfterIds=[f"p{i}" for i in range(1025)]), "has 1025 ids; the limit is 1024"),
    (task(1, cronExpression="every day"), "task t1's record: invalid cronExpression 'every day'"),
    (task(1, cronExpression=5), "task t1's record has cronExpression 5, not a string"),
    (task(1, cronExpression="* " * 600), "cronExpression is 1200 characters; the limit is 1024"),
    (task(1, webhookUrl="http://127.0.0.1:99999/x"), "webhookUrl port 99999 is out of range"),
    (task(1, webhookUrl="http://[::1/x"), "task t1's record: webhookUrl has a '[' without its ']'"),
    (task(1, webhookUrl=["http://h/"]), "task t1's record has webhookUrl an array, not a string"),
    (task(1, maxExecutionSeconds=0), "maxExecutionSeconds must be at least 1, got 0"),
    (task(1, maxExecutionSeconds=10**12), "maxExecutionSeconds 1000000000000 is more than 100"),
    (task(1, snerdVia=3), "task t1's record has snerdVia 3, not a string"),
    (task(1, snerdOutcome=1), "task t1's record has snerdOutcome 1, not a string"),
    (task(1, snerdReplayedAt="now"), "task t1's record: invalid snerdReplayedAt 'now'"),
]


@pytest.mark.parametrize(
    ("fields", "reason"), UNRUNNABLE, ids=lambda v: v if isinstance(v, str) else ""
)
def test_a_task_record_no_enqueue_would_take_says_why_its_task_cannot_run(
    fields: dict[str, Any], reason: str
) -> None:
    # The line is a record (readers place it; a daemon dead-letters its task saying why).
    decoded = decode_record(encode_record(fields)[:-1])
    why = records.task_problem(decoded)
    assert why is not None and reason in why
    assert "\n" not in why and len(why) < 400
    # A tombstone only ends its task: what it ran with does not matter any more.
    assert decode_record(encode_record({**fields, "deletedAt": NOW})[:-1])["deletedAt"] == NOW


#: The values the enqueue and the record rule share, as (wire field, record key, bad value).
SHARED = [
    ("task_id", "taskId", "x" * 1025),
    ("task_id", "taskId", ""),
    ("task_type", "taskType", "t" * 257),
    ("task_type", "taskType", ""),
    ("max_retries", "maxRetries", -1),
    ("max_retries", "maxRetries", 2**31),
    ("retry_after_hours", "retryAfterHours", -0.5),
    ("retry_after_hours", "retryAfterHours", 1e9),
    ("rate_limit_group", "rateLimitGroup", "g" * 257),
    ("pool", "pool", "p" * 257),
    ("max_per_minute", "maxPerMinute", 0),
    ("max_per_minute", "maxPerMinute", 2**31),
    ("max_execution_seconds", "maxExecutionSeconds", 0),
    ("max_execution_seconds", "maxExecutionSeconds", 10**12),
    ("execute_at", "executeAt", "2026-02-30T00:00:00Z"),
    ("cron", "cronExpression", "61 * * * *"),
    ("cron", "cronExpression", "x" * 1025),
    ("webhook_url", "webhookUrl", "http://h:abc/x"),
    ("webhook_url", "webhookUrl", "ftp://h/x"),
    ("trigger_after_ids", "triggerAfterIds", ["a", ""]),
    ("trigger_after_ids", "triggerAfterIds", ["a", "x" * 1025]),
    ("trigger_after_ids", "triggerAfterIds", ["t1"]),
]


@pytest.mark.parametrize(("wire", "key", "value"), SHARED)
def test_the_record_rule_is_the_enqueues_rule(wire: str, key: str, value: Any) -> None:
    # One rule (`snerd.core.fields`): a value an enqueue is refused for is refused in a record,
    # for the same reason in the same words, only the name differs.
    doc: dict[str, Any] = {
        "action": "enqueue",
        "task_id": "t1",
        "task_type": "email",
        "task_data": "{}",
        "max_retries": 0,
        "retry_after_hours": 0.0,
        wire: value,
    }
    fields = task(1, **{key: value})
    if wire == "max_per_minute":
        doc["rate_limit_group"] = fields["rateLimitGroup"] = "g"
    with pytest.raises(proto.ProtocolError) as refused:
        proto.parse_line(orjson.dumps(doc))
    detail = refused.value.message.removeprefix("Failed to enqueue: ")
    try:
        why = records.task_problem(decode_record(encode_record(fields)[:-1]))
    except CorruptRecord as corrupt:  # an id is what places a record
        why = corrupt.reason
    assert why is not None
    assert why.endswith("record: " + detail.replace(wire, key, 1))


def test_a_checksum_key_inside_a_line_without_a_checksum_is_refused() -> None:
    # It would parse as an upstream line; a record built on it could not be written back.
    line = orjson.dumps({"snerdCrc": "0" * 16, **task(1)})
    assert decode_line(line)["taskId"] == "t1"
    with pytest.raises(CorruptRecord, match="snerdCrc is not the checksum at the end of the line"):
        decode_record(line)


# --------------------------------------------------------------------------------------------
# A record with a base: the one merge rule every shell calls
# --------------------------------------------------------------------------------------------


def test_merge_base_puts_fields_on_top_and_drops_removed_keys() -> None:
    base = {"taskId": "t1", "taskData": "{}", "status": "queued", "retries": 0, "lease": 5}
    record = NewRecord(
        fields={"status": "retry", "retries": 1},
        base=Location(0, 10, 20),
        remove=("lease", "absent"),
    )
    merged = merge_base(base, record)
    assert merged == {"taskId": "t1", "taskData": "{}", "status": "retry", "retries": 1}
    assert base["status"] == "queued" and "lease" in base  # the base is not changed


def test_merge_base_refuses_a_base_that_is_not_a_task_record() -> None:
    record = NewRecord(fields={"status": "retry"}, base=Location(3, 128, 40))
    with pytest.raises(CorruptRecord, match="record at shard 3 offset 128 has no taskData"):
        merge_base({"taskId": "t1", "status": "queued"}, record)


def test_decode_line_at_wants_one_whole_line() -> None:
    line = encode_record({"taskId": "t1", "taskData": "{}"})
    assert decode_line_at(line, "shard 0:0+9") == {"taskId": "t1", "taskData": "{}"}
    for cut in (line[:-1], line[:1], b""):
        with pytest.raises(CorruptRecord, match="no complete line at shard 0:0"):
            decode_line_at(cut, "shard 0:0+9")
    with pytest.raises(CorruptRecord):
        decode_line_at(line[:-5] + b"\n", "shard 0:0+9")
