"""Job control in the node (`snerd.core.control`, `snerd.core.node.control`): cancel, retry
and pause, decided by the owner of the task's shard, here or through the inboxes of other
daemons, durable before they are answered, and kept across a restart."""

from __future__ import annotations

from typing import Any

from snerd.core.node import NodeConfig
from tests.core.node.test_inbox import pair
from tests.support.fakeshell import SECOND, FakeShell


def started(**config: Any) -> FakeShell:
    sh = FakeShell(NodeConfig(node_id="n@pid-1-x", **config))
    sh.start()
    return sh


def answer(sh: FakeShell, action: str) -> dict[str, Any]:
    return sh.messages(action)[-1]


def tombstone(sh: FakeShell, task_id: str) -> dict[str, Any]:
    (record,) = [
        r for r in sh.log_records() if r.get("taskId") == task_id and r.get("deletedAt")
    ]
    return record


# -- cancel, on the owner


def test_a_queued_task_cancelled_never_runs_and_ends_cancelled_in_the_log() -> None:
    sh = started()
    sh.enqueue("a")  # no handler yet: it waits
    sh.line({"action": "cancel", "task_id": "a"})
    reply = answer(sh, "cancelled")
    assert reply == {
        "action": "cancelled",
        "task_id": "a",
        "found": "queued",
        "cancelled": True,
        "shard": "shard-0",
    }
    assert tombstone(sh, "a")["snerdOutcome"] == "cancelled"
    sh.register("t")
    sh.advance(1)
    assert sh.executed_ids() == []
    assert "a" not in sh.node.tasks


def test_the_ignore_cancel_control_answers_cancelled_and_leaves_the_task_to_run() -> None:
    """`unsafe_ignore_cancel` (the simulator's negative control) lies: the answer says
    cancelled, nothing is written, and the task runs."""
    sh = started(unsafe_ignore_cancel=True)
    sh.enqueue("a")
    sh.line({"action": "cancel", "task_id": "a"})
    assert answer(sh, "cancelled")["cancelled"] is True
    sh.register("t")
    sh.advance(1)
    assert sh.executed_ids() == ["a"]


def test_a_delayed_task_is_found_delayed_and_a_retrying_one_retrying() -> None:
    sh = started()
    sh.register("t")
    sh.enqueue("later", execute_at="2099-01-01T00:00:00Z")
    sh.enqueue("flaky", max_retries=3, retry_after_hours=1.0)
    sh.result("flaky", ok=False, error="boom")
    sh.line({"action": "cancel", "task_id": "later"})
    sh.line({"action": "cancel", "task_id": "flaky"})
    found = {m["task_id"]: m["found"] for m in sh.messages("cancelled")}
    assert found == {"later": "delayed", "flaky": "retrying"}
    sh.advance(2 * 3600)
    assert sh.executed_ids() == ["flaky"]  # its first attempt only


def test_a_running_task_is_stopped_and_its_late_result_is_dropped_without_an_error() -> None:
    sh = started()
    sh.line({"action": "register", "task_type": "t", "cancellable": True})
    sh.enqueue("a", max_retries=5)
    assert sh.executed_ids() == ["a"]
    sh.line({"action": "cancel", "task_id": "a"})
    assert answer(sh, "cancelled")["found"] == "running"
    assert [(s.task_id, s.attempt) for s in sh.stopped] == [("a", 1)]
    sh.result("a", ok=False, error="stopped")
    assert sh.messages("error") == []
    sh.advance(60)
    assert sh.executed_ids() == ["a"]  # not retried
    assert tombstone(sh, "a")["snerdOutcome"] == "cancelled"


def test_a_handler_not_registered_cancellable_is_not_told_to_stop() -> None:
    sh = started()
    sh.register("t")  # an upstream SDK: it knows no `cancel` message
    sh.enqueue("a")
    sh.line({"action": "cancel", "task_id": "a"})
    assert answer(sh, "cancelled")["cancelled"] is True
    assert sh.stopped == []


def test_a_finished_or_unknown_task_is_said_so_and_nothing_is_written() -> None:
    sh = started()
    sh.register("t")
    sh.enqueue("done")
    sh.result("done")
    before = len(sh.log_records())
    sh.line({"action": "cancel", "task_id": "done"})
    sh.line({"action": "cancel", "task_id": "nobody"})
    replies = {m["task_id"]: (m["found"], m["cancelled"]) for m in sh.messages("cancelled")}
    assert replies == {"done": ("succeeded", False), "nobody": ("unknown", False)}
    assert len(sh.log_records()) == before


def test_a_cancel_while_the_enqueue_is_in_flight_waits_for_it_then_cancels() -> None:
    sh = started()
    sh.hold_appends = True
    sh.enqueue("a")
    sh.line({"action": "cancel", "task_id": "a"})
    assert sh.messages("cancelled") == []
    sh.hold_appends = False
    sh.release_held()
    sh.advance(0.1)
    assert answer(sh, "cancelled")["found"] == "queued"
    assert answer(sh, "cancelled")["cancelled"] is True


def test_children_of_a_cancelled_parent_fail_through() -> None:
    sh = started()
    sh.enqueue("parent")
    sh.enqueue("child", trigger_after_ids=["parent"])
    sh.line({"action": "cancel", "task_id": "parent"})
    assert tombstone(sh, "child")["LastErrorObj"] == "blocked_by_failed_parent: parent"


def test_a_cancelled_task_stays_cancelled_after_a_restart() -> None:
    sh = started()
    sh.enqueue("a")
    sh.line({"action": "cancel", "task_id": "a"})
    again = FakeShell(sh.config, disk=sh.disk)
    again.start()
    again.register("t")
    again.advance(1)
    assert again.executed_ids() == []
    again.line({"action": "cancel", "task_id": "a"})
    assert answer(again, "cancelled")["found"] == "cancelled"


# -- retry


def test_a_dead_letter_is_put_back_with_its_attempts_reset_and_runs_again() -> None:
    sh = started()
    sh.register("t")
    sh.enqueue("a", max_retries=0)
    sh.result("a", ok=False, error="boom")
    assert sh.dead_letters
    sh.line({"action": "retry", "task_id": "a"})
    reply = answer(sh, "retried")
    assert (reply["found"], reply["retried"]) == ("dead_letter", True)
    assert sh.executed_ids() == ["a", "a"]
    assert sh.executed[-1].attempt == 1
    sh.result("a")
    assert tombstone_outcomes(sh, "a") == ["dead_letter", "completed"]


def test_a_dead_letter_whose_payload_has_a_live_twin_is_not_put_back() -> None:
    """auto_dedupe: two pending tasks may not share a fingerprint (simulator seed 17)."""
    sh = started()
    sh.register("t")
    sh.enqueue("a", data={"p": 1}, auto_dedupe=True)
    sh.result("a", ok=False, error="boom")
    sh.enqueue("c", data={"p": 1}, auto_dedupe=True)  # a's twin: live (a is finished)
    assert "c" in sh.node.tasks
    sh.line({"action": "retry", "task_id": "a"})
    reply = answer(sh, "retried")
    assert (reply["found"], reply["retried"]) == ("dead_letter", False)
    assert tombstone_outcomes(sh, "a") == ["dead_letter"]


def tombstone_outcomes(sh: FakeShell, task_id: str) -> list[str]:
    return [
        r["snerdOutcome"]
        for r in sh.log_records()
        if r.get("taskId") == task_id and r.get("deletedAt")
    ]


def test_a_retry_of_a_live_or_succeeded_task_changes_nothing() -> None:
    sh = started()
    sh.register("t")
    sh.enqueue("live")
    sh.enqueue("ok")
    sh.result("ok")
    sh.line({"action": "retry", "task_id": "live"})
    sh.line({"action": "retry", "task_id": "ok"})
    replies = {m["task_id"]: (m["found"], m["retried"]) for m in sh.messages("retried")}
    assert replies == {"live": ("running", False), "ok": ("succeeded", False)}


def test_a_cancelled_task_can_be_put_back() -> None:
    sh = started()
    sh.enqueue("a")
    sh.line({"action": "cancel", "task_id": "a"})
    sh.line({"action": "retry", "task_id": "a"})
    assert answer(sh, "retried")["found"] == "cancelled"
    sh.register("t")
    assert sh.executed_ids() == ["a"]


# -- pause


def test_a_paused_type_is_not_dispatched_until_resumed_and_enqueues_are_still_taken() -> None:
    sh = started()
    sh.register("t")
    sh.register("u")
    sh.line({"action": "pause", "task_type": "t"})
    reply = answer(sh, "paused")
    assert reply == {
        "action": "paused",
        "task_type": "t",
        "paused": True,
        "shards": 1,
        "pending": [],
    }
    sh.enqueue("a")
    sh.enqueue("b", task_type="u")
    assert sh.messages("ack")[-1]["task_id"] == "b"
    assert sh.executed_ids() == ["b"]
    sh.line({"action": "stats"})
    assert answer(sh, "stats")["paused_types"] == ["t"]
    sh.line({"action": "resume", "task_type": "t"})
    assert answer(sh, "paused")["paused"] is False
    assert sh.executed_ids() == ["b", "a"]


def test_pausing_the_whole_queue_holds_every_type_and_survives_a_restart() -> None:
    sh = started()
    sh.line({"action": "pause", "queue": True})
    assert answer(sh, "paused")["task_type"] is None
    sh.enqueue("a")
    again = FakeShell(sh.config, disk=sh.disk)
    again.start()
    again.register("t")
    again.advance(1)
    assert again.executed_ids() == []
    again.line({"action": "resume", "queue": True})
    assert again.executed_ids() == ["a"]


def test_a_pause_survives_compaction() -> None:
    sh = started(compact_min_bytes=1, compact_dead_ratio=1, history_limit=1)
    sh.register("t")
    sh.line({"action": "pause", "task_type": "p"})
    for i in range(50):
        sh.enqueue(f"x{i}")
        sh.result(f"x{i}")
    assert len(sh.log_records()) < 20  # compacted: 152 records were written
    again = FakeShell(sh.config, disk=sh.disk)
    again.start()
    again.register("p")
    again.enqueue("held", task_type="p")
    again.advance(1)
    assert "held" not in again.executed_ids()
    pauses = [r for r in again.log_records() if r.get("snerdKind") == "pause"]
    assert pauses


def test_a_resume_stamped_before_the_pause_does_not_undo_it() -> None:
    sh = started()
    sh.register("t")
    sh.line({"action": "pause", "task_type": "t"})
    stamp = sh.node.control.marks[0]["t"].stamp
    from snerd.core.control import PauseMark

    sh.node.control.set_pause(0, "t", PauseMark(False, (stamp[0] - 1, "zz")), 0)
    assert sh.node.control.marks[0]["t"].paused is True


def test_bad_control_lines_get_a_clear_error() -> None:
    sh = started()
    sh.line({"action": "cancel"})
    sh.line({"action": "pause"})
    sh.line({"action": "pause", "task_type": "t", "queue": True})
    sh.line({"action": "retry", "task_id": 7})
    errors = [m["message"] for m in sh.messages("error")]
    assert errors == [
        "Invalid JSON: missing field `task_id`",
        'Invalid JSON: missing field `task_type` (or `"queue": true` for every type)',
        'Invalid JSON: give `task_type` or `"queue": true`, not both',
        "Invalid JSON: field `task_id` must be a string, got integer",
    ]


# -- through another daemon's inbox


def test_a_cancel_sent_to_a_daemon_without_the_shard_is_decided_by_the_owner() -> None:
    owner, other = pair()
    owner.enqueue("a")  # no handler: it waits
    other.line({"action": "cancel", "task_id": "a"})
    assert other.messages("cancelled") == []
    for _ in range(20):
        owner.advance(0.1)
        other.advance(0.1)
    reply = answer(other, "cancelled")
    assert (reply["found"], reply["cancelled"], reply["shard"]) == ("queued", True, "shard-0")
    assert tombstone(owner, "a")["snerdOutcome"] == "cancelled"
    marks = [r for r in owner.log_records() if r.get("snerdKind") == "inbox"]
    assert marks[-1]["answers"][0]["found"] == "queued"


def test_a_cancel_of_an_unknown_id_through_the_inbox_says_unknown() -> None:
    owner, other = pair()
    other.line({"action": "cancel", "task_id": "ghost"})
    for _ in range(20):
        owner.advance(0.1)
        other.advance(0.1)
    assert (answer(other, "cancelled")["found"], answer(other, "cancelled")["cancelled"]) == (
        "unknown",
        False,
    )


def test_a_command_no_owner_answers_in_time_is_answered_pending() -> None:
    owner, other = pair()
    other.line({"action": "cancel", "task_id": "a"})
    other.advance(6)  # the owner never reads its inbox meanwhile
    reply = answer(other, "cancelled")
    assert reply.get("pending") is True and reply["found"] == "unknown"
    owner.enqueue("b")
    assert owner.messages("ack")


def test_a_pause_through_the_inbox_holds_the_owner_and_is_answered_once_applied() -> None:
    owner, other = pair()
    owner.register("t")
    other.line({"action": "pause", "task_type": "t"})
    for _ in range(20):
        owner.advance(0.1)
        other.advance(0.1)
    assert answer(other, "paused")["pending"] == []
    owner.enqueue("a")
    owner.advance(1)
    assert owner.executed_ids() == []
    other.line({"action": "resume", "task_type": "t"})
    for _ in range(20):
        owner.advance(0.1)
        other.advance(0.1)
    assert answer(other, "paused")["paused"] is False
    assert owner.executed_ids() == ["a"]


def test_a_retry_through_the_inbox_puts_the_dead_letter_back_on_its_owner() -> None:
    owner, other = pair()
    owner.register("t")
    owner.enqueue("a", max_retries=0)
    owner.result("a", ok=False, error="boom")
    other.line({"action": "retry", "task_id": "a"})
    for _ in range(30):
        owner.advance(0.1)
        other.advance(0.1)
    reply = answer(other, "retried")
    assert (reply["found"], reply["retried"]) == ("dead_letter", True)
    assert owner.executed_ids() == ["a", "a"]


def test_the_answer_waits_for_the_configured_command_wait() -> None:
    _owner, other = pair(NodeConfig(node_id="other@pid-2-b", command_wait_us=SECOND))
    other.line({"action": "pause", "task_type": "t"})
    other.advance(1.5)
    assert answer(other, "paused")["pending"] == ["shard-0"]


# -- get


def test_get_answers_a_tasks_state_attempts_error_times_and_result() -> None:
    sh = started()
    sh.register("t")
    sh.enqueue("a", max_retries=2, retry_after_hours=0.001)
    sh.result("a", ok=False, error="boom")
    sh.line({"action": "get", "task_id": "a"})
    info = answer(sh, "task")
    assert (info["task_id"], info["found"], info["state"]) == ("a", True, "retrying")
    assert (info["attempts"], info["last_error"], info["shard"]) == (1, "boom", "shard-0")
    assert info["enqueued_at"] is not None and info["finished_at"] is None
    sh.advance(5)
    sh.line({"action": "result", "task_id": "a", "status": "success", "result": {"sent": 3}})
    sh.line({"action": "get", "task_id": "a"})
    info = answer(sh, "task")
    assert (info["state"], info["outcome"]) == ("succeeded", "completed")
    assert info["result"] == {"sent": 3}
    assert info["attempts"] == 2 and info["finished_at"] is not None


def test_get_of_a_running_task_on_its_owner_says_running_and_an_unknown_id_not_found() -> None:
    sh = started()
    sh.register("t")
    sh.enqueue("a")
    sh.line({"action": "get", "task_id": "a"})
    assert answer(sh, "task")["state"] == "running"
    sh.line({"action": "get", "task_id": "ghost"})
    info = answer(sh, "task")
    assert (info["found"], info["state"]) == (False, "unknown")


def test_get_of_a_running_task_shows_its_latest_progress_until_the_attempt_ends() -> None:
    sh = started()
    sh.register("t")
    sh.enqueue("a", max_retries=1)
    sh.line({"action": "get", "task_id": "a"})
    assert answer(sh, "task")["progress"] is None
    sh.line({"action": "progress", "task_id": "a", "data": {"done": 1}})
    sh.line({"action": "progress", "task_id": "a", "data": {"done": 2}})
    sh.line({"action": "get", "task_id": "a"})
    assert answer(sh, "task")["progress"] == {"done": 2}
    sh.result("a", ok=False, error="boom")  # the attempt ended: its progress is not shown
    sh.line({"action": "get", "task_id": "a"})
    assert answer(sh, "task")["progress"] is None
    sh.line({"action": "progress", "task_id": "ghost", "data": 1})  # (not held: not kept)
    assert "ghost" not in sh.node.control.progress


def test_get_finds_a_task_another_daemon_holds_and_a_cancelled_one() -> None:
    owner, other = pair()
    owner.enqueue("a")
    other.line({"action": "get", "task_id": "a"})
    assert (answer(other, "task")["state"], answer(other, "task")["shard"]) == ("queued", "shard-0")
    owner.line({"action": "cancel", "task_id": "a"})
    other.line({"action": "get", "task_id": "a"})
    assert answer(other, "task")["state"] == "cancelled"


# -- sweeps: purge, and retry of a type's dead letters


def dead(sh: FakeShell, task_id: str, task_type: str = "t") -> None:
    sh.enqueue(task_id, task_type=task_type, max_retries=0)
    sh.result(task_id, ok=False, error="boom")


def test_a_purge_forgets_the_dead_letters_before_its_time_and_keeps_the_rest() -> None:
    sh = started()
    sh.register("t")
    sh.register("u")
    dead(sh, "old")
    sh.enqueue("fine")
    sh.result("fine")  # succeeded: a purge never takes it
    sh.advance(3600)
    cutoff = sh.node.wall_text()
    sh.advance(10)
    dead(sh, "new")  # after the cutoff
    dead(sh, "other", "u")
    sh.enqueue("gone")
    sh.line({"action": "cancel", "task_id": "gone"})  # (a cancel finishes it while it runs)
    sh.line({"action": "purge", "queue": True, "before": cutoff})
    reply = answer(sh, "purged")
    assert reply == {
        "action": "purged", "task_type": None, "before": cutoff, "count": 1, "shards": 1,
        "pending": [],
    }
    sh.line({"action": "retry", "task_id": "old"})
    assert answer(sh, "retried")["found"] == "unknown"
    # Only the type asked for, and whenever it finished: "new" and the cancelled "gone"
    # stay, as type "t"'s; "other" of type "u" goes.
    sh.line({"action": "purge", "task_type": "u"})
    assert answer(sh, "purged")["count"] == 1
    history = sh.node.shards[0].history
    assert set(history) == {"fine", "new", "gone"}
    # Durable: a restart (the fold of the log) forgets the same ones.
    again = FakeShell(sh.config, disk=sh.disk)
    again.start()
    assert set(again.node.shards[0].history) == {"fine", "new", "gone"}


def test_a_purge_survives_compaction_and_drops_the_tombstones() -> None:
    sh = started(compact_min_bytes=1, compact_dead_ratio=1, history_limit=40)
    sh.register("t")
    for i in range(3):
        dead(sh, f"d{i}")
    sh.line({"action": "purge", "task_type": "t"})
    assert answer(sh, "purged")["count"] == 3
    for i in range(30):  # (enough dead bytes for a compaction)
        sh.enqueue(f"x{i}")
        sh.result(f"x{i}")
    # Compacted (the purge record is not kept), and the history (40) would have kept them.
    assert not [r for r in sh.log_records() if r.get("snerdKind") == "purge"]
    ids = {r.get("taskId") for r in sh.log_records()}
    assert "x0" in ids and not ids & {"d0", "d1", "d2"}
    again = FakeShell(sh.config, disk=sh.disk)
    again.start()
    assert len(again.node.shards[0].history) == 30


def test_the_purge_all_control_also_forgets_succeeded_tasks() -> None:
    sh = started(unsafe_purge_all=True)
    sh.register("t")
    sh.enqueue("ok")
    sh.result("ok")
    sh.line({"action": "purge", "queue": True, "before": "2000-01-01T00:00:00Z"})
    assert answer(sh, "purged")["count"] == 1


def test_a_retry_by_type_puts_back_every_dead_letter_of_it_and_no_other() -> None:
    sh = started()
    sh.register("t")
    sh.register("u")
    dead(sh, "a")
    dead(sh, "b")
    dead(sh, "c", "u")
    sh.enqueue("x")
    sh.line({"action": "cancel", "task_id": "x"})  # cancelled: a retry by type leaves it
    sh.line({"action": "retry", "task_type": "t"})
    reply = answer(sh, "requeued")
    assert (reply["count"], reply["task_type"], reply["pending"]) == (2, "t", [])
    assert sorted(sh.executed_ids()) == ["a", "a", "b", "b", "c", "x"]
    assert set(sh.node.shards[0].history) == {"c", "x"}


def test_sweeps_through_the_inbox_are_decided_and_counted_by_the_owner() -> None:
    owner, other = pair()
    owner.register("t")
    dead(owner, "a")
    dead(owner, "b")
    other.line({"action": "retry", "task_type": "t"})
    for _ in range(30):
        owner.advance(0.1)
        other.advance(0.1)
    assert answer(other, "requeued")["count"] == 2
    assert sorted(owner.executed_ids()) == ["a", "a", "b", "b"]
    owner.result("a", ok=False, error="again")
    other.line({"action": "purge", "queue": True})
    for _ in range(30):
        owner.advance(0.1)
        other.advance(0.1)
    assert answer(other, "purged")["count"] == 1
    assert "a" not in owner.node.shards[0].history
    marks = [r for r in owner.log_records() if r.get("snerdKind") == "inbox"]
    assert marks[-1]["answers"][-1]["count"] == 1


def test_bad_sweep_lines_get_a_clear_error() -> None:
    sh = started()
    for line, text in [
        ({"action": "purge"}, "missing field `task_type`"),
        ({"action": "purge", "queue": True, "before": "yesterday"}, "invalid before"),
        ({"action": "retry"}, "missing field `task_id`"),
        ({"action": "retry", "task_type": ""}, "must not be empty"),
    ]:
        sh.line(line)
        assert text in sh.messages("error")[-1]["message"], line
