"""The daemon's settings from its environment (`snerd.config.load_settings`)."""

from __future__ import annotations

import pytest

from snerd.config import ConfigError, load_settings


def test_the_inbox_polls_default_to_100_ms_and_1_s_and_follow_their_variables() -> None:
    node = load_settings({}).node
    assert (node.inbox_poll_us, node.inbox_idle_poll_us) == (100_000, 1_000_000)
    node = load_settings({"SNERD_INBOX_POLL_MS": "50", "SNERD_INBOX_IDLE_POLL_MS": "250"}).node
    assert (node.inbox_poll_us, node.inbox_idle_poll_us) == (50_000, 250_000)


@pytest.mark.parametrize("value", ["0", "-5", "soon", "1.5"])
def test_a_bad_idle_inbox_poll_is_refused_naming_it(value: str) -> None:
    with pytest.raises(ConfigError, match=f"SNERD_INBOX_IDLE_POLL_MS={value!r}"):
        load_settings({"SNERD_INBOX_IDLE_POLL_MS": value})
