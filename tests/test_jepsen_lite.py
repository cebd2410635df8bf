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
  with `SNERD_GLUSTER_NETNS=1 tests/glusterfs/up.sh` and takes it down; skipped where it cannot,
  a failure under SNERD_REQUIRE_ALL=1): mount A's client cut off beyond the volume's
  network.ping-timeout and healed, and features.locks-monkey-unlocking switched on and off;
- the negative control: daemons without fencing (SNERD_TEST_UNSAFE_NO_FENCE=1) and lock files
  replaced under their owners: the checker must report the double ownership.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sim.checker import DOUBLE_OWNERSHIP

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "jepsen-lite"))

from jepsen_lite import control
from jepsen_lite import nemesis as nem
from jepsen_lite.control import FULL_SLACK, Outcome, RunConfig, gluster_control, run
from jepsen_lite.plot import plot
from jepsen_lite.report import summary, summary_table

from tests import glusterfs as gl
from tests.conftest import missing_tool

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
    # The run did work, through faults: acks, executions, and takeovers after kills.
    assert int(s["ok"]) > 200, s  # type: ignore[call-overload]
    assert int(s["executions"]) >= int(s["ok"]), s  # type: ignore[call-overload]
    assert (config_out := outcome.out / "history.jsonl").stat().st_size > 0, config_out
    assert (outcome.out / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


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

    async def boom(self: control.Run) -> tuple[bool, list[str]]:
        seen.append(nem.mounted_fstype(self.dirs[0]))
        raise RuntimeError("boom")

    monkeypatch.setattr(control.Run, "_main", boom)
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
        str(Path(__file__).resolve().parent.parent / "jepsen-lite" / "run.py"),
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


def test_glusterfs_clear_locks(gluster_volume: gl.GlusterVolume | str, tmp_path: Path) -> None:
    """The brick forgets a shard owner's flock (clear-locks) while the owner is frozen past its
    lease: the lock is free from the other mount at once, another node takes the shard and its
    lock, the old owner wakes believing it still holds both; leases and epochs keep every
    promise (the checker passes) and the old owner gives the shard up."""
    if isinstance(gluster_volume, str):
        missing_tool(f"no GlusterFS volume: {gluster_volume}")
    volume = gluster_volume
    nemeses = ("clear-locks",)
    with gl.fresh_directory(volume, "jepsen-clear-locks") as dirs:
        config = RunConfig(
            fs="glusterfs",
            nodes=2,
            shards=2,
            duration=30,
            seed=18,
            nemesis=nemeses,
            out=tmp_path / "out",
            gluster_dirs=dirs,
            gluster=gluster_control(volume),
            rate=10.0,
            gap_s=2.0,
        )
        outcome, s = _run(config)
    _assert_clean(outcome, s, nemeses)
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
    nemeses = ("partition", "monkey-unlock")
    volume = gluster_netns_volume
    with gl.fresh_directory(volume, "jepsen-partition") as dirs:
        config = RunConfig(
            fs="glusterfs",
            nodes=2,
            shards=2,
            duration=32,
            seed=15,
            nemesis=nemeses,
            out=tmp_path / "out",
            gluster_dirs=dirs,
            gluster=gluster_control(volume),
            rate=10.0,
            gap_s=2.0,
        )
        outcome, s = _run(config)
    _assert_clean(outcome, s, nemeses)
    # the first cut (a fast heal leaves time for a second one; each is verified all the same)
    cut = next(f for f in outcome.faults if f.name == "partition")
    assert cut.info["ping_timeout_s"] == 10.0, cut.info  # tests/glusterfs/up.sh sets it
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
        rate=30.0,
        gap_s=1.0,
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
