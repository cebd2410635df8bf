"""Dependencies across nodes (`snerd.core.node.parents`): a child waits for each parent
wherever it is — a shard another node owns, an inbox, a history — and fails through a dead
one; a parent no file holds is waited on for a bounded time. Two nodes on one disk, each
owning one of two shards: ids `c1`, `c3`, `c7`, `p1` route to shard 0 (node a), `p2`, `k1`, `k2`
to shard 1 (node b)."""

from __future__ import annotations

from typing import Any

from snerd.core import events as ev
from snerd.core.node import NodeConfig
from snerd.core.node.model import TaskState, route_shard
from snerd.core.records import encode_record
from tests.support.fakeshell import SECOND, FakeShell


def split(**config: Any) -> tuple[FakeShell, FakeShell]:
    a = FakeShell(NodeConfig(node_id="a@pid-1-a", new_queue_shards=2, **config))
    a.start()
    b = FakeShell(NodeConfig(node_id="b@pid-2-b", **config), disk=a.disk)
    b.start()
    round_s = a.node.config.ownership.renew_interval_us / SECOND
    a.advance(round_s)
    b.advance(round_s)
    assert (a.node.owned_shards, b.node.owned_shards) == ([0], [1])
    assert [route_shard(i, 2) for i in ("c1", "c3", "p1", "p2", "k1", "k2")] == [0, 0, 0, 1, 1, 1]
    return a, b


def both(a: FakeShell, b: FakeShell, seconds: float) -> None:
    """Both nodes' clocks move on together, in steps of a tenth of a second."""
    for _ in range(round(seconds * 10)):
        a.advance(0.1)
        b.advance(0.1)


def tombstone(sh: FakeShell, task_id: str, shard: int) -> dict[str, Any]:
    (last,) = [r for r in sh.log_records(shard) if r.get("taskId") == task_id][-1:]
    assert last.get("deletedAt") is not None
    return last


def test_a_child_waits_for_a_parent_another_node_holds_and_runs_once_it_completed() -> None:
    a, b = split()
    a.register("t")
    b.enqueue("p2", task_type="slow")
    a.enqueue("c1", trigger_after_ids=["p2"])
    both(a, b, 2)
    assert a.node.tasks["c1"].state is TaskState.BLOCKED and a.executed_ids() == []
    assert a.scans > 0  # it looked, and saw p2 live
    assert a.node.parents.unknown_since == {}
    b.register("slow")
    b.result("p2")
    assert a.executed_ids() == []
    both(a, b, 0.5)
    assert a.executed_ids() == ["c1"]


def test_a_dead_parent_on_another_node_fails_the_children_and_theirs_through() -> None:
    a, b = split()
    a.register("t")
    b.register("slow")
    b.enqueue("p2", task_type="slow")
    a.enqueue("c1", trigger_after_ids=["p2"])
    a.enqueue("c3", trigger_after_ids=["c1"])  # a grandchild, on the same node
    b.result("p2", ok=False, error="boom")
    both(a, b, 0.5)
    assert a.executed_ids() == [] and a.node.tasks == {}
    assert tombstone(a, "c1", 0)["LastErrorObj"] == "blocked_by_failed_parent: p2"
    assert tombstone(a, "c3", 0)["LastErrorObj"] == "blocked_by_failed_parent: c1"
    dead = {d.task_id: d.error for d in a.dead_letters}
    assert dead == {"c1": "blocked_by_failed_parent: p2", "c3": "blocked_by_failed_parent: c1"}


def test_a_parent_nobody_holds_is_waited_on_for_the_wait_then_fails_the_child() -> None:
    a, b = split(unknown_parent_wait_us=10 * SECOND)
    a.register("t")
    a.enqueue("c1", trigger_after_ids=["nobody"])
    both(a, b, 9.5)
    assert a.node.tasks["c1"].state is TaskState.BLOCKED
    assert "nobody" in a.node.parents.unknown_since
    both(a, b, 1)
    assert "c1" not in a.node.tasks and a.executed_ids() == []
    error = tombstone(a, "c1", 0)["LastErrorObj"]
    assert error == "unknown_parent: nobody (no shard holds it after 10 s)"


def test_a_parent_enqueued_after_its_child_is_waited_for_and_then_run_after() -> None:
    a, b = split(unknown_parent_wait_us=10 * SECOND)
    a.register("t")
    b.register("t")
    a.enqueue("c1", trigger_after_ids=["k1"])
    both(a, b, 5)
    assert "k1" in a.node.parents.unknown_since
    b.enqueue("k1")  # runs on b at once (a handler is there)
    assert b.executed_ids() == ["k1"]
    both(a, b, 7)  # past the wait: k1 is live now, so c1 still waits
    assert a.node.tasks["c1"].state is TaskState.BLOCKED
    assert a.node.parents.unknown_since == {}
    b.result("k1")
    both(a, b, 0.5)
    assert a.executed_ids() == ["c1"]


def test_a_parent_in_this_nodes_history_is_judged_without_a_scan() -> None:
    a, _b = split()
    a.register("t")
    a.enqueue("p1")
    a.result("p1")
    a.enqueue("p3")
    a.result("p3", ok=False, error="no")
    scans = a.scans
    a.enqueue("c1", trigger_after_ids=["p1"])
    assert a.executed_ids()[-1] == "c1"
    a.enqueue("c3", trigger_after_ids=["p3"])
    assert "c3" not in a.node.tasks
    assert tombstone(a, "c3", 0)["LastErrorObj"] == "blocked_by_failed_parent: p3"
    assert a.scans == scans


def test_a_restarted_node_judges_its_blocked_children_again_from_the_files() -> None:
    a, b = split()
    b.enqueue("p2", task_type="slow")
    a.enqueue("c1", trigger_after_ids=["p2"])
    both(a, b, 1)
    b.register("slow")
    b.result("p2")
    # a dies before it looked again (its flock goes with it), and a successor starts: once
    # a's lease has run out one of the two takes shard 0 over, replays c1 as blocked, and
    # finds p2 completed in shard 1's log.
    a.disk["locks"].pop(0)
    a2 = FakeShell(NodeConfig(node_id="a@pid-3-c", new_queue_shards=2), disk=a.disk)
    a2.wall, a2.mono = a.wall, a.mono
    a2.start()
    a2.register("t")
    b.register("t")
    both(a2, b, 45)
    assert sorted(a2.executed_ids() + b.executed_ids()) == ["c1", "p2"]


def test_the_negative_control_counts_an_absent_parent_as_done() -> None:
    a, b = split(unsafe_absent_parents_done=True)
    a.register("t")
    b.enqueue("p2", task_type="slow")
    a.enqueue("c1", trigger_after_ids=["p2"])
    assert a.executed_ids() == ["c1"]  # the wrong rule the watch replaced


def test_a_cycle_across_two_nodes_is_broken_and_each_part_dead_lettered() -> None:
    a, b = split(unknown_parent_wait_us=30 * SECOND)
    a.register("t")
    b.register("t")
    a.enqueue("c1", trigger_after_ids=["k1"])  # k1 is unknown yet: c1 waits for it
    b.enqueue("k1", trigger_after_ids=["c1"])  # c1 lives on a: nobody sees the cycle yet
    assert not a.messages("error") and not b.messages("error")
    both(a, b, 1)
    assert a.node.tasks == {} and b.node.tasks == {}
    assert a.executed_ids() == [] and b.executed_ids() == []
    errors = {tombstone(a, "c1", 0)["LastErrorObj"], tombstone(b, "k1", 1)["LastErrorObj"]}
    assert errors & {"dependency_cycle_through: k1", "dependency_cycle_through: c1"}


def test_a_child_of_a_parent_the_watch_saw_dead_is_failed_through_at_its_next_scan() -> None:
    a, b = split()
    a.register("t")
    b.register("slow")
    b.enqueue("p2", task_type="slow")
    a.enqueue("c1", trigger_after_ids=["p2"])
    both(a, b, 1)
    b.result("p2", ok=False, error="boom")
    both(a, b, 1)
    assert "c1" not in a.node.tasks
    # A child that comes now is failed through too, once a scan says p2 is still dead (a
    # retry may have put it back meanwhile: the last test of this file).
    b.enqueue("c3", trigger_after_ids=["p2"])  # through b's inbox for a's shard
    both(a, b, 1)
    assert "c3" not in a.node.tasks
    assert tombstone(a, "c3", 0)["LastErrorObj"] == "blocked_by_failed_parent: p2"


def _started() -> FakeShell:
    sh = FakeShell()
    sh.start()
    sh.register("t")
    return sh


def _finished_elsewhere(sh: FakeShell, task_id: str) -> None:
    """A completed tombstone of `task_id` lands in shard 0's log, written by another daemon
    (nothing this node holds or saw finish)."""
    tombstone = {
        "taskId": task_id,
        "taskType": "t",
        "deletedAt": "2027-01-01T00:00:00.000000Z",
        "snerdOutcome": "completed",
    }
    sh.disk["logs"].setdefault(0, bytearray()).extend(encode_record(tombstone))


def test_a_child_of_a_parent_finished_elsewhere_runs_once_the_watch_reads_it() -> None:
    sh = _started()
    _finished_elsewhere(sh, "far")
    sh.enqueue("c1", trigger_after_ids=["far"])
    sh.advance(1)
    assert "c1" in sh.executed_ids()
    assert sh.node.parents.watch.state("far") == "completed"  # read by the watch, not known here


def test_a_child_of_two_parents_nobody_holds_is_dead_lettered_once_after_the_wait() -> None:
    # Seed 9 of the simulator again: both parents' waits ran out at one tick; failing the
    # child through the first left the second without children, and the tick then failed
    # on it (KeyError).
    sh = _started()
    sh.enqueue("c", trigger_after_ids=["ghost1", "ghost2"])
    sh.advance(30)
    assert "c" in sh.node.tasks
    sh.advance(31)
    assert "c" not in sh.node.tasks and "c" not in sh.executed_ids()
    [tomb] = [r for r in sh.log_records() if r.get("taskId") == "c" and r.get("deletedAt")]
    assert tomb["snerdOutcome"] == "dead_letter"
    assert tomb["LastErrorObj"].startswith("unknown_parent: ghost1 ")


def test_a_later_child_of_a_parent_the_watch_already_found_completed_runs_too() -> None:
    # Seed 9 of the simulator: once the first child went on, nothing was watched, so no scan
    # renamed the ids and the watch kept "far" reported completed; a second child of "far"
    # then waited for a change that never came.
    sh = _started()
    _finished_elsewhere(sh, "far")
    sh.enqueue("c1", trigger_after_ids=["far"])
    sh.advance(1)
    sh.result("c1")
    sh.enqueue("c2", trigger_after_ids=["far"])
    sh.advance(1)
    assert "c2" in sh.executed_ids()


def test_a_parent_that_comes_to_this_node_during_the_wait_stops_the_wait() -> None:
    # Simulator seed 157: a child enqueued before its parent; the parent was not found at
    # first (its wait began), then enqueued on this very node. The watch skips parents this
    # node holds, so the wait was never called off, and the child was dead-lettered as
    # `unknown_parent` while its parent sat in this node's own shard.
    sh = _started()
    sh.enqueue("c", trigger_after_ids=["p"])
    sh.advance(1)
    assert sh.node.parents.unknown_since  # no file holds "p": its wait began
    sh.enqueue("p", task_type="slow")  # no handler yet: it stays pending here
    sh.advance(61)
    assert "c" in sh.node.tasks and "c" not in sh.executed_ids()
    sh.register("slow")
    sh.result("p")
    assert "c" in sh.executed_ids()


def _put_back_elsewhere(sh: FakeShell, task_id: str, shard: int) -> None:
    """A fresh live record of `task_id` lands in `shard`'s log, written by another daemon: a
    retry there put the dead letter back."""
    record = {"taskId": task_id, "taskType": "slow", "retryCount": 0}
    sh.disk["logs"].setdefault(shard, bytearray()).extend(encode_record(record))


def test_a_dead_letter_in_the_history_of_a_shard_given_up_is_not_the_parents_word() -> None:
    # Simulator seed 216 (commands in worlds with dependencies): a node had seen a parent
    # dead-lettered in a shard it owned, then gave the shard up; the next owner retried the
    # parent. The node still read the shard's history it had kept, and failed every child of
    # the parent through (retried or new, even after the parent completed).
    sh = FakeShell(NodeConfig(node_id="a@pid-1-a", new_queue_shards=2))
    sh.start()
    sh.advance(sh.node.config.ownership.renew_interval_us / SECOND)
    assert sh.node.owned_shards == [0, 1]
    sh.register("t")
    sh.enqueue("p1")
    sh.result("p1", ok=False, error="boom")  # dead-lettered (no retries), in shard 0
    sh.feed(ev.LockLost(shard=0, error="Input/output error (EIO)"))
    assert sh.node.owned_shards == [1]
    _put_back_elsewhere(sh, "p1", 0)
    sh.enqueue("k1", trigger_after_ids=["p1"])  # in shard 1, which it still owns
    assert sh.node.tasks["k1"].state is TaskState.BLOCKED
    sh.advance(1)
    assert sh.node.tasks["k1"].state is TaskState.BLOCKED  # the files say p1 is live
    assert sh.node.parents.watch.state("p1") == "live"


def test_a_child_of_a_parent_retried_since_the_watch_saw_it_dead_waits_for_it() -> None:
    # The watch's word on a parent no child waits on any more is not kept current: a retry
    # may have put the parent back since. A child that comes later waits for a scan.
    a, b = split()
    a.register("t")
    b.register("slow")
    b.enqueue("p2", task_type="slow")
    a.enqueue("c1", trigger_after_ids=["p2"])
    both(a, b, 1)
    b.result("p2", ok=False, error="boom")
    both(a, b, 1)
    assert "c1" not in a.node.tasks  # failed through
    assert a.node.parents.watch.state("p2") == "dead"  # what it last read, and keeps
    b.line({"action": "retry", "task_id": "p2"})
    assert b.messages("retried")[-1]["retried"] is True
    assert b.executed_ids() == ["p2", "p2"]
    # Two children, taken in by one ingest (through b's inbox for a's shard): the second
    # comes while the first waits, before any scan (simulator seed 307).
    b.enqueue("c3", trigger_after_ids=["p2"])
    b.enqueue("c7", trigger_after_ids=["p2"])
    both(a, b, 1)
    assert a.node.tasks["c3"].state is TaskState.BLOCKED
    assert a.node.tasks["c7"].state is TaskState.BLOCKED
    b.result("p2")
    both(a, b, 1)
    assert sorted(a.executed_ids()) == ["c3", "c7"]
