"""The task watch (`snerd.core.watch`): `pick` keeps exactly the records a scan of the whole
file would give for the watched ids (and the claims), and `TaskWatch` folds a queue's files
into one state per id: fenced like a replay, read again when a log is replaced, unknown only
after a whole pass begun after the id was named."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from snerd.core import events as ev
from snerd.core.records import encode_record, scan
from snerd.core.watch import COMPLETED, DEAD, LIVE, UNKNOWN, TaskWatch, pick

TS = "2027-01-15T08:00:00Z"


def task(task_id: str, **extra: Any) -> dict[str, Any]:
    return {"taskId": task_id, "taskType": "t", "taskData": "{}", "retryCount": 0, **extra}


def done(task_id: str, **extra: Any) -> dict[str, Any]:
    return task(task_id, deletedAt=TS, snerdOutcome="completed", **extra)


def dead(task_id: str, **extra: Any) -> dict[str, Any]:
    return task(task_id, deletedAt=TS, snerdOutcome="dead_letter", LastErrorObj="x", **extra)


def claim(epoch: int) -> dict[str, Any]:
    return {"snerdKind": "claim", "epoch": epoch, "node": "n", "at": TS}


def lines(*records: dict[str, Any]) -> bytes:
    return b"".join(encode_record(r) for r in records)


# -- pick


def test_pick_keeps_the_watched_ids_and_the_claims_and_their_offsets() -> None:
    data = lines(claim(1), task("a"), task("b"), {"snerdKind": "dispatch", "task": "a",
                 "attempt": 1, "at": TS}, done("a"), task("c"))
    records, corrupt, used = pick(data, 100, frozenset({"a"}))
    assert corrupt == [] and used == len(data)
    whole = scan(data, base_offset=100).records
    expected = [r for r in whole if r.fields.get("snerdKind") == "claim"
                or (r.fields.get("snerdKind") is None and r.fields["taskId"] == "a")]
    assert [(r.offset, r.length, r.fields) for r in records] == [
        (r.offset, r.length, r.fields) for r in expected
    ]
    assert [r.fields.get("deletedAt") for r in records[1:]] == [None, TS]


def test_pick_judges_a_damaged_line_and_leaves_a_torn_tail() -> None:
    good = lines(task("a"))
    damaged = good.replace(b'"t"', b'"u"')  # the checksum no longer matches
    data = damaged + b"garbage\n" + good + b'{"taskId":"a","tor'
    records, corrupt, used = pick(data, 0, frozenset({"a"}))
    assert [r.offset for r in records] == [len(damaged) + 8]
    assert [offset for offset, _ in corrupt] == [0, len(damaged)]
    assert used == len(damaged) + 8 + len(good)


def test_pick_finds_an_id_with_an_escape_and_a_record_with_its_keys_in_another_order() -> None:
    odd = 'quo"te'
    handmade = b'{"taskType":"t","taskId":"z","taskData":"{}"}\n'
    data = lines(task(odd)) + handmade
    records, _, _ = pick(data, 0, frozenset({odd, "z"}))
    assert [r.fields["taskId"] for r in records] == [odd, "z"]


_ids = st.sampled_from(["a", "b", "c", "d\\e", "f\"g", "ü"])
_records = st.one_of(
    _ids.map(task),
    _ids.map(done),
    _ids.map(dead),
    st.integers(1, 5).map(claim),
    _ids.map(lambda i: {"snerdKind": "dispatch", "task": i, "attempt": 1, "at": TS}),
)


@given(st.lists(_records, max_size=12), st.frozensets(_ids), st.integers(0, 3))
def test_pick_gives_what_scanning_everything_gives_for_its_ids(
    records: list[dict[str, Any]], ids: frozenset[str], flip: int
) -> None:
    data = bytearray(lines(*records))
    if flip and data:
        data[(flip * 7919) % len(data)] ^= 0x20  # one damaged byte somewhere
    got, corrupt, _ = pick(bytes(data), 0, ids)
    whole = scan(bytes(data))
    want = [
        r
        for r in whole.records
        if r.fields.get("snerdKind") == "claim"
        or (r.fields.get("snerdKind") is None and r.fields.get("taskId") in ids)
    ]
    assert [(r.offset, r.fields) for r in got] == [(r.offset, r.fields) for r in want]
    # A corrupt line pick reports is one the full scan reports too.
    assert {o for o, _ in corrupt} <= {o for o, _ in whole.corrupt}


# -- TaskWatch


class Files:
    """A queue's files in memory, read the way the shells read them."""

    def __init__(self) -> None:
        self.files: dict[tuple[int, str], tuple[int, bytearray]] = {}

    def put(self, shard: int, segment: str, *records: dict[str, Any]) -> None:
        _identity, data = self.files.setdefault((shard, segment), (1, bytearray()))
        data += lines(*records)

    def replace(self, shard: int, segment: str, *records: dict[str, Any]) -> None:
        identity, _ = self.files[(shard, segment)]
        self.files[(shard, segment)] = (identity + 1, bytearray(lines(*records)))

    def answer(self, watch: TaskWatch, max_bytes: int = 1 << 20) -> dict[str, str]:
        effect = watch.request(4, max_bytes)
        chunks = []
        for (shard, segment), (identity, data) in sorted(self.files.items()):
            known = effect.known.get((shard, segment))
            start = known[1] if known is not None and known[0] == identity else 0
            end = bytes(data).rfind(b"\n", start, start + max_bytes) + 1
            if end <= start:
                continue
            records, _corrupt, _ = pick(bytes(data[start:end]), start, effect.ids)
            chunks.append(ev.ScanChunk(shard=shard, segment=segment, identity=identity,
                                       start=start, end=end, records=tuple(records)))
        ends = {(c.shard, c.segment): c.end for c in chunks}
        listed = tuple(
            (s, g, i, 0 if ends.get((s, g), 0) >= bytes(d).rfind(b"\n") + 1 else 1)
            for (s, g), (i, d) in sorted(self.files.items())
        )
        return watch.scanned(ev.QueueScanned(chunks=tuple(chunks), files=listed))


def test_the_watch_follows_an_id_from_an_inbox_to_its_completion() -> None:
    files, watch = Files(), TaskWatch()
    files.put(0, "", claim(1), task("x"))
    watch.want({"p"})
    assert files.answer(watch) == {"p": UNKNOWN}
    files.put(2, "other@pid-2-b", task("p"))
    watch.want({"p"})
    assert files.answer(watch) == {"p": LIVE}
    files.put(2, "", claim(1), task("p", snerdEpoch=1))
    assert files.answer(watch) == {}  # still live: nothing changed
    files.put(2, "", done("p", snerdEpoch=1))
    assert files.answer(watch) == {"p": COMPLETED}  # the inbox's copy stays live: ended wins


def test_a_dead_letter_is_dead_and_a_later_success_of_the_id_wins() -> None:
    files, watch = Files(), TaskWatch()
    files.put(1, "", dead("p"))
    watch.want({"p"})
    assert files.answer(watch) == {"p": DEAD}
    files.put(3, "", done("p"))
    assert files.answer(watch) == {"p": COMPLETED}


def test_a_record_older_than_the_fence_is_ignored_unless_fencing_is_off() -> None:
    for fence, want in ((True, LIVE), (False, COMPLETED)):
        files, watch = Files(), TaskWatch(fence=fence)
        files.put(0, "", claim(1), task("p", snerdEpoch=1), claim(2), done("p", snerdEpoch=1))
        watch.want({"p"})
        assert files.answer(watch) == {"p": want}


def test_a_replaced_log_is_read_again_from_its_start() -> None:
    files, watch = Files(), TaskWatch()
    files.put(0, "", task("p"), task("q"))
    watch.want({"p"})
    assert files.answer(watch) == {"p": LIVE}
    files.replace(0, "", done("p"))  # compaction: a new file, shorter than the old offset
    assert files.answer(watch) == {"p": COMPLETED}


def test_an_id_is_unknown_only_after_a_whole_pass_begun_after_it_was_named() -> None:
    files, watch = Files(), TaskWatch()
    files.put(0, "", *[task(f"t{i}") for i in range(50)])
    watch.want({"a"})
    changes = files.answer(watch, max_bytes=200)  # a pass of several reads
    assert changes == {} and not watch.caught_up()
    watch.want({"a", "b"})  # named mid-pass: the next read starts a new pass
    while not watch.caught_up():
        changes.update(files.answer(watch, max_bytes=200))
    assert changes == {"a": UNKNOWN, "b": UNKNOWN}
    # An id no longer watched is forgotten; watched again, it waits for a new pass.
    watch.want({"a"})
    files.put(0, "", task("b"))
    watch.want({"a", "b"})
    assert watch.state("b") is None
    assert files.answer(watch) == {"b": LIVE}


def test_a_removed_inbox_drops_what_it_said() -> None:
    files, watch = Files(), TaskWatch()
    files.put(1, "w@pid-3-c", task("p"))
    watch.want({"p"})
    assert files.answer(watch) == {"p": LIVE}
    del files.files[(1, "w@pid-3-c")]
    files.put(1, "", done("p"))
    assert files.answer(watch) == {"p": COMPLETED}


def test_an_inbox_copy_counts_only_until_the_owner_took_the_file_in() -> None:
    # A parent dropped at ingest (a duplicate) is in no shard log: its inbox copy, which its
    # writer alone removes, must not keep it "live" for ever once the owner's log says the
    # file was taken in past it.
    files, watch = Files(), TaskWatch()
    files.put(1, "w@pid-3-c", task("p"), task("q"))
    watch.want({"p", "q"})
    assert files.answer(watch) == {"p": LIVE, "q": LIVE}
    inbox_len = len(files.files[(1, "w@pid-3-c")][1])
    mark = {"snerdKind": "inbox", "node": "w@pid-3-c", "offset": inbox_len, "from": 0}
    files.put(1, "", claim(1), task("q", snerdEpoch=1), mark)  # p dropped, q taken in
    assert files.answer(watch) == {"p": UNKNOWN}
    assert watch.state("q") == LIVE
