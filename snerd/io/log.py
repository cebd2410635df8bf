"""Shard logs on disk: the group-committing writer, reading back, compaction, atomic replace.

This module owns every byte snerd writes to a log file (`shard-N/tasks/tasks.log`,
`shard-N/inbox/<node>.log`) and the crash-safety rules for them:

- Appends go through ONE long-lived writer thread per daemon (`GroupCommitLog`). Everything
  waiting when the thread comes round shares one `write(2)` per file and one `fsync(2)` per
  file, and trio is woken once per batch (`TrioToken.run_sync_soon`: fire and forget, the
  thread does not wait for trio). DESIGN §6: a `trio.to_thread.run_sync` per commit was near
  3x the raw fsync and flaky; this keeps the thread hop off the per-append path.
- An ack (`on_done` with offsets) means: written, and fsynced when the policy is `always`
  (`interval`: written, fsynced within `interval_ms`; `never`: written only).
- A failed or short write, or a failed fsync, is cut back off the file (`ftruncate` to the size
  before the batch) and every append of that batch for that file fails with the `OSError`:
  nothing partial stays in the log, nothing acknowledged before is touched, and the next batch
  is tried afresh (disk full is survivable).
- A new file, and a compaction's rename, is made durable by fsyncing the directory before any
  record in it is acknowledged.
- Compaction creates `<log>.tmp` beside the log exclusively (a leftover is unlinked first, so a
  link planted there is removed, never written through), fsyncs it, renames it over the log and
  fsyncs the directory. Before the rename the old file is intact; after it the new one is
  complete and durable. A leftover temp file is removed by `recover_log`.
- Reading back (`read_log`) never stops at a bad line. A last line without its newline is judged
  by the core (`snerd.core.records.scan_tail`): a whole record whose newline was lost gets its
  newline back, a torn write is cut (`repair_tail` / `recover_log`), before the log is appended
  to again (upstream bug 6.1.1: the next record glued onto a torn one and both were lost).
- Every file is opened through `snerd.io.files`: never through a symbolic link, only regular
  files; with `root` (the data directory) no directory below it is followed either.

It must never: decide anything about tasks (which record to write, what to keep — that is the
core's), hold a payload longer than one call, write a file it does not own, or acknowledge a
record before it is in the file (and, under `always`, on stable storage).

Threads: `GroupCommitLog.submit`, `append`, `compact`, `close_file` and `on_done` callbacks run
in the trio thread. The writer thread only touches the writer's own state; results travel back
through `run_sync_soon`. `LogReader` takes a lock and can be used from any thread.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import operator
import os
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, repeat
from types import TracebackType
from typing import Any, NamedTuple, Protocol

import outcome
import trio

from snerd.core.effects import KeepRange, NewRecord
from snerd.core.events import LogRecord
from snerd.core.records import (
    LINE_LIMIT,
    CorruptRecord,
    ScanResult,
    decode_line_at,
    encode_record,
    merge_base,
    scan,
    scan_tail,
)
from snerd.io.files import ensure_dir, make_dirs, open_file, replace_file, unlink_file

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_FSYNC_INTERVAL_MS",
    "FSYNC_POLICIES",
    "AppendOutcome",
    "CompactOutcome",
    "CompactResult",
    "GroupCommitLog",
    "LogChunk",
    "LogReader",
    "LogStatistics",
    "RecordReader",
    "TailRepair",
    "atomic_replace",
    "atomic_write",
    "compaction_tmp_path",
    "fsync_dir",
    "materialize",
    "read_log",
    "read_record",
    "recover_log",
    "repair_tail",
]

#: `SNERD_FSYNC` values. `always`: an ack means written and fsynced (group commit makes it
#: cheap). `interval`: an ack means written; each written file is fsynced at most every
#: `interval_ms` and at the latest `interval_ms` after a write, so a power loss can take the last
#: `interval_ms` of acknowledged records (a process crash loses nothing: the page cache survives
#: it). `never`: an ack means written; the OS writes back when it likes.
FSYNC_POLICIES = ("always", "interval", "never")
#: What `on_done` receives: the start offset of each line, or the error that failed the append.
AppendOutcome = tuple[int, ...] | OSError

DEFAULT_FSYNC_INTERVAL_MS = 100
#: Reading a log in 64 KiB chunks measured about twice as fast per record as 1 MiB chunks here
#: (fewer live objects per chunk for the cyclic GC to walk, and the chunk stays in cache).
DEFAULT_CHUNK_BYTES = 1 << 16
#: Compaction output is written in pieces of about this size.
_COPY_BUFFER = 1 << 20

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


# --------------------------------------------------------------------------------------------
# Small durable-file helpers
# --------------------------------------------------------------------------------------------


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory so that entries created, removed or renamed in it are durable.

    fsync(2): "Calling fsync() does not necessarily ensure that the entry in the directory
    containing the file has also reached disk. For that an explicit fsync() on a file descriptor
    for the directory is also needed." Some filesystems (and FUSE mounts) answer EINVAL for a
    directory: there is nothing more we can do there, so that one error is ignored.

    The path is followed even through a link: an fsync reads and writes nothing, and the files
    in the directory were opened without following one (`snerd.io.files`).
    """
    fd = os.open(path, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes | memoryview) -> int:
    """Write all of `data`; return the number of write(2) calls.

    write(2): "the number of bytes written may be less than count if, for example, there is
    insufficient space on the underlying physical medium, or the call was interrupted by a
    signal handler". A short write is followed by a write of the rest (Linux also caps one
    write at 0x7ffff000 bytes); when space really ran out, that next write raises ENOSPC.
    """
    view = memoryview(data)
    calls = 0
    while view:
        n = os.write(fd, view)
        calls += 1
        if n <= 0:  # not expected for a regular file; never loop forever
            raise OSError(errno.EIO, "write returned 0 bytes")
        view = view[n:]
    return calls


def _rename(src: str, dst: str, root: str | None = None) -> None:
    """rename(2) `src` over `dst` (one directory, reached without following a link below
    `root`), tolerating the NFS case where the rename happened but the reply was lost.

    rename(2), NFS notes: a retransmitted RENAME can fail although the first one succeeded. If
    `dst` now is the inode `src` was, the rename did happen.
    """
    src_stat = os.lstat(src)
    try:
        replace_file(src, dst, root=root)
    except OSError:
        try:
            dst_stat = os.lstat(dst)
        except OSError:
            raise
        if (dst_stat.st_ino, dst_stat.st_dev) != (src_stat.st_ino, src_stat.st_dev):
            raise


def _create_exclusive(path: str, root: str | None) -> int:
    """Create `path` afresh for writing: a leftover entry (a crash's temp file, or a link
    someone planted) is unlinked first — the link itself, never its target (unlink(2)) — and
    the file is created with O_CREAT | O_EXCL, which fails rather than open anything that
    appeared meanwhile (open(2): with O_EXCL, "symbolic links are not followed")."""
    with contextlib.suppress(FileNotFoundError):
        unlink_file(path, root=root)
    return open_file(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, root=root)


def atomic_replace(path: str | os.PathLike[str], data: bytes, *, tmp_suffix: str = ".tmp") -> None:
    """Replace a small file atomically and durably: temp file in the same directory, write,
    fsync, rename over `path`, fsync the directory (membership.json uses this).

    rename(2) is atomic: a reader sees the old content or the new, never a mix; the fsync before
    the rename makes sure the name never points at a file whose data is not on disk, and the
    directory fsync makes the rename itself durable (upstream bug 6.1.5 skipped it). The temp
    file is `path + tmp_suffix` (upstream's `membership.json.tmp`), so callers must serialise
    writers (membership.json is written under `.membership.lock`). On error the temp file is
    removed and `path` is untouched. The temp file is created exclusively (`_create_exclusive`)
    and the rename replaces the entry `path`, so no link there is ever written through.
    """
    target = os.fspath(path)
    tmp = target + tmp_suffix
    fd = _create_exclusive(tmp, None)
    try:
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        _rename(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            unlink_file(tmp)
        raise
    fsync_dir(os.path.dirname(target) or ".")


#: The same function under the other name callers know it by.
atomic_write = atomic_replace


def compaction_tmp_path(path: str | os.PathLike[str]) -> str:
    """The temp file compaction writes beside a log: `tasks.log` -> `tasks.tmp` (upstream's
    name, so a leftover from either daemon is recognised)."""
    root, _ext = os.path.splitext(os.fspath(path))
    return root + ".tmp"


# --------------------------------------------------------------------------------------------
# Reading back
# --------------------------------------------------------------------------------------------


class LogChunk(NamedTuple):
    """One chunk of a log read in file order (`read_log`)."""

    #: Well-formed records, in file order.
    records: list[LogRecord]
    #: Lines that are not records: (offset, reason). Skipped, never fatal.
    corrupt: list[tuple[int, str]]
    #: Absolute offset just past the last complete line read so far: where reading resumes.
    end: int
    #: True on the last chunk of this read.
    eof: bool
    #: On the last chunk: how many bytes follow `end` without a newline (a torn tail, a record
    #: whose newline was lost, or a line another process is still writing). 0 otherwise.
    fragment: int
    #: On the last chunk, when `fragment` is not 0: those bytes judged as the line they would
    #: be with their newline (`snerd.core.records.scan_tail`). Records there are whole, only
    #: their newline was lost, and the log's owner keeps them (`repair_tail`); none means a
    #: torn write. None otherwise.
    tail: ScanResult | None = None


def read_log(
    path: str | os.PathLike[str],
    *,
    start: int = 0,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    missing_ok: bool = True,
    root: str | os.PathLike[str] | None = None,
) -> Iterator[LogChunk]:
    """Read a log from `start` in chunks of about `chunk_bytes`, in file order.

    Blocking: call it from a worker thread (e.g. `trio.to_thread.run_sync(next, it)` per
    chunk) for big logs. A corrupt line is reported in `corrupt` and never hides the lines after
    it. A run of more than `LINE_LIMIT` bytes without a newline is reported once and skipped up
    to the next newline. The last chunk has `eof=True`; if the file does not end with a newline,
    its `fragment` says how many bytes were left and its `tail` what they hold (this function
    never modifies the file; see `repair_tail`). Resume later from the last chunk's `end`
    (inbox ingestion does; it leaves an unterminated line for the read that finds it whole).

    A log file is created by its first append, so with `missing_ok` a missing file reads as an
    empty log (one empty chunk with `eof=True`). The file is opened without following a link
    (below `root`, the data directory, no directory either): `snerd.io.files.RefusedFile`.
    """
    if chunk_bytes <= 0:
        raise ValueError("chunk_bytes must be positive")
    try:
        fd = open_file(path, os.O_RDONLY, root=root)
    except FileNotFoundError:
        if not missing_ok:
            raise
        yield LogChunk([], [], start, True, 0)
        return
    try:
        pos = start  # next byte to read from the file
        frag_start = start  # where the pending (unterminated) bytes start
        parts: list[bytes] = []  # pending bytes, joined when a newline arrives (linear time)
        parts_len = 0
        skipping = False  # inside an overlong line: discard up to the next newline
        while True:
            data = os.pread(fd, chunk_bytes, pos)
            pos += len(data)
            eof = len(data) < chunk_bytes
            corrupt: list[tuple[int, str]] = []
            records: list[LogRecord] = []
            if skipping:
                nl = data.find(b"\n")
                if nl >= 0:
                    skipping = False
                    data = data[nl + 1 :]
                    frag_start = pos - len(data)
                else:
                    data = b""
            if data:
                if data.find(b"\n") < 0:
                    parts.append(data)
                    parts_len += len(data)
                else:
                    buf = b"".join([*parts, data]) if parts else data
                    result = scan(buf, base_offset=frag_start)
                    records, corrupt = result.records, result.corrupt
                    rest = buf[result.end - frag_start :]
                    frag_start = result.end
                    parts = [rest] if rest else []
                    parts_len = len(rest)
                if parts_len > LINE_LIMIT:
                    corrupt.append((frag_start, f"line longer than {LINE_LIMIT} bytes"))
                    parts, parts_len, skipping = [], 0, True
            fragment = (pos - frag_start) if eof else 0
            tail = None
            if fragment:
                if skipping:  # the rest of an overlong line: reported already, no record
                    tail = ScanResult([], [], frag_start)
                else:
                    tail = scan_tail(b"".join(parts), offset=frag_start)
            yield LogChunk(records, corrupt, frag_start, eof, fragment, tail)
            if eof:
                return
    finally:
        os.close(fd)


class TailRepair(NamedTuple):
    """What `repair_tail` did to a log's last line (nothing: `at == -1`)."""

    #: Where the last line starts (-1: the log ended with a newline, or is missing or empty).
    at: int
    #: Bytes cut: a torn write that held no record (0 when kept).
    cut: int
    #: The line held a whole record whose newline was lost: the newline was written back.
    restored: bool
    #: Why a cut line was no record ("not JSON: ...", "checksum mismatch"; "" for blanks).
    reason: str


_NOTHING_TO_REPAIR = TailRepair(at=-1, cut=0, restored=False, reason="")


def repair_tail(
    path: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None
) -> TailRepair:
    """If the log does not end with a newline, judge its last line by the core's rule
    (`snerd.core.records.scan_tail`) and either write its newline back (a whole record whose
    newline was lost: it may have been acknowledged) or truncate the file to the end of the
    line before (a torn write: never acknowledged, an ack follows the whole write); then fsync.
    Either way the next record starts on a line of its own (upstream bug 6.1.1). A missing file
    needs nothing. Only the log's owner may call this."""
    try:
        fd = open_file(path, os.O_RDWR, root=root)
    except FileNotFoundError:
        return _NOTHING_TO_REPAIR
    try:
        size = os.fstat(fd).st_size
        if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
            return _NOTHING_TO_REPAIR
        end = size
        keep = 0
        while end > 0 and size - end <= LINE_LIMIT:
            begin = max(0, end - 65536)
            block = os.pread(fd, end - begin, begin)
            nl = block.rfind(b"\n")
            if nl >= 0:
                keep = begin + nl + 1
                break
            end = begin
        else:
            if end > 0:  # no newline in the last LINE_LIMIT bytes: find the line's start
                keep = _line_start(fd, end)
        if size - keep >= LINE_LIMIT:  # no writer writes such a line: no record
            reason = f"line longer than {LINE_LIMIT} bytes"
        else:
            tail = scan_tail(os.pread(fd, size - keep, keep), offset=keep)
            if tail.records:
                if os.pwrite(fd, b"\n", size) != 1:
                    raise OSError(errno.EIO, "short write of the missing newline", os.fspath(path))
                os.fsync(fd)
                return TailRepair(at=keep, cut=0, restored=True, reason="")
            reason = tail.corrupt[0][1] if tail.corrupt else ""
        os.ftruncate(fd, keep)
        os.fsync(fd)
        return TailRepair(at=keep, cut=size - keep, restored=False, reason=reason)
    finally:
        os.close(fd)


def _line_start(fd: int, end: int) -> int:
    """Where the line holding byte `end - 1` starts (after the newline before it, or 0)."""
    while end > 0:
        begin = max(0, end - (1 << 20))
        nl = os.pread(fd, end - begin, begin).rfind(b"\n")
        if nl >= 0:
            return begin + nl + 1
        end = begin
    return 0


def recover_log(
    path: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None
) -> TailRepair:
    """Make a log safe to append to after a crash, before reading it: remove a leftover
    compaction temp file (a crash before the rename: the log itself is intact; a link there is
    removed, never followed) and repair its last line (`repair_tail`). Only the log's owner may
    call this."""
    tmp = compaction_tmp_path(path)
    try:
        unlink_file(tmp, root=root)
    except FileNotFoundError:
        pass
    else:
        fsync_dir(os.path.dirname(tmp) or ".")
    return repair_tail(path, root=root)


def _pread_record(fd: int, offset: int, length: int, where: str) -> dict[str, Any]:
    if offset < 0 or length < 2:
        raise ValueError(f"bad record location {where}:{offset}+{length}")
    data = os.pread(fd, length, offset)
    at = f"{where}:{offset}+{length}"
    if len(data) != length:
        raise CorruptRecord(f"no complete line at {at}")
    return decode_line_at(data, at)


def read_record(
    path: str | os.PathLike[str],
    offset: int,
    length: int,
    *,
    root: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Read and decode the one line at `offset` (`length` bytes, newline included). One-shot:
    opens and closes the file; daemons use `LogReader`, which keeps descriptors open. Raises
    `CorruptRecord` when there is no valid record there."""
    fd = open_file(path, os.O_RDONLY, root=root)
    try:
        return _pread_record(fd, offset, length, os.fspath(path))
    finally:
        os.close(fd)


class LogReader:
    """Reads single records by location with one pread, keeping a read descriptor per file.

    Used to fetch a task's payload at dispatch, so it is cheap: one pread (from the page cache,
    a few µs) and one decode. Thread-safe. After a compaction renamed a new file over the log,
    `invalidate(path)` must be called (`GroupCommitLog.compact` does it) so the next read opens
    the new file instead of reading the old inode. Files are opened below `root` (the data
    directory) without following a link.
    """

    def __init__(self, max_open: int = 256, *, root: str | os.PathLike[str] | None = None) -> None:
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()
        self._max_open = max_open
        self._root = None if root is None else os.fspath(root)

    def _fd(self, key: str) -> int:
        """The read descriptor for `key`, opened if need be (call with the lock held)."""
        fd = self._fds.get(key)
        if fd is None:
            if len(self._fds) >= self._max_open:
                # Drop the oldest descriptor (dicts keep insertion order).
                with contextlib.suppress(OSError):
                    os.close(self._fds.pop(next(iter(self._fds))))
            fd = open_file(key, os.O_RDONLY, root=self._root)
            self._fds[key] = fd
        return fd

    def read_record(self, path: str | os.PathLike[str], offset: int, length: int) -> dict[str, Any]:
        key = os.fspath(path)
        with self._lock:
            return _pread_record(self._fd(key), offset, length, key)

    def read_block(self, path: str | os.PathLike[str], offset: int, size: int) -> bytes:
        """Up to `size` bytes of the file from `offset` (fewer at its end), one pread."""
        key = os.fspath(path)
        with self._lock:
            return os.pread(self._fd(key), size, offset)

    def invalidate(self, path: str | os.PathLike[str]) -> None:
        """Forget the descriptor for `path` (the file was replaced or removed)."""
        with self._lock:
            fd = self._fds.pop(os.fspath(path), None)
            if fd is not None:
                with contextlib.suppress(OSError):  # read-only: nothing to lose
                    os.close(fd)

    def close(self) -> None:
        with self._lock:
            fds, self._fds = self._fds, {}
            for fd in fds.values():
                with contextlib.suppress(OSError):  # a mount gone away (EBADFD, ENOTCONN)
                    os.close(fd)


class RecordReader(Protocol):
    """Anything that reads one record by location, as `LogReader.read_record` does."""

    def read_record(
        self, path: str | os.PathLike[str], offset: int, length: int
    ) -> dict[str, Any]: ...


def materialize(
    records: Sequence[NewRecord],
    path_for_shard: Callable[[int], str | os.PathLike[str]],
    reader: RecordReader | None = None,
    *,
    out: list[bytes] | None = None,
) -> list[bytes]:
    """Turn the core's `NewRecord`s into log lines (appended to `out` when given, so that
    after an error `len(out)` is the index of the record that could not be built).

    For a record with a `base` location, the record there is read and its fields (payload
    included) are the starting point; the record's own `fields` go on top and its `remove` keys
    are dropped, so the core never holds payloads. Raises `CorruptRecord` when the base is not a
    valid task record, `OSError` when it cannot be read, `ValueError` from `encode_record` for
    unencodable fields.
    """
    lines: list[bytes] = [] if out is None else out
    for rec in records:
        fields = rec.fields
        loc = rec.base
        if loc is not None:
            path = path_for_shard(loc.shard)
            if reader is not None:
                source = reader.read_record(path, loc.offset, loc.length)
            else:
                source = read_record(path, loc.offset, loc.length)
            fields = merge_base(source, rec)
        lines.append(encode_record(fields))
    return lines


# --------------------------------------------------------------------------------------------
# The group-commit writer
# --------------------------------------------------------------------------------------------


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


class CompactResult(NamedTuple):
    """A finished compaction: new offset and length of each kept range (in the order given),
    then of each extra line; and the size of the new log."""

    offsets: tuple[int, ...]
    lengths: tuple[int, ...]
    size: int


#: What a compaction's `on_done` receives.
CompactOutcome = CompactResult | OSError


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


#: Whether a `GroupCommitLog` made with `sync_helper=None` uses a sync helper process.
DEFAULT_SYNC_HELPER = False

#: The sync helper: fsyncs the descriptors handed to it (`F` + id, with the descriptor), when
#: asked (`S` + id, then `D`), and answers each `D` with `R` + errno (0: all synced) + the id
#: of the first file that failed. `C` + id closes one. Commands are 8 bytes, answers 12.
#: `SNERD_TEST_SYNC_FAIL_AT=n` makes its n-th fsync fail with EIO (tests).
#: It lives exactly as long as its parent's end of the socket: it leaves at the end of it, and
#: quietly when the parent died with its end unread (recv(2) ECONNRESET, send(2) EPIPE after a
#: kill -9). It runs in a process group of its own, and ignores SIGINT: Ctrl-C in a terminal
#: signals the whole foreground group, and the daemon, which drains on it, still needs its
#: fsyncs until it closes the socket (a KeyboardInterrupt would end the helper with a traceback).
_HELPER_SOURCE = """
import os, signal, socket, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
s = socket.socket(fileno=int(sys.argv[1]))
fail_at = os.environ.get("SNERD_TEST_SYNC_FAIL_AT", "0")
fail_at = int(fail_at) if fail_at.isdigit() else 0
fds, spare, buf, failed, count = {}, [], b"", None, 0
try:
    while True:
        data, got, _, _ = socket.recv_fds(s, 65536, 64)
        if not data:
            break
        buf += data
        spare.extend(got)
        while len(buf) >= 8:
            op, n, buf = buf[:1], int(buf[1:8]), buf[8:]
            if op == b"F":
                fds[n] = spare.pop(0)
            elif op == b"C":
                fd = fds.pop(n, None)
                if fd is not None:
                    os.close(fd)
            elif op == b"S":
                count += 1
                try:
                    if count == fail_at:
                        raise OSError(5, "injected")
                    os.fsync(fds[n])
                except OSError as exc:
                    if failed is None:
                        failed = (exc.errno or 5, n)
            elif op == b"D":
                s.sendall(b"R%04d%07d" % failed if failed else b"R00000000000")
                failed = None
except ConnectionError:
    pass  # the parent is gone: nobody is left to answer
"""


class _NoReply(enum.Enum):
    NO_REPLY = "no reply yet"


_NO_REPLY = _NoReply.NO_REPLY


class _SyncHelper:
    """A child process that fsyncs the log's files for the trio thread (`sync_helper`): the
    trio thread writes a batch itself, and no thread of this process needs the GIL between a
    batch's write and its acks. Talks over a Unix socket pair (descriptors passed with
    SCM_RIGHTS, so it fsyncs the very open file the trio thread wrote through)."""

    def __init__(self, proc: subprocess.Popen[bytes], sock: socket.socket) -> None:
        self.proc = proc
        self.sock = sock
        self._buf = b""

    @classmethod
    def start(cls) -> _SyncHelper:
        parent, child = socket.socketpair()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", _HELPER_SOURCE, str(child.fileno())],
                pass_fds=[child.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                process_group=0,  # out of reach of the terminal's Ctrl-C (see above)
            )
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        return cls(proc, parent)

    def adopt(self, helper_id: int, fd: int) -> None:
        socket.send_fds(self.sock, [b"F%07d" % helper_id], [fd])

    def forget(self, helper_id: int) -> None:
        self.sock.sendall(b"C%07d" % helper_id)

    def sync(self, helper_ids: list[int]) -> None:
        self.sock.sendall(b"".join(b"S%07d" % i for i in helper_ids) + b"D0000000")

    async def reply(self) -> tuple[int, int] | None:
        """The next answer: None (all synced) or (id of the file that failed, errno)."""
        while True:
            answer = self.reply_nowait()
            if answer is not _NO_REPLY:
                return answer
            await trio.lowlevel.wait_readable(self.sock)

    def reply_nowait(self) -> tuple[int, int] | _NoReply | None:
        """The next answer if it has come (see `reply`), else `_NO_REPLY`. Reads without
        blocking: `GroupCommitLog.poll_helper` may have taken what woke `reply`."""
        while len(self._buf) < 12:
            try:
                chunk = self.sock.recv(65536, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return _NO_REPLY
            if not chunk:
                raise EOFError("the sync helper exited")
            self._buf += chunk
        msg, self._buf = self._buf[:12], self._buf[12:]
        err, helper_id = int(msg[1:5]), int(msg[5:12])
        return None if err == 0 else (helper_id, err)

    def close(self) -> None:
        """(trio thread) The helper exits at the end of its socket; wait for it."""
        if self.sock.fileno() >= 0:
            trio.lowlevel.notify_closing(self.sock)
        with contextlib.suppress(OSError):
            self.sock.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


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
        self._use_helper = (
            fsync == "always" and (DEFAULT_SYNC_HELPER if sync_helper is None else sync_helper)
        )
        self._helper: _SyncHelper | None = None
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
                self._helper = _SyncHelper.start()
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

        def install(copied: _Copied) -> CompactResult:  # writer thread
            self._install(key, tmp, copied)
            return CompactResult(copied.offsets, copied.lengths, copied.size)

        def copy(expected_size: int | None) -> None:  # helper thread
            copied = outcome.capture(_write_compacted, key, tmp, ranges, extra, expected_size, root)
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
        # compaction fail (size check in `_write_compacted` and in `_install`) instead of
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

    async def _helper_replies(self, helper: _SyncHelper) -> None:
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
            if failed is _NO_REPLY:
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

    def _helper_lost(self, helper: _SyncHelper, exc: BaseException) -> None:
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

    def _succeed(
        self, jobs: list[_Append], offsets: list[tuple[int, ...]], done: _Done
    ) -> None:
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
            self._writes += _write_all(state.fd, data)
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

    def _install(self, path: str, tmp: str, copied: _Copied) -> None:
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
        _rename(tmp, path, self._root)
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


class _Copied(NamedTuple):
    offsets: tuple[int, ...]
    lengths: tuple[int, ...]
    size: int
    src_ino: int
    src_dev: int
    src_size: int


def _write_compacted(
    path: str,
    tmp: str,
    keep: tuple[KeepRange, ...],
    extra: list[bytes],
    expected_size: int | None,
    root: str | None = None,
) -> _Copied:
    """Helper thread: copy `keep` then `extra` from the log at `path` into `tmp`, fsync it.
    `expected_size` is the size the writer knows the log to have (None: it has not opened it).
    `tmp` is created exclusively (`_create_exclusive`): a link planted there is removed, and
    the copy never lands in a file someone else chose."""
    src = open_file(path, os.O_RDONLY, root=root)
    try:
        st = os.fstat(src)
        src_size = st.st_size
        if expected_size is not None and src_size != expected_size:
            raise OSError(
                errno.EAGAIN,
                f"log changed before compaction ({expected_size} -> {src_size} bytes)",
                path,
            )
        out = _create_exclusive(tmp, root)
        try:
            offsets: list[int] = []
            lengths: list[int] = []
            pending: list[bytes] = []
            pending_len = 0
            written = 0
            i = 0
            n = len(keep)
            while i < n:
                # Coalesce ranges that follow each other in the old file into one pread.
                first = keep[i]
                j = i + 1
                run_end = first.offset + first.length
                while j < n and keep[j].offset == run_end:
                    run_end += keep[j].length
                    j += 1
                run_len = run_end - first.offset
                if first.offset < 0 or run_end > src_size or any(r.length <= 0 for r in keep[i:j]):
                    raise ValueError(
                        f"keep range {first.offset}+{run_len} outside {path} ({src_size} bytes)"
                    )
                data = os.pread(src, run_len, first.offset)
                if len(data) != run_len:
                    raise OSError(errno.EIO, "short read while compacting", path)
                base = written + pending_len - first.offset
                for r in keep[i:j]:
                    if data[r.offset + r.length - 1 - first.offset] != 0x0A:
                        raise ValueError(f"keep range {r.offset}+{r.length} is not a whole line")
                    offsets.append(base + r.offset)
                    lengths.append(r.length)
                pending.append(data)
                pending_len += run_len
                if pending_len >= _COPY_BUFFER:
                    _write_all(out, b"".join(pending))
                    written += pending_len
                    pending, pending_len = [], 0
                i = j
            for line in extra:
                offsets.append(written + pending_len)
                lengths.append(len(line))
                pending.append(line)
                pending_len += len(line)
            if pending:
                _write_all(out, b"".join(pending))
                written += pending_len
            os.fsync(out)
        finally:
            os.close(out)
    except BaseException:
        with contextlib.suppress(OSError):
            unlink_file(tmp, root=root)
        raise
    finally:
        os.close(src)
    return _Copied(tuple(offsets), tuple(lengths), written, st.st_ino, st.st_dev, src_size)
