"""The command-line plumbing every `snerdmq` subcommand shares: its parser, how it runs, the
argument types, the errors and their exit codes.

A subcommand builds its parser with `command_parser(...)` and hands it with its body to
`run_command`, which turns every way out into an exit code: `--help` 0, a bad argument or
environment value 2 (the usage, then `snerdmq <command>: error: <what>`, one line on stderr), a
queue that cannot be acted on 1. `UsageError` and `QueueError` are the queue reader's (`snerd.queuedir`, which
raises them); they are re-exported here for the commands. It must never print a traceback for
bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import TypeVar

from snerd.config import ConfigError, ToolSettings, load_tool_settings
from snerd.queuedir import QueueError, UsageError

__all__ = [
    "DEFAULT_DIR",
    "EXIT_NOT_DONE",
    "EXIT_PENDING",
    "QueueError",
    "UsageError",
    "command_parser",
    "nonnegative_float",
    "nonnegative_int",
    "number_arg",
    "positive_int",
    "run_command",
    "tool_settings",
]

DEFAULT_DIR = ".snerdata"
#: The exit codes of the job-control commands (`cancel`, `retry`, `pause`, `resume`) beyond
#: 0 (done), 1 (`QueueError`) and 2 (`UsageError`): the owner answered and nothing changed;
#: no owner answered within the wait (the command is durable and applied later).
EXIT_NOT_DONE = 3
EXIT_PENDING = 4

_N = TypeVar("_N", int, float)


def command_parser(command: str, description: str, epilog: str | None = None) -> argparse.ArgumentParser:
    """The parser of `snerdmq <command>`: the description and epilog printed as written."""
    return argparse.ArgumentParser(
        prog=f"snerdmq {command}",
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def run_command(
    parser: argparse.ArgumentParser,
    argv: Sequence[str],
    body: Callable[[argparse.Namespace], int],
) -> int:
    """Parse `argv` and run `body`; every way out is an exit code (argparse's own exits
    included: `--help` 0, a bad flag 2)."""
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    try:
        return body(args)
    except UsageError as exc:
        parser.print_usage(sys.stderr)
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    except QueueError as exc:
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `snerdmq dlq DIR | head`
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keep Python's exit quiet
        return 1


def number_arg(
    name: str,
    convert: Callable[[str], _N],
    kind: str,
    bound: str,
    ok: Callable[[_N], bool],
) -> Callable[[str], _N]:
    """An argparse `type=`: `convert(text)`, which must be `ok`; refused with
    `<name> must be <kind>, got '<text>'` (it does not convert) or `<name> must be <bound>,
    got '<text>'` (it is out of range)."""

    def parse(text: str) -> _N:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be {kind}, got {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"{name} must be {bound}, got {text!r}")
        return value

    return parse


def positive_int(name: str) -> Callable[[str], int]:
    """An argparse `type=`: a whole number of at least 1."""
    return number_arg(name, int, "a whole number of at least 1", "at least 1", lambda v: v >= 1)


def nonnegative_int(name: str) -> Callable[[str], int]:
    """An argparse `type=`: a whole number, 0 or more."""
    return number_arg(name, int, "a whole number", "0 or more", lambda v: v >= 0)


def nonnegative_float(name: str) -> Callable[[str], float]:
    """An argparse `type=`: a finite number, 0 or more."""
    return number_arg(
        name, float, "a number", "a finite number, 0 or more",
        lambda v: 0 <= v < float("inf"),
    )


def tool_settings() -> ToolSettings:
    """The settings the tools share with the daemons (`snerd.config.load_tool_settings`), a
    bad one a UsageError naming it, as the daemon would refuse it."""
    try:
        return load_tool_settings()
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
