"""One simulated world: real `snerd.core` nodes, virtual time, a shared filesystem and faults.

Theory of operation
-------------------
True time is an integer number of microseconds that only the world sees. Each host has a
`NodeClock` (offset, drift, wall steps); a process reads its host's clocks and nothing else, so
a node never learns true time. Everything happens through one event queue ordered by
`(time, sequence)`: a node's effects are carried out by its "shell" a few microseconds after
the node decided them (so a pause can fall between a decision and its effect, as a SIGSTOP
can), and every outcome comes back to the node as the event the real shell would send.

A process is a `Node` (the real core object, never a copy or a model of it) plus what its shell
holds: its pending filesystem operations, the handlers running its attempts, and its SDK
client's outstanding enqueues. Processes crash (their pending appends are lost or torn, their
locks released, their outstanding enqueues become `info`), restart as a new process with a new
node id on the same host clocks (CLOCK_MONOTONIC counts from the host's boot, not the
process's start), and pause (nothing of theirs runs; what arrives for them waits).

Faults are drawn per run (swarm testing: `Settings.draw` turns whole fault kinds off in some
runs). The run has a *safety phase* with faults and a workload, then a *liveness phase*: faults
stop, paused processes resume, crashed ones restart, producers stop, and every acknowledged task
must finish and ownership must settle into an even spread within a bound.

Everything the run does is recorded in a history (`sim.checker`'s format), which the checkers
judge; `trace_digest` hashes it so two runs of one seed can be compared byte for byte.

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
from dataclasses import asdict, dataclass, replace
from heapq import heappop, heappush
from itertools import accumulate
from typing import Any

import orjson
import xxhash

from sim import checker
from sim.clock import NodeClock
from sim.fs import InboxKey, SimFS
from sim.settings import SECOND, WALL_ORIGIN, Settings, exp, uniform
from snerd.core import effects as fx
from snerd.core import events as ev
from snerd.core.node import Node, NodeConfig, route_shard
from snerd.core.ownership import LockText, OwnershipConfig, owned_by
from snerd.core.records import (
    CorruptRecord,
    decode_line_at,
    encode_record,
    merge_base,
    scan,
    scan_tail,
)
from snerd.core.slots import slot_constructor
from snerd.core.timefmt import format_rfc3339

__all__ = ["Outcome", "World", "run"]

TASK_TYPE = "t"

# Event kinds, in the queue as small ints (a tuple compare never reaches them: seq is unique).
_DELIVER = 0  # (proc index, incarnation, core event)
_EFFECTS = 1  # (proc index, incarnation, effects)
_WAKE = 2  # (proc index, incarnation, generation)
_APPEND_DONE = 3  # (proc index, incarnation, _Append)
_HANDLER_DONE = 4  # (proc index, incarnation, (task, attempt, ok))
_PRODUCE = 5
_FAULT = 6  # (fault name, None, None)
_RESUME = 7  # (proc index, incarnation, None)
_RESTART = 8  # (proc index, None, None)
_BELIEF = 9  # (proc index, incarnation, None): a lease deadline passed
_PHASE = 10
_CHECK = 11
_APPEND_ISSUE = 12  # (proc index, incarnation, (effect, built, lines, done_at, queued)): the writer thread writes
_FLUSH_LINES = 13  # (proc index, incarnation, None): the SDK client writes its held lines

_dumps = orjson.dumps
_SORT_KEYS = orjson.OPT_SORT_KEYS
_APPEND = fx.Append
_APPEND_INBOX = fx.AppendInbox
_COMPACTED = ev.Compacted
_LOG_RECORDS_READ = ev.LogRecordsRead
_MEMBERSHIP_WRITTEN = ev.MembershipWritten
#: The event of every wake-up (frozen and empty: one instance serves them all).
_TICK = ev.Tick()
#: Constructors of the commonest events, without the frozen dataclasses' `__init__`.
_line_received = slot_constructor(ev.LineReceived, "line")
_inbox_read = slot_constructor(ev.InboxRead, "chunks", "present")
_append_committed = slot_constructor(ev.AppendCommitted, "token", "offsets", "lengths")
_membership_read = slot_constructor(ev.MembershipRead, "doc")


@dataclass(slots=True)
class _Append:
    token: int
    shard: int
    seq: int
    records: list[dict[str, Any]]
    offsets: tuple[int, ...]
    lengths: tuple[int, ...]
    t_issue: int
    epoch: int
    error: str | None
    handle: Any = None
    #: An append to the process's own inbox file of `shard` (`fx.AppendInbox`).
    inbox: bool = False
    #: When the node handed it to its writer thread (at or before `t_issue`).
    t_queued: int = 0


class _Proc:
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

    def __init__(self, index: int, inc: int, node: Node, clock: NodeClock) -> None:
        self.index = index
        self.inc = inc
        self.node = node
        self.clock = clock
        self.name = node.config.node_id
        self.pid = f"host{index}#{inc}"
        #: "running", "paused", "down" (crashed or exited).
        self.state = "running"
        self.paused_until = 0
        #: membership.json cannot be reached by this process until then (an outage).
        self.unreachable_until = 0
        #: Events and effect batches that arrived while paused, in order.
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


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """What a run produced."""

    settings: Settings
    report: checker.Report
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
        self.rng_fault = random.Random(root.getrandbits(64))
        self.rng_io = random.Random(root.getrandbits(64))
        self.rng_work = random.Random(root.getrandbits(64))
        self.rng_clock = random.Random(root.getrandbits(64))
        self.rng_crash = random.Random(root.getrandbits(64))
        self.fs = SimFS(lock_mode="nfsv3" if settings.fs_mode == "nfsv3" else "posix")
        self.t = 0
        self.seq = 0
        self.queue: list[tuple[int, int, int, Any, Any, Any]] = []
        self.history: list[dict[str, Any]] = []
        self._digest = xxhash.xxh3_128()
        self._digest_update = self._digest.update
        self.procs: list[_Proc] = []
        self.clocks: list[NodeClock] = []
        self.events = 0
        #: Events handed to a node's core (`Node.handle` calls).
        self.node_events = 0
        self.liveness = False
        self.finished = False
        self.world_violations: list[str] = []
        #: What each `shard-N/.lock` file says: the node id of the process that took it last,
        #: the epoch of the claim it took it under, and whether it let it go itself.
        self.lock_files: dict[int, LockText] = {}
        self.counters: dict[str, int] = {
            "crashes": 0,
            "restarts": 0,
            "pauses": 0,
            "clock_steps": 0,
            "locks_lost": 0,
            "disk_full": 0,
            "enqueues": 0,
            "executions": 0,
            "node_errors": 0,
            "inbox_reads": 0,
            #: Lines delivered two or more at once (`Settings.line_burst_us`), and how many
            #: of them were results.
            "burst_lines": 0,
            "burst_results": 0,
            #: Owners found gone by a shard lock free under their claim (`Settings.lock_probe`),
            #: counted when the claim taking the shard over lands (no lease lapse waited for).
            "owners_found_gone": 0,
        }
        self.next_task = 0
        #: The largest wall-clock error any host had: a claim written by a host whose clock
        #: ran that far ahead looks live that much longer to the wall-clock half of the lapse
        #: rule, which delays takeovers (liveness, not safety).
        self.max_wall_error = settings.offset_max_us
        #: Recent auto_dedupe payloads, for duplicates.
        self.dedupe_payloads: deque[str] = deque(maxlen=8)
        self.watch = checker.LivenessWatch()
        self._owners_cache: tuple[int, dict[int, str]] = (-1, {})
        #: Whether a pause may fall between deciding an append and making it.
        self._pause_buggify = bool(settings.pause_rate)
        self._ownership = OwnershipConfig(
            ttl_us=settings.ttl_us,
            skew_margin_us=0 if settings.unsafe_no_margin else settings.margin_us,
            max_shards=None if settings.unsafe_no_cap else settings.max_shards,
            unsafe_wall_clock_only=settings.unsafe_wall_clock_only,
        )
        #: Shard-log appends issued and not yet recorded: seq -> (handle, append, writer name).
        self._handles: dict[int, tuple[Any, _Append, str]] = {}
        #: Appends issued to each shard's log, in file order, not yet recorded.
        self._order: dict[int, deque[int]] = {}
        #: Resolved appends: seq -> when durable (None: lost, or in a replaced file).
        self._resolved: dict[int, int | None] = {}
        #: How much of a shard's log a process read at its last load.
        self._loaded: dict[tuple[str, int], int] = {}
        #: Inbox appends not yet durable: seq -> (handle, append, writer name).
        self._inbox_handles: dict[int, tuple[Any, _Append, str]] = {}

    # ------------------------------------------------------------------ plumbing

    def _at(self, t: int, kind: int, a: Any = None, b: Any = None, c: Any = None) -> None:
        self.seq += 1
        heappush(self.queue, (t, self.seq, kind, a, b, c))

    def _record(self, entry: dict[str, Any]) -> None:
        entry["t"] = self.t
        self.history.append(entry)
        self._digest_update(_dumps(entry, option=_SORT_KEYS))

    def _io_latency(self, lo: int, hi: int) -> int:
        s, rng = self.s, self.rng_io
        if s.slow_io_prob and not self.liveness and rng.random() < s.slow_io_prob:
            return uniform(rng, hi, max(hi, s.slow_io_max_us))
        return lo + int(rng.random() * (hi - lo + 1)) if hi > lo else lo  # _uniform inline

    def _io_done_at(self, proc: _Proc, lo: int, hi: int, lane: str = "meta") -> int:
        """When an I/O call of `proc` issued now completes: calls on one lane complete in
        order."""
        lanes = proc.lanes
        at = self.t + self._io_latency(lo, hi)
        if at < lanes[lane]:
            at = lanes[lane]
        lanes[lane] = at
        return at

    # ------------------------------------------------------------------ processes

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
            history_limit=50,
            fence=not self.s.unsafe_no_fence,
            inbox_poll_us=self.s.inbox_poll_us,
            inbox_idle_poll_us=self.s.inbox_idle_poll_us,
            inbox_read_bytes=self.s.inbox_read_bytes,
            inbox_segment_bytes=self.s.inbox_segment_bytes,
            lock_proves_liveness=self.s.probes_locks,
        )

    def _start(self, index: int, inc: int) -> None:
        clock = self.clocks[index]
        proc = _Proc(index, inc, Node(self._node_config(index, inc)), clock)
        if index < len(self.procs):
            self.procs[index] = proc
        else:
            self.procs.append(proc)
        self._deliver(proc, ev.Started())
        self._deliver(proc, ev.LineReceived(line=b'{"action":"register","task_type":"t"}'))

    def _alive(self, proc: _Proc, inc: Any) -> bool:
        return proc.inc == inc and proc.state != "down"

    def _deliver(self, proc: _Proc, event: ev.Event) -> None:
        """Hand `event` to the node now, as the shell does: `handle`, then `wake_in` (the
        wake-up it asks for is queued), then what the node believes it owns is recorded.

        The world's hottest path (every core event): written out rather than split in
        helpers, with the queue pushes of `_at` inline."""
        state = proc.state
        if state != "running":
            if state == "paused":
                proc.waiting.append((_DELIVER, event))
            return
        self.node_events += 1
        t = self.t
        clock = proc.clock
        node = proc.node
        now = clock.now(t)
        effects = node.handle(event, now)
        queue = self.queue
        if effects:
            if (
                self._pause_buggify
                and not self.liveness
                and self.rng_fault.random() < 0.002
                and any(type(e) is _APPEND or type(e) is _APPEND_INBOX for e in effects)
            ):
                # A SIGSTOP between deciding an append and making it (BUGGIFY-style): the
                # effects run when the process resumes, maybe after its lease ran out.
                self._pause(proc, uniform(self.rng_fault, 1_000, self.s.pause_max_us))
            # The shell carries them out a moment later (a pause can fall in between).
            self.seq += 1
            heappush(queue, (t + 20, self.seq, _EFFECTS, proc.index, proc.inc, effects))
        etype = type(event)
        if etype is _COMPACTED or etype is _LOG_RECORDS_READ:
            self._check_locations(proc, event.shard)  # type: ignore[attr-defined]
        elif etype is _MEMBERSHIP_WRITTEN and node.dead_nodes:
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
                heappush(queue, (at, self.seq, _WAKE, proc.index, proc.inc, gen))
        # Beliefs (`_believed` and `_update_beliefs`, for a process that is not down).
        deadline = node.lease_deadline_mono
        if deadline is not None:
            if deadline != proc.watched_deadline:
                proc.watched_deadline = deadline
                self.seq += 1
                heappush(
                    queue,
                    (clock.true_at_mono(deadline), self.seq, _BELIEF, proc.index, proc.inc, None),
                )
            if mono >= deadline:
                if proc.beliefs:
                    self._set_beliefs(proc, [])
                return
        if node.shards:
            believed = node.owned_shards
            if believed != proc.beliefs:
                self._set_beliefs(proc, believed)
        elif proc.beliefs:
            self._set_beliefs(proc, [])

    def _check_locations(self, proc: _Proc, shard: int) -> None:
        """Every location the node holds for a task of `shard` must point at that task's
        record (payloads are read from there): checked after each load and compaction."""
        for task in proc.node.tasks.values():
            if task.shard != shard:
                continue
            for what, loc in (("record", task.loc), ("dispatch record", task.dispatch_loc)):
                if loc is None:
                    continue
                raw = self.fs.read_range(loc.shard, loc.offset, loc.length)
                try:
                    got = decode_line_at(raw, f"shard {loc.shard}:{loc.offset}+{loc.length}")
                except CorruptRecord as exc:
                    got = {"error": str(exc)}
                key = "task" if what == "dispatch record" else "taskId"
                if got.get(key) != task.task_id:
                    self.world_violations.append(
                        f"t={self.t}: {proc.name} holds shard-{shard}@{loc.offset}+{loc.length} "
                        f"as the {what} of {task.task_id}, but it reads {str(got)[:120]}"
                    )

    def _check_proven_dead(self, proc: _Proc, mono: int) -> None:
        """A node takes another for dead (its shard lock free under its claim) only when that
        process is gone, or owns nothing under a lease (its lease ran out on its own clock: it
        stopped acting and gave up its locks). Never while it lives and owns shards: that is a
        false proof (a shard handed over, say, whose lock went before its claim), and it drops
        a working node from the fair shares and its heartbeat from membership.json."""
        for name, since in proc.node.dead_nodes.items():
            if since != mono:
                continue  # proven earlier (and checked then)
            self.counters["owners_found_gone"] += 1
            index = name.partition("@pid-")[0]
            other = self.procs[int(index.removeprefix("n"))]
            if other.name != name or other.state == "down":
                continue  # that incarnation is gone
            if self._believed(other):
                self.world_violations.append(
                    f"t={self.t}: {proc.name} takes {name} for dead (a shard lock free under "
                    "its claim) while it lives and owns shards under its lease"
                )

    def _believed(self, proc: _Proc) -> list[int]:
        if proc.state == "down":
            return []
        deadline = proc.node.lease_deadline_mono
        if deadline is not None and proc.clock.mono(self.t) >= deadline:
            return []
        return proc.node.owned_shards

    def _update_beliefs(self, proc: _Proc) -> None:
        now = self._believed(proc)
        if now != proc.beliefs:
            self._set_beliefs(proc, now)

    def _check_cap(self, proc: _Proc, what: str, shards: list[int]) -> None:
        """A node never holds more shards than its cap (SNERD_MAX_SHARDS), neither in what it
        believes it owns nor in the claims membership.json gives it: it must not claim a
        shard only to hand it back."""
        cap = self.s.max_shards
        if cap is not None and len(shards) > cap:
            self.world_violations.append(
                f"t={self.t}: {proc.name} {what} {len(shards)} shards {shards}, above its cap "
                f"of {cap} (SNERD_MAX_SHARDS)"
            )

    def _set_beliefs(self, proc: _Proc, now: list[int]) -> None:
        """Record what changed from `proc.beliefs` to `now`."""
        self._check_cap(proc, "believes it owns", now)
        for shard in proc.beliefs:
            if shard not in now:
                self._record({"kind": "belief", "node": proc.name, "shard": shard, "on": False})
        for shard in now:
            if shard not in proc.beliefs:
                self._record({"kind": "belief", "node": proc.name, "shard": shard, "on": True})
        proc.beliefs = now

    # ------------------------------------------------------------------ the shell

    def _run_effects(self, proc: _Proc, effects: list[fx.Effect]) -> None:
        if proc.state == "paused":
            proc.waiting.append((_EFFECTS, effects))
            return
        shell = self._shell
        for effect in fx.lazy_last(effects):
            handler = shell.get(type(effect))
            if handler is None:
                raise AssertionError(f"the simulated shell has no handler for {effect!r}")
            handler(self, proc, effect)

    def _answer(self, proc: _Proc, event: ev.Event, lo: int, hi: int, lane: str = "meta") -> None:
        # `_io_done_at` and `_io_latency` written out (an answer per meta call).
        s, rng = self.s, self.rng_io
        if s.slow_io_prob and not self.liveness and rng.random() < s.slow_io_prob:
            at = self.t + uniform(rng, hi, max(hi, s.slow_io_max_us))
        else:
            at = self.t + lo + int(rng.random() * (hi - lo + 1))  # _uniform inline (hi > lo)
        lanes = proc.lanes
        if at < lanes[lane]:
            at = lanes[lane]
        lanes[lane] = at
        self.seq += 1
        heappush(self.queue, (at, self.seq, _DELIVER, proc.index, proc.inc, event))

    def _fx_send(self, proc: _Proc, effect: fx.Send) -> None:
        msg = effect.message
        task = msg.get("task_id")
        if not isinstance(task, str) or task not in proc.outstanding:
            return
        action = msg.get("action")
        if action == "ack":
            shard = msg.get("shard")
            number = (
                int(shard[6:]) if isinstance(shard, str) and shard.startswith("shard-") else None
            )
            self._acked(proc, task, number, bool(msg.get("deduplicated")))
        elif action == "error":
            del proc.outstanding[task]
            self._record({"kind": "enqueue", "phase": "fail", "task": task, "node": proc.name})

    def _fx_ack_enqueued(self, proc: _Proc, effect: fx.AckEnqueued) -> None:
        outstanding = proc.outstanding
        for task in effect.task_ids:
            if task in outstanding:
                self._acked(proc, task, effect.shard, False)

    def _acked(self, proc: _Proc, task: str, shard: int | None, deduplicated: bool) -> None:
        del proc.outstanding[task]
        entry: dict[str, Any] = {"kind": "enqueue", "phase": "ok", "task": task}
        entry["node"] = proc.name
        if shard is not None:
            entry["shard"] = shard
        if deduplicated:
            entry["deduplicated"] = True
        self._record(entry)

    def _fx_log(self, proc: _Proc, effect: fx.Log) -> None:
        if effect.level == "error":
            self.counters["node_errors"] += 1

    def _fx_execute(self, proc: _Proc, effect: fx.Execute) -> None:
        loc = effect.location
        raw = self.fs.read_range(loc.shard, loc.offset, loc.length)
        problem = None
        try:
            fields_ = decode_line_at(raw, f"shard {loc.shard}:{loc.offset}+{loc.length}")
        except CorruptRecord as exc:
            problem = f"from an unreadable record at shard-{loc.shard}@{loc.offset} ({exc})"
        else:
            if fields_.get("taskId") != effect.task_id:
                problem = (
                    f"but its location shard-{loc.shard}@{loc.offset} holds "
                    f"{fields_.get('taskId')!r}"
                )
        if problem is not None:
            if loc.shard in self._believed(proc):
                # Its owner's index points at the wrong bytes: a bug in the node.
                self.world_violations.append(
                    f"t={self.t}: {proc.name} executes {effect.task_id} {problem}"
                )
                return
            # Decided while it owned the shard, carried out after its lease ran out (paused
            # in between), when the next owner may have compacted the log: the shell finds
            # the payload unreadable and says so, as `snerd.io.runtime` does.
            self._answer(
                proc,
                ev.PayloadUnreadable(task_id=effect.task_id, attempt=effect.attempt, error=problem),
                100,
                1_000,
                "log",
            )
            return
        info = proc.node.shards.get(loc.shard)
        self.counters["executions"] += 1
        self._record(
            {
                "kind": "execute",
                "task": effect.task_id,
                "attempt": effect.attempt,
                "node": proc.name,
                "shard": loc.shard,
                "epoch": info.epoch if info is not None else -1,
            }
        )
        rng = self.rng_work
        ok = rng.random() >= self.s.fail_prob
        slow = rng.random() < self.s.slow_prob
        hang = rng.random() < self.s.hang_prob
        took = uniform(rng, 1_000, 50_000) if not slow else uniform(rng, 0, self.s.ttl_us)
        if effect.max_execution_seconds and hang:
            # Hangs past its hard timeout: the daemon fails the attempt at the deadline; this
            # result, when it finally comes, must be refused.
            took = 3 * effect.max_execution_seconds * SECOND
        self._at(
            self.t + took, _HANDLER_DONE, proc.index, proc.inc, (effect.task_id, effect.attempt, ok)
        )

    def _fx_dead_letter(self, proc: _Proc, effect: fx.DeliverDeadLetter) -> None:
        self._record({"kind": "dead_letter", "task": effect.task_id, "node": proc.name})

    def _fx_webhook(self, proc: _Proc, effect: fx.CallWebhook) -> None:
        done = ev.WebhookFinished(task_id=effect.task_id, attempt=effect.attempt, ok=True)
        self._answer(proc, done, 1_000, 10_000)

    def _fx_exit(self, proc: _Proc, effect: fx.Exit) -> None:
        self._down(proc, crashed=False)

    def _fx_read_membership(self, proc: _Proc, effect: fx.ReadMembership) -> None:
        # Each membership read is a renewal point: the shell writes through every held lock fd,
        # so a lock lost with an error surfaces here (snerd.io.runtime does the same).
        for shard, info in proc.node.shards.items():
            if info.phase.value in ("loading", "fencing", "active"):
                error = self.fs.touch_lock(proc.pid, shard)
                if error is not None:
                    self._answer(proc, ev.LockLost(shard=shard, error=error), 100, 1_000)
        if self.t < proc.unreachable_until:
            failed = ev.MembershipWriteFailed(doc=None, error="membership.json unreachable")
            self._answer(proc, failed, 500, 5_000)
            return
        self._answer(proc, _membership_read(self.fs.read_membership()), 500, 5_000)

    def _fx_write_membership(self, proc: _Proc, effect: fx.WriteMembership) -> None:
        s = self.s
        faults = not self.liveness
        r1, r2 = self.rng_io.random(), self.rng_io.random()
        fail_before = faults and (r1 < s.membership_fail_prob or self.t < proc.unreachable_until)
        fail_after = faults and not fail_before and r2 < s.membership_unknown_prob
        # The write lands when it completes (a late renewal lands late), judged then against
        # the version it expects.
        at = self._io_done_at(proc, 1_000, 10_000)
        self._at(
            at, _DELIVER, proc.index, proc.inc, ("membership", effect, fail_before, fail_after)
        )

    def _membership_done(
        self, proc: _Proc, effect: fx.WriteMembership, before: bool, after: bool
    ) -> None:
        out = self.fs.write_membership(
            proc.pid, effect.doc, effect.expected_version, fail_before=before, fail_after=after
        )
        event: ev.Event
        if out.ok:
            assert out.doc is not None
            event = ev.MembershipWritten(doc=out.doc)
            if self.s.max_shards is not None:
                self._check_cap(proc, "is given by its claims", owned_by(out.doc, proc.name))
        else:
            event = ev.MembershipWriteFailed(doc=out.doc, error=out.error or "failed")
        self._deliver(proc, event)

    def _fx_try_lock(self, proc: _Proc, effect: fx.TryLock) -> None:
        shard = effect.shard
        event: ev.Event
        if self.fs.try_lock(proc.pid, shard):
            # The shell reads what the lock file says, then writes its own node id and epoch
            # into it (a probe writes nothing).
            text = self.lock_files.get(shard, LockText())
            if not effect.probe:
                self.lock_files[shard] = LockText(owner=effect.owner, epoch=effect.epoch)
            event = ev.LockAcquired(shard=shard, previous=text)
        else:
            event = ev.LockBusy(shard=shard)
        self._answer(proc, event, 100, 1_000)

    def _fx_unlock(self, proc: _Proc, effect: fx.Unlock) -> None:
        shard = effect.shard
        text = self.lock_files.get(shard)
        if text is not None and text.owner == proc.name and proc.pid in self.fs.holders(shard):
            # The shell marks the lock file released before it unlocks (a crash does not).
            self.lock_files[shard] = replace(text, released=True)
        self.fs.unlock(proc.pid, shard)

    def _fx_read_log(self, proc: _Proc, effect: fx.ReadLog) -> None:
        shard = effect.shard
        # The shell reopens the log for writing (another owner may have compacted it) and cuts
        # a torn last line before anything is appended after it.
        self.fs.close_log(proc.pid, shard)
        data = self.fs.read_log(shard)
        if data and not data.endswith(b"\n"):
            # The core's rule for a last line (`scan_tail`, as `snerd.io.log.repair_tail`
            # applies it): a whole record that lost only its newline gets it back and is kept;
            # anything else is a torn write, cut.
            cut = data.rfind(b"\n") + 1
            if scan_tail(data[cut:], offset=cut).records:
                if self.fs.restore_newline(proc.pid, shard):
                    data += b"\n"
            elif self.fs.truncate_log(proc.pid, shard, cut):
                data = data[:cut]
        result = scan(data)
        self._loaded[(proc.pid, shard)] = result.end
        read = ev.LogRecordsRead(
            shard=shard,
            records=tuple(result.records),
            corrupt=tuple(result.corrupt),
            final=True,
            size=result.end,
        )
        self._answer(proc, read, 1_000, 5_000)

    def _build(self, record: fx.NewRecord) -> dict[str, Any]:
        """The line a record stands for, by the core's rule (`records.merge_base`)."""
        loc = record.base
        if loc is None:
            return dict(record.fields)
        raw = self.fs.read_range(loc.shard, loc.offset, loc.length)
        base = decode_line_at(raw, f"shard {loc.shard}:{loc.offset}+{loc.length}")
        return merge_base(base, record)

    def _fx_append(self, proc: _Proc, effect: fx.Append | fx.AppendInbox) -> None:
        """`fx.Append` to the shard's log, or `fx.AppendInbox` to the process's own inbox file
        of the shard: one group-commit writer thread serves both, as in `snerd.io.runtime`."""
        built: list[dict[str, Any]] = []
        try:
            for r in effect.records:
                # `_build` inline for the usual record without a base.
                built.append(dict(r.fields) if r.base is None else self._build(r))
        except CorruptRecord as exc:
            failed = ev.AppendFailed(
                token=effect.token, error=str(exc), permanent=True, record=len(built)
            )
            self._answer(proc, failed, 100, 1_000, "log")
            return
        lines = list(map(encode_record, built))
        # The shell's group-commit writer thread writes appends in order, one batch after
        # another: when it is still busy, this write(2) happens later (after an Unlock the
        # node emitted meanwhile, say), and the fsync after it.
        start, done_at = self._log_batch(proc)
        if start > self.t:
            self._at(
                start,
                _APPEND_ISSUE,
                proc.index,
                proc.inc,
                (effect, built, lines, done_at, self.t),
            )
            return
        self._issue_append(proc, effect, built, lines, done_at, self.t)

    def _log_batch(self, proc: _Proc) -> tuple[int, int]:
        """When the writer thread writes an append handed to it now, and when its fsync
        returns. An idle writer starts at once. A busy one takes every append queued meanwhile
        as its next batch (one write and one fsync per file, as `snerd.io.log.GroupCommitLog`
        does), so appends waiting behind a slow fsync share the next batch's latency instead of
        each adding its own."""
        t = self.t
        batch = proc.log_batch
        if batch[0] > t and batch[1] == proc.lanes["log"]:
            return batch  # the next batch has not started: join it
        start = max(t, proc.lanes["log"])
        done_at = start + self._io_latency(100, 2_000)
        proc.lanes["log"] = done_at
        proc.log_batch = (start, done_at)
        return start, done_at

    def _issue_append(
        self,
        proc: _Proc,
        effect: fx.Append | fx.AppendInbox,
        built: list[dict[str, Any]],
        lines: list[bytes],
        done_at: int,
        queued: int,
    ) -> None:
        fs = self.fs
        enospc = fs.disk_full
        inbox = type(effect) is _APPEND_INBOX
        shard = effect.shard
        key: InboxKey | int = shard
        short = skip = 0
        if inbox:
            assert isinstance(effect, fx.AppendInbox)
            key = InboxKey(effect.shard, effect.segment)
        # A write never glues a record onto a line its writer did not finish: the shell starts
        # it with a newline when the file does not end with one (`GroupCommitLog._write_share`
        # looks whenever the file is not the size it left it). For an inbox that is a short
        # write's bytes (the shell never cuts a failed write off an inbox, its reader may have
        # read it); for a shard log, a crashed owner's torn write a stale owner appends after.
        size = fs.log_size(key)
        if size and fs.read_range(key, size - 1, 1) != b"\n":
            skip = 1
        if inbox and enospc and self.rng_io.random() < 0.5:
            short = uniform(self.rng_io, 1, skip + sum(map(len, lines)) - 1)
        if len(lines) == 1:
            data = lines[0]
            lengths: tuple[int, ...] = (len(data),)
        else:
            data = b"".join(lines)
            lengths = tuple(map(len, lines))
        if skip:
            data = b"\n" + data
        handle = fs.append(proc.pid, key, data, enospc=enospc, short=short)
        offsets = tuple(accumulate(lengths[:-1], initial=handle.offset + skip))
        info = proc.node.shards.get(shard)
        error = handle.error
        seq = handle.seq
        pending = _Append(
            effect.token,  # token
            shard,
            seq,
            built,  # records
            offsets,
            lengths,
            self.t,  # t_issue
            info.epoch if info is not None else -1,  # epoch
            error,
            handle,
            inbox,
            queued,  # t_queued
        )
        if error is None:
            if inbox:
                self._inbox_handles[seq] = (handle, pending, proc.name)
            else:
                self._handles[seq] = (handle, pending, proc.name)
                order = self._order.get(shard)
                if order is None:
                    order = self._order[shard] = deque()
                order.append(seq)
        self.seq += 1
        heappush(self.queue, (done_at, self.seq, _APPEND_DONE, proc.index, proc.inc, pending))

    def _append_done(self, proc: _Proc, pending: _Append) -> None:
        if pending.error is not None:
            self._deliver(proc, ev.AppendFailed(token=pending.token, error=pending.error))
            return
        handle = pending.handle
        fs = self.fs
        if pending.inbox:
            # One writer per inbox file, and its appends are durable in issue order: each is
            # recorded as it becomes durable (`inbox_record`), which is its file order too.
            for done in fs.complete_append(handle):
                entry = self._inbox_handles.pop(done.seq, None)
                if entry is not None:
                    self._record_inbox(entry[1], entry[2])
        else:
            handles, resolved, t = self._handles, self._resolved, self.t
            for done in fs.complete_append(handle):
                seq = done.seq
                if seq in handles and seq not in resolved:
                    resolved[seq] = t if fs.status(done) == "durable" else None
            self._flush_records(pending.shard)
        status = fs.status(handle)
        if status == "durable" or status == "replaced":
            # fsync returned: the shell reports success even for a replaced file (it cannot
            # know); the checkers see whether the record is in the log. First what the node
            # lets go at once (`Node.on_commit`: acks, an `execute`); a paused shell's come
            # from the burst that handles the commit when it resumes.
            if proc.state == "running":
                effects = proc.node.on_commit(
                    pending.token, proc.clock.now(self.t), pending.offsets, pending.lengths
                )
                if effects:
                    self._run_effects(proc, effects)
            self._deliver(proc, _append_committed(pending.token, pending.offsets, pending.lengths))

    def _record_inbox(self, pending: _Append, name: str) -> None:
        """Record the records of a durable inbox append (their writer is the inbox's node)."""
        for fields_, offset in zip(pending.records, pending.offsets, strict=True):
            self._record(
                {
                    "kind": "inbox_record",
                    "shard": pending.shard,
                    "node": name,
                    "offset": offset,
                    "fields": _history_fields(fields_),
                    "t_issue": pending.t_issue,
                    "t_durable": self.t,
                }
            )

    def _fx_read_inbox(self, proc: _Proc, effect: fx.ReadInbox) -> None:
        """What `snerd.io.inbox.read_inboxes` does: every inbox file of each shard asked for,
        from the offset given for its writer (0 if none) to its last complete line, at most
        about `max_bytes` (but at least one line) per file; a line without its newline (a write
        in progress, a torn tail) is left alone. Readers see pending bytes as well as durable
        ones. One `InboxRead` answers it, after an I/O latency on the "meta" lane."""
        fs = self.fs
        present, grown = fs.inbox_poll(effect.offsets)
        chunks: list[ev.InboxChunk] = []
        for shard, key, start, size in grown:
            data = fs.read_range(key, start, size - start)
            end = data.rfind(b"\n", 0, effect.max_bytes) + 1
            if not end:
                end = data.find(b"\n") + 1  # one line longer than max_bytes
                if not end:
                    continue
            result = scan(data[:end], base_offset=start)
            chunks.append(
                ev.InboxChunk(
                    shard=shard,
                    node=key.node,
                    start=start,
                    end=start + end,
                    records=tuple(result.records),
                    corrupt=tuple(result.corrupt),
                )
            )
        self.counters["inbox_reads"] += 1
        read = _inbox_read(tuple(chunks), present)
        self._answer(proc, read, 500, 5_000)

    def _fx_mark_inbox_read(self, proc: _Proc, effect: fx.MarkInboxRead) -> None:
        # A hint for the writer's clean-up; a failure (ENOSPC) is only logged by the shell.
        self.fs.write_hint(InboxKey(effect.shard, effect.segment), effect.offset)

    def _fx_check_inboxes(self, proc: _Proc, effect: fx.CheckInboxes) -> None:
        fs = self.fs
        found = []
        for shard, segment in effect.segments:
            key = InboxKey(shard, segment)
            exists = key in fs.inboxes(shard)
            found.append((shard, segment, fs.read_hint(key), fs.log_size(key) if exists else None))
        self._answer(proc, ev.InboxProgress(segments=tuple(found)), 500, 5_000)

    def _fx_remove_inbox(self, proc: _Proc, effect: fx.RemoveInbox) -> None:
        self.fs.remove_inbox(InboxKey(effect.shard, effect.segment))

    def _flush_records(self, shard: int) -> None:
        """Record, in file order, the records of `shard` whose append and every append before
        it in the file are resolved (durable, or lost in a crash, or in a replaced file).

        Readers judge fencing in file order, and a write is in the file from the moment it is
        issued, so the history lists records in that order; each carries when it became
        durable (`t_durable`), and only durable ones are listed."""
        order = self._order.get(shard)
        while order and order[0] in self._resolved:
            seq = order.popleft()
            durable_at = self._resolved.pop(seq)
            _, pending, name = self._handles.pop(seq)
            if durable_at is None:
                continue
            for fields_ in pending.records:
                epoch = fields_.get("snerdEpoch")
                self._record(
                    {
                        "kind": "record",
                        "shard": pending.shard,
                        "node": name,
                        "epoch": epoch if isinstance(epoch, int) else pending.epoch,
                        "fields": _history_fields(fields_),
                        "t_issue": pending.t_issue,
                        "t_queued": pending.t_queued,
                        "t_durable": durable_at,
                    }
                )

    def _fx_compact(self, proc: _Proc, effect: fx.Compact) -> None:
        data = self.fs.read_log(effect.shard)
        parts: list[bytes] = []
        offsets, lengths, at = [], [], 0
        for keep in effect.keep:
            chunk = data[keep.offset : keep.offset + keep.length]
            parts.append(chunk)
            offsets.append(at)
            lengths.append(len(chunk))
            at += len(chunk)
        for record in effect.extra:
            line = encode_record(self._build(record))
            parts.append(line)
            offsets.append(at)
            lengths.append(len(line))
            at += len(line)
        # Appends of other writers still pending in the log being replaced: those the
        # compactor read when it loaded the shard, or whose bytes it copies, are part of the
        # log's history from now on (read and acted on, or copied and fsynced by it); the
        # rest never reach the log.
        copied = []
        loaded = self._loaded.get((proc.pid, effect.shard), 0)
        for seq in self._order.get(effect.shard, ()):
            handle = self._handles[seq][0]
            if seq not in self._resolved and self.fs.in_current_log(handle):
                end = handle.offset + handle.length
                if end <= loaded or any(
                    k.offset <= handle.offset and end <= k.offset + k.length for k in effect.keep
                ):
                    copied.append(seq)
        error = self.fs.replace_log(proc.pid, effect.shard, b"".join(parts))
        if error is None and copied:
            for seq in copied:
                self._resolved[seq] = self.t
            self._flush_records(effect.shard)
        event: ev.Event
        if error is not None:
            event = ev.CompactionFailed(token=effect.token, shard=effect.shard, error=error)
        else:
            event = ev.Compacted(
                token=effect.token,
                shard=effect.shard,
                offsets=tuple(offsets),
                lengths=tuple(lengths),
                size=at,
            )
        self._answer(proc, event, 1_000, 10_000, "log")

    _shell: dict[type, Callable[[World, _Proc, Any], None]] = {
        fx.Send: _fx_send,
        fx.AckEnqueued: _fx_ack_enqueued,
        fx.Log: _fx_log,
        fx.Execute: _fx_execute,
        fx.DeliverDeadLetter: _fx_dead_letter,
        fx.CallWebhook: _fx_webhook,
        fx.Exit: _fx_exit,
        fx.ReadMembership: _fx_read_membership,
        fx.WriteMembership: _fx_write_membership,
        fx.TryLock: _fx_try_lock,
        fx.Unlock: _fx_unlock,
        fx.ReadLog: _fx_read_log,
        fx.Append: _fx_append,
        fx.AppendInbox: _fx_append,
        fx.ReadInbox: _fx_read_inbox,
        fx.MarkInboxRead: _fx_mark_inbox_read,
        fx.CheckInboxes: _fx_check_inboxes,
        fx.RemoveInbox: _fx_remove_inbox,
        fx.Compact: _fx_compact,
    }

    # ------------------------------------------------------------------ faults and workload

    def _down(self, proc: _Proc, *, crashed: bool) -> None:
        if proc.state == "down":
            return
        if crashed:
            self.fs.crash(proc.pid, self.rng_crash, self.s.torn_prob)
            for seq, (handle, pending, _) in self._handles.items():
                if (
                    handle.pid == proc.pid
                    and seq not in self._resolved
                    and self.fs.status(handle) != "pending"
                ):
                    # Whole records in a torn append's prefix are in the log for every reader
                    # (a merged append's first tombstone, say): they count as written now,
                    # the rest of the append as lost.
                    kept = self._torn_records_read(handle, pending)
                    if kept:
                        pending.records[:] = kept
                        self._resolved[seq] = self.t
                    else:
                        self._resolved[seq] = None
            for shard in list(self._order):
                self._flush_records(shard)
            for seq in [s for s, e in self._inbox_handles.items() if e[0].pid == proc.pid]:
                del self._inbox_handles[seq]  # lost with the process (or torn: never whole)
            self.counters["crashes"] += 1
            self._record({"kind": "crash", "node": proc.name})
        else:
            self.fs.release_all(proc.pid)
            self._record({"kind": "exit", "node": proc.name})
        proc.state = "down"
        self._update_beliefs(proc)
        for task in proc.outstanding:
            self._record({"kind": "enqueue", "phase": "info", "task": task, "node": proc.name})
        proc.outstanding.clear()
        proc.waiting.clear()
        self._at(self.t + uniform(self.rng_fault, SECOND, 5 * SECOND), _RESTART, proc.index)

    def _torn_records_read(self, handle: Any, pending: _Append) -> list[dict[str, Any]]:
        """The records of a torn append that readers of the log parse, judged by `scan`, the
        readers' own rule, on the file from the start of the line its first record is on (as
        `_fx_read_log` reads it), not by a rule of the world's.

        After a dropped append's hole the first record is glued to zeros: `scan` reports the
        line corrupt yet salvages a task record at its end (a tombstone, say), so whether it
        counts depends on what it is, not only on what precedes it. The record the tear cut
        is not one, unless readers take it whole.
        """
        kept_end = handle.offset + self.fs.kept_prefix(handle)
        at = pending.offsets[0]
        if kept_end <= at:
            return []
        data = self.fs.read_log(handle.key)
        start = data.rfind(b"\n", 0, at) + 1
        # `at_eof`: a record the tear left whole but for its newline, at the end of the file,
        # is read too (the next owner writes the newline back, `_fx_read_log`, and a writer
        # before it starts its write on a new line, `_issue_append`).
        found = {r.offset for r in scan(data[start:], base_offset=start, at_eof=True).records}
        return [
            record
            for record, offset in zip(pending.records, pending.offsets, strict=True)
            if offset < kept_end and offset in found
        ]

    def _pause(self, proc: _Proc, length: int) -> None:
        if proc.state != "running":
            return
        proc.state = "paused"
        proc.paused_until = self.t + length
        self.counters["pauses"] += 1
        self._record({"kind": "pause", "node": proc.name, "us": length})
        self._at(self.t + length, _RESUME, proc.index, proc.inc)

    def _resume(self, proc: _Proc) -> None:
        if proc.state != "paused":
            return
        proc.state = "running"
        self._record({"kind": "resume", "node": proc.name})
        waiting, proc.waiting = proc.waiting, deque()
        for kind, item in waiting:
            if proc.state != "running":
                if proc.state == "paused":
                    proc.waiting.append((kind, item))
                continue
            if kind == _APPEND_ISSUE:
                effect, built, lines, done_at, queued = item
                self._issue_append(proc, effect, built, lines, max(done_at, self.t + 100), queued)
            elif kind == _DELIVER and isinstance(item, tuple):
                self._membership_done(proc, item[1], item[2], item[3])
            elif kind == _DELIVER:
                self._deliver(proc, item)
            else:
                self._run_effects(proc, item)
        self._update_beliefs(proc)

    def _fault(self, name: str) -> None:
        if self.liveness:
            return
        s, rng = self.s, self.rng_fault
        procs = self.procs
        proc = procs[int(rng.random() * len(procs))]
        if name == "crash":
            self._down(proc, crashed=True)
            self._at(self.t + exp(rng, s.crash_rate), _FAULT, "crash")
        elif name == "pause":
            self._pause(proc, uniform(rng, 1_000, s.pause_max_us))
            self._at(self.t + exp(rng, s.pause_rate), _FAULT, "pause")
        elif name == "step":
            delta = uniform(rng, -s.step_max_us, s.step_max_us)
            proc.clock.step(self.t, delta)
            self.max_wall_error = max(
                self.max_wall_error, abs(proc.clock.offset_at(self.t) - WALL_ORIGIN)
            )
            self.counters["clock_steps"] += 1
            self._record({"kind": "clock_step", "node": proc.name, "us": delta})
            self._at(self.t + exp(rng, s.step_rate), _FAULT, "step")
        elif name == "lock":
            held = [sh for sh in range(s.shards) if proc.pid in self.fs.holders(sh)]
            if held:
                shard = held[int(rng.random() * len(held))]
                silent = rng.random() < s.lock_loss_silent_prob
                if self.fs.lose_lock(proc.pid, shard, silent=silent):
                    self.counters["locks_lost"] += 1
                    self._record(
                        {
                            "kind": "fault",
                            "what": "lock_lost",
                            "node": proc.name,
                            "shard": shard,
                            "silent": silent,
                        }
                    )
            self._at(self.t + exp(rng, s.lock_loss_rate), _FAULT, "lock")
        elif name == "outage":
            proc.unreachable_until = self.t + uniform(rng, 100_000, s.outage_max_us)
            self._record(
                {
                    "kind": "fault",
                    "what": "membership_outage",
                    "node": proc.name,
                    "us": proc.unreachable_until - self.t,
                }
            )
            self._at(self.t + exp(rng, s.outage_rate), _FAULT, "outage")
        elif name == "disk_full":
            self.fs.disk_full = True
            self.counters["disk_full"] += 1
            self._record({"kind": "fault", "what": "disk_full"})
            self._at(self.t + uniform(rng, 100_000, 3 * SECOND), _FAULT, "disk_ok")
        elif name == "disk_ok":
            self.fs.disk_full = False
            self._at(self.t + exp(rng, s.enospc_rate), _FAULT, "disk_full")

    def _produce(self) -> None:
        if self.liveness:
            return
        s, rng = self.s, self.rng_work
        self._at(self.t + exp(rng, s.enqueue_rate), _PRODUCE)
        self.next_task += 1
        task = f"t{self.next_task}"
        data = orjson.dumps({"n": self.next_task}).decode()
        attrs: dict[str, Any] = {
            "type": TASK_TYPE,
            "max_retries": int(rng.random() * (s.retries_max + 1)),
        }
        msg: dict[str, Any] = {
            "action": "enqueue",
            "task_id": task,
            "task_type": TASK_TYPE,
            "max_retries": attrs["max_retries"],
            "retry_after_hours": 0.0,
        }
        fingerprint = None
        if rng.random() < s.dedupe_prob:
            if self.dedupe_payloads and rng.random() < 0.5:
                data = self.dedupe_payloads[int(rng.random() * len(self.dedupe_payloads))]
            else:
                self.dedupe_payloads.append(data)
            msg["auto_dedupe"] = True
            fingerprint = xxhash.xxh64_hexdigest((TASK_TYPE + data).encode()).lstrip("0") or "0"
        attrs["fingerprint"] = fingerprint
        msg["task_data"] = data
        group = None
        if rng.random() < s.group_prob:
            group = "g0" if rng.random() < 0.5 else "g1"
            msg["rate_limit_group"] = group
            msg["max_per_minute"] = 600 if group == "g0" else 120
            attrs["group"] = group
            attrs["max_per_minute"] = msg["max_per_minute"]
        if rng.random() < s.urgency_prob:
            msg["urgency_score"] = attrs["urgency"] = 1 + int(rng.random() * 9)
        if rng.random() < s.timeout_prob:
            msg["max_execution_seconds"] = attrs["timeout_s"] = 1 + int(rng.random() * 4)
        delay = 0
        if rng.random() < s.delay_prob:
            delay = uniform(rng, SECOND, 20 * SECOND)
        # The target: the shard's owner per membership.json most of the time (a smart client),
        # any live process otherwise (`route_any_prob`); a process that does not own the shard
        # (yet, or any more) takes the task into its inbox for it.
        live = [p for p in self.procs if p.state != "down"]
        if not live:
            return
        key = group or fingerprint or task
        shard = route_shard(key, s.shards) if s.shards != 1 else 0
        target = live[int(rng.random() * len(live))]
        if rng.random() >= s.route_any_prob:
            owner = self._owners().get(shard)
            for p in live:
                if p.name == owner:
                    target = p
        if delay:
            msg["execute_at"] = format_rfc3339(target.clock.wall(self.t) + delay)
        attrs["delay_us"] = delay
        self.counters["enqueues"] += 1
        self._record(
            {
                "kind": "enqueue",
                "phase": "invoke",
                "task": task,
                "node": target.name,
                "attrs": attrs,
            }
        )
        target.outstanding[task] = None
        self._write_line(target, orjson.dumps(msg))

    def _write_line(self, proc: _Proc, line: bytes, *, result: bool = False) -> None:
        """The SDK client writes `line` to `proc`'s stdin: at once, or, with line bursts, held
        (`Settings.line_burst_us`) and written with the lines that follow meanwhile."""
        burst_us = self.s.line_burst_us
        if not burst_us:
            self._deliver(proc, _line_received(line))
            return
        if not proc.pending_lines:
            self._at(self.t + burst_us, _FLUSH_LINES, proc.index, proc.inc)
        proc.pending_lines.append(line)
        if result:
            proc.pending_results += 1

    def _owners(self) -> dict[int, str]:
        """Each shard's owner per membership.json (parsed once per version of the file)."""
        version = self.fs.membership_generation
        if self._owners_cache[0] != version:
            doc = self.fs.read_membership() or {}
            claims = doc.get("claims") or {}
            owners = {}
            for shard in range(self.s.shards):
                owner = (claims.get(f"shard-{shard}") or {}).get("owner")
                if isinstance(owner, str):
                    owners[shard] = owner
            self._owners_cache = (version, owners)
        return self._owners_cache[1]

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
        s = self.s
        self._record(
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
        self._at(exp(self.rng_work, s.enqueue_rate), _PRODUCE)
        for name, rate in (
            ("crash", s.crash_rate),
            ("pause", s.pause_rate),
            ("step", s.step_rate),
            ("lock", s.lock_loss_rate),
            ("disk_full", s.enospc_rate),
            ("outage", s.outage_rate),
        ):
            if rate:
                self._at(exp(self.rng_fault, rate), _FAULT, name)
        self._at(s.safety_us, _PHASE)
        end = s.safety_us + s.liveness_us
        # The event loop: the commonest kinds are carried out here, the rest by `_step`.
        queue, procs, steps, tick = self.queue, self.procs, s.steps, _TICK
        events = 0
        while queue:
            t, _, kind, a, b, c = heappop(queue)
            if t > end:
                break
            self.t = t
            events += 1
            if kind == _EFFECTS:
                proc = procs[a]
                if proc.inc == b and proc.state != "down":
                    self._run_effects(proc, c)
            elif kind == _WAKE:
                proc = procs[a]
                if proc.inc == b and proc.state != "down" and c == proc.wake_gen:
                    proc.wake_at = -1
                    self._deliver(proc, tick)
            elif kind == _DELIVER and type(c) is not tuple:
                proc = procs[a]
                if proc.inc == b and proc.state != "down":
                    self._deliver(proc, c)
            elif kind == _APPEND_DONE:
                proc = procs[a]
                if proc.inc == b and proc.state != "down":
                    self._append_done(proc, c)
            else:
                self._step(kind, a, b, c)
                if self.finished:
                    break
            if events >= steps and not self.liveness:
                self.events = events
                self._start_liveness()
        self.events = events
        if not self.finished:
            self._judge_liveness(final=True)
        self._record({"kind": "end"})
        report = self.watch.check(self.history)
        return Outcome(
            settings=s,
            report=report,
            world_violations=tuple(self.world_violations),
            digest=self._digest.hexdigest(),
            events=self.events,
            node_events=self.node_events,
            true_us=self.t,
            history_len=len(self.history),
            counters={**self.counters, **asdict(self.fs.stats())},
        )

    def _step(self, kind: int, a: Any, b: Any, c: Any) -> None:
        if kind == _FLUSH_LINES:
            proc = self.procs[a]
            if self._alive(proc, b) and proc.pending_lines:
                lines, proc.pending_lines = proc.pending_lines, []
                if len(lines) > 1:
                    self.counters["burst_lines"] += len(lines)
                    self.counters["burst_results"] += proc.pending_results
                proc.pending_results = 0
                self._deliver(proc, ev.LinesReceived(lines=lines))
            return
        if kind == _DELIVER:
            proc = self.procs[a]
            if not self._alive(proc, b):
                return
            if isinstance(c, tuple):  # a membership write completing
                if proc.state == "paused":
                    proc.waiting.append((_DELIVER, c))  # resolved on resume
                    return
                self._membership_done(proc, c[1], c[2], c[3])
                return
            self._deliver(proc, c)
        elif kind == _EFFECTS:
            proc = self.procs[a]
            if self._alive(proc, b):
                self._run_effects(proc, c)
        elif kind == _WAKE:
            proc = self.procs[a]
            if self._alive(proc, b) and c == proc.wake_gen:
                proc.wake_at = -1
                self._deliver(proc, _TICK)
        elif kind == _APPEND_DONE:
            proc = self.procs[a]
            if proc.inc == b:
                if proc.state == "down":
                    return
                self._append_done(proc, c)
        elif kind == _APPEND_ISSUE:
            proc = self.procs[a]
            if self._alive(proc, b):
                if proc.state == "paused":
                    proc.waiting.append((_APPEND_ISSUE, c))
                else:
                    self._issue_append(proc, *c)
        elif kind == _HANDLER_DONE:
            proc = self.procs[a]
            if self._alive(proc, b):
                task, attempt, ok = c
                self._record(
                    {
                        "kind": "handler_done",
                        "task": task,
                        "attempt": attempt,
                        "node": proc.name,
                        "ok": ok,
                    }
                )
                result: dict[str, Any] = {"action": "result", "task_id": task, "attempt": attempt}
                result["status"] = "success" if ok else "error"
                if not ok:
                    result["error_msg"] = "simulated failure"
                self._write_line(proc, orjson.dumps(result), result=True)
        elif kind == _PRODUCE:
            self._produce()
        elif kind == _FAULT:
            self._fault(a)
        elif kind == _RESUME:
            proc = self.procs[a]
            if proc.inc == b:
                self._resume(proc)
        elif kind == _RESTART:
            proc = self.procs[a]
            if proc.state == "down":
                self.counters["restarts"] += 1
                self._record({"kind": "restart", "node": f"n{a}@pid-{proc.inc + 1}"})
                self._start(a, proc.inc + 1)
        elif kind == _BELIEF:
            proc = self.procs[a]
            if proc.inc == b:
                self._update_beliefs(proc)
        elif kind == _PHASE:
            if not self.liveness:
                self._start_liveness()
        elif kind == _CHECK:
            self._judge_liveness(final=False)

    def _start_liveness(self) -> None:
        """Faults off, everything healed; from here every acked task must finish."""
        self.liveness = True
        self.fs.disk_full = False
        self._record({"kind": "phase", "name": "liveness"})
        for proc in self.procs:
            if proc.state == "paused":
                self._resume(proc)
        # NTP brings stepped wall clocks back near true time.
        for clock in self.clocks:
            error = clock.offset_at(self.t) - WALL_ORIGIN
            if abs(error) > self.s.offset_max_us:
                clock.step(self.t, -error)
        self.liveness_started = self.t
        self._progress: tuple[int, bool, int] = (-1, False, self.t)
        self._at(self.t + SECOND, _CHECK)

    def _settled(self) -> bool:
        """Every shard believed by exactly one running process, counts within one."""
        running = [p for p in self.procs if p.state == "running"]
        if len(running) < len(self.procs):
            return False
        owners: dict[int, int] = {}
        for p in running:
            for shard in self._believed(p):
                owners[shard] = owners.get(shard, 0) + 1
        if sorted(owners) != list(range(self.s.shards)) or any(v != 1 for v in owners.values()):
            return False
        counts = [len(self._believed(p)) for p in running]
        return max(counts) - min(counts) <= 1

    def _judge_liveness(self, *, final: bool) -> None:
        left = self.watch.any_unfinished(self.history)
        settled = self._settled()
        if not left and settled:
            self.finished = True
            return
        records = self.fs.appends_completed
        if records != self._progress[0] or (not left and settled != self._progress[1]):
            self._progress = (records, settled, self.t)
        stalled = self.t - self._progress[2] >= self.s.stall_us + self.max_wall_error
        if final or stalled:
            self.finished = True
            how = (
                f"nothing was written for {(self.s.stall_us + self.max_wall_error) // SECOND} s"
                if stalled
                else f"{(self.t - self.liveness_started) // SECOND} s after the faults stopped"
            )
            if left:
                tasks = self.watch.unfinished(self.history)
                self.world_violations.append(
                    f"liveness: {len(tasks)} acked task(s) unfinished and {how}, e.g. "
                    f"{', '.join(tasks[:5])}"
                )
            if not settled:
                spread = {p.name: self._believed(p) for p in self.procs}
                self.world_violations.append(
                    f"liveness: ownership did not settle into an even spread: {spread}"
                )
            return
        self._at(self.t + SECOND, _CHECK)


def _history_fields(fields_: dict[str, Any]) -> dict[str, Any]:
    """A record's fields for the history, without the payload (the checkers never read it)."""
    if "taskData" in fields_:
        fields_ = dict(fields_)
        del fields_["taskData"]
    return fields_


def run(settings: Settings) -> Outcome:
    """Run one world."""
    return World(settings).run()
