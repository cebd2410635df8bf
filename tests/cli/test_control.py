"""`snerdmq cancel`, `retry`, `pause` and `resume` against real daemons.

Two daemons share two shards, one each (`tests.support.cluster.Daemons`); the test is the SDK
of both. A task is enqueued through the daemon that does not own its shard, so it reaches its
owner through an inbox, and the tool's command reaches that owner through another (its own
inbox file, `snerd.commands`). Each command runs as a real `snerdmq` process. With no daemon
running, a command is durable and `pending` (exit 4), and the next daemon applies it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import orjson
import trio

from snerd.core.node.model import route_shard
from snerd.core.records import scan
from tests.support.cluster import Daemons
from tests.support.daemon import Daemon

SHARDS = 2


async def snerdmq(*args: str | Path) -> tuple[int, str, str]:
    """Run `snerdmq ARGS...` as its own process: (exit code, stdout, stderr)."""
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    done = await trio.run_process(
        [sys.executable, "-m", "snerd.cli", *map(str, args)],
        capture_stdout=True, capture_stderr=True, check=False, env=env,
    )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def id_on(shard: int, prefix: str) -> str:
    """A task id that routes to `shard`."""
    n = 0
    while route_shard(f"{prefix}{n}", SHARDS) != shard:
        n += 1
    return f"{prefix}{n}"


def executes(cluster: Daemons, task_id: str) -> list[dict[str, Any]]:
    return [m for _n, m in cluster.seen if m.get("action") == "execute" and m["task_id"] == task_id]


def outcome(directory: Path, task_id: str) -> str | None:
    """The latest tombstone outcome of `task_id` in any shard log (None: none, or live)."""
    found = None
    for log in sorted(directory.glob("shard-*/tasks/tasks.log")):
        for record in scan(log.read_bytes()).records:
            if record.fields.get("taskId") == task_id:
                found = record.fields.get("snerdOutcome")
    return found


async def test_cancel_and_retry_reach_the_owner_through_the_inboxes(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        cluster = Daemons(nursery, tmp_path, SHARDS)
        await cluster.start("a", "b")
        (b_shard,) = cluster.owned["b"]
        task_id = id_on(b_shard, "run-")
        cluster.hold.add(task_id)  # its attempt runs until cancelled
        await cluster.daemons["a"].enqueue(task_id)
        await cluster.until(lambda: bool(executes(cluster, task_id)))

        code, out, err = await snerdmq("cancel", task_id, tmp_path, "--json")
        answer = orjson.loads(out)
        assert (code, err) == (0, "")
        assert answer["found"] == "running" and answer["cancelled"] is True
        assert answer["shard"] == f"shard-{b_shard}"
        assert outcome(tmp_path, task_id) == "cancelled"
        # A second cancel changes nothing: exit 3, and says what it found.
        code, out, _ = await snerdmq("cancel", task_id, tmp_path)
        assert code == 3 and f"Task {task_id} not cancelled: it is cancelled" in out

        cluster.hold.discard(task_id)
        code, out, _ = await snerdmq("retry", task_id, tmp_path)
        assert code == 0, out
        assert f"Task {task_id} put back in the queue in shard-{b_shard} (it was cancelled)" in out
        await cluster.until(lambda: len(executes(cluster, task_id)) == 2)
        assert executes(cluster, task_id)[-1]["attempt"] == 1
        await cluster.until(lambda: outcome(tmp_path, task_id) == "completed")
        # The task's owner answered each command, so its shard holds no file of theirs (the
        # other shard's may still be unread when the answer came: removed once it is read).
        assert list(tmp_path.glob(f"shard-{b_shard}/inbox/tool-*")) == []

        before = set(tmp_path.glob("shard-*/inbox/tool-*"))
        code, out, _ = await snerdmq("cancel", "no-such-task", tmp_path)
        assert code == 3 and "no shard holds it" in out
        # Every shard answered that one: it left no file.
        assert set(tmp_path.glob("shard-*/inbox/tool-*")) <= before
        await cluster.stop()


async def test_pause_holds_a_type_on_every_daemon_until_resumed(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        cluster = Daemons(nursery, tmp_path, SHARDS)
        await cluster.start("a", "b", types=("t", "u"))
        code, out, _ = await snerdmq("pause", "t", tmp_path)
        assert code == 0 and "Type 't' paused on all 2 shard(s)." in out
        code, out, _ = await snerdmq("stats", tmp_path)
        assert "Paused: type 't' (all shards)" in out
        ids = [id_on(s, "p-") for s in range(SHARDS)]
        for task_id in ids:
            await cluster.daemons["a"].enqueue(task_id, "t")
        # A task of another type, enqueued after, runs: the paused ones are held, not lost.
        await cluster.daemons["a"].enqueue("other", "u")
        await cluster.until(lambda: bool(executes(cluster, "other")))
        assert not any(executes(cluster, t) for t in ids)

        code, out, _ = await snerdmq("resume", "t", tmp_path, "--json")
        assert code == 0 and orjson.loads(out)["pending"] == []
        await cluster.until(lambda: all(executes(cluster, t) for t in ids))
        code, out, _ = await snerdmq("stats", tmp_path, "--json")
        assert orjson.loads(out)["paused"] == []
        await cluster.stop()


async def test_without_a_daemon_a_command_is_pending_and_applied_by_the_next(
    tmp_path: Path,
) -> None:
    env = {"SNERD_SHARDS": str(SHARDS), "SNERD_DRAIN_TIMEOUT": "2"}
    async with trio.open_nursery() as nursery:
        d = await Daemon.start(nursery, tmp_path, env=env)
        await d.wait_for(lambda m: m.get("action") == "membership")
        await d.close_stdin()
        assert await d.wait() == 0

        code, out, _ = await snerdmq("pause", "--all", tmp_path, "--wait", "30")
        assert code == 4, out
        assert "pending on shard-0, shard-1 (no daemon holds shard-0, shard-1)" in out
        assert len(list(tmp_path.glob("shard-*/inbox/tool-*.log"))) == SHARDS

        d = await Daemon.start(nursery, tmp_path, env=env)
        await d.send({"action": "register", "task_type": "t"})
        with trio.fail_after(10):
            while True:
                await d.send({"action": "stats"})
                stats = await d.wait_for(lambda m: m.get("action") == "stats")
                if stats["paused_types"] == [None]:
                    break
                await trio.sleep(0.05)
        await d.close_stdin()
        assert await d.wait() == 0
    code, out, _ = await snerdmq("stats", tmp_path)
    assert "Paused: the whole queue (all shards)" in out


async def test_bad_arguments_are_usage_errors(tmp_path: Path) -> None:
    for args in (["pause", tmp_path], ["pause", "t", tmp_path, "--all"],
                 ["cancel", "x", tmp_path, "--wait", "-1"], ["retry", "x", tmp_path / "nope"]):
        code, _out, err = await snerdmq(*args)
        assert code == 2, (args, err)
        assert "usage: snerdmq" in err
