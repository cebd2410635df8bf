"""Process isolation (`isolation="process"`, `snerd.sdk.isolation`) through the public API:
a sync handler past its deadline is killed, so what it would do later never happens and the
retry starts after its process is gone; a cancelled running attempt is killed too.

The handlers live in `tests.support.handlers` (module-level functions: the forkserver's
children find them by name). Each test waits for events (progress, attempt reports), bounded
by the `run` fixture's `fail_after`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import pytest

from snerd import Engine, SnerdQueue
from snerd.sdk.isolation import forkable
from snerd.sdk.workers import AttemptEnded
from tests.support import handlers
from tests.support.sdkhelpers import Calls
from tests.support.sdkhelpers import run as run


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_process_attempt_past_its_deadline_is_killed_and_its_retry_starts_after_it(
    run: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        ended = Calls()
        results = Calls()
        async with Engine(tmp_path / "q", isolation="process", drain_timeout=1) as engine:
            engine.register_handler("overstay", handlers.overstay)
            engine.on_attempt(ended.add)
            await engine.enqueue(
                "t1", "overstay", {"dir": str(tmp_path)}, max_retries=1, max_execution_seconds=1
            )
            seen = await ended.wait(2)
            results.add(await engine.result("t1", timeout=10))
        first, second = sorted(seen, key=lambda e: e.attempt)
        assert (first.attempt, first.outcome, first.isolation) == (1, "timed out", "process")
        assert first.error == "Task execution timed out after 1 seconds"
        assert second.outcome == "succeeded"
        # Attempt 2 found attempt 1's process gone when it started, and it never wrote.
        (result,) = results.items
        assert (result["attempt"], result["prior_alive"]) == (2, False)
        assert _gone(int((tmp_path / "pid-1").read_text()))
        assert not (tmp_path / "late").exists()
        # The daemon's refusal of the SDK's own (late) timeout result is expected: not logged.
        assert "unknown/expired" not in caplog.text

    run(scenario)


def test_a_cancelled_process_attempt_is_killed(run: Any, tmp_path: Path) -> None:
    async def scenario() -> None:
        started = Calls()
        ended = Calls()
        async with SnerdQueue(storage_path=tmp_path / "q", drain_timeout=1) as queue:
            queue.register_handler("overstay", handlers.overstay, isolation="process")
            queue.on_progress(lambda task_id, data: started.add(data))
            queue.on_attempt(ended.add)
            await queue.enqueue("c1", "overstay", {"dir": str(tmp_path)}, max_retries=3)
            (progress,) = await started.wait(1)
            answer = await queue.cancel("c1")
            assert answer.cancelled and answer.found == "running"
            (end,) = await ended.wait(1)
        assert (end.outcome, end.isolation, end.error) == ("cancelled", "process", None)
        assert _gone(progress["pid"])
        assert not (tmp_path / "late").exists()

    run(scenario)


def test_a_failing_process_attempt_reports_the_handlers_error(tmp_path: Path) -> None:
    async def scenario() -> None:
        ended = Calls()
        with anyio.fail_after(30):
            async with Engine(tmp_path / "q") as engine:
                engine.register_handler("boom", handlers.boom, isolation="process")
                engine.on_attempt(ended.add)
                await engine.enqueue("b1", "boom", {"text": "no disk"}, max_retries=0)
                (end,) = await ended.wait(1)
        assert (end.outcome, end.error) == ("failed", "OSError: no disk")

    anyio.run(scenario, backend="trio")


def test_a_final_error_in_a_process_is_a_failure_for_good(tmp_path: Path) -> None:
    async def scenario() -> None:
        ended = Calls()
        with anyio.fail_after(30):
            async with Engine(tmp_path / "q") as engine:
                engine.register_handler("refuse", handlers.refuse, isolation="process")
                engine.on_attempt(ended.add)
                await engine.enqueue("f1", "refuse", {"text": "bad address"}, max_retries=5)
                (end,) = await ended.wait(1)
                details = await engine.get("f1")
        assert (end.outcome, end.error, end.isolation) == ("failed", "bad address", "process")
        assert details.state == "dead_letter"  # not retried, with 5 retries left

    anyio.run(scenario, backend="trio")


def test_which_handlers_can_run_in_a_process() -> None:
    def nested(data: Any) -> None: ...

    async def coroutine(data: Any) -> None: ...

    assert forkable(handlers.overstay)
    assert not forkable(nested)
    assert not forkable(lambda data: None)
    assert not forkable(coroutine)
    assert not forkable(AttemptEnded)  # a class: callable, not a function


def test_an_async_handler_cannot_be_isolated_and_an_unknown_isolation_is_refused(
    tmp_path: Path,
) -> None:
    async def handler(data: Any) -> None: ...

    engine = Engine(tmp_path / "q")
    with pytest.raises(ValueError, match="is async"):
        engine.register_handler("a", handler, isolation="process")
    with pytest.raises(ValueError, match="isolation must be one of thread, process"):
        engine.register_handler("a", handlers.overstay, isolation="fork")
    with pytest.raises(ValueError, match="isolation must be one of"):
        Engine(tmp_path / "q", isolation="processes")


def test_a_sync_task_function_runs_in_a_process_killed_at_its_deadline(
    run: Any, tmp_path: Path
) -> None:
    task = handlers.overstay_task
    handler = task.handler()
    assert forkable(handler)  # it pickles as its module and name

    async def scenario() -> None:
        ended = Calls()
        async with Engine(tmp_path / "q", isolation="process", drain_timeout=1) as engine:
            engine.register_handler(task.name, handler)
            engine.on_attempt(ended.add)
            await engine.enqueue("t1", task.name, task.payload(str(tmp_path)), max_retries=1,
                                 max_execution_seconds=1)
            await engine.enqueue("t2", task.name, task.payload(str(tmp_path), bad=True),
                                 max_retries=3)
            seen = await ended.wait(3)
            result = await engine.result("t1", timeout=10)
        by = {(e.task_id, e.attempt): e for e in seen}
        assert by[("t1", 1)].outcome == "timed out" and by[("t1", 1)].isolation == "process"
        assert (result["attempt"], result["prior_alive"]) == (2, False)
        assert not (tmp_path / "late").exists()
        assert by[("t2", 1)].isolation == "process"
        assert ("t2", 2) not in by  # a ValueError is never retried, in a process too
        assert "ValueError: not a number" in (by[("t2", 1)].error or "")

    run(scenario)
