"""The log record's keys: the one spelling of every field name a record in `tasks.log` or an
inbox log can carry.

This module owns the names, nothing else: each key is a constant here with what it holds, and
every reader and writer of records (the core, the shell, the faces, the simulator, jepsen-lite)
spells a key through it. What a value may be is `snerd.core.fields`' and `snerd.core.records`';
the byte format of a line is `snerd.core.records`'. docs/storage.md describes the format for
people. It is a leaf: it imports nothing, so every layer can import it.

Upstream SnerdMQ's keys keep upstream's spelling and casing (`LastErrorObj` included), so
upstream tools can read a snerd log; snerd's own keys start with `snerd` and old readers ignore
them. The keys of snerd's non-task records (`snerdKind` set: a dispatch, a claim, an inbox
mark) are short lowercase words and are listed last.

The node's per-line loop (`snerd.core.node.intake`) spells the plain-enqueue record's keys as
literals, which CPython builds faster than names it has to look up; it asserts at import that
they are these.

This module must never: hold anything but the record's key names and the values of its two
enumerated keys (`snerdKind`, `snerdOutcome`), or import anything.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "AUTO_DEDUPE",
    "CLAIM_EPOCH",
    "CLAIM_NODE",
    "COMMAND_ACTION",
    "COMMAND_BEFORE",
    "COMMAND_STAMP",
    "COMMAND_TASK",
    "COMMAND_TYPE",
    "CRON_EXPRESSION",
    "DELETED_AT",
    "DISPATCH_ATTEMPT",
    "DISPATCH_GROUP",
    "DISPATCH_TASK",
    "DROP_AT",
    "DROP_ERROR",
    "DROP_OF",
    "DROP_TASK",
    "EXECUTE_AT",
    "INBOX_ANSWERS",
    "INBOX_DROPPED",
    "INBOX_FROM",
    "INBOX_NODE",
    "INBOX_OFFSET",
    "KIND_CLAIM",
    "KIND_COMMAND",
    "KIND_DISPATCH",
    "KIND_INBOX",
    "KIND_PAUSE",
    "KIND_PURGE",
    "KIND_SCHEDULE",
    "LAST_ERROR_OBJ",
    "LAST_JOB_ERROR",
    "MAX_EXECUTION_SECONDS",
    "MAX_PER_MINUTE",
    "MAX_RETRIES",
    "OUTCOME_CANCELLED",
    "OUTCOME_COMPLETED",
    "OUTCOME_DEAD",
    "PAUSE_PAUSED",
    "PAUSE_STAMP",
    "PAUSE_TYPE",
    "PAYLOAD_HASH",
    "POOL",
    "PURGE_TASKS",
    "RATE_LIMIT_GROUP",
    "RECORD_AT",
    "RETRY_AFTER_HOURS",
    "RETRY_AFTER_TIME",
    "RETRY_COUNT",
    "SCHEDULE_CATCH_UP",
    "SCHEDULE_CRON",
    "SCHEDULE_FIRED",
    "SCHEDULE_MISFIRE",
    "SCHEDULE_NAME",
    "SCHEDULE_OVERLAP",
    "SCHEDULE_REMOVED",
    "SCHEDULE_TASK",
    "SCHEDULE_TIMEZONE",
    "SNERD_BACKOFF",
    "SNERD_BACKOFF_MAX",
    "SNERD_CRC",
    "SNERD_EPOCH",
    "SNERD_KIND",
    "SNERD_NODE",
    "SNERD_OUTCOME",
    "SNERD_REPLAYED_AT",
    "SNERD_RESULT",
    "SNERD_SCHEDULE",
    "SNERD_SEQ",
    "SNERD_UNIQUE_UNTIL",
    "SNERD_VIA",
    "TASK_DATA",
    "TASK_ID",
    "TASK_TYPE",
    "TRIGGER_AFTER_IDS",
    "URGENCY_SCORE",
    "WEBHOOK_URL",
]

# -- Upstream SnerdMQ's task record keys, in the order an enqueue writes them -------------------

TASK_ID: Final = "taskId"  # the task id; every task record has it, and it comes first
RETRY_COUNT: Final = "retryCount"  # failed attempts so far (0 at enqueue)
MAX_RETRIES: Final = "maxRetries"  # the task may run 1 + maxRetries times
RETRY_AFTER_HOURS: Final = "retryAfterHours"  # the delay between attempts, in hours
RETRY_AFTER_TIME: Final = "retryAfterTime"  # RFC 3339: not runnable before (enqueue time at first)
TASK_DATA: Final = "taskData"  # the payload, verbatim (a string)
TASK_TYPE: Final = "taskType"  # the handler type
RATE_LIMIT_GROUP: Final = "rateLimitGroup"  # the rate-limit group, when given
MAX_PER_MINUTE: Final = "maxPerMinute"  # the group's dispatches per minute, with the group
AUTO_DEDUPE: Final = "autoDedupe"  # true: a pending twin (same type and data) is refused
URGENCY_SCORE: Final = "urgencyScore"  # the priority, when not 0
PAYLOAD_HASH: Final = "payloadHash"  # with autoDedupe: xxh64 of type + data, lowercase hex
EXECUTE_AT: Final = "executeAt"  # RFC 3339: first eligible time (now, execute_at, a cron tick)
POOL: Final = "pool"  # the worker pool, when given
TRIGGER_AFTER_IDS: Final = "triggerAfterIds"  # the parent task ids it waits for, when given
CRON_EXPRESSION: Final = "cronExpression"  # the cron schedule, normalized 6-field form
WEBHOOK_URL: Final = "webhookUrl"  # the webhook the daemon calls instead of a worker
MAX_EXECUTION_SECONDS: Final = "maxExecutionSeconds"  # the attempt's hard timeout, in seconds
LAST_ERROR_OBJ: Final = "LastErrorObj"  # after a failure: the last failure reason (a string)
LAST_JOB_ERROR: Final = "LastJobError"  # after a failure: {"error": reason, "retry_worthy": bool}
DELETED_AT: Final = "deletedAt"  # RFC 3339, tombstones only: when the task ended

# -- snerd's additions, which upstream readers ignore -------------------------------------------

SNERD_KIND: Final = "snerdKind"  # absent: a task record; else "dispatch", "claim" or "inbox"
SNERD_NODE: Final = "snerdNode"  # the owner id of the node that wrote the record
SNERD_EPOCH: Final = "snerdEpoch"  # the shard epoch its writer held (fencing)
SNERD_SEQ: Final = "snerdSeq"  # the task's enqueue position in its shard (1, 2, ...): FIFO order
SNERD_VIA: Final = "snerdVia"  # a task copied from an inbox: the node that wrote it there
SNERD_BACKOFF: Final = "snerdBackoff"  # the task's retry policy, "constant" or "exponential" (absent: the daemon's SNERD_BACKOFF)
SNERD_BACKOFF_MAX: Final = "snerdBackoffMax"  # the task's cap on an exponential retry delay, whole seconds (absent: 7 days)
SNERD_UNIQUE_UNTIL: Final = "snerdUniqueUntil"  # with dedupe: "started", or seconds after the twin finished ("finished", the default, is not written)
SNERD_OUTCOME: Final = "snerdOutcome"  # on a tombstone: "completed" or "dead_letter"
SNERD_REPLAYED_AT: Final = "snerdReplayedAt"  # RFC 3339: when `dlq replay` (or `retry`) put it back
SNERD_RESULT: Final = "snerdResult"  # on a completed tombstone: the handler's return value (any JSON)
SNERD_CRC: Final = "snerdCrc"  # always last: xxh3_64 hex of the line's bytes before it

# -- The values of snerdKind and snerdOutcome ---------------------------------------------------

KIND_DISPATCH: Final = "dispatch"  # an attempt started (its task, number, time, group)
KIND_CLAIM: Final = "claim"  # a node took the shard at an epoch; it fences older writers
KIND_INBOX: Final = "inbox"  # the owner copied another node's inbox up to an offset
KIND_SCHEDULE: Final = "schedule"  # a named schedule's declaration and last tick fired
KIND_COMMAND: Final = "command"  # (inbox files only) an operator's command for the shard's owner
KIND_PAUSE: Final = "pause"  # a task type's (or the whole queue's) pause state in the shard
KIND_PURGE: Final = "purge"  # dead letters and cancelled tasks an operator purged from the shard
OUTCOME_COMPLETED: Final = "completed"  # the tombstone of a task that succeeded
OUTCOME_DEAD: Final = "dead_letter"  # the tombstone of a task that used every attempt
OUTCOME_CANCELLED: Final = "cancelled"  # the tombstone of a task cancelled before it ended

# -- The keys of snerd's non-task records (snerdKind set) ---------------------------------------

DISPATCH_TASK: Final = "task"  # a dispatch: the task id whose attempt started
DISPATCH_ATTEMPT: Final = "attempt"  # a dispatch: the attempt's number (1 for the first)
DISPATCH_GROUP: Final = "group"  # a dispatch: the rate-limit group it counts against, if any
CLAIM_EPOCH: Final = "epoch"  # a claim: the epoch the claiming node took the shard at
CLAIM_NODE: Final = "node"  # a claim: the owner id of the claiming node
INBOX_NODE: Final = "node"  # an inbox mark: the node whose inbox was copied
INBOX_OFFSET: Final = "offset"  # an inbox mark: the inbox's byte offset copied up to
INBOX_FROM: Final = "from"  # an inbox mark: the inbox's byte offset this copy began at
INBOX_DROPPED: Final = "dropped"  # an inbox mark: the records not taken in, [{task, at, why, of?}]
INBOX_ANSWERS: Final = "answers"  # an inbox mark: the owner's answers to the commands in it, [{at, ...}]
SCHEDULE_NAME: Final = "name"  # a schedule: its name
SCHEDULE_TASK: Final = "task"  # ... what each run is enqueued with (the enqueue's wire fields)
SCHEDULE_CRON: Final = "cron"  # ... its cron expression, normalized
SCHEDULE_TIMEZONE: Final = "timezone"  # ... the IANA zone it is read in (absent: UTC)
SCHEDULE_MISFIRE: Final = "misfire"  # ... skip | once | catch_up
SCHEDULE_CATCH_UP: Final = "catchUp"  # ... how many missed ticks catch_up runs
SCHEDULE_OVERLAP: Final = "overlap"  # ... allow | skip | wait
SCHEDULE_FIRED: Final = "fired"  # ... RFC 3339: its last tick fired (or when it was declared)
SCHEDULE_REMOVED: Final = "removed"  # ... true: unscheduled
SNERD_SCHEDULE: Final = "snerdSchedule"  # a task record: the schedule it is a run of
DROP_TASK: Final = "task"  # a record not taken in: its task id
DROP_AT: Final = "at"  # ... its byte offset in the inbox file
DROP_OF: Final = "of"  # ... dropped as a duplicate of this task
DROP_ERROR: Final = "error"  # ... or refused with this error, as the enqueue would have been
COMMAND_ACTION: Final = "action"  # a command: cancel | retry | pause | resume
COMMAND_TASK: Final = "task"  # ... the task id a cancel or retry acts on
COMMAND_TYPE: Final = "type"  # ... the task type a pause or resume acts on ("*": the whole queue)
COMMAND_STAMP: Final = "stamp"  # ... a pause or resume's [wall µs, node]: the latest wins
COMMAND_BEFORE: Final = "before"  # ... a sweep: only tasks that finished before (wall µs)
PURGE_TASKS: Final = "tasks"  # a purge record: the ids it forgets (and its command's type, before)
PAUSE_TYPE: Final = "type"  # a pause record: the task type ("*": the whole queue)
PAUSE_PAUSED: Final = "paused"  # ... true while paused
PAUSE_STAMP: Final = "stamp"  # ... the [wall µs, node] of the command that set it
RECORD_AT: Final = "at"  # a dispatch or claim: RFC 3339, when it happened
