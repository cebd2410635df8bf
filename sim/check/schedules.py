"""Invariant 11: one dispatch per cron tick per schedule (minus crash re-executions, counted).

A named schedule's owner fires each tick once: it enqueues the tick's run, a task whose id is
`<name>@<tick>` and whose records carry `snerdSchedule`, in one append with the schedule's
record saying the tick was fired, so that a new owner goes on from the next one. Runs have no
client invoke; the checker learns them from their records (`Analysis.run_creations`).

- **Fired twice** (`TICK_FIRED_TWICE`): a run id has one accepted enqueue record (the record
  that creates it: `retryCount` 0, not a tombstone). A second one, while the first is live or
  after it finished, is its tick fired again: the tick's work done twice. Only a removal of
  the schedule (`unschedule`: an accepted record with `removed`) between the two excuses it:
  a schedule declared anew starts from its declarer's clock, and may fire a tick its earlier
  self had fired.

The executions of a run beyond its first are judged by invariant 4 (`sim.check.attempts`),
with the `maxRetries` of its record: a repeated attempt number is a crash re-execution
(counted), a new one a retry within its budget. Runs need not finish for a run to end: no
client was told anything of them (`sim.check.delivery` judges acks only).

Judgements only, over a parsed history (`sim.check.history.Analysis`).
"""

from __future__ import annotations

import bisect
import itertools

from sim.check.history import Analysis
from sim.check.report import TICK_FIRED_TWICE, Violation, at

__all__ = ["judge_schedule_runs"]


def judge_schedule_runs(a: Analysis) -> list[Violation]:
    """Every run id created once (the module header)."""
    out: list[Violation] = []
    for run, creations in a.run_creations.items():
        accepted = [r for r in creations if r.accepted]
        name = a.run_schedule[run][0]
        removals = a.schedule_removals.get(name, [])
        for first, again in itertools.pairwise(accepted):
            # An accepted removal of the schedule between the two?
            j = bisect.bisect_right(removals, first.index)
            if j < len(removals) and removals[j] < again.index:
                continue
            out.append(
                Violation(
                    kind=TICK_FIRED_TWICE,
                    index=again.index,
                    t=again.t,
                    message=(
                        f"schedule {name}: run {run} enqueued again by {again.node} at "
                        f"{at(again.t)} (record #{again.index}, shard {again.shard}); it was "
                        f"enqueued by {first.node} at {at(first.t)} (#{first.index}), and the "
                        "schedule was not removed in between: its tick fired twice"
                    ),
                )
            )
    return out
