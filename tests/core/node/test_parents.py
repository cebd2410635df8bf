"""Dependencies across nodes (`snerd.core.node.parents`): a child waits for each parent
wherever it is — a shard another node owns, an inbox, a history — and fails through a dead
one; a parent no file holds is waited on for a bounded time. Two nodes on one disk, each
owning one of two shards: ids `c1`, `c3`, `p1` route to shard 0 (node a), `p2`, `k1`, `k2`
to shard 1 (node b)."""

from __future__ import annotations

from typing import Any

from snerd.core.node import NodeConfig
from snerd.core.node.model import TaskState, route_shard
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


def test_a_child_of_a_parent_the_watch_saw_end_is_judged_at_once() -> None:
    a, b = split()
    a.register("t")
    b.register("slow")
    b.enqueue("p2", task_type="slow")
    a.enqueue("c1", trigger_after_ids=["p2"])
    both(a, b, 1)
    b.result("p2", ok=False, error="boom")
    both(a, b, 1)
    assert "c1" not in a.node.tasks
    # p2 is still what the watch last read; a child that comes now is failed through too.
    b.enqueue("c3", trigger_after_ids=["p2"])  # through b's inbox for a's shard
    both(a, b, 1)
    assert "c3" not in a.node.tasks
    assert tombstone(a, "c3", 0)["LastErrorObj"] == "blocked_by_failed_parent: p2"
