"""Several nodes on one shared disk (the in-memory shell): leases, lapses, fair shares."""

from __future__ import annotations

from snerd.core import events as ev
from snerd.core.node import NodeConfig, NodePhase
from snerd.core.ownership import OwnershipConfig
from tests.fakeshell import SECOND, FakeShell


def node(name: str, disk: dict | None = None, shards: int = 1, **ownership: object) -> FakeShell:
    config = NodeConfig(
        node_id=f"{name}@pid-1-x",
        new_queue_shards=shards,
        ownership=OwnershipConfig(**ownership),  # type: ignore[arg-type]
    )
    return FakeShell(config, disk=disk)


def run(shells: list[FakeShell], seconds: int) -> None:
    """Advance every shell's clocks together, one second at a time."""
    for _ in range(seconds):
        for sh in shells:
            sh.advance(1)


def test_a_node_whose_renewals_fail_stops_acting_when_its_lease_runs_out() -> None:
    a = node("a")
    a.start()
    a.register("t")
    assert a.node.owned_shards == [0]
    a.fail_membership = True  # membership.json unreachable: no renewal can commit
    run([a], 29)
    assert a.node.owned_shards == [0]  # the lease (30 s from the last round's start) holds
    a.hold_appends = True
    a.enqueue("late")  # its record is on its way when the lease runs out
    run([a], 2)
    assert a.node.owned_shards == []
    # The lock is kept until the record on its way has landed: the next owner, who needs the
    # lock, then reads it before writing its claim.
    assert a.disk["locks"] == {0: "a@pid-1-x"}
    a.hold_appends = False
    a.release_held()  # the record lands after all
    assert a.disk["locks"] == {}  # ...and the lock is given up
    replies = [m for m in a.sent if m.get("task_id") == "late"]
    assert [m["action"] for m in replies] == ["error"]  # never acked by a node that lost it
    assert "changed owner before the enqueue was confirmed" in replies[0]["message"]
    # Membership comes back: the claim still names it, so it takes the shard up again.
    a.fail_membership = False
    run([a], 2)
    assert a.node.owned_shards == [0]
    assert "late" in a.node.tasks  # found in the log on reload: it runs after all


def test_a_stepped_wall_clock_does_not_make_a_live_owner_look_dead() -> None:
    a = node("a")
    a.start()
    b = node("b", a.disk)
    b.wall += 3600 * SECOND  # `date -s` an hour ahead: every lease looks long expired
    b.start()
    run([a, b], 120)
    assert (a.node.owned_shards, b.node.owned_shards) == ([0], [])
    assert a.disk["membership"]["claims"]["shard-0"]["epoch"] == 1


def test_with_the_wall_clock_alone_a_stepped_clock_steals_a_live_shard() -> None:
    """The negative control: upstream's rule alone takes a live owner's shard."""
    a = node("a", unsafe_wall_clock_only=True)
    a.start()
    b = node("b", a.disk, unsafe_wall_clock_only=True)
    b.wall += 3600 * SECOND
    b.start()
    assert a.disk["membership"]["claims"]["shard-0"]["owner"] == "b@pid-1-x"
    run([a, b], 15)
    assert a.node.owned_shards == []  # stepped down at its next round


def test_a_dead_owner_is_taken_over_after_its_claim_is_seen_unchanged_for_ttl_plus_margin() -> None:
    a = node("a")
    a.start()
    a.register("t")
    a.enqueue("x")  # running on a when it dies
    b = node("b", a.disk)
    b.start()
    run([a, b], 5)
    a.disk["locks"].clear()  # a's process is gone (kill -9): its lock with it
    a.node.phase = NodePhase.STOPPED
    run([b], 30)
    assert b.node.owned_shards == []
    run([b], 15)
    assert b.node.owned_shards == [0]
    assert b.disk["membership"]["claims"]["shard-0"]["epoch"] == 2
    b.register("t")
    assert b.executed_ids() == ["x"]  # at-least-once: the unfinished attempt runs again


def test_nodes_converge_to_an_even_spread_and_back_when_one_leaves() -> None:
    a = node("a", shards=4)
    a.start()
    assert a.node.owned_shards == [0, 1, 2, 3]
    b = node("b", a.disk)
    c = node("c", a.disk)
    b.start()
    c.start()
    run([a, b, c], 60)
    counts = sorted(len(sh.node.owned_shards) for sh in (a, b, c))
    assert counts == [1, 1, 2]
    owners = [sh.node.owned_shards for sh in (a, b, c)]
    assert sorted(s for o in owners for s in o) == [0, 1, 2, 3]  # each shard owned once
    # c drains: its shards are handed back at once and the others share them.
    c.feed(ev.DrainRequested(reason="test"))
    run([a, b, c], 20)
    assert c.node.phase is NodePhase.STOPPED
    assert sorted(len(sh.node.owned_shards) for sh in (a, b)) == [2, 2]


def test_a_drain_removes_its_claims_even_after_its_lease_ran_out() -> None:
    a = node("a")
    a.start()
    a.register("t")
    a.enqueue("slow")  # running: the drain waits for it
    a.feed(ev.DrainRequested(reason="test"))
    # The process is stopped (SIGSTOP) past its lease and the drain timeout, then resumes.
    a.wall += 40 * SECOND
    a.mono += 40 * SECOND
    a.feed(ev.Tick())
    assert a.node.phase is NodePhase.STOPPED
    doc = a.disk["membership"]
    assert doc["claims"] == {}  # handed over: nobody waits for a lapse
    assert "a@pid-1-x" not in doc.get("nodes", {})
