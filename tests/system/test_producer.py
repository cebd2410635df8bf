"""The blocking producer (`snerd.Producer`) against a real daemon (`SnerdQueue`): enqueues from
threads and from a forked child all run, once each; a dedupe's answer is the owner's; a task
enqueued while no daemon runs is run by the next one to start; bad input is the daemon's
error, with the task id; the files of a producer gone are removed once ingested, never those
of a live one.

Waits are on events set by handlers (or on files), bounded by `anyio.fail_after`.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections import Counter
from datetime import timedelta
from pathlib import Path

import anyio
import pytest

from snerd import EnqueueError, Producer, SnerdQueue, current_task, producer
from snerd.core.node.model import route_shard
from snerd.io.inbox import inbox_files, inbox_progress
from snerd.queuedir import UsageError
from snerd.sdk.producer import PREFIX

SHARDS = 2
THREADS = 8
EACH = 25


async def _made(root: Path) -> None:
    """Until the daemon has made the queue (`async with` returns once it is spawned)."""
    with anyio.fail_after(30):
        while not (root / "membership.json").exists():
            await anyio.sleep(0.02)


def _queue(root: Path) -> SnerdQueue:
    return SnerdQueue(storage_path=root, shards=SHARDS, max_local_shards=SHARDS,
                      env={"SNERD_INBOX_IDLE_POLL_MS": "100"})


def _producer_files(root: Path) -> list[str]:
    return [name for shard in range(SHARDS) if (root / f"shard-{shard}" / "inbox").exists()
            for name, _path, _size in inbox_files(root, shard) if name.startswith(PREFIX)]


def _child(root: str, ids: list[str]) -> None:
    """In a forked child: the parent's process-wide producer, used as is."""
    p = producer(root)
    for task_id in ids:
        p.enqueue(task_id, "t", {"from": "child"})
    os._exit(0)


async def test_threads_and_a_forked_child_all_run_once(tmp_path: Path) -> None:
    root = tmp_path / "q"
    ran: Counter[str] = Counter()
    want = {f"th{t}-{i}" for t in range(THREADS) for i in range(EACH)}
    want |= {f"child-{i}" for i in range(20)}
    all_ran = anyio.Event()
    async with _queue(root) as queue:

        @queue.handler("t")
        async def t(data: dict[str, str]) -> None:
            ran[current_task().task_id] += 1
            if set(ran) >= want:
                all_ran.set()

        await _made(root)
        p = producer(root)

        def thread(n: int) -> None:
            for i in range(EACH):
                p.enqueue(f"th{n}-{i}", "t", {"n": n})

        def produce() -> int:
            threads = [threading.Thread(target=thread, args=(n,)) for n in range(THREADS)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            child = multiprocessing.get_context("fork").Process(
                target=_child, args=(str(root), [f"child-{i}" for i in range(20)]))
            child.start()
            child.join()
            return child.exitcode or 0

        assert await anyio.to_thread.run_sync(produce) == 0
        with anyio.fail_after(30):
            await all_ran.wait()
    assert set(ran) == want
    assert max(ran.values()) == 1
    # The child wrote files of its own: two writers, each with its own pid.
    writers = {name.split("~")[0] for name in _producer_files(root)}
    assert len(writers) == 2, writers
    assert len({w.split("@pid-")[1].split("-")[0] for w in writers}) == 2


async def test_dedupe_is_answered_by_the_owner(tmp_path: Path) -> None:
    root = tmp_path / "q"
    async with _queue(root):
        await _made(root)
        p = Producer(root)
        later = timedelta(hours=1)  # the first stays live: the second is its duplicate

        def both() -> tuple[object, object]:
            first = p.enqueue("a", "t", {"x": 1, "y": 2}, auto_dedupe=True, execute_at=later)
            second = p.enqueue("b", "t", {"y": 2, "x": 1}, auto_dedupe=True, execute_at=later)
            return first, second

        first, second = await anyio.to_thread.run_sync(both)
        p.close()
    assert (first.deduplicated, first.duplicate_of) == (False, None)  # type: ignore[attr-defined]
    assert (second.deduplicated, second.duplicate_of) == (True, "a")  # type: ignore[attr-defined]


async def test_a_task_enqueued_with_no_daemon_runs_when_one_starts(tmp_path: Path) -> None:
    root = tmp_path / "q"
    async with _queue(root):
        await _made(root)  # the queue exists; no daemon runs after this block
    with Producer(root, dedupe_wait_s=5) as p:
        plain = p.enqueue("later", "t", {"k": 1})
        undecided = p.enqueue("later-dedupe", "t", {"k": 2}, auto_dedupe=True)
    assert plain.deduplicated is False
    assert undecided.deduplicated is None  # no owner to decide, answered at once
    ran: set[str] = set()
    both = anyio.Event()
    async with _queue(root) as queue:

        @queue.handler("t")
        async def t(data: dict[str, int]) -> None:
            ran.add({1: "later", 2: "later-dedupe"}[data["k"]])
            if len(ran) == 2:
                both.set()

        with anyio.fail_after(30):
            await both.wait()


def test_a_directory_that_is_no_queue_is_named_at_the_enqueue(tmp_path: Path) -> None:
    early = Producer(tmp_path)  # made before any daemon: fine until it enqueues
    with pytest.raises(UsageError, match="not a snerd queue directory"):
        early.enqueue("x", "t", {})
    with pytest.raises(UsageError, match="does not exist"):
        Producer(tmp_path / "missing").enqueue("x", "t", {})


async def test_refusals_name_the_task(tmp_path: Path) -> None:
    root = tmp_path / "q"
    async with _queue(root):
        await _made(root)
    with Producer(root) as p:
        with pytest.raises(EnqueueError, match="max_retries must be 0 or more") as info:
            p.enqueue("bad", "t", {}, max_retries=-1)
        assert info.value.task_id == "bad"
        with pytest.raises(EnqueueError, match="cron") as info:
            p.enqueue("bad-cron", "t", {}, cron="every day")
        assert info.value.task_id == "bad-cron"
        with pytest.raises(TypeError, match="task_type"):
            p.enqueue("no-type")
    with pytest.raises(UsageError, match="closed"):
        p.enqueue("after", "t", {})
    assert _producer_files(root) == []  # nothing refused was written


async def test_files_of_a_producer_gone_are_removed_once_ingested(tmp_path: Path) -> None:
    root = tmp_path / "q"
    ran = anyio.Event()
    async with _queue(root) as queue:

        @queue.handler("t")
        async def t(data: dict[str, str]) -> None:
            if data["who"] == "first":
                ran.set()

        await _made(root)
        first = Producer(root)
        await anyio.to_thread.run_sync(lambda: first.enqueue("one", "t", {"who": "first"}))
        live = Producer(root)
        await anyio.to_thread.run_sync(lambda: live.enqueue("two", "t", {"who": "live"}))
        with anyio.fail_after(30):
            await ran.wait()
        first.close()
        gone = [n for n in _producer_files(root) if n.startswith(first.writer)]
        assert gone
        # Wait for the owner's `.read` hint to reach the end of the closed file.
        shard = next(s for s in range(SHARDS)
                     if any(n == gone[0] for n, _p, _s in inbox_files(root, s)))
        with anyio.fail_after(30):
            while True:
                ((_s, _n, read, size),) = inbox_progress(root, ((shard, gone[0]),))
                if read is not None and read == size:
                    break
                await anyio.sleep(0.05)
        # A producer opening that shard's inbox sweeps it; the live producer's file stays.
        third = Producer(root)
        key = next(f"k{i}" for i in range(1000)
                   if route_shard(f"k{i}", SHARDS) == shard)
        await anyio.to_thread.run_sync(lambda: third.enqueue(key, "t", {"who": "third"}))
        names = _producer_files(root)
        assert not [n for n in names if n.startswith(first.writer)]
        assert [n for n in names if n.startswith(live.writer)]
        live.close()
        third.close()


#: A WSGI app as a pre-fork server runs it: the producer made at import (module level, as a
#: Flask app makes its extensions), the listening socket opened, then two workers forked,
#: each serving requests from threads. Each request enqueues the task its path names.
_WSGI_SERVER = r'''
import os, socket, sys, threading
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import snerd

QUEUE = snerd.producer(sys.argv[1])
QUEUE.enqueue("boot", "t", {"at": "import"})  # the parent's own, before the fork


def app(environ, start_response):
    task = environ["PATH_INFO"].strip("/")
    done = QUEUE.enqueue(task, "t", {"pid": os.getpid()})
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [f"{done.task_id} {os.getpid()}".encode()]


class Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass


server = make_server("127.0.0.1", 0, app, server_class=Server, handler_class=Quiet)
print(server.server_address[1], flush=True)
children = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        server.serve_forever()
        os._exit(0)
    children.append(pid)
sys.stdin.read()  # until the test closes it
for pid in children:
    os.kill(pid, 15)
'''


async def test_a_prefork_wsgi_app_enqueues_from_threads_in_each_worker(tmp_path: Path) -> None:
    import subprocess
    import sys

    import httpx

    root = tmp_path / "q"
    script = tmp_path / "server.py"
    script.write_text(_WSGI_SERVER)
    want = {"boot"} | {f"req{i}" for i in range(40)}
    ran: Counter[str] = Counter()
    all_ran = anyio.Event()
    async with _queue(root) as queue:

        @queue.handler("t")
        async def t(data: dict[str, object]) -> None:
            ran[current_task().task_id] += 1
            if set(ran) >= want:
                all_ran.set()

        await _made(root)
        server = subprocess.Popen([sys.executable, str(script), str(root)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None
            port = int(await anyio.to_thread.run_sync(server.stdout.readline))
            pids: set[str] = set()
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                async def get(i: int) -> None:
                    reply = await client.get(f"/req{i}", timeout=30)
                    assert reply.status_code == 200, reply.text
                    task_id, pid = reply.text.split()
                    assert task_id == f"req{i}"
                    pids.add(pid)

                async with anyio.create_task_group() as tg:
                    for i in range(40):
                        tg.start_soon(get, i)
            with anyio.fail_after(30):
                await all_ran.wait()
        finally:
            assert server.stdin is not None
            server.stdin.close()
            server.wait(timeout=30)
    assert set(ran) == want and max(ran.values()) == 1
    # The parent and each worker that served wrote files of their own (a writer per process).
    writers = {name.split("~")[0] for name in _producer_files(root)}
    assert len(writers) == 1 + len(pids), (writers, pids)
