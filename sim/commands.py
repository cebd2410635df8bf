"""The app's job-control commands: cancel, retry, pause and resume, sent to any live process.

In worlds with `Settings.command_rate` the app sends, at that Poisson rate through the safety
phase, a `cancel` of a task id it knows of (a recent one, often still queued or running; an
older one, often finished; now and then an id nobody enqueued), a `retry` of a dead letter (or
of any id it knows), a `retry` of the second type's dead letters (`retry_type` in the history), a
`purge` of a type's (or every type's) dead letters and cancelled tasks that finished before a
time a little in the past (or whenever), or a `pause`/`resume` of one of the two task types or
of the whole queue (`"queue": true`). Each goes to a live process drawn at random, the owner of the task's shard
or not: a process that does not own it writes the command into its inboxes, and the owners
answer through them (`snerd.core.node.control`). Every command is recorded as a `command`
invoke, and its answer (`cancelled`, `retried`, `paused`) as its outcome, in the format
`sim.check.history` documents; `sim.check.control` judges them.

The workload's tasks draw one of two types here (`task_type`), so that pausing one leaves the
other running; the second type's handler registers `cancellable` in some worlds. When the
liveness phase starts, every type and the queue are resumed, again every 10 s while the phase
lasts: pause stamps are latest-wins on the sender's wall clock, so a pause stamped by a fast
clock beats a resume sent later by a slow one until the slow clock passes it. A retried task
must run again: the world's liveness phase waits for it (`awaiting`).

Which command comes next, its line, its history entries and which reply answers it are
`sim.command_mix.CommandMix`'s (jepsen-lite's workload shares them); this module schedules the
commands in the world's time, sends them to live processes, and keeps what the liveness phase
waits for. Commands draw from a generator of their own, and worlds without commands make no
draw and no history entry here: their runs are as they were before commands existed.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

import orjson

from sim.command_mix import OTHER_TYPE, CommandMix
from sim.process import COMMAND, Proc
from sim.settings import SECOND, exp
from snerd.core import events as ev
from snerd.core.schema import OUTCOME_CANCELLED, SNERD_OUTCOME, TASK_ID

if TYPE_CHECKING:
    from sim.world import World

__all__ = ["OTHER_TYPE", "Commands"]

#: How often the liveness phase resumes everything again, and for how long at most.
_END_EVERY_US = 10 * SECOND
_END_FOR_US = 600 * SECOND


class Commands:
    """The job-control commands of one world (the module docstring)."""

    def __init__(self, world: World, rng: random.Random, first_type: str) -> None:
        self.world = world
        self.s = world.s
        self.rng = rng
        self.on = world.s.command_rate > 0
        self.mix = CommandMix(rng, first_type)
        #: Retried tasks (answered `retried: true`) with no execute since the retry was sent.
        self.awaiting: dict[str, int] = {}
        #: When a cancel of each task was last sent.
        self.cancel_sent: dict[str, int] = {}
        #: Each task's latest execute (true time).
        self.last_execute: dict[str, int] = {}
        #: Each task's latest live task record listed (true time: a life begun, by its
        #: enqueue or a retry), and the start of the latest life a tombstone ended (a
        #: retried child failed through by its parents ends so, without an execute).
        self.live_at: dict[str, int] = {}
        self.ended_life: dict[str, int] = {}
        self._seen = 0
        self._end_from = 0

    # -- the SDK's side

    def task_type(self) -> str:
        """The type of the next task the workload enqueues."""
        if not self.on:
            return self.mix.types[0]
        return self.mix.task_type()

    def register(self, proc: Proc) -> None:
        """`proc`'s SDK client also registers the second type (cancellable in some worlds)."""
        if not self.on:
            return
        msg: dict[str, Any] = {"action": "register", "task_type": OTHER_TYPE}
        if self.s.cancellable:
            msg["cancellable"] = True
        self.world.deliver(proc, ev.LineReceived(line=orjson.dumps(msg)))

    def start(self) -> None:
        """The first command, and what the checker needs to judge pause stamps: how far
        apart two wall clocks can be (`sim.check.control`)."""
        if not self.on:
            return
        s = self.s
        self.world.record(
            {
                "kind": "control",
                "offset_max_us": s.offset_max_us,
                "drift_max_ppm": s.drift_max_ppm,
                "steps": s.step_rate > 0,
                "history_limit": self.world.node_history_limit(),
            }
        )
        self.world.at(exp(self.rng, s.command_rate), COMMAND, "next")

    # -- sending

    def fire(self, what: str) -> None:
        world = self.world
        if what == "end":
            self._resume_all()
            if world.t - self._end_from < _END_FOR_US:
                world.at(world.t + _END_EVERY_US, COMMAND, "end")
            return
        if world.liveness:
            return
        world.at(world.t + exp(self.rng, self.s.command_rate), COMMAND, "next")
        self._catch_up()
        self._send(*self.mix.choose(world.workload.next_task))

    def end(self) -> None:
        """The liveness phase starts: everything is resumed, now and every 10 s."""
        if self.on:
            self._end_from = self.world.t
            self.fire("end")

    def _resume_all(self) -> None:
        for action, key in self.mix.resumes():
            self._send(action, key)

    def _send(self, action: str, target: str | None) -> None:
        world = self.world
        live = [p for p in world.procs if p.state != "down"]
        sent = self.mix.send(action, target, [p.name for p in live], world.t)
        if sent is None:
            return
        if action == "cancel" and target is not None:
            self.awaiting.pop(target, None)  # (a retried task cancelled need not run)
            self.cancel_sent[target] = world.t
        world.counters["commands"] = world.counters.get("commands", 0) + 1
        world.record(sent.entry)
        world.workload.write_line(live[sent.node], orjson.dumps(sent.message))

    # -- answers (`Shell._send`)

    def answered(self, proc: Proc, msg: dict[str, Any]) -> bool:
        """`proc` sent `msg` to its SDK: if it answers a command of its, recorded (True)."""
        if not self.on:
            return False
        got = self.mix.answer(proc.name, msg)
        if got is None:
            return False
        entry, sent = got
        self.world.record(entry)
        task = msg.get("task_id")
        if msg.get("action") == "retried" and msg.get("retried") is True and isinstance(task, str):
            self._catch_up()
            later = max(
                self.last_execute.get(task, -1),
                self.cancel_sent.get(task, -1),
                self.ended_life.get(task, -1),
            )
            if later <= sent:
                self.awaiting[task] = sent
        return True

    # -- what the liveness phase waits for

    def waiting(self) -> bool:
        """Whether some retried task has not been executed since its retry was answered."""
        if not self.awaiting:
            return False
        self._catch_up()
        return bool(self.awaiting)

    def _catch_up(self) -> None:
        """Read the history grown since last time: dead letters, and executes of retried
        tasks."""
        history = self.world.history
        for i in range(self._seen, len(history)):
            e = history[i]
            kind = e["kind"]
            if kind == "dead_letter" and "@" not in e["task"]:
                # (Not a schedule's run: one retried is a tick run twice, which the schedule
                # check forbids; a run's retry is not judged yet.)
                self.mix.dead_letter(e["task"])
            elif kind == "execute":
                self.last_execute[e["task"]] = e["t"]
                self.awaiting.pop(e["task"], None)
            elif kind == "record":
                self._life(e)
                if self.awaiting:
                    # A cancel sent before the retry, still in flight (or pending in an
                    # inbox), may end the retried task: then it need not run.
                    fields = e["fields"]
                    if fields.get(SNERD_OUTCOME) == OUTCOME_CANCELLED:
                        self.awaiting.pop(fields.get(TASK_ID), None)
        self._seen = len(history)

    def _life(self, e: dict[str, Any]) -> None:
        """A record listed: a task's life begins (a live task record) or ends (a tombstone).
        A retried task whose new life ended is no longer waited for, executed or not (a
        child failed through by its parents is judged by the checker, `sim.check.deps`)."""
        fields = e["fields"]
        task = fields.get("taskId")
        if not isinstance(task, str) or "snerdKind" in fields:
            return
        if not fields.get("deletedAt"):
            self.live_at[task] = e["t"]
            return
        life = self.ended_life[task] = self.live_at.get(task, -1)
        if life >= self.awaiting.get(task, life + 1):
            del self.awaiting[task]
