"""SDK intake: the lines the SDK sends, and what each command does.

`Intake` parses lines (`snerd.core.protocol`) and decides each command: register a task type,
enqueue (into an owned shard's log, or into this node's inbox for a shard another node owns),
result, progress, stats, and the outcomes of webhooks and of payloads that could not be read.
While the node is starting it keeps commands in arrival order (`held_commands`) and the node
replays them once it runs.

The commonest lines, a plain enqueue and a plain success, are decided in one loop (`lines`)
without building their commands. That loop is a second implementation of `on_enqueue` and
`on_result` for those lines, so it sits right after `on_enqueue` and must decide what the long
way decides (a differential test in `tests/core/node/test_node.py` drives both). It is the
one function here longer than about 70 lines: it binds every name it uses once per burst and
keeps the decision inline, since a call per line costs as much as the decision itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import orjson

from snerd.core import effects as fx
from snerd.core import enqueue as enqueue_rule
from snerd.core import events as ev
from snerd.core import protocol as proto
from snerd.core.node.model import (
    ACTIVE,
    ENQUEUING,
    NODE_RUNNING,
    READY,
    RUNNING,
    SECOND,
    STARTING,
    STOPPED,
    FinishedTwin,
    ShardInfo,
    Task,
    new_record,
    route_shard,
)
from snerd.core.node.outbox import EnqueuePart, EnqueueRun, InboxPart
from snerd.core.retry import task_backoff
from snerd.core.schema import (
    EXECUTE_AT,
    MAX_RETRIES,
    RETRY_AFTER_HOURS,
    RETRY_AFTER_TIME,
    RETRY_COUNT,
    SNERD_EPOCH,
    SNERD_NODE,
    SNERD_SEQ,
    TASK_DATA,
    TASK_ID,
    TASK_TYPE,
)

if TYPE_CHECKING:
    from snerd.core.node.node import Node

__all__ = ["Intake"]

# The two builders of a plain enqueue's record (`_enqueue_fields` and the loop of `lines`) spell
# its keys as literals: a dict display of constant keys is built in one step, one whose keys are
# module names looks each up first, on the path every enqueue takes. The literals must be the
# record's keys of `snerd.core.schema`:
assert (
    TASK_ID,
    RETRY_COUNT,
    MAX_RETRIES,
    RETRY_AFTER_HOURS,
    RETRY_AFTER_TIME,
    TASK_DATA,
    TASK_TYPE,
    EXECUTE_AT,
    SNERD_NODE,
    SNERD_EPOCH,
    SNERD_SEQ,
) == (
    "taskId",
    "retryCount",
    "maxRetries",
    "retryAfterHours",
    "retryAfterTime",
    "taskData",
    "taskType",
    "executeAt",
    "snerdNode",
    "snerdEpoch",
    "snerdSeq",
), "intake's literal record keys differ from snerd.core.schema"

#: `Intake.line`'s default: the line is not parsed yet.
_UNPARSED = object()
#: A line `orjson` could not decode (no JSON value is this object).
_NOT_JSON = object()


class Intake:
    """SDK lines and commands (see the module docstring)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.config = node.config
        self.shards = node.shards
        self.out = node.outbox
        self.held_commands: list[ev.Event] = []

    def hold_or(self, command: ev.Event) -> bool:
        """While starting, keep commands in arrival order; True when the command was held."""
        if self.node.phase is STARTING:
            self.held_commands.append(command)
            return True
        return False

    def on_line(self, event: ev.LineReceived) -> None:
        if event.oversize:
            self.out.send(
                proto.error(
                    proto.sniff_task_id(event.line),
                    f"Invalid JSON: line of {event.oversize} bytes exceeds the daemon's limit "
                    "(SNERD_MAX_LINE_BYTES); keep payloads in files and send a reference",
                )
            )
            return
        self.lines((event.line,))

    def on_lines(self, event: ev.LinesReceived) -> None:
        self.lines(event.lines)

    def line(self, line: bytes, doc: Any = _UNPARSED) -> None:
        """One line, parsed (`doc`: what `orjson.loads` gave, or `_NOT_JSON`) or not, the
        long way: a command, or an error message naming what is wrong."""
        if doc is _UNPARSED:
            try:
                doc = orjson.loads(line)
            except orjson.JSONDecodeError:
                doc = _NOT_JSON
        try:
            if doc is _NOT_JSON or len(line) > proto.DEFAULT_MAX_LINE_BYTES:
                command = proto.parse_line(line)  # (it words the error)
            else:
                command = proto.parse_document(doc)
        except proto.ScheduleError as err:
            self.out.send(proto.schedule_error(err.name, err.message))
            return
        except proto.ProtocolError as err:
            self.out.send(proto.error(err.task_id, err.message))
            return
        self.node.handlers[type(command)](command)

    def on_register(self, cmd: proto.Register) -> None:
        if self.hold_or(cmd):
            return
        if (
            cmd.task_type not in self.node.book.registered
            and len(self.node.book.registered) >= proto.MAX_REGISTERED_TYPES
        ):
            # Each registered type is listed in membership.json, rewritten at every renewal.
            self.out.send(proto.error(None, proto.too_many_task_types(cmd.task_type)))
            return
        self.node.book.registered.add(cmd.task_type)
        if cmd.cancellable:
            self.node.book.cancellable.add(cmd.task_type)
        self.out.send(proto.ack_registered(cmd.task_type))
        parked = self.node.book.parked_by_type.pop(cmd.task_type, None)
        while parked:
            task = self.node.book.tasks[parked.pop()]
            self.node.book.move(task, READY)
            self.node.book.push_ready(task)

    def on_enqueue(self, cmd: proto.Enqueue) -> None:
        """An enqueue the long way: refused (not running, its id pending, a cycle), acked as a
        duplicate, written to this node's inbox for a shard it does not own, or taken here."""
        if self.node.phase is not NODE_RUNNING:
            if not self.hold_or(cmd):
                self.out.send(proto.error(cmd.task_id, proto.SHUTTING_DOWN))
            return
        book = self.node.book
        existing = book.tasks.get(cmd.task_id)
        if existing is not None:
            self.out.send(
                proto.error(cmd.task_id, proto.already_pending(cmd.task_id, existing.state.value))
            )
            return
        payload_hash = None
        if cmd.dedupes:
            payload_hash = self.fingerprint(cmd)
            original = book.twin(payload_hash, cmd.unique_until)
            if original is not None:
                self.node.stats["total_enqueued"] += 1
                self.node.stats["total_deduplicated"] += 1
                self._ack_duplicate(cmd.task_id, original)
                return
        shards = self.node.tenure.shard_count()
        key = enqueue_rule.routing_key(cmd, payload_hash)
        shard = route_shard(key, shards) if shards != 1 else 0  # x % 1 == 0: skip the hash
        info = self.shards.get(shard)
        if info is None or info.phase is not ACTIVE:
            # Another daemon owns the shard (or none does yet, or ours is still loading): the
            # task goes into this node's inbox for it, which the owner ingests.
            self._enqueue_to_inbox(cmd, shard, payload_hash)
            return
        if cmd.trigger_after_ids:
            cycle = book.cycle(cmd.task_id, cmd.trigger_after_ids)
            if cycle is not None:
                self._refuse(cmd.task_id, f"Cycle detected involving task {cycle}")
                return
        self._enqueue_here(cmd, shard, info, payload_hash)

    def on_enqueue_batch(self, cmd: proto.EnqueueBatch) -> None:
        """Each item of a batch in turn, as `on_enqueue` takes one enqueue line: their
        records join one append per shard (the appends of one call are merged), and each is
        answered alone once durable; an item that did not parse is refused alone."""
        for item in cmd.items:
            if isinstance(item, proto.ProtocolError):
                self.out.send(proto.error(item.task_id, item.message))
            else:
                if self.config.unsafe_batch_ack_early:  # the control: acked before durable
                    self.out.send(proto.ack_enqueued(item.task_id, 0))
                self.on_enqueue(item)

    def _refuse(self, task_id: str, why: str) -> None:
        self.out.send(proto.error(task_id, proto.failed_to_enqueue(why)))

    def _enqueue_here(
        self, cmd: proto.Enqueue, shard: int, info: ShardInfo, payload_hash: str | None
    ) -> None:
        """Take an enqueue into a shard this node owns: its record, and its task in the index
        (ENQUEUING until the record is durable, or dispatched with it, `_runs_at_once`)."""
        book = self.node.book
        task, fields = self.take(cmd, shard, info, payload_hash)
        records = [new_record(fields)]
        if self._runs_at_once(task):
            # Its first attempt starts now: the dispatch record shares the enqueue record's
            # append (one commit, one fsync instead of two in a row); the ack and the
            # `execute` both follow that commit (`Outcomes.on_commit`).
            records.append(new_record(book.begin_attempt(task, task.pool)))
        self.out.append(shard, records, EnqueuePart(shard, task_id=cmd.task_id))

    def take(
        self,
        cmd: proto.Enqueue,
        shard: int,
        info: ShardInfo,
        payload_hash: str | None = None,
    ) -> tuple[Task, dict[str, Any]]:
        """A new task of an owned shard, ENQUEUING in the index, and its record's fields
        (an enqueue's; a schedule's run, `snerd.core.node.schedules`)."""
        book = self.node.book
        if payload_hash is None and cmd.dedupes:
            payload_hash = self.fingerprint(cmd)
        fields, ready_at = self._enqueue_fields(cmd, payload_hash)
        fields[SNERD_NODE] = self.config.node_id
        fields[SNERD_EPOCH] = info.epoch
        fields[SNERD_SEQ] = info.next_seq
        info.next_seq += 1
        book.seq += 1
        # Positional, in field order: with 19 keywords the call costs about 2.6 us, 0.5 us so.
        task = Task(
            cmd.task_id,  # task_id
            cmd.task_type,  # task_type
            shard,  # shard
            book.seq,  # seq
            ENQUEUING,  # state
            0,  # retry_count
            cmd.max_retries,  # max_retries
            cmd.retry_after_hours,  # retry_after_hours
            ready_at,  # ready_at_us
            cmd.urgency_score,  # urgency
            book.pool_of(cmd.pool),  # pool
            cmd.rate_limit_group if cmd.max_per_minute is not None else None,  # group
            cmd.max_per_minute,  # max_per_minute
            payload_hash,  # payload_hash
            cmd.cron,  # cron
            cmd.webhook_url,  # webhook_url
            cmd.max_execution_seconds,  # max_execution_seconds
            cmd.trigger_after_ids,  # trigger_after_ids
            None,  # loc
            1,  # attempt
        )
        if cmd.backoff is not None or cmd.backoff_max_seconds is not None:
            task.backoff = task_backoff(cmd.backoff, cmd.backoff_max_seconds)
        book.tasks[cmd.task_id] = task
        book.add_fingerprint(task)
        self.node.stats["total_enqueued"] += 1
        return task, fields

    @staticmethod
    def fingerprint(cmd: proto.Enqueue) -> str:
        """The dedupe fingerprint of an enqueue with dedupe (`snerd.core.enqueue`)."""
        return enqueue_rule.fingerprint(cmd)

    def _enqueue_fields(
        self, cmd: proto.Enqueue, payload_hash: str | None
    ) -> tuple[dict[str, Any], int]:
        """The task record of a new enqueue now (`snerd.core.enqueue.enqueue_fields`)."""
        return enqueue_rule.enqueue_fields(
            cmd, payload_hash, self.node.now.wall, self.node.wall_text()
        )

    def lines(self, lines: Iterable[bytes]) -> None:
        """Lines from the SDK, each taken in turn as `line` takes it, with the commonest one,
        a plain enqueue (`proto.plain_enqueue`: the five required fields, every optional one
        absent or null), decided here in one loop while running: what `on_enqueue` does for
        it, without building the `Enqueue`, its record joining the run of plain enqueues to
        its shard (`Outbox.append_run`, a list extended in place while no other line comes
        between). The commonest result, a success of a running attempt, is decided here too
        (`_plain_success`). A plain enqueue or result this loop cannot decide alone (an
        enqueue's id pending, its shard not ours: the inbox, or a task that might run at once;
        a failure) goes to its handler with the command built from the fields already taken;
        every other line goes to `line`. After either, nothing this loop holds is trusted.
        Blank lines are skipped."""
        loads = orjson.loads
        decode_error = orjson.JSONDecodeError
        plain_of = proto.plain_enqueue
        result_of = proto.plain_result
        max_line = proto.DEFAULT_MAX_LINE_BYTES
        node = self.node
        book = node.book
        tasks = book.tasks
        registered = book.registered
        inflight = book.inflight
        ready = book.ready
        max_workers = self.config.max_workers
        infos = self.shards
        stats = node.stats
        out = self.out
        open_appends = out.open_appends
        node_id = self.config.node_id
        #: Set up at the first plain enqueue; cleared by any other line.
        shards = 0
        now_text = ""
        runs_free: bool | None = None  # a worker slot free and no ready task (`_runs_at_once`)
        #: shard -> the records, task ids and pending of the run of plain enqueues open there.
        runs: dict[int, tuple[list[fx.NewRecord], list[str], EnqueueRun]] = {}
        for line in lines:
            try:
                doc = loads(line)
            except decode_error:
                if proto.is_blank_line(line):
                    continue  # skipped without an answer, as upstream does
                doc = _NOT_JSON
            # A line plainly valid but not decided here: its command, for the long way.
            command: proto.Enqueue | proto.Result | None = None
            if type(doc) is dict and node.phase is NODE_RUNNING and len(line) <= max_line:
                action = doc.get("action")
                if action == "result":
                    result = result_of(doc)
                    if result is not None:
                        if self._plain_success(result):
                            runs_free = None  # (a worker slot came free)
                            continue
                        command = proto.result_command(result)
                plain = plain_of(doc) if action == "enqueue" else None
                if plain is not None and plain[0] not in tasks:
                    task_id, task_type, task_data, max_retries, hours = plain
                    if task_type in registered and runs_free is None:
                        runs_free = len(inflight) < max_workers and not any(ready.values())
                    # (One that might run at once, `_runs_at_once`, goes the long way.)
                    if not (task_type in registered and runs_free):
                        if not shards:
                            shards = node.tenure.shard_count()
                            now_text = node.wall_text()
                        shard = route_shard(task_id, shards) if shards != 1 else 0
                        info = infos.get(shard)
                        if info is not None and info.phase is ACTIVE:
                            seq = info.next_seq
                            info.next_seq = seq + 1
                            book.seq += 1
                            # The keys and their order of `_enqueue_fields` for a plain enqueue
                            # (literals, checked against the schema at import).
                            record = new_record(
                                {
                                    "taskId": task_id,
                                    "retryCount": 0,
                                    "maxRetries": max_retries,
                                    "retryAfterHours": hours,
                                    "retryAfterTime": now_text,
                                    "taskData": task_data,
                                    "taskType": task_type,
                                    "executeAt": now_text,
                                    "snerdNode": node_id,
                                    "snerdEpoch": info.epoch,
                                    "snerdSeq": seq,
                                }
                            )
                            tasks[task_id] = Task(
                                task_id,  # task_id
                                task_type,  # task_type
                                shard,  # shard
                                book.seq,  # seq
                                ENQUEUING,  # state
                                0,  # retry_count
                                max_retries,  # max_retries
                                hours,  # retry_after_hours
                                0,  # ready_at_us: at once (see `_enqueue_fields`)
                                0.0,  # urgency
                                "default",  # pool (`_pool_of(None)`)
                                None,  # group
                                None,  # max_per_minute
                                None,  # payload_hash
                                None,  # cron
                                None,  # webhook_url
                                None,  # max_execution_seconds
                                (),  # trigger_after_ids
                                None,  # loc
                                1,  # attempt
                            )
                            stats["total_enqueued"] += 1
                            run = runs.get(shard)
                            if run is not None:
                                run[0].append(record)
                                run[1].append(task_id)
                                run[2].count += 1
                            else:
                                out.append_run(shard, info, record, task_id, EnqueueRun)
                                merged = open_appends.get(shard)
                                if merged is not None and merged.records is not None:
                                    last = merged.last
                                    if type(last) is EnqueueRun:
                                        ids = last.ids
                                        if ids[-1] is task_id:
                                            runs[shard] = (merged.records, ids, last)
                            continue
                if plain is not None:
                    command = proto.enqueue_command(plain)
            if command is not None:
                # The long way without parsing the line again (`line` would get the same).
                node.handlers[type(command)](command)
            else:
                self.line(line, doc)
            shards, runs_free = 0, None
            runs.clear()
            if node.phase is STOPPED:
                return

    def _runs_at_once(self, task: Task) -> bool:
        """True when a task being enqueued would be dispatched as soon as its enqueue record
        commits anyway: ready now, no parents, no rate limit, a handler registered (not a
        webhook), a free slot in its pool, and no ready task waiting for a slot (those go first
        by urgency, in `TaskBook.dispatch`)."""
        return (
            self.node.phase is NODE_RUNNING
            and not task.trigger_after_ids
            and task.ready_at_us <= self.node.now.wall
            and task.webhook_url is None
            and task.group is None
            and task.task_type in self.node.book.registered
            and len(self.node.book.inflight) < self.config.max_workers
            and self.node.book.pool_busy.get(task.pool, 0) < self.node.book.pool_limit(task.pool)
            and not any(self.node.book.ready.values())
            and not self.shards[task.shard].giving_back
            and self.shards[task.shard].hold_dispatch_until_mono is None
            and not (self.node.control.paused_shards and self.node.control.holds(task))
        )

    def _enqueue_to_inbox(self, cmd: proto.Enqueue, shard: int, payload_hash: str | None) -> None:
        """Write an enqueue for a shard this node does not own into its own inbox for that
        shard; acked once durable. The owner checks what only it can (a pending task with the
        same id, a duplicate payload, dependencies) when it ingests the record."""
        fields, _ = self._enqueue_fields(cmd, payload_hash)
        fields[SNERD_NODE] = self.config.node_id
        segment = self.node.inbox.segment(shard)
        segment.in_flight += 1
        token = self.out.next_token()
        self.out.pending[token] = InboxPart(
            shard, task_id=cmd.task_id, segment=segment, verdict=cmd.dedupes
        )
        self.node.stats["total_enqueued"] += 1
        self.out.emit(
            fx.AppendInbox(
                token=token,
                shard=shard,
                segment=segment.name,
                records=(new_record(fields),),
                note_log=cmd.dedupes,
            )
        )

    def _ack_duplicate(self, task_id: str, original: Task | FinishedTwin) -> None:
        # Until the original's enqueue record is durable (it has no location yet: ENQUEUING,
        # or DISPATCHING with its dispatch record in the same append), the duplicate's ack
        # waits for it: acked now, it would be lost with the original in a crash.
        if original.loc is None:
            for p in self.out.pending_parts():
                if type(p) is EnqueuePart and p.task_id == original.task_id:
                    p.dedupe_waiters.append(task_id)
                    return
        self.out.send(
            proto.ack_enqueued(
                task_id, original.shard, deduplicated=True, duplicate_of=original.task_id
            )
        )

    def on_result(self, cmd: proto.Result) -> None:
        if self.hold_or(cmd):
            return
        task = self.node.book.result_task(cmd.task_id, cmd.attempt)
        if task is None:
            stopped = self.node.control.stopped.get(cmd.task_id)
            if stopped is not None and cmd.attempt in (stopped, None):
                del self.node.control.stopped[cmd.task_id]  # an attempt a cancel stopped
                return
            self.out.send(proto.error(cmd.task_id, proto.unknown_result(cmd.task_id)))
            return
        result = cmd.result
        if result is not None:
            size, limit = proto.result_size(result), self.config.result_max_bytes
            if size > limit:
                # The attempt fails, retried as any failure: the result cannot be kept.
                error = proto.result_too_large(task.task_id, size, limit)
                self._attempt_ended(task, False, error)
                return
        self._attempt_ended(
            task, cmd.success, cmd.error_msg or "Unknown error", result,
            retry=cmd.retry or self.config.unsafe_retry_final,
        )

    def _plain_success(self, result: proto.PlainResult) -> bool:
        """`on_result` for the commonest result, a success of a running attempt of a task
        that is not a cron task, without building the `Result` (`lines`); False, having done
        nothing, for any other result: `on_result` takes it. A success writes only a
        tombstone, which goes to the call's lazy append, so the line loop's open run of plain
        enqueues stays whole; a cron task's re-arm record would land inside that run."""
        task_id, success, _, attempt = result
        task = self.node.book.result_task(task_id, attempt) if success else None
        if task is None or task.cron is not None:
            return False
        self._attempt_ended(task, True, "")
        return True

    def _attempt_ended(
        self, task: Task, ok: bool, error: str, result: Any = None, *, retry: bool = True
    ) -> None:
        """The outcome of a running attempt, from the SDK or from a webhook; `result`: a
        success's return value (None: none); `retry`: False for a failure the SDK marked
        final."""
        self.node.stats["total_executed"] += 1
        if ok:
            self.node.book.succeeded(task, result)
        else:
            self.node.stats["total_failed"] += 1
            self.node.book.failed(task, error, retry=retry)

    def on_payload_unreadable(self, event: ev.PayloadUnreadable) -> None:
        flight = self.node.book.inflight.get(event.task_id)
        task = self.node.book.tasks.get(event.task_id)
        if flight is None or task is None or task.state is not RUNNING:
            # A dead-letter notice that could not be read: nothing left to decide.
            self.out.log("error", f"task {event.task_id}: cannot read its record ({event.error})")
            return
        if flight.attempt != event.attempt:
            return
        # A failed attempt, so the task's retry and dead-letter rules apply instead of it
        # hanging forever; a record that stays unreadable dead-letters it (`Outcomes.on_append_failed`).
        self._attempt_ended(task, False, f"snerd could not read the task's payload: {event.error}")

    def on_webhook(self, event: ev.WebhookFinished) -> None:
        if event.notification:
            if not event.ok:
                self.out.log(
                    "warning",
                    f"task {event.task_id}: dead-letter webhook failed: {event.error}",
                )
            return
        flight = self.node.book.inflight.get(event.task_id)
        task = self.node.book.tasks.get(event.task_id)
        if flight is None or task is None or flight.attempt != event.attempt:
            return
        self._attempt_ended(task, event.ok, event.error or "Webhook failed")

    def on_progress(self, cmd: proto.Progress) -> None:
        # Progress is a pass-through stream; it is not persisted (upstream does the same). The
        # latest of a running task is kept while it runs, for `get` on this node.
        self.node.control.progressed(cmd.task_id, cmd.data)
        self.out.send(proto.progress(cmd.task_id, cmd.data))

    def on_stats(self, cmd: proto.StatsRequested) -> None:
        if self.hold_or(cmd):
            return
        depth: dict[int, int] = {s: 0 for s in self.node.owned_shards}
        for task in self.node.book.tasks.values():
            depth[task.shard] = depth.get(task.shard, 0) + 1
        message = proto.stats(
            total_enqueued=self.node.stats["total_enqueued"],
            total_executed=self.node.stats["total_executed"],
            total_failed=self.node.stats["total_failed"],
            total_dlq=self.node.stats["total_dlq"],
            queue_depth=len(self.node.book.tasks),
            uptime_secs=(self.node.now.mono - (self.node.started_mono or self.node.now.mono))
            // SECOND,
            per_shard=depth,
            # snerd's additions, which old SDKs ignore.
            extra={
                "in_flight": len(self.node.book.inflight),
                "total_deduplicated": self.node.stats["total_deduplicated"],
                "waiting_types": self.node.waiting_types(),
                "paused_types": self.node.control.paused_types(),
                "node": self.config.node_id,
            },
        )
        self.out.send(message)
