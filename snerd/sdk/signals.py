"""Loop-neutral wake-ups: how a call waiting for the daemon's answer, or an idle worker, waits.

Owns: the `Signal` interface (`anyio.Event`'s `set` and `wait`), the fastest one the running
event loop has (`signal_factory`: a bare future on asyncio, `trio.Event` on trio), and `Waiter`,
one call waiting for its answer or its error.

Each enqueue and each `execute` waits on one signal, so their cost is per job: `anyio.Event`
puts two layers and a look-up of the running library in front of the same future (about a fifth
of the SDK's CPU per job). A signal is set and awaited on the event loop's thread only.

It must never: be set from another thread (use `anyio.from_thread` to get onto the loop).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import sniffio

from snerd.sdk.errors import SnerdError

__all__ = ["Signal", "Waiter", "signal_factory"]


class Signal(Protocol):
    """A one-shot wake-up of one waiting task, on the event loop's thread (`anyio.Event`'s
    interface)."""

    def set(self) -> None: ...

    def wait(self) -> Awaitable[Any]: ...


class _FutureSignal:
    """`Signal` on asyncio: a bare future."""

    __slots__ = ("_future",)

    def __init__(self, future: asyncio.Future[None]) -> None:
        self._future = future

    def set(self) -> None:
        if not self._future.done():  # (done too when its waiter was cancelled)
            self._future.set_result(None)

    def wait(self) -> Awaitable[None]:
        return self._future


def signal_factory() -> Callable[[], Signal]:
    """How the running event loop makes a `Signal`: a bare future on asyncio, `trio.Event`
    (which `anyio.Event` wraps) on trio. Call on the loop's thread."""
    if sniffio.current_async_library() == "asyncio":
        create_future = asyncio.get_running_loop().create_future
        return lambda: _FutureSignal(create_future())
    import trio

    return trio.Event


class Waiter:
    """One call waiting for the daemon's answer: `resolve` or `fail` sets its signal.

    Attributes:
        abandoned: the caller gave up (a `stats` that timed out); the answer is dropped.
    """

    __slots__ = ("abandoned", "error", "event", "value")

    def __init__(self, event: Signal) -> None:
        self.event = event
        self.value: Any = None
        self.error: SnerdError | None = None
        self.abandoned = False

    def resolve(self, value: Any) -> None:
        """The answer came: wake the caller with `value`."""
        self.value = value
        self.event.set()

    def fail(self, error: SnerdError) -> None:
        """There will be no answer: wake the caller to raise `error`."""
        self.error = error
        self.event.set()
