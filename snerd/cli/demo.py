"""`snerdmq demo [DIR]`: a short guided tour of snerd against a real daemon (what `make run` runs).

It starts a `snerdmq` daemon on DIR through `snerd.SnerdQueue`, with two workers so that
ordering shows, and enqueues a mix that exercises the features people ask about first:

- plain jobs (`resize-image`), and urgent ones enqueued after them that run first
  (`urgency_score`);
- a job that fails twice and then succeeds (retries, `max_retries=2`);
- a job that fails every attempt and lands in the dead letter queue (with its final error);
- a delayed job (`execute_at` three seconds ahead);
- a rate-limited group (`max_per_minute=3`, four jobs): three run, the fourth waits for the
  group's 60 s window. The demo does not wait a minute for it: it stays in the queue, durable,
  and runs in a later run on the same DIR (each run uses its own group name, so a run's first
  three always go through and the leftover of an earlier run shows up as such);
- a job that streams progress (`yield_progress`);
- a duplicate that `auto_dedupe` drops.

Every event is one line on stdout; the summary at the end says what ran, was retried,
dead-lettered, dropped and is still waiting. The run is bounded (`--timeout`, 20 s by default;
it normally takes about five), drains the daemon with SIGTERM, and exits 0 when everything
happened as described (1 otherwise, saying what did not). Running it again on the same DIR works:
task ids carry a per-run suffix, and tasks left by an earlier run are run and reported apart.

It must never: leave a daemon running, wait without a bound, or print anything but the tour on
stdout (the daemon's own log lines go to stderr, prefixed).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import anyio

from snerd import SnerdError, SnerdQueue, current_task, yield_progress
from snerd.cli.args import number_arg
from snerd.config import ConfigError, load_settings

__all__ = ["DemoResult", "main", "run_demo"]

DEFAULT_DIR = "./.snerdata"
WORKERS = 2
#: Wait between attempts of the retried jobs, in seconds.
RETRY_S = 0.5
DELAY_S = 3.0
PARTNER_LIMIT = 3


@dataclass(slots=True)
class DemoResult:
    """What the tour saw; the summary is printed from it."""

    run_id: str
    seconds: float = 0.0
    succeeded: Counter[str] = field(default_factory=Counter)
    #: Failed attempts that were retried, by short task id.
    retried: Counter[str] = field(default_factory=Counter)
    dead: dict[str, str] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    #: Tasks the daemon still held at the end (its `stats` queue depth), earlier runs' included.
    depth_at_end: int | None = None
    #: Tasks of earlier runs this run executed: id -> outcome.
    earlier: dict[str, str] = field(default_factory=dict)
    started: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    exit_code: int | None = None
    urgent_first: bool = False

    @property
    def ok(self) -> bool:
        return not self.missing and self.exit_code == 0 and self.urgent_first


class _Tour:
    """Prints events as they happen and keeps the score."""

    def __init__(self, run_id: str, out: Callable[[str], None]) -> None:
        self.run_id = run_id
        self.out = out
        self.t0 = time.monotonic()
        self.result = DemoResult(run_id=run_id)
        #: Short ids of this run's tasks still expected to finish (succeed or dead-letter).
        self.expected: set[str] = set()
        self.finished: set[str] = set()
        self.max_attempts: dict[str, int] = {}
        self._all_done: Any = None
        self.pending_at_urgent: list[str] = []

    def tid(self, short: str) -> str:
        return f"{short}.{self.run_id}"

    def short(self, task_id: str) -> tuple[str, bool]:
        """(short id, True when the task belongs to this run)."""
        suffix = f".{self.run_id}"
        if task_id.endswith(suffix):
            return task_id[: -len(suffix)], True
        return task_id, False

    def say(self, what: str, task: str, text: str = "") -> None:
        elapsed = time.monotonic() - self.t0
        line = f"[{elapsed:5.2f}s] {what:<9} {task:<12} {text}".rstrip()
        # stdout may be gone (`snerdmq demo | head`): the tour then goes on silently rather
        # than fail the handler that printed, which would fail its task.
        with contextlib.suppress(OSError):
            self.out(line)

    def done(self, short: str) -> None:
        self.finished.add(short)
        if self._all_done is not None and self.expected <= self.finished:
            self._all_done.set()


def _handler(
    tour: _Tour, task_type: str, work: Callable[[Any, int], Awaitable[None]]
) -> Callable[[Any], Awaitable[None]]:
    """Wrap a job body so that its start, success and failure are printed and counted."""
    async def handle(data: Any) -> None:
        info = current_task()
        short, ours = tour.short(info.task_id)
        label = short if ours else f"{short} (earlier run)"
        attempt = info.attempt or 1
        limit = tour.max_attempts.get(short)
        of = f" of {limit}" if limit else ""
        tour.say("started", label, f"{task_type}, attempt {attempt}{of}")
        if ours:
            tour.result.started.append(short)
        try:
            await work(data, attempt)
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            if limit is None:
                tour.say("failed", label, f"attempt {attempt}: {reason}")
                if not ours:
                    tour.result.earlier[short] = "failed"
            elif attempt < limit:
                tour.say("failed", label, f"attempt {attempt}: {reason} -> retry in {RETRY_S:g} s")
                tour.result.retried[short] += 1
            else:
                tour.say("failed", label, f"attempt {attempt}: {reason} -> no attempts left")
            raise
        tour.say("done", label)
        if ours:
            tour.result.succeeded[task_type] += 1
            tour.done(short)
        else:
            tour.result.earlier[short] = "succeeded"

    return handle


async def _sleep(seconds: float) -> None:
    await anyio.sleep(seconds)


async def run_demo(
    directory: str,
    *,
    timeout: float = 20.0,
    out: Callable[[str], None] | None = None,
    binary_path: str | None = None,
) -> DemoResult:
    """Run the tour on `directory`; returns what happened (the summary is printed by `main`)."""
    def default_out(line: str) -> None:
        print(line, flush=True)

    run_id = secrets.token_hex(2)
    tour = _Tour(run_id, out or default_out)
    tour._all_done = anyio.Event()
    result = tour.result
    say = tour.say

    # img-1 and img-2 hold the two workers until the urgent jobs are queued, so that the line
    # they jump is there whatever the machine's speed.
    gate = anyio.Event()

    async def resize(data: Any, attempt: int) -> None:
        if isinstance(data, dict) and data.get("run") == run_id and data.get("name") in (
            "img-1", "img-2",
        ):
            with anyio.move_on_after(timeout):
                await gate.wait()
        await _sleep(0.4)

    async def alert(data: Any, attempt: int) -> None:
        await _sleep(0.2)

    async def payment(data: Any, attempt: int) -> None:
        await _sleep(0.05)
        if attempt < 3:
            raise RuntimeError("card network timed out")

    async def export(data: Any, attempt: int) -> None:
        await _sleep(0.05)
        raise PermissionError("export bucket is read-only")

    async def quick(data: Any, attempt: int) -> None:
        await _sleep(0.1)

    async def report(data: Any, attempt: int) -> None:
        for pct in (25, 50, 75, 100):
            await _sleep(0.2)
            yield_progress({"percent": pct, "step": f"section {pct // 25} of 4"})
        await _sleep(0.1)  # publish it

    async def contacts(data: Any, attempt: int) -> None:
        await _sleep(0.3)

    queue = SnerdQueue(
        binary_path=binary_path,
        storage_path=directory,
        max_workers=WORKERS,
        drain_timeout=5,
        stderr_prefix="          daemon: ",
    )
    for task_type, body in (
        ("resize-image", resize),
        ("urgent-alert", alert),
        ("flaky-payment", payment),
        ("doomed-export", export),
        ("send-reminder", quick),
        ("call-partner-api", quick),
        ("build-report", report),
        ("sync-contacts", contacts),
    ):
        queue.register_handler(task_type, _handler(tour, task_type, body))

    async def dead_letter(data: Any, error: str | None) -> None:
        # The daemon says which task in the execute stream; the payload names it here.
        short = str(data.get("name", "?")) if isinstance(data, dict) else "?"
        run = data.get("run") if isinstance(data, dict) else None
        if run == run_id:
            result.dead[short] = error or ""
            say("DEAD", short, f"dead-lettered: {error}")
            tour.done(short)
        else:
            task_id = f"{short}.{run}"
            result.earlier[task_id] = "dead-lettered"
            say("DEAD", f"{task_id} (earlier run)", f"dead-lettered: {error}")

    queue.register_max_retry_handler("doomed-export", dead_letter)
    queue.register_max_retry_handler("flaky-payment", dead_letter)

    async def progress(task_id: str, data: Any) -> None:
        short, ours = tour.short(task_id)
        if isinstance(data, dict):
            text = f"{data.get('percent')}% ({data.get('step')})"
        else:
            text = str(data)
        say("progress", short if ours else f"{short} (earlier run)", text)

    queue.on_progress(progress)

    async def enqueue(
        short: str, task_type: str, note: str = "", *, expect: bool = True, **options: Any
    ) -> bool:
        data = {"name": short, "run": run_id}
        if "payload" in options:
            data = options.pop("payload")
        ack = await queue.enqueue(tour.tid(short), task_type, data, **options)
        if ack.deduplicated:
            say("dropped", short, "identical to a pending task (auto_dedupe); nothing stored")
            result.dropped.append(short)
            return False
        say("queued", short, f"{task_type}{', ' + note if note else ''}")
        if expect:
            tour.expected.add(short)
        return True

    _print_header(tour, directory)
    started = time.monotonic()
    try:
        async with queue:
            # The daemon announces its shards once it has loaded them: it is ready then.
            with anyio.move_on_after(timeout):
                while queue.membership is None:
                    await anyio.sleep(0.02)
            owned = ", ".join((queue.membership or {}).get("owned") or []) or "no shards"
            say(
                "ready", "",
                f"daemon pid {queue.pid} owns {owned}, up in "
                f"{time.monotonic() - started:.2f} s; times below count from here",
            )
            tour.t0 = time.monotonic()
            with anyio.move_on_after(timeout):
                for i in range(1, 7):
                    await enqueue(f"img-{i}", "resize-image")
                tour.pending_at_urgent = [f"img-{i}" for i in range(1, 7)]
                for i in (1, 2):
                    await enqueue(f"urgent-{i}", "urgent-alert", "urgency 10", urgency_score=10)
                gate.set()
                tour.max_attempts["pay-1"] = 3
                await enqueue(
                    "pay-1", "flaky-payment", "fails twice, then succeeds",
                    max_retries=2, retry_after_hours=RETRY_S / 3600,
                )
                tour.max_attempts["export-1"] = 2
                await enqueue(
                    "export-1", "doomed-export", "fails every attempt",
                    max_retries=1, retry_after_hours=RETRY_S / 3600,
                )
                await enqueue(
                    "reminder-1", "send-reminder", f"not before +{DELAY_S:g} s",
                    execute_at=timedelta(seconds=DELAY_S),
                )
                group = f"partner-api-{run_id}"
                for i in range(1, PARTNER_LIMIT + 2):
                    last = i == PARTNER_LIMIT + 1
                    await enqueue(
                        f"partner-{i}", "call-partner-api",
                        f"group {group}, {PARTNER_LIMIT} per minute"
                        + (": this one must wait for the window" if last else ""),
                        expect=not last,
                        rate_limit_group=group, max_per_minute=PARTNER_LIMIT,
                    )
                await enqueue("report-1", "build-report", "streams its progress")
                same = {"list": "newsletter", "run": run_id}
                await enqueue("contacts-1", "sync-contacts", "auto_dedupe",
                              auto_dedupe=True, payload=same)
                await enqueue("contacts-2", "sync-contacts", "auto_dedupe, same data",
                              auto_dedupe=True, payload=same)
                await tour._all_done.wait()
            result.missing = sorted(tour.expected - tour.finished)
            held_back = f"partner-{PARTNER_LIMIT + 1}"
            if held_back not in result.started:
                result.waiting.append(held_back)
                say("waiting", held_back, f"the group's {PARTNER_LIMIT} dispatches of the last 60 s "
                    "are used; it stays queued")
            # The last results may still be on their way to disk (a task counts until its
            # tombstone is durable): ask until the depth holds still.
            with anyio.move_on_after(5):
                for _ in range(20):
                    depth = (await queue.stats(timeout=5)).get("queue_depth")
                    if not isinstance(depth, int) or depth == result.depth_at_end:
                        break
                    result.depth_at_end = depth
                    await anyio.sleep(0.1)
            say("shutdown", "", "SIGTERM: the daemon drains and exits")
    except SnerdError as exc:
        say("error", "", str(exc))
        result.missing = sorted(tour.expected - tour.finished) or ["(the queue failed)"]
    result.exit_code = queue.exit_code
    result.seconds = time.monotonic() - started
    # Urgent jobs jumped the line when both started before every plain job that was still
    # waiting when they were enqueued (all but the two holding the workers).
    order = result.started
    urgent = [order.index(u) for u in ("urgent-1", "urgent-2") if u in order]
    waiting_plain = [
        order.index(p) for p in tour.pending_at_urgent if p in order
    ][2:]  # img-1 and img-2 had the two workers already
    result.urgent_first = len(urgent) == 2 and all(u < p for u in urgent for p in waiting_plain)
    return result


def _print_header(tour: _Tour, directory: str) -> None:
    tour.out(
        f"snerd demo: run {tour.run_id}, data in {os.path.abspath(directory)}, "
        f"{WORKERS} workers"
    )
    tour.out("Each line: [time since start] event, task, details.")


def _summary(result: DemoResult, directory: str) -> list[str]:
    """The closing lines."""
    lines = [f"Summary of run {result.run_id} ({result.seconds:.1f} s):"]
    by_type = ", ".join(f"{t} {n}" for t, n in sorted(result.succeeded.items()))
    lines.append(f"  succeeded:        {sum(result.succeeded.values()):3d}  ({by_type})")
    retried = ", ".join(f"{t} x{n}" for t, n in sorted(result.retried.items()))
    lines.append(
        f"  retried:          {sum(result.retried.values()):3d}  failed attempt(s) that were "
        f"retried ({retried or 'none'})"
    )
    dead = ", ".join(sorted(result.dead))
    lines.append(f"  dead-lettered:    {len(result.dead):3d}  ({dead or 'none'})")
    lines.append(
        f"  dropped (dedupe): {len(result.dropped):3d}  ({', '.join(result.dropped) or 'none'})"
    )
    lines.append(
        f"  still waiting:    {len(result.waiting):3d}  "
        + (
            f"({', '.join(result.waiting)}: rate limit {PARTNER_LIMIT}/min; it runs in a later "
            "run on this directory)"
            if result.waiting
            else ""
        )
    )
    earlier_left = (
        result.depth_at_end - len(result.waiting) if result.depth_at_end is not None else 0
    )
    if earlier_left > 0:
        lines.append(
            f"  queued from earlier runs or other programs: {earlier_left} (`snerdmq stats "
            f"{directory}` shows them)"
        )
    if result.earlier:
        text = ", ".join(f"{t} {o}" for t, o in sorted(result.earlier.items()))
        lines.append(f"  from earlier runs: {len(result.earlier):2d}  ({text})")
    lines.append(
        "  urgent jobs jumped the line: "
        + ("yes (urgent-1 and urgent-2 started before img-3..img-6)" if result.urgent_first
           else "NO")
    )
    if result.dead:
        lines.append(
            f"Inspect the dead letter with `snerdmq dlq {directory}`; put it back with "
            f"`snerdmq replay --type doomed-export {directory}`."
        )
    lines.append(f"See the queue in a browser with `snerdmq dashboard {directory}`.")
    if result.exit_code == 0:
        lines.append("The daemon drained and exited with code 0; every task is stored on disk.")
    else:
        lines.append(f"The daemon exited with code {result.exit_code}.")
    if result.missing:
        lines.append(f"Did not finish in time: {', '.join(result.missing)}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """`snerdmq demo [DIR] [--timeout S]`."""
    parser = argparse.ArgumentParser(
        prog="snerdmq demo",
        description=(
            "A guided tour: start a daemon on DIR and run a mix of jobs (successes, retries, "
            "a dead letter, urgent jobs, a delayed job, a rate-limited group, progress, a "
            "deduplicated duplicate), one line per event, then a summary. Takes about five "
            "seconds; safe to run again on the same DIR."
        ),
    )
    parser.add_argument(
        "directory", metavar="DIR", nargs="?", default=DEFAULT_DIR,
        help=f"queue directory (default {DEFAULT_DIR})",
    )
    parser.add_argument(
        "--timeout", type=_positive_seconds, default=20.0, metavar="S",
        help="stop waiting for the jobs after S seconds (default 20)",
    )
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    if os.path.exists(args.directory) and not os.path.isdir(args.directory):
        parser.print_usage(sys.stderr)
        print(f"snerdmq demo: error: DIR {args.directory!r} is not a directory", file=sys.stderr)
        return 2
    try:
        load_settings()  # the daemon would refuse a bad SNERD_* value; say so up front
    except ConfigError as exc:
        print(f"snerdmq demo: error: {exc}", file=sys.stderr)
        return 2

    async def go() -> DemoResult:
        return await run_demo(args.directory, timeout=args.timeout)

    result = anyio.run(go, backend="trio")
    with contextlib.suppress(OSError):
        print()
        for line in _summary(result, args.directory):
            print(line)
        sys.stdout.flush()
    return 0 if result.ok else 1


_positive_seconds = number_arg(
    "--timeout", float, "a number of seconds", "above 0", lambda v: v > 0
)
