"""Named schedules across real daemons on one queue directory: declared by every daemon at its
start, held in one record, each tick's run executed exactly once across the daemons, through
a kill -9 of the owner of the schedule's shard (a survivor takes over and the ticks go on; a
run in flight at the kill may run again, and is counted), and an `unschedule` through a
daemon that does not own it stops the runs.

The test is each daemon's SDK (`Queue` of test_dependencies): it answers every `execute` at
once and keeps every message in one ordered list. Runs are named `<name>@<tick>`; ticks are
read back from their ids. The schedules fire every second and catch up missed ticks
(`misfire: catch_up`), so "no tick missing" holds across the moves of the shard that holds
them, however long a move takes within `catch_up` seconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from snerd.cli.schedules import listing
from snerd.core.node.model import route_shard
from snerd.core.schedule import routing_key, schedule_of_run
from snerd.core.timefmt import parse_rfc3339
from snerd.queuedir import open_queue, scan_shard
from tests.support.daemon import Daemon
from tests.system.test_dependencies import Queue

SECOND = 1_000_000


def declaration(name: str, **extra: Any) -> dict[str, Any]:
    return {
        "action": "schedule",
        "name": name,
        "cron": "*/1 * * * * *",
        "task_type": "beat",
        "task_data": "{}",
        "max_retries": 0,
        "retry_after_hours": 0,
        "misfire": "catch_up",
        "catch_up": 30,
        **extra,
    }


class Schedules(Queue):
    """`Queue`, keeping the daemons' `scheduled` answers too."""

    def __init__(self, nursery: trio.Nursery, directory: Path, shards: int) -> None:
        super().__init__(nursery, directory, shards)
        #: (daemon, name, result) of each `scheduled`, and the refusals naming a schedule.
        self.answers: list[tuple[str, str, str]] = []
        self.refusals: list[dict[str, Any]] = []

    async def start_declaring(self, names: str, *declared: dict[str, Any]) -> None:
        """Start a daemon per name, each declaring `declared` at once (before it runs: held
        until it does), and wait until they share the shards evenly."""
        for name in names:
            d = await Daemon.start(self.nursery, self.directory, env=self.env)
            self.daemons[name] = d
            self.owned[name] = set()
            await d.send({"action": "register", "task_type": "beat"})
            for message in declared:
                await d.send(message)
            self.nursery.start_soon(self._serve, name, d)
        share = self.shards // len(self.daemons)
        await self.until(
            lambda: all(len(o) == share for o in self.owned.values())
            and set().union(*self.owned.values()) == set(range(self.shards)),
            timeout=20,
        )

    def _take(self, name: str, m: dict[str, Any]) -> None:
        super()._take(name, m)
        if m.get("action") == "scheduled":
            self.answers.append((name, m["name"], m["result"]))
        elif m.get("action") == "error" and "name" in m:
            self.refusals.append(m)

    def owner_of(self, schedule: str) -> str:
        shard = route_shard(routing_key(schedule), self.shards)
        (owner,) = [n for n, o in self.owned.items() if shard in o]
        return owner

    def runs(self, schedule: str) -> list[tuple[str, int, str]]:
        """(daemon, tick, run id) of each `execute` of a run of `schedule`, in order."""
        return [
            (s[1], parse_rfc3339(s[2].rpartition("@")[2]), s[2])
            for s in self.seen
            if s[0] == "execute" and schedule_of_run(s[2]) == schedule
        ]

    def ticks_after(self, schedule: str, at_us: int) -> int:
        return len({tick for _, tick, _ in self.runs(schedule) if tick > at_us})

    def removal_time(self, schedule: str) -> int:
        """When the record removing `schedule` was written (its `at`)."""
        queue = open_queue(str(self.directory))
        shard = route_shard(routing_key(schedule), self.shards)
        fields = scan_shard(queue, shard).fold.schedules[schedule].fields
        assert fields.get("removed") is True, fields
        return parse_rfc3339(fields["at"])

    def listed(self) -> list[dict[str, Any]]:
        """`snerdmq schedules` of the directory, now."""
        queue = open_queue(str(self.directory))
        return listing([scan_shard(queue, k) for k in range(queue.shards)], 0)


def contiguous(ticks: list[int]) -> list[int]:
    """The ticks missing between the first and the last (every second)."""
    have = set(ticks)
    return [t for t in range(min(ticks), max(ticks) + 1, SECOND) if t not in have]


@pytest.fixture
def queue_dir(tmp_path: Path) -> Path:
    return tmp_path / "q"


@pytest.mark.slow
async def test_three_daemons_declare_one_schedule_and_each_tick_runs_once(
    queue_dir: Path, nursery: trio.Nursery
) -> None:
    q = Schedules(nursery, queue_dir, shards=3)
    await q.start_declaring("abc", declaration("beat"))
    await q.until(lambda: len(q.answers) == 3)
    results = [result for _, _, result in q.answers]
    # One daemon creates it; the others find it (unchanged) or hand it to the owner's inbox
    # (forwarded: a daemon whose shards are still loading as it starts forwards its own
    # declaration, and the owner creates it from there, unanswered).
    assert set(results) <= {"created", "unchanged", "forwarded"}, q.answers
    assert results.count("created") <= 1, q.answers
    assert q.refusals == []
    start = q.runs("beat")[-1][1] if q.runs("beat") else 0
    await q.until(lambda: q.ticks_after("beat", start) >= 5, timeout=15)
    runs = q.runs("beat")
    ids = [run for _, _, run in runs]
    assert len(ids) == len(set(ids)), q.report(f"a tick ran twice: {ids}")
    assert contiguous([tick for _, tick, _ in runs]) == [], q.report(f"ticks missing: {ids}")
    (held,) = q.listed()  # one schedule record's worth of state, in the name's shard
    assert (held["name"], held["shard"]) == (
        "beat",
        f"shard-{route_shard(routing_key('beat'), 3)}",
    )
    await q.stop()


@pytest.mark.slow
async def test_a_kill_of_the_owner_hands_the_ticks_to_a_survivor(
    queue_dir: Path, nursery: trio.Nursery
) -> None:
    q = Schedules(nursery, queue_dir, shards=3)
    await q.start_declaring("abc", declaration("beat"))
    await q.until(lambda: len(q.runs("beat")) >= 3, timeout=15)
    victim = q.owner_of("beat")
    await q.until(lambda: q.runs("beat")[-1][0] == victim)  # its shard has settled there
    q.daemons[victim].kill()  # SIGKILL: its lock goes with it; a survivor probes and takes it
    killed = len(q.runs("beat"))
    await q.until(
        lambda: sum(1 for who, _, _ in q.runs("beat")[killed:] if who != victim) >= 4,
        timeout=20,
    )
    runs = q.runs("beat")
    after = {who for who, _, _ in runs[killed:] if who != victim}
    assert len(after) == 1, q.report(f"ran after the kill on {after}")
    # (An `execute` the victim wrote just before it died may be read after the kill.)
    late = [run for who, _, run in runs[killed:] if who == victim]
    assert len(late) <= 1, q.report(f"the victim ran {late} after the kill")
    ids = [run for _, _, run in runs]
    twice = sorted({run for run in ids if ids.count(run) > 1})
    # A run executed twice is one in flight at the kill: executed by the victim, its result
    # not yet written, executed again by the survivor (the crash re-execution the window
    # allows); never two runs of one tick otherwise.
    for run in twice:
        who = [w for w, _, r in runs if r == run]
        assert who[0] == victim and victim not in who[1:] and len(who) == 2, q.report(run)
    assert len(twice) <= 1, q.report(f"re-executed: {twice}")
    assert contiguous([tick for _, tick, _ in runs]) == [], q.report(f"ticks missing: {ids}")
    await q.stop()


async def test_unschedule_through_a_daemon_that_does_not_own_it_stops_the_runs(
    queue_dir: Path, nursery: trio.Nursery
) -> None:
    q = Schedules(nursery, queue_dir, shards=2)
    # A second schedule in the same shard shows that its owner goes on firing.
    probe = next(
        f"probe-{n}"
        for n in range(100)
        if route_shard(routing_key(f"probe-{n}"), 2) == route_shard(routing_key("beat"), 2)
    )
    await q.start_declaring("ab", declaration("beat"), declaration(probe))
    await q.until(lambda: len(q.runs("beat")) >= 2 and len(q.runs(probe)) >= 2, timeout=15)
    other = next(n for n in q.daemons if n != q.owner_of("beat"))
    await q.daemons[other].send({"action": "unschedule", "name": "beat"})
    await q.until(lambda: (other, "beat", "forwarded") in q.answers)
    # Until its owner applied it from the inbox: the log's latest record says removed.
    with trio.fail_after(10):
        while [r["name"] for r in q.listed()] != [probe]:
            await trio.sleep(0.05)
    removed_at = q.removal_time("beat")
    # Two ticks of the probe after the removal, fired by the same owner: a tick of beat would
    # have fired with them. (A run of beat fired before the removal may still come.)
    await q.until(lambda: q.ticks_after(probe, removed_at) >= 2)
    later = [run for _, tick, run in q.runs("beat") if tick > removed_at]
    assert later == [], q.report(f"ran on after the removal: {later}")
    assert q.refusals == []
    await q.stop()
