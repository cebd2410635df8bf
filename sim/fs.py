"""The shared queue directory as the simulated daemons see it, faults included.

Owns: the state of the files snerd touches in `.snerdata/` — each shard's `tasks.log`, the
inbox files `shard-N/inbox/<node>.log`, `membership.json`, and the flock table of
`shard-N/.lock` — and what each operation on them
returns, including the faults the world chooses to inject. It never does I/O, never reads a
clock (it has no notion of time at all: the world decides when a write completes) and never
draws a random number except from the `random.Random` a caller passes in, and then only with
`random()` (reproducible across Python versions; `randrange`/`choice` are not promised to be).
Modelled faults are results (`AppendHandle.error`, `MembershipOutcome.error`, the string from
`touch_lock`), never exceptions: an `AssertionError` here is a bug in the caller.

Theory of operation
-------------------

Shard logs. A file is an inode (`_Inode`); a directory entry (`shard -> inode`) names the
current one, and each process has at most one fd per shard log, opened at its first append and
kept (as `snerd.io.log.GroupCommitLog` keeps its fds) until the process dies, closes it
(`close_log`), or replaces the log itself. `append` is write(2) through that fd: the bytes are
visible to readers at once (the page cache) but *pending* until `complete_append`, which is the
fsync(2) returning — and fsync flushes everything that fd wrote before, so one process's appends
to one file become durable in issue order. The world picks the latency.

A crash (`crash`) loses the crashed process's pending appends: the worst case of a kill, where
what was issued but not fsynced never reaches stable storage (a power loss on a local disk; on
NFS, dirty pages in a dead client's cache). The last pending append of each file may instead
leave a torn prefix, as a short write does (write(2): "the number of bytes written may be less
than count"). Real filesystems never move bytes that were written at an offset, so lost bytes
that surviving data follows (another process's, or the torn prefix, which stays at its write's
offset) are left as a hole that reads as zeros (lseek(2), SEEK_HOLE: "a hole ... reads as
zeros"; after a power loss, blocks never written back read the same way); lost bytes at the end
of the file shorten it. No other writer's byte changes and every surviving append keeps its
offset, so a reader that cuts a torn last line at its last newline is back at the durable data. To model this
each log is a durable prefix (one `bytearray`, so an append never copies the whole log) plus a
short tail of segments `(writer, bytes, durable, hole)` that starts at the first pending one.

Inbox files. `shard-N/inbox/<node>.log` is a log like `tasks.log`, named by an `InboxKey`
(shard, writer node id) where a shard log is named by its shard number: every log operation
takes either (a `LogKey`). It has the same inode, fd, pending/durable and crash model, so a
crash loses the writer's pending inbox appends or leaves a torn last line, and ENOSPC refuses
them. One process writes it for its whole life (a node id is unique per process start; checked
here), so its pending appends are always its tail: a crash shortens it, or leaves a torn
last line (after zeros where earlier pending appends were), which nothing ever follows.
Readers (the shard's owner) see durable and pending bytes, as for `tasks.log`. Inbox appends
are counted apart (`inbox_*` in `SimFSStats`), so the shard-log counters mean what they did.

Compaction (`replace_log`) is temp file + fsync + rename(2) + fsync of the directory: atomic and
durable at once. rename(2) replaces the directory entry, not the inode other processes have
open: their pending appends, and any append they make later through the same fd, land in the
unlinked old inode. Their fsync still succeeds, so such an append is acknowledged yet never in
`tasks.log` (`status` says "replaced"). That is the real hazard of a compaction racing another
writer; the core is meant to prevent it (one writer per file, Compact only with no append in
flight), and the simulator must be able to catch it when it does not. Each inode has a number
(`identity`, st_ino), new for each file a compaction puts in place: a reader that keeps an
offset into a file (the task watch's scan) knows from it when to start over.

ENOSPC refuses an append whole: the shell truncates a failed write back off the file
(`snerd.io.log`), so nothing of it stays. Set per call (`enospc=True`) or for a period
(`disk_full`), which also fails membership writes and compactions.

membership.json is stored as the JSON bytes the daemon would write (orjson, sorted keys), so a
document that is not JSON fails here as it would on disk, and every read is a deep copy. A write
is conditional on the current `version` (under `.membership.lock` in the daemon) and is an
atomic, durable replace. `fail_after` models rename(2) BUGS: "On NFS filesystems, you can not
assume that if the operation failed, the file was not renamed": the new document is in place
but the writer is told it failed.

Locks. `shard-N/.lock` is an flock(2) table: exclusive, non-blocking, owned by the process (one
open file description per process and shard, as `snerd.io.membership.ShardLocks` keeps), released
by unlock, exit or crash. `lock_mode="posix"` is correct exclusion. `lock_mode="nfsv3"` models
NFSv3 `nolock` / `local_lock=flock` (nfs(5)): flock only excludes processes on the same client,
so a process on another host is granted a held lock; each such double grant is recorded.
`lose_lock` drops a holder's lock behind its back: loudly, as Linux NFSv4 since 3.12 does
("any I/O to the file by a process which 'thinks' it holds a lock will fail", fcntl(2)) and
Gluster with `client.strict-locks on`, so every later `touch_lock` (the daemon's write + fsync
through the locked fd at each renewal) fails with EIO until the fd is closed; or silently, as
Gluster with strict-locks off, where the holder never learns.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal, NamedTuple

import orjson
import xxhash

from snerd.core.slots import slot_constructor

__all__ = [
    "EBADF_NOT_LOCKED",
    "EIO_LOCK_LOST",
    "ENOSPC",
    "MEMBERSHIP_EIO",
    "MEMBERSHIP_RENAME_UNKNOWN",
    "AppendHandle",
    "AppendStatus",
    "DoubleGrant",
    "InboxKey",
    "LockMode",
    "LogKey",
    "MembershipOutcome",
    "SimFS",
    "SimFSStats",
]

#: strerror(ENOSPC), as the shell reports a refused write.
ENOSPC = "No space left on device"
#: What `touch_lock` returns once a lock was lost loudly (NFSv4 >= 3.12, Gluster strict-locks).
EIO_LOCK_LOST = "EIO: lock lost"
#: What `touch_lock` returns for a lock file this process does not have open.
EBADF_NOT_LOCKED = "EBADF: lock file not open"
#: What a membership write with `fail_before` reports (nothing was applied).
MEMBERSHIP_EIO = "EIO: membership.json write failed"
#: rename(2) BUGS: the rename may have happened although it reported failure.
MEMBERSHIP_RENAME_UNKNOWN = "EIO: rename(2) of membership.json reported failure"

LockMode = Literal["posix", "nfsv3"]
AppendStatus = Literal["refused", "pending", "durable", "lost", "replaced"]

_NL = 0x0A


class InboxKey(NamedTuple):
    """Names the inbox file `shard-N/inbox/<node>.log`: what `node` (a node id, the file's
    one writer) took for shard `shard`. A named tuple, so hashing one (every lookup of an
    inbox file) costs no Python call."""

    shard: int
    node: str


#: A log file: a shard number names `shard-N/tasks/tasks.log`, an `InboxKey` an inbox file.
LogKey = int | InboxKey


def _key_order(key: LogKey) -> tuple[int, int, str]:
    """A total order on log keys: shard logs by shard, then inbox files by shard and node."""
    if type(key) is int:
        return (0, key, "")
    assert isinstance(key, InboxKey)
    return (1, key.shard, key.node)


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendHandle:
    """One issued append: what the writing process knows about it."""

    #: Issue number, unique in this filesystem (the key for `complete_append` and `status`).
    seq: int
    pid: str
    #: The shard of the file: its `tasks.log`, or its inbox of `inbox`.
    shard: int
    #: Where the bytes start in the file the writer's fd refers to (O_APPEND put them at EOF).
    offset: int
    length: int
    #: Set when the write was refused (ENOSPC): nothing was written, nothing is pending (but
    #: for a short write to an inbox file: then `length` bytes were written and are pending).
    error: str | None = None
    #: Written through an fd whose file a compaction had already replaced: the bytes went to
    #: the unlinked old inode and will never be in `tasks.log`, though the fsync succeeds.
    orphaned: bool = False
    #: The writer node of an inbox file (`shard-N/inbox/<inbox>.log`); None for `tasks.log`.
    inbox: str | None = None

    @property
    def key(self) -> LogKey:
        """The file this append went to."""
        return self.shard if self.inbox is None else InboxKey(self.shard, self.inbox)


@dataclass(frozen=True, slots=True, kw_only=True)
class MembershipOutcome:
    """What a conditional write of membership.json did, and what the writer is told."""

    #: What the writer is told: True only when the write applied and reported success.
    ok: bool
    #: Whether the new document is now in place (true for `fail_after`, where `ok` is False).
    applied: bool
    #: The document on disk after the attempt (a copy); None if there is none.
    doc: dict[str, Any] | None
    #: None on success; "version mismatch ..." for a conflict; an errno text for an I/O fault.
    error: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class DoubleGrant:
    """A lock granted while other processes held it (`lock_mode="nfsv3"`)."""

    shard: int
    granted_to: str
    held_by: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class SimFSStats:
    """Counters of operations and of the faults applied, for the run's report."""

    appends: int = 0
    appends_completed: int = 0
    #: Refused with ENOSPC (per call or while `disk_full`).
    appends_refused: int = 0
    #: Pending appends lost whole in a crash.
    appends_dropped: int = 0
    #: Pending appends of which a crash left a torn prefix.
    appends_torn: int = 0
    #: Crash losses that left a hole because another writer's bytes followed them.
    holes: int = 0
    #: Appends made through an fd whose file had been replaced (bytes never in the log).
    appends_orphaned: int = 0
    #: Appends still pending when a compaction replaced their file under them.
    replaced_pending: int = 0
    replaces: int = 0
    replaces_refused: int = 0
    #: Torn last lines cut off by a new owner before appending.
    truncates: int = 0
    #: Last lines whose record was whole but had lost its newline, which a new owner wrote back
    #: before appending (`snerd.core.records.scan_tail` kept them).
    newlines_restored: int = 0
    membership_writes: int = 0
    membership_conflicts: int = 0
    membership_fail_before: int = 0
    membership_fail_after: int = 0
    lock_grants: int = 0
    lock_busy: int = 0
    double_grants: int = 0
    locks_lost_loud: int = 0
    locks_lost_silent: int = 0
    lock_touch_errors: int = 0
    crashes: int = 0
    #: The same for inbox files (never compacted nor truncated).
    inbox_appends: int = 0
    inbox_appends_completed: int = 0
    inbox_appends_refused: int = 0
    inbox_appends_dropped: int = 0
    inbox_appends_torn: int = 0
    #: Inbox files removed by their writer once ingested.
    inbox_removes: int = 0


_STAT_NAMES = tuple(f.name for f in fields(SimFSStats))
_INBOX_STAT_NAMES = tuple(name for name in _STAT_NAMES if name.startswith("inbox_"))
_LOG_STAT_NAMES = tuple(name for name in _STAT_NAMES if not name.startswith("inbox_"))


_new_handle = slot_constructor(
    AppendHandle, "seq", "pid", "shard", "offset", "length", "orphaned", "inbox"
)


class _Segment:
    """A run of bytes in a log's tail, written by one process (or a hole left by a loss)."""

    __slots__ = ("data", "durable", "handle", "hole", "inode")

    def __init__(self, handle: AppendHandle | None, inode: _Inode, data: bytes) -> None:
        self.handle = handle
        self.inode = inode
        self.data = data
        self.durable = False
        self.hole = False


class _Inode:
    """One log file's content: a durable prefix plus a tail starting at the first pending
    segment. `size` is the visible length (prefix + tail). `stat` is the prefix of the names
    its appends are counted under ("" for a shard log, "inbox_" for an inbox file)."""

    __slots__ = ("ino", "prefix", "size", "stat", "tail")

    def __init__(self, ino: int, data: bytes = b"", stat: str = "") -> None:
        self.ino = ino
        self.stat = stat
        self.prefix = bytearray(data)
        self.tail: deque[_Segment] = deque()
        self.size = len(data)

    def visible(self) -> bytes:
        if not self.tail:
            return bytes(self.prefix)
        return b"".join([self.prefix, *(seg.data for seg in self.tail)])

    def settle(self) -> None:
        """Fold leading durable segments into the prefix. A hole folds in only once durable
        data follows it; until then a later loss may still make it the end of the file, which
        then shrinks instead."""
        tail = self.tail
        while tail:
            seg = tail[0]
            if not seg.durable:
                return
            if seg.hole and not any(s.durable and not s.hole for s in tail):
                return
            self.prefix += seg.data
            tail.popleft()

    def trim_trailing_holes(self) -> None:
        """Lost bytes at the end of the file are simply not there (the size shrinks)."""
        tail = self.tail
        while tail and tail[-1].hole:
            self.size -= len(tail.pop().data)


def _default_host_of(pid: str) -> str:
    """The host part of a pid: "node-2#3" (host node-2, third process start) -> "node-2"."""
    return pid.partition("#")[0]


def _torn_length(data: bytes, rng: random.Random, *, at_end: bool = True) -> int:
    """A random strict prefix length of `data` that ends inside a line (a torn last line), or
    0 when there is none (then the append is lost whole). One `rng.random()` draw.

    A prefix may end right before a newline (a whole record that lost only its newline, which
    readers keep: `snerd.core.records.scan_tail`) only `at_end`, when nothing follows the
    append in the file: bytes after it (another writer's, pending) could be lost later and cut
    off, and the record would then become the file's last line long after the crash that
    decided, for the history, whether readers take it."""
    cuts = [c for c in range(1, len(data)) if data[c - 1] != _NL and (at_end or data[c] != _NL)]
    if not cuts:
        return 0
    return cuts[min(int(rng.random() * len(cuts)), len(cuts) - 1)]


class SimFS:
    """The shared `.snerdata/` directory: shard logs, inbox files, membership.json and shard
    locks.

    Processes are named by string pids ("node-2#3"). `host_of` maps a pid to its host (by
    default the part before "#"); only `lock_mode="nfsv3"` uses it.
    """

    def __init__(
        self,
        *,
        lock_mode: LockMode = "posix",
        host_of: Callable[[str], str] = _default_host_of,
    ) -> None:
        assert lock_mode in ("posix", "nfsv3"), lock_mode
        self.lock_mode: LockMode = lock_mode
        #: While True every append, membership write and compaction fails with ENOSPC.
        self.disk_full = False
        self._host_of = host_of
        self._seq = 0
        self._next_ino = 1
        #: Directory entries: shard -> the current inode of `shard-N/tasks/tasks.log`, and
        #: InboxKey -> the inode of `shard-N/inbox/<node>.log`.
        self._logs: dict[LogKey, _Inode] = {}
        #: Open log fds: (pid, key) -> the inode that fd refers to.
        self._fds: dict[tuple[str, LogKey], _Inode] = {}
        #: Inbox files of each shard, sorted by writer node; and each file's one writer (pid).
        self._inboxes: dict[int, tuple[InboxKey, ...]] = {}
        #: The same files' writer nodes (kept with `_inboxes`).
        self._inbox_nodes: dict[int, tuple[str, ...]] = {}
        self._inbox_writer: dict[InboxKey, str] = {}
        #: `shard-N/inbox/<segment>.read`: how far the owner says it ingested each inbox file.
        self._hints: dict[InboxKey, bytes] = {}
        #: Pending appends by seq, and per (pid, ino) in issue order.
        self._pending: dict[int, _Segment] = {}
        self._pending_by_writer: dict[tuple[str, int], deque[_Segment]] = {}
        self._lost: set[int] = set()
        #: Of lost appends torn by a crash: the bytes of their prefix left in the file.
        self._kept: dict[int, int] = {}
        self._replaced: set[int] = set()
        self._membership: bytes | None = None
        self._membership_version: Any = None
        self._holders: dict[int, list[str]] = {}
        self._lost_loud: set[tuple[str, int]] = set()
        self._lost_silent: set[tuple[str, int]] = set()
        self._double_grants: list[DoubleGrant] = []
        self._n: dict[str, int] = dict.fromkeys(_STAT_NAMES, 0)

    # -- shard logs and inbox files -----------------------------------------------------------

    def _new_inode(self, data: bytes = b"", stat: str = "") -> _Inode:
        inode = _Inode(self._next_ino, data, stat)
        self._next_ino += 1
        return inode

    def append(
        self, pid: str, key: LogKey, data: bytes, *, enospc: bool = False, short: int = 0
    ) -> AppendHandle:
        """Issue write(2) of `data` to the log `key` (a shard's `tasks.log`, or an inbox file)
        through `pid`'s fd (opening it, and creating the file, on first use). Visible at once,
        pending until `complete_append`. With `enospc` (or while `disk_full`) the write is
        refused and nothing is written, except that for an inbox file `short` bytes of `data`
        may have reached it before the error (a short write, which the shell never cuts off an
        inbox): they stay, pending, and the next fsync through the fd makes them durable. An
        inbox file has one writer: appending to one another process wrote is a bug of the
        caller."""
        assert data, "an append writes at least one byte"
        assert 0 <= short < len(data), short
        n = self._n
        if type(key) is int:
            shard, inbox, stat = key, None, ""
        else:
            assert isinstance(key, InboxKey), key
            shard, inbox, stat = key.shard, key.node, "inbox_"
            writer = self._inbox_writer.setdefault(key, pid)
            assert writer == pid, f"{key} is written by {writer}, not {pid}"
        n[stat + "appends"] += 1
        seq = self._seq
        self._seq = seq + 1
        fd = (pid, key)
        inode = self._fds.get(fd)
        refused = enospc or self.disk_full
        if refused:
            n[stat + "appends_refused"] += 1
            assert not short or inbox is not None, "a shard log's failed write is cut back off"
            if not short:
                at = inode.size if inode is not None else self.log_size(key)
                return AppendHandle(
                    seq=seq, pid=pid, shard=shard, offset=at, length=0, error=ENOSPC, inbox=inbox
                )
            data = data[:short]
        current = self._logs.get(key)
        if current is None:
            current = self._logs[key] = self._new_inode(stat=stat)
            if inbox is not None:
                assert isinstance(key, InboxKey)
                files = self._inboxes.get(shard, ())
                self._set_inboxes(shard, tuple(sorted((*files, key), key=_key_order)))
        if inode is None:
            inode = self._fds[fd] = current
        orphaned = inode is not current
        if orphaned:
            n["appends_orphaned"] += 1
        if refused:
            handle = AppendHandle(
                seq=seq,
                pid=pid,
                shard=shard,
                offset=inode.size,
                length=len(data),
                error=ENOSPC,
                orphaned=orphaned,
                inbox=inbox,
            )
        else:
            handle = _new_handle(seq, pid, shard, inode.size, len(data), orphaned, inbox)
        seg = _Segment(handle, inode, data)
        inode.tail.append(seg)
        inode.size += len(data)
        self._pending[seq] = seg
        wkey = (pid, inode.ino)
        queue = self._pending_by_writer.get(wkey)
        if queue is None:
            queue = self._pending_by_writer[wkey] = deque()
        queue.append(seg)
        return handle

    def complete_append(self, handle: AppendHandle) -> tuple[AppendHandle, ...]:
        """The fsync for `handle` returned: it and every earlier pending append of the same
        process to the same file are durable now. Returns the appends made durable, in issue
        order; empty if `handle` was already durable (an earlier completion covered it), was
        lost in a crash, or was refused (a short write's bytes become durable only with a
        later append's fsync)."""
        if handle.error is not None:
            return ()
        seg = self._pending.pop(handle.seq, None)
        if seg is None:
            return ()
        inode = seg.inode
        wkey = (handle.pid, inode.ino)
        queue = self._pending_by_writer[wkey]
        if len(queue) == 1:  # the usual case: nothing else of this writer pending in the file
            assert queue[0] is seg and seg.handle is not None
            del self._pending_by_writer[wkey]
            seg.durable = True
            inode.settle()
            self._n[inode.stat + "appends_completed"] += 1
            return (seg.handle,)
        done: list[AppendHandle] = []
        while True:
            s = queue.popleft()
            assert s.handle is not None
            if s is not seg:
                del self._pending[s.handle.seq]
            s.durable = True
            done.append(s.handle)
            if s is seg:
                break
        if not queue:
            del self._pending_by_writer[wkey]
        inode.settle()
        self._n[inode.stat + "appends_completed"] += len(done)
        return tuple(done)

    def status(self, handle: AppendHandle) -> AppendStatus:
        """Where an append stands: "refused" (ENOSPC), "pending", "durable" (in the log),
        "lost" (a crash dropped it or left only a torn prefix), or "replaced" (durable in a
        file a compaction had replaced: acknowledged to its writer, yet not in the log)."""
        if handle.error is not None:
            return "refused"
        if handle.seq in self._pending:
            return "pending"
        if handle.seq in self._lost:
            return "lost"
        if handle.orphaned or handle.seq in self._replaced:
            return "replaced"
        return "durable"

    def kept_prefix(self, handle: AppendHandle) -> int:
        """Of a "lost" append: how many of its first bytes a crash left in the file (a torn
        prefix, which readers see like any other bytes); 0 when it left none."""
        return self._kept.get(handle.seq, 0)

    def in_current_log(self, handle: AppendHandle) -> bool:
        """True when `handle` is pending in the file its log's name now names (not in a file
        a compaction has replaced)."""
        seg = self._pending.get(handle.seq)
        return seg is not None and self._logs.get(handle.key) is seg.inode

    def pending(self, pid: str) -> tuple[AppendHandle, ...]:
        """`pid`'s pending appends, in issue order."""
        out = [seg.handle for seg in self._pending.values() if seg.handle and seg.handle.pid == pid]
        return tuple(sorted(out, key=lambda h: h.seq))

    def read_log(self, key: LogKey) -> bytes:
        """The log as a reader sees it now: durable and pending bytes (b"" if none)."""
        inode = self._logs.get(key)
        return inode.visible() if inode is not None else b""

    def read_range(self, key: LogKey, offset: int, length: int) -> bytes:
        """`length` bytes at `offset` of the log (pread(2); short at the end of file).
        Cheap when the range is durable, which a payload read usually is."""
        inode = self._logs.get(key)
        if inode is None:
            return b""
        end = offset + length
        if end <= len(inode.prefix):
            return bytes(inode.prefix[offset:end])
        return inode.visible()[offset:end]

    def read_durable_log(self, key: LogKey) -> bytes:
        """What the log would hold if every pending append were lost now (holes as zeros,
        lost bytes at the end cut off): for checkers of "acked means durable"."""
        inode = self._logs.get(key)
        if inode is None:
            return b""
        parts = [bytes(inode.prefix)]
        keep = 1
        for seg in inode.tail:
            if seg.durable and not seg.hole:
                parts.append(seg.data)
                keep = len(parts)
            else:
                parts.append(bytes(len(seg.data)))
        return b"".join(parts[:keep])

    def identity(self, key: LogKey) -> int | None:
        """fstat(2) st_ino of the log (None if it does not exist): a compaction's rename(2)
        puts a new inode in place, so a reader that kept an offset into the old file can tell
        it must read the new one from its start."""
        inode = self._logs.get(key)
        return inode.ino if inode is not None else None

    def sync_file(self, key: LogKey) -> tuple[AppendHandle, ...]:
        """fsync(2) of the file through a reader's own descriptor: every pending append of
        every writer to it is durable now (their own fsyncs, when they return, find nothing
        left to do). Returns the appends made durable."""
        inode = self._logs.get(key)
        if inode is None:
            return ()
        done: list[AppendHandle] = []
        for wkey in [w for w in self._pending_by_writer if w[1] == inode.ino]:
            queue = self._pending_by_writer[wkey]
            last = queue[-1].handle
            assert last is not None
            done.extend(self.complete_append(last))
        return tuple(done)

    def log_size(self, key: LogKey) -> int:
        """fstat(2) st_size of the log: visible bytes (0 if it does not exist)."""
        inode = self._logs.get(key)
        return inode.size if inode is not None else 0

    def shards(self) -> tuple[int, ...]:
        """Shards whose log exists, ascending."""
        return tuple(sorted(k for k in self._logs if isinstance(k, int)))

    def inboxes(self, shard: int) -> tuple[InboxKey, ...]:
        """The inbox files of `shard` (readdir of `shard-N/inbox/`), sorted by writer node. A
        file exists from its first append that was not refused."""
        return self._inboxes.get(shard, ())

    def _set_inboxes(self, shard: int, files: tuple[InboxKey, ...]) -> None:
        self._inboxes[shard] = files
        self._inbox_nodes[shard] = tuple([key.node for key in files])

    def inbox_writers(self, shard: int) -> tuple[str, ...]:
        """The writer nodes of `shard`'s inbox files, in `inboxes` order (the file names)."""
        return self._inbox_nodes.get(shard, ())

    def inboxes_grown(
        self, shard: int, known: Mapping[str, int]
    ) -> list[tuple[InboxKey, int, int]]:
        """The inbox files of `shard` longer than the offset `known` gives for their writer
        (0 when it gives none), in `inboxes` order: (file, that offset, `log_size`). What an
        owner polling its inboxes reads; usually nothing grew."""
        logs = self._logs
        out = []
        for key in self._inboxes.get(shard, ()):
            size = logs[key].size
            start = known.get(key.node, 0)
            if size > start:
                out.append((key, start, size))
        return out

    def inbox_poll(
        self, offsets: Mapping[int, Mapping[str, int]]
    ) -> tuple[tuple[tuple[int, tuple[str, ...]], ...], list[tuple[int, InboxKey, int, int]]]:
        """What an owner polling the inboxes of the shards in `offsets` finds: for each
        shard, `(shard, inbox_writers(shard))`; and every file that grew, as
        `(shard, *inboxes_grown(shard, offsets[shard]))`, shard by shard. One call per poll."""
        inboxes, nodes, logs = self._inboxes, self._inbox_nodes, self._logs
        present = []
        grown = []
        for shard, known in offsets.items():
            present.append((shard, nodes.get(shard, ())))
            for key in inboxes.get(shard, ()):
                size = logs[key].size
                start = known.get(key.node, 0)
                if size > start:
                    grown.append((shard, key, start, size))
        return tuple(present), grown

    def remove_inbox(self, key: InboxKey) -> None:
        """unlink(2) an inbox file and its `.read` hint (a missing one is no error). An fd its
        writer still holds keeps the unlinked inode, as for a replaced log."""
        if self._logs.pop(key, None) is not None:
            self._set_inboxes(key.shard, tuple(k for k in self._inboxes[key.shard] if k != key))
        self._hints.pop(key, None)
        self._n["inbox_removes"] += 1

    def write_hint(self, key: InboxKey, offset: int) -> str | None:
        """Replace the `.read` hint of an inbox file with `offset` (temp file + rename: atomic).
        Returns None, or ENOSPC while `disk_full` (nothing changes)."""
        if self.disk_full:
            return ENOSPC
        self._hints[key] = b"%d\n" % offset
        return None

    def read_hint(self, key: InboxKey) -> int | None:
        """The offset in an inbox file's `.read` hint; None when there is none."""
        raw = self._hints.get(key)
        return int(raw) if raw is not None else None

    def replace_log(self, pid: str, key: LogKey, data: bytes) -> str | None:
        """Compaction: temp + fsync + rename(2) over the log + fsync dir, atomic and durable at
        once. Returns None, or ENOSPC (while `disk_full`; nothing changes).

        Nothing is checked about other writers: whatever is pending in the old file stays in
        the old inode (counted in `replaced_pending`; `status` says "replaced" once it
        completes), and other processes' fds keep pointing at it. `pid` closes its own fd, so
        its next append opens the new file, as the shell does after its own compaction.
        """
        if self.disk_full:
            self._n["replaces_refused"] += 1
            return ENOSPC
        old = self._logs.get(key)
        if old is not None:
            for seg in old.tail:
                if not seg.durable and seg.handle is not None:
                    self._replaced.add(seg.handle.seq)
                    self._n["replaced_pending"] += 1
        self._logs[key] = self._new_inode(data, old.stat if old is not None else "")
        self._fds.pop((pid, key), None)
        self._n["replaces"] += 1
        return None

    def truncate_log(self, pid: str, key: LogKey, size: int) -> bool:
        """ftruncate(2) of the log to `size` (the shell cutting a torn last line before it
        appends after it). The inode stays the same, so other fds keep writing into this file.
        Only done when nothing is pending in it (returns False and changes nothing otherwise):
        the daemon cuts right after taking the shard's lock, when no other writer should be
        active."""
        inode = self._logs.get(key)
        if inode is None or size >= inode.size:
            return True
        if any(not seg.durable for seg in inode.tail):
            return False
        data = inode.visible()[:size]
        inode.prefix = bytearray(data)
        inode.tail.clear()
        inode.size = size
        self._n["truncates"] += 1
        return True

    def restore_newline(self, pid: str, key: LogKey) -> bool:
        """Write the newline back after the log's last line (the shell keeping a whole record
        whose newline was lost, `snerd.io.log.repair_tail`: pwrite and fsync, durable at once).
        Like `truncate_log`, only done when nothing is pending in the file (returns False and
        changes nothing otherwise)."""
        inode = self._logs.get(key)
        if inode is None or inode.size == 0:
            return True
        if any(not seg.durable for seg in inode.tail):
            return False
        data = inode.visible()
        assert not data.endswith(b"\n"), "nothing to restore"
        inode.prefix = bytearray(data + b"\n")
        inode.tail.clear()
        inode.size = len(inode.prefix)
        self._n["newlines_restored"] += 1
        return True

    def close_log(self, pid: str, key: LogKey) -> None:
        """`pid` closes its fd on the log; its next append reopens the current file.
        Pending appends stay pending (close(2) does not discard written data)."""
        self._fds.pop((pid, key), None)

    def crash(self, pid: str, rng: random.Random, torn_prob: float) -> None:
        """`pid` dies: its pending appends are lost, except that the last pending append of each
        file leaves a torn prefix with probability `torn_prob` (ending inside a line); its
        locks and fds are released. With `torn_prob > 0` it draws one `rng.random()` per file
        and one more per tear, so the draws depend only on this process's pending appends."""
        n = self._n
        n["crashes"] += 1
        keys = sorted(k for k in self._pending_by_writer if k[0] == pid)
        for wkey in keys:
            queue = self._pending_by_writer.pop(wkey)
            inode = queue[0].inode
            last = queue[-1]
            made_holes: set[int] = set()
            for seg in queue:
                assert seg.handle is not None
                seq = seg.handle.seq
                del self._pending[seq]
                self._lost.add(seq)
                seg.handle = None
                torn = 0
                if seg is last and torn_prob > 0 and rng.random() < torn_prob:
                    torn = _torn_length(seg.data, rng, at_end=inode.tail[-1] is seg)
                if torn:
                    self._kept[seq] = torn
                    n[inode.stat + "appends_torn"] += 1
                    rest = _Segment(None, inode, bytes(len(seg.data) - torn))
                    rest.hole = rest.durable = True
                    seg.data = seg.data[:torn]
                    seg.durable = True
                    inode.tail.insert(inode.tail.index(seg) + 1, rest)
                    made_holes.add(id(rest))
                else:
                    n[inode.stat + "appends_dropped"] += 1
                    seg.data = bytes(len(seg.data))
                    seg.hole = seg.durable = True
                    made_holes.add(id(seg))
            inode.trim_trailing_holes()
            # Losses not cut off the end of the file stay behind as holes.
            n["holes"] += sum(1 for s in inode.tail if id(s) in made_holes)
            inode.settle()
        self.release_all(pid)

    # -- membership.json ----------------------------------------------------------------------

    def read_membership(self) -> dict[str, Any] | None:
        """A fresh copy of membership.json, or None when it does not exist."""
        if self._membership is None:
            return None
        doc: dict[str, Any] = orjson.loads(self._membership)
        return doc

    def write_membership(
        self,
        pid: str,
        doc: dict[str, Any],
        expected_version: int | None,
        *,
        fail_before: bool = False,
        fail_after: bool = False,
    ) -> MembershipOutcome:
        """Replace membership.json with `doc` if its `version` is `expected_version` (None: the
        file must not exist). Faults, chosen by the caller: `fail_before` fails the write with
        nothing applied (also while `disk_full`, with ENOSPC); `fail_after` applies it but
        reports failure (the unknown outcome of a rename on NFS)."""
        assert not (fail_before and fail_after), "one fault per write"
        assert isinstance(doc, dict), type(doc)
        n = self._n
        if fail_before or self.disk_full:
            n["membership_fail_before"] += 1
            error = ENOSPC if self.disk_full else MEMBERSHIP_EIO
            return MembershipOutcome(
                ok=False, applied=False, doc=self.read_membership(), error=error
            )
        exists = self._membership is not None
        if expected_version is None:
            matches = not exists
        else:
            matches = exists and self._membership_version == expected_version
        if not matches:
            n["membership_conflicts"] += 1
            found = self._membership_version if exists else "no file"
            return MembershipOutcome(
                ok=False,
                applied=False,
                doc=self.read_membership(),
                error=f"version mismatch: expected {expected_version}, found {found}",
            )
        self._membership = orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)
        self._membership_version = doc.get("version")
        n["membership_writes"] += 1
        if fail_after:
            n["membership_fail_after"] += 1
            return MembershipOutcome(
                ok=False, applied=True, doc=self.read_membership(), error=MEMBERSHIP_RENAME_UNKNOWN
            )
        return MembershipOutcome(ok=True, applied=True, doc=self.read_membership(), error=None)

    # -- shard locks --------------------------------------------------------------------------

    def try_lock(self, pid: str, shard: int) -> bool:
        """flock(LOCK_EX | LOCK_NB) on `shard-N/.lock` through a fresh open by `pid`. True if
        `pid` holds it now (re-locking by the holder succeeds). Under `nfsv3`, a process on
        another host than every holder is granted it too (a recorded double grant)."""
        key = (pid, shard)
        self._lost_loud.discard(key)
        self._lost_silent.discard(key)
        holders = self._holders.get(shard)
        if holders is None:
            holders = self._holders[shard] = []
        if pid in holders:
            return True
        if holders:
            host = self._host_of(pid)
            if self.lock_mode == "posix" or any(self._host_of(h) == host for h in holders):
                self._n["lock_busy"] += 1
                return False
            self._double_grants.append(
                DoubleGrant(shard=shard, granted_to=pid, held_by=tuple(holders))
            )
            self._n["double_grants"] += 1
        holders.append(pid)
        self._n["lock_grants"] += 1
        return True

    def unlock(self, pid: str, shard: int) -> None:
        """LOCK_UN and close: `pid` no longer holds the lock (nothing if it did not)."""
        key = (pid, shard)
        self._lost_loud.discard(key)
        self._lost_silent.discard(key)
        holders = self._holders.get(shard)
        if holders is not None and pid in holders:
            holders.remove(pid)

    def holders(self, shard: int) -> tuple[str, ...]:
        """Processes the lock table says hold `shard-N/.lock`, in grant order."""
        return tuple(self._holders.get(shard, ()))

    def lose_lock(self, pid: str, shard: int, *, silent: bool) -> bool:
        """Drop `pid`'s lock behind its back. Loud: every later `touch_lock` fails with EIO
        until `pid` unlocks or locks again; silent: touches succeed and `pid` never learns.
        Returns False (and changes nothing) when `pid` did not hold the lock."""
        holders = self._holders.get(shard)
        if holders is None or pid not in holders:
            return False
        holders.remove(pid)
        if silent:
            self._lost_silent.add((pid, shard))
            self._n["locks_lost_silent"] += 1
        else:
            self._lost_loud.add((pid, shard))
            self._n["locks_lost_loud"] += 1
        return True

    def touch_lock(self, pid: str, shard: int) -> str | None:
        """The renewal's write + fsync through the locked fd: None when it succeeds, else the
        error the shell would see (EIO after a loud loss; EBADF if `pid` has no such fd)."""
        key = (pid, shard)
        if key in self._lost_loud:
            self._n["lock_touch_errors"] += 1
            return EIO_LOCK_LOST
        if key in self._lost_silent or pid in self._holders.get(shard, ()):
            return None
        self._n["lock_touch_errors"] += 1
        return EBADF_NOT_LOCKED

    def release_all(self, pid: str) -> None:
        """`pid` exited or crashed: the kernel closes its fds, releasing its locks (flock(2):
        "released ... when all file descriptors are closed"). Pending appends stay pending
        (`crash` drops them first)."""
        for holders in self._holders.values():
            if pid in holders:
                holders.remove(pid)
        self._lost_loud = {k for k in self._lost_loud if k[0] != pid}
        self._lost_silent = {k for k in self._lost_silent if k[0] != pid}
        for key in [k for k in self._fds if k[0] == pid]:
            del self._fds[key]

    # -- reporting ----------------------------------------------------------------------------

    @property
    def double_grants(self) -> tuple[DoubleGrant, ...]:
        """Every lock granted while held by another process, in order."""
        return tuple(self._double_grants)

    @property
    def membership_generation(self) -> int:
        """Changes whenever membership.json is replaced (for callers caching a parse of it)."""
        return self._n["membership_writes"]

    @property
    def appends_completed(self) -> int:
        """`stats().appends_completed`, without the snapshot."""
        return self._n["appends_completed"]

    def stats(self) -> SimFSStats:
        """A snapshot of the counters."""
        return SimFSStats(**self._n)

    def digest(self) -> str:
        """A stable hash (xxh3-128, hex) of the whole state: two runs of one seed must agree.
        Everything is fed in a canonical order (sorted shards and pids, never set order)."""
        h = xxhash.xxh3_128()

        def put(value: bytes | bytearray | str | int | None) -> None:
            if isinstance(value, str):
                b = b"s" + value.encode()
            elif isinstance(value, bytes | bytearray):
                b = b"b" + bytes(value)
            elif value is None:
                b = b"n"
            else:
                b = b"i" + int(value).to_bytes(16, "little", signed=True)
            h.update(len(b).to_bytes(8, "little"))
            h.update(b)

        put(self.lock_mode)
        put(self.disk_full)
        put(self._seq)
        put(self._next_ino)
        put(self._membership)

        def put_key(key: LogKey) -> None:
            if type(key) is int:
                put(key)  # a shard log, as before inbox files existed
            else:
                assert isinstance(key, InboxKey)
                put(b"inbox")
                put(key.shard)
                put(key.node)

        inodes = {inode.ino: inode for inode in self._logs.values()}
        inodes.update((inode.ino, inode) for inode in self._fds.values())
        inodes.update((seg.inode.ino, seg.inode) for seg in self._pending.values())
        for key in sorted(self._logs, key=_key_order):
            put_key(key)
            put(self._logs[key].ino)
        for ino in sorted(inodes):
            inode = inodes[ino]
            put(ino)
            put(inode.size)
            put(inode.prefix)
            put(len(inode.tail))
            for seg in inode.tail:
                put(seg.handle.pid if seg.handle else None)
                put(seg.handle.seq if seg.handle else None)
                put(seg.durable)
                put(seg.hole)
                put(seg.data)
        for (pid, key), inode in sorted(
            self._fds.items(), key=lambda item: (item[0][0], _key_order(item[0][1]))
        ):
            put(pid)
            put_key(key)
            put(inode.ino)
        for seq in sorted(self._lost):
            put(seq)
        put(b"|")
        for seq in sorted(self._replaced):
            put(seq)
        put(b"|")
        for shard in sorted(self._holders):
            put(shard)
            put(",".join(self._holders[shard]))
        for pid, shard in sorted(self._lost_loud):
            put(pid)
            put(shard)
        put(b"|")
        for pid, shard in sorted(self._lost_silent):
            put(pid)
            put(shard)
        put(b"|")
        for grant in self._double_grants:
            put(grant.shard)
            put(grant.granted_to)
            put(",".join(grant.held_by))
        for name in _LOG_STAT_NAMES:
            put(self._n[name])
        if self._inbox_writer:
            put(b"inboxes")
            for key, pid in sorted(self._inbox_writer.items(), key=lambda kv: _key_order(kv[0])):
                put_key(key)
                put(pid)
            for key, hint in sorted(self._hints.items(), key=lambda kv: _key_order(kv[0])):
                put_key(key)
                put(hint)
            for name in _INBOX_STAT_NAMES:
                put(self._n[name])
        return h.hexdigest()
