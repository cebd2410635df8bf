"""The dedupe rule: what makes two enqueues duplicates, and for how long.

An enqueue with `auto_dedupe` or a `unique_key` has a **fingerprint**, stored in its record as
`payloadHash` and used as its routing key (so twins meet in one shard; a `rate_limit_group`
routes first):

- with `unique_key`: xxh64 (seed 0) of `snerd-unique`, the task type and the key, each followed
  by a NUL byte: one live task per type and key, whatever the data;
- with `auto_dedupe` alone: xxh64 of the task type followed by the task data in canonical form
  (`canonical_data`: JSON with its object keys sorted and no insignificant space, so
  `{"a":1,"b":2}` and `{"b": 2, "a": 1}` are one payload; data that is not JSON as it is).

Both are written in lowercase hex without leading zeros, upstream's form of `payloadHash`.

An enqueue is dropped as a duplicate of a **twin** (another task with its fingerprint) that is
within the new enqueue's `unique_until`:

- `started`: the twin has not started yet (waiting, delayed, blocked, waiting for a handler
  or a rate window, or waiting to retry);
- `finished` (the default, upstream's rule): the twin is live: not started, or running;
- N seconds: the twin is live, or it finished (completed or dead-lettered) less than N seconds
  ago.

Pure: the node asks `counts` about its tasks; the fingerprint functions are what both the
daemon and the tools compute.
"""

from __future__ import annotations

from typing import Final

import orjson
import xxhash

__all__ = [
    "FINISHED",
    "MAX_UNIQUE_SECONDS",
    "STARTED",
    "UniqueUntil",
    "canonical_data",
    "counts",
    "fingerprint",
    "unique_fingerprint",
]

STARTED: Final = "started"
FINISHED: Final = "finished"
#: The longest `unique_until` in seconds: a week.
MAX_UNIQUE_SECONDS: Final = 7 * 24 * 3600

#: `STARTED`, `FINISHED`, or a number of seconds after the twin finished.
UniqueUntil = str | int

_SECOND = 1_000_000


def _hex(data: bytes) -> str:
    return xxhash.xxh64_hexdigest(data).lstrip("0") or "0"


def canonical_data(task_data: str) -> bytes:
    """`task_data` as the fingerprint reads it: JSON re-encoded with sorted keys and no spaces
    (orjson), or the text itself when it is not JSON."""
    try:
        value = orjson.loads(task_data)
    except orjson.JSONDecodeError:
        return task_data.encode()
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # an integer orjson reads but will not write (beyond 64 bits)
        return task_data.encode()


def fingerprint(task_type: str, task_data: str) -> str:
    """The `auto_dedupe` fingerprint of a payload."""
    return _hex(task_type.encode() + canonical_data(task_data))


def unique_fingerprint(task_type: str, unique_key: str) -> str:
    """The fingerprint of an enqueue with a `unique_key`."""
    return _hex(b"snerd-unique\0" + task_type.encode() + b"\0" + unique_key.encode() + b"\0")


def counts(
    until: UniqueUntil,
    *,
    started: bool,
    finished_at_us: int | None,
    now_us: int,
) -> bool:
    """Does a twin make a new enqueue with `unique_until` = `until` a duplicate? `started`: the
    twin is running (or being dispatched); `finished_at_us`: when it finished (None: live)."""
    if finished_at_us is None:
        return not (started and until == STARTED)
    if isinstance(until, int):
        return now_us - finished_at_us < until * _SECOND
    return False
