"""snerd on a real GlusterFS volume mounted twice on this host (tests/support/glusterfs): the
startup filesystem check and the lock probe, flock on shard lock files across the two mounts,
and the cluster of real daemons under faults with its daemons alternating between mount A and
mount B.

Each mount is its own gluster client, so a lock, rename or append made through one reaches the
other only through the brick, as between two hosts. Without a volume these tests skip (fail
under SNERD_REQUIRE_ALL=1); see docs/deployment.md, "Testing on GlusterFS".
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import trio

from snerd.core.ownership import LockText
from snerd.io.fscheck import (
    LOCK_PROBE,
    check_data_directory,
    find_mount,
    judge_lock_probe,
    lock_proves_liveness,
    other_process_tries_lock,
    probe_lock_exclusion,
)
from snerd.io.membership import ShardLocks
from tests.io.test_fscheck import held_flock
from tests.support.daemon import Daemon
from tests.support.glusterfs import GlusterVolume, gluster_source
from tests.system.test_cluster import SHARDS, epoch_report, run_chaos

LEASE_ENV = {"SNERD_SHARDS": "1", "SNERD_LEASE_TTL": "1.5", "SNERD_CLOCK_SKEW_MARGIN": "0.25"}


def volume_name(volume: GlusterVolume) -> str:
    source = gluster_source(volume.a)
    assert source is not None
    return source.rpartition(":")[2].strip("/")


# --- the startup check ------------------------------------------------------------------------

def test_the_startup_check_sees_glusterfs_through_each_mount_and_warns_about_strict_locks(
    gluster_volume: GlusterVolume, gluster_dirs: tuple[Path, Path]
) -> None:
    vol = volume_name(gluster_volume)
    for directory, mount_point in zip(gluster_dirs, (gluster_volume.a, gluster_volume.b),
                                      strict=True):
        mount = find_mount(directory)
        assert mount is not None
        assert (mount.fs_type, mount.fuse_subtype) == ("fuse.glusterfs", "glusterfs"), mount
        assert mount.mount_point == os.path.realpath(mount_point)
        assert mount.source.endswith(f":/{vol}"), mount
        # a free lock proves nothing about its last holder here: only the lease decides
        assert not lock_proves_liveness(directory)

        found, warnings = check_data_directory(directory)  # raises if refused
        assert found == mount
        assert len(warnings) == 1, warnings  # the GlusterFS warning; the probe passed quietly
        assert "fuse.glusterfs" in warnings[0] and str(directory) in warnings[0]
        assert f"`gluster volume get {vol} client.strict-locks`" in warnings[0]
        assert (directory / LOCK_PROBE).exists()


def test_the_lock_probe_passes_on_each_mount_and_a_probe_lock_held_through_one_blocks_the_other(
    gluster_dirs: tuple[Path, Path],
) -> None:
    a, b = gluster_dirs
    for directory in (a, b):
        probe = probe_lock_exclusion(directory)
        assert probe.outcome == "excluded", probe
        assert judge_lock_probe(probe).kind == "ok"
        assert probe.elapsed_s < 5, probe
    # across the mounts: the second process, on B, is blocked by our lock taken on A ...
    with held_flock(a / LOCK_PROBE):
        assert other_process_tries_lock(str(b / LOCK_PROBE)) == ("excluded", "")
        assert probe_lock_exclusion(b).outcome == "held_elsewhere"
    # ... and gets the lock once it is released (so the probe can tell the two apart here)
    assert other_process_tries_lock(str(b / LOCK_PROBE)) == ("not_excluded", "")
    with held_flock(b / LOCK_PROBE):
        assert other_process_tries_lock(str(a / LOCK_PROBE)) == ("excluded", "")


async def test_a_daemon_on_mount_b_warns_once_passes_the_probe_and_runs_a_task(
    gluster_volume: GlusterVolume, gluster_dirs: tuple[Path, Path], nursery: trio.Nursery
) -> None:
    _, b = gluster_dirs
    d = await Daemon.start(nursery, b / "q", env=LEASE_ENV)
    m = await d.recv(timeout=20)
    assert m["action"] == "membership" and m["owned"] == ["shard-0"], m
    await d.send({"action": "register", "task_type": "t"})
    await d.enqueue("job-1")
    ex = await d.wait_for(lambda m: m.get("action") == "execute", timeout=20)
    assert ex["task_id"] == "job-1"
    await d.send({"action": "result", "task_id": "job-1", "status": "success", "attempt": 1})
    await d.close_stdin()
    assert await d.wait(timeout=30) == 0
    stderr = d.stderr.decode()
    warnings = [ln for ln in stderr.splitlines() if "WARNING" in ln]
    assert len(warnings) == 1, stderr
    assert "fuse.glusterfs" in warnings[0]
    assert f"gluster volume get {volume_name(gluster_volume)} client.strict-locks" in warnings[0]
    assert "lock probe" not in stderr and "refusing" not in stderr, stderr


# --- shard locks across the mounts ------------------------------------------------------------

def test_a_shard_lock_taken_through_mount_a_excludes_mount_b_until_released(
    gluster_dirs: tuple[Path, Path],
) -> None:
    a, b = gluster_dirs
    on_a, on_b = ShardLocks(a), ShardLocks(b)
    try:
        assert on_a.try_lock(3, "node-a", 2)
        assert not on_b.try_lock(3, "node-b")
        # Its write (pid, owner, the claim's epoch), read via B.
        assert ShardLocks(b).holder(3) == f"{os.getpid()} node-a 2"
        on_a.touch(3, "node-a-renewed")
        assert on_b.holder(3) == f"{os.getpid()} node-a-renewed 2"
        on_a.unlock(3)
        assert on_b.try_lock(3, "node-b", 3)  # free at once through the other mount...
        # ...and what its last holder wrote through A is what B reads on taking it.
        # (it let the lock go alive: the file says so)
        assert on_b.previous[3] == LockText(
            pid=os.getpid(), owner="node-a-renewed", epoch=2, released=True
        )
        assert not on_a.try_lock(3, "node-a")
        assert on_a.holder(3) == f"{os.getpid()} node-b 3"
    finally:
        on_a.unlock_all()
        on_b.unlock_all()


async def test_a_daemon_on_mount_b_cannot_take_a_shard_whose_lock_is_held_through_mount_a(
    gluster_dirs: tuple[Path, Path], nursery: trio.Nursery
) -> None:
    a, b = gluster_dirs
    (a / "q").mkdir()
    holder = ShardLocks(a / "q")
    assert holder.try_lock(0, "holder-on-a")
    try:
        d = await Daemon.start(nursery, b / "q", env=LEASE_ENV)
        # Its membership claims the shard (no lease stands in its way), but the flock does:
        # for two leases and more the daemon does not act for shard-0.
        announced: list[list[str]] = []
        with trio.move_on_after(4):
            while True:
                m = await d.recv(timeout=20)
                if m.get("action") == "membership":
                    announced.append(m["owned"])
        assert announced and all(owned == [] for owned in announced), announced
        assert f"held by: {os.getpid()} holder-on-a" in d.stderr.decode(), d.stderr.decode()
    finally:
        holder.unlock(0)
    started = time.monotonic()
    m = await d.wait_for(lambda m: m.get("action") == "membership" and m["owned"], timeout=15)
    assert m["owned"] == ["shard-0"]
    took = time.monotonic() - started
    # ... and now the daemon's lock, taken through B, excludes mount A
    assert not ShardLocks(a / "q").try_lock(0, "intruder")
    await d.close_stdin()
    assert await d.wait(timeout=30) == 0
    assert took < 10, took


# --- the cluster under faults, across the mounts ----------------------------------------------

@pytest.mark.slow
async def test_a_cluster_across_two_glusterfs_mounts_survives_kill_stop_and_drain(
    gluster_dirs: tuple[Path, Path], nursery: trio.Nursery
) -> None:
    """tests/system/test_cluster.py's scenario with daemons a, c, e on mount A and b, d on mount B:
    kill -9, SIGSTOP past the lease, SIGTERM, two joins; every acked task runs, epochs stay
    clean, the shards end evenly spread."""
    a, b = gluster_dirs
    # Locks, renames and fsyncs cost milliseconds here, and CI runs the volume's daemons on
    # the same two cores: a looser bound against hanging than on a local disk.
    await run_chaos(nursery, [a / "q", b / "q"], within=180)
    # what the daemons on both mounts wrote reads the same through either mount
    logs = sorted(p.relative_to(a) for p in a.glob("q/shard-*/tasks/tasks.log"))
    assert len(logs) == SHARDS, logs
    for log in logs:
        assert (a / log).read_bytes() == (b / log).read_bytes(), log
    assert epoch_report(b / "q") == []
