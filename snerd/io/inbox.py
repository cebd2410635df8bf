"""Inbox files: tasks a daemon takes for a shard it does not own (docs/architecture.md,
"Inboxes: every daemon takes enqueues").

`shard-N/inbox/<node>.log` is written only by the daemon `<node>` (appends through the
group-commit log, exactly like `tasks.log`: one record per line, checksummed, fsynced before
the ack) and read only by the shard's owner, which copies the tasks into `tasks.log` and
records there how far it has read each file (`snerd.core.node.inbox.InboxIngest.ingest`). A
node id is unique per process start, so a file has one writer for its whole life and a crashed
writer's torn last line is never followed by another.

This module owns the paths and the reading: what is new in every inbox of some shards, from
given offsets, complete lines only (a line still being written is left for the next read);
the clean-up hints: the owner writes how far it has ingested a file into `<segment>.read`
beside it, and the writer, which alone removes its files, reads that back; and the writer's
look at the owner's log for its decisions on the enqueues it wrote (`read_log_tail`, with
`log_identity_and_size` taken before the write). Blocking: run these in a worker thread
(`log_identity_and_size` is one stat).

An inbox's last line without its newline is left unread, never cut: it is a line its writer is
still writing, or the torn write of a writer that crashed (never acknowledged). Nothing here is
reached through a symbolic link (`snerd.io.files`): a linked inbox folder is an error, and an
entry in it that is not a regular file is no inbox file (`snerdmq fsck` names it).
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable
from pathlib import Path

from snerd.core import effects as fx
from snerd.core import events as ev
from snerd.core.control import decided_in
from snerd.core.node.model import ingested
from snerd.core.records import LINE_LIMIT
from snerd.core.watch import pick_marks, resume_at
from snerd.io.files import open_dir, open_file, read_small, replace_file, unlink_file
from snerd.io.log import read_log

__all__ = [
    "INBOX",
    "inbox_files",
    "inbox_path",
    "inbox_progress",
    "log_identity_and_size",
    "mark_read",
    "read_inboxes",
    "read_log_tail",
    "remove_inbox",
    "remove_ingested",
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
    lost in a crash only delays the clean-up (and a damaged one reads as no hint). The temp
    file is created afresh (a leftover, or a link planted there, is unlinked first)."""
    path = _hint_path(directory, shard, segment)
    tmp = path + ".tmp"
    with contextlib.suppress(FileNotFoundError):
        unlink_file(tmp, root=directory)
    fd = open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, root=directory)
    try:
        os.write(fd, f"{offset}\n".encode())
    finally:
        os.close(fd)
    replace_file(tmp, path, root=directory)


def inbox_progress(
    directory: str | os.PathLike[str], segments: tuple[tuple[int, str], ...]
) -> list[tuple[int, str, int | None, int | None]]:
    """Per (shard, segment): the offset its `.read` hint holds (None: none, or unreadable) and
    the file's size (None: no such file)."""
    out: list[tuple[int, str, int | None, int | None]] = []
    for shard, segment in segments:
        try:
            st = os.lstat(inbox_path(directory, shard, segment))
        except FileNotFoundError:
            size: int | None = None
        except OSError:
            continue  # unknown: ask again later
        else:
            if not stat.S_ISREG(st.st_mode):
                continue  # not a file this writer made: never judged done
            size = st.st_size
        try:
            read: int | None = int(
                read_small(_hint_path(directory, shard, segment), 32, root=directory).strip()
            )
        except (OSError, ValueError):  # a link or odd file there reads as no hint
            read = None
        out.append((shard, segment, read, size))
    return out


def remove_inbox(directory: str | os.PathLike[str], shard: int, segment: str) -> None:
    """Unlink an inbox file, then its hint (a missing one is no error)."""
    for path in (inbox_path(directory, shard, segment), _hint_path(directory, shard, segment)):
        with contextlib.suppress(FileNotFoundError):
            unlink_file(path, root=directory)


def remove_ingested(
    directory: str | os.PathLike[str],
    shard: int,
    prefix: str,
    gone: Callable[[str], bool] = lambda _path: True,
) -> None:
    """Remove the inbox files of `shard` whose writer id starts with `prefix`, that `gone`
    says no live writer holds (given the file's path), and that their owner has taken in to
    their end (`snerd.core.node.model.ingested`). Errors are left for the next look."""
    with contextlib.suppress(OSError):
        names = tuple(
            (shard, name) for name, path, _size in inbox_files(directory, shard)
            if name.startswith(prefix) and gone(path)
        )
        for s, name, read, size in inbox_progress(directory, names):
            if size is not None and ingested(read, size):
                remove_inbox(directory, s, name)


def inbox_files(directory: str | os.PathLike[str], shard: int) -> list[tuple[str, str, int]]:
    """The inbox files of a shard as (name without `.log`, path, size), by name: regular files
    only. Raises FileNotFoundError when the shard has no inbox folder, `RefusedFile` when it or
    its shard's folder is a link."""
    folder = Path(directory, f"shard-{shard}", INBOX)
    fd = open_dir(folder, root=directory)
    try:
        with os.scandir(fd) as entries:
            found = [
                (e.name[: -len(_SUFFIX)], os.path.join(folder, e.name), e.stat().st_size)
                for e in entries
                if e.name.endswith(_SUFFIX)
                and not e.name.startswith(".")
                and e.is_file(follow_symlinks=False)
            ]
    finally:
        os.close(fd)
    return sorted(found)


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
                chunk = _read_one(shard, node, path, start, max_bytes, directory)
            except OSError as exc:
                errors.append((shard, f"{path}: {exc.strerror or exc}"))
                continue
            if chunk is not None:
                chunks.append(chunk)
    return chunks, errors, present


def _read_one(
    shard: int,
    node: str,
    path: str,
    start: int,
    max_bytes: int,
    directory: str | os.PathLike[str],
) -> ev.InboxChunk | None:
    records: list[ev.LogRecord] = []
    corrupt: list[tuple[int, str]] = []
    end = start
    for part in read_log(path, start=start, chunk_bytes=min(max_bytes, 1 << 20), root=directory):
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


def log_identity_and_size(path: str) -> tuple[int, int]:
    """The identity (`st_ino`) and size of a shard's log, (0, 0) when there is none or it is
    not a regular file (reading it later says why)."""
    try:
        st = os.lstat(path)
    except OSError:
        return 0, 0
    if not stat.S_ISREG(st.st_mode):
        return 0, 0
    return st.st_ino, st.st_size


def read_log_tail(directory: str | os.PathLike[str], effect: fx.ReadLogTail) -> ev.LogTailRead:
    """What a `ReadLogTail` asks: the `inbox` records of the writers named, in the shard's log
    from the offset given (from 0 when the file is another one now, or shorter than that),
    complete lines only."""
    path = os.path.join(directory, f"shard-{effect.shard}", "tasks", "tasks.log")
    try:
        fd = open_file(path, os.O_RDONLY, root=directory)
    except FileNotFoundError:
        return ev.LogTailRead(shard=effect.shard)
    except OSError as exc:
        return ev.LogTailRead(shard=effect.shard, error=f"{path}: {exc.strerror or exc}")
    try:
        st = os.fstat(fd)
        # The same file shorter than the offset read is read from 0 too (as the queue scan
        # does): cut back (a failed append is cut off the owner's log, perhaps read first),
        # or a new file that got the old inode number.
        start = resume_at((effect.identity, effect.offset), st.st_ino, st.st_size)
        data = os.pread(fd, min(effect.max_bytes, st.st_size - start), start)
        end = data.rfind(b"\n") + 1
        if not end and len(data) < st.st_size - start:
            # One line longer than max_bytes: read on to its end.
            rest = os.pread(fd, min(st.st_size - start, LINE_LIMIT + 1), start)
            end = rest.find(b"\n") + 1
            data = rest
        marks = pick_marks(data[:end], start, effect.writers)
        if decided_in(marks):
            os.fsync(fd)  # what the answer rests on is durable before it is given
    except OSError as exc:
        return ev.LogTailRead(shard=effect.shard, error=f"{path}: {exc.strerror or exc}")
    finally:
        os.close(fd)
    return ev.LogTailRead(
        shard=effect.shard,
        identity=st.st_ino,
        start=start,
        end=start + end,
        size=st.st_size,
        records=tuple(marks),
    )
