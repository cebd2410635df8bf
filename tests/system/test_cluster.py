"""A cluster of real daemons on one queue directory under faults: kill -9, SIGSTOP past the
lease, SIGTERM, new daemons joining. Every acked task runs at least once, no shard's log accepts
a record from another node's epoch, and the spread ends even.

The test is each daemon's SDK: it registers a handler, answers every `execute`, and sends each
enqueue to the next running daemon in turn, whichever shards it owns (every daemon accepts
enqueues: a task for a shard it does not own goes through its inbox to the owner), trying
another daemon when one refuses or is gone.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from pathlib import Path

import trio

from snerd.core.records import scan
from tests.support.daemon import Daemon

SHARDS = 10
TASKS = 5000
ENV = {
    "SNERD_SHARDS": str(SHARDS),
    "SNERD_LEASE_TTL": "1.5",
    "SNERD_CLOCK_SKEW_MARGIN": "0.25",
    "SNERD_DRAIN_TIMEOUT": "2",
}


class Cluster:
    def __init__(self, nursery: trio.Nursery, directories: Path | Sequence[Path]) -> None:
        """`directories`: the queue directory, or the same directory as each daemon sees it
        (two mounts of one shared filesystem), taken in turn by the daemons as they start."""
        self.nursery = nursery
        self.directories = [directories] if isinstance(directories, Path) else list(directories)
        self.daemons: dict[str, Daemon] = {}
        #: What each daemon announced it owns (its latest `membership` message).
        self.owned: dict[str, list[int]] = {}
        self.acked: set[str] = set()
        self.executed: dict[str, int] = {}
        self.unanswered: dict[str, str] = {}  # task id -> daemon it was sent to
        self.changed = trio.Event()
        self.turn = 0

    async def start(self, name: str) -> Daemon:
        directory = self.directories[len(self.daemons) % len(self.directories)]
        d = await Daemon.start(self.nursery, directory, env=ENV)
        self.daemons[name] = d
        self.owned[name] = []
        await d.send({"action": "register", "task_type": "t"})
        self.nursery.start_soon(self._serve, name, d)
        return d

    async def _serve(self, name: str, d: Daemon) -> None:
        try:
            while True:
                m = await d.recv(timeout=120)
                action = m.get("action")
                if action == "membership":
                    self.owned[name] = [int(s.split("-")[1]) for s in m["owned"]]
                elif action == "execute":
                    task = m["task_id"]
                    self.executed[task] = self.executed.get(task, 0) + 1
                    reply = {"action": "result", "task_id": task, "status": "success"}
                    reply["attempt"] = m["attempt"]
                    await d.send(reply)
                elif action == "ack" and "task_id" in m:
                    self.acked.add(m["task_id"])
                    self.unanswered.pop(m["task_id"], None)
                elif action == "error" and "task_id" in m:
                    self.unanswered.pop(m["task_id"], None)
                self.changed.set()
                self.changed = trio.Event()
        except (EOFError, trio.BrokenResourceError, trio.ClosedResourceError):
            self.owned[name] = []
            for task, where in list(self.unanswered.items()):
                if where == name:
                    del self.unanswered[task]  # outcome unknown (`info`): not required

    def next_daemon(self, stopped: set[str]) -> str | None:
        """The next daemon in turn that is neither stopped nor gone."""
        names = [n for n in self.daemons if n not in stopped and self.daemons[n].alive]
        if not names:
            return None
        self.turn += 1
        return names[self.turn % len(names)]

    async def enqueue(self, task: str, stopped: set[str]) -> None:
        """Send `task` to the next running daemon until one acks it (or its fate is unknown)."""
        while task not in self.acked:
            target = self.next_daemon(stopped)
            if target is None or task in self.unanswered:
                await self.changed.wait()
                continue
            self.unanswered[task] = target
            try:
                await self.daemons[target].enqueue(task)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self.unanswered.pop(task, None)
            with trio.move_on_after(5):
                while task in self.unanswered:
                    await self.changed.wait()
            if task not in self.acked:
                await trio.sleep(0.05)  # refused (draining, say): try another


def epoch_report(directory: Path) -> list[str]:
    """Problems with epochs in the shard logs: a claim epoch not above the previous claims of
    other nodes, or an accepted record written under an epoch another node claimed."""
    problems = []
    for log in sorted(directory.glob("shard-*/tasks/tasks.log")):
        result = scan(log.read_bytes())
        assert result.corrupt == [], f"{log}: corrupt lines {result.corrupt}"
        fence, claimed_by = 0, {}
        for record in result.records:
            f = record.fields
            epoch = f.get("epoch") if f.get("snerdKind") == "claim" else f.get("snerdEpoch")
            if not isinstance(epoch, int):
                continue
            if f.get("snerdKind") == "claim":
                owner = claimed_by.setdefault(epoch, f.get("node"))
                if owner != f.get("node") or (epoch < fence):
                    problems.append(f"{log}: claim of epoch {epoch} by {f.get('node')} at "
                                    f"{record.offset} after {claimed_by} / fence {fence}")
                fence = max(fence, epoch)
            elif epoch >= fence and claimed_by.get(epoch) not in (None, f.get("snerdNode")):
                problems.append(f"{log}: accepted record at {record.offset} by "
                                f"{f.get('snerdNode')} under epoch {epoch} of {claimed_by[epoch]}")
    return problems


async def run_scenario(
    c: Cluster, a: Daemon, b: Daemon, d3: Daemon, stopped: set[str], within: float = 60
) -> None:
    async def produce() -> None:
        async with trio.open_nursery() as inner:
            for i in range(TASKS):
                inner.start_soon(c.enqueue, f"k{i}", stopped)
                if i % 20 == 0:
                    await trio.sleep(0.02)

    async def faults() -> None:
        await trio.sleep(0.4)
        a.kill()  # kill -9: its shards are taken over, its unfinished tasks run again
        stopped.add("a")
        await trio.sleep(0.3)
        b.signal(signal.SIGSTOP)  # longer than the lease: others claim, then it steps down
        stopped.add("b")
        await trio.sleep(3.0)
        b.signal(signal.SIGCONT)
        stopped.discard("b")
        d3.signal(signal.SIGTERM)  # drains and hands its shards over
        stopped.add("c")
        await c.start("d")
        await c.start("e")

    with trio.fail_after(within):
        async with trio.open_nursery() as work:
            work.start_soon(produce)
            work.start_soon(faults)
        assert await d3.wait() == 0
        # Every acked task runs at least once (the cluster heals meanwhile).
        while not c.acked <= set(c.executed):
            await c.changed.wait()
        # The spread settles: b, d and e share the 10 shards as 4, 3, 3.
        while sorted(len(c.owned[n]) for n in ("b", "d", "e")) != [3, 3, 4] or sorted(
            s for n in ("b", "d", "e") for s in c.owned[n]
        ) != list(range(SHARDS)):
            await c.changed.wait()


async def run_chaos(
    nursery: trio.Nursery, directories: Path | Sequence[Path], within: float = 60
) -> None:
    """Three daemons, then `run_scenario`'s faults and joins, then a drain of the survivors and
    the epoch check of the shard logs. `directories` as for Cluster. `within`: seconds the
    scenario may take until every acked task ran and the shards are spread (a bound against
    hanging, not a measure of speed)."""
    c = Cluster(nursery, directories)
    a = await c.start("a")
    b = await c.start("b")
    d3 = await c.start("c")
    stopped: set[str] = set()
    with trio.fail_after(30):
        while sum(len(v) for v in c.owned.values()) < SHARDS:
            await c.changed.wait()

    try:
        await run_scenario(c, a, b, d3, stopped, within)
    except trio.TooSlowError:
        missing = sorted(c.acked - set(c.executed))
        raise AssertionError(
            f"stuck: owned {c.owned}; acked {len(c.acked)}, never run {missing[:10]}; "
            f"daemon stderr: "
            + " || ".join(f"{n}: {d.stderr.decode()[-1500:]}" for n, d in c.daemons.items())
        ) from None
    assert len(c.acked) > TASKS // 2  # most enqueues were acked despite the faults
    for d in (b, c.daemons["d"], c.daemons["e"]):
        await d.close_stdin()
        assert await d.wait() == 0
    assert epoch_report(c.directories[0]) == []
    # Most tasks reached their shard through another daemon's inbox.
    via = {
        record.fields["taskId"]
        for log in c.directories[0].glob("shard-*/tasks/tasks.log")
        for record in scan(log.read_bytes()).records
        if "snerdVia" in record.fields
    }
    assert len(via) > len(c.acked) // 3, (len(via), len(c.acked))


async def test_a_cluster_survives_kill_stop_and_drain_and_runs_every_acked_task(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    await run_chaos(nursery, tmp_path / "q")
