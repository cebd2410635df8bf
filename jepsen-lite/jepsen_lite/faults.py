"""The faults a run can inject, each one a routine that picks its victim, does the fault,
undoes it, and says whether it took (`Fault.verified`) and what it saw (`Fault.info`):
`FAULTS` maps every fault name the command line accepts to its routine, and is the only list
of those names. The `Nemesis` runs them one at a time in a shuffled rotation on random victims
(preferring nodes that own shards), records each as `fault` entries with start and end, and
knows what is still in effect when the heal comes.

A routine here decides what to do and what counts as proof; the tools it uses (signals,
/proc, the clock file, filling a filesystem, the gluster CLI, lock probes) are in
`jepsen_lite.nemesis`, the processes it hits in `jepsen_lite.cluster`.

To add a fault: write `async def name(nemesis: Nemesis) -> None` here, ending every path that
started a fault with `nemesis.fault_end`, and add it to `FAULTS`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jepsen_lite import nemesis as nem
from jepsen_lite.cluster import Cluster, Node, now_us

if TYPE_CHECKING:
    from jepsen_lite.config import RunConfig

__all__ = ["FAULTS", "FULL_SLACK", "GLUSTER_FAULTS", "Fault", "FaultRoutine", "Nemesis"]

#: Free bytes a filesystem may still show and be called full by `disk-full` (the filler ends
#: with 1-byte writes; a daemon may free a little meanwhile).
FULL_SLACK = 1 << 20


@dataclass(slots=True)
class Fault:
    """One fault as it ran: its name, its victim (None: the cluster), start and end (µs), and
    whether it was seen to take."""

    name: str
    node: str | None
    start: int
    end: int | None = None
    verified: bool = False
    detail: str = ""
    #: What the fault's verification found, by name (reported; the tests read it).
    info: dict[str, Any] = field(default_factory=dict)


class Nemesis:
    """The faults of one run: each one's record (`faults`), the victims, and what is still in
    effect and must be undone at the heal (the GlusterFS cut, the lock options, the probes)."""

    def __init__(
        self,
        cluster: Cluster,
        config: RunConfig,
        rng: random.Random,
        gluster: nem.GlusterControl | None = None,
    ) -> None:
        self.cluster = cluster
        self.c = config
        #: Shared with the load: one seed draws both.
        self.rng = rng
        self.g = gluster
        self.faults: list[Fault] = []
        #: Faults to undo if the run ends half-way (see `undo_now`).
        self.partitioned = False
        self.monkey_on = False
        #: stat probes of mount A, reaped at the end (a blocked one cannot be killed).
        self.probes: list[nem.Probe] = []
        #: Kills so far: every other one takes the worker (the SDK) down, not the daemon.
        self.kill_turn = 0

    def fault_start(self, name: str, node: Node | None, **detail: Any) -> Fault:
        t = now_us()
        f = Fault(name=name, node=node.name if node else None, start=t)
        if node is not None and node.machine.remote:
            detail["host"] = node.machine.name
        self.faults.append(f)
        self.cluster.record("fault", t, name=name, phase="start", node=f.node, **detail)
        self.cluster.log(f"nemesis: {name} on {f.node or 'the cluster'} {detail or ''}")
        return f

    def fault_end(self, f: Fault, verified: bool, detail: str) -> None:
        f.end = now_us()
        f.verified = f.verified or verified
        f.detail = detail
        self.cluster.record(
            "fault",
            f.end,
            name=f.name,
            phase="end",
            node=f.node,
            verified=f.verified,
            detail=detail,
            **({"info": f.info} if f.info else {}),
        )
        if not f.verified:
            self.cluster.problems.append(f"nemesis {f.name} on {f.node}: not verified: {detail}")
        self.cluster.log(f"nemesis: {f.name} on {f.node} ended; verified={f.verified}: {detail}")

    def victim(self, *, owning: bool = False) -> Node | None:
        nodes = [n for n in self.cluster.nodes if n.up and not n.paused]
        if owning:
            nodes = [n for n in nodes if n.believed] or nodes
        return self.rng.choice(nodes) if nodes else None

    async def run(self, deadline: float) -> None:
        """The faults asked for, one at a time in a shuffled rotation, a gap between them,
        until `deadline` (monotonic)."""
        kinds = list(self.c.nemesis)
        if not kinds:
            return
        order: list[str] = []
        await asyncio.sleep(min(5.0, self.c.ttl_s * 1.5))
        while time.monotonic() < deadline:
            if not order:
                order = kinds[:]
                self.rng.shuffle(order)
            await FAULTS[order.pop(0)](self)
            await asyncio.sleep(self.c.gap_s * (0.5 + self.rng.random()))

    async def undo(self) -> None:
        """Undo every fault still in effect (the heal): mount A's link up and the mount back,
        the lock options reset, every paused daemon continued, every clock back to 0, the
        filler deleted. Killed nodes are the heal's to restart."""
        if self.g is not None and self.partitioned:
            ok, _why = await asyncio.to_thread(nem.set_link, self.g, True)
            self.partitioned = not ok
            await _mount_back(self)
        if self.g is not None and self.monkey_on:
            await asyncio.to_thread(_monkey_off, self)
        for node in self.cluster.nodes:
            if node.paused and node.daemon_pid:
                await asyncio.to_thread(node.machine.signal, node.daemon_pid, signal.SIGCONT)
                node.paused = False
                self.cluster.record("resume", node=node.name)
            if node.clock_offset:
                await self.cluster.set_clock(node, 0.0)
        for d in self.cluster.dirs[:1]:
            with contextlib.suppress(FileNotFoundError):
                (d / "jepsen-filler").unlink()

    def undo_now(self) -> None:
        """Synchronous last resort at the end of a run: link up, monkey off, probes reaped."""
        if self.g is not None and self.partitioned:
            ok, _why = nem.set_link(self.g, True)
            self.partitioned = not ok
        if self.g is not None and self.monkey_on:
            _monkey_off(self)
        for p in self.probes:
            if not p.reap(60.0):  # a stat on a cut-off mount ends within ping-timeout
                with contextlib.suppress(ProcessLookupError):
                    p.proc.kill()
                p.reap(5.0)
        self.probes.clear()


#: A fault: run once by the nemesis, it does the fault, undoes it, and ends its record.
FaultRoutine = Callable[[Nemesis], Awaitable[None]]


# ---------------------------------------------------------------------------- processes


async def kill(nemesis: Nemesis) -> None:
    """SIGKILL a node's daemon, or (every other kill) its worker, whose daemon then drains
    and exits on its own; then restart the node. Verified by the processes gone."""
    sdk = nemesis.kill_turn % 2 == 1
    nemesis.kill_turn += 1
    node = nemesis.victim(owning=True)
    if node is None or node.daemon_pid is None or node.proc is None or not node.worker_pid:
        return
    daemon, worker, m = node.daemon_pid, node.worker_pid, node.machine
    if sdk:
        f = nemesis.fault_start("kill", node, target="sdk", pid=worker)
        sent = await asyncio.to_thread(m.signal, worker, signal.SIGKILL)
        code = await asyncio.wait_for(node.proc.wait(), 10)
        # Its daemon's stdin closes: it drains and exits on its own (bounded by the drain
        # timeout); its beliefs end only then.
        gone = await asyncio.to_thread(m.wait_gone, daemon, 20)
        if not gone:
            await asyncio.to_thread(m.signal, daemon, signal.SIGKILL)
            gone = await asyncio.to_thread(m.wait_gone, daemon, 5)
        node.crash_recorded = True
        nemesis.cluster.record("crash", node=node.name)
        node.believed = set()
        await asyncio.wait_for(node.exited.wait(), 30)
        worker_gone = await asyncio.to_thread(m.wait_gone, worker, 5)
        detail = (
            f"worker pid {worker} killed: {sent}, gone: {worker_gone}, exit {code}; "
            f"its daemon {daemon} exited: {gone}"
        )
        # Here the worker is this process' child: its exit status says SIGKILL. On
        # another host the launcher's status is whatever it makes of the remote one.
        verified = sent and worker_gone and gone and (m.remote or code == -signal.SIGKILL)
    else:
        f = nemesis.fault_start("kill", node, target="daemon", pid=daemon)
        await asyncio.to_thread(m.signal, daemon, signal.SIGKILL)
        node.crash_recorded = True
        nemesis.cluster.record("crash", node=node.name)
        node.believed = set()
        gone = await asyncio.to_thread(m.wait_gone, daemon, 10)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(node.exited.wait(), 30)
        verified = gone and node.exited.is_set()
        detail = f"daemon pid {daemon} gone: {gone}; its worker exited: {node.exited.is_set()}"
    await asyncio.sleep(1.0 + nemesis.rng.random() * 2.0)
    await nemesis.cluster.start_node(node)
    nemesis.fault_end(f, verified, detail + f"; restarted as {node.name}")


async def pause(nemesis: Nemesis) -> None:
    """SIGSTOP a shard owner's daemon past its lease (ttl x 1.5 + margin + 1 s), then SIGCONT.
    Verified by its state: stopped at once, still stopped at the end, running after."""
    node = nemesis.victim(owning=True)
    if node is None or node.daemon_pid is None:
        return
    pid = node.daemon_pid
    hold = nemesis.c.ttl_s * 1.5 + nemesis.c.margin_s + 1.0
    f = nemesis.fault_start("pause", node, pid=pid, hold_s=hold)
    stopped = await _freeze(nemesis.cluster, node, pid)
    await asyncio.sleep(hold)
    still = await asyncio.to_thread(node.machine.state, pid)
    running, _owned = await _thaw(nemesis.cluster, node, pid)
    verified = stopped in ("T", "t") and still in ("T", "t") and running in ("R", "S", "D")
    nemesis.fault_end(
        f,
        verified,
        f"state after SIGSTOP {stopped}, after {hold:.1f} s {still}, after SIGCONT {running}",
    )


async def _freeze(cluster: Cluster, node: Node, pid: int) -> str | None:
    """SIGSTOP the node's daemon: its beliefs end; the state it was seen in (`T`)."""
    node.paused = True
    await asyncio.to_thread(node.machine.signal, pid, signal.SIGSTOP)
    cluster.record("pause", node=node.name)
    cluster.believe(node, node.name or "?", set(), now_us())
    return await asyncio.to_thread(node.machine.wait_state, pid, "Tt", 2.0)


async def _thaw(cluster: Cluster, node: Node, pid: int) -> tuple[str | None, list[int] | None]:
    """SIGCONT the node's daemon and ask it which shards it owns now: the state it was
    seen in (`R`, `S`, `D`) and its answer (None without one within 10 s)."""
    await asyncio.to_thread(node.machine.signal, pid, signal.SIGCONT)
    running = await asyncio.to_thread(node.machine.wait_state, pid, "RSD", 2.0)
    node.paused = False
    cluster.record("resume", node=node.name)
    waiter: asyncio.Future[list[int] | None] = asyncio.get_running_loop().create_future()
    node.owned_waiters.append(waiter)
    await cluster.send(node, {"op": "owned"})
    owned: list[int] | None = None
    with contextlib.suppress(asyncio.TimeoutError):
        owned = await asyncio.wait_for(waiter, 10)
    return running, owned


async def clock(nemesis: Nemesis) -> None:
    """Step a daemon's clock (its clock file) ahead or behind by the margin + 2-5 s for 4-7 s,
    then back to 0. Verified by the daemon's stderr line taking each offset."""
    node = nemesis.victim()
    if node is None:
        return
    step = (nemesis.c.margin_s + 2.0 + nemesis.rng.random() * 3.0) * nemesis.rng.choice((-1, 1))
    f = nemesis.fault_start("clock", node, offset_s=round(step, 3))
    seen = len(node.logs)
    await nemesis.cluster.set_clock(node, step)
    took = await _wait_log(node, seen, f"{step:+.6f}", 3.0)
    await asyncio.sleep(4.0 + nemesis.rng.random() * 3.0)
    seen = len(node.logs)
    await nemesis.cluster.set_clock(node, 0.0)
    back = await _wait_log(node, seen, "+0.000000", 3.0)
    nemesis.fault_end(
        f, took and back, f"daemon reported the {step:+.3f} s offset: {took}; back to 0: {back}"
    )


async def _wait_log(node: Node, since: int, needle: str, timeout: float) -> bool:
    """Whether the daemon logged a `test clock` line holding `needle`, after its line `since`,
    within `timeout` s."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if any("test clock" in line and needle in line for line in node.logs[since:]):
            return True
        await asyncio.sleep(0.05)
    return False


# ---------------------------------------------------------------------------- files


async def disk_full(nemesis: Nemesis) -> None:
    """Fill the daemons' filesystem (a tmpfs or a loop-mounted ext4 the run made) with a
    filler file until ENOSPC, hold it full 3-5 s, delete the filler. Verified by the
    filler meeting ENOSPC, statvfs reading (almost) no free bytes once it did, and the free
    space back after the delete; reported: what the daemons said about it (refused
    enqueues and ENOSPC lines in their logs)."""
    d = nemesis.cluster.dirs[0]
    free_before = await asyncio.to_thread(nem.free_bytes, d)
    f = nemesis.fault_start(
        "disk-full", None, directory=str(d), fs=nemesis.c.fs, free_before=free_before
    )
    fails_before = _count(nemesis.cluster, "fail")
    events_seen = len(nemesis.cluster.events)
    logs_seen = nemesis.cluster.log_marks()
    filler, written, enospc = await asyncio.to_thread(nem.fill_filesystem, d)
    free_full = await asyncio.to_thread(nem.free_bytes, d)
    nemesis.cluster.record("disk_full", free_bytes=free_full, filler_bytes=written, enospc=enospc)
    await asyncio.sleep(3.0 + nemesis.rng.random() * 2.0)
    with contextlib.suppress(FileNotFoundError):
        filler.unlink()
    free_after = await asyncio.to_thread(nem.free_bytes, d)
    nemesis.cluster.record("disk_freed", free_bytes=free_after)
    refused = _count(nemesis.cluster, "fail") - fails_before
    marks = ("No space", "ENOSPC")
    replies = [
        str(e.get("error"))
        for e in nemesis.cluster.events[events_seen:]
        if e["kind"] == "enqueue"
        and e.get("phase") in ("fail", "info")
        and any(m in str(e.get("error")) for m in marks)
    ]
    lines = nemesis.cluster.logged_since(logs_seen, *marks)
    f.info.update(
        fs=nemesis.c.fs,
        free_before=free_before,
        filler_bytes=written,
        enospc=enospc,
        free_full=free_full,
        free_after=free_after,
        refused=refused,
        enospc_replies=len(replies),
        enospc_log_lines=len(lines),
        examples=(replies[:1] + lines[:1]),
    )
    full = free_full is not None and free_full < FULL_SLACK
    freed = free_after is not None and free_full is not None and free_after > free_full
    nemesis.fault_end(
        f,
        enospc and full and freed,
        f"filler {written} bytes, ENOSPC met: {enospc}; free bytes {free_before} before, "
        f"{free_full} when full, {free_after} after the delete; enqueues refused "
        f"meanwhile: {refused} ({len(replies)} answered ENOSPC); daemon ENOSPC log lines: "
        f"{len(lines)}",
    )


def _count(cluster: Cluster, phase: str) -> int:
    """How many enqueues have ended in `phase` so far."""
    return sum(1 for e in cluster.events if e["kind"] == "enqueue" and e.get("phase") == phase)


async def lock_fault(nemesis: Nemesis) -> None:
    """Replace the lock file of a shard under its owner (`nemesis.replace_lock_file`), so
    another node can lock it too. Verified by the new inode; reported: whether another node
    took the shard while the owner still held it (the negative control's double owner)."""
    node = nemesis.victim(owning=True)
    if node is None or not node.believed:
        return
    shard = nemesis.rng.choice(sorted(node.believed))
    f = nemesis.fault_start("lock-fault", node, shard=shard)
    inode = nem.replace_lock_file(node.directory, shard)
    # Verified when another node announces the shard while the victim still holds it.
    end = time.monotonic() + nemesis.c.ttl_s * 2 + 5
    other: str | None = None
    while time.monotonic() < end:
        for n in nemesis.cluster.nodes:
            if n is not node and n.up and shard in n.believed and shard in node.believed:
                other = n.name
        if other or shard not in node.believed:
            break
        await asyncio.sleep(0.05)
    while time.monotonic() < end and shard in node.believed:
        await asyncio.sleep(0.1)
    # The fault is the replaced lock file; a second owner is its possible effect.
    nemesis.fault_end(
        f,
        inode is not None,
        f"shard-{shard}/.lock replaced (new inode {inode}); "
        + (
            f"{other} took the shard while {node.name} held it"
            if other
            else "no other node took the shard meanwhile"
        ),
    )


# ---------------------------------------------------------------------------- GlusterFS


def _probe(nemesis: Nemesis, limit: float) -> str:
    """stat mount A once (a child process): ok, an errno name, or blocked."""
    assert nemesis.g is not None
    p = nem.probe_stat(nemesis.g.mount_a)
    nemesis.probes.append(p)
    return p.result(limit)


async def _mount_back(nemesis: Nemesis) -> tuple[str, float, bool]:
    """After the heal: wait (bounded) until a stat of mount A works again; if it does not
    within 30 s, run the repair command (up.sh: links, routes, a remount) and wait again.
    Returns (the last probe's result, seconds waited, whether the repair ran)."""
    assert nemesis.g is not None
    t0 = time.monotonic()
    repaired = False
    result = "not probed"
    for limit_s in (30.0, 20.0):
        end = time.monotonic() + limit_s
        while time.monotonic() < end:
            result = await asyncio.to_thread(_probe, nemesis, 3.0)
            if result == "ok":
                return result, time.monotonic() - t0, repaired
            await asyncio.sleep(0.5)
        if repaired or not nemesis.g.repair:
            break
        repaired = True
        nemesis.cluster.log(
            f"mount A still {result} after the heal: running {' '.join(nemesis.g.repair)}"
        )
        env = {**os.environ, **dict(nemesis.g.repair_env)}
        with contextlib.suppress(OSError, asyncio.TimeoutError):
            proc = await asyncio.create_subprocess_exec(
                *nemesis.g.repair,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                env=env,
            )
            try:
                await asyncio.wait_for(proc.wait(), 120)
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
    return result, time.monotonic() - t0, repaired


async def partition(nemesis: Nemesis) -> None:
    """Cut mount A's client off (its server-side veth down) for longer than the volume's
    network.ping-timeout, then heal; verified by a stat of mount A that works before,
    fails (ENOTCONN) or hangs during the cut, and works again after the heal."""
    g = nemesis.g
    assert g is not None
    victims = [n for n in nemesis.cluster.nodes if n.directory == nemesis.cluster.dirs[0]]
    others = [n for n in nemesis.cluster.nodes if n.directory != nemesis.cluster.dirs[0]]
    ping = await asyncio.to_thread(_ping_timeout, g)
    hold = ping + 4.0
    end = time.monotonic() + 10.0  # a cut matters most while mount A owns shards
    while time.monotonic() < end and not any(n.believed for n in victims):
        await asyncio.sleep(0.1)
    before = await asyncio.to_thread(_probe, nemesis, 5.0)
    owned = {s: n.name for n in victims for s in n.believed}
    seen = nemesis.cluster.log_marks(victims)
    incarnations = {n.host: n.incarnation for n in victims}
    f = nemesis.fault_start(
        "partition",
        None,
        nodes=[n.name for n in victims],
        mount=str(g.mount_a),
        link=f"{g.netns_srv}/{g.link_a}",
        hold_s=hold,
        ping_timeout_s=ping,
    )
    nemesis.partitioned = True
    cut, why = await asyncio.to_thread(nem.set_link, g, False)
    t0 = time.monotonic()
    first = nem.probe_stat(g.mount_a)  # hangs until the client gives up
    nemesis.probes.append(first)
    taken = await _takeovers(others, set(owned), t0, hold)
    during_first = await asyncio.to_thread(first.result, hold)
    during_late = await asyncio.to_thread(_probe, nemesis, 3.0)
    healed, why_up = await asyncio.to_thread(nem.set_link, g, True)
    nemesis.partitioned = not healed
    after, waited, repaired = await _mount_back(nemesis)
    # A daemon that exited meanwhile is restarted once its mount is back.
    for n in victims:
        if not n.up and after == "ok":
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(n.exited.wait(), 30)
            await nemesis.cluster.start_node(n)
    stepped = nemesis.cluster.logged_since(seen, "stops acting for it")
    lock_failed = [line for line in stepped if "its lock failed" in line]
    # EBADFD (client.strict-locks) or ENOTCONN on a daemon's files after the cut
    fs_errors = nemesis.cluster.logged_since(
        seen, "File descriptor in bad state", "endpoint is not connected"
    )
    failed = {"ENOTCONN", "blocked", "EBADFD", "EIO"}
    cut_seen = during_first in failed or during_late in failed
    info = {
        "ping_timeout_s": ping,
        "hold_s": hold,
        "stat_before": before,
        "stat_during": [during_first, during_late],
        "stat_after": after,
        "back_after_s": round(waited, 1),
        "repaired": repaired,
        "link_down": cut,
        "link_up": healed,
        "owned_by_victims": sorted(owned),
        "taken_over": {f"shard-{s}": [who, round(t, 1)] for s, (who, t) in taken.items()},
        "step_downs": len(stepped),
        "lost_locks": len(lock_failed),
        "ebadfd_or_enotconn_lines": len(fs_errors),
        "victims_restarted": [n.host for n in victims if n.incarnation != incarnations[n.host]],
    }
    f.info.update(info)
    verified = cut and healed and before == "ok" and cut_seen and after == "ok"
    nemesis.fault_end(
        f,
        verified,
        f"link down: {cut or why}; stat of {g.mount_a} before {before}, during the cut "
        f"{during_first} then {during_late}, after the heal {after} ({waited:.1f} s"
        f"{', after a repair' if repaired else ''}); shards taken over meanwhile: "
        f"{info['taken_over'] or 'none'}; step-downs logged on mount A: {len(stepped)} "
        f"({len(lock_failed)} for a failed lock); EBADFD/ENOTCONN lines in their logs: "
        f"{len(fs_errors)}; restarted: {info['victims_restarted'] or 'none'}"
        + (f"; link up failed: {why_up}" if not healed else ""),
    )


def _ping_timeout(g: nem.GlusterControl) -> float:
    """The volume's network.ping-timeout, s (GlusterFS's default 42 when it cannot be read)."""
    ping_opt = nem.volume_option(g, "network.ping-timeout")
    try:
        return float(ping_opt or "42")
    except ValueError:
        return 42.0


async def _takeovers(
    others: list[Node], shards: set[int], t0: float, hold: float
) -> dict[int, tuple[str, float]]:
    """Watch until `hold` s after `t0` (monotonic): which of `shards` another node took over,
    and when (s after `t0`), the first one for each."""
    taken: dict[int, tuple[str, float]] = {}
    while time.monotonic() - t0 < hold:
        for n in others:
            for s in shards & n.believed:
                if s not in taken and n.name:
                    taken[s] = (n.name, time.monotonic() - t0)
        await asyncio.sleep(0.1)
    return taken


def _monkey_off(nemesis: Nemesis) -> bool:
    assert nemesis.g is not None
    ok = True
    for key in ("features.locks-monkey-unlocking", "features.locks-revocation-secs"):
        code, _out = nem.gluster(nemesis.g, "volume", "reset", nemesis.g.volume, key)
        ok = ok and code == 0
    if ok:
        nemesis.monkey_on = False
    return ok


async def monkey_unlock(nemesis: Nemesis) -> None:
    """features.locks-monkey-unlocking on for a while, then off. The brick's locks xlator
    then ignores about 1 in 100 unlock requests of inodelk/entrylk locks (the internal
    locks of GlusterFS's cluster translators; only when features.locks-revocation-secs is
    set, so it is set too): stuck locks, later revoked. Verified by the option read back
    from glusterd both ways and the brick's log of taking it."""
    g = nemesis.g
    assert g is not None
    log = await asyncio.to_thread(nem.brick_log, g)
    offset = log.stat().st_size if log else 0
    seen = nemesis.cluster.log_marks()
    f = nemesis.fault_start("monkey-unlock", None, volume=g.volume)
    nemesis.monkey_on = True
    code, out = await asyncio.to_thread(
        nem.gluster,
        g,
        "volume",
        "set",
        g.volume,
        "features.locks-monkey-unlocking",
        "on",
        "features.locks-revocation-secs",
        "2",
    )
    on = await asyncio.to_thread(nem.volume_option, g, "features.locks-monkey-unlocking")
    await asyncio.sleep(5.0 + nemesis.rng.random() * 3.0)
    reset = await asyncio.to_thread(_monkey_off, nemesis)
    off = await asyncio.to_thread(nem.volume_option, g, "features.locks-monkey-unlocking")
    brick_took = stuck = 0
    if log is not None:
        with contextlib.suppress(OSError), open(log, "rb") as fh:
            fh.seek(offset)
            text = fh.read().decode("utf-8", "replace")
        brick_took = text.count("option monkey-unlocking using set value on")
        stuck = text.count("MONKEY LOCKING")
    lost = nemesis.cluster.logged_since(seen, "its lock failed")
    f.info.update(
        option_on=on,
        option_off=off,
        brick_took=brick_took,
        stuck_unlocks=stuck,
        lost_locks=len(lost),
    )
    nemesis.fault_end(
        f,
        code == 0 and on == "on" and reset and off in ("off", "false", "disable"),
        f"features.locks-monkey-unlocking read back {on} (set: {out if code else 'ok'}), "
        f"then {off}; brick log: took it {brick_took}x, {stuck} unlock(s) ignored; "
        f"lost locks logged by daemons meanwhile: {len(lost)}",
    )


async def clear_locks(nemesis: Nemesis) -> None:
    """Drop the flock of a shard's owner (the victim) under it with `gluster volume
    clear-locks VOL /…/shard-N/.lock kind all posix`, while the victim is frozen (SIGSTOP)
    until past its lease, so that another node can take the shard: on GlusterFS only a
    lapsed lease lets a node claim a shard, and a frozen daemon's FUSE client keeps its
    flock, so without the clear nobody could load it. Then SIGCONT. The victim is never
    told: its client still believes it holds the lock, and its writes through the lock's
    fd go on succeeding; only its lease and the epochs stop it acting for the shard.

    (A lapse without the freeze cannot be made from outside: a clock step does not do it,
    since a challenger also waits until it has itself seen the claim unchanged for
    ttl + margin on its own monotonic clock.)

    Verified by the lock probed from the other mount: held (BLOCKED) before the clear,
    free (ACQUIRED) right after it, the brick saying it cleared a granted lock, and the
    victim stopped and running again. Reported: whether and when another node took the
    shard, the lock held again by the new owner, what the victim owns afterwards and its
    step-downs for the shard."""
    g = nemesis.g
    assert g is not None
    node = nemesis.victim(owning=True)
    if node is None or not node.believed or node.daemon_pid is None:
        return
    other_dir = next((d for d in nemesis.cluster.dirs if d != node.directory), node.directory)
    held = await _held_shard(nemesis, node, other_dir)
    if held is None:  # no fault this round
        return
    shard, before = held
    # the lock file's path from the volume's root (dirs[0] is the queue seen through A)
    volume_path = "/" + str(
        (nemesis.cluster.dirs[0] / f"shard-{shard}" / ".lock").relative_to(g.mount_a)
    )
    probe_path = other_dir / f"shard-{shard}" / ".lock"
    pid = node.daemon_pid
    hold = nemesis.c.ttl_s * 1.5 + nemesis.c.margin_s + 1.0
    seen = nemesis.cluster.log_marks([node])
    f = nemesis.fault_start(
        "clear-locks", node, shard=shard, path=volume_path, probe=str(probe_path), hold_s=hold
    )
    stopped = await _freeze(nemesis.cluster, node, pid)
    t0 = time.monotonic()
    code, out, granted = await asyncio.to_thread(nem.clear_posix_locks, g, volume_path)
    nemesis.cluster.record(
        "clear_locks", node=node.name, shard=shard, path=volume_path, granted=granted
    )
    after = await asyncio.to_thread(nem.probe_lock, probe_path)
    nemesis.cluster.record(
        "lock_probe", shard=shard, path=str(probe_path), before=before, after=after
    )
    taken: tuple[str, float] | None = None
    while time.monotonic() - t0 < hold:
        for n in nemesis.cluster.nodes:
            if n is not node and n.up and shard in n.believed and taken is None and n.name:
                taken = (n.name, round(time.monotonic() - t0, 2))
        await asyncio.sleep(0.05)
    # A node that took the shard over holds its lock now: probed again, it must be held.
    held_again = await asyncio.to_thread(nem.probe_lock, probe_path) if taken else None
    running, owned_after = await _thaw(nemesis.cluster, node, pid)
    stepped = [
        line
        for line in nemesis.cluster.logged_since(seen, "stops acting for it")
        if f"shard-{shard}" in line
    ]
    paused = stopped in ("T", "t") and running in ("R", "S", "D")
    f.info.update(
        shard=shard,
        path=volume_path,
        probe_before=before,
        cleared=granted,
        clear_status=code,
        probe_after=after,
        taken_over=list(taken) if taken else None,
        probe_after_takeover=held_again,
        victim_owned_after=owned_after,
        victim_step_downs=[line[:200] for line in stepped],
        paused=paused,
    )
    nemesis.fault_end(
        f,
        code == 0 and before == "BLOCKED" and after == "ACQUIRED" and bool(granted) and paused,
        f"shard-{shard}/.lock probed from {other_dir}: {before} before, cleared "
        f"({out if code else f'{granted} granted posix lock(s)'}), {after} after; "
        + (
            f"{taken[0]} took the shard {taken[1]} s after the clear (its lock then {held_again}); "
            if taken
            else "no other node took the shard; "
        )
        + f"the victim (frozen {hold:.1f} s: {stopped}, then {running}) owns "
        f"{owned_after} after; its step-downs for the shard: {len(stepped)}",
    )


async def _held_shard(nemesis: Nemesis, node: Node, other_dir: Path) -> tuple[int, str] | None:
    """A shard of `node` whose lock is held now (probed from `other_dir`), and the probe's
    answer; None (logged) when none is. What a node last announced can be a moment old (a
    give-back or a takeover under way releases the lock before the next announcement), and
    clearing a lock nobody holds proves nothing."""
    shards = sorted(node.believed)
    nemesis.rng.shuffle(shards)
    before = ""
    for shard in shards:
        before = await asyncio.to_thread(nem.probe_lock, other_dir / f"shard-{shard}" / ".lock")
        if before == "BLOCKED":
            return shard, before
    nemesis.cluster.log(
        f"nemesis: clear-locks on {node.name} skipped: no lock of its shards "
        f"{sorted(node.believed)} held (last probe: {before})"
    )
    return None


#: Every fault the command line accepts, by name, and its routine: the only list of them.
FAULTS: dict[str, FaultRoutine] = {
    "kill": kill,
    "pause": pause,
    "clock": clock,
    "disk-full": disk_full,
    "lock-fault": lock_fault,
    "partition": partition,
    "monkey-unlock": monkey_unlock,
    "clear-locks": clear_locks,
}
#: Those that need --fs glusterfs (a volume this run can reconfigure or cut off).
GLUSTER_FAULTS = ("partition", "monkey-unlock", "clear-locks")
