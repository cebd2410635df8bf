"""jepsen-lite in CI: short runs of real daemons (each spawned by the SDK in its own worker
process) under a nemesis, judged by the simulator's checker (docs/chaos.md).

- local filesystem, kill + pause + clock: the checker passes and every fault happened;
- a small tmpfs that fills up (root): the same, with the disk-full nemesis;
- a small ext4 in a loop-mounted image file that fills up (root, mkfs.ext4, losetup; skipped
  without, a failure under SNERD_REQUIRE_ALL=1): the same, the free bytes seen and the
  daemons' ENOSPC answers checked, and the image unmounted, detached and deleted afterwards,
  also when the run fails or is sent SIGTERM half-way;
- GlusterFS, two mounts (the `gluster_dirs` fixture; skipped without a volume, a failure under
  SNERD_REQUIRE_ALL=1): kill + pause + clock;
- GlusterFS, two mounts, clear-locks (the `gluster_volume` fixture): a shard owner's flock
  dropped by `gluster volume clear-locks ... kind all posix` while it is frozen past its lease
  (the lock probed from the other mount: held before, free after), another node takes the
  shard, the old owner wakes still believing it holds the lock: the checker must pass;
- GlusterFS in network namespaces (the `gluster_netns_volume` fixture brings up its own volume
  with `SNERD_GLUSTER_NETNS=1 tests/support/glusterfs/up.sh` and takes it down; skipped where
  it cannot, a failure under SNERD_REQUIRE_ALL=1): mount A's client cut off beyond the volume's
  network.ping-timeout and healed, and features.locks-monkey-unlocking switched on and off;
- local filesystem, kill, the dependency workload at a high share: the checker passes (children
  ran only after their parents completed, wherever those sat; those of a dead-lettered or
  never-enqueued parent ended dead-lettered) on a history holding children across nodes, sent
  before their parents, and dead-lettered through a parent; that history doctored with a
  child run before its parent, or a child of a never-enqueued parent completed, fails;
- local filesystem, kill, job-control commands at a high rate (cancel, retry, sweeps,
  pause/resume of a type or the queue, to random live daemons): the checker passes, invariants
  13-16 included, on a history where cancels, pauses and resumes were answered as taking
  effect and both task types ran; the negative controls of commands (daemons that answer a
  cancel and keep the task, or that dispatch paused types) must be caught;
- the negative control: daemons without fencing (SNERD_TEST_UNSAFE_NO_FENCE=1) and lock files
  replaced under their owners: the checker must report the double ownership.
"""

from __future__ import annotations

import asyncio
import bisect
import copy
import inspect
import os
import queue
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sim.check import (
    CHILD_NOT_FAILED,
    CHILD_NOT_RUN,
    CHILD_RAN_EARLY,
    DOUBLE_OWNERSHIP,
    check_dependencies,
)
from sim.check.control import commands
from sim.check.history import analyse
from sim.check.report import CANCEL_NOT_KEPT, CANCELLED_RAN, PAUSED_RAN
from sim.check.verdict import check_control

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "jepsen-lite"))

from jepsen_lite import faults, phases
from jepsen_lite import nemesis as nem
from jepsen_lite.cluster import Cluster
from jepsen_lite.config import RunConfig, config_problem
from jepsen_lite.faults import FAULTS, FULL_SLACK, GLUSTER_FAULTS, Nemesis
from jepsen_lite.load import GHOST_PREFIX
from jepsen_lite.phases import Outcome, gluster_control, run
from jepsen_lite.plot import plot
from jepsen_lite.report import PARENT_REASONS, summary, summary_table

from tests.conftest import missing_tool
from tests.support import glusterfs as gl

pytestmark = pytest.mark.timeout(400)


def _run(config: RunConfig) -> tuple[Outcome, dict[str, object]]:
    outcome = run(config)
    s = summary(outcome)
    plot(outcome.history, config.out / "plot.png")
    print(outcome.report.describe())
    print(summary_table(s))
    return outcome, s


def _assert_clean(outcome: Outcome, s: dict[str, object], nemeses: tuple[str, ...]) -> None:
    assert outcome.report.ok, outcome.report.describe()
    assert outcome.drained, f"unfinished: {outcome.unfinished[:10]}"
    assert not outcome.problems, outcome.problems
    ran = {f.name for f in outcome.faults if f.verified}
    assert ran >= set(nemeses), f"faults verified: {ran}, asked for {nemeses}"
    assert all(f.verified for f in outcome.faults), [f for f in outcome.faults if not f.verified]
    # The run did work, through faults: acks outside the faults at the rate asked for, and
    # every acked task executed.
    _assert_progress(outcome)
    reasons: dict[str, int] = s["dead_letters_by_reason"]  # type: ignore[assignment]
    never_ran = sum(n for why, n in reasons.items() if why in PARENT_REASONS)
    assert int(s["executions"]) >= int(s["ok"]) - never_ran, s  # type: ignore[call-overload]
    assert (config_out := outcome.out / "history.jsonl").stat().st_size > 0, config_out
    assert (outcome.out / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _assert_progress(outcome: Outcome) -> None:
    """Outside the fault windows (each fault's start to its end, which includes its heal and a
    restart), at least half the enqueues the load offered in that time were acked: the load is
    a Poisson stream at `rate`, so a healthy cluster acks about all of them and a stalled one
    about none. Enqueues are counted by their invoke time, from the chaos phase to the end of
    the load (the liveness phase). Needs at least 5 s outside the faults to judge."""
    h = outcome.history
    phase = {e["name"]: e["t"] for e in h if e.get("kind") == "phase"}
    begin, end = phase["chaos"], phase["liveness"]
    windows = sorted((f.start, f.end or end) for f in outcome.faults)
    covered, reach = 0, begin
    for a, b in windows:  # the union of the windows, within [begin, end]
        a, b = max(a, reach), min(b, end)
        if b > a:
            covered += b - a
            reach = b
    outside_s = (end - begin - covered) / 1e6
    invoked = {
        e["task"]: e["t"] for e in h if e.get("kind") == "enqueue" and e["phase"] == "invoke"
    }
    acked = [
        t
        for e in h
        if e.get("kind") == "enqueue" and e["phase"] == "ok"
        for t in (invoked[e["task"]],)
        if begin <= t <= end and not any(a <= t <= b for a, b in windows)
    ]
    offered = outcome.config.rate * outside_s
    print(f"outside the faults: {len(acked)} acked in {outside_s:.1f} s, {offered:.0f} offered")
    assert outside_s >= 3.0, f"only {outside_s:.1f} s outside the faults {windows}"
    assert len(acked) >= offered / 2, (
        f"{len(acked)} enqueues acked in {outside_s:.1f} s outside the faults, "
        f"{offered:.0f} offered at {outcome.config.rate:g}/s"
    )


def test_local_kill_pause_clock(tmp_path: Path) -> None:
    nemeses = ("kill", "pause", "clock")
    config = RunConfig(
        fs="local", nodes=3, shards=4, duration=45, seed=11, nemesis=nemeses, out=tmp_path / "out"
    )
    outcome, s = _run(config)
    _assert_clean(outcome, s, nemeses)
    kills = [f for f in outcome.faults if f.name == "kill"]
    assert kills, "no kill ran"
    # The clock nemesis was taken by the daemon (its stderr said so).
    assert any(
        e.get("kind") == "daemon_log" and "test clock" in str(e.get("line"))
        for e in outcome.history
    )


@pytest.fixture(scope="module")
def deps_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Outcome, dict[str, object]]:
    """One short run of the dependency workload (a quarter of the enqueues are children, one
    in seven of those names a parent nobody enqueues), under kills, on the local filesystem;
    a 4 s unknown-parent wait, so its children end within the drain."""
    config = RunConfig(
        fs="local",
        nodes=3,
        shards=4,
        duration=15,
        seed=19,
        nemesis=("kill",),
        out=tmp_path_factory.mktemp("deps") / "out",
        deps_share=0.25,
        ghost_share=0.15,
        unknown_parent_s=4.0,
        drain_timeout=60.0,
    )
    return _run(config)


def test_local_dependency_chains(deps_run: tuple[Outcome, dict[str, object]]) -> None:
    """Children across nodes, some sent before their parents, some of parents nobody enqueued:
    the checker passes (invariant 9 and liveness, a dead-lettered child counting as ended),
    the drain finished, and the daemons dead-lettered children through their parents."""
    outcome, s = deps_run
    _assert_clean(outcome, s, ("kill",))
    print({k: s[k] for k in s if k.startswith(("children", "parents", "dead_letters"))})
    assert int(s["children"]) >= 30, s  # type: ignore[call-overload]
    # (Some children ran: how many depends on the machine's load; on two busy cores 9 of 30.)
    assert int(s["children_ran"]) >= 5, s  # type: ignore[call-overload]
    assert int(s["children_across_nodes"]) >= 5, s  # type: ignore[call-overload]
    assert int(s["children_sent_first"]) >= 1, s  # type: ignore[call-overload]
    assert int(s["parents_never_enqueued"]) >= 1, s  # type: ignore[call-overload]
    reasons: dict[str, int] = s["dead_letters_by_reason"]  # type: ignore[assignment]
    assert reasons.get("blocked_by_failed_parent", 0) + reasons.get("unknown_parent", 0), s
    # Every child of a parent nobody enqueued ended dead-lettered, told why.
    h = outcome.history
    told = {e["task"]: str(e.get("error")) for e in h if e.get("kind") == "dead_letter"}
    ghost_children = [
        e["task"]
        for e in h
        if e.get("kind") == "enqueue"
        and e["phase"] == "invoke"
        and any(p.startswith(GHOST_PREFIX) for p in e["attrs"]["parents"])
    ]
    acked = {e["task"] for e in h if e.get("kind") == "enqueue" and e["phase"] == "ok"}
    assert ghost_children, s
    for child in ghost_children:
        if child in acked:
            assert told.get(child, "").startswith(PARENT_REASONS), (child, told.get(child))
    # Every node declared the schedule at each start; its runs, one per tick, ran (each judged
    # by invariant 11: no tick fired twice).
    runs = [e["task"] for e in h if e.get("kind") == "execute" and "@" in e["task"]]
    assert int(s["schedule_runs"]) >= 3 and len(set(runs)) >= 3, s  # type: ignore[call-overload]


def test_dependency_settings_refused_before_anything_starts() -> None:
    """A share outside 0-1, an unknown-parent wait of 0, or a drain no longer than that wait
    (the children of never-enqueued parents could not end within it) is refused."""
    assert "deps_share 1.5 is not a share" in (config_problem(RunConfig(deps_share=1.5)) or "")
    assert "ghost_share -0.1" in (config_problem(RunConfig(ghost_share=-0.1)) or "")
    assert "unknown_parent_s 0" in (config_problem(RunConfig(unknown_parent_s=0)) or "")
    short = RunConfig(drain_timeout=10.0, unknown_parent_s=10.0)
    assert "too short for the children" in (config_problem(short) or "")
    assert config_problem(RunConfig(drain_timeout=10.0, unknown_parent_s=9.0)) is None
    assert config_problem(RunConfig(drain_timeout=10.0, deps_share=0.0)) is None


@pytest.fixture(scope="module")
def commands_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Outcome, dict[str, object]]:
    """One short run with job-control commands at 4 a second under kills, on the local
    filesystem, the dependency workload and the schedule as by default."""
    config = RunConfig(
        fs="local",
        nodes=3,
        shards=4,
        # (Long enough that a kill lands on a busy machine: the first may come late.)
        duration=20,
        seed=23,
        nemesis=("kill",),
        out=tmp_path_factory.mktemp("commands") / "out",
        command_rate=4.0,
        drain_timeout=60.0,
    )
    return _run(config)


def test_local_job_control_commands(commands_run: tuple[Outcome, dict[str, object]]) -> None:
    """Cancels, retries, sweeps and pauses sent to random live daemons under kills: the
    checker passes (invariants 13-16 among the others), on a history of commands recorded as
    `sim.check.control` reads them, of which cancels, pauses and resumes were answered as
    taking effect; both task types ran, and every pause was lifted for the drain."""
    outcome, s = commands_run
    _assert_clean(outcome, s, ("kill",))
    h = outcome.history
    assert check_control(h) == []
    cmds = commands(analyse(h))
    answered = [c for c in cmds if c.reply is not None]
    assert len(answered) >= 20 and s["commands_answered"] >= len(answered), s
    per: dict[str, dict[str, int]] = s["commands_by_action"]  # type: ignore[assignment]
    for action in ("cancel", "pause", "resume"):
        assert per.get(action, {}).get("effect", 0) > 0, (action, per)
    assert sum(r["sent"] for r in per.values()) == s["commands"] == len(cmds)
    # Every command went to a node of the run, and no answer came before its command.
    names = {e["node"] for e in h if e.get("kind") == "node_start"}
    assert {c.node for c in cmds} <= names
    assert all(c.t_answer >= c.t for c in answered)
    # Both types ran: a pause of one left the other running.
    types = {
        e["fields"].get("taskType")
        for e in h
        if e.get("kind") == "record" and e["fields"].get("taskType")
    }
    assert {"t", "u"} <= types, types
    # The drain resumed what was paused: the last pause or resume of each key is a resume
    # answered on every shard.
    last: dict[object, object] = {}
    for c in answered:
        if c.action in ("pause", "resume"):
            last[c.target] = (c.action, c.reply.get("pending") if c.reply else None)
    assert last and all(v == ("resume", []) for v in last.values()), last


@pytest.mark.parametrize(
    ("unsafe", "kinds"),
    [
        ("unsafe_ignore_cancel", {CANCELLED_RAN, CANCEL_NOT_KEPT}),
        ("unsafe_ignore_pause", {PAUSED_RAN}),
    ],
)
def test_negative_controls_of_job_control(
    tmp_path: Path, unsafe: str, kinds: set[str]
) -> None:
    """Daemons that answer a cancel `cancelled` and keep the task (the
    SNERD_TEST_UNSAFE_IGNORE_CANCEL hook), or that dispatch a paused type
    (SNERD_TEST_UNSAFE_IGNORE_PAUSE): the checker must say so, with its control verdict."""
    config = RunConfig(
        fs="local",
        nodes=3,
        shards=4,
        duration=8,
        seed=3,
        nemesis=(),
        out=tmp_path / "out",
        command_rate=4.0,
        deps_share=0.0,
        schedule_cron="",
        **{unsafe: True},  # type: ignore[arg-type]
    )
    outcome, s = _run(config)
    found = {v.kind for v in outcome.report.violations}
    assert found & kinds, (found, s["commands_by_action"])
    assert found <= {CANCELLED_RAN, CANCEL_NOT_KEPT, PAUSED_RAN}, found


def test_command_settings_refused_before_anything_starts() -> None:
    """A negative rate of commands, or a negative control of commands without them, is
    refused."""
    assert "command_rate -1" in (config_problem(RunConfig(command_rate=-1.0)) or "")
    no_commands = RunConfig(command_rate=0.0, unsafe_ignore_cancel=True)
    assert "need commands" in (config_problem(no_commands) or "")
    assert config_problem(RunConfig(command_rate=0.0)) is None


def _plant(history: list[dict[str, object]], entry: dict[str, object]) -> list[dict[str, object]]:
    """`history` with `entry` inserted where its time puts it."""
    times = [int(e["t"]) for e in history[1:]]  # type: ignore[call-overload]
    i = 1 + bisect.bisect_right(times, int(entry["t"]))  # type: ignore[call-overload]
    return [*history[:i], entry, *history[i:]]


def test_a_child_run_before_its_parent_is_caught(
    deps_run: tuple[Outcome, dict[str, object]],
) -> None:
    """The run's own history, doctored: an execute of a child planted before its parent's
    handler first succeeded (`child_ran_early`), or a child of a parent nobody enqueued made
    to complete (`child_not_failed`). The history as recorded has neither."""
    outcome, _s = deps_run
    h = copy.deepcopy(outcome.history)
    assert check_dependencies(h) == []
    invoked = {e["task"]: e for e in h if e.get("kind") == "enqueue" and e["phase"] == "invoke"}
    succeeded: dict[str, int] = {}
    for e in h:
        if e.get("kind") == "handler_done" and e["ok"]:
            succeeded.setdefault(e["task"], e["t"])
    ran = {e["task"]: e for e in reversed(h) if e.get("kind") == "execute"}
    # A child that ran, every parent of which first succeeded after the child was sent: its
    # execute planted just before the first of those successes is early for every parent,
    # and the first one it names is reported.
    child, first = next(
        (c, min(succeeded[p] for p in inv["attrs"]["parents"]))
        for c, inv in invoked.items()
        if c in ran
        and inv["attrs"]["parents"]
        and all(succeeded.get(p, 0) > inv["t"] + 1 for p in inv["attrs"]["parents"])
    )
    found = check_dependencies(_plant(h, {**ran[child], "t": first - 1}))
    assert [v.kind for v in found] == [CHILD_RAN_EARLY], found
    parent = invoked[child]["attrs"]["parents"][0]
    assert f"child {child} " in found[0].message and f"parent {parent} " in found[0].message, found
    # A child of a parent nobody enqueued, its dead-letter tombstone turned into a completion.
    tombstone = next(
        e
        for e in h
        if e.get("kind") == "record"
        and e["fields"].get("snerdOutcome") == "dead_letter"
        and any(
            p.startswith(GHOST_PREFIX)
            for p in invoked.get(e["fields"].get("taskId"), {}).get("attrs", {}).get("parents", ())
        )
    )
    tombstone["fields"]["snerdOutcome"] = "completed"
    found = check_dependencies(h)
    # (Its own children, dead-lettered through it, now had a parent that "completed": those
    # that did not run are named too.)
    assert [v.kind for v in found if v.kind != CHILD_NOT_RUN] == [CHILD_NOT_FAILED], found
    assert tombstone["fields"]["taskId"] in found[0].message, found


def test_tmpfs_disk_full(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        missing_tool("the disk-full run mounts a small tmpfs: it needs root")
    nemeses = ("disk-full", "kill")
    config = RunConfig(
        fs="tmpfs", nodes=2, shards=2, duration=25, seed=12, nemesis=nemeses, out=tmp_path / "out"
    )
    outcome, s = _run(config)
    _assert_clean(outcome, s, nemeses)
    full = [f for f in outcome.faults if f.name == "disk-full"]
    assert full and all("ENOSPC met: True" in f.detail for f in full)


def _loop_tools() -> None:
    why = nem.loop_tools_missing()
    if why:
        missing_tool(f"the loop disk-full run cannot make its ext4 image: {why}")


def _assert_loop_gone(out: Path) -> None:
    """The run's image is unmounted, detached from every loop device, and deleted."""
    image, data = out / "loop.img", out / "data"
    assert not image.exists(), image
    mounts = Path("/proc/self/mounts").read_text()
    assert str(data.resolve()) not in mounts, mounts
    listed = subprocess.run(
        ["losetup", "-a"], capture_output=True, text=True, timeout=10, check=False
    ).stdout
    assert str(image) not in listed, listed


def test_loop_disk_full(tmp_path: Path) -> None:
    """The queue on a 64 MiB ext4 in a loop-mounted image: filled to ENOSPC and freed twice
    (with kills between), and the daemons keep every promise through it."""
    _loop_tools()
    nemeses = ("disk-full", "kill")
    out = tmp_path / "out"
    config = RunConfig(fs="loop", nodes=2, shards=2, duration=25, seed=16, nemesis=nemeses, out=out)
    outcome, s = _run(config)
    _assert_clean(outcome, s, nemeses)
    # The daemons' directory was the loop-mounted ext4, and it was taken down afterwards.
    params = outcome.history[0]
    assert any(step.startswith("mounted /dev/loop") for step in params["fs_setup"]), params
    assert any(step.startswith("unmounted ") for step in outcome.fs_steps), outcome.fs_steps
    assert any(step.startswith("deleted ") for step in outcome.fs_steps), outcome.fs_steps
    _assert_loop_gone(out)
    full = [f for f in outcome.faults if f.name == "disk-full"]
    assert full, "no disk-full ran"
    for f in full:
        i = f.info
        # a 64 MiB ext4 (not the host's disk): 40-64 MiB free, none once filled, back after
        assert 40 << 20 < i["free_before"] <= 64 << 20, i
        assert i["enospc"] and i["free_full"] < FULL_SLACK, i
        assert i["free_after"] > i["free_before"] // 2, i
    # The daemons met the full disk and said so (enqueue answers, their own warnings).
    assert sum(f.info["enospc_replies"] + f.info["enospc_log_lines"] for f in full) > 0, [
        f.info for f in full
    ]
    ends = [e for e in outcome.history if e.get("kind") == "fault" and e.get("phase") == "end"]
    assert any(e["name"] == "disk-full" and e["info"]["free_full"] == 0 for e in ends), ends


def test_loop_fs_undone_when_the_run_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that fails once its ext4 is mounted still unmounts, detaches and deletes it."""
    _loop_tools()
    out = tmp_path / "out"
    seen: list[str | None] = []

    async def boom(self: phases.Run) -> tuple[bool, list[str]]:
        seen.append(nem.mounted_fstype(self.cluster.dirs[0]))
        raise RuntimeError("boom")

    monkeypatch.setattr(phases.Run, "_main", boom)
    with pytest.raises(RuntimeError, match="boom"):
        run(RunConfig(fs="loop", nodes=1, shards=1, duration=1, nemesis=(), out=out))
    assert seen == ["ext4"]
    _assert_loop_gone(out)


def test_loop_fs_undone_on_sigterm(tmp_path: Path) -> None:
    """SIGTERM while the loop-mounted ext4 is full: the run kills its nodes, unmounts,
    detaches and deletes the image, and exits 143."""
    _loop_tools()
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        str(Path(__file__).resolve().parents[2] / "jepsen-lite" / "run.py"),
        *("--fs", "loop", "--nodes", "2", "--shards", "2", "--nemesis", "disk-full"),
        *("--duration", "30", "--seed", "17", "--out", str(out)),
    ]
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    seen: list[str] = []
    try:
        end = time.monotonic() + 60
        while not any("nemesis: disk-full on the cluster" in line for line in seen):
            line = lines.get(timeout=max(0.1, end - time.monotonic()))
            assert line is not None, "".join(seen)
            seen.append(line)
        filled = nem.free_bytes(out / "data")
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    while (line := lines.get(timeout=10)) is not None:
        seen.append(line)
    text = "".join(seen)
    assert code == 128 + signal.SIGTERM, text
    assert filled is not None and filled < 64 << 20, text  # it was the loop-mounted ext4
    assert "interrupted: undoing the faults, killing every node" in text, text
    assert "Traceback" not in text, text
    _assert_loop_gone(out)
    # every daemon and worker it started is gone (or a zombie nobody reaped)
    pids = [
        int(p)
        for m in re.finditer(r"@pid-(\d+) started \(worker pid (\d+)\)", text)
        for p in m.groups()
    ]
    assert len(pids) >= 4, text
    assert all(nem.process_state(pid) in (None, "Z") for pid in pids), pids


def test_glusterfs_kill_pause_clock(gluster_dirs: tuple[Path, Path], tmp_path: Path) -> None:
    nemeses = ("kill", "pause", "clock")
    config = RunConfig(
        fs="glusterfs",
        nodes=2,
        shards=2,
        duration=35,
        seed=13,
        nemesis=nemeses,
        out=tmp_path / "out",
        gluster_dirs=gluster_dirs,
        rate=10.0,
    )
    outcome, s = _run(config)
    _assert_clean(outcome, s, nemeses)


def _gluster_run(
    volume: gl.GlusterVolume, nemeses: tuple[str, ...], *, seed: int, duration: float, out: Path
) -> Outcome:
    """2 nodes, 2 shards, 10 enqueues a second, on a fresh directory of `volume` (its two
    mounts), under `nemeses` (which may reconfigure or cut off the volume); judged clean."""
    with gl.fresh_directory(volume, f"jepsen-{nemeses[0]}") as dirs:
        config = RunConfig(
            fs="glusterfs",
            nodes=2,
            shards=2,
            duration=duration,
            seed=seed,
            nemesis=nemeses,
            out=out,
            gluster_dirs=dirs,
            gluster=gluster_control(volume),
            rate=10.0,
            gap_s=2.0,
        )
        outcome, s = _run(config)
    _assert_clean(outcome, s, nemeses)
    return outcome


def test_glusterfs_clear_locks(gluster_volume: gl.GlusterVolume | str, tmp_path: Path) -> None:
    """The brick forgets a shard owner's flock (clear-locks) while the owner is frozen past its
    lease: the lock is free from the other mount at once, another node takes the shard and its
    lock, the old owner wakes believing it still holds both; leases and epochs keep every
    promise (the checker passes) and the old owner gives the shard up."""
    if isinstance(gluster_volume, str):
        missing_tool(f"no GlusterFS volume: {gluster_volume}")
    volume = gluster_volume
    outcome = _gluster_run(volume, ("clear-locks",), seed=18, duration=30, out=tmp_path / "out")
    cleared = [f for f in outcome.faults if f.name == "clear-locks"]
    assert len(cleared) >= 2, cleared
    for f in cleared:
        # the lock was really held, really dropped by the brick, and really free afterwards
        assert f.info["probe_before"] == "BLOCKED", f.info
        assert f.info["cleared"] >= 1, f.info
        assert f.info["probe_after"] == "ACQUIRED", f.info
    taken = [f for f in cleared if f.info["taken_over"]]
    assert taken, [f.info for f in cleared]
    for f in taken:
        # the new owner holds the shard's lock; the old one woke and let the shard go
        assert f.info["probe_after_takeover"] == "BLOCKED", f.info
        assert f.info["victim_step_downs"], f.info
        owned = f.info["victim_owned_after"]
        assert owned is None or f.info["shard"] not in owned, f.info
    history = outcome.history
    assert any(e.get("kind") == "clear_locks" for e in history)
    assert any(e.get("kind") == "lock_probe" and e["after"] == "ACQUIRED" for e in history)
    assert gl.check_pair(volume.a, volume.b) is None
    for log in (tmp_path / "out").rglob("*.stderr"):
        assert "Traceback" not in log.read_text(errors="replace"), log


def test_glusterfs_partition_and_monkey_unlock(
    gluster_netns_volume: gl.GlusterVolume, tmp_path: Path
) -> None:
    """Mount A's client cut off for longer than network.ping-timeout, then healed: the daemon
    on A steps down, the one on B takes its shards over, mount A works again, and the checker
    finds nothing. features.locks-monkey-unlocking is switched on and off meanwhile."""
    volume = gluster_netns_volume
    nemeses = ("partition", "monkey-unlock")
    outcome = _gluster_run(volume, nemeses, seed=15, duration=32, out=tmp_path / "out")
    # the first cut (a fast heal leaves time for a second one; each is verified all the same)
    cut = next(f for f in outcome.faults if f.name == "partition")
    assert cut.info["ping_timeout_s"] == 10.0, cut.info  # tests/support/glusterfs/up.sh sets it
    assert cut.info["stat_before"] == "ok", cut.info
    assert set(cut.info["stat_during"]) & {"ENOTCONN", "blocked"}, cut.info
    assert cut.info["stat_after"] == "ok", cut.info
    # The daemon on mount A owned a shard, stopped acting for it, and B took it over.
    assert cut.info["owned_by_victims"], cut.info
    assert cut.info["step_downs"] >= 1, cut.info
    assert cut.info["taken_over"], cut.info
    monkey = next(f for f in outcome.faults if f.name == "monkey-unlock")
    assert monkey.info["option_on"] == "on", monkey.info
    assert gl.check_pair(volume.a, volume.b) is None  # both mounts answer after the run
    # The daemon on mount A survived its lost locks (stepped down, did not crash).
    for log in (tmp_path / "out").rglob("*.stderr"):
        assert "Traceback" not in log.read_text(errors="replace"), log


#: A stand-in for ssh: it records the host, its own pid (the worker's: the command line execs
#: it) and the command line, then runs that here, as ssh would run it there.
_LAUNCHER = """#!/bin/sh
host=$1
shift
printf '%s\\t%s\\t%s\\n' "$host" "$$" "$1" >> "$0.log"
exec sh -c "$1"
"""


def test_hosts_through_a_launcher(tmp_path: Path) -> None:
    """--hosts a,b with a launcher that runs the command line locally: every worker is started
    through it on the host its node was given (round-robin), every kill, pause and clock step
    goes through it to the victim's host, the history names each node's host, and the run is
    judged clean."""
    launcher = tmp_path / "launch"
    launcher.write_text(_LAUNCHER)
    launcher.chmod(0o755)
    shared = tmp_path / "shared"
    shared.mkdir()
    nemeses = ("kill", "pause", "clock")
    config = RunConfig(
        nodes=3,
        shards=2,
        duration=22,
        seed=21,
        nemesis=nemeses,
        out=tmp_path / "out",
        dirs=(shared,),
        hosts=("a", "b"),
        remote=f"{launcher} {{host}}",
        remote_dirs=(("b", str(shared)),),
        # a short lease (a pause of 3.75 s) and a gap of 1.5 s: each nemesis runs within 22 s
        ttl_s=1.5,
        gap_s=1.5,
    )
    outcome, s = _run(config)
    _assert_clean(outcome, s, nemeses)
    sent = [line.split("\t", 2) for line in (tmp_path / "launch.log").read_text().splitlines()]
    starts = [e for e in outcome.history if e.get("kind") == "node_start"]
    assert {e["node"].split("@")[0]: e["host"] for e in starts} == {"n1": "a", "n2": "b", "n3": "a"}
    workers = {(h, int(pid)) for h, pid, cmd in sent if "-m jepsen_lite.worker" in cmd}
    assert len(workers) == len(starts), (workers, starts)
    for e in starts:  # the worker is the launcher's process, execed, on its node's host
        assert (e["host"], e["worker_pid"]) in workers, (e, workers)
        assert e["via"] == [str(launcher), e["host"]], e
    commands = {(h, cmd) for h, _pid, cmd in sent}
    host = {e["node"]: e["host"] for e in starts}
    label = {e["node"]: e["node"].split("@")[0] for e in starts}
    for e in outcome.history:
        if e.get("kind") != "fault" or e["phase"] != "start":
            continue
        assert e["host"] == host[e["node"]], e  # every fault of these names its node's host
        if e["name"] == "kill":
            assert (e["host"], f"kill -KILL {e['pid']}") in commands, e
        elif e["name"] == "pause":
            assert (e["host"], f"kill -STOP {e['pid']}") in commands, e
            assert (e["host"], f"kill -CONT {e['pid']}") in commands, e
    # every clock step (and its undo) was written into the node's clock file on its host
    steps = [e for e in outcome.history if e.get("kind") == "clock_step"]
    assert any(e["offset_s"] for e in steps), steps
    for e in steps:
        wrote = f"printf '%s\\n' {e['offset_s']:.6f} > "
        clock_file = f"/clock-{label[e['node']]}.tmp"
        assert any(
            h == host[e["node"]] and wrote in cmd and clock_file in cmd for h, cmd in commands
        ), (e, commands)
    # the clock files on the hosts are removed at the end
    (run_dir,) = shared.iterdir()
    assert {
        ("a", f"rm -rf /tmp/jepsen-lite-{run_dir.name}"),
        ("b", f"rm -rf /tmp/jepsen-lite-{run_dir.name}"),
    } <= commands
    assert not (Path("/tmp") / f"jepsen-lite-{run_dir.name}").exists()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--hosts", "a,b"], "--hosts needs --dir"),
        (
            ["--hosts", "a,b", "--dir", "/x", "--nemesis", "disk-full"],
            "cannot be used with --hosts",
        ),
        (
            ["--hosts", "a,b", "--dir", "/x", "--nemesis", "partition"],
            "cannot be used with --hosts",
        ),
        (["--hosts", "a", "--dir", "/x", "--remote", "ssh"], "put {host} in it"),
        (["--hosts", "a", "--dir", "/x", "--remote-dir", "c=/y"], "names c, not in --hosts"),
        (["--remote-dir", "/y"], "need --hosts"),
        (["--dir", "/x", "--fs", "tmpfs", "--nemesis", "disk-full"], "--fs tmpfs cannot be used"),
    ],
)
def test_hosts_refusals(args: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    """What cannot work across hosts is refused before anything starts: exit 2, the reason."""
    from jepsen_lite.cli import main

    assert main([*args, "--duration", "1"]) == 2
    assert says in capsys.readouterr().err


def test_faults_is_the_one_list_of_fault_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every fault name the run accepts is a key of `faults.FAULTS`, each with its routine, and
    the nemesis runs a fault through that table: one rotation runs each fault asked for once."""
    assert len(FAULTS) == 8, FAULTS
    assert all(inspect.iscoroutinefunction(routine) for routine in FAULTS.values())
    assert set(GLUSTER_FAULTS) <= set(FAULTS)
    assert not hasattr(nem, "NEMESES"), "a second list of fault names"
    for name in FAULTS:  # the refusals that remain are about the setup, never the name
        problem = config_problem(RunConfig(nemesis=(name,))) or ""
        assert "unknown nemesis" not in problem, (name, problem)
    ran: list[str] = []
    for name in FAULTS:

        async def fake(nemesis: Nemesis, name: str = name) -> None:
            ran.append(name)

        monkeypatch.setitem(faults.FAULTS, name, fake)
    config = RunConfig(nemesis=tuple(FAULTS), ttl_s=0.001, gap_s=0.0, out=tmp_path)
    nemesis = Nemesis(Cluster(config, [tmp_path], tmp_path), config, random.Random(5))
    asyncio.run(nemesis.run(time.monotonic() + 0.05))
    assert sorted(ran[: len(FAULTS)]) == sorted(FAULTS), ran


def test_an_unknown_fault_name_is_refused_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fault name not in `faults.FAULTS` is refused, naming it and every known one: by the
    command line (exit 2) and by `run` (ValueError), before any directory is made."""
    from jepsen_lite.cli import main

    says = f"unknown nemesis bogus (known: {', '.join(FAULTS)})"
    assert config_problem(RunConfig(nemesis=("kill", "bogus"))) == says
    out = tmp_path / "out"
    assert main(["--nemesis", "kill,bogus", "--duration", "1", "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip() == says
    with pytest.raises(ValueError, match=r"unknown nemesis bogus \(known: kill, pause, "):
        run(RunConfig(nemesis=("bogus",), out=out))
    assert not out.exists()


def test_negative_control_no_fence_with_lock_faults(tmp_path: Path) -> None:
    """Lock files replaced under their owners let a second daemon own a shard; without fencing
    the first one's later records are accepted: the checker must say so."""
    config = RunConfig(
        fs="local",
        nodes=3,
        shards=4,
        duration=20,
        seed=14,
        nemesis=("lock-fault",),
        out=tmp_path / "out",
        unsafe_no_fence=True,
        # (enough traffic that the old owner writes during the overlap, however short)
        rate=90.0,
        gap_s=1.0,
        # without fencing a task may be lost for good: not worth the default 120 s wait
        drain_timeout=15.0,
    )
    outcome, _s = _run(config)
    assert any(f.name == "lock-fault" and f.verified for f in outcome.faults)
    kinds = {v.kind for v in outcome.report.violations}
    assert DOUBLE_OWNERSHIP in kinds, outcome.report.describe()


def test_clock_correction_picks_the_offset_that_fits() -> None:
    """A daemon's timestamp read while the clock nemesis had it 3 s ahead maps back to true
    time, even where the reading is ambiguous (after the step back to 0 the clock reads again
    what it read while ahead): the record before it in its file decides."""
    from jepsen_lite.history import ClockSteps

    s = 1_000_000
    clocks = ClockSteps()
    clocks.add("n1", 100 * s, 3 * s)
    clocks.add("n1", 105 * s, 0)
    assert clocks.true_time("n2@pid-9", 103 * s) == 103 * s  # another host: untouched
    assert clocks.true_time("n1@pid-7", 99 * s) == 99 * s  # before the step
    assert clocks.true_time("n1@pid-7", 104 * s) == 101 * s  # only +3 s fits
    # 107.5 s: true 104.5 s with +3 s, or true 107.5 s with 0: both fit.
    assert clocks.true_time("n1@pid-7", 107_500_000, hint=104 * s) == 104_500_000
    assert clocks.true_time("n1@pid-7", 107_500_000, hint=107 * s) == 107_500_000
