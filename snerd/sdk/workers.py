"""Running handlers: the worker tasks that turn each `execute` into one attempt and its
`result`, and the calls of dead-letter handlers.

Owns: the queue of jobs (`execute` messages not started yet), the worker tasks that run them
and the idle ones kept for reuse, one attempt of a handler (async on the event loop, sync in a
worker thread or, isolated, in a child process of its own (`snerd.sdk.isolation`); in the
context of its own `CURRENT_ATTEMPT`; cut short after its `max_execution_seconds`), the thread
limit sync handlers share, and the `AttemptEnded` report of each attempt to its observers.

Jobs wait in one queue for a worker. A worker runs them one after another while they finish
without waiting (a handler that does not await anything); when one waits, another worker is
called for the jobs behind it. So no job ever waits for another's handler to finish, as if each
had a task of its own, and a burst of quick handlers costs one task wake-up, not one each.

A cancelled attempt (`stop`, on the daemon's `{"action":"cancel"}`) is stopped where it is:
not started yet, it never starts; running, the cancel scope of the worker that runs it is
cancelled, so an async handler gets the loop's cancellation where it awaits, and no `result`
is sent (the daemon has ended the attempt). A sync handler's thread cannot be stopped: it
runs to its end, unawaited (it no longer counts against the thread limit) and what it returns
is dropped; so after a timeout the daemon's retry may overlap it. A process-isolated one is
killed, and the attempt ends once its process is reaped: it is really stopped, on a cancel as
at its deadline, and a later attempt of the same task (the daemon's deadline passes a moment
before this process's) first stops the earlier one's process and starts after it is gone. A
worker's scope spans the jobs it runs in a row, not one job: a job that waits
keeps its worker to itself (the jobs behind it go to another), so the scope then stands for
that job alone, at no cost per job.

It must never: decide a retry (the SDK-side timeout only cuts the attempt short in this
process; the daemon decides what follows), block the event loop, or let a handler's exception
escape (it becomes the attempt's error text).
"""

from __future__ import annotations

import contextvars
import inspect
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping
from dataclasses import dataclass
from types import FunctionType
from typing import Any, TypeAlias

import anyio
import anyio.to_thread

from snerd.core.protocol import DEFAULT_RESULT_MAX_BYTES, timed_out
from snerd.sdk.context import CURRENT_ATTEMPT, RunningAttempt
from snerd.sdk.errors import FinalError
from snerd.sdk.isolation import AttemptProcessFailed, ChildAttempt, run_in_process
from snerd.sdk.messages import describe_error, parse_task_data, result_message, result_value
from snerd.sdk.signals import Signal

__all__ = ["AttemptEnded", "DeadLetterHandler", "Handler", "HandlerWorkers", "is_async"]

#: Timed-out task ids remembered for `timed_out_here` (a refusal comes within moments).
_TIMED_OUT_KEPT = 1024

#: A task handler: gets the parsed task data. Async functions run on the event loop; plain
#: functions run in a worker thread. Returning normally is success (what it returns, unless
#: None, is the task's stored result: JSON, within SNERD_RESULT_MAX_BYTES, or the attempt
#: fails); raising is a failed attempt.
Handler: TypeAlias = Callable[[Any], Any]
#: A dead-letter handler: gets the parsed task data, and the final error text when it takes a
#: second positional parameter.
DeadLetterHandler: TypeAlias = Callable[..., Any]


@dataclass(frozen=True, slots=True)
class AttemptEnded:
    """How one attempt ended in this process, for `QueueFace.on_attempt` (the worker
    command's log lines)."""

    task_id: str
    task_type: str
    #: As the `execute` said it (None from daemons that do not number attempts).
    attempt: int | None
    #: `succeeded`, `failed`, `timed out` (its `max_execution_seconds` passed), `cancelled`
    #: (the daemon's `cancel`), or `handed back` (this face stopped with it running: the
    #: daemon runs it again).
    outcome: str
    #: Seconds from its start here to its end.
    seconds: float
    #: The error text its `result` carried (None unless `failed` or `timed out`).
    error: str | None
    #: Where it ran: `loop` (an async handler), `thread` or `process`.
    isolation: str


def is_async(fn: Callable[..., Any]) -> bool:
    """Whether calling `fn` gives a coroutine (an async function, or an object with an async
    `__call__`)."""
    if type(fn) is FunctionType:  # the common case, decided as inspect would, only sooner
        return bool(fn.__code__.co_flags & inspect.CO_COROUTINE)
    call = getattr(fn, "__call__", None)  # noqa: B004 - an object with an async __call__
    return inspect.iscoroutinefunction(fn) or (
        call is not None and inspect.iscoroutinefunction(call)
    )


def _positional_arity(fn: Callable[..., Any]) -> int:
    """How many positional arguments `fn` accepts (a large number for `*args`)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 1
    count = 0
    for p in params:
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            return 1 << 16
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            count += 1
    return count


class _InContext:
    """Await `coro` with each of its steps run in `context`, as a task of its own would run it
    (what a handler sets in context variables stays its own), without the cost of a task.
    `on_suspend` is called each time `coro` waits (yields to the event loop)."""

    __slots__ = ("context", "coro", "on_suspend")

    def __init__(
        self,
        coro: Coroutine[Any, Any, Any],
        context: contextvars.Context,
        on_suspend: Callable[[], None],
    ) -> None:
        self.coro = coro
        self.context = context
        self.on_suspend = on_suspend

    def __await__(self) -> Generator[Any, Any, Any]:
        coro = self.coro
        run = self.context.run
        send = coro.send
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                if error is None:
                    signal = run(send, value)
                else:
                    signal = run(coro.throw, error)
            except StopIteration as stop:
                return stop.value
            error = None
            self.on_suspend()
            try:
                value = yield signal
            except GeneratorExit:
                run(coro.close)
                raise
            except BaseException as exc:
                value = None
                error = exc


class HandlerWorkers:
    """The worker tasks of one face, running its handlers.

    The face hands over each `execute` (`dispatch`) and each dead letter (`dead_letter`, in a
    task of its own) and says which event loop runs them (`bind_loop`); this posts the
    `result` of every attempt through `post`.
    """

    def __init__(
        self,
        handlers: Mapping[str, Handler],
        *,
        max_workers: int | None,
        post: Callable[[dict[str, Any]], None],
        spawn: Callable[..., None],
        log: Callable[[str], None],
        result_max_bytes: int = DEFAULT_RESULT_MAX_BYTES,
        isolation: Mapping[str, str] | None = None,
    ) -> None:
        """Workers for `handlers`; none runs until the first `dispatch`.

        Args:
            handlers: the registry's handlers by task type (read at each `execute`, so
                handlers registered later are found).
            max_workers: idle workers kept, and threads for sync handlers (default 100).
            post: sends one protocol message, on the event loop thread.
            spawn: starts `fn(*args)` as a task in the face's task group.
            log: reports what went wrong in this process (a malformed message, a failed
                dead-letter handler).
            result_max_bytes: the daemon's SNERD_RESULT_MAX_BYTES: a handler's return
                value larger than this fails its attempt before it is sent.
            isolation: `thread` or `process` by task type, for sync handlers (read at each
                `execute`); a type not in it runs as `default_isolation` says.
        """
        self._result_max_bytes = result_max_bytes
        self._handlers = handlers
        self._post = post
        self._spawn = spawn
        self._log = log
        self._thread_limit = max_workers or 100
        self._limiter: anyio.CapacityLimiter | None = None
        self._loop_thread: int | None = None
        #: Makes the wake-ups of idle workers (`bind_loop`).
        self._new_signal: Callable[[], Signal] = anyio.Event
        #: `execute` messages not started yet, each with the context it runs in, oldest first.
        self._jobs: deque[tuple[dict[str, Any], contextvars.Context]] = deque()
        #: A worker has been woken (or spawned) and has not run yet: it takes the next job.
        self._worker_coming = False
        #: How each idle worker is woken, the last one to go idle last.
        self._idle_workers: list[Signal] = []
        #: The scope of the worker running each attempt, by (task id, attempt) as its
        #: `execute` says them.
        self._running: dict[tuple[Any, Any], anyio.CancelScope] = {}
        #: How each attempt `stop` cancelled ended (`cancelled`, or `timed out` when a later
        #: attempt of its task superseded it), until its worker sees the cancellation.
        self._stopped: dict[tuple[Any, Any], str] = {}
        #: Isolation chosen per task type at registration (`thread` or `process`); types not
        #: in it use `default_isolation`, and None there means a thread.
        self._isolation = isolation if isolation is not None else {}
        self.default_isolation: str | None = None
        #: The child process of the process-isolated attempt of each task id, while it lives.
        self._children: dict[str, ChildAttempt] = {}
        #: Task ids whose attempt this process ended at its deadline, with a result sent
        #: that the daemon may refuse as late (`timed_out_here`); the latest few only.
        self._timed_out: dict[str, None] = {}
        #: Called with an `AttemptEnded` after every attempt (`QueueFace.on_attempt`).
        self._observers: list[Callable[[AttemptEnded], object]] = []

    def set_max_workers(self, max_workers: int) -> None:
        """Keep this many idle workers and threads for sync handlers (before the first job)."""
        self._thread_limit = max_workers

    def observe(self, observer: Callable[[AttemptEnded], object]) -> None:
        """Call `observer` (on the event loop; it must not block) after every attempt."""
        self._observers.append(observer)

    def bind_loop(self, loop_thread: int, new_signal: Callable[[], Signal]) -> None:
        """Handlers run on this thread's event loop, whose wake-ups `new_signal` makes."""
        self._loop_thread = loop_thread
        self._new_signal = new_signal

    def _call(self, fn: Callable[..., Any], *args: Any) -> Awaitable[Any]:
        """What to await to run `fn(*args)`: an async one on the loop (its own coroutine, no
        frame around it), a sync one in a worker thread (abandoned on cancel, so a stuck sync
        handler never holds up a shutdown)."""
        if is_async(fn):
            return fn(*args)  # type: ignore[no-any-return]
        return self._call_in_thread(fn, *args)

    async def _call_in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run `fn(*args)` in a worker thread (in a copy of this context, within the thread
        limit), and await what it returns if that is awaitable; return its value."""
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self._thread_limit)
        context = contextvars.copy_context()
        result = await anyio.to_thread.run_sync(
            context.run, fn, *args, abandon_on_cancel=True, limiter=self._limiter
        )
        if inspect.isawaitable(result):
            return await result
        return result

    # ------------------------------------------------------------------ execute

    def dispatch(self, message: dict[str, Any]) -> None:
        """Start running an `execute` now, as a task of its own would: in a copy of the
        current context, concurrently with every other one (see the module's header). As many
        idle workers as `max_workers` are kept."""
        self._jobs.append((message, contextvars.copy_context()))
        if not self._worker_coming:
            self._call_worker()

    def _call_worker(self) -> None:
        """Make sure a worker will take the next job: wake an idle one, or start one."""
        self._worker_coming = True
        if self._idle_workers:
            self._idle_workers.pop().set()
        else:
            self._spawn(self._worker)

    def _job_waits(self) -> None:
        """The job a worker runs waits (its handler awaits): the jobs behind it need another
        worker."""
        if self._jobs and not self._worker_coming:
            self._call_worker()

    async def _worker(self) -> None:
        """One worker task: run jobs while there are any, then idle until woken, or end when
        enough others idle already."""
        jobs = self._jobs
        idle = self._idle_workers
        job_waits = self._job_waits
        running = self._running
        wake: Signal | None = None
        try:
            while True:
                self._worker_coming = False  # this is the worker that was coming
                while jobs:
                    with anyio.CancelScope() as scope:
                        while jobs and not scope.cancel_called:
                            message, context = jobs.popleft()
                            key = (message.get("task_id"), message.get("attempt"))
                            running[key] = scope
                            try:
                                await _InContext(self._execute(message), context, job_waits)
                            finally:
                                if running.get(key) is scope:
                                    del running[key]
                if len(idle) >= self._thread_limit:
                    return  # enough idle ones (the daemon runs at most max_workers at once)
                wake = self._new_signal()
                idle.append(wake)
                await wake.wait()
        finally:
            if wake is not None and wake in idle:
                idle.remove(wake)

    def _note_timed_out(self, task_id: str) -> None:
        """Remember that this attempt's result is a timeout the daemon may have decided
        first (a bounded memory: the oldest are forgotten)."""
        timed = self._timed_out
        timed.pop(task_id, None)
        timed[task_id] = None
        if len(timed) > _TIMED_OUT_KEPT:
            del timed[next(iter(timed))]

    def timed_out_here(self, task_id: str) -> bool:
        """Whether the daemon's refusal of a `result` of `task_id` as unknown is the late
        timeout result of an attempt this process ended at its deadline (then it is
        expected, and forgotten now)."""
        if task_id not in self._timed_out:
            return False
        del self._timed_out[task_id]
        return True

    def stop(self, task_id: str, attempt: int | None) -> None:
        """The daemon ended this attempt (a cancel): drop it if it has not started, or
        cancel the scope of the worker running it (see the module's header)."""
        key = (task_id, attempt)
        scope = self._running.pop(key, None)
        if scope is not None:
            self._stopped.setdefault(key, "cancelled")
            scope.cancel()
            return
        for job in self._jobs:
            message = job[0]
            if message.get("task_id") == task_id and message.get("attempt") == attempt:
                self._jobs.remove(job)
                return

    async def _execute(self, message: dict[str, Any]) -> None:
        """Run one attempt of the `execute` in `message` and post its `result`."""
        task_id = message.get("task_id")
        task_type = message.get("task_type")
        if not isinstance(task_id, str) or not isinstance(task_type, str):
            self._log(f"ignored a malformed execute message: {message!r}")
            return
        attempt = message.get("attempt")
        attempt = attempt if type(attempt) is int else None  # (JSON numbers: int or float)
        limit = message.get("max_execution_seconds")
        limit = limit if type(limit) is int or type(limit) is float else None
        error: str | None = None
        final = False
        value: Any = None
        observed = bool(self._observers)
        started = time.monotonic() if observed else 0.0
        outcome = "failed"
        where = "loop"
        handler = self._handlers.get(task_type)
        if handler is None:
            error = f"No handler registered for task type '{task_type}'."
        else:
            data = parse_task_data(message.get("task_data"))
            assert self._loop_thread is not None
            running = RunningAttempt(
                task_id,
                task_type,
                attempt,
                None if limit is None else int(limit),
                self._post,
                self._loop_thread,
            )
            call: Awaitable[Any]
            if is_async(handler):
                call = handler(data)
            elif (self._isolation.get(task_type) or self.default_isolation) == "process":
                where = "process"
                call = self._call_in_process(handler, data, running)
            else:
                where = "thread"
                call = self._call_in_thread(handler, data)
            token = CURRENT_ATTEMPT.set(running)
            try:
                if limit is None:
                    value = await call
                else:
                    with anyio.move_on_after(limit) as scope:
                        value = await call
                    if scope.cancelled_caught:
                        error = timed_out(int(limit))
                        outcome = "timed out"
                        self._note_timed_out(task_id)
            except AttemptProcessFailed as exc:
                error, final = exc.text, exc.final
            except FinalError as exc:
                error, final = str(exc) or "FinalError", True
            except Exception as exc:
                error = describe_error(exc)
            except BaseException:
                # Cancelled: stopped (`stop`), or the face is going away with it running.
                ended = self._stopped.pop((task_id, attempt), "handed back")
                if observed:
                    # (`timed out`: superseded by the next attempt, the daemon's deadline
                    # having passed first.)
                    said = timed_out(int(limit)) if ended == "timed out" and limit else None
                    self._ended(task_id, task_type, attempt, ended, started, said, where)
                raise
            finally:
                CURRENT_ATTEMPT.reset(token)
            if error is None:
                value, error = result_value(task_id, value, self._result_max_bytes)
                if error is None:
                    outcome = "succeeded"
        self._post(result_message(task_id, error, attempt, value, retry=not final))
        if observed:
            self._ended(task_id, task_type, attempt, outcome, started, error, where)

    async def _call_in_process(
        self, handler: Handler, data: Any, running: RunningAttempt
    ) -> Any:
        """Run `handler(data)` in a child process (`snerd.sdk.isolation`), after the process
        of any earlier attempt of the same task: the daemon sent this attempt, so it has ended
        that one (its deadline passed there first), which is stopped now and waited for."""
        task_id = running.task_id
        prior = self._children.get(task_id)
        if prior is not None:
            # (The same attempt number twice, or none said: not this one's to stop; it waits.)
            if prior.attempt != running.attempt:
                if (task_id, prior.attempt) in self._running:
                    self._stopped[(task_id, prior.attempt)] = "timed out"
                self.stop(task_id, prior.attempt)
            await prior.reaped.wait()
        child = ChildAttempt(running.attempt)
        self._children[task_id] = child
        try:
            return await run_in_process(handler, data, running, child)
        finally:
            if self._children.get(task_id) is child:
                del self._children[task_id]

    def _ended(
        self,
        task_id: str,
        task_type: str,
        attempt: int | None,
        outcome: str,
        started: float,
        error: str | None,
        where: str,
    ) -> None:
        """Tell the observers how an attempt ended."""
        ended = AttemptEnded(
            task_id, task_type, attempt, outcome, time.monotonic() - started, error, where
        )
        for observer in list(self._observers):
            try:
                observer(ended)
            except Exception as exc:
                self._log(f"attempt observer {observer!r} failed: {describe_error(exc)}")

    # ------------------------------------------------------------------ dead letters

    async def dead_letter(self, handler: DeadLetterHandler, message: dict[str, Any]) -> None:
        """Call `handler` for the `max_retries_reached` in `message` (with the final error
        text when it takes a second positional parameter); log what it raises."""
        data = parse_task_data(message.get("task_data"))
        args: tuple[Any, ...] = (data,)
        if _positional_arity(handler) >= 2:
            error = message.get("error")
            args = (data, error if isinstance(error, str) else None)
        try:
            await self._call(handler, *args)
        except Exception as exc:
            self._log(
                f"Error in max retry handler for task {message.get('task_id')}: "
                f"{describe_error(exc)}"
            )
