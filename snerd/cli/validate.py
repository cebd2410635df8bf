"""`snerdmq validate DIR [--json]`: the health check of a queue and the daemons running on it.

This module gathers the facts (membership.json, each shard's lock probe, folded log, entries
and inbox files, the filesystem type, the wall clock: `snerd.queuedir`), hands them to the
core's judgement (`snerd.core.health.judge_health`, which decides everything from them and
`now_us`) and prints its report, as text or as JSON (`health_json`, documented in
docs/operations.md). Read-only but for a non-blocking probe of each shard lock, released at
once.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from snerd.cli.args import command_parser, run_command, tool_settings
from snerd.cli.text import print_json
from snerd.config import ToolSettings
from snerd.core.health import (
    HealthReport,
    HealthSettings,
    LockState,
    QueueFacts,
    ShardFacts,
    judge_health,
)
from snerd.core.status import summarize
from snerd.core.timefmt import format_rfc3339
from snerd.io.fscheck import LOCAL_FILESYSTEMS, filesystem_type
from snerd.queuedir import (
    Queue,
    QueueError,
    ShardScan,
    inbox_waiting,
    open_queue_to_check,
    paused_report,
    paused_text,
    probe_lock,
    queue_json,
    scan_shard,
    shard_entries,
    wall_now_us,
)

__all__ = ["health_json", "health_lines", "main"]

SECOND = 1_000_000


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


def main(argv: Sequence[str]) -> int:
    """`snerdmq validate DIR [--json]`."""
    parser = command_parser(
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
    return run_command(parser, argv, _validate)


def _health_settings(settings: ToolSettings) -> HealthSettings:
    return HealthSettings(ttl_us=settings.lease_ttl_us, skew_margin_us=settings.skew_margin_us)


def _shard_facts(queue: Queue, shard: int, now_us: int) -> tuple[ShardFacts, ShardScan]:
    exists = queue.shard_dir(shard).is_dir()
    # What is wrong with the shard's entries; failing to read them only says so when no entry
    # explains it (the same link would be named twice).
    unusable = [problem for _path, problem in shard_entries(queue, shard)]
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
        **inbox_waiting(queue.directory, shard, scan.fold.inbox),
    ), scan


def _validate(args: argparse.Namespace) -> int:
    queue, unusable = open_queue_to_check(args.directory)
    tool = tool_settings()
    settings = _health_settings(tool)
    fs_type = filesystem_type(queue.directory, tool.mountinfo_path)
    now = wall_now_us(tool)
    read = [_shard_facts(queue, shard, now) for shard in range(queue.shards)]
    paused = paused_report([scan for _facts, scan in read])
    facts = QueueFacts(
        directory=str(args.directory),
        shards=[shard_facts for shard_facts, _scan in read],
        orphans=sorted(k for k in queue.shard_dirs_on_disk() if k >= queue.shards),
        filesystem=fs_type,
        lock_proves_liveness=fs_type in LOCAL_FILESYSTEMS,
    )
    report = judge_health(
        queue.doc or {}, facts, now_us=now, settings=settings, membership_problem=unusable
    )
    if args.json:
        print_json({**queue_json(queue), **health_json(report), "paused": paused})
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
    for entry in paused:
        print(f"Paused: {paused_text(entry, queue.shards)}")
    return report.exit_code
