"""Several real daemons on one queue directory, each with the test as its SDK (`Daemons`):
started with a short lease, the shards shared out, every message taken in order, and every
`execute` answered; `until` waits on what the messages say, not on time. The tests of
features that span daemons (tests/system/test_dependencies.py, test_dedupe.py,
test_schedules.py) build on it, each keeping what it sees in its own form (`_take`,
`_answer`)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import trio

from snerd.core.records import scan
from tests.support.daemon import Daemon

__all__ = ["SHORT_LEASE", "Daemons"]

#: A short lease (rounds every 0.5 s) so that shares settle quickly.
SHORT_LEASE = {
    "SNERD_LEASE_TTL": "1.5",
    "SNERD_CLOCK_SKEW_MARGIN": "0.25",
    "SNERD_DRAIN_TIMEOUT": "2",
}


class Daemons:
    """Daemons on one directory, by name; `owned` is what each last said it owns."""

    def __init__(self, nursery: trio.Nursery, directory: Path, shards: int, **env: str) -> None:
        self.nursery = nursery
        self.directory = directory
        self.shards = shards
        self.env = {**SHORT_LEASE, "SNERD_SHARDS": str(shards), **env}
        self.daemons: dict[str, Daemon] = {}
        self.owned: dict[str, set[int]] = {}
        self.seen: list[Any] = []
        #: Tasks whose `execute` is not answered (see `_answer`).
        self.hold: set[str] = set()
        self._changed = trio.Event()
        self._ids = itertools.count()

    # -- running

    async def start(self, *names: str, types: Sequence[str] = ("t",)) -> None:
        """Start a daemon per name, each registering `types`, and wait until they share the
        shards evenly (each owns shards / daemons of them, and every shard is owned)."""
        for name in names:
            d = await Daemon.start(self.nursery, self.directory, env=self.env)
            self.daemons[name] = d
            self.owned[name] = set()
            for task_type in types:
                await d.send({"action": "register", "task_type": task_type})
            self.nursery.start_soon(self._serve, name, d)
        share = self.shards // len(self.daemons)
        await self.until(
            lambda: all(len(o) == share for o in self.owned.values())
            and set().union(*self.owned.values()) == set(range(self.shards)),
            timeout=20,
        )

    async def _serve(self, name: str, d: Daemon) -> None:
        try:
            while True:
                m = await d.recv(timeout=120)
                if m.get("action") == "membership":
                    self.owned[name] = {int(s.split("-")[1]) for s in m["owned"]}
                self._take(name, m)
                if m.get("action") == "execute":
                    await self._answer(name, d, m)
                self._changed.set()
                self._changed = trio.Event()
        except (EOFError, trio.BrokenResourceError, trio.ClosedResourceError):
            self.owned[name] = set()

    def _take(self, name: str, m: dict[str, Any]) -> None:
        """Keep what a message says (each test in its own form)."""
        self.seen.append((name, m))

    async def _answer(self, name: str, d: Daemon, m: dict[str, Any]) -> None:
        """Answer an `execute`: a success, unless its task is held (then never)."""
        if m["task_id"] in self.hold:
            return
        reply = {"action": "result", "task_id": m["task_id"], "status": "success"}
        await d.send({**reply, "attempt": m["attempt"]})
        self.seen.append((name, {"action": "done", "task_id": m["task_id"]}))

    async def until(self, done: Callable[[], bool], timeout: float = 10) -> None:
        """Wait until `done()` holds, looked at after each message; fail with the daemons'
        stderr when it does not within `timeout` seconds."""
        try:
            with trio.fail_after(timeout):
                while not done():
                    await self._changed.wait()
        except trio.TooSlowError:
            raise AssertionError(self.report("timed out")) from None

    def report(self, what: str) -> str:
        tails = " || ".join(f"{n}: {d.stderr.decode()[-1200:]}" for n, d in self.daemons.items())
        return f"{what}; owned {self.owned}; seen {self.seen[-30:]}; stderr: {tails}"

    async def stop(self) -> None:
        """Drain every daemon still running; each must exit 0."""
        alive = [d for d in self.daemons.values() if d.alive]
        for d in alive:
            await d.close_stdin()
        for d in alive:
            assert await d.wait() == 0, self.report("a daemon failed its drain")

    # -- the files

    def records(self) -> list[Any]:
        """Every record of every shard log, shard by shard."""
        return [
            record
            for log in sorted(self.directory.glob("shard-*/tasks/tasks.log"))
            for record in scan(log.read_bytes()).records
        ]
