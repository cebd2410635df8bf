"""`snerdmq cancel`, `retry`, `pause`, `resume` and `purge` (and `replay` by type) against real
daemons.

Two daemons share two shards, one each (`tests.support.cluster.Daemons`); the test is the SDK
of both. A task is enqueued through the daemon that does not own its shard, so it reaches its
owner through an inbox, and the tool's command reaches that owner through another (its own
inbox file, `snerd.commands`). Each command runs as a real `snerdmq` process. With no daemon
running, a command is durable and `pending` (exit 4), and the next daemon applies it; but a
purge of a shard no daemon holds is done by the tool, under the shard's lock.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from snerd.cli import main as cli_main
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


async def bury(d: Daemon, task_id: str, task_type: str) -> None:
    """Make `task_id` a dead letter of `task_type` (registered already): its one attempt
    fails."""
    await d.enqueue(task_id, task_type)
    await d.wait_for(lambda m: m.get("action") == "execute" and m["task_id"] == task_id)
    await d.send({"action": "result", "task_id": task_id, "status": "error",
                  "error_msg": "it failed"})
    await d.wait_for(lambda m: m.get("action") == "max_retries_reached"
                     and m["task_id"] == task_id)


async def dead_ids(directory: Path) -> list[str]:
    code, out, _ = await snerdmq("dlq", directory, "--json")
    assert code == 0
    return sorted(d["task_id"] for d in orjson.loads(out))


async def test_purge_and_replay_by_type_go_to_the_daemon_holding_the_shards(
    tmp_path: Path,
) -> None:
    env = {"SNERD_SHARDS": str(SHARDS), "SNERD_DRAIN_TIMEOUT": "2"}
    async with trio.open_nursery() as nursery:
        d = await Daemon.start(nursery, tmp_path, env=env)
        for task_type in ("t", "u"):
            await d.send({"action": "register", "task_type": task_type})
        doomed = [id_on(s, "t-") for s in range(SHARDS)]
        for task_id in doomed:
            await bury(d, task_id, "t")
        await bury(d, "u-1", "u")
        # Nothing died before 2020: nothing to purge, exit 3.
        code, out, _ = await snerdmq("purge", tmp_path, "--all", "--before", "2020-01-01")
        assert code == 3 and "Purged 0 dead letters and cancelled tasks of every type that " \
            "finished before 2020-01-01T00:00:00.000000Z, on all 2 shard(s)." in out
        code, out, err = await snerdmq("purge", tmp_path, "--type", "t", "--json")
        assert (code, err) == (0, "")
        assert orjson.loads(out) == {
            "action": "purged", "task_type": "t", "before": None, "count": 2, "shards": 2,
            "pending": [], "unowned_shards": [], "purged_here": {},
        }
        assert await dead_ids(tmp_path) == ["u-1"]
        # One retry of the type's dead letters per shard, answered by its daemon.
        code, out, _ = await snerdmq("replay", "--type", "u", tmp_path)
        assert code == 0 and "retried 1 dead letter(s) in shard-" in out, out
        await d.wait_for(lambda m: m.get("action") == "execute" and m["task_id"] == "u-1")
        await d.close_stdin()
        assert await d.wait() == 0
    assert await dead_ids(tmp_path) == []


async def test_purge_of_a_stopped_queue_is_done_under_the_shard_locks(tmp_path: Path) -> None:
    env = {"SNERD_SHARDS": str(SHARDS), "SNERD_DRAIN_TIMEOUT": "2"}
    async with trio.open_nursery() as nursery:
        d = await Daemon.start(nursery, tmp_path, env=env)
        await d.send({"action": "register", "task_type": "t"})
        await d.enqueue("later", "t", execute_at="2999-01-01T00:00:00Z")
        await d.send({"action": "cancel", "task_id": "later"})
        await d.wait_for(lambda m: m.get("action") == "cancelled")
        for task_id in ("a", "b"):
            await bury(d, task_id, "t")
        await d.close_stdin()
        assert await d.wait() == 0
        assert await dead_ids(tmp_path) == ["a", "b"]
        code, out, _ = await snerdmq("purge", tmp_path, "--all", "--dry-run")
        assert code == 0 and "Dry run: 3 task(s) would be purged" in out
        # Ended within the last hour: not older than it.
        code, _, _ = await snerdmq("purge", tmp_path, "--all", "--older-than", "1h")
        assert code == 3
        code, out, _ = await snerdmq("purge", tmp_path, "--all", "--json")
        answer = orjson.loads(out)
        assert (code, answer["count"], answer["pending"]) == (0, 3, [])
        assert sum(answer["purged_here"].values()) == 3
        assert list(tmp_path.glob("shard-*/inbox/tool-*")) == []
        assert await dead_ids(tmp_path) == []
        code, out, _ = await snerdmq("status", "later", tmp_path, "--json")
        assert orjson.loads(out)["state"] == "purged"
        # A daemon reading the logs agrees: nothing left to purge.
        d = await Daemon.start(nursery, tmp_path, env=env)
        await d.send({"action": "purge", "queue": True})
        reply = await d.wait_for(lambda m: m.get("action") == "purged")
        assert (reply["count"], reply["pending"]) == (0, [])
        await d.close_stdin()
        assert await d.wait() == 0


async def test_bad_arguments_are_usage_errors(tmp_path: Path) -> None:
    for args in (["pause", tmp_path], ["pause", "t", tmp_path, "--all"],
                 ["cancel", "x", tmp_path, "--wait", "-1"], ["retry", "x", tmp_path / "nope"]):
        code, _out, err = await snerdmq(*args)
        assert code == 2, (args, err)
        assert "usage: snerdmq" in err


@pytest.mark.parametrize(("args", "says"), [
    ([], "one of the arguments --type --all is required"),
    (["--type", ""], "--type must not be empty"),
    (["--all", "--type", "t"], "not allowed with argument"),
    (["--all", "--before", "yesterday"], "--before must be RFC 3339 or YYYY-MM-DD, got 'yesterday'"),
    (["--all", "--before", "2026-02-30"], "day 30 out of range"),
    (["--all", "--older-than", "7"], "--older-than must be a whole number and a unit"),
    (["--all", "--before", "2026-01-01", "--older-than", "1d"], "not allowed with argument"),
])
def test_a_bad_purge_is_a_usage_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    assert cli_main(["purge", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err
    assert "usage: snerdmq purge" in err and says in err, err
