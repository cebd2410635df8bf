"""Caps (SNERD_MAX_SHARDS) in the simulated world: drawn per seed for some seeds, checked after
every step (no node ever holds more than its cap), with a negative control that must fail.

`tests/sim/test_sim.py` runs the whole campaign, capped seeds among them; this module runs a few
capped seeds on their own, so that a change to the rule shows up here by name.
"""

from __future__ import annotations

from sim.settings import Settings
from sim.world import run


def capped_seeds(count: int, *, probes: bool) -> list[int]:
    """Seeds whose nodes have a cap below the shard count and crash (so that survivors could
    take over more than their cap), taking dead owners over by their locks or not."""
    out = []
    for seed in range(400):
        s = Settings.draw(seed)
        if (
            s.max_shards is not None
            and s.max_shards < s.shards
            and s.crash_rate
            and s.probes_locks == probes
        ):
            out.append(seed)
        if len(out) == count:
            break
    return out


def test_some_seeds_cap_their_nodes_at_or_above_their_share() -> None:
    drawn = [Settings.draw(seed) for seed in range(200)]
    capped = [s for s in drawn if s.max_shards is not None]
    assert 0 < len(capped) < len(drawn)
    assert all(s.max_shards is not None and s.max_shards * s.nodes >= s.shards for s in capped)
    # Given a cluster size, the cap follows it (the cluster can still hold every shard).
    given = Settings.draw(capped[0].seed, nodes=1)
    assert given.max_shards is not None and given.max_shards >= given.shards


def test_capped_nodes_that_take_dead_owners_over_stay_within_their_cap() -> None:
    seeds = capped_seeds(3, probes=True) + capped_seeds(2, probes=False)
    assert len(seeds) == 5, seeds
    crashes = 0
    for seed in seeds:
        outcome = run(Settings.draw(seed))
        assert outcome.ok, (seed, outcome.world_violations[:3], outcome.report.violations[:3])
        crashes += outcome.counters["crashes"]
    assert crashes > 0


def test_nodes_run_without_their_cap_are_caught() -> None:
    """The negative control: the world checks a cap the nodes do not keep."""
    outcome = run(Settings.draw(0, unsafe_no_cap=True))
    assert any("above its cap of" in v for v in outcome.world_violations), outcome.world_violations
    twin = run(Settings.draw(0, faults_of="no-cap"))
    assert twin.ok, (twin.world_violations[:3], twin.report.violations[:3])
