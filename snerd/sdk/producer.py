"""Enqueue from code without an event loop: a Flask, Django or any WSGI app, a script, a thread.

`Producer(directory).enqueue(task_type=..., data=...)` blocks until the task is durable, and
runs no daemon: it writes each enqueue the way a daemon writes one for a shard another daemon
owns, as a task record (`snerd.core.enqueue`: the same record, in the same shard, as any
daemon would write) appended to an inbox file of its own,
`shard-N/inbox/producer-<host>@pid-<pid>-<random>.log`, and fsynced before `enqueue`
returns. The shard's owner takes it in at its next look at its inboxes (every
SNERD_INBOX_POLL_MS, 100 ms, while such a file is there; a daemon with no other writer in
sight looks every SNERD_INBOX_IDLE_POLL_MS, 1 s, so a new producer's first task may wait that
long) and decides there what only it can: an id already pending, a twin, dependencies.

- **Dedupe**: an enqueue with `auto_dedupe` or `unique_key` waits for that decision, as a
  daemon's does: the owner writes it into the `inbox` record of its ingest, which the producer
  reads from where the log was before its write (`snerd.commands.owner_mark`, the rule of
  `snerd.core.node.verdicts`). `Enqueued.deduplicated` is True (with `duplicate_of`) or
  False; None when no daemon holds the shard, or none decided within SNERD_DEDUPE_WAIT_MS
  (5 s; the task is durable either way). An id the owner finds pending is refused with its
  error only when the enqueue waits (with dedupe); a plain enqueue of a pending id is dropped
  by the owner, as through any daemon's inbox.
- **Threads**: one producer serves every thread of a process; appends to one shard's file
  are serialized (each is one `write(2)` and one `fsync(2)`).
- **Fork**: a child (gunicorn's and uwsgi's pre-fork workers, multiprocessing) never writes
  its parent's files. `os.register_at_fork` forgets them in the child, whose first enqueue
  starts a writer id of its own: a file has one writer for its whole life, which its
  reader's offsets rely on (docs/architecture.md, "Inboxes").
- **Failures**: a failed or short write, or a failed fsync, raises `EnqueueError` for that
  enqueue (not acknowledged: it may or may not be taken in, like any unacknowledged
  enqueue) and closes that file: the next enqueue to the shard writes a new segment, so a
  torn line is never followed by another.
- **Clean-up**: a producer holds a shared flock on each file it writes while it is open. A
  producer opening a shard's inbox removes the files of producers gone (no flock held) that
  their owner has ingested in full (its `.read` hint reaches the file's end), as a daemon
  removes its own; a file not yet ingested stays until it is.

`producer(directory)` is the process's one producer of a directory (made on first use).
Bad arguments raise what the daemon would answer (`EnqueueError` with its text and the task
id). A producer may be made before any daemon ran: the queue is opened at the first
enqueue, and one into a directory that is not a queue yet raises `UsageError` (a daemon
makes the queue on its first start). Shard counts are read from membership.json again once a second, so a queue
grown by `snerdmq add-shards` is routed as the daemons route it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import portalocker

from snerd.commands import LogSpot, owner_mark
from snerd.config import ConfigError, load_tool_settings, make_node_id
from snerd.core import enqueue as enqueue_rule
from snerd.core import protocol as proto
from snerd.core.node.model import INBOX_SEGMENT_BYTES, inbox_segment_name, route_shard
from snerd.core.node.verdicts import verdict_at
from snerd.core.ownership import shard_name
from snerd.core.records import encode_record
from snerd.core.schema import DROP_ERROR, DROP_OF, SNERD_NODE
from snerd.core.timefmt import format_rfc3339
from snerd.io.files import fsync_dir, make_dirs, open_file, write_all
from snerd.io.inbox import inbox_path, log_identity_and_size, remove_ingested
from snerd.queuedir import Queue, QueueError, UsageError, open_queue, probe_lock, wall_now_us
from snerd.sdk.errors import EnqueueError
from snerd.sdk.messages import Enqueued, enqueue_call_message, task_spec_message

__all__ = ["PREFIX", "SEGMENT_BYTES", "Producer", "producer"]

#: The prefix of a producer's writer id (and of its inbox files' names).
PREFIX = "producer-"
#: How often the owner's log is read while a dedupe decision is awaited.
_POLL_S = 0.02
#: How often membership.json is read again for the shard count.
_SHARDS_EVERY_S = 1.0
#: A segment this large is closed; the next append to its shard starts another (the
#: daemon's rule).
SEGMENT_BYTES = INBOX_SEGMENT_BYTES


@dataclass(slots=True)
class _File:
    """The open inbox segment of one shard."""

    name: str
    fd: int
    size: int


class Producer:
    """A blocking, thread-safe, fork-safe enqueuer for the queue in `directory` (the module
    docstring). Use one per process (`producer`); `close` (or `with`) releases its files."""

    def __init__(self, directory: str | os.PathLike[str], *,
                 dedupe_wait_s: float | None = None) -> None:
        self.directory = os.fspath(directory)
        try:
            settings = load_tool_settings()
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
        self._settings = settings
        self.dedupe_wait_s = (
            settings.dedupe_wait_ms / 1000 if dedupe_wait_s is None else dedupe_wait_s
        )
        self._queue: Queue | None = None
        self._queue_read = 0.0
        self._lock = threading.Lock()
        self._shard_locks: dict[int, threading.Lock] = {}
        self._start()
        _PRODUCERS.add(self)

    def _start(self) -> None:
        """A writer id of this process, and no file open yet."""
        self._pid = os.getpid()
        self.writer = PREFIX + make_node_id(os.environ)
        self._files: dict[int, _File] = {}
        self._segments: dict[int, int] = {}
        self._closed = False

    def _forget_after_fork(self) -> None:
        """In a forked child: the parent's files and locks are the parent's (closing our copy
        of a descriptor leaves the parent's flock alone: it goes with the last copy)."""
        for f in self._files.values():
            with contextlib.suppress(OSError):
                os.close(f.fd)
        self._lock = threading.Lock()
        self._shard_locks = {}
        self._start()

    # -- enqueue

    def enqueue(
        self,
        task_id: str | None = None,
        task_type: str | None = None,
        data: Any = None,
        max_retries: int = 3,
        retry_after_hours: float = 0.0,
        rate_limit_group: str | None = None,
        max_per_minute: int | None = None,
        auto_dedupe: bool | None = None,
        urgency_score: float | None = None,
        execute_at: str | dt.datetime | dt.timedelta | None = None,
        cron: str | None = None,
        webhook_url: str | None = None,
        max_execution_seconds: int | None = None,
        pool: str | None = None,
        trigger_after_ids: Iterable[str] | None = None,
        unique_key: str | None = None,
        unique_until: str | int | None = None,
        backoff: str | None = None,
        backoff_max_seconds: int | None = None,
    ) -> Enqueued:
        """Store a task and return once it is durable: `SnerdQueue.enqueue`'s arguments and
        answer, blocking.

        Raises:
            EnqueueError: refused (the daemon's text: a bad value, an id pending when the
                enqueue waited for its owner), or the write failed.
            UsageError: the producer is closed.
        """
        message = enqueue_call_message(
            task_id, task_type, data, max_retries, retry_after_hours,
            (rate_limit_group, max_per_minute, auto_dedupe, urgency_score, execute_at, cron,
             webhook_url, max_execution_seconds, pool, trigger_after_ids, unique_key,
             unique_until, backoff, backoff_max_seconds),
        )
        (outcome,) = self._write([message])
        if isinstance(outcome, EnqueueError):
            raise outcome
        return outcome

    def enqueue_many(self, tasks: Iterable[Mapping[str, Any]]) -> list[Enqueued | EnqueueError]:
        """Store many tasks at once, blocking: `SnerdQueue.enqueue_many`'s tasks (mappings of
        `enqueue`'s arguments by name) and answer. The tasks of each shard are one `write(2)`
        and one `fsync(2)`; a task that is refused (a bad value, or its shard's write failed)
        is answered with its `EnqueueError`, not raised.

        Raises:
            TypeError: a task with an argument `enqueue` does not have, or no `task_type`
                (nothing is written).
            UsageError: the producer is closed, or the directory is not a queue.
        """
        messages: list[dict[str, Any] | EnqueueError] = []
        for spec in tasks:
            try:
                messages.append(task_spec_message(spec))
            except EnqueueError as exc:
                messages.append(exc)
        return self._write(messages)

    def _write(
        self, messages: Sequence[dict[str, Any] | EnqueueError]
    ) -> list[Enqueued | EnqueueError]:
        """Each enqueue message parsed by the daemon's rules, its record written to its
        shard's segment (one write and fsync per shard), and its outcome, in order."""
        if os.getpid() != self._pid:
            self._forget_after_fork()  # forked without `os.fork` (no at-fork hook ran)
        if self._closed:
            raise UsageError("this producer is closed")
        queue = self._current_queue()
        now = wall_now_us(self._settings)
        now_text = format_rfc3339(now)
        outcomes: list[Enqueued | EnqueueError | None] = [None] * len(messages)
        by_shard: dict[int, list[tuple[int, str, bytes, bool]]] = {}
        for i, message in enumerate(messages):
            if isinstance(message, EnqueueError):
                outcomes[i] = message
                continue
            task_id = message["task_id"]
            try:
                cmd = proto.parse_document(message)
            except proto.ProtocolError as exc:
                outcomes[i] = EnqueueError(exc.message, task_id=task_id)
                continue
            assert isinstance(cmd, proto.Enqueue)
            payload_hash = enqueue_rule.fingerprint(cmd) if cmd.dedupes else None
            key = enqueue_rule.routing_key(cmd, payload_hash)
            shard = route_shard(key, queue.shards) if queue.shards != 1 else 0
            fields, _ = enqueue_rule.enqueue_fields(cmd, payload_hash, now, now_text)
            fields[SNERD_NODE] = self.writer
            line = encode_record(fields)
            if len(line) > proto.DEFAULT_MAX_LINE_BYTES:
                outcomes[i] = EnqueueError(proto.failed_to_enqueue(
                    f"the task's record is {len(line)} bytes, more than a line may hold "
                    f"({proto.DEFAULT_MAX_LINE_BYTES})"), task_id=task_id)
                continue
            by_shard.setdefault(shard, []).append((i, task_id, line, cmd.dedupes))
        waits: list[tuple[int, str, int, LogSpot, str, int]] = []
        for shard, items in by_shard.items():
            # The log as it is before the write: the owner's decisions come after it.
            spot = (LogSpot(*log_identity_and_size(str(queue.log_path(shard))))
                    if any(dedupes for *_, dedupes in items) else None)
            try:
                name, offsets = self._append(queue, shard, [line for _i, _t, line, _d in items])
            except OSError as exc:
                for i, task_id, _line, _d in items:
                    outcomes[i] = EnqueueError(proto.failed_to_enqueue(str(exc)), task_id=task_id)
                continue
            for (i, task_id, _line, dedupes), at in zip(items, offsets, strict=True):
                if dedupes and spot is not None:
                    waits.append((i, task_id, shard, LogSpot(spot.identity, spot.offset), name, at))
                else:
                    outcomes[i] = Enqueued(task_id, shard_name(shard))
        until = time.monotonic() + self.dedupe_wait_s
        for i, task_id, shard, where, name, at in waits:
            try:
                outcomes[i] = self._verdict(queue, shard, where, name, at, task_id, until)
            except EnqueueError as exc:
                outcomes[i] = exc
        return [o for o in outcomes if o is not None]

    def _current_queue(self) -> Queue:
        """The queue, opened at the first enqueue (a producer may be made before any daemon
        made the queue), its membership read again once a second (a grown shard count)."""
        with self._lock:
            if self._queue is None:
                self._queue = open_queue(self.directory, allow_legacy=False)
                self._queue_read = time.monotonic()
            elif time.monotonic() - self._queue_read >= _SHARDS_EVERY_S:
                with contextlib.suppress(UsageError, QueueError, OSError):
                    self._queue = open_queue(self.directory, allow_legacy=False)
                self._queue_read = time.monotonic()
            return self._queue

    def _append(self, queue: Queue, shard: int, lines: list[bytes]) -> tuple[str, list[int]]:
        """Append `lines` to this writer's segment for `shard` in one write, fsynced: the
        segment and the offset of each line. Raises OSError naming the file (which is closed:
        the next append starts a new segment)."""
        with self._lock:
            lock = self._shard_locks.setdefault(shard, threading.Lock())
        with lock:
            f = self._files.get(shard)
            if f is None or f.size >= SEGMENT_BYTES:
                f = self._open(queue, shard)
            offsets = []
            at = f.size
            for line in lines:
                offsets.append(at)
                at += len(line)
            try:
                write_all(f.fd, b"".join(lines))
                os.fsync(f.fd)
            except OSError as exc:
                self._close_file(shard)
                path = inbox_path(self.directory, shard, f.name)
                raise OSError(exc.errno, f"cannot write {path}: {exc.strerror or exc}") from None
            f.size = at
            return f.name, offsets

    def _open(self, queue: Queue, shard: int) -> _File:
        """A new segment for `shard` (the last one, if any, closed): created, flocked shared
        while this producer lives, its directory entry fsynced. Raises OSError naming it."""
        self._close_file(shard)
        n = self._segments.get(shard, -1) + 1
        self._segments[shard] = n
        name = inbox_segment_name(self.writer, n)
        path = inbox_path(self.directory, shard, name)
        folder = os.path.dirname(path)
        try:
            make_dirs(folder, root=self.directory)
            _sweep(queue, shard)
            fd = open_file(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND,
                           root=self.directory)
            try:
                portalocker.lock(fd, portalocker.LOCK_SH | portalocker.LOCK_NB)
                fsync_dir(folder)
            except (OSError, portalocker.exceptions.LockException):
                os.close(fd)
                raise
        except (OSError, portalocker.exceptions.LockException) as exc:
            raise OSError(getattr(exc, "errno", None) or 0, f"cannot create {path}: {exc}") from None
        f = self._files[shard] = _File(name, fd, 0)
        return f

    def _close_file(self, shard: int) -> None:
        f = self._files.pop(shard, None)
        if f is not None:
            with contextlib.suppress(OSError):
                os.close(f.fd)

    def _verdict(self, queue: Queue, shard: int, spot: LogSpot, name: str, at: int,
                 task_id: str, until: float) -> Enqueued:
        """The owner's decision on the enqueue at byte `at` of segment `name`, awaited until
        `until` (monotonic; the module docstring)."""
        where = shard_name(shard)
        if probe_lock(queue.lock_path(shard)).state != "held":
            return Enqueued(task_id, where, None)
        while True:
            mark = owner_mark(queue, shard, spot, name, at)
            if mark is not None:
                verdict = verdict_at(mark, at)
                if verdict is None:
                    return Enqueued(task_id, where, None)
                if isinstance(verdict, dict):
                    error = verdict.get(DROP_ERROR)
                    if isinstance(error, str):
                        raise EnqueueError(error, task_id=task_id)
                    twin = verdict.get(DROP_OF)
                    return Enqueued(task_id, where, True, twin if isinstance(twin, str) else None)
                return Enqueued(task_id, where, False)
            if time.monotonic() >= until:
                return Enqueued(task_id, where, None)
            time.sleep(_POLL_S)

    # -- life

    def close(self) -> None:
        """Close this producer's files (their tasks are durable; owners take them in, and a
        later producer removes the files once they have)."""
        with self._lock:
            self._closed = True
            for shard in list(self._files):
                self._close_file(shard)
        _PRODUCERS.discard(self)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _sweep(queue: Queue, shard: int) -> None:
    """Remove the inbox files of producers gone (no flock held on the file) that the shard's
    owner has ingested in full."""
    remove_ingested(queue.directory, shard, PREFIX, lambda path: _unlocked(queue, path))


def _unlocked(queue: Queue, path: str) -> bool:
    """No process holds a flock on the file at `path` (its producer is gone)."""
    try:
        fd = open_file(path, os.O_RDONLY, root=queue.directory)
    except OSError:
        return False
    try:
        portalocker.lock(fd, portalocker.LOCK_EX | portalocker.LOCK_NB)
    except portalocker.exceptions.LockException:
        return False  # its producer is alive
    finally:
        os.close(fd)
    return True


#: The producers of this process, so a fork's child forgets their files.
_PRODUCERS: set[Producer] = set()
_ONE: dict[str, Producer] = {}
_ONE_LOCK = threading.Lock()


def producer(directory: str | os.PathLike[str]) -> Producer:
    """The process's one `Producer` of `directory` (made on first use; in a forked child, the
    parent's is forgotten and a new one made)."""
    key = os.path.realpath(directory)
    with _ONE_LOCK:
        p = _ONE.get(key)
        if p is None or p._closed:
            p = _ONE[key] = Producer(directory)
        return p


def _after_fork_in_child() -> None:
    global _ONE_LOCK
    _ONE_LOCK = threading.Lock()
    for p in list(_PRODUCERS):
        p._forget_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
