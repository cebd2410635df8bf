"""Job control on this node: cancel, retry and pause, applied here or sent to other owners.

The rules are `snerd.core.control`'s. This part:

- takes `cancel`, `retry` and `pause`/`resume` lines (`on_command`): a cancel or retry of a
  task this node holds is decided here; one it does not hold (nor knows finished) is written,
  as a `command` record, into this node's inbox of every shard it does not own, and answered
  once their owners have (`answered`, through `Verdicts`) or the wait ends. A pause is applied
  to every shard: here on the shards it owns (a `pause` record each), through the inboxes on
  the others; answered once every shard has, or naming those that have not yet (`pending`);
- applies the commands other daemons wrote into the inboxes of its shards (`ingest`, in the
  ingest's own append, with `waits_at_ingest` holding the ingest back at a command it cannot
  decide yet: a task whose record is in flight, a retry whose tombstone is still being read);
- keeps each owned shard's pause marks (loaded by the replay, kept by compaction) and says
  whether a task may start (`holds`);
- sweeps (`proto.Sweep`: a purge, a retry of a type's dead letters) go, like a pause, to every
  shard; each owner selects the ended tasks of its shard's history (`rule.swept`, by
  `ShardInfo.ended`) and forgets them (a `purge` record) or puts each back, and answers how
  many; the ask is answered with the sum once every shard has (or naming those that have not);
- puts a finished task back (`_requeue`): its tombstone is read back (`ReadRecord`), and a
  fresh record written by the rule `dlq replay` writes (`shardlog.replay_record`).

A cancel of a task whose record is being written (enqueue, dispatch, end) waits for that
write (`deferred`, looked at again on every tick), so that what it answers is what the log
says.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from snerd.core import control as rule
from snerd.core import effects as fx
from snerd.core import events as ev
from snerd.core import protocol as proto
from snerd.core import story
from snerd.core.node.model import (
    ACTIVE,
    BLOCKED,
    DISPATCHING,
    ENQUEUING,
    FINISHING,
    NODE_RUNNING,
    RUNNING,
    WAITING,
    Task,
    new_location,
    new_record,
)
from snerd.core.node.outbox import InboxPart, PausePart, PurgePart, RequeuePart
from snerd.core.schema import KIND_COMMAND, OUTCOME_CANCELLED, SNERD_KIND, SNERD_NODE
from snerd.core.shardlog import replay_record
from snerd.core.story import Found

if TYPE_CHECKING:
    from snerd.core.node.model import ShardInfo
    from snerd.core.node.node import Node

__all__ = ["Control"]

_SHUTTING_DOWN = "[Snerd] Daemon is shutting down; command rejected"
#: How often commands that wait for a write are looked at again, at most (mono µs).
_DEFERRED_POLL_US = 50_000


@dataclass(slots=True)
class Ask:
    """A command this node took from its SDK, until it is answered."""

    cmd: proto.Cancel | proto.Requeue | proto.Pause | proto.Sweep
    #: Shards whose owner's answer it waits for (through their inboxes).
    remote: set[int] = field(default_factory=set)
    #: Records of its own still in flight here (pause records, a cancel's tombstone, a
    #: retry's record).
    local: int = 0
    #: Shards that did not answer within the wait.
    late: list[int] = field(default_factory=list)
    #: The answer sent (a cancel or retry is answered by the shard that found the task).
    answered: bool = False
    #: A sweep's: the tasks it acted on so far (the answers of the shards summed).
    count: int = 0


class Control:
    """Cancel, retry and pause (the module docstring)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.config = node.config
        self.out = node.outbox
        self.shards = node.shards
        self.asks: dict[int, Ask] = {}
        self._next_ask = 0
        #: Asks for tasks whose record is being written: decided once it is.
        self.deferred: list[int] = []
        #: Per owned shard, the pause mark of each task type (None: the whole queue) and
        #: where its record is.
        self.marks: dict[int, dict[str | None, rule.PauseMark]] = {}
        self.mark_locs: dict[int, dict[str | None, fx.Location]] = {}
        #: Shards with a type paused: `holds` looks only while there is one.
        self.paused_shards: set[int] = set()
        #: The wall time of this node's latest pause stamp.
        self.last_stamp = 0
        #: Attempts stopped by a cancel, whose results are dropped silently: id -> attempt.
        self.stopped: dict[str, int] = {}
        #: Tombstones being read back for a retry: token -> (shard, task id, ask or 0); and the
        #: ones read, for an ingest that waits on them: task id -> fields.
        self.reading: dict[int, tuple[int, str, int, fx.Location]] = {}
        #: Tombstone reads that failed while their shard was being compacted (the log file
        #: replaced under them), read again once it is: shard -> [(task id, ask or 0)].
        self.reread: dict[int, list[tuple[str, int]]] = {}
        self.read: dict[str, dict[str, Any]] = {}
        #: `get`s waiting for their read: token -> task id.
        self.lookups: dict[int, str] = {}
        #: Cancels waiting for their tombstone to land: task id -> (ask, the state it was
        #: found in, its shard).
        self.ending: dict[str, tuple[int, str, int]] = {}
        #: The latest progress of each running task of this node, by the attempt that sent
        #: it: task id -> (attempt, data); `get` shows it while that attempt runs.
        self.progress: dict[str, tuple[int, Any]] = {}

    def invariants(self) -> None:
        for shard in self.paused_shards:
            assert any(m.paused for m in self.marks.get(shard, {}).values()), shard

    # -- timers (`Node.timers`)

    def deferred_due(self) -> int | None:
        return self.node.now.mono + _DEFERRED_POLL_US if self.deferred else None

    def deferred_fire(self, now: ev.Now) -> None:
        waiting, self.deferred = self.deferred, []
        for n in waiting:
            ask = self.asks.get(n)
            if ask is not None and not self._decide_here(n, ask):
                self._send_out(n, ask)

    # -- commands from the SDK

    def on_command(self, cmd: proto.Cancel | proto.Requeue | proto.Pause | proto.Sweep) -> None:
        if self.node.intake.hold_or(cmd):
            return
        if self.node.phase is not NODE_RUNNING:
            task_id = None if isinstance(cmd, proto.Pause | proto.Sweep) else cmd.task_id
            self.out.send(proto.error(task_id, _SHUTTING_DOWN))
            return
        self._next_ask += 1
        n = self._next_ask
        ask = self.asks[n] = Ask(cmd)
        if isinstance(cmd, proto.Pause):
            self._pause_everywhere(n, ask, cmd)
            return
        if isinstance(cmd, proto.Sweep):
            self._sweep_everywhere(n, ask, cmd)
            return
        if not self._decide_here(n, ask):
            self._send_out(n, ask)

    def _decide_here(self, n: int, ask: Ask) -> bool:
        """Decide a cancel or retry of a task this node holds or knows finished (True), or
        defer it while its record is being written (True); False: not known here."""
        cmd = ask.cmd
        assert not isinstance(cmd, proto.Pause | proto.Sweep)
        task = self.node.book.tasks.get(cmd.task_id)
        if task is not None:
            info = self.shards.get(task.shard)
            if self._in_transit(task) or info is None or info.phase is not ACTIVE:
                self.deferred.append(n)
                return True
            answer = self._apply_live(cmd, task, n)
            if not answer.done:
                self._finish(n, ask, answer, task.shard)
            return True
        for shard, info in self.shards.items():
            entry = info.history.get(cmd.task_id)
            if entry is None or info.phase is not ACTIVE:
                continue
            found = rule.ended_state(entry[1])
            if isinstance(cmd, proto.Requeue) and found in rule.REQUEUEABLE:
                ask.local += 1
                self._read_tombstone(shard, cmd.task_id, entry[0], n)
            else:
                self._finish(n, ask, rule.Answer(found, False), shard)
            return True
        return False

    def _send_out(self, n: int, ask: Ask) -> None:
        """Write the command into this node's inbox of every shard it does not own."""
        cmd = ask.cmd
        assert not isinstance(cmd, proto.Pause | proto.Sweep)
        for shard in range(self.node.tenure.shard_count()):
            info = self.shards.get(shard)
            if info is None or info.phase is not ACTIVE:
                self._to_inbox(n, ask, shard, rule.command_fields(cmd, (0, "")))
        self._maybe_done(n, ask)

    def _pause_everywhere(self, n: int, ask: Ask, cmd: proto.Pause) -> None:
        # Later than every stamp this node gave before, whatever its wall clock does.
        self.last_stamp = max(self.node.now.wall, self.last_stamp + 1)
        stamp: rule.Stamp = (self.last_stamp, self.config.node_id)
        mark = rule.PauseMark(cmd.paused, stamp)
        for shard in range(self.node.tenure.shard_count()):
            info = self.shards.get(shard)
            if info is not None and info.phase is ACTIVE:
                self.set_pause(shard, cmd.task_type, mark, n)
            else:
                self._to_inbox(n, ask, shard, rule.command_fields(cmd, stamp))
        self._maybe_done(n, ask)

    def _sweep_everywhere(self, n: int, ask: Ask, cmd: proto.Sweep) -> None:
        for shard in range(self.node.tenure.shard_count()):
            info = self.shards.get(shard)
            if info is not None and info.phase is ACTIVE:
                if cmd.purge:
                    ask.count += self._purge(shard, cmd, n).count
                else:
                    self._retry_dead(shard, cmd, n)
            else:
                self._to_inbox(n, ask, shard, rule.command_fields(cmd, (0, "")))
        self._maybe_done(n, ask)

    def _to_inbox(self, n: int, ask: Ask, shard: int, fields: dict[str, Any]) -> None:
        fields[SNERD_NODE] = self.config.node_id
        segment = self.node.inbox.segment(shard)
        segment.in_flight += 1
        token = self.out.next_token()
        self.out.pending[token] = InboxPart(shard, segment=segment, ask=n)
        ask.remote.add(shard)
        self.out.emit(
            fx.AppendInbox(
                token=token,
                shard=shard,
                segment=segment.name,
                records=(new_record(fields),),
                note_log=True,
            )
        )

    # -- answers

    def forwarded(self, p: InboxPart, at: int, log_identity: int, log_size: int) -> None:
        """A command's inbox record is durable: wait for its owner's answer (`Verdicts`)."""
        self.node.verdicts.hold(p, at, log_identity, log_size)

    def forward_failed(self, p: InboxPart, error: str) -> None:
        """The inbox write failed: whatever reached the file may still be applied; the shard
        counts as one that has not answered."""
        self.out.log("warning", f"a command for shard {p.shard} could not be written: {error}")
        self.answered(p.ask, p.shard, None)

    def answered(self, n: int, shard: int, answer: rule.Answer | None) -> None:
        """The owner of `shard` answered `n` (None: it did not within the wait)."""
        ask = self.asks.get(n)
        if ask is None:
            return
        ask.remote.discard(shard)
        if answer is None:
            ask.late.append(shard)
        elif isinstance(ask.cmd, proto.Sweep):
            ask.count += answer.count
        elif (
            not isinstance(ask.cmd, proto.Pause)
            and answer.found != rule.FOUND_UNKNOWN
            and not ask.answered
        ):
            ask.answered = True
            self.out.send(rule.reply(ask.cmd, answer, shard))
        self._maybe_done(n, ask)

    def _finish(self, n: int, ask: Ask, answer: rule.Answer, shard: int | None) -> None:
        cmd = ask.cmd
        if isinstance(cmd, proto.Sweep):  # (one task of a retry of dead letters)
            ask.count += answer.done
            self._maybe_done(n, ask)
            return
        assert not isinstance(cmd, proto.Pause)
        if not ask.answered:
            ask.answered = True
            self.out.send(rule.reply(cmd, answer, shard))
        self._maybe_done(n, ask)

    def _local_landed(self, n: int) -> None:
        ask = self.asks.get(n)
        if ask is not None:
            ask.local -= 1
            self._maybe_done(n, ask)

    def _maybe_done(self, n: int, ask: Ask) -> None:
        if ask.remote or ask.local > 0 or n in self.deferred:
            return
        del self.asks[n]
        cmd = ask.cmd
        if isinstance(cmd, proto.Pause):
            count = self.node.tenure.shard_count()
            self.out.send(proto.paused(cmd.task_type, cmd.paused, count, ask.late))
        elif isinstance(cmd, proto.Sweep):
            shards = self.node.tenure.shard_count()
            self.out.send(proto.swept(cmd, ask.count, shards, ask.late))
        elif not ask.answered:
            unknown = rule.Answer(rule.FOUND_UNKNOWN, False)
            self.out.send(rule.reply(cmd, unknown, None, pending=bool(ask.late)))

    # -- applying a command to a task of an owned shard

    @staticmethod
    def _in_transit(task: Task) -> bool:
        """Its latest record is being written: a command waits for it to land."""
        return task.state in (ENQUEUING, DISPATCHING, FINISHING) or task.loc is None

    def _found(self, task: Task) -> str:
        state = task.state
        return rule.live_state(
            waiting=state is WAITING,
            blocked=state is BLOCKED,
            running=state in (DISPATCHING, RUNNING, FINISHING),
            retry_count=task.retry_count,
        )

    def _apply_live(self, cmd: proto.Cancel | proto.Requeue, task: Task, n: int) -> rule.Answer:
        """Cancel a live task (its tombstone written, the ask answered when it lands), or
        answer a retry of one: it is not finished."""
        found = self._found(task)
        if isinstance(cmd, proto.Requeue):
            return rule.Answer(found, False)
        if self.config.unsafe_ignore_cancel:  # the control: told "cancelled", left as it was
            if n:
                self._finish(n, self.asks[n], rule.Answer(found, True), task.shard)
            return rule.Answer(found, True)
        if task.state is RUNNING:
            self.stopped[task.task_id] = task.attempt
            if task.webhook_url is None and task.task_type in self.node.book.cancellable:
                self.out.emit(fx.StopAttempt(task_id=task.task_id, attempt=task.attempt))
        self.node.book.cancel(task)
        if n:
            self.asks[n].local += 1
            self.ending[task.task_id] = (n, found, task.shard)
        return rule.Answer(found, True)

    def progressed(self, task_id: str, data: Any) -> None:
        """A running task's handler reported progress (its latest is kept while it runs)."""
        task = self.node.book.tasks.get(task_id)
        if task is not None and task.state is RUNNING:
            self.progress[task_id] = (task.attempt, data)

    def task_finished(self, task_id: str, outcome: str) -> None:
        """A task of this node ended (`TaskBook.finished`): its progress is dropped, and a
        cancel waiting for its tombstone is answered."""
        if self.progress:
            self.progress.pop(task_id, None)
        if not self.ending:
            return
        n, found, shard = self.ending.pop(task_id, (0, "", 0))
        ask = self.asks.get(n)
        if ask is None:
            return
        ask.local -= 1
        self._finish(n, ask, rule.Answer(found, outcome == OUTCOME_CANCELLED), shard)

    # -- get: a task looked up wherever it is

    def on_get(self, cmd: proto.GetTask) -> None:
        """Read every record of the task in the queue's files (`ReadTask`, in the shell's
        thread) and answer with its details (`snerd.core.story.details`)."""
        if self.node.intake.hold_or(cmd):
            return
        token = self.out.next_token()
        self.lookups[token] = cmd.task_id
        shards = self.node.tenure.shard_count()
        self.out.emit(fx.ReadTask(token=token, task_id=cmd.task_id, shards=shards))

    def on_task_read(self, event: ev.TaskRead) -> None:
        task_id = self.lookups.pop(event.token, None)
        if task_id is None:
            return
        found = [f for f in event.found if isinstance(f, Found)]
        details = story.details(task_id, found, self.node.now.wall)
        task = self.node.book.tasks.get(task_id)
        if task is not None and not self._in_transit(task):
            # This node holds it: its live state is known exactly, not only as the log says.
            details.update(found=True, state=self._found(task), shard=task.shard)
            attempt, data = self.progress.get(task_id, (0, None))
            if task.state is RUNNING and attempt == task.attempt:
                details["progress"] = data
        if event.errors:
            details["errors"] = list(event.errors)
        self.out.send(proto.task_details(task_id, details))

    # -- commands from the inboxes of owned shards

    def waits_at_ingest(self, fields: dict[str, Any], shard: int) -> bool:
        """An inbox command this node cannot decide yet: its task's record is being written,
        or (a retry) its tombstone is being read back, which this starts."""
        parsed = rule.command_of(fields)
        if isinstance(parsed, str) or isinstance(parsed[0], proto.Pause):
            return False
        cmd = parsed[0]
        if isinstance(cmd, proto.Sweep):
            return not cmd.purge and self._dead_unread(shard, cmd)
        task = self.node.book.tasks.get(cmd.task_id)
        if task is not None:
            return task.shard == shard and self._in_transit(task)
        if not isinstance(cmd, proto.Requeue) or cmd.task_id in self.read:
            return False
        entry = self.shards[shard].history.get(cmd.task_id)
        if entry is None or rule.ended_state(entry[1]) not in rule.REQUEUEABLE:
            return False
        if not any(t == cmd.task_id for _s, t, _n, _loc in self.reading.values()):
            self._read_tombstone(shard, cmd.task_id, entry[0], 0)
        return True

    def ingest(self, fields: dict[str, Any], shard: int) -> rule.Answer | str:
        """Apply an inbox command to an owned shard (its records join the ingest's append):
        the answer for the `inbox` mark, or why the record holds no command."""
        parsed = rule.command_of(fields)
        if isinstance(parsed, str):
            return parsed
        cmd, stamp = parsed
        if isinstance(cmd, proto.Pause):
            assert stamp is not None
            self.set_pause(shard, cmd.task_type, rule.PauseMark(cmd.paused, stamp), 0)
            return rule.Answer("paused" if cmd.paused else "resumed", True)
        if isinstance(cmd, proto.Sweep):
            return self._purge(shard, cmd, 0) if cmd.purge else self._retry_read(shard, cmd)
        task = self.node.book.tasks.get(cmd.task_id)
        if task is not None and task.shard == shard:
            return self._apply_live(cmd, task, 0)
        entry = self.shards[shard].history.get(cmd.task_id)
        if entry is None:
            return rule.Answer(rule.FOUND_UNKNOWN, False)
        found = rule.ended_state(entry[1])
        fields_read = self.read.pop(cmd.task_id, None)
        if isinstance(cmd, proto.Requeue) and found in rule.REQUEUEABLE and fields_read:
            return self._requeue(shard, fields_read, found, 0)
        return rule.Answer(found, False)

    @staticmethod
    def is_command(fields: dict[str, Any]) -> bool:
        return fields.get(SNERD_KIND) == KIND_COMMAND

    # -- retry: putting a finished task back

    def _read_tombstone(self, shard: int, task_id: str, loc: fx.Location, n: int) -> None:
        token = self.out.next_token()
        self.reading[token] = (shard, task_id, n, loc)
        self.out.emit(fx.ReadRecord(token=token, location=loc))

    def on_record_read(self, event: ev.RecordRead) -> None:
        entry = self.reading.pop(event.token, None)
        if entry is None:
            return
        shard, task_id, n, loc = entry
        ask = self.asks.get(n) if n else None
        info = self.shards.get(shard)
        usable = info is not None and info.phase is ACTIVE and task_id in info.history
        if info is None or info.phase is not ACTIVE:
            # The shard was given up meanwhile: its owner-to-be decides (the ask names it).
            if ask is not None:
                ask.local -= 1
                ask.late.append(shard)
                self._maybe_done(n, ask)
            return
        current = info.history.get(task_id)
        if current is not None and current[0] != loc:
            # A compaction moved the tombstone while it was read: what came back is of the
            # old file (or of another record of the new one). Read it again where it is now
            # (simulator seed 473: a retry of a type's dead letters left one out).
            self._read_tombstone(shard, task_id, current[0], n)
            return
        if event.fields is None and usable and info.compacting:
            # (Simulator seed 473: read while the compaction replaced the file, the tombstone
            # was "not there", and a retry of its type left it out.)
            self.reread.setdefault(shard, []).append((task_id, n))
            return
        if event.fields is None or not usable:
            if event.fields is None:
                self.out.log("error", f"task {task_id}: its tombstone cannot be read "
                             f"({event.error}); not retried")
                if ask is None:
                    self.read[task_id] = {}  # (the ingest waiting on it goes on without)
            if ask is not None:
                ask.local -= 1
                self._finish(n, ask, rule.Answer(rule.FOUND_DEAD, False), shard)
            return
        if ask is None:
            self.read[task_id] = event.fields  # for the ingest waiting on it
            return
        assert info is not None
        found = rule.ended_state(info.history[task_id][1])
        answer = self._requeue(shard, event.fields, found, n)
        if not answer.done:
            ask.local -= 1
            self._finish(n, ask, answer, shard)

    def compaction_over(self, shard: int) -> None:
        """The compaction of `shard` ended (installed, or moot after a step-down): the
        tombstone reads it failed are made again where the records are now, or, the shard
        given up, left to its next owner as any read that comes back late."""
        for task_id, n in self.reread.pop(shard, ()):
            info = self.shards.get(shard)
            entry = info.history.get(task_id) if info is not None else None
            if info is not None and info.phase is ACTIVE and entry is not None:
                self._read_tombstone(shard, task_id, entry[0], n)
                continue
            ask = self.asks.get(n) if n else None
            if ask is not None:
                ask.local -= 1
                ask.late.append(shard)
                self._maybe_done(n, ask)

    def _requeue(self, shard: int, tombstone: dict[str, Any], found: str, n: int) -> rule.Answer:
        """Write the record that puts a finished task back (the `dlq replay` rule), answered
        when it lands (`requeue_committed`)."""
        book = self.node.book
        info = self.shards[shard]
        fields = replay_record(
            ev.LogRecord(offset=0, length=0, fields=tombstone),
            now=self.node.wall_text(),
            epoch=info.epoch,
            node=self.config.node_id,
        )
        task = book.task_from_record(shard, fields, None)
        if task is None:
            task_id = tombstone.get("taskId")
            self.out.log("error", f"task {task_id}: its record cannot run again; not retried")
            return rule.Answer(found, False)
        if task.payload_hash is not None and book.fingerprints.get(task.payload_hash):
            # auto_dedupe: a live task holds its fingerprint, and two may not be pending.
            return rule.Answer(found, False)
        book.tasks[task.task_id] = task
        book.add_fingerprint(task)
        info.history.pop(task.task_id, None)
        info.ended.pop(task.task_id, None)
        part = RequeuePart(shard, task_id=task.task_id, ask=n, found=found)
        self.out.append(shard, [new_record(fields)], part)
        return rule.Answer(found, True)

    def requeue_committed(
        self, p: RequeuePart, info: ShardInfo, offsets: tuple[int, ...], lengths: tuple[int, ...]
    ) -> None:
        task = self.node.book.tasks.get(p.task_id)
        if task is not None and task.loc is None and task.state is ENQUEUING:
            task.loc = new_location(p.shard, offsets[0], lengths[0])
            self.node.book.schedule(task, self.node.now)
        ask = self.asks.get(p.ask) if p.ask else None
        if ask is not None:
            ask.local -= 1
            self._finish(p.ask, ask, rule.Answer(p.found, True), p.shard)

    def requeue_failed(
        self, token: int, p: RequeuePart, info: ShardInfo, error: str, permanent: bool
    ) -> None:
        del self.out.pending[token]
        task = self.node.book.tasks.get(p.task_id)
        if task is not None and task.loc is None:
            self.node.book.forget(p.task_id)
        self.out.log("error", f"task {p.task_id}: could not be put back ({error})")
        ask = self.asks.get(p.ask) if p.ask else None
        if ask is not None:
            ask.local -= 1
            if not isinstance(ask.cmd, proto.Sweep):  # (a sweep counts only what it put back)
                ask.answered = True
                self.out.send(proto.error(p.task_id, f"Failed to retry: {error}"))
            self._maybe_done(p.ask, ask)

    # -- sweeps: purges, and retries of a type's dead letters

    def _selected(self, shard: int, cmd: proto.Sweep) -> list[str]:
        """The ended tasks of `shard`'s history `cmd` takes (`rule.swept`), oldest first; a
        task live again under its id (enqueued anew) is not one."""
        info = self.shards[shard]
        tasks = self.node.book.tasks
        out = []
        for task_id, (finished_us, task_type) in info.ended.items():
            outcome = info.history[task_id][1]
            if task_id not in tasks and rule.swept(cmd, outcome, task_type, finished_us):
                out.append(task_id)
        if self.config.unsafe_retry_skips_oldest and not cmd.purge:  # (the control)
            return out[1:]
        return out

    def _purge(self, shard: int, cmd: proto.Sweep, n: int) -> rule.Answer:
        """Forget the ended tasks `cmd` takes in an owned shard: gone from the history now,
        by `purge` records in its log (the ask, if any, answered when they land)."""
        info = self.shards[shard]
        ids = self._selected(shard, cmd)
        if self.config.unsafe_purge_all:  # the control: every ended task, succeeded or not
            ids = [t for t in info.history if t not in self.node.book.tasks]
        if not ids:
            return rule.Answer(rule.FOUND_SWEPT, True, 0)
        for task_id in ids:
            del info.history[task_id]
            info.ended.pop(task_id, None)
            info.completed_at.pop(task_id, None)
        meta = self.node.tenure.meta(shard)
        step = rule.PURGE_RECORD_IDS
        records = [
            new_record({**rule.purge_fields(ids[i : i + step], cmd, self.node.wall_text()), **meta})
            for i in range(0, len(ids), step)
        ]
        if n:
            self.asks[n].local += 1
        self.out.append(shard, records, PurgePart(shard, ask=n))
        return rule.Answer(rule.FOUND_SWEPT, True, len(ids))

    def purge_committed(
        self, p: PurgePart, info: ShardInfo, offsets: tuple[int, ...], lengths: tuple[int, ...]
    ) -> None:
        if p.ask:
            self._local_landed(p.ask)

    def _retry_dead(self, shard: int, cmd: proto.Sweep, n: int) -> None:
        """Put back each dead letter `cmd` takes in an owned shard: its tombstone read, then
        the record of a retry written (`_requeue`); each counted in the ask as it lands."""
        ask = self.asks[n]
        for task_id in self._selected(shard, cmd):
            if any(t == task_id for _s, t, _n, _loc in self.reading.values()):
                continue  # (being read for another retry: that one puts it back)
            ask.local += 1
            self._read_tombstone(shard, task_id, self.shards[shard].history[task_id][0], n)

    def _dead_unread(self, shard: int, cmd: proto.Sweep) -> bool:
        """An inbox retry of dead letters waits until each tombstone it takes is read back
        (this starts the reads): True while one is not."""
        waiting = False
        for task_id in self._selected(shard, cmd):
            if task_id in self.read:
                continue
            waiting = True
            if not any(t == task_id for _s, t, _n, _loc in self.reading.values()):
                self._read_tombstone(shard, task_id, self.shards[shard].history[task_id][0], 0)
        return waiting

    def _retry_read(self, shard: int, cmd: proto.Sweep) -> rule.Answer:
        """An inbox retry of dead letters, once their tombstones are read: each put back."""
        count = 0
        for task_id in self._selected(shard, cmd):
            fields = self.read.pop(task_id, None)
            if fields:
                count += self._requeue(shard, fields, rule.FOUND_DEAD, 0).done
        return rule.Answer(rule.FOUND_SWEPT, True, count)

    # -- pauses

    def set_pause(self, shard: int, task_type: str | None, mark: rule.PauseMark, n: int) -> None:
        """Apply a pause or resume to an owned shard: its record written when it is newer
        than the shard's mark (the ask, if any, answered when it lands)."""
        marks = self.marks.setdefault(shard, {})
        if not rule.newer(marks.get(task_type), mark.stamp):
            return
        marks[task_type] = mark
        self._recount(shard)
        if n:
            self.asks[n].local += 1
        record = new_record({**rule.pause_fields(task_type, mark), **self.node.tenure.meta(shard)})
        self.out.append(shard, [record], PausePart(shard, task_type=task_type, ask=n))
        if not mark.paused:
            self.node.book.unpark_paused(shard)

    def _recount(self, shard: int) -> None:
        if any(m.paused for m in self.marks.get(shard, {}).values()):
            self.paused_shards.add(shard)
        else:
            self.paused_shards.discard(shard)

    def holds(self, task: Task) -> bool:
        """`task` may not start: its type (or the whole queue) is paused in its shard."""
        if self.config.unsafe_ignore_pause:
            return False
        return rule.is_paused(self.marks.get(task.shard, {}), task.task_type)

    def paused_types(self) -> list[str | None]:
        """The types paused on some owned shard (None: the whole queue), for `stats`."""
        out: set[str | None] = set()
        for shard in self.paused_shards:
            out.update(t for t, m in self.marks[shard].items() if m.paused)
        return sorted(out, key=lambda t: (t is not None, t or ""))

    def pause_committed(
        self, p: PausePart, info: ShardInfo, offsets: tuple[int, ...], lengths: tuple[int, ...]
    ) -> None:
        self.mark_locs.setdefault(p.shard, {})[p.task_type] = new_location(
            p.shard, offsets[0], lengths[0]
        )
        if p.ask:
            self._local_landed(p.ask)

    def load(self, shard: int, pauses: dict[str | None, tuple[rule.PauseMark, ev.LogRecord]]) -> None:
        """The pause marks a replay found in the shard's log."""
        self.marks[shard] = {t: mark for t, (mark, _r) in pauses.items()}
        self.mark_locs[shard] = {
            t: new_location(shard, r.offset, r.length) for t, (_m, r) in pauses.items()
        }
        self._recount(shard)

    def forget_shard(self, shard: int) -> None:
        """This node stepped down from `shard`: what it wrote there for an ask and has not
        seen land counts as not answered (`pending`)."""
        self.marks.pop(shard, None)
        self.mark_locs.pop(shard, None)
        self.paused_shards.discard(shard)
        lost = [
            p.ask
            for p in self.out.pending_parts()
            if p.shard == shard and isinstance(p, PausePart | PurgePart | RequeuePart) and p.ask
        ]
        for task_id, (n, _found, s) in list(self.ending.items()):
            if s == shard:
                del self.ending[task_id]
                lost.append(n)
        for n in lost:
            ask = self.asks.get(n)
            if ask is not None:
                ask.local -= 1
                ask.late.append(shard)
                self._maybe_done(n, ask)

    def locs(self, shard: int) -> list[fx.Location]:
        """The pause records a compaction keeps."""
        return list(self.mark_locs.get(shard, {}).values())

    def moved(self, shard: int, moved: dict[int, fx.Location]) -> None:
        locs = self.mark_locs.get(shard)
        if locs:
            self.mark_locs[shard] = {t: moved.get(loc.offset, loc) for t, loc in locs.items()}
