"""Dedupe across real daemons on one queue directory: an enqueue with `auto_dedupe` or a
`unique_key` sent to a daemon that does not own its shard is acked with the owner's decision
(deduplicated, with the twin's id; taken in; or the owner's error), or `"deduplicated": null`
once SNERD_DEDUPE_WAIT_MS passed without one, and the owner then takes it in exactly once.

Two daemons share two shards, one each. A dedupe enqueue routes by its fingerprint
(`snerd.core.dedupe.fingerprint` of the data, or `unique_fingerprint` of the key), not its id,
so the data or keys are picked to land on the shard of the daemon the test means (`route_shard`,
read against the daemons' `membership` messages), and each is sent through the other one. The
test is each daemon's SDK: it answers every `execute` with a success unless the task is held,
and keeps every message. Whether a dropped enqueue stayed out of the queue is read from the
shard logs (it has no record there; the owner's `inbox` record lists it as dropped).
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from snerd import Enqueued, SnerdQueue
from snerd.core.dedupe import fingerprint, unique_fingerprint
from snerd.core.node.model import route_shard
from snerd.core.records import scan
from tests.support.cluster import Daemons

SHARDS = 2


class Pair(Daemons):
    """Two daemons on one directory, one shard each, and the SDK of each: every message they
    send, in order, as (daemon, message)."""

    def __init__(self, nursery: trio.Nursery, directory: Path, **env: str) -> None:
        super().__init__(nursery, directory, SHARDS, **env)
        self.seen: list[tuple[str, dict[str, Any]]] = []

    # -- routing: what lands on the shard of `owner`

    def shard_of(self, owner: str) -> int:
        (shard,) = self.owned[owner]
        return shard

    def data_on(self, owner: str, task_type: str = "t") -> dict[str, Any]:
        """Fresh task data (an object of two keys) whose payload fingerprint routes to the
        shard `owner` owns."""
        while True:
            data = {"n": next(self._ids), "what": "payload"}
            text = orjson.dumps(data).decode()
            if route_shard(fingerprint(task_type, text), SHARDS) == self.shard_of(owner):
                return data

    def key_on(self, owner: str, task_type: str = "t") -> str:
        """A fresh unique_key whose fingerprint routes to the shard `owner` owns."""
        while True:
            key = f"key-{next(self._ids)}"
            if route_shard(unique_fingerprint(task_type, key), SHARDS) == self.shard_of(owner):
                return key

    # -- messages

    async def enqueue(self, via: str, task: str, **options: Any) -> dict[str, Any]:
        """Enqueue `task` through daemon `via`; its answer (an `ack` or an `error`)."""
        await self.daemons[via].enqueue(task, options.pop("task_type", "t"), **options)
        await self.until(lambda: self.answer(via, task) is not None)
        answer = self.answer(via, task)
        assert answer is not None
        return answer

    def answer(self, via: str, task: str) -> dict[str, Any] | None:
        for name, m in self.seen:
            if name == via and m.get("task_id") == task and m["action"] in ("ack", "error"):
                return m
        return None

    def runs(self, task: str) -> list[str]:
        """The daemons that got an `execute` of `task`, in order."""
        return [n for n, m in self.seen if m["action"] == "execute" and m["task_id"] == task]

    def has(self, action: str, task: str) -> bool:
        return any(m["action"] == action and m.get("task_id") == task for _, m in self.seen)

    def records(self) -> list[dict[str, Any]]:
        return [
            record.fields
            for log in sorted(self.directory.glob("shard-*/tasks/tasks.log"))
            for record in scan(log.read_bytes()).records
        ]

    def task_records(self, task: str) -> list[dict[str, Any]]:
        return [f for f in self.records() if f.get("taskId") == task and "snerdKind" not in f]

    def dropped(self) -> dict[str, dict[str, Any]]:
        """What the owners' `inbox` records say they did not take in, by task id."""
        return {
            entry["task"]: entry
            for f in self.records()
            if f.get("snerdKind") == "inbox"
            for entry in f.get("dropped") or ()
        }


@pytest.fixture
def queue_dir(tmp_path: Path) -> Path:
    return tmp_path / "q"


def _deduplicated(answer: dict[str, Any], twin: str) -> bool:
    return (
        answer["action"] == "ack"
        and answer.get("deduplicated") is True
        and answer.get("duplicate_of") == twin
    )


def _taken(answer: dict[str, Any]) -> bool:
    return answer["action"] == "ack" and "deduplicated" not in answer


async def test_through_the_non_owner_a_duplicate_is_told_so_and_runs_once_a_new_one_runs(
    queue_dir: Path, nursery: trio.Nursery
) -> None:
    q = Pair(nursery, queue_dir)
    await q.start("a", "b")
    # (a) A payload pending on a's shard, running there; the same JSON in another key order
    # through b is acked as its duplicate, and never becomes a task.
    data = q.data_on("a")
    q.hold.add("orig")
    assert _taken(await q.enqueue("a", "orig", data=data, auto_dedupe=True))
    await q.until(lambda: q.runs("orig") == ["a"])
    shuffled = dict(reversed(data.items()))
    assert orjson.dumps(shuffled) != orjson.dumps(data)
    answer = await q.enqueue("b", "dup", data=shuffled, auto_dedupe=True)
    assert _deduplicated(answer, "orig"), answer
    assert answer["shard"] == f"shard-{q.shard_of('a')}"
    assert q.dropped()["dup"]["of"] == "orig" and q.task_records("dup") == []
    # (b) Another payload through b: taken in by a, acked plainly, and run there.
    answer = await q.enqueue("b", "fresh", data=q.data_on("a"), auto_dedupe=True)
    assert _taken(answer), answer
    await q.until(lambda: q.has("done", "fresh"))
    assert q.runs("fresh") == ["a"]
    # (e) An id pending on a, enqueued through b with dedupe (data of its own, routed to a's
    # shard): b answers with a's error.
    await q.enqueue("a", "busy", task_type="later", data=q.data_on("a", "later"), auto_dedupe=True)
    answer = await q.enqueue("b", "busy", data=q.data_on("a"), auto_dedupe=True)
    assert answer["action"] == "error" and "already pending" in answer["message"], answer
    assert "busy" in q.dropped() and len(q.task_records("busy")) == 1
    # The duplicate's twin finishes; the duplicate never ran anywhere.
    await q.daemons["a"].send({"action": "result", "task_id": "orig", "status": "success"})
    await q.stop()
    assert q.runs("orig") == ["a"] and q.runs("dup") == []


@pytest.mark.slow
async def test_a_unique_key_dedupes_whatever_the_data_for_the_scope_asked(
    queue_dir: Path, nursery: trio.Nursery
) -> None:
    q = Pair(nursery, queue_dir)
    await q.start("a", "b")
    # (c) A unique_key twin running on a: an enqueue through b with other data is dropped.
    key = q.key_on("a")
    q.hold.add("k-orig")
    assert _taken(await q.enqueue("a", "k-orig", data={"v": 1}, unique_key=key))
    await q.until(lambda: q.runs("k-orig") == ["a"])
    answer = await q.enqueue("b", "k-dup", data={"v": 2}, unique_key=key)
    assert _deduplicated(answer, "k-orig"), answer
    # unique_until "started": dropped while the twin waits (no handler of its type yet), let
    # in once it runs.
    key = q.key_on("a", "later")
    options: dict[str, Any] = {"task_type": "later", "unique_key": key, "unique_until": "started"}
    q.hold.add("s-orig")
    assert _taken(await q.enqueue("a", "s-orig", **options))
    assert _deduplicated(await q.enqueue("b", "s-dup", **options), "s-orig")
    await q.daemons["a"].send({"action": "register", "task_type": "later"})
    await q.until(lambda: q.runs("s-orig") == ["a"])
    assert _taken(await q.enqueue("b", "s-next", **options))
    await q.until(lambda: q.has("done", "s-next"))
    # unique_until N seconds: dropped while the twin runs and for N s after it finished.
    key, seconds = q.key_on("a"), 2
    options = {"unique_key": key, "unique_until": seconds}
    assert _taken(await q.enqueue("a", "n-orig", **options))
    await q.until(lambda: q.has("done", "n-orig"))
    finished = trio.current_time()  # (the owner's completion comes a little after this)
    with trio.fail_after(5):
        while not any(f.get("deletedAt") for f in q.task_records("n-orig")):
            await trio.sleep(0.02)  # no message says the tombstone is written
    assert _deduplicated(await q.enqueue("b", "n-dup", **options), "n-orig")
    assert trio.current_time() - finished < seconds
    await trio.sleep_until(finished + seconds + 0.6)
    assert _taken(await q.enqueue("b", "n-late", **options))
    await q.until(lambda: q.has("done", "n-late"))
    q.hold.clear()
    for task in ("k-orig", "s-orig"):
        await q.daemons["a"].send({"action": "result", "task_id": task, "status": "success"})
    await q.stop()
    assert [q.runs(t) for t in ("k-dup", "s-dup", "n-dup")] == [[], [], []]
    assert [q.task_records(t) for t in ("k-dup", "s-dup", "n-dup")] == [[], [], []]


@pytest.mark.slow
async def test_with_the_owner_stopped_the_ack_is_undecided_after_the_wait_then_taken_once(
    queue_dir: Path, nursery: trio.Nursery
) -> None:
    # A longer lease (3 s), so that b does not take a's shard over while a is stopped.
    wait_ms = 400
    q = Pair(nursery, queue_dir, SNERD_DEDUPE_WAIT_MS=str(wait_ms), SNERD_LEASE_TTL="3")
    await q.start("a", "b")
    data = q.data_on("a")
    owner = q.daemons["a"]
    owner.signal(signal.SIGSTOP)
    try:
        sent = trio.current_time()
        answer = await q.enqueue("b", "z", data=data, auto_dedupe=True)
        waited = trio.current_time() - sent
    finally:
        owner.signal(signal.SIGCONT)
    assert answer["action"] == "ack" and answer["deduplicated"] is None, answer
    assert "duplicate_of" not in answer
    assert wait_ms / 1000 <= waited < wait_ms / 1000 + 2.5, waited
    await q.until(lambda: q.has("done", "z"))
    # Taken in exactly once: a later enqueue through b's inbox runs too (a read on past it),
    # and z has one enqueue record and ran once.
    assert _taken(await q.enqueue("b", "after", data=q.data_on("a"), auto_dedupe=True))
    await q.until(lambda: q.has("done", "after"))
    await q.stop()
    assert q.runs("z") == ["a"]
    assert len([f for f in q.task_records("z") if not f.get("deletedAt")]) == 1
    assert "z" not in q.dropped()


async def test_the_sdk_returns_the_owner_s_decision_through_another_daemon(
    queue_dir: Path, nursery: trio.Nursery
) -> None:
    # The owner is a bare daemon; the other daemon is the one `SnerdQueue` runs. Its
    # `Enqueued` says what the owner decided: deduplicated, and of which twin, or not.
    q = Pair(nursery, queue_dir)
    await q.start("a")  # (both shards, until the SDK's daemon joins)
    async with SnerdQueue(storage_path=queue_dir, env=q.env) as sdk:
        await q.until(lambda: len(q.owned["a"]) == 1, timeout=20)
        key = q.key_on("a", "later")
        await q.enqueue("a", "orig", task_type="later", data={"v": 1}, unique_key=key)
        data = q.data_on("a", "later")
        await q.enqueue("a", "orig-data", task_type="later", data=data, auto_dedupe=True)
        shard = f"shard-{q.shard_of('a')}"
        got = await sdk.enqueue("by-key", "later", {"v": 2}, unique_key=key)
        assert got == Enqueued("by-key", shard, deduplicated=True, duplicate_of="orig")
        shuffled = dict(reversed(data.items()))
        got = await sdk.enqueue("by-data", "later", shuffled, auto_dedupe=True)
        assert got == Enqueued("by-data", shard, deduplicated=True, duplicate_of="orig-data")
        got = await sdk.enqueue("new", "later", q.data_on("a", "later"), auto_dedupe=True)
        assert got == Enqueued("new", shard, deduplicated=False, duplicate_of=None)
    assert sdk.exit_code == 0
    await q.stop()
    assert {"by-key", "by-data"} <= set(q.dropped()) and q.task_records("by-key") == []
