"""A membership read is a renewal point, and the node says which locks it touches.

The rule (the shards whose lock the node holds: loading, fencing or active) is the core's,
carried by `ReadMembership.touch`; the daemon's shell and the simulated shell touch exactly
those, so a lock a network filesystem took away is noticed at the next round, in both.
"""

from __future__ import annotations

from snerd.core import effects as fx
from snerd.core.node import NodeConfig
from snerd.core.node.model import ShardPhase
from snerd.core.ownership import OwnershipConfig
from tests.support.fakeshell import FakeShell


def _node(name: str, shards: int, disk: dict | None = None) -> FakeShell:
    config = NodeConfig(
        node_id=f"{name}@pid-1-x", new_queue_shards=shards, ownership=OwnershipConfig()
    )
    return FakeShell(config, disk=disk)


def _touched(shell: FakeShell) -> tuple[int, ...]:
    return shell.membership_reads[-1].touch


def test_the_first_read_touches_nothing_and_a_renewal_touches_every_held_lock() -> None:
    a = _node("a", shards=3)
    a.start()
    assert a.membership_reads[0].touch == ()  # nothing is held before the first round
    assert a.node.owned_shards == [0, 1, 2]
    reads = len(a.membership_reads)
    a.advance(11)  # past the renewal interval: the next round
    assert len(a.membership_reads) > reads
    assert sorted(_touched(a)) == [0, 1, 2]


def test_a_shard_given_up_is_no_longer_touched() -> None:
    a = _node("a", shards=2)
    a.start()
    a.advance(11)
    assert sorted(_touched(a)) == [0, 1]
    a.node.shards[1].phase = ShardPhase.UNOWNED  # as a give-back leaves it
    a.node.tenure.read_membership()
    (effect,) = [e for e in a.node.outbox.take() if isinstance(e, fx.ReadMembership)]
    assert effect.touch == (0,)


def test_only_the_phases_that_hold_the_lock_are_touched() -> None:
    a = _node("a", shards=4)
    a.start()
    a.advance(11)
    phases = [ShardPhase.LOCKING, ShardPhase.PROBING, ShardPhase.LOADING, ShardPhase.FENCING]
    for shard, phase in enumerate(phases):
        a.node.shards[shard].phase = phase
    assert a.node.tenure.locked_shards() == (2, 3)
