"""`snerdmq add-shards N DIR`: grow a queue by N shards.

The document change is the core's (`snerd.core.ownership.grow`); this module makes the new
shard directories (each entry fsynced, never through a link) and replaces membership.json
under `.membership.lock`, conditionally on the version it read (`update_membership`), reading
again when a daemon renewed in between.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Sequence
from pathlib import Path

from snerd.cli.args import QueueError, UsageError, command_parser, positive_int, run_command
from snerd.core.ownership import (
    MAX_QUEUE_SHARDS,
    MembershipInvalid,
    OwnershipConfig,
    grow,
    shard_name,
)
from snerd.io.files import make_dirs
from snerd.io.log import fsync_dir
from snerd.io.membership import MembershipConflict, read_membership, update_membership
from snerd.queuedir import MEMBERSHIP

__all__ = ["main"]

#: Daemons renew (and so notice new shards) every third of the lease.
_RENEW_S = OwnershipConfig().renew_interval_us // 1_000_000


def main(argv: Sequence[str]) -> int:
    """`snerdmq add-shards N DIR`."""
    parser = command_parser(
        "add-shards",
        "Grow the queue in DIR by N shards: under .membership.lock, shards += N, "
        "shard-k/tasks/ created for each new shard, version += 1, membership.json replaced "
        "atomically. Shards are never removed and existing tasks stay where they are. Running "
        f"daemons claim the new shards at their next renewal (within {_RENEW_S} s).",
        "On a directory without membership.json (snerd's addition: upstream refused it), a "
        "queue of N shards is created, and DIR itself if it does not exist. A directory in "
        "the upstream v0.2 layout (tasks/tasks.log) is refused: start a daemon on it once so "
        "it is adopted first.",
    )
    parser.add_argument("n", metavar="N", type=positive_int("N"), help="shards to add (>= 1)")
    parser.add_argument("directory", metavar="DIR", help="queue directory")
    return run_command(parser, argv, _add_shards)


def _add_shards(args: argparse.Namespace) -> int:
    directory = Path(args.directory)
    n: int = args.n
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"DIR {args.directory!r} is not a directory")
    created_dir = not directory.exists()
    if created_dir:
        directory.mkdir(parents=True)
        fsync_dir(directory.parent)
    elif (
        not (directory / MEMBERSHIP).exists()
        and (directory / "tasks" / "tasks.log").exists()
    ):
        raise QueueError(
            f"{args.directory} uses the upstream SnerdMQ v0.2 layout (tasks/tasks.log); start "
            f"`snerdmq {args.directory}` once so it is adopted into shard-0, then add shards"
        )
    for _ in range(50):
        try:
            doc = read_membership(directory)
        except MembershipInvalid as exc:
            raise QueueError(str(exc)) from None
        except (ValueError, TypeError) as exc:
            raise QueueError(f"{directory / MEMBERSHIP} is unreadable: {exc}") from None
        except TimeoutError as exc:
            raise QueueError(str(exc)) from None
        old = 0
        if doc is not None:
            shards = doc.get("shards")
            if not isinstance(shards, int) or isinstance(shards, bool) or shards < 0:
                raise QueueError(f"{directory / MEMBERSHIP}: 'shards' is {shards!r}")
            old = shards
        if old + n > MAX_QUEUE_SHARDS:
            raise UsageError(
                f"N={n}: the queue has {old} shard(s); {old + n} is more than the "
                f"{MAX_QUEUE_SHARDS} a queue may have"
            )
        new_doc = grow(doc, n)
        # Written only if the document is still the one read (`grow` counts its version on).
        expected = None if doc is None else new_doc["version"] - 1
        made: list[Path] = []
        for k in range(old, old + n):
            tasks = directory / shard_name(k) / "tasks"
            if not os.path.lexists(tasks):
                try:  # never through a link below DIR (each new entry fsynced)
                    make_dirs(tasks, root=directory)
                except OSError as exc:
                    _remove_empty(made)
                    raise QueueError(f"cannot create {tasks}: {exc}") from None
                made.append(tasks)
        try:
            update_membership(directory, new_doc, expected)
        except MembershipConflict:
            # A daemon renewed meanwhile (or another add-shards won): read again and redo.
            _remove_empty(made)
            continue
        except TimeoutError as exc:
            _remove_empty(made)
            raise QueueError(str(exc)) from None
        except BaseException:
            _remove_empty(made)
            raise
        what = "Created a new queue with" if doc is None else f"Added {n} shard(s):"
        if doc is None:
            print(f"{what} {n} shard(s) in {directory} (version {new_doc['version']}).")
        else:
            print(
                f"{what} {directory} now has {old + n} shards (shard-{old}..shard-{old + n - 1} "
                f"new), version {new_doc['version']}."
            )
            print(f"Running daemons claim the new shards at their next renewal (within {_RENEW_S} s).")
        return 0
    raise QueueError("membership.json kept changing under us; try again")


def _remove_empty(dirs: list[Path]) -> None:
    for tasks in dirs:
        with contextlib.suppress(OSError):
            tasks.rmdir()
            tasks.parent.rmdir()
