"""Job control across real daemons on one queue directory: each `cancel`, `retry` and `pause`
/ `resume` is sent to the daemon that does *not* own the task's shard, is answered with what
the owner decided (through the inboxes), and has its effect there: a cancelled task never
runs (a running one is ended, and its SDK told to stop it), a retried dead letter runs again,
a paused type is dispatched by neither daemon, before and after both restart, until resumed;
a retry of a type's dead letters and a purge count what the owners of both shards took.

Two daemons share two shards, one each (tests/support/cluster.py). Task ids are picked to land
on the shard of the daemon the test means (`route_shard`, read against the daemons'
`membership` messages). The test is each daemon's SDK: it answers every `execute` with a
success (or a failure, for tasks in `fail`) unless the task is held, and keeps every message.
"Never ran" is shown against a witness: a task of the same shard enqueued after it, less
urgent, that did run; the held-back task would have been dispatched before it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from snerd import Cancelled, Paused, Retried, SnerdQueue
from snerd.core.node.model import route_shard
from tests.support.cluster import Daemons
from tests.support.daemon import Daemon

SHARDS = 2


class Control(Daemons):
    """Two daemons on one directory, one shard each, and the SDK of each: every message they
    send, in order, as (daemon, message)."""

    def __init__(self, nursery: trio.Nursery, directory: Path) -> None:
        super().__init__(nursery, directory, SHARDS)
        self.seen: list[tuple[str, dict[str, Any]]] = []
        #: Tasks whose attempts are answered with a failure.
        self.fail: set[str] = set()

    async def _answer(self, name: str, d: Daemon, m: dict[str, Any]) -> None:
        task = m["task_id"]
        if task in self.hold:
            return
        status = "failure" if task in self.fail else "success"
        reply = {"action": "result", "task_id": task, "status": status, "attempt": m["attempt"]}
        if status == "failure":
            reply["error_msg"] = "it failed"
        await d.send(reply)
        self.seen.append((name, {"action": "done", "task_id": task, "status": status}))

    # -- routing

    def shard_of(self, owner: str) -> int:
        (shard,) = self.owned[owner]
        return shard

    def other(self, name: str) -> str:
        (other,) = set(self.daemons) - {name}
        return other

    def task_on(self, owner: str, prefix: str) -> str:
        """A fresh task id that lands on the shard `owner` owns."""
        while True:
            task = f"{prefix}{next(self._ids)}"
            if route_shard(task, SHARDS) == self.shard_of(owner):
                return task

    # -- messages

    async def enqueue(self, via: str, task: str, **options: Any) -> None:
        """Enqueue `task` through `via` and wait for its ack."""
        await self.daemons[via].enqueue(task, options.pop("task_type", "t"), **options)
        await self.until(lambda: self.has(via, "ack", task))

    async def ask(self, via: str, message: dict[str, Any], reply: str) -> dict[str, Any]:
        """Send a control line to `via`; its reply (the first `reply` it sends after, naming
        the same task, or an `error`)."""
        start = len(self.seen)
        key = message.get("task_id")

        def answer() -> dict[str, Any] | None:
            for name, m in self.seen[start:]:
                if name == via and m["action"] in (reply, "error") and m.get("task_id") == key:
                    return m
            return None

        await self.daemons[via].send(message)
        await self.until(answer, timeout=15)
        got = answer()
        assert got is not None
        return got

    def has(self, via: str | None, action: str, task: str) -> bool:
        return any(
            m["action"] == action and m.get("task_id") == task and via in (None, name)
            for name, m in self.seen
        )

    def runs(self, task: str) -> list[str]:
        """The daemons that got an `execute` of `task`, in order."""
        return [n for n, m in self.seen if m["action"] == "execute" and m["task_id"] == task]

    async def restart(self, *names: str, types: tuple[str, ...]) -> None:
        """Drain every daemon, then start fresh ones (`names`) on the directory."""
        await self.stop()
        self.daemons.clear()
        self.owned.clear()
        await self.start(*names, types=types)


@pytest.fixture
def queue_dir(tmp_path: Path) -> Path:
    return tmp_path / "q"


def _answer(action: str, task: str, found: str, done: bool, shard: int | None) -> dict[str, Any]:
    verb = "cancelled" if action == "cancelled" else "retried"
    return {
        "action": action, "task_id": task, "found": found, verb: done,
        "shard": None if shard is None else f"shard-{shard}",
    }


async def test_a_cancel_through_the_non_owner_ends_the_task_there_and_it_never_runs(
    queue_dir: Path, nursery: trio.Nursery
) -> None:
    q = Control(nursery, queue_dir)
    await q.start("a", "b")
    shard = q.shard_of("a")
    # Queued on a's shard (its type has no handler anywhere yet), cancelled through b.
    waits = q.task_on("a", "w-")
    await q.enqueue("a", waits, task_type="later", urgency_score=10)
    got = await q.ask("b", {"action": "cancel", "task_id": waits}, "cancelled")
    assert got == _answer("cancelled", waits, "queued", True, shard)
    # Running on a, whose SDK registered the type as one it can stop: ended as cancelled,
    # and a's SDK is told to stop the attempt; the attempt's late result is dropped quietly.
    await q.daemons["a"].send({"action": "register", "task_type": "c", "cancellable": True})
    runs = q.task_on("a", "r-")
    q.hold.add(runs)
    await q.enqueue("b", runs, task_type="c")
    await q.until(lambda: q.runs(runs) == ["a"])
    got = await q.ask("b", {"action": "cancel", "task_id": runs}, "cancelled")
    assert got == _answer("cancelled", runs, "running", True, shard)
    await q.until(lambda: q.has("a", "cancel", runs))
    (stop,) = [m for n, m in q.seen if n == "a" and m["action"] == "cancel"]
    assert stop == {"action": "cancel", "task_id": runs, "attempt": 1}
    late = {"action": "result", "task_id": runs, "status": "success", "attempt": 1}
    await q.daemons["a"].send(late)
    stats = await q.ask("a", {"action": "stats"}, "stats")  # (lines are taken in order)
    assert not q.has("a", "error", runs) and stats["total_executed"] == 0
    # Ended already, or never seen: told so through b, nothing changes.
    got = await q.ask("b", {"action": "cancel", "task_id": runs}, "cancelled")
    assert got == _answer("cancelled", runs, "cancelled", False, shard)
    got = await q.ask("b", {"action": "cancel", "task_id": "nobody"}, "cancelled")
    assert got == _answer("cancelled", "nobody", "unknown", False, None)
    # The cancelled task never runs: once a handler comes, a witness enqueued after it (and
    # less urgent) runs, and it did not.
    witness = q.task_on("a", "x-")
    await q.enqueue("a", witness, task_type="later")
    await q.daemons["a"].send({"action": "register", "task_type": "later"})
    await q.until(lambda: q.has("a", "done", witness))
    await q.stop()
    assert q.runs(waits) == [] and q.runs(runs) == ["a"]


async def test_a_retry_through_the_non_owner_runs_a_dead_letter_again_and_leaves_a_live_task(
    queue_dir: Path, nursery: trio.Nursery
) -> None:
    q = Control(nursery, queue_dir)
    await q.start("a", "b")
    shard = q.shard_of("a")
    dead = q.task_on("a", "d-")
    q.fail.add(dead)
    await q.enqueue("a", dead, max_retries=0)
    await q.until(lambda: q.has("a", "max_retries_reached", dead))
    q.fail.discard(dead)
    got = await q.ask("b", {"action": "retry", "task_id": dead}, "retried")
    assert got == _answer("retried", dead, "dead_letter", True, shard)
    # Back in the queue on its owner, attempts reset: it runs again, as attempt 1.
    await q.until(lambda: any(
        n == "a" and m["action"] == "done" and m["task_id"] == dead and m["status"] == "success"
        for n, m in q.seen
    ))
    attempts = [m["attempt"] for _, m in q.seen if m["action"] == "execute"
                and m["task_id"] == dead]
    assert q.runs(dead) == ["a", "a"] and attempts == [1, 1]
    # A succeeded task, a running one and an unknown id are left as they are.
    got = await q.ask("b", {"action": "retry", "task_id": dead}, "retried")
    assert got == _answer("retried", dead, "succeeded", False, shard)
    live = q.task_on("a", "l-")
    q.hold.add(live)
    await q.enqueue("a", live)
    await q.until(lambda: q.runs(live) == ["a"])
    got = await q.ask("b", {"action": "retry", "task_id": live}, "retried")
    assert got == _answer("retried", live, "running", False, shard)
    got = await q.ask("b", {"action": "retry", "task_id": "nobody"}, "retried")
    assert got == _answer("retried", "nobody", "unknown", False, None)
    q.hold.clear()
    await q.daemons["a"].send({"action": "result", "task_id": live, "status": "success"})
    await q.stop()
    assert q.runs(live) == ["a"]


async def test_a_get_through_the_non_owner_reads_the_task_from_its_owners_files(
    queue_dir: Path, nursery: trio.Nursery
) -> None:
    q = Control(nursery, queue_dir)
    await q.start("a", "b")
    shard = q.shard_of("a")
    dead = q.task_on("a", "g-")
    q.fail.add(dead)
    await q.enqueue("a", dead, max_retries=1, retry_after_hours=0)
    await q.until(lambda: q.has("a", "max_retries_reached", dead))
    got = await q.ask("b", {"action": "get", "task_id": dead}, "task")
    assert (got["found"], got["state"], got["shard"], got["attempts"]) == (
        True, "dead_letter", f"shard-{shard}", 2,
    )
    assert got["last_error"] == "it failed" and got["outcome"] == "dead_letter"
    # Held running on a: a says running (it knows); b reads it from a's log.
    live = q.task_on("a", "h-")
    q.hold.add(live)
    await q.enqueue("a", live)
    await q.until(lambda: q.runs(live) == ["a"])
    for via in ("a", "b"):
        got = await q.ask(via, {"action": "get", "task_id": live}, "task")
        assert (got["state"], got["started_at"] is not None) == ("running", True)
    got = await q.ask("b", {"action": "get", "task_id": "nobody"}, "task")
    assert (got["found"], got["state"]) == (False, "unknown")
    q.hold.clear()
    await q.daemons["a"].send({"action": "result", "task_id": live, "status": "success"})
    await q.stop()


async def test_a_retry_by_type_and_a_purge_through_the_non_owner_reach_both_shards(
    queue_dir: Path, nursery: trio.Nursery
) -> None:
    q = Control(nursery, queue_dir)
    await q.start("a", "b", types=("t", "p"))
    # A dead letter of each type on each daemon's shard.
    dead = {owner: [q.task_on(owner, "d-"), q.task_on(owner, "e-")] for owner in ("a", "b")}
    for owner, (of_t, of_p) in dead.items():
        q.fail.update((of_t, of_p))
        await q.enqueue(owner, of_t, max_retries=0)
        await q.enqueue(owner, of_p, task_type="p", max_retries=0)
    buried = set(q.fail)
    await q.until(lambda: all(q.has(None, "max_retries_reached", t) for t in buried))
    q.fail.clear()
    # Through b: b's shard puts its own back, a's is reached through its inbox.
    got = await q.ask("b", {"action": "retry", "task_type": "p"}, "requeued")
    assert got == {"action": "requeued", "task_type": "p", "before": None, "count": 2,
                   "shards": 2, "pending": []}
    back = [of_p for _of_t, of_p in dead.values()]
    await q.until(lambda: all(len(q.runs(t)) == 2 for t in back))
    for owner, (_of_t, of_p) in dead.items():
        assert q.runs(of_p) == [owner, owner]
    # A cutoff before they died takes none; without one, a's and b's dead letters of t go.
    early = {"action": "purge", "task_type": "t", "before": "2020-01-01T00:00:00Z"}
    got = await q.ask("a", early, "purged")
    assert (got["count"], got["pending"]) == (0, [])
    got = await q.ask("a", {"action": "purge", "task_type": "t"}, "purged")
    assert (got["count"], got["shards"], got["pending"]) == (2, 2, [])
    for owner, (of_t, _of_p) in dead.items():
        got = await q.ask(q.other(owner), {"action": "get", "task_id": of_t}, "task")
        assert got["state"] == "purged", (owner, got)
    got = await q.ask("b", {"action": "purge", "queue": True}, "purged")
    assert got["count"] == 0
    await q.stop()


@pytest.mark.slow
async def test_a_pause_through_either_daemon_holds_the_type_on_both_across_a_restart(
    queue_dir: Path, nursery: trio.Nursery
) -> None:
    q = Control(nursery, queue_dir)
    types = ("t", "p")
    await q.start("a", "b", types=types)
    got = await q.ask("b", {"action": "pause", "task_type": "p"}, "paused")
    assert got == {"action": "paused", "task_type": "p", "paused": True, "shards": 2,
                   "pending": []}
    # On each daemon's shard, a paused task (enqueued through the other daemon, the more
    # urgent) and a witness of another type after it: the witness runs, the paused one not.
    held: list[str] = []
    for owner in ("a", "b"):
        held.append(q.task_on(owner, "p-"))
        await q.enqueue(q.other(owner), held[-1], task_type="p", urgency_score=10)
        witness = q.task_on(owner, "t-")
        await q.enqueue(q.other(owner), witness)
        await q.until(lambda w=witness: q.has(None, "done", w))
    for name in ("a", "b"):
        stats = await q.ask(name, {"action": "stats"}, "stats")
        assert stats["paused_types"] == ["p"], (name, stats)
    assert [q.runs(task) for task in held] == [[], []]
    # Both daemons restart: the pause is in the shards' logs, and holds on.
    await q.restart("c", "d", types=types)
    for owner in ("c", "d"):
        witness = q.task_on(owner, "t-")
        await q.enqueue(owner, witness)
        await q.until(lambda w=witness: q.has(None, "done", w))
    assert [q.runs(task) for task in held] == [[], []]
    # Resumed through one daemon: both shards' paused tasks run.
    got = await q.ask("c", {"action": "resume", "task_type": "p"}, "paused")
    assert got == {"action": "paused", "task_type": "p", "paused": False, "shards": 2,
                   "pending": []}
    await q.until(lambda: all(q.has(None, "done", task) for task in held))
    await q.stop()
    assert sorted(len(q.runs(task)) for task in held) == [1, 1]


async def test_the_sdk_controls_through_its_daemon_a_task_another_daemon_owns(
    queue_dir: Path, nursery: trio.Nursery
) -> None:
    # The owner is a bare daemon; the other is the one `SnerdQueue` runs, through which
    # every call goes. Its values say what the owner decided.
    q = Control(nursery, queue_dir)
    await q.start("a")  # (both shards, until the SDK's daemon joins)
    async with SnerdQueue(storage_path=queue_dir, env=q.env) as sdk:
        await q.until(lambda: len(q.owned["a"]) == 1, timeout=20)
        shard = f"shard-{q.shard_of('a')}"
        task = q.task_on("a", "w-")
        await sdk.enqueue(task, "later", None)
        assert await sdk.cancel(task) == Cancelled(task, "queued", True, shard)
        assert await sdk.retry(task) == Retried(task, "cancelled", True, shard)
        assert await sdk.cancel(task) == Cancelled(task, "queued", True, shard)
        assert await sdk.pause("p") == Paused("p", True, 2)
        stats = await q.ask("a", {"action": "stats"}, "stats")
        assert stats["paused_types"] == ["p"]
        assert await sdk.resume("p") == Paused("p", False, 2)
        stats = await q.ask("a", {"action": "stats"}, "stats")
        assert stats["paused_types"] == []
    assert sdk.exit_code == 0
    await q.stop()
