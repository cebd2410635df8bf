"""Task functions (`@queue.task`) through both faces and the blocking producer: a call's
arguments are its payload and its handler's keywords; the task's defaults reach its record
(retries, backoff, timeout, pool, rate, dedupe) and `using` overrides them for one call; an
exception `never_retry` names, or a `FinalError`, goes straight to the dead letter queue
with its error; `enqueue_sync` needs no event loop; a call that does not fit the signature is
refused before anything is sent."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest

from snerd import Engine, FinalError, SnerdQueue, TaskFunction
from snerd.core.records import scan
from tests.support.sdkhelpers import Calls, Runner
from tests.support.sdkhelpers import run as run  # the fixture

Face = Callable[[Path], SnerdQueue | Engine]


@pytest.fixture(params=["queue", "engine"])
def face(request: pytest.FixtureRequest) -> Face:
    if request.param == "queue":
        return lambda path: SnerdQueue(storage_path=path / "q", drain_timeout=3)
    return lambda path: Engine(path / "q", drain_timeout=3)


def _records(path: Path, task_id: str) -> list[dict[str, Any]]:
    data = (path / "q" / "shard-0" / "tasks" / "tasks.log").read_bytes()
    return [dict(r.fields) for r in scan(data).records if r.fields.get("taskId") == task_id]


def test_a_task_function_runs_with_its_arguments_and_carries_its_defaults(
    run: Runner, face: Face, tmp_path: Path
) -> None:
    async def scenario() -> None:
        calls = Calls()
        async with face(tmp_path) as queue:

            @queue.task(retries=5, retry_after=timedelta(seconds=2), backoff="exponential",
                        backoff_max=60, timeout=30, pool="mail", rate=100, urgency=2)
            async def send_email(to: str, subject: str = "hi", *, cc: list[str] | None = None) -> str:
                calls.add((to, subject, cc))
                return f"sent to {to}"

            assert isinstance(send_email, TaskFunction)
            assert send_email.name.endswith("send_email")
            first = await send_email.enqueue("ada@example.com", cc=["bob@example.com"])
            await send_email.using(task_id="second", urgency_score=9).enqueue(
                to="cy@example.com", subject="yo")
            await calls.wait(2)
            assert sorted(calls.items) == [("ada@example.com", "hi", ["bob@example.com"]),
                                           ("cy@example.com", "yo", None)]
            assert await queue.result(first.task_id, timeout=10) == "sent to ada@example.com"
            # Called directly, it is the function.
            assert await send_email("dee@example.com") == "sent to dee@example.com"
            with pytest.raises(TypeError):
                await send_email.enqueue(subject="no recipient")  # type: ignore[call-arg]
            with pytest.raises(TypeError, match="unexpected option 'colour'"):
                await send_email.using(colour="red").enqueue(to="x")
        record = _records(tmp_path, first.task_id)[0]
        assert record["taskType"] == send_email.name
        assert record["maxRetries"] == 5
        assert record["retryAfterHours"] == pytest.approx(2 / 3600)
        assert (record["snerdBackoff"], record["snerdBackoffMax"]) == ("exponential", 60)
        assert record["maxExecutionSeconds"] == 30 and record["pool"] == "mail"
        assert (record["rateLimitGroup"], record["maxPerMinute"]) == (send_email.name, 100)
        assert record["urgencyScore"] == 2
        assert '"to":"ada@example.com"' in record["taskData"].replace(" ", "")
        assert _records(tmp_path, "second")[0]["urgencyScore"] == 9

    run(scenario)


def test_never_retry_and_final_error_go_straight_to_the_dead_letter_queue(
    run: Runner, face: Face, tmp_path: Path
) -> None:
    async def scenario() -> None:
        attempts: list[str] = []
        dead = Calls()
        async with face(tmp_path) as queue:

            @queue.task(name="parse", retries=4, never_retry=(ValueError,))
            def parse(text: str) -> int:  # a sync handler, in a worker thread
                attempts.append(text)
                if text == "flaky" and attempts.count("flaky") < 3:
                    raise OSError("try again")
                if text == "final":
                    raise FinalError("unusable input")
                return 7 if text == "flaky" else int(text)

            @queue.max_retry_handler("parse")
            async def on_dead(data: dict[str, str], error: str | None) -> None:
                dead.add((data["text"], error))

            await parse.using(task_id="bad").enqueue("twelve")
            await parse.using(task_id="final").enqueue("final")
            await parse.using(task_id="flaky").enqueue("flaky")
            await dead.wait(2)
            assert await queue.result("flaky", timeout=10) == 7
        assert attempts.count("twelve") == 1 and attempts.count("final") == 1
        assert attempts.count("flaky") == 3  # an error not named is retried as usual
        errors = dict(dead.items)
        assert errors["twelve"] is not None and "ValueError" in errors["twelve"]
        assert errors["final"] == "unusable input"

    run(scenario)


def test_enqueue_sync_needs_no_event_loop(tmp_path: Path) -> None:
    ran: list[int] = []

    async def main() -> None:
        async with SnerdQueue(storage_path=tmp_path / "q", drain_timeout=3) as queue:

            @queue.task(name="add", dedupe=lambda a, b: f"{a}+{b}")
            async def add(a: int, b: int) -> int:
                ran.append(a + b)
                return a + b

            with anyio.fail_after(30):
                while not (tmp_path / "q" / "membership.json").exists():
                    await anyio.sleep(0.02)
            later = timedelta(hours=1)  # the first stays live: the second is its twin
            first, twin = await anyio.to_thread.run_sync(lambda: (
                add.using(execute_at=later).enqueue_sync(2, 3),
                add.using(execute_at=later).enqueue_sync(b=3, a=2),
            ))
            assert first.deduplicated is False
            assert (twin.deduplicated, twin.duplicate_of) == (True, first.task_id)
            now = await anyio.to_thread.run_sync(lambda: add.enqueue_sync(1, 1))
            with anyio.fail_after(30):
                while not ran:
                    await anyio.sleep(0.02)
            assert ran == [2] and now.deduplicated is False
        (record, *_) = [r for r in (tmp_path / "q").glob("shard-*/inbox/producer-*.log")]
        assert b'"uniqueKey"' not in record.read_bytes()  # (a key is a fingerprint, not data)

    anyio.run(main)
