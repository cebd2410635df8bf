"""The summary of a run: a table of what happened and what the checker found."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from sim.check.control import Command, commands
from sim.check.history import analyse

__all__ = [
    "PARENT_REASONS",
    "command_figures",
    "dead_letter_reasons",
    "dependencies",
    "percentile",
    "summary",
    "summary_table",
    "takeovers",
]

#: The reasons a daemon dead-letters a child without running it (its error's first word).
PARENT_REASONS = ("blocked_by_failed_parent", "unknown_parent", "dependency_cycle_through")


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


def dead_letter_reasons(history: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Dead-lettered tasks by reason: one of `PARENT_REASONS`, or `attempts` (its attempts all
    failed); each task once, under the last reason it was told."""
    last: dict[str, str] = {}
    for e in history:
        if e.get("kind") == "dead_letter":
            reason = str(e.get("error") or "").partition(":")[0]
            last[str(e["task"])] = reason if reason in PARENT_REASONS else "attempts"
    return dict(sorted(Counter(last.values()).items()))


def dependencies(history: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """The dependency workload's figures: children (invokes with `parents`), how many ran,
    how many ended (their last tombstone) on another node than one of their parents did,
    how many were sent before one of their parents, and the parents nobody enqueued."""
    sent: dict[str, int] = {}
    children: dict[str, list[str]] = {}
    ran: set[str] = set()
    ended_on: dict[str, str] = {}
    for e in history:
        kind = e.get("kind")
        if kind == "enqueue" and e.get("phase") == "invoke":
            sent.setdefault(e["task"], e["t"])
            parents = (e.get("attrs") or {}).get("parents") or []
            if parents:
                children.setdefault(e["task"], list(parents))
        elif kind == "execute":
            ran.add(e["task"])
        elif kind == "record" and e["fields"].get("deletedAt") is not None:
            task = e["fields"].get("taskId")
            if isinstance(task, str):
                ended_on[task] = str(e["node"]).partition("@")[0]
    across = sum(
        1
        for c, ps in children.items()
        if c in ended_on and any(ended_on.get(p, ended_on[c]) != ended_on[c] for p in ps)
    )
    return {
        "children": len(children),
        "children_ran": sum(1 for c in children if c in ran),
        "children_across_nodes": across,
        "children_sent_first": sum(
            1 for c, ps in children.items() if any(sent.get(p, -1) > sent[c] for p in ps)
        ),
        "parents_never_enqueued": len({p for ps in children.values() for p in ps} - set(sent)),
    }


def _took_effect(cmd: Command) -> bool:
    """Whether a command's answer says it did what it asked (the answers the checker holds the
    daemons to): cancelled, retried, paused or resumed on every shard, a sweep on every
    shard."""
    reply = cmd.reply
    if reply is None:
        return False
    if cmd.action == "cancel":
        return reply.get("cancelled") is True
    if cmd.action == "retry":
        return reply.get("retried") is True
    return reply.get("pending") == []


def command_figures(history: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The job-control figures (`jepsen_lite.commands`): commands sent and answered (an
    answer, or an error reply), per action also those whose answer says they took effect;
    how long answers took; sweeps' task counts. Commands are paired with their answers as
    `sim.check.control` pairs them."""
    cmds = commands(analyse(history))
    per: dict[str, dict[str, int]] = {}
    took: list[int] = []
    swept = 0
    for cmd in cmds:
        row = per.setdefault(cmd.action, {"sent": 0, "answered": 0, "error": 0, "effect": 0})
        row["sent"] += 1
        if cmd.t_answer == _NEVER:
            continue
        row["answered"] += 1
        took.append(cmd.t_answer - cmd.t)
        if cmd.reply is None:
            row["error"] += 1
            continue
        row["effect"] += int(_took_effect(cmd))
        if cmd.action in ("purge", "retry_type") and isinstance(cmd.reply.get("count"), int):
            swept += cmd.reply["count"]
    return {
        "commands": len(cmds),
        "commands_answered": len(took),
        "commands_by_action": dict(sorted(per.items())),
        "command_answer_p50_ms": _ms(percentile(took, 50)),
        "command_answer_p99_ms": _ms(percentile(took, 99)),
        "command_answer_max_ms": _ms(max(took, default=None)),
        "swept_tasks": swept,
    }


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
        "dead_letters_by_reason": dead_letter_reasons(h),
        **dependencies(h),
        **command_figures(h),
        "cancels_running": m.cancels_running,
        "executions": m.executions,
        "schedule_runs": m.schedule_runs,
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


#: `Command.t_answer` of a command never answered.
_NEVER = Command(index=0, t=0, node="", action="", target=None).t_answer


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
            "dead letters",
            ", ".join(f"{n} {why}" for why, n in s["dead_letters_by_reason"].items()) or "none",
        ),
        (
            "dependencies",
            f"{s['children']} children: {s['children_ran']} ran, "
            f"{s['children_across_nodes']} ended on another node than a parent, "
            f"{s['children_sent_first']} sent before a parent; "
            f"{s['parents_never_enqueued']} parents never enqueued",
        ),
        (
            "commands",
            f"{s['commands']} sent, {s['commands_answered']} answered: "
            + (
                ", ".join(
                    f"{a} {r['sent']}/{r['answered']}/{r['effect']}"
                    for a, r in s["commands_by_action"].items()
                )
                + " (sent/answered/took effect)"
                if s["commands_by_action"]
                else "none"
            ),
        ),
        (
            "command answers",
            f"p50 {s['command_answer_p50_ms']} ms, p99 {s['command_answer_p99_ms']} ms, max "
            f"{s['command_answer_max_ms']} ms; {s['swept_tasks']} tasks swept; "
            f"{s['cancels_running']} cancels of a running attempt (judged by invariants 13-16)",
        ),
        ("schedule runs", f"{s.get('schedule_runs', 0)} (one per tick, judged by invariant 11)"),
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
