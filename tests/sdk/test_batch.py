"""Bulk enqueue through both faces (`SnerdQueue`, a real daemon; `Engine`, in-process) and the
blocking producer: `enqueue_many` answers each task once, in order — acked, deduplicated, or
refused with the daemon's reason — a bad task refusing only itself; 10,000 tasks run once each;
and a mistake in the calling code (an unknown argument, no type) sends nothing."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import anyio
import pytest

from snerd import (
    DuplicateTaskId,
    Engine,
    Enqueued,
    EnqueueError,
    Producer,
    SnerdQueue,
    current_task,
)
from snerd.core.protocol import MAX_BATCH_TASKS
from tests.support.sdkhelpers import Runner
from tests.support.sdkhelpers import run as run  # the fixture

Face = Callable[[Path], SnerdQueue | Engine]
BULK = MAX_BATCH_TASKS + 500  # two lines


@pytest.fixture(params=["queue", "engine"])
def face(request: pytest.FixtureRequest) -> Face:
    if request.param == "queue":
        return lambda path: SnerdQueue(storage_path=path / "q", drain_timeout=3)
    return lambda path: Engine(path / "q", drain_timeout=3)


def test_a_bulk_runs_once_each_with_one_outcome_each(
    run: Runner, face: Face, tmp_path: Path
) -> None:
    async def scenario() -> None:
        ran: Counter[str] = Counter()
        done = anyio.Event()
        async with face(tmp_path) as queue:

            @queue.handler("t")
            async def t(data: dict[str, int]) -> None:
                ran[current_task().task_id] += 1
                if len(ran) == BULK:
                    done.set()

            outcomes = await queue.enqueue_many(
                {"task_id": f"b{i}", "task_type": "t", "data": {"i": i}} for i in range(BULK)
            )
            assert [o.task_id for o in outcomes] == [f"b{i}" for i in range(BULK)]
            assert all(isinstance(o, Enqueued) and o.deduplicated is False for o in outcomes)
            with anyio.fail_after(60):
                await done.wait()
        assert set(ran) == {f"b{i}" for i in range(BULK)}
        assert max(ran.values()) == 1

    run(scenario, timeout=120)


def test_each_task_is_answered_alone(run: Runner, face: Face, tmp_path: Path) -> None:
    later = timedelta(hours=1)  # tasks stay live: a twin, a pending id

    async def scenario() -> None:
        async with face(tmp_path) as queue:
            outcomes = await queue.enqueue_many([
                {"task_id": "a", "task_type": "t", "data": {"x": 1}, "auto_dedupe": True,
                 "execute_at": later},
                {"task_id": "bad", "task_type": "t", "max_retries": -1},
                {"task_id": "twin", "task_type": "t", "data": {"x": 1}, "auto_dedupe": True,
                 "execute_at": later},
                {"task_id": "a", "task_type": "t"},
                {"task_type": "t", "retry_after_hours": float("nan")},
                {"task_type": "t", "data": [1, 2]},
            ])
            a, bad, twin, again, nan, made = outcomes
            assert isinstance(a, Enqueued) and a.deduplicated is False
            assert isinstance(bad, EnqueueError) and bad.task_id == "bad"
            assert "max_retries must be 0 or more" in bad.message
            assert isinstance(twin, Enqueued)
            assert (twin.deduplicated, twin.duplicate_of) == (True, "a")
            assert isinstance(again, DuplicateTaskId)  # "a" was waiting for its ack here
            assert isinstance(nan, EnqueueError) and "finite" in nan.message
            assert isinstance(made, Enqueued) and len(made.task_id) == 32
            # A batch of one pending id, once "a" is stored: the daemon's refusal.
            (pending,) = await queue.enqueue_many([{"task_id": "a", "task_type": "t"}])
            assert isinstance(pending, EnqueueError) and "already pending" in pending.message
            with pytest.raises(TypeError, match="unexpected argument 'colour'"):
                await queue.enqueue_many([{"task_type": "t"}, {"task_type": "t", "colour": 1}])
            with pytest.raises(TypeError, match="needs a task_type"):
                await queue.enqueue_many([{"task_id": "x"}])
            assert (await queue.get("x")).found is False  # nothing was sent

    run(scenario)


def test_the_producer_writes_a_bulk_once_per_shard(tmp_path: Path) -> None:
    async def start_and_wait() -> None:
        ran: set[str] = set()
        done = anyio.Event()
        async with SnerdQueue(storage_path=tmp_path / "q", shards=2, max_local_shards=2,
                              drain_timeout=3) as queue:

            @queue.handler("t")
            async def t(data: dict[str, int]) -> None:
                ran.add(current_task().task_id)
                if len(ran) == 1000:
                    done.set()

            with anyio.fail_after(30):
                while not (tmp_path / "q" / "membership.json").exists():
                    await anyio.sleep(0.02)

            def produce() -> list[Enqueued | EnqueueError]:
                with Producer(tmp_path / "q") as p:
                    return p.enqueue_many(
                        [{"task_id": f"p{i}", "task_type": "t"} for i in range(1000)]
                        + [{"task_id": "bad", "task_type": "t", "cron": "often"}]
                    )

            outcomes = await anyio.to_thread.run_sync(produce)
            assert all(isinstance(o, Enqueued) for o in outcomes[:1000])
            assert {o.shard for o in outcomes[:1000]} == {"shard-0", "shard-1"}
            assert isinstance(outcomes[1000], EnqueueError)
            assert outcomes[1000].task_id == "bad"
            with anyio.fail_after(30):
                await done.wait()
        # One line per task in the producer's files: 1000 records in two files.
        lines = sum(
            f.read_bytes().count(b"\n")
            for f in (tmp_path / "q").glob("shard-*/inbox/producer-*.log")
        )
        assert lines == 1000

    anyio.run(start_and_wait)
