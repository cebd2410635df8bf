"""The `snerdmq` command.

`snerdmq [DIR]` runs the daemon (upstream's invocation: a bare positional directory, default
`.snerdata`). Any other first word is a subcommand; each has `--help`. A bad argument or
environment value is a clear error naming it, with exit code 2; so is a data directory on a
filesystem the startup check refuses (unless `--force`).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["main"]

DEFAULT_DIR = ".snerdata"


def _daemon(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="snerdmq",
        description=(
            "Run the snerd daemon on DIR: JSON lines on stdin/stdout, logs on stderr. "
            "Subcommands: " + ", ".join(sorted(SUBCOMMANDS)) + " (each has --help)."
        ),
    )
    parser.add_argument("directory", nargs="?", default=DEFAULT_DIR, help="data directory")
    parser.add_argument(
        "--force",
        action="store_true",
        help=(
            "start even on a filesystem the startup check refuses (NFSv3, SMB/CIFS, FUSE "
            "object stores, a failed lock probe), with a warning; same as "
            "SNERD_FORCE_FILESYSTEM=1"
        ),
    )
    args = parser.parse_args(argv)
    # Imported here: the daemon's modules (trio, the core) are not needed by the subcommands,
    # which then start in a third of the time.
    from snerd.config import ConfigError, load_settings

    try:
        settings = load_settings()
    except ConfigError as exc:
        print(f"snerdmq: error: {exc}", file=sys.stderr)
        return 2
    if args.force:
        settings = dataclasses.replace(settings, force_filesystem=True)
    from snerd.io.fscheck import FilesystemRefused
    from snerd.io.layout import LegacyDaemonRunning
    from snerd.io.stdio import run_daemon

    try:
        return run_daemon(Path(args.directory), settings)
    except LegacyDaemonRunning as exc:
        print(f"[Snerd] ERROR: {exc}", file=sys.stderr)
        return 1
    except FilesystemRefused as exc:
        print(f"[Snerd] ERROR: {exc}", file=sys.stderr)
        return 2


def _subcommands() -> dict[str, Callable[[Sequence[str]], int]]:
    from snerd import tools

    return dict(tools.SUBCOMMANDS)


SUBCOMMANDS: dict[str, Callable[[Sequence[str]], int]] = {}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `snerdmq` console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    SUBCOMMANDS.update(_subcommands())
    if args and args[0] in SUBCOMMANDS:
        return SUBCOMMANDS[args[0]](args[1:])
    return _daemon(args)


if __name__ == "__main__":
    sys.exit(main())
