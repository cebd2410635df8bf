"""Several real daemons on one queue directory: takeover, rebalancing, the lease loop, and
enqueues through a daemon that does not own the target shard.

Every daemon is a real `python -m snerd.cli DIR` process of the snerd beside this package
(PYTHONPATH points at it), driven over its pipes by `bench.daemon.Daemon`. Times are taken on
this process's monotonic clock, from an action (a kill, a spawn) to the line on a daemon's
stdout that shows its effect (a `membership` message naming the shards it now owns).

Rows:

- `cluster_takeover_local`: daemon A owns the one shard, daemon B stands by (both on the
  default 30 s lease); A is killed with SIGKILL; the time until B's `membership` message names
  the shard. On a local filesystem a free flock proves the owner dead, and a running daemon
  tries the locks of others' shards every second, so this does not wait for the lease.
- `cluster_takeover_gluster`: the same with A on `$GLUSTER_MOUNT_A` and B on `$GLUSTER_MOUNT_B`
  (two mounts of one GlusterFS volume stand in for two hosts). There the lock proves nothing,
  so B waits for the lease to lapse by both rules (wall clock past expiry + margin, and the claim
  seen unchanged for lease + margin); a short lease (`GLUSTER_TTL`) keeps the row short.
- `cluster_rebalance`: A owns 10 shards; B is spawned; the time until both have announced
  5 (A's give-back happens at its rounds, a third of the lease apart; B claims at its own).
- `cluster_lease_<N>`: one daemon owning N shards (10 and 100), idle: its CPU time per second
  (from /proc/PID/stat), membership writes (rounds) per second, and the duration of a round,
  taken from file times: a round writes and fsyncs every held `shard-k/.lock`, then reads and
  rewrites membership.json, so the span from the earliest `.lock` time of a round to the
  membership.json time that ends it is the round (to the kernel's timestamp granularity, a
  few ms). Once on the default lease (a round every 10 s) and once on a 1.5 s lease (a round
  every 0.5 s), which makes the per-round cost visible.
- `cluster_enqueue_owner` / `cluster_enqueue_inbox`: windowed enqueues through A (owning the
  queue's one shard) and through B (owning none, so its enqueues must go through the inbox).
  While daemons refuse enqueues for shards they do not own, the second is reported as not
  available, with the daemon's error text.
"""

from __future__ import annotations

import json
import os
import random
import select
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

from bench.common import Budget, Latency, Measurement, Rate, Scratch, Unavailable
from bench.daemon import Daemon, DaemonError, enqueue_line, pipelined

__all__ = [
    "GLUSTER_TTL",
    "cluster_enqueue",
    "cluster_lease_loop",
    "cluster_rebalance",
    "cluster_takeover",
    "cluster_takeover_gluster",
]

#: The snerd these benchmarks run: the one beside this package, not whatever is installed.
_ROOT = str(Path(__file__).resolve().parent.parent)
_COMMAND = [sys.executable, "-m", "snerd.cli"]
_MEMBERSHIP = b'"action":"membership"'
#: The lease on GlusterFS, so that a lease-decided takeover fits the row's time budget.
GLUSTER_TTL = 6.0
GLUSTER_MARGIN = 1.0


def _env(extra: dict[str, str]) -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    return {
        "PYTHONPATH": _ROOT if not path else f"{_ROOT}{os.pathsep}{path}",
        "SNERD_DRAIN_TIMEOUT": "5",
        **extra,
    }


def _spawn(home: str, queue: str, name: str, env: dict[str, str]) -> Daemon:
    return Daemon(home, env=_env(env), command=_COMMAND, data=queue, name=name)


def _owned(line: bytes) -> list[str] | None:
    """The shards a `membership` line names (None for any other line)."""
    if _MEMBERSHIP not in line:
        return None
    owned: list[str] = orjson.loads(line)["owned"]
    return owned


def _watch(daemons: dict[str, Daemon], done: Any, timeout: float) -> dict[str, float]:
    """Read every daemon's stdout until `done(latest)` holds, where `latest` maps each name to
    the shards its last `membership` message named. Returns, per name, the monotonic time its
    latest `membership` message was read."""
    latest: dict[str, list[str] | None] = dict.fromkeys(daemons)
    seen: dict[str, float] = {}
    by_fd = {d.rfd: name for name, d in daemons.items()}
    deadline = time.perf_counter() + timeout
    while not done(latest):
        left = deadline - time.perf_counter()
        if left <= 0:
            tails = {name: d.stderr_tail()[-600:] for name, d in daemons.items()}
            raise DaemonError(f"not reached within {timeout:.0f} s: {latest}; stderr: {tails}")
        ready, _, _ = select.select(list(by_fd), [], [], left)
        for fd in ready:
            name = by_fd[fd]
            for line in daemons[name].read_lines(0):
                owned = _owned(line)
                if owned is not None:
                    latest[name] = owned
                    seen[name] = time.perf_counter()
    return seen


def _kill(d: Daemon) -> None:
    if d.proc.poll() is None:
        d.proc.kill()
    d.proc.wait()
    for pipe in (d.proc.stdin, d.proc.stdout):
        if pipe is not None:
            pipe.close()


def _stop(d: Daemon) -> None:
    if d.proc.poll() is None:
        d.close()
    else:
        _kill(d)


def _takeover_once(
    home: str, queue_a: str, queue_b: str, env: dict[str, str], phase: float
) -> float:
    """Seconds from SIGKILL of the owner to the standby's `membership` naming its shard."""
    a = _spawn(home, queue_a, "a", env)
    b: Daemon | None = None
    try:
        _watch({"a": a}, lambda s: s["a"] == ["shard-0"], 60)
        b = _spawn(home, queue_b, "b", env)
        _watch({"b": b}, lambda s: s["b"] == [], 60)
        # b tries the locks of others' shards once a second: kill at a phase drawn uniformly
        # over that second, so the samples are not all taken at one point of b's cycle.
        time.sleep(0.3 + phase)
        killed = time.perf_counter()
        a.proc.kill()
        seen = _watch({"b": b}, lambda s: s["b"] == ["shard-0"], 120)
        return seen["b"] - killed
    finally:
        _kill(a)
        if b is not None:
            _stop(b)


def cluster_takeover(scratch: Scratch, count: int, seconds: float) -> list[Measurement]:
    samples: list[float] = []
    budget = Budget(count, seconds)
    with scratch.directory("cluster-takeover") as d:
        while budget.more(len(samples)):
            queue = os.path.join(d, f"q{len(samples)}")
            phase = random.Random(len(samples)).random()
            samples.append(_takeover_once(d, queue, queue, {"SNERD_SHARDS": "1"}, phase))
    return [Latency("cluster_takeover_local", tuple(samples), "default lease (30 s)")]


def cluster_takeover_gluster(scratch: Scratch, count: int, seconds: float) -> list[Measurement]:
    mount_a, mount_b = os.environ.get("GLUSTER_MOUNT_A"), os.environ.get("GLUSTER_MOUNT_B")
    if not mount_a or not mount_b:
        return [Unavailable("cluster_takeover_gluster", "skipped: no GlusterFS mounts")]
    for mount in (mount_a, mount_b):
        if "glusterfs" not in (fs := _fs_type(mount)):
            why = f"skipped: {mount} is not a GlusterFS mount ({fs})"
            return [Unavailable("cluster_takeover_gluster", why)]
    env = {
        "SNERD_SHARDS": "1",
        "SNERD_LEASE_TTL": f"{GLUSTER_TTL:g}",
        "SNERD_CLOCK_SKEW_MARGIN": f"{GLUSTER_MARGIN:g}",
    }
    name = f"snerd-bench-{uuid.uuid4().hex[:8]}"
    samples: list[float] = []
    budget = Budget(count, seconds)
    try:
        with scratch.directory("cluster-takeover-gluster") as d:
            while budget.more(len(samples)):
                sub = os.path.join(name, f"q{len(samples)}")
                os.makedirs(os.path.join(mount_a, sub))
                queues = os.path.join(mount_a, sub), os.path.join(mount_b, sub)
                phase = random.Random(len(samples)).random()
                samples.append(_takeover_once(d, *queues, env, phase))
    finally:
        for mount in (mount_a, mount_b):  # one volume: the second finds nothing left
            shutil.rmtree(os.path.join(mount, name), ignore_errors=True)
    note = f"lease {GLUSTER_TTL:g} s, margin {GLUSTER_MARGIN:g} s"
    return [Latency("cluster_takeover_gluster", tuple(samples), note)]


def _fs_type(path: str) -> str:
    """The type of the filesystem `path` is on, from /proc/self/mounts (longest mount point
    that contains it)."""
    real = os.path.realpath(path)
    best, kind = "", "unknown"
    with open("/proc/self/mounts", encoding="utf-8") as f:
        for line in f:
            _, mnt, fstype, *_ = line.split()
            inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
            if inside and len(mnt) >= len(best):
                best, kind = mnt, fstype
    return kind


def cluster_rebalance(scratch: Scratch, count: int, seconds: float) -> list[Measurement]:
    """Seconds from spawning a second daemon to both announcing 5 of 10 shards; and, beside
    it, the same on a 3 s lease (rounds every second)."""
    out: list[Measurement] = []
    for key, extra in (
        ("cluster_rebalance", {}),
        ("cluster_rebalance_ttl3", {"SNERD_LEASE_TTL": "3", "SNERD_CLOCK_SKEW_MARGIN": "1"}),
    ):
        samples: list[float] = []
        started: list[float] = []
        budget = Budget(count, seconds / 2)
        env = {"SNERD_SHARDS": "10", **extra}
        with scratch.directory("cluster-rebalance") as d:
            while budget.more(len(samples)):
                queue = os.path.join(d, f"q{len(samples)}")
                a = _spawn(d, queue, "a", env)
                b: Daemon | None = None
                try:
                    _watch({"a": a}, lambda s: s["a"] is not None and len(s["a"]) == 10, 60)
                    t0 = time.perf_counter()
                    b = _spawn(d, queue, "b", env)
                    both = {"a": a, "b": b}
                    first = _watch(both, lambda s: s["b"] is not None, 60)
                    seen = _watch(
                        both,
                        lambda s: all(o is not None and len(o) == 5 for o in s.values()),
                        120,
                    )
                    samples.append(max(seen.values()) - t0)
                    started.append(first["b"] - t0)
                finally:
                    for x in (a, b):
                        if x is not None:
                            _stop(x)
        out.append(Latency(key, tuple(samples), "10 shards, second daemon spawned"))
        out.append(Latency(f"{key}_start", tuple(started), "spawn to first membership"))
    return out


def _round_spans(queue: str, shards: int, since_ns: int) -> tuple[int, list[float]]:
    """The membership.json time, and the span of the round that wrote it: membership.json's
    mtime minus the earliest `.lock` mtime after `since_ns` (the previous write)."""
    end = os.stat(os.path.join(queue, "membership.json")).st_mtime_ns
    starts = [
        m
        for k in range(shards)
        if since_ns < (m := os.stat(os.path.join(queue, f"shard-{k}", ".lock")).st_mtime_ns) <= end
    ]
    return end, [(end - min(starts)) / 1e9] if len(starts) == shards else []


def _version(queue: str) -> int:
    with open(os.path.join(queue, "membership.json"), "rb") as f:
        version: int = json.load(f)["version"]
    return version


def _lease_once(home: str, shards: int, env: dict[str, str], idle: float) -> tuple[Rate, Latency]:
    queue = os.path.join(home, f"q{shards}-{uuid.uuid4().hex[:6]}")
    d = _spawn(home, queue, f"lease{shards}", {"SNERD_SHARDS": str(shards), **env})
    try:
        _watch({"d": d}, lambda s: s["d"] is not None and len(s["d"]) == shards, 60)
        time.sleep(1.0)  # the claim records written, the shards loaded
        v0, cpu0, t0 = _version(queue), d.cpu_seconds(), time.perf_counter()
        last = os.stat(os.path.join(queue, "membership.json")).st_mtime_ns
        spans: list[float] = []
        while time.perf_counter() - t0 < idle:
            time.sleep(0.02)
            now = os.stat(os.path.join(queue, "membership.json")).st_mtime_ns
            if now != last:
                time.sleep(0.01)
                last, span = _round_spans(queue, shards, last)
                spans.extend(span)
        elapsed = time.perf_counter() - t0
        rounds, cpu = _version(queue) - v0, d.cpu_seconds() - cpu0
    finally:
        _stop(d)
    ttl = env.get("SNERD_LEASE_TTL", "30")
    key = f"cluster_lease_{shards}" + ("" if "SNERD_LEASE_TTL" not in env else f"_ttl{ttl}")
    return Rate(key, rounds, elapsed, f"lease {ttl} s", cpu), Latency(key + "_round", tuple(spans))


def cluster_lease_loop(scratch: Scratch, count: int, seconds: float) -> list[Measurement]:
    """One daemon owning 10, then 100 shards, idle: 10.5 s on the default lease (so that at
    least one round, 10 s apart, falls in), then `seconds / 4` (at least 2 s) on a 1.5 s one."""
    del count
    out: list[Measurement] = []
    with scratch.directory("cluster-lease") as d:
        for env, idle in (({}, 10.5), ({"SNERD_LEASE_TTL": "1.5"}, max(2.0, seconds / 4))):
            for shards in (10, 100):
                out.extend(_lease_once(d, shards, env, idle))
    return out


def cluster_enqueue(
    scratch: Scratch, count: int, seconds: float, window: int = 1024
) -> list[Measurement]:
    """Windowed enqueues through the owner of the queue's one shard, then through a daemon
    that owns no shard (the inbox path), for `seconds / 2` each."""
    env = {"SNERD_SHARDS": "1"}
    out: list[Measurement] = []
    with scratch.directory("cluster-enqueue") as d:
        queue = os.path.join(d, "q")
        a = _spawn(d, queue, "owner", env)
        b: Daemon | None = None
        try:
            _watch({"a": a}, lambda s: s["a"] == ["shard-0"], 60)
            b = _spawn(d, queue, "standby", env)
            _watch({"b": b}, lambda s: s["b"] == [], 60)
            for name, daemon in (("owner", a), ("inbox", b)):
                # One enqueue first: a refusal ends the row with the daemon's reason.
                daemon.send(enqueue_line(f"{name}-probe", "parked"))
                reply = _reply(daemon)
                if b'"action":"ack"' not in reply:
                    out.append(Unavailable(f"cluster_enqueue_{name}", _reason(reply)))
                    continue
                lines = [enqueue_line(f"{name}{i}", "parked") for i in range(count)]
                acked, elapsed, cpu = pipelined(daemon, lines, Budget(count, seconds / 2), window)
                out.append(Rate(f"cluster_enqueue_{name}", acked, elapsed, f"window {window}", cpu))
        finally:
            for x in (a, b):
                if x is not None:
                    _stop(x)
    return out


def _reply(daemon: Daemon, timeout: float = 30.0) -> bytes:
    """The first `ack` or `error` line (other lines, e.g. `membership`, skipped)."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        for line in daemon.read_lines(max(0.0, deadline - time.perf_counter())):
            if b'"action":"ack"' in line or b'"action":"error"' in line:
                return line
    raise DaemonError(f"no reply to an enqueue in {timeout:.0f} s; stderr: {daemon.stderr_tail()}")


def _reason(line: bytes) -> str:
    try:
        return str(orjson.loads(line).get("message", line.decode()))
    except orjson.JSONDecodeError:
        return line.decode("utf-8", "replace")
