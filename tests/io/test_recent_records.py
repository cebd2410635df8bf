"""The daemon's cache of recently appended task records (`snerd.io.recent.RecentRecords`),
in front of a real `LogReader` on a real file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from snerd.core import effects as fx
from snerd.core.records import CorruptRecord, encode_record
from snerd.io.log import LogReader
from snerd.io.recent import RecentRecords


def _task(task_id: str) -> fx.NewRecord:
    return fx.NewRecord(fields={"taskId": task_id, "taskType": "t", "taskData": f"<{task_id}>"})


def _write(path: Path, records: list[fx.NewRecord]) -> tuple[list[bytes], tuple[int, ...]]:
    lines = [encode_record(r.fields) for r in records]
    offsets, at = [], 0
    for line in lines:
        offsets.append(at)
        at += len(line)
    path.write_bytes(b"".join(lines))
    return lines, tuple(offsets)


def test_a_remembered_record_is_read_without_the_file(tmp_path: Path) -> None:
    path = tmp_path / "tasks.log"
    records = [_task("a"), _task("b")]
    lines, offsets = _write(path, records)
    recent = RecentRecords(LogReader())
    recent.remember(str(path), offsets, lines, records)
    path.unlink()
    assert recent.read_record(path, offsets[1], len(lines[1]))["taskData"] == "<b>"
    with pytest.raises(OSError):  # not remembered at that length: read from the file
        recent.read_record(path, offsets[1], len(lines[1]) + 1)


def test_after_a_compaction_kept_records_are_remembered_at_their_new_offsets(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tasks.log"
    records = [_task("gone"), _task("kept1"), _task("kept2"), _task("gone2")]
    lines, offsets = _write(path, records)
    recent = RecentRecords(LogReader())
    recent.remember(str(path), offsets, lines, records)
    # One range holds kept1 and kept2; it lands at offset 7 of the new file.
    keep = [fx.KeepRange(offset=offsets[1], length=len(lines[1]) + len(lines[2]))]
    recent.moved(str(path), keep, [7])
    path.unlink()
    assert recent.read_record(path, 7, len(lines[1]))["taskId"] == "kept1"
    assert recent.read_record(path, 7 + len(lines[1]), len(lines[2]))["taskId"] == "kept2"
    for i in (0, 1, 3):  # dropped, or no longer at the old offset
        with pytest.raises(OSError):
            recent.read_record(path, offsets[i], len(lines[i]))


def test_forget_drops_one_file_only_and_old_entries_age_out(tmp_path: Path) -> None:
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    ra, rb = [_task("a1")], [_task("b1")]
    la, oa = _write(a, ra)
    lb, ob = _write(b, rb)
    recent = RecentRecords(LogReader(), limit=8 * len(la[0]))  # a young generation of 4 lines
    recent.remember(str(a), oa, la, ra)
    recent.remember(str(b), ob, lb, rb)
    recent.forget(str(a))
    a.unlink()
    b.unlink()
    with pytest.raises(OSError):
        recent.read_record(a, oa[0], len(la[0]))
    assert recent.read_record(b, ob[0], len(lb[0]))["taskId"] == "b1"
    # Two generations' worth of newer records push b1 out.
    c = tmp_path / "c.log"
    rc = [_task(f"c{i}") for i in range(10)]
    lc, oc = _write(c, rc)
    recent.remember(str(c), oc[:5], lc[:5], rc[:5])  # young (b1, c0..c4) becomes old
    assert recent.read_record(b, ob[0], len(lb[0]))["taskId"] == "b1"
    recent.remember(str(c), oc[5:], lc[5:], rc[5:])  # and is dropped at the next turn
    with pytest.raises(OSError):
        recent.read_record(b, ob[0], len(lb[0]))
    assert recent.read_record(c, oc[9], len(lc[9]))["taskId"] == "c9"


class _CountingReader(LogReader):
    """A real `LogReader` that counts its preads."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = 0
        self.records = 0

    def read_block(self, path: str | os.PathLike[str], offset: int, size: int) -> bytes:
        self.blocks += 1
        return super().read_block(path, offset, size)

    def read_record(self, path: str | os.PathLike[str], offset: int, length: int) -> dict[str, Any]:
        self.records += 1
        return super().read_record(path, offset, length)


def test_a_miss_reads_ahead_so_the_records_after_it_cost_no_pread(tmp_path: Path) -> None:
    path = tmp_path / "tasks.log"
    records = [_task(f"t{i:03}") for i in range(200)]
    lines, offsets = _write(path, records)
    reader = _CountingReader()
    recent = RecentRecords(reader, read_ahead=40 * len(lines[0]))
    # In log order, as queued tasks run: one block per 40 records.
    for i in range(200):
        assert recent.read_record(path, offsets[i], len(lines[i]))["taskId"] == f"t{i:03}"
    assert (reader.blocks, reader.records) == (5, 0)
    # Each was read through into the cache: the second read (the outcome record's base)
    # reads nothing.
    assert recent.read_record(path, offsets[7], len(lines[7]))["taskId"] == "t007"
    assert reader.blocks == 5
    # A record before the last block: a new block from there.
    assert recent.read_record(path, offsets[0], len(lines[0]))["taskId"] == "t000"
    recent.forget(str(path))
    assert recent.read_record(path, offsets[0], len(lines[0]))["taskId"] == "t000"
    assert reader.blocks == 6


def test_a_record_cut_by_the_end_of_a_block_is_read_again_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "tasks.log"
    records = [_task(f"t{i}") for i in range(4)]
    lines, offsets = _write(path, records)
    reader = _CountingReader()
    # The block holds record 0 and half of record 1.
    recent = RecentRecords(reader, read_ahead=len(lines[0]) + len(lines[1]) // 2)
    assert recent.read_record(path, offsets[0], len(lines[0]))["taskId"] == "t0"
    assert recent.read_record(path, offsets[1], len(lines[1]))["taskId"] == "t1"
    assert reader.blocks == 2


def test_a_block_read_before_the_file_grew_is_not_trusted_past_its_end(tmp_path: Path) -> None:
    path = tmp_path / "tasks.log"
    first, second = [_task("a")], [_task("b")]
    lines, _ = _write(path, first)
    reader = _CountingReader()
    recent = RecentRecords(reader)
    assert recent.read_record(path, 0, len(lines[0]))["taskId"] == "a"
    line_b = encode_record(second[0].fields)
    with path.open("ab") as f:
        f.write(line_b[:10])  # half written when a block is read
    assert recent.read_record(path, 0, len(lines[0]))["taskId"] == "a"
    with path.open("ab") as f:
        f.write(line_b[10:])
    assert recent.read_record(path, len(lines[0]), len(line_b))["taskId"] == "b"


def test_after_a_failed_append_a_block_holding_its_lines_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "tasks.log"
    committed = [_task("kept")]
    lines, _ = _write(path, committed)
    at = len(lines[0])
    lost = encode_record({"taskId": "lost", "taskType": "t", "taskData": "<1>"})
    again = encode_record({"taskId": "next", "taskType": "t", "taskData": "<2>"})
    assert len(lost) == len(again)
    with path.open("ab") as f:
        f.write(lost)  # written, then its fsync fails: the log cuts it
    recent = RecentRecords(LogReader())
    assert recent.read_record(path, 0, at)["taskId"] == "kept"  # the block holds `lost`
    with path.open("r+b") as f:
        f.truncate(at)
        f.seek(at)
        f.write(again)  # the next append, at the same offset
    recent.append_failed(str(path))
    assert recent.read_record(path, at, len(again))["taskId"] == "next"


def test_a_damaged_record_is_reported_as_it_is_without_a_block(tmp_path: Path) -> None:
    path = tmp_path / "tasks.log"
    records = [_task("a"), _task("b")]
    lines, offsets = _write(path, records)
    data = bytearray(path.read_bytes())
    data[offsets[1] + 3] ^= 0x01
    path.write_bytes(bytes(data))
    reader = _CountingReader()
    recent = RecentRecords(reader)
    assert recent.read_record(path, offsets[0], len(lines[0]))["taskId"] == "a"
    with pytest.raises(CorruptRecord, match="checksum"):
        recent.read_record(path, offsets[1], len(lines[1]))
    assert reader.records == 1  # read alone, which says what is wrong
    with pytest.raises(CorruptRecord):  # not at a line's start
        recent.read_record(path, offsets[0] + 1, len(lines[0]) - 1)


def test_a_record_longer_than_a_block_is_read_alone(tmp_path: Path) -> None:
    path = tmp_path / "tasks.log"
    records = [fx.NewRecord(fields={"taskId": "big", "taskType": "t", "taskData": "x" * 5000})]
    lines, _ = _write(path, records)
    reader = _CountingReader()
    recent = RecentRecords(reader, read_ahead=1024)
    assert recent.read_record(path, 0, len(lines[0]))["taskData"] == "x" * 5000
    assert (reader.blocks, reader.records) == (0, 1)


def test_a_compaction_drops_the_block_of_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "tasks.log"
    records = [_task("a"), _task("b"), _task("c")]
    lines, offsets = _write(path, records)
    reader = LogReader()
    recent = RecentRecords(reader)
    assert recent.read_record(path, offsets[0], len(lines[0]))["taskId"] == "a"
    # The compacted file keeps c only, at offset 0 — where a was, at the same length.
    assert len(lines[0]) == len(lines[2])
    tmp = tmp_path / "tasks.tmp"
    tmp.write_bytes(lines[2])
    os.replace(tmp, path)
    reader.invalidate(path)  # as `GroupCommitLog` does once it renamed the file
    recent.moved(str(path), [fx.KeepRange(offset=offsets[2], length=len(lines[2]))], [0])
    assert recent.read_record(path, 0, len(lines[2]))["taskId"] == "c"
