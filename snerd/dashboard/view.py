"""A queue directory as the dashboard shows it, read from its files and kept up to date.

`QueueView` reads what `snerdmq stats` reads (membership.json and each `shard-N/tasks/tasks.log`,
folded by `snerd.core.shardlog`, the daemon's own rules), and nothing else: no lock probes, no
writes, so it runs beside live daemons on any host that mounts the directory. Each `refresh`
folds only the bytes appended to a log since the last one (`rescan_shard`); a compaction's new
file, or a log that shrank, is read again from the start.

What it serves never holds a task's `taskData` or its webhook URL (payloads and URLs may carry
secrets; the dashboard shows ids, types, states, attempts, times and errors). A task's page
(`task`) also shows its handler's result, as `get` answers it: an operator looking a task up
asks for what it returned.

`task` is read afresh at each call, not folded incrementally: it reads every shard's log and
inbox files for one id (`snerd.queuedir.task_report`), which a person asks for one page at a
time.

Blocking: the web app calls `refresh` from a worker thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from snerd.core.events import LogRecord
from snerd.core.fields import whole_or_none
from snerd.core.ownership import NODES_KEY
from snerd.core.schema import (
    CRON_EXPRESSION,
    DELETED_AT,
    EXECUTE_AT,
    LAST_ERROR_OBJ,
    MAX_RETRIES,
    POOL,
    RATE_LIMIT_GROUP,
    RETRY_AFTER_TIME,
    RETRY_COUNT,
    TASK_TYPE,
    URGENCY_SCORE,
    WEBHOOK_URL,
)
from snerd.core.shardlog import enqueue_order, ready_at_us
from snerd.core.status import FINISHED_STATES, LIVE_STATES, finished_state, live_state
from snerd.core.timefmt import format_rfc3339, parse_rfc3339_or_none
from snerd.queuedir import (
    Queue,
    QueueError,
    ShardScan,
    UsageError,
    open_queue,
    rescan_shard,
    stats_report,
    task_report,
)

__all__ = ["STATUSES", "QueueView"]

#: Every task status the dashboard knows, live ones first (`/api/tasks?status=`).
STATUSES = LIVE_STATES + FINISHED_STATES


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _number(value: Any) -> float | int | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _next_run(fields: dict[str, Any], status: str) -> str | None:
    """When a live task may run next: the later of `executeAt` and `retryAfterTime`."""
    if status in FINISHED_STATES:
        return None
    ready = ready_at_us(fields)
    return None if ready is None else format_rfc3339(ready)


def _task_row(shard: int, task_id: str, fields: dict[str, Any], status: str) -> dict[str, Any]:
    error = fields.get(LAST_ERROR_OBJ)
    return {
        "id": task_id,
        "type": _str(fields.get(TASK_TYPE)) or "?",
        "status": status,
        "shard": shard,
        "retry_count": whole_or_none(fields.get(RETRY_COUNT)) or 0,
        "max_retries": whole_or_none(fields.get(MAX_RETRIES)),
        "execute_at": _str(fields.get(EXECUTE_AT)),
        "retry_after": _str(fields.get(RETRY_AFTER_TIME)),
        "next_run": _next_run(fields, status),
        "finished_at": _str(fields.get(DELETED_AT)),
        "error": error if isinstance(error, str) else None,
        "cron": _str(fields.get(CRON_EXPRESSION)),
        "webhook": isinstance(fields.get(WEBHOOK_URL), str),
        POOL: _str(fields.get("pool")),
        "group": _str(fields.get(RATE_LIMIT_GROUP)),
        "urgency": _number(fields.get(URGENCY_SCORE)),
    }


class QueueView:
    """One queue directory, folded incrementally. `refresh()` re-reads what changed and bumps
    `version` when anything did; the other methods build the JSON the dashboard serves from
    the last refresh."""

    def __init__(self, directory: Path, *, skew_us: int, clock: Callable[[], int]) -> None:
        self.directory = directory
        self.skew_us = skew_us
        #: The wall clock in µs (the lease and delay columns are judged on it).
        self.clock = clock
        #: Bumped by each `refresh` that found a change.
        self.version = 0
        #: Why the directory cannot be read as a queue (None: it can).
        self.error: str | None = None
        self._queue: Queue | None = None
        self._scans: dict[int, ShardScan] = {}

    # ------------------------------------------------------------------ reading

    def refresh(self) -> bool:
        """Re-read membership.json and whatever each log gained. True when anything changed."""
        try:
            queue = open_queue(str(self.directory))
        except (UsageError, QueueError) as exc:
            changed = self.error != str(exc)
            self.error, self._queue, self._scans = str(exc), None, {}
            if changed:
                self.version += 1
            return changed
        changed = self.error is not None or self._queue is None or self._queue.doc != queue.doc
        scans: dict[int, ShardScan] = {}
        error: str | None = None
        for shard in range(queue.shards):
            previous = self._scans.get(shard)
            before = None if previous is None else (previous.size, previous.exists)
            try:
                scan = rescan_shard(queue, shard, previous)
            except QueueError as exc:
                error = str(exc)
                if previous is None:
                    continue
                scan = previous
            if scan is not previous or (scan.size, scan.exists) != before:
                changed = True
            scans[shard] = scan
        if len(scans) != len(self._scans) or error != self.error:
            changed = True
        self._queue, self._scans, self.error = queue, scans, error
        if changed:
            self.version += 1
        return changed

    # ------------------------------------------------------------------ views

    def stats(self) -> dict[str, Any]:
        """`snerdmq stats --json`'s report, plus `owner_text` per shard (its owner column)."""
        if self._queue is None:
            return {"error": self.error}
        scans = [self._scans[k] for k in sorted(self._scans)]
        report = stats_report(self._queue, scans, self.clock(), self.skew_us)
        report["error"] = self.error
        return report

    def daemons(self) -> list[dict[str, Any]]:
        """Each daemon with a heartbeat in membership.json: its beat count, when it was last
        seen (and how long ago, in seconds, on this host's clock), its handler types, and the
        shards its claims name."""
        queue = self._queue
        if queue is None:
            return []
        beats = (queue.doc or {}).get(NODES_KEY)
        beats = beats if isinstance(beats, dict) else {}
        owned: dict[str, list[str]] = {}
        for shard in range(queue.shards):
            owner = queue.claim(shard).owner
            if owner is not None:
                owned.setdefault(owner, []).append(f"shard-{shard}")
        now = self.clock()
        out = []
        for node in sorted(set(beats) | set(owned)):
            beat = beats.get(node)
            beat = beat if isinstance(beat, dict) else {}
            seen = _str(beat.get("seen"))
            seen_us = parse_rfc3339_or_none(seen)
            ago = None if seen_us is None else round((now - seen_us) / 1e6, 1)
            types = beat.get("types")
            out.append(
                {
                    "node": node,
                    "beat": whole_or_none(beat.get("beat")),
                    "seen": seen,
                    "seen_ago_s": ago,
                    "types": [t for t in types if isinstance(t, str)] if isinstance(types, list) else None,
                    "shards": owned.get(node, []),
                }
            )
        return out

    def tasks(self, status: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Up to `limit` tasks, live ones first (shard by shard, in enqueue order), then
        finished ones, the most recently finished first; only those in `status` when given
        (one of `STATUSES`)."""
        if status is not None and status not in STATUSES:
            raise ValueError(f"unknown status {status!r}; one of {', '.join(STATUSES)}")
        now = self.clock()
        out: list[dict[str, Any]] = []
        if status is None or status in LIVE_STATES:
            for shard in sorted(self._scans):
                fold = self._scans[shard].fold
                in_flight = fold.in_flight()
                live: Iterable[tuple[str, LogRecord]] = fold.live.items()
                if status is not None:
                    live = [
                        (task_id, record)
                        for task_id, record in live
                        if live_state(task_id, record.fields, in_flight, now) == status
                    ]
                for task_id, record in enqueue_order(live, limit - len(out)):
                    state = live_state(task_id, record.fields, in_flight, now)
                    out.append(_task_row(shard, task_id, record.fields, state))
                if len(out) >= limit:
                    return out
        if status is not None and status not in FINISHED_STATES:
            return out
        finished: list[dict[str, Any]] = []
        want = limit - len(out)
        for shard in sorted(self._scans):
            fold = self._scans[shard].fold
            taken = 0
            for task_id, record in reversed(fold.finished.items()):
                if taken >= want:
                    break
                if task_id in fold.live:
                    continue
                state = finished_state(record.fields)
                if status is None or state == status:
                    finished.append(_task_row(shard, task_id, record.fields, state))
                    taken += 1
        finished.sort(key=lambda row: row["finished_at"] or "", reverse=True)
        return out + finished[:want]

    def dead_letters(self, limit: int = 100) -> list[dict[str, Any]]:
        """Up to `limit` dead letters with their final errors, the latest first."""
        rows: list[dict[str, Any]] = []
        for shard in sorted(self._scans):
            for letter in self._scans[shard].fold.dead_letters()[-limit:]:
                rows.append(
                    {
                        "id": letter.task_id,
                        "type": letter.task_type,
                        "shard": shard,
                        "attempts": letter.attempts,
                        "error": letter.error,
                        "at": letter.at,
                        "inferred": letter.inferred,
                    }
                )
        rows.sort(key=lambda row: row["at"] or "", reverse=True)
        return rows[:limit]

    def task(self, task_id: str) -> dict[str, Any]:
        """One task's details and story (`snerd.queuedir.task_report`); UsageError for an id
        no enqueue takes, QueueError when the directory is no queue (as of the last refresh)."""
        if self._queue is None:
            raise QueueError(self.error or f"{self.directory} cannot be read as a queue")
        return task_report(self._queue, task_id, self.clock())

    def membership(self) -> dict[str, Any] | None:
        """membership.json as last read (None: none)."""
        return None if self._queue is None else self._queue.doc

    def snapshot(self, *, tasks: int = 100, dead_letters: int = 50) -> dict[str, Any]:
        """Everything the page shows at once."""
        return {
            "version": self.version,
            "at": format_rfc3339(self.clock()),
            "directory": str(self.directory),
            "error": self.error,
            "stats": self.stats(),
            "daemons": self.daemons(),
            "tasks": self.tasks(limit=tasks),
            "dead_letters": self.dead_letters(dead_letters),
        }
