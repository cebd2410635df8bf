"""Drive a real `snerdmq` daemon process over its pipes, from trio tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
import trio

SNERDMQ = [sys.executable, "-m", "snerd.cli"]

#: Every daemon a test started; `kill_leftover_daemons` (conftest) kills those still running.
STARTED: list[int] = []


class Daemon:
    """One daemon process; `send` lines, `recv` parsed messages, `stderr` collected."""

    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self.buffer = bytearray()
        self.received: list[dict[str, Any]] = []
        self.stderr = bytearray()
        self._stderr_done = trio.Event()
        #: Set (and replaced) each time stderr grows.
        self._stderr_grew = trio.Event()
        self._send_lock = trio.Lock()

    @classmethod
    async def start(
        cls,
        nursery: trio.Nursery,
        directory: Path,
        env: Mapping[str, str] | None = None,
        args: list[str] | None = None,
    ) -> Daemon:
        full_env = {**os.environ, "SNERD_DRAIN_TIMEOUT": "5", **(env or {})}
        proc = await trio.lowlevel.open_process(
            [*SNERDMQ, *(args or [str(directory)])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=full_env,
        )
        STARTED.append(proc.pid)
        daemon = cls(proc)
        nursery.start_soon(daemon._read_stderr)
        return daemon

    async def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        try:
            while True:
                chunk = await self.proc.stderr.receive_some(65536)
                if not chunk:
                    break
                self.stderr += chunk
                self._stderr_grew.set()
                self._stderr_grew = trio.Event()
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass
        self._stderr_done.set()

    async def wait_stderr(self, text: str, timeout: float = 10.0) -> str:
        """Wait until stderr holds `text`; returns stderr so far. (stderr is read by a task of
        its own, so a line the daemon wrote before a stdout message may be read after it.)"""
        with trio.fail_after(timeout):
            while text not in self.stderr.decode(errors="replace"):
                if self._stderr_done.is_set():
                    raise AssertionError(f"stderr ended without {text!r}: {self.stderr!r}")
                await self._stderr_grew.wait()
        return self.stderr.decode(errors="replace")

    async def send_raw(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        async with self._send_lock:
            await self.proc.stdin.send_all(data)

    async def send(self, message: dict[str, Any]) -> None:
        await self.send_raw(orjson.dumps(message) + b"\n")

    async def recv(self, timeout: float = 10.0) -> dict[str, Any]:
        """The next message from stdout (raises on timeout or EOF)."""
        assert self.proc.stdout is not None
        with trio.fail_after(timeout):
            while b"\n" not in self.buffer:
                chunk = await self.proc.stdout.receive_some(65536)
                if not chunk:
                    raise EOFError(f"daemon stdout closed; stderr: {self.stderr.decode()}")
                self.buffer += chunk
        line, _, rest = bytes(self.buffer).partition(b"\n")
        self.buffer = bytearray(rest)
        message: dict[str, Any] = orjson.loads(line)
        self.received.append(message)
        return message

    async def wait_for(self, pred: Any, timeout: float = 10.0) -> dict[str, Any]:
        """Read messages until one satisfies `pred`."""
        with trio.fail_after(timeout):
            while True:
                message = await self.recv(timeout)
                if pred(message):
                    return message

    async def enqueue(self, task_id: str, task_type: str = "t", **extra: Any) -> None:
        message = {
            "action": "enqueue",
            "task_id": task_id,
            "task_type": task_type,
            "task_data": orjson.dumps(extra.pop("data", {"id": task_id})).decode(),
            "max_retries": extra.pop("max_retries", 0),
            "retry_after_hours": extra.pop("retry_after_hours", 0.0),
            **extra,
        }
        await self.send(message)

    async def close_stdin(self) -> None:
        assert self.proc.stdin is not None
        await self.proc.stdin.aclose()

    def signal(self, signum: int = signal.SIGTERM) -> None:
        self.proc.send_signal(signum)

    async def wait(self, timeout: float = 15.0) -> int:
        with trio.fail_after(timeout):
            code = await self.proc.wait()
            await self._stderr_done.wait()
        return code

    @property
    def alive(self) -> bool:
        """The process has not exited (and is not a zombie already reaped)."""
        return self.proc.returncode is None

    def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
