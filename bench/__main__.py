"""`python -m bench`: run the benchmarks in rounds and print one table of figures, ratios to the
baselines, targets and PASS/MISS.

Rounds interleave the baselines and snerd (raw, Huey, snerd, raw, Huey, snerd, ...), so a slow
spell of the (virtual, shared) disk hits all of them rather than one. A rate is the median of
its rounds; latency percentiles are taken over the samples of all rounds pooled and sorted.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from bench import cluster, daemon, huey_bench, producer, raw, sdk, sim
from bench.common import Latency, Measurement, Rate, Scratch, Unavailable, percentile

BenchFn = Callable[[Scratch, int, float], list[Measurement]]


@dataclass(frozen=True)
class Bench:
    name: str
    fn: BenchFn
    #: Count and seconds bounds of one round (full run).
    count: int
    seconds: float
    help: str


BENCHES = [
    Bench("raw1", raw.raw_fsync1, 50_000, 2.0, "raw append + fsync per record"),
    Bench("raw1-paced", raw.raw_fsync1_paced, 20_000, 2.0,
          "raw append + fsync per record, after an idle pause each"),
    Bench("raw64", raw.raw_fsync64, 2_000_000, 2.0, "raw appends, one fsync per 64"),
    Bench("huey-enqueue", huey_bench.huey_enqueue, 50_000, 2.0, "Huey SqliteHuey enqueue"),
    Bench("huey-e2e", huey_bench.huey_e2e, 50_000, 4.0, "Huey enqueue + in-process drain"),
    Bench("pipelined", daemon.snerd_enqueue_pipelined, 150_000, 3.0, "snerd windowed enqueue"),
    Bench("batch", daemon.snerd_enqueue_batch, 300_000, 3.0,
          "snerd enqueue_batch lines of 1,000, 4 in flight"),
    Bench("seq", daemon.snerd_enqueue_seq, 50_000, 3.0, "snerd one enqueue at a time"),
    Bench("e2e", daemon.snerd_e2e, 80_000, 4.0, "snerd no-op jobs over the protocol"),
    Bench("sdk", sdk.sdk_e2e, 50_000, 4.0, "snerd no-op jobs through SnerdQueue"),
    Bench("exec", daemon.snerd_exec_latency, 3_000, 3.0, "snerd enqueue -> execute, idle"),
    Bench("producer", producer.producer_enqueue, 20_000, 3.0,
          "snerd.Producer: a blocking enqueue, no event loop, one thread then 8"),
    Bench("sim", sim.sim_events, 10_000_000, 6.0, "simulator world events per second, one core"),
    Bench("takeover", cluster.cluster_takeover, 6, 20.0,
          "kill -9 of a shard's owner to the standby announcing it, local filesystem"),
    Bench("takeover-gluster", cluster.cluster_takeover_gluster, 3, 25.0,
          "the same across two GlusterFS mounts ($GLUSTER_MOUNT_A, $GLUSTER_MOUNT_B)"),
    Bench("rebalance", cluster.cluster_rebalance, 2, 50.0,
          "a second daemon joins one owning 10 shards, to both owning 5"),
    Bench("lease-loop", cluster.cluster_lease_loop, 1, 12.0,
          "an idle daemon's CPU and round time owning 10 and 100 shards"),
    Bench("inbox", cluster.cluster_enqueue, 150_000, 6.0,
          "enqueues through the shard's owner vs through a daemon owning no shard"),
]
GROUPS = {
    "raw": ["raw1", "raw1-paced", "raw64"],
    "huey": ["huey-enqueue", "huey-e2e"],
    "snerd": ["pipelined", "batch", "seq", "e2e", "sdk", "exec", "producer"],
    "protocol": ["pipelined", "batch", "seq", "e2e", "exec"],
    "simulator": ["sim"],
    "cluster": ["takeover", "takeover-gluster", "rebalance", "lease-loop", "inbox"],
}


class Results:
    """Measurements of all rounds, combined."""

    def __init__(self) -> None:
        self.rates: dict[str, list[Rate]] = {}
        self.latencies: dict[str, list[float]] = {}
        self.unavailable: dict[str, str] = {}

    def add(self, m: Measurement) -> None:
        if isinstance(m, Unavailable):
            self.unavailable[m.key] = m.reason
        elif isinstance(m, Rate):
            self.rates.setdefault(m.key, []).append(m)
        else:
            self.latencies.setdefault(m.key, []).extend(m.samples)

    def rate(self, key: str) -> float | None:
        runs = self.rates.get(key)
        return statistics.median(r.per_second for r in runs) if runs else None

    def cpu_us(self, key: str) -> float | None:
        """Median daemon CPU per operation over the rounds (None: not measured)."""
        values = [v for r in self.rates.get(key, []) if (v := r.cpu_us_per_op) is not None]
        return statistics.median(values) if values else None

    def spread(self, key: str) -> str:
        runs = self.rates.get(key, [])
        if len(runs) < 2:
            return ""
        values = [r.per_second for r in runs]
        return f" (rounds {_num(min(values))}-{_num(max(values))})"

    def pct_us(self, key: str, pct: float) -> float | None:
        samples = self.latencies.get(key)
        if not samples:
            return None
        return percentile(sorted(samples), pct) * 1e6

    def as_json(self) -> dict[str, object]:
        out: dict[str, object] = {}
        for key, runs in self.rates.items():
            out[f"{key}.rate"] = self.rate(key)
            out[f"{key}.rounds"] = [r.per_second for r in runs]
            if self.cpu_us(key) is not None:
                out[f"{key}.daemon_cpu_us_per_op"] = self.cpu_us(key)
        for key, samples in self.latencies.items():
            ordered = sorted(samples)
            out[f"{key}.samples"] = len(ordered)
            for pct in (50, 90, 99, 99.9):
                out[f"{key}.p{pct:g}_us"] = percentile(ordered, pct) * 1e6
            out[f"{key}.max_us"] = ordered[-1] * 1e6
        for key, reason in self.unavailable.items():
            out[f"{key}.unavailable"] = reason
        return out

    def cpu_per_second(self, key: str) -> float | None:
        """Median over the rounds of the daemon's CPU seconds per second (None: not measured)."""
        values = [
            r.cpu_seconds / r.seconds
            for r in self.rates.get(key, [])
            if r.cpu_seconds is not None and r.seconds > 0
        ]
        return statistics.median(values) if values else None


def _num(x: float) -> str:
    return f"{x:,.0f}"


def _us(x: float) -> str:
    return f"{x:,.0f} µs"


def _dur(seconds: float) -> str:
    """A duration in µs, or in s from 0.1 s up."""
    return f"{seconds:.2f} s" if seconds >= 0.1 else _us(seconds * 1e6)


@dataclass(frozen=True)
class Row:
    label: str
    measured: str
    baseline: str = ""
    ratio: str = ""
    target: str = ""
    result: str = ""


def _check(ok: bool | None) -> str:
    return "" if ok is None else ("PASS" if ok else "MISS")


def build_rows(r: Results) -> list[Row]:
    rows: list[Row] = []
    na = "—"

    def rate_text(key: str, unit: str) -> str:
        return rate_text_of(r, key, unit)

    def lat_text(key: str) -> str:
        p50, p99, n = r.pct_us(key, 50), r.pct_us(key, 99), len(r.latencies.get(key, []))
        if p50 is None or p99 is None:
            return na
        return f"p50 {_us(p50)}, p99 {_us(p99)} (n={n:,})"

    # Baselines.
    rows.append(Row("raw append+fsync, 1 fsync/record", rate_text("raw_fsync1", "rec/s")))
    rows.append(Row("raw append+fsync, 1 fsync/record: latency", lat_text("raw_fsync1")))
    rows.append(
        Row(
            f"raw append+fsync, paced ({raw.PACED_GAP_S * 1e6:.0f} µs idle before each): latency",
            lat_text("raw_fsync1_paced"),
        )
    )
    rows.append(Row("raw append, 1 fsync/64 records", rate_text("raw_fsync64", "rec/s")))
    rows.append(Row("Huey SqliteHuey(fsync=True): enqueue", rate_text("huey_enqueue", "jobs/s")))
    rows.append(Row("Huey SqliteHuey(fsync=True): enqueue+drain", rate_text("huey_e2e", "jobs/s")))

    def ratio_row(
        label: str, key: str, unit: str, base_key: str, base_label: str, at_least: float
    ) -> Row:
        v, b = r.rate(key), r.rate(base_key)
        ratio = v / b if v is not None and b else None
        return Row(
            label,
            rate_text(key, unit),
            f"{base_label} {_num(b)}" if b is not None else na,
            f"{ratio:.2f}x" if ratio is not None else na,
            f"≥ {at_least:g}x",
            _check(None if ratio is None else ratio >= at_least),
        )

    rows.append(
        ratio_row("snerd enqueue, pipelined (protocol)", "snerd_enqueue_pipelined", "rec/s",
                  "huey_enqueue", "Huey enqueue", 10)
    )
    rows.append(
        ratio_row("snerd enqueue, pipelined (protocol)", "snerd_enqueue_pipelined", "rec/s",
                  "raw_fsync64", "raw 64/fsync", 0.35)
    )
    rows.append(
        ratio_row("snerd enqueue_batch (protocol)", "snerd_enqueue_batch", "rec/s",
                  "raw_fsync64", "raw 64/fsync", 0.5)
    )
    p50, raw50 = r.pct_us("snerd_enqueue_seq", 50), r.pct_us("raw_fsync1", 50)
    ratio = p50 / raw50 if p50 is not None and raw50 else None
    rows.append(
        Row(
            "snerd enqueue, sequential: ack p50",
            na if p50 is None else _us(p50),
            na if raw50 is None else f"raw fsync p50 {_us(raw50)}",
            na if ratio is None else f"{ratio:.2f}x",
            "≤ 2.5x",
            _check(None if ratio is None else ratio <= 2.5),
        )
    )
    p99 = r.pct_us("snerd_enqueue_seq", 99)
    raw99 = r.pct_us("raw_fsync1", 99)
    rows.append(
        Row(
            "snerd enqueue, sequential: ack p99",
            na if p99 is None else f"{_us(p99)} (n={len(r.latencies.get('snerd_enqueue_seq', [])):,})",
            na if raw99 is None else f"raw fsync p99 {_us(raw99)}",
            na if p99 is None or not raw99 else f"{p99 / raw99:.2f}x",
            "< 1,000 µs",
            _check(None if p99 is None else p99 < 1000),
        )
    )
    rows.append(
        ratio_row("snerd end to end, protocol", "snerd_e2e", "jobs/s", "huey_e2e",
                  "Huey e2e", 10)
    )
    rows.append(
        ratio_row("snerd end to end, SnerdQueue", "sdk_e2e", "jobs/s", "huey_e2e",
                  "Huey e2e", 10)
    )
    e50, e99 = r.pct_us("snerd_exec_latency", 50), r.pct_us("snerd_exec_latency", 99)
    rows.append(
        Row(
            "snerd enqueue→execute, idle: p50",
            na if e50 is None or e99 is None else
            f"{_us(e50)} (p99 {_us(e99)}, n={len(r.latencies['snerd_exec_latency']):,})",
            na if raw50 is None else f"raw fsync p50 {_us(raw50)}",
            na if e50 is None or not raw50 else f"{e50 / raw50:.2f}x",
            "≤ 1,000 µs",
            _check(None if e50 is None else e50 <= 1000),
        )
    )
    q50, q99 = r.pct_us("producer_enqueue", 50), r.pct_us("producer_enqueue", 99)
    rows.append(
        Row(
            "snerd.Producer enqueue (blocking): p50",
            na if q50 is None or q99 is None else
            f"{_us(q50)} (p99 {_us(q99)}, n={len(r.latencies['producer_enqueue']):,})",
            na if raw50 is None else f"raw fsync p50 {_us(raw50)}",
            na if q50 is None or not raw50 else f"{q50 / raw50:.2f}x",
            "≤ 3x",
            _check(None if q50 is None or not raw50 else q50 / raw50 <= 3),
        )
    )
    rows.append(Row("snerd.Producer enqueue, 8 threads", rate_text("producer_threads", "rec/s")))
    sim_rate, bare = r.rate("sim_events"), r.rate("sim_bare_loop")
    if sim_rate is not None:
        node_rate = r.rate("sim_node_events")
        rows.append(
            Row(
                "simulator: world events/s, one core",
                rate_text("sim_events", "events/s")
                + ("" if node_rate is None else f" ({_num(node_rate)} core events/s)"),
                na if bare is None else f"bare heapq loop {_num(bare)}",
                na if not bare else f"{sim_rate / bare:.3f}x",
                "≥ 50,000/s",
                _check(sim_rate >= 50_000),
            )
        )
    rows.extend(cluster_rows(r))
    return rows


def cluster_rows(r: Results) -> list[Row]:
    """Rows of `bench.cluster`: several daemons on one queue directory."""
    rows: list[Row] = []
    na = "—"

    def seconds_text(key: str) -> str | None:
        samples = sorted(r.latencies.get(key, []))
        if not samples:
            return None
        return (
            f"median {statistics.median(samples):.2f} s, max {samples[-1]:.2f} s "
            f"(n={len(samples)})"
        )

    def vs(key: str, base: float) -> str:
        samples = r.latencies.get(key, [])
        return f"{statistics.median(samples) / base:.2f}x" if samples else na

    for key, label, base, base_label in (
        ("cluster_takeover_local", "takeover after kill -9, one host (local fs, lease 30 s)",
         35.0, "lease + margin 35 s"),
        ("cluster_takeover_gluster",
         f"takeover after kill -9, GlusterFS (lease {cluster.GLUSTER_TTL:g} s)",
         cluster.GLUSTER_TTL + cluster.GLUSTER_MARGIN,
         f"lease + margin {cluster.GLUSTER_TTL + cluster.GLUSTER_MARGIN:g} s"),
    ):
        text = seconds_text(key)
        if text is not None:
            rows.append(Row(label, text, base_label, vs(key, base)))
        elif key in r.unavailable:
            rows.append(Row(label, r.unavailable[key]))
    for key, ttl in (("cluster_rebalance", 30.0), ("cluster_rebalance_ttl3", 3.0)):
        text = seconds_text(key)
        if text is None:
            continue
        start = r.latencies.get(f"{key}_start", [])
        if start:
            text += f"; process start {statistics.median(start):.2f} s"
        rows.append(
            Row(f"rebalance after a join, 10 shards to 5 + 5 (lease {ttl:g} s)", text,
                f"round interval {ttl / 3:g} s", vs(key, ttl / 3))
        )
    for suffix, lease in (("", "30 s"), ("_ttl1.5", "1.5 s")):
        per_round: dict[int, float] = {}
        for shards in (10, 100):
            key = f"cluster_lease_{shards}{suffix}"
            runs = r.rates.get(key)
            cpu = r.cpu_per_second(key)
            if not runs or cpu is None:
                continue
            rounds = statistics.median(x.per_second for x in runs)
            if cpu > 0:
                text = f"daemon CPU {cpu * 1e3:.1f} ms/s, {rounds:.2f} rounds/s"
            else:  # /proc counts CPU in clock ticks
                tick_ms = 1e3 / os.sysconf("SC_CLK_TCK")
                idle = statistics.median(x.seconds for x in runs)
                text = (f"daemon CPU < {tick_ms / idle:.1f} ms/s (under one {tick_ms:.0f} ms "
                        f"tick in {idle:.1f} s), {rounds:.2f} rounds/s")
            if rounds > 0 and cpu > 0:
                per_round[shards] = cpu / rounds * 1e3
                text += f", {per_round[shards]:.1f} ms CPU/round"
            spans = sorted(r.latencies.get(f"{key}_round", []))
            if spans:
                text += (f"; round p50 {percentile(spans, 50) * 1e3:.0f} ms, "
                         f"max {spans[-1] * 1e3:.0f} ms (n={len(spans)})")
            base10 = per_round.get(10) if shards == 100 else None
            rows.append(
                Row(
                    f"lease loop, idle, {shards} shards (lease {lease})",
                    text,
                    "" if base10 is None else f"10 shards {base10:.1f} ms CPU/round",
                    "" if base10 is None or shards not in per_round
                    else f"{per_round[shards] / base10:.2f}x",
                )
            )
    owner, inbox = r.rate("cluster_enqueue_owner"), r.rate("cluster_enqueue_inbox")
    if owner is not None or "cluster_enqueue_owner" in r.unavailable:
        rows.append(
            Row("enqueue through the shard's owner, pipelined",
                rate_text_of(r, "cluster_enqueue_owner", "rec/s")
                if owner is not None else "not available: " + r.unavailable["cluster_enqueue_owner"])
        )
    if inbox is not None:
        rows.append(
            Row("enqueue through a daemon owning no shard (inbox)",
                rate_text_of(r, "cluster_enqueue_inbox", "rec/s"),
                na if owner is None else f"through the owner {_num(owner)}",
                na if not owner else f"{inbox / owner:.2f}x")
        )
    elif "cluster_enqueue_inbox" in r.unavailable:
        rows.append(
            Row("enqueue through a daemon owning no shard (inbox)",
                "not available: " + r.unavailable["cluster_enqueue_inbox"])
        )
    return rows


def rate_text_of(r: Results, key: str, unit: str) -> str:
    v = r.rate(key)
    if v is None:
        return "—"
    cpu = r.cpu_us(key)
    cpu_text = "" if cpu is None else f", daemon CPU {cpu:,.0f} µs/op"
    return f"{_num(v)} {unit}{r.spread(key)}{cpu_text}"


def render(rows: list[Row]) -> str:
    head = Row("Row", "Measured", "Baseline", "Ratio", "Target", "Result")
    table = [head, *rows]
    widths = [max(len(getattr(x, f)) for x in table) for f in Row.__dataclass_fields__]

    def line(x: Row) -> str:
        cells = [getattr(x, f).ljust(w) for f, w in zip(Row.__dataclass_fields__, widths, strict=True)]
        return "| " + " | ".join(cells) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(head), sep, *(line(x) for x in rows)])


def machine(scratch: Scratch) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for text in f:
                if text.startswith("model name"):
                    cpu = text.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (
        f"{os.cpu_count()} CPUs ({cpu}), Linux {platform.release()}, Python "
        f"{platform.python_version()} ({sys.executable}); scratch {scratch.root} on {scratch.device()}"
    )


def select(only: list[str]) -> list[Bench]:
    if not only:
        return BENCHES
    wanted: set[str] = set()
    names = {b.name for b in BENCHES}
    for item in only:
        for name in item.split(","):
            name = name.strip()
            if name in GROUPS:
                wanted.update(GROUPS[name])
            elif name in names:
                wanted.add(name)
            elif name:
                raise SystemExit(
                    f"bench: unknown benchmark {name!r}; one of {', '.join(sorted(names))} "
                    f"or a group: {', '.join(GROUPS)}"
                )
    return [b for b in BENCHES if b.name in wanted]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true",
                        help="one round, a quarter of the time per benchmark")
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="run only these (comma-separated, repeatable): "
                        + ", ".join(b.name for b in BENCHES) + "; groups: " + ", ".join(GROUPS))
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 3; quick 1)")
    parser.add_argument("--scale", type=float, default=None,
                        help="multiply each benchmark's time bound (default 1; quick 0.25)")
    parser.add_argument("--dir", default=None,
                        help="base directory for scratch files (default: the system temp dir); "
                        "every benchmark writes below it, so all run on the same disk")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write figures as JSON")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = parser.parse_args(argv)
    if args.list:
        for b in BENCHES:
            print(f"{b.name:14} {b.help}")
        return 0
    rounds = args.rounds or (1 if args.quick else 3)
    scale = args.scale or (0.25 if args.quick else 1.0)
    benches = select(args.only)

    scratch = Scratch(args.dir)
    results = Results()
    started = time.time()
    print(f"# snerd bench, {dt.datetime.now().isoformat(timespec='seconds')}", flush=True)
    print(f"# {machine(scratch)}", flush=True)
    print(f"# rounds {rounds}, time scale {scale:g}", flush=True)
    try:
        for n in range(rounds):
            for b in benches:
                t = time.perf_counter()
                measured = b.fn(scratch, max(1, int(b.count * max(scale, 0.05))), b.seconds * scale)
                for m in measured:
                    results.add(m)
                    if isinstance(m, Unavailable):
                        print(f"  round {n + 1} {b.name:13} {m.key:24} {m.reason}"
                              f"  [{time.perf_counter() - t:.1f} s]", flush=True)
                        continue
                    if isinstance(m, Latency) and not m.samples:
                        continue
                    cpu = m.cpu_us_per_op if isinstance(m, Rate) else None
                    summary = (
                        f"{_num(m.per_second)}/s ({m.ops:,} in {m.seconds:.2f} s"
                        + ("" if cpu is None else f", daemon CPU {cpu:,.0f} µs/op")
                        + ")"
                        if isinstance(m, Rate)
                        else f"p50 {_dur(percentile(sorted(m.samples), 50))} "
                        f"p99 {_dur(percentile(sorted(m.samples), 99))} "
                        f"(n={len(m.samples):,})"
                    )
                    print(f"  round {n + 1} {b.name:13} {m.key:24} {summary}"
                          f"  [{time.perf_counter() - t:.1f} s]", flush=True)
    finally:
        scratch.close()
    rows = build_rows(results)
    print()
    print(render(rows))
    print()
    print(f"# {time.time() - started:.0f} s; command: python -m bench "
          + " ".join(sys.argv[1:] if argv is None else argv))
    misses = sum(1 for row in rows if row.result == "MISS")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "machine": machine(scratch),
                    "figures": results.as_json(),
                    "rows": [row.__dict__ for row in rows],
                },
                f,
                indent=2,
                default=lambda x: None if isinstance(x, float) and math.isnan(x) else x,
            )
    return 1 if misses and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())
