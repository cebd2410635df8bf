"""Which job-control command an app sends next, how it is recorded, and which reply answers it.

The pure part of the app's commands, shared by the simulator (`sim.commands`) and jepsen-lite
(`jepsen_lite.control`): both feed a `CommandMix` a random generator, the number of the last
task enqueued (task ids are `t<N>`) and the dead letters seen, and get back the protocol line
to write to a daemon and the `command` history entries (`sim.check.history`) that
`sim.check.control` judges. It owns no clock and does no I/O: the caller says what time it is
and which nodes are live, and writes the line.

The mix (per command): 35 % a `cancel` of a known id (mostly recent, often still queued or
running; sometimes older, often finished; 5 % an id nobody enqueued), 15 % a `retry` of a
dead letter seen (80 %) or of a known id, 6 % a `retry` of the second type's dead letters
(`retry_type` in the history), 6 % a `purge` of a type's (or every type's) dead letters and
cancelled tasks, 70 % of them with a `before` up to 30 s in the past, and the rest a `pause`
of a type or of the whole queue, or its `resume` when the app paused it last.

The draws are made in one fixed order for one choice, so that one seed gives one run.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from typing import Any

from snerd.core.timefmt import format_rfc3339

__all__ = ["OTHER_TYPE", "CommandMix", "Sent"]

#: The second task type of runs with commands (pausing one type leaves the other running).
OTHER_TYPE = "u"
#: The replies that answer a command by task id, and the command each answers.
_REPLIES = {"cancelled": "cancel", "retried": "retry"}
#: The replies that answer a sweep (by its type), and the command each answers.
_SWEEP_REPLIES = {"purged": "purge", "requeued": "retry_type"}
#: The actions whose target is a task id (the others name a type, None: the whole queue).
_BY_TASK = ("cancel", "retry")
#: How far before now a purge's `before` may be, µs.
_PURGE_BACK_US = 30_000_000

Key = tuple[str, str | None]


@dataclass(frozen=True, slots=True, kw_only=True)
class Sent:
    """A command chosen and addressed: the line to write to `node`'s daemon and its invoke
    entry (without `t`)."""

    node: int
    message: dict[str, Any]
    entry: dict[str, Any]


class CommandMix:
    """The app's choice of commands and its matching of their replies (the module docstring).

    `types` are the two task types: the first is the workload's own, the second
    `OTHER_TYPE`."""

    def __init__(self, rng: random.Random, first_type: str) -> None:
        self.rng = rng
        self.types = (first_type, OTHER_TYPE)
        #: Per node name: when the commands it was sent and has not answered were sent, by
        #: (action, target), oldest first.
        self.outstanding: dict[str, dict[Key, deque[int]]] = {}
        #: Dead letters seen (most recent last), the retries' targets.
        self.dead: deque[str] = deque(maxlen=16)
        #: The keys paused last (a type, or None: the queue), and every key ever paused
        #: (resumed at the end).
        self.paused: set[str | None] = set()
        self.ever_paused: set[str | None] = set()

    def task_type(self) -> str:
        """The type of the next task the workload enqueues: either, evenly."""
        return self.types[0] if self.rng.random() < 0.5 else OTHER_TYPE

    def dead_letter(self, task: str) -> None:
        """A task was dead-lettered (not a schedule's run: a run retried is a tick run twice,
        which the schedule check forbids)."""
        self.dead.append(task)

    # -- choosing

    def choose(self, last_task: int) -> Key:
        """The next command's (action, target); `last_task`: the number of the last task id
        given out (0: none yet)."""
        rng = self.rng
        r = rng.random()
        if r < 0.35:
            return "cancel", self.known_id(last_task)
        if r < 0.5:
            dead = self.dead
            use_dead = dead and rng.random() < 0.8
            task = dead[int(rng.random() * len(dead))] if use_dead else self.known_id(last_task)
            return "retry", task
        if r < 0.56:
            # (Of the second type only: schedules' runs are of the first, and a run retried is
            # a tick run twice, which the schedule check forbids.)
            return "retry_type", OTHER_TYPE
        if r < 0.62:
            return "purge", self.pause_key()
        key = self.pause_key()
        return ("resume" if key in self.paused else "pause"), key

    def known_id(self, last: int) -> str:
        """A task id: mostly recent, sometimes older, now and then one nobody enqueued."""
        rng = self.rng
        r = rng.random()
        if r < 0.05 or not last:
            return f"nobody{int(rng.random() * 1000)}"
        back = int(rng.random() * 5) if r < 0.7 else int(rng.random() * min(last, 200))
        return f"t{max(1, last - back)}"

    def pause_key(self) -> str | None:
        """A type to pause, resume or purge, or None (the whole queue)."""
        r = self.rng.random()
        if r < 0.2:
            return None
        return self.types[0] if r < 0.6 else OTHER_TYPE

    def resumes(self) -> list[Key]:
        """The resumes that lift every pause the app ever sent (the liveness phase's)."""
        return [("resume", key) for key in sorted(self.ever_paused, key=lambda k: k or "")]

    # -- sending

    def send(self, action: str, target: str | None, live: list[str], now: int) -> Sent | None:
        """Address (action, target) to one of the `live` nodes, drawn at random, at true time
        `now` (µs; a purge's `before` is on the same scale): its line and invoke entry, the
        command counted as outstanding there. None when no node is live."""
        if not live:
            return None
        i = int(self.rng.random() * len(live))
        msg: dict[str, Any] = {"action": action}
        entry: dict[str, Any] = {"kind": "command", "phase": "invoke", "action": action}
        if action in _BY_TASK:
            msg["task_id"] = entry["task"] = target
        else:
            entry["type"] = target
            if target is None:
                msg["queue"] = True
            else:
                msg["task_type"] = target
            if action == "retry_type":
                msg["action"] = "retry"
            elif action == "purge" and self.rng.random() < 0.7:
                # A little in the past: some dead letters finished before it, some after.
                back = int(self.rng.random() * _PURGE_BACK_US)
                msg["before"] = entry["before"] = format_rfc3339(max(0, now - back))
            if action == "pause":
                self.paused.add(target)
                self.ever_paused.add(target)
            elif action == "resume":
                self.paused.discard(target)
        entry["node"] = live[i]
        self.outstanding.setdefault(live[i], {}).setdefault((action, target), deque()).append(
            now
        )
        return Sent(node=i, message=msg, entry=entry)

    # -- answers

    def answer(self, node: str, msg: dict[str, Any]) -> tuple[dict[str, Any], int] | None:
        """If `msg`, from `node`'s daemon, answers a command sent to it: the outcome entry
        (without `t`) and when that command was sent; the oldest outstanding one of its
        action and target is answered. None: it answers none."""
        reply = msg.get("action")
        task = msg.get("task_id")
        waiting = self.outstanding.get(node, {})
        if reply in _REPLIES:
            key: Key = (_REPLIES[reply], task)
        elif reply in _SWEEP_REPLIES:
            key = (_SWEEP_REPLIES[reply], msg.get("task_type"))
        elif reply == "paused":
            key = ("pause" if msg.get("paused") else "resume", msg.get("task_type"))
        elif reply == "error" and isinstance(task, str):
            key = ("cancel", task)
            if not waiting.get(key):
                key = ("retry", task)
        else:
            return None
        if not waiting.get(key):
            return None
        sent = waiting[key].popleft()
        entry: dict[str, Any] = {"kind": "command", "phase": "fail" if reply == "error" else "ok"}
        entry["action"], target = key
        entry["task" if key[0] in _BY_TASK else "type"] = target
        entry["node"] = node
        entry["reply"] = msg
        return entry, sent
