"""`snerdmq schedules DIR [--json]`: the named schedules of the queue, read from its files.

Each shard log is folded (`snerd.queuedir.scan_shard`, the daemon's replay rules); a
schedule's latest record is read by the owner's own rule (`snerd.core.node.schedules.
stored_schedule`), and its next fire time is `snerd.core.cron.next_fire` from now, in its
time zone. A record that cannot be read is listed with the reason (its owner does not fire it
until it is declared again). Read-only; safe while daemons run.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from snerd.cli.args import command_parser, run_command, tool_settings
from snerd.cli.text import clip, format_table, print_json
from snerd.core.cron import next_fire
from snerd.core.node.schedules import stored_schedule
from snerd.core.ownership import shard_name
from snerd.core.timefmt import format_rfc3339
from snerd.queuedir import ShardScan, open_queue, scan_shard, wall_now_us

__all__ = ["listing", "main"]


def main(argv: Sequence[str]) -> int:
    """`snerdmq schedules DIR [--json]`."""
    parser = command_parser(
        "schedules",
        "List the named schedules of the queue in DIR, read from its files: expression, time "
        "zone, misfire and overlap policies, the task type of their runs, the shard that holds "
        "each, the last tick fired and the next one. Read-only; safe while daemons run.",
        "A schedule is declared with the `schedule` action (SnerdQueue.schedule) and removed "
        "with `unschedule`. `fired` is its last tick fired (before its first run: when it was "
        "declared). The next fire time is computed from now; the owner of its shard fires it.",
    )
    parser.add_argument("directory", metavar="DIR", help="queue directory")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return run_command(parser, argv, _schedules)


def listing(scans: Sequence[ShardScan], now_us: int) -> list[dict[str, Any]]:
    """Every schedule not removed, by shard then name: what its record declares, or `error`
    (why it cannot be read)."""
    rows: list[dict[str, Any]] = []
    for scan in scans:
        for name, record in sorted(scan.fold.schedules.items()):
            row: dict[str, Any] = {"name": name, "shard": shard_name(scan.shard)}
            try:
                stored = stored_schedule(record.fields)
                if stored is None:
                    continue
                spec, fired = stored
                cron = spec.template.cron
                assert cron is not None
                upcoming = next_fire(cron, now_us, spec.timezone)
            except ValueError as exc:
                row["error"] = str(exc)
                rows.append(row)
                continue
            row.update(
                cron=cron,
                timezone=spec.timezone,
                misfire=spec.misfire,
                catch_up=spec.catch_up,
                overlap=spec.overlap,
                task_type=spec.template.task_type,
                fired=format_rfc3339(fired),
                next_fire=format_rfc3339(upcoming),
            )
            rows.append(row)
    return rows


def _schedules(args: argparse.Namespace) -> int:
    queue = open_queue(args.directory)
    scans = [scan_shard(queue, k) for k in range(queue.shards)]
    rows = listing(scans, wall_now_us(tool_settings()))
    if args.json:
        print_json(rows)
        return 0
    if not rows:
        print(f"No schedules in {queue.directory}.")
        return 0
    print(f"{len(rows)} schedule(s) in {queue.directory}:")
    headers = ["name", "cron", "timezone", "misfire/overlap", "type", "shard", "fired",
               "next fire"]
    table = [_row(r) for r in rows if "error" not in r]
    print()
    for line in format_table(headers, table, right=set()):
        print("  " + line)
    print()
    for r in rows:
        if "error" in r:
            print(
                f"Note: {r['shard']}: schedule {r['name']!r} cannot be read "
                f"({clip(r['error'], 100)}); it does not fire until it is declared again"
            )
    return 0


def _row(r: dict[str, Any]) -> list[str]:
    misfire = f"catch_up {r['catch_up']}" if r["misfire"] == "catch_up" else r["misfire"]
    return [
        clip(r["name"], 40),
        r["cron"],
        r["timezone"] or "UTC",
        f"{misfire}/{r['overlap']}",
        clip(r["task_type"], 30),
        r["shard"],
        _seconds(r["fired"]),
        _seconds(r["next_fire"]),
    ]


def _seconds(rfc3339: str) -> str:
    """An RFC 3339 time to the whole second (a tick is one): `2026-12-03T16:46:32Z`."""
    head, dot, _ = rfc3339.partition(".")
    return head + "Z" if dot else rfc3339
