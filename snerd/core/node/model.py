"""The node's data: its settings, the states of a task and of the node, and the records it keeps
per task and per shard.

Data only: nothing here decides anything or emits an effect. Every other module of the package
imports this one, and this one imports none of them (an import-linter contract), so the records
read the same wherever a part of the node holds them.

`TRANSITIONS` is the one table of allowed task state changes (the package's `node` module
draws the graph); `TaskBook.move` refuses anything else.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import xxhash

from snerd.core import effects as fx
from snerd.core.ownership import DEFAULT_QUEUE, OwnershipConfig, ShardPhase
from snerd.core.protocol import DEFAULT_RESULT_MAX_BYTES
from snerd.core.ready_queue import ReadyQueue
from snerd.core.schema import LAST_ERROR_OBJ, LAST_JOB_ERROR
from snerd.core.shardlog import ShardFold
from snerd.core.slots import slot_constructor

__all__ = [
    "ACTIVE",
    "BLOCKED",
    "CLEARED_ON_SUCCESS",
    "COMPACT_CHECK_BYTES_PER_TASK",
    "DISPATCHING",
    "DRAINING",
    "ENQUEUING",
    "FENCING",
    "FINISHING",
    "INBOX_SEGMENT_BYTES",
    "LOADING",
    "LOCKING",
    "NODE_RUNNING",
    "PARKED",
    "PAUSED",
    "PROBING",
    "READY",
    "RUNNING",
    "SECOND",
    "STARTING",
    "STOPPED",
    "TRANSITIONS",
    "UNOWNED",
    "WAITING",
    "InFlight",
    "InboxSegment",
    "LockProof",
    "NodeConfig",
    "NodePhase",
    "ShardInfo",
    "Task",
    "TaskState",
    "inbox_segment_name",
    "ingested",
    "new_ack_enqueued",
    "new_append",
    "new_based_record",
    "new_execute",
    "new_keep_range",
    "new_location",
    "new_record",
    "new_send",
    "queue_in",
    "require",
    "route_shard",
]

SECOND = 1_000_000

#: A writer closes an inbox segment once it holds this much, and writes the next to another
#: (`NodeConfig.inbox_segment_bytes`, a producer's segments alike).
INBOX_SEGMENT_BYTES = 16 * 1024 * 1024


class NodePhase(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    DRAINING = "draining"
    STOPPED = "stopped"


class TaskState(enum.Enum):
    ENQUEUING = "enqueuing"
    WAITING = "waiting"
    READY = "ready"
    PARKED = "parked"
    BLOCKED = "blocked"
    DISPATCHING = "dispatching"
    RUNNING = "running"
    FINISHING = "finishing"

    #: By identity (members are singletons, and equal only to themselves): `Enum.__hash__`
    #: is Python code, and `TaskBook.move` looks up a pair of states for every state change.
    __hash__ = object.__hash__


S = TaskState
#: Every allowed task state change. `TaskBook.move` refuses anything else.
TRANSITIONS: frozenset[tuple[TaskState, TaskState]] = frozenset(
    {
        (S.ENQUEUING, S.WAITING),
        (S.ENQUEUING, S.READY),
        (S.ENQUEUING, S.BLOCKED),
        (S.ENQUEUING, S.DISPATCHING),
        (S.BLOCKED, S.READY),
        (S.BLOCKED, S.WAITING),
        (S.BLOCKED, S.FINISHING),
        # cancelled while it waits (`snerd.core.control`)
        (S.WAITING, S.FINISHING),
        (S.READY, S.FINISHING),
        (S.PARKED, S.FINISHING),
        (S.ENQUEUING, S.FINISHING),  # replayed, but its record is one it cannot run with
        (S.WAITING, S.READY),
        (S.READY, S.PARKED),
        (S.PARKED, S.READY),
        (S.READY, S.DISPATCHING),
        (S.DISPATCHING, S.RUNNING),
        (S.DISPATCHING, S.READY),
        (S.DISPATCHING, S.WAITING),
        (S.RUNNING, S.FINISHING),
        (S.FINISHING, S.WAITING),
        (S.FINISHING, S.READY),
    }
)

# The members of the state enums as module globals, which the node reads instead of
# `TaskState.READY` and the like: on CPython 3.11 every attribute read on an Enum class goes
# through `EnumType.__getattr__`'s slow hook (~0.25 µs, against ~0.02 µs for a global), and the
# node reads them many times per message.
ENQUEUING, WAITING, READY, PARKED = (S.ENQUEUING, S.WAITING, S.READY, S.PARKED)
BLOCKED, DISPATCHING, RUNNING, FINISHING = (S.BLOCKED, S.DISPATCHING, S.RUNNING, S.FINISHING)
STARTING, NODE_RUNNING = NodePhase.STARTING, NodePhase.RUNNING
DRAINING, STOPPED = NodePhase.DRAINING, NodePhase.STOPPED
UNOWNED, LOCKING, PAUSED, PROBING = (
    ShardPhase.UNOWNED,
    ShardPhase.LOCKING,
    ShardPhase.PAUSED,
    ShardPhase.PROBING,
)
LOADING, FENCING, ACTIVE = ShardPhase.LOADING, ShardPhase.FENCING, ShardPhase.ACTIVE
#: Log bytes appended between two compaction checks, at least, per task the check walks
#: (about one small task record each: see `ShardInfo.compact_check_at`).
COMPACT_CHECK_BYTES_PER_TASK = 256


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeConfig:
    """Everything a node is told at start (parsed from the environment by the shell)."""

    #: Unique per process start: host, pid and a random part (docs/architecture.md, "Node
    #: identity").
    node_id: str
    queue: str = DEFAULT_QUEUE
    #: Shard count for a directory that has no membership.json yet (SNERD_SHARDS).
    new_queue_shards: int = 1
    #: Attempts in flight on this daemon at most (SNERD_MAX_WORKERS).
    max_workers: int = 100
    #: Per-pool limits (SNERD_POOLS). A pool not listed shares the `default` pool.
    pools: Mapping[str, int] = field(default_factory=dict)
    #: How long in-flight work may finish after a drain starts (SNERD_DRAIN_TIMEOUT).
    drain_timeout_us: int = 30 * SECOND
    ownership: OwnershipConfig = field(default_factory=OwnershipConfig)
    #: `constant` (upstream) or `exponential` (with deterministic jitter).
    backoff: str = "constant"
    jitter_seed: int = 0
    #: Webhook calls give up after this long unless the task sets `max_execution_seconds`.
    webhook_timeout_s: float = 30.0
    #: Compaction starts when a log is at least this big and mostly dead.
    compact_min_bytes: int = 8 * 1024 * 1024
    #: ... and holds at least this many dead bytes per live one. A compaction copies (and
    #: re-points) every live record, so each is copied about once per this many times its
    #: size in dead records: 1 compacts a half-dead log, three times as often as 3 (the
    #: default), which lets a log grow to about 4 times what it keeps.
    compact_dead_ratio: int = 3
    #: Finished and dead-lettered tasks kept in each log by compaction.
    history_limit: int = 10_000
    #: Largest result a handler may return, in bytes of its compact JSON encoding
    #: (SNERD_RESULT_MAX_BYTES); past it the attempt fails.
    result_max_bytes: int = DEFAULT_RESULT_MAX_BYTES
    #: How long a completed task (its tombstone, with its result) is kept in the history after
    #: it finished (SNERD_RESULT_RETENTION_SECONDS); 0: as long as `history_limit` keeps it.
    #: Dead letters are not expired: they wait for an operator.
    result_retention_us: int = 7 * 86_400 * SECOND
    #: How long to wait before retrying a failed lock, membership write or log append.
    retry_io_us: int = SECOND
    #: How long a shard whose files cannot be used (`ShardUnusable`: a symlink snerd refuses,
    #: a file of the wrong kind) is left unclaimed before this node tries it again: an
    #: operator has to fix it, so trying every round would only repeat the error.
    retry_unusable_us: int = 60 * SECOND
    #: True where holding a flock proves the previous holder's process is gone (one host, a
    #: local filesystem): a shard whose lock this node can take is taken over at once instead
    #: of after its lease lapses (docs/architecture.md, "Single-host takeover (proven dead)").
    #: The shell decides it from the mount type.
    lock_proves_liveness: bool = False
    #: Where flock proves liveness, how often a running node tries the locks of shards other
    #: nodes claim (between membership rounds too), so a dead owner's shards are taken over
    #: within about this long instead of at the next round.
    probe_interval_us: int = SECOND
    #: Ignore log records of an epoch older than a claim before them (docs/architecture.md,
    #: "Epochs, claim records and fencing"). Only the simulator's negative control
    #: `--unsafe-no-fence` turns it off.
    fence: bool = True
    #: How often the owner of a shard looks for tasks other nodes put in its inbox files
    #: (SNERD_INBOX_POLL_MS), and how much of one inbox file it takes in one read.
    inbox_poll_us: int = 100_000
    #: How often it looks while nothing can be writing to them (SNERD_INBOX_IDLE_POLL_MS):
    #: no other node's heartbeat was live at the last membership read and the last look found
    #: no inbox file in its shards' folders (`InboxIngest.poll_interval`). At least
    #: `inbox_poll_us`.
    inbox_idle_poll_us: int = SECOND
    inbox_read_bytes: int = 4 * 1024 * 1024
    #: How long a child waits for a parent no file of the queue holds (never enqueued, or
    #: finished longer ago than the history kept) before it is dead-lettered with
    #: `unknown_parent: <id>` (SNERD_UNKNOWN_PARENT_SECONDS).
    unknown_parent_wait_us: int = 60 * SECOND
    #: How long the ack of an enqueue with dedupe through another daemon's inbox waits, at
    #: most, for that daemon's decision (SNERD_DEDUPE_WAIT_MS; 0: acked at its write, as
    #: upstream did), and how often this node looks for it meanwhile.
    dedupe_wait_us: int = 5 * SECOND
    #: How long a cancel, retry or pause sent through other daemons' inboxes waits, at most,
    #: for their owners' answers before it is answered `pending` (SNERD_COMMAND_WAIT_MS).
    command_wait_us: int = 5 * SECOND
    #: A cancel of a live task is answered `cancelled: true` and changes nothing: the task
    #: stays queued (or running) and is dispatched all the same. Only the negative controls
    #: turn it on: the simulator's `--unsafe-ignore-cancel`, jepsen-lite's
    #: (SNERD_TEST_UNSAFE_IGNORE_CANCEL=1).
    unsafe_ignore_cancel: bool = False
    #: Pause records are written but dispatch does not look at them. Only the negative
    #: controls turn it on: the simulator's `--unsafe-ignore-pause`, jepsen-lite's
    #: (SNERD_TEST_UNSAFE_IGNORE_PAUSE=1).
    unsafe_ignore_pause: bool = False
    #: A purge forgets every ended task of the shard, succeeded ones and those finished after
    #: its `before` included. Only the simulator's negative control `--unsafe-purge-all`
    #: turns it on.
    unsafe_purge_all: bool = False
    #: Each task of an `enqueue_batch` line is acked as it is read, before its record is
    #: durable. Only the simulator's negative control `--unsafe-batch-ack-early` sets it.
    unsafe_batch_ack_early: bool = False
    #: A failure marked final (`"retry": false`) is retried as any other. Only the
    #: simulator's negative control `--unsafe-retry-final` sets it.
    unsafe_retry_final: bool = False
    #: Retries wait the daemon's policy, whatever the task's. Only the simulator's negative
    #: control `--unsafe-ignore-task-backoff` sets it.
    unsafe_ignore_task_backoff: bool = False
    #: A retry of a type's dead letters leaves the oldest it selects where it is. Only the
    #: simulator's negative control `--unsafe-retry-skips-oldest` turns it on.
    unsafe_retry_skips_oldest: bool = False
    verdict_poll_us: int = 50_000
    #: While children wait on parents this node does not hold, how often it reads the
    #: queue's files for news of them (SNERD_WATCH_POLL_MS), and how much of a file at once.
    watch_poll_us: int = 250_000
    watch_read_bytes: int = 4 * 1024 * 1024
    #: A parent that is not a live task of this node counts as done (the behaviour the
    #: dependency rule replaced). Only the simulator's negative control
    #: `--unsafe-absent-parents-done` turns it on.
    unsafe_absent_parents_done: bool = False
    #: A schedule's runs are written without its record saying which tick is fired, so a
    #: new owner fires those ticks again. Only the simulator's negative control
    #: `--unsafe-fire-unmarked` turns it on.
    unsafe_fire_unmarked: bool = False
    #: A success's tombstone stores a result other than the one its handler returned. Only
    #: the simulator's negative control `--unsafe-wrong-result` turns it on.
    unsafe_wrong_result: bool = False
    #: This node's own inbox files: a new segment is started once one holds this much, and
    #: closed segments are removed once their owner has ingested them (checked this often).
    inbox_segment_bytes: int = INBOX_SEGMENT_BYTES
    inbox_check_us: int = SECOND
    #: How long a drain waits, at most, for the owners to ingest this node's inboxes so that
    #: it can remove them (a shard nobody owns would hold the drain up to its timeout).
    inbox_drain_wait_us: int = 3 * SECOND


def inbox_segment_name(writer: str, n: int) -> str:
    """The name of a writer's `n`th inbox segment of a shard (0: the writer's id itself): one
    rule for the daemon's segments and a producer's, so a file is always one writer's."""
    return writer if n == 0 else f"{writer}~{n}"


def ingested(read: int | None, size: int) -> bool:
    """An inbox file of `size` bytes is taken in to its end by its owner: the `.read` hint it
    wrote (None: none) reaches the size. The one rule by which a writer removes a file: a
    daemon its closed segments, a tool or a producer the files of writers gone."""
    return read is not None and read >= size


def route_shard(key: str, shards: int) -> int:
    """The shard a routing key lands in: xxh3_64 of its UTF-8 bytes, modulo the shard count."""
    return xxhash.xxh3_64_intdigest(key.encode()) % shards


#: How many finished tasks with a dedupe fingerprint a node remembers (`TaskBook.twin`), for
#: enqueues whose `unique_until` is a number of seconds.
FINISHED_TWINS = 100_000


@dataclass(frozen=True, slots=True)
class FinishedTwin:
    """The latest task of a dedupe fingerprint that ended: which, in which shard, when (wall µs)."""

    task_id: str
    shard: int
    finished_at_us: int

    #: Its tombstone is durable (a twin a duplicate's ack waits for has none yet).
    loc = True


@dataclass(slots=True)
class Task:
    """One live task, without its payload (that stays in the log at `loc`)."""

    task_id: str
    task_type: str
    shard: int
    seq: int
    state: TaskState
    retry_count: int
    max_retries: int
    retry_after_hours: float
    ready_at_us: int
    urgency: float
    pool: str
    group: str | None
    max_per_minute: int | None
    payload_hash: str | None
    cron: str | None
    webhook_url: str | None
    max_execution_seconds: int | None
    trigger_after_ids: tuple[str, ...]
    #: Where the latest full record of this task sits (None until the enqueue commits). Every
    #: later record of the task is written from it, so the index keeps no fields or payload.
    loc: fx.Location | None = None
    #: Attempt number of the attempt being dispatched or run (1-based).
    attempt: int = 0
    #: Location of the dispatch record of the running attempt.
    dispatch_loc: fx.Location | None = None
    last_error: str | None = None
    #: The task's own retry policy and exponential cap (µs), from its record; None: the
    #: daemon's (`NodeConfig.backoff`, 7 days).
    backoff: tuple[str | None, int] | None = None


@dataclass(slots=True)
class InFlight:
    task_id: str
    attempt: int
    pool: str
    deadline_mono: int | None


@dataclass(slots=True)
class ShardInfo:
    phase: ShardPhase = ShardPhase.UNOWNED
    #: The epoch this node writes under (from its claim in membership.json).
    epoch: int = 0
    #: The epoch of the claim in membership.json this node last took the lock under (what
    #: the lock file names): once it steps down, a claim with that epoch is of a tenure that
    #: ended, to be claimed anew rather than taken up again.
    lock_epoch: int = 0
    #: The latest claim epoch read so far while replaying the log (fencing is judged in log
    #: order: a record is stale when a newer claim came before it).
    log_epoch: int = 0
    size: int = 0
    #: Location of the latest claim record (kept by compaction).
    claim_loc: fx.Location | None = None
    #: Finished tasks kept in the log, oldest first: task_id -> (location of the tombstone,
    #: `OUTCOME_COMPLETED` or `OUTCOME_DEAD`). A child of one of them is judged by it.
    history: dict[str, tuple[fx.Location, str]] = field(default_factory=dict)
    #: When each completed task of `history` finished (wall µs), oldest first: compaction
    #: drops those older than `NodeConfig.result_retention_us` (`compaction.expire_history`).
    completed_at: dict[str, int] = field(default_factory=dict)
    #: The other tasks of `history` (dead letters, cancelled ones): when each finished (wall
    #: µs) and its type, what a purge or a retry of a type's dead letters selects them by
    #: (`snerd.core.control.swept`).
    ended: dict[str, tuple[int, str]] = field(default_factory=dict)
    #: Appends in flight to this shard (compaction waits for zero).
    appends_in_flight: int = 0
    #: The log size from which the next compaction check runs (0: at once). Finding the live
    #: records walks every task this node holds, so after a check that found the log not dead
    #: enough the next waits until the log has grown by an eighth, and by at least
    #: `COMPACT_CHECK_BYTES_PER_TASK` for each task walked: O(1) amortised per appended byte
    #: however many tasks are queued (a queue of 300,000 parked tasks used to spend ~8% of an
    #: enqueue's CPU re-walking them). A log dead enough is compacted at worst once it is
    #: about 1.5x the size the eighth alone would allow.
    compact_check_at: int = 0
    compacting: bool = False
    #: Appends held back while a compaction of this shard runs (the shell must not append to a
    #: log being rewritten); emitted in order once it ends.
    backlog: list[fx.Append] = field(default_factory=list)
    retry_lock_at_mono: int | None = None
    #: Its files could not be used (`ShardUnusable`): not claimed again before then (mono).
    unusable_until_mono: int | None = None
    #: Above its fair share, this node hands the shard to another: nothing new is dispatched
    #: from it, and once its attempts in flight end (or `drain_timeout` passes) its claim is
    #: removed and its lock released. `giving_back_since_mono`: when that began.
    giving_back: bool = False
    giving_back_since_mono: int = 0
    #: A dispatch record could not be written (disk full, I/O error): nothing is dispatched
    #: from the shard until then (mono), and its ready tasks keep their places meanwhile.
    hold_dispatch_until_mono: int | None = None
    #: The shard is locked again, but its log is read only once appends issued before the
    #: last step-down have landed (`appends_in_flight` back at zero).
    read_when_drained: bool = False
    #: The log's size as the latest replay read it (after cutting a torn tail).
    loaded_size: int = 0
    #: Read again because our claim landed behind records another writer appended after our
    #: read (`Tenure.reload`): our claim is in the log, so the replay writes no new one.
    reloading: bool = False
    #: Stepped down while appends were in flight: the lock is released once they have landed.
    unlock_when_drained: bool = False
    #: Stepped down to hand the shard over (an even spread, a drain): the lock is released
    #: only once the write that removes our claim has landed. A free lock under a claim that
    #: still names us would tell a prober that this process is gone (`Tenure.probe`).
    unlock_when_unclaimed: bool = False
    #: `PROBING`: the membership document whose claim on the shard the probe tries the lock
    #: of.
    probed_doc: dict[str, Any] | None = None
    #: Counts this node's step-downs from the shard. An append issued in an earlier tenure
    #: means nothing once it ends (its task was forgotten, its enqueue answered): its outcome
    #: is ignored, even if the shard was taken up again and the record reloaded meanwhile.
    tenure: int = 0
    #: Records and bytes of the latest replay, for the startup log line.
    loaded_records: int = 0
    corrupt_lines: int = 0
    #: Live tasks of the replay whose record they cannot run with (`records.task_problem`):
    #: (task id, why, whether the record holds a payload for its tombstone to keep),
    #: dead-lettered once the shard is ours (`Tenure.claimed`).
    unrunnable: list[tuple[str, str, bool]] = field(default_factory=list)
    #: Dispatch records in the window, per group: (time, location), to keep on compaction.
    window_records: deque[tuple[int, fx.Location]] = field(default_factory=deque)
    #: The log being folded while LOADING (payloads dropped as it goes).
    fold: ShardFold | None = None
    #: The `snerdSeq` the next enqueue into this shard gets (its FIFO position, kept in the
    #: record so the order survives compaction).
    next_seq: int = 1
    #: Per writer node, how far its inbox file for this shard is ingested: durably (the latest
    #: `inbox` record in the log, and where that record is), and including ingest appends
    #: still in flight (the next read starts there).
    inbox_done: dict[str, int] = field(default_factory=dict)
    inbox_locs: dict[str, fx.Location] = field(default_factory=dict)
    inbox_taken: dict[str, int] = field(default_factory=dict)
    #: The offset last written into each file's `.read` hint for its writer.
    inbox_marked: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class InboxSegment:
    """One of this node's own inbox files, `shard-N/inbox/<name>.log`."""

    shard: int
    name: str
    #: End of its last committed append: the bytes this node knows are in the file.
    end: int = 0
    in_flight: int = 0
    #: A write to it failed: what the file holds past `end` is unknown; it takes no more.
    failed: bool = False
    #: No more appends go to it: it is removed once its owner has ingested all of it.
    closed: bool = False


@dataclass(slots=True)
class LockProof:
    """A shard lock a probe took, free under `owner`'s claim and last held under that claim.

    The probe's view of membership.json may be stale: a shard handed over has its claim
    removed before its lock is given up, and an owner whose renewals come back after its
    lease ran out claims its shards anew before it takes their locks again. So the free lock
    proves `owner` gone only while its claim stays unwritten since the probe's read
    (`signature`, from `claim_signature`): a membership read that still shows it `confirmed`
    it, and the claim that replaces it is written only if nothing changed since that read
    (the version check), so a takeover that lands rests on a proof that held.
    """

    owner: str
    signature: tuple[Any, ...] | None
    confirmed: bool = False


# Constructors of the effects and records the node makes most (`slot_constructor`: about a
# third of a keyword dataclass call's cost, which the hot paths pay per line and per record).
new_send = slot_constructor(fx.Send, "message")
new_ack_enqueued = slot_constructor(fx.AckEnqueued, "task_ids", "shard")
new_append = slot_constructor(fx.Append, "token", "shard", "records", "lazy")
new_record = slot_constructor(fx.NewRecord, "fields")
new_based_record = slot_constructor(fx.NewRecord, "fields", "base", "remove")
new_location = slot_constructor(fx.Location, "shard", "offset", "length")
new_keep_range = slot_constructor(fx.KeepRange, "offset", "length")
new_execute = slot_constructor(
    fx.Execute, "task_id", "task_type", "attempt", "location", "max_execution_seconds"
)
#: What a success tombstone drops from its base record.
CLEARED_ON_SUCCESS = (LAST_ERROR_OBJ, LAST_JOB_ERROR)

_K = TypeVar("_K")


def queue_in(queues: dict[_K, ReadyQueue[str]], key: _K) -> ReadyQueue[str]:
    """`queues[key]`, made (empty) the first time it is asked for."""
    queue = queues.get(key)
    if queue is None:
        queue = queues[key] = ReadyQueue()
    return queue


def require(ok: bool, what: str) -> None:
    """An invariant of the node's state (`Node.invariants`): raise, naming it, when it does
    not hold. Not an `assert`, so that it is checked under `python -O` too."""
    if not ok:
        raise AssertionError(f"node invariant broken: {what}")
