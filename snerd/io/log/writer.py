"""The daemon's one log writer, `GroupCommitLog`: group commit of appends, and compaction installs.

This module owns every byte snerd appends to a log file (`shard-N/tasks/tasks.log`,
`shard-N/inbox/<node>.log`) and the crash-safety rules for them:

- Appends go through ONE long-lived writer thread per daemon. Everything waiting when the thread
  comes round shares one `write(2)` per file and one `fsync(2)` per file, and trio is woken
  once per batch (`TrioToken.run_sync_soon`: fire and forget, the thread does not wait for
  trio). Measured: a `trio.to_thread.run_sync` per commit was near 3x the raw fsync and
  flaky; this keeps the thread hop off the per-append path.
- An ack (`on_done` with offsets) means: written, and fsynced when the policy is `always`
  (`interval`: written, fsynced within `interval_ms`; `never`: written only). The policies are
  `snerd.config.FSYNC_POLICIES`.
- A failed or short write, or a failed fsync, is cut back off the file (`ftruncate` to the size
  before the batch) and every append of that batch for that file fails with the `OSError`:
  nothing partial stays in the log, nothing acknowledged before is touched, and the next batch
  is tried afresh (disk full is survivable).
- A new file, and a compaction's rename, is made durable by fsyncing the directory before any
  record in it is acknowledged.
- Compaction copies into `<log>.tmp` in a thread of its own (`compact.write_compacted`), then,
  ordered with the appends to that log, the writer thread renames it over the log and fsyncs
  the directory. Before the rename the old file is intact; after it the new one is complete
  and durable. A leftover temp file is removed by `recover_log`.
- With `sync_helper`, the trio thread writes a batch itself and a child process fsyncs it
  (`fsync_helper`, `fsync_child`); the writer thread still opens and repairs files.

It must never: decide anything about tasks (which record to write, what to keep — that is the
core's), hold a payload longer than one call, write a file it does not own, or acknowledge a
record before it is in the file (and, under `always`, on stable storage).

Threads: `GroupCommitLog.submit`, `append`, `compact`, `close_file` and `on_done` callbacks run
in the trio thread. The writer thread only touches the writer's own state; results travel back
through `run_sync_soon`.

Why this module stays above 800 lines: `GroupCommitLog` is one state (the queue, the files,
the batch in flight to the sync helper, the counters) guarded by one lock and shared by three
paths (the writer thread, the inline commit in the trio thread, the sync helper's requests).
Which path may touch a file at a moment is decided by reading all of that state at once
(`submit_many`), so the paths stay in one class; what has a state of its own is out of it
(reading back: `reader`, the copy: `compact`, the helper process: `fsync_helper`).
"""

from __future__ import annotations

import contextlib
import errno
import operator
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate, repeat
from types import TracebackType
from typing import Any

import outcome
import trio

from snerd.config import FSYNC_POLICIES
from snerd.core.effects import KeepRange
from snerd.io.files import (
    ensure_dir,
    fsync_dir,
    make_dirs,
    open_file,
    rename_over,
    unlink_file,
    write_all,
)
from snerd.io.log.compact import (
    CompactOutcome,
    CompactResult,
    Copied,
    compaction_tmp_path,
    write_compacted,
)
from snerd.io.log.fsync_helper import NO_REPLY, SyncHelper
from snerd.io.log.reader import LogReader

__all__ = [
    "DEFAULT_FSYNC_INTERVAL_MS",
    "DEFAULT_SYNC_HELPER",
    "FSYNC_POLICIES",
    "AppendOutcome",
    "GroupCommitLog",
    "LogStatistics",
]

#: What `on_done` receives: the start offset of each line, or the error that failed the append.
AppendOutcome = tuple[int, ...] | OSError

DEFAULT_FSYNC_INTERVAL_MS = 100

#: Whether a `GroupCommitLog` made with `sync_helper=None` uses a sync helper process.
DEFAULT_SYNC_HELPER = False


@dataclass(frozen=True, slots=True)
class LogStatistics:
    """Counters of a `GroupCommitLog` (a snapshot; read without locking, so counters taken while
    a batch is in progress may be off by that batch)."""

    #: Appends submitted / acknowledged / failed.
    appends: int
    committed: int
    failed: int
    #: Lines and bytes acknowledged.
    lines: int
    bytes: int
    #: Writer rounds that carried at least one append.
    batches: int
    #: write(2) and fsync(2) calls on log files (rollbacks included).
    writes: int
    fsyncs: int
    #: Background (interval-policy) fsyncs and directory fsyncs that failed.
    background_errors: int
    compactions: int
    #: Times the file size after a write was not what the writer expected (someone else
    #: wrote to the file); offsets were taken from the real position.
    size_mismatches: int


class _FileState:
    __slots__ = (
        "fd",
        "helper_id",
        "last_sync",
        "needs_newline",
        "path",
        "size",
        "truncate_to",
        "unsynced",
    )

    def __init__(self, path: str, fd: int, size: int, needs_newline: bool) -> None:
        self.path = path
        self.fd = fd
        #: Size of the file as far as this writer knows (its own appends included).
        self.size = size
        #: The last line does not end with a newline (a torn tail nobody cut): the next batch
        #: starts with one, so no record is ever glued onto it.
        self.needs_newline = needs_newline
        #: Writes not yet fsynced (interval policy).
        self.unsynced = False
        #: The number the sync helper knows this descriptor by (0: not handed to it yet).
        self.helper_id = 0
        self.last_sync = time.monotonic()
        #: A failed batch could not be cut off (ftruncate failed too): cut the file back to
        #: this size before anything else is written to it.
        self.truncate_to: int | None = None


class _Append:
    __slots__ = ("answered", "data", "lines", "on_done", "path")

    def __init__(
        self, path: str, lines: list[bytes], data: bytes, on_done: Callable[[AppendOutcome], None]
    ) -> None:
        self.path = path
        self.lines = lines
        #: The lines joined (what is written).
        self.data = data
        self.on_done = on_done
        #: A result for it is on its way (so a writer crash fails only the others).
        self.answered = False


_NEWLINE = b"\n"


def _checked_append(
    path: str | os.PathLike[str],
    lines: Sequence[bytes],
    on_done: Callable[[AppendOutcome], None],
) -> _Append:
    """An append job, refusing lines that are not each one whole record line: each line's
    first newline is its last byte (checked in C, not line by line: `bytes.find` of one byte
    is a memchr, where `bytes.count` over the joined batch walks it byte by byte)."""
    checked = list(lines)
    if not checked:
        raise ValueError("nothing to append")
    try:
        firsts = list(map(bytes.find, checked, repeat(_NEWLINE)))
    except TypeError:  # not all bytes (bytearray, memoryview): copy them
        checked = [bytes(line) for line in checked]
        firsts = list(map(bytes.find, checked, repeat(_NEWLINE)))
    # length - first newline == 1 for each line; a line with none (find: -1) fails the `min`.
    if min(firsts) < 0 or set(map(operator.sub, map(len, checked), firsts)) != {1}:
        raise ValueError("each line must end with its only newline")
    return _Append(os.fspath(path), checked, b"".join(checked), on_done)


class _HEntry:
    """A file's share of a batch the trio thread wrote, waiting for the helper's fsync (or
    failed: `error`)."""

    __slots__ = ("before", "error", "jobs", "offsets", "state")

    def __init__(
        self,
        state: _FileState,
        before: int,
        jobs: list[_Append],
        offsets: list[tuple[int, ...]],
        error: OSError | None,
    ) -> None:
        self.state = state
        self.before = before
        self.jobs = jobs
        self.offsets = offsets
        self.error = error


class _Control:
    """A job the writer runs in order with appends (compaction install, closing a file)."""

    __slots__ = ("answered", "fn", "on_done")

    def __init__(
        self, fn: Callable[[], object], on_done: Callable[[outcome.Outcome[object]], None]
    ) -> None:
        self.fn = fn
        self.on_done = on_done
        self.answered = False


_Done = list[tuple[Callable[[Any], None], Any]]


class GroupCommitLog:
    """The daemon's one log writer: batches appends across all files, one write and one fsync
    per file per batch, wakes trio once per batch.

    Use::

        async with GroupCommitLog(fsync="always") as log:
            log.submit(path, lines, on_done)       # non-blocking, callback style
            offsets = await log.append(path, lines)
            log.submit_compaction(path, keep, extra_lines, on_done)
            result = await log.compact(path, keep, extra_lines)

    `fsync` is one of `FSYNC_POLICIES` (see there for what an ack means under each);
    `interval_ms` applies to `interval`. `on_background_error(path, exc)` is called in the trio
    thread when an fsync the `interval` policy does after the acks fails (acknowledged records
    may then be lost: there is nothing to take back, so it can only be reported).
    `after_deliver()` is called in the trio thread after each batch of `on_done` callbacks (a
    daemon handles the outcomes there, without waiting for a task switch).
    `never_cut(path)` names files another process reads while they are written (inboxes): a
    failed batch is not cut off them, because their reader may already have taken its complete
    lines and a cut would let the next batch land at offsets it has read past. The failed
    batch's complete lines stay (its appends still fail: they may or may not be read), and a
    partial last line is closed by a newline before the next batch, so no record is glued
    onto it (the reader skips it as corrupt).

    Paths are keys as given (`os.fspath`); use one spelling per file. Files are opened on first
    use (O_RDWR | O_APPEND | O_CREAT, kept open; a new file, and missing parent directories,
    are made durable with directory fsyncs before their first ack), never through a link, and
    with `root` (the data directory) every path must lie below it and no directory between
    is followed either (`snerd.io.files`): a refused open fails that file's appends with a
    `RefusedFile`, as any failed open does.

    GIL note: after each of its system calls (the wake-up, write, lseek, fsync) the writer
    thread needs the GIL to go on. While the trio thread is busy (parsing a burst of input,
    building records), CPython makes the writer wait up to `sys.getswitchinterval()` (5 ms by
    default) each time. A daemon wants a much shorter interval (`snerdmq` sets 50 µs); this
    class does not change the process-wide setting itself.
    """

    def __init__(
        self,
        fsync: str = "always",
        *,
        interval_ms: int = DEFAULT_FSYNC_INTERVAL_MS,
        on_background_error: Callable[[str, OSError], None] | None = None,
        after_deliver: Callable[[], None] | None = None,
        never_cut: Callable[[str], bool] | None = None,
        sync_helper: bool | None = None,
        root: str | os.PathLike[str] | None = None,
    ) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync must be one of {FSYNC_POLICIES}, not {fsync!r}")
        if interval_ms <= 0:
            raise ValueError(f"interval_ms must be positive, not {interval_ms}")
        self._policy = fsync
        self._interval = interval_ms / 1000.0
        self._on_background_error = on_background_error
        self._after_deliver = after_deliver
        self._never_cut = never_cut
        self._root = None if root is None else os.fspath(root)
        self.reader = LogReader(root=self._root)
        # Shared with the writer thread, under `_cond`.
        self._cond = threading.Condition(threading.Lock())
        self._queue: list[_Append | _Control] = []
        self._idle = False
        #: The writer thread is handling a round (from taking the queue until it comes back
        #: for the next): while it is, only it touches the files.
        self._working = True
        #: Rounds of the writer thread whose results trio has not handled yet: the trio
        #: thread writes for the helper only after them, so results come in submission order.
        self._rounds_out = 0
        self._closing = False
        # Writer thread only.
        self._files: dict[str, _FileState] = {}
        #: Files whose directory entry is not known to be durable yet (new file, or a
        #: compaction rename whose directory fsync failed): fsync the directory before acking.
        self._dir_unsynced: set[str] = set()
        # Set once.
        self._token: trio.lowlevel.TrioToken | None = None
        self._thread: threading.Thread | None = None
        self._stopped: trio.Event | None = None
        self._crash: BaseException | None = None
        self._callback_errors: list[BaseException] = []
        # Compactions between submit and outcome (trio thread only).
        self._compacting = 0
        self._compactions_done: trio.Event | None = None
        # The sync helper (`sync_helper`, policy "always"): appends written in the trio thread,
        # fsynced by a helper process. `_hq`: what was written and not answered yet, in
        # submission order (changed under `_cond`); its first `_hsent` entries are covered
        # by the sync request in flight. `_held`: jobs that arrived while `_hq` was not
        # empty and cannot be written here; they go to the writer thread, in order, once it
        # is (so no file is written by both threads at once, and order is kept).
        self._use_helper = fsync == "always" and (
            DEFAULT_SYNC_HELPER if sync_helper is None else sync_helper
        )
        self._helper: SyncHelper | None = None
        self._hq: deque[_HEntry] = deque()
        self._hsent = 0
        self._held: list[_Append | _Control] = []
        #: Helper ids of descriptors the writer thread closed, for the helper to close too.
        self._helper_closed: deque[int] = deque()
        self._helper_next_id = 0
        self._helper_drained: trio.Event | None = None
        # Counters (written by the writer thread; `appends` by the trio thread).
        self._appends = 0
        self._committed = 0
        self._failed = 0
        self._lines = 0
        self._bytes = 0
        self._batches = 0
        self._writes = 0
        self._fsyncs = 0
        self._background_errors = 0
        self._compactions = 0
        self._size_mismatches = 0

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> GroupCommitLog:
        if self._thread is not None:
            raise RuntimeError("GroupCommitLog can be entered once")
        self._token = trio.lowlevel.current_trio_token()
        self._stopped = trio.Event()
        self._thread = threading.Thread(target=self._run, name="snerd-log-writer", daemon=True)
        self._thread.start()
        if self._use_helper:
            try:
                self._helper = SyncHelper.start()
            except OSError:
                self._helper = None  # the writer thread fsyncs, as without the helper
            else:
                trio.lowlevel.spawn_system_task(self._helper_replies, self._helper)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._stopped is not None and self._thread is not None
        # Bounded by the I/O already queued; an append or compaction in flight must finish or
        # fail, never be abandoned half-done.
        with trio.CancelScope(shield=True):
            while self._compacting:
                self._compactions_done = trio.Event()
                await self._compactions_done.wait()
            while self._hq or self._held:
                self._helper_drained = trio.Event()
                await self._helper_drained.wait()
            with self._cond:
                self._closing = True
                self._cond.notify()
            await self._stopped.wait()
        self._thread.join()
        helper, self._helper = self._helper, None
        if helper is not None:
            helper.close()
        self.reader.close()
        if self._crash is not None:
            raise RuntimeError("log writer thread crashed") from self._crash
        if self._callback_errors:
            raise RuntimeError("an on_done callback raised") from self._callback_errors[0]

    # -- trio-side API -----------------------------------------------------------------------

    def submit(
        self,
        path: str | os.PathLike[str],
        lines: Sequence[bytes],
        on_done: Callable[[AppendOutcome], None],
    ) -> None:
        """Queue `lines` (each a whole record line ending in its only newline, e.g. from
        `encode_record`) for appending to `path`. Returns at once; later, in the trio thread,
        `on_done` gets the start offset of each line once they are committed, or the `OSError`
        that failed them (then none of them is in the file). Lines of one call are contiguous
        and in order; calls are committed in submission order per file. `on_done` must not
        raise (an exception is re-raised from `__aexit__`)."""
        self.submit_many([(path, lines, on_done)])

    def submit_many(
        self,
        appends: Sequence[
            tuple[str | os.PathLike[str], Sequence[bytes], Callable[[AppendOutcome], None]]
        ],
        *,
        inline: bool = False,
    ) -> None:
        """`submit` each (path, lines, on_done) in order, taking the writer's lock once for all
        of them (a daemon hands over a burst of appends at a time).

        With `inline`, if the writer thread is idle (asleep, nothing queued), the batch is
        committed here, in the calling thread, exactly as the writer would (one write and one
        fsync per file), and the callbacks and `after_deliver` run before this returns. That
        blocks the caller for the fsync, and spares the two thread hand-offs (wake the writer,
        wake trio: about 110 us each on this kind of VM) that otherwise sit on the path of a
        lone append. While the writer is busy the batch is queued as usual, so a stream of
        appends still overlaps CPU work with fsyncs. The writer cannot wake while the caller
        holds its lock, so its state is never used by two threads at once."""
        jobs: list[_Append] = []
        for path, lines, on_done in appends:
            jobs.append(_checked_append(path, lines, on_done))
        if not jobs:
            return
        done: _Done = []
        with self._cond:
            if self._closing or self._token is None:
                raise RuntimeError("log is not open")
            self._appends += len(jobs)
            writer_free = (
                not self._working and not self._rounds_out and not self._queue and not self._held
            )
            if inline and writer_free and not self._hq:
                # The writer sleeps in `_cond.wait` and needs this lock to wake up.
                self._process(list(jobs), done)
            elif writer_free and self._helper is not None and self._helper_ready(jobs):
                self._helper_write(jobs, done)
            elif self._hq:
                self._held.extend(jobs)  # behind what the helper syncs, in order
            else:
                self._queue.extend(jobs)
                if self._idle:
                    self._cond.notify()
        if done:
            self._deliver(done)

    async def append(self, path: str | os.PathLike[str], lines: Sequence[bytes]) -> tuple[int, ...]:
        """Append and wait for the commit; return the start offset of each line. Raises the
        `OSError` that failed the append. Cancellation stops the wait, not the append: a
        cancelled append may still commit."""
        task = trio.lowlevel.current_task()
        waiting = True

        def on_done(result: AppendOutcome) -> None:
            if waiting:
                trio.lowlevel.reschedule(task, outcome.Value(result))

        def abort(_: Any) -> trio.lowlevel.Abort:
            nonlocal waiting
            waiting = False
            return trio.lowlevel.Abort.SUCCEEDED

        self.submit(path, lines, on_done)
        result: AppendOutcome = await trio.lowlevel.wait_task_rescheduled(abort)
        if isinstance(result, OSError):
            raise result
        return result

    def submit_compaction(
        self,
        path: str | os.PathLike[str],
        keep: Sequence[KeepRange],
        extra_lines: Sequence[bytes],
        on_done: Callable[[CompactOutcome], None],
    ) -> None:
        """Rewrite the log at `path`: the byte ranges `keep` (in the order given), then
        `extra_lines`; replace the log atomically. Returns at once; later, in the trio thread,
        `on_done` gets a `CompactResult` (where everything landed) or an `OSError` (then the
        old log is intact and still in use; ranges that are not whole lines of the current
        file are reported as EINVAL).

        The copy is written to `<log>.tmp` and fsynced by a helper thread, so appends to
        other files go on meanwhile. Then, through the writer thread (so it is ordered with
        the appends to this file), the log is checked to be the very file and size that was
        copied — if anything was appended since, the compaction fails rather than lose it —
        the temp file is renamed over it, and the directory fsynced. A crash at any point loses
        nothing: before the rename the old log is intact (the temp file is removed by
        `recover_log`), after it the new one is complete and durable. The caller must not
        append to `path` until `on_done` ran (the core issues `Compact` only then)."""
        key = os.fspath(path)
        tmp = compaction_tmp_path(key)
        ranges = tuple(keep)
        extra = [bytes(line) for line in extra_lines]
        for line in extra:
            if line.find(b"\n") != len(line) - 1:
                raise ValueError("each line must end with its only newline")
        token = self._token
        if token is None or self._closing:
            raise RuntimeError("log is not open")
        root = self._root
        self._compacting += 1

        def finished(result: outcome.Outcome[object]) -> None:  # trio thread
            self._compacting -= 1
            if not self._compacting and self._compactions_done is not None:
                self._compactions_done.set()
            self.reader.invalidate(key)
            if isinstance(result, outcome.Error):
                with contextlib.suppress(OSError):
                    unlink_file(tmp, root=root)  # no-op when the rename happened
                on_done(_as_oserror(result.error))
            else:
                assert isinstance(result, outcome.Value)
                value = result.value
                assert isinstance(value, CompactResult)
                on_done(value)

        def install(copied: Copied) -> CompactResult:  # writer thread
            self._install(key, tmp, copied)
            return CompactResult(copied.offsets, copied.lengths, copied.size)

        def copy(expected_size: int | None) -> None:  # helper thread
            copied = outcome.capture(write_compacted, key, tmp, ranges, extra, expected_size, root)
            if isinstance(copied, outcome.Error):
                token.run_sync_soon(finished, copied)
                return
            copied_value = copied.value
            self._enqueue(_Control(lambda: install(copied_value), finished))

        def barrier() -> None:  # writer thread, after every append submitted before this call
            state = self._files.get(key)
            size = state.size if state is not None else None
            threading.Thread(
                target=copy, args=(size,), name="snerd-log-compact", daemon=True
            ).start()

        def barrier_done(result: outcome.Outcome[object]) -> None:  # trio thread
            if isinstance(result, outcome.Error):
                finished(result)

        # The copy starts once every append submitted before this call has been written, and
        # copies exactly the file the writer knows; an append submitted after it makes the
        # compaction fail (size check in `write_compacted` and in `_install`) instead of
        # being lost with the old file.
        self._enqueue(_Control(barrier, barrier_done))

    async def compact(
        self,
        path: str | os.PathLike[str],
        keep: Sequence[KeepRange],
        extra_lines: Sequence[bytes] = (),
    ) -> CompactResult:
        """`submit_compaction` and wait for it; raises the `OSError`. Not cancellable: whether
        the log was replaced must be known to the caller."""
        task = trio.lowlevel.current_task()

        def on_done(result: CompactOutcome) -> None:
            trio.lowlevel.reschedule(task, outcome.Value(result))

        self.submit_compaction(path, keep, extra_lines, on_done)
        result: CompactOutcome = await trio.lowlevel.wait_task_rescheduled(
            lambda _: trio.lowlevel.Abort.FAILED
        )
        if isinstance(result, OSError):
            raise result
        return result

    async def close_file(self, path: str | os.PathLike[str]) -> None:
        """Close the writer's and reader's descriptors for `path` once every append submitted
        before has finished (a released shard, a removed inbox segment)."""
        key = os.fspath(path)
        await self._control(lambda: self._close_state(key))
        self.reader.invalidate(key)

    def read_record(self, path: str | os.PathLike[str], offset: int, length: int) -> dict[str, Any]:
        """`LogReader.read_record` with this log's reader (kept valid across compactions)."""
        return self.reader.read_record(path, offset, length)

    def statistics(self) -> LogStatistics:
        return LogStatistics(
            appends=self._appends,
            committed=self._committed,
            failed=self._failed,
            lines=self._lines,
            bytes=self._bytes,
            batches=self._batches,
            writes=self._writes,
            fsyncs=self._fsyncs,
            background_errors=self._background_errors,
            compactions=self._compactions,
            size_mismatches=self._size_mismatches,
        )

    async def _control(self, fn: Callable[[], object]) -> object:
        task = trio.lowlevel.current_task()

        def on_done(result: outcome.Outcome[object]) -> None:
            trio.lowlevel.reschedule(task, result)

        if self._closing or self._token is None:
            raise RuntimeError("log is not open")
        self._enqueue(_Control(fn, on_done))
        # Not cancellable: the job runs anyway and its outcome (a renamed log) must be known.
        return await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)

    def _enqueue(self, job: _Control) -> None:
        """Queue a control job (any thread; the log stays open until compactions are done)."""
        with self._cond:
            if self._crash is None:
                if self._hq or self._held:
                    self._held.append(job)  # after the appends the helper syncs
                    return
                self._queue.append(job)
                if self._idle:
                    self._cond.notify()
                return
        assert self._token is not None
        failed: outcome.Outcome[object] = outcome.Error(RuntimeError("log writer crashed"))
        self._token.run_sync_soon(job.on_done, failed)

    def _deliver_round(self, done: _Done) -> None:
        """`_deliver` for a round of the writer thread (and the helper lets go of the
        descriptors the round closed: a compacted log's old file is freed then)."""
        with self._cond:
            self._rounds_out -= 1
            helper = self._helper
            if helper is not None:
                try:
                    while self._helper_closed:
                        helper.forget(self._helper_closed.popleft())
                except OSError:
                    pass  # the helper is gone: its reader handles that
        self._deliver(done)

    def _deliver(self, done: _Done) -> None:
        """Runs in the trio thread (via run_sync_soon): hand each result to its callback, then
        call `after_deliver` once for the whole batch."""
        for callback, result in done:
            try:
                callback(result)
            except BaseException as exc:  # never let a callback kill the trio run loop
                self._callback_errors.append(exc)
        if self._after_deliver is not None:
            try:
                self._after_deliver()
            except BaseException as exc:
                self._callback_errors.append(exc)

    # -- the sync helper (trio thread) -----------------------------------------------------

    def _helper_ready(self, jobs: list[_Append]) -> bool:
        """Every file of `jobs` is open and settled (no cut to retry, its directory entry
        durable): the trio thread may write to it. A file's first append, and the one after
        a failure, go through the writer thread, which opens and repairs files."""
        files = self._files
        for job in jobs:
            state = files.get(job.path)
            if state is None or state.truncate_to is not None or job.path in self._dir_unsynced:
                return False
        return True

    def _helper_write(self, jobs: list[_Append], done: _Done) -> None:
        """Under `_cond`, the writer thread idle: write each file's share of `jobs` (one
        `write`, as `_commit` does) and queue it for the helper's next fsync. A write that
        fails is cut off and fails its appends, answered in order with the rest."""
        assert self._helper is not None
        self._batches += 1
        batch: dict[str, list[_Append]] = {}
        for job in jobs:
            per_file = batch.get(job.path)
            if per_file is None:
                batch[job.path] = [job]
            else:
                per_file.append(job)
        for path, per_file in batch.items():
            state = self._files[path]
            try:
                before, offsets = self._write_share(state, per_file)
            except OSError as exc:
                self._hq.append(_HEntry(state, state.size, per_file, [], exc))
                continue
            self._hq.append(_HEntry(state, before, per_file, offsets, None))
        if not self._hsent:
            self._helper_send(done)

    def _helper_send(self, done: _Done) -> None:
        """Under `_cond`, no request in flight: ask the helper to fsync every file written
        since the last request; answer at once the failed appends at the head of the queue."""
        helper = self._helper
        assert helper is not None and not self._hsent
        self._answer_head(done)
        files: dict[int, _FileState] = {}
        try:
            while self._helper_closed:
                helper.forget(self._helper_closed.popleft())
            for entry in self._hq:
                if entry.error is None:
                    state = entry.state
                    if not state.helper_id:
                        self._helper_next_id += 1
                        state.helper_id = self._helper_next_id
                        helper.adopt(state.helper_id, state.fd)
                    files[state.helper_id] = state
            if not files:
                return
            self._hsent = len(self._hq)
            self._fsyncs += len(files)
            helper.sync(list(files))
        except OSError:
            # The helper is gone: its reader sees the end of the socket and fails all this
            # (`_helper_lost`), as it does what was sent before.
            self._hsent = len(self._hq)

    def _answer_head(self, done: _Done) -> None:
        """Move the answered entries at the head of `_hq` into `done`, in order."""
        hq = self._hq
        while hq and self._hsent == 0 and (error := hq[0].error) is not None:
            self._fail(hq.popleft().jobs, error, done)
        if not hq and not self._hsent:
            self._release_held()

    def _release_held(self) -> None:
        """Under `_cond`, `_hq` empty: what waited behind it goes to the writer thread."""
        if self._held:
            self._queue.extend(self._held)
            self._held = []
            if self._idle:
                self._cond.notify()
        if self._helper_drained is not None:
            self._helper_drained.set()

    async def _helper_replies(self, helper: SyncHelper) -> None:
        """The helper's answers, one per request: the entries it covered are durable (or the
        file it names failed its fsync: its entries fail and are cut off, and so are the ones
        written to it since, which the cut takes too)."""
        while True:
            try:
                failed = await helper.reply()
            except (OSError, EOFError, trio.ClosedResourceError) as exc:
                self._helper_lost(helper, exc)
                return
            self._helper_answered(failed)

    def poll_helper(self) -> None:
        """(trio thread) Take the sync helper's answers that have come, without waiting:
        what they cover is answered now (callbacks, `after_deliver`). A caller busy for a
        while (a long burst of lines) calls this between its steps, so that acks and
        `execute`s whose records are durable need not wait until it is done."""
        helper = self._helper
        while helper is not None and self._hsent and self._helper is helper:
            try:
                failed = helper.reply_nowait()
            except (OSError, EOFError):
                return  # the helper is gone: its reader (`_helper_replies`) sees it too
            if failed is NO_REPLY:
                return
            self._helper_answered(failed)

    def _helper_answered(self, failed: tuple[int, int] | None) -> None:
        """The helper's answer to the request out (`_hsent` entries): see `_helper_replies`."""
        done: _Done = []
        with self._cond:
            covered = [self._hq.popleft() for _ in range(self._hsent)]
            self._hsent = 0
            if failed is not None:
                bad_id, err = failed
                self._cut_written(
                    [e for e in (*covered, *self._hq) if e.state.helper_id == bad_id],
                    OSError(err, os.strerror(err)),
                )
            for entry in covered:
                if entry.error is not None:
                    self._fail(entry.jobs, entry.error, done)
                else:
                    self._succeed(entry.jobs, entry.offsets, done)
            if self._hq:
                self._helper_send(done)
            else:
                self._release_held()
        if done:
            self._deliver(done)

    def _cut_written(self, entries: list[_HEntry], error: OSError) -> None:
        """Under `_cond`: `entries`, written and not known durable, fail with `error`; each
        file is cut back to before the first of them (which takes any written after it)."""
        cut: dict[_FileState, int] = {}
        for entry in entries:
            if entry.error is None:
                entry.error = error
                cut[entry.state] = min(cut.get(entry.state, entry.before), entry.before)
        for state, before in cut.items():
            self._rollback(state, before)

    def _helper_lost(self, helper: SyncHelper, exc: BaseException) -> None:
        """The helper died or its socket broke: whatever it had not answered fails (cut off),
        and from now on the writer thread fsyncs, as without a helper."""
        done: _Done = []
        with self._cond:
            if self._helper is helper:
                self._helper = None
            self._cut_written(
                list(self._hq), OSError(errno.EIO, f"the log's sync helper is gone ({exc!r})")
            )
            while self._hq:
                entry = self._hq.popleft()
                assert entry.error is not None
                self._fail(entry.jobs, entry.error, done)
            self._hsent = 0
            self._release_held()
        helper.close()
        if done:
            self._deliver(done)

    # -- writer thread -----------------------------------------------------------------------

    def _run(self) -> None:
        token = self._token
        assert token is not None and self._stopped is not None
        jobs: list[_Append | _Control] = []
        done: _Done = []
        try:
            while True:
                with self._cond:
                    while not self._queue and not self._closing:
                        timeout = self._next_sync_due()
                        if timeout is not None and timeout <= 0:
                            break
                        self._idle = True
                        self._cond.wait(timeout)
                        self._idle = False
                    jobs, self._queue = self._queue, []
                    self._working = True
                    closing = self._closing
                done = []
                if jobs:
                    self._process(jobs, done)
                if self._policy == "interval":
                    self._background_sync(done, force=closing and not jobs)
                with self._cond:
                    # Done with the files; until trio has handled this round's results, it
                    # still leaves the appends to this thread (`_rounds_out`).
                    self._working = False
                    if done:
                        self._rounds_out += 1
                if done:
                    token.run_sync_soon(self._deliver_round, done)
                    done = []
                if closing and not jobs:
                    break
                jobs = []
        except BaseException as exc:  # a bug: fail everything unanswered, refuse new work
            with self._cond:
                self._crash = exc
                self._closing = True
                jobs = [*jobs, *self._queue]
                self._queue = []
            for job in jobs:
                if job.answered:
                    continue
                if isinstance(job, _Append):
                    done.append((job.on_done, OSError(errno.EIO, f"log writer crashed: {exc!r}")))
                else:
                    done.append((job.on_done, outcome.Error(RuntimeError("log writer crashed"))))
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(self._deliver, done)
        finally:
            for state in self._files.values():
                with contextlib.suppress(OSError):
                    os.close(state.fd)
            self._files.clear()
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(self._stopped.set)

    def _next_sync_due(self) -> float | None:
        """Seconds until the next interval fsync is due (None: nothing waiting for one)."""
        if self._policy != "interval":
            return None
        due = [s.last_sync + self._interval for s in self._files.values() if s.unsynced]
        if not due:
            return None
        return min(due) - time.monotonic()

    def _process(self, jobs: list[_Append | _Control], done: _Done) -> None:
        batch: dict[str, list[_Append]] = {}
        for job in jobs:
            if isinstance(job, _Append):
                per_file = batch.get(job.path)
                if per_file is None:
                    batch[job.path] = [job]
                else:
                    per_file.append(job)
            else:
                if batch:
                    self._commit(batch, done)
                    batch = {}
                job.answered = True
                done.append((job.on_done, outcome.capture(job.fn)))
        if batch:
            self._commit(batch, done)

    def _commit(self, batch: dict[str, list[_Append]], done: _Done) -> None:
        """One group commit: one write per file, then one fsync per file, then the acks."""
        self._batches += 1
        written: list[tuple[_FileState, int, list[_Append], list[tuple[int, ...]]]] = []
        for path, jobs in batch.items():
            try:
                state = self._state(path)
                if state.truncate_to is not None:
                    self._truncate(state, state.truncate_to)
                if path in self._dir_unsynced:
                    fsync_dir(os.path.dirname(path) or ".")
                    self._dir_unsynced.discard(path)
            except OSError as exc:
                self._fail(jobs, exc, done)
                continue
            try:
                before, offsets = self._write_share(state, jobs)
            except OSError as exc:
                self._fail(jobs, exc, done)
                continue
            written.append((state, before, jobs, offsets))
        for state, before, jobs, offsets in written:
            if self._policy == "always":
                try:
                    self._fsyncs += 1
                    os.fsync(state.fd)
                except OSError as exc:
                    # fsync(2) failed: which dirty pages reached the disk is unknown, and on Linux
                    # a retried fsync may report success for pages that were dropped
                    # ("fsyncgate", PostgreSQL 2018). Records before this batch were fsynced by
                    # earlier batches and are safe; this batch's are not known to be, so cut
                    # them off and report failure. The core treats the appends as not done.
                    self._rollback(state, before)
                    self._fail(jobs, exc, done)
                    continue
                state.unsynced = False
                state.last_sync = time.monotonic()
            self._succeed(jobs, offsets, done)

    def _succeed(self, jobs: list[_Append], offsets: list[tuple[int, ...]], done: _Done) -> None:
        """The appends `jobs` are durable, their lines at `offsets`: answer each."""
        for job, job_offsets in zip(jobs, offsets, strict=True):
            job.answered = True
            self._committed += 1
            self._lines += len(job_offsets)
            self._bytes += len(job.data)
            done.append((job.on_done, job_offsets))

    def _write_share(
        self, state: _FileState, jobs: list[_Append]
    ) -> tuple[int, list[tuple[int, ...]]]:
        """Write a file's share of a batch in one `write(2)`; return where it starts and the
        offset of each job's lines. A failed write is cut back off and re-raised."""
        # Someone else may have written to the file or cut it since this writer's last write
        # (a daemon that took the shard over meanwhile, and then crashed in the middle of an
        # append): then learn where it ends and whether it ends on a newline, so that this
        # batch never glues a record onto a line this writer did not write, and a rollback
        # cuts only this batch. One fstat per file per batch, beside a write and an fsync.
        size = os.fstat(state.fd).st_size
        if size != state.size:
            self._size_mismatches += 1
            state.needs_newline = size > 0 and os.pread(state.fd, 1, size - 1) != b"\n"
            state.size = size
        before = state.size
        parts: list[bytes] = [b"\n"] if state.needs_newline else []
        pos = before + len(parts)
        offsets: list[tuple[int, ...]] = []
        for job in jobs:
            starts = list(accumulate(map(len, job.lines), initial=pos))
            pos = starts.pop()
            offsets.append(tuple(starts))
            parts.append(job.data)
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        try:
            self._writes += write_all(state.fd, data)
            end = os.lseek(state.fd, 0, os.SEEK_CUR)
        except OSError:
            self._writes += 1
            self._rollback(state, before)
            raise
        if end != pos:
            # O_APPEND put the data at the real end of file, which is not where we thought:
            # someone else wrote to the file. Our lines are the last len(data) bytes.
            self._size_mismatches += 1
            shift = end - pos
            before += shift
            offsets = [tuple(o + shift for o in starts) for starts in offsets]
        state.size = end
        state.needs_newline = False
        state.unsynced = True
        return before, offsets

    def _fail(self, jobs: list[_Append], exc: OSError, done: _Done) -> None:
        for job in jobs:
            job.answered = True
            self._failed += 1
            # One exception object per waiter: they are raised in different tasks.
            copy = OSError(exc.errno, exc.strerror, job.path) if exc.errno else OSError(str(exc))
            done.append((job.on_done, copy))

    def _rollback(self, state: _FileState, size: int) -> None:
        """Cut a failed batch off the file: ftruncate(2) back to the size before it, so no
        partial record remains and the next batch starts on a line boundary. If even that
        fails, the file is marked and the next batch for it first retries the cut (and fails
        if it still cannot be made), so nothing is ever appended after a partial record.
        A `never_cut` file keeps what was written; the next batch starts on a new line."""
        if self._never_cut is not None and self._never_cut(state.path):
            try:
                end = os.fstat(state.fd).st_size
                last = os.pread(state.fd, 1, end - 1) if end > size else b"\n"
            except OSError:
                end, last = max(state.size, size), b""
            state.size = max(end, size)
            state.needs_newline = last != b"\n"
            return
        state.size = size
        try:
            self._truncate(state, size)
        except OSError:
            state.truncate_to = size

    def _truncate(self, state: _FileState, size: int) -> None:
        os.ftruncate(state.fd, size)
        state.truncate_to = None
        if self._policy != "never":
            # Make the cut durable too; a later successful fsync would do it as well (fsync
            # flushes the inode's size), so a failure here is not fatal.
            try:
                self._fsyncs += 1
                os.fsync(state.fd)
            except OSError:
                self._background_errors += 1

    def _background_sync(self, done: _Done, *, force: bool) -> None:
        """Interval policy: fsync each file written to more than `interval` ago."""
        now = time.monotonic()
        for state in list(self._files.values()):
            if not state.unsynced or (not force and now - state.last_sync < self._interval):
                continue
            state.unsynced = False
            state.last_sync = now
            try:
                self._fsyncs += 1
                os.fsync(state.fd)
            except OSError as exc:
                # Acknowledged records may be lost; nothing can take the acks back. Report it.
                self._background_errors += 1
                if self._on_background_error is not None:
                    done.append((_Bind(self._on_background_error, state.path), exc))

    def _state(self, path: str) -> _FileState:
        state = self._files.get(path)
        if state is not None:
            return state
        flags = os.O_RDWR | os.O_APPEND
        root = self._root
        try:
            fd = open_file(path, flags, root=root)
        except FileNotFoundError:
            parent = os.path.dirname(path) or "."
            if root is None:
                ensure_dir(parent)
            else:
                make_dirs(parent, root=root)
            try:
                fd = open_file(path, flags | os.O_CREAT | os.O_EXCL, 0o644, root=root)
            except FileExistsError:  # made meanwhile (or a link: refused here)
                fd = open_file(path, flags, root=root)
            else:
                # The new directory entry is not durable until the directory is fsynced.
                self._dir_unsynced.add(path)
        try:
            size = os.fstat(fd).st_size
            needs_newline = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
        except OSError:
            os.close(fd)
            raise
        state = _FileState(path, fd, size, needs_newline)
        self._files[path] = state
        return state

    def _close_state(self, path: str) -> None:
        state = self._files.pop(path, None)
        if state is None:
            return
        if state.helper_id:
            self._helper_closed.append(state.helper_id)  # (a deque: any thread)
        if state.unsynced and self._policy == "interval":
            with contextlib.suppress(OSError):
                self._fsyncs += 1
                os.fsync(state.fd)
        with contextlib.suppress(OSError):
            os.close(state.fd)

    def _install(self, path: str, tmp: str, copied: Copied) -> None:
        """Writer thread: rename a finished compaction over the log, if the log is still the
        file and size that was copied."""
        state = self._files.get(path)
        current = os.lstat(path)
        if (current.st_ino, current.st_dev) != (copied.src_ino, copied.src_dev):
            raise OSError(errno.ESTALE, "log was replaced during compaction", path)
        # The file's own size as well as this process's idea of it: another process may have
        # appended (a daemon that took the shard over while this one was paused past its lease,
        # say); renaming the copy over the log would unlink what it wrote.
        size = max(current.st_size, state.size if state is not None else 0)
        if size != copied.src_size:
            raise OSError(
                errno.EAGAIN,
                f"log grew during compaction ({copied.src_size} -> {size} bytes)",
                path,
            )
        rename_over(tmp, path, self._root)
        # From here on the new file is the log, whatever happens next: report success.
        self._compactions += 1
        self._close_state(path)
        try:
            fsync_dir(os.path.dirname(path) or ".")
        except OSError:
            # The rename may not survive a power loss until the directory is fsynced: appends
            # to the new file are not acknowledged before that has succeeded.
            self._background_errors += 1
            self._dir_unsynced.add(path)


class _Bind:
    """`functools.partial` for one leading argument, typed."""

    __slots__ = ("arg", "fn")

    def __init__(self, fn: Callable[[str, OSError], None], arg: str) -> None:
        self.fn = fn
        self.arg = arg

    def __call__(self, exc: OSError) -> None:
        self.fn(self.arg, exc)


def _as_oserror(exc: BaseException) -> OSError:
    """Callbacks get an OSError; a bad request (ValueError, CorruptRecord) becomes EINVAL."""
    if isinstance(exc, OSError):
        return exc
    return OSError(errno.EINVAL, f"{type(exc).__name__}: {exc}")
