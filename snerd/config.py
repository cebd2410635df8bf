"""Daemon settings from the environment, validated: a value that does not parse, or lies outside
its range, is a `ConfigError` naming the variable (the daemon exits with code 2), never a silent
default (upstream bug 6.4.24) and never a crash further in.

Every number has a floor and a ceiling (`_LIMITS`): a value past the ceiling is refused rather
than carried into the core, where it would overflow a microsecond count (a lease of 1e303 s) or
make the daemon allocate or wait without bound. The ceilings are far above any sensible value.
Messages quote at most `_SHOWN_CHARS` characters of the value: it is one line, however long the
value is. This module reads the environment only; it never touches the data directory.
"""

from __future__ import annotations

import math
import os
import re
import secrets
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from snerd.core.ownership import MAX_QUEUE_SHARDS

if TYPE_CHECKING:
    from snerd.core.node import NodeConfig

#: `SNERD_FSYNC` values. `always`: an ack means written and fsynced (group commit makes it
#: cheap). `interval`: an ack means written; each written file is fsynced at most every
#: `interval_ms` and at the latest `interval_ms` after a write, so a power loss can take the last
#: `interval_ms` of acknowledged records (a process crash loses nothing: the page cache survives
#: it). `never`: an ack means written; the OS writes back when it likes. Defined here, and used
#: by the log writer (`snerd.io.log`), so that this module imports nothing from `snerd.io`.
FSYNC_POLICIES = ("always", "interval", "never")
#: Where the kernel lists this process's mounts (proc(5)), read by `snerd.io.fscheck`. Tests
#: point the daemon at a fake table with SNERD_TEST_MOUNTINFO.
MOUNTINFO = "/proc/self/mountinfo"

__all__ = [
    "ConfigError",
    "Settings",
    "ToolSettings",
    "env_dashboard_token",
    "load_settings",
    "load_tool_settings",
    "make_node_id",
    "parse_pools",
    "seconds_setting",
]


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


#: The range of every numeric setting: (least, most). Sized so that none can overflow what it
#: becomes in the core (microseconds as an int, a count of shards or workers), while staying
#: far above anything a deployment needs.
_LIMITS: dict[str, tuple[float, float]] = {
    "SNERD_SHARDS": (1, MAX_QUEUE_SHARDS),
    "SNERD_MAX_SHARDS": (1, MAX_QUEUE_SHARDS),
    "SNERD_MAX_WORKERS": (1, 100_000),
    "SNERD_POOLS": (1, 100_000),
    "SNERD_DRAIN_TIMEOUT": (0.0, 86_400.0),
    "SNERD_CLOCK_SKEW_MARGIN": (0.0, 3_600.0),
    "SNERD_LEASE_TTL": (0.3, 3_600.0),
    "SNERD_FSYNC_INTERVAL_MS": (1, 60_000),
    # About 31 years either way: the shifted wall clock stays a date RFC 3339 can write.
    "SNERD_TEST_CLOCK_OFFSET": (-1e9, 1e9),
    "SNERD_MAX_LINE_BYTES": (1024, 1 << 30),
    "SNERD_INBOX_POLL_MS": (1, 60_000),
    "SNERD_INBOX_IDLE_POLL_MS": (1, 600_000),
    "SNERD_WATCH_POLL_MS": (10, 60_000),
    # Finished tasks each log keeps (a late child's parent, `snerdmq dlq`): up to ten million.
    "SNERD_HISTORY_LIMIT": (0, 10_000_000),
    # A result must fit in a line with the rest of its message: at most the default line
    # less `_RESULT_LINE_OVERHEAD` (and checked against SNERD_MAX_LINE_BYTES when that is set).
    "SNERD_RESULT_MAX_BYTES": (1, 64 * 1024 * 1024 - 2048),
    # 0: kept as long as the history limit keeps them; at most about ten years.
    "SNERD_RESULT_RETENTION_SECONDS": (0.0, 10 * 365 * 86_400.0),
    # Above 0 (a wait of none would fail a child whose parent is a moment from its inbox), at
    # most a week.
    "SNERD_UNKNOWN_PARENT_SECONDS": (0.001, 7 * 86_400.0),
    # 0: acked at the inbox write (upstream's ack); at most a minute, since a caller waits.
    "SNERD_DEDUPE_WAIT_MS": (0, 60_000),
    "SNERD_COMMAND_WAIT_MS": (1, 600_000),
    "SNERD_TEST_RECENT_BYTES": (1024, 1 << 32),
    "SNERD_TEST_COMPACT_MIN_BYTES": (4096, 1 << 40),
}
#: Characters of a bad value quoted in its error.
_SHOWN_CHARS = 40
#: A whole number as the settings write it: ASCII digits, an optional sign (int() would also
#: take `1_000` and other scripts' digits).
_WHOLE = re.compile(r"[+-]?[0-9]+")


def _number(value: float) -> str:
    """A bound as a person reads it: `4,096`, `0.3`, `-1,000,000,000`."""
    return f"{value:,.0f}" if value == int(value) else f"{value:g}"


def _shown(raw: str) -> str:
    """`raw` quoted for an error message: all of it when short, else its start and length."""
    if len(raw) <= _SHOWN_CHARS:
        return repr(raw)
    return f"{raw[:_SHOWN_CHARS]!r}... ({len(raw)} characters)"


def _whole(text: str, name: str, shown: str) -> int:
    """`text` as an int within `name`'s range in `_LIMITS`; `shown` names it in errors."""
    low, high = _LIMITS[name]
    text = text.strip()
    if not _WHOLE.fullmatch(text):
        raise ConfigError(f"{shown} is not a whole number")
    bounds = f"a whole number from {_number(low)} to {_number(high)}"
    # Longer than any number in range: refused before int() (which refuses 4,300 digits).
    if len(text.lstrip("+-0")) > len(str(int(high))) or not low <= int(text) <= high:
        raise ConfigError(f"{shown} must be {bounds}")
    return int(text)


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    return _whole(raw, name, f"{name}={_shown(raw)}")


def seconds_setting(env: Mapping[str, str], name: str, default: float) -> float:
    """The setting `name` (one of `_LIMITS`) in seconds, `default` when unset or empty; a
    ConfigError naming it when it is not a number in its range."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    low, high = _LIMITS[name]
    try:
        value = float(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}={_shown(raw)} is not a number of seconds") from None
    if not (math.isfinite(value) and low <= value <= high):
        raise ConfigError(
            f"{name}={_shown(raw)} must be a number of seconds from {_number(low)} to "
            f"{_number(high)}"
        )
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
    raise ConfigError(f"{name}={_shown(raw)} must be 1 or 0 (true/false, yes/no, on/off)")


def _choice(env: Mapping[str, str], name: str, default: str, choices: tuple[str, ...]) -> str:
    """One of `choices`, in any case; unset or empty: `default`."""
    raw = env.get(name)
    value = "" if raw is None else raw.strip().lower()
    if not value:
        return default
    if value not in choices:
        raise ConfigError(f"{name}={_shown(str(raw))} must be one of {', '.join(choices)}")
    return value


def parse_pools(raw: str, name: str = "SNERD_POOLS") -> dict[str, int]:
    """`name=N,other=M` (upstream) or `name:N` (what its docs show) into a dict."""
    pools: dict[str, int] = {}
    for part in raw.split(","):
        part = part.strip()
        if not part:
            continue
        sep = "=" if "=" in part else ":" if ":" in part else None
        shown = _shown(part)
        if sep is None:
            raise ConfigError(f"{name}: {shown} is not name=N")
        pool, _, count = part.partition(sep)
        pool = pool.strip()
        if not pool:
            raise ConfigError(f"{name}: {shown} needs a pool name before {sep!r}")
        pools[pool] = _whole(count, "SNERD_POOLS", f"{name}: {shown}: {_shown(count.strip())}")
    return pools


#: The host part of a node id: at most this many characters, each printable and not a space.
#: The id is written on a line of each shard's lock file, whose fields are split at whitespace
#: (`LockText.parse`), and into membership.json at every renewal: a HOSTNAME with a space or a
#: newline would misread as another owner, a huge one would be rewritten every few seconds.
_HOST_CHARS = 64


def make_node_id(env: Mapping[str, str]) -> str:
    """`<host>@pid-<pid>-<random>`: unique per process start even when HOSTNAME is unset on
    two hosts (upstream bug 6.3.18), yet still in upstream's `<host>@pid-<pid>` shape. A
    character of the host name that is a space or not printable becomes `_`."""
    host = env.get("HOSTNAME") or env.get("COMPUTERNAME") or socket.gethostname()
    host = "".join(c if c.isprintable() and not c.isspace() else "_" for c in host[:_HOST_CHARS])
    return f"{host or 'unknown-host'}@pid-{os.getpid()}-{secrets.token_hex(3)}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolSettings:
    """The settings a reader of a queue directory shares with the daemons (`snerdmq stats`,
    `validate`, `compact`, `replay`, the dashboard): read by the same rules, so a tool refuses
    what the daemon refuses and judges a lease with the parameters the daemons run with."""

    #: SNERD_LEASE_TTL, in seconds.
    lease_ttl_s: float = 30.0
    #: SNERD_CLOCK_SKEW_MARGIN, in seconds: added to a lease before it counts as lapsed.
    skew_margin_s: float = 5.0
    #: Test hook: seconds added to the wall clock (SNERD_TEST_CLOCK_OFFSET).
    clock_offset_s: float = 0.0
    #: Test hook: the mount table the filesystem check reads (SNERD_TEST_MOUNTINFO).
    mountinfo_path: str = MOUNTINFO
    #: SNERD_RESULT_RETENTION_SECONDS: how long completed tasks (and their results) are kept;
    #: 0, as long as the history limit keeps them.
    result_retention_s: float = 7 * 86_400.0
    #: SNERD_DEDUPE_WAIT_MS: how long an enqueue with dedupe written into an inbox waits for
    #: its owner's decision (0: acked at the write, undecided).
    dedupe_wait_ms: int = 5000

    @property
    def result_retention_us(self) -> int:
        return int(self.result_retention_s * 1_000_000)

    @property
    def lease_ttl_us(self) -> int:
        return int(self.lease_ttl_s * 1_000_000)

    @property
    def skew_margin_us(self) -> int:
        return int(self.skew_margin_s * 1_000_000)

    @property
    def clock_offset_us(self) -> int:
        return int(self.clock_offset_s * 1_000_000)


def load_tool_settings(env: Mapping[str, str] | None = None) -> ToolSettings:
    """Read and validate the SNERD_* variables a reader shares with the daemons (`load_settings`
    reads them through this too). Raises ConfigError naming the bad one."""
    env = os.environ if env is None else env
    return ToolSettings(
        skew_margin_s=seconds_setting(env, "SNERD_CLOCK_SKEW_MARGIN", 5.0),
        lease_ttl_s=seconds_setting(env, "SNERD_LEASE_TTL", 30.0),
        clock_offset_s=seconds_setting(env, "SNERD_TEST_CLOCK_OFFSET", 0.0),
        mountinfo_path=env.get("SNERD_TEST_MOUNTINFO", "").strip() or MOUNTINFO,
        result_retention_s=seconds_setting(env, "SNERD_RESULT_RETENTION_SECONDS", 7 * 86_400.0),
        dedupe_wait_ms=_int(env, "SNERD_DEDUPE_WAIT_MS", 5000),
    )


def env_dashboard_token(env: Mapping[str, str] | None = None) -> str | None:
    """SNERD_DASHBOARD_TOKEN as set (None: unset). Whether it may be used, and where, is the
    dashboard's rule (`snerd.dashboard.server.check_exposure`)."""
    env = os.environ if env is None else env
    return env.get("SNERD_DASHBOARD_TOKEN")


#: Bytes of a `result` line besides its result (its action, id, status, attempt), at most.
_RESULT_LINE_OVERHEAD = 2048


def _result_max_bytes(env: Mapping[str, str], max_line: int) -> int:
    """SNERD_RESULT_MAX_BYTES. A result must fit in a line of SNERD_MAX_LINE_BYTES with the
    rest of its message: a limit set past that is refused; unset, it is 256 KiB or what such
    a line leaves room for."""
    from snerd.core.protocol import DEFAULT_RESULT_MAX_BYTES

    room = max(1, max_line - _RESULT_LINE_OVERHEAD)
    result_max = _int(env, "SNERD_RESULT_MAX_BYTES", min(DEFAULT_RESULT_MAX_BYTES, room))
    if result_max > room:
        raise ConfigError(
            f"SNERD_RESULT_MAX_BYTES={result_max} leaves no room in a line of "
            f"SNERD_MAX_LINE_BYTES={max_line}: at most {room}"
        )
    return result_max


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Read and validate every SNERD_* variable. Raises ConfigError naming the bad one."""
    # Imported here: the subcommands read their few settings (`seconds_setting`) without the
    # daemon's modules (trio, the core).
    from snerd.core.node import SECOND, NodeConfig
    from snerd.core.ownership import OwnershipConfig

    env = os.environ if env is None else env
    shards = _int(env, "SNERD_SHARDS", 1)
    max_shards_raw = env.get("SNERD_MAX_SHARDS")
    max_shards = (
        None
        if max_shards_raw is None or max_shards_raw.strip() == ""
        else _int(env, "SNERD_MAX_SHARDS", 1)
    )
    max_workers = _int(env, "SNERD_MAX_WORKERS", 100)
    pools = parse_pools(env.get("SNERD_POOLS", ""))
    drain = seconds_setting(env, "SNERD_DRAIN_TIMEOUT", 30.0)
    shared = load_tool_settings(env)
    skew, ttl = shared.skew_margin_s, shared.lease_ttl_s
    fsync = _choice(env, "SNERD_FSYNC", "always", FSYNC_POLICIES)
    fsync_interval_ms = _int(env, "SNERD_FSYNC_INTERVAL_MS", 100)
    backoff = _choice(env, "SNERD_BACKOFF", "constant", ("constant", "exponential"))
    offset = shared.clock_offset_s
    max_line = _int(env, "SNERD_MAX_LINE_BYTES", 64 * 1024 * 1024)
    inbox_poll_ms = _int(env, "SNERD_INBOX_POLL_MS", 100)
    inbox_idle_poll_ms = _int(env, "SNERD_INBOX_IDLE_POLL_MS", 1000)
    watch_poll_ms = _int(env, "SNERD_WATCH_POLL_MS", 250)
    unknown_parent = seconds_setting(env, "SNERD_UNKNOWN_PARENT_SECONDS", 60.0)
    dedupe_wait_ms = shared.dedupe_wait_ms
    command_wait_ms = _int(env, "SNERD_COMMAND_WAIT_MS", 5000)
    history_limit = _int(env, "SNERD_HISTORY_LIMIT", 10_000)
    result_max = _result_max_bytes(env, max_line)
    force_filesystem = _flag(env, "SNERD_FORCE_FILESYSTEM")
    mountinfo = shared.mountinfo_path
    # Test hook, for chaos tests' negative control only: replay accepts records of stale
    # owners (no fencing), so a double ownership corrupts the log's state.
    unsafe_no_fence = _flag(env, "SNERD_TEST_UNSAFE_NO_FENCE")
    # Test hooks, for jepsen-lite's negative controls of job control only: a cancel answered
    # and not kept, pauses written and not obeyed.
    unsafe_ignore_cancel = _flag(env, "SNERD_TEST_UNSAFE_IGNORE_CANCEL")
    unsafe_ignore_pause = _flag(env, "SNERD_TEST_UNSAFE_IGNORE_PAUSE")
    # Test hooks: a small cache and early compaction, so that a short test meets both.
    recent_bytes = _int(env, "SNERD_TEST_RECENT_BYTES", 8 * 1024 * 1024)
    compact_min = _int(env, "SNERD_TEST_COMPACT_MIN_BYTES", 8 * 1024 * 1024)
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
        watch_poll_us=watch_poll_ms * 1000,
        unknown_parent_wait_us=int(unknown_parent * SECOND),
        dedupe_wait_us=dedupe_wait_ms * 1000,
        command_wait_us=command_wait_ms * 1000,
        history_limit=history_limit,
        result_max_bytes=result_max,
        result_retention_us=shared.result_retention_us,
        fence=not unsafe_no_fence,
        unsafe_ignore_cancel=unsafe_ignore_cancel,
        unsafe_ignore_pause=unsafe_ignore_pause,
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
