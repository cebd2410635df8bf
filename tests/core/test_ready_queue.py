"""snerd.core.ready_queue: urgency order with FIFO ties, and due-time order."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from snerd.core.ready_queue import DueQueue, ReadyQueue

# --- ReadyQueue ------------------------------------------------------------------------------


def test_pop_order_is_urgency_then_fifo() -> None:
    q: ReadyQueue[str] = ReadyQueue()
    q.push("low", 0.0, 1)
    q.push("high-first", 5.0, 2)
    q.push("mid", 1.5, 3)
    q.push("high-second", 5.0, 4)
    q.push("negative", -1.0, 5)
    assert len(q) == 5
    assert [q.pop() for _ in range(5)] == ["high-first", "high-second", "mid", "low", "negative"]
    assert len(q) == 0


def test_fifo_follows_seq_not_push_order() -> None:
    q: ReadyQueue[str] = ReadyQueue()
    q.push("b", 1.0, 20)
    q.push("a", 1.0, 10)
    assert q.pop() == "a"


def test_negative_zero_ties_with_zero() -> None:
    q: ReadyQueue[str] = ReadyQueue()
    q.push("zero", 0.0, 2)
    q.push("minus-zero", -0.0, 1)
    assert q.pop() == "minus-zero"


def test_empty_pop_raises_and_peek_is_none() -> None:
    q: ReadyQueue[int] = ReadyQueue()
    assert q.peek() is None
    with pytest.raises(IndexError):
        q.pop()


def test_peek_does_not_remove() -> None:
    q: ReadyQueue[str] = ReadyQueue()
    q.push("a", 1.0, 1)
    q.push("b", 2.0, 2)
    assert q.peek() == "b"
    assert q.peek() == "b"
    assert len(q) == 2
    assert q.pop() == "b"


def test_discard_is_exact_for_len_contains_and_order() -> None:
    q: ReadyQueue[str] = ReadyQueue()
    q.push("a", 3.0, 1)
    q.push("b", 2.0, 2)
    q.push("c", 1.0, 3)
    assert q.discard("a") is True
    assert q.discard("a") is False
    assert q.discard("never") is False
    assert "a" not in q and "b" in q
    assert len(q) == 2
    assert q.peek() == "b"
    assert [q.pop(), q.pop()] == ["b", "c"]
    with pytest.raises(IndexError):
        q.pop()


def test_rediscard_and_repush_same_key_with_same_seq_pops_once() -> None:
    q: ReadyQueue[str] = ReadyQueue()
    q.push("a", 1.0, 1)
    q.discard("a")
    q.push("a", 1.0, 1)
    assert q.pop() == "a"
    assert len(q) == 0
    with pytest.raises(IndexError):
        q.pop()


def test_repush_after_discard_uses_new_priority() -> None:
    q: ReadyQueue[str] = ReadyQueue()
    q.push("a", 9.0, 1)
    q.push("b", 5.0, 2)
    q.discard("a")
    q.push("a", 1.0, 3)
    assert [q.pop(), q.pop()] == ["b", "a"]


def test_double_push_is_a_caller_bug() -> None:
    q: ReadyQueue[str] = ReadyQueue()
    q.push("a", 1.0, 1)
    with pytest.raises(ValueError, match="already"):
        q.push("a", 2.0, 2)


def test_nan_urgency_is_refused() -> None:
    q: ReadyQueue[str] = ReadyQueue()
    with pytest.raises(ValueError, match="NaN"):
        q.push("a", float("nan"), 1)
    assert len(q) == 0


def test_keys_need_not_be_comparable() -> None:
    q: ReadyQueue[object] = ReadyQueue()
    a, b = object(), object()
    q.push(a, 1.0, 1)
    q.push(b, 1.0, 1)  # same urgency and seq: must not fall through to comparing keys
    assert {q.pop(), q.pop()} == {a, b}


def test_many_discards_keep_memory_bounded() -> None:
    q: ReadyQueue[int] = ReadyQueue()
    for i in range(10_000):
        q.push(i, float(i % 7), i)
        if i >= 10:
            q.discard(i - 10)
    assert len(q) == 10
    # Internal check on purpose: lazy deletion must not keep every dead entry forever.
    held = sum(len(level.fifo) + len(level.side) for level in q._levels.values())
    assert held == q._entries <= 200


_URGENCIES = st.sampled_from([-1.0, 0.0, 0.5, 1.0, 2.0, 1e9])


@given(st.lists(_URGENCIES, max_size=60))
def test_pop_all_matches_sorted_reference(urgencies: list[float]) -> None:
    q: ReadyQueue[int] = ReadyQueue()
    for seq, u in enumerate(urgencies):
        q.push(seq, u, seq)
    popped = [q.pop() for _ in range(len(urgencies))]
    expected = sorted(range(len(urgencies)), key=lambda s: (-urgencies[s], s))
    assert popped == expected
    # The law, stated directly: urgency never increases, and seq increases among equals.
    for x, y in pairwise(popped):
        assert urgencies[x] >= urgencies[y]
        if urgencies[x] == urgencies[y]:
            assert x < y


_OPS = st.lists(
    st.one_of(
        # A push's seq: None for the next in order (the usual enqueue), else any, out of order
        # or repeated (a retry keeps its old seq): ties then go to the earlier push.
        st.tuples(st.just("push"), st.tuples(_URGENCIES, st.none() | st.integers(0, 30))),
        st.tuples(st.just("pop"), st.none()),
        st.tuples(st.just("pop_many"), st.integers(min_value=0, max_value=12)),
        st.tuples(st.just("discard"), st.integers(min_value=0, max_value=80)),
        st.tuples(st.just("peek"), st.none()),
    ),
    max_size=200,
)


@given(_OPS)
def test_interleaved_operations_match_reference_model(ops: list[tuple[str, object]]) -> None:
    q: ReadyQueue[int] = ReadyQueue()
    model: dict[int, tuple[float, int, int]] = {}
    pushes = 0

    def best() -> int | None:
        if not model:
            return None
        return min(model, key=lambda k: model[k])

    for op, arg in ops:
        if op == "push":
            assert isinstance(arg, tuple)
            urgency, given_seq = arg
            # Keys are reused after they leave, to exercise stale entries.
            key = pushes % 80
            pushes += 1
            seq = 1000 + pushes if given_seq is None else given_seq
            if key in model:
                with pytest.raises(ValueError):
                    q.push(key, urgency, seq)
                continue
            q.push(key, urgency, seq)
            model[key] = (-urgency, seq, pushes)
        elif op == "pop":
            expected = best()
            if expected is None:
                with pytest.raises(IndexError):
                    q.pop()
            else:
                assert q.pop() == expected
                del model[expected]
        elif op == "pop_many":
            # What as many pops would give, all of the queue when it holds fewer.
            assert isinstance(arg, int)
            expected_keys = sorted(model, key=lambda k: model[k])[:arg]
            assert q.pop_many(arg) == expected_keys
            for k in expected_keys:
                del model[k]
        elif op == "discard":
            assert isinstance(arg, int)
            assert q.discard(arg) is (arg in model)
            model.pop(arg, None)
        else:
            assert q.peek() == best()
        assert len(q) == len(model)
        for k in range(80):
            assert (k in q) is (k in model)
    held = sum(len(level.fifo) + len(level.side) for level in q._levels.values())
    assert held == q._entries


_RUN_OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("run"),
            st.tuples(
                _URGENCIES,
                st.lists(st.tuples(st.integers(0, 40), st.integers(0, 30)), max_size=12),
            ),
        ),
        st.tuples(st.just("pop"), st.none()),
        st.tuples(st.just("discard"), st.integers(0, 40)),
    ),
    max_size=40,
)


@given(_RUN_OPS)
def test_push_run_is_push_of_each_in_turn(ops: list[tuple[str, object]]) -> None:
    # Two queues, the same operations; runs pushed with `push_run` into one and key by key
    # into the other (a repeated key raises in both, after the keys before it went in).
    run_q: ReadyQueue[int] = ReadyQueue()
    one_q: ReadyQueue[int] = ReadyQueue()
    for op, arg in ops:
        if op == "run":
            assert isinstance(arg, tuple)
            urgency, entries = arg
            keys, seqs = [k for k, _ in entries], [q for _, q in entries]
            failed = False
            try:
                for key, seq in zip(keys, seqs, strict=True):
                    one_q.push(key, urgency, seq)
            except ValueError:
                failed = True
            if failed:
                with pytest.raises(ValueError, match="already"):
                    run_q.push_run(keys, seqs, urgency)
            else:
                run_q.push_run(keys, seqs, urgency)
        elif op == "pop":
            if len(one_q):
                assert run_q.pop() == one_q.pop()
        else:
            assert isinstance(arg, int)
            assert run_q.discard(arg) is one_q.discard(arg)
        assert len(run_q) == len(one_q)
        assert run_q.peek() == one_q.peek()
        assert sorted(run_q._levels) == sorted(one_q._levels)
    assert [run_q.pop() for _ in range(len(run_q))] == [one_q.pop() for _ in range(len(one_q))]


_MANY_OPS = st.lists(
    st.one_of(
        # Mostly in seq order (the usual enqueues: one level's deque), sometimes not (a retry:
        # its heap), in two urgencies.
        st.tuples(
            st.just("push"),
            st.tuples(st.sampled_from([0.0, 1.0]), st.none() | st.integers(0, 30), st.booleans()),
        ),
        st.tuples(st.just("pop_many"), st.integers(0, 12)),
        st.tuples(st.just("discard"), st.integers(0, 40)),
    ),
    max_size=80,
)


@given(_MANY_OPS)
def test_pop_many_is_pop_in_turn(ops: list[tuple[str, object]]) -> None:
    # Two queues, the same operations; `pop_many(n)` on one, `pop` n times (or until empty)
    # on the other.
    many_q: ReadyQueue[int] = ReadyQueue()
    one_q: ReadyQueue[int] = ReadyQueue()
    pushes = 0
    for op, arg in ops:
        if op == "push":
            assert isinstance(arg, tuple)
            urgency, given_seq, in_order = arg
            pushes += 1
            key = pushes % 40
            if key in one_q:
                continue
            seq = 1000 + pushes if in_order or given_seq is None else given_seq
            one_q.push(key, urgency, seq)
            many_q.push(key, urgency, seq)
        elif op == "pop_many":
            assert isinstance(arg, int)
            expected = [one_q.pop() for _ in range(min(arg, len(one_q)))]
            assert many_q.pop_many(arg) == expected
        else:
            assert isinstance(arg, int)
            assert many_q.discard(arg) is one_q.discard(arg)
        assert len(many_q) == len(one_q)
        held = sum(len(level.fifo) + len(level.side) for level in many_q._levels.values())
        assert held == many_q._entries
    assert many_q.pop_many(len(one_q) + 1) == [one_q.pop() for _ in range(len(one_q))]


def test_pop_many_takes_a_run_past_dead_entries() -> None:
    q: ReadyQueue[str] = ReadyQueue()
    q.push_run(["a", "b", "c", "d", "e"], [1, 2, 3, 4, 5], 0.0)
    q.push("u", 1.0, 9)
    q.discard("c")
    assert q.pop_many(4) == ["u", "a", "b", "d"]
    assert q.pop_many(5) == ["e"]
    assert q.pop_many(1) == [] and len(q) == 0 and q._entries == 0


def test_push_run_refuses_nan_and_leaves_no_empty_level() -> None:
    q: ReadyQueue[str] = ReadyQueue()
    with pytest.raises(ValueError, match="NaN"):
        q.push_run(["a"], [1], float("nan"))
    q.push("a", 2.0, 1)
    with pytest.raises(ValueError, match="already"):
        q.push_run(["a"], [2], 5.0)
    assert len(q) == 1 and not q._levels.get(-5.0)
    q.push_run([], [], 7.0)
    assert sorted(q._levels) == [-2.0]
    assert q.pop() == "a"


# --- DueQueue --------------------------------------------------------------------------------


def test_pop_due_returns_everything_due_in_due_order() -> None:
    d: DueQueue[str] = DueQueue()
    d.push("later", 300, 1)
    d.push("soon", 100, 2)
    d.push("soon-tie-second", 100, 4)
    d.push("soon-tie-first", 100, 3)
    d.push("future", 10_000, 5)
    assert d.next_due() == 100
    assert d.pop_due(99) == []
    assert d.pop_due(300) == ["soon", "soon-tie-first", "soon-tie-second", "later"]
    assert len(d) == 1 and "future" in d
    assert d.next_due() == 10_000


def test_due_exactly_now_is_due() -> None:
    d: DueQueue[str] = DueQueue()
    d.push("a", 50, 1)
    assert d.pop_due(50) == ["a"]
    assert d.next_due() is None


def test_due_discard_and_next_due_skip_dead_entries() -> None:
    d: DueQueue[str] = DueQueue()
    d.push("a", 10, 1)
    d.push("b", 20, 2)
    assert d.discard("a") is True
    assert d.discard("a") is False
    assert "a" not in d
    assert len(d) == 1
    assert d.next_due() == 20
    assert d.pop_due(100) == ["b"]
    assert d.pop_due(100) == []


def test_due_reschedule_by_discard_then_push() -> None:
    d: DueQueue[str] = DueQueue()
    d.push("a", 10, 1)
    with pytest.raises(ValueError, match="already"):
        d.push("a", 5, 2)
    d.discard("a")
    d.push("a", 500, 2)
    assert d.pop_due(100) == []
    assert d.pop_due(500) == ["a"]


def test_due_many_discards_keep_memory_bounded() -> None:
    d: DueQueue[int] = DueQueue()
    for i in range(10_000):
        d.push(i, i, i)
        if i >= 5:
            d.discard(i - 5)
    assert len(d) == 5
    assert len(d._heap) <= 200


_DUE_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(min_value=0, max_value=50)),
        st.tuples(st.just("pop_due"), st.integers(min_value=0, max_value=50)),
        st.tuples(st.just("discard"), st.integers(min_value=0, max_value=30)),
    ),
    max_size=150,
)


@given(_DUE_OPS)
def test_due_queue_matches_reference_model(ops: list[tuple[str, int]]) -> None:
    d: DueQueue[int] = DueQueue()
    model: dict[int, tuple[int, int]] = {}
    seq = 0
    for op, arg in ops:
        if op == "push":
            key = seq % 30
            seq += 1
            if key in model:
                continue
            d.push(key, arg, seq)
            model[key] = (arg, seq)
        elif op == "pop_due":
            expected = sorted((k for k in model if model[k][0] <= arg), key=lambda k: model[k])
            assert d.pop_due(arg) == expected
            for k in expected:
                del model[k]
        else:
            assert d.discard(arg) is (arg in model)
            model.pop(arg, None)
        assert len(d) == len(model)
        assert d.next_due() == (min(v[0] for v in model.values()) if model else None)
