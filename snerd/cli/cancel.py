"""`snerdmq cancel ID DIR`: cancel a task, whichever daemon holds it.

The command is sent through the shards' inboxes (`snerd.commands`) and decided by the owner
of the task's shard (`snerd.core.control`); this module parses, prints the answer, and turns
it into an exit code (`snerd.cli.args`: 0 done, 3 nothing to change, 4 pending). The shared
parts of the task commands (`retry` too) are here: the `--wait` and `--json` flags and how an
answer is printed.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from snerd import commands
from snerd.cli.args import (
    EXIT_NOT_DONE,
    EXIT_PENDING,
    command_parser,
    nonnegative_float,
    run_command,
)
from snerd.cli.text import print_json
from snerd.core.ownership import shard_name

__all__ = ["add_wait", "main", "pending_text", "print_task_answer", "task_command"]

_PAST = {"cancel": "cancelled", "retry": "put back in the queue"}


def main(argv: Sequence[str]) -> int:
    """`snerdmq cancel ID DIR [--wait S] [--json]`."""
    return task_command(
        "cancel",
        "Cancel the task ID of the queue in DIR: a queued, delayed, blocked or retrying task "
        "never runs; a running attempt is ended as cancelled (its handler is told to stop "
        "when it registered its type as cancellable). Decided by the daemon that owns the "
        "task's shard, reached through the shard inboxes; safe while daemons run.",
        argv,
        lambda directory, task_id, wait: commands.cancel(directory, task_id, wait),
    )


def task_command(
    action: str,
    description: str,
    argv: Sequence[str],
    send: Callable[[str, str, float], commands.TaskAnswer],
) -> int:
    """The body of `cancel` and `retry`: parse, send, print."""
    parser = command_parser(action, description, _EPILOG)
    parser.add_argument("task_id", metavar="ID", help="the task id")
    parser.add_argument("directory", metavar="DIR", help="queue directory")
    add_wait(parser)

    def body(args: argparse.Namespace) -> int:
        answer = send(args.directory, args.task_id, args.wait)
        print_task_answer(answer, as_json=args.json)
        return task_exit(answer)

    return run_command(parser, argv, body)


_EPILOG = (
    "Exit status: 0 done; 3 the owner answered and nothing changed (an unknown id, a task "
    "in a state the command does not change); 4 pending: no daemon answered within the "
    "wait (or none runs): the command is durable in the shard inboxes and is applied when "
    "a daemon next takes the shard; 1 the queue cannot be written; 2 a bad argument."
)


def add_wait(parser: argparse.ArgumentParser, *, json: bool = True) -> None:
    parser.add_argument(
        "--wait", type=nonnegative_float("--wait"), default=commands.DEFAULT_WAIT_S,
        metavar="S", help=f"seconds to wait for the owners' answers "
        f"(default {commands.DEFAULT_WAIT_S:g})",
    )
    if json:
        parser.add_argument("--json", action="store_true", help="print the answer as JSON")


def task_exit(answer: commands.TaskAnswer) -> int:
    if answer.done:
        return 0
    return EXIT_PENDING if answer.pending else EXIT_NOT_DONE


def pending_text(pending: Sequence[int], unowned: Sequence[int]) -> str:
    """Why shards did not answer, and what becomes of the command there."""
    names = ", ".join(shard_name(s) for s in pending)
    free = ", ".join(shard_name(s) for s in unowned)
    why = f"no daemon holds {free}" if unowned else "no answer within the wait"
    if unowned and len(unowned) < len(pending):
        why += "; the others did not answer within the wait"
    return (
        f"pending on {names} ({why}): the command is durable in their inboxes and is "
        "applied when a daemon next takes them"
    )


def print_task_answer(answer: commands.TaskAnswer, *, as_json: bool) -> None:
    if as_json:
        print_json(answer.json())
        return
    where = f" in {shard_name(answer.shard)}" if answer.shard is not None else ""
    if answer.done:
        print(f"Task {answer.task_id} {_PAST[answer.action]}{where} (it was {answer.found}).")
    elif answer.pending:
        print(f"Task {answer.task_id}: {pending_text(answer.pending, answer.unowned)}.")
    elif answer.found == "unknown":
        print(f"Task {answer.task_id}: no shard holds it (unknown id, or compacted away).")
    else:
        print(f"Task {answer.task_id} not {_PAST[answer.action]}: it is {answer.found}{where}.")
