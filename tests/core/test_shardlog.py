"""`snerd.core.shardlog`: folding a shard log, and agreeing with the daemon's replay.

The law that matters: for any log, the fold's live tasks and in-flight attempts are exactly the
tasks a `Node` recovers when it loads that log (fencing included), and compacting with
`keep_ranges` changes neither. The node is driven through `tests.support.fakeshell`, its public API.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from snerd.cli import main
from snerd.core.node import NodeConfig
from snerd.core.ownership import MAX_COUNT
from snerd.core.records import encode_record, scan
from snerd.core.shardlog import (
    OUTCOME_COMPLETED,
    OUTCOME_DEAD,
    OUTCOME_DEAD_INFERRED,
    find_dead_letters,
    fold_records,
    plan_replay,
    replay_record,
    tombstone_outcome,
)
from snerd.core.timefmt import MAX_US, format_rfc3339
from tests.cli.test_cli import log_path, plant
from tests.support.daemon import Daemon
from tests.support.fakeshell import T0, FakeShell

SECOND = 1_000_000
TS = format_rfc3339(T0 - 3600 * SECOND)


def task(task_id: str, epoch: int | None = 1, **extra: Any) -> dict[str, Any]:
    f: dict[str, Any] = {
        "taskId": task_id,
        "retryCount": 0,
        "maxRetries": 2,
        "retryAfterHours": 0.0,
        "retryAfterTime": TS,
        "taskData": orjson.dumps({"id": task_id}).decode(),
        "taskType": "t",
        "executeAt": TS,
    }
    f.update(extra)
    if epoch is not None:
        f["snerdEpoch"] = epoch
    return f


def tomb(
    task_id: str, outcome: str | None = "completed", epoch: int | None = 1, **extra: Any
) -> dict[str, Any]:
    f = task(task_id, epoch, deletedAt=TS, **extra)
    if outcome is not None:
        f["snerdOutcome"] = outcome
    return f


def dispatch(
    task_id: str, attempt: int, epoch: int = 1, group: str | None = None, at: int = T0 - 10 * SECOND
) -> dict[str, Any]:
    f: dict[str, Any] = {
        "snerdKind": "dispatch",
        "task": task_id,
        "attempt": attempt,
        "at": format_rfc3339(at),
        "snerdEpoch": epoch,
    }
    if group is not None:
        f["group"] = group
    return f


def claim(epoch: int) -> dict[str, Any]:
    return {
        "snerdKind": "claim",
        "epoch": epoch,
        "node": f"n{epoch}",
        "at": TS,
        "snerdEpoch": epoch,
    }


def log_of(records: list[dict[str, Any]]) -> bytes:
    return b"".join(encode_record(r) for r in records)


def fold_log(data: bytes) -> Any:
    return fold_records(scan(data).records)


def node_view(data: bytes) -> tuple[dict[str, str], dict[str, int]]:
    """Live task ids -> taskData, and in-flight attempts, as a daemon recovers them."""
    shell = FakeShell(NodeConfig(node_id="checker@pid-1-aa"))
    shell.disk["logs"][0] = bytearray(data)
    shell.disk["membership"] = {
        "queue": "snerdmq-daemon",
        "shards": 1,
        "version": 1,
        "claims": {},
        "epochs": {"shard-0": 50},
    }
    shell.start()
    live = {t.task_id: shell.payload(t.loc) for t in shell.node.tasks.values() if t.loc}
    flying = {t.task_id: t.attempt for t in shell.node.tasks.values() if t.dispatch_loc}
    return live, flying


def fold_view(data: bytes) -> tuple[dict[str, str], dict[str, int]]:
    fold = fold_log(data)
    return {k: r.fields["taskData"] for k, r in fold.live.items()}, fold.in_flight()


def test_last_record_wins_and_tombstones_remove() -> None:
    fold = fold_log(
        log_of(
            [
                claim(1),
                task("a"),
                task("b"),
                task("a", retryCount=1, LastErrorObj="x"),
                tomb("b"),
                task("c"),
            ]
        )
    )
    assert list(fold.live) == ["a", "c"]
    assert fold.live["a"].fields["retryCount"] == 1
    assert list(fold.finished) == ["b"]
    assert fold.completed() == 1
    assert fold.dead_letters() == []


def test_fencing_ignores_records_below_the_latest_claim_before_them() -> None:
    fold = fold_log(
        log_of(
            [
                claim(1),
                task("a", epoch=1),
                claim(2),
                task("b", epoch=1),
                tomb("a", epoch=1),
                task("c", epoch=2),
                task("d", epoch=None),
            ]
        )
    )
    # b and a's tombstone were written by the fenced-off owner: stale.
    assert list(fold.live) == ["a", "c", "d"]
    assert [(s.epoch, s.fence) for s in fold.stale] == [(1, 2), (1, 2)]
    assert fold.log_epoch == 2


def test_in_flight_is_a_dispatch_not_resolved_by_a_later_full_record() -> None:
    fold = fold_log(
        log_of(
            [
                claim(1),
                task("a"),
                dispatch("a", 1),
                task("b"),
                dispatch("b", 1),
                task("b", retryCount=1),
                task("c"),
                dispatch("c", 1),
                tomb("c"),
            ]
        )
    )
    assert fold.in_flight() == {"a": 1}


def test_dead_letters_and_outcomes() -> None:
    snerd_dead = tomb("d1", OUTCOME_DEAD, retryCount=3, LastErrorObj="final")
    upstream_dead = tomb("d2", None, retryCount=2, maxRetries=3, LastErrorObj="previous")
    upstream_success = tomb("s1", None, retryCount=0, maxRetries=3, LastErrorObj="once")
    snerd_success = tomb("s2", OUTCOME_COMPLETED, retryCount=2)
    assert tombstone_outcome(snerd_dead) == OUTCOME_DEAD
    assert tombstone_outcome(upstream_dead) == OUTCOME_DEAD_INFERRED
    assert tombstone_outcome(upstream_success) == OUTCOME_COMPLETED
    assert tombstone_outcome(snerd_success) == OUTCOME_COMPLETED
    fold = fold_log(
        log_of(
            [
                snerd_dead,
                upstream_dead,
                upstream_success,
                snerd_success,
                tomb("again", OUTCOME_DEAD, LastErrorObj="x"),
                task("again"),
            ]
        )
    )
    letters = {d.task_id: d for d in fold.dead_letters()}
    assert set(letters) == {"d1", "d2"}  # "again" is live again
    assert letters["d1"].attempts == 3 and letters["d1"].error == "final"
    assert letters["d2"].inferred and letters["d2"].attempts == 3


def test_keep_ranges_keep_what_the_state_needs() -> None:
    now = T0
    data = log_of(
        [
            claim(1),
            task("old"),
            dispatch("old", 1),
            tomb("old"),
            task("rl", rateLimitGroup="g", maxPerMinute=5),
            dispatch("rl", 1, group="g", at=now - 70 * SECOND),
            task("rl", retryCount=1),
            dispatch("rl", 2, group="g", at=now - 5 * SECOND),
            claim(2),
            task("live", epoch=2),
            task("stale", epoch=1),
        ]
    )
    fold = fold_log(data)
    keep = fold.keep_ranges(now, history_limit=0)
    kept = fold_records(r for r in scan(data).records if r.offset in {k.offset for k in keep})
    assert list(kept.live) == ["rl", "live"]
    assert kept.in_flight() == {"rl": 2}
    assert kept.log_epoch == 2
    assert [w[1] for w in kept.windows] == [now - 5 * SECOND]
    assert not kept.finished
    with_history = fold.keep_ranges(now, history_limit=10)
    assert len(with_history) == len(keep) + 1


def test_keep_ranges_drop_completed_tasks_past_the_retention_and_keep_dead_letters() -> None:
    old = format_rfc3339(T0 - 10 * 86_400 * SECOND)
    data = log_of(
        [
            claim(1),
            {**tomb("done-old", snerdResult={"n": 1}), "deletedAt": old},
            {**tomb("dead-old", OUTCOME_DEAD), "deletedAt": old},
            tomb("done-new", snerdResult=[2]),
            {**tomb("done-odd"), "deletedAt": "not a time"},  # counts as just finished
        ]
    )
    fold = fold_log(data)
    assert fold.finished["done-new"].fields["snerdResult"] == [2]  # read back as stored
    week = 7 * 86_400 * SECOND
    for retention, expected in (
        (week, {"dead-old", "done-new", "done-odd"}),
        (0, {"done-old", "dead-old", "done-new", "done-odd"}),
    ):
        keep = {k.offset for k in fold.keep_ranges(T0, retention_us=retention)}
        kept = fold_records(r for r in scan(data).records if r.offset in keep)
        assert set(kept.finished) == expected, retention


# --------------------------------------------------------------- agreement with the daemon

ids = st.sampled_from(["a", "b", "c", "d"])


@st.composite
def logs(draw: st.DrawFn) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    epoch = 1
    retries: dict[str, int] = {}
    out.append(claim(epoch))
    for _ in range(draw(st.integers(0, 30))):
        kind = draw(st.sampled_from(["task", "retry", "tomb", "dispatch", "claim", "stale"]))
        t = draw(ids)
        if kind == "task":
            retries[t] = 0
            out.append(task(t, epoch, taskData=f"{t}-{len(out)}"))
        elif kind == "retry":
            retries[t] = retries.get(t, 0) + 1
            out.append(task(t, epoch, retryCount=retries[t], taskData=f"{t}-{len(out)}"))
        elif kind == "tomb":
            out.append(tomb(t, draw(st.sampled_from([OUTCOME_COMPLETED, OUTCOME_DEAD])), epoch))
        elif kind == "dispatch":
            out.append(dispatch(t, retries.get(t, 0) + draw(st.integers(0, 1)), epoch))
        elif kind == "claim":
            epoch += 1
            out.append(claim(epoch))
        else:
            out.append(task(t, epoch - 1, taskData="stale") if epoch > 1 else task(t, None))
    return out


@settings(max_examples=150, deadline=None)
@given(logs())
def test_fold_agrees_with_node_replay_and_survives_compaction(
    records: list[dict[str, Any]],
) -> None:
    data = log_of(records)
    assert fold_view(data) == node_view(data)
    assert list(fold_view(data)[0]) == list(node_view(data)[0])  # FIFO order too
    fold = fold_log(data)
    keep = fold.keep_ranges(T0)
    compacted = b"".join(data[k.offset : k.offset + k.length] for k in keep)
    assert fold_view(compacted)[0] == fold_view(data)[0]
    assert fold_view(compacted)[1] == fold_view(data)[1]
    assert node_view(compacted) == node_view(data)


# -- records a daemon cannot use, on disk ---------------------------------------------------------


def test_the_fold_names_the_live_tasks_whose_record_they_cannot_run_with() -> None:
    data = log_of(
        [
            task("a", maxExecutionSeconds="abc"),
            task("b"),
            task("c", pool=["slow"]),
            task("c", pool=["slow"], retryCount=1),  # the latest record of c is judged
            task("d", webhookUrl="http://h:99999/"),
            tomb("d"),  # ended: nothing to run
        ]
    )
    fold = fold_records(scan(data).records, keep_payloads=False)
    assert [(r.fields["taskId"], why) for r, why in fold.unrunnable()] == [
        ("a", "task a's record has maxExecutionSeconds 'abc', not an integer"),
        ("c", "task c's record has pool an array, not a string"),
    ]
    # Without payloads the fold still knows a live record that had none, or a wrong one.
    none = task("e")
    del none["taskData"]
    fold = fold_records(scan(log_of([none, task("f", taskData=[1])])).records, keep_payloads=False)
    assert [why for _, why in fold.unrunnable()] == [
        "task e's record has no taskData",
        "task f's record has taskData an array, not a string",
    ]


def test_a_node_dead_letters_a_task_it_cannot_run_and_runs_the_others() -> None:
    # A task record no enqueue would have taken: the replay dead-letters it saying why (once
    # the shard is fenced), and a task waiting for it fails with it.
    data = log_of(
        [
            task("bad", maxExecutionSeconds="abc", retryCount=1),
            task("child", triggerAfterIds=["bad"]),
            task("ok"),
        ]
    )
    shell = FakeShell(NodeConfig(node_id="n@pid-1-aa"))
    shell.disk["logs"][0] = bytearray(data)
    shell.start()
    shell.register("t")
    assert shell.executed_ids() == ["ok"]
    ends = {r["taskId"]: r for r in shell.log_records() if "deletedAt" in r}
    why = "task bad's record has maxExecutionSeconds 'abc', not an integer"
    assert ends["bad"]["LastErrorObj"] == why and ends["bad"]["retryCount"] == 1
    assert ends["bad"]["snerdOutcome"] == ends["child"]["snerdOutcome"] == OUTCOME_DEAD
    assert ends["child"]["LastErrorObj"] == "blocked_by_failed_parent: bad"
    assert ("warning", f"shard-0/tasks/tasks.log: {why} (at byte 0); it is dead-lettered") in (
        shell.logs_out
    )
    # Taken up again, the shard holds what it did: the tombstone ends the task.
    again = FakeShell(NodeConfig(node_id="n@pid-1-aa"), disk=shell.disk)
    again.start()
    assert set(again.node.tasks) == {"ok"}


async def _serves_ok_and_stays_up(d: Daemon) -> dict[str, Any]:
    """Register `t`, run task `ok` of the planted shard to success, until nothing is left to
    run; the daemon's stats then."""
    await d.send({"action": "register", "task_type": "t"})
    execute = await d.wait_for(lambda m: m["action"] == "execute")
    assert execute["task_id"] == "ok"  # the bad record's task never reaches the SDK
    await d.send({"action": "result", "task_id": "ok", "status": "success"})
    with trio.fail_after(10):
        while True:
            await d.send({"action": "stats"})
            stats = await d.wait_for(lambda m: m["action"] == "stats")
            if stats["queue_depth"] == 0:
                break
            await trio.sleep(0.02)
    assert d.alive
    return stats


async def test_a_daemon_skips_a_record_whose_task_type_is_a_list_and_serves_the_rest(
    tmp_path: Path, nursery: trio.Nursery, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: TypeError (an unhashable type) in `TaskBook.schedule` at start, in every daemon
    # that took the shard over. Not a record (a task type is what it runs by): a corrupt line.
    q = plant(tmp_path / "q", {0: [task("bad", taskType=["t"]), task("ok")]})
    d = await Daemon.start(nursery, q)
    await _serves_ok_and_stays_up(d)
    stderr = await d.wait_stderr("run `snerdmq fsck` for a report")
    assert (
        "shard-0/tasks/tasks.log: skipped a corrupt line at byte 0 (task bad's record has "
        "taskType an array, not a string)" in stderr
    )
    await d.close_stdin()
    assert await d.wait() == 0
    assert main(["fsck", str(q)]) == 1
    out = capsys.readouterr().out
    assert "corrupt line at byte 0: task bad's record has taskType an array, not a string" in out


async def test_a_daemon_dead_letters_a_task_whose_timeout_is_not_a_number_and_serves_the_rest(
    tmp_path: Path, nursery: trio.Nursery, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: the attempt's deadline (`TaskBook.begin_execution`) raised on "abc": the daemon
    # died at the first dispatch, and so did every daemon that took the shard over.
    bad = task("bad", maxExecutionSeconds="abc")
    q = plant(tmp_path / "q", {0: [bad, task("ok")]})
    assert main(["fsck", str(q)]) == 1
    why = "task bad's record has maxExecutionSeconds 'abc', not an integer"
    assert f"{why} (at byte 0): a daemon dead-letters it" in capsys.readouterr().out
    d = await Daemon.start(nursery, q)
    stats = await _serves_ok_and_stays_up(d)
    assert stats["total_dlq"] == 1 and stats["queue_depth"] == 0
    await d.wait_stderr(f"shard-0/tasks/tasks.log: {why} (at byte 0); it is dead-lettered")
    await d.close_stdin()
    assert await d.wait() == 0
    ends = [r.fields for r in scan(log_path(q).read_bytes()).records if "deletedAt" in r.fields]
    assert [(f["taskId"], f["snerdOutcome"], f.get("LastErrorObj")) for f in ends] == [
        ("bad", OUTCOME_DEAD, why),
        ("ok", OUTCOME_COMPLETED, None),
    ]
    assert main(["fsck", str(q)]) == 0  # a dead letter now, like any other


def test_counting_on_from_the_largest_epoch_and_sequence_writes_readable_records() -> None:
    # A claim and a sequence number at the largest counter a record may hold (no shard gets
    # there by counting: written by hand): the node's own claim and records must stay ones
    # readers take, or the next owner would skip them all as corrupt, acked tasks with them.
    data = log_of([claim(MAX_COUNT), task("old", MAX_COUNT, snerdSeq=MAX_COUNT)])
    shell = FakeShell(NodeConfig(node_id="n@pid-1-aa"))
    shell.disk["logs"][0] = bytearray(data)
    shell.start()
    shell.enqueue("new")
    assert scan(bytes(shell.disk["logs"][0])).corrupt == []
    again = FakeShell(NodeConfig(node_id="n@pid-1-aa"), disk=shell.disk)
    again.start()
    assert set(again.node.tasks) == {"old", "new"}


def test_a_task_whose_record_holds_no_payload_is_dead_lettered_without_a_base() -> None:
    # Its tombstone cannot be built on its record (the shell refuses a base without taskData,
    # and would dead-letter it again with another reason): it is written whole, with the why.
    bad = task("bad")
    del bad["taskData"]
    shell = FakeShell(NodeConfig(node_id="n@pid-1-aa"))
    shell.disk["logs"][0] = bytearray(log_of([bad, task("ok")]))
    shell.start()
    (tomb_,) = [r for r in shell.log_records() if "deletedAt" in r]
    assert tomb_["taskId"] == "bad" and tomb_["snerdOutcome"] == OUTCOME_DEAD
    assert tomb_["LastErrorObj"] == "task bad's record has no taskData"
    assert "executeAt" not in tomb_  # not built on the record
    assert set(shell.node.tasks) == {"ok"}


def test_a_cron_task_with_no_next_fire_before_year_10000_ends_instead_of_crashing() -> None:
    # The re-arm's `next_fire` raised out of the node (a wall clock in year 9999, a yearly
    # cron): now the task is done, said on the log.
    shell = FakeShell(NodeConfig(node_id="n@pid-1-aa"))
    shell.wall = MAX_US - 120 * SECOND
    at = format_rfc3339(shell.wall - 3600 * SECOND)
    yearly = task("yearly", retryAfterTime=at, executeAt=at, cronExpression="0 0 0 1 1 *")
    shell.disk["logs"][0] = bytearray(log_of([yearly]))
    shell.start()
    shell.register("t")
    assert shell.executed_ids() == ["yearly"]
    shell.result("yearly")
    (tomb_,) = [r for r in shell.log_records() if "deletedAt" in r]
    assert tomb_["snerdOutcome"] == OUTCOME_COMPLETED and "yearly" not in shell.node.tasks
    assert any("task yearly: not re-armed: cron" in m for _, m in shell.logs_out)


def test_an_inbox_record_whose_task_cannot_run_is_skipped_saying_why() -> None:
    # Its writer never took such an enqueue: written by hand. Before, it was ingested and the
    # node died at its first dispatch (the timeout "abc").
    owner = FakeShell(NodeConfig(node_id="owner@pid-1-a"))
    owner.start()
    owner.register("t")
    inbox = owner.disk["inboxes"].setdefault((0, "writer@pid-7-w"), bytearray())
    bad = encode_record(task("bad", None, maxExecutionSeconds="abc"))
    inbox += bad + encode_record(task("good", None, taskType=["t"])) + encode_record(task("ok"))
    owner.advance(5)
    assert owner.executed_ids() == ["ok"]
    where = "shard-0/inbox/writer@pid-7-w.log"
    assert (
        "warning",
        f"{where}: task bad's record has maxExecutionSeconds 'abc', not an integer (at byte 0); "
        "skipped",
    ) in owner.logs_out
    assert any(
        m.startswith(f"{where}: skipped a corrupt line at byte {len(bad)} (task good's record has")
        for _, m in owner.logs_out
    )


# ------------------------------------------------------------------------------ across shards


def folds_of(*logs: list[dict[str, Any]]) -> dict[int, Any]:
    return {shard: fold_log(log_of(records)) for shard, records in enumerate(logs)}


def dead(task_id: str, at: str = TS, **extra: Any) -> dict[str, Any]:
    return {**tomb(task_id, OUTCOME_DEAD, retryCount=3, LastErrorObj="boom", **extra), "deletedAt": at}


def test_a_dead_letter_counts_when_live_nowhere_and_the_latest_finish_wins() -> None:
    later = format_rfc3339(T0)
    folds = folds_of(
        [claim(1), dead("a"), dead("b"), dead("c"), dead("d")],
        [claim(1), task("b"), {**tomb("c"), "deletedAt": later}, dead("e")],
    )
    found = find_dead_letters(folds)
    # b is live again in shard 1; c completed later in shard 1: neither is a dead letter.
    assert [(d.shard, d.letter.task_id) for d in found] == [(0, "a"), (0, "d"), (1, "e")]
    assert [d.letter.task_id for d in find_dead_letters(folds, ids=["d", "e"])] == ["d", "e"]
    assert find_dead_letters(folds, task_type="other") == []


def test_a_replayed_record_is_the_task_afresh_with_its_data_and_seq() -> None:
    (d,) = find_dead_letters(folds_of([claim(1), dead("a", snerdSeq=7)]))
    fields = replay_record(d.letter.record, now="NOW", epoch=4, node="tool")
    assert next(iter(fields)) == "taskId"
    assert fields["taskData"] == d.letter.record.fields["taskData"]
    assert fields["snerdSeq"] == 7
    assert (fields["retryCount"], fields["executeAt"], fields["retryAfterTime"]) == (0, "NOW", "NOW")
    assert (fields["snerdNode"], fields["snerdEpoch"], fields["snerdReplayedAt"]) == ("tool", 4, "NOW")
    for gone in ("deletedAt", "snerdOutcome", "LastErrorObj", "LastJobError"):
        assert gone not in fields


def test_a_replay_skips_duplicates_of_pending_deduped_tasks_and_tasks_without_data() -> None:
    twin = {"autoDedupe": True, "payloadHash": "h1"}
    folds = folds_of(
        [claim(1), task("live", **twin), dead("a", **twin), dead("b", payloadHash="h1")],
        [claim(1), dead("c", autoDedupe=True, payloadHash="h2"),
         dead("d", autoDedupe=True, payloadHash="h2")],
    )
    plan = plan_replay(find_dead_letters(folds), folds)
    # a is a twin of a pending task; d of c, replayed first; b has no autoDedupe: replayed.
    assert sorted(d.letter.task_id for d in plan.replay) == ["b", "c"]
    assert plan.skipped == [
        "a: an identical task (live) is pending (auto_dedupe)",
        "d: an identical task (c) is pending (auto_dedupe)",
    ]
    no_data = folds_of([claim(1), dead("x")])
    del no_data[0].finished["x"].fields["taskData"]
    plan = plan_replay(find_dead_letters(no_data), no_data)
    assert plan.replay == [] and plan.skipped == ["x: its tombstone has no taskData"]


def test_a_purge_record_forgets_the_ended_tasks_before_it_that_did_not_succeed() -> None:
    purge = {"snerdKind": "purge", "tasks": ["d", "c", "ok", "live", "later"], "at": TS}
    data = log_of(
        [
            tomb("d", OUTCOME_DEAD, LastErrorObj="x"),
            tomb("c", "cancelled"),
            tomb("ok", OUTCOME_COMPLETED),
            tomb("live", OUTCOME_DEAD, LastErrorObj="x"),
            task("live"),  # put back: live again, not purged
            purge,
            tomb("later", OUTCOME_DEAD, LastErrorObj="x"),  # ended after the purge
        ]
    )
    fold = fold_log(data)
    assert [d.task_id for d in fold.dead_letters()] == ["later"]
    assert set(fold.finished) == {"ok", "live", "later"} and fold.purged == 2
    # Compaction keeps neither the purged tombstones nor the purge record (nor the tombstone
    # of the task put back).
    kept = {k.offset for k in fold.keep_ranges(0)}
    dropped = {r.fields.get("taskId") or r.fields.get("snerdKind")
               for r in scan(data).records if r.offset not in kept}
    assert dropped == {"d", "c", "live", "purge"}
