"""Files in the data directory are never reached through a symbolic link (`snerd.io.files`):
the helper itself, every writer that uses it (logs, compaction, locks, membership.json, inbox
hints, the operator tools), and a real daemon on a directory with a planted link."""

from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path

import pytest
import trio

from snerd.core.effects import KeepRange
from snerd.core.records import encode_record, scan
from snerd.io import inbox
from snerd.io.files import RefusedFile, make_dirs, open_file, read_small, unlink_file
from snerd.io.log import GroupCommitLog, atomic_replace, read_log, recover_log
from snerd.io.membership import ShardLocks, read_membership
from tests.support.daemon import SNERDMQ, Daemon

SECRET = b"the daemon's user owns this file; nobody may make snerd write into it\n"


def line(i: int) -> bytes:
    return encode_record({"taskId": f"t{i}", "taskType": "t", "taskData": "{}", "retryCount": 0})


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file outside the data directory that a planted link points at."""
    path = tmp_path / "victim"
    path.write_bytes(SECRET)
    return path


def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SNERDMQ, *map(str, args)], capture_output=True, text=True, timeout=60, check=False
    )


# -- the helper ----------------------------------------------------------------------------------


def test_a_link_as_the_file_is_refused_naming_the_path(tmp_path: Path, victim: Path) -> None:
    link = tmp_path / "q" / "tasks.log"
    link.parent.mkdir()
    link.symlink_to(victim)
    for flags in (os.O_RDONLY, os.O_RDWR | os.O_APPEND, os.O_RDWR | os.O_CREAT):
        with pytest.raises(RefusedFile) as caught:
            open_file(link, flags)
        assert str(caught.value).startswith(f"refusing to follow the symlink {link}")
        assert caught.value.filename == str(link)
    with pytest.raises(FileExistsError):  # O_EXCL never follows a link either
        open_file(link, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    assert victim.read_bytes() == SECRET


def test_a_link_as_a_directory_below_the_root_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "q"
    elsewhere = tmp_path / "elsewhere" / "tasks"
    elsewhere.mkdir(parents=True)
    (elsewhere / "tasks.log").write_bytes(SECRET)
    root.mkdir()
    (root / "shard-0").symlink_to(elsewhere.parent)
    path = root / "shard-0" / "tasks" / "tasks.log"
    open_file(path, os.O_RDONLY)  # without a root only the last component is checked...
    with pytest.raises(RefusedFile) as caught:  # ...with one, every directory below it
        open_file(path, os.O_RDWR, root=root)
    assert f"refusing to follow the symlink {root / 'shard-0'}" in str(caught.value)
    with pytest.raises(RefusedFile):
        make_dirs(root / "shard-0" / "inbox", root=root)
    assert not (elsewhere.parent / "inbox").exists()


def test_the_data_directory_itself_may_be_a_link(tmp_path: Path) -> None:
    real = tmp_path / "real"
    (real / "shard-0").mkdir(parents=True)
    (tmp_path / "q").symlink_to(real)
    fd = open_file(
        tmp_path / "q" / "shard-0" / ".lock", os.O_RDWR | os.O_CREAT, root=tmp_path / "q"
    )
    os.close(fd)
    assert (real / "shard-0" / ".lock").is_file()


def test_special_files_are_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "tasks.log"
    os.mkfifo(fifo)
    with pytest.raises(RefusedFile) as caught:
        open_file(fifo, os.O_RDONLY)  # a plain open would wait for a writer forever
    assert str(caught.value) == f"{fifo} is a FIFO, not a regular file"
    directory = tmp_path / "membership.json"
    directory.mkdir()
    with pytest.raises(RefusedFile, match="is a directory, not a regular file"):
        read_small(directory, None)
    with pytest.raises(RefusedFile, match="is a directory, not a regular file"):
        open_file(directory, os.O_RDWR)


def test_a_regular_file_opens_blocking(tmp_path: Path) -> None:
    path = tmp_path / "f"
    fd = open_file(path, os.O_RDWR | os.O_CREAT)
    try:
        assert os.get_blocking(fd)  # O_NONBLOCK was only for the open
    finally:
        os.close(fd)


def test_unlink_removes_the_link_never_its_target(tmp_path: Path, victim: Path) -> None:
    link = tmp_path / "tasks.tmp"
    link.symlink_to(victim)
    unlink_file(link)
    assert not os.path.lexists(link) and victim.read_bytes() == SECRET


# -- the writers ---------------------------------------------------------------------------------


async def test_appends_to_a_linked_log_fail_and_leave_the_target_alone(
    tmp_path: Path, victim: Path
) -> None:
    root = tmp_path / "q"
    path = root / "shard-0" / "tasks" / "tasks.log"
    path.parent.mkdir(parents=True)
    path.symlink_to(victim)
    async with GroupCommitLog(root=root) as log:
        with pytest.raises(OSError) as caught:
            await log.append(path, [line(1)])
    assert caught.value.errno == errno.ELOOP
    assert str(caught.value.strerror).startswith(f"refusing to follow the symlink {path}")
    with pytest.raises(RefusedFile):
        recover_log(path, root=root)  # it would have cut the target's "torn tail"
    with pytest.raises(RefusedFile):
        list(read_log(path, root=root))
    assert victim.read_bytes() == SECRET


async def test_compaction_removes_a_planted_temp_link_and_writes_a_file_of_its_own(
    tmp_path: Path, victim: Path
) -> None:
    root = tmp_path / "q"
    path = root / "shard-0" / "tasks" / "tasks.log"
    async with GroupCommitLog(root=root) as log:
        offsets = await log.append(path, [line(1), line(2)])
        (path.parent / "tasks.tmp").symlink_to(victim)
        await log.compact(path, [KeepRange(offset=offsets[1], length=len(line(2)))])
        assert await log.append(path, [line(3)]) == (len(line(2)),)
    assert victim.read_bytes() == SECRET
    assert not path.is_symlink() and path.read_bytes() == line(2) + line(3)
    assert not os.path.lexists(path.parent / "tasks.tmp")


def test_atomic_replace_never_writes_through_a_planted_temp_link(
    tmp_path: Path, victim: Path
) -> None:
    target = tmp_path / "membership.json"
    (tmp_path / "membership.json.tmp").symlink_to(victim)
    atomic_replace(target, b"{}\n")
    assert victim.read_bytes() == SECRET and target.read_bytes() == b"{}\n"
    assert not target.is_symlink()


def test_lock_files_and_membership_are_never_followed(tmp_path: Path, victim: Path) -> None:
    (tmp_path / "shard-0").mkdir()
    (tmp_path / "shard-0" / ".lock").symlink_to(victim)
    locks = ShardLocks(tmp_path)
    with pytest.raises(RefusedFile, match="refusing to follow the symlink"):
        locks.try_lock(0, "me@pid-1-aaaaaa", 1)
    assert locks.holder(0) == "unknown"  # nor read through, into a log line
    (tmp_path / "membership.json").symlink_to(victim)
    with pytest.raises(RefusedFile):
        read_membership(tmp_path)
    os.unlink(tmp_path / "membership.json")
    os.unlink(tmp_path / ".membership.lock")  # (made by the read above)
    (tmp_path / ".membership.lock").symlink_to(victim)
    with pytest.raises(RefusedFile):
        read_membership(tmp_path)
    assert victim.read_bytes() == SECRET


def test_inbox_hints_never_write_through_a_planted_link(tmp_path: Path, victim: Path) -> None:
    folder = tmp_path / "shard-0" / "inbox"
    folder.mkdir(parents=True)
    (folder / "n1.read.tmp").symlink_to(victim)
    inbox.mark_read(tmp_path, 0, "n1", 42)
    assert victim.read_bytes() == SECRET
    assert (folder / "n1.read").read_bytes() == b"42\n"
    os.unlink(folder / "n1.read")
    (folder / "n1.read").symlink_to(victim)
    (folder / "n1.log").write_bytes(line(1))
    assert inbox.inbox_progress(tmp_path, ((0, "n1"),)) == [(0, "n1", None, len(line(1)))]


def test_an_inbox_folder_that_is_a_link_is_an_error_not_a_read(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "n1.log").write_bytes(line(1))
    (tmp_path / "shard-0").mkdir()
    (tmp_path / "shard-0" / "inbox").symlink_to(elsewhere)
    chunks, errors, _present = inbox.read_inboxes(tmp_path, {0: {}}, 1 << 20)
    assert chunks == []
    assert len(errors) == 1 and "refusing to follow the symlink" in errors[0][1]


# -- the operator tools ----------------------------------------------------------------------------


def test_compact_and_fsck_with_planted_links(tmp_path: Path, victim: Path) -> None:
    q = tmp_path / "q"
    assert cli("add-shards", "2", q).returncode == 0
    log0 = q / "shard-0" / "tasks" / "tasks.log"
    log0.write_bytes(line(1) + line(1) + line(2))
    (log0.parent / "tasks.tmp").symlink_to(victim)
    out = cli("compact", q)
    assert out.returncode == 0, out.stdout + out.stderr
    assert victim.read_bytes() == SECRET
    assert not log0.is_symlink()
    assert [r.fields["taskId"] for r in scan(log0.read_bytes()).records] == ["t1", "t2"]

    log1 = q / "shard-1" / "tasks" / "tasks.log"
    log1.symlink_to(victim)
    fifo = q / "shard-0" / "inbox"
    fifo.mkdir()
    os.mkfifo(fifo / "n1.log")
    out = cli("fsck", q)
    assert out.returncode == 1
    assert f"{log1} is a symbolic link" in out.stdout
    assert f"{fifo / 'n1.log'} is a FIFO, not a regular file" in out.stdout
    report = json.loads(cli("fsck", q, "--json").stdout)
    refused = [e["path"] for s in report["shards"] for e in s["refused_entries"]]
    assert refused == [str(fifo / "n1.log"), str(log1)]
    out = cli("compact", q)
    assert out.returncode == 1 and f"refusing to follow the symlink {log1}" in out.stdout
    out = cli("validate", q)
    assert out.returncode == 1 and f"shard-1: {log1} is a symbolic link" in out.stdout
    assert victim.read_bytes() == SECRET


def test_add_shards_never_creates_directories_through_a_link(tmp_path: Path) -> None:
    q = tmp_path / "q"
    assert cli("add-shards", "1", q).returncode == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (q / "shard-1").symlink_to(elsewhere)
    out = cli("add-shards", "1", q)
    assert out.returncode == 1 and "refusing to follow the symlink" in out.stderr
    assert list(elsewhere.iterdir()) == []


# -- a real daemon ---------------------------------------------------------------------------------


async def test_a_daemon_serves_its_other_shards_when_one_log_is_a_link(
    tmp_path: Path, victim: Path, nursery: trio.Nursery
) -> None:
    q = tmp_path / "q"
    assert cli("add-shards", "2", q).returncode == 0
    log0 = q / "shard-0" / "tasks" / "tasks.log"
    log0.symlink_to(victim)
    d = await Daemon.start(nursery, q)
    first = await d.recv(timeout=20)
    assert first["action"] == "membership" and first["owned"] == ["shard-1"]
    await d.wait_stderr(f"its files cannot be used: refusing to follow the symlink {log0}")
    assert "Traceback" not in d.stderr.decode()
    for i in range(8):  # tasks of both shards are acked (shard-0's wait in its inbox)
        await d.enqueue(f"k{i}")
    acks = [await d.wait_for(lambda m: m.get("task_id") is not None) for _ in range(8)]
    assert {m["action"] for m in acks} == {"ack"}, acks
    await d.close_stdin()
    assert await d.wait() == 0
    assert victim.read_bytes() == SECRET and log0.is_symlink()
    out = cli("validate", q)
    assert out.returncode == 1 and f"{log0} is a symbolic link" in out.stdout


async def test_a_daemon_never_writes_through_a_lock_file_link(
    tmp_path: Path, victim: Path, nursery: trio.Nursery
) -> None:
    q = tmp_path / "q"
    assert cli("add-shards", "1", q).returncode == 0
    (q / "shard-0" / ".lock").symlink_to(victim)
    d = await Daemon.start(nursery, q)
    first = await d.recv(timeout=20)
    assert first["action"] == "membership" and first["owned"] == []
    await d.wait_stderr(f"refusing to follow the symlink {q / 'shard-0' / '.lock'}")
    await d.close_stdin()
    assert await d.wait() == 0
    assert victim.read_bytes() == SECRET
    assert "Traceback" not in d.stderr.decode()


def test_the_lock_probe_never_opens_a_link(tmp_path: Path, victim: Path) -> None:
    from snerd.io import fscheck, lockprobe

    (tmp_path / fscheck.LOCK_PROBE).symlink_to(victim)
    probe = fscheck.probe_lock_exclusion(tmp_path)
    assert probe.outcome == "failed" and "refusing to follow the symlink" in probe.detail
    assert lockprobe.try_lock(str(tmp_path / fscheck.LOCK_PROBE)) == lockprobe.FAILED
    assert victim.read_bytes() == SECRET


def test_an_upstream_layout_with_a_linked_lock_is_not_adopted(tmp_path: Path, victim: Path) -> None:
    from snerd.io.layout import AdoptionRefused, adopt_legacy_layout

    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "tasks.log").write_bytes(line(1))
    (tmp_path / ".lock").symlink_to(victim)
    with pytest.raises(AdoptionRefused, match="refusing to follow the symlink"):
        adopt_legacy_layout(tmp_path)
    assert (tmp_path / "tasks" / "tasks.log").read_bytes() == line(1)
    os.unlink(tmp_path / ".lock")
    assert adopt_legacy_layout(tmp_path) is not None
    assert (tmp_path / "shard-0" / "tasks" / "tasks.log").read_bytes() == line(1)
