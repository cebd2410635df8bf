"""Fuzzing the record rule: valid records with one key replaced by any JSON value (or removed).

A strategy takes a record of every kind the daemon and upstream write (an enqueue, one with
every option, a retry, the tombstones, a dispatch, a claim, an inbox record, a kind a newer
snerd adds, an upstream line) and replaces one key — a key it has, one a record may have, or
any other — by an arbitrary JSON value: any type, extreme numbers, long and odd strings,
nesting up to what a line can hold.

- The rule (`snerd.core.records`): decoding the line, with its checksum or as an upstream line
  without one, gives the record or the documented corrupt-record outcome (`CorruptRecord`, a
  reason naming the record and the key, on one line), never another exception; a record it
  takes, `task_problem` judges without raising; a scan of a log holding such lines reports
  each corrupt one and reads every other.
- The core (`snerd.core.node` through `tests.support.fakeshell`): a node loading a log of
  valid tasks followed by such records raises nothing, whatever it is fed; it runs every valid
  task to its end, and a record it cannot use is a corrupt line or a dead letter, said on its
  log; a second node taking the shard over after that raises nothing either.

Example counts come from the hypothesis profile (tests/conftest.py): `make fuzz` runs them long.
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import assume, given
from hypothesis import strategies as st

from snerd.core.fields import MAX_NESTING
from snerd.core.node import NodeConfig
from snerd.core.records import CorruptRecord, decode_record, encode_record, scan, task_problem
from snerd.core.timefmt import format_rfc3339
from tests.support.fakeshell import SECOND, T0, FakeShell

PAST = format_rfc3339(T0 - 3600 * SECOND)


def _task(task_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "taskId": task_id,
        "retryCount": 0,
        "maxRetries": 1,
        "retryAfterHours": 0.0,
        "retryAfterTime": PAST,
        "taskData": orjson.dumps({"id": task_id}).decode(),
        "taskType": "t",
        "executeAt": PAST,
        "snerdNode": "writer@pid-1-aa",
        "snerdEpoch": 1,
        **extra,
    }


#: One record of every kind, as written (the mutated ones are tasks "m", or about task "m").
SHAPES: list[dict[str, Any]] = [
    _task("m"),
    _task(
        "m",
        rateLimitGroup="g",
        maxPerMinute=600,
        autoDedupe=True,
        urgencyScore=0.5,
        payloadHash="bd899dc4be742db0",
        pool="default",
        triggerAfterIds=["p"],
        cronExpression="0 0 * * * *",
        webhookUrl="https://hooks.example.com/x",
        maxExecutionSeconds=30,
        snerdSeq=7,
        snerdVia="other@pid-2-bb",
    ),
    _task("m", retryCount=1, LastErrorObj="x", LastJobError={"error": "x", "retry_worthy": True}),
    _task("m", deletedAt=PAST, snerdOutcome="completed"),
    _task("m", deletedAt=PAST, snerdOutcome="dead_letter", LastErrorObj="boom"),
    {"snerdKind": "dispatch", "task": "m", "attempt": 1, "at": PAST, "group": "g", "snerdEpoch": 1},
    {"snerdKind": "claim", "epoch": 1, "node": "old@pid-3-cc", "at": PAST, "snerdEpoch": 1},
    {"snerdKind": "inbox", "node": "other@pid-2-bb", "offset": 100, "snerdEpoch": 1},
    {"snerdKind": "newer", "what": [1, {"a": None}], "snerdEpoch": 1},
    {k: v for k, v in _task("m").items() if not k.startswith("snerd")},  # upstream's shape
]
#: Every key some reader gives a meaning to.
KEYS = sorted(
    {key for shape in SHAPES for key in shape}
    | {"deletedAt", "snerdReplayedAt", "snerdOutcome", "snerdKind", "snerdCrc"}
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.sampled_from([0, 1, -1, 2**31 - 1, 2**31, 2**53 - 1, 2**53, 2**63 - 1]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, -0.0, 0.5, 1e300, -1e300, 5e-324]),
    st.text(max_size=30),
    st.sampled_from(
        [
            "",
            "abc",
            "m",
            "p",
            "t",
            "g",
            PAST,
            "2026-13-01T00:00:00Z",
            "9999-12-31T23:59:59.999999Z",
            "0 */5 * * * * *",
            "every day",
            "http://127.0.0.1:99999/x",
            "http://[::1/x",
            "https://example.com/",
            "x" * 2000,
            "é" * 300,
            "\u202e\n\x00",
            "completed",
            "dead_letter",
        ]
    ),
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


values = json_values | st.integers(MAX_NESTING - 3, 250).map(_nested)


@st.composite
def mutated(draw: st.DrawFn) -> dict[str, Any]:
    """A valid record with one key replaced by any JSON value, or removed."""
    record = dict(draw(st.sampled_from(SHAPES)))
    key = draw(st.sampled_from(sorted(record)) | st.sampled_from(KEYS) | st.text(max_size=10))
    if draw(st.integers(0, 9)) == 0:
        record.pop(key, None)
    else:
        record[key] = draw(values)
    return record


def _line(record: dict[str, Any], checksummed: bool) -> bytes | None:
    """The record's line (newline excluded), or None when no writer could write it."""
    try:
        if checksummed:
            return encode_record(record)[:-1]
        return orjson.dumps(record)
    except (TypeError, ValueError):  # a key snerdCrc, or deeper than orjson writes
        return None


@given(mutated(), st.booleans())
def test_decoding_a_mutated_record_gives_the_record_or_a_corrupt_line(
    record: dict[str, Any], checksummed: bool
) -> None:
    line = _line(record, checksummed)
    assume(line is not None)
    assert line is not None
    try:
        decoded = decode_record(line)
    except CorruptRecord as corrupt:
        assert corrupt.reason and "\n" not in corrupt.reason and len(corrupt.reason) < 1000
        return
    assert decoded == {k: v for k, v in record.items()}
    why = task_problem(decoded)
    assert why is None or ("\n" not in why and len(why) < 1000)
    # A record taken is one the daemon can build on and write back.
    encode_record({**decoded, "retryCount": 1})


@given(st.lists(mutated(), min_size=1, max_size=6))
def test_a_scan_of_mutated_records_reports_each_corrupt_line_and_reads_the_rest(
    mutations: list[dict[str, Any]],
) -> None:
    lines = [line for m in mutations if (line := _line(m, True)) is not None]
    good = encode_record(_task("good"))
    data = good + b"".join(line + b"\n" + good for line in lines)
    result = scan(data)
    assert len(result.records) + len(result.corrupt) == 2 * len(lines) + 1
    assert [r.fields.get("taskId") for r in result.records].count("good") == len(lines) + 1
    assert result.end == len(data)


GOOD = [f"good-{i}" for i in range(4)]


def _settle(shell: FakeShell) -> set[str]:
    """Run whatever the node dispatches to success, a few times over; the ids it ran."""
    ran: set[str] = set()
    for _ in range(4):
        shell.advance(1)
        while shell.executed:
            task_id = shell.executed.pop(0).task_id
            ran.add(task_id)
            shell.result(task_id)
    return ran


@given(st.lists(mutated(), min_size=1, max_size=5))
def test_a_node_replaying_mutated_records_raises_nothing_and_runs_every_valid_task(
    mutations: list[dict[str, Any]],
) -> None:
    lines = [line for m in mutations if (line := _line(m, True)) is not None]
    text = b"".join(lines)
    assume(all(g.encode() not in text for g in GOOD))  # the mutations are about task "m" only
    data = b"".join(encode_record(_task(g)) for g in GOOD) + b"".join(x + b"\n" for x in lines)
    corrupt_before = {offset for offset, _ in scan(data).corrupt}
    shell = FakeShell(NodeConfig(node_id="n@pid-1-aa"))
    shell.disk["logs"][0] = bytearray(data)
    shell.start()
    shell.register("t")
    shell.enqueue("new")
    assert set(GOOD) | {"new"} <= _settle(shell)
    assert not (set(GOOD) | {"new"}) & set(shell.node.tasks)  # each ran to its end
    assert shell.exit_code is None
    # What the node could not use it said, on one line each.
    assert all("\n" not in message for _, message in shell.logs_out)
    # Whatever it read, every record it wrote after it is one the rule takes (counting on from
    # a huge epoch or sequence number included).
    assert {offset for offset, _ in scan(bytes(shell.disk["logs"][0])).corrupt} <= corrupt_before
    # The next owner reads the log as it is now, and raises nothing either.
    again = FakeShell(NodeConfig(node_id="n@pid-1-aa"), disk=shell.disk)
    again.start()
    again.register("t")
    _settle(again)
    assert not (set(GOOD) | {"new"}) & set(again.node.tasks)
