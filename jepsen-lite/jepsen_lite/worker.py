"""One jepsen-lite node: a process that runs the real SDK (`SnerdQueue`), which spawns one
`snerdmq` daemon, and reports everything it sees.

    python -m jepsen_lite.worker --dir DIR --env JSON

Commands arrive on stdin, one JSON object a line:

- `{"op": "enqueue", "task", "data", "max_retries", "group", "max_per_minute", "parents"}`:
  enqueue through the SDK (`parents` as `trigger_after_ids`); the outcome comes back as a
  `reply` event (`status` ok / fail / info).
- `{"op": "owned"}`: ask the daemon (`stats`) which shards it owns now; an `owned` event.
- `{"op": "unschedule", "name"}`: remove a schedule; a `scheduled` event.
- `{"op": "command", "message"}`: write a job-control line (`cancel`, `retry`, `pause`,
  `purge`, as `docs/protocol.md` has them) to the daemon as it is; its answer comes back as
  a `control` event.

Tasks are of type `t` or `u` (the enqueue's `type`): two types, so that a pause of one leaves
the other running. Both handlers are cancellable, as every handler of the SDK is.

With `--schedule NAME=CRON` the worker declares that schedule (type `t`, runs that succeed)
as it starts, every start: an app declaring its schedules at boot; a `scheduled` event says
the daemon's answer.

Events go to stdout, one JSON object a line, each with `t` (this host's wall clock, µs: the
run's true time when every process runs on one host; with `--hosts`, as good as the hosts'
clock synchronisation) and `ev`:

- `ready` (`pid`: the daemon's pid, `worker`: this process', `uname`: the machine's name)
  once the daemon is spawned;
- `membership` (`owned`: shard numbers) for each `membership` message of the daemon;
- `execute` / `handler_done` (`task`, `attempt`, `ok`) around each handler call;
- `dead_letter` (`task`, `error`: the reason of the daemon's `max_retries_reached`, such as
  `blocked_by_failed_parent: <id>`); `reply`; `owned`; `log` (daemon stderr lines of interest);
- `control` (`message`: the daemon's line as sent) for each answer to a job-control command
  (`cancelled`, `retried`, `paused`, `purged`, `requeued`) and each `error` naming a task
  (the refusal of a cancel or retry, or of an enqueue: the controller tells them apart);
- `daemon_exit` (`code`), after which this process exits.

stdin closing drains the daemon (`shutdown`) and exits. Each line is written with one
`write(2)`, so a kill -9 of this process loses no line already reported.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import anyio
import orjson

from snerd import DaemonExited, EnqueueError, SnerdError, current_task
from snerd.client import SnerdQueue
from snerd.sdk.control import REPLY_ACTIONS
from snerd.sdk.messages import check_control_message

#: Daemon stderr lines forwarded as `log` events (the rest stay in the worker's stderr file).
_LOG_MARKS = (
    "test clock",
    "No space",
    "ENOSPC",
    "disk full",
    "taking it over",
    "stops acting for it",
    "File descriptor in bad state",
    "Transport endpoint is not connected",
    "ERROR",
)
#: The task types a worker runs (`t`: the load's first type and the schedule's).
TASK_TYPES = ("t", "u")
#: Refusals whose enqueue may still have been stored: an `info`, not a `fail`.
_UNKNOWN_MARKS = ("may or may not", "changed owner")


def now_us() -> int:
    return time.time_ns() // 1000


def emit(event: dict[str, Any]) -> None:
    """One event line on stdout, with one write(2)."""
    event.setdefault("t", now_us())
    with contextlib.suppress(OSError):  # the controller is gone: nothing to report to
        os.write(1, orjson.dumps(event) + b"\n")


class RecordingQueue(SnerdQueue):
    """The SDK, also reporting each `membership` message as it arrives."""

    def _on_message(self, message: dict[str, Any]) -> None:
        if message.get("action") == "membership":
            owned = [
                int(s.split("-", 1)[1])
                for s in message.get("owned") or []
                if isinstance(s, str) and s.startswith("shard-")
            ]
            emit({"ev": "membership", "owned": owned, "version": message.get("version")})
        elif message.get("action") in REPLY_ACTIONS or (
            message.get("action") == "error" and isinstance(message.get("task_id"), str)
        ):
            emit({"ev": "control", "message": message})
        super()._on_message(message)


async def _handle(data: Any) -> None:
    info = current_task()
    attempt = info.attempt if info.attempt is not None else 0
    emit({"ev": "execute", "task": info.task_id, "attempt": attempt})
    ok = True
    try:
        if isinstance(data, dict):
            sleep = data.get("sleep", 0)
            if isinstance(sleep, int | float) and sleep > 0:
                await anyio.sleep(min(float(sleep), 5.0))
            fail = data.get("fail") or []
            ok = attempt not in fail
    finally:
        emit({"ev": "handler_done", "task": info.task_id, "attempt": attempt, "ok": ok})
    if not ok:
        raise RuntimeError(f"planned failure of attempt {attempt}")


async def _dead_letter(data: Any, error: str | None) -> None:
    # Called with the task's data and the final error: the controller puts the task id in
    # the data.
    task = data.get("id") if isinstance(data, dict) else None
    emit({"ev": "dead_letter", "task": str(task), "error": error})


async def _enqueue(q: SnerdQueue, cmd: dict[str, Any]) -> None:
    task = str(cmd["task"])
    reply: dict[str, Any] = {"ev": "reply", "task": task}
    try:
        done = await q.enqueue(
            task,
            str(cmd.get("type") or "t"),
            cmd.get("data"),
            max_retries=int(cmd.get("max_retries", 0)),
            rate_limit_group=cmd.get("group"),
            max_per_minute=cmd.get("max_per_minute"),
            trigger_after_ids=cmd.get("parents") or None,
        )
    except EnqueueError as exc:
        text = str(exc)
        unknown = any(m in text for m in _UNKNOWN_MARKS)
        reply.update(status="info" if unknown else "fail", error=text)
    except DaemonExited as exc:
        reply.update(status="info", error=str(exc))
    except SnerdError as exc:  # not running: never sent
        reply.update(status="fail", error=str(exc))
    else:
        shard = done.shard
        reply.update(
            status="ok",
            shard=int(shard.split("-", 1)[1]) if shard and shard.startswith("shard-") else None,
            deduplicated=done.deduplicated,
        )
    emit(reply)


async def _owned(q: SnerdQueue) -> None:
    try:
        stats = await q.stats(timeout=10)
    except (SnerdError, TimeoutError) as exc:
        emit({"ev": "owned", "owned": None, "error": str(exc)})
        return
    shards = []
    for entry in stats.get("per_shard") or []:
        name = entry.get("shard") if isinstance(entry, dict) else None
        if isinstance(name, str) and name.startswith("shard-"):
            shards.append(int(name.split("-", 1)[1]))
    emit({"ev": "owned", "owned": sorted(shards)})


async def _commands(q: SnerdQueue, tg: anyio.abc.TaskGroup) -> None:
    """Read commands from stdin until it closes."""
    stdin = sys.stdin.buffer
    while True:
        line = await anyio.to_thread.run_sync(stdin.readline, abandon_on_cancel=True)
        if not line:
            return
        try:
            cmd = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(cmd, dict):
            continue
        op = cmd.get("op")
        if op == "enqueue":
            tg.start_soon(_enqueue, q, cmd)
        elif op == "owned":
            tg.start_soon(_owned, q)
        elif op == "unschedule":
            tg.start_soon(_unschedule, q, str(cmd.get("name")))
        elif op == "command":
            _command(q, cmd.get("message"))


def _command(q: SnerdQueue, message: Any) -> None:
    """Write a job-control line to the daemon as the controller made it. Its answer is read
    by `RecordingQueue._on_message`, not waited for here: no SDK call waits on it."""
    if not isinstance(message, dict):
        return
    try:
        check_control_message(message)
    except SnerdError as exc:
        emit({"ev": "log", "line": f"command refused before sending: {exc}"})
        return
    q._post(message)


async def _declare(q: SnerdQueue, spec: str) -> None:
    """Declare the schedule `NAME=CRON`: its runs succeed at once, and catch up missed ticks
    (a run per tick, so the checker sees every tick)."""
    name, _, cron = spec.partition("=")
    try:
        done = await q.schedule(
            name, cron, "t", {"sleep": 0, "fail": []}, misfire="catch_up", catch_up=5,
            max_retries=2,
        )
        emit({"ev": "scheduled", "name": name, "result": done.result})
    except (SnerdError, TimeoutError) as exc:
        emit({"ev": "scheduled", "name": name, "error": str(exc)})


async def _unschedule(q: SnerdQueue, name: str) -> None:
    try:
        done = await q.unschedule(name)
        emit({"ev": "scheduled", "name": name, "result": done.result})
    except (SnerdError, TimeoutError) as exc:
        emit({"ev": "scheduled", "name": name, "error": str(exc)})


async def _watch_exit(q: SnerdQueue, stop: anyio.CancelScope) -> None:
    while q.exit_code is None:
        await anyio.sleep(0.05)
    await anyio.sleep(0.3)  # the SDK fails every waiting enqueue: let them report
    stop.cancel()


async def run(directory: str, env: dict[str, str], schedule: str | None = None) -> int:
    q = RecordingQueue(storage_path=directory, env=env, stderr_prefix="")
    for task_type in TASK_TYPES:
        q.register_handler(task_type, _handle)
        q.register_max_retry_handler(task_type, _dead_letter)

    @q.on_daemon_log
    def _log(line: str) -> None:
        if any(m in line for m in _LOG_MARKS):
            emit({"ev": "log", "line": line[:500]})

    await q.start_listening()
    emit({"ev": "ready", "pid": q.pid, "worker": os.getpid(), "uname": os.uname().nodename})
    drained = False
    async with anyio.create_task_group() as tg:
        tg.start_soon(_watch_exit, q, tg.cancel_scope)
        if schedule:
            tg.start_soon(_declare, q, schedule)
        await _commands(q, tg)
        drained = True
        with anyio.move_on_after(60):
            await q.shutdown()
        tg.cancel_scope.cancel()
    if not drained:
        # The daemon died under us (kill -9): let every waiting enqueue report, then go.
        with anyio.move_on_after(5):
            await q.shutdown()
    emit({"ev": "daemon_exit", "code": q.exit_code})
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jepsen_lite.worker")
    p.add_argument("--dir", required=True)
    p.add_argument("--env", default="{}", help="extra daemon environment, a JSON object")
    p.add_argument("--schedule", default=None, metavar="NAME=CRON", help="declare at start")
    args = p.parse_args(argv)
    env = {str(k): str(v) for k, v in orjson.loads(args.env).items()}
    return anyio.run(run, args.dir, env, args.schedule)


if __name__ == "__main__":
    sys.exit(main())
