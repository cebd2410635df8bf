"""Invariants 6 and 7: the order tasks are dispatched in. Urgency is honoured, and
auto_dedupe keeps one of each payload pending.

6. **Priority** (`PRIORITY_INVERSION`): no ready task is passed over for a less urgent one
   while a worker slot is free, judged only where the history proves it, since a false alarm
   costs a whole CI run. Task B was passed over for task A on node N when all of these hold:

   1. A's first execute is on N with attempt 1, and matches an accepted dispatch record D
      (same shard, task, attempt 1, epoch) written by N: A's first dispatch record anywhere,
      durable first and issued first. `D.t_issue` stands for N's decision.
   2. N acked B (an "ok" naming the execute's shard, not deduplicated, not an inbox ack: such
      a task is ready only once ingested) strictly before `D.t_issue`; B != A.
   3. A and B have one type and one pool; neither has a group, parents, a delay or a cron;
      B's urgency is strictly above A's.
   4. By `D.t_issue` (inclusive) B had no execute, no dispatch record issued (accepted or
      fenced) and no tombstone durable, on any node.
   5. N had no belief change, crash, restart, pause, resume or clock step, and ran no
      execute, from B's ack to `D.t_issue` (inclusive; entries of the whole world without a
      node count for every node): N's view did not change, and the slot A took was free for B.
   6. No other record N issued before D, in a log or in an inbox file, was still in flight
      (durable at or after B's ack): N's writer was idle, so D was issued when N decided,
      not queued behind an earlier append from before B's ack.

7. **Dedupe** (`DUPLICATE_PENDING`): per shard, over accepted records in file order, no two
   live tasks (enqueued, not yet tombstoned) with `autoDedupe` and one `payloadHash` at the
   same time.

Judgements only, over a parsed history (`sim.check.history.Analysis`).
"""

from __future__ import annotations

import bisect
from collections import defaultdict

from sim.check.history import Ack, Analysis, Execute, InboxRecord, Invoke, Record
from sim.check.report import DUPLICATE_PENDING, PRIORITY_INVERSION, Violation, at
from snerd.core.schema import AUTO_DEDUPE, DISPATCH_ATTEMPT, PAYLOAD_HASH

__all__ = ["judge_dedupe", "judge_priority"]


def _plain(inv: Invoke) -> bool:
    """Ready as soon as acked and free of every other dispatch rule."""
    return inv.group is None and not inv.parents and inv.delay_us == 0 and inv.cron is None


def judge_priority(a: Analysis, via_inbox: list[bool] | None = None) -> list[Violation]:
    """`via_inbox`: `a.via_inbox` of each of `a.acks`, if the caller has it already."""
    out: list[Violation] = []
    first_exec: dict[str, Execute] = {}
    for x in a.executes:
        first_exec.setdefault(x.task, x)
    # Per node: (t, index) of entries that end a judgement window (clause 5), in history order.
    cuts: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for x in a.executes:
        cuts[x.node].append((x.t, x.index))
    for b in a.beliefs:
        cuts[b.node].append((b.t, b.index))
    for node, entries in a.disturbances.items():
        cuts[node].extend(entries)
    world = cuts.pop("", [])
    for entries in cuts.values():
        entries.extend(world)
        entries.sort()
    acks_by_node: dict[str, list[Ack]] = defaultdict(list)
    if via_inbox is None:
        via_inbox = [a.via_inbox(ack) for ack in a.acks]
    for ack, inbox in zip(a.acks, via_inbox, strict=True):
        if not ack.deduplicated and not inbox:
            acks_by_node[ack.node].append(ack)
    ack_times = {node: [k.t for k in acks] for node, acks in acks_by_node.items()}
    # When a cancel of each task was first sent: a task being cancelled is not passed over
    # by a dispatch decided after that (a cancel sent before its ack and answered after the
    # dispatch spans the whole window, and no cut inside it says so: seed 1314).
    cancel_sent: dict[str, int] = {}
    for _i, e in a.control_entries:
        if e.get("kind") == "command" and e.get("phase") == "invoke":
            task_id = e.get("task")
            if e.get("action") == "cancel" and isinstance(task_id, str):
                cancel_sent.setdefault(task_id, e["t"])
    #: Built on first use (a candidate inversion is rare).
    records_by_node: dict[str, list[Record | InboxRecord]] = {}

    def node_records(node: str) -> list[Record | InboxRecord]:
        if not records_by_node:
            by_node: dict[str, list[Record | InboxRecord]] = defaultdict(list)
            for r in a.records:
                by_node[r.node].append(r)
            # The node's writer thread serves its inbox appends too.
            for ir in a.inbox_records:
                by_node[ir.node].append(ir)
            records_by_node.update(by_node)
        return records_by_node.get(node, [])

    def touched(task: str, t: int) -> bool:
        """The task was executed, dispatched or finished by true time `t` (inclusive)."""
        x = first_exec.get(task)
        if x is not None and x.t <= t:
            return True
        if any(r.t_issue <= t for r in a.dispatches.get(task, ())):
            return True
        return any(r.tombstone and r.t <= t for r in a.task_records.get(task, ()))

    def writer_busy_since(node: str, d: Record) -> int:
        """The latest durable time of a record `node` issued before `d`: until then an append
        of `node` was in flight, and `d` may have waited behind it."""
        return max(
            (r.t for r in node_records(node) if r is not d and r.t_issue < d.t_issue),
            default=-1,
        )

    for task, x in first_exec.items():
        inv_a = a.invoke_before(task, x.index)
        if x.attempt != 1 or inv_a is None or not _plain(inv_a):
            continue
        dispatches = a.dispatches.get(task, [])
        d = next(
            (
                r
                for r in dispatches
                if r.index < x.index
                and r.accepted
                and r.shard == x.shard
                and r.fields.get(DISPATCH_ATTEMPT) == 1
                and r.epoch == x.epoch
            ),
            None,
        )
        if (
            d is None
            or d.node != x.node
            or d is not dispatches[0]
            or any(r.t_issue < d.t_issue for r in dispatches)
        ):
            continue
        # The latest cut at or before the issue time, A's own execute aside (with no disk
        # latency it shares D's time but follows D's entry).
        node_cuts = cuts.get(x.node, [])
        pos = bisect.bisect_left(node_cuts, (d.t_issue + 1, -1))
        while pos and node_cuts[pos - 1][1] > d.index:
            pos -= 1
        since = node_cuts[pos - 1][0] if pos else None
        acks = acks_by_node.get(x.node, [])
        times = ack_times.get(x.node, [])
        lo = bisect.bisect_right(times, since) if since is not None else 0
        # Acks after the node handed D to its writer do not count: it decided D before them
        # (D may then have waited behind other appends before its write was issued).
        hi = bisect.bisect_left(times, d.t_queued)
        busy: int | None = None
        for ack in acks[lo:hi]:
            inv_b = ack.invoke
            if (
                ack.task == task
                or ack.shard != x.shard
                or inv_b.type != inv_a.type
                or inv_b.pool != inv_a.pool
                or not _plain(inv_b)
                or inv_b.urgency <= inv_a.urgency
                or touched(ack.task, d.t_issue)
                or cancel_sent.get(ack.task, d.t_queued + 1) <= d.t_queued
            ):
                continue
            if busy is None:
                busy = writer_busy_since(x.node, d)
            if busy >= ack.t:
                continue
            out.append(
                Violation(
                    kind=PRIORITY_INVERSION,
                    index=x.index,
                    t=x.t,
                    message=(
                        f"{x.node} dispatched task {task} (urgency {inv_a.urgency}) at "
                        f"{at(d.t_issue)} while task {ack.task} (urgency {inv_b.urgency}, same type, "
                        f"shard {x.shard}), acked by {x.node} at {at(ack.t)}, was ready and "
                        "nothing else ran on that node in between"
                    ),
                )
            )
            break
    out.sort(key=lambda v: v.index)
    return out


def judge_dedupe(a: Analysis) -> list[Violation]:
    """Invariant 7 on `a`."""
    out: list[Violation] = []
    # Per shard: live task -> its fingerprint (None when it takes no part in dedupe).
    live: dict[int, dict[str, str | None]] = defaultdict(dict)
    for r in a.records:
        task = r.task_id
        if not r.accepted or r.kind is not None or task is None:
            continue
        shard_live = live[r.shard]
        if r.tombstone:
            shard_live.pop(task, None)
            continue
        h = r.fields.get(PAYLOAD_HASH)
        fp = h if r.fields.get(AUTO_DEDUPE) is True and isinstance(h, str) else None
        if fp is not None and shard_live.get(task) != fp:
            twin = next(
                (other for other, f in shard_live.items() if f == fp and other != task), None
            )
            if twin is not None:
                out.append(
                    Violation(
                        kind=DUPLICATE_PENDING,
                        index=r.index,
                        t=r.t,
                        message=(
                            f"shard {r.shard}: task {task} became pending (record by {r.node}) "
                            f"while task {twin} with the same fingerprint {fp} was still pending "
                            "(auto_dedupe)"
                        ),
                    )
                )
        shard_live[task] = fp
    return out
