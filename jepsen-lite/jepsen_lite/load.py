"""The client load of the chaos phase: enqueues to random running nodes, a Poisson stream at
`rate`, each recorded as an `enqueue` invoke and its outcome (`ok`, `fail`, or `info` when it
is not known: no answer within 10 s, the node gone). The acked tasks are what the drain
waits for.

A task is of type `t` or, when the run sends job-control commands, `u` for about half of
them (`jepsen_lite.commands`: pausing one type leaves the other running). Children and their
parents are all of type `t`, which the sweep of dead letters (`retry_type`, of `u`) leaves
alone, and cancels and retries by id leave them alone too (`in_deps`): the dependency check
(`sim.check.deps`) does not judge a child or parent that job control ended or put back. A task's handler
sleeps a little and fails some attempts on purpose (the worker does what its
`data` says); a share of the tasks (`rl_share`) is in a rate-limited group.

A share of the enqueues (`deps_share`) are children (`trigger_after_ids`, recorded as the
invoke's `parents`) of 1-3 tasks among the last ones enqueued through other nodes, so parent
and child often sit in shards of different daemons; some of them name the task the load sends
next as well (a child sent before its parent), a few a task nobody ever enqueues (`never-N`:
the child must end dead-lettered, `unknown_parent`). The task a child named before it was sent
names no parent itself, so no chain ever closes into a cycle: every other parent was sent
earlier than its child.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from jepsen_lite.cluster import Cluster, Node, now_us

if TYPE_CHECKING:
    from jepsen_lite.config import RunConfig

__all__ = ["GHOST_PREFIX", "RL_GROUP", "RL_LIMIT", "Load"]

#: The rate-limited group and its limit (a share of the tasks carries it).
RL_GROUP = "rl"
RL_LIMIT = 60
#: How the ids of parents nobody enqueues start.
GHOST_PREFIX = "never-"
#: How many of the latest enqueues a child's parents are drawn from.
RECENT = 30


class Load:
    def __init__(
        self,
        cluster: Cluster,
        config: RunConfig,
        rng: random.Random,
        task_type: Callable[[], str] = lambda: "t",
    ) -> None:
        self.cluster = cluster
        #: Draws the type of each task (`jepsen_lite.commands.Commands.task_type`).
        self.task_type = task_type
        self.c = config
        #: Shared with the nemesis: one seed draws both.
        self.rng = rng
        self.seq = 0
        #: Enqueues waiting for their answer.
        self.ops: set[asyncio.Task[None]] = set()
        self.stop = asyncio.Event()
        self.acked: set[str] = set()
        #: The latest invokes: (task, the label of the node it was sent through).
        self.recent: deque[tuple[str, str]] = deque(maxlen=RECENT)
        #: The task a child named before it was sent (it names no parent itself).
        self.promised: str | None = None
        self.ghosts = 0
        #: The parents each child named (children only).
        self.parents_of: dict[str, list[str]] = {}
        #: Every child and every parent named: the tasks job control leaves alone.
        self.in_deps: set[str] = set()

    async def run(self) -> None:
        """Enqueue, as a Poisson stream at `rate`, to random running nodes until `stop` is set."""
        while not self.stop.is_set():
            await asyncio.sleep(self.rng.expovariate(self.c.rate))
            running = [n for n in self.cluster.nodes if n.up]
            if not running or len(self.ops) > 2000:
                continue
            node = self.rng.choice(running)
            self.seq += 1
            task = f"t{self.seq}"
            max_retries = self.rng.randint(0, 2)
            fail = [a for a in range(1, max_retries + 2) if self.rng.random() < 0.1]
            data = {
                "id": task,
                "sleep": self.rng.choice([0, 0, 0, 0.01, 0.05, 0.2]),
                "fail": fail,
            }
            group = RL_GROUP if self.rng.random() < self.c.rl_share else None
            parents = [] if task == self.promised else self.parents(node)
            kind = self.task_type()
            if parents or task == self.promised:
                kind = "t"  # (the dependency workload keeps to the first type)
            if kind == "t":
                self.recent.append((task, node.host))
            if parents:
                self.parents_of[task] = parents
                self.in_deps.add(task)
                self.in_deps.update(parents)
            op = asyncio.create_task(
                self.enqueue(node, task, data, max_retries, group, parents, kind)
            )
            self.ops.add(op)
            op.add_done_callback(self.ops.discard)

    def parents(self, node: Node) -> list[str]:
        """The parents of the task about to be sent through `node` (`seq`): none, or 1-3 of
        the recent tasks sent through other nodes, the next task (`seq + 1`) and a ghost."""
        rng, c = self.rng, self.c
        if c.deps_share <= 0 or rng.random() >= c.deps_share:
            return []
        want = rng.randint(1, 3)
        picked: list[str] = []
        if rng.random() < c.child_first_share:
            picked.append(f"t{self.seq + 1}")  # the id the load gives the next enqueue
            self.promised = picked[-1]
        if rng.random() < c.ghost_share:
            self.ghosts += 1
            picked.append(f"{GHOST_PREFIX}{self.ghosts}")
        others = list(dict.fromkeys(t for t, via in self.recent if via != node.host))
        picked += rng.sample(others, min(len(others), max(0, want - len(picked))))
        return picked

    async def enqueue(
        self,
        node: Node,
        task: str,
        data: dict[str, Any],
        max_retries: int,
        group: str | None,
        parents: list[str],
        task_type: str = "t",
    ) -> None:
        name = node.name
        attrs = {
            "type": task_type,
            "max_retries": max_retries,
            "urgency": 0,
            "group": group,
            "max_per_minute": RL_LIMIT if group else None,
            "fingerprint": None,
            "delay_us": 0,
            "parents": parents,
        }
        t0 = now_us()
        self.cluster.record("enqueue", t0, phase="invoke", task=task, node=name, attrs=attrs)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        node.waiting[task] = fut
        cmd = {
            "op": "enqueue",
            "task": task,
            "type": task_type,
            "data": data,
            "max_retries": max_retries,
            "group": group,
            "max_per_minute": RL_LIMIT if group else None,
            "parents": parents,
        }

        def unknown(why: str) -> None:
            """The enqueue's outcome is not known (`info`)."""
            node.waiting.pop(task, None)
            self.cluster.record(
                "enqueue", max(now_us(), t0), phase="info", task=task, node=name, error=why
            )

        if not await self.cluster.send(node, cmd):
            unknown("could not write to the worker")
            return
        try:
            reply = await asyncio.wait_for(asyncio.shield(fut), 10)
        except TimeoutError:
            unknown("no answer within 10 s")
            return
        status = reply.get("status")
        t = max(int(reply.get("t") or now_us()), t0)
        if status == "ok":
            self.acked.add(task)
            extra: dict[str, Any] = {}
            if isinstance(reply.get("shard"), int):
                extra["shard"] = reply["shard"]
            if reply.get("deduplicated"):
                extra["deduplicated"] = True
            elif "deduplicated" in reply and reply["deduplicated"] is None:
                extra["undecided"] = True  # the owner had not decided in time
            self.cluster.record(
                "enqueue", t, phase="ok", task=task, node=name, latency_us=t - t0, **extra
            )
        else:
            self.cluster.record(
                "enqueue",
                t,
                phase="fail" if status == "fail" else "info",
                task=task,
                node=name,
                error=reply.get("error"),
            )
