"""The health of a queue, judged from facts: what `snerdmq validate` decides.

This module owns the judgement: given membership.json, what was found on disk about each shard
(`ShardFacts`: its directory, lock probe, folded log, inbox files; gathered by the caller) and
`now_us`, `judge_health` says per shard whether its lease is live, in grace or lapsed, whether
its epochs are in step and its lock agrees with its claim, per daemon whether its heartbeat is
live, late or stale and whether it holds above its fair share, and which of these are problems
(degraded, exit 1) and which warnings. The texts it says them in are part of the verdict.

The reader has one snapshot and no monotonic observation of its own, so it judges leases and
heartbeats on its wall clock with the skew margin added (`snerd.core.ownership.lease_state`,
upstream's wall rule), and only calls a shard degraded once a running daemon would long since
have acted (`HealthSettings.overdue_us`). The lease rule, the fair share and the claim parser
are the ownership module's; nothing here restates them.

Pure: no I/O and no clock reads. The same inputs give the same report, so every judgement is
tested on a fixed clock (tests/core/test_health.py). It must never gather a fact itself.

`judge_health` judges the daemons first (heartbeats, fair shares, caps, handled types), then
each shard with what that taught (`_Judging`), in the order its findings are printed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from snerd.core.fields import whole_or_none
from snerd.core.ownership import (
    LEASE_STATES,
    ClaimView,
    OwnershipConfig,
    claim_epoch,
    claim_view,
    fair_cap,
    lease_state,
    shard_name,
)
from snerd.core.timefmt import format_span, parse_rfc3339_or_none

__all__ = [
    "DAEMON_STATES",
    "LEASE_STATES",
    "UNUSABLE_MEANS",
    "DaemonHealth",
    "HealthReport",
    "HealthSettings",
    "LockState",
    "QueueFacts",
    "ShardFacts",
    "ShardHealth",
    "judge_health",
]

SECOND = 1_000_000

#: What an unusable membership.json means for the daemons, said by `fsck` and `validate`.
UNUSABLE_MEANS = (
    "a daemon refuses to start on it (exit 2), and a running one claims nothing and stops "
    "acting for its shards when their leases run out; fix the file or restore it"
)


@dataclass(frozen=True, slots=True)
class LockState:
    """Whether a `.lock` file is held, and what it says about its holder (a fact: the probe
    that finds it is `snerd.queuedir.probe_lock`)."""

    #: "held", "free", "absent" (no lock file: never locked) or "refused" (cannot be opened).
    state: str
    pid: int | None = None
    owner: str | None = None

    def holder(self) -> str:
        parts = []
        if self.owner:
            parts.append(self.owner)
        if self.pid is not None:
            parts.append(f"pid {self.pid}")
        return ", ".join(parts) if parts else "an unknown process"

#: Daemon states (`--json` `daemons[].state`).
DAEMON_STATES = ("live", "late", "stale", "no heartbeat")


class HealthSettings(OwnershipConfig):
    """The lease parameters the daemons run with (`OwnershipConfig`: SNERD_LEASE_TTL, default
    30 s; SNERD_CLOCK_SKEW_MARGIN, default 5 s), as the tool reads them from the environment,
    and how long past a lease the tool calls a shard degraded."""

    __slots__ = ()

    @property
    def overdue_us(self) -> int:
        """How long past a lease's expiry (or a heartbeat's `seen`) the tool waits before it
        calls the shard degraded: lease + margin + one renewal. A running daemon takes a lapsed
        claim over once it has seen it unchanged for lease + margin, which it notices within
        one renewal, so by then a healthy cluster has acted."""
        return self.lapse_us + self.renew_interval_us


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardFacts:
    """What the tool found about one shard, besides its claim in membership.json."""

    shard: int
    directory_exists: bool
    lock: LockState
    log_exists: bool
    #: The highest claim epoch in the log (0: no claim record).
    log_epoch: int = 0
    corrupt_lines: int = 0
    torn_tail_bytes: int = 0
    stale_records: int = 0
    #: Why no daemon can use the shard's files (a symbolic link snerd refuses, an entry of the
    #: wrong kind, a log it cannot read); empty when they are fine.
    unusable: tuple[str, ...] = ()
    #: Live tasks by type.
    live_types: dict[str, int] = field(default_factory=dict)
    #: Bytes in the shard's inbox files past what its log says was ingested, and in how many
    #: files (tasks enqueued through other daemons, not yet taken in by an owner).
    inbox_waiting_bytes: int = 0
    inbox_waiting_files: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueFacts:
    """Everything `judge_health` needs besides membership.json and the clock."""

    directory: str
    shards: list[ShardFacts]
    #: `shard-k` directories with k >= shards.
    orphans: list[int] = field(default_factory=list)
    #: The filesystem type of DIR (`ext4`, `nfs4`, `unknown`).
    filesystem: str = "unknown"
    #: True on a local filesystem, where a free lock proves its last holder's process is gone.
    lock_proves_liveness: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardHealth:
    """One shard, judged."""

    shard: str
    #: `free`, `active`, `lapsed`, `unreadable`, `paused` (the summary kept from before).
    status: str
    owner: str | None
    lease_expiry: str | None
    #: One of LEASE_STATES.
    lease: str
    #: lease_expiry - now, in µs (None when free or unparseable).
    expires_in_us: int | None
    #: "live (expires in 12 s)", "expired 40 s ago (lapsed: ...)", "unparseable expiry", "free".
    lease_text: str
    #: membership.json's epoch (the claim's, or the highest ever given out).
    epoch: int
    log_epoch: int
    #: `never claimed`, `in step`, `log ahead`, `taking over`, `not fenced`.
    epoch_state: str
    lock: str
    lock_holder: str | None
    directory_exists: bool
    corrupt_lines: int
    torn_tail_bytes: int
    stale_records: int
    #: The details printed after the lease: epoch, lock, log.
    details: list[str]


@dataclass(frozen=True, slots=True, kw_only=True)
class DaemonHealth:
    """One daemon, from its heartbeat and the claims naming it."""

    node: str
    shards: list[str]
    beat: int | None
    seen: str | None
    #: now - seen, in µs (None: no heartbeat, or `seen` does not parse).
    seen_age_us: int | None
    #: One of DAEMON_STATES.
    state: str
    #: Counted among the running daemons (for the fair share).
    running: bool
    above_share: bool
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class HealthReport:
    """The verdict of `judge_health`: printed by `validate`, or dumped by `--json`."""

    now_us: int
    settings: HealthSettings
    facts: QueueFacts
    shards: list[ShardHealth]
    daemons: list[DaemonHealth]
    #: Daemons counted as running (fresh or late heartbeat, or a live lease without one).
    running: int
    #: ceil(shards / running), None when no daemon runs.
    fair_share: int | None
    unowned: list[str]
    task_types: dict[str, int]
    problems: list[str]
    warnings: list[str]

    @property
    def degraded(self) -> bool:
        return bool(self.problems)

    @property
    def exit_code(self) -> int:
        return 1 if self.problems else 0

def _lease_text(
    state: str, claim: ClaimView, now_us: int, settings: HealthSettings, running: bool
) -> str:
    """How a claim's lease (`lease_state`) reads in the report."""
    if state == "free":
        return "free"
    if state == "unparseable":
        return f"unparseable expiry ({claim.lease_expiry!r})"
    assert claim.lease_expiry_us is not None
    left = claim.lease_expiry_us - now_us
    if state == "live":
        return f"live (expires in {format_span(left)})"
    ago = format_span(left)
    if state == "grace":
        margin = f"{settings.skew_margin_us / SECOND:g} s"
        return f"expired {ago} ago (within the {margin} skew margin: not lapsed yet)"
    who = "another daemon takes it over" if running else "a daemon started on DIR takes it over"
    return f"expired {ago} ago (lapsed: {who})"


def judge_health(
    doc: dict[str, Any],
    facts: QueueFacts,
    *,
    now_us: int,
    settings: HealthSettings,
    membership_problem: str | None = None,
) -> HealthReport:
    """Judge a queue's health from membership.json, what was found on disk, and `now_us` (the
    tool's wall clock). No I/O and no clock reads: the same inputs give the same report.

    Degraded (exit 1) when: a shard is free while a daemon runs (its enqueues are refused); a
    lease expired more than `settings.overdue_us` ago; a shard's owner's heartbeat is older
    than that; a lease expiry does not parse (daemons never take such a claim over); a claimed
    shard's directory is missing; a `shard-k` directory lies beyond the shard count; a log has
    corrupt lines; membership.json is unusable (`membership_problem`: what is wrong with it;
    `doc` is then empty and `facts` are the shard directories found on disk). A queue with no
    daemon and nothing claimed is healthy.
    """
    problems: list[str] = []
    if membership_problem is not None:
        problems.append(f"{membership_problem}: {UNUSABLE_MEANS}")
    warnings: list[str] = []
    shard_count = len(facts.shards)
    claims = [claim_view(doc, f.shard) for f in facts.shards]
    beats_raw = doc.get("nodes")
    beats: dict[str, Any] = beats_raw if isinstance(beats_raw, dict) else {}
    seen = _heartbeats(beats, facts, claims, now_us, settings)
    running = sum(1 for b in seen if b.running)
    fair = fair_cap(shard_count, running, OwnershipConfig()) if running else None
    daemons = [_daemon_health(b, fair, running, shard_count, settings, warnings) for b in seen]
    judging = _Judging(
        now_us=now_us,
        settings=settings,
        facts=facts,
        running=running,
        cap_remedy=_cap_remedy(daemons, beats),
        daemons={d.node: d for d in daemons},
        handlers=_handled_types(daemons, beats),
        problems=problems,
        warnings=warnings,
    )
    shards = [
        _judge_shard(f, claim, claim_epoch(doc, f.shard), judging)
        for f, claim in zip(facts.shards, claims, strict=True)
    ]
    types: Counter[str] = Counter()
    for f in facts.shards:
        types.update(f.live_types)
    handlers = judging.handlers
    if handlers and all(h is not None for h in handlers.values()):
        handled = set().union(*(h for h in handlers.values() if h is not None))
        for task_type, count in sorted(types.items()):
            if task_type not in handled:
                problems.append(
                    f"no running daemon has a handler for task type {task_type!r} "
                    f"({count} live task(s)): they wait until an SDK registers one"
                )
    for k in facts.orphans:
        problems.append(
            f"orphan directory shard-{k}: the queue has {shard_count} shard(s), so no daemon "
            "reads it (tasks in it are stranded)"
        )
    return HealthReport(
        now_us=now_us, settings=settings, facts=facts, shards=shards, daemons=daemons,
        running=running, fair_share=fair, unowned=judging.unowned,
        task_types=dict(sorted(types.items())), problems=problems, warnings=warnings,
    )


# ------------------------------------------------------------------------------------------
# Daemons: every heartbeat, and every owner a claim names
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class _Heartbeat:
    """One daemon as its heartbeat and the claims naming it show it, before the fair share."""

    node: str
    shards: list[str]
    beat: int | None
    seen: str | None
    age_us: int | None
    #: One of DAEMON_STATES.
    state: str
    running: bool


def _heartbeats(
    beats: dict[str, Any],
    facts: QueueFacts,
    claims: list[ClaimView],
    now_us: int,
    settings: HealthSettings,
) -> list[_Heartbeat]:
    """Every daemon with a heartbeat or a claim, by name: whether it runs, and how its
    heartbeat stands (one without a heartbeat runs while one of its leases is live)."""
    held: dict[str, list[str]] = {}
    for f, claim in zip(facts.shards, claims, strict=True):
        if claim.owner is not None:
            held.setdefault(claim.owner, []).append(shard_name(f.shard))
    lease_alive = {
        claim.owner
        for claim in claims
        if claim.owner is not None and lease_state(claim, now_us, settings) in ("live", "grace")
    }
    out = []
    for node in sorted(set(beats) | set(held)):
        beat = beats.get(node)
        beat_count = whole_or_none(beat.get("beat")) if isinstance(beat, dict) else None
        seen = beat.get("seen") if isinstance(beat, dict) else None
        seen = seen if isinstance(seen, str) else None
        seen_us = parse_rfc3339_or_none(seen)
        age = None if seen_us is None else now_us - seen_us
        if node not in beats:
            state = "no heartbeat"
            running = node in lease_alive
        elif age is None or age <= settings.renew_interval_us + settings.skew_margin_us:
            state, running = "live", True
        elif age <= settings.overdue_us:
            state, running = "late", True
        else:
            state, running = "stale", False
        out.append(
            _Heartbeat(
                node=node, shards=held.get(node, []), beat=beat_count, seen=seen, age_us=age,
                state=state, running=running,
            )
        )
    return out


def _daemon_health(
    b: _Heartbeat,
    fair: int | None,
    running: int,
    shard_count: int,
    settings: HealthSettings,
    warnings: list[str],
) -> DaemonHealth:
    """A daemon judged: its line in the report, and its warnings (above its fair share, a
    missed renewal)."""
    node, mine, age = b.node, b.shards, b.age_us
    above = fair is not None and b.running and len(mine) > fair
    owns = f"{len(mine)} shard(s)" + (f" ({', '.join(mine)})" if mine else "")
    if b.state == "no heartbeat":
        beat_text = "no heartbeat (an upstream daemon, or one the others pruned as gone); " + (
            "its lease is live" if b.running else "its lease has lapsed"
        )
    elif age is None:
        beat_text = f"heartbeat {b.beat}, seen {b.seen!r} (unparseable)"
    elif age < 0:
        beat_text = f"heartbeat seen {format_span(age)} ahead of this clock"
    else:
        beat_text = f"heartbeat seen {format_span(age)} ago"
        if b.state == "late":
            beat_text += " (late: it missed a renewal)"
        elif b.state == "stale":
            beat_text += f" (stale: older than {format_span(settings.overdue_us)}; not running)"
    text = f"{node}: {owns}, {beat_text}"
    if above:
        text += f"; ABOVE its fair share of {fair}"
        warnings.append(
            f"{node} holds {len(mine)} shard(s), above its fair share of {fair} "
            f"(ceil({shard_count} shards / {running} running daemons)); it gives the "
            "excess back at its next round"
        )
    if b.state == "late":
        warnings.append(
            f"{node}: its heartbeat is {format_span(age or 0)} old, more than one renewal "
            f"({format_span(settings.renew_interval_us)}) plus the skew margin: it missed a "
            "renewal (busy, paused, or its membership writes fail)"
        )
    return DaemonHealth(
        node=node, shards=mine, beat=b.beat, seen=b.seen, seen_age_us=age,
        state=b.state, running=b.running, above_share=above, text=text,
    )


def _cap_remedy(daemons: list[DaemonHealth], beats: dict[str, Any]) -> str | None:
    """What to do when every running daemon holds its cap (each heartbeat carries its daemon's
    SNERD_MAX_SHARDS): a shard nobody takes for that stays so until an operator acts. None
    when some running daemon may still claim, or a cap is unknown."""
    caps = [
        (d, whole_or_none(beats[d.node].get("max_shards")) if isinstance(beats.get(d.node), dict)
         else None)
        for d in daemons
        if d.running
    ]
    if not (caps and all(cap is not None and len(d.shards) >= cap for d, cap in caps)):
        return None
    return (
        "every running daemon holds its cap ("
        + ", ".join(f"{d.node} {len(d.shards)} of {cap}" for d, cap in caps)
        + ", SNERD_MAX_SHARDS): raise SNERD_MAX_SHARDS or start another daemon"
    )


def _handled_types(daemons: list[DaemonHealth], beats: dict[str, Any]) -> dict[str, set[str] | None]:
    """The task types each running daemon's SDK handles (heartbeats carry them; None: unknown,
    an upstream daemon or an older snerd)."""
    handlers: dict[str, set[str] | None] = {}
    for d in daemons:
        beat = beats.get(d.node)
        listed = beat.get("types") if isinstance(beat, dict) else None
        if d.running:
            handlers[d.node] = (
                {t for t in listed if isinstance(t, str)} if isinstance(listed, list) else None
            )
    return handlers


# ------------------------------------------------------------------------------------------
# Shards
# ------------------------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class _Judging:
    """What judging a shard needs from judging the daemons, and the verdict so far (each
    shard's findings are appended in shard order)."""

    now_us: int
    settings: HealthSettings
    facts: QueueFacts
    running: int
    cap_remedy: str | None
    daemons: dict[str, DaemonHealth]
    handlers: dict[str, set[str] | None]
    problems: list[str]
    warnings: list[str]
    unowned: list[str] = field(default_factory=list)

    @property
    def overdue(self) -> str:
        return format_span(self.settings.overdue_us)


def _judge_shard(f: ShardFacts, claim: ClaimView, epoch: int, j: _Judging) -> ShardHealth:
    """One shard judged: its lease, its lock, its epochs, its files, its task types."""
    name = shard_name(f.shard)
    lease = lease_state(claim, j.now_us, j.settings)
    status = {"free": "free", "unparseable": "unreadable", "lapsed": "lapsed"}.get(lease, "active")
    details = [f"epoch {epoch}"]
    _judge_lease(name, claim, lease, j)
    if _judge_lock(name, f, claim.owner, lease, details, j) and status == "active":
        status = "paused"
    epoch_state = _epoch_state(f, epoch, lease)
    if f.log_exists:
        details.append(f"log epoch {f.log_epoch}")
    if epoch_state == "log ahead":
        details.append(
            "log ahead of membership (normal: an owner that took its shard up again, or a "
            "takeover race, writes under the log's epoch + 1)"
        )
    elif epoch_state == "taking over":
        details.append(f"taking over: {claim.owner} has not written its claim record yet")
    elif epoch_state == "not fenced" and epoch > 0 and f.log_exists:
        details.append("its last claimant never wrote a claim record (harmless)")
    if _judge_files(name, f, claim.owner, epoch, lease, details, j):
        status = "unusable"
    return ShardHealth(
        shard=name, status=status, owner=claim.owner, lease_expiry=claim.lease_expiry,
        lease=lease,
        expires_in_us=None if claim.lease_expiry_us is None or claim.owner is None
        else claim.lease_expiry_us - j.now_us,
        lease_text=_lease_text(lease, claim, j.now_us, j.settings, j.running > 0),
        epoch=epoch, log_epoch=f.log_epoch, epoch_state=epoch_state, lock=f.lock.state,
        lock_holder=f.lock.holder() if f.lock.state == "held" else None,
        directory_exists=f.directory_exists, corrupt_lines=f.corrupt_lines,
        torn_tail_bytes=f.torn_tail_bytes, stale_records=f.stale_records, details=details,
    )


def _judge_lease(name: str, claim: ClaimView, lease: str, j: _Judging) -> None:
    """The problems of a shard's claim: free while daemons run, unparseable, lapsed long ago,
    held by a daemon whose heartbeat went stale."""
    owner, running, remedy = claim.owner, j.running, j.cap_remedy
    if lease == "free":
        j.unowned.append(name)
        if running and remedy is not None:
            j.problems.append(
                f"{name} is free while {running} daemon(s) run: its enqueues are "
                f"refused, and no running daemon may claim it: {remedy}"
            )
        elif running:
            j.problems.append(
                f"{name} is free while {running} daemon(s) run: its enqueues are "
                f"refused until one claims it (daemons claim free shards at their next "
                f"round, within {format_span(j.settings.renew_interval_us)}; a shard freed by a "
                "give-back or a drain is free that long; if it stays free, check "
                "SNERD_MAX_SHARDS)"
            )
    elif lease == "unparseable":
        j.problems.append(
            f"{name}: lease_expiry {claim.lease_expiry!r} does not parse; daemons never take such "
            "a claim over: a human must look"
        )
    elif lease == "lapsed" and claim.lease_expiry_us is not None:
        late = j.now_us - claim.lease_expiry_us
        if late > j.settings.overdue_us:
            why = (
                f"no running daemon may take it over: {remedy}"
                if running and remedy is not None
                else "no running daemon has taken it over"
                if running
                else "no daemon is running to take it over: start one on DIR"
            )
            j.problems.append(
                f"{name}: the lease of {owner} expired {format_span(late)} ago, longer than "
                f"{j.overdue} (lease + skew margin + one renewal); {why}"
            )
    owner_state = j.daemons.get(owner) if owner is not None else None
    if owner_state is not None and owner_state.state == "stale":
        j.problems.append(
            f"{name} is claimed by {owner}, whose heartbeat is "
            f"{format_span(owner_state.seen_age_us or 0)} old (more than {j.overdue}): that "
            "daemon is gone or hung"
            + ("" if lease == "lapsed" else "; its claim lapses at its lease expiry plus "
               "the skew margin")
        )


def _judge_lock(
    name: str, f: ShardFacts, owner: str | None, lease: str, details: list[str], j: _Judging
) -> bool:
    """The lock against the claim; True when the shard is paused (its lock held by another
    process than the claimant)."""
    lock = f.lock
    if lock.state == "held":
        details.append(f"lock held by {lock.holder()}")
        if owner is not None and lock.owner is not None and lock.owner != owner:
            j.warnings.append(
                f"{name} is PAUSED: claimed by {owner}, but its lock is held by "
                f"{lock.holder()}; the claimant waits until that process lets go"
            )
            return True
        if owner is None:
            j.warnings.append(
                f"{name}: its lock is held by {lock.holder()} although no claim names it "
                "(a daemon handing the shard over, or a tool such as replay at work)"
            )
        elif lease == "lapsed":
            j.warnings.append(
                f"{name}: the lease of {owner} lapsed but its lock is still held by "
                f"{lock.holder()}: that process lives but does not renew (paused, or a "
                "hung filesystem); a new claimant waits for the lock"
            )
    elif f.directory_exists:
        details.append("lock free" if lock.state == "free" else "never locked")
        if lease in ("live", "grace"):
            advisory = (
                ""
                if j.facts.lock_proves_liveness
                else f" (DIR is on {j.facts.filesystem}: a lock held on another host may not "
                "show here, so the lock state is advisory; the lease decides)"
            )
            j.warnings.append(
                f"{name}: claimed but its lock is free: the owner may be dead (takeover at "
                "once on a local filesystem, after the lease elsewhere)" + advisory
            )
    return False


def _epoch_state(f: ShardFacts, epoch: int, lease: str) -> str:
    """Membership's epoch against the log's last claim record."""
    if not f.log_exists or f.log_epoch == 0:
        return "never claimed" if epoch == 0 else "not fenced"
    if f.log_epoch == epoch:
        return "in step"
    if f.log_epoch > epoch:
        return "log ahead"
    return "taking over" if lease in ("live", "grace") else "not fenced"


def _judge_files(
    name: str,
    f: ShardFacts,
    owner: str | None,
    epoch: int,
    lease: str,
    details: list[str],
    j: _Judging,
) -> bool:
    """The shard's directory, log, inboxes and task types; True when its files are unusable."""
    if not f.directory_exists:
        if owner is not None or epoch > 0:
            j.problems.append(
                f"{name}: its directory is missing although the shard has been claimed "
                f"(epoch {epoch})"
            )
            details.append("DIRECTORY MISSING")
        else:
            details.append("not created yet")
    if f.corrupt_lines:
        j.problems.append(
            f"{name}: {f.corrupt_lines} corrupt line(s) in tasks.log "
            f"(`snerdmq fsck {j.facts.directory}` shows them)"
        )
        details.append(f"{f.corrupt_lines} corrupt line(s)")
    for text in f.unusable:
        j.problems.append(f"{name}: {text}; no daemon serves this shard until that is fixed")
    if f.torn_tail_bytes and f.lock.state != "held":
        j.warnings.append(
            f"{name}: tasks.log ends in {f.torn_tail_bytes} byte(s) without a newline (a "
            "crash mid-append; never acknowledged; the next owner cuts it)"
        )
    if f.stale_records:
        details.append(f"{f.stale_records} stale-epoch record(s) fenced off")
    if f.inbox_waiting_bytes:
        details.append(
            f"{f.inbox_waiting_bytes} byte(s) in {f.inbox_waiting_files} inbox file(s) "
            "not yet ingested"
        )
        if lease == "free":
            j.warnings.append(
                f"{name} is free and {f.inbox_waiting_bytes} byte(s) of enqueued tasks wait "
                "in its inboxes: they run once a daemon owns it"
            )
    handles = j.handlers.get(owner) if owner is not None and lease != "free" else None
    if handles is not None:
        for task_type, count in sorted(f.live_types.items()):
            if task_type not in handles:
                j.warnings.append(
                    f"{name}: {count} live task(s) of type {task_type!r}, but its owner "
                    f"{owner} has no handler for that type: they wait until its SDK "
                    "registers one or a daemon with one owns the shard"
                )
    return bool(f.unusable)
