"""Inbox files: tasks a daemon takes for a shard it does not own (DESIGN §3).

`shard-N/inbox/<node>.log` is written only by the daemon `<node>` (appends through the
group-commit log, exactly like `tasks.log`: one record per line, checksummed, fsynced before
the ack) and read only by the shard's owner, which copies the tasks into `tasks.log` and
records there how far it has read each file (`snerd.core.node.Node._ingest`). A node id is
unique per process start, so a file has one writer for its whole life and a crashed writer's
torn last line is never followed by another.

This module owns the paths and the reading: what is new in every inbox of some shards, from
given offsets, complete lines only (a line still being written is left for the next read);
and the clean-up hints: the owner writes how far it has ingested a file into
`<segment>.read` beside it, and the writer, which alone removes its files, reads that back.
Blocking: run these in a worker thread.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from snerd.core import events as ev
from snerd.io.log import read_log

__all__ = [
    "INBOX",
    "inbox_files",
    "inbox_path",
    "inbox_progress",
    "mark_read",
    "read_inboxes",
    "remove_inbox",
]

#: The inbox folder inside a shard's folder, and the suffix of an inbox file.
INBOX = "inbox"
_SUFFIX = ".log"


def _file_name(node: str) -> str:
    """The file name of `node`'s inbox (a node id never holds a path separator; be sure)."""
    return node.replace(os.sep, "_").replace("\0", "_") + _SUFFIX


def inbox_path(directory: str | os.PathLike[str], shard: int, node: str) -> str:
    return os.path.join(directory, f"shard-{shard}", INBOX, _file_name(node))


def _hint_path(directory: str | os.PathLike[str], shard: int, segment: str) -> str:
    return inbox_path(directory, shard, segment)[: -len(_SUFFIX)] + ".read"


def mark_read(directory: str | os.PathLike[str], shard: int, segment: str, offset: int) -> None:
    """Replace `<segment>.read` with `offset`: write a temp file, rename it over. Atomic, but
    not fsynced: it is a hint, written after the ingestion it reports is durable, so a hint
    lost in a crash only delays the clean-up (and a damaged one reads as no hint)."""
    path = _hint_path(directory, shard, segment)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(f"{offset}\n".encode())
    os.replace(tmp, path)


def inbox_progress(
    directory: str | os.PathLike[str], segments: tuple[tuple[int, str], ...]
) -> list[tuple[int, str, int | None, int | None]]:
    """Per (shard, segment): the offset its `.read` hint holds (None: none, or unreadable) and
    the file's size (None: no such file)."""
    out: list[tuple[int, str, int | None, int | None]] = []
    for shard, segment in segments:
        try:
            size: int | None = os.stat(inbox_path(directory, shard, segment)).st_size
        except FileNotFoundError:
            size = None
        except OSError:
            continue  # unknown: ask again later
        try:
            with open(_hint_path(directory, shard, segment), "rb") as f:
                read: int | None = int(f.read(32).strip())
        except (OSError, ValueError):
            read = None
        out.append((shard, segment, read, size))
    return out


def remove_inbox(directory: str | os.PathLike[str], shard: int, segment: str) -> None:
    """Unlink an inbox file, then its hint (a missing one is no error)."""
    for path in (inbox_path(directory, shard, segment), _hint_path(directory, shard, segment)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def inbox_files(directory: str | os.PathLike[str], shard: int) -> list[tuple[str, str, int]]:
    """The inbox files of a shard as (name without `.log`, path, size), by name. Raises
    FileNotFoundError when the shard has no inbox folder."""
    with os.scandir(Path(directory, f"shard-{shard}", INBOX)) as entries:
        return sorted(
            (e.name[: -len(_SUFFIX)], e.path, e.stat().st_size)
            for e in entries
            if e.name.endswith(_SUFFIX) and not e.name.startswith(".")
        )


def read_inboxes(
    directory: str | os.PathLike[str],
    offsets: dict[int, dict[str, int]],
    max_bytes: int,
) -> tuple[list[ev.InboxChunk], list[tuple[int, str]], list[tuple[int, tuple[str, ...]]]]:
    """What is new in the inboxes of the shards in `offsets` (shard -> {node: offset read}):
    one chunk per file that grew, holding its complete lines from the offset on, at most about
    `max_bytes` of them; the errors met, as (shard, text); and per shard listed, the inbox
    files it holds (names without `.log`). A missing inbox folder is an empty inbox."""
    chunks: list[ev.InboxChunk] = []
    errors: list[tuple[int, str]] = []
    present: list[tuple[int, tuple[str, ...]]] = []
    for shard, known in offsets.items():
        try:
            files = inbox_files(directory, shard)
        except FileNotFoundError:
            present.append((shard, ()))
            continue
        except OSError as exc:
            folder = Path(directory, f"shard-{shard}", INBOX)
            errors.append((shard, f"{folder}: {exc.strerror or exc}"))
            continue
        present.append((shard, tuple(name for name, _, _ in files)))
        for node, path, size in files:
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
    return chunks, errors, present


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
