"""Module-level task handlers for the process-isolation tests: a child process forked from the
forkserver finds them by module and name (`snerd.sdk.isolation.forkable`)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from snerd import current_task, yield_progress


def overstay(data: dict[str, Any]) -> dict[str, Any]:
    """Attempt 1: say its pid, then outlive any deadline and write `late` (which must never
    happen: the process is killed first). Later attempts: check that attempt 1's process is
    gone, and return at once."""
    folder = Path(data["dir"])
    attempt = current_task().attempt
    if attempt == 1:
        (folder / "pid-1").write_text(str(os.getpid()))
        yield_progress({"started": attempt, "pid": os.getpid()})
        time.sleep(data.get("sleep", 30))
        (folder / "late").write_text("attempt 1 ran past its end")
        return {"attempt": attempt}
    first = int((folder / "pid-1").read_text())
    try:
        os.kill(first, 0)
        prior_alive = True
    except ProcessLookupError:
        prior_alive = False
    return {"attempt": attempt, "prior_alive": prior_alive, "pid": os.getpid()}


def boom(data: dict[str, Any]) -> None:
    """Fail with the text in `data`."""
    raise OSError(data["text"])


def refuse(data: dict[str, Any]) -> None:
    """Fail for good (no retry)."""
    from snerd import FinalError

    raise FinalError(data["text"])


# Task functions (`@queue.task`), found by a child process through their module and name
# (`snerd.sdk.tasks.TaskHandler`). The queue here is only their registry: a test registers
# their handlers on a queue of its own.
from snerd import SnerdQueue  # noqa: E402

tasks = SnerdQueue()


@tasks.task(name="overstay_task", never_retry=(ValueError,))
def overstay_task(dir: str, sleep: float = 30, bad: bool = False) -> dict[str, Any]:
    """`overstay` as a task function; with `bad`, a ValueError (never retried)."""
    if bad:
        raise ValueError("not a number")
    return overstay({"dir": dir, "sleep": sleep})
