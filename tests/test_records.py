"""The log record codec: checksums, upstream lines, and scanning that never hides a line."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from snerd.core import records
from snerd.core.records import CorruptRecord, decode_record, encode_record, scan

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
    assert decode_record(line[:-1]) == {}


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
    line = b'{"taskId":"a","taskType":"0123456789abcdef"}'
    assert decode_record(line) == {"taskId": "a", "taskType": "0123456789abcdef"}


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
    assert decode_record(line[:-1]) == fields


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
        decoded = decode_record(bytes(flipped))
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


flat_fields = st.dictionaries(
    st.text().filter(lambda k: k != "snerdCrc"), json_scalars, max_size=8
).map(lambda f: {"taskId": "t", **f})


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
