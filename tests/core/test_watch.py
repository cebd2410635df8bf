"""snerd.core.watch: the task watch's passes over the queue's files."""

from __future__ import annotations

from snerd.core import events as ev
from snerd.core.records import encode_record
from snerd.core.watch import LIVE, UNKNOWN, TaskWatch, pick


def _answer(
    files: dict[tuple[int, str], bytes],
    request_known: dict[tuple[int, str], tuple[int, int]],
    ids: frozenset[str],
) -> ev.QueueScanned:
    """What a shell answers: each file from its known offset to its last complete line."""
    chunks = []
    for (shard, segment), data in files.items():
        known = request_known.get((shard, segment))
        start = known[1] if known is not None and known[0] == 1 else 0
        end = data.rfind(b"\n") + 1
        if end <= start:
            continue
        records, corrupt, _ = pick(data[start:end], start, ids)
        chunks.append(
            ev.ScanChunk(
                shard=shard,
                segment=segment,
                identity=1,
                start=start,
                end=end,
                records=tuple(records),
                corrupt=tuple(corrupt),
            )
        )
    return ev.QueueScanned(
        chunks=tuple(chunks),
        files=tuple((shard, seg, 1, len(data)) for (shard, seg), data in files.items()),
    )


def _scan(watch: TaskWatch, files: dict[tuple[int, str], bytes]) -> dict[str, str]:
    request = watch.request(1, 1 << 20)
    return watch.scanned(_answer(files, request.known, request.ids))


def test_an_id_no_file_holds_is_unknown_after_a_whole_pass() -> None:
    watch = TaskWatch()
    watch.want(["p"])
    log = encode_record({"taskId": "other", "taskType": "t"})
    assert _scan(watch, {(0, ""): log}) == {"p": UNKNOWN}


def test_a_torn_last_line_nobody_follows_does_not_hold_the_pass_open_for_ever() -> None:
    # Simulator seed 85: a crashed writer's inbox file ended in a torn line; the file's size
    # stayed past the last complete line, the pass never ended, and a child of a parent that
    # was never enqueued waited for ever instead of the bounded wait.
    watch = TaskWatch()
    watch.want(["p"])
    inbox = encode_record({"taskId": "q", "taskType": "t"}) + b'{"taskId":"p","ta'
    files = {(0, ""): b"", (0, "n1@pid-0"): inbox}
    assert _scan(watch, files) == {}  # the inbox's complete lines read, its tail not
    assert _scan(watch, files) == {"p": UNKNOWN}  # nothing more to read: the pass is whole


def test_a_pass_with_more_to_read_is_not_whole() -> None:
    watch = TaskWatch()
    watch.want(["p"])
    first = encode_record({"taskId": "q", "taskType": "t"})
    request = watch.request(1, 1 << 20)
    answer = _answer({(0, ""): first}, request.known, request.ids)
    grown = ev.QueueScanned(chunks=answer.chunks, files=((0, "", 1, len(first) + 10),))
    assert watch.scanned(grown) == {}  # the file grew past what was read: not settled
    later = first + encode_record({"taskId": "p", "taskType": "t"})
    assert _scan(watch, {(0, ""): later}) == {"p": LIVE}
