"""Handler plumbing shared by the two public faces, `SnerdQueue` (the SDK that spawns the daemon)
and `Engine` (the same queue in-process).

Owns: the handler registry (handlers, dead-letter handlers, progress callbacks), running one
attempt of a handler (async or sync, with the SDK-side timeout) and turning its outcome into a
`result` message, building the `enqueue` message both faces send, matching the daemon's `ack` /
`error` / `stats` replies to the calls waiting for them, the per-task context behind
`yield_progress` and `current_task`, and the public exceptions.

Both faces speak the wire protocol (PROTOCOL.md) as plain dicts: the SDK writes them to the
daemon's stdin, the engine hands them to its in-process runtime. So a face only has to say how a
message goes out (`_post`) and where a handler task runs (`_spawn`); everything else lives here
and behaves the same in both.

It must never: block the event loop (sync handlers run in worker threads), decide anything about
the queue (retries, ordering, dedupe are the daemon's), or touch the daemon's files.
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime as dt
import inspect
import json
import math
import re
import sys
import threading
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import repeat
from json.encoder import (  # type: ignore[attr-defined]
    JSONEncoder,
    c_make_encoder,
    encode_basestring_ascii,
)
from operator import is_not
from pathlib import Path
from types import FunctionType, TracebackType
from typing import Any, Protocol, Self, TypeAlias, TypeVar

import anyio
import anyio.abc
import anyio.from_thread
import anyio.to_thread
import orjson
import sniffio

from snerd.core.protocol import ENQUEUE_OPTIONS, failed_to_enqueue
from snerd.core.slots import slot_constructor

__all__ = [
    "DaemonExited",
    "DeadLetterHandler",
    "DuplicateTaskId",
    "EnqueueError",
    "Enqueued",
    "Handler",
    "ProgressCallback",
    "QueueNotRunning",
    "SnerdError",
    "TaskInfo",
    "build_enqueue_message",
    "current_task",
    "parse_task_data",
    "yield_progress",
]

#: A task handler: gets the parsed task data. Async functions run on the event loop; plain
#: functions run in a worker thread. Returning normally is success; raising is a failed attempt.
Handler: TypeAlias = Callable[[Any], Any]
#: A dead-letter handler: gets the parsed task data, and the final error text when it takes a
#: second positional parameter.
DeadLetterHandler: TypeAlias = Callable[..., Any]
#: A progress observer: `(task_id, data)`; sync or async.
ProgressCallback: TypeAlias = Callable[[str, Any], Any]

F = TypeVar("F", bound=Callable[..., Any])

#: The text the SDK reports for an attempt it cut short (the same text the daemon uses).
TIMED_OUT = "Task execution timed out after {seconds} seconds"
#: Prefix of the daemon's error for a `result` that matched no running attempt. Such an error
#: carries a task id but is never the answer to an enqueue.
_UNKNOWN_RESULT = "Received result for unknown/expired task_id"
#: Grace after the drain timeout before `shutdown` stops a daemon or runtime that has not
#: exited (kills the daemon, cancels the runtime).
_EXIT_GRACE_S = 5.0


# --- errors ------------------------------------------------------------------------------------


class SnerdError(RuntimeError):
    """Base of every error snerd's SDK and engine raise.

    A `RuntimeError` subclass, because the upstream Python SDK raised plain `RuntimeError` and
    code written for it catches that.

    Attributes:
        message: the text, for an `EnqueueError` exactly the daemon's.
        task_id: the task concerned, when there is one.
    """

    def __init__(self, message: str, *, task_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.task_id = task_id


class EnqueueError(SnerdError):
    """The daemon refused an enqueue (bad input, shutting down, disk full...); `message` is the
    daemon's `error` text, e.g. `Failed to enqueue: max_retries must be 0 or more, got -1`."""


class DaemonExited(SnerdError):
    """The daemon (or the engine's runtime) stopped before it answered."""


class QueueNotRunning(SnerdError):
    """The queue was never started, is shutting down, or has stopped."""


class DuplicateTaskId(SnerdError):
    """An enqueue with this task id is already waiting for its ack in this process. (Upstream
    SDKs silently dropped one of the two answers; the daemon itself refuses an id that is still
    pending once the first one is stored.)"""


# --- values ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Enqueued:
    """What an acknowledged enqueue returns: the record is durable (or was deduplicated)."""

    task_id: str
    #: The shard the task went to (`"shard-N"`), when the daemon says.
    shard: str | None = None
    #: True when `auto_dedupe` dropped it because an identical task is still pending.
    deduplicated: bool = False


#: `Enqueued(task_id, shard, deduplicated)`, built without the frozen `__init__`'s calls.
_new_enqueued = slot_constructor(Enqueued, "task_id", "shard", "deduplicated")


@dataclass(frozen=True, slots=True)
class TaskInfo:
    """The attempt a handler is running, from `current_task()`."""

    task_id: str
    task_type: str
    #: 1 for the first attempt; None when the daemon did not say (upstream daemons).
    attempt: int | None = None
    max_execution_seconds: int | None = None


class _Running:
    """The attempt a handler runs, as `current_task()` and `yield_progress` find it. Its
    `TaskInfo` is made only when asked for (a frozen dataclass costs a call per field, on
    every `execute`)."""

    __slots__ = ("attempt", "face", "limit", "loop_thread", "task_id", "task_type")

    def __init__(
        self,
        task_id: str,
        task_type: str,
        attempt: int | None,
        limit: int | None,
        face: _QueueFace,
        loop_thread: int,
    ) -> None:
        self.task_id = task_id
        self.task_type = task_type
        self.attempt = attempt
        self.limit = limit
        self.face = face
        self.loop_thread = loop_thread

    @property
    def info(self) -> TaskInfo:
        return TaskInfo(self.task_id, self.task_type, self.attempt, self.limit)


_CURRENT: contextvars.ContextVar[_Running | None] = contextvars.ContextVar(
    "snerd_current_task", default=None
)


def current_task() -> TaskInfo:
    """The task whose handler is calling.

    Raises:
        RuntimeError: called outside a task handler.
    """
    running = _CURRENT.get()
    if running is None:
        raise RuntimeError("[Snerd] current_task() must be called within a task handler")
    return running.info


def yield_progress(data: Any) -> None:
    """Report progress of the running task; observers see it through `on_progress`.

    Works from async handlers and from sync handlers (in their worker thread). `data` is any
    JSON value; snerd passes it on unchanged (upstream daemons accept only strings).

    Raises:
        RuntimeError: called outside a task handler.
    """
    running = _CURRENT.get()
    if running is None:
        raise RuntimeError("[Snerd] yield_progress must be called within a task handler context.")
    message = {"action": "progress", "task_id": running.task_id, "data": data}
    if threading.get_ident() == running.loop_thread:
        running.face._post(message)
    else:
        anyio.from_thread.run_sync(running.face._post, message)


# --- messages ----------------------------------------------------------------------------------


#: A run of digits that may be an integer beyond 64 bits, which orjson would read as a float
#: where `json.loads` gives an int (a run inside a string also sends the text to `json.loads`).
_LONG_DIGITS = re.compile(r"[0-9]{19}")


def parse_task_data(raw: Any) -> Any:
    """Task data as handlers get it: JSON text parsed, anything else (or text that is not JSON)
    passed as it is, like upstream SDKs.

    The value is exactly `json.loads`'s: orjson parses the text when that is certain to give
    the same value (it refuses what `json.loads` alone accepts, NaN, Infinity, lone
    surrogates, deep nesting, and then `json.loads` decides), else `json.loads` does."""
    if isinstance(raw, str):
        if _LONG_DIGITS.search(raw) is None:
            try:
                return orjson.loads(raw)
            except ValueError:
                pass
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


#: `json.dumps`'s own C encoder with its default arguments, made once: `json.dumps` makes a
#: new one on every call, which is most of its cost for a small value. No cycle check; a
#: value it cannot encode goes to `json.dumps`, which says what is wrong.
_C_ENCODER = (
    None
    if c_make_encoder is None
    else c_make_encoder(
        None, JSONEncoder().default, encode_basestring_ascii, None, ": ", ", ", False, False, True
    )
)


def _json_text(data: Any) -> str:
    """`json.dumps(data)`, exactly (default separators, ASCII only, NaN allowed), faster."""
    if _C_ENCODER is not None:
        try:
            return "".join(_C_ENCODER(data, 0))
        except (TypeError, ValueError, RecursionError):
            pass  # (a cycle ends in RecursionError without the check)
    return json.dumps(data)


def _format_execute_at(value: str | dt.datetime | dt.timedelta) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dt.timedelta):
        value = dt.datetime.now(dt.UTC) + value
    # A naive datetime is local time (datetime.astimezone's rule), never silently UTC.
    moment = value.astimezone(dt.UTC)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


def build_enqueue_message(
    task_id: str,
    task_type: str,
    data: Any,
    max_retries: int,
    retry_after_hours: float,
    options: Mapping[str, Any],
) -> dict[str, Any]:
    """The `enqueue` message, as the upstream Python SDK builds it.

    `options` are the other arguments of `_QueueFace.enqueue` by name, in its order; those
    that are None are left out. `execute_at` is written as RFC 3339 (a datetime or a timedelta
    from now) and `trigger_after_ids` as a list. `data` is serialized with `json.dumps` and its
    default separators, exactly as upstream did, so `auto_dedupe` fingerprints match tasks
    enqueued by the upstream SDK. Values are not checked here: the daemon validates them, so
    the error texts are the daemon's. Except a NaN or an infinity, which JSON cannot carry
    (orjson writes null, which the daemon would read as "absent": urgency 0): refused here,
    in the daemon's words.

    Raises:
        EnqueueError: `retry_after_hours` or `urgency_score` is not finite.
    """
    for name, number in (
        ("retry_after_hours", retry_after_hours),
        ("urgency_score", options.get("urgency_score")),
    ):
        if type(number) is float and not math.isfinite(number):
            raise EnqueueError(
                failed_to_enqueue(f"{name} must be a finite number, got {number}"), task_id=task_id
            )
    message: dict[str, Any] = {
        "action": "enqueue",
        "task_id": task_id,
        "task_type": task_type,
        "task_data": _json_text(data),
        "max_retries": max_retries,
        "retry_after_hours": retry_after_hours,
    }
    for key, value in options.items():
        if value is None:
            continue
        if key == "execute_at":
            value = _format_execute_at(value)
        elif key == "trigger_after_ids":
            value = list(value)
        message[key] = value
    return message


def _is_async(fn: Callable[..., Any]) -> bool:
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


def _describe(exc: BaseException) -> str:
    text = str(exc)
    name = type(exc).__name__
    described = f"{name}: {text}" if text else name
    # A lone surrogate (a file name decoded with surrogateescape, say) cannot be sent as JSON:
    # the result would never leave the SDK. It is written as its escape instead.
    return described.encode("utf-8", "backslashreplace").decode("utf-8")


class _Signal(Protocol):
    """A one-shot wake-up of one waiting task, on the event loop's thread (`anyio.Event`'s
    interface)."""

    def set(self) -> None: ...

    def wait(self) -> Awaitable[Any]: ...


class _FutureSignal:
    """`_Signal` on asyncio: a bare future. Each enqueue and each `execute` waits on one, and
    `anyio.Event` puts two layers and a look-up of the running library in front of the same
    future (about a fifth of the SDK's CPU per job)."""

    __slots__ = ("_future",)

    def __init__(self, future: asyncio.Future[None]) -> None:
        self._future = future

    def set(self) -> None:
        if not self._future.done():  # (done too when its waiter was cancelled)
            self._future.set_result(None)

    def wait(self) -> Awaitable[None]:
        return self._future


def _signal_factory() -> Callable[[], _Signal]:
    """How the running event loop makes a `_Signal`: a bare future on asyncio, `trio.Event`
    (which `anyio.Event` wraps) on trio. Call on the loop's thread."""
    if sniffio.current_async_library() == "asyncio":
        create_future = asyncio.get_running_loop().create_future
        return lambda: _FutureSignal(create_future())
    import trio

    return trio.Event


class _Waiter:
    """One call waiting for the daemon's answer."""

    __slots__ = ("abandoned", "error", "event", "value")

    def __init__(self, event: _Signal) -> None:
        self.event = event
        self.value: Any = None
        self.error: SnerdError | None = None
        self.abandoned = False

    def resolve(self, value: Any) -> None:
        self.value = value
        self.event.set()

    def fail(self, error: SnerdError) -> None:
        self.error = error
        self.event.set()


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


# --- the shared face ---------------------------------------------------------------------------


@dataclass
class _Registry:
    handlers: dict[str, Handler] = field(default_factory=dict)
    dead_letter: dict[str, DeadLetterHandler] = field(default_factory=dict)
    progress: list[ProgressCallback] = field(default_factory=list)


class _QueueFace:
    """Everything the SDK and the engine share; subclasses say how messages go out and what
    runs behind them.

    Subclasses implement `_post` (send one protocol message; called on the event loop thread;
    must not block), `_serve` (run the daemon or runtime: call `_bind_loop` first, `_exited` once
    there is something that will exit and `_tg` to the task group handler tasks run in; call
    `_accept_enqueues()` and `task_status.started()` once it is up; return when it has exited,
    with `exit_code` and `_exited` set), `_begin_drain` and `_stop_now` (how `shutdown` asks it
    to drain and, when that takes too long, stops it), and may override `_log`. They set
    `_drain_timeout_s`, call `_on_message` for every message from the daemon and `_fail_all`
    when it is gone, and keep `_accepting` true while enqueues may be sent.

    The lifecycle is shared: `_start` (behind the subclass's public `start_listening` /
    `start`) hosts `_serve` in the background, `async with` hosts it in a task group around the
    block, and `_shutdown` (behind `shutdown`) drains and waits for either.
    """

    #: Printed before log lines this face writes to stderr.
    _log_prefix = "[snerd] "
    #: The class name errors use ("this SnerdQueue was already started").
    _face_name = "queue face"
    #: What refused enqueues call it ("[Snerd] Queue is shutting down; ...").
    _noun = "Queue"
    #: Seconds in-flight tasks get at shutdown (the face's SNERD_DRAIN_TIMEOUT).
    _drain_timeout_s: float

    def __init__(self, *, max_workers: int | None = None) -> None:
        self._registry = _Registry()
        self._pending: dict[str, _Waiter] = {}
        self._stats_waiters: deque[_Waiter] = deque()
        self._progress_backlog: deque[tuple[Any, Any]] = deque()
        self._progress_draining = False
        self._accepting = False
        self._stopped_error: SnerdError | None = None
        self._loop_thread: int | None = None
        #: Makes the wake-ups of waiting calls and workers (`_bind_loop`).
        self._new_signal: Callable[[], _Signal] = anyio.Event
        self._thread_limit = max_workers or 100
        self._limiter: anyio.CapacityLimiter | None = None
        #: The daemon's last `membership` message (which shards this daemon owns), if any.
        self.membership: dict[str, Any] | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        #: `execute` messages not started yet, each with the context it runs in, oldest first.
        self._jobs: deque[tuple[dict[str, Any], contextvars.Context]] = deque()
        #: A worker has been woken (or spawned) and has not run yet: it takes the next job.
        self._worker_coming = False
        #: How each idle worker is woken, the last one to go idle last.
        self._idle_workers: list[_Signal] = []
        self._outer: anyio.abc.TaskGroup | None = None
        self._background: _Background | None = None
        self._started = False
        self._shutting_down = False
        self._exited: anyio.Event | None = None
        #: The dashboard `start_dashboard` serves, if any (snerd.dashboard.serve).
        self._dashboard: Any = None
        #: The exit code of the daemon (negative: killed by that signal) or of the engine's
        #: runtime, once it has exited.
        self.exit_code: int | None = None

    # ------------------------------------------------------------------ for subclasses

    def _post(self, message: dict[str, Any]) -> None:
        raise NotImplementedError

    async def _serve(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        raise NotImplementedError

    def _begin_drain(self) -> None:
        """Ask the daemon or runtime to drain and exit (once, from `shutdown`)."""
        raise NotImplementedError

    def _stop_now(self, waited: float) -> None:
        """It has not exited `waited` seconds into the shutdown: say so, and stop it now."""
        raise NotImplementedError

    def _bind_loop(self) -> None:
        """`_serve` runs on this thread and event loop (call it first thing)."""
        self._loop_thread = threading.get_ident()
        self._new_signal = _signal_factory()

    def _spawn(self, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        assert self._tg is not None
        self._tg.start_soon(fn, *args)

    def _log(self, text: str) -> None:
        print(f"{self._log_prefix}{text}", file=sys.stderr, flush=True)

    def _not_running_error(self) -> SnerdError:
        if self._stopped_error is not None:
            return self._stopped_error
        return QueueNotRunning(
            "[Snerd] Cannot enqueue task: Queue is not running. Call start_listening() first."
        )

    def _fail_all(self, error: SnerdError) -> None:
        """The daemon is gone: every waiting call fails now instead of hanging."""
        self._accepting = False
        self._stopped_error = error
        pending, self._pending = self._pending, {}
        for task_id, waiter in pending.items():
            waiter.fail(type(error)(error.message, task_id=task_id))
        while self._stats_waiters:
            self._stats_waiters.popleft().fail(error)

    # ------------------------------------------------------------------ lifecycle

    def _claim_start(self) -> None:
        if self._started:
            raise RuntimeError(
                f"[Snerd] this {self._face_name} was already started; make a new one"
            )
        self._started = True

    async def _start(self) -> None:
        """Host `_serve` in the background; return once it has started (upstream's
        unstructured `await start_listening()` ... `await shutdown()` lifecycle)."""
        self._claim_start()
        self._background = _Background()
        await self._background.start(self._serve)

    async def __aenter__(self) -> Self:
        self._claim_start()
        outer = anyio.create_task_group()
        await outer.__aenter__()
        try:
            await outer.start(self._serve)
        except BaseException:
            if not await outer.__aexit__(*sys.exc_info()):
                raise
        self._outer = outer
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._outer is not None
        try:
            # Bounded (drain timeout + grace, then stopped): safe to shield.
            with anyio.CancelScope(shield=True):
                await self._shutdown()
        finally:
            # Everything has stopped; the body's own exception (if any) propagates as it is,
            # not wrapped in the task group's ExceptionGroup.
            await self._outer.__aexit__(None, None, None)
        return None

    async def _shutdown(self, timeout: float | None = None) -> int | None:
        """Refuse new enqueues, start the drain, wait for the exit (stopping it after
        `timeout` seconds, default the drain timeout + 5 s), then stop the dashboard; the exit
        code (None if nothing was started)."""
        try:
            return await self._drain_and_wait(timeout)
        finally:
            if self._dashboard is not None:
                dashboard, self._dashboard = self._dashboard, None
                await dashboard.aclose()

    async def _drain_and_wait(self, timeout: float | None) -> int | None:
        if self._exited is None:
            return None
        if not self._shutting_down:
            self._shutting_down = True
            self._accepting = False
            if self._stopped_error is None:
                self._stopped_error = QueueNotRunning(
                    f"[Snerd] {self._noun} is shutting down; enqueue rejected."
                )
            self._begin_drain()
        limit = self._drain_timeout_s + _EXIT_GRACE_S if timeout is None else timeout
        with anyio.move_on_after(limit):
            await self._exited.wait()
        if not self._exited.is_set():
            self._stop_now(limit)
            await self._exited.wait()
        if self._background is not None and self._background.done is not None:
            await self._background.done.wait()
        self._stopped_error = QueueNotRunning(f"[Snerd] {self._noun} has been shut down.")
        return self.exit_code

    def _accept_enqueues(self) -> None:
        """The daemon or runtime is up: enqueues may be sent; register every handler so far."""
        self._accepting = True
        for task_type in self._registry.handlers:
            self._post({"action": "register", "task_type": task_type})

    # ------------------------------------------------------------------ handler registry

    def _registered(self, task_type: str) -> None:
        """A handler for `task_type` was registered: tell the daemon when it runs."""
        if self._accepting:
            self._post({"action": "register", "task_type": task_type})

    def register_handler(self, task_type: str, handler: Handler) -> None:
        """Run `handler(data)` for every task of `task_type`.

        Args:
            task_type: the task type, as given to `enqueue`.
            handler: an async function (runs on the event loop) or a plain function (runs in a
                worker thread). It gets the task data parsed from JSON. Returning is success;
                raising fails the attempt with `"<ExceptionType>: <message>"` as its error.
        """
        self._registry.handlers[task_type] = handler
        self._registered(task_type)

    def register_max_retry_handler(self, task_type: str, handler: DeadLetterHandler) -> None:
        """Call `handler(data)` when a task of `task_type` has used all its attempts.

        Args:
            task_type: the task type.
            handler: async or plain function; gets the parsed task data, and, if it takes a
                second positional parameter, the final error text (or None).
        """
        self._registry.dead_letter[task_type] = handler

    def handler(self, task_type: str) -> Callable[[F], F]:
        """Decorator form of `register_handler`: `@q.handler("email")`."""

        def register(fn: F) -> F:
            self.register_handler(task_type, fn)
            return fn

        return register

    def max_retry_handler(self, task_type: str) -> Callable[[F], F]:
        """Decorator form of `register_max_retry_handler`."""

        def register(fn: F) -> F:
            self.register_max_retry_handler(task_type, fn)
            return fn

        return register

    def _dashboard_directory(self) -> Path:
        """The queue directory behind this face."""
        raise NotImplementedError

    async def start_dashboard(
        self, port: int = 8642, *, host: str = "127.0.0.1", token: str | None = None
    ) -> str:
        """Serve the dashboard of this queue's directory (the page and API of `snerdmq
        dashboard`, docs/operations.md) on this event loop, with a live console of the
        progress messages this queue's handlers report, until `shutdown()`. Returns its URL.

        Args:
            port: the port (0: any free one; the URL says which).
            host: the address; anything but loopback needs a token.
            token: required on every request (default: SNERD_DASHBOARD_TOKEN, if set).

        Raises:
            ValueError: an address other than loopback without a token, or an empty token.
            OSError: the address cannot be listened on.
            RuntimeError: a dashboard is already served.
        """
        from snerd.dashboard.serve import EmbeddedDashboard, check_exposure

        token = check_exposure(host, token)
        if self._dashboard is not None:
            raise RuntimeError(f"[Snerd] a dashboard is already served at {self._dashboard.url}")
        dashboard = EmbeddedDashboard()
        url = await dashboard.start(
            self._dashboard_directory(),
            host=host,
            port=port,
            token=token,
            observe_progress=self.on_progress,
            spawn=_Background().start,
        )
        self._dashboard = dashboard
        return url

    def on_progress(self, callback: ProgressCallback) -> ProgressCallback:
        """Observe `progress` messages: `callback(task_id, data)`, sync or async, called on the
        event loop in the order the messages came (so a sync one must not block). Usable as a
        decorator. Progress is a live stream; nothing is stored."""
        self._registry.progress.append(callback)
        return callback

    def yield_progress(self, data: Any) -> None:
        """Report progress of the task whose handler is calling (see `snerd.yield_progress`)."""
        yield_progress(data)

    async def yield_progress_async(self, data: Any) -> None:
        """Async spelling of `yield_progress` (upstream has both)."""
        yield_progress(data)

    # ------------------------------------------------------------------ calls

    async def enqueue(
        self,
        task_id: str | None = None,
        task_type: str | None = None,
        data: Any = None,
        max_retries: int = 3,
        retry_after_hours: float = 0.0,
        rate_limit_group: str | None = None,
        max_per_minute: int | None = None,
        auto_dedupe: bool | None = None,
        urgency_score: float | None = None,
        execute_at: str | dt.datetime | dt.timedelta | None = None,
        cron: str | None = None,
        webhook_url: str | None = None,
        max_execution_seconds: int | None = None,
        pool: str | None = None,
        trigger_after_ids: Iterable[str] | None = None,
    ) -> Enqueued:
        """Store a task and return once the daemon says it is durable.

        Arguments keep the upstream SDK's names and order. Values are checked by the daemon.

        Args:
            task_id: unique id; None makes one (uuid4 hex). A finished task's id may be reused.
            task_type: which handler runs it (required).
            data: any JSON-serializable value; the handler gets it back parsed.
            max_retries: retries after the first attempt (at most `1 + max_retries` runs).
            retry_after_hours: wait between attempts.
            rate_limit_group: name of a group limited to `max_per_minute` dispatches a minute.
            max_per_minute: the group's limit (needs `rate_limit_group`).
            auto_dedupe: drop this task if an identical one (same type and data) is pending.
            urgency_score: higher runs first; equal scores run in enqueue order.
            execute_at: not before this time: an RFC 3339 string, a datetime (a naive one is
                local time) or a timedelta from now.
            cron: recurring schedule (5 or 6 fields, or `30s`, `5m`, `1h`, `1d`).
            webhook_url: POST the task to this URL instead of running a handler.
            max_execution_seconds: hard timeout per attempt (enforced here and by the daemon).
            pool: worker pool name (`SNERD_POOLS` limits its concurrency).
            trigger_after_ids: run only after all these tasks completed.

        Returns:
            `Enqueued(task_id, shard, deduplicated)`.

        Raises:
            EnqueueError: the daemon refused it; `message` is its text.
            DuplicateTaskId: an enqueue with this id is still waiting for its ack here.
            DaemonExited: the daemon stopped before answering.
            QueueNotRunning: not started, or shutting down.
        """
        if task_type is None:
            raise TypeError("enqueue() needs a task_type")
        if task_id is None:
            task_id = uuid.uuid4().hex
        given = (
            rate_limit_group,
            max_per_minute,
            auto_dedupe,
            urgency_score,
            execute_at,
            cron,
            webhook_url,
            max_execution_seconds,
            pool,
            trigger_after_ids,
        )
        # (Most enqueues set none of them: no dict to build and walk then. By identity: a value
        # such as an array may not compare with None.)
        options = (
            dict(zip(ENQUEUE_OPTIONS, given, strict=True))
            if any(map(is_not, given, repeat(None)))
            else {}
        )
        message = build_enqueue_message(
            task_id, task_type, data, max_retries, retry_after_hours, options
        )
        if not self._accepting:
            raise self._not_running_error()
        if task_id in self._pending:
            raise DuplicateTaskId(
                f"[Snerd] An enqueue of task '{task_id}' is already waiting for its ack",
                task_id=task_id,
            )
        waiter = _Waiter(self._new_signal())
        self._pending[task_id] = waiter
        try:
            self._post(message)
            await waiter.event.wait()
        finally:
            if self._pending.get(task_id) is waiter:
                del self._pending[task_id]
        if waiter.error is not None:
            raise waiter.error
        result: Enqueued = waiter.value
        return result

    async def stats(self, timeout: float | None = 10.0) -> dict[str, Any]:
        """Ask the daemon for its counters (`{"action":"stats"}`) and return the reply.

        Raises:
            TimeoutError: no reply within `timeout` seconds.
            DaemonExited, QueueNotRunning: no daemon to ask.
        """
        if self._stopped_error is not None or self._loop_thread is None:
            raise self._not_running_error()
        waiter = _Waiter(self._new_signal())
        self._stats_waiters.append(waiter)
        self._post({"action": "stats"})
        try:
            with anyio.fail_after(timeout):
                await waiter.event.wait()
        finally:
            # Replies come in request order: an abandoned request still takes its reply.
            waiter.abandoned = True
        if waiter.error is not None:
            raise waiter.error
        reply: dict[str, Any] = waiter.value
        return reply

    # ------------------------------------------------------------------ daemon messages

    def _on_message(self, message: dict[str, Any]) -> None:
        """Handle one message from the daemon (on the event loop thread)."""
        action = message.get("action")
        if action == "execute":
            self._dispatch_execute(message)
        elif action == "ack":
            task_id = message.get("task_id")
            waiter = self._pending.pop(task_id, None) if isinstance(task_id, str) else None
            if waiter is not None:
                shard = message.get("shard")
                waiter.resolve(
                    _new_enqueued(
                        task_id,
                        shard if isinstance(shard, str) else None,
                        message.get("deduplicated") is True,
                    )
                )
        elif action == "error":
            self._on_error(message)
        elif action == "max_retries_reached":
            task_type = message.get("task_type")
            handler = (
                self._registry.dead_letter.get(task_type) if isinstance(task_type, str) else None
            )
            if handler is None:
                self._log(
                    f"Dead Letter Queue: Task {message.get('task_id')} ({task_type}) "
                    f"permanently failed: {message.get('error')}"
                )
            else:
                self._spawn(self._dead_letter, handler, message)
        elif action == "progress":
            if self._registry.progress:
                self._progress_backlog.append((message.get("task_id"), message.get("data")))
                if not self._progress_draining:
                    self._progress_draining = True
                    self._spawn(self._drain_progress)
        elif action == "stats":
            # Replies come in request order; a request that gave up still takes its reply.
            if self._stats_waiters:
                waiter = self._stats_waiters.popleft()
                if not waiter.abandoned:
                    waiter.resolve(message)
        elif action == "membership":
            self.membership = message

    def _on_error(self, message: dict[str, Any]) -> None:
        task_id = message.get("task_id")
        text = message.get("message")
        text = text if isinstance(text, str) else json.dumps(text)
        if isinstance(task_id, str) and not text.startswith(_UNKNOWN_RESULT):
            waiter = self._pending.pop(task_id, None)
            if waiter is not None:
                waiter.fail(EnqueueError(text, task_id=task_id))
                return
        self._log(f"Error from daemon: {text}")

    async def _drain_progress(self) -> None:
        """Hand progress to the observers in the order it came: one task at a time drains the
        backlog (a task per message would let a later one overtake an earlier one)."""
        try:
            while self._progress_backlog:
                task_id, data = self._progress_backlog.popleft()
                for callback in list(self._registry.progress):
                    try:
                        result = callback(task_id, data)
                        if inspect.isawaitable(result):
                            await result
                    except Exception as exc:
                        self._log(f"progress callback {callback!r} failed: {_describe(exc)}")
        finally:
            self._progress_draining = False

    def _call(self, fn: Callable[..., Any], *args: Any) -> Awaitable[Any]:
        """What to await to run `fn(*args)`: an async one on the loop (its own coroutine, no
        frame around it), a sync one in a worker thread (abandoned on cancel, so a stuck sync
        handler never holds up a shutdown)."""
        if _is_async(fn):
            return fn(*args)  # type: ignore[no-any-return]
        return self._call_in_thread(fn, *args)

    async def _call_in_thread(self, fn: Callable[..., Any], *args: Any) -> None:
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self._thread_limit)
        context = contextvars.copy_context()
        result = await anyio.to_thread.run_sync(
            context.run, fn, *args, abandon_on_cancel=True, limiter=self._limiter
        )
        if inspect.isawaitable(result):
            await result

    def _dispatch_execute(self, message: dict[str, Any]) -> None:
        """Start running an `execute` now, as a task of its own would: in a copy of the
        current context, concurrently with every other one.

        Jobs wait in `_jobs` for a worker task. A worker runs them one after another while
        they finish without waiting (a handler that does not await anything); when one waits,
        another worker is called for the jobs behind it. So no job ever waits for another's
        handler to finish, and a burst of quick handlers costs one task wake-up, not one
        each. As many idle workers as `max_workers` (default 100) are kept."""
        self._jobs.append((message, contextvars.copy_context()))
        if not self._worker_coming:
            self._call_worker()

    def _call_worker(self) -> None:
        """Make sure a worker will take the next job: wake an idle one, or start one."""
        self._worker_coming = True
        if self._idle_workers:
            self._idle_workers.pop().set()
        else:
            self._spawn(self._execute_worker)

    def _job_waits(self) -> None:
        """The job a worker runs waits (its handler awaits): the jobs behind it need another
        worker."""
        if self._jobs and not self._worker_coming:
            self._call_worker()

    async def _execute_worker(self) -> None:
        jobs = self._jobs
        idle = self._idle_workers
        job_waits = self._job_waits
        wake: _Signal | None = None
        try:
            while True:
                self._worker_coming = False  # this is the worker that was coming
                while jobs:
                    message, context = jobs.popleft()
                    await _InContext(self._execute(message), context, job_waits)
                if len(idle) >= self._thread_limit:
                    return  # enough idle ones (the daemon runs at most max_workers at once)
                wake = self._new_signal()
                idle.append(wake)
                await wake.wait()
        finally:
            if wake is not None and wake in idle:
                idle.remove(wake)

    async def _execute(self, message: dict[str, Any]) -> None:
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
        handler = self._registry.handlers.get(task_type)
        if handler is None:
            error = f"No handler registered for task type '{task_type}'."
        else:
            data = parse_task_data(message.get("task_data"))
            assert self._loop_thread is not None
            running = _Running(
                task_id,
                task_type,
                attempt,
                None if limit is None else int(limit),
                self,
                self._loop_thread,
            )
            token = _CURRENT.set(running)
            try:
                if limit is None:
                    await self._call(handler, data)
                else:
                    with anyio.move_on_after(limit) as scope:
                        await self._call(handler, data)
                    if scope.cancelled_caught:
                        error = TIMED_OUT.format(seconds=running.limit)
            except Exception as exc:
                error = _describe(exc)
            finally:
                _CURRENT.reset(token)
        result: dict[str, Any] = {
            "action": "result",
            "task_id": task_id,
            "status": "success" if error is None else "error",
        }
        if error is not None:
            result["error_msg"] = error
        if attempt is not None:
            result["attempt"] = attempt
        self._post(result)

    async def _dead_letter(self, handler: DeadLetterHandler, message: dict[str, Any]) -> None:
        data = parse_task_data(message.get("task_data"))
        args: tuple[Any, ...] = (data,)
        if _positional_arity(handler) >= 2:
            error = message.get("error")
            args = (data, error if isinstance(error, str) else None)
        try:
            await self._call(handler, *args)
        except Exception as exc:
            self._log(
                f"Error in max retry handler for task {message.get('task_id')}: {_describe(exc)}"
            )


def _env_overrides(
    *,
    shards: int | None,
    max_local_shards: int | None,
    max_workers: int | None,
    drain_timeout: float | None,
    pools: Mapping[str, int] | None,
) -> dict[str, str]:
    """The `SNERD_*` variables the constructor arguments stand for."""
    env: dict[str, str] = {}
    if shards is not None:
        env["SNERD_SHARDS"] = str(shards)
    if max_local_shards is not None:
        env["SNERD_MAX_SHARDS"] = str(max_local_shards)
    if max_workers is not None:
        env["SNERD_MAX_WORKERS"] = str(max_workers)
    if drain_timeout is not None:
        env["SNERD_DRAIN_TIMEOUT"] = str(drain_timeout)
    if pools is not None:
        env["SNERD_POOLS"] = ",".join(f"{name}={limit}" for name, limit in pools.items())
    return env


def _drain_timeout(env: Mapping[str, str]) -> float:
    """SNERD_DRAIN_TIMEOUT as the daemon will read it (30 s when unset or unreadable; the
    daemon itself refuses an unreadable value)."""
    raw = env.get("SNERD_DRAIN_TIMEOUT", "").strip()
    try:
        return max(0.0, float(raw)) if raw else 30.0
    except ValueError:
        return 30.0


class _Background:
    """Hosts a face's `serve` outside the caller's task tree, for upstream's unstructured
    `await start_listening()` ... `await shutdown()` lifecycle. Under trio it is a system task
    (`trio.lowlevel.spawn_system_task`: no nursery to hand it, and an error in it must never
    crash the run, so this catches everything but cancellation); under asyncio a plain task.
    """

    def __init__(self) -> None:
        self.done: anyio.Event | None = None
        self.error: BaseException | None = None
        self._task: Any = None

    async def start(self, serve: Callable[..., Coroutine[Any, Any, None]]) -> None:
        """Start `serve(task_status=...)`; return once it called `task_status.started()`.

        Raises:
            Whatever `serve` raised before it started.
        """
        started = anyio.Event()
        done = self.done = anyio.Event()
        cancelled = anyio.get_cancelled_exc_class()

        async def runner() -> None:
            try:
                async with anyio.create_task_group() as tg:
                    await tg.start(serve)
                    started.set()
            except cancelled:
                raise
            except BaseException as exc:
                self.error = exc
                if started.is_set():  # nobody is awaiting the start any more: say it here
                    print(f"[snerd] background service failed: {_describe(exc)}", file=sys.stderr)
            finally:
                started.set()
                done.set()

        library = sniffio.current_async_library()
        if library == "trio":
            import trio

            trio.lowlevel.spawn_system_task(runner, name="snerd background")
        elif library == "asyncio":
            import asyncio

            self._task = asyncio.get_running_loop().create_task(runner(), name="snerd background")
        else:  # pragma: no cover - anyio supports only these two
            raise RuntimeError(f"snerd does not support the {library} event loop")
        await started.wait()
        if self.error is not None:
            raise self.error
