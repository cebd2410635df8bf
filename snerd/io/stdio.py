"""The daemon face: JSON lines on stdin/stdout, logs on stderr, signals, the layout check.

Owns: framing (splitting stdin into lines, refusing over-long ones without buffering them),
writing protocol messages to stdout in batches, human logs on stderr, and turning SIGTERM,
SIGINT, stdin EOF and a closed stdout into `DrainRequested`. It parses nothing: lines go to the
core as bytes.
"""

from __future__ import annotations

import dataclasses
import gc
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
from snerd.core import protocol as proto
from snerd.io.fscheck import LOCAL_FILESYSTEMS, check_data_directory
from snerd.io.layout import adopt_legacy_layout
from snerd.io.runtime import EVENT_BURST, Runtime

__all__ = ["StdioPeer", "run_daemon", "write_stderr"]

#: Bytes kept of each end of an over-long line, to find its task id for the error message
#: (`proto.sniff_task_id` looks at as much of each end).
_OVERSIZE_END = proto.SNIFF_BYTES
#: `sys.setswitchinterval` for the daemon process (CPython's default is 5 ms).
_SWITCH_INTERVAL_S = 0.00005
#: `gc.set_threshold` for the daemon process (CPython's default is 700, 10, 10).
_GC_THRESHOLDS = (20_000, 20, 20)
#: Seconds between two full collections of the daemon process (`collect_all`).
_FULL_GC_INTERVAL_S = 600.0


#: Characters a log line must not carry as they are: C0 controls (a newline in a task id could
#: forge a second `[Snerd]` line, an escape sequence could repaint the terminal), DEL, C1
#: controls and Unicode's line and paragraph separators. Each is written as its escape.
_UNSAFE_IN_A_LINE = {
    code: f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
    for code in (*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029)
}


def one_line(text: str) -> str:
    """`text` as one printable line: control characters and line separators escaped."""
    return text.translate(_UNSAFE_IN_A_LINE)


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
    """Delivers protocol messages as JSON lines on stdout.

    `flush` writes straight to the (non-blocking) stdout fd when nothing is queued before it, so
    an ack costs no task switch; what the pipe does not take at once is left to the writer task,
    which waits for the pipe to drain. Only one of them writes at a time (`_sending`), so lines
    keep their order."""

    def __init__(self, runtime_submit: Any = None) -> None:
        self.buffer = bytearray()
        self.closed = False
        self._wake = trio.Event()
        self._submit = runtime_submit
        self._stream: trio.lowlevel.FdStream | None = None
        self.flushed = trio.Event()
        #: The stdout fd for direct writes (set by `writer`), and whether the writer task owns
        #: the pipe right now (it is in the middle of a send).
        self._fd: int | None = None
        self._sending = False
        self._on_closed: Any = None

    def deliver(self, message: dict[str, Any]) -> None:
        if self.closed:
            return
        try:
            self.buffer += orjson.dumps(message, option=orjson.OPT_APPEND_NEWLINE)
        except orjson.JSONEncodeError as exc:
            # The core lets through only what can be written back (`proto.MAX_NESTING`), so
            # this is a daemon bug; the SDK still hears that its line went unanswered.
            task_id = _encodable(message.get("task_id"))
            action = message.get("action")
            text = f"[Snerd] could not write the {action!s:.40} message: {exc}"
            self.log("error", f"{text} (task {task_id}); this is a bug in snerd, please report it")
            self.buffer += orjson.dumps(
                proto.error(task_id, text), option=orjson.OPT_APPEND_NEWLINE
            )

    def deliver_lines(self, data: bytes) -> None:
        """Take protocol lines already framed (`proto.ack_lines`)."""
        if self.closed:
            return
        self.buffer += data

    async def flush(self) -> None:
        self.flush_nowait()

    def flush_nowait(self) -> None:
        """Write what is buffered now, as far as the pipe takes it; wake the writer task for
        the rest. The runtime calls this after handling a burst outside its driver task."""
        if not self.buffer:
            return
        if self._fd is not None and not self._sending:
            try:
                n = os.write(self._fd, self.buffer)
            except BlockingIOError:
                n = 0
            except OSError:
                self._closed()
                return
            del self.buffer[:n]
            if not self.buffer:
                return
        self._wake.set()

    def _closed(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.buffer.clear()
        if self._on_closed is not None:
            self._on_closed()

    def log(self, level: str, message: str) -> None:
        prefix = "[Snerd]" if level == "info" else f"[Snerd] {level.upper()}:"
        write_stderr(f"{prefix} {one_line(message)}\n")

    async def writer(self, stream: trio.lowlevel.FdStream, on_closed: Any) -> None:
        """Write what `flush` could not write at once; report a closed stdout once."""
        self._on_closed = on_closed
        self._fd = stream.fileno()
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            while self.buffer and not self.closed:
                chunk = bytes(self.buffer)
                self.buffer.clear()
                self._sending = True
                try:
                    await stream.send_all(chunk)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    self._closed()
                    return
                finally:
                    self._sending = False


async def _read_stdin(runtime: Runtime, stream: trio.lowlevel.FdStream, max_line: int) -> None:
    """Split stdin into lines and hand each burst to the node at once.

    Reads the (non-blocking) fd itself rather than through `FdStream.receive_some`, which
    passes a scheduling point before every read: after waking up because input arrived,
    that is one more round of the run loop between a line and its handling. Here a read that
    had to wait for input is handled at once; only a read that found input without waiting
    (a busy pipe) yields first, so other tasks still get their turn."""
    buffer = bytearray()
    fd = stream.fileno()
    read = os.read
    wait_readable = trio.lowlevel.wait_readable
    checkpoint = trio.lowlevel.checkpoint
    waited = False
    #: While skipping an over-long line: its length so far and its two ends (`_ends`).
    skipping: tuple[int, bytes, bytes] | None = None
    while True:
        try:
            chunk = read(fd, 1 << 16)
        except BlockingIOError:
            try:
                await wait_readable(fd)
            except (trio.ClosedResourceError, OSError):
                chunk = b""
            else:
                waited = True
                continue
        except OSError:
            chunk = b""
        if not waited:
            await checkpoint()
        waited = False
        if not chunk:
            runtime.submit(ev.DrainRequested(reason="stdin closed", input_closed=True))
            return
        batch: list[ev.Event] = []
        start = 0
        if skipping is not None:
            length, head, tail = skipping
            nl = chunk.find(b"\n")
            if nl < 0:
                skipping = (length + len(chunk), head, (tail + chunk)[-_OVERSIZE_END:])
                continue
            tail = (tail + chunk[:nl])[-_OVERSIZE_END:]
            batch.append(ev.LineReceived(line=head + tail, oversize=length + nl))
            skipping = None
            start = nl + 1
        if start:
            chunk = chunk[start:]
        nl = chunk.find(b"\n")
        if nl < 0:
            # No line ends in this chunk: keep it (each byte is copied once, however long the
            # line grows), or start skipping a line that is already too long.
            buffer += chunk
            if len(buffer) > max_line:
                skipping = (len(buffer), *_ends(buffer))
                buffer.clear()
        else:
            lines: list[bytes]
            if buffer:
                buffer += chunk[:nl]
                lines = [bytes(buffer)]
                buffer.clear()
                # bytes.split: one C pass for the rest of the burst.
                lines += chunk[nl + 1 :].split(b"\n")
            else:
                lines = chunk.split(b"\n")
            rest = lines.pop()  # an unfinished line (or b"")
            if len(chunk) <= max_line and (not lines or len(lines[0]) <= max_line):
                _add_lines(batch, lines)  # (none of them can be too long)
            else:
                run: list[bytes] = []
                for line in lines:
                    if len(line) > max_line:
                        _add_lines(batch, run)
                        run = []
                        batch.append(
                            ev.LineReceived(line=b"".join(_ends(line)), oversize=len(line))
                        )
                    else:
                        run.append(line)
                _add_lines(batch, run)
            if len(rest) > max_line:
                skipping = (len(rest), *_ends(rest))
            elif rest:
                buffer += rest
        if batch:
            runtime.feed(batch)


def _ends(data: bytes | bytearray) -> tuple[bytes, bytes]:
    """The first `_OVERSIZE_END` bytes of an over-long line and its last `_OVERSIZE_END` after
    those: joined, they are what `proto.sniff_task_id` looks at (the whole line, if short)."""
    return bytes(data[:_OVERSIZE_END]), bytes(data[max(_OVERSIZE_END, len(data) - _OVERSIZE_END) :])


def _encodable(text: Any) -> str | None:
    """`text` if it is a string JSON can carry (no lone surrogate), else None."""
    if not isinstance(text, str):
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return text


def _add_lines(batch: list[ev.Event], lines: list[bytes]) -> None:
    """`lines` (none too long) as `LinesReceived` events of up to `EVENT_BURST` lines, so a
    burst of the node (`Node.handle_burst`) takes one whole (blank lines are the node's to
    skip)."""
    if len(lines) <= EVENT_BURST:
        if lines:
            batch.append(ev.LinesReceived(lines=lines))
        return
    for start in range(0, len(lines), EVENT_BURST):
        batch.append(ev.LinesReceived(lines=lines[start : start + EVENT_BURST]))


async def _watch_signals(runtime: Runtime) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            runtime.submit(ev.DrainRequested(reason=signal.Signals(signum).name))


async def _serve(directory: Path, settings: Settings) -> int:
    peer = StdioPeer()
    runtime = Runtime(directory, settings, peer, sync_helper=True)
    stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
    stdout = trio.lowlevel.FdStream(os.dup(sys.stdout.fileno()))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            peer.writer,
            stdout,
            lambda: runtime.submit(ev.DrainRequested(reason="stdout closed by the parent")),
        )
        nursery.start_soon(_watch_signals, runtime)
        nursery.start_soon(_collect_periodically, _FULL_GC_INTERVAL_S)
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
    """Run the daemon on `directory` until it drains; returns the exit code.

    Raises FilesystemRefused (before anything is claimed or adopted) when the directory's
    filesystem fails the startup check, and LegacyDaemonRunning."""
    directory.mkdir(parents=True, exist_ok=True)
    mount, warnings = check_data_directory(
        directory, force=settings.force_filesystem, mountinfo=settings.mountinfo_path
    )
    fs_type = "unknown" if mount is None else mount.fs_type
    write_stderr(f"[Snerd] data directory {directory} is on {fs_type}\n")
    for warning in warnings:
        write_stderr(f"[Snerd] WARNING: {warning}\n")
    message = adopt_legacy_layout(directory)
    if message:
        write_stderr(f"[Snerd] {message}\n")
    if fs_type in LOCAL_FILESYSTEMS:
        settings = dataclasses.replace(
            settings, node=dataclasses.replace(settings.node, lock_proves_liveness=True)
        )
    # SIGPIPE would kill us on a closed stdout; we want EPIPE and a drain instead.
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    # The log writer thread needs the GIL after each of its system calls (woken up, write,
    # lseek, fsync) before it can go on; while the trio thread is busy, CPython makes it wait
    # up to the switch interval (5 ms by default) each time. The sync helper (a process)
    # keeps appends off that thread, but it still runs what the helper does not (a file's
    # first append, compaction, all appends should the helper die), and then each wait would
    # land on the path from a record to its message. 50 µs keeps them short; a forced switch
    # costs some µs of CPU. The daemon owns its process, so it may set this.
    sys.setswitchinterval(_SWITCH_INTERVAL_S)
    tune_gc()
    return trio.run(_serve, directory, settings)


def tune_gc() -> None:
    """The cyclic GC of the daemon process. A daemon with many queued tasks holds many
    long-lived objects (each task's state), freed by reference counting when the task ends;
    the collector finds no garbage among them, yet scanned them again and again: young
    collections every 700 allocations cost 15-20 % of the CPU of a pipelined enqueue, and
    with a deep queue each scan of the older generations stalled the daemon for tens of ms.
    So: everything imported so far is moved out of the collector's sight (`gc.freeze`);
    young collections run every 20,000 net allocations; and what survives one is frozen
    too (scanned once, never again). A cycle that becomes garbage after it was frozen waits
    for `collect_all`, which `_serve` runs every `_FULL_GC_INTERVAL_S`."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*_GC_THRESHOLDS)
    if _freeze_survivors not in gc.callbacks:
        gc.callbacks.append(_freeze_survivors)


def _freeze_survivors(phase: str, info: dict[str, Any]) -> None:
    if phase == "stop" and info["generation"] == 0:
        gc.freeze()


def collect_all() -> None:
    """A full collection, frozen objects included (cycles that became garbage since they
    were frozen); what is left is frozen again."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


async def _collect_periodically(interval_s: float) -> None:
    while True:
        await trio.sleep(interval_s)
        collect_all()
