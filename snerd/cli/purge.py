"""`snerdmq purge DIR (--type T | --all) [--before DATE | --older-than AGE]`: forget the dead
letters and cancelled tasks of a type, or of the whole queue, for good.

Which ended tasks a purge takes is the core's rule (`snerd.core.control.swept`: dead letters
and cancelled tasks, never succeeded ones, of the type, finished before the cutoff). A shard
a daemon holds is purged by that daemon: the command goes through the shard's inbox
(`snerd.commands.purge`) and its answer counts what it forgot. A shard no daemon holds is
purged here, as `snerdmq replay` replays one: under its lock, its tombstones selected by the
same rule from the folded log (`snerd.core.shardlog`), and `purge` records appended and
fsynced (`snerd.cli.dlq.append_batches`). So a purge of a stopped queue is done when the
command returns, and one of a running queue is done by its daemons; a shard whose daemon
does not answer within --wait is pending (the command is durable in its inbox, and applied
when a daemon next takes the shard), exit 4. A purge record is what every reader folds: the
purged tasks leave `snerdmq dlq`, the dashboard and `snerdmq stats` at once, and compaction
drops their tombstones.

Exit status like `snerdmq cancel`'s: 0 purged some, 3 nothing to purge, 4 pending on some.
"""

from __future__ import annotations

import argparse
import contextlib
import re
from collections.abc import Sequence

from snerd import commands
from snerd.cli.args import (
    EXIT_NOT_DONE,
    EXIT_PENDING,
    QueueError,
    command_parser,
    run_command,
    tool_settings,
)
from snerd.cli.cancel import add_wait, pending_text
from snerd.cli.dlq import append_batches
from snerd.cli.text import print_json
from snerd.core import control as rule
from snerd.core import protocol as proto
from snerd.core.ownership import shard_name
from snerd.core.records import encode_record
from snerd.core.schema import SNERD_EPOCH, SNERD_NODE, TASK_TYPE
from snerd.core.shardlog import ShardFold, finished_at_us, tombstone_outcome
from snerd.core.timefmt import format_rfc3339, parse_rfc3339
from snerd.queuedir import (
    Queue,
    open_queue,
    probe_lock,
    scan_shard,
    shard_locks,
    tool_owner,
    wall_now_us,
)

__all__ = ["main", "parse_age", "parse_before", "purged_by"]

_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400}
_AGE = re.compile(r"([0-9]+)([smhdw])")
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


def main(argv: Sequence[str]) -> int:
    """`snerdmq purge DIR (--type T | --all) [--before DATE | --older-than AGE] [--dry-run]
    [--wait S] [--json]`."""
    parser = command_parser(
        "purge",
        "Forget, for good, the dead letters and cancelled tasks of type T (--all: of every "
        "type) of the queue in DIR that finished before DATE (--before) or more than AGE ago "
        "(--older-than; neither: whenever). Succeeded tasks and live ones are never purged "
        "(results leave with the result retention). A shard a daemon holds is purged by it, "
        "through the shard's inbox; a shard no daemon holds is purged here, under its lock "
        "(as `snerdmq replay` does).",
        "DATE is RFC 3339 (2026-11-27T08:00:00Z) or a day (2026-11-27: its midnight, UTC). "
        "AGE is a whole number and a unit: s, m, h, d or w (7d: a week). Exit status: 0 "
        "purged some; 3 nothing to purge; 4 pending on some shards (no answer within the "
        "wait: purged when a daemon next reads them); 1 the queue cannot be written; 2 a "
        "bad argument.",
    )
    parser.add_argument("directory", metavar="DIR", help="queue directory")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--type", dest="task_type", metavar="T", type=_task_type,
                       help="only this task type")
    which.add_argument("--all", action="store_true", help="every task type")
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--before", metavar="DATE", type=_before,
                      help="only tasks that finished before DATE")
    when.add_argument("--older-than", metavar="AGE", type=_age,
                      help="only tasks that finished more than AGE ago (7d, 12h, 30m)")
    parser.add_argument("--dry-run", action="store_true",
                        help="only count what the files say would be purged; write nothing")
    add_wait(parser)
    return run_command(parser, argv, _purge)


def parse_before(text: str) -> int:
    """A cutoff given as RFC 3339 or as a day (`YYYY-MM-DD`, its midnight UTC): wall µs.

    Raises:
        ValueError: neither; the message says what is wrong.
    """
    if _DATE.fullmatch(text):
        text += "T00:00:00Z"
    return parse_rfc3339(text)


def parse_age(text: str) -> int:
    """An age (`7d`, `12h`, `30m`, `90s`, `2w`) in µs.

    Raises:
        ValueError: not one.
    """
    m = _AGE.fullmatch(text)
    if m is None:
        raise ValueError("a whole number and a unit (s, m, h, d, w), such as 7d")
    return int(m[1]) * _UNITS_S[m[2]] * 1_000_000


def _task_type(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("--type must not be empty (--all: every type)")
    return text


def _before(text: str) -> int:
    try:
        return parse_before(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"--before must be RFC 3339 or YYYY-MM-DD, got {text!r}: {exc}") from None


def _age(text: str) -> int:
    try:
        return parse_age(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--older-than must be {exc}, got {text!r}") from None


def purged_by(sweep: proto.Sweep, fold: ShardFold, now_us: int) -> list[str]:
    """The ended tasks of a folded shard `sweep` takes (`rule.swept`, as a daemon decides over
    its shard's history), in log order; a task live again under its id is not one."""
    out = []
    for task_id, record in fold.finished.items():
        if task_id in fold.live:
            continue
        task_type = record.fields.get(TASK_TYPE)
        outcome = tombstone_outcome(record.fields)
        if rule.swept(sweep, outcome, task_type if isinstance(task_type, str) else "",
                      finished_at_us(record.fields, now_us)):
            out.append(task_id)
    return out


def _purge(args: argparse.Namespace) -> int:
    queue = open_queue(args.directory, allow_legacy=False)
    now = wall_now_us(tool_settings())
    before = now - args.older_than if args.older_than is not None else args.before
    sweep = proto.Sweep(purge=True, task_type=args.task_type, before_us=before)
    if args.dry_run:
        return _dry_run(queue, sweep, now)
    held = [s for s in range(queue.shards) if probe_lock(queue.lock_path(s)).state == "held"]
    free = [s for s in range(queue.shards) if s not in held]
    here, busy = _purge_offline(queue, free, sweep, now)
    held = sorted([*held, *busy])  # (a daemon took one since the probe: it purges it)
    live = None
    if held:
        live = commands.purge(args.directory, sweep.task_type, before, args.wait, shards=held)
    answer = commands.SweepAnswer(
        sweep=sweep,
        count=sum(here.values()) + (live.count if live else 0),
        shards=queue.shards,
        pending=live.pending if live else (),
        unowned=live.unowned if live else (),
    )
    if args.json:
        message = answer.json()
        message["purged_here"] = {shard_name(s): n for s, n in sorted(here.items())}
        print_json(message)
    else:
        _print(answer, here)
    if answer.pending:
        return EXIT_PENDING
    return 0 if answer.count else EXIT_NOT_DONE


def _purge_offline(
    queue: Queue, shards: Sequence[int], sweep: proto.Sweep, now: int
) -> tuple[dict[int, int], list[int]]:
    """Purge the shards no daemon held at the probe, each under its lock: how many tasks each
    lost, and the shards whose lock a daemon took since (left to it)."""
    owner = tool_owner("purge")
    done: dict[int, int] = {}
    busy: list[int] = []
    with contextlib.ExitStack() as stack:
        locked = []
        for shard in shards:
            try:
                stack.enter_context(shard_locks(queue, [shard], owner))
            except QueueError:
                busy.append(shard)
            else:
                locked.append(shard)
        at = format_rfc3339(now)
        batches: dict[int, list[bytes]] = {}
        for shard in locked:
            # Read under the lock: a daemon may have changed the log before it stopped.
            fold = scan_shard(queue, shard).fold
            ids = purged_by(sweep, fold, now)
            done[shard] = len(ids)
            step = rule.PURGE_RECORD_IDS
            meta = {SNERD_NODE: owner, SNERD_EPOCH: fold.log_epoch}
            batches[shard] = [
                encode_record({**rule.purge_fields(ids[i : i + step], sweep, at), **meta})
                for i in range(0, len(ids), step)
            ]
        batches = {s: lines for s, lines in batches.items() if lines}
        if batches:
            append_batches(queue, batches)
    return done, busy


def _dry_run(queue: Queue, sweep: proto.Sweep, now: int) -> int:
    """What the files say a purge would take now, shard by shard (read-only; a daemon
    decides over what its shard holds when the command reaches it)."""
    total = 0
    for shard in range(queue.shards):
        n = len(purged_by(sweep, scan_shard(queue, shard).fold, now))
        total += n
        if n:
            print(f"would purge {n} task(s) in {shard_name(shard)}")
    print(f"Dry run: {total} task(s) would be purged ({_what(sweep)}).")
    return 0


def _what(sweep: proto.Sweep) -> str:
    kind = "of every type" if sweep.task_type is None else f"of type {sweep.task_type!r}"
    if sweep.before_us is None:
        return f"dead letters and cancelled tasks {kind}"
    cutoff = format_rfc3339(sweep.before_us)
    return f"dead letters and cancelled tasks {kind} that finished before {cutoff}"


def _print(answer: commands.SweepAnswer, here: dict[int, int]) -> None:
    for shard, n in sorted(here.items()):
        if n:
            print(f"  purged {n} task(s) in {shard_name(shard)} (no daemon holds it: under "
                  "its lock, here)")
    what = _what(answer.sweep)
    if not answer.pending:
        print(f"Purged {answer.count} {what}, on all {answer.shards} shard(s).")
        return
    applied = answer.shards - len(answer.pending)
    print(f"Purged {answer.count} {what}, on {applied} of {answer.shards} shard(s); "
          f"{pending_text(answer.pending, answer.unowned)}.")
