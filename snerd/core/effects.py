"""Outputs of the core: imperative effects the shell must carry out.

The shell executes effects in the order given and reports their outcomes back as events
(`snerd.core.events`). It adds no decisions of its own: if an effect fails, it says so and the
core decides what happens next.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "AckEnqueued",
    "Append",
    "AppendInbox",
    "CallWebhook",
    "CheckInboxes",
    "Compact",
    "DeliverDeadLetter",
    "Effect",
    "Execute",
    "Exit",
    "KeepRange",
    "Location",
    "Log",
    "MarkInboxRead",
    "NewRecord",
    "ReadInbox",
    "ReadLog",
    "ReadLogTail",
    "ReadMembership",
    "ReadRecord",
    "ReadTask",
    "RemoveInbox",
    "ScanQueue",
    "Send",
    "StopAttempt",
    "TryLock",
    "Unlock",
    "WriteMembership",
    "lazy_last",
    "split_lazy",
]


class Effect:
    """Base class of everything `Node.handle` returns."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Location:
    """Where a record sits in a shard log: the payload of a task is read from here on demand,
    so the core never holds `task_data` in memory."""

    shard: int
    offset: int
    length: int


@dataclass(frozen=True, slots=True, kw_only=True)
class NewRecord:
    """A record to append.

    With `base` set, the shell reads the record at that location and starts from all of its
    fields (its payload included), then applies `fields` on top and drops the keys in `remove`.
    That is how a retry, a cron re-arm or a tombstone is written as a full upstream-shaped task
    record while the core holds neither payloads nor the other fields of a task in memory.
    """

    fields: dict[str, Any]
    base: Location | None = None
    remove: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Append(Effect):
    """Append records to `shard-N/tasks/tasks.log` and make them durable. Appends waiting at the
    same moment share one write and one fsync (group commit). Answered by `AppendCommitted` or
    `AppendFailed` with the same token.

    `lazy`: the records are success tombstones, which nothing the SDK waits for depends on. The
    shell carries out a lazy append after the other effects of the same call, so the appends
    that do gate a message (dispatch records: `execute`; enqueue records: `ack`) reach the
    writer first and are not held back by building and writing the tombstones; the tombstones
    land after them in the log (no record needs to follow a success tombstone of another
    task, and a task has no record after its own)."""

    token: int
    shard: int
    records: tuple[NewRecord, ...]
    lazy: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendInbox(Effect):
    """Append records to this node's own inbox file for a shard it does not own,
    `shard-N/inbox/<segment>.log` (created with its folder if missing), and make them durable
    as an `Append` does (group commit), except that a failed write is never cut back off the
    file: the owner may have read it already. The shard's owner ingests them. Answered by
    `AppendCommitted` or `AppendFailed` with the same token. With `note_log`, the commit says
    what `shard-N/tasks/tasks.log` was before the write (`log_identity`, `log_size`: its
    `st_ino` and size; 0 and 0 when there is none): the owner's answer comes after that.
    """

    token: int
    shard: int
    #: The file's name without `.log`: the node id, then `<node id>~<n>` for later segments.
    segment: str
    records: tuple[NewRecord, ...]
    note_log: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class MarkInboxRead(Effect):
    """Tell an inbox's writer how far its file is ingested (durably, in tasks.log): replace
    `shard-N/inbox/<segment>.read` with the offset. A hint for the writer's clean-up only;
    nothing is answered, and a failure is only logged."""

    shard: int
    segment: str
    offset: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckInboxes(Effect):
    """For each (shard, segment) of this node's own inbox files, read the `.read` hint and the
    file's size. Answered by one `InboxProgress`."""

    segments: tuple[tuple[int, str], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class RemoveInbox(Effect):
    """Unlink one of this node's own inbox files and its `.read` hint (fully ingested, never to
    be written again). Nothing is answered; a failure is only logged."""

    shard: int
    segment: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadInbox(Effect):
    """Read what other nodes appended to the inboxes of shards this node owns: for each shard
    in `offsets`, every file `shard-N/inbox/<node>.log` from the byte offset given for its node
    (0 for a node not listed) to its last complete line, at most `max_bytes` per file. A line
    without its newline yet (a write in progress, or a writer's torn tail) is left for later.
    Answered by one `InboxRead`."""

    #: shard -> {writer node -> offset already ingested}.
    offsets: dict[int, dict[str, int]]
    max_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ScanQueue(Effect):
    """Read what is new about the task ids in `ids`, in every shard's files, whoever owns them
    (the task watch, `snerd.core.watch`): for shard 0 to `shards - 1`, its log
    `shard-N/tasks/tasks.log` (segment "") and each inbox file `shard-N/inbox/<segment>.log`.
    Each file is read from the offset `known` gives for it when its identity (`st_ino`) is the
    one given there, else from 0 (a new file, or one that compaction replaced), up to its last
    complete line and at most about `max_bytes` (but at least one line). The lines read pass
    through `snerd.core.watch.pick` with `ids`; when what it keeps of a file ends a task
    (`snerd.core.watch.ends_a_task`), the file is fsynced before the answer (a failed fsync
    is an error for that file, and its chunk is left out). Answered by one `QueueScanned`."""

    shards: int
    #: (shard, segment) -> (identity, offset already read).
    known: dict[tuple[int, str], tuple[int, int]]
    ids: frozenset[str]
    max_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadLogTail(Effect):
    """Read a shard's log, whoever owns it, for the verdicts on enqueues this node wrote into
    that shard's inbox (`snerd.core.node.verdicts`): from byte `offset` when the file's
    identity (`st_ino`) is `identity` and it still reaches `offset`, else from 0, to its last
    complete line, at most about `max_bytes` (but at least one line), through
    `snerd.core.watch.pick_marks` with `writers`. Answered by one `LogTailRead`."""

    shard: int
    identity: int
    offset: int
    max_bytes: int
    #: The inbox files (this node's segments) whose `inbox` records to keep.
    writers: frozenset[str]


@dataclass(frozen=True, slots=True, kw_only=True)
class KeepRange:
    """A byte range of the current log to carry into the compacted one."""

    offset: int
    length: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Compact(Effect):
    """Rewrite a shard log: copy `keep` (in order), then append `extra`, to a temp file; fsync;
    rename over tasks.log; fsync the directory. Answered by `Compacted` or `CompactionFailed`.
    The core issues it only when no append to the shard is in flight."""

    token: int
    shard: int
    keep: tuple[KeepRange, ...]
    extra: tuple[NewRecord, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadLog(Effect):
    """Read the whole shard log, cutting a torn last line, and report it in `LogRecordsRead`
    chunks. Issued right after the shard lock is taken."""

    shard: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadMembership(Effect):
    """Read membership.json under `.membership.lock`; answered by `MembershipRead`.

    First, write and fsync through the lock file of each shard in `touch` (the shards whose
    lock the node holds): a membership read is a renewal point, so a lock a network filesystem
    took away is reported now, as `LockLost` before the `MembershipRead`, not at the next
    append. A shard the shell holds no lock of is skipped.
    """

    touch: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class WriteMembership(Effect):
    """Under `.membership.lock`: re-read membership.json; if its `version` is
    `expected_version` (None: the file must not exist), replace it with `doc` atomically.
    Answered by `MembershipWritten` or `MembershipWriteFailed`."""

    doc: dict[str, Any]
    expected_version: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class TryLock(Effect):
    """Take `shard-N/.lock` with flock(LOCK_EX | LOCK_NB); answered by `LockAcquired` (with
    what the lock file said) or `LockBusy`. The shell then writes its pid, `owner` and `epoch`
    (the claim's) into the lock file through the locked fd, unless this is a `probe` (another
    node's claim: is its holder gone?), which leaves the file naming the holder before."""

    shard: int
    owner: str
    epoch: int = 0
    probe: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Unlock(Effect):
    """Release `shard-N/.lock`."""

    shard: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Send(Effect):
    """Send one protocol message to the SDK (a JSON object; the shell frames it as a line)."""

    message: dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class AckEnqueued(Effect):
    """Send the enqueue `ack` of each task in `task_ids`, in order, all of `shard` (what
    `Send(proto.ack_enqueued(task_id, shard))` for each would send): the acks of a burst of
    enqueues as one effect, which the shell frames in one go."""

    task_ids: list[str]
    shard: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Execute(Effect):
    """Hand one attempt of a task to the SDK: the shell reads the payload at `location` and sends
    `{"action":"execute",...}` (or, embedded, calls the handler). The outcome comes back as a
    `Result` command carrying `task_id`."""

    task_id: str
    task_type: str
    attempt: int
    location: Location
    max_execution_seconds: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class StopAttempt(Effect):
    """A running attempt's task was cancelled: the shell tells the SDK to stop its handler
    (`{"action":"cancel","task_id","attempt"}`; embedded: cancels it). Its result, if one
    still comes, is ignored."""

    task_id: str
    attempt: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadRecord(Effect):
    """Read the record at `location` back; answered by a `RecordRead` with `token`."""

    token: int
    location: Location


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadTask(Effect):
    """Find every record of `task_id` in the queue's files (every shard's log and inbox files,
    `shards` of them) for a `get`; answered by a `TaskRead` with `token`."""

    token: int
    task_id: str
    shards: int


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliverDeadLetter(Effect):
    """Tell the SDK a task exhausted its attempts: the shell reads the payload at `location` and
    sends `{"action":"max_retries_reached",...}` (embedded: calls the max-retry handler)."""

    task_id: str
    task_type: str
    location: Location
    error: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CallWebhook(Effect):
    """POST the task to its webhook. The shell applies the timeout, refuses redirects and
    refused addresses, and answers with `WebhookFinished`."""

    task_id: str
    task_type: str
    attempt: int
    url: str
    location: Location
    #: `Execute` or `MaxRetriesReached`, sent as the `X-SnerdMQ-Event` header.
    event: str
    timeout_seconds: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Log(Effect):
    """One human log line for stderr."""

    level: str
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Exit(Effect):
    """The drain finished and every lock is released: the process may exit with `code`."""

    code: int = 0


def split_lazy(effects: list[Effect]) -> tuple[list[Effect], list[Append]]:
    """The effects of one call as a shell carries them out: the others in their order, then
    the lazy appends (`Append.lazy`) in theirs."""
    others: list[Effect] = []
    lazy: list[Append] = []
    for effect in effects:
        if type(effect) is Append and effect.lazy:
            lazy.append(effect)
        else:
            others.append(effect)
    return others, lazy


def lazy_last(effects: list[Effect]) -> list[Effect]:
    """`split_lazy`'s two lists as one (for a shell that has nothing to do between them)."""
    others, lazy = split_lazy(effects)
    return [*others, *lazy]
