"""`snerdmq stats DIR [--json]`: what each shard holds, read from its files.

The report is `snerd.queuedir.stats_report` (the dashboard serves the same); this module prints
it as a table, or as JSON. Read-only; safe while daemons run.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from snerd.cli.args import command_parser, run_command, tool_settings
from snerd.cli.text import fmt_bytes, format_table, print_json
from snerd.queuedir import open_queue, paused_text, scan_shard, stats_report, wall_now_us

__all__ = ["main"]


def main(argv: Sequence[str]) -> int:
    """`snerdmq stats DIR [--json]`."""
    parser = command_parser(
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
    return run_command(parser, argv, _stats)


def _stats(args: argparse.Namespace) -> int:
    queue = open_queue(args.directory)
    settings = tool_settings()
    report = stats_report(
        queue,
        [scan_shard(queue, k) for k in range(queue.shards)],
        wall_now_us(settings),
        settings.skew_margin_us,
    )
    rows: list[dict[str, Any]] = report["per_shard"]
    totals: dict[str, Any] = report["totals"]
    if args.json:
        for r in rows:
            del r["owner_text"]
        print_json(report)
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
                fmt_bytes(r["log_bytes"]) if r["log_exists"] else "-",
                str(r["corrupt_lines"]),
            ]
        )
    table.append(
        ["total", "", ""]
        + [str(totals[k]) for k in
           ("live", "waiting", "delayed", "retrying", "in_flight", "completed", "dead_letters")]
        + [fmt_bytes(totals["log_bytes"]), str(totals["corrupt_lines"])]
    )
    print()
    for line in format_table(headers, table, right=set(range(2, 12))):
        print("  " + line)
    print()
    if totals["types"]:
        types = ", ".join(f"{t} {n}" for t, n in totals["types"].items())
        print(f"Live tasks by type: {types}")
    for entry in report["paused"]:
        print(f"Paused: {paused_text(entry, queue.shards)}")
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
