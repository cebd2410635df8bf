"""`snerdmq worker MODULE:ATTRIBUTE`: run the handlers an application registered on its queue,
as `rq worker`, `celery worker` or `huey_consumer` do.

It imports MODULE (the current directory first on `sys.path`, as those tools do), takes the
`SnerdQueue` or `Engine` named ATTRIBUTE (with no `:ATTRIBUTE`, the only one the module
has), applies the flags (`--concurrency`, `--pool`, `--types`), chooses where each sync
handler runs (`--isolation`), and runs the queue until a signal or the daemon's death:

- SIGTERM or SIGINT: warm shutdown. The daemon drains: no new work; the attempts in flight
  finish, and their results are recorded, within its drain timeout (`SNERD_DRAIN_TIMEOUT`);
  those still running then are handed back (the daemon runs them again, on the next owner)
  and their processes killed. Exit 0.
- A second signal: stop at once. The daemon is killed (its tasks are durable; the in-flight
  ones run again with the same attempt number), process-isolated attempts too. Exit 1.
- The daemon dies (killed, or it exits by itself): exit 1, with the reason.
- This process killed -9: its daemon reads the end of its stdin and exits (it runs in a
  session of its own, so a signal to this process's group reaches this process only, which
  decides); process-isolated attempts see the end of their pipe and kill themselves.

`--isolation auto` (the default): a sync handler registered without an isolation, on a queue
made without one, runs in a process of its own per attempt when it is a plain function at the
top level of an importable module (`snerd.sdk.isolation.forkable`: it pickles by reference);
anything else (a lambda, a closure, a method, a callable object) in a thread, as before.

Bad input (a module that does not import, a missing attribute, an object of another type, a
`--types` name with no handler) is one line on stderr and exit 2. It must never leave its
daemon running after it exits.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import signal
import sys
import traceback
from collections.abc import Sequence
from typing import Any

import anyio

from snerd.cli.args import UsageError, command_parser, positive_int, run_command
from snerd.client import SnerdQueue
from snerd.config import ConfigError, parse_pools
from snerd.engine import Engine
from snerd.sdk.errors import SnerdError
from snerd.sdk.isolation import forkable, preload
from snerd.sdk.messages import describe_error
from snerd.sdk.workers import AttemptEnded, is_async

__all__ = ["EXIT_STOPPED", "EXIT_USAGE", "TargetError", "main"]

logger = logging.getLogger("snerd.worker")

_EPILOG = """\
signals:
  SIGTERM, SIGINT   warm shutdown: no new work; in-flight attempts finish within the drain
                    timeout (SNERD_DRAIN_TIMEOUT), the rest are handed back; exit 0
  a second one      stop now: the daemon and the attempts' processes are killed; exit 1

exit codes: 0 after a warm shutdown; 1 when the daemon died or after a second signal;
2 for a bad argument, module or attribute, or a queue that cannot start.

example:
  snerdmq worker app.tasks:queue --concurrency 8 --pool video=2 --types resize,thumbnail
"""

#: Exit code of a worker whose daemon died, or that was stopped by a second signal.
EXIT_STOPPED = 1
#: Exit code of a bad argument, target, or a queue that cannot start on its directory.
EXIT_USAGE = 2


def _parser() -> argparse.ArgumentParser:
    parser = command_parser(
        "worker",
        "Import MODULE and run the handlers of its SnerdQueue or Engine named ATTRIBUTE "
        "(the current directory is on the import path).",
        _EPILOG,
    )
    parser.add_argument("target", metavar="MODULE[:ATTRIBUTE]", help="e.g. app.tasks:queue")
    parser.add_argument(
        "--concurrency",
        type=positive_int("--concurrency"),
        metavar="N",
        help="attempts run at once (SNERD_MAX_WORKERS; default: the queue's, else 100)",
    )
    parser.add_argument(
        "--pool",
        action="append",
        default=[],
        metavar="NAME=N",
        help="limit worker pool NAME to N attempts at once (repeatable; SNERD_POOLS)",
    )
    parser.add_argument(
        "--types",
        metavar="A,B",
        help="register only these task types of the queue's handlers (default: all)",
    )
    parser.add_argument(
        "--isolation",
        choices=("auto", "process", "thread"),
        default="auto",
        help=(
            "where sync handlers registered without one run: auto (default: a process per "
            "attempt for module-level functions, else a thread), process, or thread"
        ),
    )
    parser.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default="info",
        help=(
            "info (default): one line per attempt on stderr (id, type, attempt, outcome, "
            "duration); warning: only attempts that did not succeed"
        ),
    )
    return parser


class TargetError(Exception):
    """MODULE:ATTRIBUTE names no queue: said in one line (no usage), exit 2."""


def main(argv: Sequence[str]) -> int:
    """`snerdmq worker MODULE[:ATTRIBUTE] [flags]`."""
    return run_command(_parser(), argv, _run_checked)


def _run_checked(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except TargetError as exc:
        print(f"snerdmq worker: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _run(args: argparse.Namespace) -> int:
    face = _load(args.target)
    pools = _pools(args.pool)
    if args.types is not None:
        types = [t.strip() for t in args.types.split(",") if t.strip()]
        if not types:
            raise UsageError("--types needs at least one task type")
        try:
            face.keep_only(types)
        except KeyError as exc:
            raise UsageError(
                f"--types: no handler for {exc.args[0]} in {args.target} (its handlers: "
                f"{', '.join(sorted(face.handlers)) or 'none'})"
            ) from None
    if not face.handlers:
        raise UsageError(f"{args.target} has no handler registered: nothing to run")
    face.set_concurrency(args.concurrency, pools or None)
    isolated = _choose_isolation(face, args.isolation)
    _configure_logging(args.log_level)
    if isolated:
        # The forkserver starts now, before this process has threads, with the handlers'
        # modules imported once for every attempt forked from it.
        preload(sorted({face.handlers[t].__module__ for t in isolated}))
    where = {t: ("process" if t in isolated else _plain_place(face, t)) for t in face.handlers}
    logger.info(
        "worker %d: %s; handlers: %s",
        os.getpid(),
        args.target,
        ", ".join(f"{t} ({where[t]})" for t in sorted(where)),
    )
    return anyio.run(_serve, face)


def _plain_place(face: SnerdQueue | Engine, task_type: str) -> str:
    handler = face.handlers[task_type]
    if is_async(handler):
        return "event loop"
    return face.isolation_of(task_type) or "thread"


def _load(target: str) -> SnerdQueue | Engine:
    """The face `target` names, imported with the current directory on the import path.

    Raises:
        TargetError: the module does not import, or has no such attribute, or it is neither a
            `SnerdQueue` nor an `Engine`.
    """
    module_name, _, attribute = target.partition(":")
    if not module_name or (":" in target and not attribute):
        raise TargetError(f"{target!r} is not MODULE[:ATTRIBUTE] (e.g. app.tasks:queue)")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise TargetError(
                f"cannot import {module_name!r}: no module named {missing!r} (looked in {cwd} "
                "and on the import path)"
            ) from None
        _print_user_traceback()
        raise TargetError(f"importing {module_name!r} failed: {exc}") from None
    except Exception as exc:
        _print_user_traceback()
        raise TargetError(
            f"importing {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from None
    if not attribute:
        found = [
            name
            for name, value in vars(module).items()
            if isinstance(value, SnerdQueue | Engine) and not name.startswith("_")
        ]
        if len(found) != 1:
            raise TargetError(
                f"module {module_name!r} has "
                + (f"{len(found)} queues ({', '.join(sorted(found))})" if found else "no queue")
                + f": name one, as {module_name}:ATTRIBUTE"
            )
        attribute = found[0]
    value: Any = module
    for part in attribute.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise TargetError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if not isinstance(value, SnerdQueue | Engine):
        raise TargetError(
            f"{module_name}:{attribute} is a {type(value).__name__}, not a SnerdQueue or an "
            "Engine"
        )
    return value


def _print_user_traceback() -> None:
    """The application's own module raised while importing: its traceback helps more than a
    line (printed before the one-line error)."""
    traceback.print_exc(file=sys.stderr)


def _pools(specs: list[str]) -> dict[str, int]:
    """The `--pool NAME=N` flags, read as `SNERD_POOLS` is."""
    pools: dict[str, int] = {}
    for spec in specs:
        try:
            parsed = parse_pools(spec, name="--pool")
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
        if not parsed:
            raise UsageError(f"--pool must be NAME=N, got {spec!r}")
        pools.update(parsed)
    return pools


def _choose_isolation(face: SnerdQueue | Engine, mode: str) -> set[str]:
    """Register every sync handler that is to run in processes as such (`--isolation`); the
    task types that will.

    Raises:
        UsageError: `--isolation process` for a handler that cannot run in a process.
    """
    isolated: set[str] = set()
    for task_type, handler in list(face.handlers.items()):
        if is_async(handler):
            continue
        chosen = face.isolation_of(task_type)
        if chosen is None:
            if mode == "thread":
                continue
            if not forkable(handler):
                if mode == "process":
                    raise UsageError(
                        f"--isolation process: the handler of {task_type!r} ({handler!r}) is "
                        "not a function at the top level of a module, so it cannot run in a "
                        "process; register it with isolation='thread'"
                    )
                continue
            face.register_handler(task_type, handler, isolation="process")
            chosen = "process"
        if chosen == "process":
            isolated.add(task_type)
    return isolated


def _configure_logging(level: str) -> None:
    """Log lines on stderr, one per event, with the time and the level."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("[snerd worker] %(asctime)s %(levelname)s %(message)s")
    )
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False


def _quote(text: str) -> str:
    """`text` as one word of a log line (quoted, JSON-style, when it has blanks or quotes)."""
    if text and not any(c.isspace() or c in "\"'=" for c in text) and text.isprintable():
        return text
    return json.dumps(text)


def _log_attempt(ended: AttemptEnded) -> None:
    """One line per attempt: id, type, attempt, outcome, duration (and the error)."""
    line = (
        f"job id={_quote(ended.task_id)} type={_quote(ended.task_type)} "
        f"attempt={ended.attempt if ended.attempt is not None else '-'} "
        f"outcome={ended.outcome.replace(' ', '_')} duration={ended.seconds:.3f}s "
        f"in={ended.isolation}"
    )
    if ended.error is not None:
        line += f" error={_quote(ended.error)}"
    logger.log(logging.INFO if ended.outcome == "succeeded" else logging.WARNING, line)


async def _say_ready(face: SnerdQueue | Engine) -> None:
    """Log `ready` once the daemon answers (it has loaded its shards): from then on an
    enqueue anywhere on the queue reaches this worker."""
    with contextlib.suppress(SnerdError):
        await face.stats(timeout=None)
        daemon = face.pid if isinstance(face, SnerdQueue) else None
        where = f"daemon pid {daemon}" if daemon is not None else "in-process engine"
        logger.info("worker %d: ready (%s)", os.getpid(), where)


async def _serve(face: SnerdQueue | Engine) -> int:
    """Run `face` until a signal stops it or its daemon dies; the exit code."""
    face.on_attempt(_log_attempt)
    asked = stopped_now = False
    # Signals are caught from before the start: a SIGTERM during it is a warm shutdown too.
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        try:
            await face.start()
        except Exception as exc:  # a directory that cannot hold a queue, no daemon binary
            logger.error("the queue did not start: %s", describe_error(exc))
            return EXIT_USAGE
        async with anyio.create_task_group() as tg:
            tg.start_soon(_say_ready, face)

            async def on_signals() -> None:
                nonlocal asked, stopped_now
                count = 0
                async for signum in signals:
                    count += 1
                    asked = True
                    name = signal.Signals(signum).name
                    if count == 1:
                        logger.warning(
                            "%s: warm shutdown: no new work; attempts in flight finish within "
                            "the drain timeout, or are handed back (a second signal stops now)",
                            name,
                        )
                        tg.start_soon(face.shutdown)
                    else:
                        logger.warning("%s again: stopping now", name)
                        stopped_now = True
                        tg.start_soon(face.shutdown, 0)

            tg.start_soon(on_signals)
            await face.wait_exited()
            tg.cancel_scope.cancel()
        code = await face.shutdown()  # (it has exited: this waits for its host to finish)
    if stopped_now:
        return EXIT_STOPPED
    if code != 0:
        how = (
            f"was killed by signal {-code}"
            if code is not None and code < 0
            else f"exited with code {code}"
        )
        logger.error("the daemon %s; stopping", how)
        return EXIT_STOPPED
    if not asked:
        logger.error("the daemon exited by itself; stopping")
        return EXIT_STOPPED
    logger.info("worker %d: stopped", os.getpid())
    return 0
