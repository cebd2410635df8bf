"""The settings of one run, drawn from its seed (swarm testing), and the units they are in.

`Settings.draw(seed)` turns whole fault kinds on or off per seed and draws their strengths,
so that one campaign of seeds covers worlds with few kinds of fault as well as worlds with
many (swarm testing: a fault that masks another is off in some runs). Every value is drawn
whether or not it is given, so that overriding one setting leaves the others as they were.
`Settings.forced` builds the world each negative control needs in order to be seen.

The module also owns the units every part of the world counts in (`SECOND`, `WALL_ORIGIN`)
and the two draws they all make (`uniform`, `exp`). Draws use only `random()`, whose sequence
Python promises across versions, so that one seed builds one world everywhere. This module
never looks at a world: a setting is decided before the world exists.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, fields
from typing import Any

__all__ = ["SECOND", "WALL_ORIGIN", "Settings", "exp", "uniform"]

SECOND = 1_000_000
#: True time 0 is this wall time (2027), so clock offsets never make a wall clock negative.
WALL_ORIGIN = 1_800_000_000 * SECOND


def exp(rng: random.Random, rate_per_s: float) -> int:
    """An exponential wait in µs for a Poisson process of `rate_per_s` (from `random()` only)."""
    return max(1, int(-math.log(1.0 - rng.random()) / rate_per_s * SECOND))


def uniform(rng: random.Random, lo: int, hi: int) -> int:
    """An int in [lo, hi] (from `random()` only); `lo` when the range is empty."""
    return lo + int(rng.random() * (hi - lo + 1)) if hi > lo else lo


def _safe_ppm(ttl_us: int, margin_us: int) -> int:
    """The largest clock rate error (ppm) the margin tolerates: r <= margin / (2 ttl + margin)
    (docs/architecture.md, "What it relies on")."""
    return margin_us * 1_000_000 // (2 * ttl_us + margin_us)


def _draw_commands(seed: int) -> dict[str, Any]:
    """The job-control settings of seed `seed`, from a generator of their own: adding them
    left every other draw of every seed as it was. Commands in about 40 % of the worlds,
    those with dependencies too (a cancelled parent fails its children through, a retried
    one is waited on again: `sim.check.deps`)."""
    rng = random.Random(f"commands-{seed}")
    on = rng.random() < 0.4
    rate = 0.2 + rng.random() * 1.3
    cancellable = rng.random() < 0.5
    return {"command_rate": rate if on else 0.0, "cancellable": cancellable}


def _draw_batches(seed: int) -> dict[str, Any]:
    """The bulk-enqueue settings of seed `seed`, from a generator of their own (as
    `_draw_commands`): batches in about 30 % of the worlds."""
    rng = random.Random(f"batches-{seed}")
    on = rng.random() < 0.3
    prob = 0.2 + rng.random() * 0.6
    size = 2 + int(rng.random() * 7)
    return {"batch_prob": prob if on else 0.0, "batch_max": size}


def _draw_backoff(seed: int) -> dict[str, Any]:
    """Retry waits of the tasks' own, from a generator of their own: in about 30 % of the
    worlds some tasks wait 0.2-3 s between attempts, a share of them with an exponential
    policy and a cap (`sim.workload`, check 4c)."""
    rng = random.Random(f"backoff-{seed}")
    on = rng.random() < 0.3
    prob = 0.3 + rng.random() * 0.7
    return {"backoff_prob": prob if on else 0.0}


def _draw_finals(seed: int) -> dict[str, Any]:
    """How often a failure is final (`"retry": false`), from a generator of its own: in about
    30 % of the worlds."""
    rng = random.Random(f"finals-{seed}")
    on = rng.random() < 0.3
    prob = 0.2 + rng.random() * 0.6
    return {"final_prob": prob if on else 0.0}


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Everything one run depends on besides its seed; drawn from the seed unless given."""

    seed: int
    nodes: int = 3
    shards: int = 4
    #: Most world events in the safety phase (it also ends after `safety_us`).
    steps: int = 40_000
    safety_us: int = 120 * SECOND
    #: In the liveness phase, a stall this long (acked tasks unfinished and no record written,
    #: or ownership unsettled) is a liveness failure; `liveness_us` bounds the phase overall.
    stall_us: int = 120 * SECOND
    liveness_us: int = 3600 * SECOND
    ttl_us: int = 6 * SECOND
    margin_us: int = 1 * SECOND
    # clocks
    offset_max_us: int = 0
    drift_max_ppm: int = 0
    step_rate: float = 0.0
    step_max_us: int = 0
    # processes
    crash_rate: float = 0.0
    pause_rate: float = 0.0
    pause_max_us: int = 0
    # filesystem
    fs_mode: str = "posix"
    torn_prob: float = 0.0
    enospc_rate: float = 0.0
    membership_fail_prob: float = 0.0
    membership_unknown_prob: float = 0.0
    #: Episodes in which one process cannot reach membership.json at all (a partition, a
    #: hung mount): per second, each up to `outage_max_us`.
    outage_rate: float = 0.0
    outage_max_us: int = 0
    lock_loss_rate: float = 0.0
    lock_loss_silent_prob: float = 0.0
    slow_io_prob: float = 0.0
    slow_io_max_us: int = 0
    # workload
    enqueue_rate: float = 5.0
    fail_prob: float = 0.1
    slow_prob: float = 0.1
    #: Tasks enqueued with a hard timeout (`max_execution_seconds`, 1-4 s), and the chance that
    #: a handler of such a task hangs past it (its result comes far too late and is refused).
    timeout_prob: float = 0.0
    hang_prob: float = 0.0
    retries_max: int = 3
    group_prob: float = 0.1
    dedupe_prob: float = 0.1
    delay_prob: float = 0.1
    urgency_prob: float = 0.3
    #: The chance an enqueue goes to any live process rather than the shard's owner named in
    #: membership.json (which may not own it yet, or any more): such a process writes the task
    #: into its inbox for the shard, and the owner ingests it.
    route_any_prob: float = 0.2
    #: How often owners read their shards' inboxes (`NodeConfig.inbox_poll_us`), and how much
    #: of one inbox file one read takes (`NodeConfig.inbox_read_bytes`; small values make the
    #: owner ingest a file in several chunks).
    inbox_poll_us: int = 100_000
    inbox_idle_poll_us: int = 1_000_000
    inbox_read_bytes: int = 4 * 1024 * 1024
    #: A writer starts a new inbox file (segment) once one holds this much, and removes the
    #: closed ones once their owner's `.read` hint says they are ingested in full
    #: (`NodeConfig.inbox_segment_bytes`; small values exercise that clean-up).
    inbox_segment_bytes: int = 16 * 1024 * 1024
    #: When set, the SDK client holds an enqueue line up to this long and writes it with the
    #: ones that follow meanwhile: the daemon reads them together, as one `LinesReceived` (the
    #: node's batch path for runs of plain enqueues). 0: each line on its own.
    line_burst_us: int = 0
    #: Nodes told that a free shard lock proves its claimant gone (`lock_proves_liveness`,
    #: what the daemon decides on a local filesystem): they try the locks of what others
    #: claim and take a dead owner's shard without waiting for its lease. Only where locks
    #: are never lost behind a live holder's back (POSIX, no lock-loss faults).
    lock_probe: bool = False
    #: Every node's SNERD_MAX_SHARDS (None: no cap). Drawn for some seeds, never below
    #: ceil(shards / nodes), so that the nodes can hold every shard once all of them run
    #: (liveness); the world checks that no node ever holds more (`_check_cap`).
    max_shards: int | None = None
    #: The chance a task waits for parents (`trigger_after_ids`, `sim.workload`); 0: no task
    #: does, and the workload makes no draw for them.
    deps_prob: float = 0.0
    #: How long a node waits for a parent no file holds before it dead-letters the child
    #: (`NodeConfig.unknown_parent_wait_us`): shorter than the daemon's minute, so that runs
    #: see it end.
    unknown_parent_wait_us: int = 10 * SECOND
    #: Finished tasks each compaction keeps per log (`NodeConfig.history_limit`): few, so
    #: that compaction often drops some, but the daemon's 10,000 in worlds with dependencies
    #: (0: by `deps_prob`). Retention is by count: once a finished parent's tombstone is
    #: compacted away, a child enqueued later is judged without it (docs/simulation.md).
    history_limit: int = 0
    #: Named schedules in the workload (0-2, `sim.workload`): each declared at boot by several
    #: nodes, with a cron of a few seconds; 0: none, and the workload draws nothing for them.
    schedules: int = 0
    #: Job-control commands per second (`cancel`, `retry`, `pause`/`resume`, `sim.commands`),
    #: sent to any live process; 0: none, the workload keeps one task type and draws nothing
    #: for them. Drawn from a generator of its own (`_draw_commands`), so that the other
    #: settings of every seed stay as they were.
    command_rate: float = 0.0
    #: The second task type's handler registers `cancellable` (a cancelled running attempt
    #: is told to stop, `StopAttempt`).
    cancellable: bool = False
    #: How often a producer sends an `enqueue_batch` line of 2 to `batch_max` tasks instead
    #: of one `enqueue` (`sim.workload`); 0: never, and nothing is drawn for it. Drawn from a
    #: generator of its own (`_draw_batches`).
    batch_prob: float = 0.0
    batch_max: int = 2
    #: Of the handlers' failures, how many their SDK marks final (`"retry": false`: no retry
    #: whatever attempts are left; check 4b). Drawn from a generator of its own.
    final_prob: float = 0.0
    #: How many tasks wait between attempts (`retry_after_hours` 0.2-3 s), half of them with
    #: an exponential `backoff` and a `backoff_max_seconds`; 0: every task retries at once.
    #: Drawn from a generator of its own.
    backoff_prob: float = 0.0
    # negative controls
    unsafe_no_margin: bool = False
    unsafe_no_fence: bool = False
    unsafe_wall_clock_only: bool = False
    #: The nodes run without their cap, which the world still checks: it must catch them.
    unsafe_no_cap: bool = False
    #: A parent that is not a live task of the child's node counts as done
    #: (`NodeConfig.unsafe_absent_parents_done`, the rule the task watch replaced).
    unsafe_absent_parents_done: bool = False
    #: An enqueue with dedupe through another node's inbox is acked at its write, before the
    #: owner decided (`NodeConfig.dedupe_wait_us = 0`, upstream's behaviour).
    unsafe_dedupe_ack_at_write: bool = False
    #: A schedule's runs are written with its record still naming the tick before, so a new
    #: owner fires those ticks again (`NodeConfig.unsafe_fire_unmarked`).
    unsafe_fire_unmarked: bool = False
    #: A success's tombstone stores a result its handler did not return
    #: (`NodeConfig.unsafe_wrong_result`).
    unsafe_wrong_result: bool = False
    #: A cancel of a live task is answered `cancelled: true` and leaves the task as it was
    #: (`NodeConfig.unsafe_ignore_cancel`).
    unsafe_ignore_cancel: bool = False
    #: Dispatch does not look at pause marks (`NodeConfig.unsafe_ignore_pause`).
    unsafe_ignore_pause: bool = False
    #: A purge forgets every ended task, succeeded ones included, whenever they finished
    #: (`NodeConfig.unsafe_purge_all`).
    unsafe_purge_all: bool = False
    #: A retry of a type's dead letters leaves the oldest where it is
    #: (`NodeConfig.unsafe_retry_skips_oldest`).
    unsafe_retry_skips_oldest: bool = False
    #: Each task of an `enqueue_batch` line is acked as it is read, before its record is
    #: durable (`NodeConfig.unsafe_batch_ack_early`).
    unsafe_batch_ack_early: bool = False
    #: A failure marked final is retried as any other (`NodeConfig.unsafe_retry_final`).
    unsafe_retry_final: bool = False
    #: Retries wait the daemon's policy, ignoring the task's (`NodeConfig.unsafe_ignore_task_backoff`).
    unsafe_ignore_task_backoff: bool = False
    #: Build the world of this negative control without its unsafe switch (its safe twin):
    #: "no-margin", "no-fence", "wall-clock-only", "no-cap", "absent-parents-done",
    #: "dedupe-ack-at-write", "fire-unmarked", "wrong-result", "ignore-cancel",
    #: "ignore-pause", "purge-all", "retry-skips-oldest", "batch-ack-early", "retry-final",
    #: "ignore-task-backoff" or "nfsv3".
    faults_of: str = ""

    @classmethod
    def draw(cls, seed: int, **given: Any) -> Settings:
        """The settings of seed `seed`, swarm style: each fault kind is on in about half the
        runs, with its strength drawn too. Every value is drawn whether or not it is `given`,
        so overriding one setting does not change the others."""
        rng = random.Random(seed)

        def on(p: float = 0.5) -> bool:
            return rng.random() < p

        def pick(lo: float, hi: float) -> float:
            return lo + rng.random() * (hi - lo)

        ttl_choices = (2 * SECOND, 5 * SECOND, 30 * SECOND)
        ttl = ttl_choices[int(rng.random() * len(ttl_choices))]
        margin = ttl // 6
        # Rates within what the margin tolerates: r <= margin / (2 ttl + margin).
        safe_ppm = _safe_ppm(ttl, margin)
        drawn: dict[str, Any] = {
            "nodes": 2 + int(rng.random() * 4),
            "shards": 1 + int(rng.random() * 8),
            "ttl_us": ttl,
            "margin_us": margin,
            "safety_us": min(ttl * 20, 300 * SECOND),
            "stall_us": 120 * SECOND + 4 * ttl,
            "offset_max_us": int(pick(0, 30) * SECOND) if on() else 0,
            "drift_max_ppm": int(pick(0.1, 1.0) * safe_ppm) if on() else 0,
            "step_rate": pick(0.005, 0.05) if on(0.3) else 0.0,
            "step_max_us": int(pick(1, 120) * SECOND),
            "crash_rate": pick(0.005, 0.05) if on() else 0.0,
            "pause_rate": pick(0.005, 0.05) if on() else 0.0,
            "pause_max_us": int(pick(0.2, 3.0) * ttl),
            "fs_mode": "posix",
            "torn_prob": pick(0.2, 1.0) if on() else 0.0,
            "enospc_rate": pick(0.002, 0.02) if on(0.3) else 0.0,
            "membership_fail_prob": pick(0.01, 0.3) if on() else 0.0,
            "membership_unknown_prob": pick(0.01, 0.2) if on(0.3) else 0.0,
            "outage_rate": pick(0.005, 0.05) if on(0.3) else 0.0,
            "outage_max_us": int(pick(0.5, 3.0) * ttl),
            "lock_loss_rate": pick(0.005, 0.05) if on(0.3) else 0.0,
            "lock_loss_silent_prob": rng.random(),
            "slow_io_prob": pick(0.001, 0.05) if on() else 0.0,
            "slow_io_max_us": int(pick(0.1, 1.5) * ttl),
            "enqueue_rate": pick(1.0, 6.0),
            "fail_prob": pick(0.0, 0.3),
            "slow_prob": pick(0.0, 0.3),
            "timeout_prob": pick(0.0, 0.3) if on() else 0.0,
            "hang_prob": pick(0.05, 0.5),
            "retries_max": int(rng.random() * 4),
            "group_prob": pick(0.0, 0.15),
            "dedupe_prob": pick(0.0, 0.2),
            "delay_prob": pick(0.0, 0.2),
            "urgency_prob": pick(0.0, 0.5),
            # Drawn last, so that adding them left every earlier draw of a seed as it was.
            "route_any_prob": 0.2 if on() else pick(0.0, 1.0),
            # The daemon's default poll (100 ms) in some runs; slower ones cost fewer events.
            "inbox_poll_us": 100_000 if on(0.3) else int(pick(0.1, 2.0) * SECOND),
            "inbox_read_bytes": int(pick(200, 4_000)) if on(0.3) else 4 * 1024 * 1024,
            "inbox_segment_bytes": int(pick(300, 8_000)) if on() else 16 * 1024 * 1024,
            "line_burst_us": int(pick(1, 400) * 1000) if on(0.3) else 0,
            "lock_probe": on(),
            # (Added later: drawn after the others, which stay as they were for each seed.)
            "inbox_idle_poll_us": 1_000_000 if on(0.5) else int(pick(0.1, 5.0) * SECOND),
        }
        # The cap: its room above the share (0 or 1) is drawn here, the share once the
        # cluster's size is known (it may be given).
        cap_room = int(rng.random() * 2) if on(0.3) else None
        # (Added later: drawn after the others, which stay as they were for each seed.)
        drawn["deps_prob"] = pick(0.2, 0.6) if on(0.4) else 0.0
        drawn["unknown_parent_wait_us"] = int(pick(2, 20) * SECOND)
        drawn["schedules"] = 1 + int(rng.random() * 2) if on(0.3) else 0
        drawn |= _draw_commands(seed)
        drawn |= _draw_batches(seed)
        drawn |= _draw_finals(seed)
        drawn |= _draw_backoff(seed)
        drawn.update(given)
        if "max_shards" not in given and cap_room is not None:
            drawn["max_shards"] = -(-drawn["shards"] // drawn["nodes"]) + cap_room
        settings = cls(seed=seed, **drawn)
        return settings.forced()

    def forced(self) -> Settings:
        """The world each negative control needs to be seen (docs/simulation.md, "Negative
        controls"): a control must make the model unsafe in worlds where the safe model stays
        safe. `faults_of` names a control whose world to build without its unsafe switch: its
        safe twin, which must pass.
        """
        changes: dict[str, Any] = {}
        twin = self.faults_of
        if self.unsafe_no_margin or twin == "no-margin":
            # Clock rates at the bound the margin is sized for, owners cut off from
            # membership.json while they live, and locks that do not stop a second owner
            # (NFSv3): only the margin keeps the lease beliefs apart.
            safe_ppm = _safe_ppm(self.ttl_us, self.margin_us)
            changes |= {
                "fs_mode": "nfsv3",
                "drift_max_ppm": safe_ppm,
                "outage_rate": max(self.outage_rate, 0.2),
                "outage_max_us": max(self.outage_max_us, 3 * self.ttl_us),
            }
        if self.unsafe_wall_clock_only or twin == "wall-clock-only":
            # Wall clocks stepped far and locks that do not stop a second owner.
            changes |= {
                "fs_mode": "nfsv3",
                "step_rate": max(self.step_rate, 0.05),
                "step_max_us": max(self.step_max_us, 4 * self.ttl_us),
            }
        if self.unsafe_no_fence or twin == "no-fence":
            # A stale owner's write must land after a newer claim: a pause longer than the
            # lease between deciding an append and making it, with a lock that did not stop
            # the next owner.
            changes |= {
                "fs_mode": "nfsv3",
                "pause_rate": max(self.pause_rate, 0.05),
                "pause_max_us": max(self.pause_max_us, 4 * self.ttl_us),
            }
        if self.unsafe_no_cap or twin == "no-cap":
            # A cap below the shard count, and owners that die: survivors without their cap
            # take the dead owners' shards beyond it.
            shards = max(self.shards, self.nodes + 1)
            changes |= {
                "shards": shards,
                "max_shards": max(self.max_shards or 0, -(-shards // self.nodes)),
                "crash_rate": max(self.crash_rate, 0.05),
            }
        if self.unsafe_absent_parents_done or twin == "absent-parents-done":
            # Children whose parents live on other nodes' shards, or come after them: only
            # the watch keeps them waiting. (No commands: the world the control was measured
            # in, where nothing but the watch ends a wait.)
            changes |= {
                "deps_prob": max(self.deps_prob, 0.4),
                "shards": max(self.shards, 2),
                "command_rate": 0.0,
            }
        if self.unsafe_dedupe_ack_at_write or twin == "dedupe-ack-at-write":
            # Duplicates sent through inboxes while their twins are live: only the owner can
            # tell at ingestion, and only the verdict's wait tells the client.
            changes |= {
                "dedupe_prob": max(self.dedupe_prob, 0.3),
                "route_any_prob": max(self.route_any_prob, 0.6),
                "shards": max(self.shards, 2),
            }
        if self.unsafe_fire_unmarked or twin == "fire-unmarked":
            # Schedules whose shards change hands while their runs finish: a new owner goes on
            # from the tick the log's record names.
            changes |= {
                "schedules": 2,
                "crash_rate": max(self.crash_rate, 0.05),
            }
        if (
            self.unsafe_ignore_cancel
            or self.unsafe_ignore_pause
            or self.unsafe_purge_all
            or self.unsafe_retry_skips_oldest
            or twin in ("ignore-cancel", "ignore-pause", "purge-all", "retry-skips-oldest")
        ):
            # Commands often, in a world without dependencies: the world the controls were
            # measured in (drawn worlds send commands beside dependencies too).
            changes |= {"command_rate": max(self.command_rate, 0.5), "deps_prob": 0.0}
        if self.unsafe_batch_ack_early or twin == "batch-ack-early":
            # Batches often, and crashes that lose appends still in flight: an item acked
            # before its record was durable is then lost.
            changes |= {
                "batch_prob": max(self.batch_prob, 0.6),
                "batch_max": max(self.batch_max, 6),
                "crash_rate": max(self.crash_rate, 0.05),
            }
        if self.unsafe_retry_final or twin == "retry-final":
            # Failures often, most of them final, with attempts left to retry them.
            changes |= {
                "final_prob": max(self.final_prob, 0.7),
                "fail_prob": max(self.fail_prob, 0.3),
                "retries_max": max(self.retries_max, 2),
            }
        if self.unsafe_ignore_task_backoff or twin == "ignore-task-backoff":
            # Tasks with waits of their own that fail and retry, clocks that stay put.
            changes |= {
                "backoff_prob": max(self.backoff_prob, 0.8),
                "fail_prob": max(self.fail_prob, 0.3),
                "retries_max": max(self.retries_max, 3),
                "step_rate": 0.0,
            }
        if (self.fs_mode == "nfsv3" and not changes) or twin == "nfsv3":
            # Timing assumptions broken (clock rates far apart, owners cut off from
            # membership.json): the lock file is what keeps a second owner paused, and NFSv3
            # grants it twice. The twin keeps POSIX locks.
            changes |= {
                "drift_max_ppm": max(self.drift_max_ppm, 400_000),
                "outage_rate": max(self.outage_rate, 0.2),
                "outage_max_us": max(self.outage_max_us, 3 * self.ttl_us),
                # Locks are the only guard left here: none may be lost (the twin must pass).
                "lock_loss_rate": 0.0,
            }
        if not changes:
            return self
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return Settings(**values)

    @property
    def assumptions_hold(self) -> bool:
        """Clock rates within what the margin tolerates (offsets and steps do not matter).

        Pauses do not matter either for what is judged as belief: a node's belief ends at its
        own lease deadline, paused or not."""
        return self.drift_max_ppm <= _safe_ppm(self.ttl_us, self.margin_us)

    @property
    def window_slack_us(self) -> int:
        """Clock error allowed when judging rate windows: offsets between hosts, steps, rates."""
        slack = 2 * self.offset_max_us + 2 * self.drift_max_ppm * 60 + SECOND
        if self.step_rate:
            slack += 2 * self.step_max_us
        return min(slack, 60 * SECOND)

    @property
    def probes_locks(self) -> bool:
        """Whether nodes take a free shard lock for proof that its claimant is gone: only
        where locks are never lost behind a live holder's back."""
        return self.lock_probe and self.fs_mode == "posix" and not self.lock_loss_rate

    def flags(self) -> str:
        """The command-line flags that reproduce the settings that were not drawn."""
        out = []
        if self.unsafe_no_margin:
            out.append("--unsafe-no-margin")
        if self.unsafe_no_fence:
            out.append("--unsafe-no-fence")
        if self.unsafe_wall_clock_only:
            out.append("--unsafe-wall-clock-only")
        if self.unsafe_no_cap:
            out.append("--unsafe-no-cap")
        if self.unsafe_absent_parents_done:
            out.append("--unsafe-absent-parents-done")
        if self.unsafe_dedupe_ack_at_write:
            out.append("--unsafe-dedupe-ack-at-write")
        if self.unsafe_fire_unmarked:
            out.append("--unsafe-fire-unmarked")
        if self.unsafe_wrong_result:
            out.append("--unsafe-wrong-result")
        if self.unsafe_ignore_cancel:
            out.append("--unsafe-ignore-cancel")
        if self.unsafe_ignore_pause:
            out.append("--unsafe-ignore-pause")
        if self.unsafe_purge_all:
            out.append("--unsafe-purge-all")
        if self.unsafe_retry_skips_oldest:
            out.append("--unsafe-retry-skips-oldest")
        if self.unsafe_batch_ack_early:
            out.append("--unsafe-batch-ack-early")
        if self.unsafe_retry_final:
            out.append("--unsafe-retry-final")
        if self.unsafe_ignore_task_backoff:
            out.append("--unsafe-ignore-task-backoff")
        if self.faults_of:
            out.append(f"--faults-of {self.faults_of}")
        elif self.fs_mode != "posix" and not (
            self.unsafe_no_margin or self.unsafe_wall_clock_only or self.unsafe_no_fence
        ):
            out.append(f"--fs {self.fs_mode}")
        return " ".join(out)

    def describe(self) -> str:
        parts = []
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float):
                value = round(value, 4)
            parts.append(f"{f.name}={value}")
        return " ".join(parts)
