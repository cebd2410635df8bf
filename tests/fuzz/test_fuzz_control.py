"""Fuzz of job-control lines (`cancel`, `retry`, `pause`, `resume`, `get`, `purge`, and `retry`
of a type): any object with one of
their actions either parses into its command or is refused with an `Invalid JSON:` error
naming the field, and a node fed any of them answers each with exactly one message and keeps
running; and `command` records in an inbox, whatever they hold, never stop an ingest."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snerd.core import control
from snerd.core import protocol as proto
from snerd.core.node import NodeConfig
from tests.support.fakeshell import FakeShell

ACTIONS = ("cancel", "retry", "pause", "resume", "get", "purge")
scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)
docs = st.fixed_dictionaries(
    {"action": st.sampled_from(ACTIONS)},
    optional={
        "task_id": values | st.text(min_size=1, max_size=20),
        "task_type": values | st.sampled_from(["t", "u"]),
        "queue": values,
        "before": values | st.sampled_from(["2026-01-01T00:00:00Z", "1969-12-31T00:00:00Z"]),
    },
)


@given(docs)
@settings(max_examples=400, deadline=None)
def test_a_control_line_parses_or_is_refused_by_name(doc: dict[str, Any]) -> None:
    try:
        cmd = proto.parse_document(doc)
    except proto.ProtocolError as exc:
        assert exc.message.startswith("Invalid JSON: ")
        return
    if isinstance(cmd, proto.Sweep):
        assert doc["action"] in ("purge", "retry") and cmd.purge is (doc["action"] == "purge")
        assert (cmd.task_type is None) == (doc.get("queue") is True)
        assert (cmd.before_us is None) == (doc.get("before") in (None, ""))
        assert cmd.before_us is None or cmd.before_us >= 0
    elif doc["action"] in ("cancel", "retry", "get"):
        assert isinstance(cmd, proto.Cancel | proto.Requeue | proto.GetTask)
        assert cmd.task_id == doc["task_id"]
    else:
        assert isinstance(cmd, proto.Pause)
        assert cmd.paused is (doc["action"] == "pause")
        assert (cmd.task_type is None) == (doc.get("queue") is True)


@given(st.lists(docs, min_size=1, max_size=6))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_node_answers_every_control_line_once_and_keeps_running(
    lines: list[dict[str, Any]],
) -> None:
    sh = FakeShell(NodeConfig(node_id="n@pid-1-x"))
    sh.start()
    sh.register("t")
    sh.enqueue("t1")
    before = len(sh.sent)
    for doc in lines:
        sh.line(orjson.dumps(doc))
    sh.advance(0.5)
    answers = ("error", "cancelled", "retried", "paused", "task", "purged", "requeued")
    replies = [m for m in sh.sent[before:] if m["action"] in answers]
    assert len(replies) == len(lines)
    sh.enqueue("after")
    assert sh.messages("ack")[-1]["task_id"] == "after"


command_records = st.fixed_dictionaries(
    {"snerdKind": st.just("command")},
    optional={
        "action": values | st.sampled_from((*ACTIONS, "retry_dead")),
        "task": values | st.just("t1"),
        "type": values | st.just("t"),
        "stamp": values | st.tuples(st.integers(0, 2**62), st.text(max_size=5)).map(list),
        "before": values | st.integers(0, 2**53),
    },
)


@given(command_records)
@settings(max_examples=300, deadline=None)
def test_a_command_record_is_read_or_named_as_unreadable(fields: dict[str, Any]) -> None:
    parsed = control.command_of(fields)
    if isinstance(parsed, str):
        assert parsed
    else:
        cmd, stamp = parsed
        assert isinstance(cmd, proto.Cancel | proto.Requeue | proto.Pause | proto.Sweep)
        assert (stamp is not None) == isinstance(cmd, proto.Pause)
        if isinstance(cmd, proto.Sweep):  # (what it carries goes back into a record as it is)
            assert control.command_of(control.command_fields(cmd, (0, ""))) == (cmd, None)
