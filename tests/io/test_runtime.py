"""The daemon's runtime in-process, on real files with the real sync helper: when its
messages go out relative to the work it is doing."""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
import trio.testing

from snerd.config import load_settings
from snerd.core import events as ev
from snerd.core.dedupe import unique_fingerprint
from snerd.core.node.model import route_shard
from snerd.core.records import encode_record
from snerd.core.watch import COMPLETED, LIVE
from snerd.io import runtime as runtime_module
from snerd.io.inbox import read_log_tail
from snerd.io.log import GroupCommitLog
from snerd.io.runtime import EVENT_BURST, Runtime


class _Peer:
    """Takes the runtime's messages in order (what `StdioPeer` would write to stdout)."""

    def __init__(self) -> None:
        self.out: list[dict[str, Any]] = []
        self.logs: list[tuple[str, str]] = []
        self._changed = trio.Event()

    def deliver(self, message: dict[str, Any]) -> None:
        self.out.append(message)
        self._changed.set()

    def deliver_lines(self, data: bytes) -> None:
        self.out.extend(orjson.loads(line) for line in data.splitlines())
        self._changed.set()

    async def wait_for(self, done: Callable[[], bool]) -> None:
        """Until `done()` holds, looked at after each message (no polling: the messages wait
        for real fsyncs, in the writer thread or the sync helper)."""
        while not done():
            self._changed = trio.Event()
            await self._changed.wait()

    def flush_nowait(self) -> None:
        pass

    async def flush(self) -> None:
        pass

    def log(self, level: str, message: str) -> None:
        self.logs.append((level, message))
        self._changed.set()


def _enqueue(task_id: str, **options: Any) -> bytes:
    return orjson.dumps(
        {
            "action": "enqueue",
            "task_id": task_id,
            "task_type": "noop",
            "task_data": "{}",
            "max_retries": 0,
            "retry_after_hours": 0,
            **options,
        }
    )


@contextlib.asynccontextmanager
async def _running(tmp_path: Path) -> AsyncIterator[tuple[Runtime, _Peer, GroupCommitLog]]:
    """A runtime on `tmp_path` whose log is open, with the sync helper (as the daemon's), and
    a first task acked: the log's first append opens the file (the writer thread); the
    helper syncs the appends after it."""
    peer = _Peer()
    runtime = Runtime(tmp_path, load_settings({}), peer, sync_helper=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(runtime.run)
        with trio.fail_after(10):
            await runtime.ready.wait()
            runtime.feed([ev.LinesReceived(lines=[_enqueue("first")])])
            await peer.wait_for(lambda: any(m.get("task_id") == "first" for m in peer.out))
        peer.out.clear()
        assert runtime._log is not None
        yield runtime, peer, runtime._log
        runtime.submit(ev.DrainRequested(reason="test"))


def _bursts(lines: list[bytes]) -> list[ev.Event]:
    """`lines` as stdin's reader hands them over: `LinesReceived` of `EVENT_BURST` lines."""
    return [
        ev.LinesReceived(lines=lines[i : i + EVENT_BURST]) for i in range(0, len(lines), EVENT_BURST)
    ]


def _twenty_in_the_helper(runtime: Runtime, log: GroupCommitLog, **options: Any) -> None:
    """Enqueue t0..t19 (more than are committed inline: the sync helper fsyncs them), then
    block this thread (no trio task runs, so nothing takes the answer) until the helper's
    answer is there to read."""
    runtime.feed([ev.LinesReceived(lines=[_enqueue(f"t{i}", **options) for i in range(20)])])
    assert log._helper is not None and log._hsent
    readable, _, _ = select.select([log._helper.sock], [], [], 10)
    assert readable


async def test_acks_made_durable_during_a_long_run_of_lines_go_out_before_its_end(
    tmp_path: Path,
) -> None:
    # Twenty enqueues (more than are committed inline) are being fsynced by the helper when a
    # long run of lines (three bursts) comes in. Their acks must not wait until every line of
    # it is handled: the runtime takes the helper's answer between two bursts, so the SDK
    # gets the acks after the first one.
    async with _running(tmp_path) as (runtime, peer, log):
        _twenty_in_the_helper(runtime, log)
        runtime.feed(_bursts([b'{"action":"stats"}'] * (3 * EVENT_BURST)))
        actions = [m["action"] for m in peer.out]
        assert actions == ["stats"] * EVENT_BURST + ["ack"] * 20 + ["stats"] * 2 * EVENT_BURST


async def test_a_long_run_of_enqueues_goes_to_the_log_a_burst_at_a_time(tmp_path: Path) -> None:
    # Three bursts of enqueues read at once: each burst's records are handed to the log as
    # soon as they are built (their fsync overlaps the handling of the next burst), not all
    # at the end of the run.
    async with _running(tmp_path) as (runtime, peer, log):
        before = log.statistics().appends
        runtime.feed(_bursts([_enqueue(f"t{i}") for i in range(3 * EVENT_BURST)]))
        assert log.statistics().appends - before == 3
        with trio.fail_after(10):
            await peer.wait_for(lambda: len(peer.out) >= 3 * EVENT_BURST)
        assert [m["task_id"] for m in peer.out] == [f"t{i}" for i in range(3 * EVENT_BURST)]


async def test_commits_taken_between_bursts_jump_lines_only(tmp_path: Path) -> None:
    # The helper's answer taken between two bursts goes ahead of the lines still queued, not
    # of other events (the log's own outcomes among them keep the order it gave them). Seen
    # through enqueues with an option, which the node acks as it handles the commit.
    async with _running(tmp_path) as (runtime, peer, log):
        _twenty_in_the_helper(runtime, log, urgency_score=5)
        stats = [b'{"action":"stats"}'] * EVENT_BURST
        runtime.feed([ev.LinesReceived(lines=stats), ev.Tick(), ev.LinesReceived(lines=stats)])
        actions = [m["action"] for m in peer.out]
        assert actions == ["stats"] * 2 * EVENT_BURST + ["ack"] * 20


async def test_plain_enqueues_are_acked_as_they_commit_before_the_node_handles_it(
    tmp_path: Path,
) -> None:
    # The same run with plain enqueues: their acks leave as soon as the helper's answer is
    # taken (`Node.on_commit`), ahead of the tick still queued before the commit, and
    # the burst that handles the commit later acks none of them again.
    async with _running(tmp_path) as (runtime, peer, log):
        _twenty_in_the_helper(runtime, log)
        stats = [b'{"action":"stats"}'] * EVENT_BURST
        runtime.feed([ev.LinesReceived(lines=stats), ev.Tick(), ev.LinesReceived(lines=stats)])
        actions = [m["action"] for m in peer.out]
        assert actions == ["stats"] * EVENT_BURST + ["ack"] * 20 + ["stats"] * EVENT_BURST
        assert [m["task_id"] for m in peer.out if m["action"] == "ack"] == [
            f"t{i}" for i in range(20)
        ]
        # The commit was handled too: every task knows where its record is.
        assert all(runtime.node.tasks[f"t{i}"].loc is not None for i in range(20))


@pytest.mark.timeout(60)  # on the host's clock instead, the timeout never comes: fail soon
async def test_the_node_s_deadlines_run_on_trio_s_clock(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    # The runtime's timer and the node's deadlines read one clock, trio's: on a MockClock an
    # attempt's hard timeout fires when virtual time passes it, not before, and the test
    # waits no real second for it. (A MockClock moved by hand, not autojump: the log's
    # fsyncs run in a thread, and trio waiting for them would let autojump skip the clock to
    # the next deadline, lease deadlines included, in the middle of a write.) A lease of 600 s:
    # no renewal comes due in the 30.5 s the clock is moved, so none is in flight when the
    # lease's own deadline passes (the wall clock, which the lease is written in, stays real).
    peer = _Peer()
    runtime = Runtime(tmp_path, load_settings({"SNERD_LEASE_TTL": "600"}), peer)
    real_start = time.perf_counter()

    def executes() -> int:
        return sum(m["action"] == "execute" and m["task_id"] == "t1" for m in peer.out)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(runtime.run)
        await runtime.ready.wait()
        register = orjson.dumps({"action": "register", "task_type": "noop"})
        job = _enqueue("t1", max_execution_seconds=30, max_retries=1)
        runtime.feed([ev.LinesReceived(lines=[register, job])])
        await peer.wait_for(lambda: executes() == 1)
        mock_clock.jump(29.5)
        await trio.testing.wait_all_tasks_blocked()
        assert executes() == 1  # not yet: 29.5 of its 30 s
        assert runtime.node.stats["total_failed"] == 0
        mock_clock.jump(1)
        await peer.wait_for(lambda: executes() == 2)  # timed out, and run again
        assert runtime.node.stats["total_failed"] == 1
        done = orjson.dumps({"action": "result", "task_id": "t1", "status": "success"})
        runtime.feed([ev.LinesReceived(lines=[done])])
        # (A drain waits for running tasks up to its timeout, on this clock that stands still.)
        runtime.submit(ev.DrainRequested(reason="test"))
    assert time.perf_counter() - real_start < 25


async def test_a_renewal_touches_the_locks_the_node_names_and_a_lost_one_is_noticed(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    # The node's `ReadMembership.touch` lists the shards whose lock it holds; the shell writes
    # through each of their fds before reading membership.json. An fd that can no longer be
    # written (here: the lock's descriptor replaced by an O_PATH one, so ftruncate(2) fails
    # with EBADF, as on a lock a network filesystem dropped) is a lost lock: the node steps
    # down. (The clock is moved by hand; the pytest timeout bounds a wait that never ends.)
    peer = _Peer()
    runtime = Runtime(tmp_path, load_settings({"SNERD_LEASE_TTL": "600"}), peer)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(runtime.run)
        await runtime.ready.wait()
        assert runtime.node.owned_shards == [0]
        fd = runtime.locks.fds[0]
        unwritable = os.open(os.devnull, os.O_PATH)
        os.dup2(unwritable, fd)
        os.close(unwritable)
        await trio.testing.wait_all_tasks_blocked()
        assert runtime.node.owned_shards == [0]  # nothing touches the lock between rounds
        mock_clock.jump(201)  # past the renewal interval (a third of the lease)
        await peer.wait_for(lambda: any("its lock failed" in m for _, m in peer.logs))
        lost = [m for _, m in peer.logs if "its lock failed" in m]
        assert lost[0].startswith("shard-0: ") and "EBADF" in lost[0], lost
        runtime.submit(ev.DrainRequested(reason="test"))


def _record(task_id: str, **more: Any) -> bytes:
    return encode_record({"taskId": task_id, "taskType": "noop", "taskData": "{}", **more})


async def test_a_child_waits_for_a_parent_it_reads_of_in_a_shard_another_daemon_owns(
    tmp_path: Path,
) -> None:
    # The node owns one of two shards; the parent's records are in the other's log, as its
    # owner would write them (here: by hand, on real files). The runtime carries out the
    # node's `ScanQueue` and feeds the answer back: the child waits while the parent is live
    # and runs once its tombstone is there.
    peer = _Peer()
    env = {"SNERD_SHARDS": "2", "SNERD_MAX_SHARDS": "1", "SNERD_LEASE_TTL": "600"}
    runtime = Runtime(tmp_path, load_settings(env), peer)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(runtime.run)
        with trio.fail_after(10):
            await runtime.ready.wait()
            (mine,) = runtime.node.owned_shards
            child = next(f"c{i}" for i in range(100) if route_shard(f"c{i}", 2) == mine)
            other = tmp_path / f"shard-{1 - mine}" / "tasks" / "tasks.log"
            other.parent.mkdir(parents=True, exist_ok=True)
            other.write_bytes(_record("p"))
            register = orjson.dumps({"action": "register", "task_type": "noop"})
            enqueue = _enqueue(child, trigger_after_ids=["p"])
            runtime.feed([ev.LinesReceived(lines=[register, enqueue])])
            watch = runtime.node.parents.watch
            await peer.wait_for(lambda: any(m.get("task_id") == child for m in peer.out))
            while watch.reported.get("p") != LIVE:  # a whole scan read the parent as live
                await trio.sleep(0.01)
            assert not [m for m in peer.out if m["action"] == "execute"]
            with other.open("ab") as f:
                f.write(_record("p", deletedAt="2027-01-01T00:00:00Z", snerdOutcome="completed"))
            await peer.wait_for(lambda: any(m["action"] == "execute" for m in peer.out))
        (run,) = [m for m in peer.out if m["action"] == "execute"]
        assert run["task_id"] == child and watch.reported["p"] == COMPLETED
        done = orjson.dumps({"action": "result", "task_id": child, "status": "success"})
        runtime.feed([ev.LinesReceived(lines=[done])])
        runtime.submit(ev.DrainRequested(reason="test"))


def _mark(node: str, start: int, end: int, **more: Any) -> bytes:
    """The `inbox` record an owner writes as it takes `node`'s inbox file from `start` to `end`."""
    return encode_record({"snerdKind": "inbox", "node": node, "offset": end, "from": start, **more})


async def test_an_inbox_write_with_dedupe_notes_the_log_before_it_and_reads_the_answer_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The node owns one of two shards; the other's log is written by hand, as its owner would
    # write it. An enqueue with a unique_key whose fingerprint routes there goes into this
    # node's inbox; its commit says what the other log was before the write (its inode and
    # size), and the ack waits until the runtime, reading that log on from there
    # (`ReadLogTail`), finds the owner's decision: dropped as a duplicate, or taken in.
    peer = _Peer()
    env = {"SNERD_SHARDS": "2", "SNERD_MAX_SHARDS": "1", "SNERD_LEASE_TTL": "600"}
    runtime = Runtime(tmp_path, load_settings(env), peer)
    noted: list[tuple[int, int, int]] = []
    reads: list[ev.LogTailRead] = []

    def reading(directory: Any, effect: Any) -> ev.LogTailRead:
        reads.append(read_log_tail(directory, effect))
        return reads[-1]

    monkeypatch.setattr(runtime_module, "read_log_tail", reading)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(runtime.run)
        with trio.fail_after(10):
            await runtime.ready.wait()
            (mine,) = runtime.node.owned_shards
            theirs = 1 - mine
            keys = (
                k
                for k in map(str, range(1000))
                if route_shard(unique_fingerprint("noop", k), 2) == theirs
            )
            dup_key, fresh_key = next(keys), next(keys)
            log = tmp_path / f"shard-{theirs}" / "tasks" / "tasks.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_bytes(_record("twin"))
            verdicts = runtime.node.verdicts
            hold = verdicts.hold

            def noting(p: Any, at: int, identity: int, size: int) -> None:
                noted.append((at, identity, size))
                hold(p, at, identity, size)

            verdicts.hold = noting  # type: ignore[method-assign]

            def acked(task_id: str) -> list[dict[str, Any]]:
                return [m for m in peer.out if m.get("task_id") == task_id]

            runtime.feed([ev.LinesReceived(lines=[_enqueue("dup", unique_key=dup_key)])])
            while not noted:
                await trio.sleep(0.01)
            st = os.stat(log)
            assert noted == [(0, st.st_ino, st.st_size)]
            (inbox,) = (tmp_path / f"shard-{theirs}" / "inbox").glob("*.log")
            segment, size = inbox.stem, inbox.stat().st_size
            while len(reads) < 2:  # read twice, nothing there yet: no answer
                await trio.sleep(0.01)
            assert reads[-1].records == () and acked("dup") == []
            dropped = [{"task": "dup", "at": 0, "of": "twin"}]
            with log.open("ab") as f:
                f.write(_mark(segment, 0, size, dropped=dropped))
            await peer.wait_for(lambda: bool(acked("dup")))
            assert acked("dup")[0]["deduplicated"] is True
            assert acked("dup")[0]["duplicate_of"] == "twin"
            # The next one is noted with the log as it is now, and read on from there.
            runtime.feed([ev.LinesReceived(lines=[_enqueue("fresh", unique_key=fresh_key)])])
            while len(noted) < 2:
                await trio.sleep(0.01)
            assert noted[1] == (size, st.st_ino, log.stat().st_size)
            with log.open("ab") as f:
                f.write(_mark(segment, size, inbox.stat().st_size))
            await peer.wait_for(lambda: bool(acked("fresh")))
        (ack,) = acked("fresh")
        assert ack["action"] == "ack" and "deduplicated" not in ack
        runtime.submit(ev.DrainRequested(reason="test"))


async def test_the_runtime_is_settled_only_once_what_it_started_has_come_back(
    tmp_path: Path, mock_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `settled()` is what snerd.testing moves its clock on: it must not hold while an event
    # waits or an append is in the log's thread. The writer thread's fsync is held here (40
    # records: more than a burst commits in the trio thread), so every trio task is blocked
    # while the append is out; once it is let go and `settled()` holds, every enqueue's record
    # has been written and acked, and the clock never moved.
    gate = threading.Event()
    real_fsync = os.fsync

    def held(fd: int) -> None:
        if threading.current_thread().name == "snerd-log-writer":
            gate.wait(10)
        real_fsync(fd)

    peer = _Peer()
    runtime = Runtime(tmp_path, load_settings({"SNERD_LEASE_TTL": "600"}), peer)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(runtime.run)
        await runtime.ready.wait()
        while not runtime.settled():  # (the start's own reads and writes)
            await trio.testing.wait_all_tasks_blocked(0.0002)
        monkeypatch.setattr(os, "fsync", held)
        try:
            runtime.submit(ev.LinesReceived(lines=[_enqueue(f"t{i}") for i in range(40)]))
            assert not runtime.settled()  # an event queued
            await trio.testing.wait_all_tasks_blocked(0.01)
            assert not runtime.settled()  # every task blocked, the append still out
            assert not any(m["action"] == "ack" for m in peer.out)
        finally:
            gate.set()
        while not runtime.settled():
            await trio.testing.wait_all_tasks_blocked(0.0002)
        acked = [m["task_id"] for m in peer.out if m["action"] == "ack"]
        assert acked == [f"t{i}" for i in range(40)]
        assert trio.current_time() == 0
        runtime.submit(ev.DrainRequested(reason="test"))
