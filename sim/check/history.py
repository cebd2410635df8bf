"""The history a run is judged on: its format, and its parsing into one `Analysis`.

A history is a plain list of JSON-able dicts. This module knows nothing of how it was produced,
so the deterministic simulator (`sim.world`) and jepsen-lite (real processes) share it; it
never imports the shell (`snerd.io`), trio, os, time or random, nor reaches into the
simulator's objects. `analyse` parses a history once into an `Analysis` that every invariant
module reads; `Analysis.feed` parses only what a growing history appended since (for
`sim.check.liveness.LivenessWatch`). Acceptance is judged here, as records arrive, because
fencing is decided in file order, once; the epochs behind it are kept by
`sim.check.ownership.EpochLedger`, which judges ownership on the way.

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
  (str|None, set when auto_dedupe), `delay_us` (int), `parents` (list of ids: the enqueue's
  `trigger_after_ids`, judged by `sim.check.deps`); optional:
  `cron` (str|None), `pool` (str|None). Missing optional attrs read as None / 0 / [].
- `{"kind": "enqueue", "phase": "ok"|"fail"|"info", "task", "node"}` — its outcome. "ok" may
  carry `"deduplicated": true` with, optionally, `"duplicate_of"` (the twin's id, as the ack
  named it; older histories lack it), or `"undecided": true` (the ack said the owner had not
  decided yet whether it was a duplicate), and `"shard": int`. "fail": an error reply; "info": unknown
  (the process crashed before the reply). Neither obliges the task to finish. Every outcome
  follows an invoke of the same task.
- `{"kind": "execute", "task", "attempt", "node", "shard", "epoch"}` — a handler was handed an
  attempt. `{"kind": "handler_done", "task", "attempt", "node", "ok": bool}` — it returned
  (a failure its SDK marked final, sent with `"retry": false`, has `"final": true`);
  optional: `result` (any JSON value), what a successful attempt returned, which its `result`
  line carried (absent: it returned nothing).
- `{"kind": "stored_result", "task", "shard"}` — at the end of a run, a completed task's
  tombstone as the final log holds it, read back through the core's fold
  (`snerd.core.shardlog`); optional: `result` (absent: the tombstone stores none). Judged by
  `sim.check.results`; a history without them (jepsen-lite's) is judged on nothing there.
- `{"kind": "record", "shard", "node", "epoch", "fields": {...}, "t_issue": int}` — one record
  became durable in shard `shard`'s log. Entries for one shard are in that log's file order
  (the order readers see; the append history, untouched by compaction), which can differ from
  the order in which they became durable; `t_durable` (optional, default `t`) says when each
  did, and "acked only once durable" is judged on it. `node`: the writer (its name in the history,
  also used to tell claimers apart); `fields`: the record as written, merged with its base
  record (so a tombstone carries `taskId`): `snerdKind`, `snerdEpoch`, `snerdNode`, `taskId`,
  `retryCount`, `deletedAt`, `snerdOutcome`, `payloadHash`, `autoDedupe`, a claim's `epoch`, a
  dispatch's `task` and `attempt`, a schedule's run's `snerdSchedule` (the schedule it is a run
  of: such a task has no invoke; its enqueue record, `retryCount` 0, is what creates it), a
  schedule's own record (`snerdKind` "schedule", its `name`, `removed` when unscheduled), ... The entry's own `epoch` is informative: fencing reads
  `fields`. `t_issue`: when the writer issued the append (at or before `t`); `t_queued`
  (optional, default `t_issue`): when the node handed it to the writer (at or before `t_issue`).
- `{"kind": "inbox_record", "shard", "node", "fields": {...}, "t_issue": int, "offset": int}`
  — one record became durable in `node`'s inbox file of shard `shard`
  (`shard-N/inbox/<node>.log`): a task `node` took for a shard it did not own, which the
  shard's owner later copies into its log. Listed when it becomes durable (`t_durable`,
  optional, default `t`); an inbox file has one writer, so that is its file order too. An ack
  by `node` of a task with such a record (in the acked shard, durable between the invoke and
  the ack) is an *inbox ack*: its durability is that record's, not a log record's.
- `{"kind": "schedule", "action": "schedule"|"unschedule", "name", "node"}` — the app sent a
  schedule's declaration or removal to `node` (informative: a schedule is judged on its
  records and its runs').
- `{"kind": "command", "phase": "invoke", "action": "cancel"|"retry"|"pause"|"resume", "node",
  "task" | "type"}` — the app sent a job-control command to `node`: a cancel or retry names a
  `task`; a pause or resume a `type` (None: the whole queue, `"queue": true`). Its outcome,
  `{"kind": "command", "phase": "ok"|"fail", "action", "node", "task"|"type", "reply": {...}}`,
  matches the earliest unanswered invoke of the same node, action and target; `reply` is the
  daemon's answer as sent (`cancelled`, `retried` or `paused`, with `found`, `pending`, ...);
  "fail": an error reply. A command without an outcome was not answered (a crash). Judged by
  `sim.check.control`. `{"kind": "control", "offset_max_us", "drift_max_ppm", "steps": bool}`
  — before the first command: the most two hosts' wall clocks can differ by (offsets, and
  drift per µs of true time; `steps`: clocks were stepped, no bound), for judging pause stamps.
  `{"kind": "stop", "task", "attempt", "node"}` — the SDK was told to stop a cancelled
  attempt (informative).
- `{"kind": "dead_letter", "task", "node"}` — the SDK was told a task used every attempt;
  optional: `error` (str|None), the reason it was told (the last attempt's error, or
  `blocked_by_failed_parent: <id>` / `unknown_parent: <id> ...` for a child that never ran).
  Informative: the ends are judged on the tombstones.
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

A malformed history is the recorder's bug and raises `HistoryError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sim.check.ownership import EpochLedger
from sim.check.report import Params
from snerd.core.schema import (
    CLAIM_EPOCH,
    DELETED_AT,
    DISPATCH_TASK,
    KIND_CLAIM,
    KIND_DISPATCH,
    KIND_SCHEDULE,
    MAX_RETRIES,
    RETRY_COUNT,
    SCHEDULE_NAME,
    SCHEDULE_REMOVED,
    SNERD_EPOCH,
    SNERD_KIND,
    SNERD_SCHEDULE,
    TASK_ID,
)

__all__ = [
    "Ack",
    "Analysis",
    "Belief",
    "Execute",
    "History",
    "HistoryError",
    "InboxRecord",
    "Invoke",
    "Record",
    "StoredResult",
    "analyse",
    "parse_params",
    "start_analysis",
]

#: A history: the recorded entries, in true-time order.
History = Sequence[Mapping[str, Any]]

# Entries that end a priority judgement on their node: the node's view of time or of its own
# state changed in ways the history does not show in detail.
_DISTURBANCES = frozenset({"crash", "restart", "pause", "resume", "clock_step"})
#: Entries `sim.check.control` reads (kept raw, in history order).
_CONTROL_KINDS = frozenset(
    {"command", "control", "pause", "resume", "crash", "handler_done", "stop", "dead_letter"}
)


class HistoryError(ValueError):
    """The history is malformed: a bug in whatever recorded it, not in the system under test."""


@dataclass(slots=True)
class Invoke:
    """An enqueue `invoke` entry, its attrs read as the format says (missing: None, 0, [])."""

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
class Ack:
    """An enqueue's "ok" outcome, with the invoke it answers."""

    index: int
    t: int
    task: str
    node: str
    deduplicated: bool
    shard: int | None
    invoke: Invoke
    #: The ack said `"deduplicated": null`: the shard's owner (another daemon) did not
    #: decide in time whether the enqueue was a duplicate.
    undecided: bool = False
    #: The twin a deduplicated ack named (None: not named, or not recorded).
    duplicate_of: str | None = None


@dataclass(slots=True)
class InboxRecord:
    """An `inbox_record` entry."""

    index: int
    t: int
    shard: int
    node: str
    fields: Mapping[str, Any]
    t_issue: int
    t_durable: int


@dataclass(slots=True)
class Record:
    """A `record` entry, with its acceptance judged (in its shard's file order)."""

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
class Execute:
    """An `execute` entry."""

    index: int
    t: int
    task: str
    attempt: int
    node: str
    shard: int
    epoch: int


@dataclass(slots=True)
class StoredResult:
    """A `stored_result` entry: `result` is None when the tombstone stores none."""

    index: int
    t: int
    task: str
    shard: int
    result: Any


@dataclass(slots=True)
class Belief:
    """A `belief` entry."""

    index: int
    t: int
    node: str
    shard: int
    on: bool


#: Constructors of the parsed entries made for every history entry, positional (the fields in
#: declaration order). The classes are plain slotted dataclasses rather than frozen ones: a
#: frozen dataclass's `__init__` sets each field through `object.__setattr__`, and these are
#: built by the ten thousand per run. Nothing changes them once built.
_new_record = Record
_new_inbox_record = InboxRecord
_new_execute = Execute
_new_belief = Belief
_new_invoke = Invoke
_new_ack = Ack


@dataclass(slots=True, kw_only=True)
class Analysis:
    """The history parsed once, with acceptance judged; every check reads from it."""

    params: Params
    end_t: int
    #: The claims and fences of every shard so far, and the ownership violations found.
    epochs: EpochLedger
    invokes: dict[str, list[Invoke]] = field(default_factory=dict)
    acks: list[Ack] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)
    executes: list[Execute] = field(default_factory=list)
    beliefs: list[Belief] = field(default_factory=list)
    #: (t, index, node) of crash entries.
    crashes: list[tuple[int, int, str]] = field(default_factory=list)
    #: Per node ("" for the whole world): (t, index) of entries that end a priority judgement.
    disturbances: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    dead_letters: int = 0
    #: Per task: when a handler first returned success for it (`handler_done` with `ok`).
    succeeded: dict[str, int] = field(default_factory=dict)
    #: Per task: what each of its successful attempts returned (None: nothing), in order.
    returned: dict[str, list[Any]] = field(default_factory=dict)
    #: Failures an SDK marked final (`handler_done` with `final`): (index, t, task, attempt,
    #: node), in history order.
    finals: list[tuple[int, int, str, int, str]] = field(default_factory=list)
    #: The completed tasks' results read back at the end (`stored_result`).
    stored: list[StoredResult] = field(default_factory=list)
    #: Task records (accepted or fenced) by task id, in file order.
    task_records: dict[str, list[Record]] = field(default_factory=dict)
    #: Dispatch records (accepted or fenced) by task id, in file order.
    dispatches: dict[str, list[Record]] = field(default_factory=dict)
    #: Fingerprints of which some enqueued task has an accepted tombstone.
    finished_fingerprints: set[str] = field(default_factory=set)
    #: Per fingerprint: the history index of its latest accepted tombstone.
    fingerprint_finished_at: dict[str, int] = field(default_factory=dict)
    #: Inbox records, and those of each task id, in history order.
    inbox_records: list[InboxRecord] = field(default_factory=list)
    inbox_by_task: dict[str, list[InboxRecord]] = field(default_factory=dict)
    #: Per schedule run id (a task record with `snerdSchedule`): the enqueue records that
    #: created it (`retryCount` 0, not a tombstone; accepted or fenced), in file order, and
    #: the schedule it is a run of and its `maxRetries`.
    run_creations: dict[str, list[Record]] = field(default_factory=dict)
    run_schedule: dict[str, tuple[str, int]] = field(default_factory=dict)
    #: Per schedule name: the history indexes of its accepted removal records (`removed`).
    schedule_removals: dict[str, list[int]] = field(default_factory=dict)
    #: (index, entry) of the entries `sim.check.control` judges commands by.
    control_entries: list[tuple[int, Mapping[str, Any]]] = field(default_factory=list)
    #: Entries fed so far.
    fed: int = 0
    #: Task ids with a task or inbox record fed, and fingerprints finished, since a
    #: `LivenessWatch` last looked: only acks of these can have become satisfied.
    touched_tasks: set[str] = field(default_factory=set)
    touched_fingerprints: set[str] = field(default_factory=set)

    def invoke_before(self, task: str, index: int, node: str | None = None) -> Invoke | None:
        """The latest invoke of `task` before history entry `index`, preferring one sent to
        `node`: the enqueue that an entry about the task belongs to."""
        latest: Invoke | None = None
        on_node: Invoke | None = None
        for inv in self.invokes.get(task, ()):
            if inv.index >= index:
                break
            latest = inv
            if inv.node == node:
                on_node = inv
        return on_node or latest

    def via_inbox(self, ack: Ack) -> bool:
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

    def finished_after(self, task: str, index: int) -> Record | None:
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
        if kind in _CONTROL_KINDS:
            self.control_entries.append((i, e))
            if kind == "command":
                # A command may end or hold any task, wherever it was sent: no priority
                # judgement spans one.
                self.disturbances.setdefault("", []).append((t, i))
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
            task_id = fields.get(TASK_ID)
            if isinstance(task_id, str) and fields.get(SNERD_KIND) is None:
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
        elif kind == "handler_done":
            if e.get("ok") is True:
                task = _need(e, "task", str, i)
                self.succeeded.setdefault(task, t)
                self.returned.setdefault(task, []).append(e.get("result"))
            elif e.get("final") is True:
                self.finals.append((i, t, _need(e, "task", str, i), _need(e, "attempt", int, i),
                                    _need(e, "node", str, i)))
        elif kind == "stored_result":
            self.stored.append(
                StoredResult(
                    i, t, _need(e, "task", str, i), _need(e, "shard", int, i), e.get("result")
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
                    e.get("undecided") is True,  # undecided
                    _opt(e, "duplicate_of", str, i) if dedup else None,  # duplicate_of
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
        rkind = fields.get(SNERD_KIND)
        rkind = rkind if isinstance(rkind, str) else None
        epoch = fields.get(CLAIM_EPOCH if rkind == KIND_CLAIM else SNERD_EPOCH)
        if not isinstance(epoch, int):  # `_int_epoch` inline
            epoch = None
        accepted, fence = self.epochs.judge(i, t, shard, node, rkind, epoch)
        t_issue, t_durable = e.get("t_issue"), e.get("t_durable")
        if type(t_issue) is not int:
            t_issue = _need(e, "t_issue", int, i)
        if type(t_durable) is not int:
            t_durable = _opt(e, "t_durable", int, i)
        t_queued = e.get("t_queued")
        if type(t_queued) is not int:
            t_queued = _opt(e, "t_queued", int, i)
        if rkind is None:
            task_id = fields.get(TASK_ID)
            tombstone = fields.get(DELETED_AT) is not None
        else:
            task_id = fields.get(DISPATCH_TASK) if rkind == KIND_DISPATCH else None
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
        if rkind == KIND_SCHEDULE:
            name = fields.get(SCHEDULE_NAME)
            if accepted and isinstance(name, str) and fields.get(SCHEDULE_REMOVED) is True:
                self.schedule_removals.setdefault(name, []).append(i)
            return
        if task_id is None:
            return
        if rkind == KIND_DISPATCH:
            self.dispatches.setdefault(task_id, []).append(rec)
            return
        self.task_records.setdefault(task_id, []).append(rec)
        self.touched_tasks.add(task_id)
        schedule = fields.get(SNERD_SCHEDULE)
        if isinstance(schedule, str):
            self._feed_run(rec, task_id, schedule)
        if accepted and tombstone:
            for inv in self.invokes.get(task_id, ()):
                if inv.fingerprint:
                    self._fingerprint_finished(inv.fingerprint, i)

    def _feed_run(self, rec: Record, task_id: str, schedule: str) -> None:
        """A task record of a schedule's run."""
        retries = rec.fields.get(MAX_RETRIES)
        if task_id not in self.run_schedule:
            self.run_schedule[task_id] = (schedule, retries if type(retries) is int else 0)
        if not rec.tombstone and rec.fields.get(RETRY_COUNT) == 0:
            self.run_creations.setdefault(task_id, []).append(rec)

    def _fingerprint_finished(self, fingerprint: str, index: int) -> None:
        self.finished_fingerprints.add(fingerprint)
        self.touched_fingerprints.add(fingerprint)
        if index > self.fingerprint_finished_at.get(fingerprint, -1):
            self.fingerprint_finished_at[fingerprint] = index


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


def parse_params(history: History) -> Params:
    """The `params` entry a history must start with."""
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


def _parse_invoke(e: Mapping[str, Any], i: int, t: int, task: str, node: str) -> Invoke:
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


def start_analysis(history: History) -> Analysis:
    """An `Analysis` of `history` that has read its `params` entry and nothing else yet."""
    params = parse_params(history)
    return Analysis(
        params=params, end_t=_need(history[0], "t", int, 0), epochs=EpochLedger(params.fence)
    )


def analyse(history: History) -> Analysis:
    """`history` parsed, with acceptance judged."""
    a = start_analysis(history)
    a.feed(history)
    return a
