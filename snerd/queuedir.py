"""Reading a queue directory the way a daemon would, for the operator tools and the dashboard.

This module owns finding and reading what a queue directory holds: membership.json (checked by
the core's rule, `parse_membership`), each `shard-N/tasks/tasks.log` read and folded by
`snerd.core.shardlog` (the same rules as the daemon's replay; `rescan_shard` folds only what
was appended since the last read), whether a daemon holds `shard-N/.lock` (`probe_lock`: a
non-blocking flock released at once), the entries snerd refuses (links, odd files), the inbox
bytes not yet ingested, `stats_report`, what `snerdmq stats --json` prints and the
dashboard serves, and `task_report`, one task's details and story (`snerdmq status`, the
dashboard's task page), read by `snerd.io.scan.read_task`. `shard_locks` takes shard locks
for the commands that write.

Rules it keeps: a plain read takes no `.membership.lock` (membership.json is only ever replaced
by rename, so a read sees a whole document), and nothing below the data directory is reached
through a symbolic link (`snerd.io.files`). A bad argument is a `UsageError`, a queue that
cannot be acted on a `QueueError`: both are defined here, where they are raised, and the
command line (`snerd.cli.args`) turns them into exit codes 2 and 1.

It must never write (the lock probe aside), nor decide anything about tasks or leases itself:
those rules are the core's (`snerd.core.shardlog`, `snerd.core.status`,
`snerd.core.ownership`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import portalocker

from snerd.config import ToolSettings
from snerd.core.control import paused_where
from snerd.core.fields import BadField, check_task_id
from snerd.core.health import LockState
from snerd.core.ownership import (
    DEFAULT_QUEUE,
    MAX_QUEUE_SHARDS,
    ClaimView,
    LockText,
    MembershipInvalid,
    OwnershipConfig,
    claim_epoch,
    claim_view,
    lease_state,
    parse_membership,
    shard_name,
)
from snerd.core.shardlog import ShardFold
from snerd.core.status import ShardSummary, summarize
from snerd.core.story import LOG, Found, details, story
from snerd.core.timefmt import format_span
from snerd.io.files import describe_kind, open_file, read_small
from snerd.io.inbox import inbox_files
from snerd.io.log import read_log
from snerd.io.membership import ShardLocks
from snerd.io.scan import read_file_task, read_task

__all__ = [
    "MEMBERSHIP",
    "TEMP_NAMES",
    "LockState",
    "MembershipUnusable",
    "Queue",
    "QueueError",
    "ShardScan",
    "UsageError",
    "check_task_arg",
    "find_task",
    "inbox_waiting",
    "open_queue",
    "open_queue_to_check",
    "paused_report",
    "paused_text",
    "probe_lock",
    "queue_entries",
    "queue_json",
    "read_membership_file",
    "rescan_shard",
    "scan_shard",
    "shard_entries",
    "shard_locks",
    "stats_report",
    "task_report",
    "tool_owner",
    "wall_now_us",
]

MEMBERSHIP = "membership.json"
#: Leftover temp files a crash can leave in `shard-N/tasks/`: snerd's and upstream's
#: compaction output (`tasks.tmp`), and `tasks.log.tmp` from an atomic replace of the log.
TEMP_NAMES = ("tasks.tmp", "tasks.log.tmp")


class UsageError(Exception):
    """A bad argument or environment value: printed with the usage, exit code 2."""


class QueueError(Exception):
    """The queue cannot be acted on (a daemon holds a lock, a file is unreadable): exit 1."""


class MembershipUnusable(QueueError):
    """membership.json is there but cannot be used: unreadable, or not a membership document
    (the core's rule, `check_membership`). `fsck` and `validate` report it and check what they
    can without it; every other command stops with the message."""


def wall_now_us(settings: ToolSettings) -> int:
    """The wall clock, shifted by SNERD_TEST_CLOCK_OFFSET as the daemon's is (a test hook)."""
    return time.time_ns() // 1000 + settings.clock_offset_us


def tool_owner(command: str) -> str:
    """Who a tool that takes shard locks says it is, in the lock files it writes."""
    host = os.environ.get("HOSTNAME") or socket.gethostname() or "unknown-host"
    return f"snerdmq-{command}@{host}-pid-{os.getpid()}"


# ------------------------------------------------------------------------------------------
# The queue and its membership document
# ------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Queue:
    """A queue directory as found on disk."""

    directory: Path
    #: membership.json (None for an upstream v0.2 single-log directory).
    doc: dict[str, Any] | None
    shards: int
    #: The upstream v0.2 layout (`DIR/tasks/tasks.log`, no membership.json), not adopted yet.
    legacy: bool = False

    @property
    def version(self) -> int | None:
        if self.doc is None:
            return None
        v = self.doc.get("version")
        return v if isinstance(v, int) else None

    @property
    def name(self) -> str:
        q = None if self.doc is None else self.doc.get("queue")
        return q if isinstance(q, str) else DEFAULT_QUEUE

    def shard_dir(self, shard: int) -> Path:
        if self.legacy:
            return self.directory
        return self.directory / shard_name(shard)

    def log_path(self, shard: int) -> Path:
        return self.shard_dir(shard) / "tasks" / "tasks.log"

    def lock_path(self, shard: int) -> Path:
        return self.shard_dir(shard) / ".lock"

    def claim(self, shard: int) -> ClaimView:
        """The shard's claim (the core's parser, `claim_view`; free when there is no document)."""
        return claim_view(self.doc or {}, shard)

    def epoch(self, shard: int) -> int:
        """The shard's epoch: its claim's, or the highest ever given out (`claim_epoch`)."""
        return claim_epoch(self.doc or {}, shard)

    def shard_dirs_on_disk(self) -> dict[int, Path]:
        """Every `shard-<k>` directory, by k."""
        found: dict[int, Path] = {}
        if self.legacy:
            return found
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.directory):
                name = entry.name
                if name.startswith("shard-") and name[6:].isdigit() and entry.is_dir():
                    found[int(name[6:])] = Path(entry.path)
        return found



def read_membership_file(directory: Path) -> dict[str, Any] | None:
    """membership.json without taking its lock (it is replaced by rename: a read sees a whole
    document), checked as the daemons check it (`check_membership`). None when absent;
    MembershipUnusable when it cannot be read or is not a membership document."""
    path = directory / MEMBERSHIP
    try:
        data = read_small(path, None)  # never through a link (`snerd.io.files`)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise MembershipUnusable(f"cannot read {path}: {exc}") from None
    try:
        return parse_membership(data)
    except MembershipInvalid as exc:
        raise MembershipUnusable(f"{path} is not a usable membership file: {exc}") from None




def open_queue_to_check(directory: str) -> tuple[Queue, str | None]:
    """`open_queue`, for the commands that check a queue: when membership.json is unusable,
    the queue as its shard directories on disk show it, and what is wrong with the file."""
    try:
        return open_queue(directory), None
    except MembershipUnusable as exc:
        path = Path(directory)
        found = Queue(directory=path, doc=None, shards=0).shard_dirs_on_disk()
        shards = max(found, default=-1) + 1
        return Queue(directory=path, doc=None, shards=min(shards, MAX_QUEUE_SHARDS)), str(exc)


def open_queue(directory: str, *, allow_legacy: bool = True) -> Queue:
    """The queue in `directory`. UsageError when it does not exist or is not a queue."""
    path = Path(directory)
    if not path.exists():
        raise UsageError(f"DIR {directory!r} does not exist")
    if not path.is_dir():
        raise UsageError(f"DIR {directory!r} is not a directory")
    doc = read_membership_file(path)
    if doc is None:
        if (path / "tasks" / "tasks.log").exists():
            if not allow_legacy:
                raise QueueError(
                    f"{directory} uses the upstream SnerdMQ v0.2 layout (tasks/tasks.log, no "
                    f"membership.json); start `snerdmq {directory}` once so it is adopted "
                    "into shard-0, then run this again"
                )
            return Queue(directory=path, doc=None, shards=1, legacy=True)
        raise UsageError(
            f"DIR {directory!r} is not a snerd queue directory (no {MEMBERSHIP}; a daemon "
            "creates it on its first start)"
        )
    shards = doc.get("shards")
    if not isinstance(shards, int) or isinstance(shards, bool) or shards < 0:
        raise QueueError(f"{path / MEMBERSHIP}: 'shards' is {shards!r}, not a shard count")
    return Queue(directory=path, doc=doc, shards=shards)


# ------------------------------------------------------------------------------------------
# Shard logs
# ------------------------------------------------------------------------------------------


@dataclass(slots=True)
class ShardScan:
    """One shard log read from start to end."""

    shard: int
    path: Path
    exists: bool
    #: Bytes in the file when it was read.
    size: int = 0
    fold: ShardFold = field(default_factory=ShardFold)
    #: Lines that are not records: (offset, reason).
    corrupt: list[tuple[int, str]] = field(default_factory=list)
    #: Bytes after the last newline (a torn last line, or a record whose newline was lost),
    #: and where they start.
    torn: int = 0
    torn_at: int = 0
    #: Records in those bytes (`snerd.core.records.scan_tail`): whole records whose newline
    #: was lost, folded like the others (the owner keeps them and writes the newline back).
    #: 0: the bytes are a torn write, which the owner cuts.
    tail_records: int = 0
    #: The file's inode when it was read (a compaction installs a new file).
    ino: int = 0
    #: The data directory (files below it are opened without following a link).
    root: Path | None = None


def scan_shard(
    queue: Queue,
    shard: int,
    *,
    payloads: bool = False,
    only: set[int] | None = None,
) -> ShardScan:
    """Read and fold one shard log (read-only; never cuts a torn tail). `payloads`: keep
    `taskData` in the folded records (dlq, replay). `only`: fold just the records at these
    offsets (checking a compaction plan). Memory stays bounded by the shard's state."""
    path = queue.log_path(shard)
    scan = ShardScan(
        shard=shard,
        path=path,
        exists=os.path.lexists(path),  # a link is there, to be refused by name
        fold=ShardFold(keep_payloads=payloads),
        root=queue.directory,
    )
    if not scan.exists:
        return scan
    _fold_from(scan, 0, only)
    return scan


def rescan_shard(queue: Queue, shard: int, previous: ShardScan | None) -> ShardScan:
    """`scan_shard` for a reader that keeps watching (the dashboard): when the log is the file
    `previous` read and has only grown, fold just the bytes appended since (from the start of
    a torn tail, which may have been completed), into `previous`; otherwise (a first read, a
    compaction's new file, a shrunken or vanished log) read it whole. Returns `previous`
    itself when the file has not changed."""
    path = queue.log_path(shard)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if previous is not None and not previous.exists and previous.path == path:
            return previous
        return ShardScan(shard=shard, path=path, exists=False, root=queue.directory)
    except OSError as exc:
        raise QueueError(f"cannot read {path}: {exc}") from None
    if (
        previous is not None
        and previous.exists
        and previous.path == path
        and previous.ino == st.st_ino
        and st.st_size >= previous.size
        # Records in an unterminated last line were folded already: read it all again.
        and not (previous.tail_records and st.st_size > previous.size)
    ):
        if st.st_size > previous.size:
            _fold_from(previous, previous.torn_at, None)
        return previous
    scan = ShardScan(shard=shard, path=path, exists=True, root=queue.directory)
    _fold_from(scan, 0, None)
    return scan


def _fold_from(scan: ShardScan, start: int, only: set[int] | None) -> None:
    """Fold the records of `scan.path` from byte `start` (a line boundary) into `scan`."""
    path = scan.path
    try:
        with contextlib.suppress(FileNotFoundError):
            scan.ino = os.lstat(path).st_ino
        for chunk in read_log(path, start=start, root=scan.root):
            records = chunk.records
            scan.corrupt.extend(chunk.corrupt)
            if chunk.eof:
                scan.torn = chunk.fragment
                scan.torn_at = chunk.end
                scan.size = chunk.end + chunk.fragment
                # A last line that lost only its newline holds records the owner keeps: fold
                # them as the daemon will (the same rule, `scan_tail`).
                tail = chunk.tail
                scan.tail_records = len(tail.records) if tail is not None else 0
                if tail is not None and tail.records:
                    records = [*records, *tail.records]
                    scan.corrupt.extend(tail.corrupt)
            for record in records:
                if only is None or record.offset in only:
                    scan.fold.add(record)
    except OSError as exc:
        raise QueueError(f"cannot read {path}: {exc}") from None


# ------------------------------------------------------------------------------------------
# Locks
# ------------------------------------------------------------------------------------------


def probe_lock(path: Path) -> LockState:
    """Is the flock on `path` held by someone? Tries LOCK_EX | LOCK_NB and releases at once."""
    try:
        fd = open_file(path, os.O_RDONLY)  # never through a link (`snerd.io.files`)
    except FileNotFoundError:
        return LockState("absent")
    except OSError as exc:
        raise QueueError(f"cannot open {path}: {exc}") from None
    try:
        try:
            portalocker.lock(fd, portalocker.LOCK_EX | portalocker.LOCK_NB)
        except portalocker.exceptions.LockException:
            pid, owner = _lock_text(path)
            return LockState("held", pid, owner)
        portalocker.unlock(fd)
        return LockState("free")
    finally:
        os.close(fd)


def _lock_text(path: Path) -> tuple[int | None, str | None]:
    """The pid and owner a lock file names (`LockText`)."""
    try:
        text = LockText.parse(read_small(path, 4096).decode("utf-8", "replace"))
    except OSError:
        return None, None
    return text.pid, text.owner


@contextlib.contextmanager
def shard_locks(queue: Queue, shards: Sequence[int], owner: str) -> Iterator[None]:
    """Hold the locks of `shards` (non-blocking, like a daemon); QueueError naming the holder
    of the first one that is busy (none is held then)."""
    locks = ShardLocks(queue.directory)
    try:
        busy: list[str] = []
        for shard in shards:
            if not locks.try_lock(shard, owner):
                pid, who = _lock_text(locks.path(shard))
                busy.append(
                    f"{shard_name(shard)} is held by a running daemon "
                    f"({LockState('held', pid, who).holder()})"
                )
        if busy:
            raise QueueError(
                "; ".join(busy)
                + ". Stop that daemon first (SIGTERM, or end the program that spawned it: it "
                "drains and exits), then run this again."
            )
        yield
    finally:
        locks.unlock_all()


# ------------------------------------------------------------------------------------------
# Entries snerd refuses, inboxes
# ------------------------------------------------------------------------------------------


def entry_problem(path: Path, want_dir: bool) -> str | None:
    """What is wrong with the entry `path` for snerd, or None (fine, or absent). Read with
    lstat(2): a link is reported, never followed."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{path}: cannot inspect it ({exc})"
    if stat.S_ISLNK(mode):
        return (
            f"{path} is a symbolic link: snerd never follows a link inside its data directory "
            "and refuses it; put the real file (or directory) there"
        )
    if want_dir and not stat.S_ISDIR(mode):
        return f"{path} is {describe_kind(mode)}, not a directory: snerd refuses it"
    if not want_dir and not stat.S_ISREG(mode):
        return f"{path} is {describe_kind(mode)}, not a regular file: snerd refuses it"
    return None


def queue_entries(queue: Queue) -> list[tuple[str, str]]:
    """Problems with the entries of DIR itself that snerd uses (membership.json and its
    temp file, `.membership.lock`, `.lockprobe`)."""
    found = []
    for name in (MEMBERSHIP, MEMBERSHIP + ".tmp", ".membership.lock", ".lockprobe"):
        problem = entry_problem(queue.directory / name, False)
        if problem is not None:
            found.append((str(queue.directory / name), problem))
    return found


def shard_entries(queue: Queue, shard: int) -> list[tuple[str, str]]:
    """Problems with the entries of one shard that snerd uses: its directory, `.lock`,
    `tasks/` and what it holds, `inbox/` and every file in it."""
    base = queue.shard_dir(shard)
    tasks = queue.log_path(shard).parent
    checks: list[tuple[Path, bool]] = []
    if not queue.legacy:
        checks.append((base, True))
    checks += [(queue.lock_path(shard), False), (tasks, True)]
    checks += [(tasks / name, False) for name in ("tasks.log", "rate_limits.json", *TEMP_NAMES)]
    found: list[tuple[str, str]] = []
    for path, want_dir in checks:
        problem = entry_problem(path, want_dir)
        if problem is not None:
            found.append((str(path), problem))
            if path in (base, tasks):
                break  # nothing below a refused directory is looked at (or used)
    else:
        if not queue.legacy:
            inbox = base / "inbox"
            problem = entry_problem(inbox, True)
            if problem is not None:
                found.append((str(inbox), problem))
            else:
                with contextlib.suppress(OSError):
                    for entry in sorted(os.scandir(inbox), key=lambda e: e.name):
                        problem = entry_problem(Path(entry.path), False)
                        if problem is not None:
                            found.append((entry.path, problem))
    return found



def inbox_waiting(directory: Path, shard: int, ingested: dict[str, int]) -> dict[str, int]:
    """Bytes and files of a shard's inboxes not yet ingested (per the log's inbox records)."""
    try:
        rests = [size - ingested.get(name, 0) for name, _, size in inbox_files(directory, shard)]
    except OSError:
        rests = []
    waiting = [rest for rest in rests if rest > 0]
    return {"inbox_waiting_bytes": sum(waiting), "inbox_waiting_files": len(waiting)}

# ------------------------------------------------------------------------------------------
# stats
# ------------------------------------------------------------------------------------------


def queue_json(queue: Queue) -> dict[str, Any]:
    """What `--json` reports say about the queue itself, before their own fields."""
    return {
        "directory": str(queue.directory),
        "queue": queue.name,
        "shards": queue.shards,
        "version": queue.version,
        "legacy_layout": queue.legacy,
    }


def _summary_json(s: ShardSummary) -> dict[str, Any]:
    return {
        "live": s.live,
        "waiting": s.waiting,
        "delayed": s.delayed,
        "retrying": s.retrying,
        "in_flight": s.in_flight,
        "completed": s.completed,
        "dead_letters": s.dead_letters,
        "types": dict(sorted(s.types.items())),
    }


def _owner_text(claim: ClaimView, now_us: int, config: OwnershipConfig) -> str:
    """The owner column of `snerdmq stats`: who holds the shard and how its lease stands."""
    state = lease_state(claim, now_us, config)
    if state == "free":
        return "free"
    if state == "unparseable":
        return f"{claim.owner} (lease expiry unreadable)"
    assert claim.lease_expiry_us is not None
    left = format_span(claim.lease_expiry_us - now_us)
    if state == "lapsed":
        return f"LAPSED {claim.owner} ({left} ago)"
    if state == "grace":
        return f"{claim.owner} (lease {left} over, within skew)"
    return f"{claim.owner} (lease {left})"


def paused_report(scans: Sequence[ShardScan]) -> list[dict[str, Any]]:
    """The task types paused (None: the whole queue), each with the shards it is paused on
    and whether that is every shard read (`snerd.core.control.paused_where`)."""
    marks = {scan.shard: {t: m for t, (m, _r) in scan.fold.pauses.items()} for scan in scans}
    return [
        {"task_type": t, "shards": [shard_name(s) for s in on], "everywhere": len(on) == len(scans)}
        for t, on in paused_where(marks).items()
    ]


def paused_text(entry: dict[str, Any], shards: int) -> str:
    """One `paused_report` entry, as `stats` and `validate` print it."""
    what = "the whole queue" if entry["task_type"] is None else f"type {entry['task_type']!r}"
    if entry["everywhere"]:
        return f"{what} (all shards)"
    return (f"{what} on {', '.join(entry['shards'])} only ({len(entry['shards'])} of {shards}: "
            "a pause or resume is still pending on the others)")


def stats_report(
    queue: Queue, scans: Sequence[ShardScan], now_us: int, skew_us: int
) -> dict[str, Any]:
    """What `stats --json` prints (and the dashboard serves), from each shard's scan; each
    `per_shard` row also has `owner_text`, the owner column of the table."""
    config = OwnershipConfig(skew_margin_us=skew_us)
    rows: list[dict[str, Any]] = []
    total = ShardSummary()
    total_bytes = total_corrupt = 0
    for scan in scans:
        s = summarize(scan.fold, now_us)
        total.add(s)
        total_bytes += scan.size
        total_corrupt += len(scan.corrupt)
        claim = queue.claim(scan.shard)
        rows.append(
            {
                "shard": shard_name(scan.shard),
                "owner": claim.owner,
                "lease_expiry": claim.lease_expiry,
                "owner_text": _owner_text(claim, now_us, config),
                "epoch": queue.epoch(scan.shard),
                "log_epoch": scan.fold.log_epoch,
                "log_exists": scan.exists,
                **_summary_json(s),
                "log_bytes": scan.size,
                "corrupt_lines": len(scan.corrupt),
                "torn_tail_bytes": 0 if scan.tail_records else scan.torn,
                "stale_records": len(scan.fold.stale),
                "paused_types": [t for t, (m, _r) in scan.fold.pauses.items() if m.paused],
            }
        )
    return {
        **queue_json(queue),
        "per_shard": rows,
        "paused": paused_report(scans),
        "totals": {
            **_summary_json(total),
            "log_bytes": total_bytes,
            "corrupt_lines": total_corrupt,
        },
    }



# ------------------------------------------------------------------------------------------
# One task: its details and its story
# ------------------------------------------------------------------------------------------


def check_task_arg(task_id: str) -> None:
    """A task id given by a person: what an enqueue would take (`check_task_id`), in text a
    record can hold; UsageError naming what is wrong."""
    try:
        task_id.encode("utf-8")
        check_task_id("task id", task_id)
    except UnicodeEncodeError:
        raise UsageError("the task id is not valid UTF-8 text") from None
    except BadField as exc:
        raise UsageError(exc.detail) from None


def find_task(queue: Queue, task_id: str) -> tuple[list[Found], list[str]]:
    """Every record of `task_id` in the queue's logs and inbox files, and the files that could
    not be read (one line each). Read-only; safe while daemons run."""
    errors: list[str] = []
    if queue.legacy:
        problems: list[tuple[int, str]] = []
        path = queue.log_path(0)
        found = read_file_task(queue.directory, path, 0, LOG, task_id, problems)
        return found, [text for _shard, text in problems]
    return read_task(queue.directory, queue.shards, task_id, errors), errors


def task_report(queue: Queue, task_id: str, now_us: int) -> dict[str, Any]:
    """What `snerdmq status --json` prints and `/api/task/{id}` serves: the task's `details`
    (`snerd.core.story`), its `story` (one object per step) and `errors` (files that could not
    be read, so the story may miss their part)."""
    check_task_arg(task_id)
    found, errors = find_task(queue, task_id)
    return {
        **details(task_id, found, now_us),
        "story": [step.to_json() for step in story(found, task_id)],
        "errors": errors,
    }
