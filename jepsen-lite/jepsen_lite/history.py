"""The history of a run, in the format `sim.check` judges (`sim/check/history.py`).

What the workers saw (invokes and their outcomes, executes, beliefs, dead letters) is recorded
as it happens, stamped with the host's wall clock, the run's true time. What the daemons wrote
is read back after the run from the files themselves: every `shard-N/tasks/tasks.log` becomes
`record` entries in file order, every `shard-N/inbox/*.log` `inbox_record` entries. The instant
a record became durable is not observable from outside, so each gets an estimate:

- the writer's own timestamp in the record (`at` of a claim or dispatch, `retryAfterTime` of
  an enqueue or retry record, `snerdReplayedAt` of a task a `retry` command put back,
  `deletedAt` of a tombstone), less the clock nemesis' offset on that host at the time (the
  controller knows every step it made);
- clamped to what the clients saw: an enqueue record of the acking node lies between the
  invoke and the ack, a dispatch record no later than the first execute of that attempt on its
  writer after it (attempt numbers start again after a retry), a tombstone or retry record no earlier than the handler's return (not a `cancelled`
  tombstone: a cancel does not wait for the handler; nor a return much later than the
  tombstone's own time: a run after a retry);
- records without a timestamp (inbox progress records, copies of inbox tasks) take the time of
  the record before them in the file.

Entries of one shard keep their file order (`t` is the running maximum of the estimates; the
estimate itself is `t_durable`). An execute's shard and epoch, which the `execute` message does
not carry, come from the dispatch record of that task and attempt written by that daemon.
Node names are `<host>@pid-<daemon pid>`: a daemon's owner id without its random suffix.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from snerd.core.records import scan
from snerd.core.schema import (
    CLAIM_EPOCH,
    DELETED_AT,
    DISPATCH_ATTEMPT,
    DISPATCH_TASK,
    KIND_CLAIM,
    KIND_DISPATCH,
    OUTCOME_CANCELLED,
    RECORD_AT,
    RETRY_AFTER_HOURS,
    RETRY_AFTER_TIME,
    RETRY_COUNT,
    SNERD_CRC,
    SNERD_EPOCH,
    SNERD_KIND,
    SNERD_NODE,
    SNERD_OUTCOME,
    SNERD_REPLAYED_AT,
    SNERD_SEQ,
    SNERD_VIA,
    TASK_ID,
)
from snerd.core.shardlog import tombstone_outcome
from snerd.core.timefmt import parse_rfc3339

__all__ = ["ClockSteps", "build_history", "finished_tasks", "node_name", "read_logs"]

#: How long after a clock file is written the daemon may still use the old offset (it looks
#: at the file at most every 100 ms; a busy or paused daemon later).
_STEP_SLACK_US = 500_000


def node_name(owner_id: str) -> str:
    """`n1@pid-123-a1b2c3` -> `n1@pid-123` (the name the workers' events use); an inbox
    writer's `snerdVia` may carry a segment (`n1@pid-123-a1b2c3~7`), dropped too."""
    owner_id = owner_id.partition("~")[0]
    head, sep, tail = owner_id.rpartition("-")
    return head if sep and len(tail) == 6 and "@pid-" in head else owner_id


class ClockSteps:
    """The wall-clock offsets the clock nemesis set, per host, as (true time, offset µs)."""

    def __init__(self) -> None:
        self.steps: dict[str, list[tuple[int, int]]] = defaultdict(list)

    def add(self, host: str, t: int, offset_us: int) -> None:
        self.steps[host].append((t, offset_us))

    def offset_at(self, host: str, t: int) -> int:
        steps = self.steps.get(host)
        if not steps:
            return 0
        i = bisect.bisect_right([s[0] for s in steps], t)
        return steps[i - 1][1] if i else 0

    def true_time(self, node: str, wall_us: int, hint: int | None = None) -> int:
        """The true time at which `node`'s wall clock read `wall_us`. Around a step a reading
        can fit two offsets (after a step back, the clock reads again what it read before);
        then the one nearest `hint` (the time of the record before it in its file) wins."""
        host = node.partition("@")[0]
        steps = self.steps.get(host)
        if not steps:
            return wall_us
        fits = []
        for o in sorted({0, *(o for _, o in steps)}, key=abs):
            t = wall_us - o
            # Consistent when the offset in effect at t (or just before, as the daemon reads
            # the file late) is o.
            if o in (self.offset_at(host, t), self.offset_at(host, t - _STEP_SLACK_US)):
                fits.append(t)
        if not fits:
            return wall_us
        if hint is None or len(fits) == 1:
            return fits[0]
        return min(fits, key=lambda t: abs(t - hint))


def _time(value: Any) -> int | None:
    if not isinstance(value, str):
        return None
    try:
        return parse_rfc3339(value)
    except (ValueError, TypeError):
        return None


def read_logs(
    directory: Path,
) -> tuple[dict[int, list[dict[str, Any]]], list[tuple[int, list[dict[str, Any]]]]]:
    """Every shard log's records in file order, and every inbox file's (shard, records)."""
    logs: dict[int, list[dict[str, Any]]] = {}
    inboxes: list[tuple[int, list[dict[str, Any]]]] = []
    for shard_dir in sorted(directory.glob("shard-*")):
        try:
            shard = int(shard_dir.name.split("-", 1)[1])
        except ValueError:
            continue
        log = shard_dir / "tasks" / "tasks.log"
        if log.exists():
            logs[shard] = [
                {**dict(r.fields), "_offset": r.offset} for r in scan(log.read_bytes()).records
            ]
        for inbox in sorted((shard_dir / "inbox").glob("*.log")):
            recs = [
                {**dict(r.fields), "_offset": r.offset} for r in scan(inbox.read_bytes()).records
            ]
            inboxes.append((shard, recs))
    return logs, inboxes


def finished_tasks(directory: Path) -> set[str]:
    """Ids of tasks with a tombstone in their shard's log (the drain's progress)."""
    done: set[str] = set()
    logs, _ = read_logs(directory)
    for records in logs.values():
        for f in records:
            if f.get(SNERD_KIND) is None and f.get(DELETED_AT) is not None:
                task = f.get(TASK_ID)
                if isinstance(task, str):
                    done.add(task)
    return done


def _after_return(est: int | None, returns: list[tuple[int, int]]) -> int | None:
    """A tombstone's or retry record's estimate `est`, no earlier than the latest handler
    return (of `returns`: its task's on its writer) that could be the one it records: not one
    later than the estimate by more than the clock correction's slack (that one belongs to a
    later run, after a retry)."""
    if est is None:
        return max((t + 1 for _a, t in returns), default=None)
    fits = [t for _a, t in returns if t <= est + _STEP_SLACK_US]
    return max(est, max(fits) + 1) if fits else est


def _clean(fields: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if not k.startswith("_") and k != SNERD_CRC}


def build_history(
    events: Iterable[Mapping[str, Any]],
    directory: Path,
    clocks: ClockSteps,
) -> list[dict[str, Any]]:
    """The full history: `events` (params first, then what was seen live, with `t`), plus the
    records read from `directory`, sorted by true time."""
    live = [dict(e) for e in events]
    params = live[0]
    assert params.get("kind") == "params", "the first event must be the params entry"
    logs, inboxes = read_logs(directory)

    invokes: dict[str, list[int]] = defaultdict(list)
    acks: dict[tuple[str, str], int] = {}
    executes: dict[tuple[str, str, int], list[int]] = defaultdict(list)
    done: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
    for e in live:
        kind = e.get("kind")
        if kind == "enqueue" and e.get("phase") == "invoke":
            invokes[e["task"]].append(e["t"])
        elif kind == "enqueue" and e.get("phase") == "ok":
            acks[(e["node"], e["task"])] = e["t"]
        elif kind == "execute":
            executes[(e["node"], e["task"], e["attempt"])].append(e["t"])
        elif kind == "handler_done":
            done[(e["node"], e["task"])].append((e["attempt"], e["t"]))

    def clamp_enqueue(writer: str, task: str, est: int) -> int:
        times = invokes.get(task, [])
        i = bisect.bisect_right(times, est)
        inv = times[i - 1] if i else (times[0] if times else None)
        if inv is not None:
            est = max(est, inv)
        ack = acks.get((writer, task))
        if ack is not None and (inv is None or ack >= inv):
            est = min(est, ack)
        return est

    out: list[dict[str, Any]] = [*live]
    # Inbox records: those still in inbox files (an owner may delete a file it has read to
    # the end), and for the others the owner's copy in tasks.log (`snerdVia` names the inbox
    # writer), turned back into the record the writer wrote.
    inbox_fields: dict[tuple[int, str, str], dict[str, Any]] = {}
    for shard, records in inboxes:
        for f in records:
            writer = node_name(str(f.get(SNERD_NODE, "?")))
            inbox_fields.setdefault((shard, writer, str(f.get(TASK_ID))), f)
    for shard, records in logs.items():
        for f in records:
            via = f.get(SNERD_VIA)
            if f.get(SNERD_KIND) is not None or not isinstance(via, str):
                continue
            key = (shard, node_name(via), str(f.get(TASK_ID)))
            if key not in inbox_fields:
                copy = {
                    k: v
                    for k, v in f.items()
                    if k not in (SNERD_EPOCH, SNERD_SEQ, SNERD_VIA, DELETED_AT, SNERD_OUTCOME)
                }
                copy[SNERD_NODE] = via
                copy["_offset"] = -1
                copy["_rebuilt"] = True
                inbox_fields[key] = copy
    inbox_at: dict[tuple[int, str], int] = {}
    inbox_entries: list[dict[str, Any]] = []
    for (shard, writer, task), f in inbox_fields.items():
        raw = _time(f.get(RETRY_AFTER_TIME))
        sent = invokes.get(task)
        durable = clamp_enqueue(
            writer,
            task,
            clocks.true_time(writer, raw, sent[-1] if sent else None)
            if raw is not None
            else params["t"],
        )
        inbox_at[(shard, task)] = max(durable, inbox_at.get((shard, task), durable))
        ientry: dict[str, Any] = {
            "t": durable,
            "kind": "inbox_record",
            "shard": shard,
            "node": writer,
            "fields": _clean(f),
            "t_issue": durable,
            "offset": f["_offset"],
        }
        if f.get("_rebuilt"):
            ientry["rebuilt_from_log"] = True
        inbox_entries.append(ientry)
    # One writer per inbox file: its records in file order are in time order.
    inbox_entries.sort(key=lambda e: (e["shard"], e["node"], e["t"]))
    out.extend(inbox_entries)
    # Dispatch records by (writer, task, attempt): (shard, epoch, estimated time).
    dispatched: dict[tuple[str, str, int], list[tuple[int, int, int]]] = defaultdict(list)
    for shard, records in sorted(logs.items()):
        prev = params["t"]
        for f in records:
            writer = node_name(str(f.get(SNERD_NODE, "?")))
            kind = f.get(SNERD_KIND)
            est: int | None = None
            if kind == KIND_CLAIM:
                raw = _time(f.get(RECORD_AT))
                est = clocks.true_time(writer, raw, prev) if raw is not None else None
            elif kind == KIND_DISPATCH:
                raw = _time(f.get(RECORD_AT))
                est = clocks.true_time(writer, raw, prev) if raw is not None else None
                seen = executes.get(
                    (writer, str(f.get(DISPATCH_TASK)), int(f.get(DISPATCH_ATTEMPT, 0)))
                )
                if seen and est is not None:
                    # The first execute after the record, or (the clock correction may be a
                    # little off) just before it: attempt numbers start again after a retry,
                    # so an earlier run's execute of the same attempt may be close too.
                    after = [t for t in seen if t >= est]
                    near = [t for t in seen if t >= est - 2_000_000]
                    est = min(est, after[0] if after else near[0] if near else seen[-1])
                elif seen:
                    est = seen[0]
            elif kind is None:
                task = str(f.get(TASK_ID))
                if f.get(DELETED_AT) is not None:
                    raw = _time(f.get(DELETED_AT))
                    est = clocks.true_time(writer, raw, prev) if raw is not None else None
                    if tombstone_outcome(f) != OUTCOME_CANCELLED:
                        # (A cancel ends the task without waiting for its handler, and a
                        # later return is another run's, after a retry.)
                        est = _after_return(est, done.get((writer, task), []))
                elif f.get(SNERD_REPLAYED_AT) is not None and f.get(RETRY_COUNT, 0) == 0:
                    # Put back by a retry (keeping the `snerdVia` of its first enqueue):
                    # written when it says, not at the enqueue.
                    raw = _time(f.get(SNERD_REPLAYED_AT))
                    est = clocks.true_time(writer, raw, prev) if raw is not None else None
                elif SNERD_VIA in f:
                    # Copied from an inbox after the writer's record was durable.
                    at = inbox_at.get((shard, task))
                    est = None if at is None else max(at + 1, prev)
                elif f.get(RETRY_COUNT, 0) == 0:
                    raw = _time(f.get(RETRY_AFTER_TIME))
                    if raw is not None:
                        est = clamp_enqueue(writer, task, clocks.true_time(writer, raw, prev))
                else:
                    raw = _time(f.get(RETRY_AFTER_TIME))
                    hours = f.get(RETRY_AFTER_HOURS) or 0
                    if raw is not None and isinstance(hours, int | float):
                        est = clocks.true_time(writer, raw - int(hours * 3_600_000_000), prev)
                    attempt = f.get(RETRY_COUNT)
                    returns = [(a, t) for a, t in done.get((writer, task), []) if a == attempt]
                    est = _after_return(est, returns)
            durable = est if est is not None else prev
            t = max(prev, durable)
            prev = t
            epoch = f.get(CLAIM_EPOCH) if kind == KIND_CLAIM else f.get(SNERD_EPOCH)
            entry: dict[str, Any] = {
                "t": t,
                "kind": "record",
                "shard": shard,
                "node": writer,
                "epoch": epoch if isinstance(epoch, int) else None,
                "fields": _clean(f),
                "t_issue": min(durable, t),
                "offset": f["_offset"],
            }
            if durable != t:
                entry["t_durable"] = durable
            out.append(entry)
            if kind == KIND_DISPATCH and isinstance(epoch, int):
                dispatched[
                    (writer, str(f.get(DISPATCH_TASK)), int(f.get(DISPATCH_ATTEMPT, 0)))
                ].append((shard, epoch, durable))
    # Executes: the shard and epoch of the dispatch they followed.
    for e in out:
        if e.get("kind") != "execute":
            continue
        options = dispatched.get((e["node"], e["task"], e["attempt"]), [])
        before = [d for d in options if d[2] <= e["t"]]
        pick = before[-1] if before else (options[0] if options else None)
        if pick is None:
            e["shard"], e["epoch"] = -1, -1  # no dispatch record at all: the checker says so
        else:
            e["shard"], e["epoch"] = pick[0], pick[1]
    first = out[0]
    rest = out[1:]
    order = {"enqueue": 1}
    rest.sort(key=lambda e: (e["t"], 0 if e.get("phase") == "invoke" else order.get(e["kind"], 2)))
    history = [first, *rest]
    end_t = max((e["t"] for e in history), default=first["t"])
    history.append({"t": end_t, "kind": "end"})
    return history
