"""The summary of a run: a table of what happened and what the checker found."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["percentile", "summary", "summary_table", "takeovers"]


def percentile(values: Sequence[int], q: float) -> int | None:
    if not values:
        return None
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def takeovers(history: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, int]]:
    """For each kill, pause, partition or clear-locks: (fault, shard, µs) from the fault's start to the
    first belief of another node in a shard a victim believed it owned when the fault began."""
    believed: dict[str, set[int]] = defaultdict(set)
    out: list[tuple[str, str, int]] = []
    open_: list[tuple[str, str, int, int]] = []  # (fault, victim, shard, start)
    for e in history:
        kind = e.get("kind")
        if kind == "belief":
            node, shard = e["node"], e["shard"]
            if e["on"]:
                for item in list(open_):
                    name, victim, s, start = item
                    if s == shard and node != victim:
                        out.append((name, f"shard-{s}", e["t"] - start))
                        open_.remove(item)
                believed[node].add(shard)
            else:
                believed[node].discard(shard)
        elif (
            kind == "fault"
            and e.get("phase") == "start"
            and e.get("name")
            in (
                "kill",
                "pause",
                "partition",
                "clear-locks",
            )
        ):
            # a partition cuts off every node on mount A (`nodes`)
            for who in [e.get("node"), *(e.get("nodes") or [])]:
                if isinstance(who, str):
                    open_ += [(str(e["name"]), who, s, e["t"]) for s in sorted(believed[who])]
        elif kind == "crash":
            believed[e["node"]].clear()
    return out


def summary(outcome: Any) -> dict[str, Any]:
    """The figures of a run (`outcome`: a `jepsen_lite.phases.Outcome`)."""
    h = outcome.history
    phases = Counter(e.get("phase") for e in h if e.get("kind") == "enqueue")
    latencies = [e["latency_us"] for e in h if e.get("kind") == "enqueue" and "latency_us" in e]
    executes = [e for e in h if e.get("kind") == "execute"]
    per_task = Counter(e["task"] for e in executes)
    per_attempt = Counter((e["task"], e["attempt"]) for e in executes)
    took = takeovers(h)
    faults: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for f in outcome.faults:
        faults[f.name][0] += 1
        faults[f.name][1] += int(f.verified)
    m = outcome.report.metrics
    return {
        "verdict": "ok" if outcome.report.ok and not outcome.problems else "FAILED",
        "checker_ok": outcome.report.ok,
        "violations": len(outcome.report.violations),
        "violation_kinds": dict(Counter(v.kind for v in outcome.report.violations)),
        "invoked": phases.get("invoke", 0),
        "ok": phases.get("ok", 0),
        "fail": phases.get("fail", 0),
        "info": phases.get("info", 0),
        "inbox_acked": getattr(m, "inbox_acked", None),
        "finished": m.finished,
        "dead_letters": m.dead_letters,
        "executions": m.executions,
        "re_executions": m.re_executions,
        "tasks_run_more_than_once": sum(1 for n in per_task.values() if n > 1),
        "attempts_run_more_than_once": sum(1 for n in per_attempt.values() if n > 1),
        "max_attempts": m.max_attempts,
        "fenced_records": m.fenced_records,
        "belief_overlap_us": m.belief_overlap_us,
        "records": sum(1 for e in h if e.get("kind") == "record"),
        "inbox_records": sum(1 for e in h if e.get("kind") == "inbox_record"),
        "takeovers": len(took),
        "takeover_p50_ms": _ms(percentile([t[2] for t in took], 50)),
        "takeover_max_ms": _ms(max((t[2] for t in took), default=None)),
        "enqueue_p50_ms": _ms(percentile(latencies, 50)),
        "enqueue_p99_ms": _ms(percentile(latencies, 99)),
        "faults": {k: {"ran": v[0], "verified": v[1]} for k, v in sorted(faults.items())},
        "drained": outcome.drained,
        "problems": list(outcome.problems),
        "seconds": round((outcome.ended - outcome.started) / 1e6, 1),
    }


def _ms(us: int | None) -> float | None:
    return None if us is None else round(us / 1000, 1)


def summary_table(s: Mapping[str, Any]) -> str:
    rows: list[tuple[str, str]] = [
        ("verdict", str(s["verdict"])),
        (
            "checker",
            f"{'ok' if s['checker_ok'] else 'FAILED'} ({s['violations']} violation(s)"
            + (f": {s['violation_kinds']}" if s["violation_kinds"] else "")
            + ")",
        ),
        (
            "enqueues",
            f"{s['invoked']} invoked: {s['ok']} ok, {s['fail']} fail, {s['info']} info"
            + (f" ({s['inbox_acked']} acked via an inbox)" if s["inbox_acked"] is not None else ""),
        ),
        ("finished", f"{s['finished']} acked tasks finished, {s['dead_letters']} dead letters"),
        (
            "executions",
            f"{s['executions']} ({s['re_executions']} re-executions of an attempt; "
            f"{s['tasks_run_more_than_once']} tasks ran more than once; max attempts "
            f"{s['max_attempts']})",
        ),
        (
            "records",
            f"{s['records']} log records ({s['fenced_records']} fenced), "
            f"{s['inbox_records']} inbox records",
        ),
        ("belief overlap", f"{s['belief_overlap_us'] / 1e6:.3f} s (measured, not judged)"),
        (
            "takeovers",
            f"{s['takeovers']}: p50 {s['takeover_p50_ms']} ms, max {s['takeover_max_ms']} ms",
        ),
        ("enqueue latency", f"p50 {s['enqueue_p50_ms']} ms, p99 {s['enqueue_p99_ms']} ms"),
    ]
    for name, f in s["faults"].items():
        rows.append((f"nemesis {name}", f"{f['ran']} ran, {f['verified']} verified"))
    rows.append(("drained", str(s["drained"])))
    rows.append(("wall time", f"{s['seconds']} s"))
    for p in s["problems"]:
        rows.append(("problem", p))
    width = max(len(k) for k, _ in rows)
    line = "+" + "-" * (width + 2) + "+" + "-" * 72 + "+"
    out = [line]
    for k, v in rows:
        out.append(f"| {k.ljust(width)} | {v}")
    out.append(line)
    return "\n".join(out)
