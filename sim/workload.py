"""The workload of one world: producers, the SDK client of each process, and its handlers.

Producers enqueue at a Poisson rate through the safety phase (and stop in the liveness phase).
Each task's attributes are drawn from the settings: retries, auto_dedupe (with payloads reused
so that duplicates happen), a rate-limit group, an urgency, a hard timeout, a delay. A task goes
to its shard's owner per membership.json most of the time, as a smart client sends it, and to
any live process otherwise (`Settings.route_any_prob`): a process that does not own the shard
takes it into its inbox. Every enqueue is recorded as an `invoke`; the shell records its
outcome when the reply comes (`Shell._send`, `Shell._ack_enqueued`).

In some worlds (`Settings.deps_prob`) a task waits for others (`trigger_after_ids`): one to
three parents, each a recent task (chains, fan-out: several children of one parent, fan-in: a
child of several), a task a few enqueues from now (a child enqueued before its parent), or,
rarely, an id nobody ever enqueues (the child must end dead-lettered, `unknown_parent`). Ids
route by their own hash (but for a task with a group or a fingerprint), so with several shards
and nodes a child and its parents are mostly owned by different nodes; a task with a
fingerprint is never named as a recent parent (a duplicate has no record of its own). A task named before it is
enqueued names no parents itself, so the graph has no cycle; parents fail and dead-letter as
any task does (`fail_prob`, `max_retries`). Worlds without dependencies make no draw for them.

In some worlds (`Settings.schedules`) the app also keeps one or two named schedules with a
cron of a few seconds (`*/5 * * * * *`, `*/7 * * * * *`, misfire `catch_up` of a few ticks,
so that ticks missed during a takeover still run): every process declares them as it boots
(most do, as apps do at every boot), so a declaration often reaches a node that does not own
the name's shard and goes through an inbox. In some of those worlds one schedule is removed
late in the safety phase (and no longer declared); every one is removed when the liveness
phase starts (and again a little later, in case a declaration held by a starting process
came after), so that runs stop and the phase can end. Each tick's run is a task of the
workload's type, run by the same handlers; it has no client invoke (the checker learns it
from its record). Schedules draw from a generator of their own: the other draws of a world
stay as they were.

The SDK client writes lines to its process's stdin at once, or holds them for
`Settings.line_burst_us` and writes them together. Its handlers take a drawn time to run an
attempt, fail with a drawn probability, and some hang past their hard timeout; a result goes
back as a line like any other, and most successes return a value derived from their task and
attempt (`returned_value`), which the node stores on the tombstone.

All draws come from the world's workload generator, in the order the run makes them.
"""

from __future__ import annotations

import random
from collections import deque
from typing import TYPE_CHECKING, Any

import orjson
import xxhash

from sim.process import FLUSH_LINES, HANDLER_DONE, PRODUCE, SCHEDULES, Proc
from sim.settings import SECOND, exp, uniform
from snerd.core import effects as fx
from snerd.core import events as ev
from snerd.core.node import route_shard
from snerd.core.slots import slot_constructor
from snerd.core.timefmt import format_rfc3339

if TYPE_CHECKING:
    from sim.world import World

__all__ = ["TASK_TYPE", "Workload"]

#: The one task type every process registers a handler for.
TASK_TYPE = "t"

_line_received = slot_constructor(ev.LineReceived, "line")
#: The crons of the workload's schedules (every 5 s, every 7 s).
_CRONS = ("*/5 * * * * *", "*/7 * * * * *")


class Workload:
    """The producers and SDK clients of one world."""

    def __init__(self, world: World, rng: random.Random, rng_sched: random.Random) -> None:
        self.world = world
        self.s = world.s
        self.rng = rng
        self.next_task = 0
        #: Recent auto_dedupe payloads, for duplicates.
        self.dedupe_payloads: deque[str] = deque(maxlen=8)
        self._owners_cache: tuple[int, dict[int, str]] = (-1, {})
        #: Recent tasks a child may name (no fingerprint: never deduplicated away).
        self.recent_parents: deque[str] = deque(maxlen=8)
        #: Task ids named as parents before they were enqueued (they name none themselves).
        self.named_early: set[str] = set()
        self.next_ghost = 0
        #: The schedule lines the app declares at boot, by name (removed ones are dropped).
        self.schedules: dict[str, bytes] = {}
        self.rng_sched = rng_sched
        #: Whether the next enqueues go in one `enqueue_batch` line, and how many (drawn only
        #: in worlds with `batch_prob`, so that other worlds stay as they were).
        self.rng_batch = random.Random(f"batch-{self.s.seed}")
        #: A task's own retry wait and policy (drawn only in worlds with `backoff_prob`).
        self.rng_backoff = random.Random(f"backoff-{self.s.seed}")
        #: Whether a failure is final (drawn only in worlds with `final_prob`).
        self.rng_final = random.Random(f"final-{self.s.seed}")
        if self.s.schedules:
            self._draw_schedules()

    def start(self) -> None:
        """Schedule the first enqueue (and the late removal of a schedule, if any)."""
        self.world.at(exp(self.rng, self.s.enqueue_rate), PRODUCE)
        if self.s.backoff_prob and not self.s.command_rate:
            # The clocks' bound, which check 4c judges retry waits with (worlds with commands
            # record it already: `sim.commands`).
            s = self.s
            self.world.record({"kind": "control", "offset_max_us": s.offset_max_us,
                               "drift_max_ppm": s.drift_max_ppm, "steps": s.step_rate > 0,
                               "history_limit": self.world.node_history_limit()})
        if self.s.schedules and self.rng_sched.random() < 0.3:
            late = uniform(self.rng_sched, self.s.safety_us * 6 // 10, self.s.safety_us * 9 // 10)
            self.world.at(late, SCHEDULES, "late")

    # ------------------------------------------------------------------ schedules

    def _draw_schedules(self) -> None:
        rng = self.rng_sched
        for i, cron in enumerate(_CRONS[: self.s.schedules]):
            r = rng.random()
            msg: dict[str, Any] = {
                "action": "schedule",
                "name": f"s{i}",
                "cron": cron,
                "task_type": TASK_TYPE,
                "task_data": orjson.dumps({"schedule": i}).decode(),
                "max_retries": int(rng.random() * (self.s.retries_max + 1)),
                "retry_after_hours": 0.0,
                "misfire": "catch_up",
                "catch_up": 2 + int(rng.random() * 3),
                "overlap": "allow" if r < 0.6 else "skip" if r < 0.8 else "wait",
            }
            self.schedules[msg["name"]] = orjson.dumps(msg)

    def declare_schedules(self, proc: Proc) -> None:
        """`proc` boots: its app declares its schedules (most boots do; the first process
        always does), in the safety phase only."""
        if not self.schedules or self.world.liveness:
            return
        for name, line in self.schedules.items():
            if proc.index == 0 or self.rng_sched.random() < 0.75:
                self._schedule_line(proc, "schedule", name, line)

    def unschedule(self, what: str) -> None:
        """The app removes its last schedule ("late") or every one ("end")."""
        names = list(self.schedules)
        if what == "late":
            names = names[-1:]
        live = [p for p in self.world.procs if p.state != "down"]
        if not names or not live:
            return
        proc = live[int(self.rng_sched.random() * len(live))]
        for name in names:
            if what == "late":
                del self.schedules[name]  # (no longer declared at boot)
            line = orjson.dumps({"action": "unschedule", "name": name})
            self._schedule_line(proc, "unschedule", name, line)

    def end_schedules(self) -> None:
        """The liveness phase starts: every schedule is removed, now and 20 s later."""
        if not self.schedules:
            return
        self.unschedule("end")
        self.world.at(self.world.t + 20 * SECOND, SCHEDULES, "end")

    def _schedule_line(self, proc: Proc, action: str, name: str, line: bytes) -> None:
        self.world.counters["schedule_lines"] += 1
        self.world.record({"kind": "schedule", "action": action, "name": name, "node": proc.name})
        self.write_line(proc, line)

    # ------------------------------------------------------------------ producers

    def produce(self) -> None:
        """A producer enqueues one task, or in worlds with batches now and then several in
        one `enqueue_batch` line (and the next enqueue is scheduled)."""
        world = self.world
        if world.liveness:
            return
        s, rng = self.s, self.rng
        world.at(world.t + exp(rng, s.enqueue_rate), PRODUCE)
        if s.batch_prob and self.rng_batch.random() < s.batch_prob:
            self._produce_batch(2 + int(self.rng_batch.random() * (s.batch_max - 1)))
            return
        self.next_task += 1
        task = f"t{self.next_task}"
        msg, attrs = self._draw_task(task)
        if s.deps_prob:
            self._draw_dependencies(task, msg, attrs)
        delay = 0
        if rng.random() < s.delay_prob:
            delay = uniform(rng, SECOND, 20 * SECOND)
        target = self._target(attrs.get("group") or attrs["fingerprint"] or task)
        if target is None:
            return
        if delay:
            msg["execute_at"] = format_rfc3339(target.clock.wall(world.t) + delay)
        attrs["delay_us"] = delay
        world.counters["enqueues"] += 1
        world.record(
            {
                "kind": "enqueue",
                "phase": "invoke",
                "task": task,
                "node": target.name,
                "attrs": attrs,
            }
        )
        target.outstanding[task] = None
        self.write_line(target, orjson.dumps(msg))

    def _produce_batch(self, size: int) -> None:
        """`size` tasks drawn as `produce` draws one, sent in one `enqueue_batch` line to the
        process the first one's shard picks; each is its own invoke (and gets its own
        answer: the checker judges each as an enqueue)."""
        world, s, rng = self.world, self.s, self.rng
        drawn = []
        for _ in range(size):
            self.next_task += 1
            task = f"t{self.next_task}"
            msg, attrs = self._draw_task(task)
            if s.deps_prob:
                self._draw_dependencies(task, msg, attrs)
            delay = uniform(rng, SECOND, 20 * SECOND) if rng.random() < s.delay_prob else 0
            attrs["delay_us"] = delay
            drawn.append((task, msg, attrs))
        first_task, _msg, first = drawn[0]
        target = self._target(first.get("group") or first["fingerprint"] or first_task)
        if target is None:
            return
        items = []
        for task, msg, attrs in drawn:
            if attrs["delay_us"]:
                msg["execute_at"] = format_rfc3339(target.clock.wall(world.t) + attrs["delay_us"])
            del msg["action"]
            items.append(msg)
            world.counters["enqueues"] += 1
            world.counters["batched"] += 1
            world.record({"kind": "enqueue", "phase": "invoke", "task": task,
                          "node": target.name, "attrs": attrs})
            target.outstanding[task] = None
        self.write_line(target, orjson.dumps({"action": "enqueue_batch", "tasks": items}))

    def _draw_dependencies(self, task: str, msg: dict[str, Any], attrs: dict[str, Any]) -> None:
        """Whether `task` waits for parents, and which (into `msg` and `attrs`); and whether
        later tasks may name it (not with a fingerprint: a duplicate has no record of its
        own)."""
        if task in self.named_early:
            # Named by a child already: it keeps no fingerprint. An owner that drops an inbox
            # task as a duplicate at ingestion leaves its inbox record the only word on its
            # id, which the watch reads as live for ever (docs/simulation.md).
            self.named_early.discard(task)
            msg.pop("auto_dedupe", None)
            attrs["fingerprint"] = None
        elif self.rng.random() < self.s.deps_prob:
            msg["trigger_after_ids"] = attrs["parents"] = self._draw_parents()
        if attrs["fingerprint"] is None:
            self.recent_parents.append(task)

    def _draw_parents(self) -> list[str]:
        """The parents of the next task, drawn: one to three, each recent, to come, or an id
        nobody enqueues."""
        rng = self.rng
        count = 1 + (int(rng.random() * 3) if rng.random() < 0.4 else 0)
        parents: list[str] = []
        for _ in range(count):
            r = rng.random()
            if r < 0.08:
                self.next_ghost += 1
                parent = f"ghost{self.next_ghost}"
            elif r < 0.3 or not self.recent_parents:
                parent = f"t{self.next_task + 1 + int(rng.random() * 3)}"
                self.named_early.add(parent)
            else:
                recent = self.recent_parents
                parent = recent[int(rng.random() * len(recent))]
            if parent not in parents:
                parents.append(parent)
        return parents

    def _draw_task(self, task: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """The enqueue message of `task` and its attributes for the history (all but its
        delay), drawn."""
        s, rng = self.s, self.rng
        data = orjson.dumps({"n": self.next_task}).decode()
        # (One type but in worlds with commands, which draw it: `sim.commands`.)
        task_type = self.world.commands.task_type()
        attrs: dict[str, Any] = {
            "type": task_type,
            "max_retries": int(rng.random() * (s.retries_max + 1)),
        }
        msg: dict[str, Any] = {
            "action": "enqueue",
            "task_id": task,
            "task_type": task_type,
            "max_retries": attrs["max_retries"],
            "retry_after_hours": 0.0,
        }
        if s.backoff_prob and self.rng_backoff.random() < s.backoff_prob:
            r = self.rng_backoff
            wait_s = 0.2 + r.random() * 2.8
            msg["retry_after_hours"] = attrs["retry_after_hours"] = wait_s / 3600
            if r.random() < 0.5:
                msg["backoff"] = attrs["backoff"] = "exponential"
                msg["backoff_max_seconds"] = attrs["backoff_max_seconds"] = 2 + int(r.random() * 8)
        fingerprint = None
        if rng.random() < s.dedupe_prob:
            if self.dedupe_payloads and rng.random() < 0.5:
                data = self.dedupe_payloads[int(rng.random() * len(self.dedupe_payloads))]
            else:
                self.dedupe_payloads.append(data)
            msg["auto_dedupe"] = True
            fingerprint = xxhash.xxh64_hexdigest((task_type + data).encode()).lstrip("0") or "0"
        attrs["fingerprint"] = fingerprint
        msg["task_data"] = data
        if rng.random() < s.group_prob:
            group = "g0" if rng.random() < 0.5 else "g1"
            msg["rate_limit_group"] = group
            msg["max_per_minute"] = 600 if group == "g0" else 120
            attrs["group"] = group
            attrs["max_per_minute"] = msg["max_per_minute"]
        if rng.random() < s.urgency_prob:
            msg["urgency_score"] = attrs["urgency"] = 1 + int(rng.random() * 9)
        if rng.random() < s.timeout_prob:
            msg["max_execution_seconds"] = attrs["timeout_s"] = 1 + int(rng.random() * 4)
        return msg, attrs

    def _target(self, key: str) -> Proc | None:
        """The process a task routed by `key` is sent to (None: every process is down): the
        shard's owner per membership.json most of the time (a smart client), any live process
        otherwise (`route_any_prob`); a process that does not own the shard (yet, or any more)
        takes the task into its inbox for it."""
        s, rng = self.s, self.rng
        live = [p for p in self.world.procs if p.state != "down"]
        if not live:
            return None
        shard = route_shard(key, s.shards) if s.shards != 1 else 0
        target = live[int(rng.random() * len(live))]
        if rng.random() >= s.route_any_prob:
            owner = self._owners().get(shard)
            for p in live:
                if p.name == owner:
                    target = p
        return target

    def _owners(self) -> dict[int, str]:
        """Each shard's owner per membership.json (parsed once per version of the file)."""
        fs = self.world.fs
        version = fs.membership_generation
        if self._owners_cache[0] != version:
            doc = fs.read_membership() or {}
            claims = doc.get("claims") or {}
            owners = {}
            for shard in range(self.s.shards):
                owner = (claims.get(f"shard-{shard}") or {}).get("owner")
                if isinstance(owner, str):
                    owners[shard] = owner
            self._owners_cache = (version, owners)
        return self._owners_cache[1]

    # ------------------------------------------------------------------ the SDK client

    def write_line(self, proc: Proc, line: bytes, *, result: bool = False) -> None:
        """The SDK client writes `line` to `proc`'s stdin: at once, or, with line bursts, held
        (`Settings.line_burst_us`) and written with the lines that follow meanwhile."""
        world = self.world
        burst_us = self.s.line_burst_us
        if not burst_us:
            world.deliver(proc, _line_received(line))
            return
        if not proc.pending_lines:
            world.at(world.t + burst_us, FLUSH_LINES, proc.index, proc.inc)
        proc.pending_lines.append(line)
        if result:
            proc.pending_results += 1

    def flush_lines(self, proc: Proc) -> None:
        """The SDK client writes the lines it held, together: one `LinesReceived`."""
        if not proc.pending_lines:
            return
        lines, proc.pending_lines = proc.pending_lines, []
        counters = self.world.counters
        if len(lines) > 1:
            counters["burst_lines"] += len(lines)
            counters["burst_results"] += proc.pending_results
        proc.pending_results = 0
        self.world.deliver(proc, ev.LinesReceived(lines=lines))

    def run_handler(self, proc: Proc, effect: fx.Execute) -> None:
        """A handler of `proc` starts an attempt: how long it takes and whether it fails are
        drawn, and its result comes back then (`handler_done`)."""
        s, rng, world = self.s, self.rng, self.world
        ok = rng.random() >= s.fail_prob
        slow = rng.random() < s.slow_prob
        hang = rng.random() < s.hang_prob
        took = uniform(rng, 1_000, 50_000) if not slow else uniform(rng, 0, s.ttl_us)
        if effect.max_execution_seconds and hang:
            # Hangs past its hard timeout: the daemon fails the attempt at the deadline; this
            # result, when it finally comes, must be refused.
            took = 3 * effect.max_execution_seconds * SECOND
        world.at(
            world.t + took,
            HANDLER_DONE,
            proc.index,
            proc.inc,
            (effect.task_id, effect.attempt, ok),
        )

    def handler_done(self, proc: Proc, task: str, attempt: int, ok: bool) -> None:
        """A handler of `proc` returned: the SDK client writes its result, with the value a
        success returned (`returned_value`), which the history records too."""
        entry: dict[str, Any] = {
            "kind": "handler_done",
            "task": task,
            "attempt": attempt,
            "node": proc.name,
            "ok": ok,
        }
        result: dict[str, Any] = {"action": "result", "task_id": task, "attempt": attempt}
        result["status"] = "success" if ok else "error"
        if not ok:
            result["error_msg"] = "simulated failure"
            if self.s.final_prob and self.rng_final.random() < self.s.final_prob:
                result["retry"] = False
                entry["final"] = True
        else:
            value = returned_value(task, attempt)
            if value is not None:
                entry["result"] = result["result"] = value
        self.world.record(entry)
        self.write_line(proc, orjson.dumps(result), result=True)


def returned_value(task: str, attempt: int) -> Any:
    """What a successful attempt's handler returns: derived from the task and the attempt, so
    that a stored result names the attempt it came from; None (nothing) for about one in
    four, whose `result` lines stay plain (the node's fast path, `Intake._plain_success`).
    No draw: the other draws of a world stay as they were."""
    mix = xxhash.xxh3_64_intdigest(f"{task}/{attempt}".encode())
    if mix % 4 == 0:
        return None
    return {"task": task, "attempt": attempt, "mix": mix % 1000}
