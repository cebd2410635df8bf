"""Named schedules through both faces, `SnerdQueue` (a real daemon process) and `Engine` (the
runtime in-process), each under trio and under asyncio (`run`, tests/support/sdkhelpers.py):
`schedule` / `unschedule` send their line and return the daemon's answer, a refusal raises
`ScheduleError` with the daemon's text, and a run reaches the registered handler at its tick.
Waits are on events set by handlers, bounded by `anyio.fail_after`."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from snerd import Engine, Scheduled, ScheduleError, SnerdQueue, current_task
from snerd.sdk.messages import build_schedule_message, json_text, scheduled_from_reply
from tests.support.sdkhelpers import Calls, Runner
from tests.support.sdkhelpers import run as run  # the fixture

Face = Callable[[Path], SnerdQueue | Engine]

#: A run's id: `<name>@<tick>`, the tick in RFC 3339 (UTC, whole seconds, written with µs).
RUN_ID = re.compile(r"(?P<name>.+)@(?P<tick>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.000000Z)")


@pytest.fixture(params=["queue", "engine"])
def face(request: pytest.FixtureRequest) -> Face:
    """Makes the face under test on a directory."""
    if request.param == "queue":
        return lambda path: SnerdQueue(storage_path=path / "q", drain_timeout=5)
    return lambda path: Engine(path / "q", drain_timeout=5)


async def _declare_update_remove(face: Face, tmp_path: Path) -> None:
    async with face(tmp_path) as q:
        first = await q.schedule("nightly", "0 3 * * *", "report", {"to": "ops"})
        assert first.result == "created"
        assert first.next_fire is not None and first.next_fire > datetime.now(UTC)
        assert (first.next_fire.hour, first.next_fire.minute) == (3, 0)
        again = await q.schedule("nightly", "0 3 * * *", "report", {"to": "ops"})
        assert again == Scheduled("nightly", "unchanged", first.next_fire)
        moved = await q.schedule(
            "nightly", "0 3 * * *", "report", {"to": "ops"}, timezone="Asia/Tokyo"
        )
        assert moved.result == "updated"
        assert moved.next_fire is not None and moved.next_fire.hour == 18  # 03:00 JST
        data = await q.schedule(
            "nightly", "0 3 * * *", "report", {"to": "all"}, timezone="Asia/Tokyo"
        )
        assert data.result == "updated"
        assert await q.unschedule("nightly") == Scheduled("nightly", "removed")
        assert await q.unschedule("nightly") == Scheduled("nightly", "absent")

        with pytest.raises(ScheduleError) as refused:
            await q.schedule("moon", "* * * * *", "report", timezone="Mars/Olympus")
        assert refused.value.name == "moon"
        assert refused.value.message == (
            "Failed to schedule: unknown timezone 'Mars/Olympus' (an IANA name, like "
            "Europe/Paris)"
        )
        with pytest.raises(ScheduleError, match=r"^Failed to schedule: .*minute 61"):
            await q.schedule("bad", "61 * * * *", "report")
        with pytest.raises(ScheduleError, match="misfire must be one of"):
            await q.schedule("bad", "* * * * *", "report", misfire="sometimes")
        # The queue answers on after its refusals.
        assert (await q.schedule("bad", "* * * * *", "report")).result == "created"


def test_declare_again_is_unchanged_a_change_updates_and_a_refusal_raises(
    run: Runner, face: Face, tmp_path: Path
) -> None:
    run(_declare_update_remove, face, tmp_path)


async def _a_run_reaches_its_handler(face: Face, tmp_path: Path) -> None:
    calls = Calls()
    async with face(tmp_path) as q:

        @q.handler("beat")
        async def beat(data: Any) -> None:
            calls.add((current_task().task_id, data))

        declared = await q.schedule(
            "heartbeat", "*/1 * * * * *", "beat", {"n": 1}, max_retries=0, urgency_score=5
        )
        assert declared.result == "created"
        (task_id, data), *_ = await calls.wait(1)
        assert data == {"n": 1}
        match = RUN_ID.fullmatch(task_id)
        assert match is not None and match["name"] == "heartbeat", task_id
        assert await q.unschedule("heartbeat") == Scheduled("heartbeat", "removed")


def test_a_run_reaches_the_registered_handler_at_its_tick(
    run: Runner, face: Face, tmp_path: Path
) -> None:
    run(_a_run_reaches_its_handler, face, tmp_path)


# --- what the SDK writes and reads, no daemon ------------------------------------------------


def test_the_schedule_message_writes_data_as_an_enqueue_does() -> None:
    message = build_schedule_message(
        "s", "5m", "t", {"b": 1, "a": [2.5]}, 0, 0.5, {"timezone": None, "misfire": "skip"},
        {"pool": "p"},
    )
    assert message == {
        "action": "schedule",
        "name": "s",
        "cron": "5m",
        "task_type": "t",
        "task_data": json_text({"b": 1, "a": [2.5]}),
        "max_retries": 0,
        "retry_after_hours": 0.5,
        "misfire": "skip",
        "pool": "p",
    }
    with pytest.raises(ScheduleError, match=r"^Failed to schedule: retry_after_hours must be"):
        build_schedule_message("s", "5m", "t", None, 0, float("nan"), {}, {})


def test_a_scheduled_reply_is_read_into_its_value() -> None:
    reply = {"action": "scheduled", "name": "s", "result": "created",
             "next_fire": "2026-03-29T01:00:00Z"}
    assert scheduled_from_reply(reply) == Scheduled(
        "s", "created", datetime(2026, 3, 29, 1, tzinfo=UTC)
    )
    assert scheduled_from_reply({"name": "s", "result": "forwarded", "next_fire": 7}) == (
        Scheduled("s", "forwarded", None)
    )


async def _options_a_schedule_decides_are_refused(face: Face, tmp_path: Path) -> None:
    q = face(tmp_path)
    with pytest.raises(TypeError, match="'execute_at'"):
        await q.schedule("s", "5m", "t", execute_at="2026-01-01T00:00:00Z")
    with pytest.raises(TypeError, match="'colour'"):
        await q.schedule("s", "5m", "t", colour="red")


@pytest.mark.parametrize("run", ["trio"], indirect=True)
def test_options_a_schedule_decides_or_enqueue_lacks_are_refused(
    run: Runner, face: Face, tmp_path: Path
) -> None:
    run(_options_a_schedule_decides_are_refused, face, tmp_path)
