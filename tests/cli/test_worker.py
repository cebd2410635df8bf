"""`snerdmq worker MODULE:ATTR` as a user runs it: a real worker process on a module written
in tmp_path (its working directory), its own daemon, tasks enqueued from outside with the
blocking producer (which runs no daemon, so the worker's daemon owns the queue).

Every wait is for an event: a line on the worker's stderr (the handler prints `started ...`,
the worker logs `job id=...`), a process's exit (its pidfd reads as ready), bounded by
`anyio.fail_after`. No test lets a job sleep out its full length: the long sleeps are there to
be cut short (a drain, a kill), and a marker file makes the re-run quick.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.abc
import pytest

from snerd import producer

WORKER = [sys.executable, "-m", "snerd.cli", "worker"]

APP = """
import os, sys, time
from pathlib import Path
from snerd import SnerdQueue, current_task

HERE = Path(__file__).parent
queue = SnerdQueue(storage_path=HERE / "q")


@queue.handler("sleepy")
def sleepy(data):
    task = current_task()
    print(f"started {task.task_id} attempt {task.attempt} pid {os.getpid()}", file=sys.stderr, flush=True)
    if not (HERE / "quick").exists():
        time.sleep(data["seconds"])
    with open(HERE / f"done-{task.task_id}", "a") as out:
        out.write(f"{task.attempt}\\n")


@queue.handler("hello")
async def hello(data):
    return "hi"


not_a_queue = {"a": 1}
"""

ENV = {
    **os.environ,
    "SNERD_INBOX_POLL_MS": "20",
    "SNERD_INBOX_IDLE_POLL_MS": "20",
    "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")]
    ),
}


#: The process groups of the workers started (each leads its own); those of a test that failed
#: midway are killed at its end (`kill_leftover_workers`).
STARTED: list[anyio.abc.Process] = []


@pytest.fixture(autouse=True)
def kill_leftover_workers() -> Iterator[None]:
    yield
    while STARTED:
        process = STARTED.pop()
        if process.returncode is None:  # not reaped: its pid, and so its group, is still its
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # its daemon reads the end of stdin


class Worker:
    """One `snerdmq worker` process and the lines of its stderr."""

    def __init__(self, process: anyio.abc.Process) -> None:
        self.process = process
        self.lines: list[str] = []
        self._grew = anyio.Event()
        self.ended = anyio.Event()

    async def read_stderr(self) -> None:
        assert self.process.stderr is not None
        buffer = b""
        async for chunk in self.process.stderr:
            buffer += chunk
            *done, buffer = buffer.split(b"\n")
            self.lines += [line.decode(errors="replace") for line in done]
            self._grew.set()
            self._grew = anyio.Event()
        self.ended.set()
        self._grew.set()

    async def line(self, pattern: str, timeout: float = 15) -> re.Match[str]:
        """The first stderr line matching `pattern` (waits for it)."""
        with anyio.fail_after(timeout):
            while True:
                for text in self.lines:
                    found = re.search(pattern, text)
                    if found:
                        return found
                if self.ended.is_set():
                    raise AssertionError(f"no line {pattern!r} in:\n" + "\n".join(self.lines))
                await self._grew.wait()

    async def exit_code(self, timeout: float = 15) -> int:
        with anyio.fail_after(timeout):
            code = await self.process.wait()
            await self.ended.wait()
        return code


async def start_worker(
    tg: anyio.abc.TaskGroup,
    folder: Path,
    *args: str,
    env: dict[str, str] | None = None,
    target: str = "app:queue",
) -> Worker:
    process = await anyio.open_process(
        [*WORKER, target, *args],
        cwd=folder,
        env={**ENV, **(env or {})},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # a process group of its own, as a shell job has
    )
    STARTED.append(process)
    worker = Worker(process)
    tg.start_soon(worker.read_stderr)
    return worker


async def gone(pid: int, timeout: float = 15) -> None:
    """Wait until process `pid` (not necessarily our child) has exited."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        with anyio.fail_after(timeout):
            await anyio.wait_readable(fd)
    finally:
        os.close(fd)


def processes_in(folder: Path) -> dict[int, bytes]:
    """The processes whose working directory is `folder` (a worker's, its daemon's, the
    handlers' processes all start there), with their command lines."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "cwd") == str(folder):
                    found[int(entry.name)] = (entry / "cmdline").read_bytes()
            except OSError:
                continue
    return found


async def none_left_in(folder: Path) -> None:
    """Every process that started in `folder` exits within a bound (the forkserver and the
    daemon's sync helper end a moment after their parent: they read the end of a pipe)."""
    for pid, cmdline in processes_in(folder).items():
        try:
            await gone(pid, timeout=10)
        except TimeoutError:
            raise AssertionError(f"process {pid} is left running: {cmdline!r}") from None


@pytest.fixture
def app(tmp_path: Path) -> Path:
    (tmp_path / "app.py").write_text(textwrap.dedent(APP))
    return tmp_path


def enqueue(folder: Path, task_id: str, seconds: float, **options: object) -> None:
    with producer(folder / "q") as p:
        p.enqueue(task_id, "sleepy", {"seconds": seconds}, **options)  # type: ignore[arg-type]


async def test_the_worker_runs_jobs_and_a_group_sigterm_lets_the_running_one_finish(
    app: Path,
) -> None:
    async with anyio.create_task_group() as tg:
        worker = await start_worker(
            tg, app, "--concurrency", "4", env={"SNERD_DRAIN_TIMEOUT": "30"}
        )
        ready = await worker.line(r"ready \(daemon pid (\d+)\)")
        daemon = int(ready.group(1))
        assert "handlers: hello (event loop), sleepy (process)" in "\n".join(worker.lines)
        enqueue(app, "j1", 0)
        await worker.line(
            r"job id=j1 type=sleepy attempt=1 outcome=succeeded duration=\S+ in=process"
        )
        enqueue(app, "j2", 1.5)
        await worker.line("started j2 attempt 1")
        os.killpg(worker.process.pid, signal.SIGTERM)  # the whole group, as a terminal's ^C
        with anyio.fail_after(10):  # far less than the drain timeout of 30 s
            assert await worker.exit_code() == 0
        await gone(daemon)
    text = "\n".join(worker.lines)
    assert "SIGTERM: warm shutdown" in text
    assert re.search(r"job id=j2 type=sleepy attempt=1 outcome=succeeded", text), text
    assert (app / "done-j2").read_text() == "1\n"  # ran once, to its end
    await none_left_in(app)


async def test_a_job_longer_than_the_drain_is_handed_back_and_runs_again_later(
    app: Path,
) -> None:
    async with anyio.create_task_group() as tg:
        worker = await start_worker(tg, app, env={"SNERD_DRAIN_TIMEOUT": "0.5"})
        await worker.line("ready")
        enqueue(app, "long", 30)
        started = await worker.line(r"started long attempt 1 pid (\d+)")
        os.killpg(worker.process.pid, signal.SIGTERM)  # the forkserver gets it too
        assert await worker.exit_code() == 0
        await gone(int(started.group(1)))  # its process was killed, not left to finish
        assert "outcome=handed_back" in "\n".join(worker.lines)
        assert not (app / "done-long").exists()
        # Never lost: the next worker runs it again (the same attempt: it never ended).
        (app / "quick").touch()
        again = await start_worker(tg, app)
        await again.line(r"job id=long type=sleepy attempt=1 outcome=succeeded")
        again.process.send_signal(signal.SIGINT)
        assert await again.exit_code() == 0
    assert (app / "done-long").read_text() == "1\n"
    await none_left_in(app)


async def test_kill_9_of_the_worker_leaves_no_daemon_and_no_handler_behind(app: Path) -> None:
    async with anyio.create_task_group() as tg:
        worker = await start_worker(tg, app, env={"SNERD_DRAIN_TIMEOUT": "30"})
        daemon = int((await worker.line(r"ready \(daemon pid (\d+)\)")).group(1))
        enqueue(app, "k1", 30)
        handler = int((await worker.line(r"started k1 attempt 1 pid (\d+)")).group(1))
        worker.process.kill()
        assert await worker.exit_code() == -signal.SIGKILL
        with anyio.fail_after(10):  # the daemon reads the end of its stdin: no drain wait
            await gone(daemon)
            await gone(handler)
    await none_left_in(app)
    assert not (app / "done-k1").exists()


async def test_a_second_signal_stops_at_once(app: Path) -> None:
    async with anyio.create_task_group() as tg:
        worker = await start_worker(tg, app, env={"SNERD_DRAIN_TIMEOUT": "30"})
        daemon = int((await worker.line(r"ready \(daemon pid (\d+)\)")).group(1))
        enqueue(app, "s1", 30)
        await worker.line("started s1")
        worker.process.send_signal(signal.SIGTERM)
        await worker.line("warm shutdown")
        worker.process.send_signal(signal.SIGTERM)
        with anyio.fail_after(10):
            assert await worker.exit_code() == 1
            await gone(daemon)
    assert "SIGTERM again: stopping now" in "\n".join(worker.lines)
    await none_left_in(app)


async def test_the_worker_exits_nonzero_when_its_daemon_dies(app: Path) -> None:
    async with anyio.create_task_group() as tg:
        worker = await start_worker(tg, app)
        daemon = int((await worker.line(r"ready \(daemon pid (\d+)\)")).group(1))
        os.kill(daemon, signal.SIGKILL)
        assert await worker.exit_code() == 1
    assert "the daemon was killed by signal 9; stopping" in "\n".join(worker.lines)
    await none_left_in(app)


ENGINE_APP = """
from pathlib import Path
from snerd import Engine

engine = Engine(Path(__file__).parent / "eq")


@engine.handler("double")
def double(data):
    return data * 2
"""


async def test_the_worker_runs_an_engine_named_by_its_module_alone(tmp_path: Path) -> None:
    (tmp_path / "eng.py").write_text(ENGINE_APP)
    async with anyio.create_task_group() as tg:
        worker = await start_worker(tg, tmp_path, "--types", "double", target="eng")
        await worker.line(r"ready \(in-process engine\)")
        with producer(tmp_path / "eq") as p:
            p.enqueue("d1", "double", 21)
        await worker.line(r"job id=d1 type=double attempt=1 outcome=succeeded .* in=process")
        worker.process.send_signal(signal.SIGINT)
        assert await worker.exit_code() == 0
    await none_left_in(tmp_path)


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("nowhere:queue", "cannot import 'nowhere': no module named 'nowhere'"),
        ("app:missing", "module 'app' has no attribute 'missing'"),
        ("app:not_a_queue", "app:not_a_queue is a dict, not a SnerdQueue or an Engine"),
        ("app:queue --types hello,nope", "--types: no handler for nope in app:queue"),
    ],
)
def test_a_bad_target_is_one_line_and_exit_2(app: Path, target: str, message: str) -> None:
    out = subprocess.run(
        [*WORKER, *target.split()], cwd=app, env=ENV, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 2
    assert message in out.stderr
    assert "Traceback" not in out.stderr
    if ":" in target and "--types" not in target:
        assert out.stderr.count("\n") == 1, out.stderr  # one line, no usage
    assert not (app / "q").exists()  # no daemon was started


def test_worker_is_a_subcommand_not_a_directory(tmp_path: Path) -> None:
    out = subprocess.run(
        [*WORKER, "--help"], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0 and "--concurrency" in out.stdout
    assert not (tmp_path / "worker").exists()
