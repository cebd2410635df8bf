"""A handler's return value, through both faces: `SnerdQueue` (a real daemon process) and
`Engine` (in-process). What a handler returns is stored on its task's tombstone and read back
from the log; a value that is not JSON, or too large, fails the attempt with a clear error.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from snerd import Engine, SnerdQueue
from snerd.core.records import scan
from snerd.core.shardlog import fold_records
from snerd.sdk.messages import result_message, result_value
from tests.support.sdkhelpers import Calls, Runner
from tests.support.sdkhelpers import run as run  # the fixture

Face = Callable[..., SnerdQueue | Engine]


def _queue(path: Path, env: dict[str, str]) -> SnerdQueue:
    return SnerdQueue(storage_path=path / "q", drain_timeout=5, env=env)


def _engine(path: Path, env: dict[str, str]) -> Engine:
    return Engine(path / "q", drain_timeout=5, env=env)


FACES = pytest.mark.parametrize("make", [_queue, _engine], ids=["SnerdQueue", "Engine"])


def stored_results(path: Path) -> dict[str, Any]:
    """Each completed task's stored result, read back from the log by the core's fold."""
    data = (path / "q" / "shard-0" / "tasks" / "tasks.log").read_bytes()
    fold = fold_records(scan(data).records)
    return {t: r.fields.get("snerdResult") for t, r in fold.finished.items()}


async def _returns_are_stored(make: Face, tmp_path: Path) -> None:
    done = Calls()
    async with make(tmp_path, {}) as q:

        @q.handler("async")
        async def on_async(data: Any) -> Any:
            done.add(data)
            return {"doubled": data["n"] * 2, "tags": ("a", "b")}

        def on_sync(data: Any) -> Any:
            done.add_from_thread(data)
            return [data, "sync"]

        q.register_handler("sync", on_sync)

        @q.handler("none")
        async def on_none(data: Any) -> None:
            done.add(data)

        await q.enqueue("a", "async", {"n": 21})
        await q.enqueue("s", "sync", 5)
        await q.enqueue("n", "none", 0)
        await done.wait(3)
    # (The tuple is JSON's array.)
    assert stored_results(tmp_path) == {
        "a": {"doubled": 42, "tags": ["a", "b"]},
        "s": [5, "sync"],
        "n": None,
    }


@FACES
def test_a_handlers_return_value_is_stored_on_its_tombstone(
    run: Runner, tmp_path: Path, make: Face
) -> None:
    run(_returns_are_stored, make, tmp_path)


async def _bad_values_fail(make: Face, tmp_path: Path) -> None:
    dead = Calls()
    async with make(tmp_path, {"SNERD_RESULT_MAX_BYTES": "64"}) as q:

        @q.handler("odd")
        async def odd(data: Any) -> Any:
            return {1, 2}  # a set: not JSON

        @q.handler("big")
        async def big(data: Any) -> Any:
            return "x" * 100

        @q.max_retry_handler("odd")
        @q.max_retry_handler("big")
        async def buried(data: Any, error: str | None) -> None:
            dead.add((data, error))

        await q.enqueue("o", "odd", "o", max_retries=0)
        await q.enqueue("b", "big", "b", max_retries=0)
        errors = dict(await dead.wait(2))
    assert errors["o"] is not None and errors["o"].startswith(
        "task o: result is not JSON-serialisable:"
    )
    assert errors["b"] == (
        "task b: result of 102 bytes exceeds the limit of 64 bytes (SNERD_RESULT_MAX_BYTES)"
    )
    assert stored_results(tmp_path) == {"o": None, "b": None}


@FACES
def test_a_return_value_not_json_or_too_large_fails_the_attempt(
    run: Runner, tmp_path: Path, make: Face
) -> None:
    run(_bad_values_fail, make, tmp_path)


def test_result_value_copies_checks_and_measures() -> None:
    kept = {"n": [1, 2]}
    value, error = result_value("t", kept, 100)
    assert (value, error) == ({"n": [1, 2]}, None)
    kept["n"].append(3)
    assert value == {"n": [1, 2]}  # a copy: the handler's later changes are not stored
    assert result_value("t", None, 1) == (None, None)
    deep: Any = 0
    for _ in range(127):
        deep = [deep]
    assert result_value("t", deep, 1 << 20)[1] is None
    too_deep = "task t: result is nested deeper than 127 levels"
    assert result_value("t", [deep], 1 << 20)[1] == too_deep
    # Beyond 64 bits: not JSON the daemon reads as an integer.
    assert result_value("t", 2**70, 100)[1] is not None


def test_a_result_message_carries_a_value_only_on_success() -> None:
    assert result_message("t", None, 2, [1]) == {
        "action": "result",
        "task_id": "t",
        "status": "success",
        "result": [1],
        "attempt": 2,
    }
    assert "result" not in result_message("t", None, None, None)
    assert "result" not in result_message("t", "boom", None, [1])
