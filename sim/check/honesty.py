"""Invariant 10: dedupe honesty. A deduplicated enqueue was told so, and a non-deduplicated one
has its own task.

An enqueue with dedupe (`auto_dedupe`, `unique_key`) may be dropped as a duplicate of a live
twin. Its ack must say which: the owner of its shard decides, and an enqueue that went into
another daemon's inbox is acked only once that decision is read (`snerd.core.node.verdicts`),
or, after a bounded wait, with `"deduplicated": null` (recorded `undecided`: no promise either
way, judged by neither rule below).

- **Untold** (`UNTOLD_DUPLICATE`): a plain ack (neither deduplicated nor undecided) is of a
  task of its own: an accepted task record of its id written after its invoke, or an execute
  of it after the invoke. One without either was dropped (as a duplicate, at an inbox's
  ingestion) while its client was told it was taken in: upstream's ack at the inbox write.
- **False** (`FALSE_DUPLICATE`): a deduplicated ack's id never has an accepted task record of
  its own after its invoke, and the twin it names (`duplicate_of`, when recorded) is another
  task with the enqueue's fingerprint (its invoke's, or a task record's `payloadHash`).

Judged at the end of the history, which the liveness phase lets drain; judgements only, over a
parsed history (`sim.check.history.Analysis`).
"""

from __future__ import annotations

from sim.check.history import Ack, Analysis
from sim.check.report import FALSE_DUPLICATE, UNTOLD_DUPLICATE, Violation, at
from snerd.core.schema import PAYLOAD_HASH

__all__ = ["judge_dedupe_honesty"]


def judge_dedupe_honesty(a: Analysis) -> list[Violation]:
    """Every decided ack of an enqueue with a fingerprint told the truth (the module header)."""
    out: list[Violation] = []
    executed: dict[str, int] = {}  # each task's last execute
    for x in a.executes:
        executed[x.task] = x.index
    for ack in a.acks:
        if ack.invoke.fingerprint is None or ack.undecided:
            continue
        if ack.deduplicated:
            problem = _false_duplicate(a, ack, executed)
            kind = FALSE_DUPLICATE
        else:
            problem = None if _has_own_task(a, ack, executed) else (
                "but it never became a task of its own (no accepted task record, no execute "
                "after the invoke): dropped without being told"
            )
            kind = UNTOLD_DUPLICATE
        if problem is not None:
            told = "as a duplicate" if ack.deduplicated else "as enqueued"
            out.append(
                Violation(
                    kind=kind,
                    index=ack.index,
                    t=ack.t,
                    message=(
                        f"task {ack.task} (fingerprint {ack.invoke.fingerprint}) acked by "
                        f"{ack.node} at {at(ack.t)} {told}, {problem}"
                    ),
                )
            )
    return out


def _has_own_task(a: Analysis, ack: Ack, executed: dict[str, int]) -> bool:
    after = ack.invoke.index
    if any(r.accepted and r.index > after for r in a.task_records.get(ack.task, ())):
        return True
    return executed.get(ack.task, -1) > after


def _false_duplicate(a: Analysis, ack: Ack, executed: dict[str, int]) -> str | None:
    """What is wrong with a deduplicated ack, or None."""
    if _has_own_task(a, ack, executed):
        return "but it has a task of its own (an accepted task record or an execute)"
    twin = ack.duplicate_of
    if twin is None:
        return None
    fp = ack.invoke.fingerprint
    if twin != ack.task and (
        any(inv.fingerprint == fp for inv in a.invokes.get(twin, ()))
        or any(r.fields.get(PAYLOAD_HASH) == fp for r in a.task_records.get(twin, ()))
    ):
        return None
    return f"of {twin}, which is not another task with that fingerprint"
