"""The daemon's settings from its environment (`snerd.config.load_settings`)."""

from __future__ import annotations

import re

import pytest

from snerd.config import ConfigError, load_settings, load_tool_settings


def test_the_inbox_polls_default_to_100_ms_and_1_s_and_follow_their_variables() -> None:
    node = load_settings({}).node
    assert (node.inbox_poll_us, node.inbox_idle_poll_us) == (100_000, 1_000_000)
    node = load_settings({"SNERD_INBOX_POLL_MS": "50", "SNERD_INBOX_IDLE_POLL_MS": "250"}).node
    assert (node.inbox_poll_us, node.inbox_idle_poll_us) == (50_000, 250_000)


@pytest.mark.parametrize("value", ["0", "-5", "soon", "1.5"])
def test_a_bad_idle_inbox_poll_is_refused_naming_it(value: str) -> None:
    with pytest.raises(ConfigError, match=f"SNERD_INBOX_IDLE_POLL_MS={value!r}"):
        load_settings({"SNERD_INBOX_IDLE_POLL_MS": value})


def test_the_parent_watch_defaults_to_250_ms_and_60_s_and_follows_its_variables() -> None:
    node = load_settings({}).node
    assert (node.watch_poll_us, node.unknown_parent_wait_us) == (250_000, 60_000_000)
    env = {"SNERD_WATCH_POLL_MS": " 40 ", "SNERD_UNKNOWN_PARENT_SECONDS": "1.5"}
    node = load_settings(env).node
    assert (node.watch_poll_us, node.unknown_parent_wait_us) == (40_000, 1_500_000)
    week = load_settings({"SNERD_UNKNOWN_PARENT_SECONDS": "604800"}).node
    assert week.unknown_parent_wait_us == 7 * 86_400_000_000


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("SNERD_WATCH_POLL_MS", "9", "must be a whole number from 10 to 60,000"),
        ("SNERD_WATCH_POLL_MS", "0.5", "is not a whole number"),
        ("SNERD_UNKNOWN_PARENT_SECONDS", "0", "must be a number of seconds from 0.001 to 604,800"),
        ("SNERD_UNKNOWN_PARENT_SECONDS", "-1", "from 0.001 to 604,800"),
        ("SNERD_UNKNOWN_PARENT_SECONDS", "604801", "from 0.001 to 604,800"),
        ("SNERD_UNKNOWN_PARENT_SECONDS", "nan", "from 0.001 to 604,800"),
        ("SNERD_UNKNOWN_PARENT_SECONDS", "a minute", "is not a number of seconds"),
    ],
)
def test_a_bad_parent_watch_setting_is_refused_naming_it(name: str, value: str, says: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings({name: value})
    text = str(refused.value)
    assert text.startswith(f"{name}={value!r} ") and says in text, text


def test_the_dedupe_wait_defaults_to_5_s_and_follows_its_variable() -> None:
    assert load_settings({}).node.dedupe_wait_us == 5_000_000
    assert load_settings({"SNERD_DEDUPE_WAIT_MS": " 250 "}).node.dedupe_wait_us == 250_000
    assert load_settings({"SNERD_DEDUPE_WAIT_MS": "60000"}).node.dedupe_wait_us == 60_000_000
    # 0: the ack goes at the inbox write, as upstream's did.
    assert load_settings({"SNERD_DEDUPE_WAIT_MS": "0"}).node.dedupe_wait_us == 0


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("-1", "must be a whole number from 0 to 60,000"),
        ("60001", "must be a whole number from 0 to 60,000"),
        ("9" * 400, "must be a whole number from 0 to 60,000"),
        ("0.5", "is not a whole number"),
        ("5s", "is not a whole number"),
    ],
)
def test_a_bad_dedupe_wait_is_refused_naming_it(value: str, says: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings({"SNERD_DEDUPE_WAIT_MS": value})
    text = str(refused.value)
    assert text.startswith("SNERD_DEDUPE_WAIT_MS=") and says in text, text


def test_a_host_name_with_blanks_or_controls_makes_a_node_id_of_one_word() -> None:
    # The id is one whitespace-split field of each shard's lock file (`LockText.parse`).
    node_id = load_settings({"HOSTNAME": "web 1\nrack\x00" + "x" * 5000}).node.node_id
    host, _, pid = node_id.partition("@pid-")
    assert host == ("web_1_rack_" + "x" * 5000)[:64]
    assert node_id.split() == [node_id] and pid.split("-")[0].isdigit()


def test_a_long_bad_value_is_quoted_in_part_on_one_line() -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings({"SNERD_SHARDS": "9" * 5000})
    text = str(refused.value)
    assert text.startswith("SNERD_SHARDS='99999") and "(5000 characters)" in text
    assert "must be a whole number from 1 to 4,096" in text and len(text) < 150


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("SNERD_LEASE_TTL", "1e303", "must be a number of seconds from 0.3 to 3,600"),
        ("SNERD_TEST_CLOCK_OFFSET", "-1e10", "from -1,000,000,000 to 1,000,000,000"),
        ("SNERD_MAX_WORKERS", "1_000", "is not a whole number"),
        ("SNERD_POOLS", "fast=0", "SNERD_POOLS: 'fast=0': '0' must be a whole number from 1"),
        ("SNERD_POOLS", "=3", "needs a pool name before '='"),
        ("SNERD_BACKOFF", "linear", "must be one of constant, exponential"),
    ],
)
def test_a_value_out_of_its_range_is_refused_saying_the_range(
    name: str, value: str, says: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)):
        load_settings({name: value})


def test_the_enumerations_take_any_case() -> None:
    settings = load_settings({"SNERD_BACKOFF": " Exponential ", "SNERD_FSYNC": "NEVER"})
    assert (settings.node.backoff, settings.fsync) == ("exponential", "never")


def test_the_tools_read_the_lease_settings_as_the_daemon_does() -> None:
    env = {
        "SNERD_LEASE_TTL": "12",
        "SNERD_CLOCK_SKEW_MARGIN": "0.5",
        "SNERD_TEST_CLOCK_OFFSET": "-3",
        "SNERD_TEST_MOUNTINFO": " /tmp/mounts ",
    }
    tool = load_tool_settings(env)
    assert (tool.lease_ttl_us, tool.skew_margin_us, tool.clock_offset_us) == (
        12_000_000, 500_000, -3_000_000
    )
    assert tool.mountinfo_path == "/tmp/mounts"
    daemon = load_settings(env)
    assert daemon.node.ownership.ttl_us == tool.lease_ttl_us
    assert daemon.node.ownership.skew_margin_us == tool.skew_margin_us
    assert (daemon.clock_offset_s, daemon.mountinfo_path) == (-3.0, "/tmp/mounts")
    for name in ("SNERD_LEASE_TTL", "SNERD_CLOCK_SKEW_MARGIN", "SNERD_TEST_CLOCK_OFFSET"):
        for load in (load_tool_settings, load_settings):
            with pytest.raises(ConfigError, match=name):
                load({name: "soon"})


def test_the_history_kept_per_log_defaults_to_10000_and_follows_its_variable() -> None:
    assert load_settings({}).node.history_limit == 10_000
    assert load_settings({"SNERD_HISTORY_LIMIT": "250000"}).node.history_limit == 250_000
    assert load_settings({"SNERD_HISTORY_LIMIT": "0"}).node.history_limit == 0
    for value, says in (("-1", "from 0 to 10,000,000"), ("lots", "is not a whole number")):
        with pytest.raises(ConfigError, match=says):
            load_settings({"SNERD_HISTORY_LIMIT": value})


def test_the_result_limit_defaults_to_256_kib_and_must_fit_in_a_line() -> None:
    assert load_settings({}).node.result_max_bytes == 262_144
    assert load_settings({"SNERD_RESULT_MAX_BYTES": "1000"}).node.result_max_bytes == 1000
    # Unset under a short line: what the line leaves room for.
    short = load_settings({"SNERD_MAX_LINE_BYTES": "65536"})
    assert short.node.result_max_bytes == 65536 - 2048
    with pytest.raises(ConfigError, match="SNERD_RESULT_MAX_BYTES=100000 leaves no room"):
        load_settings({"SNERD_MAX_LINE_BYTES": "65536", "SNERD_RESULT_MAX_BYTES": "100000"})
    for value, says in (("0", "from 1 to"), ("big", "is not a whole number")):
        with pytest.raises(ConfigError, match=says):
            load_settings({"SNERD_RESULT_MAX_BYTES": value})


def test_the_result_retention_defaults_to_seven_days_and_0_keeps_them() -> None:
    assert load_settings({}).node.result_retention_us == 7 * 86_400 * 1_000_000
    node = load_settings({"SNERD_RESULT_RETENTION_SECONDS": "0"}).node
    assert node.result_retention_us == 0
    node = load_settings({"SNERD_RESULT_RETENTION_SECONDS": "1.5"}).node
    assert node.result_retention_us == 1_500_000
    for value in ("-1", "forever"):
        with pytest.raises(ConfigError, match="SNERD_RESULT_RETENTION_SECONDS"):
            load_settings({"SNERD_RESULT_RETENTION_SECONDS": value})


def test_the_job_control_test_hooks_are_off_by_default_and_follow_their_variables() -> None:
    """jepsen-lite's negative controls of job control: a daemon that ignores cancels, or
    pauses, only when its test hook says so."""
    node = load_settings({}).node
    assert not node.unsafe_ignore_cancel and not node.unsafe_ignore_pause
    node = load_settings({"SNERD_TEST_UNSAFE_IGNORE_CANCEL": "1"}).node
    assert node.unsafe_ignore_cancel and not node.unsafe_ignore_pause
    node = load_settings({"SNERD_TEST_UNSAFE_IGNORE_PAUSE": "1"}).node
    assert node.unsafe_ignore_pause and not node.unsafe_ignore_cancel
