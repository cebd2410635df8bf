"""The SDK's daemon runs in a session of its own: a signal to the application's process group
(a terminal's Ctrl-C, `kill -- -PGID`, a supervisor's group stop) reaches the application
only. An application that dies of it leaves its daemon only the end of its stdin, on which it
exits at once (no result can come). Had the daemon got the signal too, it would drain and
then wait its whole drain timeout for results of attempts nobody runs any more.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio

APP = """
import sys, anyio
from snerd import SnerdQueue

async def main():
    queue = SnerdQueue(storage_path=sys.argv[1], drain_timeout=30)

    @queue.handler("block")
    async def block(data):
        print("running", queue.pid, flush=True)
        await anyio.sleep_forever()

    async with queue:
        await queue.enqueue("b1", "block", {})
        await anyio.sleep_forever()

anyio.run(main)
"""


async def test_a_group_sigterm_that_kills_the_app_lets_its_daemon_exit_at_once(
    tmp_path: Path,
) -> None:
    (tmp_path / "app.py").write_text(APP)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    async with await anyio.open_process(
        [sys.executable, str(tmp_path / "app.py"), str(tmp_path / "q")],
        env=env,
        stdin=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    ) as app:
        assert app.stdout is not None
        with anyio.fail_after(20):
            line = b""
            async for chunk in app.stdout:
                line += chunk
                if b"\n" in line:
                    break
        daemon = int(line.split()[1])
        pidfd = os.pidfd_open(daemon)
        os.killpg(app.pid, signal.SIGTERM)  # Python's default: the app dies on the spot
        assert await app.wait() == -signal.SIGTERM
        try:
            with anyio.fail_after(10):  # its drain timeout is 30 s
                await anyio.wait_readable(pidfd)
        finally:
            os.close(pidfd)
