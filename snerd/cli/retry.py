"""`snerdmq retry ID DIR`: put a dead-lettered or cancelled task back in the queue, live.

Sent like `cancel` (`snerd.cli.cancel` holds the shared flags and printing); the owner of the
task's shard writes the task back with its attempts reset (`snerd.core.node.control`).
"""

from __future__ import annotations

from collections.abc import Sequence

from snerd import commands
from snerd.cli.cancel import task_command

__all__ = ["main"]


def main(argv: Sequence[str]) -> int:
    """`snerdmq retry ID DIR [--wait S] [--json]`."""
    return task_command(
        "retry",
        "Put the dead-lettered or cancelled task ID of the queue in DIR back in the queue, "
        "its attempts reset and the same task data, due now. Decided by the daemon that owns "
        "the task's shard, reached through the shard inboxes; safe while daemons run "
        "(`snerdmq replay` puts back many at once).",
        argv,
        lambda directory, task_id, wait: commands.retry(directory, task_id, wait),
    )
