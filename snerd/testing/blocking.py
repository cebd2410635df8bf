"""`TestQueue`: the blocking face of `AsyncTestQueue`, for plain (sync) test functions.

Owns: one trio run in a thread of its own, on a `trio.testing.MockClock`, hosting one
`AsyncTestQueue`; every call of the test's thread is carried into that run
(`trio.from_thread.run`) and blocks until it is answered. Handlers run in that run: async ones
on its loop (so they are written for trio or anyio, not asyncio), sync ones in its worker
threads, as the async queue runs them.

It must never: run anything of the queue in the caller's thread, or outlive `close()`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import inspect
import threading
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

import trio
import trio.testing

from snerd.core.shardlog import FoundDeadLetter
from snerd.sdk.context import CURRENT_ATTEMPT
from snerd.sdk.messages import Enqueued, Scheduled, TaskDetails
from snerd.testing.queue import AsyncTestQueue, Run

__all__ = ["TestQueue"]

_F = TypeVar("_F", bound=Callable[..., Any])
_T = TypeVar("_T")


class TestQueue:
    """A snerd queue for plain test functions: the calls of `AsyncTestQueue`, blocking.

    ::

        def test_delay(tmp_path):
            with TestQueue(tmp_path) as q:
                @q.handler("report")
                def build(data):
                    return {"rows": 3}
                q.enqueue("r1", "report", {}, execute_at=timedelta(hours=2))
                q.run_until_idle()
                assert q.get("r1").state == "delayed"
                q.advance(hours=2)
                assert q.result("r1") == {"rows": 3}

    `snerd_queue`, the pytest fixture of `snerd.testing.plugin`, is one of these on
    `tmp_path`, started. Call it from the test's thread or from a sync handler's thread (an
    `enqueue` from a handler does not run until idle, eager or not); inside a trio test use
    `AsyncTestQueue` instead.
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
        """Describe the queue (arguments as for `AsyncTestQueue`); `start()` or `with`
        starts it."""
        self._options: dict[str, Any] = {
            "start": start,
            "eager": eager,
            "env": env,
            "shards": shards,
            "max_workers": max_workers,
            "pools": pools,
        }
        self.directory = Path(directory)
        self._queue: AsyncTestQueue | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the queue's trio run and its engine; return once it owns its shards.

        Raises:
            Whatever starting the engine raised (a directory that cannot hold a queue).
        """
        if self._thread is not None:
            raise RuntimeError("[Snerd] this TestQueue was already started; make a new one")
        if trio.lowlevel.in_trio_run():
            raise RuntimeError(
                "[Snerd] TestQueue blocks, and this thread runs trio: in a trio test use "
                "snerd.testing.AsyncTestQueue (with pytest-trio's mock_clock)"
            )
        self._thread = threading.Thread(target=self._host, name="snerd test queue", daemon=True)
        self._thread.start()
        self._started.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error

    def close(self) -> None:
        """Drain and stop the engine, end the run and its thread (idempotent).

        Raises:
            What the run ended with, if it failed.
        """
        thread = self._thread
        if thread is None or not thread.is_alive():
            return
        if self._token is not None and self._stop is not None:
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        thread.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _host(self) -> None:
        """The thread: one trio run on a MockClock, holding the queue until `close`."""
        try:
            trio.run(self._main, clock=trio.testing.MockClock())
        except BaseException as exc:
            self._error = exc
        finally:
            self._started.set()

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        queue = AsyncTestQueue(self.directory, **self._options)
        self._queue = queue
        async with queue:
            self._started.set()
            await self._stop.wait()

    def _call(self, fn: Callable[..., Awaitable[_T]], *args: Any, **kwargs: Any) -> _T:
        """Run `fn(*args, **kwargs)` in the queue's run; block until it returns."""
        if self._token is None or not self._started.is_set() or self._queue is None:
            raise RuntimeError("[Snerd] the TestQueue is not started: use `with` or start()")
        if trio.lowlevel.in_trio_run():
            raise RuntimeError(
                "[Snerd] TestQueue blocks, and this thread runs trio: in a trio test use "
                "snerd.testing.AsyncTestQueue (with pytest-trio's mock_clock)"
            )
        return trio.from_thread.run(functools.partial(fn, *args, **kwargs), trio_token=self._token)

    def _call_sync(self, fn: Callable[..., _T], *args: Any) -> _T:
        if self._token is None or self._queue is None:
            raise RuntimeError("[Snerd] the TestQueue is not started: use `with` or start()")
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    @property
    def queue(self) -> AsyncTestQueue:
        """The async queue this one drives (its `engine`, `mock_clock`)."""
        if self._queue is None:
            raise RuntimeError("[Snerd] the TestQueue is not started: use `with` or start()")
        return self._queue

    # ------------------------------------------------------------------ time

    def now(self) -> dt.datetime:
        """`AsyncTestQueue.now`: the virtual wall-clock time (UTC)."""
        return self._call_sync(self.queue.now)

    def run_until_idle(self) -> list[Run]:
        """`AsyncTestQueue.run_until_idle`: run what is due now; the calls made."""
        return self._call(self.queue.run_until_idle)

    def advance(
        self, *, days: float = 0, hours: float = 0, minutes: float = 0, seconds: float = 0
    ) -> list[Run]:
        """`AsyncTestQueue.advance`: move the virtual clock, running what comes due."""
        return self._call(
            self.queue.advance, days=days, hours=hours, minutes=minutes, seconds=seconds
        )

    # ------------------------------------------------------------------ handlers

    @property
    def runs(self) -> list[Run]:
        """Every handler call made through this queue so far."""
        return self.queue.runs

    def runs_of(self, task_id: str) -> list[Run]:
        """The handler calls (attempts) of one task, in order."""
        return self.queue.runs_of(task_id)

    def register_handler(self, task_type: str, handler: Callable[[Any], Any]) -> None:
        """`AsyncTestQueue.register_handler` (an async handler runs on the queue's trio run)."""
        self._call_sync(self.queue.register_handler, task_type, handler)

    def handler(self, task_type: str) -> Callable[[_F], _F]:
        """Decorator form of `register_handler`."""

        def register(fn: _F) -> _F:
            self.register_handler(task_type, fn)
            return fn

        return register

    def register_max_retry_handler(self, task_type: str, handler: Callable[..., Any]) -> None:
        """`AsyncTestQueue.register_max_retry_handler`."""
        self._call_sync(self.queue.register_max_retry_handler, task_type, handler)

    def max_retry_handler(self, task_type: str) -> Callable[[_F], _F]:
        """Decorator form of `register_max_retry_handler`."""

        def register(fn: _F) -> _F:
            self.register_max_retry_handler(task_type, fn)
            return fn

        return register

    # ------------------------------------------------------------------ calls

    def enqueue(
        self,
        task_id: str | None = None,
        task_type: str | None = None,
        data: Any = None,
        max_retries: int = 3,
        retry_after_hours: float = 0.0,
        **options: Any,
    ) -> Enqueued:
        """`AsyncTestQueue.enqueue` (the engine's arguments; eager: then runs until idle,
        except from a handler's thread)."""
        queue = self.queue
        if CURRENT_ATTEMPT.get() is not None:  # a handler's thread: never wait for idle
            return self._call(
                queue.engine.enqueue, task_id, task_type, data, max_retries,
                retry_after_hours, **options,
            )
        return self._call(
            queue.enqueue, task_id, task_type, data, max_retries, retry_after_hours, **options
        )

    def schedule(
        self, name: str, cron: str, task_type: str, data: Any = None, **options: Any
    ) -> Scheduled:
        """`AsyncTestQueue.schedule`."""
        return self._call(self.queue.schedule, name, cron, task_type, data, **options)

    def get(self, task_id: str) -> TaskDetails:
        """`AsyncTestQueue.get`: the task once nothing is under way."""
        return self._call(self.queue.get, task_id)

    def result(self, task_id: str) -> Any:
        """`AsyncTestQueue.result`: what its handler returned; never waits for the clock."""
        return self._call(self.queue.result, task_id)

    def dead_letters(self, task_type: str | None = None) -> list[FoundDeadLetter]:
        """`AsyncTestQueue.dead_letters`."""
        return self._call(self.queue.dead_letters, task_type)

    def __getattr__(self, name: str) -> Any:
        """The engine's other calls (`cancel`, `retry`, `pause`, `resume`, `stats`...),
        blocking; its other attributes as they are."""
        if name.startswith("_"):
            raise AttributeError(name)
        attribute = getattr(self.queue.engine, name)
        if not inspect.iscoroutinefunction(attribute):
            return attribute

        @functools.wraps(attribute)
        def blocking(*args: Any, **kwargs: Any) -> Any:
            return self._call(attribute, *args, **kwargs)

        return blocking

