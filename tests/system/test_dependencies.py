"""Dependencies (`trigger_after_ids`) across real daemons on one queue directory: a child never
starts before its parent completed, wherever each of them lives, whichever daemon owns it,
across a kill -9 of an owner mid-chain; a dead-lettered parent fails its children through; a
parent enqueued a moment after its child is waited for, and one nobody enqueues fails the
child after SNERD_UNKNOWN_PARENT_SECONDS.

Task ids are picked so that each parent and its children land on shards owned by different
daemons (`route_shard`, read against the daemons' `membership` messages). The test is each
daemon's SDK: it answers every `execute` (success, unless the task is held or set to fail) and
keeps every message in one ordered list, so "after" means after in what the SDKs saw: a
child's `execute` came after its parent's successful `result` was sent.

To show that a child does not run while its parent is pending, the test waits for a whole
read of the queue's files to have happened on the child's daemon (`Queue.scanned_on`: a
sentinel child of a parent that completed on another daemon runs only once such a read found
that parent's completion record), not for a stretch of time.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio

from snerd.core.node.model import route_shard
from snerd.core.timefmt import parse_rfc3339
from tests.support.cluster import Daemons
from tests.support.daemon import Daemon

#: The queue's files are read for watched parents every 50 ms.
ENV = {"SNERD_WATCH_POLL_MS": "50"}


class Queue(Daemons):
    """Daemons on one directory and the SDK of each: every message they send, in order."""

    def __init__(self, nursery: trio.Nursery, directory: Path, shards: int, **env: str) -> None:
        super().__init__(nursery, directory, shards, **{**ENV, **env})
        #: (what, daemon, task id, detail), in the order seen: "ack", "execute" (detail: the
        #: attempt), "done" (a result sent; detail: its status), "dead" (a dead letter;
        #: detail: its error), "refused" (an `error` about the task).
        self.seen: list[tuple[str, str, str, Any]] = []
        #: Tasks answered with a failure (and, in `hold`, those whose next `execute` is not
        #: answered).
        self.fail: set[str] = set()

    def _take(self, name: str, m: dict[str, Any]) -> None:
        action, task = m.get("action"), m.get("task_id", "")
        if action == "execute":
            self.seen.append(("execute", name, task, m["attempt"]))
        elif action == "ack" and task:
            self.seen.append(("ack", name, task, None))
        elif action == "max_retries_reached":
            self.seen.append(("dead", name, task, m.get("error")))
        elif action == "error" and task:
            self.seen.append(("refused", name, task, m))

    async def _answer(self, name: str, d: Daemon, m: dict[str, Any]) -> None:
        task = m["task_id"]
        if task in self.hold:
            self.hold.discard(task)
            return
        status = "failure" if task in self.fail else "success"
        self.seen.append(("done", name, task, status))
        reply = {"action": "result", "task_id": task, "status": status, "attempt": m["attempt"]}
        if status == "failure":
            reply["error_msg"] = "it failed"
        await d.send(reply)

    # -- tasks

    def task_on(self, owner: str, prefix: str) -> str:
        """A fresh task id that lands on a shard `owner` owns."""
        while True:
            task = f"{prefix}{next(self._ids)}"
            if route_shard(task, self.shards) in self.owned[owner]:
                return task

    async def enqueue(self, via: str, task: str, **options: Any) -> None:
        """Enqueue `task` through the daemon `via` and wait for its ack."""
        await self.daemons[via].enqueue(task, options.pop("task_type", "t"), **options)
        await self.until(lambda: self.has("ack", task) or self.has("refused", task))
        assert not self.has("refused", task), self.report(f"{task} refused")

    def has(self, what: str, task: str) -> bool:
        return any(s[0] == what and s[2] == task for s in self.seen)

    def index(self, what: str, task: str, *, last: bool = False) -> int:
        found = [i for i, s in enumerate(self.seen) if s[0] == what and s[2] == task]
        assert found, self.report(f"no {what} of {task}")
        return found[-1] if last else found[0]

    def ran(self, tasks: Sequence[str]) -> list[str]:
        return [t for t in tasks if self.has("execute", t)]

    async def in_logs(self, tasks: Sequence[str], timeout: float = 10) -> None:
        """Until a shard log holds each of `tasks` (one enqueued through an inbox is there
        once its owner ingested it). Polls the files: no message says so."""
        with trio.fail_after(timeout):
            while not set(tasks) <= {r.fields.get("taskId") for r in self.records()}:
                await trio.sleep(0.02)

    async def scanned_on(self, owner: str, other: str) -> None:
        """Until `owner` has read the whole queue for the parents its children wait on: a
        parent completed on `other`'s shard, then a child of it on `owner`'s shard, which runs
        only once a read of every file (begun after it was named, so covering the other
        parents watched too) found that parent's completion record."""
        parent, child = self.task_on(other, "seen-"), self.task_on(owner, "seen-child-")
        await self.enqueue(other, parent)
        await self.until(lambda: self.has("done", parent))
        await self.enqueue(owner, child, trigger_after_ids=[parent])
        await self.until(lambda: self.has("execute", child))


@pytest.fixture
def queue_dir(tmp_path: Path) -> Path:
    return tmp_path / "q"


@pytest.mark.slow
async def test_children_on_both_daemons_wait_for_a_pending_parent_and_run_after_it(
    queue_dir: Path, nursery: trio.Nursery
) -> None:
    q = Queue(nursery, queue_dir, shards=4)
    await q.start("a", "b")
    # The parent is of a type no daemon has a handler for yet: it stays pending on b.
    parent = q.task_on("b", "parent-")
    await q.enqueue("b", parent, task_type="later")
    children = [q.task_on("a", "child-") for _ in range(4)] + [
        q.task_on("b", "child-") for _ in range(4)
    ]
    for via, child in zip(itertools.cycle("ab"), children, strict=False):
        await q.enqueue(via, child, trigger_after_ids=[parent])  # half through an inbox
    await q.in_logs(children)
    await q.scanned_on("a", "b")
    await q.scanned_on("b", "a")
    assert q.ran(children) == [], q.report("a child ran while its parent was pending")
    await q.daemons["b"].send({"action": "register", "task_type": "later"})
    await q.until(lambda: q.ran(children) == children)
    done = q.index("done", parent)
    early = [c for c in children if q.index("execute", c) < done]
    assert early == [], q.report(f"{early} ran before their parent completed")
    assert {q.seen[q.index("execute", c)][1] for c in children} == {"a", "b"}
    await q.stop()


@pytest.mark.slow
async def test_a_dead_lettered_parent_fails_its_children_on_the_other_daemon_through(
    queue_dir: Path, nursery: trio.Nursery
) -> None:
    q = Queue(nursery, queue_dir, shards=4)
    await q.start("a", "b")
    parent = q.task_on("b", "parent-")
    q.fail.add(parent)
    await q.enqueue("b", parent, task_type="later")
    waiting = [q.task_on("a", "child-"), q.task_on("a", "child-"), q.task_on("b", "child-")]
    for child in waiting:
        await q.enqueue("a", child, trigger_after_ids=[parent])
    await q.in_logs(waiting)
    await q.scanned_on("a", "b")
    assert q.ran(waiting) == [] and not any(q.has("dead", c) for c in waiting)
    await q.daemons["b"].send({"action": "register", "task_type": "later"})
    await q.until(lambda: q.has("dead", parent))
    # A child enqueued after the parent's end is judged by its tombstone.
    late = q.task_on("a", "late-")
    await q.enqueue("b", late, trigger_after_ids=[parent])
    children = [*waiting, late]
    await q.until(lambda: all(q.has("dead", c) for c in children))
    letters = {s[2]: (s[1], s[3]) for s in q.seen if s[0] == "dead" and s[2] in children}
    want = f"blocked_by_failed_parent: {parent}"
    assert {c: error for c, (_, error) in letters.items()} == dict.fromkeys(children, want)
    assert {letters[c][0] for c in children} == {"a", "b"}
    assert q.ran(children) == []
    await q.stop()


async def test_a_child_enqueued_before_its_parent_waits_for_it_and_runs_after_it(
    queue_dir: Path, nursery: trio.Nursery
) -> None:
    q = Queue(nursery, queue_dir, shards=4)
    await q.start("a", "b")
    parent, child = q.task_on("b", "parent-"), q.task_on("a", "child-")
    await q.enqueue("a", child, trigger_after_ids=[parent])
    # A whole read of the queue found no record of the parent: the child still waits (for
    # SNERD_UNKNOWN_PARENT_SECONDS, 60 s).
    await q.scanned_on("a", "b")
    assert q.ran([child]) == []
    await q.enqueue("b", parent)
    await q.until(lambda: q.has("execute", child))
    assert q.index("done", parent) < q.index("execute", child), q.report("ran before")
    assert not q.has("dead", child)
    await q.stop()


async def test_a_child_of_a_parent_nobody_enqueues_is_dead_lettered_after_the_wait(
    queue_dir: Path, nursery: trio.Nursery
) -> None:
    q = Queue(nursery, queue_dir, shards=4, SNERD_UNKNOWN_PARENT_SECONDS="1")
    await q.start("a", "b")
    children = [q.task_on("a", "orphan-"), q.task_on("b", "orphan-")]
    started = trio.current_time()
    for child in children:
        await q.enqueue("a", child, trigger_after_ids=["never-enqueued"])
    await q.until(lambda: all(q.has("dead", c) for c in children))
    waited = trio.current_time() - started
    errors = [s[3] for s in q.seen if s[0] == "dead"]
    assert len(errors) == 2 and all(
        e.startswith("unknown_parent: never-enqueued (") for e in errors
    ), errors
    assert waited >= 1.0, waited  # not before the bounded wait
    assert q.ran(children) == []
    await q.stop()


def _times(records: list[Any]) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """Per task: the times of its dispatch records, and of its completed tombstones."""
    dispatched: dict[str, list[int]] = {}
    completed: dict[str, list[int]] = {}
    for record in records:
        f = record.fields
        if f.get("snerdKind") == "dispatch":
            dispatched.setdefault(f["task"], []).append(parse_rfc3339(f["at"]))
        elif f.get("snerdKind") is None and f.get("snerdOutcome") == "completed":
            completed.setdefault(f["taskId"], []).append(parse_rfc3339(f["deletedAt"]))
    return dispatched, completed


@pytest.mark.slow
async def test_a_chain_across_three_daemons_completes_in_order_through_a_kill_of_an_owner(
    queue_dir: Path, nursery: trio.Nursery
) -> None:
    q = Queue(nursery, queue_dir, shards=6)
    await q.start("x", "y", "z")
    # first -> second -> third -> fourth, each on a shard of another daemon than its parent's.
    chain = [q.task_on(owner, f"step{n}-") for n, owner in enumerate("xyzx", 1)]
    q.hold.add(chain[1])  # its first attempt gets no answer: its owner is killed meanwhile
    for n in (3, 2, 1):  # children first, through daemons that do not own them
        await q.enqueue("zxy"[n - 1], chain[n], trigger_after_ids=[chain[n - 1]])
    await q.enqueue("y", chain[0])
    await q.until(lambda: q.has("execute", chain[1]))
    assert q.seen[q.index("execute", chain[1])][1] == "y"
    q.daemons["y"].kill()  # SIGKILL while the middle task runs
    await q.until(lambda: q.has("execute", chain[3]), timeout=30)
    for parent, child in itertools.pairwise(chain):
        done, runs = q.index("done", parent, last=True), q.index("execute", child)
        assert done < runs, q.report(f"{child} ran before {parent} completed")
    again = [s for s in q.seen if s[0] == "execute" and s[2] == chain[1]]
    assert [s[1] for s in again[:1]] == ["y"] and len(again) == 2 and again[1][1] in ("x", "z")
    assert [len([s for s in q.seen if s[0] == "execute" and s[2] == t]) for t in chain] == [
        1, 2, 1, 1
    ]
    await q.stop()
    # The logs agree: each task completed once, and no attempt of a child was dispatched
    # before its parent's completion record was written.
    dispatched, completed = _times(q.records())
    assert [len(completed.get(t, [])) for t in chain] == [1, 1, 1, 1], completed
    for parent, child in itertools.pairwise(chain):
        assert min(dispatched[child]) >= completed[parent][0], (parent, child)
