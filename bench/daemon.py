"""snerd through its wire protocol: the real `snerdmq` process, driven over its pipes.

The client is written to cost the daemon nothing it would not cost any SDK and to measure the
daemon, not itself: messages are prebuilt bytes, the pipes are read and written with raw
`os.read` / `os.write` (no asyncio, no buffering layer), acks are counted on whole lines without
decoding them, and only `execute` lines are decoded (their id and attempt are needed for the
`result`). Output is read in big chunks, so one read takes many acks.

Rows:

- `snerd_enqueue_pipelined`: a window of enqueues in flight (sent as soon as acks make room);
  acks/s. The task type has no handler, so nothing is dispatched: the figure is the enqueue path
  alone (parse, record, group commit, ack).
- `snerd_enqueue_seq`: one enqueue at a time; the latency from the write of the line to the
  read of its ack (so it includes both pipe hops).
- `snerd_e2e`: N no-op jobs end to end: enqueue (windowed), each `execute` answered at once
  with a `result`, until `stats` reports an empty queue (every task's completion record is
  durable). Jobs/s.
- `snerd_exec_latency`: on an idle daemon with a registered handler, the time from writing an
  enqueue to reading its `execute` (two commits in series: the enqueue record, then the
  dispatch record). The result is sent and the daemon left idle before the next sample.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from bench.common import Budget, Latency, Measurement, Rate, Scratch

__all__ = [
    "Daemon",
    "DaemonError",
    "enqueue_line",
    "pipelined",
    "snerd_e2e",
    "snerd_enqueue_pipelined",
    "snerd_enqueue_seq",
    "snerd_exec_latency",
]

_ACK = b'"action":"ack"'
_ERROR = b'"action":"error"'
_EXECUTE = b'{"action":"execute"'


def snerdmq_binary() -> str:
    beside = Path(sys.executable).parent / "snerdmq"
    return str(beside) if beside.exists() else "snerdmq"


def enqueue_line(task_id: str, task_type: str, data: str = '{"n":1}') -> bytes:
    return orjson.dumps(
        {
            "action": "enqueue",
            "task_id": task_id,
            "task_type": task_type,
            "task_data": data,
            "max_retries": 0,
            "retry_after_hours": 0,
        },
        option=orjson.OPT_APPEND_NEWLINE,
    )


class DaemonError(RuntimeError):
    pass


class Daemon:
    """One `snerdmq DIR` child process and its pipes."""

    def __init__(
        self,
        directory: str,
        env: dict[str, str] | None = None,
        command: list[str] | None = None,
        *,
        data: str | None = None,
        name: str = "daemon",
    ) -> None:
        """`directory` holds `<name>.stderr`; the queue is `data` (default `directory/data`),
        so several daemons can share one queue, each with its own stderr file."""
        self.directory = directory
        self.stderr_path = os.path.join(directory, f"{name}.stderr")
        full_env = {**os.environ, "SNERD_FSYNC": "always", **(env or {})}
        with open(self.stderr_path, "wb") as stderr:
            self.proc = subprocess.Popen(
                [*(command or [snerdmq_binary()]), data or os.path.join(directory, "data")],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=full_env,
                bufsize=0,
            )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.wfd = self.proc.stdin.fileno()
        self.rfd = self.proc.stdout.fileno()
        self._rest = b""

    # -- raw pipe I/O ------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self.wfd, view)
            view = view[n:]

    def read_lines(self, timeout: float | None) -> list[bytes]:
        """Whole lines available within `timeout` seconds (at least one read's worth, or [])."""
        if timeout is not None:
            ready, _, _ = select.select([self.rfd], [], [], timeout)
            if not ready:
                return []
        chunk = os.read(self.rfd, 1 << 20)
        if not chunk:
            raise DaemonError(f"daemon closed stdout; stderr: {self.stderr_tail()}")
        data = self._rest + chunk if self._rest else chunk
        end = data.rfind(b"\n")
        if end < 0:
            self._rest = data
            return []
        self._rest = data[end + 1 :]
        return data[:end].split(b"\n")

    def read_chunk(self, timeout: float | None) -> bytes:
        """Like `read_lines`, but the whole lines as one bytes object (for counting)."""
        if timeout is not None:
            ready, _, _ = select.select([self.rfd], [], [], timeout)
            if not ready:
                return b""
        chunk = os.read(self.rfd, 1 << 20)
        if not chunk:
            raise DaemonError(f"daemon closed stdout; stderr: {self.stderr_tail()}")
        data = self._rest + chunk if self._rest else chunk
        end = data.rfind(b"\n")
        self._rest = data[end + 1 :]
        return data[: end + 1]

    def wait_for(self, want: bytes, timeout: float = 30.0) -> dict[str, Any]:
        """Read until a line containing `want`; return it decoded."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.read_lines(max(0.0, deadline - time.monotonic())):
                if want in line:
                    msg: dict[str, Any] = orjson.loads(line)
                    return msg
                if _ERROR in line:
                    raise DaemonError(line.decode())
        raise DaemonError(f"no {want!r} within {timeout} s; stderr: {self.stderr_tail()}")

    def cpu_seconds(self) -> float:
        """User + system CPU time of the daemon process so far (all threads), from /proc."""
        try:
            with open(f"/proc/{self.proc.pid}/stat", encoding="ascii") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return float("nan")
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stderr_tail(self) -> str:
        try:
            with open(self.stderr_path, "rb") as f:
                return f.read()[-2000:].decode("utf-8", "replace")
        except OSError:
            return ""

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> Daemon:
        self.wait_for(b'"action":"membership"')
        return self

    def register(self, task_type: str) -> None:
        self.send(orjson.dumps({"action": "register", "task_type": task_type}) + b"\n")
        self.wait_for(b"Registered handler")

    def stats(self, timeout: float = 30.0) -> dict[str, Any]:
        self.send(b'{"action":"stats"}\n')
        return self.wait_for(b'"action":"stats"', timeout)

    def close(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()  # EOF: the daemon drains and exits 0
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        finally:
            if self.proc.stdout is not None:
                self.proc.stdout.close()

    def __enter__(self) -> Daemon:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None and exc[0] is not None:
            self.proc.kill()
        self.close()


def _check_errors(chunk: bytes) -> None:
    if _ERROR in chunk:
        bad = next(line for line in chunk.split(b"\n") if _ERROR in line)
        raise DaemonError(f"daemon refused a message: {bad.decode()}")


def _warm_up(daemon: Daemon) -> None:
    """64 enqueues, all acked: the first append has opened and created the file and fsynced
    the directory."""
    for i in range(64):
        daemon.send(enqueue_line(f"w{i}", "parked"))
    acked = 0
    while acked < 64:
        chunk = daemon.read_chunk(10.0)
        _check_errors(chunk)
        acked += chunk.count(_ACK)


def snerd_enqueue_pipelined(
    scratch: Scratch, count: int, seconds: float, window: int = 1024
) -> list[Measurement]:
    lines = [enqueue_line(f"p{i}", "parked") for i in range(count)]
    with scratch.directory("snerd-pipelined") as d, Daemon(d) as daemon:
        _warm_up(daemon)
        acked, elapsed, cpu = pipelined(daemon, lines, Budget(count, seconds), window)
    return [Rate("snerd_enqueue_pipelined", acked, elapsed, f"window {window}", cpu)]


def pipelined(
    daemon: Daemon, lines: list[bytes], budget: Budget, window: int
) -> tuple[int, float, float]:
    """Send enqueue `lines` with up to `window` unacknowledged, while `budget` lasts, until
    all sent are acked. Returns (acks, seconds, daemon CPU seconds)."""
    sent = acked = 0
    cpu0 = daemon.cpu_seconds()
    start = time.perf_counter()
    while True:
        room = window - (sent - acked)
        if room > 0 and budget.more(sent):
            k = min(room, len(lines) - sent)
            daemon.send(b"".join(lines[sent : sent + k]))
            sent += k
        if acked == sent:
            break
        chunk = daemon.read_chunk(30.0)
        if not chunk:
            raise DaemonError(f"no ack for 30 s; stderr: {daemon.stderr_tail()}")
        _check_errors(chunk)
        acked += chunk.count(_ACK)
    return acked, time.perf_counter() - start, daemon.cpu_seconds() - cpu0


def snerd_enqueue_batch(
    scratch: Scratch, count: int, seconds: float, size: int = 1000, window: int = 4
) -> list[Measurement]:
    """Enqueues in `enqueue_batch` lines of `size` tasks, up to `window` lines unacknowledged
    (each ack means its task's record is fsynced): acks/s and daemon CPU per task, the
    daemon's cost of a bulk enqueue against the raw loop with one fsync per 64 records."""
    lines = []
    for start in range(0, count, size):
        items = [orjson.loads(enqueue_line(f"b{i}", "parked")) for i in range(start, start + size)]
        for item in items:
            del item["action"]
        lines.append(orjson.dumps({"action": "enqueue_batch", "tasks": items},
                                  option=orjson.OPT_APPEND_NEWLINE))
    with scratch.directory("snerd-batch") as d, Daemon(d) as daemon:
        _warm_up(daemon)
        sent = acked = 0
        budget = Budget(len(lines), seconds)
        cpu0 = daemon.cpu_seconds()
        start = time.perf_counter()
        while True:
            if sent - acked < window * size and budget.more(sent // size) and sent // size < len(lines):
                daemon.send(lines[sent // size])
                sent += size
                continue
            if acked >= sent:
                break
            chunk = daemon.read_chunk(30.0)
            if not chunk:
                raise DaemonError(f"no ack for 30 s; stderr: {daemon.stderr_tail()}")
            _check_errors(chunk)
            acked += chunk.count(_ACK)
        elapsed = time.perf_counter() - start
        cpu = daemon.cpu_seconds() - cpu0
    return [Rate("snerd_enqueue_batch", acked, elapsed, f"lines of {size}, window {window}", cpu)]


def snerd_enqueue_seq(scratch: Scratch, count: int, seconds: float) -> list[Measurement]:
    lines = [enqueue_line(f"s{i}", "parked") for i in range(count)]
    with scratch.directory("snerd-seq") as d, Daemon(d) as daemon:
        for i in range(50):  # warm-up
            daemon.send(enqueue_line(f"w{i}", "parked"))
            daemon.wait_for(_ACK)
        samples: list[float] = []
        budget = Budget(count, seconds)
        perf = time.perf_counter
        send, read = daemon.send, daemon.read_chunk
        n = 0
        while budget.more(n):
            t = perf()
            send(lines[n])
            while True:
                chunk = read(None)
                if _ACK in chunk:
                    break
                _check_errors(chunk)
            samples.append(perf() - t)
            _check_errors(chunk)
            n += 1
    return [Latency("snerd_enqueue_seq", tuple(samples))]


def _results_for(chunk: bytes) -> tuple[bytes, int]:
    """`result` lines answering every `execute` in `chunk`; and how many there were."""
    out: list[bytes] = []
    for line in chunk.split(b"\n"):
        if line.startswith(_EXECUTE):
            msg = orjson.loads(line)
            out.append(
                b'{"action":"result","task_id":%s,"status":"success","attempt":%d}\n'
                % (orjson.dumps(msg["task_id"]), msg["attempt"])
            )
    return b"".join(out), len(out)


def _wait_empty(daemon: Daemon, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        daemon.send(b'{"action":"stats"}\n')
        while True:
            chunk = daemon.read_chunk(30.0)
            _check_errors(chunk)
            if b'"action":"stats"' in chunk:
                break
        line = next(x for x in chunk.split(b"\n") if b'"action":"stats"' in x)
        if orjson.loads(line)["queue_depth"] == 0:
            return
    raise DaemonError("queue did not drain")


def snerd_e2e(scratch: Scratch, count: int, seconds: float, window: int = 1024) -> list[Measurement]:
    lines = [enqueue_line(f"e{i}", "noop") for i in range(count)]
    with scratch.directory("snerd-e2e") as d, Daemon(d) as daemon:
        daemon.register("noop")
        for i in range(20):  # warm-up
            daemon.send(enqueue_line(f"w{i}", "noop"))
        done = 0
        while done < 20:
            chunk = daemon.read_chunk(10.0)
            _check_errors(chunk)
            results, k = _results_for(chunk)
            if results:
                daemon.send(results)
            done += k
        _wait_empty(daemon)
        # Half the budget for enqueueing, as for Huey.
        budget = Budget(count, seconds / 2)
        sent = acked = executed = 0
        cpu0 = daemon.cpu_seconds()
        start = time.perf_counter()
        while True:
            room = window - (sent - acked)
            if room > 0 and budget.more(sent):
                k = min(room, count - sent)
                daemon.send(b"".join(lines[sent : sent + k]))
                sent += k
            if executed == sent and acked == sent:
                break
            chunk = daemon.read_chunk(30.0)
            if not chunk:
                raise DaemonError(f"stalled; stderr: {daemon.stderr_tail()}")
            _check_errors(chunk)
            acked += chunk.count(_ACK)
            results, k = _results_for(chunk)
            if results:
                daemon.send(results)
                executed += k
        _wait_empty(daemon)
        elapsed = time.perf_counter() - start
        cpu = daemon.cpu_seconds() - cpu0
    return [Rate("snerd_e2e", sent, elapsed, f"window {window}", cpu)]


def snerd_exec_latency(scratch: Scratch, count: int, seconds: float) -> list[Measurement]:
    with scratch.directory("snerd-exec") as d, Daemon(d) as daemon:
        daemon.register("noop")
        samples: list[float] = []
        budget = Budget(count, seconds)
        perf = time.perf_counter
        n = 0
        warm = 20
        while budget.more(n - warm) or n < warm:
            line = enqueue_line(f"x{n}", "noop")
            t = perf()
            daemon.send(line)
            while True:
                chunk = daemon.read_chunk(10.0)
                if not chunk:
                    raise DaemonError(f"no execute in 10 s; stderr: {daemon.stderr_tail()}")
                _check_errors(chunk)
                if _EXECUTE in chunk:
                    break
            lat = perf() - t
            results, _ = _results_for(chunk)
            daemon.send(results)
            if n >= warm:
                samples.append(lat)
            n += 1
            # Let the completion commit and the daemon go idle before the next sample.
            time.sleep(0.002)
    return [Latency("snerd_exec_latency", tuple(samples))]
