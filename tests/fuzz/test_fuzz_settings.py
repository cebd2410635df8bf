"""Fuzzing the daemon's settings (`snerd.config.load_settings`): any value of any SNERD_*
variable either loads, within the variable's range, or is a `ConfigError` whose message names the
variable; never another exception (a lease of 1e303 s overflowed into the core as an
OverflowError) and never a value the core cannot hold.

Values are drawn as text of every kind (control characters, surrogates from undecodable bytes as
`os.environ` holds them, other scripts' digits), as numbers around and far beyond each range
(negative, 4,300-digit integers, floats up to 1e308, `nan`, `inf`), and padded with blanks. The
list of variables is checked against the names `snerd/config.py` reads, so a new setting cannot
escape the fuzzing. Example counts come from the hypothesis profile (tests/conftest.py).
"""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

import snerd.config
from snerd.config import ConfigError, Settings, env_dashboard_token, load_settings
from snerd.core.node import SECOND
from snerd.core.timefmt import MAX_US, MIN_US
from snerd.dashboard.server import check_exposure

#: Every variable load_settings reads, and the kind of value it takes.
WHOLE = [
    "SNERD_SHARDS",
    "SNERD_MAX_SHARDS",
    "SNERD_MAX_WORKERS",
    "SNERD_FSYNC_INTERVAL_MS",
    "SNERD_MAX_LINE_BYTES",
    "SNERD_INBOX_POLL_MS",
    "SNERD_INBOX_IDLE_POLL_MS",
    "SNERD_WATCH_POLL_MS",
    "SNERD_DEDUPE_WAIT_MS",
    "SNERD_COMMAND_WAIT_MS",
    "SNERD_HISTORY_LIMIT",
    "SNERD_RESULT_MAX_BYTES",
    "SNERD_TEST_RECENT_BYTES",
    "SNERD_TEST_COMPACT_MIN_BYTES",
]
SECONDS = [
    "SNERD_DRAIN_TIMEOUT",
    "SNERD_CLOCK_SKEW_MARGIN",
    "SNERD_LEASE_TTL",
    "SNERD_UNKNOWN_PARENT_SECONDS",
    "SNERD_RESULT_RETENTION_SECONDS",
    "SNERD_TEST_CLOCK_OFFSET",
]
OTHER = [
    "SNERD_POOLS",
    "SNERD_FSYNC",
    "SNERD_BACKOFF",
    "SNERD_FORCE_FILESYSTEM",
    "SNERD_TEST_UNSAFE_NO_FENCE",
    "SNERD_TEST_UNSAFE_IGNORE_CANCEL",
    "SNERD_TEST_UNSAFE_IGNORE_PAUSE",
    "SNERD_TEST_MOUNTINFO",
]
SETTINGS = WHOLE + SECONDS + OTHER
#: Read by snerd.config for another reader and taken as it is (`env_dashboard_token`); whether
#: it may be used is that reader's rule (`snerd.dashboard.server.check_exposure`).
AS_IS = ["SNERD_DASHBOARD_TOKEN"]

#: Characters as they may come out of `os.environ`: any text, lone surrogates included
#: (undecodable bytes), and digits of other scripts that int() and float() would accept.
_CHARS = st.one_of(
    st.characters(),
    st.characters(min_codepoint=0xDC80, max_codepoint=0xDCFF),
    st.sampled_from("0123456789+-._eE, =:\t\n\x00\u0660\u0967\uff11"),
)


def _numbers() -> st.SearchStrategy[str]:
    return st.one_of(
        st.integers().map(str),
        st.integers(min_value=-(10**40), max_value=10**40).map(str),
        st.integers(min_value=0, max_value=5000).map(lambda n: "9" * n),
        st.floats().map(repr),
        st.floats().map(str),
        st.sampled_from(["nan", "inf", "-inf", "1e308", "1e303", "-0", "0x10", "1_000", "١٢"]),
    )


VALUES = st.one_of(
    st.text(_CHARS, max_size=60),
    _numbers(),
    st.tuples(st.sampled_from(["", " ", "\t"]), _numbers(), st.sampled_from(["", " ", "\n"])).map(
        "".join
    ),
    st.lists(
        st.tuples(st.text(_CHARS, max_size=8), st.sampled_from("=:"), _numbers()), max_size=4
    ).map(lambda parts: ",".join(f"{name}{sep}{n}" for name, sep, n in parts)),
)


def check_in_range(settings: Settings) -> None:
    """What the core gets is what it can hold: microsecond counts as ints within the limits
    the variables document, a shifted clock RFC 3339 can still write."""
    node = settings.node
    assert 1 <= node.new_queue_shards <= 4096
    assert node.ownership.max_shards is None or 1 <= node.ownership.max_shards <= 4096
    assert 1 <= node.max_workers <= 100_000
    assert all(isinstance(n, int) and 1 <= n <= 100_000 for n in node.pools.values())
    assert 0 <= node.drain_timeout_us <= 86_400 * SECOND
    assert 0.3 * SECOND <= node.ownership.ttl_us <= 3_600 * SECOND
    assert 0 <= node.ownership.skew_margin_us <= 3_600 * SECOND
    assert 1 <= settings.fsync_interval_ms <= 60_000
    # The wall clock of today, shifted, is a time the records can carry.
    assert MIN_US <= 1_700_000_000 * SECOND + int(settings.clock_offset_s * SECOND) <= MAX_US
    assert 1_000 <= node.inbox_poll_us <= 60_000_000
    assert 1_000 <= node.inbox_idle_poll_us <= 600_000_000
    assert 10_000 <= node.watch_poll_us <= 60_000_000
    assert 1_000 <= node.unknown_parent_wait_us <= 7 * 86_400 * SECOND
    assert 0 <= node.dedupe_wait_us <= 60_000_000
    assert 0 <= node.history_limit <= 10_000_000
    assert 1024 <= settings.max_line_bytes <= 1 << 30
    assert settings.fsync in ("always", "interval", "never")
    assert node.backoff in ("constant", "exponential")


@given(name=st.sampled_from(SETTINGS), value=VALUES)
def test_any_value_of_a_setting_loads_in_range_or_is_an_error_naming_it(
    name: str, value: str
) -> None:
    try:
        settings = load_settings({name: value})
    except ConfigError as exc:
        text = str(exc)
        assert text.startswith(name), text
        assert "\n" not in text and len(text) < 400, text
    else:
        check_in_range(settings)


@given(env=st.dictionaries(st.sampled_from(SETTINGS), VALUES, max_size=len(SETTINGS)))
def test_many_values_at_once_load_or_name_one_of_the_bad_ones(env: dict[str, str]) -> None:
    try:
        settings = load_settings(env)
    except ConfigError as exc:
        named = [name for name in env if str(exc).startswith(name)]
        assert named, str(exc)
        # The one named is bad on its own, too: the error is about that value.
        try:
            load_settings({named[0]: env[named[0]]})
        except ConfigError:
            pass
        else:
            raise AssertionError(f"{named[0]}={env[named[0]]!r} loads alone, yet: {exc}")
    else:
        check_in_range(settings)


@given(
    name=st.sampled_from(WHOLE),
    fraction=st.floats(min_value=0.0, max_value=1.0),
    pad=st.sampled_from(["", " ", "\t"]),
)
def test_a_whole_number_in_range_loads_as_itself(name: str, fraction: float, pad: str) -> None:
    low, high = snerd.config._LIMITS[name]
    value = int(low + (high - low) * fraction)
    settings = load_settings({name: f"{pad}{value}{pad}"})
    got = {
        "SNERD_SHARDS": settings.node.new_queue_shards,
        "SNERD_MAX_SHARDS": settings.node.ownership.max_shards,
        "SNERD_MAX_WORKERS": settings.node.max_workers,
        "SNERD_FSYNC_INTERVAL_MS": settings.fsync_interval_ms,
        "SNERD_MAX_LINE_BYTES": settings.max_line_bytes,
        "SNERD_INBOX_POLL_MS": settings.node.inbox_poll_us // 1000,
        "SNERD_INBOX_IDLE_POLL_MS": settings.node.inbox_idle_poll_us // 1000,
        "SNERD_WATCH_POLL_MS": settings.node.watch_poll_us // 1000,
        "SNERD_DEDUPE_WAIT_MS": settings.node.dedupe_wait_us // 1000,
        "SNERD_COMMAND_WAIT_MS": settings.node.command_wait_us // 1000,
        "SNERD_HISTORY_LIMIT": settings.node.history_limit,
        "SNERD_RESULT_MAX_BYTES": settings.node.result_max_bytes,
        "SNERD_TEST_RECENT_BYTES": settings.recent_bytes,
        "SNERD_TEST_COMPACT_MIN_BYTES": settings.node.compact_min_bytes,
    }[name]
    assert got == value


def test_every_variable_config_reads_is_fuzzed() -> None:
    source = Path(snerd.config.__file__).read_text()
    read = set(re.findall(r'"(SNERD_[A-Z_]+)"', source))
    assert read == set(SETTINGS + AS_IS), read ^ set(SETTINGS + AS_IS)


@given(value=st.text(_CHARS, max_size=60))
def test_the_dashboard_token_is_taken_as_it_is_and_a_blank_one_refused(value: str) -> None:
    assert env_dashboard_token({"SNERD_DASHBOARD_TOKEN": value}) == value
    if value.strip() == "":
        try:
            check_exposure("127.0.0.1", value)
        except ValueError as exc:
            assert "SNERD_DASHBOARD_TOKEN" in str(exc)
        else:
            raise AssertionError(f"a blank token {value!r} was taken")
    else:
        assert check_exposure("0.0.0.0", value) == value
