"""The daemon's cache of recently appended task records (`snerd.io.runtime._RecentRecords`),
in front of a real `LogReader` on a real file."""

from __future__ import annotations

from pathlib import Path

import pytest

from snerd.core import effects as fx
from snerd.core.records import encode_record
from snerd.io.log import LogReader
from snerd.io.runtime import _RecentRecords


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
    recent = _RecentRecords(LogReader())
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
    recent = _RecentRecords(LogReader())
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
