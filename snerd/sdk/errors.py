"""The exceptions snerd's SDK and engine raise: `SnerdError` and its seven kinds.

Owns: the public error types of both faces (`SnerdQueue`, `Engine`) and what each one means:
the daemon refused a call (`EnqueueError`, `ScheduleError`, `ControlError`, carrying the
daemon's own text), a task a caller waited for ended without succeeding (`TaskFailed`),
the daemon or runtime is gone (`DaemonExited`), the queue is not running (`QueueNotRunning`),
or this process asked twice at once (`DuplicateTaskId`).

It must never: import anything else of the SDK's (every other module of it raises these).
"""

from __future__ import annotations

__all__ = [
    "ControlError",
    "DaemonExited",
    "DuplicateTaskId",
    "EnqueueError",
    "FinalError",
    "QueueNotRunning",
    "ScheduleError",
    "SnerdError",
    "TaskFailed",
]


class SnerdError(RuntimeError):
    """Base of every error snerd's SDK and engine raise.

    A `RuntimeError` subclass, because the upstream Python SDK raised plain `RuntimeError` and
    code written for it catches that.

    Attributes:
        message: the text, for an `EnqueueError` exactly the daemon's.
        task_id: the task concerned, when there is one.
    """

    def __init__(self, message: str, *, task_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.task_id = task_id


class EnqueueError(SnerdError):
    """The daemon refused an enqueue (bad input, shutting down, disk full...); `message` is the
    daemon's `error` text, e.g. `Failed to enqueue: max_retries must be 0 or more, got -1`."""


class FinalError(SnerdError):
    """Raise it in a handler to fail the attempt for good: no retry, whatever attempts are
    left; the task goes to the dead letter queue with this error (the `result` says
    `"retry": false`). A task function's `never_retry` exceptions become one."""


class DaemonExited(SnerdError):
    """The daemon (or the engine's runtime) stopped before it answered."""


class QueueNotRunning(SnerdError):
    """The queue was never started, is shutting down, or has stopped."""


class DuplicateTaskId(SnerdError):
    """An enqueue with this task id is already waiting for its ack in this process. (Upstream
    SDKs silently dropped one of the two answers; the daemon itself refuses an id that is still
    pending once the first one is stored.)"""


class ScheduleError(SnerdError):
    """The daemon refused a `schedule` or `unschedule` (a bad expression or time zone, bad
    enqueue fields, shutting down, the log could not be written); `message` is the daemon's
    `error` text, e.g. `Failed to schedule: unknown timezone 'Mars/Olympus' (...)`.

    Attributes:
        name: the schedule's name.
    """

    def __init__(self, message: str, *, name: str) -> None:
        super().__init__(message)
        self.name = name


class ControlError(SnerdError):
    """The daemon refused a `cancel`, `retry`, `get`, `pause` or `resume` (a malformed id or
    type, shutting down, a dead letter that could not be read back); `message` is the
    daemon's `error` text, e.g. `Invalid JSON: field `task_id` must not be empty`."""


class TaskFailed(SnerdError):
    """`result()` waited for a task that ended without succeeding: dead-lettered after its
    last attempt, or cancelled.

    Attributes:
        state: `dead_letter` or `cancelled`.
        error: the last attempt's error text, when there was one.
    """

    def __init__(
        self, message: str, *, task_id: str, state: str, error: str | None = None
    ) -> None:
        super().__init__(message, task_id=task_id)
        self.state = state
        self.error = error
