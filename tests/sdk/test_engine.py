"""Engine, the queue in-process: the SDK's handler API on a real directory, no child process.

Each scenario runs under trio (natively) and under asyncio (the runtime as a trio guest), via
the `run` fixture (tests/support/sdkhelpers.py, shared with test_client); a few run on pytest-trio's
own loop too. Real files in tmp_path, no mocks.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
import sniffio

from snerd import (
    DuplicateTaskId,
    Engine,
    Enqueued,
    EnqueueError,
    QueueNotRunning,
    current_task,
    yield_progress,
)
from snerd.config import ConfigError
from tests.support.sdkhelpers import Calls, Runner, wait_for_stats
from tests.support.sdkhelpers import run as run  # the fixture


def engine(path: Path, **kwargs: Any) -> Engine:
    kwargs.setdefault("drain_timeout", 5)
    return Engine(path / "q", **kwargs)


async def _handlers_run(tmp_path: Path) -> None:
    calls = Calls()
    progress = Calls()
    loop_thread = threading.get_ident()
    host_library = sniffio.current_async_library()
    async with engine(tmp_path) as e:

        @e.handler("async")
        async def on_async(data: Any) -> None:
            # Async handlers run on the caller's loop, also when the runtime is a trio guest.
            assert sniffio.current_async_library() == host_library
            info = current_task()
            yield_progress({"at": info.task_id})
            calls.add(("async", info.task_id, info.attempt, data))

        def on_sync(data: Any) -> None:
            calls.add_from_thread(("sync", threading.get_ident() != loop_thread, data))

        e.register_handler("sync", on_sync)
        e.on_progress(lambda task_id, data: progress.add((task_id, data)))
        first = await e.enqueue("a1", "async", {"n": 1})
        assert first == Enqueued("a1", "shard-0", False)
        await e.enqueue("s1", "sync", [1])
        items = await calls.wait(2)
        assert ("async", "a1", 1, {"n": 1}) in items
        assert ("sync", True, [1]) in items
        assert await progress.wait(1) == [("a1", {"at": "a1"})]
        stats = await wait_for_stats(e, lambda s: s["queue_depth"] == 0)
        assert stats["total_executed"] == 2
        assert e.membership is not None and e.membership["owned"] == ["shard-0"]
    assert e.exit_code == 0


def test_handlers_run(run: Runner, tmp_path: Path) -> None:
    run(_handlers_run, tmp_path)


async def _retries_then_success_and_dead_letter(tmp_path: Path) -> None:
    attempts = Calls()
    dead = Calls()
    async with engine(tmp_path) as e:

        @e.handler("flaky")
        async def flaky(data: Any) -> None:
            attempt = current_task().attempt
            attempts.add((data, attempt))
            if data == "doomed" or (attempt or 0) < 3:
                raise KeyError(data)

        @e.max_retry_handler("flaky")
        def buried(data: Any, error: str | None) -> None:
            dead.add_from_thread((data, error))

        await e.enqueue("ok", "flaky", "ok", max_retries=2)
        await e.enqueue("bad", "flaky", "doomed", max_retries=1)
        assert await dead.wait(1) == [("doomed", "KeyError: 'doomed'")]
        await wait_for_stats(e, lambda s: s["queue_depth"] == 0)
        assert [a for d, a in attempts.items if d == "ok"] == [1, 2, 3]
        assert [a for d, a in attempts.items if d == "doomed"] == [1, 2]
        assert len(dead.items) == 1


def test_retries_then_success_and_dead_letter(run: Runner, tmp_path: Path) -> None:
    run(_retries_then_success_and_dead_letter, tmp_path)


async def _urgency_and_dedupe(tmp_path: Path) -> None:
    order = Calls()
    async with engine(tmp_path, max_workers=1) as e:
        # No handler yet: everything waits, then runs by urgency once registered.
        await e.enqueue("low", "job", "low", urgency_score=1)
        await e.enqueue("high", "job", "high", urgency_score=9)
        await e.enqueue("mid", "job", "mid", urgency_score=5, auto_dedupe=True)
        dup = await e.enqueue("mid-again", "job", "mid", urgency_score=5, auto_dedupe=True)
        assert dup.deduplicated
        e.register_handler("job", order.add_from_thread)
        assert await order.wait(3) == ["high", "mid", "low"]
        await wait_for_stats(e, lambda s: s["queue_depth"] == 0)
        assert len(order.items) == 3


def test_urgency_and_dedupe(run: Runner, tmp_path: Path) -> None:
    run(_urgency_and_dedupe, tmp_path)


async def _errors_are_the_daemons(tmp_path: Path) -> None:
    async with engine(tmp_path) as e:
        with pytest.raises(EnqueueError) as info:
            await e.enqueue("neg", "t", 1, max_retries=-1)
        # The very text the daemon sends: the engine feeds the daemon's parser.
        assert info.value.message == "Failed to enqueue: max_retries must be 0 or more, got -1"
        with pytest.raises(EnqueueError, match=r"^Failed to enqueue: invalid cron"):
            await e.enqueue("cron", "t", 1, cron="every tuesday")
        await e.enqueue("held", "t", 1)
        with pytest.raises(EnqueueError, match="already pending"):
            await e.enqueue("held", "t", 2)


def test_errors_are_the_daemons(run: Runner, tmp_path: Path) -> None:
    run(_errors_are_the_daemons, tmp_path)


async def _task_survives_a_restart(tmp_path: Path) -> None:
    async with engine(tmp_path) as e:
        await e.enqueue("durable", "later", {"keep": "me"})
    ran = Calls()
    async with engine(tmp_path) as e2:
        e2.register_handler("later", ran.add_from_thread)
        assert await ran.wait(1) == [{"keep": "me"}]


def test_task_survives_a_restart(run: Runner, tmp_path: Path) -> None:
    run(_task_survives_a_restart, tmp_path)


async def _shutdown_keeps_the_running_result(tmp_path: Path) -> None:
    running = anyio.Event()
    release = anyio.Event()
    e = engine(tmp_path)

    @e.handler("slow")
    async def slow(data: Any) -> None:
        running.set()
        await release.wait()

    await e.start()
    await e.enqueue("s1", "slow", None)
    await running.wait()
    codes: list[int | None] = []
    async with anyio.create_task_group() as tg:
        stopping = anyio.Event()

        async def stop() -> None:
            stopping.set()
            # shutdown() queues the drain before its first checkpoint.
            codes.append(await e.shutdown())

        tg.start_soon(stop)
        await stopping.wait()
        with pytest.raises(QueueNotRunning):
            await e.enqueue("s2", "slow", None)
        release.set()
    assert codes == [0]
    again = Calls()
    async with engine(tmp_path) as e2:
        e2.register_handler("slow", again.add_from_thread)
        await e2.enqueue("sentinel", "slow", "sentinel")
        assert await again.wait(1) == ["sentinel"]
        stats = await wait_for_stats(e2, lambda s: s["queue_depth"] == 0)
        assert stats["total_executed"] == 1


def test_shutdown_keeps_the_running_result(run: Runner, tmp_path: Path) -> None:
    run(_shutdown_keeps_the_running_result, tmp_path)


async def _second_engine_on_a_locked_directory_waits(tmp_path: Path) -> None:
    """Same locks as the daemon: a second engine on the directory owns no shard, so it never
    writes a log another process owns; its enqueues go through its inbox to the owner."""
    ran = Calls()
    async with engine(tmp_path) as e1:
        e1.register_handler("t", ran.add_from_thread)
        await e1.enqueue("one", "t", 1)
        async with engine(tmp_path) as e2:
            ack = await e2.enqueue("two", "t", 2)
            assert ack.shard == "shard-0" and not ack.deduplicated
            assert sorted(await ran.wait(2)) == [1, 2]
        log = (tmp_path / "q" / "shard-0" / "tasks" / "tasks.log").read_bytes().splitlines()
        two = [orjson.loads(line) for line in log if b'"taskId":"two"' in line]
        # Written by the owner (one writer per log), saying which inbox it came through.
        assert {r["snerdNode"] for r in two} == {e1_node(log)}
        assert "snerdVia" in two[0] and two[0]["snerdVia"] != two[0]["snerdNode"]


def e1_node(log: list[bytes]) -> str:
    """The node of the first claim record in a log."""
    claim = next(orjson.loads(line) for line in log if b'"snerdKind":"claim"' in line)
    node: str = claim["node"]
    return node


def test_second_engine_on_a_locked_directory_waits(run: Runner, tmp_path: Path) -> None:
    run(_second_engine_on_a_locked_directory_waits, tmp_path)


async def _duplicate_pending_enqueue(tmp_path: Path) -> None:
    async with engine(tmp_path) as e:
        results: list[Any] = []
        async with anyio.create_task_group() as tg:

            async def enqueue(data: int) -> None:
                try:
                    results.append(await e.enqueue("same", "t", data))
                except DuplicateTaskId as exc:
                    results.append(exc)

            tg.start_soon(enqueue, 1)
            tg.start_soon(enqueue, 2)
        assert isinstance(results[0], DuplicateTaskId)  # the second, refused at once
        assert results[1] == Enqueued("same", "shard-0", False)


def test_duplicate_pending_enqueue(run: Runner, tmp_path: Path) -> None:
    run(_duplicate_pending_enqueue, tmp_path)


def test_bad_settings_name_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="SNERD_MAX_WORKERS"):
        Engine(tmp_path, env={"SNERD_MAX_WORKERS": "lots"})


async def test_trio_native_handlers(tmp_path: Path) -> None:
    await _handlers_run(tmp_path)


async def test_trio_native_restart(tmp_path: Path) -> None:
    await _task_survives_a_restart(tmp_path)


async def _what_json_cannot_carry_is_refused_or_escaped(tmp_path: Path) -> None:
    dead = Calls()
    async with engine(tmp_path) as e:

        @e.handler("surrogate")
        async def surrogate(data: Any) -> None:
            # A file name decoded with surrogateescape: no log record can hold the surrogate.
            raise ValueError(b"no such file: \xff".decode("utf-8", "surrogateescape"))

        e.register_max_retry_handler("surrogate", lambda data, error: dead.add_from_thread(error))
        await e.enqueue("s1", "surrogate", None, max_retries=0)
        assert await dead.wait(1) == ["ValueError: no such file: \\udcff"]
        with pytest.raises(EnqueueError) as info:
            await e.enqueue("n1", "surrogate", None, urgency_score=float("nan"))
        finite = "Failed to enqueue: urgency_score must be a finite number, got nan"
        assert info.value.message == finite


def test_what_json_cannot_carry_is_refused_or_escaped(run: Runner, tmp_path: Path) -> None:
    run(_what_json_cannot_carry_is_refused_or_escaped, tmp_path)
