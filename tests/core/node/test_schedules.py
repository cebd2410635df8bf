"""Named schedules (`snerd.core.schedule`, `snerd.core.node.schedules`): declared idempotently
from any node, fired once per tick by the owner of the name's shard, runs that are tasks like
any other (a failed one does not end the schedule), misfire and overlap policies, time zones,
and a takeover that goes on from the last tick fired."""

from __future__ import annotations

from typing import Any

from snerd.core.cron import normalize_cron
from snerd.core.node import NodeConfig
from snerd.core.schedule import due, run_id
from snerd.core.timefmt import format_rfc3339, parse_rfc3339
from tests.core.node.test_inbox import pair
from tests.support.fakeshell import SECOND, FakeShell


def started(**config: Any) -> FakeShell:
    sh = FakeShell(NodeConfig(node_id="n@pid-1-x", **config))
    sh.start()
    return sh


def schedule(sh: FakeShell, name: str = "tick", cron: str = "*/10 * * * * *", **extra: Any) -> None:
    sh.line(
        {
            "action": "schedule",
            "name": name,
            "cron": cron,
            "task_type": extra.pop("task_type", "t"),
            "task_data": extra.pop("task_data", "{}"),
            "max_retries": extra.pop("max_retries", 0),
            "retry_after_hours": 0,
            **extra,
        }
    )


def answers(sh: FakeShell) -> list[str]:
    return [m["result"] for m in sh.messages("scheduled")]


def runs(sh: FakeShell) -> list[str]:
    return [i for i in sh.executed_ids() if "@" in i]


def to_next_tick(sh: FakeShell, every_s: int = 10) -> None:
    """Move the clock to just after the next multiple of `every_s` seconds."""
    left = every_s * SECOND - sh.wall % (every_s * SECOND)
    sh.advance(left / SECOND + 0.001)


def test_a_schedule_fires_once_per_tick_with_runs_named_by_their_tick() -> None:
    sh = started()
    sh.register("t")
    schedule(sh)
    assert answers(sh) == ["created"]
    assert runs(sh) == []
    to_next_tick(sh)
    (first,) = runs(sh)
    tick = sh.wall - sh.wall % (10 * SECOND)
    assert first == run_id("tick", tick) == f"tick@{format_rfc3339(tick)}"
    sh.result(first)
    to_next_tick(sh)
    to_next_tick(sh)
    assert len(runs(sh)) == 3 and len(set(runs(sh))) == 3
    records = [r for r in sh.log_records() if r.get("snerdKind") == "schedule"]
    assert records[-1]["fired"] == format_rfc3339(sh.wall - sh.wall % (10 * SECOND))


def test_declaring_again_is_idempotent_and_a_change_takes_effect() -> None:
    sh = started()
    sh.register("t")
    schedule(sh)
    schedule(sh)  # every boot declares it again
    schedule(sh, cron="*/30 * * * * *")
    schedule(sh, cron="*/30 * * * * *", task_data='{"v":2}')
    assert answers(sh) == ["created", "unchanged", "updated", "updated"]
    to_next_tick(sh, 30)
    (run,) = runs(sh)
    assert sh.payload(sh.executed[-1].location) == '{"v":2}'
    sh.line({"action": "unschedule", "name": "tick"})
    sh.line({"action": "unschedule", "name": "tick"})
    assert answers(sh)[-2:] == ["removed", "absent"]
    sh.result(run)
    sh.advance(100)
    assert len(runs(sh)) == 1


def test_a_failed_run_is_dead_lettered_as_a_run_and_the_schedule_goes_on() -> None:
    sh = started()
    sh.register("t")
    schedule(sh, max_retries=0)
    to_next_tick(sh)
    (first,) = runs(sh)
    sh.result(first, ok=False, error="boom")
    assert [d.task_id for d in sh.dead_letters] == [first]
    to_next_tick(sh)
    assert len(runs(sh)) == 2


def test_overlap_skip_and_wait_and_allow() -> None:
    for overlap, expect in (("allow", 3), ("skip", 1), ("wait", 1)):
        sh = started()
        sh.register("t")
        schedule(sh, overlap=overlap)
        to_next_tick(sh)
        to_next_tick(sh)
        to_next_tick(sh)
        assert len(runs(sh)) == expect, overlap
        if overlap == "wait":
            sh.result(runs(sh)[0])  # the held tick runs once the live run ends
            assert len(runs(sh)) == 2


def test_declaring_again_a_schedule_holding_a_tick_answers_without_a_next_fire() -> None:
    # overlap `wait` holds the tick that came while a run was live: the schedule has no next
    # fire time until that run ends, and a boot's declaration of it must still be answered
    # (simulator seed 10, --faults-of fire-unmarked: the node raised formatting "never").
    sh = started()
    sh.register("t")
    schedule(sh, overlap="wait")
    to_next_tick(sh)
    to_next_tick(sh)  # held: a run is live
    schedule(sh, overlap="wait")
    (answer,) = sh.messages("scheduled")[-1:]
    assert answer["result"] == "unchanged" and "next_fire" not in answer
    sh.result(runs(sh)[0])  # the held tick runs, and the schedule has a next tick again
    schedule(sh, overlap="wait")
    assert "next_fire" in sh.messages("scheduled")[-1]


def test_misfire_policies_after_downtime() -> None:
    cron = normalize_cron("0 0 * * *")
    fired = parse_rfc3339("2027-01-01T00:00:00Z")
    now = parse_rfc3339("2027-01-05T12:00:00Z")
    got = {
        policy: [format_rfc3339(t)[:10] for t in due(
            cron, None, fired_us=fired, now_us=now, misfire=policy, catch_up=2
        ).runs]
        for policy in ("skip", "once", "catch_up")
    }
    assert got == {
        "skip": [],
        "once": ["2027-01-05"],
        "catch_up": ["2027-01-04", "2027-01-05"],
    }
    # On time: the tick just passed runs whatever the policy.
    just = parse_rfc3339("2027-01-02T00:00:01Z")
    assert [due(cron, None, fired_us=fired, now_us=just, misfire="skip", catch_up=1).runs] == [
        (parse_rfc3339("2027-01-02T00:00:00Z"),)
    ]


def test_a_time_zone_reads_the_expression_in_local_time() -> None:
    sh = started()
    sh.register("t")
    schedule(sh, cron="0 9 * * *", timezone="Asia/Tokyo")
    sh.advance(24 * 3600 + 1)
    (run,) = runs(sh)
    assert run.endswith("T00:00:00.000000Z")  # 09:00 in Tokyo is midnight UTC
    sh.line({"action": "schedule", "name": "x", "cron": "0 9 * * *", "timezone": "Mars/Base",
             "task_type": "t", "task_data": "{}", "max_retries": 0, "retry_after_hours": 0})
    (error,) = sh.messages("error")
    assert error["name"] == "x" and "unknown timezone 'Mars/Base'" in error["message"]


def test_a_declaration_through_another_node_is_applied_by_the_owner() -> None:
    owner, other = pair()
    owner.register("t")
    schedule(other, name="nightly")
    assert answers(other) == ["forwarded"]
    owner.advance(0.15)
    assert "nightly" in owner.node.schedules.by_name
    schedule(other, name="nightly")  # declared again at the next boot: nothing changes
    owner.advance(0.15)
    records = [r for r in owner.log_records() if r.get("snerdKind") == "schedule"]
    assert len(records) == 1


def test_a_new_owner_goes_on_from_the_last_tick_fired() -> None:
    sh = started()
    sh.register("t")
    schedule(sh, misfire="skip")
    to_next_tick(sh)
    to_next_tick(sh)
    fired = runs(sh)
    assert len(fired) == 2
    for run in fired:
        sh.result(run)
    # The owner dies; the next one takes the shard over once the lease ran out (past the
    # misfire grace: the ticks missed meanwhile are skipped, as the schedule says).
    sh.disk["locks"].clear()
    again = FakeShell(NodeConfig(node_id="n@pid-2-y"), disk=sh.disk)
    again.wall, again.mono = sh.wall, sh.mono
    again.start()
    again.register("t")
    again.advance(70)
    assert again.node.owned_shards == [0]
    assert not set(runs(again)) & set(fired)
    to_next_tick(again)
    ticks = runs(again)
    assert ticks and len(set(ticks)) == len(ticks)
    assert any("ticks missed" in m for _, m in again.logs_out)


def test_bad_declarations_are_refused_with_the_schedule_named() -> None:
    sh = started()
    for extra, text in (
        ({"cron": None}, "missing field `cron`"),
        ({"misfire": "often"}, "misfire must be one of skip, once, catch_up"),
        ({"overlap": 3}, "overlap must be one of allow, skip, wait"),
        ({"catch_up": 0}, "catch_up must be a whole number from 1 to 1000"),
        ({"execute_at": "2027-01-01T00:00:00Z"}, "a schedule has no `execute_at`"),
        ({"cron": "61 * * * *"}, "minute 61 out of range"),
        ({"max_retries": -1}, "max_retries"),
    ):
        schedule(sh, name="bad", **extra)
        message = sh.messages("error")[-1]
        assert message.get("name") == "bad" and text in message["message"], (extra, message)
        assert message["message"].startswith("Failed to schedule: ")
    assert sh.node.schedules.by_name == {}


def test_a_cron_task_whose_run_fails_for_good_is_reported_and_runs_at_its_next_tick() -> None:
    # The `cron` option of an enqueue (upstream's recurring task, one id): a run that uses
    # every attempt is a dead letter for the SDK, and the task goes on (upstream ended it).
    sh = started()
    sh.register("t")
    sh.enqueue("beat", cron="10s", max_retries=0)
    to_next_tick(sh)
    assert sh.executed_ids() == ["beat"]
    sh.result("beat", ok=False, error="boom")
    assert [(d.task_id, d.error) for d in sh.dead_letters] == [("beat", "boom")]
    assert "beat" in sh.node.tasks
    record = [r for r in sh.log_records() if r.get("taskId") == "beat"][-1]
    assert record["LastErrorObj"] == "boom" and record.get("deletedAt") is None
    to_next_tick(sh)
    assert sh.executed_ids() == ["beat", "beat"]
    sh.result("beat")
    record = [r for r in sh.log_records() if r.get("taskId") == "beat"][-1]
    assert "LastErrorObj" not in record


def test_the_negative_control_leaves_the_fired_tick_out_of_the_log() -> None:
    for unsafe, refired in ((False, False), (True, True)):
        sh = started(unsafe_fire_unmarked=unsafe)
        sh.register("t")
        schedule(sh, misfire="catch_up", catch_up=5)
        to_next_tick(sh)
        (first,) = runs(sh)
        sh.result(first)
        sh.disk["locks"].clear()
        again = FakeShell(
            NodeConfig(node_id="n@pid-2-y", unsafe_fire_unmarked=unsafe), disk=sh.disk
        )
        again.wall, again.mono = sh.wall, sh.mono
        again.start()
        again.register("t")
        again.advance(40)  # the lease runs out; the new owner catches up what it missed
        assert (first in runs(again)) is refired


def test_a_declaration_sent_while_the_daemon_starts_is_answered_once_it_runs() -> None:
    """Every boot declares its schedules as soon as it can write a line, before the node
    runs: the line is held like an enqueue, not refused as a drain would be."""
    sh = FakeShell(NodeConfig(node_id="n@pid-1-x"))
    schedule(sh)
    assert sh.messages("error") == []
    sh.start()
    assert answers(sh) == ["created"]
    assert sh.messages("error") == []


def test_a_declaration_whose_inbox_write_fails_is_refused_by_name() -> None:
    """The non-owner's inbox cannot be written: the SDK learns that the declaration failed,
    by the schedule's name (it cannot match an error without one), and no enqueue is counted
    off the stats."""
    _, other = pair()
    before = other.node.stats["total_enqueued"]
    other.disk_full = True
    schedule(other, name="nightly")
    errors = other.messages("error")
    assert [e.get("name") for e in errors] == ["nightly"], errors
    assert errors[0]["message"].startswith("Failed to schedule: No space left"), errors
    assert "forwarded" not in answers(other)
    assert other.node.stats["total_enqueued"] == before


def test_a_declaration_while_a_fire_is_in_flight_keeps_the_tick_fired_in_the_log() -> None:
    """A changed declaration lands while the append of a tick's run is in flight: the log's
    latest record of the schedule, which the next owner goes on from, must not say an
    earlier tick than the run in the log before it (the next owner would run that tick
    again)."""
    sh = started()
    sh.register("t")
    schedule(sh)
    sh.hold_appends = True
    to_next_tick(sh)  # the run of this tick and the schedule's record: held, in flight
    tick = sh.wall - sh.wall % (10 * SECOND)
    schedule(sh, task_data='{"v":2}')  # every boot of an updated app declares it anew
    sh.hold_appends = False
    sh.release_held()
    assert run_id("tick", tick) in {r.get("taskId") for r in sh.log_records()}
    latest = [r for r in sh.log_records() if r.get("snerdKind") == "schedule"][-1]
    assert parse_rfc3339(latest["fired"]) >= tick, latest
