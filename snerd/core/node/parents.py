"""Dependencies: children (`trigger_after_ids`) waiting on their parents, wherever those are.

A child is held (state `BLOCKED`, no attempt used) until every parent has completed. Each
parent is judged where it can be known:

- a live task of this node: the child waits, and `parent_finished` ends the wait when that
  task ends here;
- a task this node saw finish in a shard it owns (the shard's history, `ShardInfo.history`,
  which compaction keeps): done if it succeeded; a dead-lettered or cancelled one fails the
  child through;
- anything else (a parent in a shard another daemon owns, one still in an inbox, one that
  finished before this node took its shard, or one nobody ever enqueued): the child waits and
  the parent is **watched** (`snerd.core.watch.TaskWatch`): the node reads every shard's files
  for it, every `watch_poll_us`, and acts on what they say. Completed: the wait ends. Dead
  (dead-lettered or cancelled), by a scan begun after the child began to wait that read
  every file to its end: the child is dead-lettered with `blocked_by_failed_parent: <id>`.
  Live: the child waits.
  Unknown (a whole pass over the queue's files found no record of it): the child waits
  `unknown_parent_wait_us` for it to appear, and is dead-lettered with
  `unknown_parent: <id>` only once a look at the files begun after that still finds none (a
  slow filesystem that delays the looks delays the verdict, never makes it on stale news).

A retry puts a dead letter (or a cancelled task) back: its children failed through meanwhile
stay dead letters (retry them too), and a child judged after it waits for its new run. So
nothing here takes "dead" for final: a history counts only while its shard is owned, and the
watch's dead only as the scan that read it says it (`_known`); a completion is final.

A dead-lettered child fails its own children in turn (`TaskBook.finished`). State is in memory
only: after a restart or a takeover the replay blocks each child again and the parents are
judged afresh, from the files.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from snerd.core import events as ev
from snerd.core.node.model import (
    ACTIVE,
    BLOCKED,
    FINISHING,
    NODE_RUNNING,
    SECOND,
    Task,
    require,
)
from snerd.core.ownership import shard_name
from snerd.core.schema import OUTCOME_COMPLETED, OUTCOME_DEAD
from snerd.core.watch import COMPLETED, DEAD, LIVE, UNKNOWN, TaskWatch

if TYPE_CHECKING:
    from snerd.core.node.node import Node

__all__ = ["CYCLE", "FAILED_PARENT", "PARENT_ERRORS", "UNKNOWN_PARENT", "Parents"]

#: The error a child is dead-lettered with, followed by the parent's id.
FAILED_PARENT = "blocked_by_failed_parent: "
UNKNOWN_PARENT = "unknown_parent: "
CYCLE = "dependency_cycle_through: "
#: Every error a child is failed through with, before any attempt of it ran.
PARENT_ERRORS = (FAILED_PARENT, UNKNOWN_PARENT, CYCLE)


class Parents:
    """Who waits on whom, and the watch of the parents this node does not hold."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.config = node.config
        self.out = node.outbox
        #: Parent id -> the blocked children waiting on it.
        self.children: dict[str, set[str]] = {}
        #: Blocked child id -> the parents it still waits on (never empty).
        self.blockers: dict[str, set[str]] = {}
        #: Blocked child id -> when it began to wait (mono): a scan that says a parent is
        #: dead fails only the children that waited before the scan began.
        self.held_at: dict[str, int] = {}
        self.watch = TaskWatch(fence=self.config.fence)
        #: A `ScanQueue` is out; when the next one is due (mono).
        self.scanning = False
        self.scan_at_mono = 0
        self.scan_began_mono = 0
        #: Watched parents the files hold no record of: since when (mono).
        self.unknown_since: dict[str, int] = {}
        #: The errors the last scan met, each said once while it lasts.
        self.errors: set[tuple[int, str]] = set()

    # -- timers (`Node.timers`)

    def invariants(self) -> None:
        """Each waiting child is a blocked task waiting on each parent it names here, and
        each parent's children wait on it."""
        tasks = self.node.book.tasks
        for child, parents in self.blockers.items():
            task = tasks.get(child)
            require(task is not None and task.state is BLOCKED, f"{child} waits, not blocked")
            require(bool(parents), f"{child} waits on no parent")
            for parent in parents:
                require(child in self.children.get(parent, ()), f"{child} not under {parent}")
        for parent, children in self.children.items():
            require(bool(children), f"parent {parent} has no child listed")
            for child in children:
                require(parent in self.blockers.get(child, ()), f"{parent}: {child} not waiting")
        for task in tasks.values():
            if task.state is BLOCKED:
                require(task.task_id in self.blockers, f"{task.task_id} blocked, waits on none")
        require(self.held_at.keys() == self.blockers.keys(), "held_at is not the blocked ones")

    def scan_due(self) -> int | None:
        """When to read the queue's files for watched parents next (mono): None while a read
        is out, nothing is watched, or the node is not running."""
        if self.scanning or self.node.phase is not NODE_RUNNING or not self._watched():
            return None
        if not self.watch.caught_up():
            return 0  # a pass goes on, or new parents wait for one: at once
        return self.scan_at_mono

    def scan_fire(self, now: ev.Now) -> None:
        at = self.scan_due()
        if at is not None and now.mono >= at:
            self.watch.want(self._watched())
            self.scanning = True
            self.scan_began_mono = now.mono
            shards = self.node.tenure.shard_count()
            self.out.emit(self.watch.request(shards, self.config.watch_read_bytes))

    # -- the rule

    def hold(self, task: Task) -> bool:
        """A child whose record is durable: block it on the parents it must wait for (True),
        or say it may run (False). A parent known to have been dead-lettered fails it at once
        (True: it is on its way out)."""
        book = self.node.book
        waiting: set[str] = set()
        failed = None
        for parent in task.trigger_after_ids:
            outcome = self._known(parent)
            if outcome == LIVE:
                waiting.add(parent)
            elif outcome == DEAD:
                failed = parent
            elif outcome is None and not self.config.unsafe_absent_parents_done:
                waiting.add(parent)
        if failed is None and not waiting:
            return False
        book.move(task, BLOCKED)
        if failed is not None:
            self._fail(task, f"{FAILED_PARENT}{failed}")
            return True
        self.blockers[task.task_id] = waiting
        self.held_at[task.task_id] = self.node.now.mono
        for parent in waiting:
            self.children.setdefault(parent, set()).add(task.task_id)
        return True

    def parent_finished(self, parent: str, outcome: str) -> None:
        """A task of this node ended (`OUTCOME_COMPLETED`, `OUTCOME_DEAD`, `OUTCOME_CANCELLED`): its children go on
        or fail through."""
        if parent not in self.children:
            return
        if outcome != OUTCOME_COMPLETED:  # dead-lettered or cancelled
            self._fail_children(parent, f"{FAILED_PARENT}{parent}")
        else:
            self._release(parent)

    def recheck(self) -> None:
        """After shards were loaded: a parent a child waits on may be in a history now."""
        for parent in list(self.children):
            outcome = self._known(parent)
            if outcome == COMPLETED:
                self._release(parent)
            elif outcome == DEAD:
                self._fail_children(parent, f"{FAILED_PARENT}{parent}")

    def forget(self, task_id: str) -> None:
        """`task_id` left this node without ending (its shard was given back or lost)."""
        self.held_at.pop(task_id, None)
        for parent in self.blockers.pop(task_id, ()):
            children = self.children[parent]
            children.discard(task_id)
            if not children:
                del self.children[parent]
                self.unknown_since.pop(parent, None)

    def on_scanned(self, event: ev.QueueScanned) -> None:
        self.scanning = False
        self.scan_at_mono = self.node.now.mono + self.config.watch_poll_us
        errors = set(event.errors)
        for shard, text in sorted(errors - self.errors):
            self.out.log(
                "warning",
                f"watching parents: {shard_name(shard)}: {text} (said once while it lasts; a "
                "parent only there is unknown meanwhile)",
            )
        self.errors = errors
        self.watch.scanned(event)
        tasks = self.node.book.tasks
        wait = self.config.unknown_parent_wait_us
        # Every parent waited on, not only those whose state changed: a child blocked on a
        # parent the watch had already found completed (and kept watching) hears no change.
        for parent in sorted(self.children):
            state = self.watch.state(parent) if parent in self.watch.ids else None
            if parent in tasks:
                self.unknown_since.pop(parent, None)
                continue
            if state is None or parent not in self.children:
                continue
            if state == COMPLETED:
                self._release(parent)
            elif state == DEAD:
                if not self.watch.more:
                    # Every file read to its end by this scan, begun after these children
                    # began to wait: dead now, not before a retry put it back.
                    self._fail_children(
                        parent, f"{FAILED_PARENT}{parent}", waiting_since=self.scan_began_mono
                    )
            elif state == UNKNOWN:
                since = self.unknown_since.setdefault(parent, self.node.now.mono)
                if since + wait <= self.scan_began_mono and not self.watch.more:
                    # Still nowhere in a look at the files begun after the wait ran out.
                    del self.unknown_since[parent]
                    self._fail_children(
                        parent,
                        f"{UNKNOWN_PARENT}{parent} (no shard holds it after {wait // SECOND} s)",
                    )
            else:
                self.unknown_since.pop(parent, None)
                self._break_cycles(parent)

    # -- the parts

    def _known(self, parent: str) -> str | None:
        """What this node knows of `parent`: LIVE, COMPLETED, DEAD, or None (nothing): from
        its tasks, the histories of the shards it owns, or the watch (a completion only).

        A dead letter (or a cancelled task) is not final: a retry may put it back, on
        whichever node owns its shard. So a shard's history counts only while this node owns
        it (what it left in the history of a shard given up is not the log's word any more:
        the next owner may have retried the task), and the watch's word that a parent is
        dead is acted on only by the scan that read it (`on_scanned`), for the children that
        waited before that scan began; a completion is final, and the watch's word on it
        counts however old."""
        if parent in self.node.book.tasks:
            return LIVE
        for info in self.node.shards.values():
            entry = info.history.get(parent) if info.phase is ACTIVE else None
            if entry is not None:
                return COMPLETED if entry[1] == OUTCOME_COMPLETED else DEAD
        if parent in self.watch.ids and self.watch.state(parent) == COMPLETED:
            return COMPLETED
        return None

    def _watched(self) -> list[str]:
        tasks = self.node.book.tasks
        return [p for p in self.children if p not in tasks]

    def _break_cycles(self, parent: str) -> None:
        """`parent` is live elsewhere: a child of it that it waits on in turn (a cycle no single
        node could see at enqueue, each part enqueued on another) can never run; it is
        dead-lettered, and the rest of the cycle fails through it."""
        book = self.node.book
        for child_id in sorted(self.children.get(parent, ())):
            if child_id in self.blockers and book.cycle(child_id, (parent,)) is not None:
                self.forget(child_id)
                self._fail(book.tasks[child_id], f"{CYCLE}{parent}")

    def _release(self, parent: str) -> None:
        self.unknown_since.pop(parent, None)
        book = self.node.book
        for child_id in sorted(self.children.pop(parent, ())):
            parents = self.blockers[child_id]
            parents.discard(parent)
            if not parents:
                del self.blockers[child_id]
                del self.held_at[child_id]
                book.unblock(book.tasks[child_id])

    def _fail_children(self, parent: str, error: str, waiting_since: int | None = None) -> None:
        """Fail `parent`'s children through (only those that began to wait by
        `waiting_since`, when given)."""
        self.unknown_since.pop(parent, None)
        tasks = self.node.book.tasks
        failed = sorted(self.children.get(parent, ()))
        if waiting_since is not None:
            failed = [c for c in failed if self.held_at[c] <= waiting_since]
        for child_id in failed:
            self.forget(child_id)
            self._fail(tasks[child_id], error)

    def _fail(self, task: Task, error: str) -> None:
        book = self.node.book
        task.attempt = task.retry_count + 1
        book.move(task, FINISHING)
        book.finish(task, OUTCOME_DEAD, error)
