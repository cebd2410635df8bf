"""Fuzzing the log files: what disks, crashes and people do to `tasks.log` and the inbox files.

A strategy draws a log of real records (the daemon's enqueue shape) and damages it the ways a
file is damaged: a flipped bit in a line, a line that lost its newline (glued to the next, or
the file's last line), a duplicated line, garbage between lines, a huge line (over the line
limit too), and a cut at any byte. It knows which records stayed intact: their bytes and their
newline unchanged and a line of their own (the last line may lack only its newline).

- The reader and the recovery (`snerd.io.log`): nothing raises; every intact record is read,
  at its offset, and nothing is read that was never written; reading in small chunks or large
  ones, or the whole buffer at once (`snerd.core.records.scan`), gives the same records; after
  the owner's recovery the file ends on a newline and reads the same records as before it.
- Real daemons: every log the strategy draws becomes a shard of a queue directory, and a daemon
  started on it (several directories in the fuzz profile) claims every shard, serves, reports
  each corrupt line and repaired last line on stderr, holds exactly the tasks the core's rule
  reads in each shard, never prints a traceback; `snerdmq fsck` names what it found, before
  and after. And one running daemon is fed many damaged inbox files (the logs other daemons
  write into its shards): it takes in exactly what the rule reads, and keeps serving.

Example counts come from the hypothesis profile (tests/conftest.py): `make fuzz` runs them long.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from unittest import mock

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from snerd.cli import main as snerdmq
from snerd.core import records as records_mod
from snerd.core.records import encode_record, scan
from snerd.io.log import DEFAULT_CHUNK_BYTES, read_log, recover_log
from snerd.io.log import reader as log_reader
from tests.support import daemon as daemons
from tests.support.daemon import SNERDMQ

PAST = "2026-01-01T00:00:00.000000Z"


def task_fields(task_id: str, data_bytes: int = 8) -> dict[str, Any]:
    """A task record as a daemon writes it at enqueue (its type is never registered, so the
    task waits: a daemon's depth counts it)."""
    return {
        "taskId": task_id,
        "retryCount": 0,
        "maxRetries": 0,
        "retryAfterHours": 0.0,
        "retryAfterTime": PAST,
        "taskData": orjson.dumps({"pad": "p" * data_bytes}).decode(),
        "taskType": "fuzz-never-registered",
        "executeAt": PAST,
        "snerdNode": "writer@pid-1-abcdef",
        "snerdEpoch": 1,
    }


# -- the strategy -------------------------------------------------------------------------------

#: What happens to one line of the log (applied in file order).
Op = tuple[Any, ...]

ops = st.one_of(
    st.just(("keep",)),
    st.just(("keep",)),
    st.just(("keep",)),
    st.tuples(st.just("flip"), st.integers(0, 1 << 20), st.integers(0, 7)),
    st.just(("drop_newline",)),
    st.just(("dup",)),
    # Garbage never holds `{`: a JSON object in it would be a record (an upstream line, which
    # has no checksum), so "nothing read that was never written" could not be checked.
    st.tuples(
        st.just("garbage"), st.binary(min_size=1, max_size=80).map(lambda b: b.replace(b"{", b"("))
    ),
    st.tuples(st.just("huge"), st.integers(1_000, 40_000), st.booleans()),
)


class Damaged:
    """A damaged log: its bytes, the records it was made from, and where each intact one is.
    (A plain class: hypothesis prints a failing example with this `repr`, not its bytes.)"""

    __slots__ = ("cut", "data", "intact", "ops", "originals")

    def __init__(
        self,
        data: bytes,
        originals: list[dict[str, Any]],
        intact: list[tuple[int, int]],
        ops: list[Op],
        cut: int,
    ) -> None:
        self.data = data
        self.originals = originals
        #: (offset, index into `originals`) of every intact record.
        self.intact = intact
        self.ops = ops
        self.cut = cut

    def describe(self) -> str:
        return f"{self!r}: {self.data[:1000]!r}"

    def __repr__(self) -> str:
        sizes = [len(encode_record(f)) for f in self.originals]
        return (
            f"Damaged(line sizes {sizes}, ops {self.ops!r}, cut {self.cut}, {len(self.data)} bytes)"
        )


def build(originals: list[dict[str, Any]], plan: list[Op], cut: int | None) -> Damaged:
    lines = [encode_record(f) for f in originals]
    out = bytearray()
    placed: list[tuple[int, int]] = []
    for i, (line, op) in enumerate(zip(lines, plan, strict=True)):
        kind = op[0]
        if kind == "garbage":
            out += op[1]
        elif kind == "huge":
            out += b"x" * op[1] + (b"\n" if op[2] else b"")
        start = len(out)
        if kind == "flip":
            damaged = bytearray(line)
            damaged[op[1] % (len(line) - 1)] ^= 1 << op[2]
            out += damaged
            continue
        if kind == "drop_newline":
            out += line[:-1]  # intact only as the file's last line
        else:
            out += line
        placed.append((start, i))
        if kind == "dup":
            placed.append((len(out), i))
            out += line
    at = len(out) if cut is None else cut % (len(out) + 1)
    data = bytes(out[:at])
    intact = []
    for start, i in placed:
        line = lines[i]
        if start >= len(data):
            continue  # cut off
        if start and data[start - 1] != 0x0A:
            continue  # glued to what came before
        if data[start : start + len(line)] == line or (
            start + len(line) - 1 == len(data) and data[start:] == line[:-1]
        ):
            intact.append((start, i))
    return Damaged(data, originals, intact, plan, at)


_logs = itertools.count()


@st.composite
def damaged_logs(draw: st.DrawFn, *, max_lines: int = 12) -> Damaged:
    n = draw(st.integers(0, max_lines))
    tag = next(_logs)
    sizes = draw(st.lists(st.sampled_from([8, 8, 8, 300, 30_000]), min_size=n, max_size=n))
    originals = [task_fields(f"L{tag}-{i}", size) for i, size in enumerate(sizes)]
    plan = draw(st.lists(ops, min_size=n, max_size=n))
    cut = draw(st.none() | st.integers(0, 1 << 30))
    return build(originals, plan, cut)


def _read_all(path: Path, chunk_bytes: int) -> tuple[list[Any], list[tuple[int, str]]]:
    """What a read-only reader takes from the file: the records of every chunk, and those of
    a last line that lost only its newline."""
    records: list[Any] = []
    corrupt: list[tuple[int, str]] = []
    for chunk in read_log(path, chunk_bytes=chunk_bytes):
        records += chunk.records
        corrupt += chunk.corrupt
        if chunk.tail is not None and chunk.tail.records:
            records += chunk.tail.records
            corrupt += chunk.tail.corrupt
    return records, corrupt


def _check_reader_and_recovery(log: Damaged, directory: Path, chunk_bytes: int) -> None:
    path = directory / "tasks.log"
    path.write_bytes(log.data)
    records, _ = _read_all(path, chunk_bytes)
    found = {(r.offset, orjson.dumps(r.fields)) for r in records}
    for offset, i in log.intact:
        assert (offset, orjson.dumps(log.originals[i])) in found, (offset, i, log.describe())
    written = {orjson.dumps(f) for f in log.originals}
    assert all(orjson.dumps(r.fields) in written for r in records), log.describe()

    recover_log(path)
    after = path.read_bytes()
    assert after == b"" or after.endswith(b"\n"), log.describe()
    # Only the last line changed: cut, or its newline written back.
    assert after in (log.data[: len(after)], log.data + b"\n"), log.describe()
    again, _ = _read_all(path, chunk_bytes)
    assert [(r.offset, r.length, r.fields) for r in again] == [
        (r.offset, r.length, r.fields) for r in records
    ], log.describe()
    assert recover_log(path).at == -1  # nothing left to repair


@given(damaged_logs(), st.sampled_from([13, 97, 4096, DEFAULT_CHUNK_BYTES]))
def test_every_intact_record_survives_reading_and_recovery(log: Damaged, chunk_bytes: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tasks.log"
        path.write_bytes(log.data)
        # The file read in chunks of any size reads what the core's rule reads in the buffer.
        records, corrupt = _read_all(path, chunk_bytes)
        whole = scan(log.data, at_eof=True)
        assert [(r.offset, r.length, r.fields) for r in records] == [
            (r.offset, r.length, r.fields) for r in whole.records
        ], log.describe()
        assert sorted(corrupt) == sorted(whole.corrupt), log.describe()
        _check_reader_and_recovery(log, Path(tmp), chunk_bytes)


@given(damaged_logs(max_lines=8))
def test_lines_over_the_line_limit_hide_nothing_after_them(log: Damaged) -> None:
    # With a line limit below the huge lines' sizes, the reader reports each such run once and
    # goes on at the next newline, and the recovery cuts an over-long last line.
    small = [r for r in log.originals if len(encode_record(r)) < 4096]
    with (
        mock.patch.object(records_mod, "LINE_LIMIT", 4096),
        mock.patch.object(log_reader, "LINE_LIMIT", 4096),
        tempfile.TemporaryDirectory() as tmp,
    ):
        if len(small) != len(log.originals):  # records longer than the limit cannot be written
            log = build(small, log.ops[: len(small)], log.cut)
        _check_reader_and_recovery(log, Path(tmp), 1024)


# -- real daemons --------------------------------------------------------------------------------


class SyncDaemon:
    """One `snerdmq DIR` process driven from the test's own thread (hypothesis examples are
    plain functions): stdout parsed into a queue, stderr collected, both by threads."""

    def __init__(self, directory: Path, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [*SNERDMQ, str(directory)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "SNERD_DRAIN_TIMEOUT": "5", **(env or {})},
        )
        daemons.STARTED.append(self.proc.pid)
        self.messages: queue.Queue[dict[str, Any]] = queue.Queue()
        self._stderr: list[bytes] = []
        self._threads = [
            threading.Thread(target=self._read_stdout, daemon=True),
            threading.Thread(target=self._read_stderr, daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.messages.put(orjson.loads(line))

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line)

    @property
    def stderr(self) -> str:
        return b"".join(self._stderr).decode(errors="replace")

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(orjson.dumps(message) + b"\n")
        self.proc.stdin.flush()

    def wait_for(self, pred: Any, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                message = self.messages.get(timeout=max(left, 0.001))
            except queue.Empty:
                raise AssertionError(
                    f"no such message in {timeout} s; stderr: {self.stderr}"
                ) from None
            if pred(message):
                return message

    def stats(self) -> dict[str, Any]:
        self.send({"action": "stats"})
        return self.wait_for(lambda m: m["action"] == "stats")

    def close(self, timeout: float = 30.0) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        code = self.proc.wait(timeout=timeout)
        for thread in self._threads:
            thread.join(timeout=timeout)
        return code

    def __enter__(self) -> SyncDaemon:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _cli_json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    capsys.readouterr()
    snerdmq([*args, "--json"])
    return json.loads(capsys.readouterr().out)


def _last_line(data: bytes) -> tuple[int, int]:
    """Where a file's last line starts when it lacks its newline, and its length (0: none)."""
    at = data.rfind(b"\n") + 1
    return at, len(data) - at


@pytest.mark.slow
def test_daemons_started_on_damaged_logs_serve_and_report_what_they_found(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logs: list[Damaged] = []

    @given(damaged_logs())
    def collect(log: Damaged) -> None:
        logs.append(log)

    collect()
    per_daemon = 40  # shards per directory: each daemon loads that many damaged logs
    for n, first in enumerate(range(0, len(logs), per_daemon)):
        batch = logs[first : first + per_daemon]
        q = tmp_path / f"q{n}"
        assert snerdmq(["add-shards", str(len(batch)), str(q)]) == 0
        for k, log in enumerate(batch):
            (q / f"shard-{k}" / "tasks" / "tasks.log").write_bytes(log.data)
        expected = [scan(log.data, at_eof=True) for log in batch]

        # fsck names every damage before any daemon touched the files.
        before = _cli_json(capsys, "fsck", str(q))["shards"]
        for k, (log, read) in enumerate(zip(batch, expected, strict=True)):
            report = before[k]
            assert [c["offset"] for c in report["corrupt"]] == [o for o, _ in read.corrupt], log
            at, length = _last_line(log.data)
            kept = bool(length) and read.end == len(log.data)
            assert report["unterminated_record"] == (
                {"offset": at, "bytes": length} if kept else None
            ), log
            assert report["torn_tail"] == (
                {"offset": at, "bytes": length} if length and not kept else None
            ), log

        with SyncDaemon(q) as d:
            ready = d.wait_for(lambda m: m["action"] == "membership" and m["owned"], 60)
            assert sorted(ready["owned"]) == sorted(f"shard-{k}" for k in range(len(batch)))
            d.send(
                {
                    "action": "enqueue",
                    "task_id": "probe",
                    "task_type": "fuzz-never-registered",
                    "task_data": "{}",
                    "max_retries": 0,
                    "retry_after_hours": 0,
                }
            )
            ack = d.wait_for(lambda m: m.get("task_id") == "probe")
            assert ack["action"] == "ack", ack
            depth = {s["shard"]: s["depth"] for s in d.stats()["per_shard"]}
            depth[ack["shard"]] -= 1
            for k, (log, read) in enumerate(zip(batch, expected, strict=True)):
                live = {r.fields["taskId"] for r in read.records}
                assert depth[f"shard-{k}"] == len(live), (k, log)
            assert d.close() == 0
            stderr = d.stderr
        assert "Traceback" not in stderr, stderr
        for k, (log, read) in enumerate(zip(batch, expected, strict=True)):
            where = f"shard-{k}/tasks/tasks.log"
            for offset, _reason in read.corrupt:
                assert f"{where}: skipped a corrupt line at byte {offset} " in stderr, (k, log)
            at, length = _last_line(log.data)
            if length and read.end == len(log.data):
                assert f"{where}: the last record (at byte {at}) had lost its newline" in stderr
            elif length:
                assert f"{where}: cut a torn last line of {length} bytes at byte {at}" in stderr

        # And after: the corrupt lines are still there (daemons skip them, compaction drops
        # them), the last lines are repaired.
        after = _cli_json(capsys, "fsck", str(q))["shards"]
        for k, read in enumerate(expected):
            report = after[k]
            assert [c["offset"] for c in report["corrupt"]] == [o for o, _ in read.corrupt]
            assert report["torn_tail"] is None and report["unterminated_record"] is None


_nodes = itertools.count()


@pytest.mark.slow
def test_a_running_daemon_takes_in_damaged_inbox_files_and_keeps_serving(tmp_path: Path) -> None:
    # Inbox files are the logs other daemons write into this one's shards; it reads them while
    # it runs, so one daemon takes many damaged ones. An inbox's unterminated last line is left
    # for its writer to finish, so only complete lines are taken in.
    q = tmp_path / "q"
    assert snerdmq(["add-shards", "1", str(q)]) == 0
    folder = q / "shard-0" / "inbox"
    folder.mkdir()
    env = {"SNERD_INBOX_POLL_MS": "5", "SNERD_INBOX_IDLE_POLL_MS": "5"}
    taken: set[str] = set()
    with SyncDaemon(q, env) as d:
        d.wait_for(lambda m: m["action"] == "membership" and m["owned"] == ["shard-0"], 60)

        @given(damaged_logs())
        def feed(log: Damaged) -> None:
            (folder / f"fuzz-{next(_nodes)}.log").write_bytes(log.data)
            complete = log.data[: log.data.rfind(b"\n") + 1]
            taken.update(r.fields["taskId"] for r in scan(complete).records)
            deadline = time.monotonic() + 30
            while (depth := d.stats()["queue_depth"]) != len(taken):
                assert depth < len(taken), (depth, len(taken), log)
                assert time.monotonic() < deadline, (depth, len(taken), log)
                time.sleep(0.005)
            assert d.proc.poll() is None

        feed()
        assert d.close() == 0
        assert "Traceback" not in d.stderr, d.stderr


def _enqueue(d: SyncDaemon, task_id: str) -> dict[str, Any]:
    d.send(
        {
            "action": "enqueue",
            "task_id": task_id,
            "task_type": "fuzz-never-registered",
            "task_data": "{}",
            "max_retries": 0,
            "retry_after_hours": 0,
        }
    )
    return d.wait_for(lambda m: m.get("task_id") == task_id)


def test_a_daemon_keeps_an_acked_record_that_lost_only_its_newline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `truncate -s -1 tasks.log` after two acked enqueues: the last record is whole, and it
    # was acknowledged. It used to be cut as a torn write, the task gone, and fsck then saw
    # nothing.
    q = tmp_path / "q"
    with SyncDaemon(q) as d:
        d.wait_for(lambda m: m["action"] == "membership" and m["owned"])
        assert [_enqueue(d, t)["action"] for t in ("a", "b")] == ["ack", "ack"]
        assert d.close() == 0
    log = q / "shard-0" / "tasks" / "tasks.log"
    data = log.read_bytes()
    log.write_bytes(data[:-1])
    report = _cli_json(capsys, "fsck", str(q))["shards"][0]
    assert report["unterminated_record"] is not None and report["torn_tail"] is None
    with SyncDaemon(q) as d:
        d.wait_for(lambda m: m["action"] == "membership" and m["owned"])
        assert d.stats()["queue_depth"] == 2
        assert d.close() == 0
    assert "had lost its newline; it is a whole record, so it is kept" in d.stderr
    assert log.read_bytes().startswith(data)  # the record and its newline, then the new claim
    assert _cli_json(capsys, "fsck", str(q))["problems"] == 0
