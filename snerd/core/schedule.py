"""Named schedules: what one holds, where it lives, when its runs are due, and what they are.

A schedule is declared by name (`{"action":"schedule","name":...}`), from any daemon, as often
as wanted: declaring creates it or, when anything changed, replaces it; `unschedule` removes
it. It lives in one shard, `route_shard("schedule:" + name)`, whose owner alone fires it, so
each tick fires once however many daemons run. Its record (kind `schedule`) in that shard's
log holds the declaration and the last tick fired.

At each tick the owner enqueues a **run**: a task built from the schedule's template (type,
data, retries, and the other enqueue options), whose id is `<name>@<tick>` (the tick in
RFC 3339, UTC), with the record saying which schedule it is of (`snerdSchedule`). The run and
the schedule's new record (`fired` = the tick) are one append: a tick is fired exactly when
its run is in the log, so a new owner after a takeover or a restart goes on from there. A run
is a task like any other: retried, then dead-lettered as a run; the schedule goes on.

Policies, per schedule:

- `misfire`, for ticks missed (found more than `MISFIRE_GRACE_US` late: the owner was down,
  or nobody owned the shard): `skip` (none of them runs), `once` (the default: the latest
  runs), `catch_up` (the latest `catch_up` run, each as its own run).
- `overlap`, for a tick that comes while an earlier run is still live: `allow` (the default:
  it runs too), `skip` (it does not run), `wait` (it runs once the live run ends).

Times: the cron expression is read in `timezone` (an IANA name; UTC by default), daylight
saving as `snerd.core.cron.next_fire` says. Pure: the caller gives the clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from snerd.core.cron import last_fires, next_fire
from snerd.core.timefmt import format_rfc3339

__all__ = [
    "CATCH_UP_MAX",
    "MAX_NAME_BYTES",
    "MISFIRES",
    "MISFIRE_GRACE_US",
    "OVERLAPS",
    "Due",
    "due",
    "routing_key",
    "run_id",
    "schedule_of_run",
]

MISFIRES: Final = ("skip", "once", "catch_up")
OVERLAPS: Final = ("allow", "skip", "wait")
#: A tick found later than this is missed (its misfire policy decides), else it runs.
MISFIRE_GRACE_US: Final = 60 * 1_000_000
#: The most missed ticks `catch_up` runs.
CATCH_UP_MAX: Final = 1000
#: The longest name: its runs' ids (`<name>@<tick>`, 28 bytes more) stay task ids.
MAX_NAME_BYTES: Final = 900


def routing_key(name: str) -> str:
    """What a schedule routes by (`route_shard`)."""
    return "schedule:" + name


def run_id(name: str, tick_us: int) -> str:
    """The id of the run of `name` at `tick_us`."""
    return f"{name}@{format_rfc3339(tick_us)}"


def schedule_of_run(task_id: str) -> str | None:
    """The schedule name a run id names (None: it is no run id's shape)."""
    name, at, tick = task_id.rpartition("@")
    return name if at and tick.endswith("Z") else None


@dataclass(frozen=True, slots=True)
class Due:
    """What a schedule does now: the ticks to run (oldest first), whether ticks were missed,
    and the tick it waits for next."""

    runs: tuple[int, ...]
    missed: bool
    next_us: int
    #: The latest tick in (fired, now], run or not (None: none).
    latest: int | None = None


def due(
    cron: str,
    timezone: str | None,
    *,
    fired_us: int,
    now_us: int,
    misfire: str,
    catch_up: int,
) -> Due:
    """The ticks of a schedule (normalized `cron`, read in `timezone`) to run at `now_us`,
    after it last fired at `fired_us`. Of the ticks in (fired, now], the latest runs when it
    is at most `MISFIRE_GRACE_US` late; every other one is missed, and `misfire` says which of
    those run (`once`: the latest missed one, unless a tick on time runs; `catch_up`: the
    latest `catch_up`)."""
    latest, _ = last_fires(cron, fired_us, now_us, 1, timezone)
    nxt = next_fire(cron, now_us, timezone)
    if not latest:
        return Due(runs=(), missed=False, next_us=nxt)
    on_time = [latest[0]] if now_us - latest[0] <= MISFIRE_GRACE_US else []
    edge = latest[0] if on_time else now_us  # missed: (fired, edge)
    limit = 0
    if misfire == "catch_up":
        limit = catch_up
    elif misfire == "once" and not on_time:
        limit = 1
    earlier, _ = last_fires(cron, fired_us, edge - 1, max(limit, 1), timezone)
    missed = earlier[-limit:] if limit else []
    return Due(
        runs=tuple(missed + on_time), missed=bool(earlier) or not on_time, next_us=nxt,
        latest=latest[0],
    )
