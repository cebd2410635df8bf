"""`snerdmq status ID DIR [--json]`: one task's details and every record of its life.

Every shard's log and inbox files are read for the id (`snerd.queuedir.task_report`, through
`snerd.io.scan.read_task`); what the records mean — the state, the attempts, each step, which
records fencing ignores — is `snerd.core.story`'s. The table answers "why did this run twice?":
a `dispatched` step of the same attempt twice, a claim (a takeover) between them, and records
marked stale (a daemon that had lost the shard went on writing). Read-only; safe while daemons
run. An id no file holds exits 1.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import orjson

from snerd.cli.args import command_parser, run_command, tool_settings
from snerd.cli.text import clip, format_table, print_json
from snerd.core.ownership import shard_name
from snerd.queuedir import check_task_arg, open_queue, task_report, wall_now_us

__all__ = ["main"]

#: The details printed above the story, in order, with their labels.
_SHOWN = (
    ("state", "state"),
    ("task_type", "type"),
    ("shard", "shard"),
    ("attempts", "attempts"),
    ("runs", "runs"),
    ("max_retries", "max retries"),
    ("last_error", "last error"),
    ("enqueued_at", "enqueued"),
    ("started_at", "started"),
    ("finished_at", "finished"),
    ("outcome", "outcome"),
    ("cron", "cron"),
)


def main(argv: Sequence[str]) -> int:
    """`snerdmq status ID DIR [--json]`."""
    parser = command_parser(
        "status",
        "Show one task of the queue in DIR: its state, attempts, last error, times and result, "
        "then every record of its life (enqueued, dispatched with node, epoch and attempt, "
        "failed, retried, completed, dead-lettered, cancelled, replayed), read from every "
        "shard's log and inbox files. Read-only; safe while daemons run.",
        "Why did it run twice? Look for the same attempt dispatched twice: the first run never "
        "reported an outcome (its daemon stopped, or lost the shard: a `claimed` step shows the "
        "takeover). A record marked STALE was written by a daemon that had lost the shard; "
        "the shard's replay ignores it. Exit 1: no file holds the id.",
    )
    parser.add_argument("task_id", metavar="ID", help="the task id")
    parser.add_argument("directory", metavar="DIR", help="queue directory")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return run_command(parser, argv, _status)


def _status(args: argparse.Namespace) -> int:
    check_task_arg(args.task_id)
    queue = open_queue(args.directory)
    report = task_report(queue, args.task_id, wall_now_us(tool_settings()))
    if args.json:
        print_json(report)
        return 0 if report["found"] else 1
    for error in report["errors"]:
        print(f"Note: {error}; the story may miss what that file holds")
    if not report["found"]:
        print(f"No task {args.task_id!r} in {queue.directory}: no shard's log or inbox holds it.")
        return 1
    print(f"Task {args.task_id} in {queue.directory}:")
    print()
    for line in _details(report):
        print("  " + line)
    print()
    steps = report["story"]
    print(f"Its story ({len(steps)} record(s), oldest first):")
    print()
    headers = ["#", "when", "step", "shard", "file", "node", "epoch", "attempt", "what"]
    rows = [_row(i + 1, s) for i, s in enumerate(steps)]
    for line in format_table(headers, rows, right={0, 6, 7}):
        print("  " + line)
    for i, s in enumerate(steps):
        if s["stale"] is not None:
            print(f"\nSTALE #{i + 1}: {s['stale']}; the shard's replay ignores it.")
    return 0


def _details(report: dict[str, Any]) -> list[str]:
    lines = []
    for key, label in _SHOWN:
        value = report[key]
        if value is None:
            continue
        if key == "shard":
            value = shard_name(value)
        lines.append(f"{label + ':':13} {clip(str(value), 100)}")
    if report["has_result"]:
        lines.append(f"{'result:':13} {clip(orjson.dumps(report['result']).decode(), 100)}")
    if report["waiting_in_inbox"]:
        lines.append(f"{'':13} (in an inbox: its shard's owner has not taken it in yet)")
    return lines


def _row(n: int, s: dict[str, Any]) -> list[str]:
    step = s["kind"] + (" STALE" if s["stale"] is not None else "")
    what = s["note"]
    if s["error"] and s["error"] not in what:
        what += f": {s['error']}"
    return [
        str(n),
        _second(s["at"]),
        step,
        shard_name(s["shard"]),
        "log" if s["source"] == "log" else f"inbox/{s['source']}",
        clip(s["node"] or "", 40),
        "" if s["epoch"] is None else str(s["epoch"]),
        "" if s["attempt"] is None else str(s["attempt"]),
        clip(what, 160),
    ]


def _second(rfc3339: str | None) -> str:
    """A time to the millisecond, or blank."""
    if rfc3339 is None:
        return ""
    head, dot, frac = rfc3339.partition(".")
    return f"{head}.{frac[:3]}Z" if dot else rfc3339
