"""The daemon face (`snerd.io.stdio`): the stdin reader's framing, the stdout writer, the daemon
process's own settings (each checked in a fresh interpreter: they change process-wide state that
must not leak into the test process), and a real daemon that keeps answering."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
import trio

from snerd.core import events as ev
from snerd.core import protocol as proto
from snerd.io import stdio
from tests.support.daemon import Daemon


def _run(code: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def test_young_collection_survivors_are_frozen_and_a_full_collection_frees_their_cycles() -> None:
    _run(
        """
        import gc, weakref
        from snerd.io.stdio import collect_all, tune_gc

        class Node:
            pass

        tune_gc()
        assert gc.get_threshold()[0] == 20_000
        frozen = gc.get_freeze_count()
        # Long-lived task state: scanned by one young collection, then out of its sight.
        kept = [Node() for _ in range(500)]
        gc.collect(0)
        assert gc.get_freeze_count() >= frozen + 500
        assert gc.get_count()[0] < 100 and not gc.get_objects(1)
        # A cycle that becomes garbage after it was frozen outlives young collections...
        a = Node()
        a.me = a
        gone = weakref.ref(a)
        gc.collect(0)
        del a
        gc.collect(0)
        assert gone() is not None
        # ... and not a full one, after which what is left is frozen again.
        collect_all()
        assert gone() is None
        assert gc.get_freeze_count() >= 500 and len(kept) == 500
        """
    )


# --- framing: what the stdin reader hands the core -------------------------------------------


class _Events:
    """Stands in for the runtime: keeps what the stdin reader feeds and submits."""

    def __init__(self) -> None:
        self.events: list[ev.Event] = []

    def feed(self, events: list[ev.Event]) -> None:
        self.events += events

    def submit(self, event: ev.Event) -> None:
        self.events.append(event)

    def lines(self) -> list[ev.LineReceived]:
        """Every line, as one `LineReceived` each (`LinesReceived` split)."""
        out: list[ev.LineReceived] = []
        for event in self.events:
            if isinstance(event, ev.LinesReceived):
                out += [ev.LineReceived(line=line) for line in event.lines]
            elif isinstance(event, ev.LineReceived):
                out.append(event)
        return out


async def _read_stdin_of(data: bytes, max_line: int) -> _Events:
    """Run the daemon's stdin reader over `data` written to a pipe, until EOF."""
    read_fd, write_fd = os.pipe()
    seen = _Events()
    reader = trio.lowlevel.FdStream(read_fd)
    writer = trio.lowlevel.FdStream(write_fd)

    async def write() -> None:
        async with writer:
            await writer.send_all(data)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(write)
        with trio.fail_after(30):
            await stdio._read_stdin(cast(Any, seen), reader, max_line)
    await reader.aclose()
    assert isinstance(seen.events[-1], ev.DrainRequested)
    return seen


def _go_enqueue(task_id: str, payload_bytes: int) -> bytes:
    """An enqueue as Go's json.Marshal writes it: keys sorted, so `task_id` after the data."""
    return (
        b'{"action":"enqueue","max_retries":0,"retry_after_hours":0,"task_data":"'
        + b"x" * payload_bytes
        + b'","task_id":'
        + orjson.dumps(task_id)
        + b',"task_type":"t"}'
    )


async def test_an_over_long_line_keeps_the_task_id_at_its_end() -> None:
    # One line within a single read, one over many reads (the reader skips it as it comes),
    # one whose id is at the front; ordinary lines around them arrive whole.
    short = _go_enqueue("in-one-read", 5_000)
    long = _go_enqueue("over-many-reads", 300_000)
    front = b'{"task_id":"at-the-front","action":"enqueue","task_data":"' + b"y" * 300_000 + b'"}'
    ok = _go_enqueue("fine", 10)
    data = b"\n".join([ok, short, ok, long, front, ok, b""])
    seen = await _read_stdin_of(data, max_line=2048)
    lines = seen.lines()
    assert [line.oversize for line in lines] == [0, len(short), 0, len(long), len(front), 0]
    assert [proto.sniff_task_id(line.line) for line in lines] == [
        "fine",
        "in-one-read",
        "fine",
        "over-many-reads",
        "at-the-front",
        "fine",
    ]
    assert lines[0].line == ok and lines[-1].line == ok
    # What is kept of an over-long line is bounded: both ends, nothing in between.
    assert all(len(line.line) <= 2 * proto.SNIFF_BYTES for line in lines)


async def test_a_message_that_cannot_be_written_is_a_logged_error_not_a_crash(
    capfd: pytest.CaptureFixture[str],
) -> None:
    peer = stdio.StdioPeer()
    deep: Any = []
    for _ in range(300):
        deep = [deep]
    peer.deliver({"action": "progress", "task_id": "p1", "data": deep})
    peer.deliver({"action": "error", "task_id": "bad\udc80id", "message": "x"})
    peer.deliver({"action": "ack", "message": "next"})
    lines = [orjson.loads(line) for line in bytes(peer.buffer).splitlines()]
    assert [m.get("task_id") for m in lines] == ["p1", None, None]
    assert lines[0]["action"] == "error" and "progress message" in lines[0]["message"]
    assert lines[2] == {"action": "ack", "message": "next"}
    assert "bug in snerd" in capfd.readouterr().err


# --- the daemon keeps answering --------------------------------------------------------------


async def test_one_line_the_daemon_could_not_write_back_does_not_end_it(tmp_path: Path) -> None:
    """A `progress` nested 254 deep (read by orjson, but not written back by it) ended the
    daemon at its echo, and so did a deeply nested `error_msg`, even for an unknown id."""
    async with trio.open_nursery() as nursery:
        daemon = await Daemon.start(nursery, tmp_path / "q")
        await daemon.send_raw(b'{"action":"register","task_type":"t"}\n')
        await daemon.wait_for(lambda m: m.get("message") == "Registered handler for t")
        deep = nested_array(254)
        await daemon.send_raw(b'{"action":"progress","task_id":"p1","data":' + deep + b"}\n")
        await daemon.send_raw(
            b'{"action":"result","task_id":"nobody","status":"error","error_msg":' + deep + b"}\n"
        )
        for task_id in ("p1", "nobody"):
            reply = await daemon.wait_for(lambda m, t=task_id: m.get("task_id") == t)
            assert reply == {
                "action": "error",
                "task_id": task_id,
                "message": f"Invalid JSON: nested deeper than {proto.MAX_NESTING} levels",
            }
        # As deep as may be is echoed as it came.
        ok = nested_array(proto.MAX_NESTING - 1)
        await daemon.send_raw(b'{"action":"progress","task_id":"p2","data":' + ok + b"}\n")
        echo = await daemon.wait_for(lambda m: m.get("task_id") == "p2")
        assert echo["action"] == "progress" and orjson.dumps(echo["data"]) == ok
        await daemon.enqueue("e1")
        await daemon.wait_for(lambda m: m.get("task_id") == "e1" and m["action"] == "execute")
        await daemon.close_stdin()
        assert await daemon.wait() == 0
        assert "Traceback" not in daemon.stderr.decode()


def nested_array(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def test_a_log_line_cannot_be_split_or_forged_by_what_it_quotes(
    capfd: pytest.CaptureFixture[str],
) -> None:
    # A task id or an error text is quoted in log lines: a newline in it must not start a
    # second `[Snerd]` line, and an escape sequence must not reach the terminal.
    stdio.StdioPeer().log("warning", "task a\n[Snerd] ERROR: forged\x1b[2J\u2028end")
    err = capfd.readouterr().err
    assert err.count("\n") == 1
    assert err == "[Snerd] WARNING: task a\\x0a[Snerd] ERROR: forged\\x1b[2J\\u2028end\n"
