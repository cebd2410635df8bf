"""Claims in membership.json: who may claim what, epochs, renewals and releases."""

from __future__ import annotations

from snerd.core.ownership import (
    OwnershipConfig,
    claim_epoch,
    claimable,
    initial_doc,
    live_foreign,
    owned_by,
    with_claims,
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
    capped = OwnershipConfig(max_shards=1)
    assert claimable(initial_doc(queue="q", shards=3), node_id="me", wall_us=T, config=capped) == [0]


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
