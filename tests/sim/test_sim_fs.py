"""The simulator's filesystem model: pending and durable appends, crashes and torn writes,
compaction under another writer, conditional membership writes, and the flock table with its
faults."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.fs import EIO_LOCK_LOST, ENOSPC, AppendHandle, DoubleGrant, InboxKey, SimFS

A = "node-1#1"
B = "node-2#1"


def rng() -> random.Random:
    return random.Random(1234)


# -- shard logs ------------------------------------------------------------------------------


def test_append_is_visible_at_once_and_pending_until_completed() -> None:
    fs = SimFS()
    h = fs.append(A, 0, b"one\n")
    assert (h.offset, h.length, h.error, h.orphaned) == (0, 4, None, False)
    # The fast constructor on the append path builds the same frozen record as the class.
    assert h == AppendHandle(seq=h.seq, pid=A, shard=0, offset=0, length=4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        h.offset = 1  # type: ignore[misc]
    assert fs.read_log(0) == b"one\n"
    assert fs.log_size(0) == 4
    assert fs.status(h) == "pending"
    assert fs.read_durable_log(0) == b""
    assert fs.pending(A) == (h,)
    assert fs.complete_append(h) == (h,)
    assert fs.status(h) == "durable"
    assert fs.read_durable_log(0) == b"one\n"
    assert fs.pending(A) == ()
    assert fs.complete_append(h) == ()  # a second completion is a no-op
    h2 = fs.append(A, 0, b"two\n")
    assert h2.offset == 4
    assert fs.read_range(0, 4, 4) == b"two\n"  # pending bytes are readable too
    assert fs.read_range(0, 0, 4) == b"one\n"
    assert fs.read_range(0, 6, 100) == b"o\n"  # short at the end of file
    assert fs.read_log(5) == b"" and fs.log_size(5) == 0
    assert fs.shards() == (0,)


def test_completing_an_append_completes_the_writers_earlier_ones_in_issue_order() -> None:
    fs = SimFS()
    h1, h2, h3 = (fs.append(A, 0, b"%d\n" % i) for i in range(3))
    other = fs.append(B, 0, b"b\n")
    assert fs.complete_append(h2) == (h1, h2)  # fsync covers everything written before
    assert [fs.status(h) for h in (h1, h2, h3)] == ["durable", "durable", "pending"]
    assert fs.status(other) == "pending"  # another process's fd is not flushed by it
    assert fs.complete_append(h1) == ()
    assert fs.complete_append(h3) == (h3,)
    assert fs.stats().appends_completed == 3


def test_crash_drops_pending_appends_and_keeps_durable_ones() -> None:
    fs = SimFS()
    d = fs.append(A, 0, b"durable\n")
    fs.complete_append(d)
    p1 = fs.append(A, 0, b"pending-1\n")
    p2 = fs.append(A, 1, b"pending-2\n")
    fs.crash(A, rng(), torn_prob=0.0)
    assert fs.read_log(0) == b"durable\n"  # the lost tail shortens the file
    assert fs.log_size(0) == 8
    assert fs.read_log(1) == b""
    assert [fs.status(h) for h in (d, p1, p2)] == ["durable", "lost", "lost"]
    assert fs.complete_append(p1) == ()  # a completion scheduled before the crash finds nothing
    assert fs.pending(A) == ()
    s = fs.stats()
    assert (s.crashes, s.appends_dropped, s.appends_torn, s.holes) == (1, 2, 0, 0)


def test_torn_prefix_only_on_the_last_pending_append_of_a_file() -> None:
    fs = SimFS()
    fs.complete_append(fs.append(A, 0, b"kept\n"))
    first = fs.append(A, 0, b"first-lost\n")
    fs.append(A, 0, b"second-lost\n")
    last = b'{"id":"t3","data":"xyz"}\n{"id":"t4"}\n'
    h_last = fs.append(A, 0, last)
    fs.crash(A, rng(), torn_prob=1.0)
    log = fs.read_log(0)
    assert log.startswith(b"kept\n")
    # Only a strict prefix of the last append survives, at the offset its write had, ending
    # inside a line; the earlier pending appends are gone whole (zeros: blocks never written).
    lost = len(b"first-lost\n") + len(b"second-lost\n")
    assert log[5 : 5 + lost] == bytes(lost)
    torn = log[5 + lost :]
    assert torn and last.startswith(torn) and len(torn) < len(last)
    assert fs.kept_prefix(h_last) == len(torn) and fs.kept_prefix(first) == 0
    assert not torn.endswith(b"\n")
    assert b"lost" not in log
    # To a reader it is all one torn last line: nothing after the last newline is a record.
    assert log[: log.rfind(b"\n") + 1] == b"kept\n"
    s = fs.stats()
    assert (s.appends_torn, s.appends_dropped) == (1, 2)
    # The torn bytes are what is on disk now: durable, and no longer anybody's pending write.
    assert fs.read_durable_log(0) == log


def test_torn_prefix_draws_vary_with_the_rng_and_repeat_with_the_seed() -> None:
    def torn(seed: int) -> bytes:
        fs = SimFS()
        fs.append(A, 0, b"a" * 50 + b"\n" + b"b" * 50 + b"\n")
        fs.crash(A, random.Random(seed), torn_prob=1.0)
        return fs.read_log(0)

    assert torn(7) == torn(7)
    assert len({torn(seed) for seed in range(20)}) > 1


def test_an_append_with_no_mid_line_cut_is_dropped_not_torn() -> None:
    fs = SimFS()
    fs.append(A, 0, b"\n")
    fs.crash(A, rng(), torn_prob=1.0)
    assert fs.read_log(0) == b""
    assert fs.stats().appends_dropped == 1


def test_another_writers_later_append_survives_a_crash_of_the_first_at_its_offset() -> None:
    fs = SimFS()
    fs.complete_append(fs.append(A, 0, b"base\n"))
    lost = fs.append(A, 0, b"lost-by-a\n")
    b = fs.append(B, 0, b"kept-by-b\n")
    fs.complete_append(b)
    fs.crash(A, rng(), torn_prob=0.0)
    log = fs.read_log(0)
    # B's bytes are unchanged and where B's O_APPEND put them; A's are a hole of zeros.
    assert log[b.offset : b.offset + b.length] == b"kept-by-b\n"
    assert log == b"base\n" + bytes(lost.length) + b"kept-by-b\n"
    assert fs.status(b) == "durable"
    assert fs.stats().holes == 1
    # A torn append followed by B's bytes: the prefix, then zeros up to B's offset.
    fs2 = SimFS()
    fs2.append(A, 0, b"xxxxxxxxxx\n")
    b2 = fs2.append(B, 0, b"bee\n")
    fs2.crash(A, rng(), torn_prob=1.0)
    log2 = fs2.read_log(0)
    assert log2[b2.offset :] == b"bee\n"
    cut = log2[: b2.offset].rstrip(b"\0")
    assert cut and b"xxxxxxxxxx\n".startswith(cut) and not cut.endswith(b"\n")
    # B's pending bytes are not durable yet; if B crashes too, the file shrinks to the prefix.
    fs2.crash(B, rng(), torn_prob=0.0)
    assert fs2.read_log(0) == cut


def test_a_hole_at_the_end_goes_when_the_data_after_it_is_lost_too() -> None:
    fs = SimFS()
    fs.append(A, 0, b"aaa\n")
    fs.append(B, 0, b"bbb\n")
    fs.crash(A, rng(), torn_prob=0.0)
    assert fs.read_log(0) == bytes(4) + b"bbb\n"
    assert fs.read_durable_log(0) == b""  # B's bytes are still pending: nothing durable
    fs.crash(B, rng(), torn_prob=0.0)
    assert fs.read_log(0) == b"" and fs.log_size(0) == 0
    # New appends land at the real end of file.
    assert fs.append(A, 0, b"c\n").offset == 0


def test_enospc_refuses_the_append_and_writes_nothing() -> None:
    fs = SimFS()
    fs.complete_append(fs.append(A, 0, b"x\n"))
    h = fs.append(A, 0, b"y\n", enospc=True)
    assert h.error == ENOSPC and h.length == 0
    assert fs.read_log(0) == b"x\n"
    assert fs.status(h) == "refused"
    assert fs.complete_append(h) == ()
    fs.disk_full = True
    assert fs.append(A, 0, b"z\n").error == ENOSPC
    assert fs.replace_log(A, 0, b"") == ENOSPC
    assert fs.read_log(0) == b"x\n"
    fs.disk_full = False
    assert fs.append(A, 0, b"z\n").offset == 2
    s = fs.stats()
    assert (s.appends, s.appends_refused, s.replaces_refused) == (4, 2, 1)


def test_replace_log_is_atomic_and_durable_and_the_replacer_reopens() -> None:
    fs = SimFS()
    for i in range(3):
        fs.complete_append(fs.append(A, 0, b"r%d\n" % i))
    assert fs.replace_log(A, 0, b"r2\n") is None
    assert fs.read_log(0) == fs.read_durable_log(0) == b"r2\n"
    h = fs.append(A, 0, b"r3\n")
    assert (h.offset, h.orphaned) == (3, False)
    fs.complete_append(h)
    assert fs.read_log(0) == b"r2\nr3\n"


def test_a_compaction_leaves_another_writers_fd_on_the_old_file() -> None:
    fs = SimFS()
    fs.complete_append(fs.append(B, 0, b"b0\n"))
    in_flight = fs.append(B, 0, b"b1\n")
    fs.replace_log(A, 0, b"compacted\n")
    # B's pending write went to the old inode: its fsync succeeds, the log never shows it.
    assert fs.complete_append(in_flight) == (in_flight,)
    assert fs.status(in_flight) == "replaced"
    later = fs.append(B, 0, b"b2\n")
    assert later.orphaned and later.offset == 6  # still the old file's end
    fs.complete_append(later)
    assert fs.status(later) == "replaced"
    assert fs.read_log(0) == b"compacted\n"
    s = fs.stats()
    assert (s.replaced_pending, s.appends_orphaned) == (1, 1)
    # Once B closes its fd (or restarts) it appends to the current file.
    fs.close_log(B, 0)
    h = fs.append(B, 0, b"b3\n")
    assert not h.orphaned and h.offset == len(b"compacted\n")
    fs.crash(B, rng(), torn_prob=0.0)
    assert fs.append(B, 0, b"b4\n").orphaned is False


# -- inbox files -----------------------------------------------------------------------------

#: The inbox files of shard 0 written by A's and B's nodes.
IA = InboxKey(0, "n1@pid-0")
IB = InboxKey(0, "n2@pid-0")


def test_an_inbox_file_is_a_log_of_its_own_pending_until_fsynced() -> None:
    fs = SimFS()
    fs.complete_append(fs.append(A, 0, b"log\n"))
    h = fs.append(A, IA, b"task-1\n")
    assert (h.shard, h.inbox, h.key, h.offset, h.length) == (0, IA.node, IA, 0, 7)
    assert h == AppendHandle(seq=h.seq, pid=A, shard=0, offset=0, length=7, inbox=IA.node)
    # Visible to a reader (the shard's owner) at once, durable only once completed.
    assert fs.read_log(IA) == b"task-1\n" and fs.log_size(IA) == 7
    assert fs.read_range(IA, 0, 4) == b"task"
    assert fs.status(h) == "pending" and fs.read_durable_log(IA) == b""
    assert fs.complete_append(h) == (h,)
    assert fs.status(h) == "durable" and fs.read_durable_log(IA) == b"task-1\n"
    # It is not the shard's tasks.log, and not a shard log at all.
    assert fs.read_log(0) == b"log\n"
    assert fs.shards() == (0,)
    assert fs.append(A, IA, b"task-2\n").offset == 7
    # Counted apart: the shard-log counters mean what they did before inbox files.
    s = fs.stats()
    assert (s.appends, s.appends_completed) == (1, 1)
    assert (s.inbox_appends, s.inbox_appends_completed) == (2, 1)


def test_the_inboxes_of_a_shard_are_listed_by_writer_node_once_they_exist() -> None:
    fs = SimFS()
    assert fs.inboxes(0) == ()
    fs.append(B, IB, b"b\n")
    fs.append(B, InboxKey(1, "n2@pid-0"), b"b\n")
    assert fs.append(A, IA, b"a\n", enospc=True).error == ENOSPC
    assert fs.inboxes(0) == (IB,)  # a refused write creates nothing here
    fs.append(A, IA, b"a\n")
    assert fs.inboxes(0) == (IA, IB)
    assert fs.inboxes(1) == (InboxKey(1, "n2@pid-0"),)
    assert fs.inboxes(2) == ()


def test_an_owner_polling_sees_the_writers_and_the_inbox_files_that_grew() -> None:
    fs = SimFS()
    assert fs.inbox_writers(0) == () and fs.inboxes_grown(0, {}) == []
    fs.append(B, IB, b"bb\n")
    fs.append(A, IA, b"a\n")
    assert fs.inbox_writers(0) == (IA.node, IB.node)
    assert fs.inboxes_grown(0, {}) == [(IA, 0, 2), (IB, 0, 3)]
    assert fs.inboxes_grown(0, {IA.node: 2}) == [(IB, 0, 3)]
    assert fs.inboxes_grown(0, {IA.node: 2, IB.node: 3}) == []
    fs.append(A, IA, b"more\n")  # pending bytes are seen too
    assert fs.inboxes_grown(0, {IA.node: 2, IB.node: 3}) == [(IA, 2, 7)]
    fs.remove_inbox(IB)
    assert fs.inbox_writers(0) == (IA.node,) and fs.inboxes(0) == (IA,)
    assert fs.inboxes_grown(0, {}) == [(IA, 0, 7)]


def test_an_inbox_file_has_one_writer() -> None:
    fs = SimFS()
    fs.append(A, IA, b"a\n")
    with pytest.raises(AssertionError, match="written by"):
        fs.append(B, IA, b"b\n")


def test_a_crash_loses_the_writers_pending_inbox_appends_and_may_tear_the_last() -> None:
    fs = SimFS()
    kept = fs.append(A, IA, b"kept\n")
    fs.complete_append(kept)
    lost = fs.append(A, IA, b"lost\n")
    torn = fs.append(A, IA, b'{"taskId":"t9"}\n')
    fs.crash(A, rng(), torn_prob=1.0)
    data = fs.read_log(IA)
    # Bytes never move, so the lost append is a hole of zeros before the torn prefix; but the
    # torn prefix ends the file inside a line, and nothing will ever follow it (one writer):
    # a reader taking complete lines only stops at the durable data.
    assert data == b"kept\n" + bytes(5) + data[10:]
    assert b'{"taskId":"t9"}\n'.startswith(data[10:]) and len(data) > 10
    assert data[: data.rfind(b"\n") + 1] == b"kept\n"
    assert [fs.status(h) for h in (kept, lost, torn)] == ["durable", "lost", "lost"]
    s = fs.stats()
    assert (s.inbox_appends_dropped, s.inbox_appends_torn) == (1, 1)
    assert (s.appends_dropped, s.appends_torn) == (0, 0)
    # Without a tear the file just shrinks back to its durable bytes: no hole, no tail.
    fs2 = SimFS()
    fs2.complete_append(fs2.append(A, IA, b"kept\n"))
    fs2.append(A, IA, b"lost-1\n")
    fs2.append(A, IA, b"lost-2\n")
    fs2.crash(A, rng(), torn_prob=0.0)
    assert fs2.read_log(IA) == fs2.read_durable_log(IA) == b"kept\n"
    assert fs2.stats().holes == 0


def test_enospc_refuses_an_inbox_write_or_leaves_a_short_write_that_is_never_cut() -> None:
    fs = SimFS()
    fs.complete_append(fs.append(A, IA, b"one\n"))
    whole = fs.append(A, IA, b"two\n", enospc=True)
    assert (whole.error, whole.length) == (ENOSPC, 0)
    assert fs.read_log(IA) == b"one\n"
    # A short write: the bytes that reached the file stay there, pending; the append failed.
    short = fs.append(A, IA, b"three\nfour\n", enospc=True, short=8)
    assert (short.error, short.offset, short.length) == (ENOSPC, 4, 8)
    assert fs.status(short) == "refused"
    assert fs.complete_append(short) == ()  # nothing to fsync for a failed append
    assert fs.read_log(IA) == b"one\nthree\nfo"
    assert fs.read_durable_log(IA) == b"one\n"
    # The next write's fsync flushes the fd, so the short write's bytes become durable too.
    nxt = fs.append(A, IA, b"\nfive\n")
    assert nxt.offset == 12
    assert fs.complete_append(nxt) == (short, nxt)
    assert fs.read_durable_log(IA) == b"one\nthree\nfo\nfive\n"
    s = fs.stats()
    assert (s.inbox_appends, s.inbox_appends_refused) == (4, 2)
    # A shard log's failed write is always cut back off (the shell truncates it).
    with pytest.raises(AssertionError):
        fs.append(A, 0, b"x\ny\n", enospc=True, short=2)
    # A crash before any later fsync loses a short write like any pending bytes.
    fs2 = SimFS()
    fs2.complete_append(fs2.append(A, IA, b"one\n"))
    fs2.append(A, IA, b"two\nthree\n", enospc=True, short=6)
    fs2.crash(A, rng(), torn_prob=0.0)
    assert fs2.read_log(IA) == b"one\n"


def test_read_hints_and_removing_an_inbox_file() -> None:
    fs = SimFS()
    h = fs.append(A, IA, b"a\n")
    fs.complete_append(h)
    assert fs.read_hint(IA) is None
    assert fs.write_hint(IA, 2) is None and fs.read_hint(IA) == 2
    fs.disk_full = True
    assert fs.write_hint(IA, 5) == ENOSPC and fs.read_hint(IA) == 2
    fs.disk_full = False
    d0 = fs.digest()
    fs.remove_inbox(IA)
    assert fs.digest() != d0
    # Gone from the folder with its hint; the file reads as missing.
    assert fs.inboxes(0) == () and fs.read_hint(IA) is None
    assert fs.read_log(IA) == b"" and fs.log_size(IA) == 0
    fs.remove_inbox(IA)  # a missing file is no error
    assert fs.stats().inbox_removes == 2


def test_the_digest_sees_inbox_files_apart_from_shard_logs() -> None:
    def with_(key: int | InboxKey, data: bytes) -> str:
        fs = SimFS()
        fs.complete_append(fs.append(A, key, data))
        return fs.digest()

    assert with_(IA, b"x\n") == with_(IA, b"x\n")
    assert len({with_(0, b"x\n"), with_(IA, b"x\n"), with_(IB, b"x\n"), with_(IA, b"y\n")}) == 4


inbox_ops = st.lists(
    st.tuples(
        st.sampled_from(["append", "append", "complete", "crash", "enospc"]),
        st.sampled_from([A, B]),
        st.binary(min_size=1, max_size=12),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(ops=inbox_ops, seed=st.integers(min_value=0, max_value=2**32))
def test_an_inbox_file_keeps_its_durable_appends_whole_and_never_has_a_hole(
    ops: list[tuple[str, str, bytes]], seed: int
) -> None:
    r = random.Random(seed)
    fs = SimFS()
    incarnation = {A: 0, B: 0}

    def key(pid: str) -> InboxKey:
        # A process start is a new node id, so a new inbox file: one writer per file.
        return InboxKey(0, f"{pid}@{incarnation[pid]}")

    written: dict[int, tuple[AppendHandle, bytes]] = {}
    for op, pid, data in ops:
        if op == "append":
            h = fs.append(pid, key(pid), data)
            written[h.seq] = (h, data)
        elif op == "enospc":
            fs.append(pid, key(pid), data, enospc=True, short=int(r.random() * len(data)))
        elif op == "complete" and written:
            seqs = sorted(written)
            fs.complete_append(written[seqs[int(r.random() * len(seqs))]][0])
        elif op == "crash":
            fs.crash(pid, r, torn_prob=0.5)
            incarnation[pid] += 1
        for k in fs.inboxes(0):
            visible, durable = fs.read_log(k), fs.read_durable_log(k)
            # Pending bytes are only ever the tail: the durable view is a prefix.
            assert visible.startswith(durable)
        for h, data in written.values():
            status = fs.status(h)
            if status in ("durable", "pending"):
                assert fs.read_range(h.key, h.offset, h.length) == data
            if status == "durable":
                assert fs.read_durable_log(h.key)[h.offset : h.offset + h.length] == data


# -- membership.json -------------------------------------------------------------------------


def test_membership_write_is_conditional_on_the_version() -> None:
    fs = SimFS()
    assert fs.read_membership() is None
    first = fs.write_membership(A, {"version": 1, "claims": {}}, None)
    assert (first.ok, first.applied, first.error) == (True, True, None)
    assert first.doc == {"version": 1, "claims": {}}
    again = fs.write_membership(B, {"version": 1, "claims": {"x": 1}}, None)
    assert (again.ok, again.applied) == (False, False)
    assert again.error is not None and "version mismatch" in again.error
    stale = fs.write_membership(B, {"version": 2}, 0)
    assert (stale.ok, stale.applied) == (False, False)
    assert stale.doc == {"version": 1, "claims": {}}
    ok = fs.write_membership(B, {"version": 2, "claims": {"shard-0": {"owner": B}}}, 1)
    assert ok.ok
    assert fs.read_membership() == {"version": 2, "claims": {"shard-0": {"owner": B}}}
    s = fs.stats()
    assert (s.membership_writes, s.membership_conflicts) == (2, 2)


def test_membership_reads_are_copies() -> None:
    fs = SimFS()
    doc: dict[str, Any] = {"version": 1, "claims": {"shard-0": {"owner": A}}}
    fs.write_membership(A, doc, None)
    doc["claims"]["shard-0"]["owner"] = "mutated"
    read = fs.read_membership()
    assert read is not None
    assert read["claims"]["shard-0"]["owner"] == A
    read["version"] = 99
    assert fs.read_membership() == {"version": 1, "claims": {"shard-0": {"owner": A}}}


def test_membership_fail_before_applies_nothing_and_fail_after_applies_but_reports_failure() -> (
    None
):
    fs = SimFS()
    fs.write_membership(A, {"version": 1}, None)
    before = fs.write_membership(A, {"version": 2}, 1, fail_before=True)
    assert (before.ok, before.applied) == (False, False)
    assert before.error is not None and before.error.startswith("EIO")
    assert fs.read_membership() == {"version": 1}
    after = fs.write_membership(A, {"version": 2}, 1, fail_after=True)
    assert (after.ok, after.applied) == (False, True)
    assert after.error is not None and "rename" in after.error
    assert after.doc == {"version": 2}
    assert fs.read_membership() == {"version": 2}  # it happened, whatever the writer was told
    retry = fs.write_membership(A, {"version": 2}, 1)  # a blind retry now conflicts
    assert not retry.ok and not retry.applied
    fs.disk_full = True
    full = fs.write_membership(A, {"version": 3}, 2)
    assert (full.applied, full.error) == (False, ENOSPC)
    s = fs.stats()
    assert (s.membership_fail_before, s.membership_fail_after) == (2, 1)


# -- shard locks -----------------------------------------------------------------------------


def test_posix_locks_exclude_and_the_holder_may_relock() -> None:
    fs = SimFS()
    assert fs.try_lock(A, 0)
    assert fs.try_lock(A, 0)
    assert not fs.try_lock(B, 0)
    assert fs.try_lock(B, 1)
    assert fs.holders(0) == (A,)
    assert fs.touch_lock(A, 0) is None
    fs.unlock(A, 0)
    assert fs.holders(0) == ()
    assert fs.touch_lock(A, 0) is not None  # no fd any more
    assert fs.try_lock(B, 0)
    assert fs.double_grants == ()
    assert fs.stats().lock_busy == 1


def test_nfsv3_grants_a_held_lock_to_another_host_and_records_it() -> None:
    fs = SimFS(lock_mode="nfsv3")
    assert fs.try_lock(A, 0)
    assert not fs.try_lock("node-1#2", 0)  # same client: local flock still excludes
    assert fs.try_lock(B, 0)
    assert fs.holders(0) == (A, B)
    assert fs.double_grants == (DoubleGrant(shard=0, granted_to=B, held_by=(A,)),)
    assert fs.stats().double_grants == 1


def test_a_loudly_lost_lock_fails_every_later_touch() -> None:
    fs = SimFS()
    fs.try_lock(A, 0)
    assert fs.lose_lock(A, 0, silent=False)
    assert fs.holders(0) == ()
    assert fs.touch_lock(A, 0) == EIO_LOCK_LOST
    assert fs.touch_lock(A, 0) == EIO_LOCK_LOST
    assert fs.try_lock(B, 0)  # someone else can take it meanwhile
    fs.unlock(A, 0)  # closing the fd ends the errors
    assert fs.touch_lock(A, 0) != EIO_LOCK_LOST
    assert not fs.lose_lock(A, 0, silent=False)  # not held: nothing to lose
    s = fs.stats()
    assert (s.locks_lost_loud, s.lock_touch_errors) == (1, 3)


def test_a_silently_lost_lock_is_never_noticed_by_its_old_holder() -> None:
    fs = SimFS()
    fs.try_lock(A, 0)
    assert fs.lose_lock(A, 0, silent=True)
    assert fs.touch_lock(A, 0) is None
    assert fs.try_lock(B, 0)
    assert fs.touch_lock(A, 0) is None  # still believes; B holds it
    assert fs.holders(0) == (B,)
    assert fs.stats().locks_lost_silent == 1


def test_crash_and_exit_release_the_processes_locks() -> None:
    fs = SimFS()
    fs.try_lock(A, 0)
    fs.try_lock(A, 1)
    fs.try_lock(B, 2)
    fs.crash(A, rng(), torn_prob=0.5)
    assert fs.holders(0) == fs.holders(1) == ()
    assert fs.try_lock(B, 0)
    fs.release_all(B)
    assert fs.holders(0) == fs.holders(2) == ()


# -- determinism -----------------------------------------------------------------------------


def scenario(seed: int) -> SimFS:
    r = random.Random(seed)
    fs = SimFS(lock_mode="nfsv3")
    handles: list[AppendHandle] = []
    for i in range(200):
        pid = (A, B, "node-3#1")[int(r.random() * 3)]
        x = r.random()
        if x < 0.5:
            handles.append(fs.append(pid, i % 3, b"rec-%d\n" % i, enospc=r.random() < 0.05))
        elif x < 0.7 and handles:
            fs.complete_append(handles[int(r.random() * len(handles))])
        elif x < 0.75:
            fs.crash(pid, r, torn_prob=0.5)
        elif x < 0.85:
            fs.try_lock(pid, i % 3)
        elif x < 0.9:
            fs.lose_lock(pid, i % 3, silent=r.random() < 0.5)
        elif x < 0.95:
            doc = fs.read_membership()
            version = None if doc is None else doc["version"]
            fs.write_membership(
                pid, {"version": (version or 0) + 1}, version, fail_after=r.random() < 0.2
            )
        else:
            fs.replace_log(pid, i % 3, fs.read_durable_log(i % 3))
    return fs


def test_digest_is_deterministic_and_sees_every_part_of_the_state() -> None:
    assert scenario(5).digest() == scenario(5).digest()
    assert scenario(5).stats() == scenario(5).stats()
    assert scenario(5).digest() != scenario(6).digest()
    base = SimFS()
    h = base.append(A, 0, b"x\n")
    d0 = base.digest()
    assert d0 == base.digest()
    base.complete_append(h)  # same bytes, now durable
    d1 = base.digest()
    assert d1 != d0
    base.try_lock(A, 0)
    d2 = base.digest()
    assert d2 != d1
    base.write_membership(A, {"version": 1}, None)
    assert base.digest() != d2


# -- a law: surviving appends are exactly where their writers put them -----------------------

ops = st.lists(
    st.tuples(
        st.sampled_from(["append", "complete", "crash", "replace"]),
        st.sampled_from([A, B]),
        st.integers(min_value=0, max_value=1),
        st.binary(min_size=1, max_size=12),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(ops=ops, seed=st.integers(min_value=0, max_value=2**32))
def test_every_durable_append_is_intact_at_its_offset(
    ops: list[tuple[str, str, int, bytes]], seed: int
) -> None:
    r = random.Random(seed)
    fs = SimFS()
    written: dict[int, tuple[AppendHandle, bytes]] = {}
    for op, pid, shard, data in ops:
        if op == "append":
            h = fs.append(pid, shard, data)
            written[h.seq] = (h, data)
        elif op == "complete" and written:
            seqs = sorted(written)
            fs.complete_append(written[seqs[int(r.random() * len(seqs))]][0])
        elif op == "crash":
            fs.crash(pid, r, torn_prob=0.5)
        elif op == "replace":
            fs.replace_log(pid, shard, fs.read_durable_log(shard))
            # Offsets into the old file mean nothing in the new one.
            written = {s: hd for s, hd in written.items() if hd[0].shard != shard}
        for s in (0, 1):
            visible = fs.read_log(s)
            assert fs.log_size(s) == len(visible)
            durable = fs.read_durable_log(s)
            # The durable view is the visible one with pending bytes zeroed and cut at the end.
            assert len(durable) <= len(visible)
            assert all(d in (v, 0) for d, v in zip(durable, visible, strict=False))
        for h, data in written.values():
            if h.orphaned:
                continue  # its bytes are in a replaced file, not in this log
            status = fs.status(h)
            if status in ("durable", "pending"):
                assert fs.read_range(h.shard, h.offset, h.length) == data
            if status == "durable":
                assert fs.read_durable_log(h.shard)[h.offset : h.offset + h.length] == data


class _LastCut:
    """A crash's random draws, fixed: every file tears, at the last cut it may."""

    def random(self) -> float:
        return 0.999_999_9


def test_a_tear_leaves_a_whole_record_without_its_newline_only_at_the_end_of_the_file() -> None:
    record = b'{"taskId":"t1"}\n'
    fs = SimFS()
    fs.append(A, 0, record)
    fs.crash(A, _LastCut(), torn_prob=1.0)  # type: ignore[arg-type]
    assert fs.read_log(0) == record[:-1]  # a short write one byte short: readers keep it
    # Another writer's pending bytes after it could be lost later, making the record the last
    # line only then: there the tear stops earlier, inside the record.
    fs = SimFS()
    fs.append(A, 0, record)
    fs.append(B, 0, b"by-b\n")
    fs.crash(A, _LastCut(), torn_prob=1.0)  # type: ignore[arg-type]
    assert fs.read_log(0).startswith(record[:-2] + b"\0")


def test_restore_newline_writes_it_back_durably_unless_something_is_pending() -> None:
    fs = SimFS()
    fs.complete_append(fs.append(A, 0, b'{"taskId":"t1"}'))
    assert fs.restore_newline(B, 0)
    assert fs.read_durable_log(0) == b'{"taskId":"t1"}\n'
    assert fs.stats().newlines_restored == 1
    fs = SimFS()
    fs.complete_append(fs.append(A, 0, b'{"taskId":"t1"}'))
    fs.append(A, 0, b"x\n")
    assert not fs.restore_newline(B, 0)
    assert fs.read_log(0) == b'{"taskId":"t1"}x\n'


def test_the_world_reads_and_records_a_torn_record_that_lost_only_its_newline() -> None:
    # The tear stops one byte short of a tombstone's end: the history must list it (the next
    # owner keeps it: `snerd.core.records.scan_tail`), and the owner's read must keep it too.
    from sim.clock import NodeClock
    from sim.settings import SECOND, WALL_ORIGIN, Settings
    from sim.world import World
    from snerd.core import effects as fx
    from snerd.core.records import encode_record, scan

    world = World(Settings.draw(0, nodes=1, shards=1, torn_prob=1.0))
    world.clocks.append(NodeClock(t=0, offset_us=WALL_ORIGIN, drift_ppm=0, mono_origin=SECOND))
    world._start(0, 0)
    tombstone = {
        "taskId": "t1",
        "taskType": "t",
        "deletedAt": "2027-01-01T00:00:00.000000Z",
        "snerdOutcome": "completed",
    }
    effect = fx.Append(token=1, shard=0, records=(fx.NewRecord(fields=tombstone),))
    line = encode_record(tombstone)
    world.shell.issue_append(world.procs[0], effect, [tombstone], [line], world.t + SECOND, world.t)
    world.rng_crash = _LastCut()  # type: ignore[assignment]
    world.down(world.procs[0], crashed=True)
    assert world.fs.read_log(0) == line[:-1]
    assert [e["fields"] for e in world.history if e["kind"] == "record"] == [tombstone]
    world.shell._read_log(world.procs[0], fx.ReadLog(shard=0))
    assert world.fs.read_log(0) == line
    assert [r.fields for r in scan(world.fs.read_log(0)).records] == [tombstone]
    assert world.fs.stats().newlines_restored == 1
