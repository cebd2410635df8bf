"""Job control from the SDK: `cancel`, `retry`, `pause` / `resume`, the sweeps (`purge`,
`retry_dead` and their `_all` forms), `get` and `result`, and matching the daemon's replies
to the calls that asked (`JobControl`, a part of `QueueFace`).

A control line is checked by the daemon's own parser before it is sent
(`messages.check_control_message`); each call waits on a `Waiter` filed under the key its
reply will carry (`messages.request_key` / `reply_key`: the task id, the type and direction
of a pause, or the kind, type and cutoff of a sweep), oldest first, so two calls about one
task (or two identical sweeps) each get one answer and a call that gave up still takes its
own. A refusal that names a task (a retry the owner could
not carry out, a command refused while the daemon drains) fails the oldest such call.
"""

from __future__ import annotations

import datetime as dt
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio

from snerd.sdk.errors import ControlError, SnerdError, TaskFailed
from snerd.sdk.messages import (
    Cancelled,
    Paused,
    ReplyKey,
    Retried,
    Swept,
    TaskDetails,
    cancelled_from_reply,
    check_control_message,
    control_message,
    details_from_reply,
    pause_message,
    paused_from_reply,
    reply_key,
    request_key,
    retried_from_reply,
    sweep_message,
    swept_from_reply,
)
from snerd.sdk.signals import Signal, Waiter

__all__ = ["REPLY_ACTIONS", "JobControl"]

#: How the daemon's refusal of a control command while it drains ends (its text is
#: `[Snerd] Daemon is shutting down; command rejected`, snerd.core.node.control), and how a
#: refused retry begins: an `error` that names a task but answers no enqueue.
_COMMAND_REJECTED = "; command rejected"
_RETRY_REFUSED = "Failed to retry:"
#: Each control reply as its value.
_REPLY_VALUE: dict[str, Callable[[dict[str, Any]], Any]] = {
    "cancelled": cancelled_from_reply,
    "retried": retried_from_reply,
    "paused": paused_from_reply,
    "purged": swept_from_reply,
    "requeued": swept_from_reply,
    "task": details_from_reply,
}
#: The replies that name no task: a refusal without a task id fails the oldest such call.
_WHOLE_QUEUE_REPLIES = ("paused", "purged", "requeued")
#: The actions of the daemon's replies to control calls (`JobControl._on_control_reply`).
REPLY_ACTIONS = frozenset(_REPLY_VALUE)
#: `result()`'s polls of `get`: the first after this many seconds, each later one after
#: twice the wait before, up to the most.
_RESULT_POLL_FIRST_S = 0.05
_RESULT_POLL_MOST_S = 1.0


class JobControl:
    """The job-control calls of `QueueFace` (which holds the state they use)."""

    _control_waiters: dict[ReplyKey, deque[Waiter]]
    _accepting: bool
    _new_signal: Callable[[], Signal]

    if TYPE_CHECKING:

        def _post(self, message: dict[str, Any]) -> None: ...

        def _not_running_error(self) -> SnerdError: ...

    async def cancel(self, task_id: str) -> Cancelled:
        """Cancel a task, whichever daemon of the directory owns its shard.

        A task that waits (queued, delayed, blocked, retrying) never starts; a running one
        ends as `cancelled` at once (not retried, not dead-lettered) and its handler is
        stopped: an async handler's scope is cancelled where it awaits; a sync handler cannot
        be stopped in its thread, so it runs to its end and what it returns is dropped.
        Children waiting on it (`trigger_after_ids`) fail, as they do after a dead letter.

        Returns:
            `Cancelled(task_id, found, cancelled, shard, pending)`: `found` is the state the
            task was in (`unknown` when no shard's owner holds it, `succeeded`,
            `dead_letter` or `cancelled` when it had ended: nothing changes); `pending`
            when no owner answered within the daemon's wait (the command is durable and is
            applied when one does).

        Raises:
            ControlError: the daemon refuses it (an empty id, say); `message` is its text.
            DaemonExited, QueueNotRunning: no daemon to ask.
        """
        answer: Cancelled = await self._control(control_message("cancel", task_id))
        return answer

    async def retry(self, task_id: str) -> Retried:
        """Put a dead-lettered (or cancelled) task back in the queue, attempts reset, its
        history kept, while the daemons run.

        Returns:
            `Retried(task_id, found, retried, shard, pending)`: `retried` is True when it is
            queued again; a live task (`found` `queued`, `running`...), a succeeded one or an
            `unknown` id is left as it is. `pending` as for `cancel`.

        Raises:
            ControlError: the daemon refuses it (an empty id; a dead letter whose record
                cannot be read back); `message` is its text.
            DaemonExited, QueueNotRunning: no daemon to ask.
        """
        answer: Retried = await self._control(control_message("retry", task_id))
        return answer

    async def pause(self, task_type: str) -> Paused:
        """Stop dispatching tasks of `task_type` on every daemon of the directory, durably
        (a restart keeps it) until `resume`. Running attempts finish; enqueues are still
        taken. A type no task has yet may be paused too (its tasks wait once they come).

        Returns:
            `Paused(task_type, True, shards, pending)`: `pending` names the shards whose
            owner had not applied it within the daemon's wait (it is durable in their
            inboxes; they apply it when they read them).

        Raises:
            ControlError: the daemon refuses it (an empty type); `message` is its text.
            DaemonExited, QueueNotRunning: no daemon to ask.
        """
        answer: Paused = await self._control(pause_message(task_type, True))
        return answer

    async def resume(self, task_type: str) -> Paused:
        """Undo `pause(task_type)`: its tasks are dispatched again. The latest of a pause
        and a resume wins on every shard, whichever order they reach it in.

        Returns, raises: as `pause` (`paused` False).
        """
        answer: Paused = await self._control(pause_message(task_type, False))
        return answer

    async def pause_all(self) -> Paused:
        """Pause the whole queue (every type), as `pause` does one type. A pause of the
        queue and of a type are two marks: `resume_all` does not resume a type paused on its
        own. (A separate method, not `pause(None)`: a type that is None by mistake never
        pauses everything.)"""
        answer: Paused = await self._control(pause_message(None, True, whole_queue=True))
        return answer

    async def resume_all(self) -> Paused:
        """Undo `pause_all()`."""
        answer: Paused = await self._control(pause_message(None, False, whole_queue=True))
        return answer

    async def purge(self, task_type: str, *, before: dt.datetime | None = None) -> Swept:
        """Forget, for good, the dead letters and cancelled tasks of `task_type` that finished
        before `before` (None: whenever), on every daemon of the directory. Only ended tasks
        that wait for an operator: never a waiting or running task (unlike Celery's
        `purge`), nor a succeeded one (results leave with the result retention). A purged
        task leaves the dead-letter listings; its id may be enqueued again.

        Returns:
            `Swept("purged", task_type, before, count, shards, pending)`: `count` tasks
            purged in the shards that applied it; `pending` names those whose owner had not
            within the daemon's wait (durable in their inboxes, applied when read; their
            tasks are not counted).

        Raises:
            ControlError: the daemon refuses it (an empty type); `message` is its text.
            DaemonExited, QueueNotRunning: no daemon to ask.
        """
        answer: Swept = await self._control(sweep_message(True, task_type, before))
        return answer

    async def purge_all(self, *, before: dt.datetime | None = None) -> Swept:
        """`purge` every type's dead letters and cancelled tasks (finished before `before`).
        (A separate method, not `purge(None)`: a type that is None by mistake never purges
        the whole queue.)"""
        message = sweep_message(True, None, before, whole_queue=True)
        answer: Swept = await self._control(message)
        return answer

    async def retry_dead(self, task_type: str, *, before: dt.datetime | None = None) -> Swept:
        """Put every dead letter of `task_type` that died before `before` (None: whenever)
        back in the queue, attempts reset, on every daemon of the directory (`retry` puts
        back one task by id). Cancelled tasks are left: a cancel was meant.

        Returns:
            `Swept("requeued", task_type, before, count, shards, pending)`: `count` dead
            letters put back; `pending` as for `purge`.

        Raises:
            ControlError: the daemon refuses it (an empty type); `message` is its text.
            DaemonExited, QueueNotRunning: no daemon to ask.
        """
        answer: Swept = await self._control(sweep_message(False, task_type, before))
        return answer

    async def retry_all_dead(self, *, before: dt.datetime | None = None) -> Swept:
        """`retry_dead` every type's dead letters (a separate method, as `purge_all` is)."""
        message = sweep_message(False, None, before, whole_queue=True)
        answer: Swept = await self._control(message)
        return answer

    async def get(self, task_id: str, timeout: float | None = 10.0) -> TaskDetails:
        """Look a task up by id, whichever daemon owns it: its state, attempts, last error,
        times, shard, and the stored result of a success.

        Returns:
            `TaskDetails`; an id no file holds has `found` False and state `unknown` (so
            does, for a moment, a task enqueued through another daemon that its owner has
            not taken in yet).

        Raises:
            ControlError: the daemon refuses it (an empty id); `message` is its text.
            TimeoutError: no reply within `timeout` seconds.
            DaemonExited, QueueNotRunning: no daemon to ask.
        """
        answer: TaskDetails = await self._control(control_message("get", task_id), timeout)
        return answer

    async def result(self, task_id: str, timeout: float | None = None) -> Any:
        """Wait for a task to end and return what its handler returned (None when it
        returned nothing). It asks `get` again and again, from every 0.05 s up to every
        1 s; an `unknown` answer is waited through (the enqueue may not be taken in yet).

        Raises:
            TaskFailed: it ended without succeeding: dead-lettered, cancelled, or dropped
                (`state` says which, `error` its last error).
            TimeoutError: it has not ended within `timeout` seconds (None: wait on).
            ControlError, DaemonExited, QueueNotRunning: as `get`.
        """
        pause = _RESULT_POLL_FIRST_S
        with anyio.fail_after(timeout):
            while True:
                details = await self.get(task_id, timeout=None)
                if details.finished:
                    break
                await anyio.sleep(pause)
                pause = min(pause * 2, _RESULT_POLL_MOST_S)
        if details.state != "succeeded":
            why = f": {details.last_error}" if details.last_error else ""
            raise TaskFailed(
                f"[Snerd] task '{task_id}' ended {details.state}{why}",
                task_id=task_id,
                state=details.state,
                error=details.last_error,
            )
        return details.result

    async def _control(self, message: dict[str, Any], timeout: float | None = None) -> Any:
        """Send a control line and wait (at most `timeout` seconds) for the reply that
        names what it asked about; the reply's value (`_REPLY_VALUE`)."""
        check_control_message(message)
        if not self._accepting:
            raise self._not_running_error()
        waiter = Waiter(self._new_signal())
        self._control_waiters.setdefault(request_key(message), deque()).append(waiter)
        self._post(message)
        try:
            with anyio.fail_after(timeout):
                await waiter.event.wait()
        finally:
            # Replies to one key come one per request: an abandoned call still takes its own.
            waiter.abandoned = True
        if waiter.error is not None:
            raise waiter.error
        return waiter.value

    # -- the daemon's replies

    def _on_control_reply(self, message: dict[str, Any]) -> None:
        """A `cancelled`, `retried`, `paused`, `purged`, `requeued` or `task` reply: to the
        oldest call waiting for a reply about the same task (or type and direction, or
        sweep), if any."""
        key = reply_key(message)
        waiter = self._next_control_waiter(key) if key is not None else None
        if waiter is not None and not waiter.abandoned:
            waiter.resolve(_REPLY_VALUE[key[0]](message))  # type: ignore[index]

    def _next_control_waiter(self, key: ReplyKey) -> Waiter | None:
        """Take the oldest call waiting on `key`."""
        queue = self._control_waiters.get(key)
        if not queue:
            return None
        waiter = queue.popleft()
        if not queue:
            del self._control_waiters[key]
        return waiter

    def _control_refused(self, task_id: Any, text: str) -> bool:
        """Fail the control call an `error` refuses, if it refuses one (True): a retry the
        owner could not carry out, or a command refused while the daemon drains (the oldest
        cancel, retry or get of the task; a pause, resume or sweep when it names none)."""
        if isinstance(task_id, str):
            if text.startswith(_RETRY_REFUSED):
                kinds: tuple[str, ...] = ("retried",)
            elif text.endswith(_COMMAND_REJECTED):
                kinds = ("cancelled", "retried", "task")
            else:
                return False
            keys: list[ReplyKey] = [(kind, task_id, False) for kind in kinds]
        elif task_id is None and text.endswith(_COMMAND_REJECTED):
            keys = [key for key in self._control_waiters if key[0] in _WHOLE_QUEUE_REPLIES][:1]
        else:
            return False
        for key in keys:
            waiter = self._next_control_waiter(key)
            if waiter is not None:
                waiter.fail(ControlError(text, task_id=task_id))
                return True
        return False

