"""A handler's result: kept on its success tombstone, bounded in size, expired with the
completed task after the retention period (compaction and replay alike)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson

from snerd.core import effects as fx
from snerd.core import events as ev
from snerd.core.node import NodeConfig, NodePhase
from snerd.core.records import scan
from snerd.core.shardlog import fold_records
from tests.support.fakeshell import SECOND, FakeShell

DAY = 86_400


def started(**kw: Any) -> FakeShell:
    sh = FakeShell(NodeConfig(node_id="n@pid-1-x", **kw))
    sh.start()
    assert sh.node.phase is NodePhase.RUNNING
    sh.register("t")
    return sh


def succeed(sh: FakeShell, task_id: str, result: Any, **extra: Any) -> None:
    sh.line(
        {"action": "result", "task_id": task_id, "status": "success", "result": result, **extra}
    )


def tombstones(sh: FakeShell) -> dict[str, dict[str, Any]]:
    return {r["taskId"]: r for r in sh.log_records() if r.get("deletedAt")}


def test_a_success_stores_its_result_on_the_tombstone_and_the_fold_reads_it_back() -> None:
    sh = started()
    value = {"total": 3, "items": ["a", None, 2.5], "nested": {"ok": True}}
    sh.enqueue("a")
    succeed(sh, "a", value)
    assert tombstones(sh)["a"]["snerdResult"] == value
    fold = fold_records(scan(bytes(sh.disk["logs"][0])).records)
    assert fold.finished["a"].fields["snerdResult"] == value


def test_a_success_without_a_result_stores_none() -> None:
    sh = started()
    for task_id, extra in (("plain", {}), ("null", {"result": None})):
        sh.enqueue(task_id)
        sh.line({"action": "result", "task_id": task_id, "status": "success", **extra})
    assert all("snerdResult" not in r for r in tombstones(sh).values())
    assert set(tombstones(sh)) == {"plain", "null"}


def test_a_failures_result_is_ignored() -> None:
    sh = started()
    sh.enqueue("a")
    sh.line({"action": "result", "task_id": "a", "status": "error", "result": 5})
    (dead,) = tombstones(sh).values()
    assert dead["snerdOutcome"] == "dead_letter" and "snerdResult" not in dead


def test_a_result_past_the_limit_fails_the_attempt_naming_sizes_and_task() -> None:
    sh = started(result_max_bytes=20)
    sh.enqueue("big", max_retries=1)
    succeed(sh, "big", "x" * 30)  # 32 bytes with its quotes
    error = "task big: result of 32 bytes exceeds the limit of 20 bytes (SNERD_RESULT_MAX_BYTES)"
    retry = [r for r in sh.log_records() if r.get("taskId") == "big" and "LastErrorObj" in r]
    assert retry and retry[-1]["LastErrorObj"] == error
    assert tombstones(sh) == {}
    # Retried as any failure: the next attempt's result within the limit is kept.
    sh.advance(1)
    assert sh.executed_ids() == ["big", "big"]
    succeed(sh, "big", "x" * 18)  # exactly 20 bytes
    assert tombstones(sh)["big"]["snerdResult"] == "x" * 18


def test_results_in_a_burst_keep_the_tombstones_one_append_each_with_its_own() -> None:
    sh = started()
    sh.burst([_enqueue(i) for i in ("r1", "r2", "r3")])
    docs = [
        {"action": "result", "task_id": i, "status": "success", "result": n}
        for n, i in enumerate(("r1", "r2", "r3"))
    ]
    lines: list[ev.Event] = [ev.LineReceived(line=orjson.dumps(d)) for d in docs]
    effects = sh.burst(lines)
    (append,) = [e for e in effects if isinstance(e, fx.Append)]
    assert [r.fields.get("snerdResult") for r in append.records] == [0, 1, 2]
    assert {t: r["snerdResult"] for t, r in tombstones(sh).items()} == {"r1": 0, "r2": 1, "r3": 2}


def test_the_unsafe_control_stores_another_value() -> None:
    sh = started(unsafe_wrong_result=True)
    sh.enqueue("a")
    succeed(sh, "a", 7)
    assert tombstones(sh)["a"]["snerdResult"] != 7


def test_compaction_drops_completed_tasks_past_the_retention_and_keeps_dead_letters() -> None:
    sh = started(compact_min_bytes=1, compact_dead_ratio=1, result_retention_us=DAY * SECOND)
    sh.enqueue("old")
    succeed(sh, "old", "o")
    sh.enqueue("dead")
    sh.result("dead", ok=False, error="boom")
    sh.wall += 2 * DAY * SECOND  # the wall clock only: no timer needs to run
    sh.enqueue("young")
    succeed(sh, "young", "y")
    sh.feed(ev.CompactionRequested(shard=0))
    assert set(tombstones(sh)) == {"dead", "young"}
    assert set(sh.node.shards[0].history) == {"dead", "young"}
    assert list(sh.node.shards[0].completed_at) == ["young"]


def test_a_retention_of_0_keeps_what_the_history_limit_keeps() -> None:
    sh = started(compact_min_bytes=1, result_retention_us=0, history_limit=2)
    for task_id in ("a", "b", "c"):
        sh.enqueue(task_id)
        succeed(sh, task_id, task_id)
        sh.wall += 30 * DAY * SECOND
    sh.feed(ev.CompactionRequested(shard=0))
    assert set(tombstones(sh)) == {"b", "c"}
    assert list(sh.node.shards[0].completed_at) == ["b", "c"]


def test_a_replay_leaves_completed_tasks_past_the_retention_out_of_the_history() -> None:
    cfg = NodeConfig(node_id="n@pid-1-x", result_retention_us=DAY * SECOND)
    sh = FakeShell(cfg)
    sh.start()
    sh.register("t")
    sh.enqueue("old")
    succeed(sh, "old", 1)
    sh.enqueue("dead")
    sh.result("dead", ok=False, error="boom")
    sh.disk["locks"].clear()
    later = FakeShell(
        replace(cfg, node_id="n2@pid-2-b", lock_proves_liveness=True), disk=sh.disk
    )
    later.wall = sh.wall + 2 * DAY * SECOND
    later.start()
    assert later.node.owned_shards == [0]
    assert set(later.node.shards[0].history) == {"dead"}
    assert later.node.shards[0].completed_at == {}


def _enqueue(task_id: str) -> ev.Event:
    return ev.LineReceived(
        line=orjson.dumps(
            {
                "action": "enqueue",
                "task_id": task_id,
                "task_type": "t",
                "task_data": "{}",
                "max_retries": 0,
                "retry_after_hours": 0.0,
            }
        )
    )


def test_a_failure_marked_final_is_dead_lettered_at_once_and_others_are_retried() -> None:
    sh = started()
    for task_id in ("final", "retried", "ok-final"):
        sh.enqueue(task_id, max_retries=3)
    sh.line({"action": "result", "task_id": "final", "status": "error",
             "error_msg": "bad input", "retry": False})
    sh.line({"action": "result", "task_id": "retried", "status": "error",
             "error_msg": "flaky", "retry": True})
    sh.line({"action": "result", "task_id": "ok-final", "status": "success", "retry": False})
    dead = tombstones(sh)
    assert dead["final"]["snerdOutcome"] == "dead_letter"
    assert dead["final"]["retryCount"] == 1  # one attempt, three retries left unused
    assert "bad input" in str(dead["final"])  # its error kept on the tombstone
    assert "retried" not in dead and sh.node.tasks["retried"].retry_count == 1
    assert dead["ok-final"]["snerdOutcome"] == "completed"  # (a success's `retry` is moot)


def test_a_results_retry_must_be_a_boolean() -> None:
    sh = started()
    sh.enqueue("a")
    sh.line({"action": "result", "task_id": "a", "status": "error", "retry": "no"})
    (error,) = sh.messages("error")
    assert error["task_id"] == "a" and "field `retry` must be" in error["message"]
