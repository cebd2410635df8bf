"""`snerd.testing`: the real engine on a virtual clock. Every time asserted here is the queue's
virtual clock (`Run.started_at`, `now()`), never the host's: the proof that `advance` made
the hours pass is that nothing ran before it and everything ran at its own virtual time."""

from __future__ import annotations

import datetime as dt
import math
import threading
import tomllib
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from snerd.io.datadir import DataDirectoryError
from snerd.sdk.context import yield_progress
from snerd.sdk.errors import TaskFailed
from snerd.testing import AsyncTestQueue, TaskNotFinished, TestQueue

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]
START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
HOUR = dt.timedelta(hours=1)


@pytest.fixture
def queue(tmp_path: Path) -> Any:
    with TestQueue(tmp_path / "q", start=START) as q:
        yield q


def _flaky(failures: int) -> Any:
    """A sync handler that fails its first `failures` calls, then returns how many it took."""
    calls: list[int] = []

    def handler(data: Any) -> dict[str, int]:
        calls.append(1)
        if len(calls) <= failures:
            raise ValueError(f"failure {len(calls)}")
        return {"calls": len(calls)}

    return handler


def test_a_three_hour_backoff_runs_its_attempts_an_hour_apart_on_the_virtual_clock(
    queue: TestQueue,
) -> None:
    queue.register_handler("flaky", _flaky(2))
    queue.enqueue("t1", "flaky", {}, max_retries=2, retry_after_hours=1)
    (first,) = queue.run_until_idle()
    assert (first.attempt, first.error) == (1, "ValueError: failure 1")
    assert isinstance(first.exception, ValueError) and first.exception.__traceback__
    # Nothing more happens without the clock: the retry waits for its hour.
    assert queue.run_until_idle() == []
    details = queue.get("t1")
    assert (details.state, details.attempts) == ("retrying", 1)
    with pytest.raises(TaskNotFinished) as raised:
        queue.result("t1")
    assert raised.value.state == "retrying"
    assert queue.advance(minutes=59) == []
    (second,) = queue.advance(minutes=1)
    (third,) = queue.advance(hours=1, seconds=30)
    assert [second.attempt, third.attempt] == [2, 3]
    assert (second.error, third.error) == ("ValueError: failure 2", None)
    assert [r.started_at for r in (first, second, third)] == [START, START + HOUR, START + 2 * HOUR]
    assert queue.result("t1") == {"calls": 3}
    assert queue.now() == START + 2 * HOUR + dt.timedelta(seconds=30)
    assert queue.runs_of("t1") == [first, second, third]


def test_a_delayed_task_runs_once_advance_passes_its_time_and_not_before(
    queue: TestQueue,
) -> None:
    @queue.handler("report")
    async def report(data: Any) -> str:
        return f"report {data}"

    queue.enqueue("r1", "report", 7, execute_at=dt.timedelta(hours=2))
    assert queue.run_until_idle() == []
    assert queue.advance(hours=1, minutes=59, seconds=59) == []
    assert queue.get("r1").state == "delayed"
    (run,) = queue.advance(seconds=1)
    assert (run.task_id, run.started_at, run.result) == ("r1", START + 2 * HOUR, "report 7")
    assert queue.result("r1") == "report 7"


def test_a_cron_task_fires_four_times_over_a_day_at_its_ticks(queue: TestQueue) -> None:
    queue.register_handler("tick", lambda data: None)
    queue.enqueue("c1", "tick", None, cron="0 */6 * * *")
    assert queue.run_until_idle() == []  # (a cron task waits for its first tick)
    runs = queue.advance(days=1)
    assert [r.started_at for r in runs] == [START + n * 6 * HOUR for n in (1, 2, 3, 4)]
    assert queue.get("c1").state == "delayed"  # re-armed for the next tick


def test_a_named_schedule_runs_one_task_per_tick(queue: TestQueue) -> None:
    queue.register_handler("nightly", lambda data: data)
    scheduled = queue.schedule("backup", "0 3 * * *", "nightly", {"full": True})
    assert scheduled.next_fire == START + 3 * HOUR
    runs = queue.advance(days=2)
    assert [(r.task_id, r.started_at) for r in runs] == [
        ("backup@2026-01-01T03:00:00.000000Z", START + 3 * HOUR),
        ("backup@2026-01-02T03:00:00.000000Z", START + 27 * HOUR),
    ]
    assert queue.result(runs[0].task_id) == {"full": True}


def test_a_rate_limit_window_lets_one_task_a_minute_through(queue: TestQueue) -> None:
    queue.register_handler("api", lambda data: data)
    for i in range(3):
        queue.enqueue(f"a{i}", "api", i, rate_limit_group="api", max_per_minute=1)
    assert [r.task_id for r in queue.run_until_idle()] == ["a0"]
    assert queue.advance(seconds=59) == []
    runs = queue.advance(minutes=2)
    assert [(r.task_id, r.started_at) for r in runs] == [
        ("a1", START + dt.timedelta(minutes=1)),
        ("a2", START + dt.timedelta(minutes=2)),
    ]


def test_run_until_idle_runs_children_after_their_parents(queue: TestQueue) -> None:
    queue.register_handler("step", lambda data: data)
    queue.enqueue("load", "step", "load", trigger_after_ids=["fetch-a", "fetch-b"])
    queue.enqueue("report", "step", "report", trigger_after_ids=["load"])
    queue.enqueue("fetch-a", "step", "a")
    queue.enqueue("fetch-b", "step", "b")
    order = [r.task_id for r in queue.run_until_idle()]
    assert sorted(order[:2]) == ["fetch-a", "fetch-b"]
    assert order[2:] == ["load", "report"]
    assert queue.get("report").state == "succeeded"


def test_a_retry_due_now_and_a_dead_letter_are_seen_by_run_until_idle(queue: TestQueue) -> None:
    letters: list[tuple[Any, str | None]] = []
    queue.register_handler("doomed", _flaky(10))
    queue.register_max_retry_handler("doomed", lambda data, error: letters.append((data, error)))
    queue.enqueue("d1", "doomed", {"n": 1}, max_retries=2)  # retry_after_hours=0: at once
    runs = queue.run_until_idle()
    assert [r.attempt for r in runs] == [1, 2, 3]
    assert letters == [({"n": 1}, "ValueError: failure 3")]
    (found,) = queue.dead_letters("doomed")
    assert (found.letter.task_id, found.letter.attempts) == ("d1", 3)
    with pytest.raises(TaskFailed) as raised:
        queue.result("d1")
    assert raised.value.state == "dead_letter"
    # Job control goes to the engine's face: the dead letter runs again.
    assert queue.retry("d1").retried
    assert [r.attempt for r in queue.run_until_idle()] == [1, 2, 3]


def test_run_until_idle_waits_for_a_sync_handler_in_its_thread(queue: TestQueue) -> None:
    # The handler's thread is held until the test's thread has asked for idle: a queue that
    # returned while it ran would have no run to report.
    release = threading.Event()

    @queue.handler("slow")
    def slow(data: Any) -> str:
        release.wait(10)
        return "done"

    queue.enqueue("s1", "slow", None)
    threading.Timer(0.05, release.set).start()
    assert [r.result for r in queue.run_until_idle()] == ["done"]
    assert queue.get("s1").state == "succeeded"


def test_progress_of_a_sync_handler_reaches_the_observers(queue: TestQueue) -> None:
    seen: list[tuple[str, Any]] = []
    queue.on_progress(lambda task_id, data: seen.append((task_id, data)))

    @queue.handler("import")
    def load(data: Any) -> None:
        for step in range(3):
            yield_progress({"step": step})

    queue.enqueue("i1", "import", None)
    queue.run_until_idle()
    assert seen == [("i1", {"step": 0}), ("i1", {"step": 1}), ("i1", {"step": 2})]


def test_a_handler_that_waits_for_idle_fails_its_attempt_instead_of_hanging(
    queue: TestQueue,
) -> None:
    @queue.handler("impatient")
    def impatient(data: Any) -> None:
        queue.run_until_idle()  # (it would wait for itself)

    queue.enqueue("i1", "impatient", None, max_retries=0)
    (run,) = queue.run_until_idle()
    assert run.error is not None and "wait for itself" in run.error


def test_eager_mode_runs_the_handler_before_enqueue_returns(tmp_path: Path) -> None:
    with TestQueue(tmp_path / "q", start=START, eager=True) as q:
        seen: list[Any] = []

        @q.handler("email")
        def send(data: Any) -> None:
            seen.append(data)
            q.enqueue(None, "audit", data)  # from a handler: enqueued, not waited for

        q.register_handler("audit", lambda data: seen.append(("audit", data)))
        q.enqueue("e1", "email", "ada")
        assert seen == ["ada", ("audit", "ada")]
        assert q.get("e1").state == "succeeded"


def test_a_directory_that_cannot_hold_a_queue_is_raised_by_start_as_it_is(
    tmp_path: Path,
) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    with pytest.raises(DataDirectoryError):
        TestQueue(not_a_dir).start()


def test_the_queue_starts_at_the_time_it_is_given_and_advance_refuses_to_go_back(
    queue: TestQueue,
) -> None:
    assert queue.now() == START
    with pytest.raises(ValueError):
        queue.advance(seconds=-1)


# ------------------------------------------------------------------ the async face


async def test_the_async_queue_runs_on_the_trio_tests_mock_clock(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    async with AsyncTestQueue(tmp_path / "q", start=START) as q:

        @q.handler("poll")
        async def poll(data: Any) -> float:
            await trio.sleep(90)  # a handler's own sleep is a deadline too
            return data

        await q.enqueue("p1", "poll", 1.5)
        assert await q.run_until_idle() == []
        assert (await q.get("p1")).state == "running"
        (run,) = await q.advance(minutes=2)
        assert (run.started_at, run.ended_at) == (START, START + dt.timedelta(seconds=90))
        assert await q.result("p1") == 1.5
        assert mock_clock.current_time() == pytest.approx(120, abs=1e-3)


def test_a_hard_timeout_cuts_an_attempt_at_its_virtual_deadline(queue: TestQueue) -> None:
    @queue.handler("stuck")
    async def stuck(data: Any) -> None:
        await trio.sleep(600)

    queue.enqueue("s1", "stuck", None, max_retries=0, max_execution_seconds=30)
    assert queue.run_until_idle() == []
    (run,) = queue.advance(minutes=1)
    assert (run.error, run.ended_at) == ("cancelled", START + dt.timedelta(seconds=30))
    details = queue.get("s1")
    assert details.state == "dead_letter" and "30" in (details.last_error or "")


async def test_the_async_queue_refuses_a_clock_that_jumps_by_itself(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with pytest.raises(RuntimeError, match="autojump"):
        async with AsyncTestQueue(tmp_path / "q"):
            pass


async def test_the_async_queue_refuses_the_host_clock(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="MockClock"):
        async with AsyncTestQueue(tmp_path / "q"):
            pass


async def test_the_blocking_queue_says_to_take_the_async_one_inside_trio(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="AsyncTestQueue"):
        TestQueue(tmp_path / "q").start()


def test_shutdown_does_not_wait_for_a_handler_sleeping_on_the_virtual_clock(
    tmp_path: Path,
) -> None:
    # A handler still asleep at the end: the drain runs its course in virtual time (the
    # handler wakes within the drain timeout, 30 s, and its result is written) instead of
    # holding the test for real seconds.
    q = TestQueue(tmp_path / "q", start=START)
    with q:

        @q.handler("nap")
        async def nap(data: Any) -> str:
            await trio.sleep(20)
            return "rested"

        q.enqueue("n1", "nap", None)
        q.run_until_idle()
        assert q.runs == []
    (run,) = q.runs
    assert (run.result, run.ended_at) == ("rested", START + dt.timedelta(seconds=20))


# ------------------------------------------------------------------ the pytest plugin


def test_the_plugin_is_declared_as_a_pytest_entry_point() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["entry-points"]["pytest11"] == {"snerd": "snerd.testing.plugin"}


def test_the_snerd_queue_fixture_gives_a_started_queue(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import datetime as dt

        def test_backoff(snerd_queue):
            calls = []

            @snerd_queue.handler("flaky")
            def flaky(data):
                calls.append(snerd_queue.now())
                if len(calls) == 1:
                    raise RuntimeError("once")
                return len(calls)

            snerd_queue.enqueue("t1", "flaky", {}, retry_after_hours=1)
            snerd_queue.run_until_idle()
            snerd_queue.advance(hours=1)
            assert snerd_queue.result("t1") == 2
            assert calls[1] - calls[0] == dt.timedelta(hours=1)
        """
    )
    # (`-p no:snerd`: the entry point, when snerd is installed, is not loaded twice.)
    result = pytester.runpytest("-p", "no:snerd", "-p", "snerd.testing.plugin")
    result.assert_outcomes(passed=1)


def test_the_example_of_docs_testing_md_passes_as_written(pytester: pytest.Pytester) -> None:
    text = (ROOT / "docs" / "testing.md").read_text()
    example = text.split("```python\n", 1)[1].split("```", 1)[0]
    assert "def test_" in example and "snerd_queue" in example
    pytester.makepyfile(example)
    result = pytester.runpytest("-p", "no:snerd", "-p", "snerd.testing.plugin")
    result.assert_outcomes(passed=1)


def test_a_virtual_day_meets_each_deadline_once(tmp_path: Path) -> None:
    # What a day costs: one step per deadline the node (or a handler) has, not per second.
    jumps: list[float] = []
    with TestQueue(tmp_path / "q", start=START) as q:
        clock = q.queue.mock_clock
        assert clock is not None
        jump = clock.jump

        def counted(seconds: float) -> None:
            jumps.append(seconds)
            jump(seconds)

        clock.jump = counted  # type: ignore[method-assign]
        q.advance(days=1)
    assert math.isclose(sum(jumps), 86_400, abs_tol=1e-3)
    # The idle inbox look (every 10 min, TEST_ENV) is the most frequent deadline.
    assert len(jumps) <= 24 * 6 + 5


def test_snerd_testing_exports_exactly_the_pinned_names() -> None:
    import snerd.testing

    pinned = ["TEST_ENV", "AsyncTestQueue", "Run", "TaskNotFinished", "TestQueue"]
    assert snerd.testing.__all__ == pinned
    assert all(hasattr(snerd.testing, name) for name in pinned)


def test_a_test_queue_is_not_collected_as_a_test_class() -> None:
    assert TestQueue.__test__ is False and AsyncTestQueue.__test__ is False
