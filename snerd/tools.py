"""The `snerdmq` subcommands other than the daemon itself: operator tools on a queue directory.

    snerdmq stats DIR [--json]                     what each shard holds, from the files
    snerdmq validate DIR [--json]                  health check of the cluster; exit 1: degraded
    snerdmq add-shards N DIR                       grow the queue by N shards
    snerdmq dlq DIR [--type T] [--id ID] [--json]  list dead letters
    snerdmq replay [--type T] [--id ID] [DIR]      put dead letters back into the queue
    snerdmq fsck DIR [--repair] [--json]           check every shard log, byte by byte
    snerdmq compact DIR [--history N]              offline compaction of idle shards
    snerdmq demo [DIR]                             a guided tour (snerd.demo)
    snerdmq dashboard DIR [--host H] [--port P]    a live web dashboard (snerd.dashboard)

Owns: the command lines (argparse; `--help` on each; a bad argument or environment value is an
error naming it, exit code 2), reading a queue directory the way a daemon would (membership.json,
`shard-N/.lock`, `shard-N/tasks/tasks.log`, folded by `snerd.core.shardlog`, the same rules as
the daemon's replay), and the few writes an operator asks for.

Rules it keeps:

- Read-only commands (stats, validate, dlq, fsck without --repair) never write, never take
  `.membership.lock`, and work while daemons run: membership.json is only ever replaced by
  rename, so a plain read sees a whole document. The one exception is the lock probe: to tell
  whether a daemon holds `shard-N/.lock`, they try a non-blocking flock and release it at once
  (a daemon that tries the lock at that very moment sees it busy and retries a second later).
- A command that writes a shard log (replay, compact, fsck --repair) first takes that shard's
  lock with a non-blocking flock, exactly as a daemon does; a shard held by a daemon is refused,
  naming the holder. membership.json is only changed conditionally on the version read, under
  `.membership.lock` (`snerd.io.membership.update_membership`).
- Appends go through `GroupCommitLog` (one write, fsync, directory fsync for a new file; a
  failed write is cut back off) and compaction through `GroupCommitLog.compact` (temp file,
  fsync, rename, directory fsync): the same crash-safety as the daemon's own writes.

It must never: write a log whose lock it does not hold, delete another process's claim, decide
something about tasks differently from the daemon's replay, or print machine output on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson

from snerd.core.events import LogRecord
from snerd.core.ownership import (
    MAX_QUEUE_SHARDS,
    LockText,
    MembershipInvalid,
    OwnershipConfig,
    fair_cap,
    parse_membership,
    shard_name,
)
from snerd.core.shardlog import (
    HISTORY_LIMIT,
    DeadLetter,
    ShardFold,
    ready_at_us,
)
from snerd.core.timefmt import format_rfc3339, parse_rfc3339

__all__ = [
    "DAEMON_STATES",
    "LEASE_STATES",
    "SUBCOMMANDS",
    "DaemonHealth",
    "HealthReport",
    "HealthSettings",
    "QueueFacts",
    "ShardFacts",
    "ShardHealth",
    "add_shards_main",
    "compact_main",
    "dashboard_main",
    "demo_main",
    "dlq_main",
    "fsck_main",
    "health_json",
    "health_lines",
    "judge_health",
    "replay_main",
    "stats_main",
    "validate_main",
]

DEFAULT_DIR = ".snerdata"
MEMBERSHIP = "membership.json"
QUEUE_NAME = "snerdmq-daemon"
SECOND = 1_000_000
#: Daemons renew (and so notice new shards) every third of the lease.
_RENEW_S = 10

_N = TypeVar("_N", int, float)


# ------------------------------------------------------------------------------------------
# Errors and argument plumbing
# ------------------------------------------------------------------------------------------


class UsageError(Exception):
    """A bad argument or environment value: printed with the usage, exit code 2."""


class QueueError(Exception):
    """The queue cannot be acted on (a daemon holds a lock, a file is unreadable): exit 1."""


class MembershipUnusable(QueueError):
    """membership.json is there but cannot be used: unreadable, or not a membership document
    (the core's rule, `check_membership`). `fsck` and `validate` report it and check what they
    can without it; every other command stops with the message."""


def _parser(command: str, description: str, epilog: str | None = None) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog=f"snerdmq {command}",
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def _run(
    parser: argparse.ArgumentParser,
    argv: Sequence[str],
    body: Callable[[argparse.Namespace], int],
) -> int:
    """Parse `argv` and run `body`; every way out is an exit code (argparse's own exits
    included: `--help` 0, a bad flag 2)."""
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    try:
        return body(args)
    except UsageError as exc:
        parser.print_usage(sys.stderr)
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    except QueueError as exc:
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `snerdmq dlq DIR | head`
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keep Python's exit quiet
        return 1


def _number_arg(
    name: str,
    convert: Callable[[str], _N],
    kind: str,
    bound: str,
    ok: Callable[[_N], bool],
) -> Callable[[str], _N]:
    """An argparse `type=`: `convert(text)`, which must be `ok`; refused with
    `<name> must be <kind>, got '<text>'` (it does not convert) or `<name> must be <bound>,
    got '<text>'` (it is out of range)."""

    def parse(text: str) -> _N:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be {kind}, got {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"{name} must be {bound}, got {text!r}")
        return value

    return parse


def _positive_int(name: str) -> Callable[[str], int]:
    return _number_arg(name, int, "a whole number of at least 1", "at least 1", lambda v: v >= 1)


def _nonnegative_int(name: str) -> Callable[[str], int]:
    return _number_arg(name, int, "a whole number", "0 or more", lambda v: v >= 0)


def _env_seconds(name: str, default: float, *, minimum: float) -> float:
    """An environment value in seconds, checked as the daemon checks it (`snerd.config`: the
    same range and message; a value past the range, 1e303, would overflow a microsecond count).
    `minimum` is the floor the caller relies on, which the range includes."""
    from snerd.config import ConfigError, seconds_setting  # (not needed by most subcommands)

    try:
        value = seconds_setting(os.environ, name, default)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    assert value >= minimum, (name, value)
    return value


def _skew_margin_us() -> int:
    """SNERD_CLOCK_SKEW_MARGIN (default 5 s): daemons add it to a lease before it counts as
    lapsed, and so do these tools."""
    return int(_env_seconds("SNERD_CLOCK_SKEW_MARGIN", 5.0, minimum=0.0) * SECOND)


def _now_us() -> int:
    """The wall clock, shifted by SNERD_TEST_CLOCK_OFFSET as the daemon's is (a test hook)."""
    offset = _env_seconds("SNERD_TEST_CLOCK_OFFSET", 0.0, minimum=-math.inf)
    return time.time_ns() // 1000 + int(offset * SECOND)


def _print_json(value: Any) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n")


# ------------------------------------------------------------------------------------------
# Reading a queue directory
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Claim:
    """One shard's claim in membership.json."""

    owner: str | None
    expiry: str | None
    expiry_us: int | None
    epoch: int


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
        return q if isinstance(q, str) else QUEUE_NAME

    def shard_dir(self, shard: int) -> Path:
        if self.legacy:
            return self.directory
        return self.directory / f"shard-{shard}"

    def log_path(self, shard: int) -> Path:
        return self.shard_dir(shard) / "tasks" / "tasks.log"

    def lock_path(self, shard: int) -> Path:
        return self.shard_dir(shard) / ".lock"

    def claim(self, shard: int) -> Claim:
        claims = (self.doc or {}).get("claims") or {}
        raw = claims.get(f"shard-{shard}") if isinstance(claims, dict) else None
        epochs = (self.doc or {}).get("epochs") or {}
        recorded = epochs.get(f"shard-{shard}", 0) if isinstance(epochs, dict) else 0
        recorded = recorded if isinstance(recorded, int) and not isinstance(recorded, bool) else 0
        if not isinstance(raw, dict):
            return Claim(owner=None, expiry=None, expiry_us=None, epoch=recorded)
        owner = raw.get("owner") if isinstance(raw.get("owner"), str) else None
        expiry = raw.get("lease_expiry") if isinstance(raw.get("lease_expiry"), str) else None
        expiry_us: int | None = None
        if expiry is not None:
            with contextlib.suppress(ValueError):
                expiry_us = parse_rfc3339(expiry)
        epoch = raw.get("epoch")
        epoch = epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else 0
        return Claim(owner=owner, expiry=expiry, expiry_us=expiry_us, epoch=max(epoch, recorded))

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
    from snerd.io.files import read_small

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


#: What an unusable membership.json means for the daemons, said by `fsck` and `validate`.
_UNUSABLE_MEANS = (
    "a daemon refuses to start on it (exit 2), and a running one claims nothing and stops "
    "acting for its shards when their leases run out; fix the file or restore it"
)


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
    from snerd.io.log import read_log

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


@dataclass(frozen=True, slots=True)
class LockState:
    """Whether a `.lock` file is held, and what it says about its holder."""

    #: "held", "free" or "absent" (no lock file: never locked).
    state: str
    pid: int | None = None
    owner: str | None = None

    def holder(self) -> str:
        parts = []
        if self.owner:
            parts.append(self.owner)
        if self.pid is not None:
            parts.append(f"pid {self.pid}")
        return ", ".join(parts) if parts else "an unknown process"


def probe_lock(path: Path) -> LockState:
    """Is the flock on `path` held by someone? Tries LOCK_EX | LOCK_NB and releases at once."""
    import portalocker

    from snerd.io.files import open_file

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
    from snerd.io.files import read_small

    try:
        text = LockText.parse(read_small(path, 4096).decode("utf-8", "replace"))
    except OSError:
        return None, None
    return text.pid, text.owner


@contextlib.contextmanager
def shard_locks(queue: Queue, shards: Sequence[int], owner: str) -> Iterator[None]:
    """Hold the locks of `shards` (non-blocking, like a daemon); QueueError naming the holder
    of the first one that is busy (none is held then)."""
    from snerd.io.membership import ShardLocks

    locks = ShardLocks(queue.directory)
    try:
        busy: list[str] = []
        for shard in shards:
            if not locks.try_lock(shard, owner):
                pid, who = _lock_text(locks.path(shard))
                busy.append(
                    f"shard-{shard} is held by a running daemon "
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


def _tool_owner(command: str) -> str:
    host = os.environ.get("HOSTNAME") or socket.gethostname() or "unknown-host"
    return f"snerdmq-{command}@{host}-pid-{os.getpid()}"


def _fmt_bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


def _fmt_span(us: int) -> str:
    s = abs(us) / SECOND
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    if s < 172800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        out = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(cells)
        ]
        return "  ".join(out).rstrip()

    return [line(headers), *(line(row) for row in rows)]


def _clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


# ------------------------------------------------------------------------------------------
# Live-task breakdown (shared by stats and validate)
# ------------------------------------------------------------------------------------------


@dataclass(slots=True)
class ShardSummary:
    live: int = 0
    waiting: int = 0
    delayed: int = 0
    retrying: int = 0
    in_flight: int = 0
    completed: int = 0
    dead_letters: int = 0
    types: Counter[str] = field(default_factory=Counter)

    def add(self, other: ShardSummary) -> None:
        for name in (
            "live", "waiting", "delayed", "retrying", "in_flight", "completed", "dead_letters"
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.types.update(other.types)


#: The states of a live task (`live_state`), then of a finished one.
LIVE_STATES = ("in_flight", "retrying", "delayed", "waiting")
FINISHED_STATES = ("completed", "dead_letter")


@functools.lru_cache(maxsize=1 << 17)
def _ready_at(execute_at: str | None, retry_after: str | None) -> int | None:
    """`ready_at_us` of a record with these two fields, remembered: a watching reader (the
    dashboard) judges every live task again at each refresh, and parsing the two times was
    most of that work."""
    return ready_at_us({"executeAt": execute_at, "retryAfterTime": retry_after})


def live_state(task_id: str, fields: dict[str, Any], in_flight: dict[str, int], now_us: int) -> str:
    """A live task's state: in flight (dispatched, unresolved: running, or to be re-run after
    a crash), retrying (failed before, waiting for the next attempt), delayed (first attempt
    not due yet), waiting (due: for a worker, a handler, a rate window or its parents)."""
    if task_id in in_flight:
        return "in_flight"
    retry_count = fields.get("retryCount")
    if isinstance(retry_count, int) and retry_count > 0:
        return "retrying"
    execute_at, retry_after = fields.get("executeAt"), fields.get("retryAfterTime")
    if isinstance(execute_at, str | None) and isinstance(retry_after, str | None):
        ready = _ready_at(execute_at, retry_after)
    else:  # not the shape snerd writes: nothing to remember
        ready = ready_at_us(fields)
    if ready is not None and ready > now_us:
        return "delayed"
    return "waiting"


def summarize(fold: ShardFold, now_us: int) -> ShardSummary:
    """Live tasks by state (`live_state`), finished and dead-lettered ones."""
    s = ShardSummary()
    in_flight = fold.in_flight()
    for task_id, record in fold.live.items():
        f = record.fields
        s.live += 1
        task_type = f.get("taskType")
        s.types[task_type if isinstance(task_type, str) else "?"] += 1
        state = live_state(task_id, f, in_flight, now_us)
        setattr(s, state, getattr(s, state) + 1)
    s.completed = fold.completed()
    s.dead_letters = len(fold.dead_letters())
    return s


def _queue_json(queue: Queue) -> dict[str, Any]:
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


def _owner_text(claim: Claim, now_us: int, skew_us: int) -> str:
    if claim.owner is None:
        return "free"
    if claim.expiry_us is None:
        return f"{claim.owner} (lease expiry unreadable)"
    left = claim.expiry_us - now_us
    if now_us > claim.expiry_us + skew_us:
        return f"LAPSED {claim.owner} ({_fmt_span(left)} ago)"
    if left < 0:
        return f"{claim.owner} (lease {_fmt_span(left)} over, within skew)"
    return f"{claim.owner} (lease {_fmt_span(left)})"


# ------------------------------------------------------------------------------------------
# stats
# ------------------------------------------------------------------------------------------


def stats_main(argv: Sequence[str]) -> int:
    """`snerdmq stats DIR [--json]`."""
    parser = _parser(
        "stats",
        "Show what each shard of the queue in DIR holds, read from its files: owner, epoch, "
        "live tasks by state, finished and dead-lettered history, log size, corrupt lines.\n"
        "Read-only; safe while daemons run.",
        "States: waiting = due now (for a worker, a handler, a rate window or its parents); "
        "delayed = first attempt not due yet; retrying = failed before, waiting to retry; "
        "in flight = dispatched and not resolved (running, or re-run after a crash).",
    )
    parser.add_argument("directory", metavar="DIR", help="queue directory")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return _run(parser, argv, _stats)


def stats_report(
    queue: Queue, scans: Sequence[ShardScan], now_us: int, skew_us: int
) -> dict[str, Any]:
    """What `stats --json` prints (and the dashboard serves), from each shard's scan; each
    `per_shard` row also has `owner_text`, the owner column of the table."""
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
                "shard": f"shard-{scan.shard}",
                "owner": claim.owner,
                "lease_expiry": claim.expiry,
                "owner_text": _owner_text(claim, now_us, skew_us),
                "epoch": claim.epoch,
                "log_epoch": scan.fold.log_epoch,
                "log_exists": scan.exists,
                **_summary_json(s),
                "log_bytes": scan.size,
                "corrupt_lines": len(scan.corrupt),
                "torn_tail_bytes": 0 if scan.tail_records else scan.torn,
                "stale_records": len(scan.fold.stale),
            }
        )
    return {
        **_queue_json(queue),
        "per_shard": rows,
        "totals": {
            **_summary_json(total),
            "log_bytes": total_bytes,
            "corrupt_lines": total_corrupt,
        },
    }


def _stats(args: argparse.Namespace) -> int:
    queue = open_queue(args.directory)
    report = stats_report(
        queue, [scan_shard(queue, k) for k in range(queue.shards)], _now_us(), _skew_margin_us()
    )
    rows: list[dict[str, Any]] = report["per_shard"]
    totals: dict[str, Any] = report["totals"]
    if args.json:
        for r in rows:
            del r["owner_text"]
        _print_json(report)
        return 0
    layout = " (upstream v0.2 layout, not adopted yet)" if queue.legacy else ""
    print(
        f"Queue {queue.name} in {queue.directory}{layout}: {queue.shards} shard(s), "
        f"membership version {queue.version if queue.version is not None else '-'}"
    )
    headers = ["shard", "owner", "epoch", "live", "waiting", "delayed", "retrying",
               "in flight", "completed", "dead", "log size", "corrupt"]
    table: list[list[str]] = []
    for r in rows:
        table.append(
            [
                r["shard"],
                r["owner_text"],
                str(r["epoch"]),
                str(r["live"]),
                str(r["waiting"]),
                str(r["delayed"]),
                str(r["retrying"]),
                str(r["in_flight"]),
                str(r["completed"]),
                str(r["dead_letters"]),
                _fmt_bytes(r["log_bytes"]) if r["log_exists"] else "-",
                str(r["corrupt_lines"]),
            ]
        )
    table.append(
        ["total", "", ""]
        + [str(totals[k]) for k in
           ("live", "waiting", "delayed", "retrying", "in_flight", "completed", "dead_letters")]
        + [_fmt_bytes(totals["log_bytes"]), str(totals["corrupt_lines"])]
    )
    print()
    for line in _table(headers, table, right=set(range(2, 12))):
        print("  " + line)
    print()
    if totals["types"]:
        types = ", ".join(f"{t} {n}" for t, n in totals["types"].items())
        print(f"Live tasks by type: {types}")
    notes = []
    for r in rows:
        if r["torn_tail_bytes"]:
            notes.append(f"{r['shard']}: {r['torn_tail_bytes']} byte(s) of unterminated last line")
        if r["stale_records"]:
            notes.append(f"{r['shard']}: {r['stale_records']} stale-epoch record(s) ignored")
    if totals["corrupt_lines"]:
        notes.append(
            f"{totals['corrupt_lines']} corrupt line(s): see `snerdmq fsck {args.directory}`"
        )
    if totals["dead_letters"]:
        notes.append(
            f"{totals['dead_letters']} dead letter(s): `snerdmq dlq {args.directory}` lists them"
        )
    for note in notes:
        print(f"Note: {note}")
    return 0


# ------------------------------------------------------------------------------------------
# validate
# ------------------------------------------------------------------------------------------
#
# The health check of a running cluster. `_validate` only gathers facts (membership.json, each
# shard's lock probe and folded log, the filesystem type, the wall clock) and prints;
# `judge_health` decides everything from those facts and `now_us`, so every judgement can be
# tested with a fixed clock. The tool has one snapshot and no monotonic observation of its
# own, so it judges leases and heartbeats on its wall clock, with the skew margin added, and
# only calls a shard degraded once a running daemon would long since have acted.

#: Lease states of a shard's claim (`judge_health`, `--json` `per_shard[].lease.state`).
LEASE_STATES = ("free", "live", "grace", "lapsed", "unparseable")
#: Daemon states (`--json` `daemons[].state`).
DAEMON_STATES = ("live", "late", "stale", "no heartbeat")


class HealthSettings(OwnershipConfig):
    """The lease parameters the daemons run with (`OwnershipConfig`: SNERD_LEASE_TTL, default
    30 s; SNERD_CLOCK_SKEW_MARGIN, default 5 s), as the tool reads them from the environment,
    and how long past a lease the tool calls a shard degraded."""

    __slots__ = ()

    @property
    def overdue_us(self) -> int:
        """How long past a lease's expiry (or a heartbeat's `seen`) the tool waits before it
        calls the shard degraded: lease + margin + one renewal. A running daemon takes a lapsed
        claim over once it has seen it unchanged for lease + margin, which it notices within
        one renewal, so by then a healthy cluster has acted."""
        return self.lapse_us + self.renew_interval_us


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardFacts:
    """What the tool found about one shard, besides its claim in membership.json."""

    shard: int
    directory_exists: bool
    lock: LockState
    log_exists: bool
    #: The highest claim epoch in the log (0: no claim record).
    log_epoch: int = 0
    corrupt_lines: int = 0
    torn_tail_bytes: int = 0
    stale_records: int = 0
    #: Why no daemon can use the shard's files (a symbolic link snerd refuses, an entry of the
    #: wrong kind, a log it cannot read); empty when they are fine.
    unusable: tuple[str, ...] = ()
    #: Live tasks by type.
    live_types: dict[str, int] = field(default_factory=dict)
    #: Bytes in the shard's inbox files past what its log says was ingested, and in how many
    #: files (tasks enqueued through other daemons, not yet taken in by an owner).
    inbox_waiting_bytes: int = 0
    inbox_waiting_files: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueFacts:
    """Everything `judge_health` needs besides membership.json and the clock."""

    directory: str
    shards: list[ShardFacts]
    #: `shard-k` directories with k >= shards.
    orphans: list[int] = field(default_factory=list)
    #: The filesystem type of DIR (`ext4`, `nfs4`, `unknown`).
    filesystem: str = "unknown"
    #: True on a local filesystem, where a free lock proves its last holder's process is gone.
    lock_proves_liveness: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardHealth:
    """One shard, judged."""

    shard: str
    #: `free`, `active`, `lapsed`, `unreadable`, `paused` (the summary kept from before).
    status: str
    owner: str | None
    lease_expiry: str | None
    #: One of LEASE_STATES.
    lease: str
    #: lease_expiry - now, in µs (None when free or unparseable).
    expires_in_us: int | None
    #: "live (expires in 12 s)", "expired 40 s ago (lapsed: ...)", "unparseable expiry", "free".
    lease_text: str
    #: membership.json's epoch (the claim's, or the highest ever given out).
    epoch: int
    log_epoch: int
    #: `never claimed`, `in step`, `log ahead`, `taking over`, `not fenced`.
    epoch_state: str
    lock: str
    lock_holder: str | None
    directory_exists: bool
    corrupt_lines: int
    torn_tail_bytes: int
    stale_records: int
    #: The details printed after the lease: epoch, lock, log.
    details: list[str]


@dataclass(frozen=True, slots=True, kw_only=True)
class DaemonHealth:
    """One daemon, from its heartbeat and the claims naming it."""

    node: str
    shards: list[str]
    beat: int | None
    seen: str | None
    #: now - seen, in µs (None: no heartbeat, or `seen` does not parse).
    seen_age_us: int | None
    #: One of DAEMON_STATES.
    state: str
    #: Counted among the running daemons (for the fair share).
    running: bool
    above_share: bool
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class HealthReport:
    """The verdict of `judge_health`: printed by `validate`, or dumped by `--json`."""

    now_us: int
    settings: HealthSettings
    facts: QueueFacts
    shards: list[ShardHealth]
    daemons: list[DaemonHealth]
    #: Daemons counted as running (fresh or late heartbeat, or a live lease without one).
    running: int
    #: ceil(shards / running), None when no daemon runs.
    fair_share: int | None
    unowned: list[str]
    task_types: dict[str, int]
    problems: list[str]
    warnings: list[str]

    @property
    def degraded(self) -> bool:
        return bool(self.problems)

    @property
    def exit_code(self) -> int:
        return 1 if self.problems else 0


def _int_field(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _parse_time(value: Any) -> int | None:
    if not isinstance(value, str):
        return None
    try:
        return parse_rfc3339(value)
    except ValueError:
        return None


def _claim_of(doc: dict[str, Any], shard: int) -> Claim:
    # Queue.claim reads only the document (no path, no shard count): the same parsing as stats.
    return Queue(directory=Path("."), doc=doc, shards=0).claim(shard)


def _lease(claim: Claim, now_us: int, settings: HealthSettings, running: bool) -> tuple[str, str]:
    """(state, text) of a claim's lease on the tool's clock."""
    if claim.owner is None:
        return "free", "free"
    if claim.expiry_us is None:
        return "unparseable", f"unparseable expiry ({claim.expiry!r})"
    left = claim.expiry_us - now_us
    if left >= 0:
        return "live", f"live (expires in {_fmt_span(left)})"
    ago = _fmt_span(left)
    if -left <= settings.skew_margin_us:
        margin = f"{settings.skew_margin_us / SECOND:g} s"
        return "grace", f"expired {ago} ago (within the {margin} skew margin: not lapsed yet)"
    who = "another daemon takes it over" if running else "a daemon started on DIR takes it over"
    return "lapsed", f"expired {ago} ago (lapsed: {who})"


def judge_health(
    doc: dict[str, Any],
    facts: QueueFacts,
    *,
    now_us: int,
    settings: HealthSettings,
    membership_problem: str | None = None,
) -> HealthReport:
    """Judge a queue's health from membership.json, what was found on disk, and `now_us` (the
    tool's wall clock). No I/O and no clock reads: the same inputs give the same report.

    Degraded (exit 1) when: a shard is free while a daemon runs (its enqueues are refused); a
    lease expired more than `settings.overdue_us` ago; a shard's owner's heartbeat is older
    than that; a lease expiry does not parse (daemons never take such a claim over); a claimed
    shard's directory is missing; a `shard-k` directory lies beyond the shard count; a log has
    corrupt lines; membership.json is unusable (`membership_problem`: what is wrong with it;
    `doc` is then empty and `facts` are the shard directories found on disk). A queue with no
    daemon and nothing claimed is healthy.
    """
    problems: list[str] = []
    if membership_problem is not None:
        problems.append(f"{membership_problem}: {_UNUSABLE_MEANS}")
    warnings: list[str] = []
    shard_count = len(facts.shards)
    claims = [_claim_of(doc, f.shard) for f in facts.shards]
    overdue = _fmt_span(settings.overdue_us)

    # Daemons: every heartbeat, and every owner a claim names.
    beats_raw = doc.get("nodes")
    beats: dict[str, Any] = beats_raw if isinstance(beats_raw, dict) else {}
    held: dict[str, list[str]] = {}
    for f, claim in zip(facts.shards, claims, strict=True):
        if claim.owner is not None:
            held.setdefault(claim.owner, []).append(shard_name(f.shard))
    lease_alive = {
        claim.owner
        for claim in claims
        if claim.owner is not None
        and claim.expiry_us is not None
        and now_us <= claim.expiry_us + settings.skew_margin_us
    }
    nodes = sorted(set(beats) | set(held))
    partial: list[tuple[str, int | None, str | None, int | None, str, bool]] = []
    for node in nodes:
        beat = beats.get(node)
        beat_count = _int_field(beat.get("beat")) if isinstance(beat, dict) else None
        seen = beat.get("seen") if isinstance(beat, dict) else None
        seen = seen if isinstance(seen, str) else None
        seen_us = _parse_time(seen)
        age = None if seen_us is None else now_us - seen_us
        if node not in beats:
            state = "no heartbeat"
            running = node in lease_alive
        elif age is None or age <= settings.renew_interval_us + settings.skew_margin_us:
            state, running = "live", True
        elif age <= settings.overdue_us:
            state, running = "late", True
        else:
            state, running = "stale", False
        partial.append((node, beat_count, seen, age, state, running))
    running_count = sum(1 for p in partial if p[5])
    fair = fair_cap(shard_count, running_count, OwnershipConfig()) if running_count else None
    daemons: list[DaemonHealth] = []
    for node, beat_count, seen, age, state, running in partial:
        mine = held.get(node, [])
        above = fair is not None and running and len(mine) > fair
        owns = f"{len(mine)} shard(s)" + (f" ({', '.join(mine)})" if mine else "")
        if state == "no heartbeat":
            beat_text = "no heartbeat (an upstream daemon, or one the others pruned as gone); " + (
                "its lease is live" if running else "its lease has lapsed"
            )
        elif age is None:
            beat_text = f"heartbeat {beat_count}, seen {seen!r} (unparseable)"
        elif age < 0:
            beat_text = f"heartbeat seen {_fmt_span(age)} ahead of this clock"
        else:
            beat_text = f"heartbeat seen {_fmt_span(age)} ago"
            if state == "late":
                beat_text += " (late: it missed a renewal)"
            elif state == "stale":
                beat_text += f" (stale: older than {overdue}; not running)"
        text = f"{node}: {owns}, {beat_text}"
        if above:
            text += f"; ABOVE its fair share of {fair}"
            warnings.append(
                f"{node} holds {len(mine)} shard(s), above its fair share of {fair} "
                f"(ceil({shard_count} shards / {running_count} running daemons)); it gives the "
                "excess back at its next round"
            )
        if state == "late":
            warnings.append(
                f"{node}: its heartbeat is {_fmt_span(age or 0)} old, more than one renewal "
                f"({_fmt_span(settings.renew_interval_us)}) plus the skew margin: it missed a "
                "renewal (busy, paused, or its membership writes fail)"
            )
        daemons.append(
            DaemonHealth(
                node=node, shards=mine, beat=beat_count, seen=seen, seen_age_us=age,
                state=state, running=running, above_share=above, text=text,
            )
        )
    state_of = {d.node: d for d in daemons}
    # Caps (each heartbeat carries its daemon's SNERD_MAX_SHARDS): a shard nobody takes
    # because every running daemon already holds its cap stays so until an operator acts.
    caps = [
        (d, _int_field(beats[d.node].get("max_shards")) if isinstance(beats.get(d.node), dict)
         else None)
        for d in daemons
        if d.running
    ]
    cap_remedy = (
        "every running daemon holds its cap ("
        + ", ".join(f"{d.node} {len(d.shards)} of {cap}" for d, cap in caps)
        + ", SNERD_MAX_SHARDS): raise SNERD_MAX_SHARDS or start another daemon"
        if caps and all(cap is not None and len(d.shards) >= cap for d, cap in caps)
        else None
    )
    # The task types each running daemon's SDK handles (heartbeats carry them; None: unknown,
    # an upstream daemon or an older snerd).
    handlers: dict[str, set[str] | None] = {}
    for d in daemons:
        beat = beats.get(d.node)
        listed = beat.get("types") if isinstance(beat, dict) else None
        if d.running:
            handlers[d.node] = (
                {t for t in listed if isinstance(t, str)} if isinstance(listed, list) else None
            )

    advisory = (
        ""
        if facts.lock_proves_liveness
        else f" (DIR is on {facts.filesystem}: a lock held on another host may not show here, "
        "so the lock state is advisory; the lease decides)"
    )
    shards: list[ShardHealth] = []
    unowned: list[str] = []
    types: Counter[str] = Counter()
    for f, claim in zip(facts.shards, claims, strict=True):
        name = shard_name(f.shard)
        types.update(f.live_types)
        lease, lease_text = _lease(claim, now_us, settings, running_count > 0)
        status = {"free": "free", "unparseable": "unreadable", "lapsed": "lapsed"}.get(
            lease, "active"
        )
        details = [f"epoch {claim.epoch}"]
        owner = claim.owner
        if lease == "free":
            unowned.append(name)
            if running_count and cap_remedy is not None:
                problems.append(
                    f"{name} is free while {running_count} daemon(s) run: its enqueues are "
                    f"refused, and no running daemon may claim it: {cap_remedy}"
                )
            elif running_count:
                problems.append(
                    f"{name} is free while {running_count} daemon(s) run: its enqueues are "
                    f"refused until one claims it (daemons claim free shards at their next "
                    f"round, within {_fmt_span(settings.renew_interval_us)}; a shard freed by a "
                    "give-back or a drain is free that long; if it stays free, check "
                    "SNERD_MAX_SHARDS)"
                )
        elif lease == "unparseable":
            problems.append(
                f"{name}: lease_expiry {claim.expiry!r} does not parse; daemons never take such "
                "a claim over: a human must look"
            )
        elif lease == "lapsed" and claim.expiry_us is not None:
            late = now_us - claim.expiry_us
            if late > settings.overdue_us:
                why = (
                    f"no running daemon may take it over: {cap_remedy}"
                    if running_count and cap_remedy is not None
                    else "no running daemon has taken it over"
                    if running_count
                    else "no daemon is running to take it over: start one on DIR"
                )
                problems.append(
                    f"{name}: the lease of {owner} expired {_fmt_span(late)} ago, longer than "
                    f"{overdue} (lease + skew margin + one renewal); {why}"
                )
        owner_state = state_of.get(owner) if owner is not None else None
        if owner_state is not None and owner_state.state == "stale":
            problems.append(
                f"{name} is claimed by {owner}, whose heartbeat is "
                f"{_fmt_span(owner_state.seen_age_us or 0)} old (more than {overdue}): that "
                "daemon is gone or hung"
                + ("" if lease == "lapsed" else "; its claim lapses at its lease expiry plus "
                   "the skew margin")
            )

        # The lock.
        lock = f.lock
        if lock.state == "held":
            details.append(f"lock held by {lock.holder()}")
            if owner is not None and lock.owner is not None and lock.owner != owner:
                if status == "active":
                    status = "paused"
                warnings.append(
                    f"{name} is PAUSED: claimed by {owner}, but its lock is held by "
                    f"{lock.holder()}; the claimant waits until that process lets go"
                )
            elif owner is None:
                warnings.append(
                    f"{name}: its lock is held by {lock.holder()} although no claim names it "
                    "(a daemon handing the shard over, or a tool such as replay at work)"
                )
            elif lease == "lapsed":
                warnings.append(
                    f"{name}: the lease of {owner} lapsed but its lock is still held by "
                    f"{lock.holder()}: that process lives but does not renew (paused, or a "
                    "hung filesystem); a new claimant waits for the lock"
                )
        elif f.directory_exists:
            details.append("lock free" if lock.state == "free" else "never locked")
            if lease in ("live", "grace"):
                warnings.append(
                    f"{name}: claimed but its lock is free: the owner may be dead (takeover at "
                    "once on a local filesystem, after the lease elsewhere)" + advisory
                )

        # Epochs: membership's against the log's last claim record.
        if not f.log_exists or f.log_epoch == 0:
            epoch_state = "never claimed" if claim.epoch == 0 else "not fenced"
        elif f.log_epoch == claim.epoch:
            epoch_state = "in step"
        elif f.log_epoch > claim.epoch:
            epoch_state = "log ahead"
        else:
            epoch_state = "taking over" if lease in ("live", "grace") else "not fenced"
        if f.log_exists:
            details.append(f"log epoch {f.log_epoch}")
        if epoch_state == "log ahead":
            details.append(
                "log ahead of membership (normal: an owner that took its shard up again, or a "
                "takeover race, writes under the log's epoch + 1)"
            )
        elif epoch_state == "taking over":
            details.append(f"taking over: {owner} has not written its claim record yet")
        elif epoch_state == "not fenced" and claim.epoch > 0 and f.log_exists:
            details.append("its last claimant never wrote a claim record (harmless)")

        if not f.directory_exists:
            if owner is not None or claim.epoch > 0:
                problems.append(
                    f"{name}: its directory is missing although the shard has been claimed "
                    f"(epoch {claim.epoch})"
                )
                details.append("DIRECTORY MISSING")
            else:
                details.append("not created yet")
        if f.corrupt_lines:
            problems.append(
                f"{name}: {f.corrupt_lines} corrupt line(s) in tasks.log "
                f"(`snerdmq fsck {facts.directory}` shows them)"
            )
            details.append(f"{f.corrupt_lines} corrupt line(s)")
        for text in f.unusable:
            status = "unusable"
            problems.append(f"{name}: {text}; no daemon serves this shard until that is fixed")
        if f.torn_tail_bytes and lock.state != "held":
            warnings.append(
                f"{name}: tasks.log ends in {f.torn_tail_bytes} byte(s) without a newline (a "
                "crash mid-append; never acknowledged; the next owner cuts it)"
            )
        if f.stale_records:
            details.append(f"{f.stale_records} stale-epoch record(s) fenced off")
        if f.inbox_waiting_bytes:
            details.append(
                f"{f.inbox_waiting_bytes} byte(s) in {f.inbox_waiting_files} inbox file(s) "
                "not yet ingested"
            )
            if lease == "free":
                warnings.append(
                    f"{name} is free and {f.inbox_waiting_bytes} byte(s) of enqueued tasks wait "
                    "in its inboxes: they run once a daemon owns it"
                )
        handles = handlers.get(owner) if owner is not None and lease != "free" else None
        if handles is not None:
            for task_type, count in sorted(f.live_types.items()):
                if task_type not in handles:
                    warnings.append(
                        f"{name}: {count} live task(s) of type {task_type!r}, but its owner "
                        f"{owner} has no handler for that type: they wait until its SDK "
                        "registers one or a daemon with one owns the shard"
                    )
        shards.append(
            ShardHealth(
                shard=name, status=status, owner=owner, lease_expiry=claim.expiry, lease=lease,
                expires_in_us=None if claim.expiry_us is None or owner is None
                else claim.expiry_us - now_us,
                lease_text=lease_text, epoch=claim.epoch, log_epoch=f.log_epoch,
                epoch_state=epoch_state, lock=lock.state,
                lock_holder=lock.holder() if lock.state == "held" else None,
                directory_exists=f.directory_exists, corrupt_lines=f.corrupt_lines,
                torn_tail_bytes=f.torn_tail_bytes, stale_records=f.stale_records,
                details=details,
            )
        )
    if handlers and all(h is not None for h in handlers.values()):
        handled = set().union(*(h for h in handlers.values() if h is not None))
        for task_type, count in sorted(types.items()):
            if task_type not in handled:
                problems.append(
                    f"no running daemon has a handler for task type {task_type!r} "
                    f"({count} live task(s)): they wait until an SDK registers one"
                )
    for k in facts.orphans:
        problems.append(
            f"orphan directory shard-{k}: the queue has {shard_count} shard(s), so no daemon "
            "reads it (tasks in it are stranded)"
        )
    return HealthReport(
        now_us=now_us, settings=settings, facts=facts, shards=shards, daemons=daemons,
        running=running_count, fair_share=fair, unowned=unowned,
        task_types=dict(sorted(types.items())), problems=problems, warnings=warnings,
    )


def health_json(report: HealthReport) -> dict[str, Any]:
    """The `--json` body after `_queue_json` (documented in docs/operations.md)."""

    def seconds(us: int | None) -> float | None:
        return None if us is None else round(us / SECOND, 3)

    s = report.settings
    return {
        "now": format_rfc3339(report.now_us),
        "settings": {
            "lease_ttl_s": seconds(s.ttl_us),
            "skew_margin_s": seconds(s.skew_margin_us),
            "renew_interval_s": seconds(s.renew_interval_us),
            "overdue_after_s": seconds(s.overdue_us),
        },
        "filesystem": {
            "type": report.facts.filesystem,
            "lock_proves_liveness": report.facts.lock_proves_liveness,
        },
        "per_shard": [
            {
                "shard": h.shard,
                "status": h.status,
                "owner": h.owner,
                "lease_expiry": h.lease_expiry,
                "lease": {
                    "state": h.lease,
                    "expires_in_s": seconds(h.expires_in_us),
                    "text": h.lease_text,
                },
                "epoch": h.epoch,
                "log_epoch": h.log_epoch,
                "epoch_state": h.epoch_state,
                "lock": h.lock,
                "lock_holder": h.lock_holder,
                "directory_exists": h.directory_exists,
                "corrupt_lines": h.corrupt_lines,
                "torn_tail_bytes": h.torn_tail_bytes,
                "stale_records": h.stale_records,
            }
            for h in report.shards
        ],
        "daemons": [
            {
                "node": d.node,
                "shards": d.shards,
                "heartbeat": (
                    None
                    if d.state == "no heartbeat"
                    else {"beat": d.beat, "seen": d.seen, "age_s": seconds(d.seen_age_us)}
                ),
                "state": d.state,
                "running": d.running,
                "above_share": d.above_share,
            }
            for d in report.daemons
        ],
        "daemons_running": report.running,
        "fair_share": report.fair_share,
        "unowned": report.unowned,
        "orphans": [f"shard-{k}" for k in report.facts.orphans],
        "task_types": report.task_types,
        "problems": report.problems,
        "warnings": report.warnings,
        "degraded": report.degraded,
    }


def health_lines(report: HealthReport) -> list[str]:
    """The human report, from `Shards:` to `Status:`."""
    lines = []
    s = report.settings
    lines.append(
        f"Clock: {format_rfc3339(report.now_us)} (lease {s.ttl_us / SECOND:g} s, skew margin "
        f"{s.skew_margin_us / SECOND:g} s, renewal every {s.renew_interval_us / SECOND:g} s)"
    )
    for h in report.shards:
        who = "free" if h.owner is None else f"owner {h.owner}, {h.lease_text}"
        lines.append(f"  {h.shard}: {who}; " + ", ".join(h.details))
    if report.running == 0:
        lines.append("Daemons: no daemon running")
    else:
        lines.append(
            f"Daemons: {report.running} running, fair share {report.fair_share} shard(s) each"
        )
    for d in report.daemons:
        lines.append(f"  {d.text}")
    if report.unowned and report.running:
        lines.append(f"Shards nobody holds: {', '.join(report.unowned)}")
    if report.task_types:
        lines.append(
            "Task types with live tasks: "
            + ", ".join(f"{t} ({n})" for t, n in report.task_types.items())
        )
        lines.append(
            "  (a daemon runs a type only once its SDK has registered a handler for it; "
            "which daemons have, the files do not say)"
        )
    lines.extend(f"Warning: {w}" for w in report.warnings)
    lines.extend(f"Problem: {p}" for p in report.problems)
    lines.append(f"Status: {'DEGRADED' if report.degraded else 'OK'}")
    return lines


def validate_main(argv: Sequence[str]) -> int:
    """`snerdmq validate DIR [--json]`."""
    parser = _parser(
        "validate",
        "Health check of the queue in DIR and the daemons running on it, read from the files "
        "(read-only; the only thing it touches is a non-blocking probe of each shard lock, "
        "released at once). Per shard: owner or free, epoch, the lease judged on this host's "
        "clock (live, within the skew margin, lapsed, unparseable), whether its lock is held, "
        "and the log's last claim epoch against membership.json's. Per daemon (heartbeats "
        "under `nodes`, and claims): shards held, heartbeat age, and the fair share "
        "ceil(shards / running daemons). Also missing and orphan shard directories, corrupt "
        "log lines, and the task types with live tasks.\n"
        "Exit 0: healthy (a queue with no daemon running and nothing claimed is healthy). "
        "Exit 1: degraded: a shard free while daemons run, a lease expired longer ago than "
        "lease + margin + one renewal, a shard claimed by a daemon whose heartbeat is older "
        "than that, an unparseable lease expiry, a missing or orphan shard directory, corrupt "
        "lines, a membership.json that cannot be used (then the shard directories found on "
        "disk are checked). Exit 2: a bad argument or environment value.",
        "SNERD_LEASE_TTL (default 30 s) and SNERD_CLOCK_SKEW_MARGIN (default 5 s) are read as "
        "daemons read them; set them as the daemons have them.",
    )
    parser.add_argument("directory", metavar="DIR", help="queue directory")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    return _run(parser, argv, _validate)


def _health_settings() -> HealthSettings:
    ttl = _env_seconds("SNERD_LEASE_TTL", 30.0, minimum=0.3)
    return HealthSettings(ttl_us=int(ttl * SECOND), skew_margin_us=_skew_margin_us())


def _shard_facts(queue: Queue, shard: int, now_us: int) -> ShardFacts:
    exists = queue.shard_dir(shard).is_dir()
    # What is wrong with the shard's entries; failing to read them only says so when no entry
    # explains it (the same link would be named twice).
    unusable = [problem for _path, problem in _shard_entries(queue, shard)]
    errors = []
    try:
        lock = probe_lock(queue.lock_path(shard)) if exists else LockState("absent")
    except QueueError as exc:
        lock = LockState("refused")
        errors.append(str(exc))
    try:
        scan = scan_shard(queue, shard)
    except QueueError as exc:
        scan = ShardScan(shard=shard, path=queue.log_path(shard), exists=True)
        errors.append(str(exc))
    if not unusable:
        unusable = errors
    return ShardFacts(
        unusable=tuple(unusable),
        shard=shard,
        directory_exists=exists,
        lock=lock,
        log_exists=scan.exists,
        log_epoch=scan.fold.log_epoch,
        corrupt_lines=len(scan.corrupt),
        torn_tail_bytes=0 if scan.tail_records else scan.torn,
        stale_records=len(scan.fold.stale),
        live_types=dict(summarize(scan.fold, now_us).types),
        **_inbox_waiting(queue.directory, shard, scan.fold.inbox),
    )


def _inbox_waiting(directory: Path, shard: int, ingested: dict[str, int]) -> dict[str, int]:
    """Bytes and files of a shard's inboxes not yet ingested (per the log's inbox records)."""
    from snerd.io.inbox import inbox_files

    try:
        rests = [size - ingested.get(name, 0) for name, _, size in inbox_files(directory, shard)]
    except OSError:
        rests = []
    waiting = [rest for rest in rests if rest > 0]
    return {"inbox_waiting_bytes": sum(waiting), "inbox_waiting_files": len(waiting)}


def _validate(args: argparse.Namespace) -> int:
    from snerd.io.fscheck import LOCAL_FILESYSTEMS, MOUNTINFO, filesystem_type

    queue, unusable = open_queue_to_check(args.directory)
    settings = _health_settings()
    mountinfo = os.environ.get("SNERD_TEST_MOUNTINFO", "").strip() or MOUNTINFO
    fs_type = filesystem_type(queue.directory, mountinfo)
    now = _now_us()
    facts = QueueFacts(
        directory=str(args.directory),
        shards=[_shard_facts(queue, shard, now) for shard in range(queue.shards)],
        orphans=sorted(k for k in queue.shard_dirs_on_disk() if k >= queue.shards),
        filesystem=fs_type,
        lock_proves_liveness=fs_type in LOCAL_FILESYSTEMS,
    )
    report = judge_health(
        queue.doc or {}, facts, now_us=now, settings=settings, membership_problem=unusable
    )
    if args.json:
        _print_json({**_queue_json(queue), **health_json(report)})
        return report.exit_code
    print(f"Queue: {queue.name}")
    print(f"Directory: {queue.directory}")
    if queue.legacy:
        print(
            "Layout: upstream SnerdMQ v0.2 (tasks/tasks.log); a snerd daemon adopts it into "
            "shard-0 on its first start"
        )
    print(f"Shards: {queue.shards}")
    print(f"Version: {queue.version if queue.version is not None else '-'}")
    for line in health_lines(report):
        print(line)
    return report.exit_code


# ------------------------------------------------------------------------------------------
# add-shards
# ------------------------------------------------------------------------------------------


def add_shards_main(argv: Sequence[str]) -> int:
    """`snerdmq add-shards N DIR`."""
    parser = _parser(
        "add-shards",
        "Grow the queue in DIR by N shards: under .membership.lock, shards += N, "
        "shard-k/tasks/ created for each new shard, version += 1, membership.json replaced "
        "atomically. Shards are never removed and existing tasks stay where they are. Running "
        f"daemons claim the new shards at their next renewal (within {_RENEW_S} s).",
        "On a directory without membership.json (snerd's addition: upstream refused it), a "
        "queue of N shards is created, and DIR itself if it does not exist. A directory in "
        "the upstream v0.2 layout (tasks/tasks.log) is refused: start a daemon on it once so "
        "it is adopted first.",
    )
    parser.add_argument("n", metavar="N", type=_positive_int("N"), help="shards to add (>= 1)")
    parser.add_argument("directory", metavar="DIR", help="queue directory")
    return _run(parser, argv, _add_shards)


def _add_shards(args: argparse.Namespace) -> int:
    from snerd.io.files import make_dirs
    from snerd.io.log import fsync_dir
    from snerd.io.membership import MembershipConflict, read_membership, update_membership

    directory = Path(args.directory)
    n: int = args.n
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"DIR {args.directory!r} is not a directory")
    created_dir = not directory.exists()
    if created_dir:
        directory.mkdir(parents=True)
        fsync_dir(directory.parent)
    elif (
        not (directory / MEMBERSHIP).exists()
        and (directory / "tasks" / "tasks.log").exists()
    ):
        raise QueueError(
            f"{args.directory} uses the upstream SnerdMQ v0.2 layout (tasks/tasks.log); start "
            f"`snerdmq {args.directory}` once so it is adopted into shard-0, then add shards"
        )
    for _ in range(50):
        try:
            doc = read_membership(directory)
        except MembershipInvalid as exc:
            raise QueueError(str(exc)) from None
        except (ValueError, TypeError) as exc:
            raise QueueError(f"{directory / MEMBERSHIP} is unreadable: {exc}") from None
        except TimeoutError as exc:
            raise QueueError(str(exc)) from None
        if doc is None:
            old, expected = 0, None
            new_doc: dict[str, Any] = {
                "queue": QUEUE_NAME, "shards": n, "version": 1, "claims": {}
            }
        else:
            shards = doc.get("shards")
            if not isinstance(shards, int) or isinstance(shards, bool) or shards < 0:
                raise QueueError(f"{directory / MEMBERSHIP}: 'shards' is {shards!r}")
            version = doc.get("version", 0)
            expected = version if isinstance(version, int) else 0
            old = shards
            new_doc = {**doc, "shards": shards + n, "version": expected + 1}
        if old + n > MAX_QUEUE_SHARDS:
            raise UsageError(
                f"N={n}: the queue has {old} shard(s); {old + n} is more than the "
                f"{MAX_QUEUE_SHARDS} a queue may have"
            )
        made: list[Path] = []
        for k in range(old, old + n):
            tasks = directory / f"shard-{k}" / "tasks"
            if not os.path.lexists(tasks):
                try:  # never through a link below DIR (each new entry fsynced)
                    make_dirs(tasks, root=directory)
                except OSError as exc:
                    _remove_empty(made)
                    raise QueueError(f"cannot create {tasks}: {exc}") from None
                made.append(tasks)
        try:
            update_membership(directory, new_doc, expected)
        except MembershipConflict:
            # A daemon renewed meanwhile (or another add-shards won): read again and redo.
            _remove_empty(made)
            continue
        except TimeoutError as exc:
            _remove_empty(made)
            raise QueueError(str(exc)) from None
        except BaseException:
            _remove_empty(made)
            raise
        what = "Created a new queue with" if doc is None else f"Added {n} shard(s):"
        if doc is None:
            print(f"{what} {n} shard(s) in {directory} (version {new_doc['version']}).")
        else:
            print(
                f"{what} {directory} now has {old + n} shards (shard-{old}..shard-{old + n - 1} "
                f"new), version {new_doc['version']}."
            )
            print(f"Running daemons claim the new shards at their next renewal (within {_RENEW_S} s).")
        return 0
    raise QueueError("membership.json kept changing under us; try again")


def _remove_empty(dirs: list[Path]) -> None:
    for tasks in dirs:
        with contextlib.suppress(OSError):
            tasks.rmdir()
            tasks.parent.rmdir()


# ------------------------------------------------------------------------------------------
# Dead letters (dlq, replay)
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FoundDeadLetter:
    shard: int
    letter: DeadLetter


def find_dead_letters(
    scans: Sequence[ShardScan],
    *,
    task_type: str | None = None,
    ids: Sequence[str] = (),
) -> list[FoundDeadLetter]:
    """Dead letters across shards: a task whose latest record is a dead-letter tombstone and
    which is not live in any shard. When one id finished in several shards (ids reused after
    `add-shards`), the latest `deletedAt` decides."""
    live: set[str] = set()
    for scan in scans:
        live.update(scan.fold.live)
    latest: dict[str, tuple[int, int, LogRecord]] = {}
    for scan in scans:
        for task_id, record in scan.fold.finished.items():
            at = record.fields.get("deletedAt")
            try:
                at_us = parse_rfc3339(at) if isinstance(at, str) else 0
            except ValueError:
                at_us = 0
            if task_id not in latest or at_us >= latest[task_id][0]:
                latest[task_id] = (at_us, scan.shard, record)
    out: list[FoundDeadLetter] = []
    for scan in scans:
        for letter in scan.fold.dead_letters():
            if letter.task_id in live:
                continue
            if latest[letter.task_id][2] is not letter.record:
                continue
            if task_type is not None and letter.task_type != task_type:
                continue
            if ids and letter.task_id not in ids:
                continue
            out.append(FoundDeadLetter(scan.shard, letter))
    out.sort(key=lambda d: (d.letter.at or "", d.shard, d.letter.task_id))
    return out


def dlq_main(argv: Sequence[str]) -> int:
    """`snerdmq dlq DIR [--type T] [--id ID] [--json]`."""
    parser = _parser(
        "dlq",
        "List the dead letters of the queue in DIR: tasks that used every attempt, with their "
        "type, attempts, final error and when. Read-only.",
        "A dead letter is a tombstone snerd wrote with snerdOutcome dead_letter. Tombstones "
        "written by upstream SnerdMQ carry no outcome; those with upstream's dead-letter shape "
        "(LastErrorObj set, retryCount >= maxRetries - 1) are listed marked 'inferred': a task "
        "that succeeded on its last allowed attempt looks the same. A task that is live again "
        "(replayed, re-enqueued) is not listed.",
    )
    parser.add_argument("directory", metavar="DIR", help="queue directory")
    parser.add_argument("--type", dest="task_type", metavar="T", help="only this task type")
    parser.add_argument(
        "--id", dest="ids", metavar="ID", action="append", default=[], help="only this task id "
        "(repeatable)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON (with task data)")
    return _run(parser, argv, _dlq)


def _dlq(args: argparse.Namespace) -> int:
    queue = open_queue(args.directory)
    scans = [scan_shard(queue, s, payloads=args.json) for s in range(queue.shards)]
    found = find_dead_letters(scans, task_type=args.task_type, ids=args.ids)
    if args.json:
        _print_json(
            [
                {
                    "task_id": d.letter.task_id,
                    "task_type": d.letter.task_type,
                    "shard": f"shard-{d.shard}",
                    "attempts": d.letter.attempts,
                    "max_retries": d.letter.record.fields.get("maxRetries"),
                    "error": d.letter.error,
                    "dead_lettered_at": d.letter.at,
                    "inferred": d.letter.inferred,
                    "task_data": d.letter.record.fields.get("taskData"),
                }
                for d in found
            ]
        )
        return 0
    where = f" of type {args.task_type!r}" if args.task_type else ""
    if not found:
        print(f"No dead letters{where} in {queue.directory}.")
        return 0
    print(f"{len(found)} dead letter(s){where} in {queue.directory}:")
    rows = [
        [
            d.letter.task_id + ("*" if d.letter.inferred else ""),
            d.letter.task_type,
            str(d.letter.attempts),
            d.letter.at or "-",
            f"shard-{d.shard}",
            _clip(d.letter.error or "(no error recorded)", 72),
        ]
        for d in found
    ]
    print()
    for line in _table(["id", "type", "attempts", "when", "shard", "final error"], rows, {2}):
        print("  " + line)
    print()
    if any(d.letter.inferred for d in found):
        print(
            "* written by upstream SnerdMQ without an outcome: judged a dead letter by its shape "
            "(its error is the one before the last attempt; a success on the last attempt "
            "looks the same)"
        )
    print(
        f"Put them back with `snerdmq replay{' --type ' + args.task_type if args.task_type else ''}"
        f" {args.directory}` (with every daemon on it stopped); --json shows the task data."
    )
    return 0


def replay_main(argv: Sequence[str]) -> int:
    """`snerdmq replay [--type T | --type=T] [--id ID] [DIR]`."""
    parser = _parser(
        "replay",
        "Put the dead letters of the queue in DIR back into the queue: for each, a fresh task "
        "record (retryCount 0, errors cleared, executeAt now, the same task data) is appended "
        "to its shard's log and fsynced. Only real dead letters are replayed, never tasks that "
        "succeeded. Each shard written is locked first, as a daemon locks it: while a daemon "
        "runs on the queue, replay refuses (exit 1) and names it.",
        "Tombstones from upstream SnerdMQ carry no outcome; those that look like dead letters "
        "are replayed only with --include-upstream (a success on the last attempt looks the "
        "same). A dead letter whose auto_dedupe fingerprint matches a pending task is skipped. "
        "DIR defaults to .snerdata.",
    )
    parser.add_argument("directory", metavar="DIR", nargs="?", default=DEFAULT_DIR,
                        help="queue directory (default: .snerdata)")
    parser.add_argument("--type", dest="task_type", metavar="T", default="all",
                        help="only this task type (default: all)")
    parser.add_argument("--id", dest="ids", metavar="ID", action="append", default=[],
                        help="only this task id (repeatable)")
    parser.add_argument("--include-upstream", action="store_true",
                        help="also replay upstream tombstones that look like dead letters")
    parser.add_argument("--dry-run", action="store_true",
                        help="only list what would be replayed; take no lock, write nothing")
    return _run(parser, argv, _replay)


def _replay_fields(record: LogRecord, *, now: str, epoch: int, node: str) -> dict[str, Any]:
    """A fresh task record from a dead letter's tombstone: same task, attempts and errors reset,
    due now. `taskId` stays the first key (upstream's order; `scan` resynchronises on it)."""
    f = record.fields
    drop = {
        "taskId", "deletedAt", "snerdOutcome", "LastErrorObj", "LastJobError",
        "snerdNode", "snerdEpoch",
    }
    fields: dict[str, Any] = {"taskId": f["taskId"]}
    fields.update((k, v) for k, v in f.items() if k not in drop)
    fields.update(
        {
            "retryCount": 0,
            "retryAfterTime": now,
            "executeAt": now,
            "snerdReplayedAt": now,
            "snerdNode": node,
            "snerdEpoch": epoch,
        }
    )
    return fields


def _replay(args: argparse.Namespace) -> int:
    queue = open_queue(args.directory, allow_legacy=False)
    task_type = None if args.task_type in ("all", "") else args.task_type
    scans = [scan_shard(queue, s, payloads=True) for s in range(queue.shards)]
    found = find_dead_letters(scans, task_type=task_type, ids=args.ids)
    upstream = [d for d in found if d.letter.inferred]
    if not args.include_upstream:
        found = [d for d in found if not d.letter.inferred]
    if args.dry_run:
        for d in found:
            print(f"would replay {d.letter.task_id} ({d.letter.task_type}) in shard-{d.shard}")
        print(f"Dry run: {len(found)} dead letter(s) would be replayed.")
        return 0
    owner = _tool_owner("replay")
    shards = sorted({d.shard for d in found})
    recovered: list[tuple[int, DeadLetter]] = []
    skipped: list[str] = []
    with shard_locks(queue, shards, owner):
        # Read again under the locks: a daemon may have changed the logs before it stopped.
        for shard in shards:
            scans[shard] = scan_shard(queue, shard, payloads=True)
        found = find_dead_letters(scans, task_type=task_type, ids=args.ids)
        if not args.include_upstream:
            found = [d for d in found if not d.letter.inferred]
        pending_hashes: dict[str, str] = {}
        for scan in scans:
            for task_id, record in scan.fold.live.items():
                h = record.fields.get("payloadHash")
                if isinstance(h, str):
                    pending_hashes.setdefault(h, task_id)
        now = format_rfc3339(_now_us())
        batches: dict[int, list[bytes]] = {}
        from snerd.core.records import encode_record

        for d in found:
            if d.shard not in shards:
                continue  # appeared after the first read, in a shard we did not lock
            f = d.letter.record.fields
            h = f.get("payloadHash")
            if f.get("autoDedupe") and isinstance(h, str):
                if h in pending_hashes:
                    skipped.append(
                        f"{d.letter.task_id}: an identical task ({pending_hashes[h]}) is "
                        "pending (auto_dedupe)"
                    )
                    continue
                pending_hashes[h] = d.letter.task_id
            if "taskData" not in f:
                skipped.append(f"{d.letter.task_id}: its tombstone has no taskData")
                continue
            fields = _replay_fields(
                d.letter.record, now=now, epoch=scans[d.shard].fold.log_epoch, node=owner
            )
            batches.setdefault(d.shard, []).append(encode_record(fields))
            recovered.append((d.shard, d.letter))
        if batches:
            _append_batches(queue, batches)
    for shard, letter in recovered:
        print(f"  replayed {letter.task_id} ({letter.task_type}) into shard-{shard}")
    for text in skipped:
        print(f"  skipped {text}")
    if upstream and not args.include_upstream:
        print(
            f"  note: {len(upstream)} upstream tombstone(s) look like dead letters but may be "
            "successes on their last attempt; --include-upstream replays them too"
        )
    print(f"Replay complete. Recovered {len(recovered)} failed task(s) into the active queue.")
    return 0


def _append_batches(queue: Queue, batches: dict[int, list[bytes]]) -> None:
    """Append each shard's lines durably (caller holds the shard locks): the last line is
    repaired first (a torn write cut, a lost newline written back), so no line is glued onto
    it; then one write and one fsync per shard. No file is reached through a link."""
    import trio

    from snerd.io.log import GroupCommitLog, recover_log

    try:
        for shard in batches:
            recover_log(queue.log_path(shard), root=queue.directory)
    except OSError as exc:
        raise QueueError(f"could not prepare the shard logs: {exc}") from None

    async def append_all() -> None:
        async with GroupCommitLog("always", root=queue.directory) as log:
            for shard, lines in batches.items():
                await log.append(queue.log_path(shard), lines)

    try:
        trio.run(append_all)
    except OSError as exc:
        raise QueueError(f"could not append to the shard logs: {exc}") from None


# ------------------------------------------------------------------------------------------
# fsck
# ------------------------------------------------------------------------------------------

#: Leftover temp files a crash can leave in `shard-N/tasks/`: snerd's and upstream's
#: compaction output (`tasks.tmp`), and `tasks.log.tmp` from an atomic replace of the log.
_TEMP_NAMES = ("tasks.tmp", "tasks.log.tmp")
#: Corrupt lines printed per shard (all of them with --json).
_SHOW_CORRUPT = 20


def fsck_main(argv: Sequence[str]) -> int:
    """`snerdmq fsck DIR [--repair] [--json]`."""
    parser = _parser(
        "fsck",
        "Check every shard log of the queue in DIR: records, corrupt lines (offset and reason), "
        "the last line when it lacks its newline (a whole record that lost it, which is kept, "
        "or a torn write), records fenced off as stale (an older owner's writes after a "
        "takeover: expected, reported for information), task ids live in two shards, "
        "leftover temp files, and every entry snerd uses that is a symbolic link or not the "
        "kind of file it should be (a FIFO, socket, device, a directory where a file belongs): "
        "snerd refuses those. Exit 1 when a problem remains.\n"
        "--repair, shard by shard and only where no daemon holds the shard lock, writes back "
        "the newline a whole last record lost, cuts torn tails and removes leftover temp files. "
        "Corrupt lines are never rewritten here: daemons skip them, and `snerdmq compact` "
        "drops them. Symbolic links and odd files are never touched: replace them with the "
        "file snerd expects.",
    )
    parser.add_argument("directory", metavar="DIR", help="queue directory")
    parser.add_argument("--repair", action="store_true",
                        help="repair last lines and remove temp files on idle shards")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    return _run(parser, argv, _fsck)


@dataclass(slots=True)
class _FsckShard:
    scan: ShardScan
    lock: LockState
    temps: list[tuple[str, int]]
    #: Entries snerd refuses: (path, what is wrong).
    entries: list[tuple[str, str]] = field(default_factory=list)
    #: Why the log could not be read at all (then `scan` is empty).
    error: str | None = None
    repaired: list[str] = field(default_factory=list)
    not_repaired: list[str] = field(default_factory=list)


def _entry_problem(path: Path, want_dir: bool) -> str | None:
    """What is wrong with the entry `path` for snerd, or None (fine, or absent). Read with
    lstat(2): a link is reported, never followed."""
    import stat

    from snerd.io.files import describe_kind

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


def _queue_entries(queue: Queue) -> list[tuple[str, str]]:
    """Problems with the entries of DIR itself that snerd uses (membership.json and its
    temp file, `.membership.lock`, `.lockprobe`)."""
    found = []
    for name in (MEMBERSHIP, MEMBERSHIP + ".tmp", ".membership.lock", ".lockprobe"):
        problem = _entry_problem(queue.directory / name, False)
        if problem is not None:
            found.append((str(queue.directory / name), problem))
    return found


def _shard_entries(queue: Queue, shard: int) -> list[tuple[str, str]]:
    """Problems with the entries of one shard that snerd uses: its directory, `.lock`,
    `tasks/` and what it holds, `inbox/` and every file in it."""
    base = queue.shard_dir(shard)
    tasks = queue.log_path(shard).parent
    checks: list[tuple[Path, bool]] = []
    if not queue.legacy:
        checks.append((base, True))
    checks += [(queue.lock_path(shard), False), (tasks, True)]
    checks += [(tasks / name, False) for name in ("tasks.log", "rate_limits.json", *_TEMP_NAMES)]
    found: list[tuple[str, str]] = []
    for path, want_dir in checks:
        problem = _entry_problem(path, want_dir)
        if problem is not None:
            found.append((str(path), problem))
            if path in (base, tasks):
                break  # nothing below a refused directory is looked at (or used)
    else:
        if not queue.legacy:
            inbox = base / "inbox"
            problem = _entry_problem(inbox, True)
            if problem is not None:
                found.append((str(inbox), problem))
            else:
                with contextlib.suppress(OSError):
                    for entry in sorted(os.scandir(inbox), key=lambda e: e.name):
                        problem = _entry_problem(Path(entry.path), False)
                        if problem is not None:
                            found.append((entry.path, problem))
    return found


def _fsck_shard(queue: Queue, shard: int) -> _FsckShard:
    import stat

    tasks = queue.log_path(shard).parent
    entries = _shard_entries(queue, shard)
    temps = []
    for name in _TEMP_NAMES:
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            st = os.lstat(tasks / name)
            if not stat.S_ISDIR(st.st_mode):
                temps.append((name, st.st_size))
    error = None
    try:
        lock = probe_lock(queue.lock_path(shard))
    except QueueError as exc:
        lock, error = LockState("refused"), str(exc)
    try:
        scan = scan_shard(queue, shard)
    except QueueError as exc:
        path = queue.log_path(shard)
        scan = ShardScan(shard=shard, path=path, exists=True, root=queue.directory)
        error = str(exc) if error is None else f"{error}; {exc}"
    return _FsckShard(scan=scan, lock=lock, temps=temps, entries=entries, error=error)


def _tail_text(scan: ShardScan) -> str:
    """How an unterminated last line reads in the report (call when `scan.torn`)."""
    if scan.tail_records:
        return (
            f"the last record (at byte {scan.torn_at}, {scan.torn} byte(s)) lacks its newline: "
            "it is a whole record, so it is kept; its owner writes the newline back when it "
            "loads the shard"
        )
    return f"torn tail: {scan.torn} byte(s) without a newline at byte {scan.torn_at}"


def _fsck(args: argparse.Namespace) -> int:
    queue, unusable = open_queue_to_check(args.directory)
    top = _queue_entries(queue)
    if unusable is not None and not any(p == str(queue.directory / MEMBERSHIP) for p, _ in top):
        top.insert(
            0,
            (
                str(queue.directory / MEMBERSHIP),
                f"{unusable}: {_UNUSABLE_MEANS} (the shard directories found on disk are "
                "checked below)",
            ),
        )
    shards = [_fsck_shard(queue, s) for s in range(queue.shards)]
    if args.repair:
        for item in shards:
            if not (item.scan.torn or item.temps) or item.error is not None:
                continue
            shard = item.scan.shard
            if queue.legacy:
                item.not_repaired.append(
                    "upstream v0.2 layout: a snerd daemon repairs it when it adopts it"
                )
                continue
            try:
                with shard_locks(queue, [shard], _tool_owner("fsck")):
                    item.repaired.extend(_repair_shard(queue, shard))
            except QueueError:
                item.not_repaired.append(
                    f"held by a daemon ({item.lock.holder()}); a daemon repairs the last line "
                    "and removes temp files itself when it loads a shard"
                )
            except OSError as exc:
                item.not_repaired.append(f"could not repair it: {exc}")
        repaired = shards
        shards = [_fsck_shard(queue, s.scan.shard) for s in repaired]
        for new, old in zip(shards, repaired, strict=True):
            new.repaired, new.not_repaired = old.repaired, old.not_repaired
    live_in: dict[str, list[int]] = {}
    for item in shards:
        for task_id in item.scan.fold.live:
            live_in.setdefault(task_id, []).append(item.scan.shard)
    duplicates = {t: s for t, s in live_in.items() if len(s) > 1}
    problems = len(top)
    report: list[dict[str, Any]] = []
    lines: list[str] = [problem for _path, problem in top]
    for item in shards:
        scan = item.scan
        name = f"shard-{scan.shard}"
        # An unterminated last line in a log a daemon holds may be an append in progress.
        tail_problem = bool(scan.torn) and item.lock.state != "held"
        # Live tasks whose record they cannot run with (`snerd.core.records.task_problem`).
        unrunnable = scan.fold.unrunnable()
        shard_problems = (
            len(scan.corrupt)
            + len(unrunnable)
            + int(tail_problem)
            + len(item.temps)
            + len(item.entries)
            + int(item.error is not None and not item.entries)
        )
        problems += shard_problems
        kept = scan.torn and scan.tail_records
        report.append(
            {
                "shard": name,
                "log": str(scan.path),
                "exists": scan.exists,
                "bytes": scan.size,
                "records": scan.fold.records,
                "corrupt": [{"offset": o, "reason": r} for o, r in scan.corrupt],
                "unrunnable": [
                    {"offset": r.offset, "task_id": r.fields["taskId"], "reason": why}
                    for r, why in unrunnable
                ],
                "torn_tail": (
                    {"offset": scan.torn_at, "bytes": scan.torn}
                    if scan.torn and not kept
                    else None
                ),
                "unterminated_record": (
                    {"offset": scan.torn_at, "bytes": scan.torn} if kept else None
                ),
                "stale": [
                    {"offset": s.offset, "epoch": s.epoch, "fence": s.fence, "kind": s.kind}
                    for s in scan.fold.stale
                ],
                "temp_files": [{"name": n, "bytes": b} for n, b in item.temps],
                "refused_entries": [{"path": p, "problem": t} for p, t in item.entries],
                "error": item.error,
                "lock": item.lock.state,
                "lock_holder": item.lock.holder() if item.lock.state == "held" else None,
                "repaired": item.repaired,
                "not_repaired": item.not_repaired,
                "problems": shard_problems,
            }
        )
        if item.entries:
            lines.append(f"{name}: cannot be used:")  # the entries below say why
        elif item.error is not None:
            lines.append(f"{name}: cannot be used: {item.error}")
        elif not scan.exists:
            lines.append(f"{name}: no tasks.log (nothing written yet)")
        else:
            lock = f", lock held by {item.lock.holder()}" if item.lock.state == "held" else ""
            lines.append(
                f"{name}: {scan.fold.records} record(s), {_fmt_bytes(scan.size)}{lock}"
                + ("" if shard_problems else ", OK")
            )
        for _path, problem in item.entries:
            lines.append(f"  {problem}")
        for offset, reason in scan.corrupt[:_SHOW_CORRUPT]:
            lines.append(f"  corrupt line at byte {offset}: {reason}")
        if len(scan.corrupt) > _SHOW_CORRUPT:
            lines.append(f"  ... and {len(scan.corrupt) - _SHOW_CORRUPT} more (--json lists all)")
        for record, why in unrunnable[:_SHOW_CORRUPT]:
            lines.append(
                f"  {why} (at byte {record.offset}): a daemon dead-letters it when it loads "
                "the shard"
            )
        if len(unrunnable) > _SHOW_CORRUPT:
            lines.append(f"  ... and {len(unrunnable) - _SHOW_CORRUPT} more (--json lists all)")
        if scan.torn:
            why = ""
            if item.lock.state == "held":
                why = " (a daemon holds the lock: maybe an append in progress)"
            elif not scan.tail_records:
                why = " (a crash mid-append: no whole record in it, never acknowledged)"
            lines.append(f"  {_tail_text(scan)}{why}")
        if scan.fold.stale:
            first = scan.fold.stale[0]
            lines.append(
                f"  {len(scan.fold.stale)} stale-epoch record(s) fenced off, ignored as the "
                f"daemon ignores them (first at byte {first.offset}: epoch {first.epoch} < "
                f"{first.fence}); not a problem"
            )
        for tmp, size in item.temps:
            lines.append(f"  leftover temp file {tmp} ({_fmt_bytes(size)}) from an interrupted "
                         "compaction; the log itself is intact")
        for text in item.repaired:
            lines.append(f"  repaired: {text}")
        for text in item.not_repaired:
            lines.append(f"  not repaired: {text}")
    for task_id, where in sorted(duplicates.items()):
        problems += 1
        lines.append(
            f"task {task_id} is live in {', '.join(f'shard-{s}' for s in where)}: a daemon "
            "keeps only one of them (the first shard it loads)"
        )
    if args.json:
        _print_json(
            {
                "directory": str(queue.directory),
                "refused_entries": [{"path": p, "problem": t} for p, t in top],
                "shards": report,
                "duplicate_live_ids": {t: [f"shard-{s}" for s in w] for t, w in duplicates.items()},
                "problems": problems,
            }
        )
        return 1 if problems else 0
    for line in lines:
        print(line)
    if problems:
        hint = (
            ""
            if args.repair
            else f"; `snerdmq fsck --repair {args.directory}` repairs last lines and removes "
            "temp files"
        )
        print(f"fsck: {problems} problem(s){hint}.")
        if any(item.scan.corrupt for item in shards):
            print(
                "Corrupt lines are skipped by daemons and never hide the lines after them; "
                f"`snerdmq compact {args.directory}` drops them."
            )
        return 1
    print("fsck: no problems.")
    return 0


def _repair_shard(queue: Queue, shard: int) -> list[str]:
    """Remove temp files and repair the last line (caller holds the shard lock): write back the
    newline a whole record lost, or cut a torn write (`snerd.io.log.repair_tail`)."""
    from snerd.io.files import unlink_file
    from snerd.io.log import fsync_dir, repair_tail

    done = []
    tasks = queue.log_path(shard).parent
    for name in _TEMP_NAMES:
        try:
            unlink_file(tasks / name, root=queue.directory)  # a link: the link itself
        except FileNotFoundError:
            continue
        fsync_dir(tasks)
        done.append(f"removed {name}")
    repair = repair_tail(queue.log_path(shard), root=queue.directory)
    if repair.restored:
        done.append(f"wrote back the newline of the whole last record at byte {repair.at}")
    elif repair.cut:
        why = f" ({repair.reason})" if repair.reason else ""
        done.append(f"cut a torn tail of {repair.cut} byte(s) at byte {repair.at}{why}")
    return done


# ------------------------------------------------------------------------------------------
# compact
# ------------------------------------------------------------------------------------------


def compact_main(argv: Sequence[str]) -> int:
    """`snerdmq compact DIR [--history N]`."""
    parser = _parser(
        "compact",
        "Compact the shard logs of the queue in DIR that no daemon holds (each is locked "
        "first, as a daemon locks it). Kept: the latest record of each live task, its "
        "unresolved dispatch record, the latest claim record (and the one that set the fence), "
        "dispatch records of the last 60 s (rate windows), and the latest --history finished "
        "or dead-lettered tasks. Written to a temp file, fsynced, renamed over tasks.log, "
        "directory fsynced: a crash at any point loses nothing.\n"
        "Exit 1 when a shard was skipped (held by a daemon: daemons compact their own logs) "
        "or failed.",
    )
    parser.add_argument("directory", metavar="DIR", help="queue directory")
    parser.add_argument(
        "--history", type=_nonnegative_int("--history"), default=HISTORY_LIMIT, metavar="N",
        help=f"finished tasks to keep per shard (default {HISTORY_LIMIT})",
    )
    return _run(parser, argv, _compact)


def _compact(args: argparse.Namespace) -> int:
    import trio

    from snerd.io.log import GroupCommitLog

    queue = open_queue(args.directory, allow_legacy=False)
    owner = _tool_owner("compact")
    failed = 0
    total_before = total_after = 0
    for shard in range(queue.shards):
        name = f"shard-{shard}"
        path = queue.log_path(shard)
        if not os.path.lexists(path):
            print(f"{name}: no tasks.log, nothing to compact")
            continue
        try:
            with shard_locks(queue, [shard], owner):
                repaired = _recover_for_compaction(queue, shard)
                scan = scan_shard(queue, shard)
                now = _now_us()
                keep = scan.fold.keep_ranges(now, history_limit=args.history)
                kept_bytes = sum(r.length for r in keep)
                total_before += scan.size
                if kept_bytes == scan.size:
                    total_after += scan.size
                    print(f"{name}: {_fmt_bytes(scan.size)}, already compact")
                    continue
                # Check the plan before touching the file: folding only the kept records must
                # give the same shard.
                planned = scan_shard(queue, shard, only={r.offset for r in keep})
                _check_same(scan.fold, planned.fold, name, "planned")

                async def run(path: Path = path, keep: Any = keep) -> int:
                    async with GroupCommitLog("always", root=queue.directory) as log:
                        result = await log.compact(path, keep)
                    return result.size

                try:
                    size = trio.run(run)
                except (OSError, ValueError) as exc:
                    failed += 1
                    total_after += scan.size
                    print(f"{name}: compaction failed, log unchanged: {exc}")
                    continue
                after = scan_shard(queue, shard)
                _check_same(scan.fold, after.fold, name, "written")
                total_after += size
                dropped = len(scan.corrupt)
                extra = f"; dropped {dropped} corrupt line(s)" if dropped else ""
                extra += f"; {repaired}" if repaired else ""
                print(
                    f"{name}: {_fmt_bytes(scan.size)} -> {_fmt_bytes(size)} "
                    f"({scan.fold.records} -> {after.fold.records} records: "
                    f"{len(after.fold.live)} live, {len(after.fold.finished)} finished kept){extra}"
                )
        except QueueError as exc:
            failed += 1
            print(f"{name}: skipped: {exc}")
    print(f"Total: {_fmt_bytes(total_before)} -> {_fmt_bytes(total_after)}")
    return 1 if failed else 0


def _recover_for_compaction(queue: Queue, shard: int) -> str:
    """Before compacting (lock held): remove a leftover temp file and repair the last line as
    a daemon loading the shard would, so every record kept is a whole line. Returns what was
    done, for the report ("" when nothing)."""
    from snerd.io.log import recover_log

    try:
        repair = recover_log(queue.log_path(shard), root=queue.directory)
    except OSError as exc:
        raise QueueError(f"cannot prepare tasks.log: {exc}") from None
    if repair.restored:
        return f"wrote back the newline of the whole last record at byte {repair.at}"
    if repair.cut:
        return f"dropped a torn tail of {repair.cut} byte(s)"
    return ""


def _check_same(before: ShardFold, after: ShardFold, name: str, stage: str) -> None:
    """The compacted log must hold the same shard: live tasks (records equal), in-flight
    attempts, fence. Anything else is a bug: stop loudly."""
    same = (
        {k: r.fields for k, r in before.live.items()} == {k: r.fields for k, r in after.live.items()}
        and before.in_flight() == after.in_flight()
        and before.log_epoch == after.log_epoch
    )
    if not same:
        raise QueueError(
            f"{name}: the {stage} compacted log does not fold to the same live tasks; this is "
            "a bug in snerd, please report it (the original log is "
            + ("untouched)" if stage == "planned" else "replaced; keep a copy of the directory)")
        )


# ------------------------------------------------------------------------------------------
# demo
# ------------------------------------------------------------------------------------------


def demo_main(argv: Sequence[str]) -> int:
    """`snerdmq demo [DIR]` (see `snerd.demo`)."""
    from snerd.demo import main

    return main(argv)


def dashboard_main(argv: Sequence[str]) -> int:
    """`snerdmq dashboard DIR` (see `snerd.dashboard`)."""
    from snerd.dashboard.serve import dashboard_main as main

    return main(argv)


SUBCOMMANDS: dict[str, Callable[[Sequence[str]], int]] = {
    "stats": stats_main,
    "validate": validate_main,
    "add-shards": add_shards_main,
    "dlq": dlq_main,
    "replay": replay_main,
    "fsck": fsck_main,
    "compact": compact_main,
    "demo": demo_main,
    "dashboard": dashboard_main,
}
