"""The runtime in-process: whatever one task carries, a failure while carrying out its effects
(its `execute`, its webhook call, its dead letter) fails that task, never the runtime."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import trio

from snerd.config import load_settings
from snerd.core import events as ev
from snerd.io.runtime import Runtime


class _PickyPeer:
    """A peer that cannot take any message about the task `poison` (as when a record from an
    older version holds what no encoder takes); it keeps the rest, and the runtime's log."""

    def __init__(self) -> None:
        self.out: list[dict[str, Any]] = []
        self.logged: list[str] = []
        self._changed = trio.Event()

    def deliver(self, message: dict[str, Any]) -> None:
        if message.get("task_id") == "poison" and message["action"] != "ack":
            raise TypeError("cannot encode this task's message")
        self.out.append(message)
        self._changed.set()

    def deliver_lines(self, data: bytes) -> None:
        self.out.extend(orjson.loads(line) for line in data.splitlines())
        self._changed.set()

    async def wait_for(self, done: Callable[[], bool]) -> None:
        """Until `done()` holds, looked at after each message (no polling: the messages wait
        for the log's real fsyncs)."""
        while not done():
            self._changed = trio.Event()
            await self._changed.wait()

    def flush_nowait(self) -> None:
        pass

    async def flush(self) -> None:
        pass

    def log(self, level: str, message: str) -> None:
        self.logged.append(f"{level}: {message}")


def _line(**fields: Any) -> bytes:
    return orjson.dumps(fields)


def _enqueue(task_id: str, **options: Any) -> bytes:
    return _line(
        action="enqueue",
        task_id=task_id,
        task_type="noop",
        task_data="{}",
        max_retries=1,
        retry_after_hours=0,
        **options,
    )


async def _stats(runtime: Runtime, peer: _PickyPeer) -> dict[str, Any]:
    before = len(peer.out)
    runtime.feed([ev.LinesReceived(lines=[_line(action="stats")])])
    await peer.wait_for(lambda: any(m["action"] == "stats" for m in peer.out[before:]))
    return next(m for m in peer.out[before:] if m["action"] == "stats")


async def test_a_task_whose_execute_cannot_be_sent_dead_letters_and_the_runtime_runs_on(
    tmp_path: Path,
) -> None:
    # Before, the exception left `_execute_task`, and the runtime (the daemon) died of it; the
    # task stayed in the log, so the next daemon to take the shard died too.
    peer = _PickyPeer()
    runtime = Runtime(tmp_path, load_settings({}), peer)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(runtime.run)
        with trio.fail_after(20):
            await runtime.ready.wait()
            runtime.feed(
                [
                    ev.LinesReceived(
                        lines=[
                            _line(action="register", task_type="noop"),
                            _enqueue("poison"),
                            _enqueue("fine"),
                        ]
                    )
                ]
            )
            await peer.wait_for(
                lambda: any(
                    m.get("task_id") == "fine" and m["action"] == "execute" for m in peer.out
                )
            )
            runtime.feed(
                [ev.LinesReceived(lines=[_line(action="result", task_id="fine", status="success")])]
            )
            # The counters change as the log commits the retries' records (real fsyncs in the
            # writer thread), and no message marks the moment: look again every 10 ms.
            while (stats := await _stats(runtime, peer))["total_dlq"] < 1 or stats["queue_depth"]:
                await trio.sleep(0.01)
        assert stats["total_failed"] == 2  # both attempts of `poison`
        assert any("task poison: cannot send its dead letter" in line for line in peer.logged), (
            peer.logged
        )
        runtime.submit(ev.DrainRequested(reason="test"))
