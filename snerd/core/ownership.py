"""Shard ownership for one node: claims in membership.json, shard locks, renewals, release.

Theory of operation (docs/architecture.md, "Ownership, as built"). membership.json holds, per shard, a claim
`{owner, lease_expiry, epoch, renewals}`. A node claims a shard by writing its own claim with
`epoch + 1` (under `.membership.lock`, conditional on the version it read), then takes
`shard-N/.lock` with a non-blocking flock. Only when both hold does the shard become *active*:
its log is read, a `claim` record carrying the new epoch is appended (fencing older epochs), and
only then does the node dispatch from it. If the flock is busy, the previous owner's process is
still alive: the shard stays *paused* for this node, which retries the lock and never deletes
another node's claim (upstream bug 6.3.15). Claims are renewed every `ttl / 3`; a drain releases
claims and locks so another node can take over at once.

The document rule (`check_membership`). membership.json is input from disk: a human may edit
it, another program may write it. Every reader in snerd takes it through `parse_membership`, which
accepts upstream's shape plus snerd's additions and refuses anything else with
`MembershipInvalid` naming the problem: a shard count outside 1..`MAX_QUEUE_SHARDS`, a claim
that is not an object naming its owner and lease expiry, a counter that is not a whole number
(`MAX_COUNT` at most). The rest of this module may then trust the shapes it reads.

This module owns the decisions about claims; it never touches a file. The node composes it and
turns its answers into effects. Where flock proves liveness (one host, a local filesystem) a
node that takes a shard's lock has proof that its claimant is dead and takes over at once
(docs/architecture.md, "Ownership, as built").

Lapse rule. A challenger may take over a claim only when BOTH hold: its wall
clock is past `lease_expiry + skew_margin` (upstream's rule, kept so upstream daemons and snerd
agree), and it has itself seen that claim unchanged for `ttl + skew_margin` on its own monotonic
clock (`Observer`). The second rule uses no other node's clock reading at all, so no clock
offset and no wall-clock step can make a live owner look dead; only clock *rates* matter. The
owner, for its part, counts its lease from the start of its last renewal known to have
committed and stops acting when `ttl` has passed on its own monotonic clock. With rates within
`1 ± r`, the challenger's wait of at least `(ttl + margin) / (1 + r)` true seconds after the
renewal committed outlasts the owner's `ttl / (1 - r)` whenever
`r <= margin / (2 ttl + margin)` (7.7 % with the defaults 30 s and 5 s).

Fair shares. Every node writes a heartbeat under `nodes` in membership.json at
each round; a node is live for an observer while its heartbeat keeps changing (the same
observation rule). With `S` shards and `N` live nodes a node holds at most
`cap = ceil(S / N)` (and `max_shards`), claims free and lapsed shards up to it, and gives back
shards above it. When a live node holds fewer than `S // N` while every shard is held, the
nodes at `cap` beyond the `S % N` that may stay there give one back, lowest ranked (by node id)
first, so a cluster converges to counts that differ by at most one.

Caps (`max_shards`, SNERD_MAX_SHARDS). A node never claims beyond its cap, not even a shard
whose owner it has proven dead (`plan_claims`): what the cap forbids stays free, and the node
says so once (`ClaimPlan.left_free`) rather than claiming and handing back. Its heartbeat
carries the cap, so `validate` can tell a shard left free by caps from one nobody noticed.

A process that ends without its drain (an exception unwinding it, its runtime cancelled) acts
for nothing any more: the shell writes `withdrawal` (its claims and heartbeat gone, as a drain
leaves them) and lets its locks go unmarked, as a killed process does, so a successor takes
over at once either way (a free shard; or a lock free under a claim: `lock_names_claim`).
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from snerd.core.timefmt import format_rfc3339, parse_rfc3339

#: Top-level key of membership.json holding the highest epoch per shard (snerd's addition).
EPOCHS_KEY = "epochs"
#: Top-level key of membership.json holding each node's heartbeat (snerd's addition).
NODES_KEY = "nodes"
#: The queue name of a document a daemon or `add-shards` creates (upstream's).
DEFAULT_QUEUE = "snerdmq-daemon"
#: The most shards a queue may have (the ceiling of SNERD_SHARDS in `snerd.config`, and of
#: `add-shards`). Every membership round walks every shard (claims, what the node observed,
#: its probes), so a count far beyond any deployment's stops a daemon answering
#: (`"shards": 1000000000` did).
MAX_QUEUE_SHARDS = 4096
#: The largest counter (version, epoch, renewals, beat) membership.json may hold: 2**53 - 1,
#: the largest integer every JSON reader keeps exactly (RFC 8259 §6), and far enough below
#: orjson's 64-bit limit that counting on from it can never make the file unwritable.
MAX_COUNT = 2**53 - 1

__all__ = [
    "DEFAULT_QUEUE",
    "EPOCHS_KEY",
    "LEASE_STATES",
    "MAX_COUNT",
    "MAX_QUEUE_SHARDS",
    "NODES_KEY",
    "ClaimPlan",
    "ClaimView",
    "LockText",
    "MembershipInvalid",
    "Observer",
    "OwnershipConfig",
    "ShardPhase",
    "check_membership",
    "claim_epoch",
    "claim_owner",
    "claim_signature",
    "claim_view",
    "claimable",
    "fair_cap",
    "give_back",
    "grow",
    "initial_doc",
    "lease_state",
    "live_foreign",
    "lock_names_claim",
    "owned_by",
    "parse_membership",
    "plan_claims",
    "proof_room",
    "shard_name",
    "with_claims",
    "with_heartbeat",
    "withdrawal",
    "without_claims",
]


class MembershipInvalid(ValueError):
    """membership.json holds something that is not a membership document: bad input from disk
    (a hand edit, another program), never a caller bug. The message says what is wrong, in
    words a person can act on; readers add the file's path."""


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _shown(value: Any) -> str:
    """A value for an error message: a scalar as JSON, cut short (a file may hold anything, at
    any length); an array or object by its kind only (it may be nested past any printer)."""
    if isinstance(value, str | int | float | bool) or value is None:
        text = repr(value) if isinstance(value, float) else orjson.dumps(value).decode()
        return text if len(text) <= 60 else text[:57] + "..."
    return _type_name(value)


def _counter(value: Any, what: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_COUNT:
        raise MembershipInvalid(
            f"{what} is {_shown(value)}, not a whole number from 0 to {MAX_COUNT}"
        )


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise MembershipInvalid(f"{what} is {_type_name(value)}, not an object")
    return value


def check_membership(doc: Any) -> dict[str, Any]:
    """`doc` (parsed JSON) if it is a membership document; else `MembershipInvalid`.

    A document is an object with `shards`, a whole number from 1 to `MAX_QUEUE_SHARDS`; and,
    each optional: `version`, a counter (0 to `MAX_COUNT`); `queue`, a string; `claims`, an
    object whose every value is a claim: an object with a non-empty `owner` string and a
    `lease_expiry` string (one that does not parse as RFC 3339 is kept: such a claim is never
    taken over, and `validate` shows it for a human to look at), and counters `epoch` and
    `renewals` when present; `epochs`, an object of counters; `nodes`, an object of heartbeat
    objects (`beat` a counter, `seen` a string, `types` an array of strings, `max_shards` a
    count, each when present). Keys neither upstream nor snerd writes are allowed (upstream
    ignores them too). (A counter at the very ceiling is accepted; the write that counts past
    it makes a file the next read refuses, as any unusable one: 2**53 renewals take millions
    of years, so only a hand-made file gets there.)"""
    top = _object(doc, "the document")
    shards = top.get("shards")
    if (
        not isinstance(shards, int)
        or isinstance(shards, bool)
        or not 1 <= shards <= MAX_QUEUE_SHARDS
    ):
        got = "missing" if "shards" not in top else f"{_shown(shards)}"
        raise MembershipInvalid(
            f"'shards' is {got}, not a whole number from 1 to {MAX_QUEUE_SHARDS}"
        )
    if "version" in top:
        _counter(top["version"], "'version'")
    queue = top.get("queue")
    if queue is not None and not isinstance(queue, str):
        raise MembershipInvalid(f"'queue' is {_type_name(queue)}, not a string")
    for name, claim in _object(top.get("claims", {}), "'claims'").items():
        what = f"the claim of {_shown(name)}"
        claim = _object(claim, what)
        owner = claim.get("owner")
        if not isinstance(owner, str) or not owner:
            raise MembershipInvalid(f"{what} has no owner (a non-empty string)")
        if not isinstance(claim.get("lease_expiry"), str):
            raise MembershipInvalid(f"{what} has no lease_expiry (an RFC 3339 string)")
        for key in ("epoch", "renewals"):
            if key in claim:
                _counter(claim[key], f"{what}: '{key}'")
    for name, epoch in _object(top.get(EPOCHS_KEY, {}), f"'{EPOCHS_KEY}'").items():
        _counter(epoch, f"the epoch of {_shown(name)}")
    for name, beat in _object(top.get(NODES_KEY, {}), f"'{NODES_KEY}'").items():
        what = f"the heartbeat of {_shown(name)}"
        beat = _object(beat, what)
        if "beat" in beat:
            _counter(beat["beat"], f"{what}: 'beat'")
        if "seen" in beat and not isinstance(beat["seen"], str):
            raise MembershipInvalid(f"{what}: 'seen' is {_type_name(beat['seen'])}, not a string")
        types = beat.get("types", [])
        if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
            raise MembershipInvalid(f"{what}: 'types' is not an array of strings")
        if "max_shards" in beat:
            cap = beat["max_shards"]
            if not isinstance(cap, int) or isinstance(cap, bool) or not 1 <= cap <= MAX_COUNT:
                raise MembershipInvalid(f"{what}: 'max_shards' is {_shown(cap)}, not a count")
    return top


def parse_membership(data: bytes) -> dict[str, Any]:
    """The membership document in `data` (membership.json's bytes), checked by
    `check_membership`; `MembershipInvalid` when it is not one (empty, not JSON, not UTF-8,
    or the wrong shape)."""
    if not data.strip():
        raise MembershipInvalid("the file is empty")
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise MembershipInvalid(f"not valid JSON ({exc})") from None
    return check_membership(doc)


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
    #: whether that node's process is gone (only where flock proves liveness: docs/deployment.md).
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
    #: Negative control of the simulator (`--unsafe-wall-clock-only`): judge a lapse on the
    #: wall clock alone, as upstream does, without the monotonic observation rule. Unsafe
    #: under clock steps; never set outside the simulator.
    unsafe_wall_clock_only: bool = False

    @property
    def lapse_us(self) -> int:
        """How long a claim must be seen unchanged before it counts as lapsed."""
        return self.ttl_us + self.skew_margin_us

    @property
    def renew_interval_us(self) -> int:
        """Renewals happen every third of the lease, so two may fail before it runs out."""
        return self.ttl_us // 3


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimView:
    """One shard's claim as read from membership.json."""

    owner: str | None
    lease_expiry_us: int | None
    #: The claim's own epoch (`claim_epoch`: the shard's highest, released claims included).
    epoch: int
    renewals: int
    #: `lease_expiry` as written (None: absent, or not a string).
    lease_expiry: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)


def claim_view(doc: dict[str, Any], shard: int) -> ClaimView:
    """The claim `doc` holds for `shard`, the one parser of claims for every reader (the
    node, the operator tools, the dashboard). A field that is not what snerd or upstream
    writes reads as absent, so a reader that shows a document it did not check (`validate`
    on a hand-edited file) gets a view, never an exception."""
    claims = doc.get("claims") or {}
    raw = claims.get(shard_name(shard)) if isinstance(claims, dict) else None
    if not isinstance(raw, dict):
        return ClaimView(owner=None, lease_expiry_us=None, epoch=0, renewals=0)
    text = raw.get("lease_expiry")
    expiry: int | None
    try:
        expiry = parse_rfc3339(str(text))
    except ValueError:
        expiry = None
    epoch = raw.get("epoch")
    renewals = raw.get("renewals")
    return ClaimView(
        owner=raw.get("owner") if isinstance(raw.get("owner"), str) else None,
        lease_expiry=text if isinstance(text, str) else None,
        lease_expiry_us=expiry,
        epoch=epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else 0,
        renewals=renewals if isinstance(renewals, int) and not isinstance(renewals, bool) else 0,
        raw=raw,
    )


@dataclass(frozen=True, slots=True)
class LockText:
    """What a `shard-N/.lock` file says about the process that took the lock last:
    `<pid>\n<owner>\n<epoch>\n` (snerd; the epoch of the claim it was taken under, 0 for
    none), followed by `released\n` once that process let the lock go itself, alive and
    acting on (a process that dies holding the lock never writes it, nor does one that lets
    its locks go because it is ending without its drain: both are gone for good),
    `<pid>\n<owner>\n` (snerd before epochs) or `<pid>` (upstream)."""

    pid: int | None = None
    owner: str | None = None
    epoch: int | None = None
    released: bool = False

    def render(self) -> str:
        tail = "released\n" if self.released else ""
        return f"{self.pid}\n{self.owner}\n{self.epoch}\n{tail}"

    @classmethod
    def parse(cls, text: str) -> LockText:
        """Whatever the file holds (it is input from disk): a field that is not what snerd or
        upstream writes reads as absent."""
        lines = text.split()
        pid = _decimal(lines[0]) if lines else None
        owner = lines[1] if len(lines) > 1 else None
        epoch = _decimal(lines[2]) if len(lines) > 2 else None
        released = len(lines) > 3 and lines[3] == "released"
        return cls(pid=pid, owner=owner, epoch=epoch, released=released)


def _decimal(text: str) -> int | None:
    """`text` as a whole number if it is ASCII digits of a 64-bit one (`str.isdigit` also
    takes `²`, which `int` refuses, and `int` refuses more than 4300 digits)."""
    if text.isascii() and text.isdigit() and len(text) <= 19:
        return int(text)
    return None


def lock_names_claim(text: LockText, doc: dict[str, Any], shard: int) -> bool:
    """Whether the lock file's `text`, as its last holder left it, says that holder took the
    lock under the claim `doc` has for `shard` and did not let it go itself: then that lock
    found free means the claimant's process died holding it (not that it has yet to take it,
    nor that it stepped down, alive: a holder that unlocks marks the file `released`).

    A snerd claim: the file names its owner and epoch. Upstream's claim (no epoch; upstream
    writes only its pid into the lock file): the file holds just the pid in the owner's id
    (`<host>@pid-<pid>`)."""
    view = claim_view(doc, shard)
    if view.owner is None:
        return False
    if text.released:
        return False
    if "epoch" in view.raw:
        return text.owner == view.owner and text.epoch == claim_epoch(doc, shard)
    _, _, pid = view.owner.rpartition("@pid-")
    return text.owner is None and text.pid is not None and pid == str(text.pid)


def claim_signature(doc: dict[str, Any], shard: int) -> tuple[Any, ...] | None:
    """What changes whenever a shard's claim is written (owner, epoch, renewals, expiry):
    equal signatures read at two moments mean nobody rewrote the claim between them (None:
    no claim)."""
    raw = (doc.get("claims") or {}).get(shard_name(shard))
    if not isinstance(raw, dict):
        return None
    return (raw.get("owner"), raw.get("epoch"), raw.get("renewals"), raw.get("lease_expiry"))


def claim_owner(doc: dict[str, Any], shard: int) -> str | None:
    """The owner a shard's claim names (None: free)."""
    return _owner_of(doc, shard)


def _owner_of(doc: dict[str, Any], shard: int) -> str | None:
    """The owner a shard's claim names (None: free), without parsing the rest of the claim."""
    raw = (doc.get("claims") or {}).get(shard_name(shard))
    if not isinstance(raw, dict):
        return None
    owner = raw.get("owner")
    return owner if isinstance(owner, str) else None


def _holdings(doc: dict[str, Any]) -> dict[str, int]:
    """How many shards each owner's claims name."""
    out: dict[str, int] = {}
    for shard in range(int(doc.get("shards", 0))):
        owner = _owner_of(doc, shard)
        if owner is not None:
            out[owner] = out.get(owner, 0) + 1
    return out


def claim_epoch(doc: dict[str, Any], shard: int) -> int:
    """The highest epoch ever recorded for a shard (0 when never claimed by snerd).

    Epochs also live outside the claims, under `EPOCHS_KEY`, because a released shard has no
    claim (upstream's shape: an absent key means free) and its epoch must not start over.
    """
    epochs = doc.get(EPOCHS_KEY) or {}
    recorded = epochs.get(shard_name(shard), 0) if isinstance(epochs, dict) else 0
    if not isinstance(recorded, int) or isinstance(recorded, bool):
        recorded = 0
    return max(recorded, claim_view(doc, shard).epoch)


def initial_doc(*, queue: str, shards: int) -> dict[str, Any]:
    """A fresh membership document: no claims yet (upstream shape plus nothing else)."""
    assert 1 <= shards <= MAX_QUEUE_SHARDS
    return {"queue": queue, "shards": shards, "version": 0, "claims": {}}


def grow(doc: dict[str, Any] | None, n: int, *, queue: str = DEFAULT_QUEUE) -> dict[str, Any]:
    """membership.json after `add-shards n`: `n` more shards and the version counted on, every
    claim and epoch kept (shards are never removed; tasks stay where they are). A directory
    without a document gets a queue of `n` shards at version 1: written where none was, it is
    the document's first change (`initial_doc` is version 0, what a daemon starts from)."""
    assert n >= 1, n
    if doc is None:
        return {**initial_doc(queue=queue, shards=n), "version": 1}
    shards = doc["shards"]
    assert isinstance(shards, int) and not isinstance(shards, bool) and shards >= 0, shards
    assert shards + n <= MAX_QUEUE_SHARDS, (shards, n)
    version = doc.get("version", 0)
    version = version if isinstance(version, int) else 0
    return {**doc, "shards": shards + n, "version": version + 1}


#: The states of a claim's lease on a reader's wall clock (`lease_state`).
LEASE_STATES = ("free", "live", "grace", "lapsed", "unparseable")


def lease_state(claim: ClaimView, now_us: int, config: OwnershipConfig) -> str:
    """One of `LEASE_STATES`: `free` (no owner), `unparseable` (an expiry that does not parse:
    daemons never take such a claim over), `live` (not expired at `now_us`), `grace` (expired,
    within the skew margin) or `lapsed` (past `lease_expiry + skew_margin`: upstream's wall
    rule, the half of `claimable`'s rule a reader without an `Observer` can judge)."""
    if claim.owner is None:
        return "free"
    if claim.lease_expiry_us is None:
        return "unparseable"
    if now_us <= claim.lease_expiry_us:
        return "live"
    if now_us <= claim.lease_expiry_us + config.skew_margin_us:
        return "grace"
    return "lapsed"


def claimable(
    doc: dict[str, Any],
    *,
    node_id: str,
    wall_us: int,
    config: OwnershipConfig,
    proven_dead: frozenset[int] = frozenset(),
    observer: Observer | None = None,
    mono_us: int = 0,
) -> list[int]:
    """Shards this node may claim now, lowest first: free, already its own, lapsed, or held by a
    node whose death this node has proven by taking the shard's lock.

    A claim is lapsed when `wall_us > lease_expiry + skew_margin` (upstream's rule) and, given
    an `observer`, when this node has also seen it unchanged for `ttl + skew_margin` on its
    monotonic clock. A claim whose expiry does not parse is never lapsed by the wall rule: a
    human must look (the caller logs it). No fair share or `max_shards` cut is made here.
    """
    shards = int(doc.get("shards", 0))
    out: list[int] = []
    for shard in range(shards):
        owner = _owner_of(doc, shard)
        if owner is None or owner == node_id or shard in proven_dead:
            out.append(shard)
            continue
        if (
            observer is not None
            and not config.unsafe_wall_clock_only
            and not observer.claim_unchanged_for(shard, config.lapse_us, mono_us)
        ):
            continue  # (checked first: it is cheaper than parsing the expiry)
        if lease_state(claim_view(doc, shard), wall_us, config) != "lapsed":
            continue
        out.append(shard)
    return out


@dataclass(slots=True)
class Observer:
    """What this node has seen of membership.json, timed on its own monotonic clock.

    For each shard's claim and each node's heartbeat it keeps the content last seen and when
    that content was first seen. Nothing another node wrote is compared with this node's
    clocks: only *that* something changed, and how long ago this node noticed (the
    Kubernetes lease rule, reference §3.2 scheme M).
    """

    claims: dict[int, tuple[Any, int]] = field(default_factory=dict)
    nodes: dict[str, tuple[Any, int]] = field(default_factory=dict)

    def observe(self, doc: dict[str, Any], mono_us: int) -> None:
        """Note a fresh read of membership.json at `mono_us`."""
        for shard in range(int(doc.get("shards", 0))):
            signature = claim_signature(doc, shard)
            seen = self.claims.get(shard)
            if seen is None or seen[0] != signature:
                self.claims[shard] = (signature, mono_us)
        beats = doc.get(NODES_KEY)
        beats = beats if isinstance(beats, dict) else {}
        for node, beat in beats.items():
            beat_text = repr(beat)
            seen_node = self.nodes.get(node)
            if seen_node is None or seen_node[0] != beat_text:
                self.nodes[node] = (beat_text, mono_us)
        for node in [n for n in self.nodes if n not in beats]:
            del self.nodes[node]

    def claim_unchanged_for(self, shard: int, span_us: int, mono_us: int) -> bool:
        seen = self.claims.get(shard)
        return seen is not None and mono_us - seen[1] >= span_us

    def live_nodes(self, *, node_id: str, mono_us: int, config: OwnershipConfig) -> list[str]:
        """Nodes whose heartbeat changed within `ttl + skew_margin` (this node always)."""
        live = {
            node
            for node, (_, first_seen) in self.nodes.items()
            if mono_us - first_seen < config.lapse_us
        }
        live.add(node_id)
        return sorted(live)


def fair_cap(shards: int, live_nodes: int, config: OwnershipConfig) -> int:
    """The most shards one node should hold: `ceil(shards / live_nodes)`, and `max_shards`."""
    assert live_nodes >= 1
    cap = -(-shards // live_nodes)
    if config.max_shards is not None:
        cap = min(cap, config.max_shards)
    return cap


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimPlan:
    """What one membership round of a node claims (`plan_claims`)."""

    #: Shards to claim or renew, lowest first.
    wanted: list[int]
    #: Shards whose owner this node proved dead but which its cap leaves to others: the
    #: locks the proofs took go back.
    proofs_dropped: list[int]
    #: Claimable shards the fair share would give this node but `max_shards` forbids: left
    #: free (to other nodes, if any has room).
    left_free: list[int]


def plan_claims(
    doc: dict[str, Any],
    *,
    node_id: str,
    candidates: list[int],
    proofs: Collection[int],
    live: int,
    config: OwnershipConfig,
) -> ClaimPlan:
    """Which of `candidates` (from `claimable`) a node claims this round, with `live` nodes
    counted for the fair share and `proofs` the shards whose lock it took as proof of their
    owner's death.

    It keeps its own shards and takes over proven-dead owners' shards beyond its fair share
    (the dead node's heartbeat may look fresh for a while, so the share is too small until
    the node is counted out), then free and lapsed ones up to the share. `max_shards` bounds
    what it claims: it never claims a shard only to hand it back. (Shards it holds already
    stay wanted, even past the cap: their claims must be renewed while it acts for them, and
    `give_back` hands the excess over, stepping down before the write that frees them.)"""
    mine = set(owned_by(doc, node_id))
    own = [s for s in candidates if s in mine]
    proven = [s for s in candidates if s in proofs and s not in mine]
    limit = config.max_shards
    dropped: list[int] = []
    if limit is not None:
        keep = max(0, limit - len(own))
        proven, dropped = proven[:keep], proven[keep:]
    held = own + proven
    shards = int(doc["shards"])
    rest = [s for s in candidates if s not in mine and s not in proofs]
    room = max(0, fair_cap(shards, live, config) - len(held))
    wanted = sorted(held + rest[:room])
    left_free: list[int] = []
    if limit is not None:
        share = max(0, -(-shards // live) - len(held))
        left_free = rest[room:share]
    return ClaimPlan(wanted=wanted, proofs_dropped=dropped, left_free=left_free)


def proof_room(
    doc: dict[str, Any],
    *,
    node_id: str,
    wanted: Collection[int],
    proofs: Collection[int],
    config: OwnershipConfig,
) -> int | None:
    """How many more shards of other nodes a node may try the locks of, for proof that their
    owner is gone: a proof holds the lock until the shard is claimed, so no more than its room
    under `max_shards` once what it claims (`wanted`, and what `doc` gives it) and the proofs
    it seeks or holds are counted (None: no cap)."""
    if config.max_shards is None:
        return None
    held = set(wanted) | set(owned_by(doc, node_id)) | set(proofs)
    return max(0, config.max_shards - len(held))


def give_back(
    doc: dict[str, Any], *, node_id: str, live: list[str], config: OwnershipConfig
) -> int:
    """How many of its shards `node_id` should give back now for an even spread.

    Above `cap` it gives back the excess. At `cap` it gives back one only when every shard is
    held, some live node holds fewer than `shards // N`, and more nodes sit at `cap` than the
    `shards % N` that may: the lowest ranked of those (greatest node id) give, so the nodes do
    not all give at once.
    """
    shards = int(doc.get("shards", 0))
    n = len(live)
    cap = fair_cap(shards, n, config)
    holdings = _holdings(doc)
    held = {node: holdings.get(node, 0) for node in live}
    mine = held.get(node_id, 0)
    if mine > cap:
        return mine - cap
    if config.max_shards is not None and config.max_shards < -(-shards // n):
        # Capped below its share: the cap is this node's own limit, and what it gave back
        # would stay free. (At a cap equal to the share it evens out like any node.)
        return 0
    free = shards - sum(holdings.values())
    base = shards // n
    if mine < cap or free > 0 or not any(count < base for count in held.values()):
        return 0
    at_cap = sorted(node for node, count in held.items() if count >= cap)
    allowed = shards % n if shards % n else n
    return 1 if node_id in at_cap[allowed:] else 0


def with_heartbeat(
    doc: dict[str, Any],
    *,
    node_id: str,
    wall_us: int,
    live: list[str] | None,
    types: list[str] | None = None,
    max_shards: int | None = None,
) -> dict[str, Any]:
    """A new document carrying this node's heartbeat (one more beat, the task types its SDK
    has handlers for when `types` is given, its cap when it has one), and without the
    heartbeats of nodes not in `live` (None: keep them all). Bumps `version`."""
    new = dict(doc)
    beats = doc.get(NODES_KEY)
    beats = dict(beats) if isinstance(beats, dict) else {}
    if live is not None:
        beats = {node: beat for node, beat in beats.items() if node in live}
    mine = beats.get(node_id)
    count = mine.get("beat", 0) if isinstance(mine, dict) else 0
    beats[node_id] = {
        "beat": count + 1 if isinstance(count, int) else 1,
        "seen": format_rfc3339(wall_us),
    }
    if types is not None:
        beats[node_id]["types"] = list(types)
    if max_shards is not None:
        beats[node_id]["max_shards"] = max_shards
    new[NODES_KEY] = beats
    new["version"] = int(doc.get("version", 0)) + 1
    return new


def with_claims(
    doc: dict[str, Any],
    *,
    node_id: str,
    shards: Iterable[int],
    wall_us: int,
    config: OwnershipConfig,
    anew: Collection[int] = (),
) -> dict[str, Any]:
    """A new document where `node_id` holds (claims or renews) each of `shards`.

    A renewal keeps the epoch and counts one more renewal; a claim of a shard owned by someone
    else (or nobody) bumps the epoch, which fences every record the previous owner writes. So
    does a claim of a shard in `anew`, though the claim names `node_id` already: one it
    stopped acting for (its lease ran out, say), whose next tenure is a new one.
    """
    new = dict(doc)
    claims = dict(doc.get("claims") or {})
    epochs = dict(doc.get(EPOCHS_KEY) or {})
    expiry = format_rfc3339(wall_us + config.ttl_us)
    for shard in shards:
        view = claim_view(doc, shard)
        if view.owner == node_id and shard not in anew:
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


def without_claims(
    doc: dict[str, Any], *, node_id: str, shards: Iterable[int] | None = None
) -> dict[str, Any]:
    """A new document with the claims of `node_id` on `shards` removed (None: every claim, and
    its heartbeat too: a drain hands everything over)."""
    new = dict(doc)
    names = None if shards is None else {shard_name(s) for s in shards}
    claims = {
        key: value
        for key, value in (doc.get("claims") or {}).items()
        if not (
            isinstance(value, dict)
            and value.get("owner") == node_id
            and (names is None or key in names)
        )
    }
    new["claims"] = claims
    if shards is None and isinstance(doc.get(NODES_KEY), dict):
        new[NODES_KEY] = {k: v for k, v in doc[NODES_KEY].items() if k != node_id}
    new["version"] = int(doc.get("version", 0)) + 1
    return new


def withdrawal(doc: dict[str, Any], *, node_id: str) -> dict[str, Any] | None:
    """What a node that stops acting without its drain leaves in membership.json: no claim
    and no heartbeat of its own, as a finished drain does (`without_claims`), so successors
    find its shards free and take them at once. None when `doc` names it nowhere."""
    beats = doc.get(NODES_KEY)
    if not owned_by(doc, node_id) and not (isinstance(beats, dict) and node_id in beats):
        return None
    return without_claims(doc, node_id=node_id)


def live_foreign(doc: dict[str, Any], *, node_id: str) -> list[int]:
    """Shards claimed by some other node (lapsed or not)."""
    return [s for s in range(int(doc.get("shards", 0))) if _owner_of(doc, s) not in (None, node_id)]


def owned_by(doc: dict[str, Any], node_id: str) -> list[int]:
    """Shards whose claim names `node_id`."""
    return [s for s in range(int(doc.get("shards", 0))) if _owner_of(doc, s) == node_id]
