"""`Engine`: the snerd queue in-process: the SDK's handler API with no child process.

Owns: one `snerd.io.runtime.Runtime` on a data directory (the same log, membership and shard
locks as a daemon: an engine and daemons can share a directory), the in-process `Peer` that
turns the runtime's protocol messages into handler calls, and the bridge between the runtime's
trio world and the caller's event loop.

Every request goes through the daemon's own parser: `enqueue`, `register`, `stats`,
`schedule` and `unschedule` are the JSON lines the SDK would write, submitted as
`LineReceived`, so validation and error texts are the daemon's to the letter. Only a handler's
outcome is handed over as a `Result` event (and progress as a `Progress` event), since they
need no parsing.

Two hosts:

- trio: the runtime runs natively in a nursery of the engine's task group; messages and
  results are plain calls on the one trio thread.
- asyncio: the runtime runs as a trio *guest* on the running asyncio loop
  (`trio.lowlevel.start_guest_run`, trio's own I/O wait in trio's helper thread). Trio allows
  one run per thread, so all engines on one loop share one guest run (`_GuestHost`), each in
  its own task with its errors captured. Trio steps and
  asyncio callbacks alternate on the same thread, but each side may only touch its own
  primitives: messages go to asyncio with `loop.call_soon_threadsafe`, submissions go to trio
  with `TrioToken.run_sync_soon`. Handlers are asyncio tasks (or threads for sync handlers).

What is wrong with the directory is raised by `start()` / `async with` as it is, before any
task starts (`DataDirectoryError`, `LegacyDaemonRunning`), never as a traceback from inside a
task group.

It must never: decide anything about the queue (the runtime's node does), block either loop
(preparing the directory and the legacy-layout adoption run in a worker thread), or leave the runtime running after
`shutdown()` returns or the `async with` block exits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import weakref
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, ClassVar, Self

import anyio
import anyio.abc
import anyio.to_thread
import orjson
import outcome
import sniffio
import trio

from snerd.config import Settings, load_settings
from snerd.core import events as ev
from snerd.core import protocol as proto
from snerd.io.clock import Clock
from snerd.io.datadir import prepare_data_directory
from snerd.io.layout import adopt_legacy_layout
from snerd.io.runtime import Runtime
from snerd.io.stdio import one_line
from snerd.sdk.errors import DaemonExited
from snerd.sdk.face import EXIT_GRACE_S, QueueFace, drain_timeout_from_env, env_overrides

__all__ = ["Engine"]

logger = logging.getLogger("snerd.engine")


class _EnginePeer:
    """The runtime's `Peer`: buffers messages and hands each batch to the engine at `flush`."""

    def __init__(self, engine: Engine) -> None:
        """The peer of `engine`'s runtime."""
        self.engine = engine
        self.batch: list[dict[str, Any]] = []

    def deliver(self, message: dict[str, Any]) -> None:
        """Keep one message of the runtime for the next `flush`."""
        self.batch.append(message)

    async def flush(self) -> None:
        """Hand the messages kept so far to the engine, on its event loop, as one batch."""
        if self.batch:
            batch, self.batch = self.batch, []
            self.engine._to_host(self.engine._on_messages, batch)

    def log(self, level: str, message: str) -> None:
        """Log one line of the runtime's on the `snerd.engine` logger, at its level."""
        number = logging.getLevelName(level.upper())
        logger.log(number if isinstance(number, int) else logging.INFO, one_line(message))


class _GuestStarted:
    """A `trio.TaskStatus` that tells the asyncio host the runtime has started."""

    def __init__(self, notify: Callable[[], object]) -> None:
        self._notify = notify

    def started(self, value: None = None) -> None:
        """The runtime is up: tell the host."""
        self._notify()


class _GuestHost:
    """The one trio guest run on an asyncio loop, shared by every engine on that loop.

    Trio allows one run per thread, so engines cannot each start their own guest run; they
    borrow a nursery in a shared one instead. The run starts with the first engine and ends
    when the last one leaves.
    """

    _hosts: ClassVar[weakref.WeakKeyDictionary[Any, _GuestHost]] = weakref.WeakKeyDictionary()

    def __init__(self, loop: Any) -> None:
        self.loop = loop
        self.users = 0
        self.closing = False
        self.ready = anyio.Event()
        self.done = anyio.Event()
        self.failure: outcome.Outcome[None] | None = None
        self.token: trio.lowlevel.TrioToken | None = None
        self.nursery: trio.Nursery | None = None

    @classmethod
    async def acquire(cls, loop: Any) -> _GuestHost:
        """The loop's guest run, started if need be; call `release` when done with it."""
        while True:
            host = cls._hosts.get(loop)
            if host is None:
                host = cls(loop)
                cls._hosts[loop] = host
                host._start()
            if host.closing:
                await host.done.wait()
                if cls._hosts.get(loop) is host:
                    del cls._hosts[loop]
                continue
            host.users += 1
            await host.ready.wait()
            if host.failure is not None:
                host.users -= 1
                if cls._hosts.get(loop) is host:
                    del cls._hosts[loop]
                host.failure.unwrap()
                raise RuntimeError("the trio guest run ended at its start")
            return host

    def _start(self) -> None:
        """Start the guest run: a nursery that lives until `release` cancels it; `ready` is
        set once engines can spawn into it, `done` once the run has ended."""
        loop = self.loop

        async def main() -> None:
            self.token = trio.lowlevel.current_trio_token()
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                loop.call_soon_threadsafe(self.ready.set)
                await trio.sleep_forever()

        def finished(out: outcome.Outcome[None]) -> None:
            self.closing = True
            if not self.ready.is_set():
                self.failure = out
            elif isinstance(out, outcome.Error) and not isinstance(out.error, trio.Cancelled):
                logger.error("the trio guest run failed: %r", out.error)
            self.ready.set()
            self.done.set()

        trio.lowlevel.start_guest_run(
            main,
            run_sync_soon_threadsafe=loop.call_soon_threadsafe,
            run_sync_soon_not_threadsafe=loop.call_soon,
            done_callback=finished,
            # asyncio owns signals; the runtime needs none (an engine drains on shutdown()).
            host_uses_signal_set_wakeup_fd=True,
        )

    def spawn(self, fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Start `fn()` in the shared nursery (from the asyncio side)."""
        assert self.token is not None and self.nursery is not None
        self.token.run_sync_soon(self.nursery.start_soon, fn)

    async def release(self) -> None:
        """Stop using the run; the last user ends it and waits until it has finished, so the
        loop never closes under a live guest run (trio would refuse any later run)."""
        self.users -= 1
        if self.users > 0:
            return
        if not self.closing:
            self.closing = True
            assert self.token is not None and self.nursery is not None
            with contextlib.suppress(trio.RunFinishedError):
                self.token.run_sync_soon(self.nursery.cancel_scope.cancel)
        with anyio.CancelScope(shield=True):
            await self.done.wait()
        if type(self)._hosts.get(self.loop) is self:
            del type(self)._hosts[self.loop]


class Engine(QueueFace):
    """The queue, embedded: same handler API as `SnerdQueue`, no daemon process.

    ::

        async with Engine("./.snerdata", max_workers=8) as engine:
            @engine.handler("email")
            async def send(data): ...
            await engine.enqueue(None, "email", {"to": "a@b.c"})

    Runs under trio natively and under asyncio as a trio guest. `start()` / `shutdown()` work
    too, for code shaped like the upstream SDK.
    """

    _log_prefix = "[snerd engine] "
    _face_name = "Engine"
    _noun = "Engine"

    def __init__(
        self,
        directory: str | os.PathLike[str] = ".snerdata",
        *,
        shards: int | None = None,
        max_local_shards: int | None = None,
        max_workers: int | None = None,
        drain_timeout: float | None = None,
        pools: Mapping[str, int] | None = None,
        env: Mapping[str, str] | None = None,
        settings: Settings | None = None,
        clock: Clock | None = None,
        isolation: str | None = None,
    ) -> None:
        """Describe the engine; nothing starts until `start()` / `async with`.

        Args:
            directory: the data directory (a daemon's `DIR`).
            shards, max_local_shards, max_workers, drain_timeout, pools: as for `SnerdQueue`
                (the `SNERD_*` variables they stand for).
            env: the environment to read `SNERD_*` settings from (default `os.environ`); the
                arguments above override it.
            settings: ready-made settings; then `env` and the arguments above are ignored.
            clock: the clock the runtime reads for the node (default: the host's, `Clock`);
                `snerd.testing` passes a `DrivenClock`, which a `MockClock` moves.
            isolation: where sync handlers registered without one run: `thread` (default)
                or `process` (`register_handler`).

        Raises:
            snerd.config.ConfigError: a setting does not parse (the message names it).
            ValueError: an unknown isolation.
        """
        overrides = env_overrides(
            shards=shards,
            max_local_shards=max_local_shards,
            max_workers=max_workers,
            drain_timeout=drain_timeout,
            pools=pools,
        )
        merged = {**(os.environ if env is None else env), **overrides}
        self.settings = settings if settings is not None else load_settings(merged)
        super().__init__(
            max_workers=self.settings.node.max_workers,
            result_max_bytes=self.settings.node.result_max_bytes,
            isolation=isolation,
        )
        self.directory = Path(directory)
        self._drain_timeout_s = (
            self.settings.node.drain_timeout_us / 1_000_000
            if settings is not None
            else drain_timeout_from_env(merged)
        )
        self._runtime: Runtime | None = None
        self._runtime_scope: trio.CancelScope | None = None
        self._guest = False
        self._loop: Any = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._runtime_done = False
        self._clock = clock

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start the engine; returns once its runtime runs. Stop it with `shutdown()`.

        Raises:
            snerd.io.datadir.DataDirectoryError: the directory is not a directory, cannot be
                made, or is not writable (the message names it and the problem).
            snerd.io.layout.LegacyDaemonRunning: an upstream v0.2 daemon holds the directory.
            RuntimeError: already started.
        """
        await self._prepare()
        await self._start()

    async def __aenter__(self) -> Self:
        """Start the engine for the block (see `start` for what it raises)."""
        await self._prepare()
        return await super().__aenter__()

    #: The upstream SDK's name for `start`.
    start_listening = start

    async def shutdown(self, timeout: float | None = None) -> int | None:
        """Drain and stop: no new enqueues; running handlers finish (their results are
        recorded) within the drain timeout; then leases are released and the runtime exits.
        After `timeout` seconds (default: drain timeout + 5 s) the runtime is cancelled.

        Returns:
            The runtime's exit code (None if it was never started).
        """
        return await self._shutdown(timeout)

    def _apply_limits(self, max_workers: int | None, pools: Mapping[str, int] | None) -> None:
        """The runtime will run with them (its settings, replaced)."""
        node = self.settings.node
        node = dataclasses.replace(
            node,
            max_workers=node.max_workers if max_workers is None else max_workers,
            pools=node.pools if pools is None else dict(pools),
        )
        self.settings = dataclasses.replace(self.settings, node=node)

    @property
    def runtime(self) -> Runtime | None:
        """The runtime once started (None before): `snerd.testing` asks it whether it has
        settled (`Runtime.settled`)."""
        return self._runtime

    def _dashboard_directory(self) -> Path:
        """The engine's data directory."""
        return self.directory

    def _begin_drain(self) -> None:
        """Submit a `DrainRequested` to the runtime, as SIGTERM does to a daemon."""
        if self._runtime is not None:
            self._to_runtime(self._runtime.submit, ev.DrainRequested(reason="shutdown"))

    def _stop_now(self, waited: float) -> None:
        """The runtime outlived its drain: cancel it."""
        self._log(f"the runtime did not exit within {waited:g} s of the drain; cancelling it")
        if self._runtime_scope is not None:
            self._to_runtime(self._runtime_scope.cancel)

    async def _serve(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Run the runtime (natively under trio, as a guest under asyncio) until it exits; then
        cancel the handlers still running and fail whatever still waits."""
        self._bind_loop()
        self._exited = anyio.Event()
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                if sniffio.current_async_library() == "trio":
                    await self._run_native(task_status)
                else:
                    await self._run_guest(task_status)
                # The runtime has exited: handlers still running cannot report any more.
                tg.cancel_scope.cancel()
        finally:
            self._accepting = False
            self._runtime_done = True
            if self._stopped_error is None or self._pending or self._stats_waiters:
                self._fail_all(
                    DaemonExited(
                        f"[Snerd] the engine stopped (exit code {self.exit_code}) before answering"
                    )
                )
            self._exited.set()

    async def _prepare(self) -> None:
        """Make the directory and adopt a legacy layout, in a worker thread, before anything
        starts: what is wrong with the directory is raised as it is, not wrapped in a task
        group's ExceptionGroup. Nothing to do for an engine already started (`_start` says)."""
        if self._started:
            return
        message = await anyio.to_thread.run_sync(self._prepare_directory)
        if message:
            logger.info(message)

    def _prepare_directory(self) -> str | None:
        """Make the directory and adopt a legacy layout (blocking); what the adoption did, if
        anything."""
        prepare_data_directory(self.directory)
        return adopt_legacy_layout(self.directory)

    def _new_runtime(self) -> Runtime:
        """The runtime on this engine's directory, with this engine as its peer."""
        runtime = Runtime(self.directory, self.settings, _EnginePeer(self), clock=self._clock)
        self._runtime = runtime
        return runtime

    async def _run_native(self, task_status: anyio.abc.TaskStatus[None]) -> None:
        """Under trio: run the runtime in a nursery of its own (its cancel scope is how
        `_stop_now` stops it) until it exits."""
        runtime = self._new_runtime()

        async def run(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            self.exit_code = await runtime.run(task_status=task_status)

        async with trio.open_nursery() as nursery:
            self._runtime_scope = nursery.cancel_scope
            await nursery.start(run)
            self._accept_enqueues()
            task_status.started()

    async def _run_guest(self, task_status: anyio.abc.TaskStatus[None]) -> None:
        """Under asyncio: run the runtime in the loop's shared trio guest run until it exits,
        its outcome captured so that an error ends this engine only; cancelled from the
        asyncio side, stop the runtime (bounded) before leaving."""
        import asyncio

        loop = asyncio.get_running_loop()
        host = await _GuestHost.acquire(loop)
        self._guest = True
        self._loop = loop
        self._token = host.token
        started = anyio.Event()
        done = anyio.Event()
        result: list[outcome.Outcome[None]] = []

        async def run_runtime() -> None:
            runtime = self._new_runtime()
            with trio.CancelScope() as scope:
                self._runtime_scope = scope
                status = _GuestStarted(lambda: loop.call_soon_threadsafe(started.set))
                self.exit_code = await runtime.run(task_status=status)

        def finished(out: outcome.Outcome[None]) -> None:
            result.append(out)
            started.set()
            done.set()

        async def trio_main() -> None:
            # Captured: an error here must end this engine, not the run other engines share.
            out = await outcome.acapture(run_runtime)
            loop.call_soon_threadsafe(finished, out)

        try:
            host.spawn(trio_main)
            await started.wait()
            if not done.is_set():
                self._accept_enqueues()
                task_status.started()
                await done.wait()
        finally:
            if not done.is_set():
                # Cancelled from the host side: stop the runtime before leaving, bounded.
                with anyio.CancelScope(shield=True):
                    if self._runtime_scope is not None:
                        self._to_runtime(self._runtime_scope.cancel)
                    with anyio.move_on_after(EXIT_GRACE_S + self._drain_timeout_s):
                        await done.wait()
            await host.release()
        if result:
            result[0].unwrap()

    # ------------------------------------------------------------------ bridges

    def _to_runtime(self, fn: Callable[..., object], *args: Any) -> None:
        """Call `fn(*args)` in the runtime's trio context."""
        if self._runtime_done:
            return
        if not self._guest:
            fn(*args)
            return
        assert self._token is not None
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(fn, *args)

    def _to_host(self, fn: Callable[..., object], *args: Any) -> None:
        """Call `fn(*args)` on the caller's event loop (from the runtime)."""
        if self._guest:
            self._loop.call_soon_threadsafe(fn, *args)
        else:
            fn(*args)

    def _on_messages(self, batch: list[dict[str, Any]]) -> None:
        """Handle a batch of the runtime's messages, in order (on the caller's event loop)."""
        for message in batch:
            self._on_message(message)

    def _post(self, message: dict[str, Any]) -> None:
        """Submit `message` to the runtime: a `result` or `progress` as its event, anything
        else as the line the SDK would write (so the daemon's parser judges it)."""
        runtime = self._runtime
        if runtime is None:
            return
        action = message.get("action")
        event: ev.Event
        if action == "result":
            event = proto.Result(
                task_id=message["task_id"],
                success=message["status"] == "success",
                error_msg=message.get("error_msg"),
                attempt=message.get("attempt"),
                result=message.get("result"),
                retry=message.get("retry") is not False,
            )
        elif action == "progress":
            event = proto.Progress(task_id=message["task_id"], data=message.get("data"))
        else:
            event = ev.LineReceived(line=orjson.dumps(message))
        self._to_runtime(runtime.submit, event)

    def _log(self, text: str) -> None:
        """Log on the `snerd.engine` logger (an engine writes nothing to stderr itself)."""
        logger.warning(text)
