"""Several real daemons on one queue directory: fair shares, give-back and hand-over on drain."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import trio

from tests.daemon import Daemon

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
    assert "handed over to even out the shares" in a.stderr.decode()
    b.signal(signal.SIGTERM)
    assert await b.wait() == 0
    back = await a.wait_for(owning(4))  # b handed its shards over on drain
    assert back["owned"] == first["owned"]
    await a.close_stdin()
    assert await a.wait() == 0
