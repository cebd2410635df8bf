"""The per-attempt context a handler runs in: `current_task()` and `yield_progress()`.

Owns: `TaskInfo` (what a handler may ask about its attempt), the context variable that holds
the attempt a handler is running (`CURRENT_ATTEMPT`, set by the worker around the call), and the
two functions handlers call, which find their attempt there, from an async handler on the event
loop or from a sync handler in its worker thread.

It must never: know which face runs the handler (an attempt carries the function that posts
its messages), or keep an attempt past its handler's return.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio.from_thread

__all__ = [
    "CURRENT_ATTEMPT",
    "RunningAttempt",
    "TaskInfo",
    "current_task",
    "yield_progress",
]


@dataclass(frozen=True, slots=True)
class TaskInfo:
    """The attempt a handler is running, from `current_task()`."""

    task_id: str
    task_type: str
    #: 1 for the first attempt; None when the daemon did not say (upstream daemons).
    attempt: int | None = None
    max_execution_seconds: int | None = None


class RunningAttempt:
    """The attempt a handler runs, as `current_task()` and `yield_progress` find it. Its
    `TaskInfo` is made only when asked for (a frozen dataclass costs a call per field, on
    every `execute`).

    Attributes:
        post: sends one protocol message; call it on the event loop thread, `loop_thread`.
    """

    __slots__ = ("attempt", "limit", "loop_thread", "post", "task_id", "task_type")

    def __init__(
        self,
        task_id: str,
        task_type: str,
        attempt: int | None,
        limit: int | None,
        post: Callable[[dict[str, Any]], None],
        loop_thread: int,
    ) -> None:
        self.task_id = task_id
        self.task_type = task_type
        self.attempt = attempt
        self.limit = limit
        self.post = post
        self.loop_thread = loop_thread

    @property
    def info(self) -> TaskInfo:
        """This attempt as `current_task()` returns it."""
        return TaskInfo(self.task_id, self.task_type, self.attempt, self.limit)


#: The attempt whose handler runs in this context (None outside a handler).
CURRENT_ATTEMPT: contextvars.ContextVar[RunningAttempt | None] = contextvars.ContextVar(
    "snerd_current_task", default=None
)


def current_task() -> TaskInfo:
    """The task whose handler is calling.

    Raises:
        RuntimeError: called outside a task handler.
    """
    running = CURRENT_ATTEMPT.get()
    if running is None:
        raise RuntimeError("[Snerd] current_task() must be called within a task handler")
    return running.info


def yield_progress(data: Any) -> None:
    """Report progress of the running task; observers see it through `on_progress`.

    Works from async handlers and from sync handlers (in their worker thread). `data` is any
    JSON value; snerd passes it on unchanged (upstream daemons accept only strings).

    Raises:
        RuntimeError: called outside a task handler.
    """
    running = CURRENT_ATTEMPT.get()
    if running is None:
        raise RuntimeError("[Snerd] yield_progress must be called within a task handler context.")
    message = {"action": "progress", "task_id": running.task_id, "data": data}
    if threading.get_ident() == running.loop_thread:
        running.post(message)
    else:
        anyio.from_thread.run_sync(running.post, message)
