"""The task book: every task this node knows, the queues it waits in, and its lifecycle.

`TaskBook` owns the payload-free task index (`tasks`), the ready queues by pool, the due queue
(delayed tasks and retries), the parked queues (no handler here, by type; rate window full, by
group; shard being given back or holding dispatch, by shard), the parents' children, the dedupe
fingerprints, the attempts in flight with their pool counts, and the rate windows. It moves a
task only along `TRANSITIONS` (`move`), fills free worker slots best task first (`dispatch`),
and writes the records that end an attempt: retry, cron re-arm, completion or dead letter.

Tasks are node-wide, not per shard: the scheduler is per pool across shards. A record is never
told to the SDK here; the outcome of its append does that (`snerd.core.node.outcomes`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from snerd.core import dedupe
from snerd.core import effects as fx
from snerd.core import events as ev
from snerd.core import protocol as proto
from snerd.core.cron import next_fire
from snerd.core.dedupe import UniqueUntil
from snerd.core.fields import adopt_cron
from snerd.core.node.model import (
    ACTIVE,
    BLOCKED,
    CLEARED_ON_SUCCESS,
    DISPATCHING,
    ENQUEUING,
    FENCING,
    FINISHED_TWINS,
    FINISHING,
    LOADING,
    PARKED,
    READY,
    RUNNING,
    SECOND,
    STOPPED,
    TRANSITIONS,
    WAITING,
    FinishedTwin,
    InFlight,
    Task,
    TaskState,
    new_based_record,
    new_execute,
    new_record,
    queue_in,
    require,
)
from snerd.core.node.outbox import DispatchRun, FinishPart, FinishRun, RearmPart, RetryPart
from snerd.core.rate_limit import RateWindows
from snerd.core.ready_queue import DueQueue, ReadyQueue
from snerd.core.retry import EXPONENTIAL_CAP_US, attempts_allowed, retry_delay_us, task_backoff
from snerd.core.schema import (
    CRON_EXPRESSION,
    DELETED_AT,
    DISPATCH_ATTEMPT,
    DISPATCH_GROUP,
    DISPATCH_TASK,
    EXECUTE_AT,
    KIND_DISPATCH,
    LAST_ERROR_OBJ,
    LAST_JOB_ERROR,
    MAX_EXECUTION_SECONDS,
    MAX_PER_MINUTE,
    MAX_RETRIES,
    OUTCOME_CANCELLED,
    OUTCOME_COMPLETED,
    OUTCOME_DEAD,
    PAYLOAD_HASH,
    POOL,
    RATE_LIMIT_GROUP,
    RECORD_AT,
    RETRY_AFTER_HOURS,
    RETRY_AFTER_TIME,
    RETRY_COUNT,
    SNERD_BACKOFF,
    SNERD_BACKOFF_MAX,
    SNERD_EPOCH,
    SNERD_KIND,
    SNERD_NODE,
    SNERD_OUTCOME,
    SNERD_RESULT,
    TASK_ID,
    TASK_TYPE,
    TRIGGER_AFTER_IDS,
    URGENCY_SCORE,
    WEBHOOK_URL,
)
from snerd.core.timefmt import format_rfc3339, parse_rfc3339

if TYPE_CHECKING:
    from snerd.core.node.node import Node

__all__ = ["TaskBook"]


class TaskBook:
    """The task index, its queues and the task lifecycle (see the module docstring)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.config = node.config
        self.shards = node.shards
        self.out = node.outbox
        self.tasks: dict[str, Task] = {}
        self.registered: set[str] = set()
        #: Types whose SDK handler can be stopped (`register` with `cancellable`).
        self.cancellable: set[str] = set()
        self.inflight: dict[str, InFlight] = {}
        #: Some flight may have a deadline (set with it; cleared by `timeouts_fire` when none has).
        self.timed_flights = False
        self.pool_busy: dict[str, int] = {}
        self.ready: dict[str, ReadyQueue[str]] = {}
        self.due: DueQueue[str] = DueQueue()
        #: Tasks waiting for a handler, by type.
        self.parked_by_type: dict[str, ReadyQueue[str]] = {}
        #: Tasks waiting for room in their rate window, by group.
        self.parked_by_group: dict[str, ReadyQueue[str]] = {}
        self.group_wake: DueQueue[str] = DueQueue()
        self.windows = RateWindows()
        #: The live tasks of each dedupe fingerprint, in the order they came (`pending_twin`).
        #: Usually one, but two can share it: one with a rate-limit group routes by its group,
        #: so two owners may each take one in, and a node taking both shards over has both.
        self.fingerprints: dict[str, dict[str, None]] = {}
        #: The latest finished task of each dedupe fingerprint, oldest first (`twin`).
        self.finished_twins: dict[str, FinishedTwin] = {}
        #: Ready tasks of shards being given back (not dispatched here any more), by shard.
        self.parked_by_shard: dict[int, ReadyQueue[str]] = {}
        #: Ready tasks whose type is paused in their shard (`Control.holds`), by shard.
        self.parked_by_pause: dict[int, ReadyQueue[str]] = {}
        self.seq = 0

    # -- timers (`Node.timers`)

    def invariants(self) -> None:
        """Check the index against its queues (`Node.invariants`): each queue entry is a
        known task in the state and on the key that queue means; each task in a waiting
        state is in its queue, each dispatching or running one in flight; the pool counts,
        the fingerprints."""
        tasks = self.tasks
        for task_id, task in tasks.items():
            require(task.task_id == task_id, f"task {task_id} is filed under another id")
        queued: dict[str, str] = {}

        def entries(where: str, queue: ReadyQueue[str] | DueQueue[str], state: TaskState) -> None:
            for task_id in queue.queued():
                task = tasks.get(task_id)
                require(task is not None, f"{where} holds {task_id}, which is not a live task")
                assert task is not None
                require(task.state is state, f"{where} holds {task_id}, {task.state.value}")
                require(task_id not in queued, f"{task_id} is in {queued.get(task_id)} and {where}")
                queued[task_id] = where

        for pool, queue in self.ready.items():
            entries(f"ready[{pool}]", queue, READY)
            require(
                all(tasks[t].pool == pool for t in queue.queued()), f"ready[{pool}]: wrong pool"
            )
        for key, queue in self.parked_by_type.items():
            entries(f"parked_by_type[{key}]", queue, PARKED)
        for group, queue in self.parked_by_group.items():
            entries(f"parked_by_group[{group}]", queue, PARKED)
        for shard, queue in self.parked_by_shard.items():
            entries(f"parked_by_shard[{shard}]", queue, PARKED)
            require(all(tasks[t].shard == shard for t in queue.queued()), "parked on another shard")
        for shard, queue in self.parked_by_pause.items():
            entries(f"parked_by_pause[{shard}]", queue, PARKED)
            require(all(tasks[t].shard == shard for t in queue.queued()), "paused on another shard")
        entries("due", self.due, WAITING)
        for task_id, task in tasks.items():
            if task.state in (READY, PARKED, WAITING):
                require(task_id in queued, f"{task.state.value} task {task_id} is in no queue")
            flying = task.state in (DISPATCHING, RUNNING)
            require(flying == (task_id in self.inflight), f"{task_id} {task.state.value}: flight")
        self._flight_invariants()

    def _flight_invariants(self) -> None:
        # (A stopped node let go of its shards and keeps what it held as it was.)
        stopped = self.node.phase is STOPPED
        busy: dict[str, int] = {}
        for task_id, flight in self.inflight.items():
            task = self.tasks[task_id]
            require(flight.task_id == task_id, f"flight of {task_id} names {flight.task_id}")
            require(flight.attempt == task.attempt, f"{task_id}: flight of another attempt")
            info = self.shards.get(task.shard)
            require(
                stopped or (info is not None and info.phase in (LOADING, FENCING, ACTIVE)),
                f"{task_id} is in flight on shard {task.shard}, which this node does not hold",
            )
            require(
                flight.deadline_mono is None or self.timed_flights,
                f"{task_id} has a deadline but timed_flights is off",
            )
            busy[flight.pool] = busy.get(flight.pool, 0) + 1
        for pool, count in self.pool_busy.items():
            require(
                count == busy.get(pool, 0), f"pool {pool}: {count} busy, {busy.get(pool, 0)} flying"
            )
        require(len(self.inflight) <= self.config.max_workers, "more in flight than max_workers")
        for digest, ids in self.fingerprints.items():
            require(bool(ids), f"fingerprint {digest} lists no task")
            for task_id in ids:
                twin = self.tasks.get(task_id)
                require(
                    twin is not None and twin.payload_hash == digest,
                    f"fingerprint {digest} lists {task_id}, not a live task of it",
                )
        for task in self.tasks.values():
            if task.payload_hash is not None:
                ids = self.fingerprints.get(task.payload_hash, {})
                require(task.task_id in ids, f"{task.task_id} is missing from its fingerprint")

    def due_at(self) -> int | None:
        """When the next delayed task or retry is due (wall)."""
        return self.due.next_due()

    def due_fire(self, now: ev.Now) -> None:
        """Delayed tasks and retries whose time came."""
        tasks = self.tasks
        for task_id in self.due.pop_due(now.wall):
            task = tasks[task_id]
            self.move(task, READY)
            self.push_ready(task)

    def group_wake_at(self) -> int | None:
        """When the next full rate window has room again (wall)."""
        return self.group_wake.next_due()

    def group_wake_fire(self, now: ev.Now) -> None:
        """Rate windows with room again: their parked tasks are ready."""
        for group in self.group_wake.pop_due(now.wall):
            parked = self.parked_by_group.get(group)
            while parked:
                task = self.tasks[parked.pop()]
                self.move(task, READY)
                self.push_ready(task)

    def timeouts_due(self) -> int | None:
        """The earliest hard timeout of an attempt in flight (mono)."""
        if not self.timed_flights:
            return None
        deadlines = [f.deadline_mono for f in self.inflight.values() if f.deadline_mono is not None]
        return min(deadlines) if deadlines else None

    def timeouts_fire(self, now: ev.Now) -> None:
        """Hard timeouts. `timed_flights` spares the scan of every flight on every event when
        no attempt has a deadline (the common case); it is cleared when a scan finds none."""
        timed = (
            [f for f in self.inflight.values() if f.deadline_mono is not None]
            if self.timed_flights
            else []
        )
        if self.timed_flights and not timed:
            self.timed_flights = False
        for flight in timed:
            assert flight.deadline_mono is not None
            if now.mono >= flight.deadline_mono:
                task = self.tasks[flight.task_id]
                if task.state is RUNNING:
                    self.node.stats["total_failed"] += 1
                    self.failed(task, proto.timed_out(task.max_execution_seconds or 0))

    def dispatch_holds_due(self) -> int | None:
        """When the earliest shard's dispatch hold (a dispatch record that failed) ends (mono)."""
        holds = [
            i.hold_dispatch_until_mono
            for i in self.shards.values()
            if i.hold_dispatch_until_mono is not None
        ]
        return min(holds) if holds else None

    def dispatch_holds_fire(self, now: ev.Now) -> None:
        """Shards whose dispatch hold ends: their parked ready tasks are ready again."""
        for shard, info in self.shards.items():
            until = info.hold_dispatch_until_mono
            if until is not None and now.mono >= until:
                info.hold_dispatch_until_mono = None
                parked = self.parked_by_shard.get(shard)
                while parked and not info.giving_back:
                    task = self.tasks[parked.pop()]
                    self.move(task, READY)
                    self.push_ready(task)

    # -- the lifecycle

    def move(self, task: Task, new: TaskState) -> None:
        if (task.state, new) not in TRANSITIONS:
            raise AssertionError(f"task {task.task_id}: {task.state.value} -> {new.value}")
        task.state = new

    def pool_of(self, name: str | None) -> str:
        if name is not None and name in self.config.pools:
            return name
        return "default"

    def pool_limit(self, pool: str) -> int:
        return min(self.config.pools.get(pool, self.config.max_workers), self.config.max_workers)

    def forget(self, task_id: str) -> None:
        task = self.tasks.pop(task_id)
        self._unqueue(task)
        flight = self.inflight.pop(task_id, None)
        if flight is not None:
            self.pool_busy[flight.pool] -= 1
        self.drop_fingerprint(task)
        self.node.parents.forget(task_id)
        self.node.schedules.run_finished(task_id)

    def add_fingerprint(self, task: Task) -> None:
        if task.payload_hash is not None:
            self.fingerprints.setdefault(task.payload_hash, {})[task.task_id] = None

    def drop_fingerprint(self, task: Task) -> None:
        """`task` is no longer live: its fingerprint's other live tasks stay known."""
        if task.payload_hash is None:
            return
        ids = self.fingerprints.get(task.payload_hash)
        if ids is not None:
            ids.pop(task.task_id, None)
            if not ids:
                del self.fingerprints[task.payload_hash]

    def _unqueue(self, task: Task) -> None:
        self.due.discard(task.task_id)
        for q in (
            self.ready.get(task.pool),
            self.parked_by_type.get(task.task_type),
            self.parked_by_group.get(task.group or ""),
            self.parked_by_shard.get(task.shard),
            self.parked_by_pause.get(task.shard),
        ):
            if q is not None:
                q.discard(task.task_id)

    def task_from_record(
        self, shard: int, f: dict[str, Any], loc: fx.Location | None
    ) -> Task | None:
        """The task of its latest record, read from a log or an inbox and found runnable by
        the record rule (`snerd.core.records.task_problem`): each value has the type and
        range the task runs with. (A `null` is an absent key there, and an empty group, pool,
        cron or webhook URL none.)"""
        try:
            task_id = f[TASK_ID]
            task_type = f[TASK_TYPE]
            retry_count = f.get(RETRY_COUNT) or 0
            max_retries = f.get(MAX_RETRIES) or 0
            ready = max(
                _parse_time(f.get(EXECUTE_AT), 0),
                _parse_time(f.get(RETRY_AFTER_TIME), 0),
            )
            cron = f.get(CRON_EXPRESSION) or None
            if cron is not None:
                # Upstream's 7-field form is read without its year.
                cron = adopt_cron(CRON_EXPRESSION, cron)
        except (KeyError, ValueError):  # (a record the rule was not asked about)
            return None
        if cron is None and f.get(EXECUTE_AT) == f.get(RETRY_AFTER_TIME) is not None:
            # Enqueued without `execute_at` (both times are the enqueue's, as no retry or cron
            # tick has moved one): due at once, whatever this node's clock says of the other
            # writer's (an inbox record) or of an earlier wall clock (a replay after a step).
            ready = 0
        self.seq += 1
        urgency = f.get(URGENCY_SCORE)
        return Task(
            task_id=task_id,
            task_type=task_type,
            shard=shard,
            seq=self.seq,
            state=ENQUEUING,
            retry_count=retry_count,
            max_retries=max_retries,
            retry_after_hours=float(f.get(RETRY_AFTER_HOURS) or 0.0),
            ready_at_us=ready,
            urgency=float(urgency) if isinstance(urgency, int | float) else 0.0,
            pool=self.pool_of(f.get(POOL) or None),
            group=f.get(RATE_LIMIT_GROUP) or None,
            max_per_minute=f.get(MAX_PER_MINUTE),
            payload_hash=f.get(PAYLOAD_HASH),
            cron=cron,
            webhook_url=f.get(WEBHOOK_URL) or None,
            max_execution_seconds=f.get(MAX_EXECUTION_SECONDS),
            trigger_after_ids=tuple(f.get(TRIGGER_AFTER_IDS) or ()),
            loc=loc,
            attempt=retry_count + 1,
            last_error=f.get(LAST_ERROR_OBJ),
            backoff=task_backoff(f.get(SNERD_BACKOFF), f.get(SNERD_BACKOFF_MAX)),
        )

    def twin(self, payload_hash: str, until: UniqueUntil) -> Task | FinishedTwin | None:
        """The task an enqueue with this dedupe fingerprint and `unique_until` is a duplicate
        of (`snerd.core.dedupe.counts`), if any: the oldest live one that counts, else the one
        that finished last, if it counts (an enqueue's, or an inbox record's being ingested:
        both are dropped as its duplicates)."""
        now = self.node.now.wall
        for task_id in self.fingerprints.get(payload_hash, ()):
            task = self.tasks[task_id]
            started = task.state is RUNNING or task.state is DISPATCHING
            if dedupe.counts(until, started=started, finished_at_us=None, now_us=now):
                return task
        ended = self.finished_twins.get(payload_hash)
        if ended is not None and dedupe.counts(
            until, started=True, finished_at_us=ended.finished_at_us, now_us=now
        ):
            return ended
        return None

    def twin_finished(self, task: Task, shard: int, at_us: int) -> None:
        """A task with a dedupe fingerprint ended: later enqueues with a `unique_until` of
        seconds are judged against it for that long (at most `FINISHED_TWINS` are kept, the
        latest)."""
        if task.payload_hash is not None:
            self.remember_twin(task.payload_hash, FinishedTwin(task.task_id, shard, at_us))

    def remember_twin(self, payload_hash: str, twin: FinishedTwin) -> None:
        """`twin` is the latest finished task of its fingerprint, unless one that finished
        later is known (a replay reads shards in any order); the oldest beyond
        `FINISHED_TWINS` are forgotten."""
        twins = self.finished_twins
        known = twins.pop(payload_hash, None)
        twins[payload_hash] = twin if known is None or known.finished_at_us <= twin.finished_at_us else known
        if len(twins) > FINISHED_TWINS:
            del twins[next(iter(twins))]

    def cycle(self, task_id: str, parents: Iterable[str]) -> str | None:
        """A task id on a dependency cycle through `task_id`, or None: followed through this
        node's live tasks and the parents the watch saw in other shards' files."""
        elsewhere = self.node.parents.watch.parents_of
        seen: set[str] = set()
        stack = list(parents)
        while stack:
            parent = stack.pop()
            if parent == task_id:
                return task_id
            if parent in seen:
                continue
            seen.add(parent)
            task = self.tasks.get(parent)
            if task is not None:
                stack.extend(task.trigger_after_ids)
            else:
                stack.extend(elsewhere.get(parent, ()))
        return None

    def result_task(self, task_id: str, attempt: int | None) -> Task | None:
        """The task a result is for: running, in the attempt named (if one is); None when
        there is none (unknown, finished, or that attempt timed out)."""
        flight = self.inflight.get(task_id)
        task = self.tasks.get(task_id)
        if (
            flight is None
            or task is None
            or task.state is not RUNNING
            or (attempt is not None and attempt != flight.attempt)
        ):
            return None
        return task

    def schedule(self, task: Task, now: ev.Now) -> None:
        """Put a task whose record is durable where it belongs: blocked, waiting or ready."""
        if task.trigger_after_ids and self.node.parents.hold(task):
            return
        self.place(task, now)

    def unblock(self, task: Task) -> None:
        """Every parent of a blocked task has completed (`Parents`): it runs when due."""
        self.place(task, self.node.now)

    def place(self, task: Task, now: ev.Now) -> None:
        """A task free to run: waiting until it is due, or ready."""
        if task.ready_at_us > now.wall:
            self.move(task, WAITING)
            self.due.push(task.task_id, task.ready_at_us, task.seq)
            return
        self.move(task, READY)
        if task.webhook_url is None and task.task_type not in self.registered:
            self.park_by_type(task)
            return
        self.push_ready(task)

    def park_by_type(self, task: Task) -> None:
        """A ready task with no handler here: `dispatch` would only pop it to park it; park
        it now, in the same queue with the same order keys (`Intake.on_register` makes it ready
        again)."""
        self.move(task, PARKED)
        queue_in(self.parked_by_type, task.task_type).push(task.task_id, task.urgency, task.seq)

    def push_ready(self, task: Task) -> None:
        assert task.state is READY
        queue_in(self.ready, task.pool).push(task.task_id, task.urgency, task.seq)

    def dispatch(self) -> None:
        """Fill free worker slots, best task first (highest urgency, then enqueue order)."""
        ready = self.ready
        tasks = self.tasks
        while True:
            free = self.config.max_workers - len(self.inflight)
            if free <= 0:
                return
            if len(ready) == 1:
                # One pool (the usual case): its head is the best task, nothing to compare;
                # as many as it has room for are taken at once.
                ((pool, queue),) = ready.items()
                free = min(free, self.pool_limit(pool) - self.pool_busy.get(pool, 0))
                if not queue or free <= 0:
                    return
                for task_id in queue.pop_many(free):
                    self._offer(tasks[task_id], pool)
                continue
            best: tuple[float, int, str] | None = None
            for pool, queue in ready.items():
                if not queue or self.pool_busy.get(pool, 0) >= self.pool_limit(pool):
                    continue
                head = queue.peek()
                assert head is not None
                t = tasks[head]
                key = (-t.urgency, t.seq, pool)
                if best is None or key < best:
                    best = key
            if best is None:
                return
            pool = best[2]
            self._offer(tasks[ready[pool].pop()], pool)

    def _offer(self, task: Task, pool: str) -> None:
        """A task taken from the ready queue of `pool`, which has a free slot: its attempt
        starts, or it is parked (its shard holds dispatch or is being given back, no handler
        here takes its type, its rate window is full)."""
        info = self.shards[task.shard]
        if info.giving_back or info.hold_dispatch_until_mono is not None:
            self.move(task, PARKED)
            queue_in(self.parked_by_shard, task.shard).push(task.task_id, task.urgency, task.seq)
            return
        if task.webhook_url is None and task.task_type not in self.registered:
            self.park_by_type(task)
            return
        control = self.node.control
        if control.paused_shards and task.shard in control.paused_shards and control.holds(task):
            self.move(task, PARKED)
            queue_in(self.parked_by_pause, task.shard).push(task.task_id, task.urgency, task.seq)
            return
        if task.group is not None and task.max_per_minute is not None:
            now = self.node.now
            if not self.windows.allows(task.group, task.max_per_minute, now.wall):
                self.move(task, PARKED)
                queue_in(self.parked_by_group, task.group).push(
                    task.task_id, task.urgency, task.seq
                )
                wake = self.windows.next_allowed_us(task.group, task.max_per_minute, now.wall)
                if task.group not in self.group_wake:
                    self.group_wake.push(task.group, wake, 0)
                return
            self.windows.record(task.group, now.wall)
        self._start_attempt(task, pool)

    def _start_attempt(self, task: Task, pool: str) -> None:
        fields = self.begin_attempt(task, pool)
        shard = task.shard
        self.out.append_run(
            shard, self.shards[shard], new_record(fields), task.task_id, DispatchRun
        )

    def begin_attempt(self, task: Task, pool: str) -> dict[str, Any]:
        """Take a worker slot for the task's next attempt (-> DISPATCHING); return the fields
        of its dispatch record."""
        self.move(task, DISPATCHING)
        if task.attempt <= task.retry_count:
            task.attempt = task.retry_count + 1
        self.inflight[task.task_id] = InFlight(task.task_id, task.attempt, pool, None)
        self.pool_busy[pool] = self.pool_busy.get(pool, 0) + 1
        fields: dict[str, Any] = {
            SNERD_KIND: KIND_DISPATCH,
            DISPATCH_TASK: task.task_id,
            DISPATCH_ATTEMPT: task.attempt,
            RECORD_AT: self.node.wall_text(),
        }
        if task.group is not None:
            fields[DISPATCH_GROUP] = task.group
        # (`Tenure.meta`, set key by key: one dispatch record per attempt.)
        fields[SNERD_NODE] = self.config.node_id
        fields[SNERD_EPOCH] = self.shards[task.shard].epoch
        return fields

    def begin_execution(self, task: Task) -> None:
        now = self.node.now
        flight = self.inflight[task.task_id]
        self.move(task, RUNNING)
        assert task.loc is not None
        if task.webhook_url is not None:
            timeout = float(task.max_execution_seconds or self.config.webhook_timeout_s)
            self.call_webhook(task, task.webhook_url, task.loc, "Execute", timeout)
            return
        if task.max_execution_seconds is not None:
            flight.deadline_mono = now.mono + task.max_execution_seconds * SECOND
            self.timed_flights = True
        self.out.emit(
            new_execute(
                task.task_id, task.task_type, task.attempt, task.loc, task.max_execution_seconds
            )
        )

    def call_webhook(
        self, task: Task, url: str, loc: fx.Location, event: str, timeout: float
    ) -> None:
        self.out.emit(
            fx.CallWebhook(
                task_id=task.task_id,
                task_type=task.task_type,
                attempt=task.attempt,
                url=url,
                location=loc,
                event=event,
                timeout_seconds=timeout,
            )
        )

    def cancel(self, task: Task) -> None:
        """End a live task as cancelled (`snerd.core.node.control`): out of its queue or its
        flight (the attempt's result, if one comes, is dropped), then its tombstone."""
        if task.state is RUNNING:
            self._end_flight(task)
        else:
            self._unqueue(task)
            if task.state is BLOCKED:
                self.node.parents.forget(task.task_id)
            self.move(task, FINISHING)
        self.finish(task, OUTCOME_CANCELLED, None)

    def unpark_paused(self, shard: int) -> None:
        """A resume in `shard`: its tasks held by a pause are ready again (`dispatch` parks
        those still paused once more)."""
        parked = self.parked_by_pause.pop(shard, None)
        while parked:
            task = self.tasks[parked.pop()]
            self.move(task, READY)
            self.push_ready(task)

    def _end_flight(self, task: Task) -> None:
        flight = self.inflight.pop(task.task_id)
        self.pool_busy[flight.pool] -= 1
        self.move(task, FINISHING)

    def succeeded(self, task: Task, result: Any = None) -> None:
        """A running attempt succeeded, returning `result` (None: nothing), which its
        tombstone keeps. A cron task's run keeps none: it is re-armed, not finished."""
        self._end_flight(task)
        assert task.loc is not None
        if task.cron is not None and self._rearm(task, None):
            return
        self._complete(task, result)

    def _rearm(self, task: Task, error: str | None) -> bool:
        """A cron task's run ended: due again at its next tick, same id, retry count reset
        (missed ticks skipped); the run's error kept when it used every attempt (`error`),
        else cleared. False: it has no next tick (a wall clock near year 9999): it ends."""
        now = self.node.now
        assert task.cron is not None and task.loc is not None
        try:
            nxt = next_fire(task.cron, now.wall)
        except ValueError as exc:
            self.out.log("warning", f"task {task.task_id}: not re-armed: {exc}; it is done")
            return False
        fields: dict[str, Any] = {
            RETRY_COUNT: 0,
            RETRY_AFTER_TIME: format_rfc3339(now.wall),
            EXECUTE_AT: format_rfc3339(nxt),
            **self.node.tenure.meta(task.shard),
        }
        remove: tuple[str, ...] = (DELETED_AT,)
        if error is None:
            remove = (LAST_ERROR_OBJ, LAST_JOB_ERROR, DELETED_AT)
        else:
            fields[LAST_ERROR_OBJ] = error
            fields[LAST_JOB_ERROR] = {"error": error, "retry_worthy": False}
        record = fx.NewRecord(fields=fields, base=task.loc, remove=remove)
        self.out.append(
            task.shard, [record], RearmPart(task.shard, task_id=task.task_id, ready_at=nxt)
        )
        return True

    def failed(self, task: Task, error: str, *, retry: bool = True) -> None:
        """A failed attempt: retried after its backoff while attempts are left and `retry`
        (False: a failure its SDK marked final), else dead-lettered (a cron task re-armed)."""
        now = self.node.now
        self._end_flight(task)
        task.last_error = error
        if retry and task.attempt < attempts_allowed(task.max_retries):
            own = None if self.config.unsafe_ignore_task_backoff else task.backoff
            policy, cap_us = own or (None, EXPONENTIAL_CAP_US)
            delay = retry_delay_us(
                retry_after_hours=task.retry_after_hours,
                failures=task.attempt,
                policy=policy or self.config.backoff,
                jitter_seed=self.config.jitter_seed,
                task_id=task.task_id,
                cap_us=cap_us,
            )
            fields = {
                RETRY_COUNT: task.attempt,
                RETRY_AFTER_TIME: format_rfc3339(now.wall + delay),
                LAST_ERROR_OBJ: error,
                LAST_JOB_ERROR: {"error": error, "retry_worthy": True},
                **self.node.tenure.meta(task.shard),
            }
            self.out.append(
                task.shard,
                [fx.NewRecord(fields=fields, base=task.loc)],
                RetryPart(task.shard, task_id=task.task_id, ready_at=now.wall + delay),
            )
            return
        if task.cron is not None and self._rearm(task, error):
            # A run of a cron task that used every attempt: reported as a dead letter, and
            # the schedule goes on at its next tick (upstream ended it for good).
            self.node.stats["total_dlq"] += 1
            self._deliver_dead(task, task.loc, error)
            return
        self.finish(task, OUTCOME_DEAD, error)

    def dead_letter_unbased(self, task: Task, error: str) -> None:
        """Dead-letter `task` with a tombstone that needs no base record (its own is damaged,
        or holds no payload to keep)."""
        fields = {
            TASK_ID: task.task_id,
            TASK_TYPE: task.task_type,
            RETRY_COUNT: task.attempt,
            MAX_RETRIES: task.max_retries,
            DELETED_AT: format_rfc3339(self.node.now.wall),
            SNERD_OUTCOME: OUTCOME_DEAD,
            LAST_ERROR_OBJ: error,
            LAST_JOB_ERROR: {"error": error, "retry_worthy": False},
            **self.node.tenure.meta(task.shard),
        }
        self.out.append(
            task.shard,
            [fx.NewRecord(fields=fields)],
            FinishPart(task.shard, task_id=task.task_id, outcome=OUTCOME_DEAD, error=error),
        )

    def finish(self, task: Task, outcome: str, error: str | None) -> None:
        """Write the tombstone that ends a task (completed or dead-lettered)."""
        if outcome == OUTCOME_COMPLETED:
            self._complete(task)
            return
        shard = task.shard
        fields = self._tombstone_fields(task, task.attempt, outcome)
        if error is not None:
            fields[LAST_ERROR_OBJ] = error
            fields[LAST_JOB_ERROR] = {"error": error, "retry_worthy": False}
        self.out.append(
            shard,
            [new_based_record(fields, task.loc, ())],
            FinishPart(shard, task_id=task.task_id, outcome=outcome, error=error),
        )

    def _complete(self, task: Task, result: Any = None) -> None:
        """Write the tombstone of a task that succeeded, with its handler's `result` (None:
        none). Success clears the error (upstream kept it, so dashboards showed "failed").
        The tombstones of tasks completed together are one run (`FinishRun`: one pending for
        them all, each committed as a `FinishPart` of its own would be)."""
        shard = task.shard
        info = self.shards[shard]
        fields = self._tombstone_fields(task, task.retry_count, OUTCOME_COMPLETED)
        if self.config.unsafe_wrong_result:
            result = _wrong_result(result)
        if result is not None:
            fields[SNERD_RESULT] = result
        record = new_based_record(fields, task.loc, CLEARED_ON_SUCCESS)
        self.out.append_run(shard, info, record, task.task_id, FinishRun)

    def _deliver_dead(self, task: Task, loc: fx.Location | None, error: str | None) -> None:
        """Tell whoever takes `task`'s dead letters: its webhook, or the SDK with its handler."""
        assert loc is not None
        if task.webhook_url is not None:
            self.call_webhook(
                task, task.webhook_url, loc, "MaxRetriesReached", self.config.webhook_timeout_s
            )
        elif task.task_type in self.registered:
            self.out.emit(
                fx.DeliverDeadLetter(
                    task_id=task.task_id,
                    task_type=task.task_type,
                    location=loc,
                    error=error or "",
                )
            )

    def _tombstone_fields(self, task: Task, retry_count: int, outcome: str) -> dict[str, Any]:
        return {
            RETRY_COUNT: retry_count,
            DELETED_AT: self.node.wall_text(),
            SNERD_OUTCOME: outcome,
            SNERD_NODE: self.config.node_id,  # (`Tenure.meta`, key by key: one per task)
            SNERD_EPOCH: self.shards[task.shard].epoch,
        }

    def end_flight_unsent(self, task: Task, delay_us: int = 0) -> None:
        """Give back the slot of an attempt that was never sent (its dispatch record is moot)."""
        flight = self.inflight.pop(task.task_id)
        self.pool_busy[flight.pool] -= 1
        if delay_us:
            self.move(task, WAITING)
            self.due.push(task.task_id, self.node.now.wall + delay_us, task.seq)
        else:
            self.move(task, READY)
            self.push_ready(task)

    def finished(self, task: Task, outcome: str, error: str | None, loc: fx.Location) -> None:
        info = self.shards[task.shard]
        del self.tasks[task.task_id]
        self.drop_fingerprint(task)
        self.twin_finished(task, task.shard, self.node.now.wall)
        history = info.history
        history.pop(task.task_id, None)  # (a reused id: its latest end goes last)
        history[task.task_id] = (loc, outcome)
        completed_at, ended = info.completed_at, info.ended
        completed_at.pop(task.task_id, None)
        ended.pop(task.task_id, None)
        if outcome == OUTCOME_COMPLETED:
            completed_at[task.task_id] = self.node.now.wall
        else:
            ended[task.task_id] = (self.node.now.wall, task.task_type)
        while len(history) > self.config.history_limit:
            oldest = next(iter(history))
            del history[oldest]
            completed_at.pop(oldest, None)
            ended.pop(oldest, None)
        if outcome == OUTCOME_DEAD:
            self.node.stats["total_dlq"] += 1
            self._deliver_dead(task, loc, error)
        self.node.parents.parent_finished(task.task_id, outcome)
        self.node.schedules.run_finished(task.task_id)
        self.node.control.task_finished(task.task_id, outcome)


def _wrong_result(result: Any) -> Any:
    """What `NodeConfig.unsafe_wrong_result` stores instead of `result`: a different value."""
    return {"wrong": result}


def _parse_time(value: Any, default: int) -> int:
    if not isinstance(value, str):
        return default
    return parse_rfc3339(value)
