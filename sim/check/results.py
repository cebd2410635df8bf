"""Invariant 12: a stored result read back equals one a successful attempt returned.

What a handler returns travels in its attempt's `result` line and is stored on the task's
success tombstone (`snerdResult`). At the end of a run the recorder reads every completed
task's tombstone back from the final files, through the core's own fold
(`snerd.core.shardlog`), and lists it as a `stored_result` entry.

- **Wrong result** (`WRONG_RESULT`): a completed task's stored result (none counts as a
  value: the attempt returned nothing) is not what any of its successful attempts returned
  (`handler_done` with `ok`, and its `result`). Values compare as JSON does: `1` and `1.0`
  and `true` are three values, so they are compared by their canonical encoding.

A completed task with no successful attempt in the history is not judged here (no client saw
its result; `sim.check.delivery` judges its ends). Attempts whose `result` line was lost in a
crash count as returned: the check is that the stored value is one of theirs, not which.

Judgements only, over a parsed history (`sim.check.history.Analysis`).
"""

from __future__ import annotations

from typing import Any

import orjson

from sim.check.history import Analysis
from sim.check.report import WRONG_RESULT, Violation, at

__all__ = ["judge_results"]


def judge_results(a: Analysis) -> list[Violation]:
    """Every stored result is one its task returned (the module header)."""
    out: list[Violation] = []
    for stored in a.stored:
        returned = a.returned.get(stored.task)
        if not returned:
            continue
        if _canonical(stored.result) in {_canonical(value) for value in returned}:
            continue
        out.append(
            Violation(
                kind=WRONG_RESULT,
                index=stored.index,
                t=stored.t,
                message=(
                    f"task {stored.task} (shard {stored.shard}) stores the result "
                    f"{_shown(stored.result)} at {at(stored.t)}, but its successful attempts "
                    f"returned {', '.join(_shown(v) for v in returned)}"
                ),
            )
        )
    return out


def _canonical(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def _shown(value: Any) -> str:
    text = "nothing" if value is None else orjson.dumps(value).decode()
    return text if len(text) <= 80 else text[:80] + "…"
