"""Job control through both faces, `SnerdQueue` (a real daemon process) and `Engine` (the
runtime in-process), each under trio and under asyncio (`run`, tests/support/sdkhelpers.py):
`cancel`, `retry`, `pause` / `resume` return the daemon's answer and their effect shows in what
handlers run; a running async handler is really stopped; bad input raises `ControlError` with
the daemon's text. Then, with no daemon, a fake peer (`_Peer`, a face whose messages a test
answers): replies matched to their calls, `get` and `result` read from the `task` reply's
shape, a refusal routed to its call.

Waits are on events set by handlers, bounded by `anyio.fail_after`; a fixed wait appears
only where something must *not* happen, and the test says so.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
import trio.testing

from snerd import (
    Cancelled,
    ControlError,
    Engine,
    Enqueued,
    EnqueueError,
    Paused,
    Retried,
    SnerdQueue,
    Swept,
    TaskDetails,
    TaskFailed,
    current_task,
)
from snerd.sdk.face import QueueFace
from snerd.sdk.messages import details_from_reply
from tests.support.sdkhelpers import Calls, Runner, wait_for_stats
from tests.support.sdkhelpers import run as run  # the fixture

Face = Callable[[Path], SnerdQueue | Engine]


@pytest.fixture(params=["queue", "engine"])
def face(request: pytest.FixtureRequest) -> Face:
    """Makes the face under test on a directory."""
    if request.param == "queue":
        return lambda path: SnerdQueue(storage_path=path / "q", drain_timeout=3)
    return lambda path: Engine(path / "q", drain_timeout=3)


def _ran(calls: Calls) -> list[str]:
    return [task_id for task_id, _ in calls.items]


# --- cancel ----------------------------------------------------------------------------------


async def _cancel_waiting_running_finished_unknown(face: Face, tmp_path: Path) -> None:
    calls = Calls()
    started, stopped = anyio.Event(), anyio.Event()
    reached: list[str] = []
    async with face(tmp_path) as q:

        @q.handler("slow")
        async def slow(data: Any) -> None:
            started.set()
            try:
                await anyio.sleep(3600)
                reached.append("after the await")  # never: the cancel stops it here
            finally:
                stopped.set()

        # Queued (its type has no handler yet) and delayed: cancelled, they never start.
        await q.enqueue("waits", "later", {"n": 1})
        later = datetime.now(UTC) + timedelta(hours=1)
        await q.enqueue("delayed", "later", {"n": 2}, execute_at=later)
        assert await q.cancel("waits") == Cancelled("waits", "queued", True, "shard-0")
        assert await q.cancel("delayed") == Cancelled("delayed", "delayed", True, "shard-0")
        # Running: the attempt ends as cancelled, and the async handler is stopped where it
        # awaits (the only way it ends within the test's bound).
        await q.enqueue("runs", "slow", None)
        await started.wait()
        assert await q.cancel("runs") == Cancelled("runs", "running", True, "shard-0")
        await stopped.wait()
        assert reached == []
        # Finished already (cancelled), or never seen: told so, nothing changes.
        assert await q.cancel("runs") == Cancelled("runs", "cancelled", False, "shard-0")
        assert await q.cancel("nobody") == Cancelled("nobody", "unknown", False, None)

        # The cancelled tasks never run: once a handler comes, a later task of the type runs
        # and the earlier, cancelled one did not before it.
        @q.handler("later")
        async def record(data: Any) -> None:
            calls.add((current_task().task_id, data))

        await q.enqueue("after", "later", {"n": 3})
        await calls.wait(1)
        # The worker the stopped attempt ran on takes work again; a success is not a cancel.
        await q.enqueue("done", "later", {"n": 4})
        await calls.wait(2)
        assert await q.cancel("done") == Cancelled("done", "succeeded", False, "shard-0")
        stats = await q.stats()
        # No result was recorded for the stopped attempt (neither a success nor a failure).
        assert (stats["total_executed"], stats["total_failed"]) == (2, 0)
    assert _ran(calls) == ["after", "done"]


def test_cancel_of_a_waiting_a_running_a_finished_and_an_unknown_task(
    run: Runner, face: Face, tmp_path: Path
) -> None:
    run(_cancel_waiting_running_finished_unknown, face, tmp_path)


async def _a_sync_handler_runs_to_its_end(face: Face, tmp_path: Path) -> None:
    started, release = threading.Event(), threading.Event()
    ended = Calls()
    async with face(tmp_path) as q:

        @q.handler("sync")
        def blocking(data: Any) -> str:
            started.set()
            release.wait(20)
            ended.add_from_thread("end")
            return "dropped"

        await q.enqueue("s", "sync", None)
        await anyio.to_thread.run_sync(started.wait, 20)
        assert await q.cancel("s") == Cancelled("s", "running", True, "shard-0")
        release.set()
        # Its thread cannot be stopped: the handler runs to its end...
        await ended.wait(1)
        # ...and the task stays cancelled, no success counted.
        assert await q.cancel("s") == Cancelled("s", "cancelled", False, "shard-0")
        stats = await q.stats()
        assert (stats["total_executed"], stats["total_failed"]) == (0, 0)


def test_a_cancelled_sync_handler_runs_to_its_end_and_its_result_is_dropped(
    run: Runner, face: Face, tmp_path: Path
) -> None:
    run(_a_sync_handler_runs_to_its_end, face, tmp_path)


# --- retry -----------------------------------------------------------------------------------


async def _retry_dead_letter_and_live(face: Face, tmp_path: Path) -> None:
    calls, buried = Calls(), Calls()
    held = anyio.Event()
    async with face(tmp_path) as q:

        @q.handler("flaky")
        async def flaky(data: Any) -> None:
            calls.add(current_task().task_id)
            if len(calls.items) == 1:
                raise ValueError("first run fails")

        @q.max_retry_handler("flaky")
        async def dead(data: Any, error: str | None) -> None:
            buried.add(error)

        @q.handler("held")
        async def hold(data: Any) -> None:
            await held.wait()

        await q.enqueue("d", "flaky", None, max_retries=0)
        assert await buried.wait(1) == ["ValueError: first run fails"]
        # A dead letter goes back in the queue, attempts reset, and runs again.
        assert await q.retry("d") == Retried("d", "dead_letter", True, "shard-0")
        assert await calls.wait(2) == ["d", "d"]
        # A succeeded task, a live one and an unknown id are left as they are.
        await wait_for_stats(q, lambda s: s["total_executed"] == 2)  # (a failure, a success)
        assert await q.retry("d") == Retried("d", "succeeded", False, "shard-0")
        await q.enqueue("live", "held", None)
        await wait_for_stats(q, lambda s: s["in_flight"] == 1)
        assert await q.retry("live") == Retried("live", "running", False, "shard-0")
        assert await q.retry("nobody") == Retried("nobody", "unknown", False, None)
        held.set()


def test_retry_of_a_dead_letter_runs_it_again_and_of_a_live_task_changes_nothing(
    run: Runner, face: Face, tmp_path: Path
) -> None:
    run(_retry_dead_letter_and_live, face, tmp_path)


# --- get and result --------------------------------------------------------------------------


async def _get_and_result(face: Face, tmp_path: Path) -> None:
    async with face(tmp_path) as q:

        @q.handler("sum")
        async def add(data: Any) -> int:
            if current_task().attempt == 1:
                raise RuntimeError("first try fails")
            return int(data["a"]) + int(data["b"])

        @q.handler("doomed")
        async def doomed(data: Any) -> None:
            raise RuntimeError("always")

        await q.enqueue("s1", "sum", {"a": 2, "b": 3}, max_retries=2)
        assert await q.result("s1", timeout=30) == 5
        info = await q.get("s1")
        assert (info.found, info.state, info.outcome, info.attempts) == (
            True, "succeeded", "completed", 2,
        )
        assert info.shard == "shard-0" and info.result == 5 and info.has_result
        assert info.enqueued_at is not None and info.finished_at is not None
        await q.enqueue("d1", "doomed", None, max_retries=0)
        with pytest.raises(TaskFailed) as failed:
            await q.result("d1", timeout=30)
        assert failed.value.state == "dead_letter"
        assert (await q.get("d1")).last_error == "RuntimeError: always"
        unknown = await q.get("nobody")
        assert (unknown.found, unknown.state) == (False, "unknown")
        with pytest.raises(TimeoutError):
            await q.result("nobody", timeout=0.3)


def test_get_and_result_read_a_task_back_from_the_daemon(
    run: Runner, face: Face, tmp_path: Path
) -> None:
    run(_get_and_result, face, tmp_path)


# --- pause -----------------------------------------------------------------------------------


async def _pause_holds_a_type(face: Face, tmp_path: Path) -> None:
    calls = Calls()
    async with face(tmp_path) as q:

        @q.handler("mail")
        async def mail(data: Any) -> None:
            calls.add(current_task().task_id)

        @q.handler("report")
        async def report(data: Any) -> None:
            calls.add(current_task().task_id)

        assert await q.pause("mail") == Paused("mail", True, 1)
        # Enqueues are still taken. The paused task is the more urgent one: it would run
        # first, were it not held.
        await q.enqueue("m1", "mail", None, urgency_score=10)
        await q.enqueue("r1", "report", None)
        assert await calls.wait(1) == ["r1"]
        # (r1's tombstone lands a little after its count: its depth is looked at until then.)
        stats = await wait_for_stats(q, lambda s: s["queue_depth"] == 1)
        assert stats["paused_types"] == ["mail"] and stats["total_executed"] == 1
        assert await q.resume("mail") == Paused("mail", False, 1)
        assert await calls.wait(2) == ["r1", "m1"]
        # The whole queue: nothing runs until it is resumed.
        assert await q.pause_all() == Paused(None, True, 1)
        await q.enqueue("m2", "mail", None, urgency_score=10)
        await q.enqueue("r2", "report", None)
        await wait_for_stats(q, lambda s: s["queue_depth"] == 2)
        assert await q.resume_all() == Paused(None, False, 1)
        assert sorted((await calls.wait(4))[2:]) == ["m2", "r2"]


def test_pause_holds_a_type_while_another_runs_and_resume_lets_it_go(
    run: Runner, face: Face, tmp_path: Path
) -> None:
    run(_pause_holds_a_type, face, tmp_path)


# --- sweeps: purge and retry by type -----------------------------------------------------------


async def _sweeps(face: Face, tmp_path: Path) -> None:
    calls, buried = Calls(), Calls()
    healed = threading.Event()
    async with face(tmp_path) as q:

        @q.handler("boom")
        async def boom(data: Any) -> None:
            calls.add(current_task().task_id)
            if not healed.is_set():
                raise ValueError("boom")

        @q.handler("other")
        async def other(data: Any) -> None:
            raise ValueError("other")

        @q.max_retry_handler("boom")
        @q.max_retry_handler("other")
        async def dead(data: Any, error: str | None) -> None:
            buried.add(error)

        for task_id, task_type in (("b1", "boom"), ("b2", "boom"), ("o1", "other")):
            await q.enqueue(task_id, task_type, None, max_retries=0)
        await buried.wait(3)
        later = datetime.now(UTC) + timedelta(hours=1)
        await q.enqueue("c1", "boom", None, execute_at=later)
        assert (await q.cancel("c1")).cancelled
        # The type's dead letters go back (not the cancelled task), and run again.
        healed.set()
        assert await q.retry_dead("boom") == Swept("requeued", "boom", None, 2, 1)
        assert sorted((await calls.wait(4))[2:]) == ["b1", "b2"]
        await wait_for_stats(q, lambda s: s["total_executed"] == 5)
        # A purge of the type takes the cancelled task, never the succeeded ones; two at
        # once each get an answer of their own.
        answers: list[Swept] = []
        async with anyio.create_task_group() as tg:

            async def purge() -> None:
                answers.append(await q.purge("boom"))

            tg.start_soon(purge)
            tg.start_soon(purge)
        assert sorted(a.count for a in answers) == [0, 1]
        assert (await q.get("b1")).state == "succeeded"
        # A cutoff before the dead letter died leaves it; the whole queue's purge takes it.
        cutoff = datetime(2020, 1, 1, tzinfo=UTC)
        assert await q.purge_all(before=cutoff) == Swept("purged", None, cutoff, 0, 1)
        assert await q.purge_all() == Swept("purged", None, None, 1, 1)
        assert (await q.get("o1")).state == "purged"
        assert await q.retry_all_dead() == Swept("requeued", None, None, 0, 1)
        # No accidental whole-queue sweep: a type of None or "" is refused.
        for call in (q.purge, q.retry_dead):
            with pytest.raises(ControlError, match=r"^Invalid JSON: missing field `task_type`"):
                await call(None)  # type: ignore[arg-type]
            with pytest.raises(ControlError, match=r"^Invalid JSON: field `task_type` must not"):
                await call("")


def test_purge_and_retry_by_type_count_what_they_took(
    run: Runner, face: Face, tmp_path: Path
) -> None:
    run(_sweeps, face, tmp_path)


# --- bad input -------------------------------------------------------------------------------


async def _bad_input(face: Face, tmp_path: Path) -> None:
    async with face(tmp_path) as q:
        empty_id = "Invalid JSON: field `task_id` must not be empty"
        for call in (q.cancel, q.retry, q.get):
            with pytest.raises(ControlError) as refused:
                await call("")
            assert refused.value.message == empty_id
        with pytest.raises(ControlError, match=r"^Invalid JSON: field `task_id` must be a string"):
            await q.cancel(7)  # type: ignore[arg-type]
        with pytest.raises(ControlError, match=r"^Invalid JSON: field `task_type` must not be"):
            await q.pause("")
        with pytest.raises(ControlError, match=r"^Invalid JSON: missing field `task_type`"):
            await q.resume(None)  # type: ignore[arg-type]
        # A type nothing has: paused all the same (its tasks wait once they come).
        assert await q.pause("no-such-type") == Paused("no-such-type", True, 1)
        # Two calls about one task at once: each gets an answer of its own.
        await q.enqueue("twice", "later", None)
        async with anyio.create_task_group() as tg:
            answers: list[Cancelled] = []

            async def cancel() -> None:
                answers.append(await q.cancel("twice"))

            tg.start_soon(cancel)
            tg.start_soon(cancel)
        assert sorted(a.cancelled for a in answers) == [False, True]
        assert {a.found for a in answers} == {"queued", "cancelled"}
        # The queue answers on after its refusals.
        assert (await q.enqueue("next", "later", None)).task_id == "next"


def test_bad_input_raises_the_daemons_text_and_changes_nothing(
    run: Runner, face: Face, tmp_path: Path
) -> None:
    run(_bad_input, face, tmp_path)


# --- a fake peer: matching, get, result ------------------------------------------------------


class _Peer(QueueFace):
    """A face with no daemon: what it posts is kept, and the test answers it (`reply`), at
    once from `answer` when that is set."""

    _drain_timeout_s = 1.0

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[dict[str, Any]] = []
        self.answer: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None

    def start(self) -> None:
        self._bind_loop()
        self._accepting = True

    def _post(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        reply = None if self.answer is None else self.answer(message)
        if reply is not None:
            self._on_message(reply)

    def reply(self, message: dict[str, Any]) -> None:
        self._on_message(message)


def _run_trio(scenario: Callable[[], Any]) -> None:
    """Run `scenario` under trio on a clock that jumps ahead when everything waits."""
    anyio.run(
        scenario,
        backend="trio",
        backend_options={"clock": trio.testing.MockClock(autojump_threshold=0)},
    )


def _task(task_id: str, state: str, **details: Any) -> dict[str, Any]:
    """A `task` reply of the daemon's shape."""
    base: dict[str, Any] = {
        "action": "task", "task_id": task_id, "found": state != "unknown", "state": state,
        "task_type": "t", "shard": 1, "attempts": 1, "max_retries": 3, "last_error": None,
        "enqueued_at": "2026-12-03T10:00:00.000000Z", "started_at": None,
        "finished_at": None, "result": None, "has_result": False, "outcome": None,
    }
    return {**base, **details}


def test_a_task_reply_is_read_into_its_value() -> None:
    details = details_from_reply(
        _task(
            "x", "succeeded", attempts=2, outcome="completed", result={"n": [1]},
            has_result=True, started_at="2026-12-03T10:00:01.5Z",
            finished_at="2026-12-03T10:00:02Z", last_error="ValueError: once",
        )
    )
    assert details == TaskDetails(
        task_id="x", found=True, state="succeeded", task_type="t", shard="shard-1",
        attempts=2, max_retries=3, last_error="ValueError: once",
        enqueued_at=datetime(2026, 12, 3, 10, tzinfo=UTC),
        started_at=datetime(2026, 12, 3, 10, 0, 1, 500_000, tzinfo=UTC),
        finished_at=datetime(2026, 12, 3, 10, 0, 2, tzinfo=UTC),
        outcome="completed", result={"n": [1]}, has_result=True,
    )
    assert details.finished
    # Fields of the wrong type are read as absent; a "shard-N" is kept as it is.
    odd = details_from_reply(
        {"action": "task", "task_id": "y", "found": "yes", "shard": "shard-0", "attempts": 1.5,
         "enqueued_at": "yesterday"}
    )
    assert odd == TaskDetails("y", found=False, state="unknown", shard="shard-0")
    assert not odd.finished


def test_get_sends_its_line_and_returns_the_reply_naming_its_task() -> None:
    async def scenario() -> None:
        q = _Peer()
        q.start()
        async with anyio.create_task_group() as tg:
            got: dict[str, TaskDetails] = {}

            async def get(task_id: str) -> None:
                got[task_id] = await q.get(task_id)

            for task_id in ("a", "b"):
                tg.start_soon(get, task_id)
                await anyio.wait_all_tasks_blocked()
            assert q.sent == [{"action": "get", "task_id": "a"}, {"action": "get", "task_id": "b"}]
            # Answered out of order: each call takes the reply that names its task.
            q.reply(_task("b", "running"))
            q.reply(_task("a", "queued"))
        assert (got["a"].state, got["b"].state) == ("queued", "running")
        # No reply: a `get` gives up after its timeout.
        with pytest.raises(TimeoutError):
            await q.get("silent", timeout=2)

    _run_trio(scenario)


def test_result_waits_for_the_outcome_through_unknown_and_live_answers() -> None:
    async def scenario() -> None:
        q = _Peer()
        q.start()
        answers = iter(
            [_task("r", "unknown"), _task("r", "queued"), _task("r", "running"),
             _task("r", "succeeded", outcome="completed", result=[42], has_result=True)]
        )
        q.answer = lambda message: next(answers)
        assert await q.result("r") == [42]
        assert len(q.sent) == 4 and {m["action"] for m in q.sent} == {"get"}
        # A dead letter or a cancel raises, with the state and the last error.
        q.answer = lambda m: _task("d", "dead_letter", outcome="dead_letter", last_error="E: x")
        with pytest.raises(TaskFailed) as failed:
            await q.result("d")
        assert (failed.value.state, failed.value.error, failed.value.task_id) == (
            "dead_letter", "E: x", "d"
        )
        q.answer = lambda m: _task("c", "cancelled", outcome="cancelled")
        with pytest.raises(TaskFailed, match="ended cancelled"):
            await q.result("c")
        # A task that never ends: TimeoutError after `timeout`, on the clock.
        q.answer = lambda m: _task("slow", "running")
        start = anyio.current_time()
        with pytest.raises(TimeoutError):
            await q.result("slow", timeout=5)
        assert 5 <= anyio.current_time() - start < 5.1

    _run_trio(scenario)


def test_replies_go_to_the_calls_they_name_oldest_first_and_refusals_to_theirs() -> None:
    async def scenario() -> None:
        q = _Peer()
        q.start()
        got: dict[str, Any] = {}

        async def call(label: str, fn: Callable[..., Any], *args: Any) -> None:
            try:
                got[label] = await fn(*args)
            except (ControlError, EnqueueError) as exc:
                got[label] = exc

        async with anyio.create_task_group() as tg:
            # Sent in this order (each call is waiting before the next starts).
            for label, fn, *args in (
                ("pause", q.pause, "t"), ("resume", q.resume, "t"), ("cancel 1", q.cancel, "x"),
                ("cancel 2", q.cancel, "x"), ("retry", q.retry, "x"),
                ("enqueue", q.enqueue, "x", "t"),
            ):
                tg.start_soon(call, label, fn, *args)
                await anyio.wait_all_tasks_blocked()
            # A resume's answer is not a pause's (matched by direction too).
            q.reply({"action": "paused", "task_type": "t", "paused": False, "shards": 2,
                     "pending": ["shard-1"]})
            await anyio.wait_all_tasks_blocked()
            assert got == {"resume": Paused("t", False, 2, ("shard-1",))}
            q.reply({"action": "paused", "task_type": "t", "paused": True, "shards": 2,
                     "pending": []})
            # Two cancels of one id: the oldest takes the first answer.
            q.reply({"action": "cancelled", "task_id": "x", "found": "queued",
                     "cancelled": True, "shard": "shard-0"})
            q.reply({"action": "cancelled", "task_id": "x", "found": "cancelled",
                     "cancelled": False, "shard": "shard-0", "pending": True})
            # A refused retry fails the retry, not the enqueue of the same id.
            q.reply({"action": "error", "task_id": "x",
                     "message": "Failed to retry: x: cannot read its record"})
            q.reply({"action": "ack", "task_id": "x", "shard": "shard-0"})
        assert got.pop("pause") == Paused("t", True, 2, ())
        assert got.pop("cancel 1") == Cancelled("x", "queued", True, "shard-0")
        assert got.pop("cancel 2") == Cancelled("x", "cancelled", False, "shard-0", pending=True)
        # The enqueue of the same id is untouched.
        assert got.pop("enqueue") == Enqueued("x", "shard-0")
        retry = got.pop("retry")
        assert isinstance(retry, ControlError)
        assert retry.message == "Failed to retry: x: cannot read its record"
        # A pause refused while the daemon drains names no task: it fails the pause.
        async with anyio.create_task_group() as tg:
            tg.start_soon(call, "all", q.pause_all)
            await anyio.wait_all_tasks_blocked()
            q.reply({"action": "error",
                     "message": "[Snerd] Daemon is shutting down; command rejected"})
        assert isinstance(got["all"], ControlError) and "shutting down" in got["all"].message
        # Sweeps are matched by kind, type and cutoff: two identical ones oldest first, and
        # one with another cutoff is not answered by their replies.
        cutoff = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
        async with anyio.create_task_group() as tg:
            sweeps: list[tuple[str, Callable[[], Any]]] = [
                ("p1", lambda: q.purge("t")), ("p2", lambda: q.purge("t")),
                ("cut", lambda: q.purge("t", before=cutoff)), ("r", lambda: q.retry_dead("t")),
            ]
            for name, sweep in sweeps:
                tg.start_soon(call, name, sweep)
                await anyio.wait_all_tasks_blocked()
            assert q.sent[-1] == {"action": "retry", "task_type": "t"}
            assert q.sent[-2] == {"action": "purge", "task_type": "t",
                                  "before": "2026-01-02T03:04:05.000000Z"}
            for count in (3, 4):
                q.reply({"action": "purged", "task_type": "t", "before": None, "count": count,
                         "shards": 2, "pending": []})
            q.reply({"action": "requeued", "task_type": "t", "before": None, "count": 5,
                     "shards": 2, "pending": ["shard-1"]})
            await anyio.wait_all_tasks_blocked()
            assert "cut" not in got
            q.reply({"action": "purged", "task_type": "t", "before": "2026-01-02T03:04:05.000Z",
                     "count": 6, "shards": 2, "pending": []})
        assert [got.pop(k).count for k in ("p1", "p2", "cut")] == [3, 4, 6]
        assert got.pop("r") == Swept("requeued", "t", None, 5, 2, ("shard-1",))
        # A call given up (cancelled) still takes its own reply; the next call gets its own.
        with anyio.move_on_after(1):
            await q.cancel("y")
        q.reply({"action": "cancelled", "task_id": "y", "found": "queued", "cancelled": True,
                 "shard": None})
        q.answer = lambda m: {"action": "cancelled", "task_id": "y", "found": "cancelled",
                              "cancelled": False, "shard": None}
        assert await q.cancel("y") == Cancelled("y", "cancelled", False)

    _run_trio(scenario)


def test_handlers_are_registered_cancellable() -> None:
    async def scenario() -> None:
        q = _Peer()
        q.register_handler("early", lambda data: None)
        q.start()
        q._accept_enqueues()
        q.register_handler("late", lambda data: None)
        assert q.sent == [
            {"action": "register", "task_type": "early", "cancellable": True},
            {"action": "register", "task_type": "late", "cancellable": True},
        ]

    _run_trio(scenario)


def test_an_attempt_cancelled_before_its_worker_starts_never_runs() -> None:
    # The `execute` and its `cancel` in one batch (as the engine hands them over): the job is
    # dropped from the queue of jobs, no handler call, no result; the next job runs.
    async def scenario() -> None:
        ran: list[Any] = []
        q = _Peer()

        @q.handler("t")
        async def handler(data: Any) -> None:
            ran.append(data)

        async with anyio.create_task_group() as tg:
            q._tg = tg
            q.start()
            for message in (
                {"action": "execute", "task_id": "a", "task_type": "t", "task_data": "1",
                 "attempt": 1},
                {"action": "cancel", "task_id": "a", "attempt": 1},
                {"action": "cancel", "task_id": "b", "attempt": 1},  # (nothing of it here)
                {"action": "execute", "task_id": "b", "task_type": "t", "task_data": "2",
                 "attempt": 1},
            ):
                q.reply(message)
            await anyio.wait_all_tasks_blocked()
            tg.cancel_scope.cancel()
        assert ran == [2]
        assert [(m["action"], m.get("task_id")) for m in q.sent] == [("result", "b")]

    _run_trio(scenario)
