"""Daemon settings from the environment, validated: a value that does not parse is an error
naming the variable (exit code 2), never a silent default (upstream bug 6.4.24)."""

from __future__ import annotations

import math
import os
import secrets
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

from snerd.core.node import SECOND, NodeConfig
from snerd.core.ownership import OwnershipConfig
from snerd.io.fscheck import MOUNTINFO
from snerd.io.log import FSYNC_POLICIES

__all__ = ["ConfigError", "Settings", "load_settings", "make_node_id", "parse_pools"]


class ConfigError(ValueError):
    """A bad environment value or argument; the message names it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Everything the shell needs to start a daemon on one directory."""

    node: NodeConfig
    #: SNERD_FSYNC: `always` (an ack means fsynced), `interval`, `never`.
    fsync: str = "always"
    #: SNERD_FSYNC_INTERVAL_MS: how often `interval` fsyncs.
    fsync_interval_ms: int = 100
    #: Test hook: seconds added to the wall clock (SNERD_TEST_CLOCK_OFFSET).
    clock_offset_s: float = 0.0
    #: Longest accepted SDK line, in bytes.
    max_line_bytes: int = 64 * 1024 * 1024
    #: SNERD_FORCE_FILESYSTEM (or `snerdmq --force`): start on a filesystem the startup check
    #: refuses, with a warning instead.
    force_filesystem: bool = False
    #: Test hook: the mount table the startup check reads (SNERD_TEST_MOUNTINFO).
    mountinfo_path: str = MOUNTINFO
    #: Test hook: bytes of lines the cache of recent records keeps (SNERD_TEST_RECENT_BYTES),
    #: small to make a short queue deeper than the cache.
    recent_bytes: int = 8 * 1024 * 1024
    extra: dict[str, str] = field(default_factory=dict)


def _int(env: Mapping[str, str], name: str, default: int, *, minimum: int) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a whole number") from None
    if value < minimum:
        raise ConfigError(f"{name}={raw!r} must be at least {minimum}")
    return value


def _seconds(env: Mapping[str, str], name: str, default: float, *, minimum: float) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < minimum:
        raise ConfigError(f"{name}={raw!r} must be a finite number of seconds >= {minimum}")
    return value


def _flag(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return False
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}={raw!r} must be 1 or 0 (true/false, yes/no, on/off)")


def parse_pools(raw: str, name: str = "SNERD_POOLS") -> dict[str, int]:
    """`name=N,other=M` (upstream) or `name:N` (what its docs show) into a dict."""
    pools: dict[str, int] = {}
    for part in raw.split(","):
        part = part.strip()
        if not part:
            continue
        sep = "=" if "=" in part else ":" if ":" in part else None
        if sep is None:
            raise ConfigError(f"{name}: {part!r} is not name=N")
        pool, _, count = part.partition(sep)
        pool = pool.strip()
        try:
            n = int(count.strip())
        except ValueError:
            raise ConfigError(f"{name}: {part!r}: {count.strip()!r} is not a whole number") from None
        if not pool or n < 1:
            raise ConfigError(f"{name}: {part!r} needs a pool name and a limit of at least 1")
        pools[pool] = n
    return pools


def make_node_id(env: Mapping[str, str]) -> str:
    """`<host>@pid-<pid>-<random>`: unique per process start even when HOSTNAME is unset on
    two hosts (upstream bug 6.3.18), yet still in upstream's `<host>@pid-<pid>` shape."""
    host = env.get("HOSTNAME") or env.get("COMPUTERNAME") or socket.gethostname() or "unknown-host"
    return f"{host}@pid-{os.getpid()}-{secrets.token_hex(3)}"


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Read and validate every SNERD_* variable. Raises ConfigError naming the bad one."""
    env = os.environ if env is None else env
    shards = _int(env, "SNERD_SHARDS", 1, minimum=1)
    max_shards_raw = env.get("SNERD_MAX_SHARDS")
    max_shards = (
        None
        if max_shards_raw is None or max_shards_raw.strip() == ""
        else _int(env, "SNERD_MAX_SHARDS", 1, minimum=1)
    )
    max_workers = _int(env, "SNERD_MAX_WORKERS", 100, minimum=1)
    pools = parse_pools(env.get("SNERD_POOLS", ""))
    drain = _seconds(env, "SNERD_DRAIN_TIMEOUT", 30.0, minimum=0.0)
    skew = _seconds(env, "SNERD_CLOCK_SKEW_MARGIN", 5.0, minimum=0.0)
    ttl = _seconds(env, "SNERD_LEASE_TTL", 30.0, minimum=0.3)
    fsync = env.get("SNERD_FSYNC", "always").strip().lower() or "always"
    if fsync not in FSYNC_POLICIES:
        raise ConfigError(f"SNERD_FSYNC={fsync!r} must be one of {', '.join(FSYNC_POLICIES)}")
    fsync_interval_ms = _int(env, "SNERD_FSYNC_INTERVAL_MS", 100, minimum=1)
    backoff = env.get("SNERD_BACKOFF", "constant").strip() or "constant"
    if backoff not in ("constant", "exponential"):
        raise ConfigError(f"SNERD_BACKOFF={backoff!r} must be constant or exponential")
    offset = _seconds(env, "SNERD_TEST_CLOCK_OFFSET", 0.0, minimum=-math.inf)
    max_line = _int(env, "SNERD_MAX_LINE_BYTES", 64 * 1024 * 1024, minimum=1024)
    inbox_poll_ms = _int(env, "SNERD_INBOX_POLL_MS", 100, minimum=1)
    inbox_idle_poll_ms = _int(env, "SNERD_INBOX_IDLE_POLL_MS", 1000, minimum=1)
    force_filesystem = _flag(env, "SNERD_FORCE_FILESYSTEM")
    mountinfo = env.get("SNERD_TEST_MOUNTINFO", "").strip() or MOUNTINFO
    # Test hook, for chaos tests' negative control only: replay accepts records of stale
    # owners (no fencing), so a double ownership corrupts the log's state.
    unsafe_no_fence = _flag(env, "SNERD_TEST_UNSAFE_NO_FENCE")
    # Test hooks: a small cache and early compaction, so that a short test meets both.
    recent_bytes = _int(env, "SNERD_TEST_RECENT_BYTES", 8 * 1024 * 1024, minimum=1024)
    compact_min = _int(env, "SNERD_TEST_COMPACT_MIN_BYTES", 8 * 1024 * 1024, minimum=4096)
    node = NodeConfig(
        node_id=make_node_id(env),
        new_queue_shards=shards,
        max_workers=max_workers,
        pools=pools,
        drain_timeout_us=int(drain * SECOND),
        ownership=OwnershipConfig(
            ttl_us=int(ttl * SECOND), skew_margin_us=int(skew * SECOND), max_shards=max_shards
        ),
        backoff=backoff,
        jitter_seed=secrets.randbits(32),
        inbox_poll_us=inbox_poll_ms * 1000,
        inbox_idle_poll_us=inbox_idle_poll_ms * 1000,
        fence=not unsafe_no_fence,
        compact_min_bytes=compact_min,
    )
    return Settings(
        node=node,
        fsync=fsync,
        fsync_interval_ms=fsync_interval_ms,
        clock_offset_s=offset,
        max_line_bytes=max_line,
        force_filesystem=force_filesystem,
        mountinfo_path=mountinfo,
        recent_bytes=recent_bytes,
    )
