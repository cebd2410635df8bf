"""The `snerdmq` command.

`snerdmq [DIR]` runs the daemon (upstream's invocation: a bare positional directory, default
`.snerdata`; `snerd.cli.daemon`). Any other first word is a subcommand (`SUBCOMMANDS`, one
module each); each has `--help`. A bad argument or environment value is a clear error naming
it, with exit code 2; so is a data directory that cannot hold a queue (not a directory,
read-only, not writable: `snerd.io.datadir`), one on a filesystem the startup check refuses
(unless `--force`), and a daemon started with its stdin or stdout closed. Each is one line on
stderr, never a traceback.

    snerdmq stats DIR [--json]                     what each shard holds, from the files
    snerdmq validate DIR [--json]                  health check of the cluster; exit 1: degraded
    snerdmq add-shards N DIR                       grow the queue by N shards
    snerdmq dlq DIR [--type T] [--id ID] [--json]  list dead letters
    snerdmq schedules DIR [--json]                 list the named schedules, with their next fire
    snerdmq status ID DIR [--json]                 one task: its state, details and every record
    snerdmq replay [--type T] [--id ID] [DIR]      put dead letters back (live: as retries)
    snerdmq cancel ID DIR [--wait S] [--json]      cancel a task, live (through the inboxes)
    snerdmq retry ID DIR [--wait S] [--json]       put a dead or cancelled task back, live
    snerdmq pause (TYPE | --all) DIR               stop dispatching a type on every daemon
    snerdmq resume (TYPE | --all) DIR              dispatch it again
    snerdmq purge DIR (--type T | --all)           forget dead letters and cancelled tasks
    snerdmq fsck DIR [--repair] [--json]           check every shard log, byte by byte
    snerdmq compact DIR [--history N]              offline compaction of idle shards
    snerdmq demo [DIR]                             a guided tour
    snerdmq dashboard DIR [--host H] [--port P]    a live web dashboard
    snerdmq worker MODULE:ATTR [--concurrency N]   run an application's handlers (`rq worker`)

The subcommands read a queue directory the way a daemon would (`snerd.queuedir`: folded by
`snerd.core.shardlog`, the same rules as the daemon's replay) and leave every rule about
tasks, leases and health to the core (`snerd.core.status`, `health`, `ownership`, `story`).
Read-only commands (stats, validate, dlq, schedules, status, fsck without --repair) never write
and never take `.membership.lock`; the lock probe is a non-blocking flock released at once. A
command that writes a shard log (replay, purge, compact, fsck --repair) first takes that shard's lock
as a daemon does, and refuses a shard a daemon holds, naming it; membership.json is only
changed conditionally on the version read, under `.membership.lock`. Appends and compaction go
through `GroupCommitLog`, with the daemon's crash-safety. The job-control commands (cancel,
retry, pause, resume, and replay and purge while a daemon holds a shard) write no shard log: they write a
command into the shards' inboxes, as a daemon that does not own a shard does, and the owner
decides it (`snerd.commands`).

It must never: write a log whose lock it does not hold, delete another process's claim, decide
something about tasks differently from the daemon's replay, or print machine output on stderr.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

__all__ = ["SUBCOMMANDS", "main"]

# The lazy subcommand table. Each entry imports its module only when it runs: a command then
# loads only what it needs (`stats` neither the daemon's runtime nor the web stack, the daemon
# not the dashboard), and the daemon starts in a third of the time the whole CLI would take
# to import. These are the only function-level imports in snerd.cli; import-linter sees them.


def _stats(argv: Sequence[str]) -> int:
    from snerd.cli import stats

    return stats.main(argv)


def _validate(argv: Sequence[str]) -> int:
    from snerd.cli import validate

    return validate.main(argv)


def _add_shards(argv: Sequence[str]) -> int:
    from snerd.cli import add_shards

    return add_shards.main(argv)


def _dlq(argv: Sequence[str]) -> int:
    from snerd.cli import dlq

    return dlq.main(argv)


def _schedules(argv: Sequence[str]) -> int:
    from snerd.cli import schedules

    return schedules.main(argv)


def _status(argv: Sequence[str]) -> int:
    from snerd.cli import status

    return status.main(argv)


def _replay(argv: Sequence[str]) -> int:
    from snerd.cli import dlq

    return dlq.replay_main(argv)


def _cancel(argv: Sequence[str]) -> int:
    from snerd.cli import cancel

    return cancel.main(argv)


def _retry(argv: Sequence[str]) -> int:
    from snerd.cli import retry

    return retry.main(argv)


def _pause(argv: Sequence[str]) -> int:
    from snerd.cli import pause

    return pause.main(argv)


def _resume(argv: Sequence[str]) -> int:
    from snerd.cli import pause

    return pause.resume_main(argv)


def _purge(argv: Sequence[str]) -> int:
    from snerd.cli import purge

    return purge.main(argv)


def _fsck(argv: Sequence[str]) -> int:
    from snerd.cli import fsck

    return fsck.main(argv)


def _compact(argv: Sequence[str]) -> int:
    from snerd.cli import compact

    return compact.main(argv)


def _demo(argv: Sequence[str]) -> int:
    from snerd.cli import demo

    return demo.main(argv)


def _dashboard(argv: Sequence[str]) -> int:
    from snerd.cli import dashboard

    return dashboard.main(argv)


def _worker(argv: Sequence[str]) -> int:
    from snerd.cli import worker

    return worker.main(argv)


def _daemon(argv: Sequence[str]) -> int:
    from snerd.cli import daemon

    return daemon.main(argv, subcommands=sorted(SUBCOMMANDS))


SUBCOMMANDS: dict[str, Callable[[Sequence[str]], int]] = {
    "stats": _stats,
    "validate": _validate,
    "add-shards": _add_shards,
    "dlq": _dlq,
    "schedules": _schedules,
    "status": _status,
    "replay": _replay,
    "cancel": _cancel,
    "retry": _retry,
    "pause": _pause,
    "resume": _resume,
    "purge": _purge,
    "fsck": _fsck,
    "compact": _compact,
    "demo": _demo,
    "dashboard": _dashboard,
    "worker": _worker,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `snerdmq` console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in SUBCOMMANDS:
        return SUBCOMMANDS[args[0]](args[1:])
    return _daemon(args)
