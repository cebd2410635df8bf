"""The workload's job-control commands: cancels, retries, sweeps and pauses, sent through the
chaos phase to random live nodes, at `command_rate` per second (a Poisson stream).

What to send next, the line, its history entries and which answer matches it are the
simulator's own (`sim.command_mix.CommandMix`: one mix, judged by `sim.check.control`): a
`cancel` of a recent task (often still queued or running) or an older one, a `retry` of a dead
letter seen (or of a known id), a `retry` of type `u`'s dead letters, a `purge` with or
without `before`, a `pause` or `resume` of a type or of the whole queue. Each goes to a node
drawn among those up (a frozen one too: it answers when it wakes), the owner of the task's
shard or not; the worker writes it to its daemon as it is (`{"op": "command"}`), and the
daemon's answer comes back as a `control` event (`Cluster.on_control`). Every command is a
`command` invoke in the history, its answer the outcome; a node that dies first leaves it
unanswered.

The load draws each task's type (`t` or `u`) here, evenly, so that pausing one type leaves
the other running. The dependency workload's children and parents are left alone by cancels
and retries (`spared`): the dependency check does not judge job control yet. Commands draw from a generator of their own (seeded from the run's seed):
with `command_rate` 0 nothing is drawn or sent, and the run is as it was without commands.

Liveness: as the drain begins every type and the queue are resumed, and again every 5 s while
it lasts (a pause's stamp is its sender's wall clock, latest wins: a pause stamped by a clock
the clock nemesis ran fast beats a resume sent later, until the healed clock passes it). A
retried task must run again: the drain waits for it too (`waiting`).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Container
from typing import TYPE_CHECKING, Any

from jepsen_lite.cluster import Cluster, now_us
from sim.command_mix import CommandMix

if TYPE_CHECKING:
    from jepsen_lite.config import RunConfig

__all__ = ["FIRST_TYPE", "RESUME_EVERY_S", "Commands"]

#: The load's first task type (the schedule's too); the second is `sim.command_mix.OTHER_TYPE`.
FIRST_TYPE = "t"
#: How often the drain resumes everything again, seconds.
RESUME_EVERY_S = 5.0
#: The generator's seed is the run's, mixed with this (the load and nemesis draw the seed's).
_SEED_SALT = 0x636D64


class Commands:
    """The job-control commands of one run (the module docstring)."""

    def __init__(self, cluster: Cluster, config: RunConfig) -> None:
        self.cluster = cluster
        #: Tasks no cancel or retry is sent for (`Load.in_deps`, set by the run): the command
        #: is drawn, then dropped.
        self.spared: Container[str] = frozenset()
        self.c = config
        self.on = config.command_rate > 0
        self.rng = random.Random(config.seed ^ _SEED_SALT)
        self.mix = CommandMix(self.rng, FIRST_TYPE)
        #: Retried tasks (answered `retried: true`) not executed since, by when the retry was
        #: sent.
        self.awaiting: dict[str, int] = {}
        #: When a cancel of each task was last sent; each task's latest execute.
        self.cancel_sent: dict[str, int] = {}
        self.last_execute: dict[str, int] = {}
        #: How many of the cluster's events `_catch_up` has read.
        self._seen = 0
        if self.on:
            cluster.on_control = self.answered

    def task_type(self) -> str:
        """The type of the next task the load enqueues."""
        return self.mix.task_type() if self.on else FIRST_TYPE

    def start(self) -> None:
        """What the checker needs to judge pause stamps: how far apart two nodes' wall clocks
        can be. On one host they share one clock, except for the clock nemesis' steps; on
        several hosts the bound is not known (`steps`: no judgement that needs it)."""
        if not self.on:
            return
        self.cluster.record(
            "control",
            offset_max_us=0,
            drift_max_ppm=0,
            steps="clock" in self.c.nemesis or bool(self.c.hosts),
        )

    async def run(self, stop: asyncio.Event, last_task: Callable[[], int]) -> None:
        """Send commands, a Poisson stream at `command_rate`, until `stop` is set;
        `last_task`: the number of the last task id the load gave out."""
        if not self.on:
            return
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), self.rng.expovariate(self.c.command_rate))
                return
            except TimeoutError:
                pass  # time for the next command
            self._catch_up()
            await self.send(*self.mix.choose(last_task()))

    async def resume_all(self) -> None:
        """Resume every type and the queue the run ever paused."""
        for action, key in self.mix.resumes():
            await self.send(action, key)

    async def send(self, action: str, target: str | None) -> None:
        """Send (action, target) to a node drawn among those up, recorded as its invoke."""
        if action in ("cancel", "retry") and target in self.spared:
            return
        live = [n for n in self.cluster.nodes if n.up and n.name is not None]
        t = now_us()
        sent = self.mix.send(action, target, [str(n.name) for n in live], t)
        if sent is None:
            return
        if action == "cancel" and target is not None:
            self.awaiting.pop(target, None)  # (a retried task cancelled need not run)
            self.cancel_sent[target] = t
        fields = {k: v for k, v in sent.entry.items() if k != "kind"}
        self.cluster.record("command", t, **fields)
        # (Not written, the node gone: no answer comes, and the command stays unanswered.)
        await self.cluster.send(live[sent.node], {"op": "command", "message": sent.message})

    def answered(self, node: str, message: dict[str, Any], t: int) -> None:
        """`node`'s daemon sent `message` (at `t`): recorded if it answers a command."""
        got = self.mix.answer(node, message)
        if got is None:
            return
        entry, sent = got
        fields = {k: v for k, v in entry.items() if k != "kind"}
        self.cluster.record("command", max(t, sent), **fields)
        task = message.get("task_id")
        retried = message.get("action") == "retried" and message.get("retried") is True
        if retried and isinstance(task, str):
            self._catch_up()
            later = max(self.last_execute.get(task, -1), self.cancel_sent.get(task, -1))
            if later <= sent:
                self.awaiting[task] = sent

    def waiting(self) -> list[str]:
        """The retried tasks not executed since their retry was answered."""
        self._catch_up()
        return sorted(self.awaiting)

    def _catch_up(self) -> None:
        """Read the events recorded since last time: dead letters (the retries' targets) and
        executes (of retried tasks)."""
        events = self.cluster.events
        for i in range(self._seen, len(events)):
            e = events[i]
            kind = e.get("kind")
            task = str(e.get("task"))
            if kind == "dead_letter" and task.startswith("t"):
                # (A task of the load's, not a schedule's run, whose data names no id: one
                # retried is a tick run twice, which the schedule check forbids.)
                self.mix.dead_letter(task)
            elif kind == "execute":
                self.last_execute[e["task"]] = e["t"]
                self.awaiting.pop(e["task"], None)
        self._seen = len(events)
