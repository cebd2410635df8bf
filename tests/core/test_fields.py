"""The value rules shared by the enqueue and the log reader (`snerd.core.fields`)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from snerd.core import fields
from snerd.core.fields import BadField, check_time
from snerd.core.timefmt import MAX_US, format_rfc3339, parse_rfc3339

_digits = st.text(alphabet="0123456789", min_size=1, max_size=1)


@st.composite
def written_shape(draw: st.DrawFn) -> str:
    """A text in the shape snerd writes times in, its digits anything (impossible dates too)."""
    shape = "dddd-dd-ddTdd:dd:dd.ddddddZ"
    return "".join(draw(_digits) if c == "d" else c for c in shape)


def _parses(text: str) -> bool:
    try:
        parse_rfc3339(text)
    except ValueError:
        return False
    return True


@given(written_shape() | st.integers(0, MAX_US).map(format_rfc3339) | st.text(max_size=40))
def test_check_time_accepts_exactly_what_the_parse_accepts(text: str) -> None:
    # The fast path (`fromisoformat` on the written form) must agree with `parse_rfc3339`.
    fields._last_time = format_rfc3339(0)  # (only an accepted time is ever remembered)
    try:
        check_time("at", text)
    except BadField as bad:
        assert not _parses(text)
        assert bad.detail.startswith("invalid at '")
    else:
        assert _parses(text)


@pytest.mark.parametrize(
    "text", ["2016-12-31T23:59:60.000000Z", "0001-01-01T00:00:00.000000Z", "2024-02-29T12:00:00Z"]
)
def test_check_time_takes_a_leap_second_and_the_edges(text: str) -> None:
    check_time("at", text)


def test_the_webhook_check_never_remembers_a_huge_url() -> None:
    url = "http://example.com/" + "x" * 100_000
    before = fields._webhook_target.cache_info().currsize
    with pytest.raises(BadField, match="webhookUrl is 100019 bytes"):
        fields.check_webhook_url("webhookUrl", url)
    assert fields._webhook_target.cache_info().currsize == before
