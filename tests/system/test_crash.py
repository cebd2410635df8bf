"""Crash tests with real processes: kill -9 the daemon at random points while a producer
streams enqueues and handlers run; restart; nothing acknowledged is lost, nothing runs more
often than its attempts allow (crash re-executions aside), and the logs stay clean."""

from __future__ import annotations

import functools
import random
import signal
from pathlib import Path
from typing import Any

import pytest
import trio

from snerd.core.records import scan
from tests.support.daemon import Daemon

MAX_RETRIES = 2


def fold(directory: Path) -> dict[str, dict[str, Any]]:
    """The last task record of each task id across every shard log."""
    last: dict[str, dict[str, Any]] = {}
    for log in sorted(directory.glob("shard-*/tasks/tasks.log")):
        result = scan(log.read_bytes())
        assert result.corrupt == [], f"{log}: corrupt lines {result.corrupt}"
        for record in result.records:
            if "taskId" in record.fields and "snerdKind" not in record.fields:
                last[record.fields["taskId"]] = record.fields
    return last


def should_fail(task_id: str, attempt: int) -> bool:
    """Every fourth task fails its first attempt: retries happen across crashes too."""
    return attempt == 1 and int(task_id[1:]) % 4 == 0


async def run_round(
    d: Daemon,
    rng: random.Random,
    state: dict[str, Any],
    *,
    produce: bool,
    kill_after: float | None,
) -> None:
    """Produce, execute and (maybe) kill; returns when the daemon is gone or the work is done."""

    async def producer() -> None:
        while produce:
            for _ in range(rng.randint(1, 10)):
                task_id = f"k{state['next']}"
                state["next"] += 1
                state["sent"].add(task_id)
                await d.enqueue(task_id, max_retries=MAX_RETRIES)
            await trio.sleep(rng.uniform(0.001, 0.02))

    async def consumer() -> None:
        while True:
            m = await d.recv(timeout=30)
            if m["action"] == "ack" and "task_id" in m:
                state["acked"].add(m["task_id"])
            elif m["action"] == "execute":
                state["runs"].setdefault(m["task_id"], []).append(m["attempt"])
                ok = not should_fail(m["task_id"], m["attempt"])
                await d.send(
                    {
                        "action": "result",
                        "task_id": m["task_id"],
                        "status": "success" if ok else "error",
                        "error_msg": None if ok else "planned failure",
                    }
                )

    async with trio.open_nursery() as inner:
        inner.start_soon(producer)
        try:
            await d.recv()  # membership: the daemon owns its shards
            await d.send({"action": "register", "task_type": "t"})
            inner.start_soon(consumer)
            if kill_after is None:
                await trio.sleep_forever()
            await trio.sleep(kill_after)
        except (EOFError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            d.kill()
            inner.cancel_scope.cancel()
    await d.wait()


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_kill_9_at_random_points_loses_nothing_acked(
    tmp_path: Path, nursery: trio.Nursery, seed: int
) -> None:
    rng = random.Random(seed)
    q = tmp_path / "q"
    env = {"SNERD_SHARDS": str(rng.choice([1, 3]))}
    state: dict[str, Any] = {"next": 0, "sent": set(), "acked": set(), "runs": {}}
    for _ in range(5):
        d = await Daemon.start(nursery, q, env=env)
        with trio.move_on_after(20):
            await run_round(d, rng, state, produce=True, kill_after=rng.uniform(0.2, 0.8))
        assert d.proc.returncode == -signal.SIGKILL
    assert len(state["acked"]) > 20, "the producer hardly ran"
    # Heal: one more daemon runs everything that is left; it must drain the queue.
    d = await Daemon.start(nursery, q, env=env)
    with trio.move_on_after(90) as scope:
        async with trio.open_nursery() as inner:
            inner.start_soon(
                functools.partial(run_round, d, rng, state, produce=False, kill_after=None)
            )
            while True:
                await trio.sleep(0.5)
                last = await trio.to_thread.run_sync(fold, q)
                if all(last.get(t, {}).get("snerdOutcome") for t in state["acked"]) and all(
                    r.get("deletedAt") for r in last.values()
                ):
                    break
            inner.cancel_scope.cancel()
    if scope.cancelled_caught:
        last = fold(q)
        open_ids = sorted(t for t in state["acked"] if not last.get(t, {}).get("snerdOutcome"))
        live = sorted(t for t, r in last.items() if not r.get("deletedAt"))
        raise AssertionError(
            f"the healed daemon did not finish: {len(open_ids)} acked open, e.g. "
            f"{[(t, last.get(t), state['runs'].get(t)) for t in open_ids[:3]]}; "
            f"{len(live)} live: {live[:5]}; stderr: {d.stderr.decode()[-2000:]}"
        )
    last = fold(q)
    # At-least-once: every acknowledged task completed; nothing appeared that was not sent.
    for task_id in state["acked"]:
        assert last[task_id]["snerdOutcome"] == "completed", last[task_id]
    assert set(last) <= state["sent"]
    # Attempts: a crash may repeat an attempt number, but never skips one or goes past the
    # budget; a task that failed its first attempt ran a second.
    for task_id, attempts in state["runs"].items():
        distinct = sorted(set(attempts))
        assert distinct == list(range(1, len(distinct) + 1)), (task_id, attempts)
        assert distinct[-1] <= 1 + MAX_RETRIES, (task_id, attempts)
        if task_id in state["acked"] and should_fail(task_id, 1):
            assert 2 in distinct, (task_id, attempts)
