"""Invariants 2, 3 and 8: one owner per shard, nothing told before it is accepted, and beliefs
that never overlap while the timing assumptions hold.

2. **Ownership** (`DOUBLE_OWNERSHIP`), judged on accepted records (see Acceptance in
   `sim.check.history`), per shard in file order: accepted transitions are in epoch order (a
   record below an earlier claim's epoch is accepted only by a system that does not fence),
   one epoch of a shard is claimed by one node, and accepted records under an epoch are
   written by the node that claimed it. `EpochLedger` judges it as the history is parsed,
   since acceptance is decided there, once.
3. **Fenced acts** (`STALE_OWNER_ACTED`, `ACK_NOT_DURABLE`): nothing is told before the record
   that makes it true is accepted. Every execute matches an accepted dispatch record (same
   shard, task, attempt and epoch) durable before it, and every ack (not as a duplicate)
   follows an accepted enqueue record of the task (`retryCount` 0, no `deletedAt`, in the
   acked shard) durable between the invoke and the ack, or is an inbox ack, made durable by
   its `inbox_record` (one writer, no fence).
8. **Belief** (`BELIEF_OVERLAP`): the true time two or more nodes believed they owned one shard
   at once (a node's belief ends at its "off", its crash, or the end of the history) is always
   measured (`Metrics.belief_overlap_us`); any of it is a violation when `params` says the
   timing assumptions held (clock rates within what the margin tolerates).

Judgements only, over a parsed history (`sim.check.history.Analysis`).
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from sim.check.report import (
    ACK_NOT_DURABLE,
    BELIEF_OVERLAP,
    DOUBLE_OWNERSHIP,
    STALE_OWNER_ACTED,
    Violation,
    at,
)
from snerd.core.schema import DELETED_AT, DISPATCH_ATTEMPT, KIND_CLAIM, RETRY_COUNT

if TYPE_CHECKING:  # (`sim.check.history` imports this module for `EpochLedger`)
    from sim.check.history import Analysis

__all__ = ["EpochLedger", "judge_belief", "judge_fenced_acts"]


class EpochLedger:
    """Per shard, the claims accepted so far and the fence they raise, judged record by record
    in file order as the history is parsed (`Analysis.feed`); the ownership violations found
    on the way are kept in `violations`, in history order."""

    __slots__ = ("claimed", "fence_on", "fences", "foreign_seen", "violations")

    def __init__(self, fence_on: bool) -> None:
        #: Whether the system under test fences stale records (`params.fence`).
        self.fence_on = fence_on
        #: Per shard: the fence (highest accepted claim epoch) so far.
        self.fences: dict[int, int] = defaultdict(int)
        #: Per shard: epoch -> (claiming node, history index).
        self.claimed: dict[int, dict[int, tuple[str, int]]] = defaultdict(dict)
        #: (shard, epoch, node) already reported as writing under someone else's epoch.
        self.foreign_seen: set[tuple[int, int, str]] = set()
        self.violations: list[Violation] = []

    def _double(self, index: int, t: int, message: str) -> None:
        self.violations.append(Violation(kind=DOUBLE_OWNERSHIP, index=index, t=t, message=message))

    def judge(
        self, i: int, t: int, shard: int, node: str, rkind: str | None, epoch: int | None
    ) -> tuple[bool, int]:
        """History entry `i`, a record of kind `rkind` (None: a task record) by `node` in
        `shard` under `epoch` (None: not an int): whether it is accepted, and the fence before
        it (the highest claim epoch before it in its shard's log)."""
        fence = self.fences[shard]
        claimed = self.claimed[shard]
        below = epoch is not None and epoch < fence
        accepted = not below or not self.fence_on
        if below and accepted:
            what = f"{rkind or 'task'} record"
            self._double(
                i,
                t,
                f"shard {shard}: a {what} by {node} under epoch {epoch} was accepted after "
                f"the claim of epoch {fence} (#{claimed[fence][1]}): a transition out of "
                "epoch order",
            )
        if accepted and epoch is not None:
            owner = claimed.get(epoch)
            if rkind == KIND_CLAIM:
                if owner is None:
                    claimed[epoch] = (node, i)
                elif owner[0] != node:
                    self._double(
                        i,
                        t,
                        f"shard {shard}: epoch {epoch} claimed by {owner[0]} (#{owner[1]}) "
                        f"and again by {node}",
                    )
                self.fences[shard] = max(fence, epoch)
            elif (
                owner is not None
                and owner[0] != node
                and (shard, epoch, node) not in self.foreign_seen
            ):
                self.foreign_seen.add((shard, epoch, node))
                what = f"{rkind or 'task'} record"
                self._double(
                    i,
                    t,
                    f"shard {shard}: {node} wrote an accepted {what} under epoch {epoch}, "
                    f"which {owner[0]} claimed (#{owner[1]})",
                )
        return accepted, fence


def judge_fenced_acts(a: Analysis, via_inbox: list[bool] | None = None) -> list[Violation]:
    """`via_inbox`: `a.via_inbox` of each of `a.acks`, if the caller has it already."""
    out: list[Violation] = []
    for x in a.executes:
        matching = [
            r
            for r in a.dispatches.get(x.task, ())
            if r.t_durable <= x.t
            and r.shard == x.shard
            and r.fields.get(DISPATCH_ATTEMPT) == x.attempt
            and r.epoch == x.epoch
        ]
        if any(r.accepted for r in matching):
            continue
        head = (
            f"stale owner acted: {x.node} executed task {x.task} attempt {x.attempt} under "
            f"epoch {x.epoch} of shard {x.shard} at {at(x.t)}"
        )
        if matching:
            r = matching[-1]
            why = (
                f"its dispatch record (#{r.index}, durable at {at(r.t_durable)}) was fenced by the "
                f"claim of epoch {r.fence}"
            )
        else:
            why = "no dispatch record of that attempt and epoch was durable before it"
        out.append(
            Violation(kind=STALE_OWNER_ACTED, index=x.index, t=x.t, message=f"{head}; {why}")
        )
    if via_inbox is None:
        via_inbox = [a.via_inbox(ack) for ack in a.acks]
    for ack, inbox in zip(a.acks, via_inbox, strict=True):
        if ack.deduplicated or inbox:
            continue  # an inbox ack is durable by its inbox record (see `inbox_record`)
        candidates = [
            r
            for r in a.task_records.get(ack.task, ())
            if ack.invoke.t <= r.t_durable <= ack.t
            and (ack.shard is None or r.shard == ack.shard)
            and r.fields.get(RETRY_COUNT, 0) == 0
            and r.fields.get(DELETED_AT) is None
        ]
        if any(r.accepted for r in candidates):
            continue
        where = f" in shard {ack.shard}" if ack.shard is not None else ""
        why = (
            f"its enqueue record #{candidates[0].index} was fenced (epoch {candidates[0].epoch} "
            f"< {candidates[0].fence})"
            if candidates
            else f"no enqueue record of it{where} was durable by then"
        )
        out.append(
            Violation(
                kind=ACK_NOT_DURABLE,
                index=ack.index,
                t=ack.t,
                message=f"task {ack.task} acked by {ack.node} at {at(ack.t)}, but {why}",
            )
        )
    return out


def judge_belief(a: Analysis) -> tuple[list[Violation], dict[int, int]]:
    """Invariant 8 on `a`: its violations, and the overlap measured per shard (µs)."""
    # Intervals per shard: (start, end, node, index of the "on" entry).
    intervals: dict[int, list[tuple[int, int, str, int]]] = defaultdict(list)
    open_: dict[tuple[int, str], tuple[int, int]] = {}
    events: list[tuple[int, int, str, int | None, bool]] = [
        (b.t, b.index, b.node, b.shard, b.on) for b in a.beliefs
    ]
    events += [(t, i, node, None, False) for t, i, node in a.crashes]
    events.sort(key=lambda e: e[1])
    for t, index, node, shard, on in events:
        keys = [(shard, node)] if shard is not None else [k for k in open_ if k[1] == node]
        for key in keys:
            if on and key not in open_:
                open_[key] = (t, index)
            elif not on and key in open_:
                start, start_index = open_.pop(key)
                intervals[key[0]].append((start, t, node, start_index))
    for (shard, node), (start, start_index) in open_.items():
        intervals[shard].append((start, a.end_t, node, start_index))
    out: list[Violation] = []
    by_shard: dict[int, int] = {}
    for shard, spans in sorted(intervals.items()):
        # Sweep: at one instant, ends before starts, so a hand-over at one time is no overlap.
        # A belief begun and ended at one instant is none (its end would sort before its start).
        spans = [span for span in spans if span[1] > span[0]]
        points = sorted(
            [(s, 1, node, idx) for s, _e, node, idx in spans]
            + [(e, 0, node, idx) for _s, e, node, idx in spans]
        )
        active: dict[str, int] = {}
        total = 0
        prev = 0
        episode: tuple[int, int, list[str]] | None = None
        for t, starts, node, idx in points:
            if len(active) >= 2:
                total += t - prev
            prev = t
            if starts:
                active[node] = idx
                if len(active) == 2 and episode is None:
                    episode = (t, idx, sorted(active))
            else:
                active.pop(node, None)
                if len(active) < 2 and episode is not None:
                    begin, idx0, nodes = episode
                    episode = None
                    if t > begin and a.params.assumptions_hold:
                        out.append(
                            Violation(
                                kind=BELIEF_OVERLAP,
                                index=idx0,
                                t=begin,
                                message=(
                                    f"shard {shard}: {' and '.join(nodes)} both believed they owned "
                                    f"it from {at(begin)} to {at(t)} ({t - begin} µs), though "
                                    "clock rates stayed within what the margin tolerates"
                                ),
                            )
                        )
        by_shard[shard] = total
    return out, by_shard
