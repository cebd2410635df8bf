"""snerd.core.node.parents: children wait on parents this node does not hold, by the watch."""

from __future__ import annotations

from snerd.core.records import encode_record
from tests.support.fakeshell import FakeShell


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
