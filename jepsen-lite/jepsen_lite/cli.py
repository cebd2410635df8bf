"""`python -m jepsen_lite` / `python jepsen-lite/run.py`: run real daemons under a nemesis and
judge the history with the simulator's checker.

Prints the checker's report and a summary table; writes to the output folder `history.jsonl`
(the history), `summary.json`, `report.txt`, `plot.png` (throughput and faults over time) and
each worker's stderr (with its daemon's). Exit status 0 when the checker found nothing and
every nemesis asked for ran and was verified; 1 otherwise. With `--expect-violation` (the
negative control) the status is 0 only when the checker did report a violation.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from jepsen_lite.config import DEFAULT_REMOTE, RunConfig, config_problem
from jepsen_lite.faults import FAULTS
from jepsen_lite.phases import run
from jepsen_lite.plot import plot
from jepsen_lite.report import summary, summary_table

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m jepsen_lite",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--fs",
        choices=("local", "tmpfs", "loop", "glusterfs"),
        default="local",
        help="loop: a small ext4 in an image file, loop-mounted (root; --loop-size)",
    )
    p.add_argument("--loop-size", type=int, default=64, help="MiB of the ext4 image of --fs loop")
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--duration", type=float, default=60.0, help="seconds of chaos")
    p.add_argument("--seed", type=int, default=None, help="default: from the clock (printed)")
    p.add_argument(
        "--nemesis",
        default="kill,pause,clock",
        help=f"comma-separated, from {','.join(FAULTS)}; empty for none",
    )
    p.add_argument("--rate", type=float, default=20.0, help="client enqueues per second")
    p.add_argument(
        "--deps-share",
        type=float,
        default=0.05,
        help="share of enqueues that are children (trigger_after_ids) of recent tasks sent "
        "through other nodes (0: none)",
    )
    p.add_argument(
        "--command-rate",
        type=float,
        default=1.0,
        help="job-control commands per second (cancel, retry, purge, pause/resume) to random "
        "nodes (0: none)",
    )
    p.add_argument(
        "--unknown-parent",
        type=float,
        default=10.0,
        help="SNERD_UNKNOWN_PARENT_SECONDS of the daemons: a child of a parent no file holds "
        "is dead-lettered after this long",
    )
    p.add_argument(
        "--schedule",
        default="*/2 * * * * *",
        metavar="CRON",
        help="a named schedule every node declares at each start, removed as the drain begins "
        "('' for none); its runs are judged for one run per tick",
    )
    p.add_argument("--ttl", type=float, default=3.0, help="SNERD_LEASE_TTL, seconds")
    p.add_argument("--margin", type=float, default=0.5, help="SNERD_CLOCK_SKEW_MARGIN, seconds")
    p.add_argument("--gap", type=float, default=3.0, help="seconds between faults (mean)")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output folder (default jepsen-out/<fs>-<seed>-<time>)",
    )
    p.add_argument(
        "--unsafe-no-fence",
        action="store_true",
        help="negative control: daemons run with SNERD_TEST_UNSAFE_NO_FENCE=1",
    )
    p.add_argument(
        "--unsafe-ignore-cancel",
        action="store_true",
        help="negative control: daemons answer cancels and keep the task "
        "(SNERD_TEST_UNSAFE_IGNORE_CANCEL=1)",
    )
    p.add_argument(
        "--unsafe-ignore-pause",
        action="store_true",
        help="negative control: daemons dispatch paused types (SNERD_TEST_UNSAFE_IGNORE_PAUSE=1)",
    )
    p.add_argument(
        "--expect-violation",
        action="store_true",
        help="succeed only if the checker reports a violation (negative controls)",
    )
    p.add_argument("--drain-timeout", type=float, default=120.0)
    p.add_argument(
        "--dir",
        type=Path,
        action="append",
        default=[],
        help="a mount point of your own shared filesystem (repeat for each mount of "
        "the same filesystem; nodes take them in turn); the run makes a fresh "
        "directory under it and leaves it there",
    )
    p.add_argument(
        "--hosts",
        default="",
        help="comma-separated hosts to run the workers and daemons on, round-robin (needs "
        "--dir: the shared mount as this host sees it); default: all on this host",
    )
    p.add_argument(
        "--remote",
        default=DEFAULT_REMOTE,
        help="command that runs a shell command line (given as one more argument) on {host} "
        f"(default: {DEFAULT_REMOTE!r})".replace("%", "%%"),
    )
    p.add_argument(
        "--remote-python",
        default=None,
        help="the interpreter on the hosts, of a venv with snerd installed (default: this "
        "one's path)",
    )
    p.add_argument(
        "--remote-repo",
        default=None,
        help="this checkout's path on the hosts (default: its path here)",
    )
    p.add_argument(
        "--remote-dir",
        action="append",
        default=[],
        metavar="[HOST=]PATH",
        help="the shared mount's path on the hosts (HOST=PATH for one host; repeatable); "
        "default: the --dir path, the same everywhere",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    nemesis = tuple(n for n in (x.strip() for x in args.nemesis.split(",")) if n)
    seed = args.seed if args.seed is not None else int(time.time()) % 100_000
    out = args.out or Path("jepsen-out") / f"{args.fs}-{seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    config = RunConfig(
        fs=args.fs,
        nodes=args.nodes,
        shards=args.shards,
        duration=args.duration,
        seed=seed,
        nemesis=nemesis,
        out=out,
        rate=args.rate,
        deps_share=args.deps_share,
        command_rate=args.command_rate,
        unknown_parent_s=args.unknown_parent,
        schedule_cron=args.schedule,
        ttl_s=args.ttl,
        margin_s=args.margin,
        gap_s=args.gap,
        unsafe_no_fence=args.unsafe_no_fence,
        unsafe_ignore_cancel=args.unsafe_ignore_cancel,
        unsafe_ignore_pause=args.unsafe_ignore_pause,
        drain_timeout=args.drain_timeout,
        dirs=tuple(args.dir),
        loop_size_mib=args.loop_size,
        hosts=tuple(h.strip() for h in args.hosts.split(",") if h.strip()),
        remote=args.remote,
        remote_python=args.remote_python,
        remote_repo=args.remote_repo,
        remote_dirs=tuple(
            (h, d) if sep else ("", h) for h, sep, d in (x.partition("=") for x in args.remote_dir)
        ),
    )
    problem = config_problem(config)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    print(
        f"jepsen-lite: fs={config.fs} nodes={config.nodes} shards={config.shards} "
        f"duration={config.duration:g}s seed={seed} nemesis={','.join(nemesis) or '-'} "
        + (f"hosts={','.join(config.hosts)} " if config.hosts else "")
        + f"out={out}",
        flush=True,
    )
    outcome = run(config)
    s = summary(outcome)
    plot(outcome.history, out / "plot.png")
    (out / "summary.json").write_text(json.dumps(s, indent=2) + "\n")
    text = outcome.report.describe() + "\n" + summary_table(s)
    (out / "report.txt").write_text(text + "\n")
    print(text)
    print(f"history: {out / 'history.jsonl'}  plot: {out / 'plot.png'}")
    if args.expect_violation:
        return 0 if not outcome.report.ok else 1
    return 0 if s["verdict"] == "ok" else 1
