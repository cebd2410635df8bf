"""One jepsen-lite run, phase by phase: filesystem, workers, client load, nemesis, heal,
drain, history, verdict (`run`).

Phases (all bounded in time):

1. **setup**: the queue directory (a local directory, a small tmpfs, a small ext4 in a
   loop-mounted image file, or a fresh directory on a GlusterFS volume seen through two
   mounts), then one worker per node (`jepsen_lite.worker`,
   which spawns its daemon through `SnerdQueue`). Nodes alternate mounts on GlusterFS. With
   `hosts` each worker runs on its host through the `remote` command template, and the
   nemesis reaches its processes and clock file there the same way (`nemesis.Machine`).
2. **chaos** (`duration` s): clients enqueue to random running nodes and send job-control
   commands (cancel, retry, purge, pause/resume) to random live ones; the nemesis runs its
   faults one after another on random victims, each recorded as `fault` entries with start and
   end and verified to have happened.
3. **heal**: every fault undone (SIGCONT, clock files back to 0, filler deleted, killed nodes
   restarted); the load stops.
4. **drain**: every pause lifted (again every few seconds while it lasts); wait (bounded)
   until every acked task has a tombstone and every retried one ran again, then stop every worker
   (its SDK drains its daemon). A child (`trigger_after_ids`) is an acked task like any other:
   it ends when it has run, or dead-lettered through a failed parent or one no file holds
   (after `unknown_parent_s`, which the drain must outlast); a dead letter is an end.
5. **judge**: the shard logs and inboxes are read back into the history
   (`jepsen_lite.history`), written to `history.jsonl`, and judged by `sim.check.check`.

The phases are the only part that knows the order; the parts they drive each own their state:
`cluster.Cluster` the worker processes and the record, `load.Load` the enqueues and their acks,
`commands.Commands` the job-control commands and their answers, `faults.Nemesis` the faults
and what is left to undo.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shlex
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jepsen_lite import nemesis as nem
from jepsen_lite.cluster import REPO, SCHEDULE_NAME, SECOND, Cluster, now_us
from jepsen_lite.commands import RESUME_EVERY_S, Commands
from jepsen_lite.config import RunConfig, config_problem
from jepsen_lite.faults import Fault, Nemesis
from jepsen_lite.history import build_history, finished_tasks
from jepsen_lite.load import Load
from sim.check import Report, check

__all__ = ["Outcome", "Run", "gluster_control", "run"]


@dataclass(slots=True)
class Outcome:
    """What one run gave: its history and the checker's report on it, its faults, and
    whether the run itself went as asked (`problems`, `drained`)."""

    config: RunConfig
    history: list[dict[str, Any]]
    report: Report
    faults: list[Fault]
    out: Path
    #: Problems of the run itself (a nemesis that did not take, a drain that timed out...).
    problems: list[str]
    started: int
    ended: int
    drained: bool
    unfinished: list[str] = field(default_factory=list)
    #: What setting up and taking down the filesystem did (`fs="loop"`: image, mkfs, mount,
    #: unmount, detach, delete), in order.
    fs_steps: list[str] = field(default_factory=list)


class Run:
    """One run's parts, and its phases in order (`main`)."""

    def __init__(
        self,
        config: RunConfig,
        directories: list[Path],
        out: Path,
        gluster: nem.GlusterControl | None = None,
    ) -> None:
        self.c = config
        rng = random.Random(config.seed)
        self.cluster = Cluster(config, directories, out)
        self.commands = Commands(self.cluster, config)
        self.load = Load(self.cluster, config, rng, self.commands.task_type)
        self.commands.spared = self.load.in_deps
        self.nemesis = Nemesis(self.cluster, config, rng, gluster)
        #: The signals that end the run (set by `run`), and whether one (or Ctrl-C) did.
        self.signals: nem.Signals | None = None
        self.interrupted = False
        #: What setting the filesystem up did (recorded in the params entry).
        self.fs_steps: list[str] = []

    async def main(self) -> tuple[bool, list[str]]:
        """The run (`_main`). A signal (`signals`) or Ctrl-C cancels it: the faults are undone
        without waiting for the one in progress, no node is restarted, every worker and daemon
        is killed, and the cancellation goes on up to `run`, which undoes the filesystem."""
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        assert task is not None

        def interrupt() -> None:
            if not self.interrupted:
                self.interrupted = True
                loop.call_soon_threadsafe(task.cancel)

        if self.signals is not None:
            self.signals.on_signal = interrupt
        try:
            return await self._main()
        except asyncio.CancelledError:
            self.interrupted = True
            self.cluster.log("interrupted: undoing the faults, killing every node")
            await self.cluster.kill_all()
            raise
        finally:
            if self.signals is not None:
                self.signals.on_signal = None

    async def _main(self) -> tuple[bool, list[str]]:
        """The phases: setup, chaos (the heal at its end), drain, every worker stopped."""
        await self.setup()
        await self.chaos()
        self.cluster.record("phase", name="liveness")
        drained, unfinished = await self.drain()
        for node in self.cluster.nodes:
            await self.cluster.stop_node(node)
        return drained, unfinished

    async def setup(self) -> None:
        """The params entry, every clock file at 0, every node started."""
        c, cluster = self.c, self.cluster
        cluster.record(
            "params",
            ttl_us=int(c.ttl_s * SECOND),
            margin_us=int(c.margin_s * SECOND),
            fence=not c.unsafe_no_fence,
            # Beliefs are seen only as stdout messages reach the workers: an overlap measured
            # from them is reported, never judged (safety is judged on the records).
            assumptions_hold=False,
            window_slack_us=SECOND
            + (2 * int((c.margin_s + 5.0) * SECOND) if "clock" in c.nemesis else 0),
            fs=c.fs,
            fs_setup=self.fs_steps,
            nodes=c.nodes,
            shards=c.shards,
            seed=c.seed,
            nemesis=list(c.nemesis),
            command_rate=c.command_rate,
        )
        self.commands.start()
        for node in cluster.nodes:
            if not await asyncio.to_thread(node.machine.write_clock, node.clock_file, 0.0):
                raise RuntimeError(
                    f"{node.host}: cannot write its clock file {node.clock_file} on "
                    f"{node.machine.label} (through {shlex.join(node.machine.command('...'))})"
                )
        for node in cluster.nodes:
            await cluster.start_node(node)

    async def chaos(self) -> None:
        """The load and the nemesis for `duration` s, then (also when it ends early) the heal
        and the end of the load."""
        c, cluster, load = self.c, self.cluster, self.load
        cluster.record("phase", name="chaos")
        deadline = time.monotonic() + c.duration
        load_task = asyncio.create_task(load.run())
        commands_task = asyncio.create_task(
            self.commands.run(load.stop, lambda: load.seq)
        )
        chaos = asyncio.create_task(self.nemesis.run(deadline))
        try:
            await asyncio.wait_for(asyncio.shield(chaos), c.duration + 5)
        except TimeoutError:
            pass
        except asyncio.CancelledError:  # Ctrl-C, SIGTERM: heal and stop, no more waiting
            self.interrupted = True
            raise
        finally:
            if not chaos.done() and not self.interrupted:
                # Let the fault in progress finish (it undoes itself), bounded.
                with contextlib.suppress(asyncio.TimeoutError, Exception):
                    await asyncio.wait_for(chaos, 60)
            if not chaos.done():
                chaos.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await asyncio.wait_for(chaos, 30)
            cluster.record("phase", name="heal")
            await self.heal(restart=not self.interrupted)
            remaining = deadline - time.monotonic()
            if remaining > 0 and not self.interrupted:
                await asyncio.sleep(remaining)
            load.stop.set()
            await load_task
            if self.interrupted:
                commands_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await commands_task
            if load.ops and self.interrupted:
                for op in load.ops:
                    op.cancel()
            if load.ops:
                await asyncio.wait(list(load.ops), timeout=30)
        if chaos.done() and not chaos.cancelled() and chaos.exception() is not None:
            raise chaos.exception()  # type: ignore[misc]

    async def heal(self, *, restart: bool = True) -> None:
        """Every fault undone, then (`restart`) every node that is down started again."""
        await self.nemesis.undo()
        for node in self.cluster.nodes:
            if restart and not node.up:
                await self.cluster.start_node(node)

    async def drain(self) -> tuple[bool, list[str]]:
        """Wait (bounded) until every acked task has a tombstone (completed or dead-lettered,
        children too) and every retried task has run again, every pause lifted now and every
        `RESUME_EVERY_S` meanwhile: whether all did, and those that did not."""
        end = time.monotonic() + self.c.drain_timeout
        commands = self.commands
        resumed = time.monotonic()
        await commands.resume_all()
        if self.c.schedule_cron:
            # Its runs stop: the drain waits for the acked tasks only (a run is owed to none).
            for node in self.cluster.nodes:
                if node.up and await self.cluster.send(
                    node, {"op": "unschedule", "name": SCHEDULE_NAME}
                ):
                    break
        left = sorted(self.load.acked)
        while time.monotonic() < end:
            done = await asyncio.to_thread(finished_tasks, self.cluster.dirs[0])
            left = sorted((self.load.acked - done) | set(commands.waiting()))
            if not left:
                return True, []
            await asyncio.sleep(1.0)
            if time.monotonic() - resumed >= RESUME_EVERY_S:
                resumed = time.monotonic()
                await commands.resume_all()
        return False, left

    def waiting_children(self, unfinished: list[str]) -> str:
        """What the unfinished children among `unfinished` wait on ("" if none): a child is
        waited for like any acked task, and ends when its parents do (run, or dead-lettered
        through a failed or unknown parent)."""
        parents_of = self.load.parents_of
        children = [t for t in unfinished if t in parents_of]
        if not children:
            return ""
        shown = "; ".join(f"{t} on {', '.join(parents_of[t])}" for t in children[:5])
        return f", {len(children)} of them children ({shown})"

    def take_down(self) -> None:
        """Synchronous, at the end of every run however it ended: every worker and daemon
        killed and seen gone (before their filesystem is unmounted), the GlusterFS faults
        undone, the clock folders on the hosts removed."""
        cluster = self.cluster
        for node in cluster.nodes:
            cluster.kill_processes(node)
        for node in cluster.nodes:  # gone before their filesystem is unmounted
            for pid in (node.daemon_pid, node.worker_pid):
                if pid:
                    node.machine.wait_gone(pid, 5.0)
        self.nemesis.undo_now()
        for m in {n.machine for n in cluster.nodes if n.machine.remote}:
            m.remove_tree(cluster.remote_clock_dir)

    def judge(
        self,
        history: list[dict[str, Any]],
        *,
        started: int,
        drained: bool,
        unfinished: list[str],
        undo_problems: list[str],
        fs_steps: list[str],
    ) -> Outcome:
        """The history written to `history.jsonl` and checked; the run's own problems (the
        cluster's, the filesystem's, an unfinished drain, a fault asked for that never ran)."""
        config, out = self.c, self.cluster.out
        ended = now_us()
        with open(out / "history.jsonl", "w", encoding="utf-8") as f:
            for e in history:
                f.write(json.dumps(e, separators=(",", ":")) + "\n")
        report = check(history)
        problems = list(self.cluster.problems) + [
            f"taking the filesystem down: {p}" for p in undo_problems
        ]
        if not drained:
            problems.append(
                f"the drain did not finish within {config.drain_timeout:g} s: "
                f"{len(unfinished)} acked task(s) unfinished" + self.waiting_children(unfinished)
            )
        faults = self.nemesis.faults
        by_kind: dict[str, int] = defaultdict(int)
        for fault in faults:
            by_kind[fault.name] += 1
        for kind in config.nemesis:
            if not by_kind.get(kind):
                problems.append(f"nemesis {kind} was asked for but never ran")
        return Outcome(
            config=config,
            history=history,
            report=report,
            faults=faults,
            out=out,
            problems=problems,
            started=started,
            ended=ended,
            drained=drained,
            unfinished=unfinished,
            fs_steps=fs_steps,
        )


def _setup_dirs(
    config: RunConfig, out: Path, steps: list[str]
) -> tuple[list[Path], Callable[[], list[str]], nem.GlusterControl | None]:
    """The queue directory as each node sees it, how to undo the setup (it returns the
    problems met), and (GlusterFS) how to reach the volume."""
    if config.dirs:
        name = f"jepsen-{config.seed}-{os.getpid()}-{int(time.time())}"
        (config.dirs[0] / name).mkdir()
        seen = [d / name for d in config.dirs]
        end = time.monotonic() + 10
        while not all(p.is_dir() for p in seen):
            if time.monotonic() > end:
                raise RuntimeError(f"{seen[0]} made, but not seen through every --dir in 10 s")
            time.sleep(0.1)
        return seen, list, None
    if config.fs == "local":
        d = out / "data"
        d.mkdir(parents=True)
        return [d], list, None
    if config.fs == "tmpfs":
        d = out / "data"
        nem.mount_tmpfs(d, config.tmpfs_size)

        def undo_tmpfs() -> list[str]:
            nem.umount(d)
            return []

        return [d], undo_tmpfs, None
    if config.fs == "loop":
        # The image lives next to the output, its mount at data/ (as the tmpfs'); both are
        # gone after the run (the atexit hook of nemesis.mount_loop if the run itself dies).
        d = out / "data"
        loop = nem.mount_loop(out / "loop.img", d, config.loop_size_mib)
        steps.extend(loop.steps)

        def undo_loop() -> list[str]:
            done = len(loop.steps)
            problems = loop.cleanup()
            steps.extend(loop.steps[done:])
            return problems

        return [d], undo_loop, None
    if config.fs == "glusterfs":
        if config.gluster_dirs is not None:
            return list(config.gluster_dirs), list, config.gluster
        sys.path.insert(0, str(REPO))
        from tests.support import glusterfs as gl  # the test suite's volume helpers

        # The partition nemesis needs mount A's client in a network namespace: the
        # SNERD_GLUSTER_NETNS=1 setup of up.sh (a volume of its own).
        netns = "partition" in config.nemesis
        volume, why = gl.find_netns_volume() if netns else gl.find_volume()
        if volume is None:
            raise RuntimeError(f"no GlusterFS volume: {why}")
        ctx = gl.fresh_directory(volume, f"jepsen-{config.seed}-{os.getpid()}")
        a, b = ctx.__enter__()

        def undo() -> list[str]:
            ctx.__exit__(None, None, None)
            if volume.started_here:
                gl.take_down(netns=volume.netns)
            return []

        return [a, b], undo, gluster_control(volume)
    raise ValueError(f"unknown filesystem {config.fs!r}")


def gluster_control(volume: Any) -> nem.GlusterControl:
    """How to reach a `tests.support.glusterfs.GlusterVolume` (its CLI socket, mount A's link)."""
    return nem.GlusterControl(
        volume=volume.name,
        mount_a=volume.a,
        sock=volume.sock,
        netns_srv=volume.netns_srv,
        link_a=volume.link_a,
        repair=("bash", str(REPO / "tests" / "glusterfs" / "up.sh")) if volume.netns else (),
        repair_env=(("SNERD_GLUSTER_NETNS", "1"),) if volume.netns else (),
    )


def run(config: RunConfig) -> Outcome:
    """Run once; the history goes to `config.out/history.jsonl`. SIGTERM and SIGHUP end the
    run as Ctrl-C does: processes killed, mounts and images undone, then SystemExit."""
    problem = config_problem(config)
    if problem:
        raise ValueError(problem)
    out = config.out
    out.mkdir(parents=True, exist_ok=True)
    fs_steps: list[str] = []
    with nem.exit_on_signals() as signals:
        dirs, undo, gluster = _setup_dirs(config, out, fs_steps)
        undo_problems: list[str] = []
        try:
            r = Run(config, dirs, out, gluster)
            r.fs_steps = list(fs_steps)
            r.signals = signals
            started = now_us()
            drained, unfinished = False, list[str]()
            try:
                drained, unfinished = asyncio.run(r.main())
            except asyncio.CancelledError:
                if signals.signum is None:
                    raise
                raise SystemExit(128 + signals.signum) from None
            finally:
                r.take_down()
            # read back before the filesystem goes (only when the run got this far)
            history = build_history(r.cluster.events, dirs[0], r.cluster.clocks)
        finally:
            undo_problems = undo()
    return r.judge(
        history,
        started=started,
        drained=drained,
        unfinished=unfinished,
        undo_problems=undo_problems,
        fs_steps=fs_steps,
    )
