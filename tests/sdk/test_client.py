"""SnerdQueue, the SDK, against real `snerdmq` daemon processes on real directories.

Every scenario is written once with anyio; the key ones run under both trio and asyncio (the
`run` fixture, shared with test_engine in tests/support/sdkhelpers.py), the rest under one of them,
alternating (each run spawns a daemon, and a daemon start costs about a second). Nothing is
mocked: each test spawns the console-script daemon next to this interpreter. Waits are on
events set by handlers, bounded by `anyio.fail_after`; the few fixed waits prove that
something does *not* happen and say so.
"""

from __future__ import annotations

import contextvars
import inspect
import json
import math
import os
import signal
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from snerd import (
    DaemonExited,
    DuplicateTaskId,
    Enqueued,
    EnqueueError,
    QueueNotRunning,
    SnerdError,
    SnerdQueue,
    current_task,
    yield_progress,
)
from snerd.client import _read_lines
from snerd.core.protocol import ENQUEUE_OPTIONS
from snerd.sdk.messages import json_text, parse_task_data
from tests.support.sdkhelpers import Calls, Runner, wait_for_stats
from tests.support.sdkhelpers import run as run  # the fixture


def queue(path: Path, **kwargs: Any) -> SnerdQueue:
    kwargs.setdefault("drain_timeout", 5)
    return SnerdQueue(storage_path=path / "q", **kwargs)


# --- the round trip --------------------------------------------------------------------------


async def _enqueue_runs_handler(tmp_path: Path) -> None:
    calls = Calls()
    async with queue(tmp_path) as q:

        @q.handler("greet")
        async def greet(data: Any) -> None:
            info = current_task()
            calls.add((info.task_id, info.attempt, data))

        result = await q.enqueue("t1", "greet", {"name": "ada", "n": [1, 2]})
        assert result == Enqueued(task_id="t1", shard="shard-0", deduplicated=False)
        assert await calls.wait(1) == [("t1", 1, {"name": "ada", "n": [1, 2]})]
        generated = await q.enqueue(task_type="greet", data="plain")
        assert len(generated.task_id) == 32
        await calls.wait(2)
        assert calls.items[1] == (generated.task_id, 1, "plain")
        stats = await q.stats()
        assert stats["action"] == "stats"
        assert stats["total_enqueued"] == 2
        assert q.membership is not None and q.membership["owned"] == ["shard-0"]
    assert q.exit_code == 0


def test_enqueue_runs_handler(run: Runner, tmp_path: Path) -> None:
    run(_enqueue_runs_handler, tmp_path)


async def _register_after_enqueue(tmp_path: Path) -> None:
    calls = Calls()
    async with queue(tmp_path) as q:
        await q.enqueue("late-1", "late", {"x": 1})
        stats = await q.stats()
        # snerd's stats extra: the task waits for a handler of its type.
        assert stats["waiting_types"] == ["late"]
        assert stats["queue_depth"] == 1
        q.register_handler(
            "late", calls.add_from_thread
        )  # a sync handler, registered while running
        assert await calls.wait(1) == [{"x": 1}]


@pytest.mark.parametrize("run", ["asyncio"], indirect=True)
def test_register_after_enqueue(run: Runner, tmp_path: Path) -> None:
    run(_register_after_enqueue, tmp_path)

async def _calls_cancelled_while_waiting(tmp_path: Path) -> None:
    """An enqueue and a stats request cancelled while they wait for the daemon's answer: the
    answers still come (a stats reply is taken by the request that gave up, the enqueue was
    sent and runs), and the queue goes on serving the calls after them."""
    calls = Calls()
    async with queue(tmp_path) as q:

        @q.handler("job")
        async def job(data: Any) -> None:
            calls.add(data)

        with anyio.CancelScope() as scope:
            scope.cancel()
            await q.enqueue("gave-up", "job", 1)
        assert scope.cancelled_caught
        with anyio.CancelScope() as scope:
            scope.cancel()
            await q.stats()
        assert scope.cancelled_caught
        assert (await q.enqueue("after", "job", 2)).task_id == "after"
        stats = await q.stats()  # the reply of its own request, not the abandoned one's
        assert stats["total_enqueued"] == 2
        assert sorted(await calls.wait(2)) == [1, 2]
    assert q.exit_code == 0


def test_calls_cancelled_while_waiting_leave_the_queue_serving(
    run: Runner, tmp_path: Path
) -> None:
    run(_calls_cancelled_while_waiting, tmp_path)



async def _sync_handler_runs_in_a_thread(tmp_path: Path) -> None:
    calls = Calls()
    progress = Calls()
    loop_thread = threading.get_ident()
    async with queue(tmp_path) as q:
        q.on_progress(lambda task_id, data: progress.add((task_id, data)))

        def work(data: Any) -> None:
            yield_progress({"step": 1})
            calls.add_from_thread((threading.get_ident() != loop_thread, data))

        q.register_handler("work", work)
        await q.enqueue("s1", "work", [1, 2, 3])
        assert await calls.wait(1) == [(True, [1, 2, 3])]
        assert await progress.wait(1) == [("s1", {"step": 1})]


def test_sync_handler_runs_in_a_thread(run: Runner, tmp_path: Path) -> None:
    run(_sync_handler_runs_in_a_thread, tmp_path)


async def _progress_is_observed(tmp_path: Path) -> None:
    progress = Calls()
    async with queue(tmp_path) as q:

        @q.on_progress
        async def seen(task_id: str, data: Any) -> None:
            progress.add((task_id, data))

        @q.handler("long")
        async def long(data: Any) -> None:
            q.yield_progress({"pct": 50})
            await q.yield_progress_async("done")

        await q.enqueue("p1", "long", None)
        assert await progress.wait(2) == [("p1", {"pct": 50}), ("p1", "done")]


@pytest.mark.parametrize("run", ["trio"], indirect=True)
def test_progress_is_observed(run: Runner, tmp_path: Path) -> None:
    run(_progress_is_observed, tmp_path)


# --- retries, dead letters, timeouts ---------------------------------------------------------


async def _fails_twice_then_succeeds(tmp_path: Path) -> None:
    attempts = Calls()
    dead = Calls()
    async with queue(tmp_path) as q:

        @q.handler("flaky")
        async def flaky(data: Any) -> None:
            attempts.add(current_task().attempt)
            if len(attempts.items) < 3:
                raise ConnectionError(f"try {len(attempts.items)}")

        q.register_max_retry_handler("flaky", dead.add_from_thread)
        await q.enqueue("f1", "flaky", {"k": "v"}, max_retries=2)
        assert await attempts.wait(3) == [1, 2, 3]
        # Let the third (successful) result land, then check it was the end of it.
        stats = await wait_for_stats(q, lambda s: s["queue_depth"] == 0)
        assert stats["total_executed"] == 3
        assert stats["total_failed"] == 2
        assert stats["total_dlq"] == 0
        assert dead.items == []


def test_fails_twice_then_succeeds(run: Runner, tmp_path: Path) -> None:
    run(_fails_twice_then_succeeds, tmp_path)


async def _exhausted_retries_reach_the_dead_letter_handler(tmp_path: Path) -> None:
    attempts = Calls()
    dead = Calls()
    legacy_dead = Calls()
    async with queue(tmp_path) as q:

        @q.handler("doomed")
        async def doomed(data: Any) -> None:
            attempts.add(data)
            raise ValueError("nope")

        @q.max_retry_handler("doomed")
        async def buried(data: Any, error: str | None) -> None:
            dead.add((data, error))

        q.register_handler("doomed-sync", lambda data: 1 / 0)
        q.register_max_retry_handler("doomed-sync", legacy_dead.add_from_thread)

        await q.enqueue("d1", "doomed", {"id": 7}, max_retries=1)
        await q.enqueue("d2", "doomed-sync", [7], max_retries=0)
        assert await dead.wait(1) == [({"id": 7}, "ValueError: nope")]
        assert len(attempts.items) == 2
        # The upstream shape: a one-parameter handler gets the parsed data only.
        assert await legacy_dead.wait(1) == [[7]]


def test_exhausted_retries_reach_the_dead_letter_handler(run: Runner, tmp_path: Path) -> None:
    run(_exhausted_retries_reach_the_dead_letter_handler, tmp_path)


async def _handler_timeout(tmp_path: Path) -> None:
    dead = Calls()
    async with queue(tmp_path) as q:

        @q.handler("stuck")
        async def stuck(data: Any) -> None:
            await anyio.sleep_forever()

        q.register_max_retry_handler("stuck", lambda data, error: dead.add_from_thread(error))
        await q.enqueue("to1", "stuck", None, max_retries=0, max_execution_seconds=1)
        assert await dead.wait(1) == ["Task execution timed out after 1 seconds"]


@pytest.mark.parametrize("run", ["asyncio"], indirect=True)
def test_handler_timeout(run: Runner, tmp_path: Path) -> None:
    run(_handler_timeout, tmp_path)


# --- scheduling ------------------------------------------------------------------------------


async def _urgency_orders_the_queue(tmp_path: Path) -> None:
    order = Calls()
    blocker_running = anyio.Event()
    release = anyio.Event()
    async with queue(tmp_path, max_workers=1) as q:

        @q.handler("job")
        async def job(data: Any) -> None:
            if data == "blocker":
                blocker_running.set()
                await release.wait()
            order.add(data)

        await q.enqueue("blocker", "job", "blocker")
        await blocker_running.wait()
        await q.enqueue("low", "job", "low", urgency_score=1)
        for score in (10, 30, 20):
            await q.enqueue(f"high-{score}", "job", f"high-{score}", urgency_score=score)
        await q.enqueue("high-30b", "job", "high-30b", urgency_score=30)
        release.set()
        assert await order.wait(6) == [
            "blocker",
            "high-30",
            "high-30b",  # equal scores: enqueue order
            "high-20",
            "high-10",
            "low",
        ]


@pytest.mark.parametrize("run", ["trio"], indirect=True)
def test_urgency_orders_the_queue(run: Runner, tmp_path: Path) -> None:
    run(_urgency_orders_the_queue, tmp_path)


async def _execute_at_in_the_future_runs_later(tmp_path: Path) -> None:
    ran = Calls()
    async with queue(tmp_path) as q:

        @q.handler("when")
        async def when(data: Any) -> None:
            ran.add((data, datetime.now(UTC)))

        await q.stats()  # the daemon is up: its start-up time is not part of the delay
        at = datetime.now(UTC) + timedelta(seconds=1)
        await q.enqueue("later", "when", "later", execute_at=at)
        await q.enqueue("now", "when", "now")
        items = await ran.wait(2)
        assert [name for name, _ in items] == ["now", "later"]
        assert items[1][1] >= at


@pytest.mark.parametrize("run", ["asyncio"], indirect=True)
def test_execute_at_in_the_future_runs_later(run: Runner, tmp_path: Path) -> None:
    run(_execute_at_in_the_future_runs_later, tmp_path)


async def _rate_limited_group(tmp_path: Path) -> None:
    ran = Calls()
    async with queue(tmp_path) as q:
        q.register_handler("api", ran.add_from_thread)
        for i in range(3):
            await q.enqueue(f"r{i}", "api", i, rate_limit_group="g", max_per_minute=2)
        await q.enqueue("free", "api", "free")  # another group is not held up
        assert sorted(map(str, await ran.wait(3))) == ["0", "1", "free"]
        # The third dispatch of group g would exceed 2 a minute: it must still be waiting.
        # (No event can say "did not happen"; half a second is long enough to see it run.)
        await anyio.sleep(0.5)
        assert len(ran.items) == 3
        stats = await q.stats()
        assert stats["queue_depth"] == 1


@pytest.mark.parametrize("run", ["trio"], indirect=True)
def test_rate_limited_group(run: Runner, tmp_path: Path) -> None:
    run(_rate_limited_group, tmp_path)


async def _dedupe(tmp_path: Path) -> None:
    ran = Calls()
    async with queue(tmp_path) as q:
        # No handler yet: the first task stays pending, so the second is its duplicate.
        first = await q.enqueue("dup-1", "dd", {"same": True}, auto_dedupe=True)
        second = await q.enqueue("dup-2", "dd", {"same": True}, auto_dedupe=True)
        other = await q.enqueue("dup-3", "dd", {"same": False}, auto_dedupe=True)
        assert (first.deduplicated, second.deduplicated, other.deduplicated) == (
            False,
            True,
            False,
        )
        assert second.task_id == "dup-2"

        @q.handler("dd")
        async def dd(data: Any) -> None:
            ran.add(current_task().task_id)

        await ran.wait(2)
        await wait_for_stats(q, lambda s: s["queue_depth"] == 0)
        assert sorted(ran.items) == ["dup-1", "dup-3"]


@pytest.mark.parametrize("run", ["asyncio"], indirect=True)
def test_dedupe(run: Runner, tmp_path: Path) -> None:
    run(_dedupe, tmp_path)


# --- errors ----------------------------------------------------------------------------------


async def _bad_input_raises_the_daemons_text(tmp_path: Path) -> None:
    ran = Calls()
    async with queue(tmp_path) as q:
        q.register_handler("ok", ran.add_from_thread)
        with pytest.raises(EnqueueError) as info:
            await q.enqueue("neg", "ok", 1, max_retries=-1)
        assert info.value.message == "Failed to enqueue: max_retries must be 0 or more, got -1"
        assert info.value.task_id == "neg"
        assert isinstance(info.value, SnerdError) and isinstance(info.value, RuntimeError)
        with pytest.raises(EnqueueError, match=r"^Failed to enqueue: invalid execute_at 'soon'"):
            await q.enqueue("when", "ok", 1, execute_at="soon")
        with pytest.raises(EnqueueError, match="max_per_minute must be at least 1"):
            await q.enqueue("rate", "ok", 1, rate_limit_group="g", max_per_minute=0)
        with pytest.raises(TypeError):
            await q.enqueue("no-type")
        # The queue is fine afterwards, and a refused id can be used again.
        await q.enqueue("neg", "ok", "fine")
        assert await ran.wait(1) == ["fine"]


def test_bad_input_raises_the_daemons_text(run: Runner, tmp_path: Path) -> None:
    run(_bad_input_raises_the_daemons_text, tmp_path)


async def _duplicate_concurrent_enqueue_is_refused(tmp_path: Path) -> None:
    async with queue(tmp_path) as q:
        await q.stats()  # the daemon is up and reading
        assert q.pid is not None
        os.kill(q.pid, signal.SIGSTOP)  # hold the ack back
        try:
            acked: list[Enqueued] = []
            async with anyio.create_task_group() as tg:
                sent = anyio.Event()

                async def first() -> None:
                    sent.set()  # enqueue() registers the id before its first checkpoint
                    acked.append(await q.enqueue("same", "x", 1))

                tg.start_soon(first)
                await sent.wait()
                with pytest.raises(DuplicateTaskId):
                    await q.enqueue("same", "x", 2)
                os.kill(q.pid, signal.SIGCONT)
            assert acked == [Enqueued("same", "shard-0", False)]
        finally:
            os.kill(q.pid, signal.SIGCONT)
        # Once stored, the daemon itself refuses the id while the task is pending.
        with pytest.raises(EnqueueError, match="already pending"):
            await q.enqueue("same", "x", 3)


@pytest.mark.parametrize("run", ["trio"], indirect=True)
def test_duplicate_concurrent_enqueue_is_refused(run: Runner, tmp_path: Path) -> None:
    run(_duplicate_concurrent_enqueue_is_refused, tmp_path)


async def _killed_daemon_fails_pending_enqueues_fast(tmp_path: Path) -> None:
    q = queue(tmp_path)
    await q.start_listening()
    await q.stats()
    pid = q.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)  # the enqueue below can never be acked
    failure: list[BaseException] = []
    sent = anyio.Event()
    failed = anyio.Event()
    async with anyio.create_task_group() as tg:

        async def pending() -> None:
            sent.set()
            try:
                await q.enqueue("orphan", "x", 1)
            except SnerdError as exc:
                failure.append(exc)
            failed.set()

        tg.start_soon(pending)
        await sent.wait()
        os.kill(pid, signal.SIGKILL)
        with anyio.fail_after(3):  # fast, not the 30 s drain timeout nor forever
            await failed.wait()
    assert isinstance(failure[0], DaemonExited)
    assert "killed by SIGKILL" in str(failure[0])
    assert q.exit_code == -signal.SIGKILL
    with pytest.raises(DaemonExited):
        await q.enqueue("after", "x", 1)
    assert await q.shutdown() == -signal.SIGKILL


def test_killed_daemon_fails_pending_enqueues_fast(run: Runner, tmp_path: Path) -> None:
    run(_killed_daemon_fails_pending_enqueues_fast, tmp_path)


# --- lifecycle -------------------------------------------------------------------------------


async def _shutdown_delivers_the_running_handlers_result(tmp_path: Path) -> None:
    running = anyio.Event()
    release = anyio.Event()
    draining = anyio.Event()
    finished = Calls()
    q = queue(tmp_path)

    @q.handler("slow")
    async def slow(data: Any) -> None:
        running.set()
        await release.wait()
        finished.add(data)

    q.on_daemon_log(lambda line: draining.set() if "draining" in line else None)
    await q.start_listening()
    await q.enqueue("s1", "slow", "once")
    await running.wait()
    async with anyio.create_task_group() as tg:
        codes: list[int | None] = []

        async def stop() -> None:
            codes.append(await q.shutdown())

        tg.start_soon(stop)
        await draining.wait()  # the daemon got SIGTERM and is draining
        with pytest.raises(QueueNotRunning):
            await q.enqueue("s2", "slow", "refused")
        release.set()  # the result now goes out during the drain
    assert codes == [0]
    assert finished.items == ["once"]

    # Restart on the same directory: the task is done, it must not run again.
    again = Calls()
    async with queue(tmp_path) as q2:
        q2.register_handler("slow", again.add_from_thread)
        await q2.enqueue("sentinel", "slow", "sentinel")
        # FIFO: had s1 been pending, it would have run before the sentinel.
        assert await again.wait(1) == ["sentinel"]
        stats = await wait_for_stats(q2, lambda s: s["queue_depth"] == 0)
        assert stats["total_dlq"] == 0


def test_shutdown_delivers_the_running_handlers_result(run: Runner, tmp_path: Path) -> None:
    run(_shutdown_delivers_the_running_handlers_result, tmp_path)


async def _upstream_style_lifecycle(tmp_path: Path) -> None:
    ran = Calls()
    q = SnerdQueue(None, str(tmp_path / "q"), 2, 2, 4, drain_timeout=5)

    async def handler(data: Any) -> None:
        ran.add(data)

    q.register_handler("up", handler)  # before the start: sent when it starts
    with pytest.raises(QueueNotRunning):
        await q.enqueue("early", "up", 1)
    await q.start_listening()
    with pytest.raises(RuntimeError):
        await q.start_listening()
    await q.enqueue("u1", "up", {"a": 1})
    await q.enqueue("u2", "up", {"a": 2})
    assert sorted(x["a"] for x in await ran.wait(2)) == [1, 2]
    stats = await q.stats()
    assert [s["shard"] for s in stats["per_shard"]] == ["shard-0", "shard-1"]
    assert await q.shutdown() == 0
    assert await q.shutdown() == 0  # idempotent
    with pytest.raises(QueueNotRunning):
        await q.enqueue("late", "up", 1)


def test_upstream_style_lifecycle(run: Runner, tmp_path: Path) -> None:
    run(_upstream_style_lifecycle, tmp_path)


@pytest.mark.parametrize("run", ["asyncio"], indirect=True)
def test_daemon_stderr_is_relayed_and_stdout_stays_clean(
    run: Runner, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    run(_enqueue_runs_handler, tmp_path)
    out, err = capfd.readouterr()
    assert out == ""
    assert "[snerdmq] [Snerd]" in err


async def _bad_setting_fails_with_the_daemons_words(tmp_path: Path) -> None:
    q = SnerdQueue(storage_path=tmp_path / "q", env={"SNERD_MAX_WORKERS": "many"})
    await q.start_listening()
    with pytest.raises(DaemonExited, match="SNERD_MAX_WORKERS"):
        await q.enqueue("x", "y", 1)
    assert q.exit_code == 2


@pytest.mark.parametrize("run", ["trio"], indirect=True)
def test_bad_setting_fails_with_the_daemons_words(run: Runner, tmp_path: Path) -> None:
    run(_bad_setting_fails_with_the_daemons_words, tmp_path)


def test_missing_binary_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="Binary not found"):
        SnerdQueue(binary_path=tmp_path / "nope")


async def test_native_trio_async_with(tmp_path: Path) -> None:
    """pytest-trio's own loop (trio_mode): the SDK needs nothing from anyio.run."""
    await _enqueue_runs_handler(tmp_path)


# --- handler workers -------------------------------------------------------------------------

_SEEN: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="unset")


async def _each_attempt_runs_concurrently_in_its_own_context(tmp_path: Path) -> None:
    """Idle handler workers are reused, yet every attempt still starts in a fresh copy of the
    context (what one handler sets, no other sees), all run at once, and a timeout cuts only
    the attempt that overran."""
    seen = Calls()
    dead = Calls()
    b_running = anyio.Event()
    async with queue(tmp_path) as q:

        @q.handler("ctx")
        async def ctx(data: Any) -> None:
            seen.add((data, _SEEN.get()))
            _SEEN.set(data)
            if data == "a":  # needs "b" running at the same time
                await b_running.wait()
            elif data == "b":
                b_running.set()
            elif data == "stuck":
                await anyio.sleep_forever()
            await anyio.sleep(0)
            assert _SEEN.get() == data

        q.register_max_retry_handler("ctx", lambda data, error: dead.add_from_thread(error))
        for wave in range(3):
            names = ["a", "b"] if wave == 0 else [f"{wave}-{i}" for i in range(4)]
            for name in names:
                await q.enqueue(f"t-{name}", "ctx", name, max_retries=0)
            items = await seen.wait(2 + 4 * wave)
            await wait_for_stats(q, lambda s: s["queue_depth"] == 0)
        await q.enqueue("t-stuck", "ctx", "stuck", max_retries=0, max_execution_seconds=1)
        assert await dead.wait(1) == ["Task execution timed out after 1 seconds"]
        await q.enqueue("t-after", "ctx", "after", max_retries=0)
        items = await seen.wait(12)
    assert sorted(items) == sorted(
        [(name, "unset") for name in ["a", "b", "stuck", "after"]]
        + [(f"{w}-{i}", "unset") for w in (1, 2) for i in range(4)]
    )


def test_each_attempt_runs_concurrently_in_its_own_context(run: Runner, tmp_path: Path) -> None:
    run(_each_attempt_runs_concurrently_in_its_own_context, tmp_path)


async def _a_waiting_handler_holds_up_no_other(tmp_path: Path) -> None:
    """Executes that arrive together are run by one worker while their handlers return at
    once; a handler that waits (async, or sync in its thread) hands the ones behind it to
    another worker: here the first of a burst waits for the last, and a sync one for a later
    async one."""
    done = Calls()
    last_ran = anyio.Event()
    async with queue(tmp_path) as q:
        token = anyio.lowlevel.current_token()

        @q.handler("burst")
        async def burst(n: int) -> None:
            if n == 0:
                await last_ran.wait()
            elif n == 39:
                last_ran.set()
            done.add(n)

        @q.handler("sync-waits")
        def sync_waits(flag: str) -> None:
            assert released.wait(10), "the async job behind it never ran"
            anyio.from_thread.run_sync(done.add, flag, token=token)

        @q.handler("release")
        async def release(flag: str) -> None:
            released.set()
            done.add(flag)

        released = threading.Event()
        async with anyio.create_task_group() as tg:
            for n in range(40):
                tg.start_soon(q.enqueue, f"b{n}", "burst", n)
        assert sorted(await done.wait(40)) == list(range(40))
        async with anyio.create_task_group() as tg:
            tg.start_soon(q.enqueue, "s", "sync-waits", "sync")
            tg.start_soon(q.enqueue, "r", "release", "async")
        await done.wait(42)
    assert done.items[-2:] in (["async", "sync"], ["sync", "async"])


def test_a_waiting_handler_holds_up_no_other(run: Runner, tmp_path: Path) -> None:
    run(_a_waiting_handler_holds_up_no_other, tmp_path)


# --- task data -------------------------------------------------------------------------------


def _same(a: Any, b: Any) -> bool:
    """Equal values of equal types, floats to the sign and NaN, dict keys in order."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1, a) == math.copysign(1, b)
        )
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _as_json_loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text
    except RecursionError as exc:  # too deep for json.loads: that is what a handler gets
        return exc


def _parsed(text: str) -> Any:
    try:
        return parse_task_data(text)
    except RecursionError as exc:
        return exc


@pytest.mark.parametrize(
    "text",
    [
        '{"n": 1, "s": "x", "l": [1.5, -0.0, null, true]}',
        "18446744073709551615",
        "18446744073709551616",
        "-9223372036854775808",
        "-9223372036854775809",
        "[123456789012345678901234567890, 1]",
        '"a 1234567890123456789012 run of digits in a string"',
        "1e400",
        "-1e400",
        "2.5e-324",
        "0.1000000000000000055511151231257827",
        "-0",
        "NaN",
        "[Infinity, -Infinity]",
        '{"a": 1, "a": 2}',
        '"\\ud800"',
        '"\\ud83d\\ude00"',
        '"\ud800"',
        '"\x01"',
        "1\x0c",
        "\ufeff1",
        " \r\n\t[1]\n",
        "[" * 200 + "]" * 200,
        "[" * 3000 + "]" * 3000,
        "[1,]",
        "01",
        "",
        "plain text",
    ],
)
def test_task_data_is_what_json_loads_gives(text: str) -> None:
    got, expected = _parsed(text), _as_json_loads(text)
    if isinstance(expected, RecursionError):
        assert isinstance(got, RecursionError)
    else:
        assert _same(got, expected)


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
)


@given(_JSON)
def test_task_data_round_trips_as_json_loads_reads_it(value: Any) -> None:
    text = json.dumps(value)
    assert _same(parse_task_data(text), json.loads(text))


@given(st.text(alphabet='[]{}",:0123456789.eE-+ \\truefalsnu\x01\t\n'))
def test_task_data_of_any_text_is_what_json_loads_gives(text: str) -> None:
    assert _same(parse_task_data(text), _as_json_loads(text))


# --- task data out ------------------------------------------------------------------------------


class _Point:
    """Not JSON-serializable."""


def _dumps_outcome(encode: Any, value: Any) -> tuple[str, Any]:
    try:
        return "ok", encode(value)
    except Exception as exc:  # the kind and text of the error are compared
        return type(exc).__name__, str(exc)


_ANY_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()  # NaN and the infinities too: json.dumps writes them
    | st.text(),
    lambda inner: st.lists(inner)
    | st.tuples(inner, inner)
    | st.dictionaries(st.text() | st.integers() | st.floats() | st.booleans() | st.none(), inner),
)


@given(_ANY_JSON)
def test_task_data_is_sent_as_json_dumps_writes_it(value: Any) -> None:
    # auto_dedupe hashes the text: it must be byte for byte what the upstream SDK sends.
    assert json_text(value) == json.dumps(value)


def _cycle() -> list[Any]:
    loop: list[Any] = [1]
    loop.append({"back": loop})
    return loop


@pytest.mark.parametrize(
    "value",
    [_cycle(), {"p": _Point()}, [1, {2, 3}], {(1, 2): "tuple key"}, "é\ud800", [[[[]]]] * 3],
    ids=["cycle", "object", "set", "tuple-key", "lone-surrogate", "shared"],
)
def test_task_data_json_dumps_refuses_is_refused_alike(value: Any) -> None:
    assert _dumps_outcome(json_text, value) == _dumps_outcome(json.dumps, value)
    # And the fast path is not left broken by a failure: the next value encodes.
    assert json_text({"after": [1, 2]}) == '{"after": [1, 2]}'


# --- reading the daemon's lines -------------------------------------------------------------------


class _Chunks:
    """A byte stream that gives the chunks it was made with, then ends."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if not self.chunks:
            raise anyio.EndOfStream
        return self.chunks.pop(0)


def _lines_read(chunks: list[bytes]) -> list[bytes]:
    got: list[bytes] = []
    anyio.run(_read_lines, _Chunks(chunks), got.append)  # type: ignore[arg-type]
    return got


@given(st.lists(st.binary(max_size=12) | st.sampled_from([b"\n", b"\n\n", b"a\nb", b"x" * 40])))
def test_lines_are_read_whole_however_the_stream_cuts_them(chunks: list[bytes]) -> None:
    whole = b"".join(chunks)
    expected = whole.split(b"\n")
    if expected[-1] == b"":
        expected.pop()  # a last line is one only when it holds something
    assert _lines_read(chunks) == expected


def test_a_line_longer_than_many_chunks_is_read_whole() -> None:
    big = [b"y" * 65536] * 40
    got = _lines_read([b"first\nsec", *big, b"ond\n", b"last"])
    assert got == [b"first", b"sec" + b"y" * 65536 * 40 + b"ond", b"last"]


class _Ids(list[str]):
    """Parent ids in a container that will not be compared with None (as an array would not)."""

    def __eq__(self, other: object) -> bool:
        raise ValueError("the truth value of this comparison is ambiguous")

    __hash__ = None  # type: ignore[assignment]


async def _options_are_taken_by_identity(tmp_path: Path) -> None:
    calls = Calls()
    async with queue(tmp_path) as q:

        @q.handler("child")
        async def child(data: Any) -> None:
            calls.add(data)

        @q.handler("parent")
        async def parent(data: Any) -> None:
            calls.add(data)

        await q.enqueue("p", "parent", "parent")
        await q.enqueue("c", "child", "child", trigger_after_ids=_Ids(["p"]))
        assert sorted(await calls.wait(2)) == ["child", "parent"]


def test_an_option_that_cannot_be_compared_with_none_is_still_sent(
    run: Runner, tmp_path: Path
) -> None:
    run(_options_are_taken_by_identity, tmp_path)


def test_enqueue_takes_the_protocols_options_in_the_upstream_order() -> None:
    # `enqueue` hands its options to the message builder by position (`ENQUEUE_OPTIONS`).
    names = list(inspect.signature(SnerdQueue.enqueue).parameters)
    after = names[names.index("retry_after_hours") + 1 :]
    assert tuple(after) == ENQUEUE_OPTIONS


async def _what_json_cannot_carry_is_refused_or_escaped(tmp_path: Path) -> None:
    dead = Calls()
    async with queue(tmp_path) as q:

        @q.handler("surrogate")
        async def surrogate(data: Any) -> None:
            # A file name decoded with surrogateescape: JSON cannot carry the lone surrogate.
            raise ValueError(b"no such file: \xff".decode("utf-8", "surrogateescape"))

        q.register_max_retry_handler("surrogate", lambda data, error: dead.add_from_thread(error))
        await q.enqueue("s1", "surrogate", None, max_retries=0)
        assert await dead.wait(1) == ["ValueError: no such file: \\udcff"]
        # orjson writes NaN as null, which the daemon would read as "absent".
        with pytest.raises(EnqueueError) as info:
            await q.enqueue("n1", "surrogate", None, urgency_score=math.nan)
        finite = "Failed to enqueue: urgency_score must be a finite number, got nan"
        assert info.value.message == finite
        with pytest.raises(EnqueueError, match="retry_after_hours must be a finite number"):
            await q.enqueue("n2", "surrogate", None, retry_after_hours=math.inf)
        assert (await q.stats())["total_enqueued"] == 1


@pytest.mark.parametrize("run", ["asyncio"], indirect=True)
def test_what_json_cannot_carry_is_refused_or_escaped(run: Runner, tmp_path: Path) -> None:
    run(_what_json_cannot_carry_is_refused_or_escaped, tmp_path)
