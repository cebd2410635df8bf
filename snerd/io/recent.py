"""The daemon's cache of the task records it appended most recently, in front of the log's reader.

Owns `RecentRecords`: the fields of recent records by (path, offset), and a read-ahead block
per file for records read back in log order. The runtime remembers what each commit wrote
(`remember`), reads payloads and bases through it (`read_record`), and tells it when a file's
bytes moved or may differ (`moved`, `forget`, `append_failed`).

It must never: hold a record whose bytes in the file could differ from what it holds (only
records written whole, without a base, and only committed offsets), or decide anything about a
task.
"""

from __future__ import annotations

import bisect
import itertools
import os
from collections.abc import Sequence
from typing import Any

from snerd.core import effects as fx
from snerd.core.records import CorruptRecord, decode_record
from snerd.core.schema import TASK_DATA
from snerd.io.log import LogReader

__all__ = ["RecentRecords"]


class RecentRecords:
    """The fields of the task records this daemon appended most recently (at least the last
    `limit / 2` bytes of lines, at most `limit`), by (path, offset), in front of the log's
    reader.

    A task's record is read back soon after its commit: its payload for the `execute`, and as
    the base of its next record (the tombstone copies it). From here that costs neither a
    pread (which releases the GIL: getting it back in a busy daemon is the larger part) nor a
    decode. Only records written whole (no base) with a payload are kept — exactly the fields
    that were encoded into the line at that offset. The dicts are shared with `materialize`
    and the runtime's payload reads, which only read them. A file's entries are dropped when it is read
    afresh or compacted (`forget`); appends never reuse a committed offset of the same file.
    Two generations: new entries go into the young dict; once it holds `limit / 2` bytes of
    lines it becomes the old one and the previous old one is dropped whole (no per-entry
    eviction, no key order to keep: a plain dict drops its first key slowly once many were
    dropped before, about 13 us at 30,000 entries here).

    A queue deeper than the cache reads its records back from the file, in log order as its
    tasks run: a miss reads a block of the file (`read_ahead` bytes) from the record on and
    keeps it, so the records after it are cut from that block instead of one pread each. A
    block is only ever asked for records already committed, whose bytes never change; it is
    dropped when the file is compacted or read afresh, and when an append to the file fails
    (its lines are cut, and the next append writes other bytes at their offsets).
    """

    def __init__(self, reader: LogReader, limit: int = 8 << 20, read_ahead: int = 32 << 10) -> None:
        self._reader = reader
        self._half = limit >> 1
        self._big = limit >> 3  # a huge record would push out everything else
        #: path -> offset -> (line length, fields), young and old; bytes of lines in young.
        #: (Per path, so the key of an entry is a plain int: no tuple to build and hash.)
        self._young: dict[str, dict[int, tuple[int, dict[str, Any]]]] = {}
        self._old: dict[str, dict[int, tuple[int, dict[str, Any]]]] = {}
        self._size = 0
        #: Bytes read at a miss: the records after the one asked for come with it.
        self._read_ahead = read_ahead
        #: path -> (offset, bytes from there): the block read at the last miss in the file.
        self._blocks: dict[str, tuple[int, bytes]] = {}

    def remember(
        self,
        path: str,
        offsets: tuple[int, ...],
        lines: list[bytes],
        records: list[fx.NewRecord] | tuple[fx.NewRecord, ...],
    ) -> None:
        young = self._young.get(path)
        if young is None:
            young = self._young[path] = {}
        big = self._big
        size = self._size
        for offset, line, record in zip(offsets, lines, records, strict=True):
            if record.base is None and TASK_DATA in record.fields:
                length = len(line)
                if length <= big:
                    young[offset] = (length, record.fields)
                    size += length
        if size >= self._half:
            self._old = self._young
            self._young = {}
            size = 0
        self._size = size

    def read_record(self, path: str | os.PathLike[str], offset: int, length: int) -> dict[str, Any]:
        name = os.fspath(path)
        young = self._young.get(name)
        hit = young.get(offset) if young is not None else None
        if hit is None:
            old = self._old.get(name)
            hit = old.get(offset) if old is not None else None
        if hit is not None and hit[0] == length:
            return hit[1]
        fields = self._read_missed(path, name, offset, length)
        if hit is None and TASK_DATA in fields and length <= self._big:
            # Read through: a task's record is read twice, for its `execute` and as the base of
            # its outcome record. A task that waited long in the queue has left the cache by
            # then; this keeps it for the second read.
            if young is None:
                young = self._young[name] = {}
            young[offset] = (length, fields)
            self._size += length
        return fields

    def _read_missed(
        self, path: str | os.PathLike[str], name: str, offset: int, length: int
    ) -> dict[str, Any]:
        """A record not remembered: from the block read at the file's last miss when that
        holds its whole line, else from a new block read from its offset on. Queued tasks
        run, and are read back, mostly in log order, so one pread serves the records that
        follow (a deep queue outgrows what is remembered); the records in a block are decoded
        only when asked for."""
        block = self._blocks.get(name)
        if block is not None:
            fields = _line_in(block[1], offset - block[0], length)
            if fields is not None:
                return fields
        if 2 <= length <= self._read_ahead and offset >= 0:
            data = self._reader.read_block(path, offset, self._read_ahead)
            self._blocks[name] = (offset, data)
            fields = _line_in(data, 0, length)
            if fields is not None:
                return fields
        # Not a whole valid line in a block (past the end of the file when read, a huge
        # record, or damaged): read it alone, which says what is wrong.
        return self._reader.read_record(path, offset, length)

    def append_failed(self, path: str) -> None:
        """An append to `path` failed: the lines it wrote are cut (their offsets are used
        again), so a block read meanwhile may hold bytes that are not the log's."""
        self._blocks.pop(path, None)

    def moved(self, path: str, keep: Sequence[fx.KeepRange], offsets: Sequence[int]) -> None:
        """The file was compacted: the byte range `keep[i]` is now at `offsets[i]`. Entries
        inside a kept range move with it; the others are dropped."""
        self._blocks.pop(path, None)
        starts = [r.offset for r in keep]
        if any(a >= b for a, b in itertools.pairwise(starts)):  # (the core sorts them)
            self.forget(path)
            return
        for generation in (self._young, self._old):
            entries = generation.pop(path, None)
            if not entries:
                continue
            kept: dict[int, tuple[int, dict[str, Any]]] = {}
            for old_offset, entry in entries.items():
                i = bisect.bisect_right(starts, old_offset) - 1
                if i >= 0 and old_offset + entry[0] <= starts[i] + keep[i].length:
                    kept[offsets[i] + old_offset - starts[i]] = entry
                elif generation is self._young:
                    self._size -= entry[0]
            generation[path] = kept

    def forget(self, path: str) -> None:
        self._blocks.pop(path, None)
        young = self._young.pop(path, None)
        if young:
            self._size -= sum(length for length, _ in young.values())
        self._old.pop(path, None)


def _line_in(data: bytes, at: int, length: int) -> dict[str, Any] | None:
    """The fields of the valid record line of `length` bytes at `data[at:]`, or None when
    `data` does not hold one there whole."""
    end = at + length
    if at < 0 or end > len(data) or data[end - 1] != 0x0A:
        return None
    try:
        return decode_record(data[at : end - 1])
    except CorruptRecord:
        return None
