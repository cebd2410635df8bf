"""Shard tenure: which shards this node acts for, and for how long.

`Tenure` owns the membership rounds (read membership.json, then write claims, renewals,
give-backs and this node's heartbeat), the lease (the node acts for its shards only until
`lease_deadline_mono`: the start of its last renewal known to have committed, plus the ttl),
the lock of each shard it claims (`TryLock`, busy, lost, unusable files), the probes of other
nodes' locks where flock proves liveness and the proofs they yield (`LockProof`), the hand-over
of shards above this node's share, the step-down (`step_down`: the shard's tasks forgotten, its
enqueues in flight told they may be lost, the lock kept until its appends have landed) and the
reload of a log another writer appended to behind our claim.

A shard's per-tenure state is in `ShardInfo` (`phase` UNOWNED..ACTIVE, `epoch`, `tenure`, the
deferred unlocks); the replay that makes a claimed shard ACTIVE is `snerd.core.node.replay`.
It never decides what a claim or a heartbeat looks like on disk (`snerd.core.ownership` does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from snerd.core import effects as fx
from snerd.core import events as ev
from snerd.core import protocol as proto
from snerd.core.node.model import (
    ACTIVE,
    DRAINING,
    ENQUEUING,
    FENCING,
    FINISHING,
    LOADING,
    LOCKING,
    NODE_RUNNING,
    PAUSED,
    PROBING,
    SECOND,
    STARTING,
    STOPPED,
    UNOWNED,
    LockProof,
    ShardInfo,
    new_location,
    require,
)
from snerd.core.node.outbox import ClaimPart, EnqueuePart, EnqueueRun
from snerd.core.ownership import (
    Observer,
    claim_epoch,
    claim_owner,
    claim_signature,
    claimable,
    give_back,
    initial_doc,
    live_foreign,
    lock_names_claim,
    owned_by,
    plan_claims,
    proof_room,
    shard_name,
    with_claims,
    with_heartbeat,
    without_claims,
)
from snerd.core.schema import OUTCOME_DEAD, SNERD_EPOCH, SNERD_NODE
from snerd.core.shardlog import ShardFold

#: The shard phases in which the node holds the shard's lock.
_LOCKED_PHASES = frozenset((LOADING, FENCING, ACTIVE))

if TYPE_CHECKING:
    from snerd.core.node.node import Node

__all__ = ["Tenure"]


class Tenure:
    """Membership rounds, claims, locks, probes, the lease, give-backs and step-downs (see the
    module docstring)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.config = node.config
        self.shards = node.shards
        self.out = node.outbox
        self.doc: dict[str, Any] | None = None
        #: Whether `doc` names another node as a shard's owner (`live_foreign`): worked out
        #: once per document, not on every `wake_in`.
        self.doc_names_others = False
        #: The last membership read found a live heartbeat of another node.
        self.peers_live = False
        self.membership_busy = False
        #: A renewal came due while a membership operation was out: do it when that ends.
        self.renew_after_busy = False
        self.renew_at_mono: int | None = None
        #: Shards whose lock a probe took while another node's claim named it (`LockProof`).
        #: The lock stays held until the claim is rewritten as ours, or the proof fails.
        self.lock_proofs: dict[int, LockProof] = {}
        #: Nodes whose process is gone, proven by their shard's lock (node id -> when, mono):
        #: no longer counted among the live nodes for fair shares, so their shards are not
        #: handed back to them while their heartbeat still looks fresh.
        self.dead_nodes: dict[str, int] = {}
        #: When to try other nodes' shard locks next (only where flock proves liveness).
        self.probe_at_mono: int | None = None
        #: Shards this node's cap left free at its last round, said once (`_say_left_free`).
        self.left_free_said: set[int] = set()
        #: What made the last membership round fail, logged once (`_membership_trouble`),
        #: and whether its end is to be said too; None: the last round landed.
        self.membership_trouble: str | None = None
        self.membership_trouble_said = False
        #: Claims and heartbeats seen in membership.json, timed on this node's monotonic clock.
        self.observer = Observer()
        #: When the membership round in flight started (its read was issued).
        self.round_started_mono: int | None = None
        #: This node acts for its shards only until then: the start of its last renewal known
        #: to have committed, plus the lease (docs/architecture.md, "Leases: counted from the
        #: round's start, and self-expiring"). None: it holds no lease.
        self.lease_deadline_mono: int | None = None

    # -- timers (`Node.timers`)

    def invariants(self) -> None:
        """Each shard's tenure fields agree with its phase; lock proofs are of shards this
        node does not act for."""
        for shard, info in self.shards.items():
            phase = info.phase
            require(
                (phase is PROBING) == (info.probed_doc is not None), f"shard {shard}: probe doc"
            )
            require(
                phase is not LOADING or info.fold is not None, f"shard {shard}: loading, no fold"
            )
            require(phase is not ACTIVE or info.claim_loc is not None, f"shard {shard}: no claim")
            require(not info.giving_back or phase is ACTIVE, f"shard {shard}: gives back, not held")
            require(info.tenure >= 0 and info.epoch >= 0, f"shard {shard}: negative counter")
        for shard in self.lock_proofs:
            proved = self.shards.get(shard)
            require(
                proved is None or proved.phase in (UNOWNED, PROBING),
                f"shard {shard}: a lock proof for a shard this node acts for",
            )

    def renew_due(self) -> int | None:
        """When the next membership round (a renewal, a retry, a takeover) is due (mono)."""
        return self.renew_at_mono

    def renew_fire(self, now: ev.Now) -> None:
        if self.renew_at_mono is not None and now.mono >= self.renew_at_mono:
            self.renew()

    def lock_retry_due(self) -> int | None:
        """When the earliest paused shard's lock is tried again (mono)."""
        retries = [
            i.retry_lock_at_mono for i in self.shards.values() if i.retry_lock_at_mono is not None
        ]
        return min(retries) if retries else None

    def lock_retry_fire(self, now: ev.Now) -> None:
        for shard, info in self.shards.items():
            if info.retry_lock_at_mono is not None and now.mono >= info.retry_lock_at_mono:
                info.retry_lock_at_mono = None
                if info.phase is PAUSED:
                    self.out.emit(
                        fx.TryLock(shard=shard, owner=self.config.node_id, epoch=info.lock_epoch)
                    )

    def probe_due(self) -> int | None:
        """When to try other nodes' shard locks next (mono): only while running and another
        node holds shards (`doc_names_others`)."""
        at = self.probe_at_mono
        if at is None or self.node.phase is not NODE_RUNNING or not self.doc_names_others:
            return None
        return at

    def probe_fire(self, now: ev.Now) -> None:
        at = self.probe_at_mono
        if (
            self.config.lock_proves_liveness
            and self.node.phase is NODE_RUNNING
            and self.doc is not None
            and (at is None or now.mono >= at)
        ):
            self.probe_at_mono = now.mono + self.config.probe_interval_us
            if not self.membership_busy:
                self.probe(self.doc, [])

    def lease_due(self) -> int | None:
        """When the lease runs out (mono); `Node._begin` checks it before every event."""
        return self.lease_deadline_mono

    # -- membership rounds

    def read_membership(self) -> None:
        """Start a membership round: read, then (in `on_membership_read`) write claims,
        renewals, give-backs and this node's heartbeat. A renewal's lease counts from here."""
        self.membership_busy = True
        self.round_started_mono = self.node.now.mono
        self.out.emit(fx.ReadMembership(touch=self.locked_shards()))

    def locked_shards(self) -> tuple[int, ...]:
        """The shards whose lock this node holds (loading, fencing or active), in its own
        order: those a membership read touches."""
        return tuple(
            shard for shard, info in self.shards.items() if info.phase in _LOCKED_PHASES
        )

    def on_started(self, event: ev.Started) -> None:
        self.read_membership()

    def on_membership_read(self, event: ev.MembershipRead) -> None:
        """A membership round's read: step down from what it gives to others, then write
        claims, renewals, give-backs and this node's heartbeat (or, draining and done, the
        release)."""
        self.membership_busy = False
        if self.node.phase is STOPPED:
            return
        doc = event.doc
        if doc is None:
            doc = initial_doc(queue=self.config.queue, shards=self.config.new_queue_shards)
            expected: int | None = None
        else:
            expected = int(doc.get("version", 0))
        now = self.node.now
        self.observer.observe(doc, now.mono)
        self._unlock_handed_over(doc)
        self._confirm_probes(doc)
        if self.node.phase is DRAINING and self.node.released:
            self.node.release(doc, expected)
            return
        mine = set(owned_by(doc, self.config.node_id))
        # A shard we think we hold but membership.json gives to someone else: step down.
        for shard, info in self.shards.items():
            if info.phase not in (UNOWNED, PROBING) and shard not in mine:
                self.step_down(shard, "its claim in membership.json now names another owner")
        live = self._live_nodes(now.mono)
        self.peers_live = len(live) > 1  # (`live` names this node too)
        if self.peers_live:
            self.node.inbox.poll_soon()  # one may be writing to our inboxes now
        releases: list[int] = []
        if self.node.phase is DRAINING:
            # Renewals go on during a drain (upstream let leases lapse), but nothing new is
            # claimed.
            wanted = sorted(s for s, i in self.shards.items() if i.phase not in (UNOWNED, PROBING))
        else:
            wanted, releases = self._plan_round(doc, mine, live)
        if not wanted and self.node.phase is STARTING:
            self.out.log(
                "warning",
                "every shard of this queue is claimed by a live daemon; this daemon waits "
                "and claims shards as their leases lapse or as the others give shares back",
            )
        self._write_round(doc, expected, mine, live, wanted, releases)

    def _live_nodes(self, mono: int) -> list[str]:
        """The nodes whose heartbeat is live (this one included), less those proven dead."""
        config = self.config.ownership
        live = self.observer.live_nodes(node_id=self.config.node_id, mono_us=mono, config=config)
        if self.dead_nodes:
            # Proven dead: not live, whatever their heartbeat says (and no longer written).
            # Forgotten once the heartbeat would have lapsed anyway (ids are never reused).
            forget = 2 * (config.ttl_us + config.skew_margin_us)
            for dead, since in list(self.dead_nodes.items()):
                if mono - since > forget:
                    del self.dead_nodes[dead]
            live = [n for n in live if n not in self.dead_nodes]
        return live

    def _plan_round(
        self, doc: dict[str, Any], mine: set[int], live: list[str]
    ) -> tuple[list[int], list[int]]:
        """The shards this round claims or renews, and those it hands back (stepped down
        from already: once the write that frees one lands, another node may claim it at once,
        before this node hears back)."""
        now = self.node.now
        config = self.config.ownership
        node_id = self.config.node_id
        candidates = claimable(
            doc,
            node_id=node_id,
            wall_us=now.wall,
            config=config,
            proven_dead=self._proven_dead(),
            observer=self.observer,
            mono_us=now.mono,
        )
        # A shard whose files cannot be used is neither claimed nor kept (`ShardUnusable`).
        candidates = [s for s in candidates if not self._unusable(s)]
        plan = plan_claims(
            doc,
            node_id=node_id,
            candidates=candidates,
            proofs=self.lock_proofs,
            live=len(live),
            config=config,
        )
        wanted = plan.wanted
        for shard in plan.proofs_dropped:
            # Proven dead, but beyond this node's cap: the lock goes back for another.
            del self.lock_proofs[shard]
            self.out.emit(fx.Unlock(shard=shard))
        self._say_left_free(plan.left_free)
        self._mark_give_backs(give_back(doc, node_id=node_id, live=live, config=config))
        releases = [s for s in wanted if self._ready_to_give_back(s)]
        releases += [s for s in sorted(mine) if self._unusable(s)]
        wanted = [s for s in wanted if s not in releases]
        for shard in releases:
            self.step_down(
                shard, "handed over to even out the shares", level="info", handing_over=True
            )
        if self.config.lock_proves_liveness:
            self.probe(doc, wanted)
        return wanted, releases

    def _write_round(
        self,
        doc: dict[str, Any],
        expected: int | None,
        mine: set[int],
        live: list[str],
        wanted: list[int],
        releases: list[int],
    ) -> None:
        """Write the round: `wanted` claimed or renewed, `releases` removed, the heartbeat."""
        now = self.node.now
        config = self.config.ownership
        node_id = self.config.node_id
        # A shard this node stepped down from is claimed anew (a new epoch), not renewed: its
        # lock file still names the tenure that ended (`LockProof`), and fencing keeps the
        # two tenures apart.
        anew = [s for s in wanted if s in mine and self._stepped_down(s)]
        new_doc = with_claims(
            doc, node_id=node_id, shards=wanted, wall_us=now.wall, config=config, anew=anew
        )
        if releases:
            new_doc = without_claims(new_doc, node_id=node_id, shards=releases)
        new_doc = with_heartbeat(
            new_doc,
            node_id=node_id,
            wall_us=now.wall,
            live=live,
            types=sorted(self.node.book.registered),
            max_shards=config.max_shards,
        )
        new_doc["version"] = (expected or 0) + 1
        self.membership_busy = True
        self.out.emit(fx.WriteMembership(doc=new_doc, expected_version=expected))

    def _say_left_free(self, shards: list[int]) -> None:
        """Say once why claimable shards stay free: this node's cap (`ClaimPlan.left_free`).
        Said again only for a shard that was claimed meanwhile and is left free anew."""
        new = [s for s in shards if s not in self.left_free_said]
        self.left_free_said = set(shards)
        if not new:
            return
        names = ", ".join(shard_name(s) for s in new)
        self.out.log(
            "warning",
            f"{names} left free: this daemon holds its cap of {self.config.ownership.max_shards} "
            "(SNERD_MAX_SHARDS); raise the cap or start another daemon to run "
            + ("them" if len(new) > 1 else "it"),
        )

    def _mark_give_backs(self, count: int) -> None:
        """Start handing over `count` more shards (the highest numbered active ones)."""
        giving = sum(1 for i in self.shards.values() if i.giving_back)
        cap = self.config.ownership.max_shards
        held = sum(1 for i in self.shards.values() if i.phase is ACTIVE)
        why = (
            f"above this daemon's cap of {cap} (SNERD_MAX_SHARDS)"
            if cap is not None and held > cap
            else "above this daemon's fair share"
        )
        for shard in sorted(self.shards, reverse=True):
            if giving >= count:
                return
            info = self.shards[shard]
            if info.phase is ACTIVE and not info.giving_back:
                info.giving_back = True
                info.giving_back_since_mono = self.node.now.mono
                giving += 1
                self.out.log(
                    "info",
                    f"{shard_name(shard)}: {why}; handing it over once its attempts in flight end",
                )

    def _ready_to_give_back(self, shard: int) -> bool:
        info = self.shards.get(shard)
        if info is None or not info.giving_back:
            return False
        if self.node.now.mono >= info.giving_back_since_mono + self.config.drain_timeout_us:
            return True
        return not (
            info.appends_in_flight
            or info.compacting
            or any(self.node.book.tasks[t].shard == shard for t in self.node.book.inflight)
        )

    def probe(self, doc: dict[str, Any], wanted: list[int]) -> None:
        """Try the lock of each shard another node claims: getting it proves that node dead.
        No more than this node's cap leaves room for (`proof_room`)."""
        room = proof_room(
            doc,
            node_id=self.config.node_id,
            wanted=wanted,
            proofs=[*self.lock_proofs, *(s for s, i in self.shards.items() if i.phase is PROBING)],
            config=self.config.ownership,
        )
        for shard in live_foreign(doc, node_id=self.config.node_id):
            if room is not None and room <= 0:
                return
            if shard in wanted or shard in self.lock_proofs:
                continue
            info = self.shards.setdefault(shard, ShardInfo())
            # A lock this node still holds after stepping down proves nothing about another.
            if info.phase is UNOWNED and not (
                info.unlock_when_drained or info.unlock_when_unclaimed
            ):
                info.phase = PROBING
                info.probed_doc = doc
                self.out.emit(fx.TryLock(shard=shard, owner=self.config.node_id, probe=True))
                if room is not None:
                    room -= 1

    def on_membership_written(self, event: ev.MembershipWritten) -> None:
        self.membership_busy = False
        if self.membership_trouble is not None:
            if self.membership_trouble_said:
                self.out.log("info", "membership.json read and updated again")
            self.membership_trouble = None
        self.doc = event.doc
        self.doc_names_others = bool(live_foreign(event.doc, node_id=self.config.node_id))
        now = self.node.now
        self._unlock_handed_over(event.doc)
        if self.node.releasing:
            self.node.finish_release()
            return
        if self.node.released:
            # A renewal landed after the drain finished: now write the release itself.
            self.read_membership()
            return
        self.renew_at_mono = now.mono + self.config.ownership.renew_interval_us
        # The lease of every claim this write renewed or made counts from the round's start.
        ours = owned_by(event.doc, self.config.node_id)
        if ours and self.round_started_mono is not None:
            self.lease_deadline_mono = self.round_started_mono + self.config.ownership.ttl_us
        elif not ours:
            self.lease_deadline_mono = None
        if self.lock_proofs or self.renew_after_busy:
            self.renew_at_mono = now.mono  # a takeover or a renewal is waiting
            self.renew_after_busy = False
        changed = False
        for shard in owned_by(event.doc, self.config.node_id):
            info = self.shards.setdefault(shard, ShardInfo())
            proof = self.lock_proofs.pop(shard, None)  # ours now: the lock is held for that
            if proof is not None and proof.confirmed:
                # Taken over: the claim we wrote replaced the one read unwritten since the
                # lock came free (the write's version check says so).
                self.dead_nodes[proof.owner] = now.mono
                self.out.log(
                    "info",
                    f"{shard_name(shard)}: its owner's process is gone (its lock was free under "
                    f"{proof.owner}'s claim); taken over without waiting for the lease",
                )
            if info.phase is UNOWNED:
                epoch = claim_epoch(event.doc, shard)
                if epoch == info.lock_epoch:
                    # A renewal issued before this node stepped down from the shard: that
                    # tenure is over; the next round claims the shard anew.
                    self.renew_at_mono = now.mono
                    continue
                info.epoch = info.lock_epoch = epoch
                info.phase = LOCKING
                # A lock still held from the last tenure is taken up as it is: a deferred
                # Unlock must not fire between this TryLock and its answer.
                info.unlock_when_drained = info.unlock_when_unclaimed = False
                self.out.emit(fx.TryLock(shard=shard, owner=self.config.node_id, epoch=epoch))
                changed = True
        if not changed:
            self.node.maybe_running()

    def _stepped_down(self, shard: int) -> bool:
        info = self.shards.get(shard)
        return info is not None and info.phase is UNOWNED

    def _proven_dead(self) -> frozenset[int]:
        return frozenset(s for s, proof in self.lock_proofs.items() if proof.confirmed)

    def _confirm_probes(self, doc: dict[str, Any]) -> None:
        """Check each lock proof against `doc`: the claim still there, unwritten since,
        confirms it; anything else ends it."""
        for shard, proof in list(self.lock_proofs.items()):
            if claim_signature(doc, shard) == proof.signature:
                proof.confirmed = True
            else:
                # Handed over, renewed or claimed anew since the probe's read: the free lock
                # proves nothing. The shard is claimable like any other.
                del self.lock_proofs[shard]
                self.out.emit(fx.Unlock(shard=shard))

    def _unlock_handed_over(self, doc: dict[str, Any]) -> None:
        """Give up the locks of shards handed over whose claim `doc` no longer gives us."""
        for shard, info in self.shards.items():
            if info.unlock_when_unclaimed and claim_owner(doc, shard) != self.config.node_id:
                self.lock_hold_over(shard, info, drained=False)

    def on_membership_write_failed(self, event: ev.MembershipWriteFailed) -> None:
        self.membership_busy = False
        if self.node.released:
            # We tried to hand our shards over and could not: the leases lapse on their own.
            self.out.log("warning", f"membership.json not updated ({event.error}) while stopping")
            self.node.finish_release()
            return
        # A conflict (another writer came first: `doc` is what is there now) is routine with
        # several daemons; an I/O error is not, and its end is said too.
        self._membership_trouble(
            event.error,
            f"membership.json not updated ({event.error}); retrying",
            lasting=event.doc is None,
        )
        if self.node.drain_before_start():
            return
        self._retry_membership()

    def on_membership_unusable(self, event: ev.MembershipUnusable) -> None:
        """membership.json is not a membership document (`check_membership`). At start,
        before any round landed, this node has claimed nothing: it refuses to start (exit 2)
        rather than wait for a human. Later, it keeps acting for what it holds until its lease
        runs out (no renewal can commit meanwhile) and reads the file again until it is
        fixed."""
        self.membership_busy = False
        if self.node.released:
            self.out.log("warning", f"{event.problem}; its claims are left to lapse while stopping")
            self.node.finish_release()
            return
        if self.node.phase is STARTING and self.doc is None:
            self.out.log(
                "error",
                f"{event.problem}; this daemon cannot start on it: fix or restore the file "
                "(`snerdmq validate DIR` reports what is wrong)",
            )
            self.node.stop_before_start(2)
            return
        ttl = self.config.ownership.ttl_us // SECOND
        self._membership_trouble(
            event.problem,
            f"{event.problem}; this daemon keeps acting for the shards it holds until its "
            f"lease runs out ({ttl} s after its last renewal), claims nothing, and reads the "
            "file again until it is fixed",
            lasting=True,
        )
        self._retry_membership()

    def _membership_trouble(self, what: str, message: str, *, lasting: bool) -> None:
        """Log a failed membership round once per kind of failure (a read retried every
        `retry_io_us` must not flood stderr); `lasting`: say so when a round lands again."""
        if what == self.membership_trouble:
            return
        self.membership_trouble = what
        self.membership_trouble_said = lasting
        self.out.log("warning" if lasting else "info", message)

    def _retry_membership(self) -> None:
        self.renew_after_busy = False
        self.renew_at_mono = self.node.now.mono + self.config.retry_io_us

    def on_lock_acquired(self, event: ev.LockAcquired) -> None:
        info = self.shards[event.shard]
        if info.phase is PROBING:
            # The lock was free: evidence that the claimant's process is gone, if the claimant
            # held it under this claim and the claim stays unwritten (`LockProof`).
            info.phase = UNOWNED
            doc, info.probed_doc = info.probed_doc, None
            assert doc is not None
            owner = claim_owner(doc, event.shard)
            assert owner is not None
            if not lock_names_claim(event.previous, doc, event.shard):
                # The claimant never held this lock under this claim (it is about to take it,
                # retries it while the owner before it finishes, or claimed the shard again
                # after giving it up): a free lock says nothing of it.
                self.out.emit(fx.Unlock(shard=event.shard))
                self.node.maybe_running()
                return
            self.lock_proofs[event.shard] = LockProof(
                owner=owner, signature=claim_signature(doc, event.shard)
            )
            self.renew(force=True)  # a read confirms it (`_confirm_probes`)
            return
        if info.phase not in (LOCKING, PAUSED):
            # Claim withdrawn meanwhile: give the lock straight back.
            self.out.emit(fx.Unlock(shard=event.shard))
            return
        info.retry_lock_at_mono = None
        # Held again: a deferred Unlock is moot.
        info.unlock_when_drained = info.unlock_when_unclaimed = False
        self._load(event.shard, info)

    def _load(self, shard: int, info: ShardInfo) -> None:
        """Replay the shard's log (`LOADING`) into a fresh fold."""
        info.phase = LOADING
        info.fold = ShardFold(keep_payloads=False, fence=self.config.fence)
        info.log_epoch = 0
        if info.appends_in_flight:
            # Appends from before this node last stepped down (or after its claim) are still
            # on their way (the shell writes in order, maybe after an Unlock): read the log
            # once they are in it, or the reload would miss them and they would surface
            # later, unknown.
            info.read_when_drained = True
            return
        self.out.emit(fx.ReadLog(shard=shard))

    def on_lock_busy(self, event: ev.LockBusy) -> None:
        info = self.shards[event.shard]
        if info.phase is PROBING:
            info.phase = UNOWNED  # its owner is alive
            info.probed_doc = None
            self.node.maybe_running()
            return
        if info.phase not in (LOCKING, PAUSED):
            return  # stepped down while the TryLock was out: nothing to retry
        if info.phase is LOCKING:
            self.out.log(
                "warning",
                f"{shard_name(event.shard)} is claimed by this daemon but its lock is held by "
                "another process (a daemon still running on this directory?); the shard stays "
                "paused and the lock is retried",
            )
        info.phase = PAUSED
        info.retry_lock_at_mono = self.node.now.mono + self.config.retry_io_us
        self.node.maybe_running()

    def on_lock_lost(self, event: ev.LockLost) -> None:
        self.step_down(event.shard, f"its lock failed: {event.error}")

    def on_shard_unusable(self, event: ev.ShardUnusable) -> None:
        """Bad files on disk: stop acting for the shard, give its claim back at the next round
        and leave it unclaimed for a while; the daemon goes on with its other shards (and
        becomes ready without this one)."""
        info = self.shards.get(event.shard)
        if info is None:
            return
        info.unusable_until_mono = self.node.now.mono + self.config.retry_unusable_us
        self.step_down(
            event.shard,
            f"its files cannot be used: {event.error}; it is left unclaimed and tried again in "
            f"{self.config.retry_unusable_us // SECOND} s (`snerdmq fsck` lists what it found)",
        )
        self.node.maybe_running()

    def _unusable(self, shard: int) -> bool:
        info = self.shards.get(shard)
        until = None if info is None else info.unusable_until_mono
        return until is not None and self.node.now.mono < until

    def lease_over(self, now: ev.Now) -> bool:
        """No renewal committed within the lease: past it, the node acts for no shard."""
        return self.lease_deadline_mono is not None and now.mono >= self.lease_deadline_mono

    def lease_ran_out(self) -> None:
        """No renewal committed within the lease: stop acting for every shard at once, whatever
        the shell is doing (a hung write must not extend a lease: docs/architecture.md,
        "Leases: counted from the round's start, and self-expiring"). The claims still name
        this node; the next round that commits takes them up again."""
        self.lease_deadline_mono = None
        for shard, info in self.shards.items():
            if info.phase not in (UNOWNED, PROBING):
                self.step_down(shard, "its lease ran out before a renewal committed")

    def step_down(
        self, shard: int, why: str, level: str = "error", *, handing_over: bool = False
    ) -> None:
        """Stop acting for `shard` now. `handing_over`: a write removing our claim follows, and
        the lock is kept until it lands (`unlock_when_unclaimed`)."""
        info = self.shards.get(shard)
        if info is None or info.phase in (UNOWNED, PROBING):
            return
        self.out.log(level, f"{shard_name(shard)}: this daemon stops acting for it: {why}")
        was_locked = info.phase not in (LOCKING, PAUSED)
        info.phase = UNOWNED
        info.tenure += 1
        info.read_when_drained = False
        info.reloading = False
        info.retry_lock_at_mono = None
        info.giving_back = False
        info.hold_dispatch_until_mono = None
        info.inbox_done.clear()
        info.inbox_taken.clear()
        info.inbox_locs.clear()
        info.inbox_marked.clear()
        self.node.book.parked_by_shard.pop(shard, None)
        # Enqueues not yet committed will never be acked by this node: say so now (their
        # records may still land; the next owner finds them).
        for p in self.out.pending_parts():
            if p.shard == shard and isinstance(p, EnqueuePart | EnqueueRun) and not p.answered:
                p.answered = True
                message = proto.failed_to_enqueue(
                    f"{shard_name(shard)} changed owner before the enqueue was confirmed; "
                    "it may or may not be enqueued"
                )
                if isinstance(p, EnqueueRun):
                    answer = p.ids
                else:
                    answer = [p.task_id, *p.dedupe_waiters]
                for task_id in answer:
                    self.out.send(proto.error(task_id, message))
        for task_id in [t.task_id for t in self.node.book.tasks.values() if t.shard == shard]:
            self.node.book.forget(task_id)
        self.node.schedules.forget_shard(shard)
        self.node.control.forget_shard(shard)
        # Appends held back by a compaction still running are never made: they belong to this
        # tenure (a compaction ends with them otherwise, `Compaction._over`).
        for effect in info.backlog:
            self.out.pending.pop(effect.token, None)
        info.backlog = []
        if was_locked:
            # The shell may write appends in flight after an Unlock: keep the lock until they
            # are in the log, so the next owner, who needs the lock, reads them before its
            # claim.
            info.unlock_when_drained = bool(info.appends_in_flight)
            info.unlock_when_unclaimed = handing_over
            if not (info.unlock_when_drained or info.unlock_when_unclaimed):
                self.out.emit(fx.Unlock(shard=shard))
        self.announce_membership()

    def lock_hold_over(self, shard: int, info: ShardInfo, *, drained: bool) -> None:
        """What a deferred Unlock waited for is over (`drained`: the appends in flight, else
        the write removing our claim): unlock once nothing else holds it back."""
        if not (info.unlock_when_drained or info.unlock_when_unclaimed):
            return
        if drained:
            info.unlock_when_drained = False
        else:
            info.unlock_when_unclaimed = False
        if not (info.unlock_when_drained or info.unlock_when_unclaimed):
            self.out.emit(fx.Unlock(shard=shard))

    def claimed(self, shard: int, info: ShardInfo, loc: fx.Location) -> None:
        """Our claim (at `loc`) fences the shard: it is ours to act for."""
        info.claim_loc = loc
        info.phase = ACTIVE
        unrunnable, info.unrunnable = info.unrunnable, []
        for task_id, why, based in unrunnable:
            task = self.node.book.tasks.get(task_id)
            if task is not None and task.state is ENQUEUING:
                self.node.book.move(task, FINISHING)
                if based:  # the tombstone keeps the record, payload and all
                    self.node.book.finish(task, OUTCOME_DEAD, why)
                else:
                    self.node.book.dead_letter_unbased(task, why)
        if self.node.phase is STARTING:
            self.node.maybe_running()
        else:
            self.announce_membership()

    def reload(self, shard: int, info: ShardInfo) -> None:
        """Our claim landed behind records another writer appended after we read the log (a
        stale owner's write, made late: paused after deciding it, on a filesystem whose lock
        did not stop us). They precede our fence, so every reader takes them: we must know
        them too. Forget what the replay built and read the log again; our claim is in it now,
        and it writes no new one (`Replay._fence`)."""
        self.out.log(
            "warning",
            f"{shard_name(shard)}: another writer appended to tasks.log between our reading it "
            "and our claim; reading it again",
        )
        for task_id in [t.task_id for t in self.node.book.tasks.values() if t.shard == shard]:
            self.node.book.forget(task_id)
        self.node.schedules.forget_shard(shard)
        self.node.control.forget_shard(shard)
        self.node.book.parked_by_shard.pop(shard, None)
        self.node.book.parked_by_pause.pop(shard, None)
        info.history.clear()
        info.completed_at.clear()
        info.ended.clear()
        info.window_records.clear()
        info.claim_loc = None
        info.reloading = True
        self._load(shard, info)

    def appends_drained(self, shard: int, info: ShardInfo) -> None:
        """Every append issued to `shard` has landed or failed: do what waited for that."""
        self.lock_hold_over(shard, info, drained=True)
        if info.read_when_drained:
            info.read_when_drained = False
            if info.phase is LOADING:
                self.out.emit(fx.ReadLog(shard=shard))

    def renew(self, force: bool = False) -> None:
        if self.membership_busy:
            # Another membership operation is out: renew right after it (no timer meanwhile,
            # or the node would be woken again and again for a renewal it cannot start).
            self.renew_at_mono = None
            self.renew_after_busy = True
            return
        self.renew_at_mono = None
        self.renew_after_busy = False
        self.read_membership()

    def announce_membership(self) -> None:
        if self.doc is None or self.node.phase is STARTING:
            return
        self.out.send(
            proto.membership(
                self.config.queue if self.doc.get("queue") is None else str(self.doc["queue"]),
                int(self.doc.get("shards", 0)),
                self.node.owned_shards,
                int(self.doc.get("version", 0)),
            )
        )

    def shard_count(self) -> int:
        """The queue's shard count, as membership.json last said (1 before it was read)."""
        return int(self.doc.get("shards", 1)) if self.doc is not None else 1

    def meta(self, shard: int) -> dict[str, Any]:
        return {SNERD_NODE: self.config.node_id, SNERD_EPOCH: self.shards[shard].epoch}

    def claim_committed(
        self, p: ClaimPart, info: ShardInfo, offsets: tuple[int, ...], lengths: tuple[int, ...]
    ) -> None:
        """The claim record that fences the shard landed (dispatched by `Outcomes`): the shard
        is ours, or, behind records another writer appended after our read, read again."""
        if offsets[0] > info.loaded_size:
            self.reload(p.shard, info)
            return
        self.claimed(p.shard, info, new_location(p.shard, offsets[0], lengths[0]))
