"""`snerdmq [DIR]`: the daemon itself, on a data directory, speaking JSON lines on stdin/stdout.

Before anything else it gives a closed standard descriptor /dev/null (and refuses to run with
stdin or stdout closed), reads its settings (`snerd.config.load_settings`: a bad one is exit
2), checks the data directory (`snerd.io.datadir`) and the filesystem (unless `--force`), then
runs (`snerd.io.stdio.run_daemon`). Each refusal is one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from snerd.config import ConfigError, load_settings
from snerd.io.datadir import DataDirectoryError, prepare_data_directory
from snerd.io.fscheck import FilesystemRefused
from snerd.io.layout import LegacyDaemonRunning
from snerd.io.stdio import run_daemon

__all__ = ["main"]

DEFAULT_DIR = ".snerdata"
#: The standard descriptors the daemon speaks on, and what each is for.
_STREAMS = {0: ("stdin", "reads the SDK's requests"), 1: ("stdout", "answers the SDK")}


def _closed_streams() -> list[int]:
    """Which of fds 0, 1 and 2 were closed when this process started; each is given /dev/null
    at once. A closed standard fd is the first number open(2) hands out, so the daemon's first
    file (a lock, a log) would get it, and a line meant for stdout or stderr would land there."""
    closed = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            closed.append(fd)
    for fd in closed:
        null = os.open(os.devnull, os.O_RDWR)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
    if 2 in closed and sys.stderr is None:
        # Else print(file=sys.stderr) would write to sys.stdout, the protocol's stream.
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115 - for the process's life
    return closed


def _refuse(text: str) -> int:
    print(f"[Snerd] ERROR: refusing to start: {text}", file=sys.stderr)
    return 2


def main(argv: Sequence[str], subcommands: Sequence[str] = ()) -> int:
    """`snerdmq [DIR] [--force]`: run the daemon; `subcommands` are named in `--help`."""
    parser = argparse.ArgumentParser(
        prog="snerdmq",
        description=(
            "Run the snerd daemon on DIR: JSON lines on stdin/stdout, logs on stderr. "
            "Subcommands: " + ", ".join(sorted(subcommands)) + " (each has --help)."
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
    # A closed stderr gets /dev/null and the daemon runs (nobody reads its logs); a closed
    # stdin or stdout is refused, said on stderr when that is open.
    for fd in _closed_streams():
        if fd in _STREAMS:
            name, use = _STREAMS[fd]
            return _refuse(
                f"{name} (fd {fd}) is closed, and the daemon {use} on it; start it with {name} "
                "open (a pipe, or /dev/null)"
            )
    try:
        settings = load_settings()
    except ConfigError as exc:
        print(f"snerdmq: error: {exc}", file=sys.stderr)
        return 2
    if args.force:
        settings = dataclasses.replace(settings, force_filesystem=True)
    directory = Path(args.directory)
    try:
        prepare_data_directory(directory)
    except DataDirectoryError as exc:
        return _refuse(str(exc))
    try:
        return run_daemon(directory, settings)
    except LegacyDaemonRunning as exc:
        print(f"[Snerd] ERROR: {exc}", file=sys.stderr)
        return 1
    except FilesystemRefused as exc:
        print(f"[Snerd] ERROR: {exc}", file=sys.stderr)
        return 2
