"""The group-commit log on real files: exact offsets, shared fsyncs, torn tails, corrupt lines,
compaction, disk full and failing fsyncs."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from snerd.core.effects import KeepRange, Location, NewRecord
from snerd.core.records import CorruptRecord, decode_record, encode_record
from snerd.io.log import (
    CompactResult,
    GroupCommitLog,
    atomic_replace,
    compaction_tmp_path,
    materialize,
    read_log,
    read_record,
    recover_log,
    repair_tail,
)
from snerd.io.log import reader as log_reader
from snerd.io.log import writer as log_writer


@pytest.fixture(autouse=True, params=["writer thread", "sync helper"])
def sync_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every log test twice: fsyncs by the writer thread, and by the sync helper process
    (the daemon's way: `GroupCommitLog(sync_helper=True)`)."""
    monkeypatch.setattr(log_writer, "DEFAULT_SYNC_HELPER", request.param == "sync helper")
    return str(request.param)


def fields(i: int, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "taskId": f"t{i}",
        "retryCount": 0,
        "maxRetries": 3,
        "retryAfterHours": 0.0,
        "taskData": f'{{"n": {i}}}',
        "taskType": "email",
        "snerdEpoch": 1,
    }
    out.update(extra)
    return out


def line(i: int, **extra: Any) -> bytes:
    return encode_record(fields(i, **extra))


def read_all(path: Path, **kw: Any) -> tuple[list[Any], list[tuple[int, str]]]:
    records: list[Any] = []
    corrupt: list[tuple[int, str]] = []
    for chunk in read_log(path, **kw):
        records.extend(chunk.records)
        corrupt.extend(chunk.corrupt)
    return records, corrupt


def ids(records: list[Any]) -> list[str]:
    return [r.fields["taskId"] for r in records]


# -- appends -----------------------------------------------------------------------------------


async def test_offsets_are_exact_and_records_read_back(tmp_path: Path) -> None:
    path = tmp_path / "shard-0" / "tasks" / "tasks.log"  # directories created on demand
    batches = [[line(0)], [line(1), line(2), line(3)], [line(4, taskData="x" * 5000)]]
    async with GroupCommitLog() as log:
        expected_offset = 0
        for batch in batches:
            offsets = await log.append(path, batch)
            assert len(offsets) == len(batch)
            for off, ln in zip(offsets, batch, strict=True):
                assert off == expected_offset
                assert log.read_record(path, off, len(ln)) == decode_record(ln[:-1])
                expected_offset += len(ln)
        stats = log.statistics()
    assert path.read_bytes() == b"".join(b"".join(b) for b in batches)
    assert (stats.appends, stats.committed, stats.failed, stats.lines) == (3, 3, 0, 5)
    assert stats.fsyncs >= stats.batches == 3
    records, corrupt = read_all(path)
    assert ids(records) == ["t0", "t1", "t2", "t3", "t4"]
    assert corrupt == []


async def test_concurrent_appends_share_writes_and_fsyncs(tmp_path: Path, sync_mode: str) -> None:
    path = tmp_path / "tasks.log"
    n_tasks, per_task = 64, 5
    got: dict[bytes, int] = {}

    async with GroupCommitLog(fsync="always") as log:

        async def appender(k: int) -> None:
            for j in range(per_task):
                ln = line(k * 1000 + j)
                (off,) = await log.append(path, [ln])
                got[ln] = off

        async with trio.open_nursery() as nursery:
            for k in range(n_tasks):
                nursery.start_soon(appender, k)
        stats = log.statistics()

    assert stats.appends == stats.committed == n_tasks * per_task
    # Group commit: far fewer fsyncs than appends. The writer thread writes what waited for
    # it in one write and one fsync a round; through the sync helper each submit is written
    # at once and the fsyncs are shared (one in flight, the next covering all written since).
    assert stats.fsyncs < stats.appends // 4
    assert stats.writes == stats.batches
    if sync_mode == "writer thread":
        assert stats.batches < stats.appends
        assert stats.fsyncs == stats.batches
    data = path.read_bytes()
    for ln, off in got.items():
        assert data[off : off + len(ln)] == ln
    # Offsets tile the file exactly: nothing lost, nothing duplicated.
    assert sorted(got.values()) == sorted(
        sum(len(x) for x in sorted(got, key=got.__getitem__)[:i]) for i in range(len(got))
    )
    assert len(data) == sum(len(x) for x in got)


async def test_one_batch_spans_several_files(tmp_path: Path) -> None:
    paths = [tmp_path / f"shard-{i}" / "tasks" / "tasks.log" for i in range(3)]
    results: dict[int, Any] = {}
    async with GroupCommitLog() as log:
        done = trio.Event()

        def on_done(key: int) -> Any:
            def cb(result: Any) -> None:
                results[key] = result
                if len(results) == 9:
                    done.set()

            return cb

        for k in range(9):  # submitted without yielding: one writer round sees them all
            log.submit(paths[k % 3], [line(k)], on_done(k))
        await done.wait()
        stats = log.statistics()
    assert stats.batches <= 2 and stats.fsyncs <= 2 * 3
    for i, path in enumerate(paths):
        records, _ = read_all(path)
        assert ids(records) == [f"t{k}" for k in range(9) if k % 3 == i]
        assert [results[k][0] for k in range(9) if k % 3 == i] == [r.offset for r in records]


async def test_submit_rejects_malformed_lines(tmp_path: Path) -> None:
    async with GroupCommitLog() as log:
        with pytest.raises(ValueError):
            log.submit(tmp_path / "x.log", [b'{"a":1}'], lambda r: None)
        with pytest.raises(ValueError):
            log.submit(tmp_path / "x.log", [b'{"a":1}\n{"b":2}\n'], lambda r: None)
        with pytest.raises(ValueError):
            log.submit(tmp_path / "x.log", [], lambda r: None)
        # An empty line, one good line beside a bad one, a newline first and not last.
        for bad in ([b""], [line(1), b'{"a":1}'], [b'\n{"a":1}'], [line(1), b"\n\n"]):
            with pytest.raises(ValueError):
                log.submit(tmp_path / "x.log", bad, lambda r: None)
    assert not (tmp_path / "x.log").exists()
    with pytest.raises(RuntimeError):
        log.submit(tmp_path / "x.log", [line(1)], lambda r: None)


async def test_a_cancelled_append_still_commits(tmp_path: Path) -> None:
    path = tmp_path / "tasks.log"
    async with GroupCommitLog() as log:
        with trio.CancelScope() as scope:
            scope.cancel()
            await log.append(path, [line(1)])
        assert scope.cancelled_caught
    records, _ = read_all(path)
    assert ids(records) == ["t1"]


async def test_a_raising_callback_surfaces_at_exit(tmp_path: Path) -> None:
    def boom(result: Any) -> None:
        raise KeyError("bug in a callback")

    with pytest.raises(RuntimeError, match="on_done") as info:
        async with GroupCommitLog() as log:
            log.submit(tmp_path / "tasks.log", [line(1)], boom)
            await log.append(tmp_path / "tasks.log", [line(2)])
    assert isinstance(info.value.__cause__, KeyError)


async def test_a_writer_bug_fails_appends_instead_of_hanging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: GroupCommitLog, *args: Any) -> None:
        raise ZeroDivisionError("bug in the writer")

    with pytest.raises(RuntimeError, match="crashed") as info:
        async with GroupCommitLog(sync_helper=False) as log:  # (the writer thread's crash)
            await log.append(tmp_path / "tasks.log", [line(0)])
            monkeypatch.setattr(GroupCommitLog, "_commit", broken)
            with trio.fail_after(10), pytest.raises(OSError) as failed:
                await log.append(tmp_path / "tasks.log", [line(1)])
            assert failed.value.errno == errno.EIO
            with pytest.raises(RuntimeError):
                log.submit(tmp_path / "tasks.log", [line(2)], lambda r: None)
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert ids(read_all(tmp_path / "tasks.log")[0]) == ["t0"]


async def test_close_file_then_append_reopens_at_the_right_offset(tmp_path: Path) -> None:
    path = tmp_path / "tasks.log"
    async with GroupCommitLog() as log:
        (a,) = await log.append(path, [line(1)])
        await log.close_file(path)
        (b,) = await log.append(path, [line(2)])
    assert (a, b) == (0, len(line(1)))


async def test_a_foreign_write_does_not_corrupt_offsets(tmp_path: Path) -> None:
    # Nobody else should write the file; if someone does anyway, offsets stay true.
    path = tmp_path / "tasks.log"
    async with GroupCommitLog() as log:
        await log.append(path, [line(1)])
        with open(path, "ab") as f:
            f.write(line(99))
        (off,) = await log.append(path, [line(2)])
        assert log.statistics().size_mismatches == 1
        assert off == len(line(1)) + len(line(99))
        assert log.read_record(path, off, len(line(2)))["taskId"] == "t2"


# -- fsync policies ------------------------------------------------------------------------------


async def test_never_policy_does_not_fsync(tmp_path: Path) -> None:
    async with GroupCommitLog(fsync="never") as log:
        for i in range(3):
            await log.append(tmp_path / "tasks.log", [line(i)])
    assert log.statistics().fsyncs == 0
    assert ids(read_all(tmp_path / "tasks.log")[0]) == ["t0", "t1", "t2"]


async def test_interval_policy_acks_before_fsync_and_syncs_at_close(tmp_path: Path) -> None:
    async with GroupCommitLog(fsync="interval", interval_ms=60_000) as log:
        await log.append(tmp_path / "tasks.log", [line(1)])
        await log.append(tmp_path / "tasks.log", [line(2)])
        assert log.statistics().fsyncs == 0  # acked after the write alone
    assert log.statistics().fsyncs == 1  # the final sync at close


async def test_interval_policy_syncs_in_the_background(tmp_path: Path) -> None:
    async with GroupCommitLog(fsync="interval", interval_ms=5) as log:
        await log.append(tmp_path / "tasks.log", [line(1)])
        with trio.fail_after(10):
            while log.statistics().fsyncs == 0:
                await trio.sleep(0.005)


def test_bad_policy_is_refused() -> None:
    with pytest.raises(ValueError):
        GroupCommitLog(fsync="sometimes")


# -- failures --------------------------------------------------------------------------------------


async def test_failed_fsync_cuts_the_batch_and_the_next_one_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sync_mode: str
) -> None:
    path = tmp_path / "tasks.log"
    real_fsync = os.fsync
    failures = [0]

    def flaky_fsync(fd: int) -> None:
        if failures[0] == 0 and os.fstat(fd).st_size > len(line(1)):
            failures[0] += 1
            raise OSError(errno.EIO, "injected EIO")
        real_fsync(fd)

    if sync_mode == "sync helper":
        # The file's first append goes through the writer thread (it opens the file); the
        # helper's first fsync is the second append's.
        monkeypatch.setenv("SNERD_TEST_SYNC_FAIL_AT", "1")
    async with GroupCommitLog() as log:
        await log.append(path, [line(1)])
        if sync_mode == "writer thread":
            monkeypatch.setattr(os, "fsync", flaky_fsync)
        with pytest.raises(OSError) as info:
            await log.append(path, [line(2), line(3)])
        assert info.value.errno == errno.EIO
        assert path.read_bytes() == line(1)  # the unsynced batch was cut off
        (off,) = await log.append(path, [line(4)])
        assert off == len(line(1))
        assert log.statistics().failed == 1
    if sync_mode == "writer thread":
        assert failures == [1]
    assert ids(read_all(path)[0]) == ["t1", "t4"]


async def test_short_write_then_enospc_leaves_nothing_partial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "tasks.log"
    real_write = os.write
    calls = [0]

    def short_then_full(fd: int, data: Any) -> int:
        calls[0] += 1
        if calls[0] == 1:
            return real_write(fd, bytes(data)[: len(data) // 2])  # a short write...
        raise OSError(errno.ENOSPC, "No space left on device")  # ...then the disk is full

    async with GroupCommitLog() as log:
        await log.append(path, [line(1)])
        monkeypatch.setattr(os, "write", short_then_full)
        with pytest.raises(OSError) as info:
            await log.append(path, [line(2), line(3)])
        monkeypatch.setattr(os, "write", real_write)
        assert info.value.errno == errno.ENOSPC
        assert path.read_bytes() == line(1)
        assert await log.append(path, [line(4)]) == (len(line(1)),)
    assert calls[0] == 2


async def test_a_never_cut_file_keeps_a_failed_batch_and_goes_on_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An inbox file is read by another process while it is written: a failed batch is not cut
    (its reader may have taken its complete lines already), a partial line is closed by a
    newline, and the next batch lands after both, never at offsets a reader has passed."""
    path = tmp_path / "inbox" / "n.log"
    real_write = os.write
    calls = [0]
    half = len(line(2) + line(3)) * 3 // 4  # all of line 2, part of line 3

    def short_then_full(fd: int, data: Any) -> int:
        calls[0] += 1
        if calls[0] == 1:
            return real_write(fd, bytes(data)[:half])
        raise OSError(errno.ENOSPC, "No space left on device")

    async with GroupCommitLog(never_cut=lambda p: p.endswith("n.log")) as log:
        await log.append(path, [line(1)])
        monkeypatch.setattr(os, "write", short_then_full)
        with pytest.raises(OSError):
            await log.append(path, [line(2), line(3)])
        monkeypatch.setattr(os, "write", real_write)
        kept = path.read_bytes()
        assert kept == line(1) + (line(2) + line(3))[:half]  # nothing cut
        (off,) = await log.append(path, [line(4)])
        assert off == len(kept) + 1  # after a newline closing the partial line
    records, corrupt = read_all(path)
    assert ids(records) == ["t1", "t2", "t4"]
    assert len(corrupt) == 1


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str = "64k") -> Iterator[Path]:
    where.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        reason = (
            f"cannot mount a tmpfs for the disk-full test: {proc.stderr.strip() or proc.returncode}"
        )
        if os.environ.get("SNERD_REQUIRE_ALL") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], check=False)


def fill(directory: Path) -> Path:
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            try:
                os.write(fd, b"\0" * 4096)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
        # Take the last few bytes too.
        with contextlib.suppress(OSError):
            while os.write(fd, b"\0"):
                pass
    finally:
        os.close(fd)
    return filler


async def test_disk_full_fails_cleanly_and_recovers(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "small") as mnt:
        path = mnt / "shard-0" / "tasks" / "tasks.log"
        first = [line(i) for i in range(3)]
        big = line(99, taskData="x" * 9000)
        async with GroupCommitLog() as log:
            offsets = await log.append(path, first)
            size_before = path.stat().st_size
            filler = fill(mnt)
            with pytest.raises(OSError) as info:
                await log.append(path, [line(3), big])
            assert info.value.errno == errno.ENOSPC
            # Nothing partial remains, earlier records are intact.
            assert path.stat().st_size == size_before
            assert path.read_bytes() == b"".join(first)
            # Still full: fails again, still clean.
            with pytest.raises(OSError):
                await log.append(path, [big])
            assert path.stat().st_size == size_before
            # Space returns: appends work again, at the right offset.
            filler.unlink()
            assert await log.append(path, [big]) == (size_before,)
            stats = log.statistics()
        assert offsets == (0, len(first[0]), len(first[0]) + len(first[1]))
        assert stats.failed == 2
        records, corrupt = read_all(path)
        assert ids(records) == ["t0", "t1", "t2", "t99"]
        assert corrupt == []


# -- reading back --------------------------------------------------------------------------------


def test_torn_tail_is_reported_then_cut(tmp_path: Path) -> None:
    path = tmp_path / "tasks.log"
    whole = line(1) + line(2)
    torn = line(3)[:25]
    path.write_bytes(whole + torn)
    chunks = list(read_log(path))
    assert chunks[-1].eof and chunks[-1].fragment == len(torn)
    assert chunks[-1].end == len(whole)
    assert ids([r for c in chunks for r in c.records]) == ["t1", "t2"]
    tail = chunks[-1].tail
    assert tail is not None and tail.records == [] and "not JSON" in tail.corrupt[0][1]
    repair = repair_tail(path)
    assert (repair.at, repair.cut, repair.restored) == (len(whole), len(torn), False)
    assert "not JSON" in repair.reason
    assert path.read_bytes() == whole
    assert repair_tail(path).at == -1
    assert repair_tail(tmp_path / "missing.log").at == -1


def test_a_file_that_is_only_a_torn_line_is_cut_to_empty(tmp_path: Path) -> None:
    path = tmp_path / "tasks.log"
    path.write_bytes(line(1)[:-1] + b"x" * 100_000)
    assert repair_tail(path).cut == len(line(1)) - 1 + 100_000
    assert path.read_bytes() == b""


def test_a_whole_last_record_that_lost_only_its_newline_is_kept(tmp_path: Path) -> None:
    # `truncate -s -1 tasks.log`: the last record is complete and its checksum holds. It may
    # have been acknowledged, so it is kept and its newline written back, never cut.
    path = tmp_path / "tasks.log"
    whole = line(1) + line(2)
    path.write_bytes(whole[:-1])
    last = list(read_log(path))[-1]
    assert last.fragment == len(line(2)) - 1
    assert last.tail is not None and ids(last.tail.records) == ["t2"]
    assert last.tail.records[0].length == len(line(2))  # once its newline is back
    repair = repair_tail(path)
    assert (repair.at, repair.cut, repair.restored) == (len(line(1)), 0, True)
    assert path.read_bytes() == whole
    assert ids(read_all(path)[0]) == ["t1", "t2"]


def test_a_last_line_is_cut_only_when_it_holds_no_record(tmp_path: Path) -> None:
    path = tmp_path / "tasks.log"
    flipped = bytearray(line(2)[:-1])
    flipped[20] ^= 0x01  # a flipped byte: the checksum fails, the line is no record
    for tail, kept in [
        (line(2)[:-1], True),
        (line(2)[:-2], False),  # the closing brace lost too: a torn write
        (bytes(flipped), False),
        (b"   ", False),
        (b"\x00" * 40, False),
    ]:
        path.write_bytes(line(1) + tail)
        repair = repair_tail(path)
        assert repair.restored is kept, tail
        assert path.read_bytes() == line(1) + (tail + b"\n" if kept else b"")


def test_a_last_line_longer_than_the_line_limit_is_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(log_reader, "LINE_LIMIT", 1000)
    path = tmp_path / "tasks.log"
    path.write_bytes(line(1) + b"y" * 5000)
    repair = repair_tail(path)
    assert (repair.cut, repair.restored) == (5000, False) and "longer than" in repair.reason
    assert path.read_bytes() == line(1)


async def test_writer_never_glues_a_record_onto_an_uncut_torn_tail(tmp_path: Path) -> None:
    # Upstream bug 6.1.1. Even if nobody cut the torn tail, the next record starts a new line.
    path = tmp_path / "tasks.log"
    torn = line(1)[:30]
    path.write_bytes(line(0) + torn)
    async with GroupCommitLog() as log:
        (off,) = await log.append(path, [line(2)])
    assert off == len(line(0)) + len(torn) + 1
    records, corrupt = read_all(path)
    assert ids(records) == ["t0", "t2"]
    assert [o for o, _ in corrupt] == [len(line(0))]


async def test_writer_never_glues_a_record_onto_another_process_s_torn_line(
    tmp_path: Path,
) -> None:
    # The file is open already when another process (a daemon that took the shard over, then
    # crashed mid-append) leaves a torn line at its end: the next write starts on a new line,
    # and a failed one would be cut back to the real end, not to this writer's idea of it.
    path = tmp_path / "tasks.log"
    async with GroupCommitLog() as log:
        assert await log.append(path, [line(1)]) == (0,)
        with open(path, "ab") as other:
            other.write(line(8) + line(9)[:30])
        (off,) = await log.append(path, [line(2)])
    assert off == len(line(1)) + len(line(8)) + 30 + 1
    records, corrupt = read_all(path)
    assert ids(records) == ["t1", "t8", "t2"]
    assert [o for o, _ in corrupt] == [len(line(1)) + len(line(8))]


def test_corrupt_middle_lines_are_skipped_and_reported(tmp_path: Path) -> None:
    path = tmp_path / "tasks.log"
    damaged = bytearray(line(2))
    damaged[15] ^= 0x20
    bad_utf8 = b'{"taskId":"t3","taskData":"\xe2\x82"}\n'
    parts = [line(1), bytes(damaged), bad_utf8, b"\n", line(4)]
    path.write_bytes(b"".join(parts))
    records, corrupt = read_all(path)
    assert ids(records) == ["t1", "t4"]
    assert records[1].offset == sum(len(p) for p in parts[:4])
    assert [o for o, _ in corrupt] == [len(parts[0]), len(parts[0]) + len(parts[1])]


@pytest.mark.parametrize("chunk_bytes", [1, 7, 64, 1000, 1 << 20])
def test_chunking_does_not_change_what_is_read(tmp_path: Path, chunk_bytes: int) -> None:
    path = tmp_path / "tasks.log"
    body = b"".join(line(i, taskData="y" * (i * 37)) for i in range(20))
    path.write_bytes(body + b"garbage\n" + line(20) + b"torn")
    records, corrupt = read_all(path, chunk_bytes=chunk_bytes)
    assert ids(records) == [f"t{i}" for i in range(21)]
    assert corrupt == [(len(body), corrupt[0][1])]
    assert sum(r.length for r in records) == len(body) + len(line(20))


def test_a_missing_log_reads_as_empty(tmp_path: Path) -> None:
    assert list(read_log(tmp_path / "nope.log")) == [([], [], 0, True, 0, None)]
    with pytest.raises(FileNotFoundError):
        list(read_log(tmp_path / "nope.log", missing_ok=False))


def test_read_log_resumes_from_an_offset(tmp_path: Path) -> None:
    path = tmp_path / "inbox.log"
    path.write_bytes(line(1) + line(2) + line(3)[:10])
    first = list(read_log(path))
    end = first[-1].end
    with open(path, "ab") as f:
        f.write(line(3)[10:] + line(4))
    later = list(read_log(path, start=end))
    assert ids([r for c in later for r in c.records]) == ["t3", "t4"]
    assert later[0].records[0].offset == end


def test_overlong_lines_are_reported_and_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(log_reader, "LINE_LIMIT", 500)
    path = tmp_path / "tasks.log"
    path.write_bytes(line(1) + b"z" * 5000 + b"\n" + line(2))
    records, corrupt = read_all(path, chunk_bytes=64)
    assert ids(records) == ["t1", "t2"]
    # Reported once the limit is crossed, without buffering the rest of the run.
    assert corrupt == [(len(line(1)), "line longer than 500 bytes")]


def test_read_record_checks_the_location(tmp_path: Path) -> None:
    path = tmp_path / "tasks.log"
    path.write_bytes(line(1) + line(2))
    assert read_record(path, len(line(1)), len(line(2)))["taskId"] == "t2"
    with pytest.raises(CorruptRecord):
        read_record(path, 3, len(line(2)))
    with pytest.raises(CorruptRecord):
        read_record(path, len(line(1)), len(line(2)) + 5)  # past the end of the file


def test_materialize_builds_on_a_base_record_from_the_log(tmp_path: Path) -> None:
    path = tmp_path / "shard-0" / "tasks" / "tasks.log"
    path.parent.mkdir(parents=True)
    src = line(1, taskData="the payload", LastErrorObj="old error")
    no_data = encode_record({"snerdKind": "claim", "epoch": 3, "node": "n", "snerdEpoch": 3})
    path.write_bytes(src + no_data)

    def path_for(shard: int) -> Path:
        return tmp_path / f"shard-{shard}" / "tasks" / "tasks.log"

    new = NewRecord(
        fields={"retryCount": 1, "deletedAt": "2026-01-01T00:00:00Z"},
        base=Location(shard=0, offset=0, length=len(src)),
        remove=("LastErrorObj",),
    )
    plain = NewRecord(fields={"snerdKind": "dispatch", "task": "t1", "attempt": 1})
    out = materialize([new, plain], path_for)
    expected = {**decode_record(src[:-1]), "retryCount": 1, "deletedAt": "2026-01-01T00:00:00Z"}
    del expected["LastErrorObj"]
    assert decode_record(out[0][:-1]) == expected
    assert expected["taskData"] == "the payload"
    assert decode_record(out[1][:-1]) == {"snerdKind": "dispatch", "task": "t1", "attempt": 1}
    missing = NewRecord(
        fields={"taskId": "t1"},
        base=Location(shard=0, offset=len(src), length=len(no_data)),
    )
    with pytest.raises(CorruptRecord, match="taskData"):
        materialize([missing], path_for)
    built: list[bytes] = []
    with pytest.raises(CorruptRecord, match="taskData"):
        materialize([plain, new, missing, plain], path_for, out=built)
    assert len(built) == 2  # the index of the record that could not be built


# -- compaction ---------------------------------------------------------------------------------


async def test_compaction_keeps_exactly_the_given_ranges(tmp_path: Path) -> None:
    path = tmp_path / "tasks.log"
    lines = [line(i) for i in range(10)]
    async with GroupCommitLog() as log:
        offsets = await log.append(path, lines)
        for i in (2, 5):  # warm the reader's descriptor on the old file
            assert log.read_record(path, offsets[i], len(lines[i]))["taskId"] == f"t{i}"
        keep_idx = [2, 5, 6, 9, 0]  # any order; 5 and 6 are adjacent in the old file
        keep = [KeepRange(offset=offsets[i], length=len(lines[i])) for i in keep_idx]
        extra = [line(100), line(101)]
        result = await log.compact(path, keep, extra)
        assert isinstance(result, CompactResult)
        expected = b"".join(lines[i] for i in keep_idx) + b"".join(extra)
        assert path.read_bytes() == expected
        assert result.size == len(expected)
        assert result.lengths == (*(len(lines[i]) for i in keep_idx), *map(len, extra))
        # The reader follows the new file.
        for off, ln, want in zip(
            result.offsets, result.lengths, [*keep_idx, 100, 101], strict=True
        ):
            assert log.read_record(path, off, ln)["taskId"] == f"t{want}"
        # Appends continue at the end of the new file.
        assert await log.append(path, [line(200)]) == (result.size,)
        assert log.statistics().compactions == 1
    assert not Path(compaction_tmp_path(path)).exists()
    assert ids(read_all(path)[0]) == [f"t{i}" for i in [*keep_idx, 100, 101, 200]]


async def test_compaction_of_partial_lines_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tasks.log"
    async with GroupCommitLog() as log:
        await log.append(path, [line(1), line(2)])
        before = path.read_bytes()
        for bad in (KeepRange(offset=0, length=10), KeepRange(offset=0, length=len(before) + 1)):
            with pytest.raises(OSError) as info:
                await log.compact(path, [bad], [])
            assert info.value.errno == errno.EINVAL
        assert path.read_bytes() == before
        assert not Path(compaction_tmp_path(path)).exists()
        assert await log.append(path, [line(3)]) == (len(before),)


async def test_compaction_fails_rather_than_lose_a_later_append(tmp_path: Path) -> None:
    path = tmp_path / "tasks.log"
    async with GroupCommitLog() as log:
        offsets = await log.append(path, [line(1), line(2)])
        outcomes: list[Any] = []
        done = trio.Event()

        def on_compacted(result: Any) -> None:
            outcomes.append(result)
            done.set()

        log.submit_compaction(
            path, [KeepRange(offset=offsets[1], length=len(line(2)))], [], on_compacted
        )
        appended = await log.append(path, [line(3)])  # the core never does this; the log copes
        await done.wait()
    assert isinstance(outcomes[0], OSError)
    assert appended == (len(line(1)) + len(line(2)),)
    assert ids(read_all(path)[0]) == ["t1", "t2", "t3"]
    assert not Path(compaction_tmp_path(path)).exists()


async def test_compaction_fails_rather_than_unlink_another_process_s_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another process (a daemon that took the shard over while this one was paused past its
    # lease) appends to the log after the copy was made: the rename would unlink its record.
    path = tmp_path / "tasks.log"
    copy = log_writer.write_compacted

    def copy_then_another_process_appends(*args: Any) -> Any:
        copied = copy(*args)
        with open(path, "ab") as other:
            other.write(line(9))
        return copied

    monkeypatch.setattr(log_writer, "write_compacted", copy_then_another_process_appends)
    async with GroupCommitLog() as log:
        offsets = await log.append(path, [line(1), line(2)])
        with pytest.raises(OSError) as caught:
            await log.compact(path, [KeepRange(offset=offsets[1], length=len(line(2)))])
    assert caught.value.errno == errno.EAGAIN and "grew during compaction" in str(caught.value)
    assert ids(read_all(path)[0]) == ["t1", "t2", "t9"]
    assert not Path(compaction_tmp_path(path)).exists()


async def test_compaction_covers_appends_submitted_before_it(tmp_path: Path) -> None:
    path = tmp_path / "tasks.log"
    async with GroupCommitLog() as log:
        offsets = await log.append(path, [line(1), line(2)])
        pending: list[Any] = []
        log.submit(path, [line(3)], pending.append)  # not yet written when compaction starts
        third = offsets[1] + len(line(2))
        keep = [
            KeepRange(offset=offsets[1], length=len(line(2))),
            KeepRange(offset=third, length=len(line(3))),
        ]
        result = await log.compact(path, keep, [])
    assert pending == [(third,)]
    assert result.offsets == (0, len(line(2)))
    assert path.read_bytes() == line(2) + line(3)


async def test_a_crash_before_the_rename_loses_nothing(tmp_path: Path) -> None:
    # A crash while tasks.tmp was being written: the log is intact, the temp file is junk.
    path = tmp_path / "tasks" / "tasks.log"
    path.parent.mkdir()
    lines = [line(i) for i in range(5)]
    path.write_bytes(b"".join(lines) + lines[0][:7])  # and a torn tail, for good measure
    tmp = Path(compaction_tmp_path(path))
    assert tmp.name == "tasks.tmp"
    tmp.write_bytes(lines[3] + lines[4][:20])
    assert recover_log(path).cut == 7
    assert not tmp.exists()
    assert path.read_bytes() == b"".join(lines)
    async with GroupCommitLog() as log:
        assert await log.append(path, [line(5)]) == (len(b"".join(lines)),)
    assert ids(read_all(path)[0]) == [f"t{i}" for i in range(6)]


# -- small files ----------------------------------------------------------------------------------


def test_atomic_replace(tmp_path: Path) -> None:
    target = tmp_path / "membership.json"
    atomic_replace(target, b'{"version":1}\n')
    atomic_replace(target, b'{"version":2}\n')
    assert target.read_bytes() == b'{"version":2}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["membership.json"]
    with pytest.raises(OSError):
        atomic_replace(tmp_path / "missing-dir" / "membership.json", b"{}")
    assert target.read_bytes() == b'{"version":2}\n'
