"""snerd through its Python SDK, `snerd.SnerdQueue`, as an application would use it.

`sdk_e2e`: a no-op async handler; up to `window` enqueues awaited concurrently (each `await
q.enqueue(...)` returns once the daemon acked it), until every job has run and `q.stats()`
reports an empty queue (every completion record durable). Jobs/s. Runs under asyncio (anyio's
default backend). The daemon's stderr, which the SDK relays, is kept out of the table.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import time
from typing import Any

from bench.common import Budget, Measurement, Rate, Scratch

__all__ = ["sdk_e2e"]


async def _run(directory: str, count: int, seconds: float, window: int) -> Rate:
    import anyio

    from snerd import SnerdQueue

    executed = 0
    target = -1
    all_done = anyio.Event()

    q = SnerdQueue(storage_path=os.path.join(directory, "data"), env={"SNERD_FSYNC": "always"})

    @q.handler("noop")
    async def noop(data: Any) -> None:
        nonlocal executed
        executed += 1
        if executed == target:
            all_done.set()

    async def drained() -> None:
        while (await q.stats())["queue_depth"]:
            await anyio.sleep(0.001)

    async with q:
        # Warm-up.
        target = 20
        for i in range(20):
            await q.enqueue(f"w{i}", "noop", {"n": i}, max_retries=0)
        with anyio.fail_after(30):
            await all_done.wait()
            await drained()
        executed, target, all_done = 0, -1, anyio.Event()

        budget = Budget(count, seconds / 2)
        sent = 0

        async def producer() -> None:
            nonlocal sent
            while budget.more(sent):
                i = sent
                sent += 1
                await q.enqueue(f"e{i}", "noop", {"n": i}, max_retries=0)

        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(window):
                tg.start_soon(producer)
        target = sent
        if executed >= target:
            all_done.set()
        with anyio.fail_after(120):
            await all_done.wait()
            await drained()
        elapsed = time.perf_counter() - start
    return Rate("sdk_e2e", sent, elapsed, f"{window} concurrent enqueues, asyncio")


def sdk_e2e(scratch: Scratch, count: int, seconds: float, window: int = 256) -> list[Measurement]:
    import anyio

    with scratch.directory("sdk-e2e") as d:
        relayed = io.StringIO()
        with contextlib.redirect_stderr(relayed):
            try:
                rate = anyio.run(_run, d, count, seconds, window)
            except BaseException:
                sys.stderr.write(relayed.getvalue()[-4000:])
                raise
    return [rate]
