"""The record of a new enqueue, and where it goes: one rule for every writer of one.

Three writers turn an enqueue into a task record: the daemon taking it into a shard it owns
(`snerd.core.node.intake`), the daemon writing it into its inbox for a shard another daemon
owns, and a producer without a daemon (`snerd.sdk.producer`) writing it into an inbox of its own.
They build the record here (`enqueue_fields`), pick its shard by the same key
(`routing_key`, then `snerd.core.node.model.route_shard`) and its dedupe fingerprint the same
way (`fingerprint`), so a task enqueued through any of them is the same record in the same
shard, and two of them dedupe against each other.

Pure: the caller passes the wall clock's reading (and its RFC 3339 text, which a burst of
enqueues shares).
"""

from __future__ import annotations

from typing import Any

from snerd.core import dedupe
from snerd.core import protocol as proto
from snerd.core.cron import next_fire
from snerd.core.schema import (
    AUTO_DEDUPE,
    CRON_EXPRESSION,
    EXECUTE_AT,
    MAX_EXECUTION_SECONDS,
    MAX_PER_MINUTE,
    MAX_RETRIES,
    PAYLOAD_HASH,
    POOL,
    RATE_LIMIT_GROUP,
    RETRY_AFTER_HOURS,
    RETRY_AFTER_TIME,
    RETRY_COUNT,
    SNERD_BACKOFF,
    SNERD_BACKOFF_MAX,
    SNERD_UNIQUE_UNTIL,
    TASK_DATA,
    TASK_ID,
    TASK_TYPE,
    TRIGGER_AFTER_IDS,
    URGENCY_SCORE,
    WEBHOOK_URL,
)
from snerd.core.timefmt import format_rfc3339

__all__ = ["enqueue_fields", "fingerprint", "routing_key"]

# `enqueue_fields` spells the keys every record has as literals: a dict display of constant
# keys is built in one step, one whose keys are module names looks each up first, on the path
# every enqueue takes. The literals must be the record's keys of `snerd.core.schema`:
assert (TASK_ID, RETRY_COUNT, MAX_RETRIES, RETRY_AFTER_HOURS, RETRY_AFTER_TIME, TASK_DATA,
        TASK_TYPE) == ("taskId", "retryCount", "maxRetries", "retryAfterHours",
                       "retryAfterTime", "taskData", "taskType")


def fingerprint(cmd: proto.Enqueue) -> str:
    """The dedupe fingerprint of an enqueue with dedupe (`snerd.core.dedupe`): its
    `unique_key` when it has one, else its payload."""
    if cmd.unique_key is not None:
        return dedupe.unique_fingerprint(cmd.task_type, cmd.unique_key)
    return dedupe.fingerprint(cmd.task_type, cmd.task_data)


def routing_key(cmd: proto.Enqueue, payload_hash: str | None) -> str:
    """What picks an enqueue's shard: its rate-limit group (a group's tasks share a shard, so
    one owner counts its rate), else its dedupe fingerprint (twins meet in one shard, where
    one owner decides), else its id."""
    return cmd.rate_limit_group or payload_hash or cmd.task_id


def enqueue_fields(
    cmd: proto.Enqueue, payload_hash: str | None, now_us: int, now_text: str
) -> tuple[dict[str, Any], int]:
    """The task record of a new enqueue at wall time `now_us` (`now_text`: its RFC 3339
    text), without snerd's node, epoch and sequence keys, and when it is due (µs): 0 without
    `execute_at` or `cron`, so it is ready as soon as its record is durable even if the wall
    clock is stepped back meanwhile (its record's `executeAt` says now, as upstream's does).
    Upstream's keys in upstream's order, optional ones only when set."""
    execute_at = cmd.execute_at_us
    if execute_at is None and cmd.cron is not None:
        execute_at = next_fire(cmd.cron, now_us)
    ready_at = 0 if execute_at is None else execute_at
    if execute_at is None:
        execute_at = now_us
    fields: dict[str, Any] = {
        "taskId": cmd.task_id,
        "retryCount": 0,
        "maxRetries": cmd.max_retries,
        "retryAfterHours": cmd.retry_after_hours,
        "retryAfterTime": now_text,
        "taskData": cmd.task_data,
        "taskType": cmd.task_type,
    }
    if cmd.rate_limit_group is not None:
        fields[RATE_LIMIT_GROUP] = cmd.rate_limit_group
    if cmd.max_per_minute is not None:
        fields[MAX_PER_MINUTE] = cmd.max_per_minute
    if cmd.dedupes:
        fields[AUTO_DEDUPE] = True
        if cmd.unique_until != dedupe.FINISHED:
            fields[SNERD_UNIQUE_UNTIL] = cmd.unique_until
    if cmd.urgency_score:
        fields[URGENCY_SCORE] = cmd.urgency_score
    if payload_hash is not None:
        fields[PAYLOAD_HASH] = payload_hash
    fields[EXECUTE_AT] = now_text if execute_at == now_us else format_rfc3339(execute_at)
    if cmd.pool is not None:
        fields[POOL] = cmd.pool
    if cmd.trigger_after_ids:
        fields[TRIGGER_AFTER_IDS] = list(cmd.trigger_after_ids)
    if cmd.cron is not None:
        fields[CRON_EXPRESSION] = cmd.cron
    if cmd.webhook_url is not None:
        fields[WEBHOOK_URL] = cmd.webhook_url
    if cmd.max_execution_seconds is not None:
        fields[MAX_EXECUTION_SECONDS] = cmd.max_execution_seconds
    if cmd.backoff is not None:
        fields[SNERD_BACKOFF] = cmd.backoff
    if cmd.backoff_max_seconds is not None:
        fields[SNERD_BACKOFF_MAX] = cmd.backoff_max_seconds
    return fields, ready_at
