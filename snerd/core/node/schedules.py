"""Named schedules on this node: the ones its shards hold, their ticks, their runs.

The rule is `snerd.core.schedule`'s (what a schedule is, when its ticks are due under its
misfire policy, what a run's id is). This part keeps the schedules of the shards this node
owns, fires them (`fire`: the runs of the ticks due and the schedule's new record, one
append), answers `schedule` and `unschedule` (here, or through the inbox of the shard that
holds the name), applies the ones other daemons put in its inboxes, and follows each
schedule's live runs for its overlap policy.

A fire waits while an append of the same schedule's records is in flight (`writing`). A
declaration does not: it is written at once, saying as the last tick fired the one a fire in
flight writes (`firing`), so the log's latest record of a schedule never says an earlier tick
than a run written before it (the next owner goes on from that record).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from snerd.core import effects as fx
from snerd.core import events as ev
from snerd.core import protocol as proto
from snerd.core.cron import next_fire
from snerd.core.node.model import (
    ACTIVE,
    NODE_RUNNING,
    new_location,
    new_record,
    require,
    route_shard,
)
from snerd.core.node.outbox import FirePart, InboxPart, SchedulePart
from snerd.core.ownership import shard_name
from snerd.core.schedule import due, routing_key, run_id, schedule_of_run
from snerd.core.schema import (
    KIND_SCHEDULE,
    RECORD_AT,
    SCHEDULE_CATCH_UP,
    SCHEDULE_FIRED,
    SCHEDULE_MISFIRE,
    SCHEDULE_NAME,
    SCHEDULE_OVERLAP,
    SCHEDULE_REMOVED,
    SCHEDULE_TASK,
    SCHEDULE_TIMEZONE,
    SNERD_KIND,
    SNERD_NODE,
    SNERD_SCHEDULE,
)
from snerd.core.timefmt import format_rfc3339, parse_rfc3339

if TYPE_CHECKING:
    from snerd.core.node.model import ShardInfo
    from snerd.core.node.node import Node

#: A schedule that does not fire by itself (held, or with no next tick).
NEVER = 2**62

__all__ = ["Schedules", "declaration_of", "schedule_fields", "stored_schedule"]


def schedule_fields(cmd: proto.Schedule, fired_us: int) -> dict[str, Any]:
    """A schedule's record, but for its writer's keys."""
    fields: dict[str, Any] = {
        SNERD_KIND: KIND_SCHEDULE,
        SCHEDULE_NAME: cmd.name,
        SCHEDULE_TASK: cmd.task,
        SCHEDULE_MISFIRE: cmd.misfire,
        SCHEDULE_CATCH_UP: cmd.catch_up,
        SCHEDULE_OVERLAP: cmd.overlap,
        SCHEDULE_FIRED: format_rfc3339(fired_us),
    }
    if cmd.timezone is not None:
        fields[SCHEDULE_TIMEZONE] = cmd.timezone
    return fields


def declaration_of(fields: dict[str, Any]) -> proto.Schedule:
    """The declaration a schedule record holds, checked as a `schedule` line is.

    Raises:
        ScheduleError: the record holds no declaration a `schedule` line could make.
    """
    task = fields.get(SCHEDULE_TASK)
    if not isinstance(task, dict):
        raise proto.ScheduleError("its record has no task", name=fields.get(SCHEDULE_NAME))
    doc = {
        **task,
        "action": "schedule",
        "name": fields.get(SCHEDULE_NAME),
        "timezone": fields.get(SCHEDULE_TIMEZONE),
        "misfire": fields.get(SCHEDULE_MISFIRE, "once"),
        "catch_up": fields.get(SCHEDULE_CATCH_UP, 1),
        "overlap": fields.get(SCHEDULE_OVERLAP, "allow"),
    }
    cmd = proto.parse_document(doc)
    assert isinstance(cmd, proto.Schedule)
    return cmd


def stored_schedule(fields: dict[str, Any]) -> tuple[proto.Schedule, int] | None:
    """What a schedule's latest record holds: its declaration and its last tick fired (or
    when it was declared), as the owner loads it; None when the record says it was removed.
    (`snerdmq schedules` lists them by this rule too.)

    Raises:
        ValueError: the record cannot be read; the message says why.
    """
    if fields.get(SCHEDULE_REMOVED) is True:
        return None
    try:
        spec = declaration_of(fields)
    except proto.ProtocolError as exc:
        raise ValueError(exc.message.removeprefix("Failed to schedule: ")) from None
    fired = fields.get(SCHEDULE_FIRED)
    if not isinstance(fired, str):
        raise ValueError(f"its record has no `{SCHEDULE_FIRED}` time")
    return spec, parse_rfc3339(fired)


def _shown(next_us: int) -> int | None:
    """A next fire time an answer can name: none while the schedule does not fire by itself
    (`NEVER`: a tick held by overlap `wait`, or no tick left)."""
    return None if next_us >= NEVER else next_us


def _same(a: proto.Schedule, b: proto.Schedule) -> bool:
    return (a.task, a.timezone, a.misfire, a.catch_up, a.overlap) == (
        b.task,
        b.timezone,
        b.misfire,
        b.catch_up,
        b.overlap,
    )


@dataclass(slots=True)
class Sched:
    """One schedule of an owned shard."""

    spec: proto.Schedule
    shard: int
    #: Its last tick fired (or when it was declared), and its next one (wall µs).
    fired_us: int
    next_us: int
    #: Its latest record (compaction keeps it).
    loc: fx.Location | None = None
    #: Runs of it that are live tasks here.
    live_runs: set[str] = field(default_factory=set)
    #: overlap `wait`: the tick that came while a run was live; it runs when none is.
    held: int | None = None
    #: An append of its records is in flight.
    writing: bool = False
    #: The tick a fire in flight writes as the last fired (None: no fire in flight).
    firing: int | None = None


class Schedules:
    """The schedules of the shards this node owns (module docstring)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.config = node.config
        self.out = node.outbox
        self.by_name: dict[str, Sched] = {}

    # -- timers (`Node.timers`)

    def invariants(self) -> None:
        tasks = self.node.book.tasks
        for name, s in self.by_name.items():
            require(s.spec.name == name, f"schedule {name} filed under another name")
            require(s.shard in self.node.shards, f"schedule {name}: shard {s.shard} not ours")
            for run in s.live_runs:
                require(run in tasks, f"schedule {name}: run {run} is not live")

    def tick_due(self) -> int | None:
        """The next tick of any schedule (wall µs)."""
        if self.node.phase is not NODE_RUNNING:
            return None
        ticks = [s.next_us for s in self.by_name.values() if not s.writing]
        return min(ticks) if ticks else None

    def tick_fire(self, now: ev.Now) -> None:
        for s in sorted(self.by_name.values(), key=lambda s: s.spec.name):
            if not s.writing and s.next_us <= now.wall:
                self._fire(s, now.wall)

    # -- declarations

    def on_schedule(self, cmd: proto.Schedule | proto.Unschedule) -> None:
        """A `schedule` or `unschedule` line: applied here when this node owns the name's
        shard, else written to its inbox for the owner (held while the node starts, as an
        enqueue is: every boot declares its schedules at once)."""
        if self.node.intake.hold_or(cmd):
            return
        if self.node.phase is not NODE_RUNNING:
            self.out.send(proto.schedule_error(cmd.name, proto.SHUTTING_DOWN))
            return
        shard = route_shard(routing_key(cmd.name), self.node.tenure.shard_count())
        info = self.node.shards.get(shard)
        if info is None or info.phase is not ACTIVE:
            self._to_inbox(cmd, shard)
            return
        self.apply(cmd, shard, answer=True)

    def apply(self, cmd: proto.Schedule | proto.Unschedule, shard: int, *, answer: bool) -> None:
        """Create, replace or remove a schedule of an owned shard (`answer`: tell the SDK)."""
        now = self.node.now.wall
        s = self.by_name.get(cmd.name)
        if isinstance(cmd, proto.Unschedule):
            if s is None:
                if answer:
                    self.out.send(proto.scheduled(cmd.name, "absent"))
                return
            fields = {SNERD_KIND: KIND_SCHEDULE, SCHEDULE_NAME: cmd.name, SCHEDULE_REMOVED: True}
            del self.by_name[cmd.name]
            self._write(shard, cmd.name, fields, "removed" if answer else "")
            return
        if s is not None and _same(s.spec, cmd):
            if answer:
                self.out.send(proto.scheduled(cmd.name, "unchanged", _shown(s.next_us)))
            return
        result = "created" if s is None else "updated"
        fired = now if s is None else max(s.fired_us, s.firing or 0)
        spec_next = self._next(cmd, now)
        live = set() if s is None else s.live_runs
        self.by_name[cmd.name] = Sched(cmd, shard, fired, spec_next, live_runs=live, writing=True)
        self._write(shard, cmd.name, schedule_fields(cmd, fired), result if answer else "")

    def _to_inbox(self, cmd: proto.Schedule | proto.Unschedule, shard: int) -> None:
        if isinstance(cmd, proto.Unschedule):
            fields: dict[str, Any] = {
                SNERD_KIND: KIND_SCHEDULE,
                SCHEDULE_NAME: cmd.name,
                SCHEDULE_REMOVED: True,
            }
        else:
            fields = schedule_fields(cmd, self.node.now.wall)
        fields[SNERD_NODE] = self.config.node_id
        segment = self.node.inbox.segment(shard)
        segment.in_flight += 1
        token = self.out.next_token()
        # Answered `forwarded` once the write is durable (`Outcomes`), or refused by name.
        self.out.pending[token] = InboxPart(shard, segment=segment, schedule=cmd.name)
        self.out.emit(
            fx.AppendInbox(
                token=token, shard=shard, segment=segment.name, records=(new_record(fields),)
            )
        )

    def ingest(self, fields: dict[str, Any], shard: int) -> str | None:
        """A schedule record from an inbox of an owned shard: applied (None), or why not."""
        name = fields.get(SCHEDULE_NAME)
        if not isinstance(name, str):
            return "a schedule record without a name"
        if fields.get(SCHEDULE_REMOVED) is True:
            self.apply(proto.Unschedule(name=name), shard, answer=False)
            return None
        try:
            cmd = declaration_of(fields)
        except proto.ProtocolError as exc:
            return exc.message
        self.apply(cmd, shard, answer=False)
        return None

    # -- firing

    def _fire(self, s: Sched, now_us: int) -> None:
        spec = s.spec
        cron = spec.template.cron
        assert cron is not None
        try:
            d = due(
                cron,
                spec.timezone,
                fired_us=s.fired_us,
                now_us=now_us,
                misfire=spec.misfire,
                catch_up=spec.catch_up,
            )
        except ValueError as exc:
            self.out.log("error", f"schedule {spec.name}: {exc}; it no longer fires")
            s.next_us = NEVER
            return
        s.next_us = d.next_us
        if d.latest is None:
            return  # (woken before its tick)
        runs = list(d.runs)
        if d.missed:
            self.out.log(
                "warning",
                f"schedule {spec.name}: ticks missed since {format_rfc3339(s.fired_us)} "
                f"(misfire {spec.misfire}: {len(runs)} run now)",
            )
        if runs and s.live_runs and spec.overlap != "allow":
            if spec.overlap == "wait":
                s.held = runs[-1]  # runs once the live ones end (`run_finished`)
                s.next_us = NEVER
                return
            self.out.log(
                "info", f"schedule {spec.name}: a run is still live; tick skipped (overlap skip)"
            )
            runs = []
        self._write_fire(s, runs, d.latest)

    def run_finished(self, task_id: str) -> None:
        """A task ended or left this node: if it was a schedule's run, that schedule may go
        on (a tick held by overlap `wait`)."""
        name = schedule_of_run(task_id)
        s = self.by_name.get(name) if name is not None else None
        if s is None or task_id not in s.live_runs:
            return
        s.live_runs.discard(task_id)
        if s.held is not None and not s.live_runs and not s.writing:
            tick, s.held = s.held, None
            try:
                s.next_us = self._next(s.spec, self.node.now.wall)
            except ValueError:
                s.next_us = NEVER
            self._write_fire(s, [tick], tick)

    def _write_fire(self, s: Sched, runs: list[int], fired: int) -> None:
        """The runs of `runs` (those not live already) and the record saying `fired` is the
        last tick fired, in one append."""
        info = self.node.shards[s.shard]
        records = []
        ids: list[str] = []
        for tick in runs:
            task_id = run_id(s.spec.name, tick)
            if task_id in self.node.book.tasks:
                continue  # (a run of that tick is live)
            run = replace(s.spec.template, task_id=task_id, cron=None, execute_at_us=None)
            task, fields = self.node.intake.take(run, s.shard, info)
            fields[SNERD_SCHEDULE] = s.spec.name
            records.append(new_record(fields))
            ids.append(task.task_id)
        if not ids and fired <= s.fired_us:
            return
        s.writing = True
        s.firing = max(fired, s.fired_us)
        marked = s.firing
        if self.config.unsafe_fire_unmarked:
            marked = s.fired_us  # the negative control: the log keeps the tick before
        record = {
            **schedule_fields(s.spec, marked),
            RECORD_AT: format_rfc3339(self.node.now.wall),
            **self.node.tenure.meta(s.shard),
        }
        records.append(new_record(record))
        self.out.append(
            s.shard, records, FirePart(s.shard, name=s.spec.name, tasks=ids, fired=fired)
        )

    # -- outcomes of the appends this part made (dispatched by `Outcomes`)

    def fire_committed(
        self, p: FirePart, info: ShardInfo, offsets: tuple[int, ...], lengths: tuple[int, ...]
    ) -> None:
        book = self.node.book
        s = self.by_name.get(p.name)
        for i, task_id in enumerate(p.tasks):
            task = book.tasks.get(task_id)
            if task is None or task.loc is not None:
                continue
            task.loc = new_location(p.shard, offsets[i], lengths[i])
            book.schedule(task, self.node.now)
            if s is not None:
                s.live_runs.add(task_id)
        if s is not None:
            s.writing = False
            s.firing = None
            s.fired_us = max(s.fired_us, p.fired)
            s.loc = new_location(p.shard, offsets[len(p.tasks)], lengths[len(p.tasks)])

    def fire_failed(
        self, token: int, p: FirePart, info: ShardInfo, error: str, permanent: bool
    ) -> None:
        del self.out.pending[token]
        for task_id in p.tasks:
            if task_id in self.node.book.tasks:
                self.node.book.forget(task_id)
        s = self.by_name.get(p.name)
        if s is not None:
            s.writing = False
            s.firing = None
            s.next_us = self.node.now.wall + self.config.retry_io_us  # its ticks again, then
        self.out.log("error", f"schedule {p.name}: its runs could not be written ({error})")

    def schedule_committed(
        self, p: SchedulePart, info: ShardInfo, offsets: tuple[int, ...], lengths: tuple[int, ...]
    ) -> None:
        s = self.by_name.get(p.name)
        if s is not None:
            s.writing = False
            s.loc = new_location(p.shard, offsets[0], lengths[0])
        if p.result:
            self.out.send(proto.scheduled(p.name, p.result, None if s is None else _shown(s.next_us)))

    def schedule_failed(
        self, token: int, p: SchedulePart, info: ShardInfo, error: str, permanent: bool
    ) -> None:
        del self.out.pending[token]
        s = self.by_name.get(p.name)
        if s is not None:
            s.writing = False
            if p.result == "created":
                del self.by_name[p.name]
        message = f"Failed to schedule: {error}"
        if p.result:
            self.out.send(proto.schedule_error(p.name, message))
        else:
            self.out.log("error", f"schedule {p.name}: {message}")

    # -- ownership

    def load(self, shard: int, records: dict[str, ev.LogRecord]) -> None:
        """A shard's schedules, from its log's latest record of each (the replay): each
        evaluated at once, so ticks missed meanwhile meet their misfire policy."""
        now = self.node.now.wall
        for name, record in records.items():
            try:
                stored = stored_schedule(record.fields)
            except ValueError as exc:
                self.out.log(
                    "error",
                    f"{shard_name(shard)}: schedule {name} cannot be read ({exc}); it does not "
                    "fire until it is declared again",
                )
                continue
            if stored is None:
                continue
            spec, fired = stored
            live = {
                t.task_id
                for t in self.node.book.tasks.values()
                if t.shard == shard and schedule_of_run(t.task_id) == name
            }
            loc = new_location(shard, record.offset, record.length)
            self.by_name[name] = Sched(spec, shard, fired, now, loc=loc, live_runs=live)

    def forget_shard(self, shard: int) -> None:
        """The shard is no longer this node's: its schedules fire elsewhere."""
        for name in [n for n, s in self.by_name.items() if s.shard == shard]:
            del self.by_name[name]

    def moved(self, shard: int, moved: dict[int, fx.Location]) -> None:
        """A compaction of `shard` moved its records: where each schedule's is now."""
        for s in self.by_name.values():
            if s.shard == shard and s.loc is not None:
                s.loc = moved.get(s.loc.offset, s.loc)

    def locs(self, shard: int) -> list[fx.Location]:
        """Where the latest record of each schedule of `shard` is (compaction keeps them)."""
        return [s.loc for s in self.by_name.values() if s.shard == shard and s.loc is not None]

    def _write(self, shard: int, name: str, fields: dict[str, Any], result: str) -> None:
        s = self.by_name.get(name)
        if s is not None:
            s.writing = True
        record = {**fields, RECORD_AT: format_rfc3339(self.node.now.wall),
                  **self.node.tenure.meta(shard)}
        self.out.append(shard, [new_record(record)], SchedulePart(shard, name=name, result=result))

    def _next(self, cmd: proto.Schedule, after_us: int) -> int:
        assert cmd.template.cron is not None
        return next_fire(cmd.template.cron, after_us, cmd.timezone)
