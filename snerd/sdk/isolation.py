"""Process isolation: one attempt of a sync handler in a child process of its own, which can be
killed.

Owns: the multiprocessing context attempts run in (forkserver, with the handlers' modules
preloaded), the child's side of an attempt (run the handler, forward its `yield_progress`, send
back its value or its error, die with its parent) and the parent's side (start the child,
await its answer without blocking the event loop, kill it and reap it), and the rule of which
handlers may run this way (`forkable`).

Why a child per attempt, killed: a thread cannot be stopped, so a sync handler past its
`max_execution_seconds` or cancelled runs on, and a retry can overlap it. A process can be
killed (SIGKILL to its process group, so what it started dies with it), and the attempt ends
only once it is reaped: whatever the handler would have done after its deadline never happens,
and the next attempt starts after it. `concurrent.futures.ProcessPoolExecutor` cannot kill one
job (a killed worker breaks the whole pool), so each attempt gets a `multiprocessing.Process`.

Why forkserver: the worker process has threads (the event loop's helpers, sync handlers in
threads), and fork(2) in a threaded process copies locks other threads held (logging's, the
allocator's) into a child that can never release them. The forkserver is a single-threaded
process started once, which imports the handlers' modules once (`preload`); each attempt is
forked from it, so a child starts in a few milliseconds with its modules already loaded. The
handler and its data go to the child by pickle: a module-level function pickles by reference
(its module and name), which is why only such functions qualify (`forkable`).

A child leaves its parent's process group (a terminal's Ctrl-C reaches the worker, which
decides; not the child) and watches its end of the pipe: when the parent dies (kill -9), the
pipe ends and the child kills its group, so no attempt outlives its worker.

It must never: run an attempt on after its parent stopped waiting for it (a cancel, the
deadline, the worker's exit), or block the event loop (the child's start runs in a worker
thread; its answer and its exit are awaited as readable descriptors).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import multiprocessing.context
import multiprocessing.forkserver
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable
from types import FunctionType
from typing import Any

import anyio
import anyio.to_thread

from snerd.sdk.context import CURRENT_ATTEMPT, RunningAttempt
from snerd.sdk.errors import FinalError

__all__ = [
    "ISOLATIONS",
    "AttemptProcessFailed",
    "ChildAttempt",
    "forkable",
    "preload",
    "run_in_process",
]

#: How a handler may run: `thread` (a worker thread of this process) or `process` (a child
#: process per attempt, killed at its deadline or on a cancel).
ISOLATIONS = ("thread", "process")

#: How long a child that answered gets to exit by itself before it is killed.
_EXIT_WAIT_S = 1.0

_preloaded: set[str] = set()
#: `preload` has run in this process (the forkserver is up, with our modules).
_server_started = False


class AttemptProcessFailed(Exception):
    """The attempt failed in its child: `text` is the attempt's error text, as the child
    described its exception (or how the child died); `final` when it was a `FinalError` (no
    retry)."""

    def __init__(self, text: str, *, final: bool = False) -> None:
        super().__init__(text)
        self.text = text
        self.final = final


def forkable(fn: Callable[..., Any]) -> bool:
    """Whether `fn` can run in a child process: a plain (not async) function defined at the
    top level of an importable module (not `__main__`), found there under its own name, so it
    pickles by reference. Lambdas, closures, nested functions, methods, `functools.partial`
    and callable objects do not qualify, but for a sync task function's handler, which pickles
    as its task's module and name when the task is found there (`TaskHandler.forkable`)."""
    ask = getattr(fn, "forkable", None)
    if type(fn) is not FunctionType and callable(ask):
        return bool(ask())
    if type(fn) is not FunctionType or fn.__code__.co_flags & 0x80:  # CO_COROUTINE
        return False
    module = sys.modules.get(fn.__module__)
    if module is None or fn.__module__ == "__main__" or fn.__qualname__ != fn.__name__:
        return False
    return getattr(module, fn.__name__, None) is fn


def preload(modules: Iterable[str]) -> None:
    """Have the forkserver import `modules` before it forks any attempt (call it before the
    first process attempt; later calls are too late for a server already running, and
    harmless). Starts the server now, while this process may have no threads yet."""
    global _server_started
    new = set(modules) - _preloaded
    if new or not _server_started:
        _preloaded.update(new)
        # `__main__` too, multiprocessing's own default (CPython 3.11's forkserver does not
        # act on it for a script: a script is imported again in each child).
        multiprocessing.set_forkserver_preload(["__main__", __name__, *sorted(_preloaded)])
    # The server is in this process's group, and a signal to the group (a supervisor's
    # SIGTERM) would kill it, SIGTERM's default: then the children's exit codes could no
    # longer be read, nor new attempts forked, during the warm shutdown that signal starts.
    # An ignored signal stays ignored across exec(2), so the server starts with SIGTERM
    # ignored (SIGINT it ignores itself); each child restores it (`_child_main`). Only the
    # main thread may change a handler: started from another, the server keeps the default.
    try:
        previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    except ValueError:
        previous = None
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    _server_started = True


def _context() -> multiprocessing.context.ForkServerContext:
    ctx = multiprocessing.get_context("forkserver")
    assert isinstance(ctx, multiprocessing.context.ForkServerContext)
    return ctx


# ---------------------------------------------------------------------- the child


def _child_main(
    conn: multiprocessing.connection.Connection,
    fn: Callable[[Any], Any],
    data: Any,
    info: tuple[str, str, int | None, int | None],
) -> None:
    """In the child: run `fn(data)` as the attempt `info` names, send `("ok", value)` or
    `("error", text)` (and `("progress", data)` for each `yield_progress`), and exit."""
    os.setpgrp()  # out of reach of the terminal's signals: the worker decides
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    threading.Thread(target=_die_with_parent, args=(conn,), daemon=True).start()
    lock = threading.Lock()

    def post(message: dict[str, Any]) -> None:
        with lock:
            conn.send(("progress", message.get("data")))

    task_id, task_type, attempt, limit = info
    CURRENT_ATTEMPT.set(
        RunningAttempt(task_id, task_type, attempt, limit, post, threading.get_ident())
    )
    try:
        answer: tuple[str, Any] = ("ok", fn(data))
    except FinalError as exc:  # a failure for good, as in a thread (`snerd.sdk.workers`)
        answer = ("final", str(exc) or "FinalError")
    except BaseException as exc:  # every way out of the handler is its error
        answer = ("error", _describe(exc))
    with lock:
        try:
            conn.send(answer)
        except Exception as exc:
            text = f"the handler's return value cannot leave its process: {_describe(exc)}"
            conn.send(("error", text))


def _describe(exc: BaseException) -> str:
    """`"<ExceptionType>: <message>"`, as `snerd.sdk.messages.describe_error` says it (not
    imported: the child loads as little as it can)."""
    text = str(exc)
    name = type(exc).__name__
    described = f"{name}: {text}" if text else name
    return described.encode("utf-8", "backslashreplace").decode("utf-8")


def _die_with_parent(conn: multiprocessing.connection.Connection) -> None:
    """Wait for the end of the parent's side of the pipe (the parent never writes): it came
    because the parent died or stopped waiting, so kill this process's group now."""
    with contextlib.suppress(EOFError, OSError):  # the parent is gone (or stopped waiting)
        conn.recv_bytes()
    os.killpg(0, signal.SIGKILL)


# ---------------------------------------------------------------------- the parent


class ChildAttempt:
    """One attempt's child process, seen from the parent. `reaped` is set once it has exited
    and been waited for."""

    def __init__(self, attempt: int | None) -> None:
        self.attempt = attempt
        self.reaped = anyio.Event()


async def run_in_process(
    fn: Callable[[Any], Any],
    data: Any,
    running: RunningAttempt,
    child: ChildAttempt,
) -> Any:
    """Run `fn(data)` in a child process of its own and return what it returned; its
    `yield_progress` calls are posted through `running.post`. However this is left (the
    handler's answer, a cancel, the deadline), the child is dead and reaped before it returns
    or raises; `child.reaped` is set then.

    Raises:
        AttemptProcessFailed: the handler raised (its text), or the child died without
            answering (its exit code or signal).
    """
    ctx = _context()
    ours, theirs = ctx.Pipe(duplex=True)
    process = ctx.Process(
        target=_child_main,
        args=(
            theirs,
            fn,
            data,
            (running.task_id, running.task_type, running.attempt, running.limit),
        ),
        name=f"snerd {running.task_type} {running.task_id}",
        daemon=False,
    )
    try:
        if not _server_started:
            # The first attempt here: start the forkserver with this handler's module (and
            # this one) imported once, not in every child.
            await anyio.to_thread.run_sync(preload, [fn.__module__])
        # The start is a short exchange with the forkserver (blocking): in a worker thread,
        # never abandoned, so a cancel waits for the child to exist and then kills it.
        await anyio.to_thread.run_sync(process.start)
    except BaseException:
        ours.close()
        theirs.close()
        child.reaped.set()
        raise
    theirs.close()
    answered = False
    try:
        while True:
            await anyio.wait_readable(ours.fileno())
            try:
                kind, payload = ours.recv()
            except (EOFError, OSError):
                break
            if kind == "progress":
                running.post({"action": "progress", "task_id": running.task_id, "data": payload})
                continue
            answered = True
            if kind == "ok":
                return payload
            raise AttemptProcessFailed(str(payload), final=kind == "final")
        await _reap(process)
        raise AttemptProcessFailed(_death(process.exitcode))
    finally:
        with anyio.CancelScope(shield=True):
            if answered:
                # It answered and is exiting: let it, briefly, before the kill.
                with anyio.move_on_after(_EXIT_WAIT_S):
                    await anyio.wait_readable(process.sentinel)
            if process.exitcode is None:
                _kill(process)
            await _reap(process)
            ours.close()
            process.close()
            child.reaped.set()


def _kill(process: multiprocessing.process.BaseProcess) -> None:
    """SIGKILL the child's process group (it leads one: `_child_main`), else the child."""
    pid = process.pid
    if pid is None:
        return
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


async def _reap(process: multiprocessing.process.BaseProcess) -> None:
    """Wait until the child has exited (its sentinel reads as ready), then collect it."""
    if process.exitcode is None:
        await anyio.wait_readable(process.sentinel)
    process.join()


def _death(code: int | None) -> str:
    """The error text of a child that exited without answering."""
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"the handler's process was killed by {name}"
    return f"the handler's process exited with code {code} without an answer"
