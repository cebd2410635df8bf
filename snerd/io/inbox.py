"""Inbox files: tasks a daemon takes for a shard it does not own (DESIGN §3).

`shard-N/inbox/<node>.log` is written only by the daemon `<node>` (appends through the
group-commit log, exactly like `tasks.log`: one record per line, checksummed, fsynced before
the ack) and read only by the shard's owner, which copies the tasks into `tasks.log` and
records there how far it has read each file (`snerd.core.node.Node._ingest`). A node id is
unique per process start, so a file has one writer for its whole life and a crashed writer's
torn last line is never followed by another.

This module owns the paths and the reading: what is new in every inbox of some shards, from
given offsets, complete lines only (a line still being written is left for the next read).
Blocking: run `read_inboxes` in a worker thread.
"""

from __future__ import annotations

import os
from pathlib import Path

from snerd.core import events as ev
from snerd.io.log import read_log

__all__ = ["INBOX", "inbox_path", "is_inbox_path", "read_inboxes"]

#: The inbox folder inside a shard's folder, and the suffix of an inbox file.
INBOX = "inbox"
_SUFFIX = ".log"


def _file_name(node: str) -> str:
    """The file name of `node`'s inbox (a node id never holds a path separator; be sure)."""
    return node.replace(os.sep, "_").replace("\0", "_") + _SUFFIX


def inbox_path(directory: str | os.PathLike[str], shard: int, node: str) -> str:
    return os.path.join(directory, f"shard-{shard}", INBOX, _file_name(node))


def is_inbox_path(path: str) -> bool:
    """True for a path `inbox_path` makes (the group-commit log never cuts such a file)."""
    return os.path.basename(os.path.dirname(path)) == INBOX and path.endswith(_SUFFIX)


def read_inboxes(
    directory: str | os.PathLike[str],
    offsets: dict[int, dict[str, int]],
    max_bytes: int,
) -> tuple[list[ev.InboxChunk], list[tuple[int, str]]]:
    """What is new in the inboxes of the shards in `offsets` (shard -> {node: offset read}):
    one chunk per file that grew, holding its complete lines from the offset on, at most about
    `max_bytes` of them; and the errors met, as (shard, text). A missing inbox folder is an
    empty inbox."""
    chunks: list[ev.InboxChunk] = []
    errors: list[tuple[int, str]] = []
    for shard, known in offsets.items():
        folder = Path(directory, f"shard-{shard}", INBOX)
        try:
            with os.scandir(folder) as entries:
                files = [
                    (e.name[: -len(_SUFFIX)], e.path, e.stat().st_size)
                    for e in entries
                    if e.name.endswith(_SUFFIX) and not e.name.startswith(".")
                ]
        except FileNotFoundError:
            continue
        except OSError as exc:
            errors.append((shard, f"{folder}: {exc.strerror or exc}"))
            continue
        for node, path, size in sorted(files):
            start = known.get(node, 0)
            if size <= start:
                continue
            try:
                chunk = _read_one(shard, node, path, start, max_bytes)
            except OSError as exc:
                errors.append((shard, f"{path}: {exc.strerror or exc}"))
                continue
            if chunk is not None:
                chunks.append(chunk)
    return chunks, errors


def _read_one(shard: int, node: str, path: str, start: int, max_bytes: int) -> ev.InboxChunk | None:
    records: list[ev.LogRecord] = []
    corrupt: list[tuple[int, str]] = []
    end = start
    for part in read_log(path, start=start, chunk_bytes=min(max_bytes, 1 << 20)):
        records.extend(part.records)
        corrupt.extend(part.corrupt)
        end = part.end
        if end - start >= max_bytes:
            break
    if end <= start:
        return None
    return ev.InboxChunk(
        shard=shard,
        node=node,
        start=start,
        end=end,
        records=tuple(records),
        corrupt=tuple(corrupt),
    )
