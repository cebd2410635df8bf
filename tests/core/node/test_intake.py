"""The node's intake of SDK lines: the batch path of plain enqueues and results
(`Intake.lines`) beside the long way (`Intake.line`), the acks that go out as an append commits
(`Node.on_commit`), and the differential test that the two paths decide alike."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snerd.core import effects as fx
from snerd.core import events as ev
from snerd.core import protocol as proto
from snerd.core.node import NodeConfig, TaskState
from snerd.core.records import decode_record
from tests.core.node.test_node import _enqueue_lines, started
from tests.support.fakeshell import SECOND


def test_plain_and_other_enqueues_in_one_burst_keep_arrival_order_in_records_and_acks() -> None:
    # Plain enqueues go the batch path; one with an urgency goes the long way between them.
    # One append, records and acks in arrival order; each task where it belongs.
    sh = started(NodeConfig(node_id="test-node@pid-1-aa", max_workers=1))
    sh.register("t")
    sh.enqueue("busy")  # runs at once, so the rest queue behind it
    lines = [
        *_enqueue_lines("p1", "p2", task_type="t"),
        *_enqueue_lines("u1", task_type="t", urgency_score=5),
        *_enqueue_lines("p3", task_type="t"),
        *_enqueue_lines("n1"),
    ]
    effects = sh.burst(lines)
    (append,) = [e for e in effects if isinstance(e, fx.Append)]
    order = ["p1", "p2", "u1", "p3", "n1"]
    assert [r.fields["taskId"] for r in append.records] == order
    assert [m.get("task_id") for m in sh.messages("ack")][-5:] == order
    assert sh.node.tasks["n1"].state.value == "parked"
    assert {sh.node.tasks[i].state.value for i in ("p1", "p2", "u1", "p3")} == {"ready"}
    sh.result("busy")
    assert sh.executed_ids()[1] == "u1"  # most urgent first, then FIFO
    for task_id in ("u1", "p1", "p2"):
        sh.result(task_id)
    assert sh.executed_ids() == ["busy", "u1", "p1", "p2", "p3"]


def test_a_step_down_answers_each_plain_enqueue_of_a_burst_still_in_flight() -> None:
    sh = started()
    sh.hold_appends = True
    sh.burst(_enqueue_lines("s1", "s2", "s3"))
    assert not sh.messages("ack")
    sh.feed(ev.LockLost(shard=0, error="Input/output error (EIO)"))
    errors = sh.messages("error")
    assert [m["task_id"] for m in errors] == ["s1", "s2", "s3"]
    assert all("changed owner before the enqueue was confirmed" in m["message"] for m in errors)
    sh.hold_appends = False
    sh.release_held()
    assert not sh.messages("ack")  # answered once, never acked after the error


def test_plain_enqueues_are_acked_as_their_append_commits_and_not_again() -> None:
    # The shell asks as the fsync returns (`on_commit`): the acks leave then, and the
    # burst that handles the commit schedules the tasks without acking them twice.
    sh = started()
    sh.hold_appends = True
    sh.burst(_enqueue_lines("s1", "s2"))
    (append,) = sh.held
    assert sh.acks_on_commit(append, sh.now()) == ["s1", "s2"]
    assert sh.acks_on_commit(append, sh.now()) == []  # answered once
    sh.early_acks = False  # (asked above already)
    sh.release_held()
    assert not sh.messages("ack")  # the burst left them to the shell
    assert {sh.node.tasks[i].state.value for i in ("s1", "s2")} == {"parked"}
    assert all(sh.node.tasks[i].loc is not None for i in ("s1", "s2"))


def test_a_task_dispatched_with_its_record_is_acked_and_run_as_the_append_commits() -> None:
    # The shell asks as the fsync returns (`on_commit`): the ack and the `execute`
    # leave then, the task is running with its deadline, and the burst that handles the
    # commit sends neither again.
    sh = started()
    sh.register("t")
    sh.hold_appends = True
    sh.enqueue("a", max_execution_seconds=5)
    (append,) = sh.held
    assert len(append.records) == 2  # the enqueue record and the dispatch record
    effects = sh.node.on_commit(append.token, sh.now(), (100, 300), (200, 100))
    assert [type(e) for e in effects] == [fx.AckEnqueued, fx.Execute]
    (execute,) = [e for e in effects if isinstance(e, fx.Execute)]
    assert execute.task_id == "a" and execute.location.offset == 100
    task = sh.node.tasks["a"]
    assert task.state is TaskState.RUNNING and task.dispatch_loc is not None
    assert sh.node.book.inflight["a"].deadline_mono == sh.mono + 5 * SECOND
    assert sh.node.on_commit(append.token, sh.now(), (100, 300), (200, 100)) == []
    sh.early_acks = False  # (asked above already)
    sh.hold_appends = False
    sh.release_held()
    assert not [m for m in sh.messages("ack") if m.get("task_id") == "a"]
    assert sh.executed == []


def test_a_task_dispatched_with_its_record_is_left_to_the_burst_past_the_lease() -> None:
    # The fsync returned after the lease's end: nothing leaves early; the burst steps down
    # and tells the SDK (the record may have landed after a takeover; here it did not, and
    # the shard taken up again runs the task from its log).
    sh = started()
    sh.register("t")
    sh.hold_appends = True
    sh.enqueue("a")
    deadline = sh.node.lease_deadline_mono
    assert deadline is not None
    sh.mono = deadline
    (append,) = sh.held
    assert sh.node.on_commit(append.token, sh.now(), (100, 300), (200, 100)) == []
    sh.hold_appends = False
    sh.release_held()
    assert [m["task_id"] for m in sh.messages("error")] == ["a"]
    assert not [m for m in sh.messages("ack") if m.get("task_id") == "a"]


def test_a_task_dispatched_with_its_record_while_draining_is_left_to_the_burst() -> None:
    # Draining: the burst gives its slot back unsent (it runs elsewhere), so nothing may
    # leave early for it; its ack still comes, from the burst.
    sh = started()
    sh.register("t")
    sh.hold_appends = True
    sh.enqueue("a")
    sh.feed(ev.DrainRequested(reason="test"))
    (append,) = sh.held
    assert sh.node.on_commit(append.token, sh.now(), (100, 300), (200, 100)) == []
    sh.hold_appends = False
    sh.release_held()
    assert [m.get("task_id") for m in sh.messages("ack")][-1] == "a"
    assert sh.executed == []


def test_an_append_one_of_whose_tasks_was_forgotten_is_left_to_the_burst() -> None:
    # A task of the run was forgotten while its append was in flight (what a reload of the
    # shard does): the shell acks none of the run, and the burst acks what it always did.
    sh = started()
    sh.hold_appends = True
    sh.burst(_enqueue_lines("s1", "s2"))
    (append,) = sh.held
    sh.node.book.forget("s1")
    assert sh.acks_on_commit(append, sh.now()) == []
    sh.hold_appends = False
    sh.release_held()
    assert [m["task_id"] for m in sh.messages("ack")] == ["s2"]


def test_an_append_that_commits_after_the_lease_ran_out_is_not_acked_early() -> None:
    # The fsync returned after the lease's end (a hung write): the record may have landed
    # after another node took the shard over, so no ack; the burst that handles the commit
    # steps down first and tells the SDK, once.
    sh = started()
    sh.hold_appends = True
    sh.burst(_enqueue_lines("s1", "s2"))
    deadline = sh.node.lease_deadline_mono
    assert deadline is not None
    sh.mono = deadline
    sh.hold_appends = False
    sh.release_held()
    assert not sh.messages("ack")
    errors = sh.messages("error")
    assert [m["task_id"] for m in errors] == ["s1", "s2"]
    assert all("changed owner before the enqueue was confirmed" in m["message"] for m in errors)


def test_an_enqueue_acked_early_is_not_refused_when_the_lease_runs_out_before_its_burst() -> None:
    # Acked as the append committed, within the lease; the lease runs out before the burst
    # that handles the commit. The step-down must not tell the SDK the enqueue may have been
    # lost (its record landed in time), and the commit acks nothing again.
    sh = started()
    sh.hold_appends = True
    sh.burst(_enqueue_lines("s1", "s2"))
    (append,) = sh.held
    sh.held.clear()
    sh._commit(append)  # the fsync returns, within the lease
    sh._ack_committed()
    assert [m["task_id"] for m in sh.messages("ack")] == ["s1", "s2"]
    deadline = sh.node.lease_deadline_mono
    assert deadline is not None
    sh.mono = deadline  # ... and the burst handling the commit comes after its end
    sh._pump()
    assert not sh.messages("error")
    assert [m["task_id"] for m in sh.messages("ack")] == ["s1", "s2"]
    assert any("lease ran out" in message for _, message in sh.logs_out)  # it did step down


def test_an_append_issued_before_a_step_down_is_not_acked_early_after_it() -> None:
    # The node stepped down from the shard (its lock failed) while the append was in
    # flight: it told the SDK then; the append's commit must not ack it as well.
    sh = started()
    sh.hold_appends = True
    sh.burst(_enqueue_lines("s1"))
    (append,) = sh.held
    sh.feed(ev.LockLost(shard=0, error="Input/output error (EIO)"))
    assert [m["task_id"] for m in sh.messages("error")] == ["s1"]
    assert sh.acks_on_commit(append, sh.now()) == []


_PLAIN_LINE = st.builds(
    lambda i, kind: {
        "action": "enqueue",
        "task_id": f"k{i}",
        "task_type": kind,
        "task_data": "{}",
        "max_retries": 1,
        "retry_after_hours": 0,
    },
    st.integers(0, 12),
    st.sampled_from(["t", "nobody"]),
)
_OTHER_LINE = st.one_of(
    st.builds(
        lambda i, u: {
            "action": "enqueue",
            "task_id": f"k{i}",
            "task_type": "t",
            "task_data": "{}",
            "max_retries": 0,
            "retry_after_hours": 0,
            "urgency_score": u,
        },
        st.integers(0, 12),
        st.integers(1, 3),
    ),
    st.builds(
        lambda i: {"action": "result", "task_id": f"k{i}", "status": "success"}, st.integers(0, 12)
    ),
    st.builds(
        lambda i, a: {"action": "result", "task_id": f"k{i}", "status": "success", "attempt": a},
        st.integers(0, 12),
        st.integers(1, 2),
    ),
    st.builds(
        lambda i: {"action": "result", "task_id": f"k{i}", "status": "error", "error_msg": "no"},
        st.integers(0, 12),
    ),
    st.just({"action": "register", "task_type": "t"}),
    st.just({"action": "enqueue", "task_id": "k1"}),
    st.sampled_from([b"", b" \t", b"not json", b"[1]"]),
)
#: A result for the j-th task in flight at the time (success, with or without the attempt it
#: was given, with a wrong attempt; or a failure).
_RESULT_MARK = st.tuples(
    st.just("result"), st.integers(0, 7), st.sampled_from(["ok", "ok@", "ok@wrong", "fail"])
)
_STEP = st.one_of(
    st.lists(st.one_of(_PLAIN_LINE, _OTHER_LINE), min_size=1, max_size=8).map(
        lambda lines: ("burst", lines)
    ),
    st.lists(st.one_of(_PLAIN_LINE, _RESULT_MARK), min_size=1, max_size=10).map(
        lambda lines: ("burst", lines)
    ),
    st.sampled_from(
        [
            ("disk_full", True),
            ("disk_full", False),
            ("hold", True),
            ("hold", False),
            ("lock_lost", None),
            ("advance", None),
        ]
    ),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_STEP, max_size=14), st.integers(1, 3))
def test_the_batch_path_of_plain_enqueues_and_results_decides_what_the_long_way_decides(
    steps: list[tuple[str, Any]], workers: int
) -> None:
    # The same traffic through a node with the batch path and one without it: the same
    # messages, in the same order, the same log, the same tasks in the same states.
    # The fast node takes each burst as one `LinesReceived`, the slow one as a `LineReceived`
    # per line, each line the long way (`Intake.line`).
    config = NodeConfig(node_id="test-node@pid-1-aa", max_workers=workers)
    fast, slow = started(config), started(config)

    def the_long_way(lines: Iterable[bytes]) -> None:
        for line in lines:
            if not proto.is_blank_line(line):
                slow.node.intake.line(line)

    def line_of(m: Any) -> bytes:
        if isinstance(m, bytes):
            return m
        if isinstance(m, tuple):  # a `_RESULT_MARK`: the two nodes have the same in flight
            flying = sorted(fast.node.book.inflight.items())
            if not flying:
                return b""
            task_id, flight = flying[m[1] % len(flying)]
            doc: dict[str, Any] = {"action": "result", "task_id": task_id, "status": "success"}
            if m[2] == "ok@":
                doc["attempt"] = flight.attempt
            elif m[2] == "ok@wrong":
                doc["attempt"] = flight.attempt + 1
            elif m[2] == "fail":
                doc.update(status="error", error_msg="no")
            return orjson.dumps(doc)
        return orjson.dumps(m)

    slow.node.intake.lines = the_long_way  # type: ignore[method-assign]
    for kind, arg in steps:
        lines = [line_of(m) for m in arg] if kind == "burst" else []
        for sh in (fast, slow):
            if kind == "burst":
                raw = lines
                if sh is fast:
                    sh.burst([ev.LinesReceived(lines=raw)])
                else:
                    sh.burst([ev.LineReceived(line=line) for line in raw])
            elif kind == "disk_full":
                sh.disk_full = arg
            elif kind == "hold":
                sh.hold_appends = arg
                if not arg:
                    sh.release_held()
            elif kind == "lock_lost":
                sh.feed(ev.LockLost(shard=0, error="Input/output error (EIO)"))
            else:
                sh.advance(2)
        assert fast.sent == slow.sent
        assert bytes(fast.disk["logs"].get(0, b"")) == bytes(slow.disk["logs"].get(0, b""))
        assert {k: (t.state, t.loc, t.dispatch_loc) for k, t in fast.node.tasks.items()} == {
            k: (t.state, t.loc, t.dispatch_loc) for k, t in slow.node.tasks.items()
        }
        assert fast.node.shards[0].history == slow.node.shards[0].history
    assert fast.executed == slow.executed


def _same_burst(*items: tuple[str, str]) -> list[bytes]:
    """Lines of one burst: ("enqueue", "id:type") or ("result", "id")."""
    out = []
    for kind, arg in items:
        if kind == "enqueue":
            task_id, task_type = arg.split(":")
            (line,) = _enqueue_lines(task_id, task_type=task_type)
            assert isinstance(line, ev.LineReceived)
            out.append(line.line)
        else:
            out.append(orjson.dumps({"action": "result", "task_id": arg, "status": "success"}))
    return out


def test_a_result_between_enqueues_of_one_burst_leaves_each_record_its_own_place() -> None:
    sh = started(NodeConfig(node_id="n@pid-1-x", max_workers=1))
    sh.register("t")
    sh.burst(_enqueue_lines("a", task_type="t"))
    assert sh.node.tasks["a"].state is TaskState.RUNNING
    lines = _same_burst(
        ("enqueue", "p1:nobody"),
        ("enqueue", "p2:nobody"),
        ("result", "a"),
        ("enqueue", "p3:nobody"),
    )
    sh.burst([ev.LinesReceived(lines=lines)])
    log = bytes(sh.disk["logs"][0])

    def at(loc: fx.Location | None) -> dict[str, Any]:
        assert loc is not None
        return decode_record(log[loc.offset : loc.offset + loc.length].rstrip(b"\n"))

    for task_id in ("p1", "p2", "p3"):
        assert at(sh.node.tasks[task_id].loc)["taskId"] == task_id
    ((done, (loc, outcome)),) = list(sh.node.shards[0].history.items())
    assert outcome == "completed"
    assert done == "a"
    assert at(loc)["taskId"] == "a"
    assert "deletedAt" in at(loc)


def test_a_slot_freed_by_a_result_in_a_burst_is_seen_by_the_enqueues_after_it() -> None:
    # As line by line: c, enqueued once a's slot is free and nothing is ready, runs at once
    # (its dispatch record in its enqueue's append); b, enqueued while the slot was taken,
    # waits for its commit.
    def run(burst: bool) -> list[str]:
        sh = started(NodeConfig(node_id="n@pid-1-x", max_workers=1))
        sh.register("t")
        sh.burst(_enqueue_lines("a", task_type="t"))
        lines = _same_burst(("enqueue", "b:t"), ("result", "a"), ("enqueue", "c:t"))
        if burst:
            sh.burst([ev.LinesReceived(lines=lines)])
        else:
            sh.burst([ev.LineReceived(line=line) for line in lines])
        return sh.executed_ids()

    assert run(burst=True) == run(burst=False) == ["a", "c"]


def test_a_cron_tasks_success_amid_plain_enqueues_leaves_each_record_to_its_task() -> None:
    # One stdin chunk: plain enqueues (a run the line loop extends in place), the success of
    # a running cron task (re-armed: a record of its own, not a tombstone), another plain
    # enqueue. Each task's location must hold its own record, the re-armed task's included.
    sh = started()
    sh.register("t")
    sh.enqueue("tick", task_type="t", cron="10s")
    sh.advance(10.5)
    assert sh.executed_ids() == ["tick"]
    lines = [e.line for e in _enqueue_lines("x", "a")]
    lines += [orjson.dumps({"action": "result", "task_id": "tick", "status": "success"})]
    lines += [e.line for e in _enqueue_lines("b")]
    sh.burst([ev.LinesReceived(lines=lines)])
    assert [m.get("task_id") for m in sh.messages("ack")][-3:] == ["x", "a", "b"]
    log = bytes(sh.disk["logs"][0])
    for task_id in ("x", "a", "tick", "b"):
        loc = sh.node.tasks[task_id].loc
        assert loc is not None
        assert orjson.loads(log[loc.offset : loc.offset + loc.length])["taskId"] == task_id
    sh.advance(10)
    assert sh.executed_ids() == ["tick", "tick"]


def test_acks_leave_in_the_order_of_their_enqueues_across_appends() -> None:
    # A plain enqueue's ack goes out the moment its append commits (`Node.on_commit`); it must
    # not overtake an enqueue appended before it whose ack waits for the burst that handles
    # its commit (one with options). Found by the differential test above, with held appends.
    sh = started(NodeConfig(node_id="test-node@pid-1-aa", max_workers=1))

    def enqueue(task_id: str, **options: Any) -> bytes:
        doc = {"action": "enqueue", "task_id": task_id, "task_type": "t", "task_data": "{}"}
        return orjson.dumps({**doc, "max_retries": 1, "retry_after_hours": 0, **options})

    sh.burst([ev.LinesReceived(lines=[enqueue("k0")])])  # runs: the one worker is busy after
    sh.hold_appends = True
    sh.burst([ev.LinesReceived(lines=[enqueue("k1", urgency_score=1)])])
    sh.burst([ev.LinesReceived(lines=[enqueue("k2")])])
    sh.hold_appends = False
    sh.release_held()
    assert [m["task_id"] for m in sh.sent if m["action"] == "ack"] == ["k0", "k1", "k2"]


def _batch(*items: Any) -> bytes:
    return orjson.dumps({"action": "enqueue_batch", "tasks": list(items)})


def _item(task_id: str, **extra: Any) -> dict[str, Any]:
    return {"task_id": task_id, "task_type": "nobody", "task_data": "{}", "max_retries": 0,
            "retry_after_hours": 0, **extra}


def test_a_batch_is_one_append_and_each_item_is_answered_alone() -> None:
    # 100 good items, a bad value, a non-object, an id twice: one append with the good
    # records, an ack each once durable, an error each for the three others at once.
    sh = started()
    sh.hold_appends = True
    good = [_item(f"b{i}") for i in range(100)]
    effects = sh.burst([ev.LineReceived(line=_batch(
        *good[:50], _item("bad", max_retries=-1), 7, _item("b0"), *good[50:]))])
    (append,) = [e for e in effects if isinstance(e, fx.Append)]
    assert [r.fields["taskId"] for r in append.records] == [f"b{i}" for i in range(100)]
    errors = sh.messages("error")
    assert [m.get("task_id") for m in errors] == ["bad", None, "b0"]
    assert "max_retries must be 0 or more" in errors[0]["message"]
    assert errors[1]["message"].endswith("(tasks[51])")
    assert "already pending" in errors[2]["message"]
    assert not sh.messages("ack")  # nothing acked before its record is durable
    sh.hold_appends = False
    sh.release_held()
    assert [m["task_id"] for m in sh.messages("ack")] == [f"b{i}" for i in range(100)]
    assert {sh.node.tasks[f"b{i}"].state for i in range(100)} == {TaskState.PARKED}


def test_a_batch_line_that_is_not_a_list_of_enqueues_is_refused_whole() -> None:
    sh = started()
    for line, why in (
        (orjson.dumps({"action": "enqueue_batch", "tasks": {}}), "must be a list"),
        (orjson.dumps({"action": "enqueue_batch"}), "must be a list"),
        (orjson.dumps({"action": "enqueue_batch", "tasks": []}), "must not be empty"),
        (_batch(*[_item(f"x{i}") for i in range(proto.MAX_BATCH_TASKS + 1)]), "more than"),
        (_batch(_item("r", action="result")), "not 'result'"),
    ):
        before = len(sh.messages("error"))
        sh.burst([ev.LineReceived(line=line)])
        (error,) = sh.messages("error")[before:]
        assert why in error["message"], (why, error)
    assert not sh.node.tasks
