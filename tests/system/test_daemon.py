"""The daemon as a real process: the protocol, bad input, drain, a second daemon, adoption."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from snerd.core.records import decode_record
from snerd.queuedir import open_queue, scan_shard
from tests.conftest import fill, small_tmpfs
from tests.support.daemon import Daemon


def log_records(directory: Path, shard: int = 0) -> list[dict[str, Any]]:
    data = (directory / f"shard-{shard}" / "tasks" / "tasks.log").read_bytes()
    return [decode_record(line) for line in data.splitlines() if line.strip()]


def is_ack(task_id: str) -> Any:
    return lambda m: m.get("task_id") == task_id and m["action"] in ("ack", "error")


async def test_round_trip_and_stats(tmp_path: Path, nursery: trio.Nursery) -> None:
    d = await Daemon.start(nursery, tmp_path / "q")
    first = await d.recv()
    assert first["action"] == "membership" and first["owned"] == ["shard-0"]
    await d.send({"action": "register", "task_type": "t"})
    assert await d.recv() == {"action": "ack", "message": "Registered handler for t"}
    await d.enqueue("a", data={"n": 1})
    ack = await d.recv()
    assert ack == {
        "action": "ack",
        "task_id": "a",
        "message": "Enqueued successfully",
        "shard": "shard-0",
    }
    execute = await d.recv()
    assert execute["action"] == "execute" and orjson.loads(execute["task_data"]) == {"n": 1}
    await d.send({"action": "progress", "task_id": "a", "data": {"pct": 50}})
    assert await d.recv() == {"action": "progress", "task_id": "a", "data": {"pct": 50}}
    await d.send({"action": "result", "task_id": "a", "status": "success"})
    with trio.fail_after(5):
        while True:  # the task leaves the queue once its completion record is durable
            await d.send({"action": "stats"})
            stats = await d.wait_for(lambda m: m["action"] == "stats")
            if stats["queue_depth"] == 0:
                break
            await trio.sleep(0.01)
    assert stats["total_enqueued"] == 1 and stats["total_executed"] == 1
    assert stats["per_shard"] == [{"shard": "shard-0", "depth": 0}]
    await d.close_stdin()
    assert await d.wait() == 0
    assert log_records(tmp_path / "q")[-1]["snerdOutcome"] == "completed"


ENQ = (
    b'{"action":"enqueue","task_id":"k","task_type":"t","task_data":"{}",'
    b'"max_retries":%s,"retry_after_hours":0%s}\n'
)

BAD_LINES: list[tuple[bytes, str, str | None]] = [
    (b"this is not json\n", "Invalid JSON", None),
    (b"[1, 2, 3]\n", "Invalid JSON: expected an object", None),
    (b'{"action":"teleport","task_id":"k"}\n', "unknown action", "k"),
    (b'{"action":"enqueue","task_id":"k","task_type":"t"}\n', "missing field", "k"),
    (ENQ % (b'"3"', b""), "max_retries", "k"),
    (ENQ % (b"-1", b""), "Failed to enqueue", "k"),
    (ENQ % (b"1", b',"execute_at":"next tuesday"'), "execute_at", "k"),
    (ENQ % (b"1", b',"execute_at":"2026-01-02T03:04:05"'), "offset", "k"),
    (ENQ % (b"1", b',"rate_limit_group":"g","max_per_minute":0'), "max_per_minute", "k"),
    (ENQ % (b"1", b',"cron":"every day at noon"'), "cron", "k"),
    (b'{"action":"enqueue","task_id":"k","task_data":"\xff\xfe"}\n', "UTF-8", "k"),
    (b'{"action":"result","task_id":"ghost","status":"success"}\n', "unknown/expired", "ghost"),
]


async def test_bad_input_gets_clear_errors_and_the_daemon_keeps_serving(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    d = await Daemon.start(nursery, tmp_path / "q")
    await d.recv()
    await d.send({"action": "register", "task_type": "t"})
    await d.recv()
    await d.enqueue("before")
    await d.wait_for(lambda m: m["action"] == "execute")
    for line, text, task_id in BAD_LINES:
        await d.send_raw(line)
        err = await d.wait_for(lambda m: m["action"] == "error")
        assert text in err["message"], (line, err)
        assert err.get("task_id") == task_id, (line, err)
    # A duplicate live task id is refused, never a silent overwrite.
    await d.enqueue("before", data={"other": True})
    err = await d.wait_for(is_ack("before"))
    assert err["action"] == "error" and "already pending" in err["message"]
    # Still serving; the task acknowledged before the bad lines is intact.
    await d.send({"action": "result", "task_id": "before", "status": "success"})
    await d.enqueue("after")
    assert (await d.wait_for(is_ack("after")))["action"] == "ack"
    await d.close_stdin()
    assert await d.wait() == 0
    done = [r for r in log_records(tmp_path / "q") if r.get("taskId") == "before"]
    assert done[-1]["snerdOutcome"] == "completed" and done[0]["taskData"] == '{"id":"before"}'


async def test_a_result_is_stored_on_its_tombstone_and_one_too_large_fails_the_attempt(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    directory = tmp_path / "q"
    d = await Daemon.start(nursery, directory, env={"SNERD_RESULT_MAX_BYTES": "32"})
    await d.recv()
    await d.send({"action": "register", "task_type": "t"})
    await d.recv()
    value = {"sent": 3, "ids": ["a", "é"]}
    await d.enqueue("kept")
    await d.wait_for(lambda m: m["action"] == "execute" and m["task_id"] == "kept")
    await d.send({"action": "result", "task_id": "kept", "status": "success", "result": value})
    await d.enqueue("big")  # no retries: its failure is a dead letter
    await d.wait_for(lambda m: m["action"] == "execute" and m["task_id"] == "big")
    await d.send({"action": "result", "task_id": "big", "status": "success", "result": "x" * 40})
    dead = await d.wait_for(lambda m: m["action"] == "max_retries_reached")
    assert dead["error"] == (
        "task big: result of 42 bytes exceeds the limit of 32 bytes (SNERD_RESULT_MAX_BYTES)"
    )
    await d.close_stdin()
    assert await d.wait() == 0
    # Read back from the log, through the fold every reader uses.
    fold = scan_shard(open_queue(directory), 0).fold
    assert fold.finished["kept"].fields["snerdResult"] == value
    assert "snerdResult" not in fold.finished["big"].fields
    # A bad value for the setting is refused at start, naming it (exit 2).
    bad = await Daemon.start(nursery, directory, env={"SNERD_RESULT_MAX_BYTES": "lots"})
    assert await bad.wait() == 2
    assert b"SNERD_RESULT_MAX_BYTES" in bad.stderr


async def test_a_50_mb_line_is_refused_without_buffering_it(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    d = await Daemon.start(nursery, tmp_path / "q", env={"SNERD_MAX_LINE_BYTES": "1048576"})
    await d.recv()
    head = b'{"action":"enqueue","task_id":"big","task_type":"t","task_data":"'
    body = b"x" * (50 * 1024 * 1024)
    nursery.start_soon(d.send_raw, head + body + b'","max_retries":0,"retry_after_hours":0}\n')
    err = await d.wait_for(lambda m: m["action"] == "error", timeout=60)
    assert err["task_id"] == "big" and "exceeds" in err["message"]
    await d.enqueue("small")
    assert (await d.wait_for(is_ack("small")))["action"] == "ack"
    await d.close_stdin()
    assert await d.wait() == 0


@pytest.mark.parametrize("max_line", [1024, 64 * 1024 * 1024])
async def test_lines_written_at_once_are_each_answered_in_order(
    tmp_path: Path, nursery: trio.Nursery, max_line: int
) -> None:
    # 250 enqueues, blank lines and (under the small limit) an over-long line in one write:
    # the reader hands the node up to 64 lines an event, splitting around a line that is too
    # long; every enqueue is acked once, in log order, blank lines get no answer.
    d = await Daemon.start(nursery, tmp_path / "q", env={"SNERD_MAX_LINE_BYTES": str(max_line)})
    await d.recv()

    def line(task_id: str, data: str = "{}") -> bytes:
        message = {
            "action": "enqueue",
            "task_id": task_id,
            "task_type": "nobody",
            "task_data": data,
            "max_retries": 0,
            "retry_after_hours": 0,
        }
        return orjson.dumps(message) + b"\n"

    ids = [f"b{i}" for i in range(250)]
    data = b"".join(map(line, ids[:100])) + b"\n  \n" + line("big", "x" * 2000)
    data += b"".join(map(line, ids[100:]))
    await d.send_raw(data)
    await d.wait_for(is_ack(ids[-1]))
    await d.send({"action": "stats"})
    stats = await d.wait_for(lambda m: m["action"] == "stats")
    answers = [m for m in d.received if m["action"] in ("ack", "error")]
    acks = [m["task_id"] for m in answers if m["action"] == "ack"]
    errors = [m for m in answers if m["action"] == "error"]
    if max_line == 1024:
        assert [e["task_id"] for e in errors] == ["big"] and "exceeds" in errors[0]["message"]
        assert acks == ids
    else:
        assert not errors and acks == [*ids[:100], "big", *ids[100:]]
    assert stats["queue_depth"] == len(acks)
    logged = [r["taskId"] for r in log_records(tmp_path / "q") if "taskId" in r]
    assert logged == acks
    await d.close_stdin()
    assert await d.wait() == 0


async def test_a_queue_deeper_than_the_cache_runs_each_task_with_its_own_payload(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    # 2,000 tasks queued behind a 16 KiB cache of recent records, in a log compacted from
    # 64 KiB on; each fails twice and then succeeds. Their records are read back from the
    # file as they run (blocks read ahead, cut per record), moved by compactions meanwhile,
    # and each retry record and tombstone is built on the task's latest record: every
    # `execute` carries its own task's payload, and so does every tombstone.
    d = await Daemon.start(
        nursery,
        tmp_path / "q",
        env={"SNERD_TEST_RECENT_BYTES": "16384", "SNERD_TEST_COMPACT_MIN_BYTES": "65536"},
    )
    await d.recv()
    ids = [f"deep{i}" for i in range(2000)]
    payload = {
        task_id: orjson.dumps({"n": task_id, "pad": "x" * (i % 97)}).decode()
        for i, task_id in enumerate(ids)
    }

    def line(task_id: str) -> bytes:
        message = {
            "action": "enqueue",
            "task_id": task_id,
            "task_type": "t",
            "task_data": payload[task_id],
            "max_retries": 2,
            "retry_after_hours": 0,
        }
        return orjson.dumps(message) + b"\n"

    await d.send_raw(b"".join(map(line, ids)))
    await d.wait_for(is_ack(ids[-1]), timeout=60)
    await d.send({"action": "register", "task_type": "t"})
    runs: dict[str, list[int]] = {task_id: [] for task_id in ids}
    done = 0
    with trio.fail_after(120):
        while done < len(ids):
            m = await d.recv(60)
            assert m["action"] != "error", m
            if m["action"] != "execute":
                continue
            task_id, attempt = m["task_id"], m["attempt"]
            assert m["task_data"] == payload[task_id], m
            runs[task_id].append(attempt)
            ok = attempt == 3
            done += ok
            await d.send(
                {"action": "result", "task_id": task_id, "status": "success"}
                if ok
                else {"action": "result", "task_id": task_id, "status": "error", "error_msg": "no"}
            )
    assert all(attempts == [1, 2, 3] for attempts in runs.values())
    await d.send({"action": "stats"})
    while (await d.wait_for(lambda m: m["action"] == "stats"))["queue_depth"]:
        await trio.sleep(0.05)
        await d.send({"action": "stats"})
    assert b"compacted tasks.log" in d.stderr
    tombs = {r["taskId"]: r for r in log_records(tmp_path / "q") if r.get("deletedAt")}
    # (compaction keeps the last 10,000 tombstones: all of them here)
    assert {task_id: r["taskData"] for task_id, r in tombs.items()} == payload
    assert all(r["snerdOutcome"] == "completed" for r in tombs.values())
    await d.close_stdin()
    assert await d.wait() == 0


@pytest.mark.parametrize("slots", [2, 40])
async def test_results_read_together_free_slots_whose_dispatch_records_precede_the_tombstones(
    tmp_path: Path, nursery: trio.Nursery, slots: int
) -> None:
    # Every slot busy, as many tasks waiting; all the results arrive in one write. The
    # daemon hands the log writer the next tasks' dispatch records before it builds the
    # results' success tombstones (a lazy append): many of them at once (40), a few (2) in
    # the same batch as the tombstones, committed in the trio thread. Either way those
    # records, which gate the `execute`s, come first in the log.
    d = await Daemon.start(nursery, tmp_path / "q", env={"SNERD_MAX_WORKERS": str(slots)})
    await d.recv()
    await d.send({"action": "register", "task_type": "t"})
    first, second = [f"a{i}" for i in range(slots)], [f"b{i}" for i in range(slots)]
    for task_id in first + second:
        await d.enqueue(task_id)
    await d.wait_for(is_ack(second[-1]))

    async def executed(count: int) -> list[str]:
        while len(ids := [m["task_id"] for m in d.received if m["action"] == "execute"]) < count:
            await d.recv()
        return ids

    def results(ids: list[str]) -> bytes:
        return b"".join(
            orjson.dumps({"action": "result", "task_id": t, "status": "success"}) + b"\n"
            for t in ids
        )

    assert sorted(await executed(slots)) == sorted(first)
    await d.send_raw(results(first))  # one write: one burst
    assert sorted((await executed(2 * slots))[slots:]) == sorted(second)
    await d.send_raw(results(second))
    await d.send({"action": "stats"})
    while (await d.wait_for(lambda m: m["action"] == "stats"))["queue_depth"]:
        await trio.sleep(0.02)
        await d.send({"action": "stats"})
    order = [
        ("dispatch", r["task"]) if r.get("snerdKind") == "dispatch" else ("tomb", r["taskId"])
        for r in log_records(tmp_path / "q")
        if r.get("snerdKind") == "dispatch" or r.get("deletedAt")
    ]
    at = order.index(("dispatch", second[0]))
    assert sorted(order[at : at + slots]) == sorted(("dispatch", t) for t in second)
    assert sorted(order[at + slots : at + 2 * slots]) == sorted(("tomb", t) for t in first)
    await d.close_stdin()
    assert await d.wait() == 0


async def test_sigterm_drains_and_keeps_reading_results(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    d = await Daemon.start(nursery, tmp_path / "q", env={"SNERD_DRAIN_TIMEOUT": "20"})
    await d.recv()
    await d.send({"action": "register", "task_type": "t"})
    await d.enqueue("slow")
    await d.wait_for(lambda m: m["action"] == "execute")
    d.signal(signal.SIGTERM)
    with trio.fail_after(5):
        while b"draining (SIGTERM)" not in d.stderr:
            await trio.sleep(0.01)
    await d.enqueue("late")
    err = await d.wait_for(is_ack("late"))
    assert err["message"] == "[Snerd] Daemon is shutting down; enqueue rejected"
    # The result of the in-flight task is still read and recorded (upstream lost it).
    await d.send({"action": "result", "task_id": "slow", "status": "success"})
    assert await d.wait(timeout=10) == 0
    assert log_records(tmp_path / "q")[-1]["snerdOutcome"] == "completed"
    membership = orjson.loads((tmp_path / "q" / "membership.json").read_bytes())
    assert membership["claims"] == {}  # handed over at once


async def test_closed_stdout_drains_and_loses_nothing_acked(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    d = await Daemon.start(nursery, tmp_path / "q")
    await d.recv()
    await d.enqueue("kept", task_type="nobody")
    assert (await d.wait_for(is_ack("kept")))["action"] == "ack"
    assert d.proc.stdout is not None
    await d.proc.stdout.aclose()
    # The next message the daemon writes meets a closed pipe: it must drain and exit cleanly.
    await d.send({"action": "stats"})
    assert await d.wait() == 0
    assert "stdout closed" in d.stderr.decode()
    live = [r for r in log_records(tmp_path / "q") if r.get("taskId") == "kept"]
    assert live and not live[-1].get("deletedAt")


async def test_a_second_daemon_on_the_same_directory_waits_and_routes_enqueues_to_the_owner(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    first = await Daemon.start(nursery, tmp_path / "q")
    await first.recv()
    await first.send({"action": "register", "task_type": "t"})
    second = await Daemon.start(nursery, tmp_path / "q")
    m = await second.recv()
    assert m["action"] == "membership" and m["owned"] == []
    await second.wait_stderr("claimed by a live daemon")
    # Owning no shard, it still takes the enqueue: into its inbox for shard-0, acked once
    # durable there; the owner ingests it and runs it.
    await second.enqueue("x", data={"n": 1})
    ack = await second.wait_for(is_ack("x"))
    assert ack == {
        "action": "ack",
        "task_id": "x",
        "message": "Enqueued successfully",
        "shard": "shard-0",
    }
    inbox = list((tmp_path / "q" / "shard-0" / "inbox").glob("*.log"))
    assert len(inbox) == 1 and b'"taskId":"x"' in inbox[0].read_bytes()
    run = await first.wait_for(lambda m: m.get("action") == "execute", timeout=10)
    assert run["task_id"] == "x" and run["task_data"] == '{"n":1}'
    await first.send({"action": "result", "task_id": "x", "status": "success"})
    # The first is unaffected.
    await first.enqueue("y")
    assert (await first.wait_for(is_ack("y")))["action"] == "ack"
    size = inbox[0].stat().st_size
    # The owner says how far it has ingested the file in its `.read` hint (about once a
    # second). A draining writer waits a few seconds for that; on a busy machine the owner can
    # take longer, so the test waits for the hint first (the wait itself is tested in
    # tests/core/node/test_inbox.py, on the core with a driven clock).
    hint = inbox[0].with_suffix(".read")
    with trio.fail_after(20):
        while not (hint.exists() and hint.read_bytes().strip() == str(size).encode()):
            await trio.sleep(0.05)
    # Stopping, the second sees its inbox ingested in full and removes it.
    await second.close_stdin()
    assert await second.wait() == 0
    assert not inbox[0].exists()
    assert list(inbox[0].parent.iterdir()) == []  # nor its `.read` hint
    await first.close_stdin()
    assert await first.wait() == 0
    records = [
        orjson.loads(line)
        for line in (tmp_path / "q" / "shard-0" / "tasks" / "tasks.log").read_bytes().splitlines()
    ]
    x = [r for r in records if r.get("taskId") == "x"]
    assert x[0]["snerdVia"] == inbox[0].name.removesuffix(".log")
    assert x[-1]["snerdOutcome"] == "completed"
    (progress,) = [r for r in records if r.get("snerdKind") == "inbox"]
    assert progress["offset"] == size


async def test_upstream_single_log_directory_is_adopted(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    q = tmp_path / "q"
    (q / "tasks").mkdir(parents=True)
    upstream = [
        b'{"taskId":"old1","retryCount":0,"maxRetries":3,"retryAfterHours":0.0,'
        b'"retryAfterTime":"2026-08-17T02:31:53.237260Z","taskData":"{\\"a\\":1}",'
        b'"taskType":"t","executeAt":"2026-08-17T02:31:53.237260Z"}',
        b'{"taskId":"gone","retryCount":0,"maxRetries":3,"retryAfterHours":0.0,'
        b'"retryAfterTime":"2026-08-17T02:31:53.237260Z","taskData":"{}","taskType":"t",'
        b'"executeAt":"2026-08-17T02:31:53.237260Z","deletedAt":"2026-08-17T02:32:00.000000Z"}',
        b'{"taskId":"old2","retryCount":1,"maxRetries":3,"retryAfterHours":0.0,'
        b'"retryAfterTime":"2026-08-17T02:31:53.237260Z","taskData":"{\\"a\\":2}",'
        b'"taskType":"t","executeAt":"2026-08-17T02:31:53.237260Z","LastErrorObj":"x",'
        b'"LastJobError":{"error":"x","retry_worthy":true}}',
    ]
    (q / "tasks" / "tasks.log").write_bytes(b"\n".join(upstream) + b"\n")
    d = await Daemon.start(nursery, q)
    await d.recv()
    await d.send({"action": "register", "task_type": "t"})
    ran = []
    for _ in range(2):
        m = await d.wait_for(lambda m: m["action"] == "execute")
        ran.append((m["task_id"], orjson.loads(m["task_data"])))
        await d.send({"action": "result", "task_id": m["task_id"], "status": "success"})
    assert sorted(ran) == [("old1", {"a": 1}), ("old2", {"a": 2})]
    await d.close_stdin()
    assert await d.wait() == 0
    assert not (q / "tasks" / "tasks.log").exists()
    assert "adopted" in d.stderr.decode()


async def test_full_disk_refuses_enqueues_then_recovers(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    with small_tmpfs(tmp_path / "small", size="256k") as mnt:
        q = mnt / "q"
        d = await Daemon.start(nursery, q)
        await d.recv()
        await d.enqueue("fits", task_type="nobody")
        assert (await d.wait_for(is_ack("fits")))["action"] == "ack"
        filler = fill(mnt)
        await d.enqueue("nospace", task_type="nobody", data={"pad": "x" * 8000})
        err = await d.wait_for(is_ack("nospace"))
        assert err["action"] == "error"
        assert err["message"].startswith("Failed to enqueue: ")
        assert "space" in err["message"].lower()
        filler.unlink()
        await d.enqueue("later", task_type="nobody")
        assert (await d.wait_for(is_ack("later")))["action"] == "ack"
        await d.close_stdin()
        assert await d.wait() == 0
        ids = [r.get("taskId") for r in log_records(q)]
        assert "fits" in ids and "later" in ids and "nospace" not in ids


async def test_bad_environment_is_a_clear_startup_error(tmp_path: Path) -> None:
    for name, value in [
        ("SNERD_MAX_WORKERS", "lots"),
        ("SNERD_POOLS", "fast=zero"),
        ("SNERD_DRAIN_TIMEOUT", "-1"),
        ("SNERD_FSYNC", "sometimes"),
    ]:
        proc = await trio.run_process(
            [sys.executable, "-m", "snerd.cli", str(tmp_path / "q")],
            env={**os.environ, name: value},
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        assert proc.returncode == 2, (name, proc.stderr)
        assert name in proc.stderr.decode()


async def test_upstream_sharded_directory_is_adopted(tmp_path: Path, nursery: trio.Nursery) -> None:
    q = tmp_path / "q"
    # What upstream v0.3 leaves behind: two shards, a claim whose daemon died a second ago
    # (its lease is still live, but its lock is free), and a claim that lapsed long ago. Each
    # lock file holds the pid of the upstream daemon that took it (and claimed the shard).
    membership = {
        "queue": "snerdmq-daemon",
        "shards": 2,
        "version": 7,
        "claims": {
            "shard-0": {"owner": "old@pid-4242", "lease_expiry": "2999-01-01T00:00:00.000000Z"},
            "shard-1": {"owner": "old@pid-4243", "lease_expiry": "2020-01-01T00:00:00.000000Z"},
        },
    }
    q.mkdir()
    (q / "membership.json").write_bytes(orjson.dumps(membership, option=orjson.OPT_INDENT_2))
    for shard in (0, 1):
        tasks = q / f"shard-{shard}" / "tasks"
        tasks.mkdir(parents=True)
        (q / f"shard-{shard}" / ".lock").write_text(str(4242 + shard))
        (tasks / "tasks.log").write_bytes(
            b'{"taskId":"up%d","retryCount":0,"maxRetries":3,"retryAfterHours":0.0,'
            b'"retryAfterTime":"2026-09-07T11:05:55.083436Z","taskData":"{\\"s\\":%d}",'
            b'"taskType":"t","executeAt":"2026-09-07T11:05:55.083436Z"}\n' % (shard, shard)
        )
    d = await Daemon.start(nursery, q)
    m = await d.recv()
    assert m["owned"] == ["shard-0", "shard-1"], (m, d.stderr.decode())
    await d.send({"action": "register", "task_type": "t"})
    seen = set()
    for _ in range(2):
        e = await d.wait_for(lambda m: m["action"] == "execute")
        seen.add(e["task_id"])
        await d.send({"action": "result", "task_id": e["task_id"], "status": "success"})
    assert seen == {"up0", "up1"}
    await d.close_stdin()
    assert await d.wait() == 0
    doc = orjson.loads((q / "membership.json").read_bytes())
    assert doc["epochs"] == {"shard-0": 1, "shard-1": 1} and doc["version"] > 7


async def test_bad_settings_are_one_line_never_a_traceback(tmp_path: Path) -> None:
    # Values that parse but overflow, or would make the daemon wait or allocate without bound.
    for name, value in [
        ("SNERD_LEASE_TTL", "1e303"),
        ("SNERD_DRAIN_TIMEOUT", "1e303"),
        ("SNERD_TEST_CLOCK_OFFSET", "1e15"),
        ("SNERD_SHARDS", "9" * 5000),
        ("SNERD_MAX_WORKERS", "99999999999999999999"),
        ("SNERD_INBOX_POLL_MS", "999999999999999"),
        ("SNERD_BACKOFF", "sometimes"),
    ]:
        proc = await trio.run_process(
            [sys.executable, "-m", "snerd.cli", str(tmp_path / "q")],
            env={**os.environ, name: value},
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        err = proc.stderr.decode()
        assert proc.returncode == 2, (name, err)
        assert err.startswith(f"snerdmq: error: {name}=") and err.count("\n") == 1, err
        assert len(err) < 300 and proc.stdout == b""
        assert not (tmp_path / "q").exists()


#: A parent of the log's sync helper that leaves it replies it never reads, then waits to be
#: killed: the helper's next read of the socket is ECONNRESET, its next write EPIPE.
_HELPER_PARENT = """
import os, signal, sys, time
from snerd.io.log.fsync_helper import SyncHelper
helper = SyncHelper.start()
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o644)
helper.adopt(1, fd)
helper.sync([1])
while helper.reply_nowait() is not None:  # once answered, the helper is in its loop
    time.sleep(0.01)
os.kill(helper.proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole process group
for _ in range(50):  # few: unread replies fill the socket buffer, then both would block
    helper.sync([1])
print(helper.proc.pid, flush=True)
time.sleep(600)
"""


def test_the_sync_helper_leaves_quietly_when_its_parent_is_killed(tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", _HELPER_PARENT, str(tmp_path / "f")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    helper = int(parent.stdout.readline())
    assert os.path.exists(f"/proc/{helper}")  # it took the SIGINT and lives on
    parent.kill()
    # The helper holds the parent's stderr: its end is the helper's exit.
    _, err = parent.communicate(timeout=30)
    assert parent.returncode == -signal.SIGKILL
    assert err == "", err


async def test_ctrl_c_drains_the_daemon_and_its_sync_helper_says_nothing(
    tmp_path: Path,
) -> None:
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "snerd.cli", str(tmp_path / "q")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # a process group of its own, as a shell job has
    )
    d = Daemon(proc)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(d._read_stderr)
        await d.recv()
        await d.enqueue("a", task_type="nobody")
        assert (await d.wait_for(is_ack("a")))["action"] == "ack"  # fsynced by the helper
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        assert await d.wait() == 0
        with trio.fail_after(30):  # the helper holds stderr until it exits
            await d._stderr_done.wait()
    err = d.stderr.decode()
    assert "draining (SIGINT)" in err and "Traceback" not in err, err
