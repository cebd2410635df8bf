"""`snerdmq dlq DIR` and `snerdmq replay DIR`: list dead letters, and put them back.

Which dead letters count, which of them a replay writes back and what it writes are the core's
rules (`snerd.core.shardlog.find_dead_letters`, `plan_replay`, `replay_record`); this module
reads the shards, takes the locks of those it writes (as a daemon does), appends durably and
prints. A replayed task goes back into the shard it died in. A shard a daemon holds is never
written: it is sent one retry of the type's dead letters (`snerd.commands.retry_dead`; its
daemon puts back each one it holds, by the same rule, and answers how many), or, for a replay
by `--id` (or one that leaves out upstream look-alikes a daemon would take too), one `retry`
command per dead letter, through the shard's inbox, each answer printed.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import trio

from snerd import commands
from snerd.cli.args import (
    DEFAULT_DIR,
    EXIT_PENDING,
    QueueError,
    command_parser,
    run_command,
    tool_settings,
)
from snerd.cli.cancel import add_wait, pending_text
from snerd.cli.text import clip, format_table, print_json
from snerd.core.ownership import shard_name
from snerd.core.records import encode_record
from snerd.core.schema import MAX_RETRIES, TASK_DATA
from snerd.core.shardlog import (
    DeadLetter,
    FoundDeadLetter,
    ShardFold,
    find_dead_letters,
    plan_replay,
    replay_record,
)
from snerd.core.timefmt import format_rfc3339
from snerd.io.log import GroupCommitLog, recover_log
from snerd.queuedir import (
    Queue,
    ShardScan,
    open_queue,
    probe_lock,
    scan_shard,
    shard_locks,
    tool_owner,
    wall_now_us,
)

__all__ = ["append_batches", "main", "replay_main"]


def folds(scans: Sequence[ShardScan]) -> dict[int, ShardFold]:
    """Each scan's fold, by shard (what the core's cross-shard rules read)."""
    return {scan.shard: scan.fold for scan in scans}


def main(argv: Sequence[str]) -> int:
    """`snerdmq dlq DIR [--type T] [--id ID] [--json]`."""
    parser = command_parser(
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
    return run_command(parser, argv, _dlq)


def _dlq(args: argparse.Namespace) -> int:
    queue = open_queue(args.directory)
    scans = [scan_shard(queue, s, payloads=args.json) for s in range(queue.shards)]
    found = find_dead_letters(folds(scans), task_type=args.task_type, ids=args.ids)
    if args.json:
        print_json(
            [
                {
                    "task_id": d.letter.task_id,
                    "task_type": d.letter.task_type,
                    "shard": shard_name(d.shard),
                    "attempts": d.letter.attempts,
                    "max_retries": d.letter.record.fields.get(MAX_RETRIES),
                    "error": d.letter.error,
                    "dead_lettered_at": d.letter.at,
                    "inferred": d.letter.inferred,
                    "task_data": d.letter.record.fields.get(TASK_DATA),
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
            shard_name(d.shard),
            clip(d.letter.error or "(no error recorded)", 72),
        ]
        for d in found
    ]
    print()
    for line in format_table(["id", "type", "attempts", "when", "shard", "final error"], rows, {2}):
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
        f" {args.directory}` (a daemon holding a shard puts its own back), or forget them with "
        f"`snerdmq purge {args.directory} {'--type ' + args.task_type if args.task_type else '--all'}"
        "`; --json shows the task data."
    )
    return 0


def replay_main(argv: Sequence[str]) -> int:
    """`snerdmq replay [--type T | --type=T] [--id ID] [DIR]`."""
    parser = command_parser(
        "replay",
        "Put the dead letters of the queue in DIR back into the queue: for each, a fresh task "
        "record (retryCount 0, errors cleared, executeAt now, the same task data) is appended "
        "to its shard's log and fsynced. Only real dead letters are replayed, never tasks that "
        "succeeded. Each shard written is locked first, as a daemon locks it. A dead letter in "
        "a shard a daemon holds is put back by that daemon instead: one retry of the type's "
        "dead letters per shard (with --id, one `snerdmq retry` per dead letter), through "
        "the shard's inbox, and its answer printed; exit 4 when one is still pending after "
        "--wait.",
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
    add_wait(parser, json=False)
    return run_command(parser, argv, _replay)


def _replay(args: argparse.Namespace) -> int:
    queue = open_queue(args.directory, allow_legacy=False)
    task_type = None if args.task_type in ("all", "") else args.task_type
    scans = [scan_shard(queue, s, payloads=True) for s in range(queue.shards)]
    found = find_dead_letters(folds(scans), task_type=task_type, ids=args.ids)
    upstream = [d for d in found if d.letter.inferred]
    if not args.include_upstream:
        found = [d for d in found if not d.letter.inferred]
    if args.dry_run:
        for d in found:
            print(f"would replay {d.letter.task_id} ({d.letter.task_type}) in {shard_name(d.shard)}")
        print(f"Dry run: {len(found)} dead letter(s) would be replayed.")
        return 0
    if upstream and not args.include_upstream:
        print(
            f"  note: {len(upstream)} upstream tombstone(s) look like dead letters but may be "
            "successes on their last attempt; --include-upstream replays them too"
        )
    live = {d.shard for d in found if probe_lock(queue.lock_path(d.shard)).state == "held"}
    if args.ids or (not args.include_upstream and any(d.shard in live for d in upstream)):
        # By id, or with upstream look-alikes a daemon would put back too: one by one.
        retried, pending = _retry_live(args, [d for d in found if d.shard in live])
    else:
        retried, pending = _retry_live_by_type(args, task_type, sorted(live))
    recovered = _replay_offline(args, queue, scans, [d for d in found if d.shard not in live],
                                task_type)
    print(f"Replay complete. Recovered {recovered + retried} failed task(s) into the active "
          f"queue{f'; {pending} pending' if pending else ''}.")
    return EXIT_PENDING if pending else 0


def _retry_live_by_type(
    args: argparse.Namespace, task_type: str | None, shards: Sequence[int]
) -> tuple[int, int]:
    """Send the shards a daemon holds one retry of the type's dead letters each (its daemon
    puts back every one it holds); how many were put back, and how many shards are pending."""
    if not shards:
        return 0, 0
    answer = commands.retry_dead(args.directory, task_type, None, args.wait, shards=shards)
    answered = [shard_name(s) for s in shards if s not in answer.pending]
    if answered:
        print(f"  retried {answer.count} dead letter(s) in {', '.join(answered)}, by their "
              "daemons")
    if answer.pending:
        print(f"  {pending_text(answer.pending, answer.unowned)}")
    return answer.count, len(answer.pending)


def _retry_live(args: argparse.Namespace, found: Sequence[FoundDeadLetter]) -> tuple[int, int]:
    """Send each dead letter of a shard a daemon holds to it as a retry; how many were put
    back, and how many are still pending."""
    retried = pending = 0
    for d in found:
        answer = commands.retry(args.directory, d.letter.task_id, args.wait, shard=d.shard)
        if answer.done:
            print(f"  retried {d.letter.task_id} ({d.letter.task_type}) in "
                  f"{shard_name(d.shard)}, by its daemon")
        elif answer.pending:
            print(f"  {d.letter.task_id}: {pending_text(answer.pending, answer.unowned)}")
        else:
            print(f"  not retried {d.letter.task_id}: its daemon found it {answer.found}")
        pending += bool(answer.pending)
        retried += answer.done
    return retried, pending


def _replay_offline(
    args: argparse.Namespace,
    queue: Queue,
    scans: list[ShardScan],
    found: Sequence[FoundDeadLetter],
    task_type: str | None,
) -> int:
    """Replay the dead letters of shards no daemon holds: under their locks, appended here;
    how many were."""
    if not found:
        return 0
    owner = tool_owner("replay")
    shards = sorted({d.shard for d in found})
    recovered: list[tuple[int, DeadLetter]] = []
    with shard_locks(queue, shards, owner):
        # Read again under the locks: a daemon may have changed the logs before it stopped.
        for shard in shards:
            scans[shard] = scan_shard(queue, shard, payloads=True)
        found = find_dead_letters(folds(scans), task_type=task_type, ids=args.ids)
        if not args.include_upstream:
            found = [d for d in found if not d.letter.inferred]
        # Only the shards locked: a dead letter that appeared after the first read, in a
        # shard not locked, waits for the next replay.
        plan = plan_replay([d for d in found if d.shard in shards], folds(scans))
        skipped = plan.skipped
        now = format_rfc3339(wall_now_us(tool_settings()))
        batches: dict[int, list[bytes]] = {}
        for d in plan.replay:
            fields = replay_record(
                d.letter.record, now=now, epoch=scans[d.shard].fold.log_epoch, node=owner
            )
            batches.setdefault(d.shard, []).append(encode_record(fields))
            recovered.append((d.shard, d.letter))
        if batches:
            append_batches(queue, batches)
    for shard, letter in recovered:
        print(f"  replayed {letter.task_id} ({letter.task_type}) into {shard_name(shard)}")
    for text in skipped:
        print(f"  skipped {text}")
    return len(recovered)


def append_batches(queue: Queue, batches: dict[int, list[bytes]]) -> None:
    """Append each shard's lines durably (caller holds the shard locks): the last line is
    repaired first (a torn write cut, a lost newline written back), so no line is glued onto
    it; then one write and one fsync per shard. No file is reached through a link."""
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
