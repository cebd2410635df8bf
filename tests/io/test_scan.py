"""The queue scan on real files (`snerd.io.scan.scan_queue`): every shard's log and inbox
files, each resumed where the core left it while it is the same file (`st_ino`), complete
lines only, no link followed; and the answer folded by the core's `TaskWatch` as a node
would. Then `read_task`, the read of one id's records for its story."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from snerd.core import effects as fx
from snerd.core import events as ev
from snerd.core.records import encode_record
from snerd.core.watch import COMPLETED, LIVE, UNKNOWN, TaskWatch
from snerd.io import scan
from snerd.io.scan import scan_queue
from tests.support.queuefiles import append, log_path


def _task(task_id: str, outcome: str | None = None, **more: Any) -> bytes:
    fields: dict[str, Any] = {"taskId": task_id, "taskType": "t", "taskData": "{}", **more}
    if outcome is not None:
        fields |= {"deletedAt": "2027-01-01T00:00:00Z", "snerdOutcome": outcome}
    return encode_record(fields)



def _scan(
    q: Path,
    ids: set[str],
    known: dict[tuple[int, str], tuple[int, int]] | None = None,
    *,
    shards: int = 1,
    max_bytes: int = 1 << 20,
) -> ev.QueueScanned:
    effect = fx.ScanQueue(shards=shards, known=known or {}, ids=frozenset(ids), max_bytes=max_bytes)
    return scan_queue(q, effect)


def test_a_growing_log_is_read_from_where_the_last_read_ended(tmp_path: Path) -> None:
    log = log_path(tmp_path, 0)
    first = _task("p") + _task("other")
    log.write_bytes(first)
    ino = os.stat(log).st_ino
    got = _scan(tmp_path, {"p"})
    assert got.errors == () and got.files == ((0, "", ino, 0),)  # read to its end
    (chunk,) = got.chunks
    assert (chunk.segment, chunk.identity, chunk.start, chunk.end) == ("", ino, 0, len(first))
    assert [r.fields["taskId"] for r in chunk.records] == ["p"]  # another id's record is dropped
    append(log, _task("other", "completed") + _task("p", "completed"))
    again = _scan(tmp_path, {"p"}, {(0, ""): (ino, len(first))})
    (chunk,) = again.chunks
    assert (chunk.start, chunk.end) == (len(first), log.stat().st_size)
    assert [(r.offset, r.fields.get("deletedAt") is not None) for r in chunk.records] == [
        (len(first) + len(_task("other", "completed")), True)
    ]
    # Nothing new: no chunk, the file still listed.
    idle = _scan(tmp_path, {"p"}, {(0, ""): (ino, chunk.end)})
    assert idle.chunks == () and idle.files == ((0, "", ino, 0),)


def test_a_torn_last_line_is_left_for_the_read_that_finds_it_whole(tmp_path: Path) -> None:
    log = log_path(tmp_path, 0)
    whole, late = _task("p"), _task("p", "completed")
    log.write_bytes(whole + late[:20])
    got = _scan(tmp_path, {"p"})
    (chunk,) = got.chunks
    assert chunk.end == len(whole) and len(chunk.records) == 1 and chunk.corrupt == ()
    ino = chunk.identity
    # Still torn: nothing to hand over.
    assert _scan(tmp_path, {"p"}, {(0, ""): (ino, len(whole))}).chunks == ()
    append(log, late[20:])
    (chunk,) = _scan(tmp_path, {"p"}, {(0, ""): (ino, len(whole))}).chunks
    assert (chunk.start, chunk.end) == (len(whole), len(whole) + len(late))
    assert chunk.records[0].fields["snerdOutcome"] == "completed"


def test_a_log_replaced_by_a_rename_is_read_again_from_its_start(tmp_path: Path) -> None:
    log = log_path(tmp_path, 0)
    log.write_bytes(_task("x") * 3 + _task("p"))
    old = _scan(tmp_path, {"p"}).chunks[0]
    # What a compaction does: a new file, renamed over the log (a new inode); longer than
    # the offset read, so only its identity tells it from the old one.
    tmp = log.with_name("tasks.tmp")
    tmp.write_bytes(_task("p", "completed") + _task("y") * 5)
    assert tmp.stat().st_size > old.end
    os.rename(tmp, log)
    (chunk,) = _scan(tmp_path, {"p"}, {(0, ""): (old.identity, old.end)}).chunks
    assert chunk.identity == os.stat(log).st_ino != old.identity
    assert (chunk.start, chunk.end) == (0, log.stat().st_size)
    assert chunk.records[0].fields["snerdOutcome"] == "completed"


def test_a_file_shorter_than_the_offset_known_is_read_from_its_start(tmp_path: Path) -> None:
    log = log_path(tmp_path, 0)
    log.write_bytes(_task("p"))
    ino = os.stat(log).st_ino
    (chunk,) = _scan(tmp_path, {"p"}, {(0, ""): (ino, 10_000)}).chunks
    assert (chunk.start, chunk.end) == (0, log.stat().st_size)


def test_inbox_files_of_every_shard_are_read_and_hints_are_not(tmp_path: Path) -> None:
    log_path(tmp_path, 0).write_bytes(_task("x"))
    inbox = tmp_path / "shard-1" / "inbox"
    inbox.mkdir(parents=True)
    (inbox / "b@pid-1-aa.log").write_bytes(_task("p"))
    (inbox / "b@pid-1-aa.read").write_bytes(b"0\n")
    got = _scan(tmp_path, {"p"}, shards=2)
    assert got.errors == ()
    assert [(s, seg) for s, seg, _, _ in got.files] == [(0, ""), (1, "b@pid-1-aa")]
    (chunk,) = [c for c in got.chunks if c.records]
    assert (chunk.shard, chunk.segment, chunk.records[0].fields["taskId"]) == (
        1, "b@pid-1-aa", "p"
    )


def test_a_symlinked_log_is_refused_naming_it_and_not_followed(tmp_path: Path) -> None:
    q = tmp_path / "q"
    elsewhere = tmp_path / "elsewhere.log"
    elsewhere.write_bytes(_task("p", "completed"))
    log = log_path(q, 0)
    log.symlink_to(elsewhere)
    got = _scan(q, {"p"})
    assert got.chunks == () and got.files == ()
    ((shard, text),) = got.errors
    assert shard == 0 and text.startswith(f"refusing to follow the symlink {log}"), text


def test_a_symlinked_inbox_folder_is_an_error_naming_it(tmp_path: Path) -> None:
    q = tmp_path / "q"
    (tmp_path / "other").mkdir()
    log_path(q, 0).write_bytes(_task("x"))
    (q / "shard-0" / "inbox").symlink_to(tmp_path / "other")
    ((shard, text),) = _scan(q, {"p"}).errors
    assert shard == 0 and str(q / "shard-0" / "inbox") in text, text


def test_missing_shard_folders_logs_and_inboxes_are_no_error(tmp_path: Path) -> None:
    (tmp_path / "shard-1" / "tasks").mkdir(parents=True)  # a folder, no log yet
    log_path(tmp_path, 2).write_bytes(_task("p"))
    got = _scan(tmp_path, {"p"}, shards=4)
    assert got.errors == ()
    assert [(s, seg) for s, seg, _, _ in got.files] == [(2, "")]


def test_a_read_stops_near_max_bytes_yet_takes_at_least_one_line(tmp_path: Path) -> None:
    log = log_path(tmp_path, 0)
    one = _task("p", taskData="x" * 200)
    log.write_bytes(one * 3)
    (chunk,) = _scan(tmp_path, {"p"}, max_bytes=10).chunks
    assert (chunk.start, chunk.end, len(chunk.records)) == (0, len(one), 1)
    (chunk,) = _scan(tmp_path, {"p"}, max_bytes=len(one) * 2 + 5).chunks
    assert chunk.end == 2 * len(one)


def test_a_line_longer_than_any_record_is_skipped_and_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scan, "LINE_LIMIT", 4096)
    monkeypatch.setattr(scan, "_STEP", 1000)
    log = log_path(tmp_path, 0)
    log.write_bytes(b"x" * 5000 + b"\n" + _task("p"))
    (chunk,) = _scan(tmp_path, {"p"}, max_bytes=100).chunks
    assert (chunk.start, chunk.end, chunk.records) == (0, 5001, ())
    assert chunk.corrupt == ((0, "line longer than 4096 bytes"),)
    (chunk,) = _scan(tmp_path, {"p"}, {(0, ""): (chunk.identity, 5001)}, max_bytes=100).chunks
    assert [r.offset for r in chunk.records] == [5001]


def test_a_damaged_line_about_a_watched_id_is_reported_and_passed(tmp_path: Path) -> None:
    log = log_path(tmp_path, 0)
    bad = _task("p").replace(b'"t"', b'"u"')  # checksum no longer matches
    log.write_bytes(bad + _task("p", "completed"))
    (chunk,) = _scan(tmp_path, {"p"}).chunks
    assert [offset for offset, _ in chunk.corrupt] == [0]
    assert [r.offset for r in chunk.records] == [len(bad)]
    assert chunk.end == log.stat().st_size


def test_the_core_s_watch_follows_a_parent_through_real_files(tmp_path: Path) -> None:
    # A node's loop, by hand: want, request, scan, fold. The parent is unknown after a
    # whole pass, live once an inbox holds it, completed once its owner's log says so.
    watch = TaskWatch()
    watch.want({"p"})

    def step() -> dict[str, str]:
        return watch.scanned(scan_queue(tmp_path, watch.request(2, 1 << 20)))

    log_path(tmp_path, 0).write_bytes(_task("x"))
    assert step() == {"p": UNKNOWN}
    inbox = tmp_path / "shard-1" / "inbox"
    inbox.mkdir(parents=True)
    (inbox / "a@pid-1-aa.log").write_bytes(_task("p"))
    assert step() == {"p": LIVE}
    append(log_path(tmp_path, 1), _task("p") + _task("p", "completed"))
    assert step() == {"p": COMPLETED}
    assert step() == {}


# A pass settles whatever bytes no read can take: an empty file (a writer that crashed as it
# created it), a dead writer's torn last line; so a parent no file holds is judged `UNKNOWN`
# and the node does not scan back to back.


def test_an_empty_inbox_file_does_not_keep_a_pass_from_settling(tmp_path: Path) -> None:
    log_path(tmp_path, 0).write_bytes(_task("x"))
    (tmp_path / "shard-0" / "inbox").mkdir()
    (tmp_path / "shard-0" / "inbox" / "w@pid-1-aa.log").write_bytes(b"")  # crashed at create
    watch = TaskWatch()
    watch.want({"p"})
    assert watch.scanned(scan_queue(tmp_path, watch.request(1, 1 << 20))) == {"p": UNKNOWN}


def test_a_dead_writer_s_torn_inbox_tail_does_not_keep_a_pass_from_settling(
    tmp_path: Path,
) -> None:
    log_path(tmp_path, 0).write_bytes(_task("x"))
    (tmp_path / "shard-0" / "inbox").mkdir()
    (tmp_path / "shard-0" / "inbox" / "w@pid-1-aa.log").write_bytes(_task("y") + _task("z")[:9])
    watch = TaskWatch()
    watch.want({"p"})
    assert watch.scanned(scan_queue(tmp_path, watch.request(1, 1 << 20))) == {"p": UNKNOWN}


def test_a_read_stopped_at_max_bytes_says_how_much_it_left_and_the_pass_goes_on(
    tmp_path: Path,
) -> None:
    log_path(tmp_path, 0).write_bytes(b"".join(_task(f"t{i}") for i in range(20)) + _task("p"))
    watch = TaskWatch()
    watch.want({"p"})
    changes = watch.scanned(scan_queue(tmp_path, watch.request(1, 300)))
    assert changes == {} and not watch.caught_up()
    reads = 1
    while not watch.caught_up():
        changes.update(watch.scanned(scan_queue(tmp_path, watch.request(1, 300))))
        reads += 1
    assert changes == {"p": LIVE} and reads > 3


def test_a_folder_that_cannot_be_read_is_reported_and_does_not_hold_the_pass(
    tmp_path: Path,
) -> None:
    log_path(tmp_path, 0).write_bytes(_task("x"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "shard-0" / "inbox").symlink_to(elsewhere)
    watch = TaskWatch()
    watch.want({"p"})
    got = scan_queue(tmp_path, watch.request(1, 1 << 20))
    assert [shard for shard, _ in got.errors] == [0] and "inbox" in got.errors[0][1]
    assert watch.scanned(got) == {"p": UNKNOWN}


# ------------------------------------------------------------------------------------------
# read_task: every record of one id, for its story
# ------------------------------------------------------------------------------------------


def test_read_task_finds_the_ids_records_in_logs_and_inboxes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scan, "_STEP", 64)  # lines cross the reads' boundaries
    log = log_path(tmp_path, 1)
    claim = encode_record(
        {"snerdKind": "claim", "epoch": 1, "node": "n1", "at": "2027-01-01T00:00:00Z"}
    )
    dispatch = encode_record(
        {"snerdKind": "dispatch", "task": "p", "attempt": 1, "at": "2027-01-01T00:00:01Z"}
    )
    lines = [claim, _task("p"), b"{damaged\n", _task("other"), dispatch]
    tail = _task("p", "completed")[:-1]  # the last record lost only its newline: it counts
    log.write_bytes(b"".join(lines) + tail)
    inbox = tmp_path / "shard-1" / "inbox"
    inbox.mkdir()
    (inbox / "w2.log").write_bytes(_task("p") + _task("p", "completed")[:-1])  # being written
    errors: list[str] = []
    found = scan.read_task(tmp_path, 3, "p", errors)
    assert errors == []
    at = [sum(len(x) for x in lines[:i]) for i in range(len(lines))]
    assert [(f.shard, f.source, f.offset) for f in found] == [
        (1, "log", at[0]),
        (1, "log", at[1]),
        (1, "log", at[4]),
        (1, "log", len(b"".join(lines))),
        (1, "w2", 0),
    ]
    assert found[3].fields["snerdOutcome"] == "completed"


def test_read_task_reports_a_linked_log_and_reads_on(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.log"
    elsewhere.write_bytes(_task("p"))
    log = log_path(tmp_path, 0)
    log.symlink_to(elsewhere)
    log_path(tmp_path, 1).write_bytes(_task("p"))
    errors: list[str] = []
    found = scan.read_task(tmp_path, 2, "p", errors)
    assert [(f.shard, f.source) for f in found] == [(1, "log")]
    assert len(errors) == 1 and str(log) in errors[0]


def test_read_task_skips_a_line_longer_than_any_writer_makes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scan, "_STEP", 64)
    monkeypatch.setattr(scan, "LINE_LIMIT", 200)
    log = log_path(tmp_path, 0)
    huge = _task("p", note="x" * 500)
    after = _task("p", "completed")
    log.write_bytes(huge + after)
    found = scan.read_task(tmp_path, 1, "p")
    assert [(f.offset, f.fields.get("snerdOutcome")) for f in found] == [(len(huge), "completed")]
