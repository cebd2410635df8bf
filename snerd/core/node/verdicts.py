"""Verdicts: the answer to an enqueue with dedupe that went into another daemon's shard, and
to a command (cancel, retry, pause) sent through its inboxes.

A command's answer is found the same way, in the mark's `answers` (`snerd.core.control`:
`mark_at`, `command_answer`), and handed to `Control`, which replies; its wait is
`command_wait_us`.

An enqueue this node writes into its inbox for a shard it does not own is decided by the
shard's owner when it ingests the file: taken in as a task, dropped as a duplicate of a twin,
or refused (an id already pending). An enqueue with dedupe (`auto_dedupe`, `unique_key`) is
answered only once that decision is known, so its ack can say whether it was deduplicated,
as it does when this node owns the shard.

The owner writes its decision into the shard's log: each ingest ends with an `inbox` record
naming the writer's file, the range it took (`from`, `offset`) and what in it was not taken
in (`dropped`: the record's offset, and the twin or the error). That record comes after the
enqueue's write, so after the log's size then (the inbox write's commit says it). While an
answer waits this node reads the log on from there (`ReadLogTail`, every `verdict_poll_us`)
and, for each waiting enqueue at byte `at` of its file, finds the record whose range holds it
(`from <= at < offset`):

- listed in `dropped` with a twin: acked `"deduplicated": true, "duplicate_of": <twin>`;
- listed with an error: answered with that error, as the owner would have answered it;
- not listed: taken in; acked as enqueued.

No record holds it yet: it waits, at most `dedupe_wait_us` after its write was durable;
then it is acked with `"deduplicated": null` (enqueued; whether as a duplicate, the owner
decides when it takes the file in). A log replaced meanwhile (compacted) is read from its
start; where only a later ingest's record of the file is left there (compaction keeps the
latest of each file), the enqueue is undecided too, at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from snerd.core import control
from snerd.core import effects as fx
from snerd.core import events as ev
from snerd.core import protocol as proto
from snerd.core.node.model import require
from snerd.core.node.outbox import InboxPart
from snerd.core.ownership import shard_name
from snerd.core.schema import (
    DROP_AT,
    DROP_ERROR,
    DROP_OF,
    INBOX_DROPPED,
    INBOX_FROM,
    INBOX_NODE,
)

if TYPE_CHECKING:
    from snerd.core.node.node import Node

__all__ = ["Verdicts", "verdict_at"]

@dataclass(slots=True)
class _Waiting:
    task_id: str
    segment: str
    #: Where its record starts in the inbox file.
    at: int
    #: When it is answered undecided (mono).
    until: int
    #: A command's `Ask` in `Control` (0: an enqueue), answered from the mark's `answers`.
    ask: int = 0


@dataclass(slots=True)
class _Shard:
    waiting: list[_Waiting] = field(default_factory=list)
    #: The log's identity and how far it is read.
    identity: int = 0
    offset: int = 0
    reading: bool = False


class Verdicts:
    """The enqueues through inboxes waiting for their owner's decision (module docstring)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.config = node.config
        self.out = node.outbox
        self.shards: dict[int, _Shard] = {}
        self.poll_at_mono = 0

    # -- timers (`Node.timers`)

    def invariants(self) -> None:
        for shard, s in self.shards.items():
            require(bool(s.waiting) or s.reading, f"verdicts of shard {shard}: nothing waits")

    def poll_due(self) -> int | None:
        """When to read on in the logs that hold answers (mono)."""
        if not any(s.waiting and not s.reading for s in self.shards.values()):
            return None
        return self.poll_at_mono

    def poll_fire(self, now: ev.Now) -> None:
        at = self.poll_due()
        if at is None or now.mono < at:
            return
        self.poll_at_mono = now.mono + self.config.verdict_poll_us
        for shard, s in sorted(self.shards.items()):
            if s.waiting and not s.reading:
                self._read(shard, s)

    def deadline_due(self) -> int | None:
        """When the first waiting enqueue is answered undecided (mono)."""
        ends = [w.until for s in self.shards.values() for w in s.waiting]
        return min(ends) if ends else None

    def deadline_fire(self, now: ev.Now) -> None:
        for shard, s in list(self.shards.items()):
            late = [w for w in s.waiting if now.mono >= w.until]
            for w in late:
                if w.ask:
                    self.node.control.answered(w.ask, shard, None)
                else:
                    self._answer(shard, w, None)
            self._drop_answered(shard, s, late)

    # -- the rule

    def awaits(self, p: InboxPart) -> bool:
        """An enqueue into an inbox is answered with its owner's decision (not at its write)."""
        return p.verdict and self.config.dedupe_wait_us > 0

    def hold(self, p: InboxPart, at: int, log_identity: int, log_size: int) -> None:
        """`p`'s record is durable at byte `at` of its inbox file, written when the shard's
        log had this identity and size: wait for the verdict, reading the log from there."""
        assert p.segment is not None
        s = self.shards.get(p.shard)
        if s is None:
            s = self.shards[p.shard] = _Shard(identity=log_identity, offset=log_size)
        elif s.identity == log_identity and log_size < s.offset:
            s.offset = log_size  # read on from the earliest place an answer may be
        now = self.node.now.mono
        wait = self.config.command_wait_us if p.ask else self.config.dedupe_wait_us
        s.waiting.append(_Waiting(p.task_id, p.segment.name, at, now + wait, p.ask))
        if self.poll_at_mono < now:
            # No sooner than the owner may have looked at its inboxes.
            self.poll_at_mono = now + self.config.verdict_poll_us

    def pending(self) -> bool:
        """An enqueue still waits for its verdict (a drain waits for them, within the wait)."""
        return any(s.waiting for s in self.shards.values())

    def on_log_tail(self, event: ev.LogTailRead) -> None:
        s = self.shards.get(event.shard)
        if s is None:
            return
        s.reading = False
        if event.error is not None:
            self.out.log("warning", f"reading the verdicts of {shard_name(event.shard)}: "
                         f"{event.error}")
            self._drop_answered(event.shard, s, [])
            return
        s.identity, s.offset = event.identity, event.end
        marks: dict[str, list[dict[str, Any]]] = {}
        for record in event.records:
            f = record.fields
            if isinstance(f.get(INBOX_FROM), int):
                marks.setdefault(f[INBOX_NODE], []).append(f)
        answered: list[_Waiting] = []
        for w in s.waiting:
            mark = control.mark_at(marks.get(w.segment, ()), w.at)
            if mark is control.LATER:
                continue
            if w.ask:
                self.node.control.answered(w.ask, event.shard, control.command_answer(mark, w.at))
            else:
                self._answer(event.shard, w, verdict_at(mark, w.at))
            answered.append(w)
        if event.start < event.end < event.size:
            # More to read: at once. (A read that took nothing, before a torn last line the
            # owner is writing or died writing, waits for the next poll: read again at once,
            # it would spin.)
            self.poll_at_mono = self.node.now.mono
        self._drop_answered(event.shard, s, answered)

    # -- the parts

    def _read(self, shard: int, s: _Shard) -> None:
        s.reading = True
        writers = frozenset(w.segment for w in s.waiting)
        self.out.emit(
            fx.ReadLogTail(
                shard=shard,
                identity=s.identity,
                offset=s.offset,
                max_bytes=self.config.inbox_read_bytes,
                writers=writers,
            )
        )

    def _answer(self, shard: int, w: _Waiting, verdict: dict[str, Any] | str | None) -> None:
        if verdict is None:
            self.out.send(proto.ack_enqueued(w.task_id, shard, deduplicated=None))
        elif verdict is _TAKEN:
            self.out.send(proto.ack_enqueued(w.task_id, shard))
        else:
            assert isinstance(verdict, dict)
            twin = verdict.get(DROP_OF)
            if isinstance(twin, str):
                self.node.stats["total_deduplicated"] += 1
                self.out.send(
                    proto.ack_enqueued(w.task_id, shard, deduplicated=True, duplicate_of=twin)
                )
            else:
                self.node.stats["total_enqueued"] -= 1
                self.out.send(proto.error(w.task_id, str(verdict.get(DROP_ERROR))))

    def _drop_answered(self, shard: int, s: _Shard, answered: list[_Waiting]) -> None:
        done = {id(w) for w in answered}
        s.waiting = [w for w in s.waiting if id(w) not in done]
        if not s.waiting and not s.reading:
            del self.shards[shard]


_TAKEN = "taken"


def verdict_at(mark: Mapping[str, Any] | str, at: int) -> dict[str, Any] | str | None:
    """What the mark says of the enqueue at byte `at`: the `dropped` entry naming it,
    `_TAKEN`, or None (`control.GONE`: undecided)."""
    if not isinstance(mark, dict):
        return None
    for entry in mark.get(INBOX_DROPPED) or ():
        if isinstance(entry, dict) and entry.get(DROP_AT) == at:
            return entry
    return _TAKEN



