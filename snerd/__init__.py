"""snerd: a background job queue with no server to run (a SnerdMQ-compatible daemon, SDK and
embedded engine).

The public faces are imported lazily (PEP 562 `__getattr__`): the daemon imports `snerd.core`
and `snerd.io` through this package and must not pay for, or depend on, the SDK and the engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from snerd.client import SnerdQueue
    from snerd.config import ConfigError
    from snerd.engine import Engine
    from snerd.io.datadir import DataDirectoryError
    from snerd.sdk.context import TaskInfo, current_task, yield_progress
    from snerd.sdk.errors import (
        ControlError,
        DaemonExited,
        DuplicateTaskId,
        EnqueueError,
        FinalError,
        QueueNotRunning,
        ScheduleError,
        SnerdError,
        TaskFailed,
    )
    from snerd.sdk.messages import (
        Cancelled,
        Enqueued,
        Paused,
        Retried,
        Scheduled,
        Swept,
        TaskDetails,
    )
    from snerd.sdk.producer import Producer, producer
    from snerd.sdk.tasks import TaskFunction

__all__ = [
    "Cancelled",
    "ConfigError",
    "ControlError",
    "DaemonExited",
    "DataDirectoryError",
    "DuplicateTaskId",
    "Engine",
    "EnqueueError",
    "Enqueued",
    "FinalError",
    "Paused",
    "Producer",
    "QueueNotRunning",
    "Retried",
    "ScheduleError",
    "Scheduled",
    "SnerdError",
    "SnerdQueue",
    "Swept",
    "TaskDetails",
    "TaskFailed",
    "TaskFunction",
    "TaskInfo",
    "current_task",
    "producer",
    "yield_progress",
]
__version__ = "0.1.0"

_LAZY = {
    "SnerdQueue": "snerd.client",
    "Engine": "snerd.engine",
    "ConfigError": "snerd.config",
    "DataDirectoryError": "snerd.io.datadir",
    "Producer": "snerd.sdk.producer",
    "producer": "snerd.sdk.producer",
    "Cancelled": "snerd.sdk.messages",
    "ControlError": "snerd.sdk.errors",
    "DaemonExited": "snerd.sdk.errors",
    "DuplicateTaskId": "snerd.sdk.errors",
    "EnqueueError": "snerd.sdk.errors",
    "FinalError": "snerd.sdk.errors",
    "TaskFunction": "snerd.sdk.tasks",
    "Enqueued": "snerd.sdk.messages",
    "QueueNotRunning": "snerd.sdk.errors",
    "ScheduleError": "snerd.sdk.errors",
    "Scheduled": "snerd.sdk.messages",
    "Paused": "snerd.sdk.messages",
    "Retried": "snerd.sdk.messages",
    "SnerdError": "snerd.sdk.errors",
    "Swept": "snerd.sdk.messages",
    "TaskDetails": "snerd.sdk.messages",
    "TaskFailed": "snerd.sdk.errors",
    "TaskInfo": "snerd.sdk.context",
    "current_task": "snerd.sdk.context",
    "yield_progress": "snerd.sdk.context",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'snerd' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
