"""The read behind a `ScanQueue`: what every shard's files say about the watched task ids.

A node whose children wait on parents it does not hold reads the queue's files for them,
whoever owns each shard (the task watch, `snerd.core.watch`). This module owns that read on
real files: for shard 0 to `shards - 1`, its log `shard-N/tasks/tasks.log` (segment "") and
every inbox file (`snerd.io.inbox.inbox_files`), each from the offset the core gave for it
when the file is still the one it read (same `st_ino`), else from 0, complete lines only, at
most about `max_bytes` of them but at least one, kept or dropped by `snerd.core.watch.pick`.

Why this shape:

- The identity is the fstat(2) of the descriptor read, never a stat of the path beside the
  open: compaction renames a new log over the old one (rename(2)), so a path stat and the read
  could see two different files, and the core would resume the new file at the old offset.
- A line without its newline is left for a later read, never cut or judged: its writer is
  still writing it, or crashed mid-write (never acknowledged; the owner repairs a log's tail).
- A read that finds a watched task's end fsyncs the file through its own descriptor before
  answering: the writer's fsync may not have returned, and fsync(2) of any descriptor of a
  file flushes every writer's data of it (on a network filesystem, what the server holds:
  what this reader could see), so the core never acts on an end a crash could take back.
- Nothing is reached through a symbolic link (`snerd.io.files`): a linked log or folder is an
  error the core is told about (it names the path), and no file behind the link is read.
- A shard with no folder, no log or no inbox yet is no error: those files are absent.

`read_task` is the other read of the same files: every record of one task id, for its story
(`snerd.core.story`: `snerdmq status`, the dashboard's task page, the daemon's `get`). It reads
each file whole, in steps of complete lines kept by `snerd.core.story.pick_story`; a log's last
line without its newline is judged as the daemon judges it (a whole record there was only
missing its newline), an inbox's is left (a write in progress). It never fsyncs: what it
finds is shown to a person, and nothing acts on it.

It decides nothing about tasks: what the records mean is `snerd.core.watch`'s and
`snerd.core.story`'s. Blocking: run it in a worker thread.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from snerd.core import effects as fx
from snerd.core import events as ev
from snerd.core.records import LINE_LIMIT
from snerd.core.story import LOG, Found, pick_story
from snerd.core.watch import ends_a_task, pick, resume_at
from snerd.io.files import PathError, open_file
from snerd.io.inbox import INBOX, inbox_files

__all__ = ["read_file_task", "read_task", "scan_queue"]

#: Bytes read at once while looking for the end of a line longer than `max_bytes`.
_STEP = 1 << 20


@dataclass(frozen=True, slots=True)
class _Lines:
    """Complete lines read from `start` (`data`), the file's identity and size when opened,
    and a line skipped for its length (its offset), if one was."""

    identity: int
    size: int
    start: int
    data: bytes
    overlong: int | None = None
    #: The read went to the file's end (it did not stop at `max_bytes`).
    reached_end: bool = True


def scan_queue(directory: str | os.PathLike[str], effect: fx.ScanQueue) -> ev.QueueScanned:
    """Carry out `effect` on the queue in `directory` (see the module docstring)."""
    chunks: list[ev.ScanChunk] = []
    files: list[tuple[int, str, int, int]] = []
    errors: list[tuple[int, str]] = []
    for shard in range(effect.shards):
        for segment, path in _shard_files(directory, shard, errors):
            try:
                lines, chunk = _read_file(directory, path, shard, segment, effect)
            except FileNotFoundError:
                continue  # not written yet, or an inbox removed since it was listed
            except OSError as exc:
                errors.append((shard, _text(path, exc)))
                continue
            if chunk is not None:
                chunks.append(chunk)
            files.append((shard, segment, lines.identity, _rest(lines, chunk)))
    return ev.QueueScanned(chunks=tuple(chunks), files=tuple(files), errors=tuple(errors))


def _shard_files(
    directory: str | os.PathLike[str], shard: int, errors: list[tuple[int, str]]
) -> list[tuple[str, str]]:
    """(segment, path) of a shard's log and inbox files; a folder that cannot be listed is
    reported in `errors` (a missing one holds no file)."""
    found = [("", os.path.join(directory, f"shard-{shard}", "tasks", "tasks.log"))]
    try:
        found += [(name, path) for name, path, _size in inbox_files(directory, shard)]
    except FileNotFoundError:
        pass
    except OSError as exc:
        errors.append((shard, _text(os.path.join(directory, f"shard-{shard}", INBOX), exc)))
    return found


def _read_file(
    directory: str | os.PathLike[str], path: str, shard: int, segment: str, effect: fx.ScanQueue
) -> tuple[_Lines, ev.ScanChunk | None]:
    """One file's new complete lines and what `pick` keeps of them; the file fsynced first
    when they end a watched task (`snerd.core.watch.ends_a_task`: a tombstone seen before its
    writer's fsync returned is made durable by ours before the core acts on it)."""
    fd = open_file(path, os.O_RDONLY, root=directory)
    try:
        lines = _read_lines(fd, effect.known.get((shard, segment)), effect.max_bytes)
        chunk = _chunk(shard, segment, lines, effect.ids)
        if chunk is not None and ends_a_task(list(chunk.records)):
            os.fsync(fd)
        return lines, chunk
    finally:
        os.close(fd)


def _read_lines(fd: int, known: tuple[int, int] | None, max_bytes: int) -> _Lines:
    """The complete lines of the open file from the offset `known` gives (when its identity
    is the file's, and the file still reaches it), else from 0."""
    st = os.fstat(fd)
    start = resume_at(known, st.st_ino, st.st_size)
    data = os.pread(fd, max(max_bytes, 1), start)
    end = data.rfind(b"\n") + 1
    if end == 0 and len(data) >= max_bytes:
        return _first_line(fd, st.st_ino, st.st_size, start, data)
    reached = start + len(data) >= st.st_size
    return _Lines(st.st_ino, st.st_size, start, data[:end], reached_end=reached)


def _first_line(fd: int, identity: int, size: int, start: int, head: bytes) -> _Lines:
    """No newline within `max_bytes`: read on to the end of the first line (a read returns at
    least one line when there is one). A line longer than `LINE_LIMIT` is no record any writer
    makes: it is skipped, unread, and reported."""
    parts = [head]
    pos = start + len(head)
    while True:
        more = os.pread(fd, _STEP, pos)
        if not more:
            return _Lines(identity, size, start, b"")  # not complete yet
        nl = more.find(b"\n")
        if nl >= 0:
            pos += nl + 1
            if pos - start > LINE_LIMIT:
                return _Lines(identity, size, start, b"", overlong=pos, reached_end=pos >= size)
            parts.append(more[: nl + 1])
            return _Lines(identity, size, start, b"".join(parts), reached_end=pos >= size)
        pos += len(more)
        if pos - start <= LINE_LIMIT:
            parts.append(more)
        else:
            parts.clear()  # kept no longer: only where the line ends matters now


def _chunk(shard: int, segment: str, lines: _Lines, ids: frozenset[str]) -> ev.ScanChunk | None:
    """The chunk of what `pick` keeps of `lines` (None: no complete line was new)."""
    if lines.overlong is not None:
        return ev.ScanChunk(
            shard=shard,
            segment=segment,
            identity=lines.identity,
            start=lines.start,
            end=lines.overlong,
            records=(),
            corrupt=((lines.start, f"line longer than {LINE_LIMIT} bytes"),),
        )
    if not lines.data:
        return None
    records, corrupt, consumed = pick(lines.data, lines.start, ids)
    return ev.ScanChunk(
        shard=shard,
        segment=segment,
        identity=lines.identity,
        start=lines.start,
        end=lines.start + consumed,
        records=tuple(records),
        corrupt=tuple(corrupt),
    )


def _rest(lines: _Lines, chunk: ev.ScanChunk | None) -> int:
    """The bytes a read left unread when it stopped short of the file's end, else 0 (what
    follows the last newline is a line being written, or a torn one: not for this read)."""
    end = lines.start if chunk is None else chunk.end
    if lines.reached_end:
        return 0
    return max(lines.size - end, 0)


def _text(path: str, exc: OSError) -> str:
    """An error as one line that names the path once."""
    if isinstance(exc, PathError):
        return str(exc)  # the sentence names the path already
    return f"{path}: {exc.strerror or exc}"


def read_task(
    directory: str | os.PathLike[str],
    shards: int,
    task_id: str,
    errors: list[str] | None = None,
) -> list[Found]:
    """Every record of `task_id` (and the claims that fence them) in the logs and inbox files
    of shards 0 to `shards - 1`, in file order per file. A file that cannot be read is left
    out, its error appended to `errors` when given; a missing one holds nothing."""
    found: list[Found] = []
    problems: list[tuple[int, str]] = []
    for shard in range(shards):
        for segment, path in _shard_files(directory, shard, problems):
            source = segment or LOG
            found += read_file_task(directory, path, shard, source, task_id, problems)
    if errors is not None:
        errors += [text for _shard, text in problems]
    return found


def read_file_task(
    directory: str | os.PathLike[str],
    path: str | os.PathLike[str],
    shard: int,
    source: str,
    task_id: str,
    errors: list[tuple[int, str]],
) -> list[Found]:
    """`read_task` of one file (`source`: `LOG` for a shard's log, else the inbox's writer)."""
    try:
        fd = open_file(path, os.O_RDONLY, root=directory)
    except FileNotFoundError:
        return []
    except OSError as exc:
        errors.append((shard, _text(str(path), exc)))
        return []
    try:
        return _task_lines(fd, shard, source, task_id)
    except OSError as exc:
        errors.append((shard, _text(str(path), exc)))
        return []
    finally:
        os.close(fd)


def _task_lines(fd: int, shard: int, source: str, task_id: str) -> list[Found]:
    """The records of `task_id` in the open file, read in steps of `_STEP` bytes."""
    found: list[Found] = []
    pos = 0
    carry = b""
    skipping = False  # inside a line longer than `LINE_LIMIT`: no writer makes one
    while True:
        more = os.pread(fd, _STEP, pos)
        if not more:
            break
        pos += len(more)
        data = carry + more
        start = pos - len(data)
        if skipping:
            nl = data.find(b"\n")
            if nl < 0:
                carry = b""
                continue
            skipping, data, start = False, data[nl + 1 :], start + nl + 1
        records, consumed = pick_story(data, start, task_id)
        found += [Found(shard, source, r.offset, r.fields) for r in records]
        carry = data[consumed:]
        if len(carry) > LINE_LIMIT:
            carry, skipping = b"", True
    if carry and source == LOG and not skipping:
        # A log's last line without its newline: a whole record there lost only its newline
        # (the owner keeps it: `snerd.core.records.scan_tail`); anything else is a torn write.
        records, _ = pick_story(carry + b"\n", pos - len(carry), task_id)
        found += [Found(shard, source, r.offset, r.fields) for r in records]
    return found
