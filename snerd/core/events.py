"""Inputs to the core: past-tense facts the shell (or the simulator) reports.

Each event is a frozen, slotted, keyword-only dataclass. Time is not an event field: every call
`Node.handle(event, now)` carries one `Now` reading of the node's clocks, so the core never reads
a clock and a simulator can give each node its own skewed view of time.

The protocol commands parsed from an SDK line (`Register`, `Enqueue`, `Result`, `Progress`,
`StatsRequested`) live in `snerd.core.protocol` and are events too: the embedded engine hands
them to the node directly, the daemon first parses them from stdin with `LineReceived` and
`LinesReceived`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from snerd.core.ownership import LockText

_NO_LOCK_TEXT = LockText()  # (frozen: one value shared by every event)

__all__ = [
    "AppendCommitted",
    "AppendFailed",
    "Compacted",
    "CompactionFailed",
    "CompactionRequested",
    "DrainRequested",
    "Event",
    "InboxChunk",
    "InboxProgress",
    "InboxRead",
    "LineReceived",
    "LinesReceived",
    "LockAcquired",
    "LockBusy",
    "LockLost",
    "LogRecord",
    "LogRecordsRead",
    "LogTailRead",
    "MembershipRead",
    "MembershipUnusable",
    "MembershipWriteFailed",
    "MembershipWritten",
    "Now",
    "PayloadUnreadable",
    "QueueScanned",
    "RecordRead",
    "ScanChunk",
    "ShardUnusable",
    "Started",
    "TaskRead",
    "Tick",
    "WebhookFinished",
]


@dataclass(frozen=True, slots=True)
class Now:
    """One reading of a node's two clocks, in integer microseconds.

    `wall` is microseconds since the Unix epoch on the node's wall clock (what RFC 3339 times in
    the log and in `execute_at` are compared against). `mono` is the node's monotonic clock; its
    origin is arbitrary, it never steps, and only differences of it mean anything (timeouts,
    lease ages).
    """

    wall: int
    mono: int


class Event:
    """Base class of everything `Node.handle` accepts."""

    __slots__ = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Started(Event):
    """The shell is up; the node may begin (read membership, lock shards, load logs)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Tick(Event):
    """Time passed. Sent when the deadline the node asked for (`Node.wake_in`) is reached."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LineReceived(Event):
    """One line (without its newline) arrived from the SDK on stdin."""

    #: The raw bytes; the core parses and validates them (`snerd.core.protocol`).
    line: bytes
    #: When the line was longer than the shell accepts: its full length in bytes. `line` then
    #: holds only its first and last `protocol.SNIFF_BYTES`, joined (where `sniff_task_id`
    #: looks for a task id for the error).
    oversize: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class LinesReceived(Event):
    """Lines (without their newlines, none longer than the shell accepts) that arrived from
    the SDK together, in order: exactly one `LineReceived` for each in turn, handed over in
    one event so the node can take a run of them in one pass. `Node.handle_burst` counts each
    line against its limit."""

    lines: list[bytes]


@dataclass(frozen=True, slots=True, kw_only=True)
class DrainRequested(Event):
    """SIGTERM, SIGINT, stdin EOF or a closed stdout: stop taking work, finish, release."""

    #: Human text for the log line ("SIGTERM", "stdin closed", ...).
    reason: str
    #: True when no `result` can arrive any more (stdin closed): the drain then waits only for
    #: work that does not need the SDK (webhooks, records being written).
    input_closed: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class MembershipRead(Event):
    """The shell read membership.json under `.membership.lock` (None: no such file yet)."""

    #: The parsed document, or None when the directory has no membership.json.
    doc: dict[str, Any] | None


@dataclass(frozen=True, slots=True, kw_only=True)
class MembershipWritten(Event):
    """A `WriteMembership` effect committed (temp file, fsync, rename, fsync dir)."""

    #: The document now on disk.
    doc: dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class MembershipWriteFailed(Event):
    """A `WriteMembership` did not commit: the version on disk was not the expected one (`doc`
    holds what is there now), or an I/O error (`error`)."""

    doc: dict[str, Any] | None
    error: str


@dataclass(frozen=True, slots=True, kw_only=True)
class MembershipUnusable(Event):
    """membership.json is there but is not a membership document
    (`snerd.core.ownership.check_membership` refused it): bad input from disk, which a retry
    cures only once someone fixes the file (an I/O error is a `MembershipWriteFailed`)."""

    #: What is wrong, naming the file.
    problem: str


@dataclass(frozen=True, slots=True, kw_only=True)
class LockAcquired(Event):
    """`shard-N/.lock` is now held by this process."""

    shard: int
    #: What the lock file said when the lock was taken: its holder before (this node when it
    #: held the lock already), the claim's epoch it held the lock under, and whether it let
    #: the lock go itself (`LockText`; the core judges what that proves, `lock_names_claim`).
    previous: LockText = _NO_LOCK_TEXT


@dataclass(frozen=True, slots=True, kw_only=True)
class LockBusy(Event):
    """`shard-N/.lock` is held by another process (flock LOCK_NB said EWOULDBLOCK)."""

    shard: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardUnusable(Event):
    """The shard's files cannot be used as they are on disk: its log or lock file is a symbolic
    link snerd refuses to follow, not a regular file, or not readable. Bad input from disk, not
    a lost lock: the node leaves the shard unclaimed for `NodeConfig.retry_unusable_us`."""

    shard: int
    #: What is wrong, naming the path ("refusing to follow the symlink DIR/shard-0/...").
    error: str


@dataclass(frozen=True, slots=True, kw_only=True)
class LockLost(Event):
    """An operation on the held lock fd failed (EIO, EBADF, ENOTCONN, ENOLCK): the lock may be
    gone, so this node must stop acting for the shard."""

    shard: int
    error: str


@dataclass(frozen=True, slots=True, kw_only=True)
class LogRecord:
    """One well-formed record read back from a shard log."""

    #: Byte offset of the line in tasks.log.
    offset: int
    #: Length of the line in bytes, newline included.
    length: int
    #: The decoded JSON object (checksum verified when the record carries one).
    fields: dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class LogRecordsRead(Event):
    """A chunk of a shard's log, in file order, read after the shard was locked."""

    shard: int
    records: tuple[LogRecord, ...]
    #: Lines that could not be decoded: (offset, reason). Skipped, never fatal.
    corrupt: tuple[tuple[int, str], ...] = ()
    #: True on the last chunk: the whole log has been read (a torn tail was cut).
    final: bool = False
    #: Size of the log after reading (and after cutting a torn tail), in bytes.
    size: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class InboxChunk:
    """New complete lines of one inbox file: `shard-N/inbox/<node>.log` from `start` to `end`."""

    shard: int
    #: The writer: the inbox file's name without `.log`.
    node: str
    start: int
    end: int
    #: Well-formed records, in file order (offsets are inbox-file offsets).
    records: tuple[LogRecord, ...]
    #: Lines that could not be decoded: (offset, reason). Skipped, never fatal.
    corrupt: tuple[tuple[int, str], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class InboxRead(Event):
    """The answer to a `ReadInbox`: the chunks with anything new (none: nothing new), and the
    errors met reading (a shard's inbox folder or one file unreadable), as (shard, text)."""

    chunks: tuple[InboxChunk, ...]
    errors: tuple[tuple[int, str], ...] = ()
    #: Per shard whose inbox folder could be listed: the segments (file names without `.log`)
    #: it holds now.
    present: tuple[tuple[int, tuple[str, ...]], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ScanChunk:
    """New complete lines of one file of the queue, read for a `ScanQueue`: the shard's log
    (segment "") or an inbox file, from `start` to `end`, the file `identity` (`st_ino`)."""

    shard: int
    segment: str
    identity: int
    start: int
    end: int
    #: The records `snerd.core.watch.pick` kept, in file order (offsets are the file's).
    records: tuple[LogRecord, ...]
    #: Lines kept by `pick` that could not be decoded: (offset, reason). Skipped.
    corrupt: tuple[tuple[int, str], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueScanned(Event):
    """The answer to a `ScanQueue`: a chunk for each file with anything new; every file found,
    as (shard, segment, identity, rest), where `rest` is 0 when the read went to the file's
    end (what follows its last newline is a line still being written, or torn) and otherwise
    how many bytes it left unread (the read stopped at `max_bytes`); the errors met (a folder
    or a file that could not be read), as (shard, text)."""

    chunks: tuple[ScanChunk, ...]
    files: tuple[tuple[int, str, int, int], ...]
    errors: tuple[tuple[int, str], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class LogTailRead(Event):
    """The answer to a `ReadLogTail`: the `inbox` records kept, in file order, read from byte
    `start` to `end` of the log whose identity is `identity` and size `size` when read; or
    `error` (the log could not be read)."""

    shard: int
    identity: int = 0
    start: int = 0
    end: int = 0
    size: int = 0
    records: tuple[LogRecord, ...] = ()
    error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordRead(Event):
    """The answer to a `ReadRecord`: the record's fields, or why it could not be read."""

    token: int
    fields: dict[str, Any] | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskRead(Event):
    """The answer to a `ReadTask`: the task's records as found (`snerd.core.story.Found`), in
    file order per file, and what could not be read."""

    token: int
    task_id: str
    found: tuple[Any, ...] = ()
    errors: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class InboxProgress(Event):
    """The answer to a `CheckInboxes`: per (shard, segment), the offset in its `.read` hint
    (None: no hint, or it does not parse) and the file's size (None: it does not exist)."""

    segments: tuple[tuple[int, str, int | None, int | None], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendCommitted(Event):
    """An `Append` is durable: written and (per the fsync policy) fsynced."""

    token: int
    #: Start offset of each appended record, in the order given.
    offsets: tuple[int, ...]
    #: Length of each appended record in bytes, newline included.
    lengths: tuple[int, ...]
    #: An `AppendInbox` only: the shard log's identity and size just before the write.
    log_identity: int = 0
    log_size: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendFailed(Event):
    """An `Append` did not become durable (ENOSPC, EIO, ...). Nothing of it is in the log: the
    shell truncates a partial write away before reporting."""

    token: int
    error: str
    #: True when retrying cannot help: the record could not be built (its base record is
    #: damaged on disk, or a field cannot be encoded), as opposed to an I/O error.
    permanent: bool = False
    #: The index in the `Append`'s records of the one record that could not be built (its
    #: base unreadable, or unencodable); None when the write itself failed. Nothing of the
    #: append was written either way: the other records may be appended again.
    record: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Compacted(Event):
    """A `Compact` finished: the log was rewritten and atomically replaced."""

    token: int
    shard: int
    #: New offset of each kept range, in the order the effect listed them, then of each new line.
    offsets: tuple[int, ...]
    lengths: tuple[int, ...]
    #: Size of the new log file.
    size: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CompactionFailed(Event):
    """A `Compact` failed; the old log is intact and still in use."""

    token: int
    shard: int
    error: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PayloadUnreadable(Event):
    """The shell could not read a task's record to carry out an `Execute`, `CallWebhook` or
    `DeliverDeadLetter` (moved, damaged, I/O error). What that means for the task is the
    core's decision."""

    task_id: str
    attempt: int
    error: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CompactionRequested(Event):
    """Compact a shard's log now rather than when the node's own threshold says so (an
    operator's request). Ignored for a shard this node does not own."""

    shard: int


@dataclass(frozen=True, slots=True, kw_only=True)
class WebhookFinished(Event):
    """A `CallWebhook` effect finished (any outcome)."""

    task_id: str
    attempt: int
    ok: bool
    #: Why it failed ("Webhook returned non-2xx status: 500", a timeout, a refused address).
    error: str | None = None
    #: True for the dead-letter notification, whose outcome changes nothing.
    notification: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
