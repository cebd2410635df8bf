"""`snerd.core.control`'s rules for the tools: where a type is paused, shard by shard."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from snerd.core.control import PauseMark, paused_where

_TYPES = st.one_of(st.none(), st.sampled_from(["a", "b"]))
_MARK = st.builds(PauseMark, st.booleans(), st.tuples(st.integers(0, 9), st.just("n")))
_SHARDS = st.dictionaries(st.integers(0, 4), st.dictionaries(_TYPES, _MARK))


def test_a_type_paused_on_some_shards_names_them() -> None:
    on, off = PauseMark(True, (2, "n")), PauseMark(False, (3, "n"))
    assert paused_where({0: {"t": on, None: off}, 1: {"t": off}, 2: {"t": on}}) == {"t": [0, 2]}
    assert paused_where({0: {None: on, "t": on}}) == {None: [0], "t": [0]}


@given(_SHARDS)
def test_exactly_the_shards_whose_mark_is_paused_are_named(shards: dict) -> None:  # type: ignore[type-arg]
    where = paused_where(shards)
    for task_type, on in where.items():
        assert on == sorted(s for s, marks in shards.items() if marks.get(task_type, _OFF).paused)
        assert on
    named = {(t, s) for t, on in where.items() for s in on}
    assert named == {(t, s) for s, marks in shards.items() for t, m in marks.items() if m.paused}


_OFF = PauseMark(False, (0, ""))
