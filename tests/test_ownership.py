"""Claims in membership.json: who may claim what, epochs, renewals and releases."""

from __future__ import annotations

from snerd.core.ownership import (
    NODES_KEY,
    LockText,
    Observer,
    OwnershipConfig,
    claim_epoch,
    claimable,
    fair_cap,
    give_back,
    initial_doc,
    live_foreign,
    lock_names_claim,
    owned_by,
    with_claims,
    with_heartbeat,
    without_claims,
)
from snerd.core.timefmt import format_rfc3339

S = 1_000_000
T = 1_800_000_000 * S
CFG = OwnershipConfig(ttl_us=30 * S, skew_margin_us=5 * S)


def doc_with(owner: str, expiry_us: int, epoch: int = 3) -> dict:
    doc = initial_doc(queue="q", shards=2)
    doc["claims"] = {
        "shard-0": {"owner": owner, "lease_expiry": format_rfc3339(expiry_us), "epoch": epoch}
    }
    return doc


def test_free_own_and_lapsed_claims_are_claimable_but_a_live_one_is_not() -> None:
    doc = doc_with("other", T + 10 * S)
    assert claimable(doc, node_id="me", wall_us=T, config=CFG) == [1]
    assert claimable(doc, node_id="other", wall_us=T, config=CFG) == [0, 1]
    # Lapsed only past expiry + skew margin (upstream: not at 35 s, at 36 s).
    assert claimable(doc, node_id="me", wall_us=T + 15 * S, config=CFG) == [1]
    assert claimable(doc, node_id="me", wall_us=T + 15 * S + 1, config=CFG) == [0, 1]
    # Proof of death (the lock was free where flock proves liveness) overrides the lease.
    dead = frozenset({0})
    assert claimable(doc, node_id="me", wall_us=T, config=CFG, proven_dead=dead) == [0, 1]
    assert live_foreign(doc, node_id="me") == [0]


def test_an_unparseable_expiry_is_never_treated_as_lapsed() -> None:
    doc = doc_with("other", T)
    doc["claims"]["shard-0"]["lease_expiry"] = "soon"
    assert claimable(doc, node_id="me", wall_us=T + 3600 * S, config=CFG) == [1]


def test_claims_bump_the_epoch_renewals_keep_it_and_releases_remember_it() -> None:
    doc = doc_with("other", T - 60 * S, epoch=3)
    mine = with_claims(doc, node_id="me", shards=[0, 1], wall_us=T, config=CFG)
    assert mine["version"] == doc["version"] + 1
    assert owned_by(mine, "me") == [0, 1]
    assert mine["claims"]["shard-0"]["epoch"] == 4  # taken over: fences epoch 3
    assert mine["claims"]["shard-1"]["epoch"] == 1
    assert mine["claims"]["shard-0"]["lease_expiry"] == format_rfc3339(T + 30 * S)
    renewed = with_claims(mine, node_id="me", shards=[0], wall_us=T + 10 * S, config=CFG)
    assert renewed["claims"]["shard-0"]["epoch"] == 4
    assert renewed["claims"]["shard-0"]["renewals"] == 1
    released = without_claims(renewed, node_id="me")
    assert released["claims"] == {}  # upstream's shape: an absent key means free
    assert claim_epoch(released, 0) == 4  # ...but the epoch is not forgotten
    again = with_claims(released, node_id="next", shards=[0], wall_us=T, config=CFG)
    assert again["claims"]["shard-0"]["epoch"] == 5


def test_a_renewal_of_a_shard_stepped_down_from_is_a_new_claim_when_asked_anew() -> None:
    doc = with_claims(doc_with("other", T - 60 * S), node_id="me", shards=[0], wall_us=T, config=CFG)
    assert doc["claims"]["shard-0"]["epoch"] == 4
    again = with_claims(doc, node_id="me", shards=[0, 1], wall_us=T, config=CFG, anew=[0])
    assert again["claims"]["shard-0"]["epoch"] == 5  # a new tenure: fences the last one
    assert again["claims"]["shard-0"]["renewals"] == 0
    assert claim_epoch(again, 0) == 5
    assert again["claims"]["shard-1"]["epoch"] == 1  # `anew` changes only what it names


def test_a_lock_file_names_a_claim_only_if_taken_under_that_very_claim() -> None:
    doc = doc_with("a@pid-7-x", T, epoch=3)
    assert lock_names_claim(LockText(pid=7, owner="a@pid-7-x", epoch=3), doc, 0)
    # Taken under an earlier claim of the same node (it claimed the shard anew since, and has
    # not taken the lock yet), or by the owner before it, or by nobody: not this claim.
    assert not lock_names_claim(LockText(pid=7, owner="a@pid-7-x", epoch=2), doc, 0)
    assert not lock_names_claim(LockText(pid=6, owner="b@pid-6-y", epoch=3), doc, 0)
    assert not lock_names_claim(LockText(pid=7), doc, 0)
    assert not lock_names_claim(LockText(), doc, 0)
    assert not lock_names_claim(LockText(pid=7, owner="a@pid-7-x", epoch=3), doc, 1)  # no claim
    # Let go by its holder, alive (stepped down, handed over, drained): proves nothing.
    assert not lock_names_claim(LockText(pid=7, owner="a@pid-7-x", epoch=3, released=True), doc, 0)
    # Upstream's claim (no epoch) and lock file (its pid only): the pid in the owner's id.
    upstream = initial_doc(queue="q", shards=1)
    upstream["claims"] = {"shard-0": {"owner": "h@pid-4242", "lease_expiry": "2999-01-01T00:00:00Z"}}
    assert lock_names_claim(LockText(pid=4242), upstream, 0)
    assert not lock_names_claim(LockText(pid=4243), upstream, 0)  # another's pid: never held
    assert not lock_names_claim(LockText(pid=4242, owner="h@pid-4242-ab", epoch=1), upstream, 0)
    assert not lock_names_claim(LockText(), upstream, 0)


def test_lock_text_reads_what_snerd_and_upstream_write() -> None:
    text = LockText(pid=12, owner="h@pid-12-ab", epoch=5)
    assert LockText.parse(text.render()) == text
    assert LockText.parse("4242") == LockText(pid=4242)  # upstream
    assert LockText.parse("12\nh@pid-12-ab\n") == LockText(pid=12, owner="h@pid-12-ab")
    assert LockText.parse("") == LockText()
    assert LockText.parse("x\ny\nz\n") == LockText(owner="y")  # garbage reads as unknown
    released = LockText(pid=12, owner="h@pid-12-ab", epoch=5, released=True)
    assert released.render() == "12\nh@pid-12-ab\n5\nreleased\n"
    assert LockText.parse(released.render()) == released


def test_a_lapse_also_needs_the_claim_seen_unchanged_for_ttl_plus_margin_on_our_own_clock() -> None:
    doc = doc_with("other", T)  # expired long ago by the wall clock
    seen = Observer()
    seen.observe(doc, mono_us=100 * S)
    late_wall = T + 3600 * S  # a wall clock stepped far ahead proves nothing
    assert claimable(doc, node_id="me", wall_us=late_wall, config=CFG) == [0, 1]
    assert claimable(
        doc, node_id="me", wall_us=late_wall, config=CFG, observer=seen, mono_us=134 * S
    ) == [1]
    assert claimable(
        doc, node_id="me", wall_us=late_wall, config=CFG, observer=seen, mono_us=135 * S
    ) == [0, 1]
    # A renewal (any change) restarts the wait.
    renewed = with_claims(doc, node_id="other", shards=[0], wall_us=T - 40 * S, config=CFG)
    seen.observe(renewed, mono_us=135 * S)
    assert claimable(
        renewed, node_id="me", wall_us=late_wall, config=CFG, observer=seen, mono_us=160 * S
    ) == [1]
    # Both rules must hold: seen unchanged for long, but not yet expired by the wall clock.
    assert claimable(
        renewed, node_id="me", wall_us=T - 20 * S, config=CFG, observer=seen, mono_us=999 * S
    ) == [1]
    # The negative control judges on the wall clock alone.
    unsafe = OwnershipConfig(ttl_us=30 * S, skew_margin_us=5 * S, unsafe_wall_clock_only=True)
    assert claimable(
        renewed, node_id="me", wall_us=late_wall, config=unsafe, observer=seen, mono_us=136 * S
    ) == [0, 1]


def test_heartbeats_make_nodes_live_until_they_stop_changing() -> None:
    doc = initial_doc(queue="q", shards=4)
    doc = with_heartbeat(doc, node_id="a", wall_us=T, live=None)
    doc = with_heartbeat(doc, node_id="b", wall_us=T, live=None)
    assert doc[NODES_KEY]["a"]["beat"] == 1
    seen = Observer()
    seen.observe(doc, mono_us=0)
    assert seen.live_nodes(node_id="me", mono_us=34 * S, config=CFG) == ["a", "b", "me"]
    doc = with_heartbeat(doc, node_id="a", wall_us=T, live=None)
    seen.observe(doc, mono_us=20 * S)
    assert seen.live_nodes(node_id="me", mono_us=35 * S, config=CFG) == ["a", "me"]
    # Dead nodes' heartbeats are pruned by whoever writes next.
    pruned = with_heartbeat(doc, node_id="me", wall_us=T, live=["a", "me"])
    assert sorted(pruned[NODES_KEY]) == ["a", "me"]
    assert pruned[NODES_KEY]["a"]["beat"] == 2
    gone = without_claims(pruned, node_id="a")
    assert sorted(gone[NODES_KEY]) == ["me"]


def claimed(owners: dict[str, list[int]], shards: int) -> dict:
    doc = initial_doc(queue="q", shards=shards)
    for node, mine in owners.items():
        doc = with_claims(doc, node_id=node, shards=mine, wall_us=T, config=CFG)
    return doc


def test_fair_cap_is_the_ceiling_share_and_max_shards() -> None:
    assert fair_cap(4, 3, CFG) == 2
    assert fair_cap(6, 3, CFG) == 2
    assert fair_cap(1, 2, CFG) == 1
    assert fair_cap(8, 1, OwnershipConfig(max_shards=3)) == 3


def test_give_back_converges_to_counts_that_differ_by_at_most_one() -> None:
    # A node above the ceiling gives the excess back.
    doc = claimed({"a": [0, 1, 2, 3], "b": []}, 4)
    assert give_back(doc, node_id="a", live=["a", "b"], config=CFG) == 2
    assert give_back(doc, node_id="b", live=["a", "b"], config=CFG) == 0
    # 4 shards, 3 nodes holding 2, 2, 0: one of the two at the ceiling gives one (the lowest
    # ranked), so the spread becomes 2, 1, 1 and not 1, 1, 0 with a shard bouncing around.
    doc = claimed({"a": [0, 1], "b": [2, 3], "c": []}, 4)
    live = ["a", "b", "c"]
    assert [give_back(doc, node_id=n, live=live, config=CFG) for n in live] == [0, 1, 0]
    # While a shard is free the needy node claims it; nobody gives.
    doc = claimed({"a": [0, 1], "b": [2], "c": []}, 4)
    assert [give_back(doc, node_id=n, live=live, config=CFG) for n in live] == [0, 0, 0]
    # Even already: 2, 1, 1.
    doc = claimed({"a": [0, 1], "b": [2], "c": [3]}, 4)
    assert [give_back(doc, node_id=n, live=live, config=CFG) for n in live] == [0, 0, 0]
    # A node's own max_shards is not a share of the cluster: it never gives back for it.
    capped = OwnershipConfig(max_shards=1)
    doc = claimed({"a": [0], "b": []}, 1)
    assert give_back(doc, node_id="a", live=["a", "b"], config=capped) == 0
