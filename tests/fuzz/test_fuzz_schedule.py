"""Fuzz `schedule` and `unschedule` lines (hypothesis) against the core: every line gets one
answer, `scheduled` or an error naming the schedule and what is wrong; the node keeps its
invariants through the declarations and the ticks that follow, and what it writes reads back
as the schedules it answered for."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snerd.core import protocol as proto
from snerd.core.node import NodeConfig
from snerd.core.records import scan
from snerd.core.shardlog import ShardFold
from tests.support.fakeshell import FakeShell

pytestmark = pytest.mark.timeout(0 if settings().max_examples > 1000 else 300)

names = st.sampled_from(["nightly", "a", "x" * 900, "x" * 901, "", "ü@b", 7, None])
crons = st.sampled_from(["*/5 * * * * *", "0 9 * * 1-5", "@daily", "61 * * * *", "", 3, None])
zones = st.sampled_from(["Europe/Paris", "UTC", "Asia/Tokyo", "Mars/Base", "../etc", "", 1, None])
scalars = st.none() | st.booleans() | st.integers(-5, 2000) | st.text(max_size=8)
fields: dict[str, st.SearchStrategy[Any]] = {
    "task_type": st.sampled_from(["t", "", 5]) | st.none(),
    "task_data": st.sampled_from(["{}", '{"a":1}', "not json"]) | st.integers(-(2**63), 2**63 - 1),
    "max_retries": st.integers(-1, 3) | st.none() | st.text(max_size=2),
    "retry_after_hours": st.sampled_from([0, 0.5, -1, "x"]) | st.none(),
    "timezone": zones,
    "misfire": st.sampled_from(["skip", "once", "catch_up", "often"]) | scalars,
    "catch_up": st.integers(-1, 1001) | scalars,
    "overlap": st.sampled_from(["allow", "skip", "wait", "never"]) | scalars,
    "execute_at": st.sampled_from(["2027-01-01T00:00:00Z"]) | st.none(),
    "trigger_after_ids": st.sampled_from([["p"], []]) | st.none(),
    "pool": st.sampled_from(["p", ""]) | st.none(),
    "unique_key": st.sampled_from(["k", ""]) | st.none(),
}


valid = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["nightly", "a", "ü@b"]),
        "cron": st.sampled_from(["*/5 * * * * *", "*/7 * * * * *", "@daily"]),
        "task_type": st.just("t"),
        "task_data": st.sampled_from(["{}", '{"a":1}']),
        "max_retries": st.integers(0, 2),
        "retry_after_hours": st.just(0),
    },
    optional={
        "timezone": st.sampled_from(["Europe/Paris", "UTC"]),
        "misfire": st.sampled_from(["skip", "once", "catch_up"]),
        "catch_up": st.integers(1, 3),
        "overlap": st.sampled_from(["allow", "skip", "wait"]),
    },
)


@st.composite
def lines(draw: st.DrawFn) -> dict[str, Any]:
    """A valid declaration, with some of its fields (or the name, or the cron) then set to
    anything; or an `unschedule`."""
    if draw(st.integers(0, 3)) == 0:
        return {"action": "unschedule", "name": draw(names | st.just("nightly"))}
    doc: dict[str, Any] = {"action": "schedule", **draw(valid)}
    if draw(st.booleans()):
        for name in draw(st.sets(st.sampled_from([*sorted(fields), "name", "cron"]), max_size=2)):
            pool = {"name": names, "cron": crons}.get(name, fields.get(name))
            assert pool is not None
            value = draw(pool)
            if value is None:
                doc.pop(name, None)
            else:
                doc[name] = value
    return doc


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(lines(), min_size=1, max_size=10), st.integers(0, 30))
def test_every_schedule_line_gets_one_answer_and_the_node_holds(
    docs: list[dict[str, Any]], seconds: int
) -> None:
    sh = FakeShell(NodeConfig(node_id="fuzz@pid-1-aa"))
    sh.start()
    sh.register("t")
    answered: dict[str, str] = {}
    for doc in docs:
        before = len(sh.sent)
        sh.line(orjson.dumps(doc))
        replies = sh.sent[before:]
        for message in replies:
            proto.encode_message(message)
        answers = [m for m in replies if m["action"] in ("scheduled", "error")]
        assert len(answers) == 1, (doc, replies)
        (answer,) = answers
        name = doc.get("name")
        if answer["action"] == "error":
            assert answer["message"].startswith(("Failed to schedule: ", "Invalid JSON: "))
            if isinstance(name, str) and name and answer["message"].startswith("Failed"):
                assert answer.get("name") in (name, None), (doc, answer)
        else:
            assert answer["name"] == name and answer["result"] in (
                "created", "updated", "unchanged", "removed", "absent"
            )
            answered[name] = answer["result"]
    sh.advance(seconds)  # the ticks of what was declared fire (invariants checked each call)
    fold = ShardFold().add_all(sh_records(sh))
    live = {n for n, r in fold.schedules.items() if not r.fields.get("removed")}
    assert live == set(sh.node.schedules.by_name)
    # Each name ends as its last answer left it.
    for name, result in answered.items():
        assert (name in live) == (result in ("created", "updated", "unchanged")), (name, result)


def sh_records(sh: FakeShell) -> list[Any]:
    return scan(bytes(sh.disk["logs"].get(0, b""))).records
