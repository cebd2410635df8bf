"""The simulator's command line: `python -m sim --seed N` or `--seeds A..B`.

The first line printed is the seed and every derived setting; a failure prints the first
violation and the one command that reproduces it.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from sim.settings import SECOND, Settings
from sim.world import Outcome, run

__all__ = ["main", "repro_command", "run_seed"]


_RATES = ("crash-rate", "pause-rate", "step-rate", "lock-loss-rate", "enospc-rate", "outage-rate")
_PROBS = (
    "torn-prob",
    "membership-fail-prob",
    "membership-unknown-prob",
    "slow-io-prob",
    "lock-loss-silent-prob",
)
#: Settings the command line can set, with their flags (float ones and int ones).
_FLOAT_FLAGS = (*_RATES, *_PROBS, "enqueue-rate", "fail-prob", "deps-prob", "batch-prob",
                "final-prob")
_INT_FLAGS = ("steps", "nodes", "shards", "drift-max-ppm", "history-limit")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sim", description=__doc__)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--seed", type=int, help="run one seed")
    which.add_argument("--seeds", help="run a batch, A..B (B excluded)")
    which.add_argument(
        "--regression-seeds",
        action="store_true",
        help="run only the regression seeds kept in sim/regressions.txt",
    )
    p.add_argument("--steps", type=int, help="most world events in the safety phase")
    p.add_argument("--nodes", type=int)
    p.add_argument("--shards", type=int)
    for name in _RATES:
        p.add_argument(f"--{name}", type=float, help="fault episodes per second of true time")
    for name in _PROBS:
        p.add_argument(f"--{name}", type=float, help="a fault's probability per operation")
    p.add_argument("--enqueue-rate", type=float, help="enqueues per second (the workload)")
    p.add_argument("--fail-prob", type=float, help="probability that a handler fails")
    p.add_argument("--deps-prob", type=float, help="probability that a task waits for parents")
    p.add_argument("--final-prob", type=float,
                   help="probability that a failure is marked final (retry: false)")
    p.add_argument("--batch-prob", type=float,
                   help="probability that an enqueue is a batch of several (0: none)")
    p.add_argument("--drift-max-ppm", type=int)
    p.add_argument(
        "--history-limit", type=int, help="finished tasks compaction keeps per log (0: drawn)"
    )
    p.add_argument("--offset-max-s", type=float)
    p.add_argument("--pause-max-s", type=float)
    p.add_argument("--fs", choices=("posix", "nfsv3"), default="posix")
    p.add_argument("--unsafe-no-margin", action="store_true")
    p.add_argument("--unsafe-no-fence", action="store_true")
    p.add_argument("--unsafe-wall-clock-only", action="store_true")
    p.add_argument(
        "--unsafe-no-cap",
        action="store_true",
        help="nodes run without SNERD_MAX_SHARDS while the world checks it (a control)",
    )
    p.add_argument(
        "--unsafe-absent-parents-done",
        action="store_true",
        help="a parent that is not a live task of the child's node counts as done (a control)",
    )
    p.add_argument(
        "--unsafe-dedupe-ack-at-write",
        action="store_true",
        help="an enqueue with dedupe through an inbox is acked at its write (a control)",
    )
    p.add_argument(
        "--unsafe-fire-unmarked",
        action="store_true",
        help="a schedule's fire leaves its record at the tick before (a control)",
    )
    p.add_argument(
        "--unsafe-wrong-result",
        action="store_true",
        help="a success's tombstone stores a result its handler did not return (a control)",
    )
    p.add_argument(
        "--unsafe-ignore-cancel",
        action="store_true",
        help="a cancel is answered cancelled and leaves the task as it was (a control)",
    )
    p.add_argument(
        "--unsafe-ignore-pause",
        action="store_true",
        help="dispatch does not look at pause marks (a control)",
    )
    p.add_argument(
        "--unsafe-purge-all",
        action="store_true",
        help="a purge forgets every ended task, succeeded or not, whenever it ended (a control)",
    )
    p.add_argument(
        "--unsafe-retry-skips-oldest",
        action="store_true",
        help="a retry of a type's dead letters leaves the oldest where it is (a control)",
    )
    p.add_argument(
        "--unsafe-batch-ack-early",
        action="store_true",
        help="each task of a batch is acked as it is read, before it is durable (a control)",
    )
    p.add_argument(
        "--unsafe-retry-final",
        action="store_true",
        help="a failure marked final (retry: false) is retried as any other (a control)",
    )
    p.add_argument(
        "--unsafe-ignore-task-backoff",
        action="store_true",
        help="retries wait the daemon's policy, not the task's own (a control)",
    )
    p.add_argument(
        "--faults-of",
        choices=(
            "no-margin",
            "no-fence",
            "wall-clock-only",
            "no-cap",
            "absent-parents-done",
            "dedupe-ack-at-write",
            "fire-unmarked",
            "wrong-result",
            "ignore-cancel",
            "ignore-pause",
            "purge-all",
            "retry-skips-oldest",
            "batch-ack-early",
            "retry-final",
            "ignore-task-backoff",
            "nfsv3",
        ),
        help="the world of a negative control, without its unsafe switch (its safe twin)",
    )
    p.add_argument("--quiet", action="store_true", help="batch: print failures and the summary")
    p.add_argument(
        "--stop-on-failure", action="store_true", help="batch: stop at the first failing seed"
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="batch: run seeds in this many processes (0: one per core); output order is kept",
    )
    p.add_argument(
        "--regressions",
        action="store_true",
        help="also run the regression seeds kept in sim/regressions.txt",
    )
    return p


def _given(args: argparse.Namespace) -> dict[str, Any]:
    given: dict[str, Any] = {}
    for flag in (*_INT_FLAGS, *_FLOAT_FLAGS):
        key = flag.replace("-", "_")
        if getattr(args, key) is not None:
            given[key] = getattr(args, key)
    if args.offset_max_s is not None:
        given["offset_max_us"] = int(args.offset_max_s * SECOND)
    if args.pause_max_s is not None:
        given["pause_max_us"] = int(args.pause_max_s * SECOND)
    given["fs_mode"] = args.fs
    if args.faults_of:
        given["faults_of"] = args.faults_of
    given["unsafe_no_margin"] = args.unsafe_no_margin
    given["unsafe_no_fence"] = args.unsafe_no_fence
    given["unsafe_wall_clock_only"] = args.unsafe_wall_clock_only
    given["unsafe_no_cap"] = args.unsafe_no_cap
    given["unsafe_absent_parents_done"] = args.unsafe_absent_parents_done
    given["unsafe_dedupe_ack_at_write"] = args.unsafe_dedupe_ack_at_write
    given["unsafe_fire_unmarked"] = args.unsafe_fire_unmarked
    given["unsafe_wrong_result"] = args.unsafe_wrong_result
    given["unsafe_ignore_cancel"] = args.unsafe_ignore_cancel
    given["unsafe_ignore_pause"] = args.unsafe_ignore_pause
    given["unsafe_purge_all"] = args.unsafe_purge_all
    given["unsafe_retry_skips_oldest"] = args.unsafe_retry_skips_oldest
    given["unsafe_batch_ack_early"] = args.unsafe_batch_ack_early
    given["unsafe_retry_final"] = args.unsafe_retry_final
    given["unsafe_ignore_task_backoff"] = args.unsafe_ignore_task_backoff
    return given


REGRESSIONS = Path(__file__).with_name("regressions.txt")


def regression_seeds() -> list[tuple[int, dict[str, Any]]]:
    """The seeds of `sim/regressions.txt`: each line `SEED [FLAGS]` (`#` starts a comment),
    the flags as on the command line."""
    out = []
    for line in REGRESSIONS.read_text().splitlines():
        line = line.partition("#")[0].strip()
        if not line:
            continue
        seed_text, *flags = line.split()
        args = _parser().parse_args(["--seed", seed_text, *flags])
        out.append((int(seed_text), _given(args)))
    return out


def repro_command(settings: Settings) -> str:
    """The command that runs `settings` again: the seed, the control or twin flags, and every
    setting given on the command line (one that differs from what the seed draws)."""
    flags = [settings.flags()] if settings.flags() else []
    drawn = Settings.draw(
        settings.seed,
        fs_mode=settings.fs_mode,
        faults_of=settings.faults_of,
        unsafe_no_margin=settings.unsafe_no_margin,
        unsafe_no_fence=settings.unsafe_no_fence,
        unsafe_wall_clock_only=settings.unsafe_wall_clock_only,
        unsafe_no_cap=settings.unsafe_no_cap,
        unsafe_absent_parents_done=settings.unsafe_absent_parents_done,
        unsafe_dedupe_ack_at_write=settings.unsafe_dedupe_ack_at_write,
        unsafe_fire_unmarked=settings.unsafe_fire_unmarked,
        unsafe_wrong_result=settings.unsafe_wrong_result,
        unsafe_ignore_cancel=settings.unsafe_ignore_cancel,
        unsafe_ignore_pause=settings.unsafe_ignore_pause,
        unsafe_purge_all=settings.unsafe_purge_all,
        unsafe_retry_skips_oldest=settings.unsafe_retry_skips_oldest,
        unsafe_batch_ack_early=settings.unsafe_batch_ack_early,
        unsafe_retry_final=settings.unsafe_retry_final,
        unsafe_ignore_task_backoff=settings.unsafe_ignore_task_backoff,
    )
    for flag in (*_INT_FLAGS, *_FLOAT_FLAGS):
        key = flag.replace("-", "_")
        if getattr(settings, key) != getattr(drawn, key):
            flags.append(f"--{flag} {getattr(settings, key)!r}")
    if settings.offset_max_us != drawn.offset_max_us:
        flags.append(f"--offset-max-s {settings.offset_max_us / SECOND!r}")
    if settings.pause_max_us != drawn.pause_max_us:
        flags.append(f"--pause-max-s {settings.pause_max_us / SECOND!r}")
    return " ".join([f"python -m sim --seed {settings.seed}", *flags])


def run_seed(seed: int, **given: Any) -> Outcome:
    return run(Settings.draw(seed, **given))


def _summary(outcome: Outcome, elapsed: float) -> str:
    m = outcome.report.metrics
    rate = outcome.events / elapsed if elapsed else 0.0
    return (
        f"seed {outcome.settings.seed}: {'ok' if outcome.ok else 'FAILED'}; "
        f"{outcome.events} events in {elapsed:.2f} s ({rate:,.0f}/s), "
        f"{outcome.true_us / SECOND:.0f} s simulated; acked {m.acked} ({m.inbox_acked} via an "
        f"inbox), finished {m.finished}, "
        f"dead letters {m.dead_letters}, executions {m.executions} "
        f"(re-executions {m.re_executions}), "
        f"{f'schedule runs {m.schedule_runs}, ' if m.schedule_runs else ''}"
        f"belief overlap {m.belief_overlap_us} µs; "
        f"crashes {outcome.counters['crashes']}, pauses {outcome.counters['pauses']}, "
        f"locks lost {outcome.counters['locks_lost']}, disk full {outcome.counters['disk_full']}, clock steps "
        f"{outcome.counters['clock_steps']}; digest {outcome.digest[:16]}"
    )


def _failure(outcome: Outcome) -> str:
    # The checkers' verdicts first: a world violation (liveness) is often their symptom.
    lines = [str(v) for v in outcome.report.violations[:3]]
    lines += list(outcome.world_violations[:3])
    first = lines[0] if lines else "?"
    return f"  first violation: {first}\n  reproduce: {repro_command(outcome.settings)}"


def _run_one(job: tuple[int, dict[str, Any]]) -> tuple[int, Outcome, float]:
    seed, seed_given = job
    started = time.perf_counter()
    outcome = run(Settings.draw(seed, **seed_given))
    return seed, outcome, time.perf_counter() - started


def _outcomes(
    batch: list[tuple[int, dict[str, Any]]], jobs: int, *, quiet: bool
) -> Iterator[tuple[int, Outcome, float]]:
    """Each seed's outcome in the batch's order: in this process, or spread over `jobs`
    processes (each seed is a pure function of its settings, so where it runs changes nothing)."""
    if jobs <= 1:
        for seed, seed_given in batch:
            if not quiet:
                print(f"seed {seed}: {Settings.draw(seed, **seed_given).describe()}", flush=True)
            yield _run_one((seed, seed_given))
        return
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        for seed, outcome, seconds in pool.imap(_run_one, batch, chunksize=4):
            if not quiet:
                print(f"seed {seed}: {outcome.settings.describe()}", flush=True)
            yield seed, outcome, seconds


def main(argv: Sequence[str] | None = None) -> int:
    if os.environ.get("PYTHONHASHSEED") != "0":
        # The core may iterate sets of strings: pin their order so a seed replays exactly.
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, "-m", "sim", *(argv or sys.argv[1:])])
    args = _parser().parse_args(argv)
    given = _given(args)
    if args.seed is not None:
        settings = Settings.draw(args.seed, **given)
        print(f"seed {args.seed}: {settings.describe()}", flush=True)
        started = time.perf_counter()
        outcome = run(settings)
        print(_summary(outcome, time.perf_counter() - started))
        if not outcome.ok:
            print(outcome.report.describe())
            for v in outcome.world_violations:
                print(f"  {v}")
            print(_failure(outcome))
            return 1
        return 0
    batch: list[tuple[int, dict[str, Any]]] = []
    if args.seeds is not None:
        lo_text, _, hi_text = args.seeds.partition("..")
        batch += [(seed, given) for seed in range(int(lo_text), int(hi_text))]
    if args.regression_seeds or args.regressions:
        batch += regression_seeds()
    failed = 0
    events = 0
    started = time.perf_counter()
    jobs = args.jobs if args.jobs > 0 else (os.cpu_count() or 1)
    for _seed, outcome, seconds in _outcomes(batch, jobs, quiet=args.quiet):
        events += outcome.events
        if not outcome.ok:
            failed += 1
            print(_summary(outcome, seconds))
            print(_failure(outcome), flush=True)
            if args.stop_on_failure:
                break
        elif not args.quiet:
            print(_summary(outcome, seconds), flush=True)
    elapsed = time.perf_counter() - started
    print(
        f"{len(batch)} seeds, {failed} failed; {events} events in {elapsed:.1f} s "
        f"({events / elapsed:,.0f}/s)"
    )
    return 1 if failed else 0
