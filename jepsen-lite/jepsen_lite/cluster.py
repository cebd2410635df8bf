"""The cluster of one run: one worker process per node (`jepsen_lite.worker`, which spawns
its daemon through the SDK), on this host or, with `hosts`, on another through the `remote`
launcher. It starts, stops and kills them, sends them commands (one JSON line each on the
worker's stdin), and turns what they print (replies, beliefs, executions, daemon log lines,
their exit) into history entries.

It also keeps the run's record: every entry the history is built from goes through `record`,
and the problems of the run itself gather in `problems`. It knows no fault and no phase:
`jepsen_lite.faults` and `jepsen_lite.phases` drive it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jepsen_lite import nemesis as nem
from jepsen_lite.history import ClockSteps

if TYPE_CHECKING:
    from jepsen_lite.config import RunConfig

__all__ = ["REPO", "SECOND", "Cluster", "Node", "now_us"]

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
SECOND = 1_000_000
#: Where a remote node's clock file lives on its host (`<dir>/jepsen-lite-<run>/clock-nN`).
REMOTE_CLOCK_DIR = "/tmp"


def now_us() -> int:
    return time.time_ns() // 1000


#: The name of the schedule every node declares (`RunConfig.schedule_cron`).
SCHEDULE_NAME = "jl-beat"


@dataclass(slots=True, eq=False)
class Node:
    """One node: where it runs, its worker and daemon of the current incarnation, and what
    its worker has told the controller (answers awaited, shards it believes it owns, log)."""

    #: The node's label (`n1`): its daemon's HOSTNAME, the first part of its names.
    host: str
    #: The queue directory as this host (the controller) sees it.
    directory: Path
    #: The clock file, on the node's machine.
    clock_file: Path
    #: Where its worker and daemon run.
    machine: nem.Machine = field(default_factory=nem.Machine)
    #: The queue directory as the worker is given it (on its machine).
    worker_dir: str = ""
    clock_offset: float = 0.0
    incarnation: int = 0
    #: The local process: the worker itself, or the launcher (`ssh ...`) that runs it.
    proc: asyncio.subprocess.Process | None = None
    name: str | None = None
    daemon_pid: int | None = None
    #: The worker's pid on its machine (the same as `proc.pid` on this host).
    worker_pid: int | None = None
    up: bool = False
    paused: bool = False
    waiting: dict[str, asyncio.Future[dict[str, Any]]] = field(default_factory=dict)
    owned_waiters: list[asyncio.Future[list[int] | None]] = field(default_factory=list)
    believed: set[int] = field(default_factory=set)
    logs: list[str] = field(default_factory=list)
    reader: asyncio.Task[None] | None = None
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    crash_recorded: bool = False


class Cluster:
    """The run's nodes and their worker processes, and the record of everything they did."""

    def __init__(self, config: RunConfig, directories: list[Path], out: Path) -> None:
        self.c = config
        self.dirs = directories
        self.out = out
        self.events: list[dict[str, Any]] = []
        self.problems: list[str] = []
        self.clocks = ClockSteps()
        #: Who hears the answers to job-control commands (`control` events): (node name,
        #: the daemon's line, the worker's time).
        self.on_control: Callable[[str, dict[str, Any], int], None] | None = None
        self.nodes = [self._node(i) for i in range(config.nodes)]
        self.daemon_env = {
            "SNERD_SHARDS": str(config.shards),
            "SNERD_LEASE_TTL": str(config.ttl_s),
            "SNERD_CLOCK_SKEW_MARGIN": str(config.margin_s),
            "SNERD_DRAIN_TIMEOUT": "2",
            "SNERD_MAX_WORKERS": "32",
            "SNERD_UNKNOWN_PARENT_SECONDS": str(config.unknown_parent_s),
        }
        if config.unsafe_no_fence:
            self.daemon_env["SNERD_TEST_UNSAFE_NO_FENCE"] = "1"
        if config.unsafe_ignore_cancel:
            self.daemon_env["SNERD_TEST_UNSAFE_IGNORE_CANCEL"] = "1"
        if config.unsafe_ignore_pause:
            self.daemon_env["SNERD_TEST_UNSAFE_IGNORE_PAUSE"] = "1"

    def _node(self, i: int) -> Node:
        """Node i: on this host, or (`hosts`) on host i mod len(hosts) through the launcher."""
        c, label = self.c, f"n{i + 1}"
        directory = self.dirs[i % len(self.dirs)]
        if not c.hosts:
            return Node(
                host=label,
                directory=directory,
                clock_file=self.out / f"clock-{label}",
                worker_dir=str(directory),
            )
        host = c.hosts[i % len(c.hosts)]
        mounts = dict(c.remote_dirs)
        mount = mounts.get(host) or mounts.get("") or str(c.dirs[i % len(c.dirs)])
        launcher = tuple(t.replace("{host}", host) for t in shlex.split(c.remote))
        return Node(
            host=label,
            directory=directory,
            clock_file=self.remote_clock_dir / f"clock-{label}",
            machine=nem.Machine(host, launcher),
            worker_dir=f"{mount.rstrip('/')}/{self.dirs[0].name}",
        )

    @property
    def remote_clock_dir(self) -> Path:
        return Path(REMOTE_CLOCK_DIR) / f"jepsen-lite-{self.dirs[0].name}"

    # ------------------------------------------------------------------ recording

    def record(self, kind: str, t: int | None = None, **fields: Any) -> dict[str, Any]:
        entry = {"t": now_us() if t is None else t, "kind": kind, **fields}
        self.events.append(entry)
        return entry

    def log(self, text: str) -> None:
        sys.stderr.write(f"[jepsen-lite {time.strftime('%H:%M:%S')}] {text}\n")
        sys.stderr.flush()

    # ------------------------------------------------------------------ workers

    async def start_node(self, node: Node) -> None:
        node.incarnation += 1
        node.exited = asyncio.Event()
        node.crash_recorded = False
        node.paused = False
        node.believed = set()
        env = {
            **self.daemon_env,
            "HOSTNAME": node.host,
            "SNERD_TEST_CLOCK_FILE": str(node.clock_file),
        }
        py_path = os.pathsep.join([str(REPO), str(HERE.parent), os.environ.get("PYTHONPATH", "")])
        worker = ["-m", "jepsen_lite.worker", "--dir", node.worker_dir, "--env", json.dumps(env)]
        if self.c.schedule_cron:
            worker += ["--schedule", f"{SCHEDULE_NAME}={self.c.schedule_cron}"]
        argv = [sys.executable, *worker]
        if node.machine.remote:
            repo = self.c.remote_repo or str(REPO)
            python = self.c.remote_python or sys.executable
            path = f"PYTHONPATH={repo}:{repo}/jepsen-lite"
            argv = node.machine.command("exec " + shlex.join(["env", path, python, *worker]))
        stderr = open(self.out / f"{node.host}.{node.incarnation}.stderr", "wb")  # noqa: SIM115
        try:
            node.proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
                env={**os.environ, "PYTHONPATH": py_path},
                limit=1 << 24,
            )
        finally:
            stderr.close()
        assert node.proc.stdout is not None
        line = await asyncio.wait_for(node.proc.stdout.readline(), 60)
        ready = json.loads(line) if line else {}
        if ready.get("ev") != "ready":
            raise RuntimeError(f"{node.host}: the worker did not start (see its stderr file)")
        node.daemon_pid = int(ready["pid"])
        node.worker_pid = int(ready.get("worker") or node.proc.pid)
        node.name = f"{node.host}@pid-{node.daemon_pid}"
        node.up = True
        if node.incarnation > 1:
            self.record("restart", node=node.name)
        via: dict[str, Any] = {"via": argv[:-1]} if node.machine.remote else {}
        self.record(
            "node_start",
            node=node.name,
            host=node.machine.label,
            uname=ready.get("uname"),
            worker_pid=node.worker_pid,
            daemon_pid=node.daemon_pid,
            incarnation=node.incarnation,
            **via,
        )
        node.reader = asyncio.create_task(self._read(node, node.proc, node.name))
        on = f" on {node.machine.name}" if node.machine.remote else ""
        self.log(f"{node.name} started{on} (worker pid {node.worker_pid})")

    async def _read(self, node: Node, proc: asyncio.subprocess.Process, name: str) -> None:
        assert proc.stdout is not None
        try:
            while True:
                line = await proc.stdout.readline()
                if not line:
                    break
                try:
                    e = json.loads(line)
                except json.JSONDecodeError:
                    continue
                self._on_event(node, name, e)
        finally:
            with contextlib.suppress(ProcessLookupError):
                await asyncio.wait_for(proc.wait(), 30)
            self._node_gone(node, name)

    def _on_event(self, node: Node, name: str, e: dict[str, Any]) -> None:
        ev = e.get("ev")
        t = int(e.get("t") or now_us())
        if ev == "reply":
            fut = node.waiting.pop(str(e.get("task")), None)
            if fut is not None and not fut.done():
                fut.set_result(e)
        elif ev == "membership":
            if not node.paused:
                self.believe(node, name, set(e.get("owned") or []), t)
        elif ev == "owned":
            owned = e.get("owned")
            for w in node.owned_waiters:
                if not w.done():
                    w.set_result(owned)
            node.owned_waiters.clear()
            if owned is not None and not node.paused:
                self.believe(node, name, set(owned), t)
        elif ev == "execute":
            self.record("execute", t, task=e["task"], attempt=e["attempt"], node=name)
        elif ev == "handler_done":
            self.record(
                "handler_done", t, task=e["task"], attempt=e["attempt"], node=name, ok=e["ok"]
            )
        elif ev == "dead_letter":
            self.record("dead_letter", t, task=e["task"], node=name, error=e.get("error"))
        elif ev == "log":
            node.logs.append(str(e.get("line")))
            self.record("daemon_log", t, node=name, line=e.get("line"))
        elif ev == "daemon_exit":
            self.record("daemon_exit", t, node=name, code=e.get("code"))
        elif ev == "control" and isinstance(e.get("message"), dict):
            if self.on_control is not None:
                self.on_control(name, e["message"], t)
        elif ev == "scheduled" and e.get("error"):
            node.logs.append(f"schedule {e.get('name')}: {e.get('error')}")

    def believe(self, node: Node, name: str, owned: set[int], t: int) -> None:
        for s in sorted(node.believed - owned):
            self.record("belief", t, node=name, shard=s, on=False)
        for s in sorted(owned - node.believed):
            self.record("belief", t, node=name, shard=s, on=True)
        node.believed = set(owned)

    def _node_gone(self, node: Node, name: str) -> None:
        if node.name != name:
            return
        node.up = False
        t = now_us()
        if not node.crash_recorded:
            node.crash_recorded = True
            self.record("crash", t, node=name)
        node.believed = set()
        for task, fut in list(node.waiting.items()):
            if not fut.done():
                fut.set_result(
                    {
                        "ev": "reply",
                        "task": task,
                        "status": "info",
                        "t": t,
                        "error": "the node went away before answering",
                    }
                )
        node.waiting.clear()
        node.exited.set()

    async def send(self, node: Node, cmd: dict[str, Any]) -> bool:
        proc = node.proc
        if proc is None or proc.stdin is None or not node.up:
            return False
        try:
            proc.stdin.write(json.dumps(cmd).encode() + b"\n")
            await asyncio.wait_for(proc.stdin.drain(), 5)
        except (TimeoutError, OSError, ConnectionError, RuntimeError):
            return False
        return True

    async def stop_node(self, node: Node) -> None:
        """Close the worker's stdin: its SDK drains the daemon and exits."""
        proc = node.proc
        if proc is None:
            return
        if proc.stdin is not None:
            with contextlib.suppress(OSError, RuntimeError):
                proc.stdin.close()
        try:
            await asyncio.wait_for(node.exited.wait(), 60)
        except TimeoutError:
            self.problems.append(f"{node.name}: its worker did not exit within 60 s; killed")
            await asyncio.to_thread(self.kill_processes, node)
            await asyncio.wait_for(node.exited.wait(), 30)

    def kill_processes(self, node: Node) -> None:
        """SIGKILL the node's daemon and worker wherever they run, and the launcher here."""
        for pid in (node.daemon_pid, node.worker_pid):
            node.machine.kill_if_alive(pid)
        if node.machine.remote and node.proc is not None:
            nem.Machine().kill_if_alive(node.proc.pid)

    # ------------------------------------------------------------------ what the nemesis uses

    async def set_clock(self, node: Node, offset_s: float) -> bool:
        """Write `offset_s` into the node's clock file (on its machine) and record the step."""
        ok = await asyncio.to_thread(node.machine.write_clock, node.clock_file, offset_s)
        t = now_us()
        node.clock_offset = offset_s
        self.clocks.add(node.host, t, int(offset_s * SECOND))
        self.record("clock_step", t, node=node.name, offset_s=offset_s)
        return ok

    def log_marks(self, nodes: list[Node] | None = None) -> dict[str, int]:
        """How many daemon log lines each node (of `nodes`, default all) has reported so far."""
        return {n.host: len(n.logs) for n in (self.nodes if nodes is None else nodes)}

    def logged_since(self, marks: dict[str, int], *needles: str) -> list[str]:
        """The daemon log lines of the nodes in `marks` reported since, holding any of
        `needles`."""
        return [
            line
            for n in self.nodes
            if n.host in marks
            for line in n.logs[marks[n.host] :]
            if any(x in line for x in needles)
        ]

    async def kill_all(self) -> None:
        """SIGKILL every node's processes and wait (bounded) for its worker to be seen gone."""
        for node in self.nodes:
            await asyncio.to_thread(self.kill_processes, node)
        for node in self.nodes:
            if node.proc is not None:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(node.exited.wait(), 10)
