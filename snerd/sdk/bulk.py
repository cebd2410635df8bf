"""Bulk enqueue on the faces: `enqueue_many`, in `enqueue_batch` lines (docs/protocol.md).

A mixin of `snerd.sdk.face.QueueFace`, which holds the state it uses (the enqueues waiting
for their acks), as `snerd.sdk.control.JobControl` is for job control: each task of a batch
waits for its own `ack` or `error`, matched by task id as a single enqueue's is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from snerd.core.protocol import MAX_BATCH_TASKS
from snerd.sdk.errors import DuplicateTaskId, EnqueueError, SnerdError
from snerd.sdk.messages import Enqueued, batch_message, task_spec_message
from snerd.sdk.signals import Signal, Waiter

__all__ = ["BulkEnqueue"]


class BulkEnqueue:
    """`enqueue_many` of `QueueFace`."""

    _pending: dict[str, Waiter]
    _accepting: bool
    _new_signal: Callable[[], Signal]

    if TYPE_CHECKING:

        def _post(self, message: dict[str, Any]) -> None: ...

        def _not_running_error(self) -> SnerdError: ...

    async def enqueue_many(
        self, tasks: Iterable[Mapping[str, Any]]
    ) -> list[Enqueued | SnerdError]:
        """Store many tasks at once: each a mapping of `enqueue`'s arguments by name
        (`task_type` required; `task_id` made when absent), sent in `enqueue_batch` lines
        of at most `MAX_BATCH_TASKS` (the daemon writes each line's tasks in one append
        per shard, one fsync each). Returns once every task is answered.

        Returns:
            Each task's outcome, in order: an `Enqueued`, or the error that refused it, not
            raised (a bad task refuses only itself): an `EnqueueError` with the daemon's text,
            or `DuplicateTaskId` for an id already waiting here.

        Raises:
            TypeError: a task with an argument `enqueue` does not have, or no `task_type`
                (nothing is sent).
            DaemonExited, QueueNotRunning: no daemon to answer.
        """
        outcomes: list[Enqueued | SnerdError | None] = []
        messages: list[tuple[int, dict[str, Any]]] = []
        for spec in tasks:
            try:
                messages.append((len(outcomes), task_spec_message(spec)))
                outcomes.append(None)
            except EnqueueError as exc:
                outcomes.append(exc)
        if not self._accepting:
            raise self._not_running_error()
        waiting: list[tuple[int, str, Waiter]] = []
        try:
            for start in range(0, len(messages), MAX_BATCH_TASKS):
                line = []
                for i, message in messages[start : start + MAX_BATCH_TASKS]:
                    task_id = message["task_id"]
                    if task_id in self._pending:
                        outcomes[i] = DuplicateTaskId(
                            f"[Snerd] An enqueue of task '{task_id}' is already waiting for "
                            "its ack", task_id=task_id)
                        continue
                    waiter = Waiter(self._new_signal())
                    self._pending[task_id] = waiter
                    waiting.append((i, task_id, waiter))
                    line.append(message)
                if line:
                    self._post(batch_message(line))
            for i, _task_id, waiter in waiting:
                await waiter.event.wait()
                if waiter.error is not None and not isinstance(waiter.error, EnqueueError):
                    raise waiter.error  # the daemon is gone: no task's answer is known
                outcomes[i] = waiter.error if waiter.error is not None else waiter.value
        finally:
            for _i, task_id, waiter in waiting:
                if self._pending.get(task_id) is waiter:
                    del self._pending[task_id]
        return [o for o in outcomes if o is not None]
