"""Several real daemons on one queue directory: fair shares, give-back and hand-over on drain."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import orjson
import trio

from snerd.core.shardlog import KIND_CLAIM
from tests.support.daemon import Daemon

#: A short lease so that rounds (every third of it) come quickly.
ENV = {"SNERD_SHARDS": "4", "SNERD_LEASE_TTL": "1.5", "SNERD_CLOCK_SKEW_MARGIN": "0.25"}


def owning(count: int) -> Any:
    return lambda m: m.get("action") == "membership" and len(m["owned"]) == count


async def test_two_daemons_split_the_shards_and_one_takes_all_back_when_the_other_drains(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    a = await Daemon.start(nursery, tmp_path / "q", env=ENV)
    first = await a.wait_for(owning(4))
    assert first["owned"] == ["shard-0", "shard-1", "shard-2", "shard-3"]
    b = await Daemon.start(nursery, tmp_path / "q", env=ENV)
    # b's heartbeat makes a give back its shares above ceil(4 / 2); b claims them.
    got_a = await a.wait_for(owning(2))
    got_b = await b.wait_for(owning(2))
    assert sorted(got_a["owned"] + got_b["owned"]) == first["owned"]
    await a.wait_stderr("handed over to even out the shares")
    b.signal(signal.SIGTERM)
    assert await b.wait() == 0
    back = await a.wait_for(owning(4))  # b handed its shards over on drain
    assert back["owned"] == first["owned"]
    await a.close_stdin()
    assert await a.wait() == 0
    # A shard handed over (for the spread, or on drain) keeps its lock until its claim is
    # gone: no daemon ever took the other, alive all along, for dead.
    for d in (a, b):
        assert "process is gone" not in d.stderr.decode()


def nfs4_table(tmp_path: Path, directory: Path) -> Path:
    """A mount table that puts `directory` on NFSv4: there a free lock proves nothing, so only
    the lease decides a takeover (the daemon still uses real local flock underneath)."""
    table = tmp_path / "mountinfo"
    table.write_text(
        "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
        f"99 27 0:99 / {os.path.realpath(directory)} rw,relatime - nfs4 srv:/q "
        "rw,vers=4.2,local_lock=none\n"
    )
    return table


async def test_a_daemon_with_its_wall_clock_an_hour_ahead_does_not_take_a_live_shard(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    q = tmp_path / "q"
    q.mkdir()
    env = {**ENV, "SNERD_SHARDS": "1", "SNERD_TEST_MOUNTINFO": str(nfs4_table(tmp_path, q))}
    a = await Daemon.start(nursery, q, env=env)
    await a.wait_for(owning(1))
    claim = orjson.loads((q / "membership.json").read_bytes())["claims"]["shard-0"]
    # An hour ahead: by the wall clock alone (upstream's rule) every lease it reads has lapsed.
    b = await Daemon.start(nursery, q, env={**env, "SNERD_TEST_CLOCK_OFFSET": "3600"})
    assert (await b.wait_for(lambda m: m.get("action") == "membership"))["owned"] == []
    # Several leases long (1.5 s each, renewed every 0.5 s): the claim never changes hands.
    with trio.move_on_after(4):
        await b.wait_for(owning(1), timeout=5)
        raise AssertionError("the daemon with the stepped clock took the live shard")
    now = orjson.loads((q / "membership.json").read_bytes())["claims"]["shard-0"]
    assert now["owner"] == claim["owner"]
    # Nor ever did: every claim record in the shard's log is a's (a's own claims only, if a
    # busy machine let its short lease run out and it claimed the shard anew).
    records = map(orjson.loads, (q / "shard-0" / "tasks" / "tasks.log").read_bytes().splitlines())
    claimants = {r["node"] for r in records if r.get("snerdKind") == KIND_CLAIM}
    assert claimants == {claim["owner"]}
    await b.wait_stderr("claimed by a live daemon")
    for d in (a, b):
        await d.close_stdin()
        assert await d.wait() == 0


async def test_shards_added_while_daemons_run_are_claimed_and_shared(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    env = {**ENV, "SNERD_SHARDS": "2"}
    a = await Daemon.start(nursery, tmp_path / "q", env=env)
    await a.wait_for(owning(2))
    b = await Daemon.start(nursery, tmp_path / "q", env=env)
    await b.wait_for(owning(1))
    await a.wait_for(owning(1))
    grow = await trio.run_process(
        [sys.executable, "-m", "snerd.cli", "add-shards", "4", str(tmp_path / "q")],
        capture_stdout=True,
        capture_stderr=True,
    )
    assert grow.returncode == 0, grow.stderr
    # Within a renewal or two both daemons claim the new shards up to ceil(6 / 2) = 3 each.
    got_a = await a.wait_for(owning(3))
    got_b = await b.wait_for(owning(3))
    assert sorted(got_a["owned"] + got_b["owned"]) == [f"shard-{i}" for i in range(6)]
    for d in (a, b):
        await d.close_stdin()
        assert await d.wait() == 0


async def test_a_running_standby_takes_a_killed_owners_shard_long_before_a_round(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """On a local filesystem a free lock proves its owner dead: a running daemon tries the
    locks of others' shards every second, not only at its rounds (every 20 s with a 60 s
    lease), so it takes over within a couple of seconds of a kill -9."""
    env = {"SNERD_SHARDS": "1", "SNERD_LEASE_TTL": "60"}
    a = await Daemon.start(nursery, tmp_path / "q", env=env)
    await a.wait_for(owning(1))
    b = await Daemon.start(nursery, tmp_path / "q", env=env)
    assert (await b.wait_for(lambda m: m.get("action") == "membership"))["owned"] == []
    a.kill()
    got = await b.wait_for(owning(1), timeout=6)  # a round would come only after 20 s
    assert got["owned"] == ["shard-0"]
    await b.wait_stderr("its owner's process is gone")
    await b.close_stdin()
    assert await b.wait() == 0


async def test_a_daemon_proven_dead_is_not_counted_for_fair_shares(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """Two daemons share 4 shards; one is killed. The survivor takes the dead one's shards at
    once (their locks are free) and keeps its own: it does not count the dead daemon among the
    live ones while its heartbeat still looks fresh (that would make it hand shards back to
    nobody, free for a lease and more)."""
    # Rounds every second; a heartbeat looks fresh for lease + margin = 8 s.
    env = {"SNERD_SHARDS": "4", "SNERD_LEASE_TTL": "3"}
    a = await Daemon.start(nursery, tmp_path / "q", env=env)
    await a.wait_for(owning(4))
    b = await Daemon.start(nursery, tmp_path / "q", env=env)
    await b.wait_for(owning(2), timeout=10)
    a.kill()
    got = await b.wait_for(owning(4), timeout=4)
    assert got["owned"] == [f"shard-{i}" for i in range(4)]
    # And it keeps them: no give-back follows (the next rounds would show one).
    with trio.move_on_after(4):
        m = await b.wait_for(lambda m: m.get("action") == "membership", timeout=30)
        raise AssertionError(f"the shares changed again: {m}")
    await b.close_stdin()
    assert await b.wait() == 0
