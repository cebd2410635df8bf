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


def test_forget_drops_one_file_only_and_old_entries_age_out(tmp_path: Path) -> None:
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    ra, rb = [_task("a1")], [_task("b1")]
    la, oa = _write(a, ra)
    lb, ob = _write(b, rb)
    recent = _RecentRecords(LogReader(), limit=8 * len(la[0]))  # a young generation of 4 lines
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
