"""The daemon face: JSON lines on stdin/stdout, logs on stderr, signals, the layout check.

Owns: framing (splitting stdin into lines, refusing over-long ones without buffering them),
writing protocol messages to stdout in batches, human logs on stderr, and turning SIGTERM,
SIGINT, stdin EOF and a closed stdout into `DrainRequested`. It parses nothing: lines go to the
core as bytes.
"""

from __future__ import annotations

import dataclasses
import os
import select
import signal
import sys
from pathlib import Path
from typing import Any

import orjson
import trio

from snerd.config import Settings
from snerd.core import events as ev
from snerd.io.fscheck import filesystem_type, lock_proves_liveness
from snerd.io.layout import adopt_legacy_layout
from snerd.io.runtime import Runtime

__all__ = ["StdioPeer", "run_daemon", "write_stderr"]

#: Bytes of an over-long line kept to find its task id for the error message.
_OVERSIZE_PREFIX = 4096


def write_stderr(text: str) -> None:
    """Write a log line to stderr even if the fd was made non-blocking (trio's FdStream on a
    shared tty or pipe does that; trio `_unix_pipes.py` notes the same hazard)."""
    data = text.encode("utf-8", "replace")
    while data:
        try:
            n = os.write(2, data)
        except BlockingIOError:
            select.select([], [2], [], 1.0)
            continue
        except OSError:
            return  # stderr is gone; nothing sensible to do
        data = data[n:]


class StdioPeer:
    """Delivers protocol messages as JSON lines on stdout; a writer task does the writes."""

    def __init__(self, runtime_submit: Any = None) -> None:
        self.buffer = bytearray()
        self.closed = False
        self._wake = trio.Event()
        self._submit = runtime_submit
        self._stream: trio.lowlevel.FdStream | None = None
        self.flushed = trio.Event()

    def deliver(self, message: dict[str, Any]) -> None:
        if self.closed:
            return
        self.buffer += orjson.dumps(message)
        self.buffer += b"\n"

    async def flush(self) -> None:
        if self.buffer:
            self._wake.set()

    def log(self, level: str, message: str) -> None:
        prefix = "[Snerd]" if level == "info" else f"[Snerd] {level.upper()}:"
        write_stderr(f"{prefix} {message}\n")

    async def writer(self, stream: trio.lowlevel.FdStream, on_closed: Any) -> None:
        """Write whatever is buffered, as it comes; report a closed stdout once."""
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            while self.buffer:
                chunk = bytes(self.buffer)
                self.buffer.clear()
                try:
                    await stream.send_all(chunk)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    self.closed = True
                    self.buffer.clear()
                    on_closed()
                    return


async def _read_stdin(
    runtime: Runtime, stream: trio.lowlevel.FdStream, max_line: int
) -> None:
    """Split stdin into lines and hand each burst to the node at once."""
    buffer = bytearray()
    #: While skipping an over-long line: its length so far and its first bytes.
    skipping: tuple[int, bytes] | None = None
    while True:
        try:
            chunk = await stream.receive_some(1 << 16)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            chunk = b""
        if not chunk:
            runtime.submit(ev.DrainRequested(reason="stdin closed", input_closed=True))
            return
        batch: list[ev.Event] = []
        start = 0
        if skipping is not None:
            nl = chunk.find(b"\n")
            if nl < 0:
                skipping = (skipping[0] + len(chunk), skipping[1])
                continue
            batch.append(
                ev.LineReceived(line=skipping[1], oversize=skipping[0] + nl)
            )
            skipping = None
            start = nl + 1
        buffer += chunk[start:] if start else chunk
        pos = 0
        while True:
            nl = buffer.find(b"\n", pos)
            if nl < 0:
                break
            if nl - pos > max_line:
                batch.append(ev.LineReceived(line=bytes(buffer[pos : pos + _OVERSIZE_PREFIX]), oversize=nl - pos))
            elif nl > pos and not buffer[pos:nl].isspace():
                batch.append(ev.LineReceived(line=bytes(buffer[pos:nl])))
            pos = nl + 1
        del buffer[:pos]
        if len(buffer) > max_line:
            skipping = (len(buffer), bytes(buffer[:_OVERSIZE_PREFIX]))
            buffer.clear()
        if batch:
            runtime.submit_many(batch)


async def _watch_signals(runtime: Runtime) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            runtime.submit(ev.DrainRequested(reason=signal.Signals(signum).name))


async def _serve(directory: Path, settings: Settings) -> int:
    peer = StdioPeer()
    runtime = Runtime(directory, settings, peer)
    stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
    stdout = trio.lowlevel.FdStream(os.dup(sys.stdout.fileno()))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            peer.writer,
            stdout,
            lambda: runtime.submit(ev.DrainRequested(reason="stdout closed by the parent")),
        )
        nursery.start_soon(_watch_signals, runtime)
        nursery.start_soon(_read_stdin, runtime, stdin, settings.max_line_bytes)
        code = await runtime.run()
        # Let the last messages out before leaving (bounded: a parent that stopped reading
        # must not keep us alive).
        with trio.move_on_after(5):
            await peer.flush()
            while peer.buffer and not peer.closed:
                await trio.sleep(0.001)
        nursery.cancel_scope.cancel()
    return code


def run_daemon(directory: Path, settings: Settings) -> int:
    """Run the daemon on `directory` until it drains; returns the exit code."""
    directory.mkdir(parents=True, exist_ok=True)
    message = adopt_legacy_layout(directory)
    if message:
        write_stderr(f"[Snerd] {message}\n")
    fs_type = filesystem_type(directory)
    if lock_proves_liveness(directory):
        settings = dataclasses.replace(
            settings, node=dataclasses.replace(settings.node, lock_proves_liveness=True)
        )
    write_stderr(f"[Snerd] data directory {directory} is on {fs_type}\n")
    # SIGPIPE would kill us on a closed stdout; we want EPIPE and a drain instead.
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    return trio.run(_serve, directory, settings)
