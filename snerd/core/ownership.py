"""Shard ownership for one node: claims in membership.json, shard locks, renewals, release.

Theory of operation (DESIGN.md §4). membership.json holds, per shard, a claim
`{owner, lease_expiry, epoch, renewals}`. A node claims a shard by writing its own claim with
`epoch + 1` (under `.membership.lock`, conditional on the version it read), then takes
`shard-N/.lock` with a non-blocking flock. Only when both hold does the shard become *active*:
its log is read, a `claim` record carrying the new epoch is appended (fencing older epochs), and
only then does the node dispatch from it. If the flock is busy, the previous owner's process is
still alive: the shard stays *paused* for this node, which retries the lock and never deletes
another node's claim (upstream bug 6.3.15). Claims are renewed every `ttl / 3`; a drain releases
claims and locks so another node can take over at once.

This module owns the decisions about claims; it never touches a file. The node composes it and
turns its answers into effects. The lapse rule here is upstream's wall-clock one; where flock
proves liveness (one host, a local filesystem) a node that takes a shard's lock has proof that
its claimant is dead and takes over at once (DESIGN §4.8). The monotonic observation rule of
DESIGN §4.1 and fair shares for many daemons come with the ownership core of the simulator
issue.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from snerd.core.timefmt import format_rfc3339, parse_rfc3339

#: Top-level key of membership.json holding the highest epoch per shard (snerd's addition).
EPOCHS_KEY = "epochs"

__all__ = [
    "EPOCHS_KEY",
    "ClaimView",
    "OwnershipConfig",
    "ShardPhase",
    "claim_epoch",
    "claimable",
    "initial_doc",
    "live_foreign",
    "owned_by",
    "shard_name",
    "with_claims",
    "without_claims",
]


def shard_name(shard: int) -> str:
    """The directory and claim key of a shard: `shard-N`."""
    return f"shard-{shard}"


class ShardPhase(enum.Enum):
    """Where one shard stands for this node."""

    #: Not ours.
    UNOWNED = "unowned"
    #: Claimed in membership.json; taking `shard-N/.lock`.
    LOCKING = "locking"
    #: Claimed, but the lock is held by another process; retried later.
    PAUSED = "paused"
    #: Claimed by another node whose lease is still live; this node tries the lock to learn
    #: whether that node's process is gone (only where flock proves liveness, DESIGN §4.8).
    PROBING = "probing"
    #: Locked; its log is being read.
    LOADING = "loading"
    #: Log read; the `claim` record with our epoch is being appended.
    FENCING = "fencing"
    #: Ours: tasks are dispatched from it.
    ACTIVE = "active"


@dataclass(frozen=True, slots=True, kw_only=True)
class OwnershipConfig:
    """Lease parameters, in microseconds."""

    #: Lease length (upstream: 30 s).
    ttl_us: int = 30_000_000
    #: Extra time a challenger waits past `lease_expiry` (SNERD_CLOCK_SKEW_MARGIN, default 5 s).
    skew_margin_us: int = 5_000_000
    #: Most shards this node claims (None: no limit beyond its fair share).
    max_shards: int | None = None

    @property
    def renew_interval_us(self) -> int:
        """Renewals happen every third of the lease, so two may fail before it runs out."""
        return self.ttl_us // 3


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimView:
    """One shard's claim as read from membership.json."""

    owner: str | None
    lease_expiry_us: int | None
    epoch: int
    renewals: int
    raw: dict[str, Any] = field(default_factory=dict)


def _claim_view(doc: dict[str, Any], shard: int) -> ClaimView:
    claims = doc.get("claims") or {}
    raw = claims.get(shard_name(shard))
    if not isinstance(raw, dict):
        return ClaimView(owner=None, lease_expiry_us=None, epoch=0, renewals=0)
    expiry: int | None
    try:
        expiry = parse_rfc3339(str(raw.get("lease_expiry")))
    except ValueError:
        expiry = None
    epoch = raw.get("epoch")
    renewals = raw.get("renewals")
    return ClaimView(
        owner=raw.get("owner") if isinstance(raw.get("owner"), str) else None,
        lease_expiry_us=expiry,
        epoch=epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else 0,
        renewals=renewals if isinstance(renewals, int) and not isinstance(renewals, bool) else 0,
        raw=raw,
    )


def claim_epoch(doc: dict[str, Any], shard: int) -> int:
    """The highest epoch ever recorded for a shard (0 when never claimed by snerd).

    Epochs also live outside the claims, under `EPOCHS_KEY`, because a released shard has no
    claim (upstream's shape: an absent key means free) and its epoch must not start over.
    """
    recorded = (doc.get(EPOCHS_KEY) or {}).get(shard_name(shard), 0)
    if not isinstance(recorded, int) or isinstance(recorded, bool):
        recorded = 0
    return max(recorded, _claim_view(doc, shard).epoch)


def initial_doc(*, queue: str, shards: int) -> dict[str, Any]:
    """A fresh membership document: no claims yet (upstream shape plus nothing else)."""
    assert shards >= 1
    return {"queue": queue, "shards": shards, "version": 0, "claims": {}}


def claimable(
    doc: dict[str, Any],
    *,
    node_id: str,
    wall_us: int,
    config: OwnershipConfig,
    proven_dead: frozenset[int] = frozenset(),
) -> list[int]:
    """Shards this node may claim now: free, already its own, lapsed on the wall clock, or
    held by a node whose death this node has proven by taking the shard's lock.

    A claim is lapsed when `wall_us > lease_expiry + skew_margin` (upstream's rule). A claim
    whose expiry does not parse is treated as lapsed only through the same rule failing
    closed: it is not claimable (a human must look), and the caller logs it.
    """
    shards = int(doc.get("shards", 0))
    out: list[int] = []
    for shard in range(shards):
        view = _claim_view(doc, shard)
        if view.owner is None or view.owner == node_id or shard in proven_dead or (view.lease_expiry_us is not None and (
            wall_us > view.lease_expiry_us + config.skew_margin_us
        )):
            out.append(shard)
    if config.max_shards is not None:
        out = out[: config.max_shards]
    return out


def with_claims(
    doc: dict[str, Any],
    *,
    node_id: str,
    shards: Iterable[int],
    wall_us: int,
    config: OwnershipConfig,
) -> dict[str, Any]:
    """A new document where `node_id` holds (claims or renews) each of `shards`.

    A renewal keeps the epoch and counts one more renewal; a claim of a shard owned by someone
    else (or nobody) bumps the epoch, which fences every record the previous owner writes.
    """
    new = dict(doc)
    claims = dict(doc.get("claims") or {})
    epochs = dict(doc.get(EPOCHS_KEY) or {})
    expiry = format_rfc3339(wall_us + config.ttl_us)
    for shard in shards:
        view = _claim_view(doc, shard)
        if view.owner == node_id:
            epoch, renewals = view.epoch, view.renewals + 1
        else:
            epoch, renewals = max(view.epoch, claim_epoch(doc, shard)) + 1, 0
        epochs[shard_name(shard)] = epoch
        claims[shard_name(shard)] = {
            **view.raw,
            "owner": node_id,
            "lease_expiry": expiry,
            "epoch": epoch,
            "renewals": renewals,
        }
    new["claims"] = claims
    new[EPOCHS_KEY] = epochs
    new["version"] = int(doc.get("version", 0)) + 1
    return new


def without_claims(doc: dict[str, Any], *, node_id: str) -> dict[str, Any]:
    """A new document with every claim of `node_id` removed (a drain hands shards over)."""
    new = dict(doc)
    claims = {
        key: value
        for key, value in (doc.get("claims") or {}).items()
        if not (isinstance(value, dict) and value.get("owner") == node_id)
    }
    new["claims"] = claims
    new["version"] = int(doc.get("version", 0)) + 1
    return new


def live_foreign(doc: dict[str, Any], *, node_id: str) -> list[int]:
    """Shards claimed by some other node (lapsed or not)."""
    return [
        s
        for s in range(int(doc.get("shards", 0)))
        if _claim_view(doc, s).owner not in (None, node_id)
    ]


def owned_by(doc: dict[str, Any], node_id: str) -> list[int]:
    """Shards whose claim names `node_id`."""
    return [s for s in range(int(doc.get("shards", 0))) if _claim_view(doc, s).owner == node_id]
