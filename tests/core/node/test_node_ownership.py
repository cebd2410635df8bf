"""Several nodes on one shared disk (the in-memory shell): leases, lapses, fair shares."""

from __future__ import annotations

from snerd.core import effects as fx
from snerd.core import events as ev
from snerd.core.node import NodeConfig, NodePhase
from snerd.core.ownership import LockText, OwnershipConfig
from tests.support.fakeshell import SECOND, FakeShell


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


def prober(name: str, disk: dict | None = None, shards: int = 1) -> FakeShell:
    """A node on a local filesystem: a claimant whose shard lock is free counts as dead."""
    config = NodeConfig(
        node_id=f"{name}@pid-1-x", new_queue_shards=shards, lock_proves_liveness=True
    )
    return FakeShell(config, disk=disk)


def test_a_shard_handed_over_keeps_its_lock_until_the_claim_is_gone_so_no_prober_thinks_it_dead() -> (
    None
):
    a = prober("a", shards=2)
    a.start()
    assert a.node.owned_shards == [0, 1]
    b = prober("b", a.disk)
    b.start()
    # Hold a's membership writes one at a time until one hands a shard over to even out the
    # shares: a stops acting for it at once, but that write has not landed yet.
    handed: list[str] = []
    for _ in range(60):
        a.hold_membership = True
        run([a, b], 1)
        claims = a.disk["membership"]["claims"]
        for effect in a.held_membership:
            after = effect.doc["claims"]
            handed += [
                key
                for key, claim in claims.items()
                if claim["owner"] == "a@pid-1-x" and key not in after
            ]
        if handed:
            break
        a.release_membership()
    assert handed == ["shard-1"]
    assert a.node.owned_shards == [0]
    # membership.json still names a for it, and its lock is still a's: b, reading the file
    # meanwhile and trying the locks of what others claim, finds the lock busy.
    assert a.disk["membership"]["claims"]["shard-1"]["owner"] == "a@pid-1-x"
    assert a.disk["locks"][1] == "a@pid-1-x"
    run([b], 3)
    assert not [m for _, m in b.logs_out if "process is gone" in m]
    assert b.node.dead_nodes == {}
    assert "a@pid-1-x" in b.disk["membership"]["nodes"]  # b keeps a's heartbeat: a is live
    # b wrote meanwhile, so a's write fails (the file changed) and the claim stays a's: a
    # keeps the lock and takes the shard up again, until a later round hands it over for
    # good; the lock goes with the claim, and b takes the shard over.
    a.release_membership()
    assert a.disk["membership"]["claims"]["shard-1"]["owner"] == "a@pid-1-x"
    assert a.disk["locks"][1] == "a@pid-1-x"
    run([a, b], 20)
    assert sorted([*a.node.owned_shards, *b.node.owned_shards]) == [0, 1]
    assert len(a.node.owned_shards) == len(b.node.owned_shards) == 1
    assert a.disk["locks"] == {
        **{s: "a@pid-1-x" for s in a.node.owned_shards},
        **{s: "b@pid-1-x" for s in b.node.owned_shards},
    }
    assert set(a.disk["membership"]["nodes"]) == {"a@pid-1-x", "b@pid-1-x"}
    assert b.node.dead_nodes == {}


def test_a_drain_gives_its_locks_up_only_once_its_claims_are_removed() -> None:
    a = prober("a", shards=2)
    a.start()
    b = prober("b", a.disk)
    b.start()
    run([a, b], 30)
    assert sorted([*a.node.owned_shards, *b.node.owned_shards]) == [0, 1]
    mine = {f"shard-{s}" for s in a.node.owned_shards}
    [mine_shard] = a.node.owned_shards
    mine_epoch = a.disk["membership"]["claims"][f"shard-{mine_shard}"]["epoch"]
    a.hold_membership = True
    a.feed(ev.DrainRequested(reason="test"))
    run([a], 1)
    assert a.held_membership  # the release is on its way
    assert {
        k for k, c in a.disk["membership"]["claims"].items() if c["owner"] == "a@pid-1-x"
    } == mine
    assert {f"shard-{s}" for s, owner in a.disk["locks"].items() if owner == "a@pid-1-x"} == mine
    run([b], 2)
    assert b.node.dead_nodes == {}
    a.release_membership()
    assert a.node.phase is NodePhase.STOPPED
    assert "a@pid-1-x" not in a.disk["locks"].values()
    # Let go alive: marked released.
    assert a.disk["lock_files"][mine_shard] == LockText(
        owner="a@pid-1-x", epoch=mine_epoch, released=True
    )
    run([b], 12)  # b's next round claims the freed shard
    assert b.node.owned_shards == [0, 1]
    assert b.node.dead_nodes == {}


def test_a_lock_still_held_after_stepping_down_proves_nothing_about_the_next_owner() -> None:
    a = prober("a")
    a.start()
    a.register("t")
    b = prober("b", a.disk)
    b.start()
    a.fail_membership = True  # a cannot renew: its lease runs out
    a.hold_appends = True
    run([a, b], 29)
    a.enqueue("late")  # its record is on its way when a steps down
    run([a, b], 2)
    assert a.node.owned_shards == []
    assert a.disk["locks"] == {0: "a@pid-1-x"}  # kept until the record lands
    run([a, b], 10)  # b sees a's claim unchanged past ttl + margin and claims the shard
    assert a.disk["membership"]["claims"]["shard-0"]["owner"] == "b@pid-1-x"
    # a reads membership.json again and tries the locks of what others claim: the lock it
    # still holds itself must not count as b's being gone.
    a.fail_membership = False
    run([a, b], 5)
    assert a.node.dead_nodes == {}
    assert not [m for _, m in a.logs_out if "process is gone" in m]
    a.hold_appends = False
    a.release_held()  # the record lands, the lock goes, and b takes the shard up
    run([a, b], 5)
    assert (a.node.owned_shards, b.node.owned_shards) == ([], [0])
    assert "late" in b.node.tasks


def test_a_shard_stepped_down_from_is_claimed_anew_under_a_new_epoch() -> None:
    a = prober("a")
    a.start()
    a.register("t")
    first = a.disk["membership"]["claims"]["shard-0"]["epoch"]
    assert a.disk["lock_files"][0] == LockText(owner="a@pid-1-x", epoch=first)  # names the claim
    # A renewal stalls on a slow disk until the lease has run out: a stops acting for the
    # shard and gives its lock up (a prober may take it now: a's process looks gone).
    a.hold_membership = True
    run([a], 35)
    assert a.node.owned_shards == []
    assert a.disk["locks"] == {}
    # The renewal lands after all. It renews the tenure that ended: a does not take the lock
    # up again under it, but claims the shard anew, under a new epoch, and only then locks it.
    a.release_membership()
    run([a], 2)
    assert a.node.owned_shards == [0]
    again = a.disk["membership"]["claims"]["shard-0"]["epoch"]
    assert again == first + 1
    assert a.disk["lock_files"][0] == LockText(owner="a@pid-1-x", epoch=again)
    a.enqueue("after")
    assert a.executed_ids() == ["after"]


def test_a_node_is_counted_dead_only_once_the_claim_taking_over_its_shard_lands() -> None:
    a = prober("a", shards=2)
    a.start()
    b = prober("b", a.disk)
    b.start()
    run([a, b], 30)
    owned_a = list(a.node.owned_shards)
    assert len(owned_a) == 1
    a.disk["locks"] = {s: o for s, o in a.disk["locks"].items() if o != "a@pid-1-x"}
    a.node.phase = NodePhase.STOPPED  # a's process is gone (kill -9): its lock with it
    # b's probe finds the lock free under a's claim, and writes its own claim; but another
    # writer changed membership.json meanwhile: the version check refuses b's claim, so
    # nothing is taken over yet and a is not counted dead.
    b.hold_membership = True
    run([b], 2)
    assert b.held_membership
    b.disk["membership"] = {**b.disk["membership"], "version": b.disk["membership"]["version"] + 1}
    b.release_membership()
    assert b.node.dead_nodes == {}
    assert b.node.owned_shards != [0, 1]
    # The next round finds a's claim still unwritten and its lock still free: now it lands.
    run([b], 3)
    assert sorted(b.node.owned_shards) == [0, 1]
    assert list(b.node.dead_nodes) == ["a@pid-1-x"]
    assert [m for _, m in b.logs_out if "process is gone" in m]


def test_a_late_lock_busy_does_not_take_up_a_shard_stepped_down_from() -> None:
    a = node("a")
    a.start()
    a.fail_membership = True
    run([a], 31)  # the lease runs out: a steps down and gives its lock up
    assert a.node.owned_shards == [] and a.disk["locks"] == {}
    # The answer to a TryLock sent before the step-down comes now: busy. The shard is not
    # ours any more; nothing is retried, and a does not take the shard up without a lease.
    a.feed(ev.LockBusy(shard=0))
    run([a], 5)
    assert a.node.owned_shards == []
    assert a.disk["locks"] == {}
    assert not [m for _, m in a.logs_out if "stays paused" in m]


def test_a_dead_owners_free_lock_is_no_reason_to_take_a_claim_written_since() -> None:
    a = prober("a")
    a.start()
    p = prober("p", a.disk)
    p.start()
    a.disk["locks"].clear()  # a's process dies holding its lock (kill -9): the lock goes
    a.node.phase = NodePhase.STOPPED
    # p's probe finds the lock free, its file naming a's claim, not released: a is gone. p's
    # claim of the shard is on its way...
    p.hold_membership = True
    run([p], 2)
    assert p.held_membership and p.disk["locks"] == {0: "p@pid-1-x"}
    # ...when another daemon's claim lands first (a lapse judged on its own clock, say).
    doc = p.disk["membership"]
    doc = {
        **doc,
        "claims": {"shard-0": {**doc["claims"]["shard-0"], "owner": "c@pid-3-z", "epoch": 2}},
        "epochs": {"shard-0": 2},
        "version": doc["version"] + 1,
    }
    p.disk["membership"] = doc
    p.release_membership()  # refused: the file changed
    run([p], 3)
    # The claim p's proof rested on is gone: p lets the lock go and leaves c's claim alone.
    assert p.disk["membership"]["claims"]["shard-0"]["owner"] == "c@pid-3-z"
    assert p.node.owned_shards == [] and p.disk["locks"] == {}
    assert p.node.dead_nodes == {}


def capped(name: str, disk: dict | None = None, shards: int = 1, cap: int = 2) -> FakeShell:
    """A node on a local filesystem (it takes proven-dead owners' shards) with SNERD_MAX_SHARDS."""
    config = NodeConfig(
        node_id=f"{name}@pid-1-x",
        new_queue_shards=shards,
        lock_proves_liveness=True,
        ownership=OwnershipConfig(max_shards=cap),
    )
    return FakeShell(config, disk=disk)


def claims_of(disk: dict, node_id: str) -> list[str]:
    return sorted(k for k, c in disk["membership"]["claims"].items() if c["owner"] == node_id)


def test_a_capped_survivor_never_claims_a_dead_owners_shards_beyond_its_cap() -> None:
    a = capped("a", shards=4)
    a.start()
    b = capped("b", a.disk)
    b.start()
    run([a, b], 30)
    assert sorted(len(sh.node.owned_shards) for sh in (a, b)) == [2, 2]
    # a dies (kill -9): its locks go with it, and b's probe could prove it gone at once.
    a.disk["locks"] = {s: o for s, o in a.disk["locks"].items() if o != "a@pid-1-x"}
    a.node.phase = NodePhase.STOPPED
    a_shards = claims_of(a.disk, "a@pid-1-x")
    kept = b.node.owned_shards
    for _ in range(120):  # past a's lease and its heartbeat's lapse
        run([b], 1)
        assert b.node.owned_shards == kept  # b keeps its own, and takes nothing beyond its cap
    assert not [m for _, m in b.logs_out if "taken over" in m or "handing it over" in m]
    said = [m for _, m in b.logs_out if "left free" in m]
    assert said == [
        f"{', '.join(a_shards)} left free: this daemon holds its cap of 2 (SNERD_MAX_SHARDS); "
        "raise the cap or start another daemon to run them"
    ]  # once, naming the cap
    assert not [m for _, m in b.logs_out if "fair share" in m or "handed over" in m]
    assert (
        b.disk["lock_files"]
        and all(  # b holds no lock of a shard it does not claim
            b.disk["locks"].get(int(k[6:])) != "b@pid-1-x" for k in a_shards
        )
    )
    assert b.disk["membership"]["nodes"]["b@pid-1-x"]["max_shards"] == 2
    # A daemon with room comes: it takes the shards left free.
    c = capped("c", a.disk, cap=4)
    c.start()
    run([b, c], 15)
    assert sorted([*b.node.owned_shards, *c.node.owned_shards]) == [0, 1, 2, 3]


def test_a_capped_node_at_its_share_still_evens_out_with_a_newcomer() -> None:
    # Four shards, caps of 2: at three daemons the share is 2 too, and the cap is no reason
    # to keep a newcomer at nothing.
    a = capped("a", shards=4)
    a.start()
    b = capped("b", a.disk)
    b.start()
    run([a, b], 30)
    c = capped("c", a.disk)
    c.start()
    run([a, b, c], 60)
    assert sorted(len(sh.node.owned_shards) for sh in (a, b, c)) == [1, 1, 2]


class CorruptibleShell(FakeShell):
    """The in-memory shell, whose membership.json can be made unusable: reads and writes are
    then answered as the daemon's shell answers them (`MembershipUnusable`)."""

    problem: str | None = None

    def _do(self, effect: fx.Effect) -> None:
        if self.problem is not None and isinstance(effect, fx.ReadMembership | fx.WriteMembership):
            self.queue.append(ev.MembershipUnusable(problem=self.problem))
            return
        super()._do(effect)


BAD = "/q/membership.json is not a usable membership file: 'shards' is -1, not a whole number"


def test_a_node_refuses_to_start_on_an_unusable_membership_file() -> None:
    sh = CorruptibleShell(NodeConfig(node_id="a@pid-1-x"))
    sh.problem = BAD
    sh.enqueue("early")  # held while starting
    sh.start()
    assert sh.exit_code == 2
    assert sh.node.phase is NodePhase.STOPPED
    [error] = [m for level, m in sh.logs_out if level == "error"]
    assert error.startswith(BAD) and "cannot start on it" in error
    assert [m["task_id"] for m in sh.messages("error")] == ["early"]  # answered: not enqueued
    assert sh.disk["membership"] is None and sh.disk["locks"] == {}  # nothing written, taken


def test_a_running_node_keeps_its_shards_and_says_once_that_membership_json_is_unusable() -> None:
    sh = CorruptibleShell(NodeConfig(node_id="a@pid-1-x"))
    sh.start()
    sh.register("t")
    sh.problem = BAD  # corrupted by hand while the daemon runs
    sh.advance(12)  # a renewal comes due, and is retried every second
    sh.enqueue("during")
    assert sh.node.owned_shards == [0]
    assert sh.executed_ids() == ["during"]  # still served, within its lease
    said = [m for _, m in sh.logs_out if BAD in m]
    assert len(said) == 1 and "keeps acting for the shards it holds" in said[0]
    sh.advance(25)  # past the lease: no renewal could commit
    assert sh.node.owned_shards == []
    assert len([m for _, m in sh.logs_out if BAD in m]) == 1  # once, not once a retry
    sh.problem = None  # fixed
    sh.advance(3)
    assert sh.node.owned_shards == [0]
    assert ("info", "membership.json read and updated again") in sh.logs_out


def test_a_drain_while_membership_json_cannot_be_read_at_start_stops_at_once() -> None:
    sh = FakeShell(NodeConfig(node_id="a@pid-1-x"))
    sh.fail_membership = True  # every read fails (an I/O error, retried)
    sh.start()
    sh.advance(5)
    assert sh.node.phase is NodePhase.STARTING
    assert len([m for _, m in sh.logs_out if "not updated" in m]) == 1  # said once
    sh.enqueue("early")
    sh.feed(ev.DrainRequested(reason="SIGTERM"))  # no time passes
    assert sh.exit_code == 0 and sh.node.phase is NodePhase.STOPPED
    assert [m["task_id"] for m in sh.messages("error")] == ["early"]
    assert any("stopping (SIGTERM) before this daemon could start" in m for _, m in sh.logs_out)
