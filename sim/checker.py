"""The invariant checkers: judging one recorded history against DESIGN §5.

This module owns the verdict on a run. It takes a plain history (a list of JSON-able dicts) and
knows nothing of how it was produced, so the deterministic simulator (`sim.world`) and
jepsen-lite (real processes) share it. It must never import the shell (`snerd.io`), trio, os,
time or random, nor reach into the simulator's objects: everything it knows is in the history.
It may import the pure core for shared names (`snerd.core.shardlog`, `snerd.core.retry`).

History format
--------------
A list of dicts in true-time order (`t` never decreases). Every entry has `"t"` (true time,
int µs) and `"kind"`. Kinds not listed here are ignored (a newer recorder may add some).

- `{"kind": "params", "ttl_us", "margin_us", "fence": bool, "assumptions_hold": bool,
  "window_slack_us": int}` — the first entry. `assumptions_hold`: the world states that clock
  rates stayed within what the margin tolerates (then no two nodes may even believe they own
  one shard at once; pauses do not matter, as a node's belief ends at its own lease deadline,
  paused or not, and the recorder ends it there). `window_slack_us`: the
  clock error and dispatch-to-execute latency allowed when judging rate windows. `fence`:
  whether the system under test fences stale records (False for the `--unsafe-no-fence`
  negative control).
- `{"kind": "enqueue", "phase": "invoke", "task", "node", "attrs": {...}}` — a client sent an
  enqueue to `node`. `attrs`: `type` (str), `max_retries` (int, retries after the first
  attempt), `urgency` (int), `group` (str|None), `max_per_minute` (int|None), `fingerprint`
  (str|None, set when auto_dedupe), `delay_us` (int), `parents` (list of ids); optional:
  `cron` (str|None), `pool` (str|None). Missing optional attrs read as None / 0 / [].
- `{"kind": "enqueue", "phase": "ok"|"fail"|"info", "task", "node"}` — its outcome. "ok" may
  carry `"deduplicated": true` and `"shard": int`. "fail": an error reply; "info": unknown
  (the process crashed before the reply). Neither obliges the task to finish. Every outcome
  follows an invoke of the same task.
- `{"kind": "execute", "task", "attempt", "node", "shard", "epoch"}` — a handler was handed an
  attempt. `{"kind": "handler_done", "task", "attempt", "node", "ok": bool}` — it returned.
- `{"kind": "record", "shard", "node", "epoch", "fields": {...}, "t_issue": int}` — one record
  became durable in shard `shard`'s log. Entries for one shard are in that log's file order
  (the order readers see; the append history, untouched by compaction), which can differ from
  the order in which they became durable; `t_durable` (optional, default `t`) says when each
  did, and "acked only once durable" is judged on it. `node`: the writer (its name in the history,
  also used to tell claimers apart); `fields`: the record as written, merged with its base
  record (so a tombstone carries `taskId`): `snerdKind`, `snerdEpoch`, `snerdNode`, `taskId`,
  `retryCount`, `deletedAt`, `snerdOutcome`, `payloadHash`, `autoDedupe`, a claim's `epoch`, a
  dispatch's `task` and `attempt`, ... The entry's own `epoch` is informative: fencing reads
  `fields`. `t_issue`: when the writer issued the append (at or before `t`); `t_queued`
  (optional, default `t_issue`): when the node handed it to the writer (at or before `t_issue`).
- `{"kind": "inbox_record", "shard", "node", "fields": {...}, "t_issue": int, "offset": int}`
  — one record became durable in `node`'s inbox file of shard `shard`
  (`shard-N/inbox/<node>.log`): a task `node` took for a shard it did not own, which the
  shard's owner later copies into its log. Listed when it becomes durable (`t_durable`,
  optional, default `t`); an inbox file has one writer, so that is its file order too. An ack
  by `node` of a task with such a record (in the acked shard, durable between the invoke and
  the ack) is an *inbox ack*: its durability is that record's, not a log record's.
- `{"kind": "dead_letter", "task", "node"}` — the SDK was told a task used every attempt.
- `{"kind": "belief", "node", "shard", "on": bool}` — `node` started / stopped believing it
  owns `shard` (dispatching from it).
- Context: `{"kind": "crash", "node"}` (ends the node's beliefs); `restart`, `pause`,
  `resume`, `clock_step`, each with `node` (without one it concerns every node), which only
  make priority judgements around them void; `fault`, `phase` (`"name": "liveness"` starts
  the fault-free phase) and `end` (its `t` ends beliefs still held) are not read otherwise.

Acceptance
----------
The checker judges which records are part of a shard's state itself, per shard in durable
order, as `snerd.core.shardlog.ShardFold` does: a claim record (`snerdKind` "claim", epoch in
its field `epoch`) raises the fence; a record whose epoch (`snerdEpoch`; a claim's `epoch`) is
an int below the highest claim epoch before it is fenced. (The fold never marks a claim stale,
but a claim below the fence changes nothing in its state, so here it counts as fenced.) With
`params.fence` false the system under test accepts everything, so every record is taken as
accepted, and each record below an earlier claim's epoch is an accepted transition out of epoch
order: a violation. A record without an int epoch (upstream's) is always accepted.

Verdicts
--------
Each `check_*` function returns a list of `Violation`; `check` runs them all and adds
`Metrics`. At-least-once is judged at the end of the history, so a run records its history up
to the end of its liveness phase, which it may end early once `unfinished` (or a
`LivenessWatch`, for repeated polling) is empty. A false alarm costs a whole CI run, so where
a rule depends on timing the checker cannot see (priority, rate windows), it flags only what
the history proves. A malformed history is the recorder's bug and raises `HistoryError`.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from snerd.core.retry import attempts_allowed
from snerd.core.shardlog import KIND_CLAIM, KIND_DISPATCH, RATE_WINDOW_US

__all__ = [
    "ACK_NOT_DURABLE",
    "ATTEMPTS_EXCEEDED",
    "BELIEF_OVERLAP",
    "DOUBLE_OWNERSHIP",
    "DUPLICATE_PENDING",
    "INVENTED_TASK",
    "LOST_TASK",
    "PRIORITY_INVERSION",
    "RATE_EXCEEDED",
    "STALE_OWNER_ACTED",
    "History",
    "HistoryError",
    "LivenessWatch",
    "Metrics",
    "Params",
    "Report",
    "Violation",
    "check",
    "check_at_least_once",
    "check_attempts",
    "check_belief",
    "check_dedupe",
    "check_fenced_acts",
    "check_ownership",
    "check_priority",
    "check_rate_windows",
    "unfinished",
]

#: An acked task never completed nor dead-lettered (check 1).
LOST_TASK = "lost_task"
#: A task id in an accepted record or an execute that no client ever enqueued (check 1).
INVENTED_TASK = "invented_task"
#: Accepted transitions out of epoch order, or one epoch of a shard used by two nodes (check 2).
DOUBLE_OWNERSHIP = "double_ownership"
#: An execute without an accepted dispatch record durable before it (check 3).
STALE_OWNER_ACTED = "stale_owner_acted"
#: An ack without an accepted enqueue record durable before it (check 3).
ACK_NOT_DURABLE = "ack_not_durable"
#: More distinct attempts than `1 + max_retries` (check 4).
ATTEMPTS_EXCEEDED = "attempts_exceeded"
#: More than `max_per_minute` first executions of a group in one window (check 5).
RATE_EXCEEDED = "rate_exceeded"
#: A ready task passed over for a less urgent one while a slot was free (check 6).
PRIORITY_INVERSION = "priority_inversion"
#: Two live tasks with one fingerprint in one shard (check 7).
DUPLICATE_PENDING = "duplicate_pending"
#: Two nodes believed they owned one shard at once, though the assumptions held (check 8).
BELIEF_OVERLAP = "belief_overlap"

#: A history: the recorded entries, in true-time order.
History = Sequence[Mapping[str, Any]]

# Entries that end a priority judgement on their node: the node's view of time or of its own
# state changed in ways the history does not show in detail.
_DISTURBANCES = frozenset({"crash", "restart", "pause", "resume", "clock_step"})


class HistoryError(ValueError):
    """The history is malformed: a bug in whatever recorded it, not in the system under test."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Violation:
    """One broken invariant, located at the history entry that proves it."""

    #: One of the module's violation kinds (`LOST_TASK`, `DOUBLE_OWNERSHIP`, ...).
    kind: str
    #: What happened, for a person reading a failed run.
    message: str
    #: Index of the offending history entry.
    index: int
    #: That entry's true time (µs).
    t: int

    def __str__(self) -> str:
        return f"[{self.kind}] #{self.index} {_at(self.t)}: {self.message}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Params:
    """The history's first entry: the run's settings as the checker needs them."""

    ttl_us: int
    margin_us: int
    fence: bool
    assumptions_hold: bool
    window_slack_us: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Metrics:
    """Measurements reported whether or not anything failed."""

    #: True time during which two or more nodes believed they owned one shard, summed over
    #: shards; and per shard.
    belief_overlap_us: int
    belief_overlap_us_by_shard: Mapping[int, int]
    #: "ok" enqueue replies, and how many of them said `deduplicated`.
    acked: int
    deduplicated: int
    #: Acks of enqueues made durable in an inbox file (see `inbox_record`).
    inbox_acked: int
    #: Acked tasks that finished (accepted tombstone; deduplicated: their fingerprint finished).
    finished: int
    #: Dead-letter deliveries the SDK saw.
    dead_letters: int
    #: Execute entries, and those that repeated a (task, attempt) already executed.
    executions: int
    re_executions: int
    #: The most distinct attempts any task made.
    max_attempts: int
    #: Records fencing kept out of the state (0 when the system under test does not fence).
    fenced_records: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    """The verdict on one history: every violation found, and the metrics."""

    violations: tuple[Violation, ...]
    metrics: Metrics

    @property
    def ok(self) -> bool:
        """True when no invariant was broken."""
        return not self.violations

    def describe(self, limit: int = 20) -> str:
        """A few lines for a person: the verdict, the metrics, the first `limit` violations."""
        m = self.metrics
        lines = [
            f"{'OK' if self.ok else 'FAILED'}: {len(self.violations)} violation(s); "
            f"acked {m.acked} ({m.deduplicated} deduplicated), finished {m.finished}, "
            f"executions {m.executions} (re-executions {m.re_executions}), max attempts "
            f"{m.max_attempts}, fenced records {m.fenced_records}, belief overlap "
            f"{m.belief_overlap_us} µs"
        ]
        lines += [str(v) for v in self.violations[:limit]]
        if len(self.violations) > limit:
            lines.append(f"... and {len(self.violations) - limit} more")
        return "\n".join(lines)


# ---------------------------------------------------------------------------- parsing


@dataclass(slots=True)
class _Invoke:
    index: int
    t: int
    task: str
    node: str
    type: str
    max_retries: int
    urgency: int
    group: str | None
    max_per_minute: int | None
    fingerprint: str | None
    delay_us: int
    parents: tuple[str, ...]
    cron: str | None
    pool: str | None


@dataclass(slots=True)
class _Ack:
    index: int
    t: int
    task: str
    node: str
    deduplicated: bool
    shard: int | None
    invoke: _Invoke


@dataclass(slots=True)
class _InboxRecord:
    index: int
    t: int
    shard: int
    node: str
    fields: Mapping[str, Any]
    t_issue: int
    t_durable: int


@dataclass(slots=True)
class _Record:
    index: int
    t: int
    shard: int
    node: str
    fields: Mapping[str, Any]
    t_issue: int
    #: When the record became durable (`t_durable`, else the entry's `t`).
    t_durable: int
    #: `snerdKind`, or None for a task record.
    kind: str | None
    #: The epoch fencing judges: a claim's `epoch`, else `snerdEpoch`; None when not an int.
    epoch: int | None
    accepted: bool
    #: The highest claim epoch before this record in its shard's log.
    fence: int
    #: The task a task record (`taskId`) or a dispatch record (`task`) is about, if a str.
    task_id: str | None
    #: A task record with `deletedAt` set.
    tombstone: bool
    #: When its writer was handed the append (`t_queued`, else `t_issue`): the node decided
    #: the record by then.
    t_queued: int


@dataclass(slots=True)
class _Execute:
    index: int
    t: int
    task: str
    attempt: int
    node: str
    shard: int
    epoch: int


@dataclass(slots=True)
class _Belief:
    index: int
    t: int
    node: str
    shard: int
    on: bool


#: Constructors of the parsed entries made for every history entry, positional (the fields in
#: declaration order). The classes are plain slotted dataclasses rather than frozen ones: a
#: frozen dataclass's `__init__` sets each field through `object.__setattr__`, and these are
#: built by the ten thousand per run. Nothing changes them once built.
_new_record = _Record
_new_inbox_record = _InboxRecord
_new_execute = _Execute
_new_belief = _Belief
_new_invoke = _Invoke
_new_ack = _Ack


@dataclass(slots=True, kw_only=True)
class _Analysis:
    """The history parsed once, with acceptance judged; every check reads from it."""

    params: Params
    end_t: int
    invokes: dict[str, list[_Invoke]] = field(default_factory=dict)
    acks: list[_Ack] = field(default_factory=list)
    records: list[_Record] = field(default_factory=list)
    executes: list[_Execute] = field(default_factory=list)
    beliefs: list[_Belief] = field(default_factory=list)
    #: (t, index, node) of crash entries.
    crashes: list[tuple[int, int, str]] = field(default_factory=list)
    #: Per node ("" for the whole world): (t, index) of entries that end a priority judgement.
    disturbances: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    dead_letters: int = 0
    ownership: list[Violation] = field(default_factory=list)
    #: Task records (accepted or fenced) by task id, in file order.
    task_records: dict[str, list[_Record]] = field(default_factory=dict)
    #: Dispatch records (accepted or fenced) by task id, in file order.
    dispatches: dict[str, list[_Record]] = field(default_factory=dict)
    #: Fingerprints of which some enqueued task has an accepted tombstone.
    finished_fingerprints: set[str] = field(default_factory=set)
    #: Per fingerprint: the history index of its latest accepted tombstone.
    fingerprint_finished_at: dict[str, int] = field(default_factory=dict)
    #: Inbox records, and those of each task id, in history order.
    inbox_records: list[_InboxRecord] = field(default_factory=list)
    inbox_by_task: dict[str, list[_InboxRecord]] = field(default_factory=dict)
    #: Entries fed so far.
    fed: int = 0
    #: Per shard: the fence (highest accepted claim epoch) so far.
    fences: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    #: Per shard: epoch -> (claiming node, history index).
    claimed: dict[int, dict[int, tuple[str, int]]] = field(
        default_factory=lambda: defaultdict(dict)
    )
    #: (shard, epoch, node) already reported as writing under someone else's epoch.
    foreign_seen: set[tuple[int, int, str]] = field(default_factory=set)
    #: Task ids with a task or inbox record fed, and fingerprints finished, since a
    #: `LivenessWatch` last looked: only acks of these can have become satisfied.
    touched_tasks: set[str] = field(default_factory=set)
    touched_fingerprints: set[str] = field(default_factory=set)

    def invoke_before(self, task: str, index: int, node: str | None = None) -> _Invoke | None:
        """The latest invoke of `task` before history entry `index`, preferring one sent to
        `node`: the enqueue that an entry about the task belongs to."""
        latest: _Invoke | None = None
        on_node: _Invoke | None = None
        for inv in self.invokes.get(task, ()):
            if inv.index >= index:
                break
            latest = inv
            if inv.node == node:
                on_node = inv
        return on_node or latest

    def via_inbox(self, ack: _Ack) -> bool:
        """An inbox ack: a record of the task in the acking node's inbox file of the acked
        shard, durable between the invoke and the ack (an entry listed after the ack at the
        same time counts too: a recorder may order equal times either way)."""
        if ack.deduplicated:
            return False
        return any(
            r.node == ack.node
            and (ack.shard is None or r.shard == ack.shard)
            and ack.invoke.t <= r.t_durable <= ack.t
            for r in self.inbox_by_task.get(ack.task, ())
        )

    def finished_after(self, task: str, index: int) -> _Record | None:
        """The first accepted tombstone of `task` durable after history entry `index`."""
        for rec in self.task_records.get(task, ()):
            if rec.index > index and rec.accepted and rec.tombstone:
                return rec
        return None

    def feed(self, history: History) -> None:
        """Parse the entries of `history` not fed yet (a history only ever grows), judging
        acceptance as records arrive: fencing is decided in file order, once."""
        for i in range(self.fed, len(history)):
            self._feed_one(i, history[i])
        self.fed = len(history)

    def _feed_one(self, i: int, e: Mapping[str, Any]) -> None:
        kind = e.get("kind")
        t = e.get("t")
        if type(t) is not int:  # `_need`'s common case inline (every entry)
            t = _need(e, "t", int, i)
        if t < self.end_t:
            raise HistoryError(
                f"history entry {i} ({kind!r}) goes back in time: {t} < {self.end_t}"
            )
        self.end_t = t
        if kind == "enqueue":
            self._feed_enqueue(i, t, e)
        elif kind == "record":
            self._feed_record(i, t, e)
        elif kind == "inbox_record":
            fields = e.get("fields")
            shard, node, t_issue = e.get("shard"), e.get("node"), e.get("t_issue")
            if (
                type(fields) is not dict
                or type(shard) is not int
                or type(node) is not str
                or type(t_issue) is not int
            ):
                fields = _need(e, "fields", dict, i)
                shard = _need(e, "shard", int, i)
                node = _need(e, "node", str, i)
                t_issue = _need(e, "t_issue", int, i)
            t_durable = e.get("t_durable")
            if type(t_durable) is not int:
                t_durable = _opt(e, "t_durable", int, i)
            rec = _new_inbox_record(
                i,  # index
                t,
                shard,
                node,
                fields,
                t_issue,
                t_durable or t,
            )
            self.inbox_records.append(rec)
            task_id = fields.get("taskId")
            if isinstance(task_id, str) and fields.get("snerdKind") is None:
                self.inbox_by_task.setdefault(task_id, []).append(rec)
                self.touched_tasks.add(task_id)
        elif kind == "execute":
            self.executes.append(
                _new_execute(
                    i,  # index
                    t,
                    _need(e, "task", str, i),
                    _need(e, "attempt", int, i),
                    _need(e, "node", str, i),
                    _need(e, "shard", int, i),
                    _need(e, "epoch", int, i),
                )
            )
        elif kind == "belief":
            self.beliefs.append(
                _new_belief(
                    i,  # index
                    t,
                    _need(e, "node", str, i),
                    _need(e, "shard", int, i),
                    _need(e, "on", bool, i),
                )
            )
        elif kind == "dead_letter":
            self.dead_letters += 1
        elif kind in _DISTURBANCES:
            node = e.get("node")
            if kind == "crash":
                self.crashes.append((t, i, _need(e, "node", str, i)))
            # Without a node it concerns the whole world (every clock stepped, say).
            self.disturbances.setdefault(node if isinstance(node, str) else "", []).append((t, i))

    def _feed_enqueue(self, i: int, t: int, e: Mapping[str, Any]) -> None:
        task = _need(e, "task", str, i)
        node = _need(e, "node", str, i)
        phase = e.get("phase")
        if phase == "invoke":
            inv = _parse_invoke(e, i, t, task, node)
            self.invokes.setdefault(task, []).append(inv)
            if inv.fingerprint is not None:
                done = [r for r in self.task_records.get(task, ()) if r.accepted and r.tombstone]
                if done:
                    self._fingerprint_finished(inv.fingerprint, done[-1].index)
            return
        inv_or_none = self.invoke_before(task, i, node)
        if inv_or_none is None:
            raise HistoryError(f"history entry {i}: enqueue {phase!r} of {task} without an invoke")
        if phase == "ok":
            dedup = e.get("deduplicated") is True
            if dedup and inv_or_none.fingerprint is None:
                raise HistoryError(
                    f"history entry {i}: {task} acked as deduplicated but its invoke carries no "
                    "fingerprint"
                )
            shard = _opt(e, "shard", int, i)
            self.acks.append(
                _new_ack(
                    i,  # index
                    t,
                    task,
                    node,
                    dedup,  # deduplicated
                    shard,
                    inv_or_none,  # invoke
                )
            )
        elif phase not in ("fail", "info"):
            raise HistoryError(f"history entry {i}: unknown enqueue phase {phase!r}")

    def _feed_record(self, i: int, t: int, e: Mapping[str, Any]) -> None:
        shard, node, fields = e.get("shard"), e.get("node"), e.get("fields")
        if type(shard) is not int or type(node) is not str or type(fields) is not dict:
            shard = _need(e, "shard", int, i)
            node = _need(e, "node", str, i)
            fields = _need(e, "fields", dict, i)
        rkind = fields.get("snerdKind")
        rkind = rkind if isinstance(rkind, str) else None
        epoch = fields.get("epoch" if rkind == KIND_CLAIM else "snerdEpoch")
        if not isinstance(epoch, int):  # `_int_epoch` inline
            epoch = None
        fence = self.fences[shard]
        claimed = self.claimed[shard]
        below = epoch is not None and epoch < fence
        accepted = not below or not self.params.fence
        if below and accepted:
            what = f"{rkind or 'task'} record"
            self.ownership.append(
                Violation(
                    kind=DOUBLE_OWNERSHIP,
                    index=i,
                    t=t,
                    message=(
                        f"shard {shard}: a {what} by {node} under epoch {epoch} was accepted after "
                        f"the claim of epoch {fence} (#{claimed[fence][1]}): a transition out of "
                        "epoch order"
                    ),
                )
            )
        if accepted and epoch is not None:
            owner = claimed.get(epoch)
            if rkind == KIND_CLAIM:
                if owner is None:
                    claimed[epoch] = (node, i)
                elif owner[0] != node:
                    self.ownership.append(
                        Violation(
                            kind=DOUBLE_OWNERSHIP,
                            index=i,
                            t=t,
                            message=(
                                f"shard {shard}: epoch {epoch} claimed by {owner[0]} (#{owner[1]}) "
                                f"and again by {node}"
                            ),
                        )
                    )
                self.fences[shard] = max(fence, epoch)
            elif (
                owner is not None
                and owner[0] != node
                and (shard, epoch, node) not in self.foreign_seen
            ):
                self.foreign_seen.add((shard, epoch, node))
                what = f"{rkind or 'task'} record"
                self.ownership.append(
                    Violation(
                        kind=DOUBLE_OWNERSHIP,
                        index=i,
                        t=t,
                        message=(
                            f"shard {shard}: {node} wrote an accepted {what} under epoch {epoch}, "
                            f"which {owner[0]} claimed (#{owner[1]})"
                        ),
                    )
                )
        t_issue, t_durable = e.get("t_issue"), e.get("t_durable")
        if type(t_issue) is not int:
            t_issue = _need(e, "t_issue", int, i)
        if type(t_durable) is not int:
            t_durable = _opt(e, "t_durable", int, i)
        t_queued = e.get("t_queued")
        if type(t_queued) is not int:
            t_queued = _opt(e, "t_queued", int, i)
        if rkind is None:
            task_id = fields.get("taskId")
            tombstone = fields.get("deletedAt") is not None
        else:
            task_id = fields.get("task") if rkind == KIND_DISPATCH else None
            tombstone = False
        if not isinstance(task_id, str):
            task_id = None
        rec = _new_record(
            i,  # index
            t,
            shard,
            node,
            fields,
            t_issue,
            t_durable or t,
            rkind,  # kind
            epoch,
            accepted,
            fence,
            task_id,
            tombstone,
            t_issue if t_queued is None else t_queued,  # t_queued
        )
        self.records.append(rec)
        if task_id is None:
            return
        if rkind == KIND_DISPATCH:
            self.dispatches.setdefault(task_id, []).append(rec)
            return
        self.task_records.setdefault(task_id, []).append(rec)
        self.touched_tasks.add(task_id)
        if accepted and tombstone:
            for inv in self.invokes.get(task_id, ()):
                if inv.fingerprint:
                    self._fingerprint_finished(inv.fingerprint, i)

    def _fingerprint_finished(self, fingerprint: str, index: int) -> None:
        self.finished_fingerprints.add(fingerprint)
        self.touched_fingerprints.add(fingerprint)
        if index > self.fingerprint_finished_at.get(fingerprint, -1):
            self.fingerprint_finished_at[fingerprint] = index


def _at(t: int) -> str:
    return f"t={t / 1_000_000:.6f}s"


def _need(entry: Mapping[str, Any], key: str, kind: type | tuple[type, ...], index: int) -> Any:
    value = entry.get(key)
    if type(value) is kind:  # the common case, exactly the type asked for (never bool for int)
        return value
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _types(kind)):
        raise HistoryError(
            f"history entry {index} ({entry.get('kind')!r}): {key!r} is {value!r}, expected "
            f"{' or '.join(k.__name__ for k in _types(kind))}"
        )
    return value


def _types(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _opt(entry: Mapping[str, Any], key: str, kind: type, index: int) -> Any:
    if entry.get(key) is None:
        return None
    return _need(entry, key, kind, index)


def _int_epoch(value: Any) -> int | None:
    # Mirrors the fold: any int counts (`isinstance(epoch, int)`).
    return value if isinstance(value, int) else None


def _parse_params(history: History) -> Params:
    if not history or history[0].get("kind") != "params":
        raise HistoryError("a history must start with its 'params' entry")
    p = history[0]
    return Params(
        ttl_us=_need(p, "ttl_us", int, 0),
        margin_us=_need(p, "margin_us", int, 0),
        fence=_need(p, "fence", bool, 0),
        assumptions_hold=_need(p, "assumptions_hold", bool, 0),
        window_slack_us=_need(p, "window_slack_us", int, 0),
    )


def _parse_invoke(e: Mapping[str, Any], i: int, t: int, task: str, node: str) -> _Invoke:
    attrs = _need(e, "attrs", dict, i)
    parents = attrs.get("parents") or []
    if not isinstance(parents, list | tuple) or not all(isinstance(p, str) for p in parents):
        raise HistoryError(f"history entry {i} (enqueue): attrs 'parents' must be a list of ids")
    if _need(attrs, "max_retries", int, i) < 0:
        raise HistoryError(f"history entry {i} (enqueue): attrs 'max_retries' is negative")
    get = attrs.get
    type_, urgency, group = get("type"), get("urgency"), get("group")
    per_minute, fingerprint, delay_us = get("max_per_minute"), get("fingerprint"), get("delay_us")
    cron, pool = get("cron"), get("pool")
    # `_need` and `_opt` only where the value is not what they would return as it is.
    if type(type_) is not str:
        type_ = _need(attrs, "type", str, i)
    if urgency is not None and type(urgency) is not int:
        urgency = _opt(attrs, "urgency", int, i)
    if group is not None and type(group) is not str:
        group = _opt(attrs, "group", str, i)
    if per_minute is not None and type(per_minute) is not int:
        per_minute = _opt(attrs, "max_per_minute", int, i)
    if fingerprint is not None and type(fingerprint) is not str:
        fingerprint = _opt(attrs, "fingerprint", str, i)
    if delay_us is not None and type(delay_us) is not int:
        delay_us = _opt(attrs, "delay_us", int, i)
    if cron is not None and type(cron) is not str:
        cron = _opt(attrs, "cron", str, i)
    if pool is not None and type(pool) is not str:
        pool = _opt(attrs, "pool", str, i)
    return _new_invoke(
        i,  # index
        t,
        task,
        node,
        type_,
        attrs["max_retries"],  # checked above
        urgency or 0,
        group,
        per_minute,
        fingerprint,
        delay_us or 0,
        tuple(parents),  # parents
        cron,
        pool,
    )


def _analyse(history: History) -> _Analysis:
    a = _Analysis(params=_parse_params(history), end_t=_need(history[0], "t", int, 0))
    a.feed(history)
    return a


# ---------------------------------------------------------------------------- 1. at-least-once


def _satisfied(a: _Analysis, ack: _Ack) -> bool:
    if not ack.deduplicated:
        if a.finished_after(ack.task, ack.invoke.index) is not None:
            return True
        # The owner drops an inbox task with `autoDedupe` when it ingests it while a task with
        # the same fingerprint is pending (only it can tell): that task finishing covers it.
        fp = ack.invoke.fingerprint
        return (
            fp is not None
            and a.via_inbox(ack)
            and a.fingerprint_finished_at.get(fp, -1) > ack.invoke.index
        )
    # The daemon may answer a duplicate while the original's tombstone is being written, and
    # the original may be an enqueue whose client never saw the reply: any finished task with
    # the fingerprint covers it.
    return ack.invoke.fingerprint in a.finished_fingerprints


def _at_least_once(a: _Analysis, satisfied: list[bool] | None = None) -> list[Violation]:
    """`satisfied`: `_satisfied` of each of `a.acks`, if the caller has it already."""
    out: list[Violation] = []
    if satisfied is None:
        satisfied = [_satisfied(a, ack) for ack in a.acks]
    for ack, done in zip(a.acks, satisfied, strict=True):
        if done:
            continue
        what = (
            f"as a duplicate of fingerprint {ack.invoke.fingerprint}, but no task with that "
            "fingerprint"
            if ack.deduplicated
            else "never"
        )
        fenced = [
            r
            for r in a.task_records.get(ack.task, ())
            if r.tombstone and not r.accepted and r.index > ack.invoke.index
        ]
        extra = (
            f" (its tombstone #{fenced[0].index} by {fenced[0].node} was fenced: epoch "
            f"{fenced[0].epoch} < {fenced[0].fence})"
            if fenced and not ack.deduplicated
            else ""
        )
        out.append(
            Violation(
                kind=LOST_TASK,
                index=ack.index,
                t=ack.t,
                message=(
                    f"task {ack.task} acked by {ack.node} at {_at(ack.t)} {what} completed or "
                    f"dead-lettered{extra}"
                ),
            )
        )
    reported: set[str] = set()
    # In history order (an entry is a record or an execute, never both: indexes are unique).
    sightings: list[tuple[int, _Record | _Execute]] = [
        (r.index, r) for r in a.records if r.accepted and r.task_id is not None
    ]
    sightings += [(x.index, x) for x in a.executes]
    sightings.sort(key=_first)
    invokes = a.invokes
    for index, seen in sightings:
        task = seen.task if isinstance(seen, _Execute) else seen.task_id
        assert task is not None
        if task in reported:
            continue
        listed = invokes.get(task)
        if listed and listed[0].index < index:  # `invoke_before(task, index) is not None`
            continue
        reported.add(task)
        if isinstance(seen, _Execute):
            where = f"an execute on {seen.node}"
        else:
            where = f"an accepted {seen.kind or 'task'} record in shard {seen.shard}"
        out.append(
            Violation(
                kind=INVENTED_TASK,
                index=index,
                t=seen.t,
                message=f"task {task} appears in {where} but no client had enqueued it",
            )
        )
    return out


def _first(pair: tuple[int, Any]) -> int:
    return pair[0]


def check_at_least_once(history: History) -> list[Violation]:
    """Every task acked (not as a duplicate) has an accepted tombstone — completed or
    dead-lettered — durable after its enqueue was sent; a duplicate's ack is covered when some
    task enqueued with its fingerprint finished, and so is an inbox ack of a task with a
    fingerprint when a task with it finished after the invoke (the owner drops such a task at
    ingestion while its twin is pending). And no task is invented: every task id in an
    accepted record or an execute was enqueued before."""
    return _at_least_once(_analyse(history))


def _unfinished(a: _Analysis) -> list[str]:
    out: dict[str, None] = {}
    for ack in a.acks:
        if not _satisfied(a, ack):
            out.setdefault(ack.task)
    return list(out)


def unfinished(history: History) -> list[str]:
    """Acked tasks (deduplicated ones included) not finished yet, in ack order: the world runs
    its liveness phase until this is empty (or gives up, and `check` reports them lost). To ask
    again and again of one growing history, use a `LivenessWatch`."""
    return _unfinished(_analyse(history))


class LivenessWatch:
    """`unfinished` for a history that keeps growing: each call parses only the entries
    appended since the last one and re-judges only the acks still open whose task has a new
    record or whose fingerprint finished since (a finished task stays finished: acceptance is
    decided once), so polling during the liveness phase stays cheap."""

    __slots__ = ("_acks_seen", "_analysis", "_by_fingerprint", "_by_task", "_open", "_tasks")

    def __init__(self) -> None:
        self._analysis: _Analysis | None = None
        #: The open acks by history index, in ack order.
        self._open: dict[int, _Ack] = {}
        #: The open acks of each task and each fingerprint (closed ones are dropped lazily).
        self._by_task: dict[str, list[_Ack]] = {}
        self._by_fingerprint: dict[str, list[_Ack]] = {}
        self._acks_seen = 0
        #: The task ids of `_open`, in order, once each (None: to be listed again).
        self._tasks: list[str] | None = []

    def unfinished(self, history: History) -> list[str]:
        """As the module's `unfinished`; `history` must be the one seen before, grown."""
        self._follow(history)
        if self._tasks is None:
            self._tasks = list(dict.fromkeys([ack.task for ack in self._open.values()]))
        return list(self._tasks)

    def any_unfinished(self, history: History) -> bool:
        """Whether `unfinished(history)` is not empty, without listing the tasks."""
        self._follow(history)
        return bool(self._open)

    def _follow(self, history: History) -> None:
        """Parse what `history` grew by and re-judge the open acks it can have satisfied."""
        if self._analysis is None:
            self._analysis = _Analysis(
                params=_parse_params(history), end_t=_need(history[0], "t", int, 0)
            )
        elif len(history) < self._analysis.fed:
            raise HistoryError("a LivenessWatch follows one history, which never shrinks")
        a = self._analysis
        a.feed(history)
        # An open ack can only have become satisfied through a record of its task or its
        # fingerprint finishing (`_satisfied` reads nothing else that changes): re-judge those.
        tasks, fingerprints = a.touched_tasks, a.touched_fingerprints
        if tasks or fingerprints:
            self._rejudge(a, self._by_task, tasks)
            self._rejudge(a, self._by_fingerprint, fingerprints)
            tasks.clear()
            fingerprints.clear()
        if self._acks_seen < len(a.acks):
            for ack in a.acks[self._acks_seen :]:
                if _satisfied(a, ack):
                    continue
                self._open[ack.index] = ack
                self._by_task.setdefault(ack.task, []).append(ack)
                if ack.invoke.fingerprint is not None:
                    self._by_fingerprint.setdefault(ack.invoke.fingerprint, []).append(ack)
                self._tasks = None
            self._acks_seen = len(a.acks)

    def _rejudge(self, a: _Analysis, index: dict[str, list[_Ack]], keys: set[str]) -> None:
        """Close the open acks listed in `index` under `keys` that are satisfied now."""
        open_ = self._open
        for key in keys:
            listed = index.get(key)
            if listed is None:
                continue
            still = []
            for ack in listed:
                if ack.index not in open_:
                    continue  # closed through its task or its fingerprint already
                if _satisfied(a, ack):
                    del open_[ack.index]
                    self._tasks = None
                else:
                    still.append(ack)
            if still:
                index[key] = still
            else:
                del index[key]

    def check(self, history: History) -> Report:
        """`check(history)`, reusing what was parsed already (the same verdict)."""
        self.unfinished(history)
        assert self._analysis is not None
        return _report(self._analysis)


# ---------------------------------------------------------------------------- 2. ownership


def check_ownership(history: History) -> list[Violation]:
    """No double ownership, judged on accepted records (see Acceptance in the module header):
    accepted transitions are in epoch order per shard (only a non-fencing system can break
    this), one epoch of a shard is claimed by one node, and accepted records under an epoch are
    written by the node that claimed it."""
    return list(_analyse(history).ownership)


# ---------------------------------------------------------------------------- 3. fenced acts


def _fenced_acts(a: _Analysis, via_inbox: list[bool] | None = None) -> list[Violation]:
    """`via_inbox`: `a.via_inbox` of each of `a.acks`, if the caller has it already."""
    out: list[Violation] = []
    for x in a.executes:
        matching = [
            r
            for r in a.dispatches.get(x.task, ())
            if r.t_durable <= x.t
            and r.shard == x.shard
            and r.fields.get("attempt") == x.attempt
            and r.epoch == x.epoch
        ]
        if any(r.accepted for r in matching):
            continue
        head = (
            f"stale owner acted: {x.node} executed task {x.task} attempt {x.attempt} under "
            f"epoch {x.epoch} of shard {x.shard} at {_at(x.t)}"
        )
        if matching:
            r = matching[-1]
            why = (
                f"its dispatch record (#{r.index}, durable at {_at(r.t_durable)}) was fenced by the "
                f"claim of epoch {r.fence}"
            )
        else:
            why = "no dispatch record of that attempt and epoch was durable before it"
        out.append(
            Violation(kind=STALE_OWNER_ACTED, index=x.index, t=x.t, message=f"{head}; {why}")
        )
    if via_inbox is None:
        via_inbox = [a.via_inbox(ack) for ack in a.acks]
    for ack, inbox in zip(a.acks, via_inbox, strict=True):
        if ack.deduplicated or inbox:
            continue  # an inbox ack is durable by its inbox record (see `inbox_record`)
        candidates = [
            r
            for r in a.task_records.get(ack.task, ())
            if ack.invoke.t <= r.t_durable <= ack.t
            and (ack.shard is None or r.shard == ack.shard)
            and r.fields.get("retryCount", 0) == 0
            and r.fields.get("deletedAt") is None
        ]
        if any(r.accepted for r in candidates):
            continue
        where = f" in shard {ack.shard}" if ack.shard is not None else ""
        why = (
            f"its enqueue record #{candidates[0].index} was fenced (epoch {candidates[0].epoch} "
            f"< {candidates[0].fence})"
            if candidates
            else f"no enqueue record of it{where} was durable by then"
        )
        out.append(
            Violation(
                kind=ACK_NOT_DURABLE,
                index=ack.index,
                t=ack.t,
                message=f"task {ack.task} acked by {ack.node} at {_at(ack.t)}, but {why}",
            )
        )
    return out


def check_fenced_acts(history: History) -> list[Violation]:
    """Nothing is told before the record that makes it true is accepted: every execute matches
    an accepted dispatch record (same shard, task, attempt and epoch) durable before it, and
    every ack (not as a duplicate) follows an accepted enqueue record of the task (`retryCount`
    0, no `deletedAt`, in the acked shard) durable between the invoke and the ack — or is an
    inbox ack, made durable by its `inbox_record` (one writer, no fence)."""
    return _fenced_acts(_analyse(history))


# ---------------------------------------------------------------------------- 4. attempts


@dataclass(frozen=True, slots=True, kw_only=True)
class _Runs:
    """The executes of one task incarnation. A task id may be enqueued again once finished;
    an execute belongs to the latest invoke of its task before it."""

    task: str
    invoke: _Invoke | None
    executes: list[_Execute]


def _task_runs(a: _Analysis) -> list[_Runs]:
    runs: dict[tuple[str, int], _Runs] = {}
    for x in a.executes:
        inv = a.invoke_before(x.task, x.index)
        key = (x.task, inv.index if inv is not None else -1)
        if key not in runs:
            runs[key] = _Runs(task=x.task, invoke=inv, executes=[])
        runs[key].executes.append(x)
    return list(runs.values())


def _attempts(runs: list[_Runs]) -> tuple[list[Violation], int, int]:
    out: list[Violation] = []
    re_executions = 0
    most = 0
    for run in runs:
        inv = run.invoke
        # Cron tasks re-arm with retryCount 0, so their attempt numbers repeat by design; a task
        # never enqueued is `INVENTED_TASK`'s business.
        judged = inv is not None and inv.cron is None
        allowed = attempts_allowed(inv.max_retries) if inv is not None else 0
        seen: set[int] = set()
        for x in run.executes:
            if x.attempt in seen:
                re_executions += 1
                continue
            seen.add(x.attempt)
            if judged and (len(seen) > allowed or x.attempt > allowed):
                judged = False  # one violation per task is enough to read
                assert inv is not None
                out.append(
                    Violation(
                        kind=ATTEMPTS_EXCEEDED,
                        index=x.index,
                        t=x.t,
                        message=(
                            f"task {run.task} ran attempt {x.attempt} on {x.node} at {_at(x.t)}: "
                            f"attempts {sorted(seen)} so far, but max_retries={inv.max_retries} "
                            f"allows {allowed}"
                        ),
                    )
                )
        most = max(most, len(seen))
    return out, re_executions, most


def check_attempts(history: History) -> list[Violation]:
    """Per task, the distinct attempt numbers executed stay within `1 + max_retries` (and none
    is above it). Re-executing an attempt number already executed is a crash re-execution,
    allowed and counted apart (`Metrics.re_executions`). Cron tasks (attrs `cron`) re-arm with
    their attempt count reset, so they are skipped."""
    return _attempts(_task_runs(_analyse(history)))[0]


# ---------------------------------------------------------------------------- 5. rate windows


def _rate_windows(params: Params, runs: list[_Runs]) -> list[Violation]:
    window = RATE_WINDOW_US - params.window_slack_us
    if window <= 0:
        return []
    limits: dict[str, int] = {}
    firsts: dict[str, list[_Execute]] = defaultdict(list)
    for run in runs:
        inv = run.invoke
        if inv is None or inv.group is None or inv.max_per_minute is None:
            continue
        # Tasks of one group may name different limits; the largest is the loosest judgement.
        limits[inv.group] = max(limits.get(inv.group, 0), inv.max_per_minute)
        seen: set[int] = set()
        for x in run.executes:
            if x.attempt not in seen:
                seen.add(x.attempt)
                firsts[inv.group].append(x)
    out: list[Violation] = []
    for group, execs in sorted(firsts.items()):
        execs.sort(key=lambda x: x.index)
        m = limits[group]
        for j in range(m, len(execs)):
            first, last = execs[j - m], execs[j]
            if last.t - first.t < window:
                out.append(
                    Violation(
                        kind=RATE_EXCEEDED,
                        index=last.index,
                        t=last.t,
                        message=(
                            f"group {group} (max_per_minute={m}): {m + 1} first executions within "
                            f"{(last.t - first.t) / 1e6:.3f} s, from task {first.task} at "
                            f"{_at(first.t)} to task {last.task} at {_at(last.t)} (window judged: "
                            f"{window / 1e6:.3f} s, 60 s less {params.window_slack_us} µs slack)"
                        ),
                    )
                )
    return out


def check_rate_windows(history: History) -> list[Violation]:
    """Per rate-limit group (tasks with `group` and `max_per_minute`), the first execute of
    each (task, attempt) counts at its true time; any `m + 1` of them less than 60 s minus
    `window_slack_us` apart are a violation (`m`: the largest limit the group's tasks name).
    Crash re-executions do not count, so the judgement is never stricter than the daemon's,
    which counts every dispatch; the slack covers clock error and dispatch-to-execute delay."""
    a = _analyse(history)
    return _rate_windows(a.params, _task_runs(a))


# ---------------------------------------------------------------------------- 6. priority


def _plain(inv: _Invoke) -> bool:
    """Ready as soon as acked and free of every other dispatch rule."""
    return inv.group is None and not inv.parents and inv.delay_us == 0 and inv.cron is None


def _priority(a: _Analysis, via_inbox: list[bool] | None = None) -> list[Violation]:
    """`via_inbox`: `a.via_inbox` of each of `a.acks`, if the caller has it already."""
    out: list[Violation] = []
    first_exec: dict[str, _Execute] = {}
    for x in a.executes:
        first_exec.setdefault(x.task, x)
    # Per node: (t, index) of entries that end a judgement window (clause 5), in history order.
    cuts: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for x in a.executes:
        cuts[x.node].append((x.t, x.index))
    for b in a.beliefs:
        cuts[b.node].append((b.t, b.index))
    for node, entries in a.disturbances.items():
        cuts[node].extend(entries)
    world = cuts.pop("", [])
    for entries in cuts.values():
        entries.extend(world)
        entries.sort()
    acks_by_node: dict[str, list[_Ack]] = defaultdict(list)
    if via_inbox is None:
        via_inbox = [a.via_inbox(ack) for ack in a.acks]
    for ack, inbox in zip(a.acks, via_inbox, strict=True):
        if not ack.deduplicated and not inbox:
            acks_by_node[ack.node].append(ack)
    ack_times = {node: [k.t for k in acks] for node, acks in acks_by_node.items()}
    #: Built on first use (a candidate inversion is rare).
    records_by_node: dict[str, list[_Record | _InboxRecord]] = {}

    def node_records(node: str) -> list[_Record | _InboxRecord]:
        if not records_by_node:
            by_node: dict[str, list[_Record | _InboxRecord]] = defaultdict(list)
            for r in a.records:
                by_node[r.node].append(r)
            # The node's writer thread serves its inbox appends too.
            for ir in a.inbox_records:
                by_node[ir.node].append(ir)
            records_by_node.update(by_node)
        return records_by_node.get(node, [])

    def touched(task: str, t: int) -> bool:
        """The task was executed, dispatched or finished by true time `t` (inclusive)."""
        x = first_exec.get(task)
        if x is not None and x.t <= t:
            return True
        if any(r.t_issue <= t for r in a.dispatches.get(task, ())):
            return True
        return any(r.tombstone and r.t <= t for r in a.task_records.get(task, ()))

    def writer_busy_since(node: str, d: _Record) -> int:
        """The latest durable time of a record `node` issued before `d`: until then an append
        of `node` was in flight, and `d` may have waited behind it."""
        return max(
            (r.t for r in node_records(node) if r is not d and r.t_issue < d.t_issue),
            default=-1,
        )

    for task, x in first_exec.items():
        inv_a = a.invoke_before(task, x.index)
        if x.attempt != 1 or inv_a is None or not _plain(inv_a):
            continue
        dispatches = a.dispatches.get(task, [])
        d = next(
            (
                r
                for r in dispatches
                if r.index < x.index
                and r.accepted
                and r.shard == x.shard
                and r.fields.get("attempt") == 1
                and r.epoch == x.epoch
            ),
            None,
        )
        if (
            d is None
            or d.node != x.node
            or d is not dispatches[0]
            or any(r.t_issue < d.t_issue for r in dispatches)
        ):
            continue
        # The latest cut at or before the issue time, A's own execute aside (with no disk
        # latency it shares D's time but follows D's entry).
        node_cuts = cuts.get(x.node, [])
        pos = bisect.bisect_left(node_cuts, (d.t_issue + 1, -1))
        while pos and node_cuts[pos - 1][1] > d.index:
            pos -= 1
        since = node_cuts[pos - 1][0] if pos else None
        acks = acks_by_node.get(x.node, [])
        times = ack_times.get(x.node, [])
        lo = bisect.bisect_right(times, since) if since is not None else 0
        # Acks after the node handed D to its writer do not count: it decided D before them
        # (D may then have waited behind other appends before its write was issued).
        hi = bisect.bisect_left(times, d.t_queued)
        busy: int | None = None
        for ack in acks[lo:hi]:
            inv_b = ack.invoke
            if (
                ack.task == task
                or ack.shard != x.shard
                or inv_b.type != inv_a.type
                or inv_b.pool != inv_a.pool
                or not _plain(inv_b)
                or inv_b.urgency <= inv_a.urgency
                or touched(ack.task, d.t_issue)
            ):
                continue
            if busy is None:
                busy = writer_busy_since(x.node, d)
            if busy >= ack.t:
                continue
            out.append(
                Violation(
                    kind=PRIORITY_INVERSION,
                    index=x.index,
                    t=x.t,
                    message=(
                        f"{x.node} dispatched task {task} (urgency {inv_a.urgency}) at "
                        f"{_at(d.t_issue)} while task {ack.task} (urgency {inv_b.urgency}, same type, "
                        f"shard {x.shard}), acked by {x.node} at {_at(ack.t)}, was ready and "
                        "nothing else ran on that node in between"
                    ),
                )
            )
            break
    out.sort(key=lambda v: v.index)
    return out


def check_priority(history: History) -> list[Violation]:
    """No ready task is passed over for a less urgent one while a worker slot is free — judged
    only where the history proves it, since a false alarm costs a whole CI run. Task B was
    passed over for task A on node N when all of these hold:

    1. A's first execute is on N with attempt 1, and matches an accepted dispatch record D
       (same shard, task, attempt 1, epoch) written by N: A's first dispatch record anywhere,
       durable first and issued first. `D.t_issue` stands for N's decision.
    2. N acked B (an "ok" naming the execute's shard, not deduplicated, not an inbox ack: such
       a task is ready only once ingested) strictly before `D.t_issue`; B != A.
    3. A and B have one type and one pool; neither has a group, parents, a delay or a cron;
       B's urgency is strictly above A's.
    4. By `D.t_issue` (inclusive) B had no execute, no dispatch record issued (accepted or
       fenced) and no tombstone durable, on any node.
    5. N had no belief change, crash, restart, pause, resume or clock step, and ran no
       execute, from B's ack to `D.t_issue` (inclusive; entries of the whole world without a
       node count for every node): N's view did not change, and the slot A took was free for B.
    6. No other record N issued before D, in a log or in an inbox file, was still in flight
       (durable at or after B's ack): N's writer was idle, so D was issued when N decided, not queued behind an earlier
       append from before B's ack.
    """
    return _priority(_analyse(history))


# ---------------------------------------------------------------------------- 7. dedupe


def _dedupe(a: _Analysis) -> list[Violation]:
    out: list[Violation] = []
    # Per shard: live task -> its fingerprint (None when it takes no part in dedupe).
    live: dict[int, dict[str, str | None]] = defaultdict(dict)
    for r in a.records:
        task = r.task_id
        if not r.accepted or r.kind is not None or task is None:
            continue
        shard_live = live[r.shard]
        if r.tombstone:
            shard_live.pop(task, None)
            continue
        h = r.fields.get("payloadHash")
        fp = h if r.fields.get("autoDedupe") is True and isinstance(h, str) else None
        if fp is not None and shard_live.get(task) != fp:
            twin = next(
                (other for other, f in shard_live.items() if f == fp and other != task), None
            )
            if twin is not None:
                out.append(
                    Violation(
                        kind=DUPLICATE_PENDING,
                        index=r.index,
                        t=r.t,
                        message=(
                            f"shard {r.shard}: task {task} became pending (record by {r.node}) "
                            f"while task {twin} with the same fingerprint {fp} was still pending "
                            "(auto_dedupe)"
                        ),
                    )
                )
        shard_live[task] = fp
    return out


def check_dedupe(history: History) -> list[Violation]:
    """Per shard, over accepted records in file order: no two live tasks (enqueued, not yet
    tombstoned) with `autoDedupe` and one `payloadHash` at the same time."""
    return _dedupe(_analyse(history))


# ---------------------------------------------------------------------------- 8. belief


def _belief(a: _Analysis) -> tuple[list[Violation], dict[int, int]]:
    # Intervals per shard: (start, end, node, index of the "on" entry).
    intervals: dict[int, list[tuple[int, int, str, int]]] = defaultdict(list)
    open_: dict[tuple[int, str], tuple[int, int]] = {}
    events: list[tuple[int, int, str, int | None, bool]] = [
        (b.t, b.index, b.node, b.shard, b.on) for b in a.beliefs
    ]
    events += [(t, i, node, None, False) for t, i, node in a.crashes]
    events.sort(key=lambda e: e[1])
    for t, index, node, shard, on in events:
        keys = [(shard, node)] if shard is not None else [k for k in open_ if k[1] == node]
        for key in keys:
            if on and key not in open_:
                open_[key] = (t, index)
            elif not on and key in open_:
                start, start_index = open_.pop(key)
                intervals[key[0]].append((start, t, node, start_index))
    for (shard, node), (start, start_index) in open_.items():
        intervals[shard].append((start, a.end_t, node, start_index))
    out: list[Violation] = []
    by_shard: dict[int, int] = {}
    for shard, spans in sorted(intervals.items()):
        # Sweep: at one instant, ends before starts, so a hand-over at one time is no overlap.
        points = sorted(
            [(s, 1, node, idx) for s, _e, node, idx in spans]
            + [(e, 0, node, idx) for _s, e, node, idx in spans]
        )
        active: dict[str, int] = {}
        total = 0
        prev = 0
        episode: tuple[int, int, list[str]] | None = None
        for t, starts, node, idx in points:
            if len(active) >= 2:
                total += t - prev
            prev = t
            if starts:
                active[node] = idx
                if len(active) == 2 and episode is None:
                    episode = (t, idx, sorted(active))
            else:
                active.pop(node, None)
                if len(active) < 2 and episode is not None:
                    begin, idx0, nodes = episode
                    episode = None
                    if t > begin and a.params.assumptions_hold:
                        out.append(
                            Violation(
                                kind=BELIEF_OVERLAP,
                                index=idx0,
                                t=begin,
                                message=(
                                    f"shard {shard}: {' and '.join(nodes)} both believed they owned "
                                    f"it from {_at(begin)} to {_at(t)} ({t - begin} µs), though "
                                    "clock rates stayed within what the margin tolerates"
                                ),
                            )
                        )
        by_shard[shard] = total
    return out, by_shard


def check_belief(history: History) -> list[Violation]:
    """Belief overlap: the true time two or more nodes believed they owned one shard at once
    (a node's belief ends at its "off", its crash, or the end of the history). Always measured
    (`Metrics.belief_overlap_us`); a violation only when `params.assumptions_hold`."""
    return _belief(_analyse(history))[0]


# ---------------------------------------------------------------------------- all together


def check(history: History) -> Report:
    """Run every check on one history and measure it."""
    return _report(_analyse(history))


def _report(a: _Analysis) -> Report:
    runs = _task_runs(a)
    attempts, re_executions, most = _attempts(runs)
    belief, overlap = _belief(a)
    # Each ack judged once for every check and measure that asks.
    via_inbox = [a.via_inbox(ack) for ack in a.acks]
    satisfied = [_satisfied(a, ack) for ack in a.acks]
    violations = [
        *_at_least_once(a, satisfied),
        *a.ownership,
        *_fenced_acts(a, via_inbox),
        *attempts,
        *_rate_windows(a.params, runs),
        *_priority(a, via_inbox),
        *_dedupe(a),
        *belief,
    ]
    violations.sort(key=lambda v: v.index)
    metrics = Metrics(
        belief_overlap_us=sum(overlap.values()),
        belief_overlap_us_by_shard=overlap,
        acked=len(a.acks),
        deduplicated=sum(1 for k in a.acks if k.deduplicated),
        inbox_acked=sum(via_inbox),
        finished=sum(satisfied),
        dead_letters=a.dead_letters,
        executions=len(a.executes),
        re_executions=re_executions,
        max_attempts=most,
        fenced_records=sum(1 for r in a.records if not r.accepted),
    )
    return Report(violations=tuple(violations), metrics=metrics)
