"""`snerdmq compact DIR [--history N]`: offline compaction of the shards no daemon holds.

What a compacted log keeps is the fold's rule (`snerd.core.shardlog.ShardFold.keep_ranges`,
the daemon's own); the plan is checked before the file is touched (folding only the kept
records must give the same shard) and the result after, and the file is written the daemon's
way (`GroupCommitLog.compact`: temp file, fsync, rename, directory fsync), each shard's lock
held throughout.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from snerd.cli.args import QueueError, command_parser, nonnegative_int, run_command, tool_settings
from snerd.cli.text import fmt_bytes
from snerd.core.ownership import shard_name
from snerd.core.shardlog import HISTORY_LIMIT, ShardFold
from snerd.io.log import GroupCommitLog, recover_log
from snerd.queuedir import Queue, open_queue, scan_shard, shard_locks, tool_owner, wall_now_us

__all__ = ["main"]


def main(argv: Sequence[str]) -> int:
    """`snerdmq compact DIR [--history N]`."""
    parser = command_parser(
        "compact",
        "Compact the shard logs of the queue in DIR that no daemon holds (each is locked "
        "first, as a daemon locks it). Kept: the latest record of each live task, its "
        "unresolved dispatch record, the latest claim record (and the one that set the fence), "
        "dispatch records of the last 60 s (rate windows), and the latest --history finished "
        "or dead-lettered tasks (a completed one only while younger than "
        "SNERD_RESULT_RETENTION_SECONDS, as a daemon keeps them). Written to a temp file, "
        "fsynced, renamed over tasks.log, directory fsynced: a crash at any point loses "
        "nothing.\n"
        "Exit 1 when a shard was skipped (held by a daemon: daemons compact their own logs) "
        "or failed.",
    )
    parser.add_argument("directory", metavar="DIR", help="queue directory")
    parser.add_argument(
        "--history", type=nonnegative_int("--history"), default=HISTORY_LIMIT, metavar="N",
        help=f"finished tasks to keep per shard (default {HISTORY_LIMIT})",
    )
    return run_command(parser, argv, _compact)


def _compact(args: argparse.Namespace) -> int:
    queue = open_queue(args.directory, allow_legacy=False)
    owner = tool_owner("compact")
    settings = tool_settings()
    failed = 0
    total_before = total_after = 0
    for shard in range(queue.shards):
        name = shard_name(shard)
        path = queue.log_path(shard)
        if not os.path.lexists(path):
            print(f"{name}: no tasks.log, nothing to compact")
            continue
        try:
            with shard_locks(queue, [shard], owner):
                repaired = _recover_for_compaction(queue, shard)
                scan = scan_shard(queue, shard)
                now = wall_now_us(settings)
                keep = scan.fold.keep_ranges(
                    now, history_limit=args.history, retention_us=settings.result_retention_us
                )
                kept_bytes = sum(r.length for r in keep)
                total_before += scan.size
                if kept_bytes == scan.size:
                    total_after += scan.size
                    print(f"{name}: {fmt_bytes(scan.size)}, already compact")
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
                    f"{name}: {fmt_bytes(scan.size)} -> {fmt_bytes(size)} "
                    f"({scan.fold.records} -> {after.fold.records} records: "
                    f"{len(after.fold.live)} live, {len(after.fold.finished)} finished kept){extra}"
                )
        except QueueError as exc:
            failed += 1
            print(f"{name}: skipped: {exc}")
    print(f"Total: {fmt_bytes(total_before)} -> {fmt_bytes(total_after)}")
    return 1 if failed else 0


def _recover_for_compaction(queue: Queue, shard: int) -> str:
    """Before compacting (lock held): remove a leftover temp file and repair the last line as
    a daemon loading the shard would, so every record kept is a whole line. Returns what was
    done, for the report ("" when nothing)."""
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
