"""`SnerdQueue`: the Python SDK. It spawns a `snerdmq` daemon and speaks the wire protocol.

Owns: the daemon child process (spawn, in a session of its own; SIGTERM drain, kill as a last
resort; it exits by itself when this process dies, at the end of its stdin), its pipes
(newline-delimited JSON on stdin/stdout; its stderr relayed, prefixed, to this process's
stderr), and the tasks that read and write them. Handlers, enqueue bookkeeping and the
`execute` -> `result` round trip are shared with the embedded engine (`snerd.sdk`).

It keeps the upstream Python SDK's (snerdmq-python 0.4.2) names and argument order, so code
written for it runs unchanged, and fixes that SDK's bugs (reference §1.5-1.6 and §6): results
are still sent while the daemon drains, an enqueue fails fast when the daemon dies, two
concurrent enqueues of one id are refused instead of clobbering each other, a refused enqueue
raises the daemon's text, progress data may be any JSON value, and nothing is printed on stdout.
It runs under asyncio and trio alike (anyio).

It must never: write to this process's stdout, parse or validate task options (the daemon does,
so its error texts reach the caller unchanged), or leave a daemon running after `shutdown()`
returns or the `async with` block exits.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import orjson

from snerd.sdk.errors import DaemonExited
from snerd.sdk.face import (
    EXIT_GRACE_S,
    QueueFace,
    drain_timeout_from_env,
    env_overrides,
    result_max_bytes_from_env,
)
from snerd.sdk.signals import Signal

__all__ = ["SnerdQueue", "default_binary"]

#: Daemon stderr lines kept to explain an unexpected exit.
_STDERR_TAIL = 20


def default_binary() -> str:
    """Where the `snerdmq` daemon is: the console script next to this Python interpreter (the
    one `pip install snerd` put there, even in a venv that is not activated), else on PATH.

    Raises:
        FileNotFoundError: neither exists.
    """
    name = "snerdmq.exe" if os.name == "nt" else "snerdmq"
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which("snerdmq")
    if found:
        return found
    raise FileNotFoundError(
        f"[Snerd] snerdmq not found at {beside} nor on PATH. Install snerd into this "
        "environment (pip install snerd) or pass binary_path=."
    )


class SnerdQueue(QueueFace):
    """A job queue backed by a `snerdmq` daemon child process.

    Two ways to run it::

        async with SnerdQueue(storage_path="./.snerdata") as q:
            @q.handler("email")
            async def send(data): ...
            await q.enqueue(None, "email", {"to": "a@b.c"})

        q = SnerdQueue(storage_path="./.snerdata")   # the upstream SDK's shape
        q.register_handler("email", send)
        await q.start_listening()
        ...
        await q.shutdown()

    Handlers may be registered before or after the start.
    """

    _log_prefix = "[snerd sdk] "
    _face_name = "SnerdQueue"
    _noun = "Queue"

    def __init__(
        self,
        binary_path: str | os.PathLike[str] | None = None,
        storage_path: str | os.PathLike[str] | None = None,
        shards: int | None = None,
        max_local_shards: int | None = None,
        max_workers: int | None = None,
        *,
        drain_timeout: float | None = None,
        pools: Mapping[str, int] | None = None,
        env: Mapping[str, str] | None = None,
        stderr_prefix: str = "[snerdmq] ",
        isolation: str | None = None,
    ) -> None:
        """Describe the daemon to run; nothing starts until `start_listening()` / `async with`.

        Args:
            binary_path: the daemon executable; default `default_binary()`.
            storage_path: the data directory, passed as the daemon's argument (default: the
                daemon's own, `.snerdata` in the working directory).
            shards: shard count for a new directory (`SNERD_SHARDS`).
            max_local_shards: most shards this daemon owns (`SNERD_MAX_SHARDS`).
            max_workers: concurrent executions (`SNERD_MAX_WORKERS`); also sizes the thread
                pool for sync handlers.
            drain_timeout: seconds in-flight tasks get at shutdown (`SNERD_DRAIN_TIMEOUT`).
            pools: worker pools and their limits (`SNERD_POOLS`).
            env: extra environment for the daemon (applied before the arguments above).
            stderr_prefix: put before each daemon stderr line relayed to our stderr.
            isolation: where sync handlers registered without one run: `thread` (default)
                or `process` (`register_handler`).

        Raises:
            FileNotFoundError: no daemon binary.
            ValueError: an unknown isolation.
        """
        merged_env = {**os.environ, **(env or {})}
        super().__init__(
            max_workers=max_workers,
            result_max_bytes=result_max_bytes_from_env(merged_env),
            isolation=isolation,
        )
        self.binary_path = str(binary_path) if binary_path else default_binary()
        if not Path(self.binary_path).exists() and not shutil.which(self.binary_path):
            raise FileNotFoundError(f"[Snerd] Binary not found at {self.binary_path}.")
        self.storage_path = None if storage_path is None else os.fspath(storage_path)
        self.env: dict[str, str] = {
            **os.environ,
            **(env or {}),
            **env_overrides(
                shards=shards,
                max_local_shards=max_local_shards,
                max_workers=max_workers,
                drain_timeout=drain_timeout,
                pools=pools,
            ),
        }
        self.stderr_prefix = stderr_prefix
        self._drain_timeout_s = drain_timeout_from_env(self.env)
        self._process: anyio.abc.Process | None = None
        self._outbox = bytearray()
        self._outbox_wake: Signal | None = None
        self._pipe_broken = False
        self._stderr_tail: deque[str] = deque(maxlen=_STDERR_TAIL)
        self._log_observers: list[Callable[[str], object]] = []

    def _apply_limits(self, max_workers: int | None, pools: Mapping[str, int] | None) -> None:
        """The daemon will read them from its environment (it validates them)."""
        self.env.update(
            env_overrides(
                shards=None,
                max_local_shards=None,
                max_workers=max_workers,
                drain_timeout=None,
                pools=pools,
            )
        )

    def _dashboard_directory(self) -> Path:
        """The daemon's data directory (its default, `.snerdata`, when none was given)."""
        return Path(self.storage_path if self.storage_path is not None else ".snerdata")

    def on_daemon_log(self, callback: Callable[[str], object]) -> Callable[[str], object]:
        """Also hand each daemon stderr line (without its newline) to `callback`, on the event
        loop thread; it must not block. Usable as a decorator. The lines are still relayed to
        stderr."""
        self._log_observers.append(callback)
        return callback

    # ------------------------------------------------------------------ lifecycle

    @property
    def pid(self) -> int | None:
        """The daemon's process id while it runs."""
        return self._process.pid if self._process is not None else None

    async def start_listening(self) -> None:
        """Spawn the daemon and start serving it; returns once it is spawned and every handler
        registered so far has been sent. Stop it with `shutdown()`.

        Raises:
            OSError: the daemon could not be spawned.
            RuntimeError: already started.
        """
        await self._start()

    #: The same as `start_listening`.
    start = start_listening

    async def shutdown(self, timeout: float | None = None) -> int | None:
        """Drain and stop the daemon: SIGTERM, keep running handlers and sending their results
        while it drains, wait for it to exit; kill it if it has not after `timeout` seconds
        (default: the drain timeout + 5 s). New enqueues are refused at once.

        Returns:
            The daemon's exit code (None if it was never started).
        """
        return await self._shutdown(timeout)

    def _begin_drain(self) -> None:
        """SIGTERM the daemon, if it still runs: it drains, then exits."""
        process = self._process
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()  # SIGTERM: the daemon drains, then exits

    def _stop_now(self, waited: float) -> None:
        """The daemon outlived its drain: kill it."""
        self._log(f"the daemon did not exit within {waited:g} s of SIGTERM; killing it")
        if self._process is not None:
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()

    async def _serve(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Spawn the daemon and serve its pipes until it exits: a writer task, a stderr relay,
        and this task reading stdout. When stdout ends, wait (bounded) for the exit, then fail
        whatever still waits. However this is left, the daemon is not left running."""
        self._bind_loop()
        self._outbox_wake = self._new_signal()
        args = [self.binary_path] + ([self.storage_path] if self.storage_path else [])
        process = await anyio.open_process(
            args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self.env,
            # A session of its own: a signal to this process's group (Ctrl-C in a terminal, a
            # `kill` of the job) reaches this process only, which drains the daemon itself. A
            # daemon that got it too would drain on its own and, once draining, wait its whole
            # drain timeout for results this process may no longer send.
            start_new_session=True,
        )
        # Only now is there something for `shutdown` to wait for.
        self._process = process
        self._exited = anyio.Event()
        assert process.stdin and process.stdout and process.stderr
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                stderr_done = anyio.Event()
                tg.start_soon(self._write_loop, process.stdin)
                tg.start_soon(self._relay_stderr, process.stderr, stderr_done)
                self._accept_enqueues()
                task_status.started()
                await _read_lines(process.stdout, self._on_line)
                # stdout closed: the daemon is exiting (or gone). Nothing can be answered now.
                self._accepting = False
                with anyio.move_on_after(2):
                    await stderr_done.wait()
                with anyio.move_on_after(EXIT_GRACE_S):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
                self.exit_code = await process.wait()
                self._fail_all(self._exit_error())
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                if process.returncode is None:
                    # Leaving abnormally (cancelled, or an error in this SDK): never leave the
                    # daemon behind. Its tasks are durable; in-flight ones run again later.
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
                self.exit_code = await process.wait()
                await process.aclose()
                self._accepting = False
                if self._stopped_error is None or self._pending:
                    self._fail_all(self._exit_error())
                self._exited.set()

    def _exit_error(self) -> DaemonExited:
        """What the calls still waiting raise: how the daemon ended and, when it was not asked
        to, its last stderr lines."""
        code = self.exit_code
        how = (
            f"was killed by {signal.Signals(-code).name}"
            if code is not None and code < 0 and -code in signal.valid_signals()
            else f"exited with code {code}"
        )
        text = f"[Snerd] the snerdmq daemon {how} before answering"
        if not self._shutting_down and self._stderr_tail:
            text += "; its last words: " + " | ".join(self._stderr_tail)
        return DaemonExited(text)

    # ------------------------------------------------------------------ pipes

    def _post(self, message: dict[str, Any]) -> None:
        """Queue `message` as one JSON line for the writer task (dropped once the daemon is
        gone: nothing could answer it)."""
        if self._pipe_broken or self._outbox_wake is None or self.exit_code is not None:
            return
        if not self._outbox:
            # The writer waits only with the outbox empty: lines already in it have woken it.
            self._outbox_wake.set()
        self._outbox += orjson.dumps(message)
        self._outbox += b"\n"

    async def _write_loop(self, stdin: anyio.abc.ByteSendStream) -> None:
        """One writer: everything posted since the last write goes out in one write."""
        assert self._outbox_wake is not None
        while True:
            await self._outbox_wake.wait()
            self._outbox_wake = self._new_signal()
            while self._outbox:
                chunk = bytes(self._outbox)
                self._outbox.clear()
                try:
                    await stdin.send(chunk)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    # The daemon is gone; the stdout reader sees EOF and fails what waits.
                    self._pipe_broken = True
                    self._outbox.clear()
                    return

    def _on_line(self, line: bytes) -> None:
        """Handle one line of the daemon's stdout: a JSON object, else logged and ignored."""
        try:
            message = orjson.loads(line)
        except orjson.JSONDecodeError:
            if line.strip():
                self._log(f"ignored a line from the daemon that is not JSON: {line[:200]!r}")
            return
        if isinstance(message, dict):
            self._on_message(message)
        else:
            self._log(f"ignored a line from the daemon that is not an object: {line[:200]!r}")

    async def _relay_stderr(self, stderr: anyio.abc.ByteReceiveStream, done: anyio.Event) -> None:
        """Copy the daemon's log lines to our stderr, prefixed; keep the last few."""
        try:
            await _read_lines(stderr, self._relay_line)
        finally:
            done.set()

    def _relay_line(self, raw: bytes) -> None:
        """Keep one daemon stderr line for `_exit_error`, hand it to the observers, and write
        it to our stderr with the prefix."""
        text = raw.decode("utf-8", "replace").rstrip("\r")
        if not text:
            return
        self._stderr_tail.append(text)
        for observer in list(self._log_observers):
            try:
                observer(text)
            except Exception as exc:
                self._log(f"daemon log observer {observer!r} failed: {exc!r}")
        try:
            sys.stderr.write(f"{self.stderr_prefix}{text}\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass  # our own stderr is gone; nothing sensible to do


async def _read_lines(
    stream: anyio.abc.ByteReceiveStream, on_line: Callable[[bytes], None]
) -> None:
    """Call `on_line` with each line of `stream` (without its newline; an unterminated last
    line too) until the stream ends or breaks."""
    unfinished: list[bytes] = []  # the pieces of a line not ended yet (a long one: many)
    while True:
        try:
            chunk = await stream.receive(1 << 16)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            break
        if b"\n" not in chunk:
            unfinished.append(chunk)
            continue
        if unfinished:
            unfinished.append(chunk)
            chunk = b"".join(unfinished)
            unfinished.clear()
        lines = chunk.split(b"\n")
        last = lines.pop()
        if last:
            unfinished.append(last)
        for line in lines:
            on_line(line)
    if rest := b"".join(unfinished):
        on_line(rest)
