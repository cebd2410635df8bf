"""One simulated world: real `snerd.core` nodes, virtual time, a shared filesystem and faults.

Theory of operation
-------------------
True time is an integer number of microseconds that only the world sees. Each host has a
`NodeClock` (offset, drift, wall steps); a process reads its host's clocks and nothing else, so
a node never learns true time. Everything happens through one event queue of
`(time, sequence, kind, a, b, c)` entries (`sim.process` lists the kinds): the sequence number
breaks ties in the order events were scheduled, so one seed always pops them in one order.

The run loop pops the earliest entry, sets true time to it and carries it out. The commonest
kinds are carried out in the loop itself: a core event handed to a node (`deliver`), a batch of
effects handed to the shell (`Shell.carry_out`), a node's wake-up, an append's fsync returning.
`_STEPS` maps every other kind to the one method that carries it out. An event for a process
names its incarnation, and is dropped once that process is down (it restarted as another).

`deliver` is what the daemon's shell does with one event: `Node.handle`, then the effects are
queued for the shell a few microseconds later (so a pause can fall between a decision and its
effect, as a SIGSTOP can), then `Node.wake_in` (the wake-up it asks for is queued, at the true
time its host's monotonic clock reaches the deadline), then what the node believes it owns is
recorded. Every outcome of an effect comes back to the node as the event the real shell would
send (`sim.shell`).

A process (`sim.process.Proc`) is a `Node` (the real core object, never a copy or a model of
it) plus what its shell holds: its pending filesystem operations, the handlers running its
attempts, and its SDK client's outstanding enqueues. Processes crash (their pending appends are
lost or torn, their locks released, their outstanding enqueues become `info`), restart as a new
process with a new node id on the same host clocks (CLOCK_MONOTONIC counts from the host's
boot, not the process's start), and pause (nothing of theirs runs; what arrives for them waits,
in order, and runs when they resume).

The world composes its parts, each owning its state and its draws: the shell (`sim.shell`),
the faults (`sim.faults`) and the workload (`sim.workload`); they act through the world's
`at`, `record`, `deliver` and its process model (`down`, `pause`). The run has a *safety
phase* with faults and a workload, then a *liveness phase*: faults stop, paused processes
resume, crashed ones restart, producers stop, and every acknowledged task must finish and
ownership must settle into an even spread within a bound (`_judge_liveness`, every second).

Everything the run does is recorded in a history (in the format `sim.check.history` defines),
which the checkers (`sim.check`) judge; its digest hashes it so two runs of one seed can be
compared byte for byte. The world checks a few things the history cannot show (a node's record
locations, its proofs of death, its cap on shards); what it reads of a node for them beyond its
public API is read through `sim.node_view`.

Determinism: one `random.Random(seed)` derives a child generator per subsystem, draws use only
`random()` (whose sequence Python promises across versions), events tie-break on a sequence
number, and nothing iterates a set. `python -m sim` pins `PYTHONHASHSEED` because the core may
iterate sets of strings.
"""

from __future__ import annotations

import gc
import random
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from heapq import heappop, heappush
from typing import Any

import orjson
import xxhash

from sim import check
from sim.clock import NodeClock
from sim.commands import Commands
from sim.faults import Faults
from sim.fs import SimFS
from sim.node_view import found_dead, holds_shards, lease_deadline, task_locations
from sim.process import (
    APPEND_DONE,
    APPEND_ISSUE,
    BELIEF,
    CARRY_OUT,
    CHECK,
    COMMAND,
    DELIVER,
    FAULT,
    FLUSH_LINES,
    HANDLER_DONE,
    MEMBERSHIP_DONE,
    PHASE,
    PRODUCE,
    RESTART,
    RESUME,
    SCHEDULES,
    WAKE,
    Proc,
)
from sim.settings import SECOND, WALL_ORIGIN, Settings, uniform
from sim.shell import Shell
from sim.workload import TASK_TYPE, Workload
from snerd.core import events as ev
from snerd.core.node import Node, NodeConfig
from snerd.core.ownership import OwnershipConfig
from snerd.core.records import CorruptRecord, decode_line_at, scan
from snerd.core.schema import DISPATCH_TASK, OUTCOME_COMPLETED, SNERD_RESULT, TASK_ID
from snerd.core.shardlog import ShardFold, tombstone_outcome

#: The simulator checks a node's `invariants()` after every this many events handed to the
#: nodes: each check walks the node's tasks, so checking after every event would make a long
#: run quadratic in its queue (at 64, seeds 0..40 take about 10 % longer).
INVARIANTS_EVERY = 64

__all__ = ["Outcome", "World", "run"]

_dumps = orjson.dumps
_SORT_KEYS = orjson.OPT_SORT_KEYS
_COMPACTED = ev.Compacted
_LOG_RECORDS_READ = ev.LogRecordsRead
_MEMBERSHIP_WRITTEN = ev.MembershipWritten
#: The event of every wake-up (frozen and empty: one instance serves them all).
_TICK = ev.Tick()
#: What every process's SDK client says first: it runs a handler of the workload's task type.
_REGISTER = orjson.dumps({"action": "register", "task_type": TASK_TYPE})


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """What a run produced."""

    settings: Settings
    report: check.Report
    #: Violations the world itself found (liveness, a wrong payload location, ...).
    world_violations: tuple[str, ...]
    digest: str
    events: int
    node_events: int
    true_us: int
    history_len: int
    counters: dict[str, int]

    @property
    def ok(self) -> bool:
        return self.report.ok and not self.world_violations


class World:
    """One run. `World(settings).run()` returns its `Outcome`."""

    def __init__(self, settings: Settings) -> None:
        self.s = settings
        root = random.Random(settings.seed ^ 0x5EED)
        rng_fault = random.Random(root.getrandbits(64))
        rng_io = random.Random(root.getrandbits(64))
        rng_work = random.Random(root.getrandbits(64))
        self.rng_clock = random.Random(root.getrandbits(64))
        self.rng_crash = random.Random(root.getrandbits(64))
        # (Added later: derived after the others, which stay as they were for each seed.)
        rng_sched = random.Random(root.getrandbits(64))
        rng_commands = random.Random(root.getrandbits(64))
        self.fs = SimFS(lock_mode="nfsv3" if settings.fs_mode == "nfsv3" else "posix")
        self.t = 0
        self.seq = 0
        self.queue: list[tuple[int, int, int, Any, Any, Any]] = []
        self.history: list[dict[str, Any]] = []
        self._digest = xxhash.xxh3_128()
        self._digest_update = self._digest.update
        self.procs: list[Proc] = []
        self.clocks: list[NodeClock] = []
        self.events = 0
        #: Events handed to a node's core (`Node.handle` calls).
        self.node_events = 0
        self.liveness = False
        self.finished = False
        self.world_violations: list[str] = []
        self.counters: dict[str, int] = {
            "crashes": 0,
            "restarts": 0,
            "pauses": 0,
            "clock_steps": 0,
            "locks_lost": 0,
            "disk_full": 0,
            "enqueues": 0,
            #: Of `enqueues`, those sent in `enqueue_batch` lines.
            "batched": 0,
            "executions": 0,
            "node_errors": 0,
            "inbox_reads": 0,
            #: Reads of the queue's files for watched parents (`fx.ScanQueue`).
            "queue_scans": 0,
            "reader_fsyncs": 0,
            #: Lines delivered two or more at once (`Settings.line_burst_us`), and how many
            #: of them were results.
            "burst_lines": 0,
            "burst_results": 0,
            #: Owners found gone by a shard lock free under their claim (`Settings.lock_probe`),
            #: counted when the claim taking the shard over lands (no lease lapse waited for).
            "owners_found_gone": 0,
            #: Lines the app sent to declare or remove a schedule (`Settings.schedules`).
            "schedule_lines": 0,
        }
        self.watch = check.LivenessWatch()
        self._ownership = OwnershipConfig(
            ttl_us=settings.ttl_us,
            skew_margin_us=0 if settings.unsafe_no_margin else settings.margin_us,
            max_shards=None if settings.unsafe_no_cap else settings.max_shards,
            unsafe_wall_clock_only=settings.unsafe_wall_clock_only,
        )
        self.shell = Shell(self, self.fs, rng_io)
        self.faults = Faults(self, rng_fault)
        self.workload = Workload(self, rng_work, rng_sched)
        self.commands = Commands(self, rng_commands, TASK_TYPE)
        #: Where a pause may fall between deciding an append and making it: the faults' hook.
        self._stop_between = self.faults.stop_between if settings.pause_rate else None

    # ------------------------------------------------------------------ plumbing

    def at(self, t: int, kind: int, a: Any = None, b: Any = None, c: Any = None) -> None:
        """Schedule an event of `kind` at true time `t`."""
        self.seq += 1
        heappush(self.queue, (t, self.seq, kind, a, b, c))

    def record(self, entry: dict[str, Any]) -> None:
        """Append `entry` to the history, at the current true time."""
        entry["t"] = self.t
        self.history.append(entry)
        self._digest_update(_dumps(entry, option=_SORT_KEYS))

    def check_node(self, proc: Proc) -> None:
        """`Node.invariants()` on `proc`'s node: a broken one is a world violation (the
        history cannot show a node's inner state)."""
        try:
            proc.node.invariants()
        except AssertionError as exc:
            if len(self.world_violations) < 10:
                self.violation(f"t={self.t}: {proc.name}: node invariant broken: {exc}")

    def violation(self, message: str) -> None:
        """Something the world itself found wrong (the history cannot show it)."""
        self.world_violations.append(message)

    # ------------------------------------------------------------------ processes

    def node_history_limit(self) -> int:
        """The finished tasks each node keeps per shard (`NodeConfig.history_limit`)."""
        return self.s.history_limit or (10_000 if self.s.deps_prob else 50)

    def _node_config(self, index: int, inc: int) -> NodeConfig:
        return NodeConfig(
            node_id=f"n{index}@pid-{inc}",
            new_queue_shards=self.s.shards,
            max_workers=4,
            drain_timeout_us=self.s.ttl_us,
            ownership=self._ownership,
            retry_io_us=max(100_000, self.s.ttl_us // 10),
            compact_min_bytes=64 * 1024,
            compact_dead_ratio=1,  # (often: compaction meets more of the faults)
            history_limit=self.node_history_limit(),
            fence=not self.s.unsafe_no_fence,
            inbox_poll_us=self.s.inbox_poll_us,
            inbox_idle_poll_us=self.s.inbox_idle_poll_us,
            inbox_read_bytes=self.s.inbox_read_bytes,
            inbox_segment_bytes=self.s.inbox_segment_bytes,
            lock_proves_liveness=self.s.probes_locks,
            unknown_parent_wait_us=self.s.unknown_parent_wait_us,
            unsafe_absent_parents_done=self.s.unsafe_absent_parents_done,
            unsafe_fire_unmarked=self.s.unsafe_fire_unmarked,
            unsafe_wrong_result=self.s.unsafe_wrong_result,
            unsafe_ignore_cancel=self.s.unsafe_ignore_cancel,
            unsafe_ignore_pause=self.s.unsafe_ignore_pause,
            unsafe_purge_all=self.s.unsafe_purge_all,
            unsafe_batch_ack_early=self.s.unsafe_batch_ack_early,
            unsafe_retry_final=self.s.unsafe_retry_final,
            unsafe_ignore_task_backoff=self.s.unsafe_ignore_task_backoff,
            unsafe_retry_skips_oldest=self.s.unsafe_retry_skips_oldest,
            # (The daemon's 5 s; 0, upstream's ack at the inbox write, for the control.)
            dedupe_wait_us=0 if self.s.unsafe_dedupe_ack_at_write else 5 * SECOND,
        )

    def _start(self, index: int, inc: int) -> None:
        config = self._node_config(index, inc)
        proc = Proc(index, inc, Node(config), self.clocks[index], config.node_id)
        if index < len(self.procs):
            self.procs[index] = proc
        else:
            self.procs.append(proc)
        self.deliver(proc, ev.Started())
        self.deliver(proc, ev.LineReceived(line=_REGISTER))
        self.commands.register(proc)
        self.workload.declare_schedules(proc)

    def _alive(self, proc: Proc, inc: Any) -> bool:
        return proc.inc == inc and proc.state != "down"

    def deliver(self, proc: Proc, event: ev.Event) -> None:
        """Hand `event` to the node now, as the shell does: `handle`, then `wake_in` (the
        wake-up it asks for is queued), then what the node believes it owns is recorded.

        The world's hottest path (every core event): written out rather than split in
        helpers, with the queue pushes of `at` inline."""
        state = proc.state
        if state != "running":
            if state == "paused":
                proc.waiting.append((DELIVER, event))
            return
        self.node_events += 1
        t = self.t
        clock = proc.clock
        node = proc.node
        now = clock.now(t)
        effects = node.handle(event, now)
        if self.node_events % INVARIANTS_EVERY == 0:
            self.check_node(proc)
        queue = self.queue
        if effects:
            stop_between = self._stop_between
            if stop_between is not None and not self.liveness:
                stop_between(proc, effects)
            # The shell carries them out a moment later (a pause can fall in between).
            self.seq += 1
            heappush(queue, (t + 20, self.seq, CARRY_OUT, proc.index, proc.inc, effects))
        etype = type(event)
        if etype is _COMPACTED or etype is _LOG_RECORDS_READ:
            self._check_locations(proc, event.shard)  # type: ignore[attr-defined]
        elif etype is _MEMBERSHIP_WRITTEN and found_dead(node):
            self._check_proven_dead(proc, now.mono)
        # What the shell does after every `handle`: ask when to wake the node.
        wait = node.wake_in(now)
        mono = now.mono
        if wait is not None:
            target = mono + wait
            if target == proc.wake_mono:  # the same deadline as last time (half the calls)
                at = proc.wake_true
            else:
                at = proc.wake_true = clock.true_at_mono(target)
                proc.wake_mono = target
            if at <= t:
                at = t + 1
            if at != proc.wake_at:
                proc.wake_gen = gen = proc.wake_gen + 1
                proc.wake_at = at
                self.seq += 1
                heappush(queue, (at, self.seq, WAKE, proc.index, proc.inc, gen))
        # Beliefs (`believed` and `_update_beliefs`, for a process that is not down).
        deadline = lease_deadline(node)
        if deadline is not None:
            if deadline != proc.watched_deadline:
                proc.watched_deadline = deadline
                self.seq += 1
                heappush(
                    queue,
                    (clock.true_at_mono(deadline), self.seq, BELIEF, proc.index, proc.inc, None),
                )
            if mono >= deadline:
                if proc.beliefs:
                    self._set_beliefs(proc, [])
                return
        if holds_shards(node):
            believed = node.owned_shards
            if believed != proc.beliefs:
                self._set_beliefs(proc, believed)
        elif proc.beliefs:
            self._set_beliefs(proc, [])

    def _check_locations(self, proc: Proc, shard: int) -> None:
        """Every location the node holds for a task of `shard` must point at that task's
        record (payloads are read from there): checked after each load and compaction."""
        for task_id, what, loc in task_locations(proc.node, shard):
            raw = self.fs.read_range(loc.shard, loc.offset, loc.length)
            try:
                got = decode_line_at(raw, f"shard {loc.shard}:{loc.offset}+{loc.length}")
            except CorruptRecord as exc:
                got = {"error": str(exc)}
            key = DISPATCH_TASK if what == "dispatch record" else TASK_ID
            if got.get(key) != task_id:
                self.violation(
                    f"t={self.t}: {proc.name} holds shard-{shard}@{loc.offset}+{loc.length} "
                    f"as the {what} of {task_id}, but it reads {str(got)[:120]}"
                )

    def _check_proven_dead(self, proc: Proc, mono: int) -> None:
        """A node takes another for dead (its shard lock free under its claim) only when that
        process is gone, or owns nothing under a lease (its lease ran out on its own clock: it
        stopped acting and gave up its locks). Never while it lives and owns shards: that is a
        false proof (a shard handed over, say, whose lock went before its claim), and it drops
        a working node from the fair shares and its heartbeat from membership.json."""
        for name, since in found_dead(proc.node).items():
            if since != mono:
                continue  # proven earlier (and checked then)
            self.counters["owners_found_gone"] += 1
            index = name.partition("@pid-")[0]
            other = self.procs[int(index.removeprefix("n"))]
            if other.name != name or other.state == "down":
                continue  # that incarnation is gone
            if self.believed(other):
                self.violation(
                    f"t={self.t}: {proc.name} takes {name} for dead (a shard lock free under "
                    "its claim) while it lives and owns shards under its lease"
                )

    def believed(self, proc: Proc) -> list[int]:
        """The shards `proc` believes it owns now: none once down or past its lease."""
        if proc.state == "down":
            return []
        deadline = lease_deadline(proc.node)
        if deadline is not None and proc.clock.mono(self.t) >= deadline:
            return []
        return proc.node.owned_shards

    def _update_beliefs(self, proc: Proc) -> None:
        now = self.believed(proc)
        if now != proc.beliefs:
            self._set_beliefs(proc, now)

    def check_cap(self, proc: Proc, what: str, shards: list[int]) -> None:
        """A node never holds more shards than its cap (SNERD_MAX_SHARDS), neither in what it
        believes it owns nor in the claims membership.json gives it: it must not claim a
        shard only to hand it back."""
        cap = self.s.max_shards
        if cap is not None and len(shards) > cap:
            self.violation(
                f"t={self.t}: {proc.name} {what} {len(shards)} shards {shards}, above its cap "
                f"of {cap} (SNERD_MAX_SHARDS)"
            )

    def _set_beliefs(self, proc: Proc, now: list[int]) -> None:
        """Record what changed from `proc.beliefs` to `now`."""
        self.check_cap(proc, "believes it owns", now)
        for shard in proc.beliefs:
            if shard not in now:
                self.record({"kind": "belief", "node": proc.name, "shard": shard, "on": False})
        for shard in now:
            if shard not in proc.beliefs:
                self.record({"kind": "belief", "node": proc.name, "shard": shard, "on": True})
        proc.beliefs = now

    def down(self, proc: Proc, *, crashed: bool) -> None:
        """`proc` crashes (`crashed`) or exits; it restarts after a downtime."""
        if proc.state == "down":
            return
        if crashed:
            self.fs.crash(proc.pid, self.rng_crash, self.s.torn_prob)
            self.shell.crashed(proc)
            self.counters["crashes"] += 1
            self.record({"kind": "crash", "node": proc.name})
        else:
            self.fs.release_all(proc.pid)
            self.record({"kind": "exit", "node": proc.name})
        proc.state = "down"
        self._update_beliefs(proc)
        for task in proc.outstanding:
            self.record({"kind": "enqueue", "phase": "info", "task": task, "node": proc.name})
        proc.outstanding.clear()
        proc.waiting.clear()
        self.at(self.t + self.faults.downtime(), RESTART, proc.index)

    def pause(self, proc: Proc, length: int) -> None:
        """`proc` stops for `length` µs (SIGSTOP): nothing of its runs until it resumes."""
        if proc.state != "running":
            return
        proc.state = "paused"
        proc.paused_until = self.t + length
        self.counters["pauses"] += 1
        self.record({"kind": "pause", "node": proc.name, "us": length})
        self.at(self.t + length, RESUME, proc.index, proc.inc)

    def _resume(self, proc: Proc) -> None:
        """`proc` runs again: what arrived while it was paused runs now, in order."""
        if proc.state != "paused":
            return
        proc.state = "running"
        self.record({"kind": "resume", "node": proc.name})
        waiting, proc.waiting = proc.waiting, deque()
        shell = self.shell
        for kind, item in waiting:
            if proc.state != "running":
                if proc.state == "paused":
                    proc.waiting.append((kind, item))
                continue
            if kind == APPEND_ISSUE:
                effect, built, lines, done_at, queued = item
                shell.issue_append(proc, effect, built, lines, max(done_at, self.t + 100), queued)
            elif kind == MEMBERSHIP_DONE:
                shell.membership_done(proc, *item)
            elif kind == DELIVER:
                self.deliver(proc, item)
            else:
                shell.carry_out(proc, item)
        self._update_beliefs(proc)

    # ------------------------------------------------------------------ the run

    def run(self) -> Outcome:
        # A run allocates millions of objects and leaves almost no reference cycles behind:
        # the cyclic collector, triggered by allocations, would find next to nothing (and it
        # cannot change what the run does). It is off while the world runs.
        enabled = gc.isenabled()
        gc.disable()
        try:
            return self._run()
        finally:
            if enabled:
                gc.enable()

    def _run(self) -> Outcome:
        self._begin()
        s = self.s
        end = s.safety_us + s.liveness_us
        # The event loop: the commonest kinds are carried out here, the rest by `_STEPS`.
        queue, procs, steps, tick = self.queue, self.procs, s.steps, _TICK
        carry_out, append_done, deliver = (
            self.shell.carry_out,
            self.shell.append_done,
            self.deliver,
        )
        table = _STEPS
        events = 0
        while queue:
            t, _, kind, a, b, c = heappop(queue)
            if t > end:
                break
            self.t = t
            events += 1
            if kind == CARRY_OUT:
                proc = procs[a]
                if proc.inc == b and proc.state != "down":
                    carry_out(proc, c)
            elif kind == WAKE:
                proc = procs[a]
                if proc.inc == b and proc.state != "down" and c == proc.wake_gen:
                    proc.wake_at = -1
                    deliver(proc, tick)
            elif kind == DELIVER:
                proc = procs[a]
                if proc.inc == b and proc.state != "down":
                    deliver(proc, c)
            elif kind == APPEND_DONE:
                proc = procs[a]
                if proc.inc == b and proc.state != "down":
                    append_done(proc, c)
            else:
                table[kind](self, a, b, c)
                if self.finished:
                    break
            if events >= steps and not self.liveness:
                self.events = events
                self._start_liveness()
        self.events = events
        if not self.finished:
            self._judge_liveness(final=True)
        self._record_stored_results()
        self.record({"kind": "end"})
        return Outcome(
            settings=s,
            report=self.watch.check(self.history),
            world_violations=tuple(self.world_violations),
            digest=self._digest.hexdigest(),
            events=self.events,
            node_events=self.node_events,
            true_us=self.t,
            history_len=len(self.history),
            counters={**self.counters, **asdict(self.fs.stats())},
        )

    def _record_stored_results(self) -> None:
        """Every completed task's stored result, as the final logs hold it, read back through
        the core's fold (`stored_result` entries, judged by `sim.check.results`)."""
        for shard in self.fs.shards():
            data = self.fs.read_log(shard)
            fold = ShardFold(keep_payloads=False, fence=not self.s.unsafe_no_fence)
            fold.add_all(scan(data, at_eof=True).records)
            for task_id, record in fold.finished.items():
                if task_id in fold.live or tombstone_outcome(record.fields) != OUTCOME_COMPLETED:
                    continue
                entry: dict[str, Any] = {"kind": "stored_result", "task": task_id, "shard": shard}
                if record.fields.get(SNERD_RESULT) is not None:
                    entry["result"] = record.fields[SNERD_RESULT]
                self.record(entry)

    def _begin(self) -> None:
        """The history's `params`, the hosts' clocks, every process, and the first events of
        the workload, the faults and the phases."""
        s = self.s
        self.record(
            {
                "kind": "params",
                "ttl_us": s.ttl_us,
                "margin_us": s.margin_us,
                "fence": not s.unsafe_no_fence,
                "assumptions_hold": s.assumptions_hold,
                "window_slack_us": s.window_slack_us,
            }
        )
        rng = self.rng_clock
        for _ in range(s.nodes):
            offset = uniform(rng, -s.offset_max_us, s.offset_max_us)
            drift = uniform(rng, -s.drift_max_ppm, s.drift_max_ppm)
            origin = uniform(rng, SECOND, 1000 * SECOND)
            self.clocks.append(
                NodeClock(t=0, offset_us=WALL_ORIGIN + offset, drift_ppm=drift, mono_origin=origin)
            )
        for index in range(s.nodes):
            self._start(index, 0)
        self.workload.start()
        self.commands.start()
        self.faults.arm()
        self.at(s.safety_us, PHASE)

    # The kinds the run loop leaves to a method of their own, one each (`_STEPS`).

    def _on_flush_lines(self, a: Any, b: Any, c: Any) -> None:
        proc = self.procs[a]
        if self._alive(proc, b):
            self.workload.flush_lines(proc)

    def _on_deliver(self, a: Any, b: Any, c: Any) -> None:
        proc = self.procs[a]
        if self._alive(proc, b):
            self.deliver(proc, c)

    def _on_membership_done(self, a: Any, b: Any, c: Any) -> None:
        proc = self.procs[a]
        if not self._alive(proc, b):
            return
        if proc.state == "paused":
            proc.waiting.append((MEMBERSHIP_DONE, c))  # resolved on resume
            return
        self.shell.membership_done(proc, *c)

    def _on_carry_out(self, a: Any, b: Any, c: Any) -> None:
        proc = self.procs[a]
        if self._alive(proc, b):
            self.shell.carry_out(proc, c)

    def _on_wake(self, a: Any, b: Any, c: Any) -> None:
        proc = self.procs[a]
        if self._alive(proc, b) and c == proc.wake_gen:
            proc.wake_at = -1
            self.deliver(proc, _TICK)

    def _on_append_done(self, a: Any, b: Any, c: Any) -> None:
        proc = self.procs[a]
        if self._alive(proc, b):
            self.shell.append_done(proc, c)

    def _on_append_issue(self, a: Any, b: Any, c: Any) -> None:
        proc = self.procs[a]
        if not self._alive(proc, b):
            return
        if proc.state == "paused":
            proc.waiting.append((APPEND_ISSUE, c))
        else:
            self.shell.issue_append(proc, *c)

    def _on_handler_done(self, a: Any, b: Any, c: Any) -> None:
        proc = self.procs[a]
        if self._alive(proc, b):
            self.workload.handler_done(proc, *c)

    def _on_produce(self, a: Any, b: Any, c: Any) -> None:
        self.workload.produce()

    def _on_fault(self, a: Any, b: Any, c: Any) -> None:
        self.faults.fire(a)

    def _on_resume(self, a: Any, b: Any, c: Any) -> None:
        proc = self.procs[a]
        if proc.inc == b:
            self._resume(proc)

    def _on_restart(self, a: Any, b: Any, c: Any) -> None:
        proc = self.procs[a]
        if proc.state == "down":
            self.counters["restarts"] += 1
            self.record({"kind": "restart", "node": f"n{a}@pid-{proc.inc + 1}"})
            self._start(a, proc.inc + 1)

    def _on_belief(self, a: Any, b: Any, c: Any) -> None:
        proc = self.procs[a]
        if proc.inc == b:
            self._update_beliefs(proc)

    def _on_phase(self, a: Any, b: Any, c: Any) -> None:
        if not self.liveness:
            self._start_liveness()

    def _on_schedules(self, a: Any, b: Any, c: Any) -> None:
        self.workload.unschedule(a)

    def _on_command(self, a: Any, b: Any, c: Any) -> None:
        self.commands.fire(a)

    def _on_check(self, a: Any, b: Any, c: Any) -> None:
        self._judge_liveness(final=False)

    # ------------------------------------------------------------------ liveness

    def _start_liveness(self) -> None:
        """Faults off, everything healed; from here every acked task must finish."""
        self.liveness = True
        self.fs.disk_full = False
        self.record({"kind": "phase", "name": "liveness"})
        for proc in self.procs:
            if proc.state == "paused":
                self._resume(proc)
        # NTP brings stepped wall clocks back near true time.
        for clock in self.clocks:
            error = clock.offset_at(self.t) - WALL_ORIGIN
            if abs(error) > self.s.offset_max_us:
                clock.step(self.t, -error)
        self.liveness_started = self.t
        self.workload.end_schedules()
        self.commands.end()
        self._progress: tuple[int, bool, int] = (-1, False, self.t)
        self.at(self.t + SECOND, CHECK)

    def _settled(self) -> bool:
        """Every shard believed by exactly one running process, counts within one."""
        running = [p for p in self.procs if p.state == "running"]
        if len(running) < len(self.procs):
            return False
        owners: dict[int, int] = {}
        for p in running:
            for shard in self.believed(p):
                owners[shard] = owners.get(shard, 0) + 1
        if sorted(owners) != list(range(self.s.shards)) or any(v != 1 for v in owners.values()):
            return False
        counts = [len(self.believed(p)) for p in running]
        return max(counts) - min(counts) <= 1

    def _judge_liveness(self, *, final: bool) -> None:
        left = self.watch.any_unfinished(self.history) or self.commands.waiting()
        settled = self._settled()
        if not left and settled:
            self.finished = True
            return
        records = self.fs.appends_completed
        if records != self._progress[0] or (not left and settled != self._progress[1]):
            self._progress = (records, settled, self.t)
        max_wall_error = self.faults.max_wall_error
        stalled = self.t - self._progress[2] >= self.s.stall_us + max_wall_error
        if final or stalled:
            self.finished = True
            how = (
                f"nothing was written for {(self.s.stall_us + max_wall_error) // SECOND} s"
                if stalled
                else f"{(self.t - self.liveness_started) // SECOND} s after the faults stopped"
            )
            if left:
                tasks = [*self.watch.unfinished(self.history), *self.commands.awaiting]
                self.violation(
                    f"liveness: {len(tasks)} acked (or retried) task(s) unfinished and {how}, e.g. "
                    f"{', '.join(tasks[:5])}"
                )
            if not settled:
                spread = {p.name: self.believed(p) for p in self.procs}
                self.violation(f"liveness: ownership did not settle into an even spread: {spread}")
            return
        self.at(self.t + SECOND, CHECK)


#: Every event kind the run loop does not carry out itself, and the method that does.
_STEPS: dict[int, Callable[[World, Any, Any, Any], None]] = {
    DELIVER: World._on_deliver,
    CARRY_OUT: World._on_carry_out,
    WAKE: World._on_wake,
    APPEND_DONE: World._on_append_done,
    HANDLER_DONE: World._on_handler_done,
    PRODUCE: World._on_produce,
    FAULT: World._on_fault,
    RESUME: World._on_resume,
    RESTART: World._on_restart,
    BELIEF: World._on_belief,
    PHASE: World._on_phase,
    CHECK: World._on_check,
    APPEND_ISSUE: World._on_append_issue,
    FLUSH_LINES: World._on_flush_lines,
    MEMBERSHIP_DONE: World._on_membership_done,
    SCHEDULES: World._on_schedules,
    COMMAND: World._on_command,
}


def run(settings: Settings) -> Outcome:
    """Run one world."""
    return World(settings).run()
