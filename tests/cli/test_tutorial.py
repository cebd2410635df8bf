"""The five-minute tutorial of docs/python.md runs as written: its two files (`tasks.py`, the
web app `app.py`), a real `snerdmq worker tasks:queue` and the app serving one request; the
worker prints the handler's line and its job line, and stops cleanly on SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import httpx

PAGE = Path(__file__).resolve().parents[2] / "docs" / "python.md"
ENV = {
    **os.environ,
    "SNERD_INBOX_IDLE_POLL_MS": "50",
    "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")]
    ),
}


def tutorial_files() -> dict[str, str]:
    """The `py` blocks of the page that start with `# <file name>`."""
    files = {}
    for body in re.findall(r"```py\n(.*?)```", PAGE.read_text(), re.S):
        name = re.match(r"# (\w+\.py)", body)
        if name:
            files[name.group(1)] = body
    return files


async def _line(stream: anyio.abc.ByteReceiveStream, pattern: str, seen: list[str]) -> str:
    buffer = b""
    while True:
        buffer += await stream.receive()
        *lines, buffer = buffer.split(b"\n")
        for raw in lines:
            line = raw.decode(errors="replace")
            seen.append(line)
            if re.search(pattern, line):
                return line


async def test_the_tutorial_runs_as_written(tmp_path: Path) -> None:
    files = tutorial_files()
    assert set(files) == {"tasks.py", "app.py"}
    for name, body in files.items():
        (tmp_path / name).write_text(body)
    # The app on a free port (the page's listens on 8000): the same module, served here.
    serve = tmp_path / "serve.py"
    serve.write_text(
        "from wsgiref.simple_server import make_server\n"
        "from app import app\n"
        "server = make_server('127.0.0.1', 0, app)\n"
        "print(server.server_address[1], flush=True)\n"
        "server.serve_forever()\n"
    )
    seen: list[str] = []
    worker = await anyio.open_process(
        [sys.executable, "-m", "snerd.cli", "worker", "tasks:queue", "--log-level", "info"],
        cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    web = subprocess.Popen([sys.executable, str(serve)], cwd=tmp_path, env=ENV,
                           stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout is not None and web.stdout is not None
        with anyio.fail_after(60):
            await _line(worker.stdout, r"ready", seen)
            port = int(await anyio.to_thread.run_sync(web.stdout.readline))
            async with httpx.AsyncClient() as client:
                reply = await client.get(f"http://127.0.0.1:{port}/ada@example.com")
            assert reply.status_code == 202 and reply.text.startswith("queued "), reply.text
            await _line(worker.stdout, r"welcome mail to ada@example\.com", seen)
            job = await _line(worker.stdout, r"job id=.*type=send_welcome", seen)
            assert "outcome=succeeded" in job, job
            os.killpg(worker.pid, signal.SIGTERM)
            assert await worker.wait() == 0, "\n".join(seen[-20:])
    finally:
        web.kill()
        web.wait()
        if worker.returncode is None:
            os.killpg(worker.pid, signal.SIGKILL)
            await worker.wait()
