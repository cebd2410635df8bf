"""Reading shard logs back: in chunks, one record by location, and the repair of a last line.

Owns the reading side of `shard-N/tasks/tasks.log` and `shard-N/inbox/<node>.log`:

- `read_log` reads a log in file order and never stops at a bad line: a corrupt line is
  reported and skipped, a run longer than `LINE_LIMIT` without a newline is reported once.
- A last line without its newline is judged by the core (`snerd.core.records.scan_tail`): a
  whole record whose newline was lost gets its newline back, a torn write is cut
  (`repair_tail`, `recover_log`), before the log is appended to again (upstream bug 6.1.1: the
  next record glued onto a torn one and both were lost).
- `LogReader` reads one record by location with one pread, keeping a descriptor per file
  (thread-safe); `materialize` turns the core's `NewRecord`s into lines, reading each base
  record and merging by the core's rule (`snerd.core.records.merge_base`).

It must never: change a file except through `repair_tail` / `recover_log` (which only the
log's owner may call), decide which records matter (that is the core's), or open a file
through a link (`snerd.io.files`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple, Protocol

from snerd.core.effects import NewRecord
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
from snerd.io.files import fsync_dir, open_file, unlink_file
from snerd.io.log.compact import compaction_tmp_path

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "LogChunk",
    "LogReader",
    "RecordReader",
    "TailRepair",
    "materialize",
    "read_log",
    "read_record",
    "recover_log",
    "repair_tail",
]

#: Reading a log in 64 KiB chunks measured about twice as fast per record as 1 MiB chunks here
#: (fewer live objects per chunk for the cyclic GC to walk, and the chunk stays in cache).
DEFAULT_CHUNK_BYTES = 1 << 16


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
