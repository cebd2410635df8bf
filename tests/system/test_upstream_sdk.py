"""The real upstream Python SDK (snerdmq-python 0.4.2, from PyPI) driving snerd's daemon.

The proof that existing SnerdMQ SDKs run snerd unchanged: the SDK is used exactly as its README
shows, pointed at our `snerdmq` through its `binary_path` argument. It is asyncio-only, so these
tests run plain `asyncio.run` inside sync test functions (pytest-trio's trio_mode leaves those
alone).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from snerdmq import SnerdQueue as UpstreamQueue

from snerd.client import default_binary


@pytest.fixture(autouse=True)
def short_drain(monkeypatch: pytest.MonkeyPatch) -> None:
    # The upstream SDK passes its own environment on to the daemon.
    monkeypatch.setenv("SNERD_DRAIN_TIMEOUT", "5")


async def _wait(event: asyncio.Event, timeout: float = 15) -> None:
    await asyncio.wait_for(event.wait(), timeout)


def test_register_enqueue_run_shutdown(tmp_path: Path) -> None:
    async def main() -> None:
        q = UpstreamQueue(binary_path=default_binary(), storage_path=str(tmp_path / "q"))
        seen: list[Any] = []
        done = asyncio.Event()

        async def send_email(data: Any) -> None:
            seen.append(data)
            q.yield_progress({"sent": data["to"]})  # an object: snerd accepts any JSON value
            done.set()

        q.register_handler("email", send_email)
        await q.start_listening()
        await q.enqueue("e1", "email", {"to": "ada@example.com"})
        await _wait(done)
        assert seen == [{"to": "ada@example.com"}]

        # A refused enqueue raises the daemon's text (upstream left such calls hanging).
        with pytest.raises(RuntimeError, match="max_retries must be 0 or more"):
            await asyncio.wait_for(q.enqueue("bad", "email", {}, max_retries=-1), 5)

        # Registered after the start, like upstream's examples do.
        late = asyncio.Event()

        async def on_late(data: Any) -> None:
            late.set()

        q.register_handler("late", on_late)
        await q.enqueue("l1", "late", {"when": "now"})
        await _wait(late)

        started = time.monotonic()
        await q.shutdown()
        assert q.process is not None and q.process.returncode == 0
        assert time.monotonic() - started < 4  # nothing in flight: no drain wait

    asyncio.run(main())


def test_retries_and_dead_letter(tmp_path: Path) -> None:
    async def main() -> None:
        q = UpstreamQueue(binary_path=default_binary(), storage_path=str(tmp_path / "q"))
        attempts: list[Any] = []
        dead: list[Any] = []
        buried = asyncio.Event()

        async def flaky(data: Any) -> None:
            attempts.append(data)
            raise RuntimeError("smtp down")

        async def on_dead(data: Any) -> None:
            dead.append(data)
            buried.set()

        q.register_handler("flaky", flaky)
        q.register_max_retry_handler("flaky", on_dead)
        await q.start_listening()
        await q.enqueue("f1", "flaky", {"n": 1}, max_retries=2)
        await _wait(buried)
        assert attempts == [{"n": 1}] * 3
        assert dead == [{"n": 1}]
        await q.shutdown()
        assert q.process is not None and q.process.returncode == 0

    asyncio.run(main())


def test_result_sent_during_drain_is_kept(tmp_path: Path) -> None:
    """Upstream's daemon died on the first line read during a drain, losing the very result it
    was waiting for (reference §1.5). snerd keeps reading: the result lands, the daemon exits
    as soon as it does, and the task does not run again after a restart."""

    async def main() -> None:
        path = str(tmp_path / "q")
        q = UpstreamQueue(binary_path=default_binary(), storage_path=path)
        running = asyncio.Event()
        release = asyncio.Event()
        runs: list[Any] = []

        async def slow(data: Any) -> None:
            runs.append(data)
            running.set()
            await release.wait()

        q.register_handler("slow", slow)
        await q.start_listening()
        await q.enqueue("s1", "slow", {"once": True})
        await _wait(running)
        stopping = asyncio.create_task(q.shutdown())
        await asyncio.sleep(0.3)  # SIGTERM delivered; no event in the upstream SDK to await
        assert not stopping.done()  # the daemon is draining, waiting for our result
        started = time.monotonic()
        release.set()
        await asyncio.wait_for(stopping, 10)
        assert time.monotonic() - started < 3  # well before the 5 s drain timeout
        assert q.process is not None and q.process.returncode == 0

        q2 = UpstreamQueue(binary_path=default_binary(), storage_path=path)
        ran_again: list[Any] = []
        sentinel = asyncio.Event()

        async def slow_again(data: Any) -> None:
            ran_again.append(data)
            if data == "sentinel":
                sentinel.set()

        q2.register_handler("slow", slow_again)
        await q2.start_listening()
        await q2.enqueue("sentinel", "slow", "sentinel")
        await _wait(sentinel)
        assert ran_again == ["sentinel"]  # FIFO: a pending s1 would have run first
        await q2.shutdown()
        assert runs == [{"once": True}]

    asyncio.run(main())
