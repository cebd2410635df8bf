"""Job control from outside a daemon: cancel, retry, pause and resume, and the sweeps (a
purge, a retry of a type's dead letters), sent by a tool.

A tool (`snerdmq cancel`, the dashboard's buttons) writes to a queue the way a daemon that
does not own a shard does: it is an inbox writer. Each command becomes a `command` record
(`snerd.core.control.command_fields`; a pause stamped with the tool's wall clock and its
writer id) in `shard-N/inbox/<writer>.log` of every shard it targets, written to a new file,
fsynced, and its directory entry fsynced. The shard's owner applies it when it ingests the
file and answers in the ingest's `inbox` mark; the tool reads the owner's log from where it
was before the write (a log compacted meanwhile: from 0) and finds the answer by the core's
rule (`mark_at`, `command_answer`), exactly as a daemon's `Verdicts` does.

The writer id (`tool-<host>@pid-<pid>-<random>`) is new for every invocation: an owner
remembers how far it has read each writer's file, so a file is written once and never
reused. A sweep (`purge`, `retry_dead`) goes to every shard (or those the caller names) like
a pause, and its answer sums the `count` of each owner's answer. Once an owner's answer is in its log the file is ingested and the tool removes it;
a file whose shard did not answer stays (the command is durable there, and applied when a
daemon next takes the shard: `pending`). Files of earlier tools that their owner has ingested
in full are removed on the way (`_sweep`).

What a command means is the core's (`snerd.core.control`, `snerd.core.node.control`); this
module only writes, waits and reads. It never writes a shard log, and never waits on a shard
no daemon holds (its command is pending at once). Blocking: call it from a worker thread in
an event loop.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from snerd.config import ConfigError, load_tool_settings, make_node_id
from snerd.core import control as rule
from snerd.core import effects as fx
from snerd.core import protocol as proto
from snerd.core.ownership import shard_name
from snerd.core.records import encode_record
from snerd.core.schema import INBOX_FROM, SNERD_NODE
from snerd.io.files import fsync_dir, make_dirs, open_file, write_all
from snerd.io.inbox import (
    inbox_path,
    log_identity_and_size,
    read_log_tail,
    remove_inbox,
    remove_ingested,
)
from snerd.queuedir import Queue, QueueError, UsageError, open_queue, probe_lock, wall_now_us

__all__ = [
    "DEFAULT_WAIT_S",
    "LogSpot",
    "PauseAnswer",
    "SweepAnswer",
    "TaskAnswer",
    "cancel",
    "owner_mark",
    "pause",
    "purge",
    "resume",
    "retry",
    "retry_dead",
]

#: How long a command waits for its owners' answers (the daemon's SNERD_COMMAND_WAIT_MS).
DEFAULT_WAIT_S = 5.0
#: How often the owners' logs are read while answers are awaited (owners poll their inboxes
#: every 100 ms to 1 s).
_POLL_S = 0.05
_READ_BYTES = 1 << 20
#: The prefix of a tool's writer id (and inbox file name).
_TOOL = "tool-"


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskAnswer:
    """The answer to a cancel or a retry: the state the owner `found` the task in, whether the
    command changed it (`done`), and its `shard`; or, when no owner knew it, `found` unknown
    and the shards whose owner has not answered (`pending`: the command waits there)."""

    action: str
    task_id: str
    found: str
    done: bool
    shard: int | None
    pending: tuple[int, ...] = ()
    #: Of `pending`, the shards no daemon held when the command was written.
    unowned: tuple[int, ...] = ()

    def json(self) -> dict[str, Any]:
        """The daemon's own answer to the same command (`proto.cancelled`, `retried`), with
        the shards still pending named."""
        build = proto.cancelled if self.action == "cancel" else proto.retried
        message = build(self.task_id, self.found, done=self.done, shard=self.shard,
                        pending=bool(self.pending))
        message["pending_shards"] = [shard_name(s) for s in self.pending]
        message["unowned_shards"] = [shard_name(s) for s in self.unowned]
        return message


@dataclass(frozen=True, slots=True, kw_only=True)
class PauseAnswer:
    """The answer to a pause or resume: applied on every one of `shards` but those `pending`."""

    task_type: str | None
    paused: bool
    shards: int
    pending: tuple[int, ...] = ()
    #: Of `pending`, the shards no daemon held when the command was written.
    unowned: tuple[int, ...] = ()

    def json(self) -> dict[str, Any]:
        message = proto.paused(self.task_type, self.paused, self.shards, list(self.pending))
        message["unowned_shards"] = [shard_name(s) for s in self.unowned]
        return message


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepAnswer:
    """The answer to a sweep: how many tasks it acted on (`count`: purged, or put back) in
    the shards that answered; it waits in those `pending` (counted when their owners act)."""

    sweep: proto.Sweep
    count: int
    #: How many shards the queue has.
    shards: int
    pending: tuple[int, ...] = ()
    #: Of `pending`, the shards no daemon held when the command was written.
    unowned: tuple[int, ...] = ()

    def json(self) -> dict[str, Any]:
        """The daemon's own answer to the same command (`proto.swept`), with the shards no
        daemon held named."""
        message = proto.swept(self.sweep, self.count, self.shards, list(self.pending))
        message["unowned_shards"] = [shard_name(s) for s in self.unowned]
        return message


def cancel(root: str, task_id: str, wait_s: float = DEFAULT_WAIT_S) -> TaskAnswer:
    """Cancel `task_id` wherever it is: the command goes to every shard."""
    return _task_command(root, proto.Cancel(task_id=task_id), None, wait_s)


def retry(
    root: str, task_id: str, wait_s: float = DEFAULT_WAIT_S, *, shard: int | None = None
) -> TaskAnswer:
    """Put the dead-lettered (or cancelled) `task_id` back: the command goes to `shard` when
    the caller knows where the task is (a dead letter's shard), else to every shard."""
    return _task_command(root, proto.Requeue(task_id=task_id), shard, wait_s)


def pause(root: str, task_type: str | None, wait_s: float = DEFAULT_WAIT_S) -> PauseAnswer:
    """Pause the dispatch of `task_type` (None: of the whole queue) on every shard."""
    return _pause_command(root, proto.Pause(task_type=task_type, paused=True), wait_s)


def resume(root: str, task_type: str | None, wait_s: float = DEFAULT_WAIT_S) -> PauseAnswer:
    """Resume what `pause` paused (a type, or None: the whole queue)."""
    return _pause_command(root, proto.Pause(task_type=task_type, paused=False), wait_s)


def purge(
    root: str,
    task_type: str | None,
    before_us: int | None,
    wait_s: float = DEFAULT_WAIT_S,
    *,
    shards: Sequence[int] | None = None,
) -> SweepAnswer:
    """Forget the dead letters and cancelled tasks of `task_type` (None: of every type) that
    finished before `before_us` (wall µs; None: whenever), in every shard (or `shards`). A
    shard no daemon holds is left pending: its next owner purges it when it reads its inbox
    (`snerdmq purge` purges those itself, under their locks)."""
    sweep = proto.Sweep(purge=True, task_type=task_type, before_us=before_us)
    return _sweep_command(root, sweep, shards, wait_s)


def retry_dead(
    root: str,
    task_type: str | None,
    before_us: int | None,
    wait_s: float = DEFAULT_WAIT_S,
    *,
    shards: Sequence[int] | None = None,
) -> SweepAnswer:
    """Put back in the queue every dead letter of `task_type` (None: of every type) that died
    before `before_us` (None: whenever), attempts reset, in every shard (or `shards`); not
    cancelled tasks (a cancel was meant: `retry` one by id). Pending where `purge` is."""
    sweep = proto.Sweep(purge=False, task_type=task_type, before_us=before_us)
    return _sweep_command(root, sweep, shards, wait_s)


# -- the three kinds of command


def _task_command(
    root: str, cmd: proto.Cancel | proto.Requeue, shard: int | None, wait_s: float
) -> TaskAnswer:
    action = "cancel" if isinstance(cmd, proto.Cancel) else "retry"
    if not cmd.task_id:
        raise UsageError(f"a {action} needs a task id")
    queue = open_queue(root, allow_legacy=False)
    if shard is not None and not 0 <= shard < queue.shards:
        raise QueueError(f"{shard_name(shard)} is not a shard of {queue.directory}")
    shards = range(queue.shards) if shard is None else [shard]
    sent = _Sent.write(queue, cmd, shards, (0, ""))

    def settled(answers: dict[int, rule.Answer]) -> bool:
        return any(a.found != rule.FOUND_UNKNOWN for a in answers.values())

    answers = sent.collect(wait_s, settled)
    for s, answer in sorted(answers.items()):
        if answer.found != rule.FOUND_UNKNOWN:
            return TaskAnswer(action=action, task_id=cmd.task_id, found=answer.found,
                              done=answer.done, shard=s)
    return TaskAnswer(action=action, task_id=cmd.task_id, found=rule.FOUND_UNKNOWN, done=False,
                      shard=None, pending=sent.unanswered(answers), unowned=sent.unowned())


def _pause_command(root: str, cmd: proto.Pause, wait_s: float) -> PauseAnswer:
    queue = open_queue(root, allow_legacy=False)
    try:
        now = wall_now_us(load_tool_settings())
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    stamp: rule.Stamp = (now, "")
    sent = _Sent.write(queue, cmd, range(queue.shards), stamp)
    answers = sent.collect(wait_s, lambda _answers: False)
    return PauseAnswer(task_type=cmd.task_type, paused=cmd.paused, shards=queue.shards,
                       pending=sent.unanswered(answers), unowned=sent.unowned())


def _sweep_command(
    root: str, sweep: proto.Sweep, shards: Sequence[int] | None, wait_s: float
) -> SweepAnswer:
    what = "purge" if sweep.purge else "retry of dead letters"
    if sweep.task_type is not None and not sweep.task_type:
        raise UsageError(f"a {what} needs a task type (or the whole queue), not an empty one")
    queue = open_queue(root, allow_legacy=False)
    targets = range(queue.shards) if shards is None else sorted(set(shards))
    for shard in targets:
        if not 0 <= shard < queue.shards:
            raise QueueError(f"{shard_name(shard)} is not a shard of {queue.directory}")
    sent = _Sent.write(queue, sweep, targets, (0, ""))
    answers = sent.collect(wait_s, lambda _answers: False)
    return SweepAnswer(sweep=sweep, count=sum(a.count for a in answers.values()),
                       shards=queue.shards, pending=sent.unanswered(answers),
                       unowned=sent.unowned())


# -- writing the command, and reading the answers back


def _writer_id() -> str:
    """A writer id new to every invocation (`make_node_id`'s rule: host, pid, random)."""
    return _TOOL + make_node_id(os.environ)


@dataclass(slots=True)
class LogSpot:
    """Where an owner's answer is looked for: its log's identity and how far it is read
    (taken before the write the answer is awaited for: `log_identity_and_size`)."""

    identity: int
    offset: int


@dataclass(slots=True)
class _Shard(LogSpot):
    #: A daemon held the shard's lock when the command was written (else none can answer).
    held: bool


@dataclass(slots=True)
class _Sent:
    """A command written into one inbox file per shard, at byte 0 of each."""

    queue: Queue
    writer: str
    shards: dict[int, _Shard] = field(default_factory=dict)

    @classmethod
    def write(
        cls,
        queue: Queue,
        cmd: proto.Cancel | proto.Requeue | proto.Pause | proto.Sweep,
        shards: Sequence[int],
        stamp: rule.Stamp,
    ) -> _Sent:
        writer = _writer_id()
        if isinstance(cmd, proto.Pause):
            stamp = (stamp[0], writer)
        fields = {**rule.command_fields(cmd, stamp), SNERD_NODE: writer}
        line = encode_record(fields)
        sent = cls(queue, writer)
        for shard in shards:
            _sweep(queue, shard)
            # The log as it is before the write: its owner's answer comes after it.
            identity, size = log_identity_and_size(str(queue.log_path(shard)))
            held = probe_lock(queue.lock_path(shard)).state == "held"
            _write_new(queue, inbox_path(queue.directory, shard, writer), line)
            sent.shards[shard] = _Shard(identity, size, held)
        return sent

    def collect(
        self,
        wait_s: float,
        settled: Callable[[dict[int, rule.Answer]], bool],
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> dict[int, rule.Answer]:
        """The owners' answers, by shard, until each held shard answered, `settled` says
        enough, or `wait_s` passed. A shard that answered has its file removed."""
        answers: dict[int, rule.Answer] = {}
        until = monotonic() + wait_s
        while True:
            for shard, where in self.shards.items():
                if where.held and shard not in answers:
                    answer = self._read(shard, where)
                    if answer is not None:
                        answers[shard] = answer
                        remove_inbox(self.queue.directory, shard, self.writer)
            waiting = [s for s, w in self.shards.items() if w.held and s not in answers]
            if not waiting or settled(answers) or monotonic() >= until:
                return answers
            sleep(_POLL_S)

    def _read(self, shard: int, where: _Shard) -> rule.Answer | None:
        """The owner's answer in its log, read on from `where` (None: not there yet)."""
        mark = owner_mark(self.queue, shard, where, self.writer, 0)
        return None if mark is None else rule.command_answer(mark, 0)

    def unanswered(self, answers: dict[int, rule.Answer]) -> tuple[int, ...]:
        return tuple(s for s in sorted(self.shards) if s not in answers)

    def unowned(self) -> tuple[int, ...]:
        return tuple(s for s in sorted(self.shards) if not self.shards[s].held)


def owner_mark(
    queue: Queue, shard: int, where: LogSpot, writer: str, at: int
) -> Mapping[str, Any] | str | None:
    """The mark of the owner's ingest that took byte `at` of `writer`'s inbox file for
    `shard` (`snerd.core.control.mark_at`: a mark, or `GONE`), read in the shard's log on from
    `where`, which moves on; None: no ingest has taken it yet."""
    while True:
        tail = read_log_tail(
            queue.directory,
            fx.ReadLogTail(shard=shard, identity=where.identity, offset=where.offset,
                           max_bytes=_READ_BYTES, writers=frozenset({writer})),
        )
        if tail.error is not None:
            raise QueueError(f"cannot read the answer of {shard_name(shard)}: {tail.error}")
        where.identity, where.offset = tail.identity, tail.end
        marks = [r.fields for r in tail.records if isinstance(r.fields.get(INBOX_FROM), int)]
        mark = rule.mark_at(marks, at)
        if mark is not rule.LATER:
            return mark
        if not tail.start < tail.end < tail.size:
            return None


def _write_new(queue: Queue, path: str, line: bytes) -> None:
    """Create the inbox file `path` (never an existing one: the writer id is new), write the
    line, fsync it and the directory entry."""
    folder = os.path.dirname(path)
    try:
        make_dirs(folder, root=queue.directory)
        fd = open_file(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND,
                       root=queue.directory)
        try:
            write_all(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(folder)
    except OSError as exc:
        raise QueueError(f"cannot write the command to {path}: {exc}") from None


def _sweep(queue: Queue, shard: int) -> None:
    """Remove the inbox files of earlier tools that the shard's owner has ingested in full
    (its `.read` hint reaches the file's end): their answers are in its log."""
    remove_ingested(queue.directory, shard, _TOOL)
