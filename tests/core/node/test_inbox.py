"""Inbox routing in the core: a daemon that does not own a task's shard writes the task into its
own inbox for that shard, acks it once durable, and the owner ingests it into tasks.log with a
record of how far it has read, so a new owner resumes exactly there (docs/architecture.md,
"Inboxes: every daemon takes enqueues")."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from snerd.core import events as ev
from snerd.core.node import NodeConfig, NodePhase
from snerd.core.records import encode_record
from snerd.core.timefmt import format_rfc3339
from tests.support.fakeshell import SECOND, FakeShell


def pair(other_config: NodeConfig | None = None) -> tuple[FakeShell, FakeShell]:
    """An owner of the only shard, and a second node on the same disk that owns nothing; the
    owner has seen it in membership.json (one round), so it looks at its inboxes every
    `inbox_poll_us`."""
    owner = FakeShell(NodeConfig(node_id="owner@pid-1-a"))
    owner.start()
    assert owner.node.owned_shards == [0]
    other = FakeShell(other_config or NodeConfig(node_id="other@pid-2-b"), disk=owner.disk)
    other.start()
    assert other.node.phase is NodePhase.RUNNING and other.node.owned_shards == []
    round_s = owner.node.config.ownership.renew_interval_us / SECOND
    owner.advance(round_s)
    other.advance(round_s)  # (the two clocks stay together)
    assert owner.node.tenure.peers_live and owner.node.owned_shards == [0]
    return owner, other


def inbox_of(sh: FakeShell, node: str = "other@pid-2-b", shard: int = 0) -> bytearray:
    inbox: bytearray = sh.disk["inboxes"][(shard, node)]
    return inbox


def inbox_records(sh: FakeShell) -> list[dict[str, Any]]:
    return [r for r in sh.log_records() if r.get("snerdKind") == "inbox"]


def test_a_node_without_the_shard_acks_through_its_inbox_and_the_owner_runs_it() -> None:
    owner, other = pair()
    owner.register("t")
    other.enqueue("a", data={"x": 1})
    ack = other.messages("ack")[-1]
    assert ack == {
        "action": "ack",
        "task_id": "a",
        "message": "Enqueued successfully",
        "shard": "shard-0",
    }
    assert b'"taskId":"a"' in inbox_of(other)
    assert owner.executed_ids() == []  # not before the owner looks at its inboxes
    owner.advance(0.15)
    assert owner.executed_ids() == ["a"]
    assert owner.payload(owner.executed[0].location) == '{"x":1}'
    task = next(r for r in owner.log_records() if r.get("taskId") == "a")
    assert task["snerdNode"] == "owner@pid-1-a"
    assert task["snerdVia"] == "other@pid-2-b"
    assert task["snerdEpoch"] == owner.node.shards[0].epoch
    (progress,) = inbox_records(owner)
    assert progress["node"] == "other@pid-2-b"
    assert progress["offset"] == len(inbox_of(other))
    owner.result("a")
    assert owner.node.tasks == {}
    # Read once: later polls find nothing new and ingest nothing again.
    owner.advance(1.0)
    assert owner.executed_ids() == ["a"]
    assert len(inbox_records(owner)) == 1


def test_an_inbox_enqueue_is_acked_as_it_commits_whatever_the_lease_and_once() -> None:
    # Durable in the node's own inbox file, which the shard's owner ingests: the shell acks
    # it as the fsync returns (`on_commit`), even past this node's lease, and the burst
    # that handles the commit does not ack it again.
    _owner, other = pair()
    other.hold_inbox = True
    other.enqueue("a")
    (append,) = other.held
    late = ev.Now(wall=other.wall, mono=other.mono + 3600 * SECOND)  # any lease is over
    assert other.acks_on_commit(append, late) == ["a"]
    assert other.acks_on_commit(append, late) == []
    other.early_acks = False  # (asked above already)
    other.hold_inbox = False
    other.release_held()
    assert not other.messages("ack")  # the burst left it to the shell
    assert b'"taskId":"a"' in inbox_of(other)


def test_a_new_owner_resumes_each_inbox_where_the_log_says() -> None:
    owner, other = pair()
    other.enqueue("a")
    owner.advance(0.15)
    other.enqueue("b")
    # The owner dies before it reads "b"; a new owner on the same disk replays the log.
    owner.disk["locks"].clear()
    owner.disk["membership"] = None
    heir = FakeShell(NodeConfig(node_id="heir@pid-3-c"), disk=owner.disk)
    heir.register("t")
    heir.start()
    assert heir.node.owned_shards == [0]
    # "a" from the log, "b" from the inbox (read as soon as the shard is active): each once.
    heir.advance(0.5)
    assert sorted(heir.executed_ids()) == ["a", "b"]
    ids = [r["taskId"] for r in heir.log_records() if "taskId" in r and "deletedAt" not in r]
    assert ids.count("a") == 1 and ids.count("b") == 1


def test_the_inbox_offset_survives_compaction() -> None:
    owner, other = pair()
    owner.register("t")
    for i in range(5):
        other.enqueue(f"t{i}")
    owner.advance(0.15)
    for i in range(5):
        owner.result(f"t{i}")
    owner.feed(ev.CompactionRequested(shard=0))
    assert any("compacted" in m for _, m in owner.logs_out)
    (progress,) = inbox_records(owner)
    assert progress["offset"] == len(inbox_of(other))
    # After a restart on the compacted log nothing is ingested twice.
    owner.disk["locks"].clear()
    owner.disk["membership"] = None
    heir = FakeShell(NodeConfig(node_id="heir@pid-3-c"), disk=owner.disk)
    heir.register("t")
    heir.start()
    heir.advance(0.5)
    assert heir.executed_ids() == []


def test_a_partial_line_waits_and_a_corrupt_line_is_skipped_with_a_warning() -> None:
    owner, _other = pair()
    owner.register("t")
    inbox = owner.disk["inboxes"].setdefault((0, "writer@pid-7-w"), bytearray())
    good = encode_record({"taskId": "g1", "taskType": "t", "taskData": "", "maxRetries": 0})
    inbox += good + b"{not json}\n"
    second = encode_record({"taskId": "g2", "taskType": "t", "taskData": "", "maxRetries": 0})
    inbox += second[:10]  # still being written
    owner.advance(0.15)
    assert owner.executed_ids() == ["g1"]
    assert any("skipped a corrupt line" in m and "writer@pid-7-w" in m for _, m in owner.logs_out)
    inbox += second[10:]
    owner.advance(0.15)
    assert owner.executed_ids() == ["g1", "g2"]


def test_an_id_already_pending_and_a_duplicate_payload_are_dropped_at_ingest() -> None:
    owner, other = pair()
    owner.enqueue("dup")  # pending on the owner, no handler registered
    other.enqueue("dup")
    owner.enqueue("first", data={"same": 1}, auto_dedupe=True)
    other.enqueue("second", data={"same": 1}, auto_dedupe=True)
    # The plain enqueue is acked at its write; the one with dedupe waits for the owner.
    assert [m["task_id"] for m in other.messages("ack")] == ["dup"]
    owner.advance(0.15)
    assert set(owner.node.tasks) == {"dup", "first"}
    assert any("dup" in m and "already pending" in m for _, m in owner.logs_out)
    assert any("second" in m and "duplicate of task first" in m for _, m in owner.logs_out)
    assert owner.node.stats["total_deduplicated"] == 1
    (mark,) = inbox_records(owner)
    assert mark["from"] == 0 and [d["task"] for d in mark["dropped"]] == ["dup", "second"]
    other.advance(0.1)
    assert other.messages("ack")[-1] == {
        "action": "ack",
        "task_id": "second",
        "message": "Enqueued successfully",
        "shard": "shard-0",
        "deduplicated": True,
        "duplicate_of": "first",
    }


def test_a_duplicate_payload_waits_at_ingest_while_its_twin_is_not_durable() -> None:
    # The inbox copy was acked by its writer; the owner's twin was not yet (its enqueue record
    # in flight). Dropped against it, the copy was lost when the twin's append failed and the
    # ingest's landed (sim seed 108945: the owner stepped down, the twin's append never made).
    owner, other = pair()
    owner.hold_appends = True
    owner.enqueue("first", data={"same": 1}, auto_dedupe=True)  # its record in flight
    other.enqueue("second", data={"same": 1}, auto_dedupe=True)
    other.enqueue("plain")
    assert [m["task_id"] for m in other.messages("ack")] == ["plain"]  # "second" waits
    owner.advance(0.15)
    assert "second" not in owner.node.tasks
    (twin,) = [a for a in owner.held if any(r.fields.get("taskId") == "first" for r in a.records)]
    owner.held.remove(twin)
    owner.feed(ev.AppendFailed(token=twin.token, error="No space left on device"))
    assert owner.messages("error")[-1]["task_id"] == "first"
    owner.hold_appends = False
    owner.release_held()  # what was ingested meanwhile lands
    owner.advance(0.5)
    assert {"second", "plain"} <= set(owner.node.tasks)
    assert [r["taskId"] for r in owner.log_records() if r.get("snerdVia")] == ["second", "plain"]


def test_a_duplicate_payload_is_dropped_at_ingest_once_its_twin_is_durable() -> None:
    owner, other = pair()
    owner.hold_appends = True
    owner.enqueue("first", data={"same": 1}, auto_dedupe=True)
    other.enqueue("second", data={"same": 1}, auto_dedupe=True)
    owner.advance(0.15)  # waits for "first"
    owner.hold_appends = False
    owner.release_held()
    owner.advance(0.5)
    assert set(owner.node.tasks) == {"first"}
    assert any("second" in m and "duplicate of task first" in m for _, m in owner.logs_out)
    assert inbox_records(owner)[-1]["offset"] == len(inbox_of(other))


def test_an_inbox_write_that_fails_is_an_error_naming_the_task() -> None:
    _owner, other = pair()
    other.disk_full = True
    other.enqueue("a")
    (error,) = other.messages("error")
    assert error["task_id"] == "a"
    assert "No space left" in error["message"]
    assert other.messages("ack") == []
    assert other.node.stats["total_enqueued"] == 0
    other.disk_full = False
    other.enqueue("a")
    assert other.messages("ack")[-1]["task_id"] == "a"


def test_an_ingest_that_fails_is_read_again_later_and_nothing_is_lost() -> None:
    owner, other = pair()
    owner.register("t")
    other.enqueue("a")
    owner.disk_full = True
    owner.advance(0.15)
    assert owner.executed_ids() == []
    assert any("could not ingest" in m for _, m in owner.logs_out)
    assert "a" not in owner.node.tasks
    owner.disk_full = False
    owner.advance(1.2)
    assert owner.executed_ids() == ["a"]


def test_a_later_chunk_of_an_inbox_waits_for_the_ingest_before_it() -> None:
    # One ingest of a file in flight at a time: had a later chunk been ingested while the
    # first was in flight, its commit would have recorded the file as read past the first
    # chunk's tasks, and those tasks (acked by the writer) would be lost when it failed.
    owner, other = pair()
    owner.register("t")
    other.enqueue("a")
    # A read takes one record at a time.
    owner.node.config = replace(owner.node.config, inbox_read_bytes=len(inbox_of(other)) + 8)
    owner.hold_appends = True
    owner.advance(0.15)  # "a" read and its ingest issued, held in flight
    other.enqueue("b")
    owner.advance(0.5)  # polls read "b"'s chunk: not ingested while "a"'s is in flight
    assert "b" not in owner.node.tasks
    owner.disk_full = True
    owner.hold_appends = False
    owner.release_held()  # "a"'s ingest fails
    assert "a" not in owner.node.tasks
    owner.disk_full = False
    owner.advance(2.0)
    assert sorted(owner.executed_ids()) == ["a", "b"]
    (mark,) = [r for r in inbox_records(owner) if r["offset"] == len(inbox_of(other))][-1:]
    assert mark["node"] == "other@pid-2-b"


def test_a_drain_waits_for_inbox_appends_to_be_answered_then_removes_the_read_inbox() -> None:
    owner, other = pair()
    other.hold_inbox = True
    other.enqueue("a")
    other.feed(ev.DrainRequested(reason="SIGTERM"))
    other.advance(0.5)
    assert other.exit_code is None  # the enqueue is not answered yet
    other.hold_inbox = False
    other.release_held()
    assert other.messages("ack")[-1]["task_id"] == "a"
    other.advance(0.5)
    assert other.exit_code is None  # its inbox is not ingested yet
    owner.advance(1.2)  # ingests, and (within a second) tells the writer how far
    assert owner.disk["inbox_hints"][(0, "other@pid-2-b")] == len(inbox_of(other))
    other.advance(0.2)
    assert other.exit_code == 0
    assert (0, "other@pid-2-b") not in owner.disk["inboxes"]  # removed by its writer
    # The owner forgets the offset of a file that is gone (compaction stops keeping it).
    owner.advance(0.2)
    assert "other@pid-2-b" not in owner.node.shards[0].inbox_done


def test_a_drain_does_not_wait_long_for_an_inbox_nobody_reads() -> None:
    owner, other = pair()
    other.enqueue("a")
    other.feed(ev.DrainRequested(reason="SIGTERM"))
    other.advance(2.9)
    assert other.exit_code is None
    other.advance(0.2)
    assert other.exit_code == 0
    assert (0, "other@pid-2-b") in owner.disk["inboxes"]  # left for the owner to read


def test_a_full_inbox_segment_is_closed_and_removed_once_ingested() -> None:
    owner, other = pair(NodeConfig(node_id="other@pid-2-b", inbox_segment_bytes=600))
    owner.register("t")
    for i in range(6):
        other.enqueue(f"t{i}")
    names = sorted(n for _, n in other.disk["inboxes"])
    assert len(names) >= 2 and names[0] == "other@pid-2-b" and names[1] == "other@pid-2-b~1"
    owner.advance(1.2)
    assert sorted(owner.executed_ids()) == [f"t{i}" for i in range(6)]
    other.advance(1.1)
    # Every closed segment is gone; the one still taking enqueues stays.
    left = sorted(n for _, n in other.disk["inboxes"])
    assert left == [other.node.inbox.current[0].name]
    # A failed write closes its segment too (what it holds past the last acked record is
    # unknown); here nothing reached it, and it is dropped.
    other.disk_full = True
    other.enqueue("x")
    failed = other.node.inbox.current[0]
    other.disk_full = False
    other.enqueue("y")
    assert failed.failed and failed.closed
    assert other.node.inbox.current[0] is not failed
    owner.advance(1.2)
    other.advance(1.1)
    assert (0, failed.name) not in other.node.inbox.segments
    assert [m["task_id"] for m in other.messages("ack")][-1] == "y"


def test_a_plain_task_from_an_inbox_runs_at_once_though_the_owners_clock_is_behind() -> None:
    # The writer's record says `executeAt` = its own wall time at enqueue; an owner whose clock
    # is 10 s behind must not hold the task back for those 10 s. One with `execute_at` waits.
    owner, other = pair()
    owner.register("t")
    owner.wall -= 10 * SECOND
    other.enqueue("plain")
    other.enqueue("timed", execute_at=format_rfc3339(other.wall + 2 * SECOND))
    owner.advance(0.15)
    assert owner.executed_ids() == ["plain"]
    owner.advance(11)  # due at the writer's time + 2 s: 12 s on the owner's clock
    assert owner.executed_ids() == ["plain"]
    owner.advance(1)
    assert owner.executed_ids() == ["plain", "timed"]


def test_a_lone_owner_looks_at_its_inboxes_seldom_and_often_once_membership_names_another() -> None:
    owner = FakeShell(NodeConfig(node_id="owner@pid-1-a"))
    owner.start()
    idle_s = owner.node.config.inbox_idle_poll_us / SECOND
    poll_s = owner.node.config.inbox_poll_us / SECOND
    assert idle_s >= 10 * poll_s
    before = owner.inbox_reads
    owner.advance(3 * idle_s)
    assert owner.inbox_reads - before == 3  # nothing can write to them: once a second
    other = FakeShell(NodeConfig(node_id="other@pid-2-b"), disk=owner.disk)
    other.start()  # its heartbeat is in membership.json now; the owner reads it next round
    owner.advance(owner.node.config.ownership.renew_interval_us / SECOND)
    assert owner.node.tenure.peers_live
    before = owner.inbox_reads
    owner.advance(1.0)
    assert owner.inbox_reads - before >= round(1.0 / poll_s) - 1


def test_a_task_through_a_node_the_owner_has_not_seen_yet_waits_at_most_the_idle_poll() -> None:
    owner = FakeShell(NodeConfig(node_id="owner@pid-1-a"))
    owner.start()
    owner.register("t")
    other = FakeShell(NodeConfig(node_id="other@pid-2-b"), disk=owner.disk)
    other.start()
    assert not owner.node.tenure.peers_live  # (no membership read since the other started)
    other.enqueue("a")
    owner.advance(0.15)
    assert owner.executed_ids() == []  # the owner still looks once a second
    owner.advance(owner.node.config.inbox_idle_poll_us / SECOND)
    assert owner.executed_ids() == ["a"]
    # An inbox file is there now: the owner looks every `inbox_poll_us` again.
    other.enqueue("b")
    owner.advance(0.15)
    assert owner.executed_ids() == ["a", "b"]


def test_a_shard_taken_over_later_has_its_inbox_looked_at_within_the_poll() -> None:
    # a and b share a 2-shard queue; b drains and a claims b's shard, whose inbox holds a
    # task another node wrote: a reads it within `inbox_poll_us` of the claim.
    def shell(name: str, disk: dict[str, Any] | None = None) -> FakeShell:
        return FakeShell(NodeConfig(node_id=f"{name}@pid-1-x", new_queue_shards=2), disk=disk)

    a = shell("a")
    a.start()
    b = shell("b", a.disk)
    b.start()
    for _ in range(60):
        for sh in (a, b):
            sh.advance(1)
    assert len(a.node.owned_shards) == 1 and len(b.node.owned_shards) == 1
    (taken,) = b.node.owned_shards
    a.register("t")
    inbox = a.disk["inboxes"].setdefault((taken, "writer@pid-7-w"), bytearray())
    inbox += encode_record({"taskId": "w1", "taskType": "t", "taskData": "", "maxRetries": 0})
    b.feed(ev.DrainRequested(reason="test"))
    for _ in range(400):
        for sh in (a, b):
            sh.advance(0.05)
        if taken in a.node.owned_shards:
            break
    assert taken in a.node.owned_shards and not a.node.tenure.peers_live
    assert a.executed_ids() == []
    a.advance(a.node.config.inbox_poll_us / SECOND + 0.01)
    assert a.executed_ids() == ["w1"]


def test_an_inbox_that_cannot_be_read_is_said_once_until_it_changes() -> None:
    # A link where the inbox folder belongs stays until an operator removes it, and inboxes
    # are looked at every poll: the warning is not repeated at each look.
    owner, _other = pair()
    refused = (0, "refusing to follow the symlink DIR/shard-0/inbox")
    for _ in range(3):
        owner.feed(ev.InboxRead(chunks=(), errors=(refused,), present=()))
    said = [m for _, m in owner.logs_out if "cannot read its inbox" in m]
    assert said == [
        f"shard-0: cannot read its inbox: {refused[1]} (said once until it changes; "
        "the inbox is tried again at every poll)"
    ]
    owner.feed(ev.InboxRead(chunks=(), errors=(), present=((0, ()),)))
    owner.feed(ev.InboxRead(chunks=(), errors=(refused,), present=()))
    assert len([m for _, m in owner.logs_out if "cannot read its inbox" in m]) == 2
