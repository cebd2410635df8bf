"""Fuzzing a task's story (`snerd.core.story`): whatever records a reader found, `story` and
`details` never raise, and `details` is JSON with every documented key; `pick_story` never
raises on any bytes and keeps exactly the records that are the id's.

Records are of every kind the queue's files hold about a task (enqueue, retry, tombstones of
each outcome, a replay, a dispatch, a claim, an inbox mark with drops and answers, a command),
each with one key replaced by any JSON value or removed, mixed with arbitrary JSON objects, in
any order, on any shard and file. Example counts come from the hypothesis profile
(tests/conftest.py): `make fuzz` runs them long.
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from snerd.core.records import CorruptRecord, decode_record, encode_record
from snerd.core.story import DETAIL_KEYS, LOG, STATES, STEP_KINDS, Found, details, pick_story, story

TS = "2027-01-15T08:00:00Z"
NOW = 1_800_000_000_000_000


def _task(**extra: Any) -> dict[str, Any]:
    return {
        "taskId": "m", "retryCount": 0, "maxRetries": 1, "retryAfterHours": 0.0,
        "retryAfterTime": TS, "taskData": "{}", "taskType": "t", "executeAt": TS,
        "snerdNode": "w@pid-1-aa", "snerdEpoch": 1, **extra,
    }


SHAPES: list[dict[str, Any]] = [
    _task(),
    _task(retryCount=1, LastErrorObj="boom", retryAfterTime="2027-01-15T09:00:00Z"),
    _task(deletedAt=TS, snerdOutcome="completed", snerdResult={"n": 1}),
    _task(deletedAt=TS, snerdOutcome="dead_letter", LastErrorObj="no"),
    _task(deletedAt=TS, snerdOutcome="cancelled"),
    _task(deletedAt=TS),
    _task(snerdReplayedAt=TS),
    _task(snerdVia="w2", cronExpression="0 * * * * *", triggerAfterIds=["p"]),
    {"snerdKind": "dispatch", "task": "m", "attempt": 1, "at": TS, "snerdEpoch": 1},
    {"snerdKind": "claim", "epoch": 2, "node": "n2", "at": TS},
    {
        "snerdKind": "inbox", "node": "w2", "offset": 10, "from": 0,
        "dropped": [{"task": "m", "at": 0, "error": "bad"}, {"task": "m", "at": 5, "of": "x"}],
        "answers": [{"at": TS, "task": "m", "found": "queued"}],
    },
    {"snerdKind": "command", "action": "cancel", "task": "m", "at": TS},
]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
    | st.sampled_from(["m", TS, "completed", "dead_letter", "cancelled", "log", "w2"]),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def mutated(draw: st.DrawFn) -> dict[str, Any]:
    shape = dict(draw(st.sampled_from(SHAPES)))
    keys = sorted({*shape, "taskId", "snerdKind", "snerdEpoch", "deletedAt", "attempt", "task"})
    key = draw(st.sampled_from(keys))
    if draw(st.booleans()):
        shape.pop(key, None)
    else:
        shape[key] = draw(json_values)
    return shape


records = mutated() | st.dictionaries(
    st.sampled_from(["taskId", "snerdKind", "task", "deletedAt", "snerdEpoch", "dropped", "x"]),
    json_values,
    max_size=6,
)
found_lists = st.lists(
    st.builds(
        Found,
        shard=st.integers(0, 3),
        source=st.sampled_from([LOG, LOG, "w2", "w3"]),
        offset=st.integers(0, 10_000),
        fields=records,
    ),
    max_size=12,
)


@given(found_lists)
def test_story_and_details_never_raise(found: list[Found]) -> None:
    steps = story(found)
    assert all(s.kind in STEP_KINDS for s in steps)
    orjson.dumps([s.to_json() for s in steps])
    d = details("m", found, NOW)
    assert set(d) == set(DETAIL_KEYS) and d["state"] in STATES
    assert d["task_id"] == "m" and isinstance(d["found"], bool)
    orjson.dumps(d)


@given(st.binary(max_size=400), st.text(max_size=8))
def test_pick_story_never_raises_on_any_bytes(data: bytes, task_id: str) -> None:
    records, consumed = pick_story(data, 7, task_id)
    assert 0 <= consumed <= len(data)
    assert all(7 <= r.offset < 7 + len(data) for r in records)


@given(st.lists(mutated(), max_size=8))
def test_pick_story_keeps_exactly_the_ids_records(shapes: list[dict[str, Any]]) -> None:
    lines: list[bytes] = []
    for f in shapes:
        try:
            lines.append(encode_record(f))
        except (TypeError, ValueError, orjson.JSONEncodeError):
            continue  # a value no writer can encode
    data = b"".join(lines)
    records, consumed = pick_story(data, 0, "m")
    assert consumed == len(data)
    starts: dict[int, dict[str, Any]] = {}
    for i, line in enumerate(lines):
        try:  # a record the record rule refuses is a corrupt line to every reader
            starts[sum(len(x) for x in lines[:i])] = decode_record(line[:-1])
        except CorruptRecord:
            continue
    for r in records:
        assert r.offset in starts
    kept = {r.offset for r in records}
    for offset, fields in starts.items():
        plain = fields.get("snerdKind") is None and fields.get("taskId") == "m"
        dispatch = fields.get("snerdKind") == "dispatch" and fields.get("task") == "m"
        claim = fields.get("snerdKind") == "claim"
        if plain or dispatch or claim:
            assert offset in kept, fields
