"""Task functions: `@queue.task(...)` turns a function into a task type with its defaults.

    @queue.task(retries=3, backoff="exponential", retry_after=10, timeout=60,
                never_retry=(ValueError,))
    async def send_email(to: str, subject: str) -> None: ...

    await send_email.enqueue(to="ada@example.com", subject="hi")      # from async code
    send_email.enqueue_sync(to="ada@example.com", subject="hi")       # from any code
    await send_email.using(urgency=5, execute_at=timedelta(hours=1)).enqueue(...)

The task's type is its name (`module.qualname`, or `name=`); its data is its arguments by
parameter name (`inspect.signature(fn).bind`, so positional and keyword calls make one payload,
and a call that does not fit the function's signature is a `TypeError` before anything is
sent); the handler calls the function with them as keywords. The options are `enqueue`'s under
plainer names (`retries` is `max_retries`, `retry_after` seconds or a timedelta is
`retry_after_hours`, `timeout` is `max_execution_seconds`, `rate` a number per minute with
the task's name as its group, `dedupe=True` is `auto_dedupe` and a function of the arguments
is a `unique_key`); `using(...)` overrides them for one call, by `enqueue`'s own names.

`never_retry`: exception classes that fail a task for good. The handler turns them into a
`FinalError`, which the workers send as a final failure (`"retry": false`): the task goes
straight to the dead letter queue with its error, whatever attempts it has left.

`enqueue_sync` goes through the process's blocking producer of the queue's directory
(`snerd.sdk.producer.producer`): no event loop needed, and the same record as `enqueue`.
Calling the task function itself runs the function, as a plain call does (tests, scripts).
"""

from __future__ import annotations

import datetime as dt
import functools
import importlib
import inspect
import sys
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from snerd.sdk.errors import FinalError
from snerd.sdk.messages import ENQUEUE_ARGS, Enqueued

if TYPE_CHECKING:
    from snerd.sdk.face import QueueFace

__all__ = ["TaskFactory", "TaskFunction", "TaskHandler", "task_options"]

_P = ParamSpec("_P")
_R = TypeVar("_R")


class TaskFactory:
    """`task` of `QueueFace` (a mixin, as `snerd.sdk.control.JobControl` is)."""

    if TYPE_CHECKING:

        def register_handler(
            self, task_type: str, handler: Callable[[Any], Any], *, isolation: str | None = None
        ) -> None: ...

    def task(
        self,
        fn: Callable[_P, _R] | None = None,
        *,
        name: str | None = None,
        retries: int | None = None,
        retry_after: float | dt.timedelta | None = None,
        backoff: str | None = None,
        backoff_max: float | dt.timedelta | None = None,
        timeout: float | dt.timedelta | None = None,
        pool: str | None = None,
        rate: int | None = None,
        rate_group: str | None = None,
        dedupe: bool | Callable[..., str] | None = None,
        urgency: float | None = None,
        never_retry: tuple[type[BaseException], ...] = (),
    ) -> Any:
        """Register a function as a task type with its defaults (`snerd.sdk.tasks`): used as
        `@q.task` or `@q.task(retries=3, ...)`, it returns a `TaskFunction` whose `enqueue`
        (async) and `enqueue_sync` (blocking) enqueue a run of it with its arguments.

        Args:
            name: the task type (default: the function's `module.qualname`).
            retries: `max_retries` (default 3, `enqueue`'s).
            retry_after: the wait before a retry, seconds or a timedelta.
            backoff: `"constant"` or `"exponential"` (doubling from `retry_after`, with
                jitter); default the daemon's `SNERD_BACKOFF`.
            backoff_max: where exponential backoff stops growing (default 7 days).
            timeout: the hard timeout of one attempt (`max_execution_seconds`).
            pool: the worker pool (`SNERD_POOLS`).
            rate: most dispatches a minute, counted for the group `rate_group` (default the
                task's name).
            dedupe: True: drop an enqueue while a twin with the same arguments counts; a
                function of the arguments: its value is the `unique_key`.
            urgency: `urgency_score` (higher runs first).
            never_retry: exception classes that fail the task for good (no retry).
        """

        def register(f: Callable[_P, _R]) -> TaskFunction[_P, _R]:
            task_name = name or f"{f.__module__}.{f.__qualname__}"
            options, key_of = task_options(
                retries=retries, retry_after=retry_after, backoff=backoff,
                backoff_max=backoff_max, timeout=timeout, pool=pool, rate=rate,
                rate_group=rate_group, dedupe=dedupe, urgency=urgency, name=task_name,
            )
            task = TaskFunction(self, f, task_name, options, key_of, tuple(never_retry))  # type: ignore[arg-type]
            self.register_handler(task_name, task.handler())
            return task

        return register if fn is None else register(fn)



def task_options(
    *,
    retries: int | None,
    retry_after: float | dt.timedelta | None,
    backoff: str | None,
    backoff_max: float | dt.timedelta | None,
    timeout: float | dt.timedelta | None,
    pool: str | None,
    rate: int | None,
    rate_group: str | None,
    dedupe: bool | Callable[..., str] | None,
    urgency: float | None,
    name: str,
) -> tuple[dict[str, Any], Callable[..., str] | None]:
    """`enqueue`'s options for a task's defaults (the module docstring), and the function of
    the arguments that makes its `unique_key`, if any."""
    options: dict[str, Any] = {}
    if retries is not None:
        options["max_retries"] = retries
    if retry_after is not None:
        options["retry_after_hours"] = _seconds(retry_after) / 3600
    if backoff is not None:
        options["backoff"] = backoff
    if backoff_max is not None:
        options["backoff_max_seconds"] = max(1, round(_seconds(backoff_max)))
    if timeout is not None:
        options["max_execution_seconds"] = max(1, round(_seconds(timeout)))
    if pool is not None:
        options["pool"] = pool
    if rate is not None:
        options["rate_limit_group"] = rate_group or name
        options["max_per_minute"] = rate
    if urgency is not None:
        options["urgency_score"] = urgency
    key_of = None
    if callable(dedupe):
        key_of = dedupe
    elif dedupe:
        options["auto_dedupe"] = True
    return options, key_of


def _seconds(value: float | dt.timedelta) -> float:
    return value.total_seconds() if isinstance(value, dt.timedelta) else float(value)


class TaskFunction(Generic[_P, _R]):
    """A function registered as a task type (`QueueFace.task`): call it to run it here,
    `enqueue` it to run it on the queue."""

    def __init__(
        self,
        face: QueueFace,
        fn: Callable[_P, _R],
        name: str,
        options: Mapping[str, Any],
        key_of: Callable[..., str] | None,
        never_retry: tuple[type[BaseException], ...],
    ) -> None:
        self.face = face
        self.fn = fn
        self.name = name
        self.options = dict(options)
        self._key_of = key_of
        self.never_retry = never_retry
        self._signature = inspect.signature(fn)
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]

    def __call__(self, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        return self.fn(*args, **kwargs)

    # -- what goes on the queue

    def payload(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The task's data for a call: its arguments by parameter name, defaults left out
        (a later default applies). Raises TypeError when they do not fit the signature."""
        return dict(self._signature.bind(*args, **kwargs).arguments)

    def _message_args(self, call_options: Mapping[str, Any], data: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(call_options) - set(ENQUEUE_ARGS) - {"task_id"})
        if unknown:
            raise TypeError(f"using() got an unexpected option {unknown[0]!r}")
        args: dict[str, Any] = {**self.options, **call_options, "task_type": self.name,
                                "data": data}
        if self._key_of is not None and "unique_key" not in call_options:
            args["unique_key"] = str(self._key_of(**data))
        return args

    async def enqueue(self, *args: _P.args, **kwargs: _P.kwargs) -> Enqueued:
        """Enqueue a run of the function with these arguments, with the task's options."""
        return await self.using().enqueue(*args, **kwargs)

    def enqueue_sync(self, *args: _P.args, **kwargs: _P.kwargs) -> Enqueued:
        """`enqueue`, blocking, from code without an event loop (through the process's
        producer of the queue's directory: no daemon needed in this process)."""
        return self.using().enqueue_sync(*args, **kwargs)

    def using(self, **options: Any) -> _Call[_P, _R]:
        """This task with some of `enqueue`'s options set for one call (`task_id`,
        `urgency_score`, `execute_at`, `max_retries`, ...)."""
        return _Call(self, options)

    # -- what runs

    def handler(self) -> Callable[[Any], Any]:
        """The handler the queue runs: the function called with the task's data as keywords,
        async if it is, an exception of `never_retry` raised as a `FinalError`."""
        fn: Callable[..., Any] = self.fn
        final = self.never_retry
        if inspect.iscoroutinefunction(fn):
            coro_fn: Callable[..., Awaitable[Any]] = fn

            async def run_async(data: Any) -> Any:
                try:
                    return await coro_fn(**_kwargs(data))
                except final as exc:
                    raise FinalError(f"{type(exc).__name__}: {exc}") from exc

            return run_async

        return TaskHandler(self)

    def reachable(self) -> bool:
        """Whether another process finds this task by importing its module: defined at the
        top level of an importable module (not `__main__`), under its own name there."""
        module = sys.modules.get(self.fn.__module__)
        name = getattr(self.fn, "__name__", "")
        return (
            module is not None
            and self.fn.__module__ != "__main__"
            and name == getattr(self.fn, "__qualname__", None)
            and getattr(module, name, None) is self
        )


class TaskHandler:
    """The handler of a sync task function: the function called with the task's data as
    keywords, an exception of `never_retry` raised as a `FinalError`. It pickles as its
    task's module and name, so that a worker may run it in a process of its own
    (`snerd.sdk.isolation.forkable` asks `forkable`)."""

    def __init__(self, task: TaskFunction[Any, Any]) -> None:
        self.task = task
        self.__module__ = task.fn.__module__
        self.__name__ = getattr(task.fn, "__name__", task.name)

    def __call__(self, data: Any) -> Any:
        try:
            return self.task.fn(**_kwargs(data))
        except self.task.never_retry as exc:
            raise FinalError(f"{type(exc).__name__}: {exc}") from exc

    def forkable(self) -> bool:
        return self.task.reachable()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_handler_of, (self.task.fn.__module__, self.__name__))


def _handler_of(module: str, name: str) -> Callable[[Any], Any]:
    """In a child process: the handler of the task function `name` of `module`."""
    task: TaskFunction[Any, Any] = getattr(importlib.import_module(module), name)
    return task.handler()


def _kwargs(data: Any) -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise FinalError(f"a task function's data is an object of its arguments, got {data!r:.100}")
    return data


class _Call(Generic[_P, _R]):
    """A task with options for one call (`TaskFunction.using`)."""

    def __init__(self, task: TaskFunction[_P, _R], options: Mapping[str, Any]) -> None:
        self.task = task
        self.options = dict(options)

    async def enqueue(self, *args: _P.args, **kwargs: _P.kwargs) -> Enqueued:
        message = self.task._message_args(self.options, self.task.payload(*args, **kwargs))
        return await self.task.face.enqueue(**message)

    def enqueue_sync(self, *args: _P.args, **kwargs: _P.kwargs) -> Enqueued:
        from snerd.sdk.producer import producer

        message = self.task._message_args(self.options, self.task.payload(*args, **kwargs))
        directory: Path = self.task.face._dashboard_directory()
        return producer(directory).enqueue(**message)
