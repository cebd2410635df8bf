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
from typing import Any, Final

from snerd.core.cron import check_timezone, last_fires, next_fire
from snerd.core.fields import show
from snerd.core.timefmt import format_rfc3339

__all__ = [
    "CATCH_UP_MAX",
    "MAX_NAME_BYTES",
    "MISFIRES",
    "MISFIRE_GRACE_US",
    "OVERLAPS",
    "Due",
    "due",
    "policies",
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


def policies(doc: dict[str, Any]) -> tuple[str | None, str, int, str]:
    """A declaration's own fields (`timezone`, `misfire`, `catch_up`, `overlap`), checked,
    with their defaults: (timezone or None, misfire, catch_up, overlap).

    Raises:
        ValueError: what is wrong, in words for the `Failed to schedule: ` answer.
    """
    timezone = doc.get("timezone")
    if timezone is not None and not isinstance(timezone, str):
        raise ValueError(f"timezone must be a string, got {type(timezone).__name__}")
    if timezone:
        check_timezone(timezone)
    misfire = doc.get("misfire", "once")
    if misfire not in MISFIRES:
        raise ValueError(f"misfire must be one of {', '.join(MISFIRES)}, got {show(str(misfire))!r}")
    catch_up = doc.get("catch_up", 1)
    if type(catch_up) is not int or not 1 <= catch_up <= CATCH_UP_MAX:
        raise ValueError(f"catch_up must be a whole number from 1 to {CATCH_UP_MAX}")
    overlap = doc.get("overlap", "allow")
    if overlap not in OVERLAPS:
        raise ValueError(f"overlap must be one of {', '.join(OVERLAPS)}, got {show(str(overlap))!r}")
    return timezone or None, misfire, catch_up, overlap


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
