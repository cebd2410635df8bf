"""Dedupe (`snerd.core.dedupe`, `TaskBook.twin`, `snerd.core.node.verdicts`): a chosen key and
period, a fingerprint that ignores key order, and an honest answer for every enqueue, also
one that went into another daemon's inbox."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from snerd.core.dedupe import fingerprint, unique_fingerprint
from snerd.core.node import NodeConfig
from tests.core.node.test_inbox import inbox_records, pair
from tests.support.fakeshell import SECOND, FakeShell


def started(**config: Any) -> FakeShell:
    sh = FakeShell(NodeConfig(node_id="n@pid-1-x", **config))
    sh.start()
    return sh


def ack(sh: FakeShell, task_id: str) -> dict[str, Any]:
    (found,) = [m for m in sh.messages("ack") if m.get("task_id") == task_id]
    return found


def test_the_payload_fingerprint_reads_json_in_canonical_form() -> None:
    assert fingerprint("t", '{"a":1,"b":2}') == fingerprint("t", '{ "b": 2, "a": 1 }')
    assert fingerprint("t", '{"a":1}') != fingerprint("t", '{"a":2}')
    assert fingerprint("t", '{"a":1}') != fingerprint("u", '{"a":1}')
    assert fingerprint("t", "not json {") == fingerprint("t", "not json {")
    assert fingerprint("t", "not json {") != fingerprint("t", "not json  {")
    assert unique_fingerprint("t", "k") != unique_fingerprint("u", "k")
    assert unique_fingerprint("t", "k") != fingerprint("t", "k")


def test_two_enqueues_of_one_payload_in_another_key_order_are_one_task() -> None:
    sh = started()
    sh.line(_enqueue("a", '{"x":1,"y":[1,2]}', auto_dedupe=True))
    sh.line(_enqueue("b", '{"y": [1, 2], "x": 1}', auto_dedupe=True))
    assert set(sh.node.tasks) == {"a"}
    assert ack(sh, "b")["deduplicated"] is True and ack(sh, "b")["duplicate_of"] == "a"
    assert "deduplicated" not in ack(sh, "a")


def test_a_unique_key_dedupes_whatever_the_data_within_its_type() -> None:
    sh = started()
    sh.enqueue("a", data={"v": 1}, unique_key="user-7")
    sh.enqueue("b", data={"v": 2}, unique_key="user-7")
    sh.enqueue("c", task_type="other", data={"v": 1}, unique_key="user-7")
    sh.enqueue("d", data={"v": 1}, unique_key="user-8")
    assert set(sh.node.tasks) == {"a", "c", "d"}
    assert ack(sh, "b")["duplicate_of"] == "a"


def test_unique_until_started_lets_an_enqueue_in_once_its_twin_runs() -> None:
    sh = started()
    sh.enqueue("a", unique_key="k", unique_until="started")
    sh.enqueue("b", unique_key="k", unique_until="started")
    assert set(sh.node.tasks) == {"a"}  # a waits for a handler: not started
    sh.register("t")
    assert sh.executed_ids() == ["a"]
    sh.enqueue("c", unique_key="k", unique_until="started")  # a runs: c is its own task
    sh.enqueue("d", unique_key="k")  # ... but the default still sees a running twin
    assert set(sh.node.tasks) == {"a", "c"}
    assert ack(sh, "d")["duplicate_of"] == "a"


def test_unique_until_seconds_counts_a_twin_that_finished_that_recently() -> None:
    sh = started()
    sh.register("t")
    sh.enqueue("a", unique_key="k")
    sh.result("a")
    sh.enqueue("b", unique_key="k")  # the default: a finished, b is its own task
    sh.result("b")
    sh.advance(5)
    sh.enqueue("c", unique_key="k", unique_until=10)
    assert ack(sh, "c")["duplicate_of"] == "b"
    # Remembered across a restart (from the tombstones the log keeps): the old node died
    # (its flock with it), and the new one takes the shard over once the lease ran out.
    sh.disk["locks"].clear()
    again = FakeShell(NodeConfig(node_id="n@pid-2-y"), disk=sh.disk)
    again.wall, again.mono = sh.wall, sh.mono
    again.start()
    again.advance(40)
    assert again.node.owned_shards == [0]
    again.register("t")
    again.enqueue("d", unique_key="k", unique_until=100)
    assert ack(again, "d")["duplicate_of"] == "b"
    again.advance(60)
    again.enqueue("e", unique_key="k", unique_until=100)
    assert "deduplicated" not in ack(again, "e")
    assert again.executed_ids() == ["e"]


def test_an_enqueue_through_an_inbox_is_acked_with_its_owners_decision() -> None:
    owner, other = pair()
    owner.enqueue("first", unique_key="k")
    other.enqueue("second", unique_key="k")
    other.enqueue("third", unique_key="j")
    other.enqueue("first", data={"x": 1}, auto_dedupe=True)  # its id is pending there
    assert other.messages("ack") == [] and other.messages("error") == []
    owner.advance(0.15)  # the owner ingests other's inbox
    other.advance(0.1)  # other reads the owner's answer in its log
    assert ack(other, "second")["duplicate_of"] == "first"
    assert "deduplicated" not in ack(other, "third")
    (error,) = other.messages("error")
    assert error["task_id"] == "first" and "already pending" in error["message"]
    assert set(owner.node.tasks) == {"first", "third"}
    stats = other.node.stats
    assert (stats["total_enqueued"], stats["total_deduplicated"]) == (2, 1)


def test_an_undecided_enqueue_is_acked_as_such_after_the_wait() -> None:
    owner, other = pair(NodeConfig(node_id="other@pid-2-b", dedupe_wait_us=2 * SECOND))
    other.enqueue("second", unique_key="k")
    other.advance(1.9)  # the owner does not look meanwhile (its clock stands still)
    assert other.messages("ack") == []
    other.advance(0.2)
    assert ack(other, "second")["deduplicated"] is None
    owner.advance(0.15)  # taken in later, as a task of its own
    assert "second" in owner.node.tasks


def test_without_a_wait_an_inbox_enqueue_is_acked_at_its_write_as_upstream_did() -> None:
    _owner, other = pair(NodeConfig(node_id="other@pid-2-b", dedupe_wait_us=0))
    other.enqueue("second", unique_key="k")
    assert "deduplicated" not in ack(other, "second")


def test_the_owner_honours_the_scope_written_in_an_inbox_record() -> None:
    owner, other = pair()
    owner.register("t")
    owner.enqueue("first", unique_key="k")
    assert owner.executed_ids() == ["first"]  # running
    other.enqueue("second", unique_key="k", unique_until="started")
    owner.advance(0.15)
    other.advance(0.1)
    assert "deduplicated" not in ack(other, "second")
    assert inbox_records(owner)[-1].get("dropped") is None


@pytest.mark.timeout(20)  # the spin it guards against never ends: fail instead
def test_a_torn_last_line_in_the_owner_s_log_is_read_again_at_the_poll_not_at_once() -> None:
    # The owner died halfway through a line (or is writing it): each read of its log ends
    # before that line. Only a read cut short by its size is followed at once by another;
    # this one waits for the next poll (it once spun, reading again at once for the whole
    # wait).
    owner, other = pair()
    other.enqueue("second", unique_key="k")
    owner.disk["logs"][0] += b'{"taskId":"torn'
    other.advance(1)
    poll = other.node.config.verdict_poll_us / SECOND
    assert 1 / poll - 2 <= other.log_tail_reads <= 1 / poll + 2, other.log_tail_reads
    assert other.messages("ack") == []  # still waiting for the owner's decision


def _replace_log(sh: FakeShell, keep: Callable[[bytes], bool] = lambda line: True) -> None:
    """What a compaction of shard 0's log does to a reader: a new file (its generation) holding
    the lines `keep` takes."""
    log = sh.disk["logs"][0]
    lines = [line for line in bytes(log).splitlines(keepends=True) if keep(line)]
    log[:] = b"".join(lines)
    generations = sh.disk.setdefault("generations", {})
    generations[0] = generations.get(0, 1) + 1


def test_a_log_compacted_before_the_owner_decided_is_read_on_for_its_decision() -> None:
    # The owner's log is replaced (compacted) after the write, before the owner took the
    # inbox in: the answer is still to come, in the new file. (It was acked undecided at once.)
    owner, other = pair()
    owner.enqueue("first", unique_key="k")
    other.enqueue("second", unique_key="k")
    other.advance(0.06)  # read once: nothing yet
    _replace_log(owner)
    other.advance(0.06)
    assert other.messages("ack") == []
    owner.advance(0.15)
    other.advance(0.1)
    assert ack(other, "second")["duplicate_of"] == "first"


def test_where_compaction_left_only_a_later_record_of_the_file_the_ack_is_undecided() -> None:
    owner, other = pair()
    other.enqueue("second", unique_key="k")
    owner.advance(0.15)  # taken in; other has not looked yet (its clock stands still)
    other.enqueue("third", unique_key="j")
    owner.advance(0.15)
    first_mark = bytes(owner.disk["logs"][0]).splitlines(keepends=True)
    (older,) = [line for line in first_mark if b'"from":0,' in line]
    _replace_log(owner, lambda line: line != older)  # only the latest is kept
    other.advance(0.1)
    assert ack(other, "second")["deduplicated"] is None
    assert "deduplicated" not in ack(other, "third")


def _enqueue(task_id: str, task_data: str, **extra: Any) -> dict[str, Any]:
    return {
        "action": "enqueue",
        "task_id": task_id,
        "task_type": "t",
        "task_data": task_data,
        "max_retries": 0,
        "retry_after_hours": 0,
        **extra,
    }
