"""`QueueFace`: everything the two public faces share, `SnerdQueue` (the SDK that spawns the
daemon) and `Engine` (the same queue in-process).

Owns: the lifecycle both faces share (`start_listening` / `start` ... `shutdown`, or `async
with`), the handler registry (handlers, dead-letter handlers, progress callbacks), `enqueue`,
`schedule` / `unschedule` and `stats` and the waiting calls behind them, job control (`cancel`,
`retry`, `get`, `result`, `pause` / `resume`, `pause_all` / `resume_all`, `purge` /
`purge_all` and `retry_dead` / `retry_all_dead`: `snerd.sdk.control`), the dispatch of each
message from the daemon (`ack` / `scheduled` / `error` / `stats` / `cancelled` / `retried` /
`paused` / `purged` / `requeued` / `task` replies matched to their calls, `execute` handed
to the workers and `cancel` of a running attempt too, dead letters, progress handed to the
observers in order), the attempt observers (`on_attempt`) and the settings `snerdmq worker`
applies before the start (`keep_only`, `set_concurrency`, a handler's `isolation`), the
embedded dashboard, and the `SNERD_*` variables the faces' constructor arguments
stand for.

Both faces speak the wire protocol (docs/protocol.md, "SDK → daemon" and "Daemon → SDK") as
plain dicts: the SDK writes them to the daemon's stdin, the engine hands them to its in-process
runtime. So a face only has to say how a message goes out (`_post`) and where a handler task
runs (`_spawn`); everything else lives here and behaves the same in both.

It must never: block the event loop (sync handlers run in worker threads), decide anything about
the queue (retries, ordering, dedupe are the daemon's), or touch the daemon's files.
"""

from __future__ import annotations

import datetime as dt
import inspect
import json
import sys
import threading
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import Any, ParamSpec, Self, TypeAlias, TypeVar

import anyio
import anyio.abc
import sniffio

from snerd.core.protocol import (
    DEFAULT_RESULT_MAX_BYTES,
    unknown_result,
)
from snerd.sdk.bulk import BulkEnqueue
from snerd.sdk.context import yield_progress
from snerd.sdk.control import REPLY_ACTIONS, JobControl
from snerd.sdk.errors import (
    DuplicateTaskId,
    EnqueueError,
    QueueNotRunning,
    ScheduleError,
    SnerdError,
)
from snerd.sdk.isolation import ISOLATIONS
from snerd.sdk.messages import (
    SCHEDULE_OPTIONS,
    Enqueued,
    ReplyKey,
    Scheduled,
    build_schedule_message,
    build_unschedule_message,
    describe_error,
    enqueue_call_message,
    enqueued_from_ack,
    scheduled_from_reply,
)
from snerd.sdk.signals import Signal, Waiter, signal_factory
from snerd.sdk.tasks import TaskFactory
from snerd.sdk.workers import AttemptEnded, DeadLetterHandler, Handler, HandlerWorkers, is_async

__all__ = [
    "EXIT_GRACE_S",
    "ProgressCallback",
    "QueueFace",
    "drain_timeout_from_env",
    "env_overrides",
    "result_max_bytes_from_env",
]

#: A progress observer: `(task_id, data)`; sync or async.
ProgressCallback: TypeAlias = Callable[[str, Any], Any]

_F = TypeVar("_F", bound=Callable[..., Any])
_P = ParamSpec("_P")
_R = TypeVar("_R")

#: What the daemon's error for a `result` that matched no running attempt starts with (its text
#: up to the task id). Such an error carries a task id but is never the answer to an enqueue.
_UNKNOWN_RESULT = unknown_result("").rstrip()
#: Grace after the drain timeout before `shutdown` stops a daemon or runtime that has not
#: exited (kills the daemon, cancels the runtime).
EXIT_GRACE_S = 5.0


@dataclass
class _Registry:
    """What the application registered: handlers and dead-letter handlers by task type, and
    the progress observers in the order they came."""

    handlers: dict[str, Handler] = field(default_factory=dict)
    #: The isolation asked for at registration (`thread` or `process`), by task type.
    isolation: dict[str, str] = field(default_factory=dict)
    dead_letter: dict[str, DeadLetterHandler] = field(default_factory=dict)
    progress: list[ProgressCallback] = field(default_factory=list)


class QueueFace(JobControl, BulkEnqueue, TaskFactory):
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

    def __init__(
        self,
        *,
        max_workers: int | None = None,
        result_max_bytes: int = DEFAULT_RESULT_MAX_BYTES,
        isolation: str | None = None,
    ) -> None:
        """A face with nothing registered and nothing started.

        Args:
            max_workers: idle handler workers kept, and threads for sync handlers (default
                100).
            result_max_bytes: the daemon's SNERD_RESULT_MAX_BYTES (a larger return value
                fails its attempt before it is sent).
            isolation: where sync handlers registered without one run: `thread` (the
                default) or `process` (`snerd.sdk.isolation`).
        """
        self._registry = _Registry()
        self._pending: dict[str, Waiter] = {}
        #: `schedule` / `unschedule` calls waiting for their answer, by schedule name.
        self._schedule_waiters: dict[str, Waiter] = {}
        self._stats_waiters: deque[Waiter] = deque()
        #: Control calls waiting for their reply, oldest first, by what the reply names
        #: (`reply_key`): two calls about one task (or one type) each take one reply.
        self._control_waiters: dict[ReplyKey, deque[Waiter]] = {}
        self._progress_backlog: deque[tuple[Any, Any]] = deque()
        self._progress_draining = False
        self._accepting = False
        self._stopped_error: SnerdError | None = None
        self._loop_thread: int | None = None
        #: Makes the wake-ups of waiting calls and workers (`_bind_loop`).
        self._new_signal: Callable[[], Signal] = anyio.Event
        #: The daemon's last `membership` message (which shards this daemon owns), if any.
        self.membership: dict[str, Any] | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._workers = HandlerWorkers(
            self._registry.handlers,
            max_workers=max_workers,
            post=self._post,
            spawn=self._spawn,
            log=self._log,
            result_max_bytes=result_max_bytes,
            isolation=self._registry.isolation,
        )
        self._workers.default_isolation = _check_isolation(isolation)
        self._outer: anyio.abc.TaskGroup | None = None
        self._background: _Background | None = None
        self._started = False
        self._shutting_down = False
        self._exited: anyio.Event | None = None
        #: The dashboard `start_dashboard` serves, if any (snerd.dashboard.server).
        self._dashboard: Any = None
        #: The exit code of the daemon (negative: killed by that signal) or of the engine's
        #: runtime, once it has exited.
        self.exit_code: int | None = None

    # ------------------------------------------------------------------ for subclasses

    def _post(self, message: dict[str, Any]) -> None:
        """Send one protocol message (on the event loop thread; must not block)."""
        raise NotImplementedError

    async def _serve(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Run the daemon or runtime until it has exited (see the class's docstring)."""
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
        self._new_signal = signal_factory()
        self._workers.bind_loop(self._loop_thread, self._new_signal)

    def _spawn(self, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        """Start `fn(*args)` as a task in the task group handler tasks run in."""
        assert self._tg is not None
        self._tg.start_soon(fn, *args)

    def _log(self, text: str) -> None:
        """Report something that went wrong in this process: one line on stderr, prefixed."""
        print(f"{self._log_prefix}{text}", file=sys.stderr, flush=True)

    def _not_running_error(self) -> SnerdError:
        """What a call raises while no daemon can answer it: why it stopped, or that it was
        never started."""
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
        waiting, self._schedule_waiters = self._schedule_waiters, {}
        for waiter in waiting.values():
            waiter.fail(error)
        while self._stats_waiters:
            self._stats_waiters.popleft().fail(error)
        controls, self._control_waiters = self._control_waiters, {}
        for queue in controls.values():
            for waiter in queue:
                waiter.fail(error)

    # ------------------------------------------------------------------ lifecycle

    def _claim_start(self) -> None:
        """Mark the face started; a face runs once.

        Raises:
            RuntimeError: it was started before.
        """
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
        """Host `_serve` in a task group around the block; return once it has started."""
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
        """Shut down (shielded, bounded), then leave the task group; the block's own exception
        propagates unchanged."""
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
        """Begin the drain once, wait for the exit for `timeout` seconds (default: the drain
        timeout + `EXIT_GRACE_S`), stop it after that, and wait for the exit (and for the
        background host, if any). The exit code; None if nothing was started."""
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
        limit = self._drain_timeout_s + EXIT_GRACE_S if timeout is None else timeout
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
            self._post(_register_message(task_type))

    # ------------------------------------------------------------------ handler registry

    def _registered(self, task_type: str) -> None:
        """A handler for `task_type` was registered: tell the daemon when it runs."""
        if self._accepting:
            self._post(_register_message(task_type))

    def register_handler(
        self, task_type: str, handler: Handler, *, isolation: str | None = None
    ) -> None:
        """Run `handler(data)` for every task of `task_type`.

        Args:
            task_type: the task type, as given to `enqueue`.
            handler: an async function (runs on the event loop) or a plain function (runs in a
                worker thread, or a process: `isolation`). It gets the task data parsed from
                JSON. Returning is success; raising fails the attempt with
                `"<ExceptionType>: <message>"` as its error.
            isolation: for a plain function: `thread`, or `process`: each attempt in a child
                process of its own, killed at its `max_execution_seconds` or on a cancel (the
                function must be defined at the top level of a module, so that it pickles;
                docs/architecture.md, "Process isolation"). Default: the face's.

        Raises:
            ValueError: an unknown isolation, or `process` for an async handler (it runs on
                the event loop).
        """
        if _check_isolation(isolation) == "process" and is_async(handler):
            raise ValueError(
                f"[Snerd] handler {handler!r} of {task_type!r} is async: it runs on the event "
                "loop and cannot be isolated in a process"
            )
        self._registry.handlers[task_type] = handler
        if isolation is None:
            self._registry.isolation.pop(task_type, None)
        else:
            self._registry.isolation[task_type] = isolation
        self._registered(task_type)

    @property
    def handlers(self) -> Mapping[str, Handler]:
        """The registered handlers by task type (read-only)."""
        return MappingProxyType(self._registry.handlers)

    def isolation_of(self, task_type: str) -> str | None:
        """The isolation a sync handler of `task_type` was given (at its registration, else
        the face's), None when neither said (it runs in a thread)."""
        return self._registry.isolation.get(task_type) or self._workers.default_isolation

    def keep_only(self, task_types: Iterable[str]) -> None:
        """Drop every handler but those of `task_types` (before the start): this face then
        takes only those types' tasks (`snerdmq worker --types`).

        Raises:
            KeyError: a type in `task_types` has no handler.
            RuntimeError: already started.
        """
        keep = set(task_types)
        if self._started:
            raise RuntimeError(f"[Snerd] this {self._face_name} has started; choose types before")
        missing = sorted(keep - set(self._registry.handlers))
        if missing:
            raise KeyError(", ".join(missing))
        for task_type in list(self._registry.handlers):
            if task_type not in keep:
                del self._registry.handlers[task_type]
                self._registry.isolation.pop(task_type, None)

    def set_concurrency(
        self, max_workers: int | None = None, pools: Mapping[str, int] | None = None
    ) -> None:
        """Set the concurrent executions (`SNERD_MAX_WORKERS`, and the threads of sync
        handlers) and the worker pools (`SNERD_POOLS`) before the start, as the constructor's
        `max_workers` and `pools` would (`snerdmq worker --concurrency / --pool`).

        Raises:
            RuntimeError: already started.
        """
        if self._started:
            raise RuntimeError(f"[Snerd] this {self._face_name} has started; set limits before")
        if max_workers is not None:
            self._workers.set_max_workers(max_workers)
        self._apply_limits(max_workers, pools)

    def _apply_limits(self, max_workers: int | None, pools: Mapping[str, int] | None) -> None:
        """Make the daemon or runtime use these limits (`set_concurrency`)."""
        raise NotImplementedError

    def on_attempt(self, callback: Callable[[AttemptEnded], object]) -> Callable[..., object]:
        """Call `callback(ended)` after every attempt this face ran, with how it ended
        (`snerd.sdk.workers.AttemptEnded`: id, type, attempt, outcome, seconds, error), on the
        event loop (it must not block). Usable as a decorator."""
        self._workers.observe(callback)
        return callback

    async def wait_exited(self) -> int | None:
        """Wait until the daemon (or the engine's runtime) has exited, for whatever reason (a
        `shutdown`, a crash, a kill); its exit code. Returns at once if it never started."""
        if self._exited is None:
            return None
        await self._exited.wait()
        return self.exit_code

    def register_max_retry_handler(self, task_type: str, handler: DeadLetterHandler) -> None:
        """Call `handler(data)` when a task of `task_type` has used all its attempts.

        Args:
            task_type: the task type.
            handler: async or plain function; gets the parsed task data, and, if it takes a
                second positional parameter, the final error text (or None).
        """
        self._registry.dead_letter[task_type] = handler

    def handler(self, task_type: str, *, isolation: str | None = None) -> Callable[[_F], _F]:
        """Decorator form of `register_handler`: `@q.handler("email")`,
        `@q.handler("resize", isolation="process")`."""

        def register(fn: _F) -> _F:
            self.register_handler(task_type, fn, isolation=isolation)
            return fn

        return register

    def max_retry_handler(self, task_type: str) -> Callable[[_F], _F]:
        """Decorator form of `register_max_retry_handler`."""

        def register(fn: _F) -> _F:
            self.register_max_retry_handler(task_type, fn)
            return fn

        return register

    def _dashboard_directory(self) -> Path:
        """The queue directory behind this face."""
        raise NotImplementedError

    async def start_dashboard(
        self,
        port: int = 8642,
        *,
        host: str = "127.0.0.1",
        token: str | None = None,
        read_only: bool = False,
    ) -> str:
        """Serve the dashboard of this queue's directory (the page and API of `snerdmq
        dashboard`, docs/operations.md) on this event loop, with a live console of the
        progress messages this queue's handlers report, until `shutdown()`. Returns its URL.

        Args:
            port: the port (0: any free one; the URL says which).
            host: the address; anything but loopback needs a token.
            token: required on every request (default: SNERD_DASHBOARD_TOKEN, if set).
            read_only: refuse every write (retry, cancel, pause, resume) and show no button.

        Raises:
            ValueError: an address other than loopback without a token, or an empty token.
            OSError: the address cannot be listened on.
            RuntimeError: a dashboard is already served.
        """
        from snerd.dashboard import EmbeddedDashboard, check_exposure

        token = check_exposure(host, token)
        if self._dashboard is not None:
            raise RuntimeError(f"[Snerd] a dashboard is already served at {self._dashboard.url}")
        dashboard = EmbeddedDashboard()
        url = await dashboard.start(
            self._dashboard_directory(),
            host=host,
            port=port,
            token=token,
            read_only=read_only,
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
        unique_key: str | None = None,
        unique_until: str | int | None = None,
        backoff: str | None = None,
        backoff_max_seconds: int | None = None,
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
            auto_dedupe: drop this task if an identical one (same type and data, whatever the
                order of its keys) is pending or running.
            urgency_score: higher runs first; equal scores run in enqueue order.
            execute_at: not before this time: an RFC 3339 string, a datetime (a naive one is
                local time) or a timedelta from now.
            cron: recurring schedule (5 or 6 fields, or `30s`, `5m`, `1h`, `1d`).
            webhook_url: POST the task to this URL instead of running a handler.
            max_execution_seconds: hard timeout per attempt (enforced here and by the daemon).
            pool: worker pool name (`SNERD_POOLS` limits its concurrency).
            trigger_after_ids: run only after all these tasks completed.
            unique_key: drop this task if another of its type with this key counts (see
                `unique_until`), whatever its data.
            unique_until: how long a twin counts, with `auto_dedupe` or `unique_key`:
                `"started"` (until it starts running), `"finished"` (the default: until it
                ends) or a number of seconds after it ended.
            backoff: this task's retry policy, `"constant"` (every retry waits
                `retry_after_hours`) or `"exponential"` (doubling from it, with jitter);
                None: the daemon's `SNERD_BACKOFF`.
            backoff_max_seconds: where exponential backoff stops growing (default 7 days).

        Returns:
            `Enqueued(task_id, shard, deduplicated, duplicate_of)`: `deduplicated` is True
            when it was dropped as a duplicate of `duplicate_of`, None when the shard's owner
            (another daemon) did not decide in time.

        Raises:
            EnqueueError: the daemon refused it; `message` is its text.
            DuplicateTaskId: an enqueue with this id is still waiting for its ack here.
            DaemonExited: the daemon stopped before answering.
            QueueNotRunning: not started, or shutting down.
        """
        message = enqueue_call_message(
            task_id, task_type, data, max_retries, retry_after_hours,
            (rate_limit_group, max_per_minute, auto_dedupe, urgency_score, execute_at, cron,
             webhook_url, max_execution_seconds, pool, trigger_after_ids, unique_key,
             unique_until, backoff, backoff_max_seconds),
        )
        task_id = message["task_id"]
        if not self._accepting:
            raise self._not_running_error()
        if task_id in self._pending:
            raise DuplicateTaskId(
                f"[Snerd] An enqueue of task '{task_id}' is already waiting for its ack",
                task_id=task_id,
            )
        waiter = Waiter(self._new_signal())
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

    async def schedule(
        self,
        name: str,
        cron: str,
        task_type: str,
        data: Any = None,
        *,
        timezone: str | None = None,
        misfire: str = "once",
        catch_up: int = 1,
        overlap: str = "allow",
        max_retries: int = 3,
        retry_after_hours: float = 0.0,
        **options: Any,
    ) -> Scheduled:
        """Declare the named schedule: create it, or replace it where anything differs (so
        every boot of every process may declare it). Each tick of `cron` runs one task of
        `task_type` with `data`, whose id is `<name>@<tick>` (the tick in RFC 3339, UTC), once
        across all the daemons of the directory (docs/protocol.md, "Schedules").

        Args:
            name: the schedule's name (a non-empty string; it picks the shard that holds it).
            cron: 5 fields, or 6 with seconds first, an `@` alias, or `30s`, `5m`, `1h`, `1d`.
            task_type: the handler each run goes to.
            data: any JSON-serializable value, written as `enqueue` writes it.
            timezone: an IANA name (`Europe/Paris`) the expression is read in; default UTC.
            misfire: ticks missed while nobody ran it: `skip`, `once` (the latest runs) or
                `catch_up` (the latest `catch_up` run).
            catch_up: how many missed ticks `catch_up` runs (1 to 1000).
            overlap: a tick while a run is live: `allow` (it runs too), `skip`, or `wait` (it
                runs once the live run ends).
            max_retries, retry_after_hours: each run's, as `enqueue`'s.
            **options: the other `enqueue` options each run carries (`urgency_score`, `pool`,
                `max_execution_seconds`, `webhook_url`, `rate_limit_group`, `max_per_minute`,
                `auto_dedupe`, `unique_key`, `unique_until`).

        Returns:
            `Scheduled(name, result, next_fire)`: `result` is `created`, `updated`,
            `unchanged`, or `forwarded` (another daemon owns the name's shard and applies it
            from its inbox); `next_fire` is the next tick (UTC) when the daemon said.

        Raises:
            ScheduleError: the daemon refused it; `message` is its text.
            TypeError: an option `enqueue` does not have, or one a schedule decides
                (`execute_at`, `cron`, `trigger_after_ids`).
            DaemonExited, QueueNotRunning: no daemon to ask.
        """
        unknown = sorted(set(options) - set(SCHEDULE_OPTIONS))
        if unknown:
            raise TypeError(f"schedule() got an unexpected keyword argument {unknown[0]!r}")
        given = {key: options[key] for key in SCHEDULE_OPTIONS if options.get(key) is not None}
        policy = {
            "timezone": timezone,
            "misfire": misfire,
            "catch_up": catch_up,
            "overlap": overlap,
        }
        message = build_schedule_message(
            name, cron, task_type, data, max_retries, retry_after_hours, policy, given
        )
        return await self._ask_schedule(name, message)

    async def unschedule(self, name: str) -> Scheduled:
        """Remove the named schedule (runs already enqueued go on).

        Returns:
            `Scheduled(name, result, None)`: `result` is `removed`, `absent` (there was none),
            or `forwarded` (another daemon owns the name's shard and removes it).

        Raises:
            ScheduleError, DaemonExited, QueueNotRunning: as `schedule`.
        """
        return await self._ask_schedule(name, build_unschedule_message(name))

    async def _ask_schedule(self, name: str, message: dict[str, Any]) -> Scheduled:
        """Send a `schedule` or `unschedule` and wait for the answer naming `name`."""
        if not isinstance(name, str) or not name:
            # (The daemon's refusal could name no schedule, so no call would get it.)
            raise ScheduleError(
                "Failed to schedule: missing field `name` (a non-empty string)", name=str(name)
            )
        if not self._accepting:
            raise self._not_running_error()
        if name in self._schedule_waiters:
            raise ScheduleError(
                f"[Snerd] A schedule or unschedule of '{name}' is already waiting for its "
                "answer",
                name=name,
            )
        waiter = Waiter(self._new_signal())
        self._schedule_waiters[name] = waiter
        try:
            self._post(message)
            await waiter.event.wait()
        finally:
            if self._schedule_waiters.get(name) is waiter:
                del self._schedule_waiters[name]
        if waiter.error is not None:
            raise waiter.error
        answer: Scheduled = waiter.value
        return answer

    async def stats(self, timeout: float | None = 10.0) -> dict[str, Any]:
        """Ask the daemon for its counters (`{"action":"stats"}`) and return the reply.

        Raises:
            TimeoutError: no reply within `timeout` seconds.
            DaemonExited, QueueNotRunning: no daemon to ask.
        """
        if self._stopped_error is not None or self._loop_thread is None:
            raise self._not_running_error()
        waiter = Waiter(self._new_signal())
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
            self._workers.dispatch(message)
        elif action in REPLY_ACTIONS:
            self._on_control_reply(message)
        elif action == "cancel":
            task_id = message.get("task_id")
            attempt = message.get("attempt")
            if isinstance(task_id, str):
                self._workers.stop(task_id, attempt if type(attempt) is int else None)
        elif action == "ack":
            task_id = message.get("task_id")
            if isinstance(task_id, str):
                waiter = self._pending.pop(task_id, None)
                if waiter is not None:
                    waiter.resolve(enqueued_from_ack(task_id, message))
        elif action == "scheduled":
            name = message.get("name")
            waiting = self._schedule_waiters.pop(name, None) if isinstance(name, str) else None
            if waiting is not None:
                waiting.resolve(scheduled_from_reply(message))
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
                self._spawn(self._workers.dead_letter, handler, message)
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
        """An `error`: the refusal of the enqueue waiting with its task id, of the
        `schedule` waiting with its name, or of a control call (`_control_refused`), if
        there is one; else (no such call, or a late `result`) logged."""
        task_id = message.get("task_id")
        text = message.get("message")
        text = text if isinstance(text, str) else json.dumps(text)
        name = message.get("name")
        if task_id is None and isinstance(name, str):
            waiting = self._schedule_waiters.pop(name, None)
            if waiting is not None:
                waiting.fail(ScheduleError(text, name=name))
                return
        if self._control_waiters and self._control_refused(task_id, text):
            return
        if isinstance(task_id, str):
            if not text.startswith(_UNKNOWN_RESULT):
                waiter = self._pending.pop(task_id, None)
                if waiter is not None:
                    waiter.fail(EnqueueError(text, task_id=task_id))
                    return
            elif self._workers.timed_out_here(task_id):
                # The result of an attempt this SDK ended at its deadline: the daemon's
                # deadline (counted from its `execute`) passed first and ended it already.
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
                        self._log(f"progress callback {callback!r} failed: {describe_error(exc)}")
        finally:
            self._progress_draining = False


def _check_isolation(isolation: str | None) -> str | None:
    """`isolation`, if it is one (or None).

    Raises:
        ValueError: it is not.
    """
    if isolation is not None and isolation not in ISOLATIONS:
        raise ValueError(
            f"[Snerd] isolation must be one of {', '.join(ISOLATIONS)}, got {isolation!r}"
        )
    return isolation


def _register_message(task_type: str) -> dict[str, Any]:
    """The `register` of a handler's type: `cancellable`, since this SDK stops a running
    attempt when the daemon says it was cancelled (`HandlerWorkers.stop`)."""
    return {"action": "register", "task_type": task_type, "cancellable": True}


def env_overrides(
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


def result_max_bytes_from_env(env: Mapping[str, str]) -> int:
    """SNERD_RESULT_MAX_BYTES as the daemon will read it when set to a whole number (the
    default otherwise; the daemon itself refuses an unreadable value)."""
    raw = env.get("SNERD_RESULT_MAX_BYTES", "").strip()
    return int(raw) if raw.isascii() and raw.isdigit() else DEFAULT_RESULT_MAX_BYTES


def drain_timeout_from_env(env: Mapping[str, str]) -> float:
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
        """A host with nothing started; `done` is set once what `start` ran has ended."""
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
                    print(
                        f"[snerd] background service failed: {describe_error(exc)}", file=sys.stderr
                    )
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
