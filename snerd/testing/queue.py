"""`AsyncTestQueue`: a real engine on a virtual clock, for unit tests under trio.

Owns: one `snerd.Engine` on a directory of real files whose runtime reads a `DrivenClock`
(both of the node's clocks follow trio's clock, a `trio.testing.MockClock` that moves only
when told), the two ways a test moves the world (`run_until_idle`, `advance`), the record of
every handler call made through it (`Run`), and the handler wrappers that make a sync
handler's thread visible to it.

Nothing here decides anything about the queue: every task goes through the engine's node, the
daemon's own state machine, exactly as in production; this module only waits until nothing is
under way and then moves the clock to the next deadline. What "nothing is under way" means:
every trio task blocked (`trio.testing.wait_all_tasks_blocked`), the runtime settled
(`Runtime.settled`: no event queued, no append or read out), and no sync handler in its
thread. Then the only thing that can happen is a deadline: the earliest of them all
(`trio.lowlevel.current_statistics().seconds_to_next_deadline`: the node's timer, a handler's
`sleep`, a hard timeout) is where `advance` jumps next, so everything due in between runs at
its own virtual time, in order.

It must never: move the clock while anything is under way (a write in the log's thread, a sync
handler), re-implement a queue rule (retries, ordering, cron, rate windows are the node's), or
read the host's clock for the queue.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import functools
import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

import anyio.to_thread
import trio
import trio.testing

from snerd.core.shardlog import FoundDeadLetter, find_dead_letters
from snerd.engine import Engine
from snerd.io.clock import DrivenClock
from snerd.io.runtime import Runtime
from snerd.queuedir import open_queue, scan_shard
from snerd.sdk.context import CURRENT_ATTEMPT
from snerd.sdk.errors import SnerdError, TaskFailed
from snerd.sdk.messages import Enqueued, Scheduled, TaskDetails, describe_error

__all__ = ["TEST_ENV", "AsyncTestQueue", "Run", "TaskNotFinished"]

_F = TypeVar("_F", bound=Callable[..., Any])
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)

#: The settings a test queue runs with unless `env` says otherwise. None of them is a queue
#: rule; they set how often the daemon does I/O of its own on the clock, which on a virtual
#: day would otherwise be thousands of membership rounds and inbox looks: a lease of an hour
#: (a renewal every 20 minutes), inboxes looked at every 10 minutes while nothing else can
#: write to them (another daemon, a `snerd.producer`, a `snerdmq` command: `advance` past
#: the poll to take such writes in), and appends written but not fsynced (a test survives no
#: power cut; what is acked is the same).
TEST_ENV: Mapping[str, str] = {
    "SNERD_LEASE_TTL": "3600",
    "SNERD_INBOX_IDLE_POLL_MS": "600000",
    "SNERD_FSYNC": "never",
}
#: Real seconds a settle waits between looks while a thread is at work (a write, a read, a
#: sync handler): trio counts a task waiting for a thread as blocked.
_THREAD_POLL_S = 0.0002


class TaskNotFinished(SnerdError):
    """`result()` asked for a task that has not ended at the queue's virtual time: nothing
    more happens to it until the clock moves (`advance`).

    Attributes:
        state: the task's state (`delayed`, `retrying`, `blocked`, `queued`, `running`...).
    """

    def __init__(self, message: str, *, task_id: str, state: str) -> None:
        super().__init__(message, task_id=task_id)
        self.state = state


@dataclass(frozen=True, slots=True)
class Run:
    """One handler call made through the test queue: one attempt of a task."""

    task_id: str
    task_type: str
    #: 1 for the first attempt.
    attempt: int | None
    #: The task data, as the handler got it.
    data: Any
    #: Virtual wall-clock times (UTC) the call started and ended.
    started_at: dt.datetime
    ended_at: dt.datetime
    #: What the handler returned (None when it raised).
    result: Any = None
    #: `"<ExceptionType>: <message>"` when the handler raised (the attempt's error), else None.
    error: str | None = None
    #: The exception the handler raised, with its traceback (None when it returned).
    exception: BaseException | None = field(default=None, compare=False, repr=False)

    @property
    def ok(self) -> bool:
        """True when the handler returned (the attempt succeeded, unless its result did not
        fit SNERD_RESULT_MAX_BYTES)."""
        return self.error is None


def _is_async(fn: Callable[..., Any]) -> bool:
    """Whether calling `fn` gives a coroutine (as the SDK's workers decide it)."""
    call = getattr(fn, "__call__", None)  # noqa: B004 - an object with an async __call__
    return inspect.iscoroutinefunction(fn) or (
        call is not None and inspect.iscoroutinefunction(call)
    )


def _wall_us(moment: dt.datetime | str | None) -> int | None:
    """`moment` in µs since the epoch (a naive datetime is UTC here, unlike `execute_at`: a
    test's start is a fixed instant, not the host's local time)."""
    if moment is None:
        return None
    if isinstance(moment, str):
        moment = dt.datetime.fromisoformat(moment.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return (moment - _EPOCH) // dt.timedelta(microseconds=1)


class AsyncTestQueue:
    """A snerd queue for tests, under trio, on a virtual clock that moves only when told.

    ::

        async def test_backoff(tmp_path, mock_clock):      # pytest-trio's MockClock
            async with AsyncTestQueue(tmp_path) as q:
                @q.handler("email")
                async def send(data): ...
                await q.enqueue("e1", "email", {}, retry_after_hours=1)
                await q.run_until_idle()                   # what is due now runs
                await q.advance(hours=1)                   # an hour passes: the retry runs
                assert await q.result("e1") is None

    The run's clock must be a `trio.testing.MockClock` without autojump (pytest-trio's
    `mock_clock` fixture; `trio.run(..., clock=MockClock())`): autojump would move time while
    a write is in the log's thread. Only trio: under asyncio (or from a plain test function)
    use the blocking `snerd.testing.TestQueue`, which runs one of these in a thread.

    Handlers registered through the queue (`handler`, `register_handler`,
    `max_retry_handler`) are recorded (`runs`) and, when sync, run in a thread the queue
    waits for; register them here, not on `engine`, or a sync handler's thread is invisible
    to `run_until_idle`.
    """

    __test__ = False  # (not a pytest test class, whatever module imports it)

    def __init__(
        self,
        directory: str | Path,
        *,
        start: dt.datetime | str | None = None,
        eager: bool = False,
        env: Mapping[str, str] | None = None,
        shards: int | None = None,
        max_workers: int | None = None,
        pools: Mapping[str, int] | None = None,
    ) -> None:
        """Describe the queue; nothing runs until `async with`.

        Args:
            directory: the data directory (real files: a `tmp_path`).
            start: the virtual wall-clock time the queue starts at (a datetime, naive ones
                UTC, or an RFC 3339 string); default the host's time now, to the second.
            eager: every `enqueue` runs what it made due before returning
                (`run_until_idle`), as Celery's `task_always_eager` (not from a handler).
            env: `SNERD_*` settings over `TEST_ENV` (the host's environment is not read).
            shards, max_workers, pools: as for `snerd.Engine`.
        """
        start_us = _wall_us(start)
        if start_us is None:
            start_us = _wall_us(dt.datetime.now(dt.UTC).replace(microsecond=0))
        assert start_us is not None
        self.directory = Path(directory)
        self.eager = eager
        self._clock = DrivenClock(start_us)
        self.engine = Engine(
            self.directory,
            shards=shards,
            max_workers=max_workers,
            pools=pools,
            env={**TEST_ENV, **(env or {})},
            clock=self._clock,
        )
        self.mock_clock: trio.testing.MockClock | None = None
        self._nursery_cm: Any = None
        self._nursery: trio.Nursery | None = None
        self._runs: list[Run] = []
        #: How many of `_runs` `run_until_idle` and `advance` have returned.
        self._reported = 0
        #: Sync handlers (and dead-letter handlers) running in their thread now.
        self._threads = 0

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Self:
        """Start the engine on the run's MockClock and wait until it owns its shards."""
        clock = trio.lowlevel.current_clock()
        if not isinstance(clock, trio.testing.MockClock):
            raise RuntimeError(
                "[Snerd] a test queue needs the trio run's clock to be a "
                "trio.testing.MockClock (pytest-trio's mock_clock fixture, or "
                "trio.run(..., clock=trio.testing.MockClock())); from a plain test function "
                "use snerd.testing.TestQueue"
            )
        if clock.autojump_threshold != math.inf or clock.rate != 0:
            raise RuntimeError(
                "[Snerd] a test queue moves the MockClock itself: give it one without "
                "autojump and at rate 0 (pytest-trio's mock_clock, not autojump_clock)"
            )
        self.mock_clock = clock
        # A nursery around the engine's task group, for the clock's stepper at the end.
        self._nursery_cm = trio.open_nursery()
        self._nursery = await self._nursery_cm.__aenter__()
        try:
            await self.engine.__aenter__()
            await self._settle()
        except BaseException:
            # (Closed clean, no child in it yet: the error goes up as it is, not in a group.)
            await self._nursery_cm.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Drain and stop the engine while the clock moves from deadline to deadline (as
        `advance` moves it), so that a handler still waiting on the clock, or the drain's
        own timeout, does not hold the test up."""
        assert self._nursery is not None and self._nursery_cm is not None
        self._nursery.start_soon(self._step_until_stopped)
        try:
            await self.engine.__aexit__(exc_type, exc, tb)
        finally:
            self._nursery.cancel_scope.cancel()
            await self._nursery_cm.__aexit__(None, None, None)

    async def _step_until_stopped(self) -> None:
        """Jump the clock to each next deadline whenever all else is blocked (until
        cancelled): the engine's drain runs its course in virtual time."""
        clock = self._mock()
        while True:
            await self._settle()
            gap = trio.lowlevel.current_statistics().seconds_to_next_deadline
            clock.jump(max(gap, 1e-6) if gap < math.inf else 1.0)

    # ------------------------------------------------------------------ time

    def now(self) -> dt.datetime:
        """The queue's virtual wall-clock time (UTC): what the node reads for delays,
        backoff, cron, schedules and rate windows."""
        return _EPOCH + dt.timedelta(microseconds=self._clock.wall_us())

    async def run_until_idle(self) -> list[Run]:
        """Run everything that is due at the current virtual time, retries due now and
        children whose parents end included, until nothing more is under way; the clock does
        not move. Returns the handler calls that ended since the last `run_until_idle` or
        `advance` returned (a task runs as soon as it is due: maybe already during its
        `enqueue`), in the order they ended.

        A handler that waits on trio's clock (a `sleep`) is left waiting: `advance` it."""
        await self._settle()
        return self._new_runs()

    async def advance(
        self, *, days: float = 0, hours: float = 0, minutes: float = 0, seconds: float = 0
    ) -> list[Run]:
        """Move the virtual clock forward by this much, stopping at every deadline on the way
        (a delayed task, a retry, a cron or schedule tick, a rate window, a lease renewal, a
        handler's sleep) and running what it made due before going on; returns the handler
        calls that ended since the last `run_until_idle` or `advance` returned. Real time
        goes on the deadlines met, not on the span (docs/testing.md, "What it costs").

        Raises:
            ValueError: a negative span.
        """
        span = days * 86_400 + hours * 3_600 + minutes * 60 + seconds
        if span < 0 or not math.isfinite(span):
            raise ValueError(f"advance() moves the clock forward, not by {span!r} s")
        clock = self._mock()
        target = trio.current_time() + span
        while True:
            await self._settle()
            now = trio.current_time()
            if now >= target:
                break
            # Everything is blocked: only a deadline can happen next. (At least a µs: a jump
            # that lands a rounding error short of a deadline would find it again.)
            gap = trio.lowlevel.current_statistics().seconds_to_next_deadline
            clock.jump(min(max(gap, 1e-6), target - now))
        return self._new_runs()

    def _new_runs(self) -> list[Run]:
        """The runs since the last call, and the mark moved past them."""
        new, self._reported = self._runs[self._reported :], len(self._runs)
        return new

    async def _settle(self) -> None:
        """Wait until nothing is under way: every trio task blocked, the runtime settled, no
        sync handler in its thread (waiting real time, a fraction of a millisecond at a
        time, while a thread works).

        Raises:
            RuntimeError: called from a handler, which it would wait for.
        """
        if CURRENT_ATTEMPT.get() is not None:
            raise RuntimeError(
                "[Snerd] a handler cannot wait for the test queue to be idle (it would wait "
                "for itself): call the engine's face (`q.engine.get`, `q.engine.enqueue`)"
            )
        cushion = 0.0
        while True:
            await trio.testing.wait_all_tasks_blocked(cushion)
            if self._threads == 0 and self._runtime().settled():
                return
            cushion = _THREAD_POLL_S

    def _mock(self) -> trio.testing.MockClock:
        if self.mock_clock is None:
            raise RuntimeError("[Snerd] the test queue is not started: use `async with`")
        return self.mock_clock

    def _runtime(self) -> Runtime:
        runtime = self.engine.runtime
        if runtime is None:
            raise RuntimeError("[Snerd] the test queue is not started: use `async with`")
        return runtime

    # ------------------------------------------------------------------ handlers

    @property
    def runs(self) -> list[Run]:
        """Every handler call made through this queue so far, in the order they ended."""
        return list(self._runs)

    def runs_of(self, task_id: str) -> list[Run]:
        """The handler calls (attempts) of one task, in order."""
        return [run for run in self._runs if run.task_id == task_id]

    def register_handler(self, task_type: str, handler: Callable[[Any], Any]) -> None:
        """`Engine.register_handler`, recorded in `runs`; a sync handler runs in a thread
        this queue waits for."""
        self.engine.register_handler(task_type, self._recorded(self._threaded(handler)))

    def handler(self, task_type: str) -> Callable[[_F], _F]:
        """Decorator form of `register_handler`: `@q.handler("email")`."""

        def register(fn: _F) -> _F:
            self.register_handler(task_type, fn)
            return fn

        return register

    def register_max_retry_handler(self, task_type: str, handler: Callable[..., Any]) -> None:
        """`Engine.register_max_retry_handler`; a sync one runs in a thread this queue waits
        for."""
        self.engine.register_max_retry_handler(task_type, self._threaded(handler))

    def max_retry_handler(self, task_type: str) -> Callable[[_F], _F]:
        """Decorator form of `register_max_retry_handler`."""

        def register(fn: _F) -> _F:
            self.register_max_retry_handler(task_type, fn)
            return fn

        return register

    def _threaded(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn` as an async function: itself if it is one, else one that runs it in a worker
        thread (in a copy of the attempt's context, abandoned on cancel, as the SDK runs a
        sync handler) and counts the thread while it runs."""
        if _is_async(fn):
            return fn

        @functools.wraps(fn)  # (keeps its signature: a dead-letter handler's arity counts)
        async def in_thread(*args: Any) -> Any:
            self._threads += 1
            try:
                context = contextvars.copy_context()
                result = await anyio.to_thread.run_sync(
                    context.run, fn, *args, abandon_on_cancel=True
                )
            finally:
                self._threads -= 1
            if inspect.isawaitable(result):
                return await result
            return result

        return in_thread

    def _recorded(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """The async handler `fn`, each call of it recorded as a `Run`."""

        @functools.wraps(fn)
        async def recorded(data: Any) -> Any:
            attempt = CURRENT_ATTEMPT.get()
            assert attempt is not None  # (the SDK's worker sets it around every call)
            started = self.now()

            def run(result: Any = None, error: BaseException | None = None) -> Run:
                text = None if error is None else describe_error(error)
                return Run(
                    attempt.task_id,
                    attempt.task_type,
                    attempt.attempt,
                    data,
                    started,
                    self.now(),
                    result,
                    text if isinstance(error, Exception) or error is None else "cancelled",
                    error,
                )

            try:
                value = await fn(data)
            except BaseException as exc:  # (cancelled too: recorded, then on its way)
                self._runs.append(run(error=exc))
                raise
            self._runs.append(run(value))
            return value

        return recorded

    # ------------------------------------------------------------------ calls

    async def enqueue(
        self,
        task_id: str | None = None,
        task_type: str | None = None,
        data: Any = None,
        max_retries: int = 3,
        retry_after_hours: float = 0.0,
        *,
        execute_at: str | dt.datetime | dt.timedelta | None = None,
        **options: Any,
    ) -> Enqueued:
        """`Engine.enqueue` (same arguments); a timedelta `execute_at` counts from the
        virtual now. Eager: then `run_until_idle` (not when called from a handler)."""
        if isinstance(execute_at, dt.timedelta):
            execute_at = self.now() + execute_at
        enqueued = await self.engine.enqueue(
            task_id,
            task_type,
            data,
            max_retries,
            retry_after_hours,
            execute_at=execute_at,
            **options,
        )
        if self.eager and CURRENT_ATTEMPT.get() is None:
            await self._settle()
        return enqueued

    async def schedule(self, name: str, cron: str, task_type: str, data: Any = None,
                       **options: Any) -> Scheduled:
        """`Engine.schedule` (same arguments): ticks come as the virtual clock passes them."""
        return await self.engine.schedule(name, cron, task_type, data, **options)

    async def get(self, task_id: str) -> TaskDetails:
        """`Engine.get` once nothing is under way: the task as the queue's files say it."""
        await self._settle()
        return await self.engine.get(task_id)

    async def result(self, task_id: str) -> Any:
        """What the task's handler returned, once nothing is under way; never waits for the
        clock (`Engine.result` would wait for time that does not pass by itself).

        Raises:
            TaskNotFinished: it has not ended at the virtual now (`advance` the clock).
            TaskFailed: it ended without succeeding (dead letter, cancelled, dropped).
        """
        details = await self.get(task_id)
        if not details.finished:
            raise TaskNotFinished(
                f"[Snerd] task '{task_id}' is {details.state} at {self.now().isoformat()}: "
                "nothing more happens to it until the clock moves (advance())",
                task_id=task_id,
                state=details.state,
            )
        if details.state != "succeeded":
            why = f": {details.last_error}" if details.last_error else ""
            raise TaskFailed(
                f"[Snerd] task '{task_id}' ended {details.state}{why}",
                task_id=task_id,
                state=details.state,
                error=details.last_error,
            )
        return details.result

    async def dead_letters(self, task_type: str | None = None) -> list[FoundDeadLetter]:
        """The queue's dead letters (of `task_type`, or all), oldest first, read from its
        files by the rule `snerdmq dlq` lists them by, once nothing is under way."""
        await self._settle()

        def read() -> list[FoundDeadLetter]:
            queue = open_queue(str(self.directory))
            folds = {s: scan_shard(queue, s).fold for s in range(queue.shards)}
            return find_dead_letters(folds, task_type=task_type)

        return await anyio.to_thread.run_sync(read)

    def __getattr__(self, name: str) -> Any:
        """Everything else of the engine's face (`cancel`, `retry`, `pause`, `stats`,
        `on_progress`...), as it is."""
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.engine, name)
