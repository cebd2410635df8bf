"""Module-level task handlers for the process-isolation tests: a child process forked from the
forkserver finds them by module and name (`snerd.sdk.isolation.forkable`)."""

from __future__ import annotations

import os
import sys
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


def announce_then_sleep(data: dict[str, Any]) -> int:
    """Print `started <id>` on stderr (what a test awaits), sleep `seconds` unless the file
    `quick` exists in `dir`, then write `done-<id>` there; return its pid."""
    folder = Path(data["dir"])
    task = current_task()
    print(f"started {task.task_id} attempt {task.attempt} pid {os.getpid()}", file=sys.stderr, flush=True)
    if not (folder / "quick").exists():
        time.sleep(data["seconds"])
    with open(folder / f"done-{task.task_id}", "a") as out:
        out.write(f"{task.attempt}\n")
    return os.getpid()


def boom(data: dict[str, Any]) -> None:
    """Fail with the text in `data`."""
    raise OSError(data["text"])
