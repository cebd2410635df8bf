"""`snerdmq fsck DIR [--repair] [--json]`: check every shard log of a queue, byte by byte.

It reports what the queue reader finds (`snerd.queuedir`: corrupt lines, a last line without
its newline, stale-epoch records, leftover temp files, entries snerd refuses, task ids live in
two shards) and, with `--repair`, fixes the last line and removes temp files in each shard no
daemon holds (its lock taken first, as a daemon takes it). Corrupt lines are never rewritten:
daemons skip them, and `snerdmq compact` drops them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from snerd.cli.args import QueueError, command_parser, run_command
from snerd.cli.text import fmt_bytes, print_json
from snerd.core.health import UNUSABLE_MEANS, LockState
from snerd.core.ownership import shard_name
from snerd.core.schema import TASK_ID
from snerd.io.files import unlink_file
from snerd.io.log import fsync_dir, repair_tail
from snerd.queuedir import (
    MEMBERSHIP,
    TEMP_NAMES,
    Queue,
    ShardScan,
    open_queue_to_check,
    probe_lock,
    queue_entries,
    scan_shard,
    shard_entries,
    shard_locks,
    tool_owner,
)

__all__ = ["main"]

#: Corrupt lines printed per shard (all of them with --json).
_SHOW_CORRUPT = 20


def main(argv: Sequence[str]) -> int:
    """`snerdmq fsck DIR [--repair] [--json]`."""
    parser = command_parser(
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
    return run_command(parser, argv, _fsck)


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


def _fsck_shard(queue: Queue, shard: int) -> _FsckShard:
    tasks = queue.log_path(shard).parent
    entries = shard_entries(queue, shard)
    temps = []
    for name in TEMP_NAMES:
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
    top = _top_entries(queue, unusable)
    shards = [_fsck_shard(queue, s) for s in range(queue.shards)]
    if args.repair:
        shards = _repair(queue, shards)
    duplicates = _live_in_several(shards)
    problems = len(top) + len(duplicates)
    report: list[dict[str, Any]] = []
    lines: list[str] = [problem for _path, problem in top]
    for item in shards:
        shard_problems = _problems(item)
        problems += shard_problems
        report.append(_shard_json(item, shard_problems))
        lines.extend(_shard_lines(item, shard_problems))
    for task_id, where in sorted(duplicates.items()):
        lines.append(
            f"task {task_id} is live in {', '.join(shard_name(s) for s in where)}: a daemon "
            "keeps only one of them (the first shard it loads)"
        )
    if args.json:
        print_json(
            {
                "directory": str(queue.directory),
                "refused_entries": [{"path": p, "problem": t} for p, t in top],
                "shards": report,
                "duplicate_live_ids": {t: [shard_name(s) for s in w] for t, w in duplicates.items()},
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


def _top_entries(queue: Queue, unusable: str | None) -> list[tuple[str, str]]:
    """The problems with DIR's own entries, an unusable membership.json first."""
    top = queue_entries(queue)
    if unusable is not None and not any(p == str(queue.directory / MEMBERSHIP) for p, _ in top):
        top.insert(
            0,
            (
                str(queue.directory / MEMBERSHIP),
                f"{unusable}: {UNUSABLE_MEANS} (the shard directories found on disk are "
                "checked below)",
            ),
        )
    return top


def _repair(queue: Queue, shards: list[_FsckShard]) -> list[_FsckShard]:
    """`--repair`: repair each shard that needs it and no daemon holds; the shards read again,
    each with what was and was not repaired."""
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
            with shard_locks(queue, [shard], tool_owner("fsck")):
                item.repaired.extend(_repair_shard(queue, shard))
        except QueueError:
            item.not_repaired.append(
                f"held by a daemon ({item.lock.holder()}); a daemon repairs the last line "
                "and removes temp files itself when it loads a shard"
            )
        except OSError as exc:
            item.not_repaired.append(f"could not repair it: {exc}")
    again = [_fsck_shard(queue, s.scan.shard) for s in shards]
    for new, old in zip(again, shards, strict=True):
        new.repaired, new.not_repaired = old.repaired, old.not_repaired
    return again


def _live_in_several(shards: list[_FsckShard]) -> dict[str, list[int]]:
    """Task ids live in more than one shard, with those shards."""
    live_in: dict[str, list[int]] = {}
    for item in shards:
        for task_id in item.scan.fold.live:
            live_in.setdefault(task_id, []).append(item.scan.shard)
    return {t: s for t, s in live_in.items() if len(s) > 1}


def _problems(item: _FsckShard) -> int:
    """How many problems a shard has (stale records are none)."""
    scan = item.scan
    # An unterminated last line in a log a daemon holds may be an append in progress.
    tail_problem = bool(scan.torn) and item.lock.state != "held"
    return (
        len(scan.corrupt)
        # Live tasks whose record they cannot run with (`snerd.core.records.task_problem`).
        + len(scan.fold.unrunnable())
        + int(tail_problem)
        + len(item.temps)
        + len(item.entries)
        + int(item.error is not None and not item.entries)
    )


def _shard_json(item: _FsckShard, problems: int) -> dict[str, Any]:
    """A shard's entry in `--json`'s `shards`."""
    scan = item.scan
    kept = scan.torn and scan.tail_records
    return {
        "shard": shard_name(scan.shard),
        "log": str(scan.path),
        "exists": scan.exists,
        "bytes": scan.size,
        "records": scan.fold.records,
        "corrupt": [{"offset": o, "reason": r} for o, r in scan.corrupt],
        "unrunnable": [
            {"offset": r.offset, "task_id": r.fields[TASK_ID], "reason": why}
            for r, why in scan.fold.unrunnable()
        ],
        "torn_tail": (
            {"offset": scan.torn_at, "bytes": scan.torn} if scan.torn and not kept else None
        ),
        "unterminated_record": ({"offset": scan.torn_at, "bytes": scan.torn} if kept else None),
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
        "problems": problems,
    }


def _shard_lines(item: _FsckShard, problems: int) -> list[str]:
    """A shard's lines in the human report."""
    scan = item.scan
    name = shard_name(scan.shard)
    unrunnable = scan.fold.unrunnable()
    lines = []
    if item.entries:
        lines.append(f"{name}: cannot be used:")  # the entries below say why
    elif item.error is not None:
        lines.append(f"{name}: cannot be used: {item.error}")
    elif not scan.exists:
        lines.append(f"{name}: no tasks.log (nothing written yet)")
    else:
        lock = f", lock held by {item.lock.holder()}" if item.lock.state == "held" else ""
        lines.append(
            f"{name}: {scan.fold.records} record(s), {fmt_bytes(scan.size)}{lock}"
            + ("" if problems else ", OK")
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
        lines.append(f"  leftover temp file {tmp} ({fmt_bytes(size)}) from an interrupted "
                     "compaction; the log itself is intact")
    lines.extend(f"  repaired: {text}" for text in item.repaired)
    lines.extend(f"  not repaired: {text}" for text in item.not_repaired)
    return lines


def _repair_shard(queue: Queue, shard: int) -> list[str]:
    """Remove temp files and repair the last line (caller holds the shard lock): write back the
    newline a whole record lost, or cut a torn write (`snerd.io.log.repair_tail`)."""
    done = []
    tasks = queue.log_path(shard).parent
    for name in TEMP_NAMES:
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
