"""A simulated process (`Proc`), and the kinds of event the world's queue holds.

A process is a real `Node` plus what its shell and its SDK client hold: the state it is in
(running, paused, down), what waits for it while it is paused, its wake-up, what it believes it
owns, its outstanding enqueues and held lines, and its I/O lanes. The world, its shell, its
faults and its workload all act on processes; this module is the vocabulary they share, so that
none of them imports another to learn it. It holds data only: what a process does is the world's
(`sim.world`) and its shell's (`sim.shell`) business.

An event in the queue is `(true time, sequence, kind, a, b, c)`. The kinds are small ints (a
tuple compare never reaches them: the sequence number is unique); for most, `a` is the
process's index and `b` its incarnation, so that an event for a process that has since crashed
and restarted is dropped.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from sim.clock import NodeClock
from snerd.core.node import Node

__all__ = [
    "APPEND_DONE",
    "APPEND_ISSUE",
    "BELIEF",
    "CARRY_OUT",
    "CHECK",
    "COMMAND",
    "DELIVER",
    "FAULT",
    "FLUSH_LINES",
    "HANDLER_DONE",
    "MEMBERSHIP_DONE",
    "PHASE",
    "PRODUCE",
    "RESTART",
    "RESUME",
    "SCHEDULES",
    "WAKE",
    "Proc",
]

DELIVER = 0  # (proc index, incarnation, core event)
CARRY_OUT = 1  # (proc index, incarnation, effects): the shell carries them out
WAKE = 2  # (proc index, incarnation, generation)
APPEND_DONE = 3  # (proc index, incarnation, shell.Append): its fsync returns
HANDLER_DONE = 4  # (proc index, incarnation, (task, attempt, ok))
PRODUCE = 5  # a producer enqueues
FAULT = 6  # (fault name, None, None)
RESUME = 7  # (proc index, incarnation, None)
RESTART = 8  # (proc index, None, None)
BELIEF = 9  # (proc index, incarnation, None): a lease deadline passed
PHASE = 10  # the safety phase ends
CHECK = 11  # the liveness phase looks at its progress
APPEND_ISSUE = 12  # (proc index, incarnation, (effect, built, lines, done_at, queued)): the writer thread writes
FLUSH_LINES = 13  # (proc index, incarnation, None): the SDK client writes its held lines
MEMBERSHIP_DONE = 14  # (proc index, incarnation, (effect, fail_before, fail_after)): a write lands
SCHEDULES = 15  # (what, None, None): the app unschedules ("late": one schedule; "end": every one)
COMMAND = 16  # (what, None, None): the app sends a job-control command ("next"; "end": resumes)


class Proc:
    """A process: the node and what its shell and SDK client hold."""

    __slots__ = (
        "beliefs",
        "clock",
        "inc",
        "index",
        "lanes",
        "log_batch",
        "name",
        "node",
        "outstanding",
        "paused_until",
        "pending_lines",
        "pending_results",
        "pid",
        "state",
        "unreachable_until",
        "waiting",
        "wake_at",
        "wake_gen",
        "wake_mono",
        "wake_true",
        "watched_deadline",
    )

    def __init__(self, index: int, inc: int, node: Node, clock: NodeClock, name: str) -> None:
        self.index = index
        self.inc = inc
        self.node = node
        self.clock = clock
        #: The node id it was started with (`NodeConfig.node_id`).
        self.name = name
        self.pid = f"host{index}#{inc}"
        #: "running", "paused", "down" (crashed or exited).
        self.state = "running"
        self.paused_until = 0
        #: membership.json cannot be reached by this process until then (an outage).
        self.unreachable_until = 0
        #: Events and effect batches that arrived while paused, in order: (kind, payload).
        self.waiting: deque[tuple[int, Any]] = deque()
        self.wake_gen = 0
        #: When the pending wake-up fires (true time), and the lease deadline being watched.
        self.wake_at = -1
        #: The monotonic reading last asked to be woken at, and its true time (the host's
        #: monotonic clock is never re-anchored while this process lives).
        self.wake_mono = -1
        self.wake_true = -1
        self.watched_deadline: int | None = None
        self.beliefs: list[int] = []
        #: Enqueues sent and not answered: task id -> None.
        self.outstanding: dict[str, None] = {}
        #: Lines the SDK client holds to write together (`Settings.line_burst_us`), and how
        #: many of them are results.
        self.pending_lines: list[bytes] = []
        self.pending_results = 0
        #: When each of this process's I/O lanes is next free: calls on one lane complete in
        #: order ("log": the group-commit writer thread; "meta": membership, locks, reads).
        self.lanes = {"log": 0, "meta": 0}
        #: The writer thread's latest batch: (when it starts, when its fsync returns).
        self.log_batch = (-1, -1)
