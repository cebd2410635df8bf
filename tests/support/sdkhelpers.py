"""Helpers shared by the tests of the two faces, `SnerdQueue` (test_client) and `Engine`
(test_engine): the `run` fixture that runs a scenario under trio and under asyncio, `Calls` to
collect what handlers saw and wait for it, and `wait_for_stats` to poll a queue-side fact.

A test module takes the fixture with `from tests.support.sdkhelpers import run as run`
(pytest finds a fixture by its name in the module; the alias marks the import as meant).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.from_thread
import pytest

from snerd import Engine, SnerdQueue

Runner = Callable[..., None]


@pytest.fixture(params=["trio", "asyncio"])
def run(request: pytest.FixtureRequest) -> Runner:
    """Run `scenario(*args)` to completion on one backend, bounded in time."""

    def runner(scenario: Callable[..., Awaitable[None]], *args: Any, timeout: float = 30) -> None:
        async def main() -> None:
            with anyio.fail_after(timeout):
                await scenario(*args)

        anyio.run(main, backend=request.param)

    return runner


class Calls:
    """What handlers saw, with a way to wait until `n` things were seen."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self._waiters: list[tuple[int, anyio.Event]] = []

    def add(self, item: Any) -> None:
        self.items.append(item)
        for n, event in self._waiters:
            if len(self.items) >= n:
                event.set()

    def add_from_thread(self, item: Any) -> None:
        anyio.from_thread.run_sync(self.add, item)

    async def wait(self, n: int, timeout: float = 15) -> list[Any]:
        if len(self.items) < n:
            event = anyio.Event()
            self._waiters.append((n, event))
            with anyio.fail_after(timeout):
                await event.wait()
        return self.items


async def wait_for_stats(
    face: SnerdQueue | Engine, done: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """Poll stats until `done` (a daemon- or runtime-side fact with no event to await)."""
    with anyio.fail_after(10):
        while True:
            stats = await face.stats()
            if done(stats):
                return stats
            await anyio.sleep(0.02)
