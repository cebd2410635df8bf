"""`snerdmq pause TYPE DIR` and `snerdmq resume TYPE DIR` (or `--all`): stop and restart
the dispatch of a task type, or of the whole queue, on every daemon.

Sent through every shard's inbox (`snerd.commands`); each shard's owner writes a `pause`
record, the latest stamp winning (`snerd.core.control`). Exit status as `snerdmq cancel`'s:
0 applied on every shard, 4 pending on some.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from snerd import commands
from snerd.cli.args import EXIT_PENDING, UsageError, command_parser, run_command
from snerd.cli.cancel import add_wait, pending_text
from snerd.cli.text import print_json

__all__ = ["main", "resume_main"]


def main(argv: Sequence[str]) -> int:
    """`snerdmq pause (TYPE | --all) DIR [--wait S] [--json]`."""
    return _command(
        "pause",
        "Pause the task type TYPE (--all: every type) of the queue in DIR: no new attempt of "
        "it starts on any daemon until `snerdmq resume`; running attempts finish; enqueues "
        "are still taken. Kept in each shard's log, so a restarted daemon stays paused.",
        argv,
    )


def resume_main(argv: Sequence[str]) -> int:
    """`snerdmq resume (TYPE | --all) DIR [--wait S] [--json]`."""
    return _command(
        "resume",
        "Resume the task type TYPE (--all: the whole queue) of the queue in DIR, paused by "
        "`snerdmq pause`: its ready tasks are dispatched again. (Resuming --all does not "
        "resume a type paused on its own.)",
        argv,
    )


def _command(action: str, description: str, argv: Sequence[str]) -> int:
    parser = command_parser(
        action, description,
        "Exit status: 0 applied on every shard; 4 pending on some (no daemon holds them, or "
        "none answered within the wait: applied when a daemon next takes them); 1 the queue "
        "cannot be written; 2 a bad argument.",
    )
    parser.add_argument("target", metavar="TYPE", nargs="?", help="the task type")
    parser.add_argument("directory", metavar="DIR", nargs="?", help="queue directory")
    parser.add_argument("--all", action="store_true", help="the whole queue, every type")
    add_wait(parser)

    def body(args: argparse.Namespace) -> int:
        task_type, directory = _target(args)
        send = commands.pause if action == "pause" else commands.resume
        answer = send(directory, task_type, args.wait)
        if args.json:
            print_json(answer.json())
        else:
            _print(answer)
        return EXIT_PENDING if answer.pending else 0

    return run_command(parser, argv, body)


def _target(args: argparse.Namespace) -> tuple[str | None, str]:
    """(TYPE or None for --all, DIR): `pause TYPE DIR`, or `pause --all DIR`."""
    given = [a for a in (args.target, args.directory) if a is not None]
    if args.all:
        if len(given) != 1:
            raise UsageError("with --all, give only DIR")
        return None, given[0]
    if len(given) != 2:
        raise UsageError("give TYPE and DIR (or --all and DIR)")
    if not given[0]:
        raise UsageError("TYPE must not be empty")
    return given[0], given[1]


def _print(answer: commands.PauseAnswer) -> None:
    what = "the whole queue" if answer.task_type is None else f"type {answer.task_type!r}"
    done = "paused" if answer.paused else "resumed"
    if not answer.pending:
        print(f"{what[0].upper()}{what[1:]} {done} on all {answer.shards} shard(s).")
        return
    applied = answer.shards - len(answer.pending)
    print(f"{what[0].upper()}{what[1:]} {done} on {applied} of {answer.shards} shard(s); "
          f"{pending_text(answer.pending, answer.unowned)}.")
