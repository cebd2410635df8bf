"""Claims in membership.json: who may claim what, epochs, renewals and releases."""

from __future__ import annotations

import pytest

from snerd.config import ConfigError, load_settings
from snerd.core.ownership import (
    MAX_COUNT,
    MAX_QUEUE_SHARDS,
    NODES_KEY,
    LockText,
    MembershipInvalid,
    Observer,
    OwnershipConfig,
    check_membership,
    claim_epoch,
    claim_view,
    claimable,
    fair_cap,
    give_back,
    grow,
    initial_doc,
    lease_state,
    live_foreign,
    lock_names_claim,
    owned_by,
    parse_membership,
    plan_claims,
    proof_room,
    with_claims,
    with_heartbeat,
    withdrawal,
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
    doc = with_claims(
        doc_with("other", T - 60 * S), node_id="me", shards=[0], wall_us=T, config=CFG
    )
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
    upstream["claims"] = {
        "shard-0": {"owner": "h@pid-4242", "lease_expiry": "2999-01-01T00:00:00Z"}
    }
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


def test_a_capped_node_at_its_share_gives_back_like_any_node() -> None:
    # 4 shards, 3 nodes capped at 2, holding 2, 2, 0: the cap equals the share, so one gives
    # (uncapped nodes do the same) and the newcomer is not left with nothing.
    at_share = OwnershipConfig(max_shards=2)
    doc = claimed({"a": [0, 1], "b": [2, 3], "c": []}, 4)
    live = ["a", "b", "c"]
    assert [give_back(doc, node_id=n, live=live, config=at_share) for n in live] == [0, 1, 0]
    # Capped below the share (1 < 2), nobody gives: what it gave would stay free.
    below = OwnershipConfig(max_shards=1)
    doc = claimed({"a": [0], "b": [1], "c": []}, 4)
    assert [give_back(doc, node_id=n, live=live, config=below) for n in live] == [0, 0, 0]


def test_a_plan_never_goes_beyond_the_cap_and_names_what_it_leaves_free() -> None:
    capped = OwnershipConfig(max_shards=2)
    doc = claimed({"me": [2, 3], "dead": [0, 1]}, 4)
    # Both of dead's shards proven dead, dead still counted live: without a cap, all four.
    plan = plan_claims(
        doc, node_id="me", candidates=[0, 1, 2, 3], proofs=[0, 1], live=2, config=CFG
    )
    assert plan.wanted == [0, 1, 2, 3] and plan.proofs_dropped == [] and plan.left_free == []
    # Capped at 2: its own two, and the proofs go back.
    plan = plan_claims(
        doc, node_id="me", candidates=[0, 1, 2, 3], proofs=[0, 1], live=2, config=capped
    )
    assert plan.wanted == [2, 3] and plan.proofs_dropped == [0, 1]
    # Alone, with dead's claims lapsed: its share is 4, its cap 2, so two are left free.
    doc = claimed({"me": [2, 3]}, 4)
    plan = plan_claims(doc, node_id="me", candidates=[0, 1, 2, 3], proofs=[], live=1, config=capped)
    assert plan.wanted == [2, 3] and plan.left_free == [0, 1]
    # With room: it takes what it may and leaves the rest free.
    doc = claimed({"me": [3]}, 4)
    plan = plan_claims(doc, node_id="me", candidates=[0, 1, 2, 3], proofs=[], live=1, config=capped)
    assert plan.wanted == [0, 3] and plan.left_free == [1, 2]
    # At a cap no smaller than the share, nothing is said to be left free.
    plan = plan_claims(
        claimed({"me": []}, 4),
        node_id="me",
        candidates=[0, 1, 2, 3],
        proofs=[],
        live=2,
        config=capped,
    )
    assert plan.wanted == [0, 1] and plan.left_free == []


def test_proofs_are_sought_only_within_the_cap() -> None:
    doc = claimed({"me": [0], "other": [1, 2, 3]}, 4)
    assert proof_room(doc, node_id="me", wanted=[0], proofs=[], config=CFG) is None
    capped = OwnershipConfig(max_shards=2)
    assert proof_room(doc, node_id="me", wanted=[0], proofs=[], config=capped) == 1
    assert proof_room(doc, node_id="me", wanted=[0], proofs=[1], config=capped) == 0
    assert proof_room(doc, node_id="me", wanted=[], proofs=[], config=capped) == 1


def test_a_heartbeat_carries_the_cap_and_a_withdrawal_leaves_nothing_of_the_node() -> None:
    doc = claimed({"me": [0], "other": [1]}, 2)
    doc = with_heartbeat(doc, node_id="me", wall_us=T, live=None, max_shards=3)
    doc = with_heartbeat(doc, node_id="other", wall_us=T, live=None)
    assert doc[NODES_KEY]["me"]["max_shards"] == 3 and "max_shards" not in doc[NODES_KEY]["other"]
    check_membership(doc)
    gone = withdrawal(doc, node_id="me")
    assert gone is not None and owned_by(gone, "me") == [] and "me" not in gone[NODES_KEY]
    assert owned_by(gone, "other") == [1] and gone["version"] == doc["version"] + 1
    assert withdrawal(gone, node_id="me") is None  # nothing to write


def test_what_snerd_and_upstream_write_is_a_membership_document() -> None:
    doc = claimed({"a": [0], "b": [1]}, 2)
    doc = with_heartbeat(doc, node_id="a", wall_us=T, live=None, types=["t"], max_shards=2)
    assert check_membership(doc) is doc
    upstream = {
        "queue": "snerdmq-daemon",
        "shards": 2,
        "version": 7,
        "claims": {"shard-0": {"owner": "old@pid-4242", "lease_expiry": "2020-01-01T00:00:00Z"}},
    }
    assert check_membership(upstream) is upstream
    # An unparseable expiry is kept: such a claim is never taken over, and validate shows it.
    odd = {**upstream, "claims": {"shard-0": {"owner": "x", "lease_expiry": "soon"}}}
    assert check_membership(odd) is odd
    assert parse_membership(b'{"shards": 1}') == {"shards": 1}  # the rest is optional


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"", "the file is empty"),
        (b"  \n", "the file is empty"),
        (b"nope", "not valid JSON"),
        (b'{"shards": 1', "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[1]", "the document is an array, not an object"),
        (b'"x"', "the document is a string, not an object"),
        (b"{}", "'shards' is missing, not a whole number from 1 to 4096"),
        (b'{"shards": "x"}', "'shards' is \"x\", not a whole number from 1 to 4096"),
        (b'{"shards": -1}', "'shards' is -1, not a whole number"),
        (b'{"shards": 0}', "'shards' is 0, not a whole number"),
        (b'{"shards": true}', "'shards' is true, not a whole number"),
        (b'{"shards": 1.5}', "'shards' is 1.5, not a whole number"),
        (b'{"shards": 1000000000}', "'shards' is 1000000000, not a whole number from 1 to 4096"),
        (b'{"shards": 1, "version": -1}', "'version' is -1, not a whole number from 0 to"),
        (b'{"shards": 1, "version": 9007199254740992}', "'version' is 9007199254740992"),
        (b'{"shards": 1, "version": "3"}', "'version' is \"3\""),
        (b'{"shards": 1, "queue": 5}', "'queue' is a number, not a string"),
        (b'{"shards": 1, "claims": [1]}', "'claims' is an array, not an object"),
        (b'{"shards": 1, "claims": null}', "'claims' is null, not an object"),
        (b'{"shards": 1, "claims": {"shard-0": 1}}', 'the claim of "shard-0" is a number'),
        (b'{"shards": 1, "claims": {"shard-0": {}}}', 'the claim of "shard-0" has no owner'),
        (
            b'{"shards": 1, "claims": {"shard-0": {"owner": "a"}}}',
            'the claim of "shard-0" has no lease_expiry',
        ),
        (
            b'{"shards": 1, "claims": {"shard-0": {"owner": "a", "lease_expiry": "x", '
            b'"epoch": "2"}}}',
            'the claim of "shard-0": \'epoch\' is "2"',
        ),
        (b'{"shards": 1, "epochs": {"shard-0": -3}}', 'the epoch of "shard-0" is -3'),
        (b'{"shards": 1, "nodes": {"a": []}}', 'the heartbeat of "a" is an array'),
        (b'{"shards": 1, "nodes": {"a": {"types": [1]}}}', "'types' is not an array of strings"),
        (b'{"shards": 1, "nodes": {"a": {"max_shards": 0}}}', "'max_shards' is 0, not a count"),
    ],
)
def test_anything_else_is_refused_with_what_is_wrong(data: bytes, problem: str) -> None:
    with pytest.raises(MembershipInvalid) as caught:
        parse_membership(data)
    assert problem in str(caught.value)


def test_the_shard_ceiling_is_the_one_snerd_shards_has() -> None:
    # A queue SNERD_SHARDS may create is one the rule accepts, and no larger one.
    top = str(MAX_QUEUE_SHARDS)
    assert load_settings({"SNERD_SHARDS": top}).node.new_queue_shards == MAX_QUEUE_SHARDS
    with pytest.raises(ConfigError):
        load_settings({"SNERD_SHARDS": str(MAX_QUEUE_SHARDS + 1)})
    assert check_membership({"shards": MAX_QUEUE_SHARDS})
    assert MAX_COUNT == 2**53 - 1


def test_a_lock_file_holding_anything_reads_as_fields_absent_never_an_error() -> None:
    assert LockText.parse("\u00b2\nowner\n\u00b3\n") == LockText(owner="owner")
    assert LockText.parse("9" * 5000) == LockText()  # past int()'s digit limit
    assert LockText.parse("12\nx\n3\nreleased\n") == LockText(
        pid=12, owner="x", epoch=3, released=True
    )


# ------------------------------------------------------------------------------ readers' rules


def test_one_claim_parser_reads_what_is_there_and_anything_else_as_absent() -> None:
    view = claim_view(doc_with("a@pid-1-aa", T, epoch=4), 0)
    assert (view.owner, view.lease_expiry_us, view.epoch) == ("a@pid-1-aa", T, 4)
    assert view.lease_expiry == format_rfc3339(T)
    assert claim_view(doc_with("a", T), 1).owner is None
    odd = {"shards": 1, "claims": {"shard-0": {"owner": 3, "lease_expiry": 5, "epoch": True}}}
    view = claim_view(odd, 0)
    assert (view.owner, view.lease_expiry, view.lease_expiry_us, view.epoch) == (None, None, None, 0)
    # A document nobody checked (a hand-edited file `validate` shows) never raises.
    assert claim_view({"claims": [1]}, 0).owner is None
    assert claim_epoch({"claims": {}, "epochs": [2]}, 0) == 0


@pytest.mark.parametrize(
    ("expiry_s", "state"),
    [(12, "live"), (0, "live"), (-3, "grace"), (-5, "grace"), (-6, "lapsed"), (None, "free")],
)
def test_lease_states_on_a_readers_wall_clock(expiry_s: int | None, state: str) -> None:
    doc = initial_doc(queue="q", shards=1) if expiry_s is None else doc_with("a", T + expiry_s * S)
    assert lease_state(claim_view(doc, 0), T, CFG) == state
    if state == "lapsed":  # the wall half of the takeover rule agrees
        assert 0 in claimable(doc, node_id="b", wall_us=T, config=CFG)


def test_an_unparseable_expiry_has_its_own_lease_state() -> None:
    doc = doc_with("a", T)
    doc["claims"]["shard-0"]["lease_expiry"] = "tomorrow"
    view = claim_view(doc, 0)
    assert lease_state(view, T, CFG) == "unparseable" and view.lease_expiry == "tomorrow"


def test_growing_a_queue_adds_shards_and_counts_the_version_on() -> None:
    doc = doc_with("a", T)
    doc["version"] = 7
    grown = grow(doc, 3)
    assert (grown["shards"], grown["version"]) == (5, 8)
    assert grown["claims"] == doc["claims"] and doc["shards"] == 2  # the input is not changed
    check_membership(grown)
    fresh = grow(None, 2)
    assert fresh == {"queue": "snerdmq-daemon", "shards": 2, "version": 1, "claims": {}}
    check_membership(fresh)
    with pytest.raises(AssertionError):
        grow(initial_doc(queue="q", shards=MAX_QUEUE_SHARDS), 1)
