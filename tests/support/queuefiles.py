"""A queue directory's files written by hand, for the tests of the shell's readers
(tests/io/test_scan.py, test_inbox.py): a shard's log, created with its folders, and appends
to a file as another process would make them."""

from __future__ import annotations

from pathlib import Path

__all__ = ["append", "log_path"]


def log_path(q: Path, shard: int = 0) -> Path:
    """`q/shard-N/tasks/tasks.log`, its folders made."""
    path = q / f"shard-{shard}" / "tasks" / "tasks.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def append(path: Path, data: bytes) -> None:
    with path.open("ab") as f:
        f.write(data)
