"""What a node hands the shell: the effects of the current call, and the appends in flight.

`Outbox` owns the effect buffer of one call (`handle` / `handle_burst` / `on_commit`), the
token counter, the merging of the appends of one call into one `Append` per shard, the
pending record of every append in flight (what it means once it commits or fails), and the
queue of failed outcome appends waiting for another try. It calls no other part of the node:
every part emits through it, and the commit outcomes read its `pending` back
(`snerd.core.node.node`).

It never decides what a record says or what an outcome means; it only keeps each append's
pending with it, in order, so that the outcome finds it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from snerd.core import effects as fx
from snerd.core import events as ev
from snerd.core.node.model import InboxSegment, ShardInfo, new_append, new_send, require
from snerd.core.ready_queue import DueQueue

__all__ = [
    "ClaimPart",
    "CompactPart",
    "DispatchRun",
    "EnqueuePart",
    "EnqueueRun",
    "FinishPart",
    "FinishRun",
    "GroupPart",
    "InboxPart",
    "IngestPart",
    "OpenAppend",
    "Outbox",
    "PausePart",
    "PendingAppend",
    "PurgePart",
    "RearmPart",
    "RequeuePart",
    "RetryPart",
    "Run",
]


@dataclass(slots=True)
class OpenAppend:
    """An `Append` emitted during the current call, which later appends to its shard join
    (`Outbox.append`)."""

    token: int
    shard: int
    #: Its place in the effects of the call.
    index: int
    tenure: int
    #: Every record once a second append has joined (the effect is rebuilt at the end of the
    #: call); None while it is the first alone.
    records: list[fx.NewRecord] | None = None
    #: An `Append` with `lazy` set (success tombstones; `Outbox.open_lazy`).
    lazy: bool = False
    #: Its last part: a run of plain enqueues there takes more of them (`append_run`).
    last: PendingAppend | None = None


@dataclass(slots=True)
class PendingAppend:
    """What an `Append` in flight will mean once it commits (or fails): one of the kinds
    below, each a class of its own (the outcomes are dispatched on the class,
    `snerd.core.node.outcomes`). `KIND` names it in log lines."""

    KIND: ClassVar[str] = ""
    shard: int
    #: For outcome appends: the effect to retry with if it fails.
    effect: fx.Append | None = None
    #: The SDK was already answered: acked as the append committed (`Node.on_commit`),
    #: or told the shard changed owner before it did (`Tenure.step_down`).
    answered: bool = False
    #: The shard's tenure when the append was issued (`ShardInfo.tenure`).
    tenure: int = 0
    #: How many records of its `Append` are its own (all of them, unless merged).
    count: int = 0


@dataclass(slots=True)
class EnqueuePart(PendingAppend):
    """One enqueue's task record (and, dispatched with it, its first dispatch record)."""

    KIND: ClassVar[str] = "enqueue"
    task_id: str = ""
    #: Tasks dropped by dedupe while this enqueue was in flight: acked when it commits.
    dedupe_waiters: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Run(PendingAppend):
    """One record per task of `ids`, each meaning the same for its task (`Outbox.append_run`):
    committed or failed one by one, in order."""

    ids: list[str] = field(default_factory=list)


@dataclass(slots=True)
class EnqueueRun(Run):
    """Plain enqueues (`Intake.lines`), each as an `EnqueuePart` with no waiters would be."""

    KIND: ClassVar[str] = "enqueues"


@dataclass(slots=True)
class DispatchRun(Run):
    """Dispatch records, one per attempt."""

    KIND: ClassVar[str] = "dispatches"


@dataclass(slots=True)
class FinishRun(Run):
    """Success tombstones, in the call's lazy append (`fx.Append.lazy`)."""

    KIND: ClassVar[str] = "finishes"


@dataclass(slots=True)
class FinishPart(PendingAppend):
    """One task's tombstone: the task finished with `outcome`."""

    KIND: ClassVar[str] = "finish"
    task_id: str = ""
    outcome: str = ""
    error: str | None = None


@dataclass(slots=True)
class RetryPart(PendingAppend):
    """A failed attempt's retry record: the task is due again at `ready_at` (wall µs)."""

    KIND: ClassVar[str] = "retry"
    task_id: str = ""
    ready_at: int = 0


@dataclass(slots=True)
class RearmPart(PendingAppend):
    """A cron task's re-arm record: due again at `ready_at` (wall µs)."""

    KIND: ClassVar[str] = "rearm"
    task_id: str = ""
    ready_at: int = 0


@dataclass(slots=True)
class ClaimPart(PendingAppend):
    """The claim record that fences a shard after its replay."""

    KIND: ClassVar[str] = "claim"


@dataclass(slots=True)
class InboxPart(PendingAppend):
    """An enqueue, or a schedule's declaration, written to this node's own inbox `segment`
    for a shard it does not own."""

    KIND: ClassVar[str] = "inbox"
    task_id: str = ""
    segment: InboxSegment | None = None
    #: A declaration (or removal) of this schedule, not an enqueue: answered `forwarded` once
    #: durable, or refused by the schedule's name.
    schedule: str = ""
    #: An enqueue with dedupe: answered with the owner's decision (`Verdicts`), not at its write.
    verdict: bool = False
    #: A command (cancel, retry, pause): the number of the `Ask` in `Control` waiting for
    #: the owner's answer; 0 for none.
    ask: int = 0


@dataclass(slots=True)
class PausePart(PendingAppend):
    """A shard's `pause` record for one task type (None: the whole queue)."""

    KIND: ClassVar[str] = "pause"
    task_type: str | None = None
    #: The `Ask` answered once it lands (0: none, a pause ingested from an inbox).
    ask: int = 0


@dataclass(slots=True)
class PurgePart(PendingAppend):
    """A shard's `purge` records: the ended tasks a purge forgot (`snerd.core.control`)."""

    KIND: ClassVar[str] = "purge"
    #: The `Ask` answered once it lands (0: none, a purge ingested from an inbox).
    ask: int = 0


@dataclass(slots=True)
class RequeuePart(PendingAppend):
    """A finished task put back in the queue: its new record (`snerd.core.control`)."""

    KIND: ClassVar[str] = "requeue"
    task_id: str = ""
    ask: int = 0
    #: The state it was found in (`snerd.core.control`), for the answer.
    found: str = ""


@dataclass(slots=True)
class IngestPart(PendingAppend):
    """An inbox chunk taken in: its tasks (None for a record dropped), then the `inbox` record
    saying `writer`'s file is ingested up to `end`."""

    KIND: ClassVar[str] = "ingest"
    tasks: list[str | None] = field(default_factory=list)
    writer: str = ""
    end: int = 0


@dataclass(slots=True)
class SchedulePart(PendingAppend):
    """A schedule's record: declared (or removed) here, answered once it lands."""

    KIND: ClassVar[str] = "schedule"
    name: str = ""
    #: The answer once it lands (`created`, `updated`, `removed`); "" for none.
    result: str = ""


@dataclass(slots=True)
class FirePart(PendingAppend):
    """A schedule's runs for the ticks due, then its record saying the last one is fired."""

    KIND: ClassVar[str] = "fire"
    name: str = ""
    tasks: list[str] = field(default_factory=list)
    fired: int = 0


@dataclass(slots=True)
class CompactPart(PendingAppend):
    """A compaction in flight, keeping `keep`."""

    KIND: ClassVar[str] = "compact"
    keep: list[fx.KeepRange] = field(default_factory=list)


@dataclass(slots=True)
class GroupPart(PendingAppend):
    """Appends of one call merged into one `Append` (`Outbox.append`), in record order."""

    KIND: ClassVar[str] = "group"
    parts: list[PendingAppend] = field(default_factory=list)


class Outbox:
    """The effects of the current call and the appends in flight (see the module docstring).

    `shards` is the node's per-shard state (read for a shard's tenure, compaction and the
    count of its appends in flight, which the outbox keeps)."""

    def __init__(self, shards: dict[int, ShardInfo]) -> None:
        self.shards = shards
        self.out: list[fx.Effect] = []
        self.pending: dict[int, PendingAppend] = {}
        self.token = 0
        #: Appends of this call open to later appends to their shard, by shard; and those a
        #: second one joined, to rebuild at the end of the call (`append`, `take`).
        self.open_appends: dict[int, OpenAppend] = {}
        #: The same for the success tombstones of the call, which go in a lazy `Append` of
        #: their own (`fx.Append.lazy`): the shell writes them after the call's other appends.
        self.open_lazy: dict[int, OpenAppend] = {}
        self.merged_appends: list[OpenAppend] = []
        #: Failed outcome appends waiting for another try, by token (mono time).
        self.retry_appends: DueQueue[int] = DueQueue()

    def invariants(self) -> None:
        """Between calls: nothing buffered or open; every pending append under its own token,
        its effect (if kept) that token's, a group's parts adding up to its records; every
        append held back by a compaction pending, and held only while one runs."""
        require(not self.out, "effects left in the buffer between calls")
        require(not (self.open_appends or self.open_lazy or self.merged_appends), "open appends")
        for token, p in self.pending.items():
            require(0 < token <= self.token, f"pending token {token} was never issued")
            effect = p.effect
            if effect is not None:
                require(
                    effect.token == token, f"pending {token} keeps the effect of {effect.token}"
                )
                require(effect.shard == p.shard, f"pending {token}: effect of another shard")
            if type(p) is GroupPart:
                require(bool(p.parts), f"group {token} has no part")
                require(all(type(q) is not GroupPart for q in p.parts), f"group {token} nests")
                if effect is not None:
                    total = sum(q.count for q in p.parts)
                    require(total == len(effect.records), f"group {token}: parts miscounted")
        for shard, info in self.shards.items():
            require(info.appends_in_flight >= 0, f"shard {shard}: appends in flight < 0")
            require(not info.backlog or info.compacting, f"shard {shard}: backlog, no compaction")
            for held in info.backlog:
                require(held.token in self.pending, f"shard {shard}: held append {held.token} lost")

    def take(self) -> list[fx.Effect]:
        """What every call ends with: the appends merged during it are written out in full
        (`append`), and the effects handed over."""
        out, self.out = self.out, []
        if self.open_appends:
            self.open_appends.clear()
        if self.open_lazy:
            self.open_lazy.clear()
        if self.merged_appends:
            for merged in self.merged_appends:
                assert merged.records is not None
                effect = new_append(merged.token, merged.shard, tuple(merged.records), merged.lazy)
                out[merged.index] = effect
                # (Its outcome, the only thing that removes the group, comes in a later call.)
                self.pending[merged.token].effect = effect
            self.merged_appends.clear()
        return out

    def emit(self, effect: fx.Effect) -> None:
        self.out.append(effect)

    def log(self, level: str, message: str) -> None:
        self.emit(fx.Log(level=level, message=message))

    def send(self, message: dict[str, Any]) -> None:
        self.emit(new_send(message))

    def next_token(self) -> int:
        self.token += 1
        return self.token

    def append(
        self,
        shard: int,
        records: Iterable[fx.NewRecord],
        pending: PendingAppend,
        *,
        lazy: bool = False,
    ) -> None:
        """Write `records` to the shard's log; `pending` says what they mean once they land.

        Appends to one shard within one call of `handle` / `handle_burst` are merged into one
        `Append`, at the place of the first, their records in the order of the calls: a burst
        of 64 enqueues is one effect and one `AppendCommitted`, not 64 of each (the shell
        commits a file's share of a batch as a whole anyway: one write, one fsync, and on
        error every append of it fails). Its pending is a "group" listing each part; the
        outcome is handed to each part in turn as if it were an append of its own. A record
        whose base the shell cannot read fails its own part only: the shell names it
        (`AppendFailed.record`) and writes nothing, and the other parts are issued again
        (`Outcomes.on_append_failed`).

        `lazy` (success tombstones only, `append_run`): the records join the call's lazy
        append to the shard instead (`fx.Append.lazy`), which the shell writes after the
        others, so a burst's dispatch records are not held back behind its tombstones.
        """
        info = self.shards[shard]
        pending.tenure = info.tenure
        part = tuple(records)
        pending.count = len(part)
        opened = self.open_lazy if lazy else self.open_appends
        merged = opened.get(shard)
        if merged is not None and merged.tenure == info.tenure and not info.compacting:
            if merged.records is None:
                self._group(merged, info)
                assert merged.records is not None
            group = self.pending[merged.token]
            assert type(group) is GroupPart
            group.parts.append(pending)
            pending.effect = None
            merged.records += part
            merged.last = pending
            return
        token = self.next_token()
        effect = new_append(token, shard, part, lazy)
        pending.effect = effect
        self.pending[token] = pending
        if info.compacting:
            info.backlog.append(effect)
            return
        info.appends_in_flight += 1
        opened[shard] = OpenAppend(
            token, shard, len(self.out), info.tenure, last=pending, lazy=lazy
        )
        self.emit(effect)

    def _group(self, merged: OpenAppend, info: ShardInfo) -> None:
        """A second append joins `merged`: its pending becomes a "group" listing each part
        (the first so far), and the effect is rebuilt from `merged.records` at the end of the
        call."""
        first = self.pending[merged.token]
        assert first.effect is not None
        merged.records = list(first.effect.records)
        self.merged_appends.append(merged)
        first.effect = None
        self.pending[merged.token] = GroupPart(merged.shard, tenure=info.tenure, parts=[first])

    def append_run(
        self, shard: int, info: ShardInfo, record: fx.NewRecord, task_id: str, kind: type[Run]
    ) -> None:
        """`append` for one record of a task whose append would mean the same for every
        task (`kind` `EnqueueRun`: a plain enqueue, `Intake.lines`; `DispatchRun`: a dispatch
        record; `FinishRun`: a success tombstone): consecutive ones to a shard within a call
        are one part, listing their task ids (one pending for a burst of them, not one each),
        committed or failed one by one, in order, as if each were an enqueue, a dispatch or a
        finish of its own. Finishes go in the call's lazy append (`fx.Append.lazy`)."""
        lazy = kind is FinishRun
        merged = (self.open_lazy if lazy else self.open_appends).get(shard)
        if merged is not None and merged.tenure == info.tenure and not info.compacting:
            run = merged.last
            if run is not None and type(run) is kind:
                assert isinstance(run, Run)
                if merged.records is None:
                    self._group(merged, info)
                    assert merged.records is not None
                merged.records.append(record)
                run.ids.append(task_id)
                run.count += 1
                return
        self.append(shard, (record,), kind(shard, ids=[task_id]), lazy=lazy)

    def emit_append(self, info: ShardInfo, effect: fx.Append) -> None:
        """Emit an append decided earlier (held back, or to retry): after it, later appends
        to the shard start a new effect (they must follow it in the log)."""
        self.open_appends.pop(effect.shard, None)
        self.open_lazy.pop(effect.shard, None)
        info.appends_in_flight += 1
        self.emit(effect)

    def flush_backlog(self, info: ShardInfo) -> None:
        backlog, info.backlog = info.backlog, []
        for effect in backlog:
            self.emit_append(info, effect)

    def pending_parts(self) -> Iterator[PendingAppend]:
        """Every append in flight or waiting, the parts of merged ones one by one."""
        for p in self.pending.values():
            if type(p) is GroupPart:
                yield from p.parts
            else:
                yield p

    def reissue(
        self,
        info: ShardInfo,
        shard: int,
        parts: list[tuple[PendingAppend, tuple[fx.NewRecord, ...]]],
        *,
        lazy: bool,
    ) -> None:
        """Append again, as one new `Append`, the parts of a merged append that failed for
        another part's record (nothing of it was written)."""
        token = self.next_token()
        records = tuple(r for _, recs in parts for r in recs)
        effect = new_append(token, shard, records, lazy)
        if len(parts) == 1:
            pending = parts[0][0]
        else:
            pending = GroupPart(
                shard, tenure=info.tenure, count=len(records), parts=[part for part, _ in parts]
            )
            for part, _ in parts:
                part.effect = None
        pending.effect = effect
        self.pending[token] = pending
        self.hold_or_emit(info, effect)

    def hold_or_emit(self, info: ShardInfo, effect: fx.Append) -> None:
        """Emit an append decided earlier, or hold it back while its shard compacts."""
        if info.compacting:
            info.backlog.append(effect)
        else:
            self.emit_append(info, effect)

    def retry_due_at(self) -> int | None:
        """When the next failed append is due for another try (mono; `Node.timers`)."""
        return self.retry_appends.next_due()

    def retry_fire(self, now: ev.Now) -> None:
        self.retry_due(now.mono)

    def retry_due(self, now_mono: int) -> None:
        """Issue again the failed appends due for another try (those of an ended tenure are
        dropped)."""
        for token in self.retry_appends.pop_due(now_mono):
            p = self.pending.get(token)
            if p is not None and p.tenure != self.shards[p.shard].tenure:
                del self.pending[token]
                continue
            if p is not None and p.effect is not None:
                self.hold_or_emit(self.shards[p.shard], p.effect)
