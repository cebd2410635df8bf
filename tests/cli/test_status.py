"""`snerdmq status ID DIR`: one task's details and story, on queues real daemons wrote.

A retried task, a task whose daemon was killed mid-attempt (so the next daemon runs the same
attempt again) and a task enqueued through a daemon that does not own its shard are made by
real `snerdmq` processes over their pipes; the story must show both attempts, the takeover
between the two runs of the killed one, and the owner taking the far one in from its inbox.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import trio

from snerd.core.node.model import route_shard
from tests.cli.test_cli import Cli, Daemon, plant, task
from tests.cli.test_cli import cli as cli  # the fixture
from tests.cli.test_cli import daemons as daemons  # the fixture
from tests.support.cluster import Daemons


def test_a_retried_task_shows_both_attempts(
    cli: Cli, tmp_path: Path, daemons: Callable[..., Daemon]
) -> None:
    q = tmp_path / "q"
    d = daemons(q)
    d.send({"action": "register", "task_type": "flaky"})
    assert d.enqueue("t1", "flaky", {"n": 1}, max_retries=1)["action"] == "ack"
    first = d.execute()
    assert (first["task_id"], first["attempt"]) == ("t1", 1)
    d.result("t1", ok=False, error="upstream API 503")
    second = d.execute()
    assert (second["task_id"], second["attempt"]) == ("t1", 2)
    d.result("t1", ok=True)
    assert d.stop() == 0

    code, out, _ = cli("status", "t1", q, "--json")
    assert code == 0
    report = json.loads(out)
    assert report["state"] == "succeeded" and report["task_type"] == "flaky"
    assert (report["attempts"], report["runs"], report["shard"]) == (2, 2, 0)
    assert report["errors"] == [] and report["stale_records"] == 0
    kinds = [s["kind"] for s in report["story"]]
    assert kinds == ["enqueued", "dispatched", "retry_scheduled", "dispatched", "completed"]
    assert report["story"][2]["error"] == "upstream API 503"
    assert [s["attempt"] for s in report["story"] if s["kind"] == "dispatched"] == [1, 2]

    code, out, _ = cli("status", "t1", q)
    assert code == 0
    assert "state:        succeeded" in out
    assert "retry_scheduled" in out and "upstream API 503" in out


def test_a_killed_daemons_attempt_runs_again_and_the_story_says_why(
    cli: Cli, tmp_path: Path, daemons: Callable[..., Daemon]
) -> None:
    q = tmp_path / "q"
    d = daemons(q)
    d.send({"action": "register", "task_type": "slow"})
    assert d.enqueue("t2", "slow", {})["action"] == "ack"
    assert d.execute()["attempt"] == 1
    d.kill()  # mid-attempt: no outcome is ever written for this run

    d = daemons(q)
    d.send({"action": "register", "task_type": "slow"})
    again = d.execute()
    assert (again["task_id"], again["attempt"]) == ("t2", 1)
    d.result("t2", ok=True)
    assert d.stop() == 0

    code, out, _ = cli("status", "t2", q, "--json")
    assert code == 0
    report = json.loads(out)
    steps = report["story"]
    assert [s["kind"] for s in steps] == [
        "enqueued", "dispatched", "claimed", "dispatched", "completed"
    ]
    first, claimed, rerun = steps[1], steps[2], steps[3]
    assert first["node"] != rerun["node"] and rerun["node"] == claimed["node"]
    assert rerun["epoch"] == claimed["epoch"] > first["epoch"]
    assert "runs twice" in rerun["note"]
    assert (report["attempts"], report["runs"]) == (1, 2)

    code, out, _ = cli("status", "t2", q)
    assert "runs twice" in out and "claimed" in out


def test_an_unknown_id_exits_1_and_a_malformed_one_2(cli: Cli, tmp_path: Path) -> None:
    q = plant(tmp_path / "q", {0: [task("known")]})
    code, out, _ = cli("status", "nope", q)
    assert code == 1
    assert "No task 'nope'" in out
    code, out, _ = cli("status", "nope", q, "--json")
    assert code == 1 and json.loads(out)["found"] is False
    code, _, err = cli("status", "", q)
    assert code == 2 and "task id" in err
    code, out, _ = cli("status", "known", q)
    assert code == 0 and "state:        queued" in out


def test_a_missing_dir_is_a_usage_error(cli: Cli, tmp_path: Path) -> None:
    code, _, err = cli("status", "t1", tmp_path / "nope")
    assert code == 2 and "does not exist" in err


def test_a_task_enqueued_through_a_daemon_that_does_not_own_its_shard(
    cli: Cli, tmp_path: Path
) -> None:
    q = tmp_path / "q"

    async def run() -> dict[str, set[int]]:
        async with trio.open_nursery() as nursery:
            cluster = Daemons(nursery, q, shards=2)
            await cluster.start("a", "b")
            owned = {name: set(shards) for name, shards in cluster.owned.items()}
            via = next(n for n, s in owned.items() if route_shard("far-1", 2) not in s)
            await cluster.daemons[via].enqueue("far-1")
            await cluster.until(
                lambda: any(m.get("action") == "done" and m["task_id"] == "far-1"
                            for _, m in cluster.seen),
                timeout=20,
            )
            await cluster.stop()
            return owned

    trio.run(run)
    code, out, _ = cli("status", "far-1", q, "--json")
    assert code == 0
    report = json.loads(out)
    assert report["state"] == "succeeded" and report["shard"] == route_shard("far-1", 2)
    kinds = [s["kind"] for s in report["story"]]
    # Its inbox copy, when the owner has not removed the ingested file yet, comes first.
    assert kinds[-3:] == ["taken_in", "dispatched", "completed"], kinds
    assert kinds[:-3] in ([], ["inbox"])
    taken_in, dispatched = report["story"][-3], report["story"][-2]
    assert "inbox" in taken_in["note"] and dispatched["node"] == taken_in["node"]
    assert report["enqueued_at"] is not None
