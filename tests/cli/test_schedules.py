"""`snerdmq schedules DIR`: every schedule not removed, read from the shard logs by the owner's
rule, with its next fire time from now in its time zone; an unreadable record listed with the
reason. The records are written as the daemon writes them (`schedule_fields`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from snerd.cli.schedules import listing
from snerd.core import protocol as proto
from snerd.core.cron import next_fire
from snerd.core.node.schedules import schedule_fields
from snerd.core.timefmt import format_rfc3339, parse_rfc3339
from snerd.queuedir import open_queue, scan_shard
from tests.cli.test_cli import NOW, SECOND, Cli, plant
from tests.cli.test_cli import cli as cli  # the fixture

FIRED = NOW - 90 * SECOND


def declared(name: str, cron: str, **extra: Any) -> dict[str, Any]:
    """The record of a schedule as its owner writes it."""
    cmd = proto.parse_document(
        {
            "action": "schedule",
            "name": name,
            "cron": cron,
            "task_type": extra.pop("task_type", "report"),
            "task_data": "{}",
            "max_retries": 0,
            "retry_after_hours": 0,
            **extra,
        }
    )
    assert isinstance(cmd, proto.Schedule)
    return {**schedule_fields(cmd, FIRED), "snerdEpoch": 1}


def removed(name: str) -> dict[str, Any]:
    return {"snerdKind": "schedule", "name": name, "removed": True, "snerdEpoch": 1}


def planted(directory: Path) -> Path:
    return plant(
        directory,
        {
            0: [
                declared("nightly", "0 3 * * *", timezone="Europe/Paris", misfire="catch_up",
                         catch_up=5),
                declared("gone", "* * * * *"),
                removed("gone"),
                {"snerdKind": "schedule", "name": "broken", "fired": format_rfc3339(FIRED),
                 "snerdEpoch": 1},
            ],
            1: [
                declared("beat", "*/10 * * * * *", task_type="ping", overlap="skip"),
                declared("beat", "*/20 * * * * *", task_type="ping", overlap="skip"),
            ],
        },
    )


def test_the_listing_says_what_each_latest_record_declares(tmp_path: Path) -> None:
    queue = open_queue(str(planted(tmp_path / "q")))
    rows = listing([scan_shard(queue, k) for k in range(queue.shards)], NOW)
    assert [(r["shard"], r["name"]) for r in rows] == [
        ("shard-0", "broken"),
        ("shard-0", "nightly"),
        ("shard-1", "beat"),
    ]
    broken, nightly, beat = rows
    assert broken == {"name": "broken", "shard": "shard-0", "error": "its record has no task"}
    assert nightly == {
        "name": "nightly",
        "shard": "shard-0",
        "cron": "0 0 3 * * *",
        "timezone": "Europe/Paris",
        "misfire": "catch_up",
        "catch_up": 5,
        "overlap": "allow",
        "task_type": "report",
        "fired": format_rfc3339(FIRED),
        "next_fire": format_rfc3339(next_fire("0 0 3 * * *", NOW, "Europe/Paris")),
    }
    assert beat["cron"] == "*/20 * * * * *"  # the latest declaration
    assert (beat["misfire"], beat["overlap"], beat["task_type"]) == ("once", "skip", "ping")
    assert beat["timezone"] is None  # UTC
    assert beat["next_fire"] == format_rfc3339(next_fire("*/20 * * * * *", NOW))


def test_schedules_prints_a_table_and_json(cli: Cli, tmp_path: Path) -> None:
    q = planted(tmp_path / "q")
    code, out, _ = cli("schedules", q, "--json")
    assert code == 0
    rows = json.loads(out)
    assert [r["name"] for r in rows] == ["broken", "nightly", "beat"]
    nightly = rows[1]
    at = parse_rfc3339(nightly["next_fire"])
    assert at > NOW
    assert format_rfc3339(at)[11:19] in ("01:00:00", "02:00:00")  # 03:00 in Paris, in UTC

    code, out, _ = cli("schedules", q)
    assert code == 0
    assert "3 schedule(s) in" in out
    header = next(line for line in out.splitlines() if "misfire/overlap" in line)
    assert header.split() == ["name", "cron", "timezone", "misfire/overlap", "type", "shard",
                              "fired", "next", "fire"]
    (nightly_line,) = [line for line in out.splitlines() if line.strip().startswith("nightly")]
    assert "0 0 3 * * *" in nightly_line and "Europe/Paris" in nightly_line
    assert "catch_up 5/allow" in nightly_line and "shard-0" in nightly_line
    assert "gone" not in out
    assert "Note: shard-0: schedule 'broken' cannot be read (its record has no task)" in out


def test_a_queue_without_schedules_says_so(cli: Cli, tmp_path: Path) -> None:
    q = plant(tmp_path / "q", {0: []})
    code, out, _ = cli("schedules", q)
    assert (code, out.split(" in ")[0]) == (0, "No schedules")
    code, out, _ = cli("schedules", q, "--json")
    assert (code, json.loads(out)) == (0, [])
