"""The log's sync helper process (`GroupCommitLog(sync_helper=True)`, the daemon's way): its
own failures. Everything else the log does is tested in both ways by test_log.py."""

from __future__ import annotations

import errno
import os
import select
from pathlib import Path

import pytest
import trio

from snerd.core.effects import KeepRange
from snerd.io.log import GroupCommitLog
from tests.io.log.test_log import ids, line, read_all


async def test_sync_helper_failure_cuts_every_batch_written_after_the_failed_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Through the sync helper: batches written while an fsync is out wait for the next one.
    # When that fsync fails, the cut takes every batch written since the last good fsync;
    # each fails, in submission order, and the log then goes on from the cut.
    monkeypatch.setenv("SNERD_TEST_SYNC_FAIL_AT", "2")
    path = tmp_path / "tasks.log"
    outcomes: list[tuple[int, object]] = []
    all_answered = trio.Event()

    def answered(k: int, result: object) -> None:  # (the trio thread)
        outcomes.append((k, result))
        if len(outcomes) == 3:
            all_answered.set()

    async with GroupCommitLog(sync_helper=True) as log:
        await log.append(path, [line(1)])  # the writer thread opens the file
        await log.append(path, [line(2)])  # the helper's fsync 1
        for k in (3, 4, 5):
            log.submit(path, [line(k)], lambda r, k=k: answered(k, r))
        with trio.fail_after(10):
            await all_answered.wait()
        (off,) = await log.append(path, [line(6)])
    # 3 went alone in fsync 2, which failed; 4 and 5 were written behind it and cut with it.
    assert [k for k, _ in outcomes] == [3, 4, 5]
    assert all(isinstance(r, OSError) and r.errno == errno.EIO for _, r in outcomes)
    assert off == len(line(1)) + len(line(2))
    assert ids(read_all(path)[0]) == ["t1", "t2", "t6"]


async def test_a_dead_sync_helper_fails_what_it_held_and_the_writer_thread_takes_over(
    tmp_path: Path
) -> None:
    # A poll that finds the helper gone neither raises nor answers: the log's reader of the
    # answers sees the end of the socket and fails what the helper held, once.
    path = tmp_path / "tasks.log"
    async with GroupCommitLog(sync_helper=True) as log:
        await log.append(path, [line(1)])
        await log.append(path, [line(2)])
        helper = log._helper
        assert helper is not None
        helper.proc.kill()
        helper.proc.wait()
        outcome: list[object] = []
        failed = trio.Event()

        def answered(result: object) -> None:  # (the trio thread)
            outcome.append(result)
            failed.set()

        log.submit(path, [line(3)], answered)
        log.poll_helper()
        assert outcome == []
        with trio.fail_after(10):
            await failed.wait()
        assert len(outcome) == 1
        assert isinstance(outcome[0], OSError) and outcome[0].errno == errno.EIO
        assert log._helper is None
        (off,) = await log.append(path, [line(4)])  # the writer thread, as without a helper
        assert log.statistics().failed == 1
    assert off == len(line(1)) + len(line(2))
    assert ids(read_all(path)[0]) == ["t1", "t2", "t4"]


async def test_the_helper_lets_go_of_a_compacted_log_s_old_file(tmp_path: Path) -> None:
    # The helper fsyncs through its own copy of the log's descriptor; when a compaction
    # replaces the file, it closes that copy, so the old file's space is freed.
    path = tmp_path / "tasks.log"

    def helper_files(pid: int) -> list[str]:
        fds = Path(f"/proc/{pid}/fd")
        return [os.readlink(fds / fd) for fd in os.listdir(fds)]

    async with GroupCommitLog(sync_helper=True) as log:
        await log.append(path, [line(1)])
        offsets = await log.append(path, [line(2), line(3)])  # through the helper
        helper = log._helper
        assert helper is not None
        assert str(path) in helper_files(helper.proc.pid)
        await log.compact(path, [KeepRange(offset=offsets[1], length=len(line(3)))])
        await log.append(path, [line(4)])  # the writer thread opens the new file
        await log.append(path, [line(5)])  # through the helper again: it has read all before
        held = [name for name in helper_files(helper.proc.pid) if "tasks.log" in name]
        assert held == [str(path)]  # the new file only, not the old one "(deleted)"
        assert log._helper is helper
    assert ids(read_all(path)[0]) == ["t3", "t4", "t5"]


async def test_poll_helper_answers_what_the_helper_synced_without_waiting(tmp_path: Path) -> None:
    # A caller busy in the trio thread takes the helper's answer itself (`poll_helper`), and
    # the log's own reader of the answers goes on with the next one as before.
    path = tmp_path / "tasks.log"
    async with GroupCommitLog(sync_helper=True) as log:
        await log.append(path, [line(1)])  # the writer thread opens the file
        outcome: list[object] = []
        log.poll_helper()  # nothing asked yet: nothing to take, nothing waited for
        log.submit(path, [line(2)], outcome.append)
        helper = log._helper
        assert helper is not None and log._hsent
        # Block this thread (no trio task runs) until the answer is there to read.
        readable, _, _ = select.select([helper.sock], [], [], 10)
        assert readable and outcome == []
        log.poll_helper()
        assert outcome == [(len(line(1)),)]
        log.poll_helper()
        with trio.fail_after(10):
            assert await log.append(path, [line(3)]) == (len(line(1)) + len(line(2)),)
        assert log._helper is helper
    assert ids(read_all(path)[0]) == ["t1", "t2", "t3"]

