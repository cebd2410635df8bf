"""One jepsen-lite run: filesystem, workers, client load, nemesis, heal, drain, history, verdict.

Phases (all bounded in time):

1. **setup**: the queue directory (a local directory, a small tmpfs, a small ext4 in a
   loop-mounted image file, or a fresh directory on a GlusterFS volume seen through two
   mounts), then one worker per node (`jepsen_lite.worker`,
   which spawns its daemon through `SnerdQueue`). Nodes alternate mounts on GlusterFS. With
   `hosts` each worker runs on its host through the `remote` command template, and the
   nemesis reaches its processes and clock file there the same way (`nemesis.Machine`).
2. **chaos** (`duration` s): clients enqueue to random running nodes; the nemesis runs its
   faults one after another on random victims, each recorded as `fault` entries with start and
   end and verified to have happened.
3. **heal**: every fault undone (SIGCONT, clock files back to 0, filler deleted, killed nodes
   restarted); the load stops.
4. **drain**: wait (bounded) until every acked task has a tombstone, then stop every worker
   (its SDK drains its daemon).
5. **judge**: the shard logs and inboxes are read back into the history
   (`jepsen_lite.history`), written to `history.jsonl`, and judged by `sim.checker.check`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shlex
import signal
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xxhash

from jepsen_lite import nemesis as nem
from jepsen_lite.history import ClockSteps, build_history, finished_tasks
from sim.checker import Report, check

__all__ = ["Outcome", "RunConfig", "config_problem", "run"]

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
SECOND = 1_000_000
#: The rate-limited group and its limit (a share of the tasks carries it).
RL_GROUP = "rl"
RL_LIMIT = 60
#: How `--remote` reaches a host by default.
DEFAULT_REMOTE = "ssh -o BatchMode=yes {host}"
#: Where a remote node's clock file lives on its host (`<dir>/jepsen-lite-<run>/clock-nN`).
REMOTE_CLOCK_DIR = "/tmp"
#: Free bytes a filesystem may still show and be called full by `disk-full` (the filler ends
#: with 1-byte writes; a daemon may free a little meanwhile).
FULL_SLACK = 1 << 20


def now_us() -> int:
    return time.time_ns() // 1000


@dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig:
    fs: str = "local"
    nodes: int = 3
    shards: int = 4
    duration: float = 60.0
    seed: int = 0
    nemesis: tuple[str, ...] = ("kill", "pause", "clock")
    out: Path = Path("jepsen-out")
    #: Client enqueues per second, across the cluster.
    rate: float = 20.0
    ttl_s: float = 3.0
    margin_s: float = 0.5
    #: Seconds between the end of one fault and the start of the next.
    gap_s: float = 3.0
    #: The negative control: daemons without fencing (SNERD_TEST_UNSAFE_NO_FENCE=1).
    unsafe_no_fence: bool = False
    #: The two directories (mount A, mount B) of a GlusterFS run; found or brought up if None.
    gluster_dirs: tuple[Path, Path] | None = None
    #: The volume behind `gluster_dirs`, for the partition, monkey-unlock and clear-locks
    #: nemeses (found with the volume when the run brings it up itself).
    gluster: nem.GlusterControl | None = None
    #: Mount points of one shared filesystem (your own EFS, GlusterFS, Lustre...): the run
    #: makes a fresh directory under the first and uses it through each, nodes in turn.
    dirs: tuple[Path, ...] = ()
    #: Longest wait for the drain, seconds.
    drain_timeout: float = 120.0
    #: Share of tasks in the rate-limited group.
    rl_share: float = 0.04
    tmpfs_size: str = "48m"
    #: Size of the ext4 image of `fs="loop"`, MiB.
    loop_size_mib: int = 64
    #: Hosts to run the workers (and their daemons) on, round-robin; empty: all on this one.
    #: Needs `dirs`: the shared filesystem as this host sees it (the logs are read back
    #: through it).
    hosts: tuple[str, ...] = ()
    #: The command that runs a shell command line on `{host}` (given as one more argument).
    remote: str = DEFAULT_REMOTE
    #: The interpreter (of a venv with snerd installed) and the checkout on the hosts; by
    #: default the paths they have here.
    remote_python: str | None = None
    remote_repo: str | None = None
    #: The shared filesystem's mount point on the hosts: ("", path) for every host, (host,
    #: path) for one; by default the `dirs` path, the same everywhere.
    remote_dirs: tuple[tuple[str, str], ...] = ()


def config_problem(config: RunConfig) -> str | None:
    """Why `config` cannot run (the command line exits 2 with it), or None."""
    nemesis = config.nemesis
    gluster_only = [n for n in nemesis if n in nem.GLUSTER_NEMESES]
    if config.hosts:
        if not config.dirs:
            return (
                "--hosts needs --dir: the shared filesystem's mount point on this host (the "
                "run makes its directory there and reads the daemons' logs back through it)"
            )
        if "disk-full" in nemesis:
            return (
                "the disk-full nemesis cannot be used with --hosts: it fills a tmpfs or "
                "loop-mounted ext4 made on this host, which the other hosts do not share"
            )
        if gluster_only:
            return (
                f"the {', '.join(gluster_only)} nemesis cannot be used with --hosts: it needs "
                "the test volume of --fs glusterfs on this host (its glusterd, and for "
                "partition mount A's client in a local network namespace)"
            )
        if "{host}" not in config.remote:
            return f"--remote {config.remote!r} does not name the host: put {{host}} in it"
        if len(set(config.hosts)) != len(config.hosts) or not all(config.hosts):
            return f"--hosts {','.join(config.hosts)}: empty or repeated host names"
        if config.nodes < len(config.hosts):
            return f"--nodes {config.nodes} is fewer than the {len(config.hosts)} --hosts"
        unknown = [h for h, _ in config.remote_dirs if h and h not in config.hosts]
        if unknown:
            return f"--remote-dir names {', '.join(unknown)}, not in --hosts"
    elif (
        config.remote != DEFAULT_REMOTE
        or config.remote_dirs
        or config.remote_python
        or config.remote_repo
    ):
        return "--remote, --remote-dir, --remote-python and --remote-repo need --hosts"
    if config.dirs and config.fs != "local":
        return f"--dir is your own filesystem: --fs {config.fs} cannot be used with it"
    if gluster_only and config.fs != "glusterfs":
        return f"the {', '.join(gluster_only)} nemesis needs --fs glusterfs"
    if "disk-full" in nemesis and config.fs not in nem.FILLABLE_FS:
        return "the disk-full nemesis needs --fs tmpfs or --fs loop (a small filesystem to fill)"
    if gluster_only and config.gluster_dirs is not None and config.gluster is None:
        return f"the {', '.join(gluster_only)} nemesis needs RunConfig.gluster"
    if "partition" in nemesis and config.gluster is not None and not config.gluster.link_a:
        return "the partition nemesis needs mount A's client in a network namespace"
    return None


@dataclass(slots=True)
class Fault:
    name: str
    node: str | None
    start: int
    end: int | None = None
    verified: bool = False
    detail: str = ""
    #: What the fault's verification found, by name (reported; the tests read it).
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Outcome:
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


@dataclass(slots=True, eq=False)
class Node:
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


class Run:
    def __init__(
        self,
        config: RunConfig,
        directories: list[Path],
        out: Path,
        gluster: nem.GlusterControl | None = None,
    ) -> None:
        self.c = config
        self.g = gluster
        #: Faults to undo if the run ends half-way (see `undo_gluster`).
        self.partitioned = False
        self.monkey_on = False
        #: stat probes of mount A, reaped at the end (a blocked one cannot be killed).
        self.probes: list[nem.Probe] = []
        self.rng = random.Random(config.seed)
        #: The signals that end the run (set by `run`), and whether one (or Ctrl-C) did.
        self.signals: nem.Signals | None = None
        self.interrupted = False
        #: What setting the filesystem up did (recorded in the params entry).
        self.fs_steps: list[str] = []
        self.dirs = directories
        self.out = out
        self.events: list[dict[str, Any]] = []
        self.faults: list[Fault] = []
        self.problems: list[str] = []
        self.clocks = ClockSteps()
        self.nodes = [self._node(i) for i in range(config.nodes)]
        self.seq = 0
        self.ops: set[asyncio.Task[None]] = set()
        self.stop_load = asyncio.Event()
        self.acked: set[str] = set()
        self.daemon_env = {
            "SNERD_SHARDS": str(config.shards),
            "SNERD_LEASE_TTL": str(config.ttl_s),
            "SNERD_CLOCK_SKEW_MARGIN": str(config.margin_s),
            "SNERD_DRAIN_TIMEOUT": "2",
            "SNERD_MAX_WORKERS": "32",
        }
        if config.unsafe_no_fence:
            self.daemon_env["SNERD_TEST_UNSAFE_NO_FENCE"] = "1"

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
                self._believe(node, name, set(e.get("owned") or []), t)
        elif ev == "owned":
            owned = e.get("owned")
            for w in node.owned_waiters:
                if not w.done():
                    w.set_result(owned)
            node.owned_waiters.clear()
            if owned is not None and not node.paused:
                self._believe(node, name, set(owned), t)
        elif ev == "execute":
            self.record("execute", t, task=e["task"], attempt=e["attempt"], node=name)
        elif ev == "handler_done":
            self.record(
                "handler_done", t, task=e["task"], attempt=e["attempt"], node=name, ok=e["ok"]
            )
        elif ev == "dead_letter":
            self.record("dead_letter", t, task=e["task"], node=name)
        elif ev == "log":
            node.logs.append(str(e.get("line")))
            self.record("daemon_log", t, node=name, line=e.get("line"))
        elif ev == "daemon_exit":
            self.record("daemon_exit", t, node=name, code=e.get("code"))

    def _believe(self, node: Node, name: str, owned: set[int], t: int) -> None:
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
            await asyncio.to_thread(self._kill_processes, node)
            await asyncio.wait_for(node.exited.wait(), 30)

    def _kill_processes(self, node: Node) -> None:
        """SIGKILL the node's daemon and worker wherever they run, and the launcher here."""
        for pid in (node.daemon_pid, node.worker_pid):
            node.machine.kill_if_alive(pid)
        if node.machine.remote and node.proc is not None:
            nem.Machine().kill_if_alive(node.proc.pid)

    # ------------------------------------------------------------------ load

    def shard_of(self, key: str) -> int:
        return xxhash.xxh3_64_intdigest(key.encode()) % self.c.shards

    async def load(self) -> None:
        while not self.stop_load.is_set():
            await asyncio.sleep(self.rng.expovariate(self.c.rate))
            running = [n for n in self.nodes if n.up]
            if not running or len(self.ops) > 2000:
                continue
            node = self.rng.choice(running)
            self.seq += 1
            task = f"t{self.seq}"
            max_retries = self.rng.randint(0, 2)
            fail = [a for a in range(1, max_retries + 2) if self.rng.random() < 0.1]
            data = {
                "id": task,
                "sleep": self.rng.choice([0, 0, 0, 0.01, 0.05, 0.2]),
                "fail": fail,
            }
            group = RL_GROUP if self.rng.random() < self.c.rl_share else None
            op = asyncio.create_task(self.enqueue(node, task, data, max_retries, group))
            self.ops.add(op)
            op.add_done_callback(self.ops.discard)

    async def enqueue(
        self, node: Node, task: str, data: dict[str, Any], max_retries: int, group: str | None
    ) -> None:
        name = node.name
        attrs = {
            "type": "t",
            "max_retries": max_retries,
            "urgency": 0,
            "group": group,
            "max_per_minute": RL_LIMIT if group else None,
            "fingerprint": None,
            "delay_us": 0,
            "parents": [],
        }
        t0 = now_us()
        self.record("enqueue", t0, phase="invoke", task=task, node=name, attrs=attrs)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        node.waiting[task] = fut
        cmd = {
            "op": "enqueue",
            "task": task,
            "data": data,
            "max_retries": max_retries,
            "group": group,
            "max_per_minute": RL_LIMIT if group else None,
        }

        def unknown(why: str) -> None:
            """The enqueue's outcome is not known (`info`)."""
            node.waiting.pop(task, None)
            self.record("enqueue", max(now_us(), t0), phase="info", task=task, node=name, error=why)

        if not await self.send(node, cmd):
            unknown("could not write to the worker")
            return
        try:
            reply = await asyncio.wait_for(asyncio.shield(fut), 10)
        except TimeoutError:
            unknown("no answer within 10 s")
            return
        status = reply.get("status")
        t = max(int(reply.get("t") or now_us()), t0)
        if status == "ok":
            self.acked.add(task)
            extra: dict[str, Any] = {}
            if isinstance(reply.get("shard"), int):
                extra["shard"] = reply["shard"]
            if reply.get("deduplicated"):
                extra["deduplicated"] = True
            self.record("enqueue", t, phase="ok", task=task, node=name, latency_us=t - t0, **extra)
        else:
            self.record(
                "enqueue",
                t,
                phase="fail" if status == "fail" else "info",
                task=task,
                node=name,
                error=reply.get("error"),
            )

    # ------------------------------------------------------------------ nemesis

    def fault_start(self, name: str, node: Node | None, **detail: Any) -> Fault:
        t = now_us()
        f = Fault(name=name, node=node.name if node else None, start=t)
        if node is not None and node.machine.remote:
            detail["host"] = node.machine.name
        self.faults.append(f)
        self.record("fault", t, name=name, phase="start", node=f.node, **detail)
        self.log(f"nemesis: {name} on {f.node or 'the cluster'} {detail or ''}")
        return f

    def fault_end(self, f: Fault, verified: bool, detail: str) -> None:
        f.end = now_us()
        f.verified = f.verified or verified
        f.detail = detail
        self.record(
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
            self.problems.append(f"nemesis {f.name} on {f.node}: not verified: {detail}")
        self.log(f"nemesis: {f.name} on {f.node} ended; verified={f.verified}: {detail}")

    def victim(self, *, owning: bool = False) -> Node | None:
        nodes = [n for n in self.nodes if n.up and not n.paused]
        if owning:
            nodes = [n for n in nodes if n.believed] or nodes
        return self.rng.choice(nodes) if nodes else None

    async def restart_later(self, node: Node, delay: float) -> None:
        await asyncio.sleep(delay)
        if not node.up:
            await self.start_node(node)

    async def nemesis(self, deadline: float) -> None:
        kinds = list(self.c.nemesis)
        if not kinds:
            return
        order: list[str] = []
        kill_turn = 0
        await asyncio.sleep(min(5.0, self.c.ttl_s * 1.5))
        while time.monotonic() < deadline:
            if not order:
                order = kinds[:]
                self.rng.shuffle(order)
            kind = order.pop(0)
            if kind == "kill":
                await self.kill(sdk=kill_turn % 2 == 1)
                kill_turn += 1
            elif kind == "pause":
                await self.pause()
            elif kind == "clock":
                await self.clock()
            elif kind == "disk-full":
                await self.disk_full()
            elif kind == "lock-fault":
                await self.lock_fault()
            elif kind == "partition":
                await self.partition()
            elif kind == "monkey-unlock":
                await self.monkey_unlock()
            elif kind == "clear-locks":
                await self.clear_locks()
            await asyncio.sleep(self.c.gap_s * (0.5 + self.rng.random()))

    async def kill(self, *, sdk: bool) -> None:
        node = self.victim(owning=True)
        if node is None or node.daemon_pid is None or node.proc is None or not node.worker_pid:
            return
        daemon, worker, m = node.daemon_pid, node.worker_pid, node.machine
        if sdk:
            f = self.fault_start("kill", node, target="sdk", pid=worker)
            sent = await asyncio.to_thread(m.signal, worker, signal.SIGKILL)
            code = await asyncio.wait_for(node.proc.wait(), 10)
            # Its daemon's stdin closes: it drains and exits on its own (bounded by the drain
            # timeout); its beliefs end only then.
            gone = await asyncio.to_thread(m.wait_gone, daemon, 20)
            if not gone:
                await asyncio.to_thread(m.signal, daemon, signal.SIGKILL)
                gone = await asyncio.to_thread(m.wait_gone, daemon, 5)
            node.crash_recorded = True
            self.record("crash", node=node.name)
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
            f = self.fault_start("kill", node, target="daemon", pid=daemon)
            await asyncio.to_thread(m.signal, daemon, signal.SIGKILL)
            node.crash_recorded = True
            self.record("crash", node=node.name)
            node.believed = set()
            gone = await asyncio.to_thread(m.wait_gone, daemon, 10)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(node.exited.wait(), 30)
            verified = gone and node.exited.is_set()
            detail = f"daemon pid {daemon} gone: {gone}; its worker exited: {node.exited.is_set()}"
        await asyncio.sleep(1.0 + self.rng.random() * 2.0)
        await self.start_node(node)
        self.fault_end(f, verified, detail + f"; restarted as {node.name}")

    async def pause(self) -> None:
        node = self.victim(owning=True)
        if node is None or node.daemon_pid is None:
            return
        pid = node.daemon_pid
        hold = self.c.ttl_s * 1.5 + self.c.margin_s + 1.0
        f = self.fault_start("pause", node, pid=pid, hold_s=hold)
        stopped = await self._freeze(node, pid)
        await asyncio.sleep(hold)
        still = await asyncio.to_thread(node.machine.state, pid)
        running, _owned = await self._thaw(node, pid)
        verified = stopped in ("T", "t") and still in ("T", "t") and running in ("R", "S", "D")
        self.fault_end(
            f,
            verified,
            f"state after SIGSTOP {stopped}, after {hold:.1f} s {still}, after SIGCONT {running}",
        )

    async def _freeze(self, node: Node, pid: int) -> str | None:
        """SIGSTOP the node's daemon: its beliefs end; the state it was seen in (`T`)."""
        node.paused = True
        await asyncio.to_thread(node.machine.signal, pid, signal.SIGSTOP)
        self.record("pause", node=node.name)
        self._believe(node, node.name or "?", set(), now_us())
        return await asyncio.to_thread(node.machine.wait_state, pid, "Tt", 2.0)

    async def _thaw(self, node: Node, pid: int) -> tuple[str | None, list[int] | None]:
        """SIGCONT the node's daemon and ask it which shards it owns now: the state it was
        seen in (`R`, `S`, `D`) and its answer (None without one within 10 s)."""
        await asyncio.to_thread(node.machine.signal, pid, signal.SIGCONT)
        running = await asyncio.to_thread(node.machine.wait_state, pid, "RSD", 2.0)
        node.paused = False
        self.record("resume", node=node.name)
        waiter: asyncio.Future[list[int] | None] = asyncio.get_running_loop().create_future()
        node.owned_waiters.append(waiter)
        await self.send(node, {"op": "owned"})
        owned: list[int] | None = None
        with contextlib.suppress(asyncio.TimeoutError):
            owned = await asyncio.wait_for(waiter, 10)
        return running, owned

    async def set_clock(self, node: Node, offset_s: float) -> bool:
        """Write `offset_s` into the node's clock file (on its machine) and record the step."""
        ok = await asyncio.to_thread(node.machine.write_clock, node.clock_file, offset_s)
        t = now_us()
        node.clock_offset = offset_s
        self.clocks.add(node.host, t, int(offset_s * SECOND))
        self.record("clock_step", t, node=node.name, offset_s=offset_s)
        return ok

    async def clock(self) -> None:
        node = self.victim()
        if node is None:
            return
        step = (self.c.margin_s + 2.0 + self.rng.random() * 3.0) * self.rng.choice((-1, 1))
        f = self.fault_start("clock", node, offset_s=round(step, 3))
        seen = len(node.logs)
        await self.set_clock(node, step)
        took = await self._wait_log(node, seen, f"{step:+.6f}", 3.0)
        await asyncio.sleep(4.0 + self.rng.random() * 3.0)
        seen = len(node.logs)
        await self.set_clock(node, 0.0)
        back = await self._wait_log(node, seen, "+0.000000", 3.0)
        self.fault_end(
            f, took and back, f"daemon reported the {step:+.3f} s offset: {took}; back to 0: {back}"
        )

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

    async def _wait_log(self, node: Node, since: int, needle: str, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if any("test clock" in line and needle in line for line in node.logs[since:]):
                return True
            await asyncio.sleep(0.05)
        return False

    async def disk_full(self) -> None:
        """Fill the daemons' filesystem (a tmpfs or a loop-mounted ext4 the run made) with a
        filler file until ENOSPC, hold it full 3-5 s, delete the filler. Verified by the
        filler meeting ENOSPC, statvfs reading (almost) no free bytes once it did, and the free
        space back after the delete; reported: what the daemons said about it (refused
        enqueues and ENOSPC lines in their logs)."""
        d = self.dirs[0]
        free_before = await asyncio.to_thread(nem.free_bytes, d)
        f = self.fault_start(
            "disk-full", None, directory=str(d), fs=self.c.fs, free_before=free_before
        )
        fails_before = self._count("fail")
        events_seen = len(self.events)
        logs_seen = self.log_marks()
        filler, written, enospc = await asyncio.to_thread(nem.fill_filesystem, d)
        free_full = await asyncio.to_thread(nem.free_bytes, d)
        self.record("disk_full", free_bytes=free_full, filler_bytes=written, enospc=enospc)
        await asyncio.sleep(3.0 + self.rng.random() * 2.0)
        with contextlib.suppress(FileNotFoundError):
            filler.unlink()
        free_after = await asyncio.to_thread(nem.free_bytes, d)
        self.record("disk_freed", free_bytes=free_after)
        refused = self._count("fail") - fails_before
        marks = ("No space", "ENOSPC")
        replies = [
            str(e.get("error"))
            for e in self.events[events_seen:]
            if e["kind"] == "enqueue"
            and e.get("phase") in ("fail", "info")
            and any(m in str(e.get("error")) for m in marks)
        ]
        lines = self.logged_since(logs_seen, *marks)
        f.info.update(
            fs=self.c.fs,
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
        self.fault_end(
            f,
            enospc and full and freed,
            f"filler {written} bytes, ENOSPC met: {enospc}; free bytes {free_before} before, "
            f"{free_full} when full, {free_after} after the delete; enqueues refused "
            f"meanwhile: {refused} ({len(replies)} answered ENOSPC); daemon ENOSPC log lines: "
            f"{len(lines)}",
        )

    def _count(self, phase: str) -> int:
        return sum(1 for e in self.events if e["kind"] == "enqueue" and e.get("phase") == phase)

    async def lock_fault(self) -> None:
        node = self.victim(owning=True)
        if node is None or not node.believed:
            return
        shard = self.rng.choice(sorted(node.believed))
        f = self.fault_start("lock-fault", node, shard=shard)
        inode = nem.replace_lock_file(node.directory, shard)
        # Verified when another node announces the shard while the victim still holds it.
        end = time.monotonic() + self.c.ttl_s * 2 + 5
        other: str | None = None
        while time.monotonic() < end:
            for n in self.nodes:
                if n is not node and n.up and shard in n.believed and shard in node.believed:
                    other = n.name
            if other or shard not in node.believed:
                break
            await asyncio.sleep(0.05)
        while time.monotonic() < end and shard in node.believed:
            await asyncio.sleep(0.1)
        # The fault is the replaced lock file; a second owner is its possible effect.
        self.fault_end(
            f,
            inode is not None,
            f"shard-{shard}/.lock replaced (new inode {inode}); "
            + (
                f"{other} took the shard while {node.name} held it"
                if other
                else "no other node took the shard meanwhile"
            ),
        )

    # ------------------------------------------------------------------ GlusterFS nemeses

    def _probe(self, limit: float) -> str:
        """stat mount A once (a child process): ok, an errno name, or blocked."""
        assert self.g is not None
        p = nem.probe_stat(self.g.mount_a)
        self.probes.append(p)
        return p.result(limit)

    async def _mount_back(self) -> tuple[str, float, bool]:
        """After the heal: wait (bounded) until a stat of mount A works again; if it does not
        within 30 s, run the repair command (up.sh: links, routes, a remount) and wait again.
        Returns (the last probe's result, seconds waited, whether the repair ran)."""
        assert self.g is not None
        t0 = time.monotonic()
        repaired = False
        result = "not probed"
        for limit_s in (30.0, 20.0):
            end = time.monotonic() + limit_s
            while time.monotonic() < end:
                result = await asyncio.to_thread(self._probe, 3.0)
                if result == "ok":
                    return result, time.monotonic() - t0, repaired
                await asyncio.sleep(0.5)
            if repaired or not self.g.repair:
                break
            repaired = True
            self.log(f"mount A still {result} after the heal: running {' '.join(self.g.repair)}")
            env = {**os.environ, **dict(self.g.repair_env)}
            with contextlib.suppress(OSError, asyncio.TimeoutError):
                proc = await asyncio.create_subprocess_exec(
                    *self.g.repair,
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

    async def partition(self) -> None:
        """Cut mount A's client off (its server-side veth down) for longer than the volume's
        network.ping-timeout, then heal; verified by a stat of mount A that works before,
        fails (ENOTCONN) or hangs during the cut, and works again after the heal."""
        g = self.g
        assert g is not None
        victims = [n for n in self.nodes if n.directory == self.dirs[0]]
        others = [n for n in self.nodes if n.directory != self.dirs[0]]
        ping_opt = await asyncio.to_thread(nem.volume_option, g, "network.ping-timeout")
        try:
            ping = float(ping_opt or "42")
        except ValueError:
            ping = 42.0
        hold = ping + 4.0
        end = time.monotonic() + 10.0  # a cut matters most while mount A owns shards
        while time.monotonic() < end and not any(n.believed for n in victims):
            await asyncio.sleep(0.1)
        before = await asyncio.to_thread(self._probe, 5.0)
        owned = {s: n.name for n in victims for s in n.believed}
        seen = self.log_marks(victims)
        incarnations = {n.host: n.incarnation for n in victims}
        f = self.fault_start(
            "partition",
            None,
            nodes=[n.name for n in victims],
            mount=str(g.mount_a),
            link=f"{g.netns_srv}/{g.link_a}",
            hold_s=hold,
            ping_timeout_s=ping,
        )
        self.partitioned = True
        cut, why = await asyncio.to_thread(nem.set_link, g, False)
        t0 = time.monotonic()
        first = nem.probe_stat(g.mount_a)  # hangs until the client gives up
        self.probes.append(first)
        taken: dict[int, tuple[str, float]] = {}
        while time.monotonic() - t0 < hold:
            for n in others:
                for s in set(owned) & n.believed:
                    if s not in taken and n.name:
                        taken[s] = (n.name, time.monotonic() - t0)
            await asyncio.sleep(0.1)
        during_first = await asyncio.to_thread(first.result, hold)
        during_late = await asyncio.to_thread(self._probe, 3.0)
        healed, why_up = await asyncio.to_thread(nem.set_link, g, True)
        self.partitioned = not healed
        after, waited, repaired = await self._mount_back()
        # A daemon that exited meanwhile is restarted once its mount is back.
        for n in victims:
            if not n.up and after == "ok":
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(n.exited.wait(), 30)
                await self.start_node(n)
        stepped = self.logged_since(seen, "stops acting for it")
        lock_failed = [line for line in stepped if "its lock failed" in line]
        # EBADFD (client.strict-locks) or ENOTCONN on a daemon's files after the cut
        fs_errors = self.logged_since(
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
        self.fault_end(
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

    def _monkey_off(self) -> bool:
        assert self.g is not None
        ok = True
        for key in ("features.locks-monkey-unlocking", "features.locks-revocation-secs"):
            code, _out = nem.gluster(self.g, "volume", "reset", self.g.volume, key)
            ok = ok and code == 0
        if ok:
            self.monkey_on = False
        return ok

    async def monkey_unlock(self) -> None:
        """features.locks-monkey-unlocking on for a while, then off. The brick's locks xlator
        then ignores about 1 in 100 unlock requests of inodelk/entrylk locks (the internal
        locks of GlusterFS's cluster translators; only when features.locks-revocation-secs is
        set, so it is set too): stuck locks, later revoked. Verified by the option read back
        from glusterd both ways and the brick's log of taking it."""
        g = self.g
        assert g is not None
        log = await asyncio.to_thread(nem.brick_log, g)
        offset = log.stat().st_size if log else 0
        seen = self.log_marks()
        f = self.fault_start("monkey-unlock", None, volume=g.volume)
        self.monkey_on = True
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
        await asyncio.sleep(5.0 + self.rng.random() * 3.0)
        reset = await asyncio.to_thread(self._monkey_off)
        off = await asyncio.to_thread(nem.volume_option, g, "features.locks-monkey-unlocking")
        brick_took = stuck = 0
        if log is not None:
            with contextlib.suppress(OSError), open(log, "rb") as fh:
                fh.seek(offset)
                text = fh.read().decode("utf-8", "replace")
            brick_took = text.count("option monkey-unlocking using set value on")
            stuck = text.count("MONKEY LOCKING")
        lost = self.logged_since(seen, "its lock failed")
        f.info.update(
            option_on=on,
            option_off=off,
            brick_took=brick_took,
            stuck_unlocks=stuck,
            lost_locks=len(lost),
        )
        self.fault_end(
            f,
            code == 0 and on == "on" and reset and off in ("off", "false", "disable"),
            f"features.locks-monkey-unlocking read back {on} (set: {out if code else 'ok'}), "
            f"then {off}; brick log: took it {brick_took}x, {stuck} unlock(s) ignored; "
            f"lost locks logged by daemons meanwhile: {len(lost)}",
        )

    async def clear_locks(self) -> None:
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
        g = self.g
        assert g is not None
        node = self.victim(owning=True)
        if node is None or not node.believed or node.daemon_pid is None:
            return
        other_dir = next((d for d in self.dirs if d != node.directory), node.directory)
        # A shard whose lock is held now: what a node last announced can be a moment old (a
        # give-back or a takeover under way releases the lock before the next announcement),
        # and clearing a lock nobody holds proves nothing. None held: no fault this round.
        shards = sorted(node.believed)
        self.rng.shuffle(shards)
        shard, before = shards[0], ""
        for shard in shards:
            before = await asyncio.to_thread(nem.probe_lock, other_dir / f"shard-{shard}" / ".lock")
            if before == "BLOCKED":
                break
        else:
            self.log(
                f"nemesis: clear-locks on {node.name} skipped: no lock of its shards "
                f"{sorted(node.believed)} held (last probe: {before})"
            )
            return
        # the lock file's path from the volume's root (dirs[0] is the queue seen through A)
        volume_path = "/" + str((self.dirs[0] / f"shard-{shard}" / ".lock").relative_to(g.mount_a))
        probe_path = other_dir / f"shard-{shard}" / ".lock"
        pid = node.daemon_pid
        hold = self.c.ttl_s * 1.5 + self.c.margin_s + 1.0
        seen = self.log_marks([node])
        f = self.fault_start(
            "clear-locks", node, shard=shard, path=volume_path, probe=str(probe_path), hold_s=hold
        )
        stopped = await self._freeze(node, pid)
        t0 = time.monotonic()
        code, out, granted = await asyncio.to_thread(nem.clear_posix_locks, g, volume_path)
        self.record("clear_locks", node=node.name, shard=shard, path=volume_path, granted=granted)
        after = await asyncio.to_thread(nem.probe_lock, probe_path)
        self.record("lock_probe", shard=shard, path=str(probe_path), before=before, after=after)
        taken: tuple[str, float] | None = None
        while time.monotonic() - t0 < hold:
            for n in self.nodes:
                if n is not node and n.up and shard in n.believed and taken is None and n.name:
                    taken = (n.name, round(time.monotonic() - t0, 2))
            await asyncio.sleep(0.05)
        # A node that took the shard over holds its lock now: probed again, it must be held.
        held_again = await asyncio.to_thread(nem.probe_lock, probe_path) if taken else None
        running, owned_after = await self._thaw(node, pid)
        stepped = [
            line
            for line in self.logged_since(seen, "stops acting for it")
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
        self.fault_end(
            f,
            code == 0 and before == "BLOCKED" and after == "ACQUIRED" and bool(granted) and paused,
            f"shard-{shard}/.lock probed from {other_dir}: {before} before, cleared "
            f"({out if code else f'{granted} granted posix lock(s)'}), {after} after; "
            + (
                f"{taken[0]} took the shard {taken[1]} s after the clear (its lock then "
                f"{held_again}); "
                if taken
                else "no other node took the shard; "
            )
            + f"the victim (frozen {hold:.1f} s: {stopped}, then {running}) owns "
            f"{owned_after} after; its step-downs for the shard: {len(stepped)}",
        )

    def undo_gluster(self) -> None:
        """Synchronous last resort at the end of a run: link up, monkey off, probes reaped."""
        if self.g is not None and self.partitioned:
            ok, _why = nem.set_link(self.g, True)
            self.partitioned = not ok
        if self.g is not None and self.monkey_on:
            self._monkey_off()
        for p in self.probes:
            if not p.reap(60.0):  # a stat on a cut-off mount ends within ping-timeout
                with contextlib.suppress(ProcessLookupError):
                    p.proc.kill()
                p.reap(5.0)
        self.probes.clear()

    async def heal(self, *, restart: bool = True) -> None:
        if self.g is not None and self.partitioned:
            ok, _why = await asyncio.to_thread(nem.set_link, self.g, True)
            self.partitioned = not ok
            await self._mount_back()
        if self.g is not None and self.monkey_on:
            await asyncio.to_thread(self._monkey_off)
        for node in self.nodes:
            if node.paused and node.daemon_pid:
                await asyncio.to_thread(node.machine.signal, node.daemon_pid, signal.SIGCONT)
                node.paused = False
                self.record("resume", node=node.name)
            if node.clock_offset:
                await self.set_clock(node, 0.0)
        for d in self.dirs[:1]:
            with contextlib.suppress(FileNotFoundError):
                (d / "jepsen-filler").unlink()
        for node in self.nodes:
            if restart and not node.up:
                await self.start_node(node)

    # ------------------------------------------------------------------ the run

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
            self.log("interrupted: undoing the faults, killing every node")
            await self._kill_all()
            raise
        finally:
            if self.signals is not None:
                self.signals.on_signal = None

    async def _kill_all(self) -> None:
        for node in self.nodes:
            await asyncio.to_thread(self._kill_processes, node)
        for node in self.nodes:
            if node.proc is not None:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(node.exited.wait(), 10)

    async def _main(self) -> tuple[bool, list[str]]:
        self.record(
            "params",
            ttl_us=int(self.c.ttl_s * SECOND),
            margin_us=int(self.c.margin_s * SECOND),
            fence=not self.c.unsafe_no_fence,
            # Beliefs are seen only as stdout messages reach the workers: an overlap measured
            # from them is reported, never judged (safety is judged on the records).
            assumptions_hold=False,
            window_slack_us=SECOND
            + (2 * int((self.c.margin_s + 5.0) * SECOND) if "clock" in self.c.nemesis else 0),
            fs=self.c.fs,
            fs_setup=self.fs_steps,
            nodes=self.c.nodes,
            shards=self.c.shards,
            seed=self.c.seed,
            nemesis=list(self.c.nemesis),
        )
        for node in self.nodes:
            if not await asyncio.to_thread(node.machine.write_clock, node.clock_file, 0.0):
                raise RuntimeError(
                    f"{node.host}: cannot write its clock file {node.clock_file} on "
                    f"{node.machine.label} (through {shlex.join(node.machine.command('...'))})"
                )
        for node in self.nodes:
            await self.start_node(node)
        self.record("phase", name="chaos")
        deadline = time.monotonic() + self.c.duration
        load = asyncio.create_task(self.load())
        chaos = asyncio.create_task(self.nemesis(deadline))
        try:
            await asyncio.wait_for(asyncio.shield(chaos), self.c.duration + 5)
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
            self.record("phase", name="heal")
            await self.heal(restart=not self.interrupted)
            remaining = deadline - time.monotonic()
            if remaining > 0 and not self.interrupted:
                await asyncio.sleep(remaining)
            self.stop_load.set()
            await load
            if self.ops and self.interrupted:
                for op in self.ops:
                    op.cancel()
            if self.ops:
                await asyncio.wait(list(self.ops), timeout=30)
        if chaos.done() and not chaos.cancelled() and chaos.exception() is not None:
            raise chaos.exception()  # type: ignore[misc]
        self.record("phase", name="liveness")
        drained, unfinished = await self.drain()
        for node in self.nodes:
            await self.stop_node(node)
        return drained, unfinished

    async def drain(self) -> tuple[bool, list[str]]:
        end = time.monotonic() + self.c.drain_timeout
        left = sorted(self.acked)
        while time.monotonic() < end:
            done = await asyncio.to_thread(finished_tasks, self.dirs[0])
            left = sorted(self.acked - done)
            if not left:
                return True, []
            await asyncio.sleep(1.0)
        return False, left


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
        from tests import glusterfs as gl  # the test suite's volume helpers

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
    """How to reach a `tests.glusterfs.GlusterVolume` (its CLI socket, mount A's link)."""
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
                for node in r.nodes:
                    r._kill_processes(node)
                for node in r.nodes:  # gone before their filesystem is unmounted
                    for pid in (node.daemon_pid, node.worker_pid):
                        if pid:
                            node.machine.wait_gone(pid, 5.0)
                r.undo_gluster()
                for m in {n.machine for n in r.nodes if n.machine.remote}:
                    m.remove_tree(r.remote_clock_dir)
            # read back before the filesystem goes (only when the run got this far)
            history = build_history(r.events, dirs[0], r.clocks)
        finally:
            undo_problems = undo()
    ended = now_us()
    with open(out / "history.jsonl", "w", encoding="utf-8") as f:
        for e in history:
            f.write(json.dumps(e, separators=(",", ":")) + "\n")
    report = check(history)
    problems = list(r.problems) + [f"taking the filesystem down: {p}" for p in undo_problems]
    if not drained:
        problems.append(
            f"the drain did not finish within {config.drain_timeout:g} s: "
            f"{len(unfinished)} acked task(s) unfinished"
        )
    by_kind: dict[str, int] = defaultdict(int)
    for fault in r.faults:
        by_kind[fault.name] += 1
    for kind in config.nemesis:
        if not by_kind.get(kind):
            problems.append(f"nemesis {kind} was asked for but never ran")
    return Outcome(
        config=config,
        history=history,
        report=report,
        faults=r.faults,
        out=out,
        problems=problems,
        started=started,
        ended=ended,
        drained=drained,
        unfinished=unfinished,
        fs_steps=fs_steps,
    )
