"""What one jepsen-lite run is asked to do (`RunConfig`: the filesystem, the nodes and hosts,
the nemesis, the load, the lease), and what cannot run (`config_problem`), refused before
anything starts: the command line exits 2 with the reason, `phases.run` raises ValueError.

Every refusal lives here, once. The fault names are `faults.FAULTS`'s; this module only says
which faults need which filesystem or host setup.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from jepsen_lite import nemesis as nem
from jepsen_lite.faults import FAULTS, GLUSTER_FAULTS

__all__ = ["DEFAULT_REMOTE", "RunConfig", "config_problem"]

#: How `--remote` reaches a host by default.
DEFAULT_REMOTE = "ssh -o BatchMode=yes {host}"


@dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig:
    fs: str = "local"
    nodes: int = 3
    shards: int = 4
    duration: float = 60.0
    seed: int = 0
    nemesis: tuple[str, ...] = ("kill", "pause", "clock")
    out: Path = Path("jepsen-out")
    #: Client enqueues per second, across the cluster.
    rate: float = 20.0
    ttl_s: float = 3.0
    margin_s: float = 0.5
    #: Seconds between the end of one fault and the start of the next.
    gap_s: float = 3.0
    #: Job-control commands per second across the cluster (`jepsen_lite.commands`: cancels,
    #: retries, sweeps, pauses of a type or of the queue; 0: none).
    command_rate: float = 1.0
    #: The negative control: daemons without fencing (SNERD_TEST_UNSAFE_NO_FENCE=1).
    unsafe_no_fence: bool = False
    #: Negative controls of the commands: daemons that answer a cancel `cancelled` and leave
    #: the task as it was (SNERD_TEST_UNSAFE_IGNORE_CANCEL=1), or whose dispatch does not look
    #: at pauses (SNERD_TEST_UNSAFE_IGNORE_PAUSE=1).
    unsafe_ignore_cancel: bool = False
    unsafe_ignore_pause: bool = False
    #: The two directories (mount A, mount B) of a GlusterFS run; found or brought up if None.
    gluster_dirs: tuple[Path, Path] | None = None
    #: The volume behind `gluster_dirs`, for the partition, monkey-unlock and clear-locks
    #: nemeses (found with the volume when the run brings it up itself).
    gluster: nem.GlusterControl | None = None
    #: Mount points of one shared filesystem (your own EFS, GlusterFS, Lustre...): the run
    #: makes a fresh directory under the first and uses it through each, nodes in turn.
    dirs: tuple[Path, ...] = ()
    #: Longest wait for the drain, seconds.
    drain_timeout: float = 120.0
    #: Share of tasks in the rate-limited group.
    rl_share: float = 0.04
    #: Share of enqueues that are children (`trigger_after_ids`) of 1-3 recent tasks enqueued
    #: through other nodes (`load.Load.parents`; 0: none). At the default rate a minute's run
    #: has some sixty children.
    deps_share: float = 0.05
    #: Of the children: the share that also names the task the load enqueues next (a child
    #: sent before its parent), and the share that names a parent nobody ever enqueues.
    child_first_share: float = 0.2
    ghost_share: float = 0.05
    #: SNERD_UNKNOWN_PARENT_SECONDS of the daemons: how long a child waits for a parent no
    #: file holds before it is dead-lettered (`unknown_parent`). Longer than a pause of the
    #: nemesis (a parent stamped by a frozen daemon and written after it wakes is waited for),
    #: short enough that the children of never-enqueued parents end within the drain.
    unknown_parent_s: float = 10.0
    #: A named schedule every node declares at each start (`schedule_cron`, a cron with
    #: seconds; "" for none), removed as the drain begins: its runs are judged by invariant 11.
    schedule_cron: str = "*/2 * * * * *"
    tmpfs_size: str = "48m"
    #: Size of the ext4 image of `fs="loop"`, MiB.
    loop_size_mib: int = 64
    #: Hosts to run the workers (and their daemons) on, round-robin; empty: all on this one.
    #: Needs `dirs`: the shared filesystem as this host sees it (the logs are read back
    #: through it).
    hosts: tuple[str, ...] = ()
    #: The command that runs a shell command line on `{host}` (given as one more argument).
    remote: str = DEFAULT_REMOTE
    #: The interpreter (of a venv with snerd installed) and the checkout on the hosts; by
    #: default the paths they have here.
    remote_python: str | None = None
    remote_repo: str | None = None
    #: The shared filesystem's mount point on the hosts: ("", path) for every host, (host,
    #: path) for one; by default the `dirs` path, the same everywhere.
    remote_dirs: tuple[tuple[str, str], ...] = ()


def config_problem(config: RunConfig) -> str | None:
    """Why `config` cannot run (the command line exits 2 with it), or None."""
    nemesis = config.nemesis
    shares = {
        "deps_share": config.deps_share,
        "child_first_share": config.child_first_share,
        "ghost_share": config.ghost_share,
    }
    for name, share in shares.items():
        if not 0.0 <= share <= 1.0:
            return f"{name} {share:g} is not a share: give one from 0 to 1"
    if config.command_rate < 0:
        return f"command_rate {config.command_rate:g}: give commands per second, 0 for none"
    if (config.unsafe_ignore_cancel or config.unsafe_ignore_pause) and config.command_rate <= 0:
        return "the unsafe ignore-cancel and ignore-pause controls need commands: a command_rate"
    if config.unknown_parent_s <= 0:
        return f"unknown_parent_s {config.unknown_parent_s:g}: give a number of seconds above 0"
    if config.deps_share > 0 and config.drain_timeout <= config.unknown_parent_s:
        return (
            f"a drain of {config.drain_timeout:g} s is too short for the children of parents "
            f"nobody enqueues, dead-lettered only after {config.unknown_parent_s:g} s: give a "
            "longer drain, a shorter unknown-parent wait, or no dependencies"
        )
    unknown_faults = [n for n in nemesis if n not in FAULTS]
    if unknown_faults:
        return f"unknown nemesis {', '.join(unknown_faults)} (known: {', '.join(FAULTS)})"
    gluster_only = [n for n in nemesis if n in GLUSTER_FAULTS]
    if config.hosts:
        if not config.dirs:
            return (
                "--hosts needs --dir: the shared filesystem's mount point on this host (the "
                "run makes its directory there and reads the daemons' logs back through it)"
            )
        if "disk-full" in nemesis:
            return (
                "the disk-full nemesis cannot be used with --hosts: it fills a tmpfs or "
                "loop-mounted ext4 made on this host, which the other hosts do not share"
            )
        if gluster_only:
            return (
                f"the {', '.join(gluster_only)} nemesis cannot be used with --hosts: it needs "
                "the test volume of --fs glusterfs on this host (its glusterd, and for "
                "partition mount A's client in a local network namespace)"
            )
        if "{host}" not in config.remote:
            return f"--remote {config.remote!r} does not name the host: put {{host}} in it"
        if len(set(config.hosts)) != len(config.hosts) or not all(config.hosts):
            return f"--hosts {','.join(config.hosts)}: empty or repeated host names"
        if config.nodes < len(config.hosts):
            return f"--nodes {config.nodes} is fewer than the {len(config.hosts)} --hosts"
        unknown = [h for h, _ in config.remote_dirs if h and h not in config.hosts]
        if unknown:
            return f"--remote-dir names {', '.join(unknown)}, not in --hosts"
    elif (
        config.remote != DEFAULT_REMOTE
        or config.remote_dirs
        or config.remote_python
        or config.remote_repo
    ):
        return "--remote, --remote-dir, --remote-python and --remote-repo need --hosts"
    if config.dirs and config.fs != "local":
        return f"--dir is your own filesystem: --fs {config.fs} cannot be used with it"
    if gluster_only and config.fs != "glusterfs":
        return f"the {', '.join(gluster_only)} nemesis needs --fs glusterfs"
    if "disk-full" in nemesis and config.fs not in nem.FILLABLE_FS:
        return "the disk-full nemesis needs --fs tmpfs or --fs loop (a small filesystem to fill)"
    if gluster_only and config.gluster_dirs is not None and config.gluster is None:
        return f"the {', '.join(gluster_only)} nemesis needs RunConfig.gluster"
    if "partition" in nemesis and config.gluster is not None and not config.gluster.link_a:
        return "the partition nemesis needs mount A's client in a network namespace"
    return None
