"""`snerd.core.control`'s rules for the tools: where a type is paused, shard by shard."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from snerd.core import protocol as proto
from snerd.core.control import (
    Answer,
    PauseMark,
    answer_entry,
    answer_of,
    command_fields,
    command_of,
    paused_where,
    swept,
)

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


def test_a_purge_takes_dead_letters_and_cancelled_tasks_a_retry_dead_letters_only() -> None:
    purge = proto.Sweep(purge=True, task_type="t", before_us=100)
    retry = proto.Sweep(purge=False, task_type=None, before_us=None)
    assert swept(purge, "dead_letter", "t", 99) and swept(purge, "cancelled", "t", 0)
    assert not swept(purge, "completed", "t", 0)
    assert not swept(purge, "dead_letter", "t", 100)  # (before: strictly)
    assert not swept(purge, "dead_letter", "u", 0)
    assert swept(retry, "dead_letter", "u", 10**15) and not swept(retry, "cancelled", "u", 0)


@given(st.booleans(), st.one_of(st.none(), st.text(min_size=1)), st.one_of(st.none(), st.integers(0, 2**53 - 1)))
def test_a_sweep_goes_through_an_inbox_record_unchanged(purge, task_type, before) -> None:  # type: ignore[no-untyped-def]
    cmd = proto.Sweep(purge=purge, task_type=task_type, before_us=before)
    assert command_of(command_fields(cmd, (0, ""))) == (cmd, None)
    answer = Answer("swept", True, 7)
    assert answer_of(answer_entry(3, answer)) == answer
    assert command_of({"action": "purge", "before": "soon"}) == (
        "a purge command whose `before` is not a time in µs"
    )
