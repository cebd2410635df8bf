"""The writer's look at the owner's log, on real files (`snerd.io.inbox.read_log_tail` and
`log_identity_and_size`): the `inbox` records of the writers asked for, resumed from the
offset while the log is the same file (`st_ino`), complete lines only, no link followed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from snerd.core import effects as fx
from snerd.core.records import encode_record
from snerd.io.inbox import log_identity_and_size, read_log_tail
from tests.support.queuefiles import append, log_path


def _task(task_id: str) -> bytes:
    return encode_record({"taskId": task_id, "taskType": "t", "taskData": "{}"})


def _mark(node: str, start: int, end: int, **more: Any) -> bytes:
    """An owner's `inbox` record: it took `node`'s file from `start` to `end`."""
    return encode_record({"snerdKind": "inbox", "node": node, "offset": end, "from": start, **more})



def _tail(
    q: Path,
    identity: int = 0,
    offset: int = 0,
    *,
    writers: tuple[str, ...] = ("a",),
    max_bytes: int = 1 << 20,
    shard: int = 0,
) -> Any:
    effect = fx.ReadLogTail(
        shard=shard,
        identity=identity,
        offset=offset,
        max_bytes=max_bytes,
        writers=frozenset(writers),
    )
    return read_log_tail(q, effect)


def test_the_identity_and_size_are_the_log_s_and_none_without_one(tmp_path: Path) -> None:
    log = log_path(tmp_path)
    assert log_identity_and_size(str(log)) == (0, 0)  # no file yet: no error
    log.write_bytes(_task("x"))
    st = os.stat(log)
    assert log_identity_and_size(str(log)) == (st.st_ino, st.st_size) != (0, 0)


def test_a_missing_log_is_read_as_empty_without_an_error(tmp_path: Path) -> None:
    for q in (tmp_path, tmp_path / "no-such-queue"):
        got = _tail(q)
        assert got.error is None and got.records == ()
        assert (got.identity, got.start, got.end, got.size) == (0, 0, 0, 0)
    log_path(tmp_path)  # the folders, no file
    assert _tail(tmp_path).error is None


def test_a_growing_log_is_read_on_from_the_offset_for_the_writers_asked(tmp_path: Path) -> None:
    log = log_path(tmp_path)
    first = _task("x") + _mark("b", 0, 100) + _mark("a", 0, 50, dropped=[{"task": "d", "at": 0, "of": "t"}])
    log.write_bytes(first)
    ino = os.stat(log).st_ino
    got = _tail(tmp_path)
    assert got.error is None and (got.identity, got.start, got.end) == (ino, 0, len(first))
    (mark,) = got.records  # b's record and the task are left out
    assert mark.offset == len(_task("x") + _mark("b", 0, 100)) and mark.length == len(first) - mark.offset
    assert mark.fields["dropped"] == [{"task": "d", "at": 0, "of": "t"}]
    later = _mark("a", 50, 80)
    append(log, _task("y") + later)
    again = _tail(tmp_path, ino, got.end)
    assert (again.start, again.end, again.size) == (len(first), log.stat().st_size, log.stat().st_size)
    assert [(r.offset, r.fields["from"]) for r in again.records] == [
        (log.stat().st_size - len(later), 50)
    ]
    # Nothing new: nothing read.
    idle = _tail(tmp_path, ino, again.end)
    assert idle.records == () and idle.start == idle.end == idle.size


def test_a_log_replaced_by_a_rename_is_read_from_its_start(tmp_path: Path) -> None:
    log = log_path(tmp_path)
    log.write_bytes(_task("x") * 3 + _mark("a", 0, 10))
    old = _tail(tmp_path)
    # What a compaction does: a new file (a new inode) renamed over the log, longer than the
    # offset read, so only its identity tells it from the old one.
    tmp = log.with_name("tasks.tmp")
    tmp.write_bytes(_mark("a", 0, 10) + _task("y") * 5)
    assert tmp.stat().st_size > old.end
    os.rename(tmp, log)
    got = _tail(tmp_path, old.identity, old.end)
    assert got.identity == os.stat(log).st_ino != old.identity
    assert (got.start, got.end) == (0, log.stat().st_size)
    assert [r.offset for r in got.records] == [0]


def test_the_same_file_shorter_than_the_offset_is_read_from_its_start(tmp_path: Path) -> None:
    # The same inode, yet shorter than the offset read: cut back (an append that failed is cut
    # off the owner's log, and may have been read first), or a new file that got the old inode
    # number. What is there now is read from its start, as the queue scan does.
    log = log_path(tmp_path)
    log.write_bytes(_mark("a", 0, 10))
    ino = os.stat(log).st_ino
    got = _tail(tmp_path, ino, 10_000)
    assert (got.start, got.end) == (0, log.stat().st_size) and len(got.records) == 1


def test_a_torn_last_line_is_left_for_the_read_that_finds_it_whole(tmp_path: Path) -> None:
    log = log_path(tmp_path)
    whole, late = _mark("a", 0, 10), _mark("a", 10, 20)
    log.write_bytes(whole + late[:20])
    got = _tail(tmp_path)
    assert (got.end, got.size) == (len(whole), len(whole) + 20) and len(got.records) == 1
    again = _tail(tmp_path, got.identity, got.end)  # still torn: nothing
    assert again.records == () and again.end == len(whole)
    append(log, late[20:])
    done = _tail(tmp_path, got.identity, got.end)
    assert (done.start, done.end) == (len(whole), len(whole + late))
    assert [r.fields["from"] for r in done.records] == [10]


def test_a_read_stops_at_about_max_bytes_yet_takes_one_line_at_least(tmp_path: Path) -> None:
    log = log_path(tmp_path)
    one, two = _mark("a", 0, 10), _mark("a", 10, 20)
    log.write_bytes(one + two)
    got = _tail(tmp_path, max_bytes=len(one) + 5)
    assert (got.end, got.size) == (len(one), len(one + two))
    assert [r.fields["from"] for r in got.records] == [0]
    # Less than one line: read on to its end.
    short = _tail(tmp_path, got.identity, got.end, max_bytes=8)
    assert short.end == len(one + two) and [r.fields["from"] for r in short.records] == [10]


def test_a_linked_log_is_refused_with_an_error_not_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.log"
    elsewhere.write_bytes(_mark("a", 0, 10))
    log = log_path(tmp_path)
    log.symlink_to(elsewhere)
    got = _tail(tmp_path)
    assert got.records == () and got.error is not None and str(log) in got.error, got.error
    assert log_identity_and_size(str(log)) == (0, 0)  # not the target's


def test_a_linked_folder_on_the_way_to_the_log_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / "tasks.log").write_bytes(_mark("a", 0, 10))
    (tmp_path / "shard-0").mkdir()
    (tmp_path / "shard-0" / "tasks").symlink_to(real)
    got = _tail(tmp_path)
    assert got.records == () and got.error is not None, got
