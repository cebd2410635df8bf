"""How long a failed task waits before its next attempt, and how many attempts it gets.

This module owns the retry arithmetic. It must never read a clock or draw a random number: the
"random" jitter of the exponential policy is a hash of (seed, task id, failure count), so one
seed replays one run exactly and two daemons compute the same delay for the same failure.

Policies:

- `constant` (upstream): every retry waits `retry_after_hours`.
- `exponential`: the n-th failure waits a time drawn uniformly from
  `[base, min(base * 2**(n - 1), cap)]`, where `base` is `retry_after_hours` and `cap` is 7 days
  (or `base` itself, when that is longer). This is "full jitter" (Brooker, "Exponential Backoff
  And Jitter", AWS Architecture Blog, 2015) with `base` as a floor: docs/protocol.md ("Attempts and retries") promises that a
  task waits `retry_after_hours` between attempts, so jitter only ever adds to it. The first
  retry waits exactly `base`.

Attempts: snerd's promise is that a task runs at most `1 + max_retries` times (crash
re-executions aside). Upstream ran it `max_retries` times (reference §4.1).
"""

from __future__ import annotations

import math

import xxhash

__all__ = [
    "EXPONENTIAL_CAP_US",
    "MAX_RETRY_AFTER_HOURS",
    "POLICIES",
    "attempts_allowed",
    "retry_delay_us",
    "task_backoff",
]

#: The policies `retry_delay_us` knows.
POLICIES = ("constant", "exponential")
#: The longest `retry_after_hours` accepted: 100 years. Longer is a mistake, and upstream's
#: chrono overflowed and panicked on such values (reference §6.4 #23).
MAX_RETRY_AFTER_HOURS = 100 * 365.25 * 24
#: Exponential backoff stops growing at 7 days.
EXPONENTIAL_CAP_US = 7 * 24 * 3600 * 1_000_000

_US_PER_HOUR = 3600 * 1_000_000
# Doubling stops mattering long before this: base >= 1 us and 2**62 us is ~146,000 years, so the
# shift is clamped here to keep huge failure counts cheap.
_MAX_SHIFT = 62
_U64 = 2**64


def retry_delay_us(
    *,
    retry_after_hours: float,
    failures: int,
    policy: str = "constant",
    jitter_seed: int = 0,
    task_id: str = "",
    cap_us: int = EXPONENTIAL_CAP_US,
) -> int:
    """The wait before the next attempt, after `failures` failed attempts.

    Args:
        retry_after_hours: the task's base delay; finite, 0 to 100 years.
        failures: failed attempts so far, at least 1.
        policy: `constant` or `exponential`.
        jitter_seed: seeds the exponential jitter; 0 <= seed < 2**64.
        task_id: mixed into the jitter so tasks failing together spread out.
        cap_us: where exponential growth stops (7 days unless the task names its own); a
            cap below `base` is `base`.

    Returns:
        Microseconds to wait, rounded to the nearest microsecond; never negative.

    Raises:
        ValueError: an argument is out of its range, or the policy is unknown.
    """
    if isinstance(retry_after_hours, bool) or not isinstance(retry_after_hours, int | float):
        raise ValueError(f"retry_after_hours must be a number, got {retry_after_hours!r}")
    if not math.isfinite(retry_after_hours) or not 0 <= retry_after_hours <= MAX_RETRY_AFTER_HOURS:
        raise ValueError(
            f"retry_after_hours must be between 0 and {MAX_RETRY_AFTER_HOURS}, "
            f"got {retry_after_hours}"
        )
    if isinstance(failures, bool) or not isinstance(failures, int) or failures < 1:
        raise ValueError(f"failures must be an integer of at least 1, got {failures!r}")
    if isinstance(jitter_seed, bool) or not isinstance(jitter_seed, int):
        raise ValueError(f"jitter_seed must be an integer, got {jitter_seed!r}")
    if not 0 <= jitter_seed < _U64:
        raise ValueError(f"jitter_seed must be in [0, 2**64), got {jitter_seed}")

    # round(), not int(): 0.1 h * 3.6e9 is 360000000.00000006 in binary floating point, and
    # other values land just under the integer; rounding gives the microsecond the user wrote.
    base = round(retry_after_hours * _US_PER_HOUR)
    if policy == "constant":
        return base
    if policy != "exponential":
        raise ValueError(f"unknown retry policy {policy!r}; known: {', '.join(POLICIES)}")

    ceiling = max(cap_us, base)
    grown = min(ceiling, base << min(failures - 1, _MAX_SHIFT))
    span = grown - base
    if span == 0:
        return base
    digest = xxhash.xxh64_intdigest(
        f"{failures}:{task_id}".encode("utf-8", "surrogatepass"), seed=jitter_seed
    )
    # Integer scaling of a uniform 64-bit value onto [0, span]: exact, no float rounding.
    return base + (digest * (span + 1) >> 64)


def task_backoff(policy: str | None, cap_seconds: int | None) -> tuple[str | None, int] | None:
    """A task's own retry policy (None: the daemon's) and exponential cap in µs, as an
    enqueue or its record names them; None when it names neither."""
    if policy is None and cap_seconds is None:
        return None
    return policy, EXPONENTIAL_CAP_US if cap_seconds is None else cap_seconds * 1_000_000


def attempts_allowed(max_retries: int) -> int:
    """How many times a task with `max_retries` may run: `1 + max_retries`.

    Raises:
        ValueError: `max_retries` is negative or not an integer.
    """
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
        raise ValueError(f"max_retries must be an integer of at least 0, got {max_retries!r}")
    return 1 + max_retries
