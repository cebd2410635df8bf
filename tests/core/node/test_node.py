"""The node's decisions, driven through its public API by an in-memory shell."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snerd.core import effects as fx
from snerd.core import events as ev
from snerd.core import protocol as proto
from snerd.core.node import NodeConfig, NodePhase, route_shard
from snerd.core.ownership import OwnershipConfig
from snerd.core.records import encode_record
from snerd.core.timefmt import format_rfc3339
from tests.support.fakeshell import SECOND, FakeShell


def started(config: NodeConfig | None = None, **kw: Any) -> FakeShell:
    sh = FakeShell(config, **kw)
    sh.start()
    assert sh.node.phase is NodePhase.RUNNING
    return sh


def test_enqueue_is_acked_after_commit_then_executed_then_completed() -> None:
    sh = started()
    sh.register("t")
    sh.hold_appends = True
    sh.enqueue("a", data={"x": 1})
    assert sh.messages("ack")[-1]["message"] == "Registered handler for t"  # no enqueue ack yet
    sh.hold_appends = False
    sh.release_held()
    ack = sh.messages("ack")[-1]
    assert ack == {
        "action": "ack",
        "task_id": "a",
        "message": "Enqueued successfully",
        "shard": "shard-0",
    }
    # Executed at once (event-driven), with its payload read from the log.
    assert sh.executed_ids() == ["a"]
    assert orjson.loads(sh.payload(sh.executed[0].location)) == {"x": 1}
    sh.result("a")
    records = sh.log_records()
    tomb = [r for r in records if r.get("taskId") == "a" and r.get("deletedAt")]
    assert len(tomb) == 1 and tomb[0]["snerdOutcome"] == "completed"
    assert tomb[0]["taskData"] == '{"x":1}'  # the tombstone is a full upstream-shaped record
    assert sh.node.tasks == {}


def test_membership_is_announced_and_claims_are_written() -> None:
    sh = started()
    doc = sh.disk["membership"]
    claim = doc["claims"]["shard-0"]
    assert claim["owner"] == sh.config.node_id
    assert claim["epoch"] == 1
    assert sh.messages("membership")[0]["owned"] == ["shard-0"]
    # The first record of the log is the claim that fences older epochs.
    assert sh.log_records()[0]["snerdKind"] == "claim"


def test_unregistered_type_waits_for_register() -> None:
    sh = started()
    sh.enqueue("a", task_type="later")
    assert sh.executed_ids() == []
    sh.line({"action": "stats"})
    assert sh.messages("stats")[-1]["waiting_types"] == ["later"]
    sh.register("later")
    assert sh.executed_ids() == ["a"]


def test_priority_then_fifo_with_one_worker() -> None:
    sh = started(NodeConfig(node_id="n@pid-1-x", max_workers=1))
    sh.register("t")
    sh.enqueue("blocker")
    for i, urgency in enumerate([0.0, 5.0, 1.0, 5.0, 0.0]):
        sh.enqueue(f"t{i}", urgency_score=urgency)
    assert sh.executed_ids() == ["blocker"]
    for _ in range(5):
        sh.result(sh.executed[-1].task_id)
    assert sh.executed_ids() == ["blocker", "t1", "t3", "t2", "t0", "t4"]


def test_fails_twice_then_succeeds_within_its_attempts() -> None:
    sh = started()
    sh.register("t")
    sh.enqueue("a", max_retries=2, retry_after_hours=1 / 3600)  # 1 s backoff
    sh.result("a", ok=False, error="boom 1")
    assert len(sh.executed) == 1
    sh.advance(0.5)
    assert len(sh.executed) == 1  # still backing off
    sh.advance(0.6)
    assert len(sh.executed) == 2 and sh.executed[-1].attempt == 2
    sh.result("a", ok=False, error="boom 2")
    sh.advance(1.1)
    assert sh.executed[-1].attempt == 3
    sh.result("a")
    retry_records = [r for r in sh.log_records() if r.get("taskId") == "a" and "LastErrorObj" in r]
    assert [r["LastErrorObj"] for r in retry_records] == ["boom 1", "boom 2"]
    assert sh.log_records()[-1]["snerdOutcome"] == "completed"
    assert "LastJobError" not in sh.log_records()[-1]  # success clears the error
    assert sh.dead_letters == []


def test_exhausted_attempts_dead_letter_with_final_error() -> None:
    sh = started()
    sh.register("t")
    sh.enqueue("a", max_retries=1)
    sh.result("a", ok=False, error="first")
    sh.advance(0)
    sh.result("a", ok=False, error="final")
    sh.advance(10)
    assert len(sh.executed) == 2  # 1 + max_retries attempts, never more
    assert [d.task_id for d in sh.dead_letters] == ["a"]
    assert sh.dead_letters[0].error == "final"
    tomb = sh.log_records()[-1]
    assert tomb["snerdOutcome"] == "dead_letter" and tomb["LastErrorObj"] == "final"
    assert tomb["retryCount"] == 2


def test_execute_at_in_the_future_waits() -> None:
    sh = started()
    sh.register("t")
    sh.enqueue("a", execute_at=format_rfc3339(sh.wall + 30 * SECOND))
    assert sh.executed_ids() == []
    sh.advance(29)
    assert sh.executed_ids() == []
    sh.advance(1.5)
    assert sh.executed_ids() == ["a"]


def test_rate_window_is_sliding_and_costs_no_attempt() -> None:
    sh = started()
    sh.register("t")
    for i in range(3):
        sh.enqueue(f"r{i}", rate_limit_group="g", max_per_minute=2)
    assert sh.executed_ids() == ["r0", "r1"]
    for i in range(2):
        sh.result(f"r{i}")
    sh.advance(59)
    assert sh.executed_ids() == ["r0", "r1"]
    sh.advance(1.5)
    assert sh.executed_ids() == ["r0", "r1", "r2"]
    assert sh.executed[-1].attempt == 1


def test_dedupe_drops_a_pending_duplicate_and_says_so() -> None:
    sh = started()
    sh.enqueue("a", data={"same": 1}, auto_dedupe=True)
    sh.enqueue("b", data={"same": 1}, auto_dedupe=True)
    acks = {m["task_id"]: m for m in sh.messages("ack") if "task_id" in m}
    assert acks["b"].get("deduplicated") is True
    assert "deduplicated" not in acks["a"]
    assert set(sh.node.tasks) == {"a"}
    sh.register("t")
    sh.result("a")
    # Once the original finished, the same payload is accepted again.
    sh.enqueue("c", data={"same": 1}, auto_dedupe=True)
    assert "c" in sh.node.tasks


def test_a_duplicate_is_acked_only_once_its_original_is_durable() -> None:
    """The original runs at once (its dispatch record shares its enqueue append), so it is
    DISPATCHING, not ENQUEUING, while that append is out: the duplicate must still wait."""
    sh = started()
    sh.register("t")
    sh.hold_appends = True
    sh.enqueue("a", data={"same": 1}, auto_dedupe=True)
    sh.enqueue("b", data={"same": 1}, auto_dedupe=True)
    assert sh.messages("ack")[1:] == []  # nothing is durable yet: nobody is told anything
    sh.hold_appends = False
    sh.release_held()
    acks = {m["task_id"]: m for m in sh.messages("ack") if "task_id" in m}
    assert acks["b"].get("deduplicated") is True and "a" in acks


@pytest.mark.parametrize("done_first", ["grouped", "plain"])
def test_dedupe_still_sees_a_pending_twin_after_another_task_of_its_fingerprint_finished(
    done_first: str,
) -> None:
    # Two live tasks may share a fingerprint: one with a rate-limit group routes by its group,
    # so daemons owning the two shards each took one in, and a node that takes both shards
    # over loads both. The node kept one task per fingerprint; when that one finished, the
    # other was forgotten and a duplicate of it was taken in (sim seed 109167).
    fingerprint = "de288ed34ff99f1a"  # xxh64 of 't{"same":1}', without leading zeros
    assert route_shard(fingerprint, 2) != route_shard("g", 2)

    def record(task_id: str, **extra: Any) -> bytes:
        return encode_record(
            {
                "taskId": task_id,
                "retryCount": 0,
                "maxRetries": 0,
                "retryAfterHours": 0.0,
                "retryAfterTime": "2026-01-01T00:00:00.000000Z",
                "taskData": '{"same":1}',
                "taskType": "t",
                "autoDedupe": True,
                "payloadHash": fingerprint,
                "executeAt": "2026-01-01T00:00:00.000000Z",
                **extra,
            }
        )

    sh = FakeShell(NodeConfig(node_id="n@pid-1-x", new_queue_shards=2))
    sh.disk["logs"][route_shard("g", 2)] = bytearray(
        record("grouped", rateLimitGroup="g", maxPerMinute=600)
    )
    sh.disk["logs"][route_shard(fingerprint, 2)] = bytearray(record("plain"))
    sh.start()
    sh.register("t")
    assert sorted(sh.executed_ids()) == ["grouped", "plain"]
    sh.result(done_first)
    sh.enqueue("again", data={"same": 1}, auto_dedupe=True)
    ack = next(m for m in sh.messages("ack") if m.get("task_id") == "again")
    assert ack.get("deduplicated") is True
    assert "again" not in sh.node.tasks
    # Once no task of the fingerprint is live, the payload is taken again.
    sh.result("plain" if done_first == "grouped" else "grouped")
    sh.enqueue("later", data={"same": 1}, auto_dedupe=True)
    assert "later" in sh.node.tasks


def test_a_dispatch_record_refused_by_a_full_disk_keeps_the_task_ahead_of_newer_ones() -> None:
    sh = started(NodeConfig(node_id="n@pid-1-x", max_workers=1))
    sh.register("t")
    sh.enqueue("busy")  # takes the only slot
    sh.enqueue("urgent", urgency_score=5)
    sh.disk_full = True
    sh.result("busy")  # the slot frees; the finish record and urgent's dispatch both fail
    assert "urgent" not in sh.executed_ids()
    sh.disk_full = False
    sh.enqueue("later")  # the disk has room again: a newer, less urgent task arrives
    assert sh.executed_ids() == ["busy"]  # nothing overtakes while the shard's dispatch waits
    sh.advance(1.5)
    assert sh.executed_ids() == ["busy", "urgent"]
    sh.result("urgent")
    assert sh.executed_ids() == ["busy", "urgent", "later"]


def test_duplicate_live_task_id_is_refused_not_overwritten() -> None:
    sh = started()
    sh.enqueue("a", data={"v": 1})
    sh.enqueue("a", data={"v": 2})
    err = sh.messages("error")[-1]
    assert err["task_id"] == "a" and "already pending" in err["message"]
    sh.register("t")
    assert orjson.loads(sh.payload(sh.executed[0].location)) == {"v": 1}


def test_hard_timeout_fails_the_attempt_and_refuses_the_late_result() -> None:
    sh = started()
    sh.register("t")
    sh.enqueue("a", max_execution_seconds=5, max_retries=1)
    sh.advance(5.1)
    assert sh.node.tasks["a"].last_error == "Task execution timed out after 5 seconds"
    assert len(sh.executed) == 2  # retried at once (no backoff)
    # A result naming the first attempt is late: refused with the unknown/expired text.
    sh.line({"action": "result", "task_id": "a", "status": "success", "attempt": 1})
    assert sh.messages("error")[-1]["message"] == ("Received result for unknown/expired task_id a")
    sh.result("a")
    assert "a" not in sh.node.tasks


def test_full_disk_refuses_enqueue_and_recovers() -> None:
    sh = started()
    sh.disk_full = True
    sh.enqueue("a")
    err = sh.messages("error")[-1]
    assert err["task_id"] == "a" and err["message"].startswith("Failed to enqueue: ")
    assert "a" not in sh.node.tasks
    sh.disk_full = False
    sh.enqueue("a")
    assert sh.messages("ack")[-1]["task_id"] == "a"


def test_outcome_record_is_retried_until_the_disk_has_room() -> None:
    sh = started()
    sh.register("t")
    sh.enqueue("a")
    sh.disk_full = True
    sh.result("a")
    assert "a" in sh.node.tasks  # not finished until its tombstone is durable
    sh.disk_full = False
    sh.advance(1.5)
    assert "a" not in sh.node.tasks
    assert sh.log_records()[-1]["snerdOutcome"] == "completed"


def test_restart_replays_the_log_and_reruns_unfinished_attempts() -> None:
    sh = started()
    sh.register("t")
    sh.enqueue("done")
    sh.result("done")
    sh.enqueue("running", max_retries=3)
    sh.result("running", ok=False, error="e1")
    sh.advance(0)  # attempt 2 dispatched, then the process dies
    assert sh.executed[-1].attempt == 2
    sh.line({"action": "register", "task_type": "other"})
    sh.enqueue("q1", task_type="other2")
    sh.enqueue("q2", task_type="other2")
    # Crash: a new node on the same disk (the old one's lock is gone with its process).
    sh.disk["locks"].clear()
    sh2 = FakeShell(NodeConfig(node_id="n2@pid-2-b", lock_proves_liveness=True), disk=sh.disk)
    sh2.wall = sh.wall + 40 * SECOND  # its lease lapsed
    sh2.start()
    assert sh2.node.phase is NodePhase.RUNNING
    assert set(sh2.node.tasks) == {"running", "q1", "q2"}
    sh2.register("t")
    # Crash re-execution: the same attempt number again, not a new attempt.
    assert [(e.task_id, e.attempt) for e in sh2.executed] == [("running", 2)]
    sh2.register("other2")
    assert sh2.executed_ids()[1:] == ["q1", "q2"]  # FIFO survives the restart
    claims = [r for r in sh2.log_records() if r.get("snerdKind") == "claim"]
    assert [c["epoch"] for c in claims] == [1, 2]


def test_drain_refuses_enqueues_keeps_results_and_releases() -> None:
    sh = started()
    sh.register("t")
    sh.enqueue("a")
    sh.feed(ev.DrainRequested(reason="SIGTERM"))
    sh.enqueue("b")
    assert sh.messages("error")[-1] == {
        "action": "error",
        "task_id": "b",
        "message": "[Snerd] Daemon is shutting down; enqueue rejected",
    }
    assert sh.exit_code is None  # waits for the in-flight task
    sh.result("a")
    assert sh.exit_code == 0
    assert sh.log_records()[-1]["snerdOutcome"] == "completed"
    assert sh.disk["membership"]["claims"] == {}
    assert sh.disk["membership"]["epochs"]["shard-0"] == 1
    assert sh.disk["locks"] == {}


def test_drain_gives_up_on_stuck_tasks_after_the_timeout() -> None:
    sh = started(NodeConfig(node_id="n@pid-1-x", drain_timeout_us=3 * SECOND))
    sh.register("t")
    sh.enqueue("stuck")
    sh.feed(ev.DrainRequested(reason="SIGTERM"))
    sh.advance(2.9)
    assert sh.exit_code is None
    sh.advance(0.2)
    assert sh.exit_code == 0


def test_second_node_waits_while_the_first_holds_the_shards() -> None:
    sh = started()
    other = FakeShell(NodeConfig(node_id="other@pid-9-z"), disk=sh.disk)
    other.start()
    assert other.node.owned_shards == []
    assert any("claimed by a live daemon" in m for _, m in other.logs_out)
    # It still takes enqueues: through its inbox, to the owner (tests/core/node/test_inbox.py).
    other.enqueue("x")
    assert other.messages("error") == []
    assert other.messages("ack")[-1]["task_id"] == "x"


def test_lock_held_elsewhere_pauses_the_shard_and_retries() -> None:
    disk: dict[str, Any] = {"logs": {}, "membership": None, "locks": {0: "ghost"}}
    sh = FakeShell(NodeConfig(node_id="n@pid-1-x"), disk=disk)
    sh.start()
    assert sh.node.owned_shards == []
    assert any("lock is held by another process" in m for _, m in sh.logs_out)
    del disk["locks"][0]
    sh.advance(1.5)
    assert sh.node.owned_shards == [0]


def test_commands_sent_during_startup_are_kept_in_order() -> None:
    sh = FakeShell()
    sh.register("t")  # before Started: held
    sh.enqueue("a")
    sh.start()
    assert sh.executed_ids() == ["a"]


def test_compaction_keeps_live_state() -> None:
    cfg = NodeConfig(
        node_id="n@pid-1-x", compact_min_bytes=4096, history_limit=5, compact_dead_ratio=1
    )
    sh = started(cfg)
    sh.register("t")
    for i in range(60):
        sh.enqueue(f"d{i}")
        sh.result(f"d{i}")
    sh.enqueue("live", task_type="nobody")
    size_after = len(sh.disk["logs"][0])
    assert size_after < 4096 + 2000  # compaction ran and shrank the log
    ids = [r.get("taskId") for r in sh.log_records() if r.get("deletedAt")]
    assert len(ids) <= 5 + 10  # bounded history
    sh.disk["locks"].clear()
    sh2 = FakeShell(replace(cfg, node_id="n@pid-2-y"), disk=sh.disk)
    sh2.wall = sh.wall + 40 * SECOND
    sh2.start()
    assert sh2.node.owned_shards == []  # the dead claim has not been seen long enough yet
    # Seen unchanged for ttl + margin (35 s) on its own monotonic clock by its round at 40 s.
    sh2.advance(41)
    assert sh2.node.owned_shards == [0]
    assert set(sh2.node.tasks) == {"live"}


@pytest.mark.parametrize("ratio", [1, 3])
def test_a_log_is_compacted_once_it_holds_ratio_dead_bytes_per_live_one(ratio: int) -> None:
    cfg = NodeConfig(
        node_id="n@pid-1-x", compact_min_bytes=4096, history_limit=5, compact_dead_ratio=ratio
    )
    sh = started(cfg)
    sh.register("t")
    for i in range(20):
        sh.enqueue(f"parked{i}", task_type="nobody")  # live all along
    for i in range(400):
        sh.enqueue(f"d{i}")
        sh.result(f"d{i}")
    sizes = [
        tuple(int(n) for n in re.findall(r"from (\d+) to (\d+) bytes", message)[0])
        for _, message in sh.logs_out
        if "compacted tasks.log" in message
    ]
    assert len(sizes) >= 2
    for before, after in sizes:
        # Kept: the live records alone (nothing was held back); dead: the rest.
        assert before - after >= ratio * after
        assert before >= cfg.compact_min_bytes
    if ratio == 1:
        # Not later than needed: the check runs as the log grows by an eighth at most.
        assert any(before < 3 * after for before, after in sizes)
    assert set(sh.node.tasks) == {f"parked{i}" for i in range(20)}


def _enqueue_lines(*ids: str, **extra: Any) -> list[ev.Event]:
    return [
        ev.LineReceived(
            line=orjson.dumps(
                {
                    "action": "enqueue",
                    "task_id": i,
                    "task_type": "nobody",
                    "task_data": "{}",
                    "max_retries": 0,
                    "retry_after_hours": 0,
                    **extra,
                }
            )
        )
        for i in ids
    ]


def test_a_burst_of_enqueues_is_one_append_and_each_task_gets_its_own_record_and_ack() -> None:
    sh = started()
    ids = [f"b{i}" for i in range(5)]
    effects = sh.burst(_enqueue_lines(*ids))
    (append,) = [e for e in effects if isinstance(e, fx.Append)]
    assert [r.fields["taskId"] for r in append.records] == ids
    assert [m["task_id"] for m in sh.messages("ack")] == ids
    records = sh.log_records()
    log = bytes(sh.disk["logs"][0])
    for task_id in ids:
        loc = sh.node.tasks[task_id].loc
        assert loc is not None
        line = log[loc.offset : loc.offset + loc.length]
        assert orjson.loads(line)["taskId"] == task_id
    assert [r["taskId"] for r in records if "taskId" in r] == ids


def test_a_failed_burst_fails_each_enqueue_in_it_and_keeps_none() -> None:
    sh = started()
    sh.disk_full = True
    sh.burst(_enqueue_lines("f1", "f2", "f3", auto_dedupe=False))
    errors = sh.messages("error")
    assert [m["task_id"] for m in errors] == ["f1", "f2", "f3"]
    assert all("No space left" in m["message"] for m in errors)
    assert not sh.messages("ack") and not {"f1", "f2", "f3"} & set(sh.node.tasks)
    sh.disk_full = False
    sh.burst(_enqueue_lines("f1"))  # the ids are free again
    assert [m["task_id"] for m in sh.messages("ack")] == ["f1"]


def test_a_step_down_during_a_compaction_keeps_the_lock_until_it_ends_and_drops_held_appends() -> (
    None
):
    # The compaction renames a new file over the log: another daemon must not get the lock
    # (and append to the old file) before that; and what was held back meanwhile belongs to
    # a tenure that is over, so it is never written (it used to be, after the compaction).
    sh = started()
    sh.enqueue("early", task_type="nobody")
    sh.hold_compaction = True
    sh.feed(ev.CompactionRequested(shard=0))
    assert sh.held_compactions
    sh.enqueue("late", task_type="nobody")
    assert not sh.messages("ack") or sh.messages("ack")[-1]["task_id"] == "early"
    sh.feed(ev.LockLost(shard=0, error="Input/output error (EIO)"))
    assert sh.messages("error")[-1]["task_id"] == "late"
    assert sh.disk["locks"].get(0) == sh.config.node_id  # kept while the compaction runs
    sh.release_compactions()
    assert 0 not in sh.disk["locks"]
    assert [r.get("taskId") for r in sh.log_records() if "taskId" in r] == ["early"]


@pytest.mark.parametrize(
    "line",
    [
        b"not json",
        b"[1,2]",
        b'{"action":"fly"}',
        b'{"action":"enqueue","task_id":"k","task_type":"t","task_data":"{}","max_retries":-1,'
        b'"retry_after_hours":0}',
        b'{"action":"enqueue","task_id":"k","task_type":"t","task_data":"{}","max_retries":1,'
        b'"retry_after_hours":0,"execute_at":"tomorrow"}',
        b'{"action":"enqueue","task_id":"k","task_type":"t","task_data":"{}","max_retries":1,'
        b'"retry_after_hours":0,"rate_limit_group":"g","max_per_minute":0}',
        b"\xff\xfe{",
    ],
)
def test_bad_lines_get_an_error_and_the_node_keeps_serving(line: bytes) -> None:
    sh = started()
    sh.feed(ev.LineReceived(line=line))
    err = sh.messages("error")[-1]
    assert err["message"]
    if b'"task_id":"k"' in line:
        assert err["task_id"] == "k"
    sh.register("t")
    sh.enqueue("ok")
    assert sh.executed_ids() == ["ok"]


def test_oversize_line_is_refused_with_its_task_id() -> None:
    sh = started()
    prefix = b'{"action":"enqueue","task_id":"huge","task_data":"' + b"x" * 100
    sh.feed(ev.LineReceived(line=prefix, oversize=50_000_000))
    err = sh.messages("error")[-1]
    assert err["task_id"] == "huge" and "50000000" in err["message"]


def test_dependencies_wait_and_fail_through() -> None:
    sh = started()
    sh.register("t")
    sh.enqueue("parent", task_type="slow")
    sh.enqueue("child", trigger_after_ids=["parent"])
    assert sh.executed_ids() == []
    sh.register("slow")
    assert sh.executed_ids() == ["parent"]
    sh.result("parent")
    assert sh.executed_ids() == ["parent", "child"]
    # A dead-lettered parent fails its children.
    sh.enqueue("p2", task_type="slow")
    sh.enqueue("c2", trigger_after_ids=["p2"])
    sh.result("p2", ok=False, error="nope")
    assert "c2" not in sh.node.tasks
    tomb = [r for r in sh.log_records() if r.get("taskId") == "c2"][-1]
    assert tomb["LastErrorObj"] == "blocked_by_failed_parent: p2"
    sh.enqueue("c3", trigger_after_ids=["c3x"])
    sh.enqueue("c3x", trigger_after_ids=["c3"])
    assert "Cycle detected" in sh.messages("error")[-1]["message"]


def test_cron_task_rearms_after_success() -> None:
    sh = started()
    sh.register("t")
    sh.enqueue("tick", cron="10s")
    assert sh.executed_ids() == []
    sh.advance(10.5)
    assert sh.executed_ids() == ["tick"]
    sh.result("tick")
    assert "tick" in sh.node.tasks
    sh.advance(10)
    assert sh.executed_ids() == ["tick", "tick"]


def test_lease_is_renewed() -> None:
    sh = started(NodeConfig(node_id="n@pid-1-x", ownership=OwnershipConfig(ttl_us=30 * SECOND)))
    first = sh.disk["membership"]["claims"]["shard-0"]["lease_expiry"]
    sh.advance(11)
    claim = sh.disk["membership"]["claims"]["shard-0"]
    assert claim["lease_expiry"] > first and claim["renewals"] >= 1 and claim["epoch"] == 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["enqueue", "ok", "fail", "tick", "restart"]),
            st.integers(0, 7),
            st.integers(0, 2),
        ),
        max_size=60,
    )
)
def test_random_workloads_finish_every_acked_task_within_its_attempts(
    ops: list[tuple[str, int, int]],
) -> None:
    sh = started(NodeConfig(node_id="n@pid-1-x", max_workers=3))
    sh.register("t")
    max_retries: dict[str, int] = {}
    runs: dict[str, list[int]] = {}
    seen = 0

    def note_executions(shell: FakeShell) -> None:
        nonlocal seen
        for e in shell.executed[seen:]:
            runs.setdefault(e.task_id, []).append(e.attempt)
        seen = len(shell.executed)

    for op, n, r in ops:
        tid = f"k{n}"
        if op == "enqueue" and tid not in sh.node.tasks and tid not in max_retries:
            sh.enqueue(tid, max_retries=r)
            max_retries[tid] = r
        elif op in ("ok", "fail") and tid in sh.node.book.inflight:
            sh.result(tid, ok=op == "ok", error="x")
        elif op == "tick":
            sh.advance(1)
        elif op == "restart":
            note_executions(sh)
            sh.disk["locks"].clear()
            wall = sh.wall
            sh = FakeShell(
                NodeConfig(node_id=f"n@pid-{n}-r", max_workers=3, lock_proves_liveness=True),
                disk=sh.disk,
            )
            sh.wall = wall + 40 * SECOND
            sh.start()
            sh.register("t")
            seen = 0
        note_executions(sh)
    # Quiet phase: everything acked finishes.
    for _ in range(200):
        if not sh.node.tasks:
            break
        for tid in list(sh.node.book.inflight):
            sh.result(tid)
        sh.advance(1)
        note_executions(sh)
    assert sh.node.tasks == {}
    acked = {m["task_id"] for m in sh.sent if m.get("action") == "ack" and "task_id" in m}
    for tid in acked:
        assert tid in runs
    for tid, attempts in runs.items():
        # Crash re-executions repeat an attempt number; distinct attempts stay within bounds.
        assert max(attempts) <= 1 + max_retries[tid]
        assert sorted(set(attempts)) == list(range(1, max(attempts) + 1))


def test_a_dead_owner_is_taken_over_at_once_where_flock_proves_liveness() -> None:
    sh = started()
    sh.register("t")
    sh.enqueue("a")  # dispatched, then the process is killed: its lock goes with it
    dead = sh.disk["locks"].pop(0)
    cfg = NodeConfig(node_id="n2@pid-2-b", lock_proves_liveness=True)
    sh2 = FakeShell(cfg, disk=sh.disk)
    sh2.wall = sh.wall + 1 * SECOND  # the dead owner's lease is still live
    sh2.start()
    assert sh2.node.owned_shards == [0]
    assert sh2.disk["membership"]["claims"]["shard-0"]["owner"] == "n2@pid-2-b"
    assert sh2.disk["membership"]["claims"]["shard-0"]["epoch"] == 2
    sh2.register("t")
    assert sh2.executed_ids() == ["a"]
    # A live owner (lock held) is never taken over early, even with the probe on.
    sh3 = FakeShell(NodeConfig(node_id="n3@pid-3-c", lock_proves_liveness=True), disk=sh.disk)
    sh3.wall = sh2.wall
    sh3.start()
    assert sh3.node.owned_shards == []
    assert sh3.disk["membership"]["claims"]["shard-0"]["owner"] == "n2@pid-2-b"
    assert dead != "n2@pid-2-b"
    # Without the probe, a fresh lease is respected until it lapses.
    sh2.disk["locks"].clear()
    sh4 = FakeShell(NodeConfig(node_id="n4@pid-4-d"), disk=sh.disk)
    sh4.wall = sh2.wall + 1 * SECOND
    sh4.start()
    assert sh4.node.owned_shards == []


def test_rate_window_survives_a_restart() -> None:
    sh = started()
    sh.register("t")
    for i in range(3):
        sh.enqueue(f"r{i}", rate_limit_group="g", max_per_minute=2)
    sh.result("r0")
    sh.result("r1")
    assert sh.executed_ids() == ["r0", "r1"]
    sh.advance(10)
    sh.disk["locks"].clear()
    sh2 = FakeShell(NodeConfig(node_id="n2@pid-2-b", lock_proves_liveness=True), disk=sh.disk)
    sh2.wall, sh2.mono = sh.wall + 36 * SECOND, sh.mono  # lease lapsed; 46 s after r0, r1 ran
    sh2.start()
    sh2.register("t")
    assert sh2.executed_ids() == []  # the window was rebuilt from the dispatch records
    sh2.advance(13)
    assert sh2.executed_ids() == []
    sh2.advance(1.5)
    assert sh2.executed_ids() == ["r2"]


def test_stdin_eof_does_not_wait_for_results_that_cannot_come() -> None:
    sh = started()
    sh.register("t")
    sh.enqueue("running")
    sh.feed(ev.DrainRequested(reason="stdin closed", input_closed=True))
    assert sh.exit_code == 0  # at once, not after SNERD_DRAIN_TIMEOUT
    assert any("will run again" in m for _, m in sh.logs_out)
    # The task is still in the log, unfinished: the next owner runs it again.
    assert not [r for r in sh.log_records() if r.get("deletedAt")]


def test_stdin_eof_during_a_signal_drain_stops_waiting_for_results() -> None:
    # SIGTERM first (the SDK may still answer), then the SDK dies: its results cannot come.
    sh = started()
    sh.register("t")
    sh.enqueue("running")
    sh.feed(ev.DrainRequested(reason="SIGTERM"))
    sh.advance(1)
    assert sh.exit_code is None  # waits for the running attempt's result
    sh.feed(ev.DrainRequested(reason="stdin closed", input_closed=True))
    sh.advance(0.1)
    assert sh.exit_code == 0  # at once, not after SNERD_DRAIN_TIMEOUT
    assert any("will run again" in m for _, m in sh.logs_out)


def test_commands_before_a_drain_during_startup_are_still_answered() -> None:
    sh = FakeShell()
    sh.line({"action": "stats"})
    sh.register("t")
    sh.enqueue("early")
    sh.feed(ev.DrainRequested(reason="stdin closed", input_closed=True))
    sh.start()
    assert sh.messages("stats") and sh.messages("ack")[0]["message"] == "Registered handler for t"
    assert sh.messages("ack")[1]["task_id"] == "early"  # sent before the drain: accepted
    assert sh.exit_code == 0


def test_pool_limits_and_max_workers() -> None:
    cfg = NodeConfig(node_id="n@pid-1-x", max_workers=3, pools={"slow": 1})
    sh = started(cfg)
    sh.register("t")
    for i in range(3):
        sh.enqueue(f"s{i}", pool="slow")
    for i in range(4):
        sh.enqueue(f"d{i}")  # default pool (so is an unknown pool name)
    running = sh.executed_ids()
    assert running == ["s0", "d0", "d1"]  # one slot for `slow`, three in all
    sh.result("s0")
    assert sh.executed_ids()[-1] == "s1"  # the slot went back to its own pool
    sh.result("d0")
    assert sh.executed_ids()[-1] == "d2"


def test_fifo_order_survives_compaction_and_restart() -> None:
    cfg = NodeConfig(node_id="n@pid-1-x", max_workers=1)
    sh = started(cfg)
    sh.register("t")
    for task_id in "ABC":
        sh.enqueue(task_id, max_retries=1, retry_after_hours=1 / 3600)
    sh.result("A", ok=False, error="once")  # A's latest record now follows B's and C's
    assert sh.executed_ids() == ["A", "B"]  # B runs while A backs off; then the node dies
    sh.feed(ev.CompactionRequested(shard=0))
    records = sh.log_records()
    assert [r["taskId"] for r in records if "taskId" in r] == ["B", "C", "A"]  # compacted
    sh.disk["locks"].clear()
    sh2 = FakeShell(
        NodeConfig(node_id="n2@pid-2-b", max_workers=1, lock_proves_liveness=True), disk=sh.disk
    )
    sh2.wall = sh.wall + 40 * SECOND
    sh2.start()
    sh2.register("t")
    sh2.result("A")
    sh2.result("B")
    assert sh2.executed_ids() == ["A", "B", "C"]  # enqueue order, not file order


def test_an_adopted_task_with_an_invalid_cron_is_dead_lettered_saying_why() -> None:
    # A cron that does not parse is refused by the record rule, as by the enqueue (upstream ran
    # such a task once: a silent change of meaning): the task ends as a dead letter naming its
    # record's key. Upstream's 7-field form is read.
    sh = FakeShell()
    from snerd.core.records import encode_record

    log = bytearray()
    for task_id, cron in (("bad", "every day"), ("upstream7", "0 */5 * * * * *")):
        log += encode_record(
            {
                "taskId": task_id,
                "retryCount": 0,
                "maxRetries": 1,
                "retryAfterHours": 0.0,
                "retryAfterTime": "2026-01-01T00:00:00.000000Z",
                "taskData": "{}",
                "taskType": "t",
                "executeAt": "2026-01-01T00:00:00.000000Z",
                "cronExpression": cron,
            }
        )
    sh.disk["logs"][0] = log
    sh.start()
    sh.register("t")
    assert sh.executed_ids() == ["upstream7"]
    why = "task bad's record: invalid cronExpression 'every day'"
    assert any(why in m and "(at byte 0); it is dead-lettered" in m for _, m in sh.logs_out)
    (tomb,) = [r for r in sh.log_records() if "deletedAt" in r]
    assert tomb["taskId"] == "bad" and tomb["snerdOutcome"] == "dead_letter"
    assert tomb["LastErrorObj"].startswith(why) and tomb["retryCount"] == 0
    assert "bad" not in sh.node.tasks
    sh.result("upstream7")
    assert sh.node.tasks["upstream7"].cron == "0 */5 * * * *"  # re-armed, year field dropped


def test_a_damaged_base_record_dead_letters_the_task_instead_of_retrying_forever() -> None:
    sh = started()
    sh.register("t")
    sh.enqueue("a", max_retries=3)
    loc = sh.node.tasks["a"].loc
    assert loc is not None
    sh.disk["logs"][0][loc.offset + 5] ^= 0x01  # a flipped bit on disk
    sh.fail_bases = True
    sh.result("a", ok=False, error="boom")
    assert "a" not in sh.node.tasks
    tomb = sh.log_records()[-1]
    assert tomb["snerdOutcome"] == "dead_letter"
    assert "could not rebuild" in tomb["LastErrorObj"]


def test_no_busy_wakeups_while_draining_or_renewing() -> None:
    sh = started(NodeConfig(node_id="n@pid-1-x", drain_timeout_us=2 * SECOND))
    sh.register("t")
    sh.enqueue("stuck")
    # A renewal that comes due while another membership operation is out waits for it,
    # without asking to be woken at once, again and again.
    sh.node.tenure.membership_busy = True
    sh.advance(11)
    assert sh.node.wake_in(sh.now()) != 0
    sh.node.tenure.membership_busy = False
    sh.feed(ev.DrainRequested(reason="SIGTERM"))
    sh.disk["membership"] = None  # membership.json vanished: the release cannot be written
    sh.fail_membership = True
    sh.advance(3)
    assert sh.exit_code == 0  # the leases lapse on their own; the daemon still exits
    assert sh.node.wake_in(sh.now()) is None


def test_a_burst_acks_after_commit_and_then_runs_most_urgent_first() -> None:
    from collections import deque

    from snerd.core import effects as fx

    sh = started(NodeConfig(node_id="n@pid-1-x", max_workers=1))
    sh.register("t")
    lines = deque(
        ev.LineReceived(
            line=orjson.dumps(
                {
                    "action": "enqueue",
                    "task_id": f"b{i}",
                    "task_type": "t",
                    "task_data": "{}",
                    "max_retries": 0,
                    "retry_after_hours": 0,
                    "urgency_score": urgency,
                }
            )
        )
        for i, urgency in enumerate([1.0, 9.0, 5.0])
    )
    effects = sh.node.handle_burst(lines, sh.now())
    assert not lines
    # Nothing is told to the SDK before its record is durable.
    assert not [e for e in effects if isinstance(e, (fx.Send, fx.AckEnqueued, fx.Execute))]
    for effect in effects:
        sh._do(effect)
    sh._pump()
    # The first took the free slot as it arrived (dispatched with its enqueue record); the
    # rest then go most urgent first.
    assert sh.executed_ids() == ["b0"]
    assert {m["task_id"] for m in sh.messages("ack") if "task_id" in m} == {"b0", "b1", "b2"}
    sh.result("b0")
    sh.result("b1")
    assert sh.executed_ids() == ["b0", "b1", "b2"]


def test_an_unreadable_payload_is_a_failed_attempt_decided_by_the_core() -> None:
    sh = started()
    sh.register("t")
    sh.enqueue("a", max_retries=1)
    sh.feed(ev.PayloadUnreadable(task_id="a", attempt=1, error="checksum mismatch"))
    assert sh.node.tasks["a"].last_error == (
        "snerd could not read the task's payload: checksum mismatch"
    )
    assert [e.attempt for e in sh.executed] == [1, 2]  # its retry rules applied
    sh.feed(ev.PayloadUnreadable(task_id="a", attempt=1, error="late"))  # stale: ignored
    assert [e.attempt for e in sh.executed] == [1, 2]


def _result_lines(*ids: str, ok: bool = True) -> list[ev.Event]:
    status = "success" if ok else "error"
    return [
        ev.LineReceived(
            line=orjson.dumps({"action": "result", "task_id": i, "status": status, "error_msg": "x"})
        )
        for i in ids
    ]



def test_the_tombstones_of_a_burst_of_results_are_one_append() -> None:
    sh = started()
    sh.register("t")
    sh.burst(_enqueue_lines("r1", "r2", "r3", task_type="t"))
    assert sorted(sh.executed_ids()) == ["r1", "r2", "r3"]
    effects = sh.burst(_result_lines("r1", "r2", "r3"))
    (append,) = [e for e in effects if isinstance(e, fx.Append)]
    assert append.lazy
    assert [r.base is not None for r in append.records] == [True, True, True]
    assert [r.fields["snerdOutcome"] for r in append.records] == ["completed"] * 3
    assert sh.node.tasks == {}
    tombs = [r for r in sh.log_records() if r.get("deletedAt")]
    assert [r["taskId"] for r in tombs] == ["r1", "r2", "r3"]


def test_the_next_tasks_execute_once_their_dispatch_records_land_before_the_tombstones() -> None:
    # Every slot busy, a queue behind them: a burst of results frees the slots and gives them
    # to the next tasks. Their dispatch records go in an append of their own, ahead of the
    # results' tombstones (a lazy append, carried out last): their `execute`s are sent once
    # those records are durable, whether or not the tombstones are; the finished tasks are
    # removed when theirs are.
    sh = started(NodeConfig(node_id="n@pid-1-x", max_workers=2))
    sh.register("t")
    sh.burst(_enqueue_lines("a", "b", "c", "d", task_type="t"))
    assert sh.executed_ids() == ["a", "b"]
    sh.hold_appends = True
    effects = fx.lazy_last(sh.burst(_result_lines("a", "b")))
    appends = [e for e in effects if isinstance(e, fx.Append)]
    assert [e.lazy for e in appends] == [False, True]
    assert [r.fields["task"] for r in appends[0].records] == ["c", "d"]
    assert [r.fields["snerdOutcome"] for r in appends[1].records] == ["completed"] * 2
    assert list(sh.held) == appends  # handed over in this order: dispatch records first
    sh._commit(sh.held.popleft())  # the dispatch records land; the tombstones not yet
    sh._pump()
    assert sh.executed_ids() == ["a", "b", "c", "d"]
    assert set(sh.node.tasks) == {"a", "b", "c", "d"}  # a and b until their tombstones land
    sh.result("c")  # c's tombstone waits behind the held one
    sh.hold_appends = False
    sh.release_held()
    sh.result("d")
    assert sh.node.tasks == {}
    records = sh.log_records()
    kinds = [
        (r.get("snerdKind") or r["snerdOutcome"], r.get("task") or r["taskId"])
        for r in records
        if r.get("snerdKind") == "dispatch" or r.get("deletedAt")
    ]
    assert kinds == [
        ("dispatch", "a"),
        ("dispatch", "b"),
        ("dispatch", "c"),
        ("dispatch", "d"),
        ("completed", "a"),
        ("completed", "b"),
        ("completed", "c"),
        ("completed", "d"),
    ]


def test_a_damaged_base_in_a_merged_append_fails_only_its_own_task() -> None:
    # The shell names the record it could not build; the enqueue and the other retry record
    # in the same append are written without it, and the damaged task is dead-lettered.
    sh = started()
    sh.register("t")
    sh.burst(_enqueue_lines("good", "bad", task_type="t", max_retries=1, retry_after_hours=1))
    loc = sh.node.tasks["bad"].loc
    assert loc is not None
    sh.disk["logs"][0][loc.offset + 5] ^= 0x01  # a flipped bit on disk
    sh.fail_bases = True
    effects = sh.burst([*_result_lines("bad", "good", ok=False), *_enqueue_lines("fresh")])
    appends = [len(e.records) for e in effects if isinstance(e, fx.Append)]
    assert appends == [3]  # one append: two retry records and an enqueue record
    assert [m.get("task_id") for m in sh.messages("ack")][-1] == "fresh"
    assert not sh.messages("error")
    assert set(sh.node.tasks) == {"good", "fresh"}
    retries = [
        r["taskId"] for r in sh.log_records() if r.get("retryCount") == 1 and "deletedAt" not in r
    ]
    assert retries == ["good"]
    (dead,) = [r for r in sh.log_records() if r.get("deletedAt")]
    assert dead["taskId"] == "bad" and dead["snerdOutcome"] == "dead_letter"
    assert "could not rebuild" in dead["LastErrorObj"]


def test_a_damaged_base_among_the_tombstones_of_a_burst_fails_only_its_own_task() -> None:
    # Success tombstones go in a lazy append of their own, after the burst's enqueue record:
    # the one whose base is damaged is dead-lettered, the other completes, and the enqueue
    # is not held back by them.
    sh = started()
    sh.register("t")
    sh.burst(_enqueue_lines("good", "bad", task_type="t"))
    loc = sh.node.tasks["bad"].loc
    assert loc is not None
    sh.disk["logs"][0][loc.offset + 5] ^= 0x01  # a flipped bit on disk
    sh.fail_bases = True
    effects = sh.burst([*_result_lines("bad", "good"), *_enqueue_lines("fresh")])
    appends = [(len(e.records), e.lazy) for e in fx.lazy_last(effects) if isinstance(e, fx.Append)]
    assert appends == [(1, False), (2, True)]
    assert [m.get("task_id") for m in sh.messages("ack")][-1] == "fresh"
    assert not sh.messages("error")
    assert set(sh.node.tasks) == {"fresh"}
    outcomes = {r["taskId"]: r["snerdOutcome"] for r in sh.log_records() if r.get("deletedAt")}
    assert outcomes == {"good": "completed", "bad": "dead_letter"}
    (dead,) = [r for r in sh.log_records() if r.get("snerdOutcome") == "dead_letter"]
    assert "could not rebuild" in dead["LastErrorObj"]


def test_tasks_completed_together_share_one_pending_and_each_is_finished_once() -> None:
    sh = started()
    sh.register("t")
    ids = [f"f{i}" for i in range(6)]
    sh.burst(_enqueue_lines(*ids, task_type="t"))
    effects = sh.burst(_result_lines(*ids))
    (append,) = [e for e in effects if isinstance(e, fx.Append)]
    assert [r.base is not None for r in append.records] == [True] * 6
    assert not sh.node.tasks
    tombs = [r for r in sh.log_records() if r.get("deletedAt")]
    assert [r["taskId"] for r in tombs] == ids
    assert {r["snerdOutcome"] for r in tombs} == {"completed"}
    assert sh.node.stats["total_executed"] == 6
    assert len(sh.node.shards[0].history) == 6


def test_a_full_disk_under_tombstones_of_tasks_completed_together_retries_them_all() -> None:
    sh = started()
    sh.register("t")
    ids = [f"f{i}" for i in range(4)]
    sh.burst(_enqueue_lines(*ids, task_type="t"))
    sh.disk_full = True
    sh.burst(_result_lines(*ids))
    assert set(sh.node.tasks) == set(ids)  # finishing, nothing written
    assert not [r for r in sh.log_records() if r.get("deletedAt")]
    sh.disk_full = False
    sh.advance(2)
    assert not sh.node.tasks
    tombs = [r["taskId"] for r in sh.log_records() if r.get("deletedAt")]
    assert tombs == ids  # each once, in order
    assert not sh.messages("error")


def test_a_damaged_base_among_tasks_completed_together_dead_letters_it_alone() -> None:
    sh = started()
    sh.register("t")
    ids = [f"f{i}" for i in range(5)]
    sh.burst(_enqueue_lines(*ids, task_type="t"))
    loc = sh.node.tasks["f2"].loc
    assert loc is not None
    sh.disk["logs"][0][loc.offset + 5] ^= 0x01  # a flipped bit on disk
    sh.fail_bases = True
    sh.burst(_result_lines(*ids))
    assert not sh.node.tasks
    outcomes = {r["taskId"]: r["snerdOutcome"] for r in sh.log_records() if r.get("deletedAt")}
    assert outcomes == {
        "f0": "completed",
        "f1": "completed",
        "f2": "dead_letter",
        "f3": "completed",
        "f4": "completed",
    }
    assert sh.node.stats["total_dlq"] == 1


def test_a_failed_dispatch_pass_uses_no_attempt_and_runs_each_task_after_the_pause() -> None:
    sh = started()
    sh.burst(_enqueue_lines("d1", "d2", "d3", task_type="t"))  # no handler yet: parked
    sh.disk_full = True
    effects = sh.burst([ev.LineReceived(line=b'{"action":"register","task_type":"t"}')])
    (append,) = [e for e in effects if isinstance(e, fx.Append)]
    assert [r.fields["task"] for r in append.records] == ["d1", "d2", "d3"]  # one pass
    warnings = [m for level, m in sh.logs_out if "dispatch record not written" in m]
    assert [w.split()[1] for w in warnings] == ["d1:", "d2:", "d3:"]
    assert sh.executed_ids() == [] and not sh.node.book.inflight
    sh.disk_full = False
    sh.advance(2)
    assert sh.executed_ids() == ["d1", "d2", "d3"]
    assert [e.attempt for e in sh.executed] == [1, 1, 1]


def test_a_task_without_execute_at_is_ready_at_once_though_the_wall_clock_stepped_back() -> None:
    # Its record says `executeAt` = the wall time at enqueue; a step back before the commit
    # (NTP correcting a fast clock) must not make it wait. One with `execute_at` still waits.
    sh = started(NodeConfig(node_id="test-node@pid-1-aa", max_workers=1))
    sh.register("t")
    sh.enqueue("busy")  # takes the only slot: the others queue
    sh.hold_appends = True
    later = format_rfc3339(sh.wall + 5 * SECOND)
    sh.burst(
        [
            *_enqueue_lines("plain", task_type="t"),
            *_enqueue_lines("urgent", task_type="t", urgency_score=3),
            *_enqueue_lines("timed", task_type="t", execute_at=later),
        ]
    )
    sh.wall -= 10 * SECOND
    sh.hold_appends = False
    sh.release_held()
    assert {sh.node.tasks[t].state.value for t in ("plain", "urgent")} == {"ready"}
    sh.result("busy")
    sh.result("urgent")
    assert sh.executed_ids() == ["busy", "urgent", "plain"]
    sh.result("plain")
    sh.advance(14)
    assert "timed" not in sh.executed_ids()
    sh.advance(2)
    assert sh.executed_ids()[-1] == "timed"


def test_records_another_writer_appends_between_our_read_and_our_claim_are_read_again() -> None:
    # A stale owner's write made late (paused after deciding it, on a filesystem whose lock
    # did not stop us) lands after we read the log and before our claim: every reader takes
    # it (it precedes our fence), so we read the log again before acting for the shard.
    sh = FakeShell()
    sh.hold_appends = True
    sh.start()
    assert sh.held and sh.node.shards[0].phase.value == "fencing"
    stale = {
        "taskId": "late",
        "retryCount": 0,
        "maxRetries": 0,
        "retryAfterHours": 0.0,
        "retryAfterTime": format_rfc3339(sh.wall),
        "taskData": "{}",
        "taskType": "t",
        "executeAt": format_rfc3339(sh.wall),
    }
    sh.disk["logs"].setdefault(0, bytearray()).extend(encode_record(stale))
    sh.hold_appends = False
    sh.release_held()
    assert sh.node.phase is NodePhase.RUNNING and sh.node.owned_shards == [0]
    assert "late" in sh.node.tasks
    assert any("reading it again" in m for _, m in sh.logs_out)
    claims = [r for r in sh.log_records() if r.get("snerdKind") == "claim"]
    assert len(claims) == 1  # no second claim: ours is in the log
    sh.register("t")
    assert sh.executed_ids() == ["late"]


def test_registered_types_are_bounded_because_membership_lists_them() -> None:
    sh = started()
    for n in range(proto.MAX_REGISTERED_TYPES):
        sh.register(f"type-{n}")
    sh.register("type-0")  # registering a type again is fine
    sh.register("one-too-many")
    acks = sh.messages("ack")
    assert len(acks) == proto.MAX_REGISTERED_TYPES + 1
    assert sh.messages("error") == [
        {"action": "error", "message": proto.too_many_task_types("one-too-many")}
    ]
    assert "one-too-many" not in sh.node.book.registered
    assert proto.too_many_task_types("x").startswith("[Snerd] Cannot register task type 'x'")


def _retry_waits(sh: FakeShell, task_id: str) -> list[float]:
    """Each retry record's wait (retryAfterTime minus the wall time of the failure), in s."""
    from snerd.core.timefmt import parse_rfc3339

    waits = []
    for r in sh.log_records():
        if r.get("taskId") == task_id and "LastErrorObj" in r and "deletedAt" not in r:
            waits.append(r["retryAfterTime"])
    return [parse_rfc3339(w) / SECOND for w in waits]


def test_a_task_names_its_own_backoff_and_cap_and_keeps_them_across_a_restart() -> None:
    # The daemon's policy is constant; this task's is exponential, capped at 4 s, from a 1 s
    # base: its n-th retry waits in [1, min(2**(n-1), 4)] s (the core's jittered rule).
    sh = started()
    sh.register("t")
    sh.enqueue("a", max_retries=5, retry_after_hours=1 / 3600, backoff="exponential",
               backoff_max_seconds=4)
    sh.enqueue("c", max_retries=1, retry_after_hours=1 / 3600)  # the daemon's: constant
    record = next(r for r in sh.log_records() if r.get("taskId") == "a")
    assert (record["snerdBackoff"], record["snerdBackoffMax"]) == ("exponential", 4)
    assert "snerdBackoff" not in next(r for r in sh.log_records() if r.get("taskId") == "c")
    failed_at = []
    for attempt in range(1, 4):
        failed_at.append(sh.now().wall / SECOND)
        sh.result("a", ok=False, error=f"boom {attempt}")
        sh.advance(4.1)
    sh.result("c", ok=False, error="once")
    waits = [w - f for w, f in zip(_retry_waits(sh, "a"), failed_at, strict=True)]
    assert 0.99 <= waits[0] <= 1.01  # the first retry waits the base
    assert all(1 <= w <= min(2 ** n, 4) + 0.01 for n, w in enumerate(waits))
    assert any(w > 1.01 for w in waits[1:])  # it grew (jitter above the base)
    # A restart (the process gone, its lease lapsed) reads the policy back from the record.
    sh.disk["locks"].clear()
    sh2 = FakeShell(NodeConfig(node_id="n2@pid-2-b", lock_proves_liveness=True), disk=sh.disk)
    sh2.wall = sh.wall + 40 * SECOND
    sh2.start()
    assert sh2.node.tasks["a"].backoff == ("exponential", 4 * SECOND)
    assert sh2.node.tasks["c"].backoff is None


def test_a_bad_backoff_is_refused_naming_the_field() -> None:
    sh = started()
    sh.enqueue("a", backoff="linear")
    sh.enqueue("b", backoff="exponential", backoff_max_seconds=0)
    errors = {m["task_id"]: m["message"] for m in sh.messages("error")}
    assert "backoff must be one of constant, exponential, got 'linear'" in errors["a"]
    assert "backoff_max_seconds must be at least 1, got 0" in errors["b"]
    assert not sh.node.tasks
