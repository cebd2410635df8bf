"""A data directory that cannot hold a queue, and a daemon started without its stdin or stdout:
each is one line on stderr naming the path (or the fd) and the problem, exit code 2, never a
traceback; the embedded engine raises `DataDirectoryError` itself and the SDK's `DaemonExited`
carries the daemon's line (`snerd.io.datadir`, `snerd.cli`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

import snerd
from snerd import DaemonExited, Engine, SnerdQueue
from snerd.io.datadir import prepare_data_directory
from tests.conftest import fill, missing_tool, small_tmpfs

SNERDMQ = Path(sys.executable).parent / "snerdmq"
#: The uid a root test runs the daemon as, to meet a directory it may not write.
NOBODY = 65534


def daemon(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """`snerdmq ARGS` as a real process, stdin at EOF unless told otherwise."""
    kwargs.setdefault("stdin", subprocess.DEVNULL)
    kwargs.setdefault("stdout", subprocess.PIPE)
    return subprocess.run(
        [str(SNERDMQ), *args], stderr=subprocess.PIPE, text=True, timeout=60, **kwargs
    )


def assert_refused(proc: subprocess.CompletedProcess[str], *words: str) -> str:
    """Exit 2, and stderr is one line that says `words`, no traceback."""
    err = proc.stderr
    assert proc.returncode == 2, err
    assert "Traceback" not in err, err
    assert err.count("\n") == 1 and err.startswith("[Snerd] ERROR: refusing to start: "), err
    for word in words:
        assert word in err, (word, err)
    return err


def test_a_file_is_refused_as_the_data_directory(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("not a queue")
    assert_refused(
        daemon(str(tmp_path / "f")), f"data directory {tmp_path / 'f'} is a regular file"
    )
    assert (tmp_path / "f").read_text() == "not a queue"


def test_a_directory_under_a_file_is_refused_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    assert_refused(
        daemon(str(tmp_path / "f" / "sub" / "q")),
        f"cannot create data directory {tmp_path / 'f' / 'sub' / 'q'}",
        f"{tmp_path / 'f'} is a regular file, not a directory",
    )


def test_a_fifo_and_a_dangling_symlink_are_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    assert_refused(daemon(str(tmp_path / "fifo")), "is a FIFO, not a directory")
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    assert_refused(daemon(str(tmp_path / "link")), "is a symlink to nothing")
    assert not (tmp_path / "nowhere").exists()


@contextlib.contextmanager
def read_only_mount(where: Path) -> Iterator[Path]:
    """A tmpfs at `where` holding a queue made while it was writable, then remounted read-only
    (root only: skipped, or failed under SNERD_REQUIRE_ALL=1, otherwise)."""
    with small_tmpfs(where, size="1m") as mnt:
        made = daemon(str(mnt / "q"))
        assert made.returncode == 0, made.stderr
        remount = subprocess.run(
            ["mount", "-o", "remount,ro", str(mnt)], capture_output=True, text=True
        )
        if remount.returncode != 0:
            missing_tool(f"cannot remount a tmpfs read-only: {remount.stderr.strip()}")
        yield mnt


def test_a_read_only_mount_is_refused_with_or_without_force(tmp_path: Path) -> None:
    with read_only_mount(tmp_path / "ro") as mnt:
        for args in ([str(mnt / "q")], ["--force", str(mnt / "q")], [str(mnt)]):
            assert_refused(daemon(*args), f"data directory {args[-1]} is on a read-only filesystem")
        assert_refused(
            daemon(str(mnt / "new")),
            f"cannot create data directory {mnt / 'new'}: the filesystem there is read-only",
        )


@contextlib.contextmanager
def unwritable_directory() -> Iterator[tuple[Path, dict[str, Any]]]:
    """A directory this user may enter but not write (mode 0o555), and how to run a daemon
    that meets it as such. Root passes any mode check, so as root the daemon runs as uid
    65534: the directory then lies under a fresh one everybody may enter (pytest's own is
    0o700)."""
    top = Path(tempfile.mkdtemp(prefix="snerd-unwritable-"))
    try:
        top.chmod(0o755)
        q = top / "q"
        q.mkdir()
        q.chmod(0o555)
        run_as: dict[str, Any] = {}
        if os.geteuid() == 0:
            run_as = {"user": NOBODY, "group": NOBODY, "extra_groups": [], "cwd": "/"}
            probe = subprocess.run(
                [sys.executable, "-c", "import snerd.cli"], capture_output=True, **run_as
            )
            if probe.returncode != 0:
                missing_tool(f"uid {NOBODY} cannot run this snerd: {probe.stderr[-300:]!r}")
        yield q, run_as
    finally:
        with contextlib.suppress(OSError):
            (top / "q").chmod(0o755)
        shutil.rmtree(top, ignore_errors=True)


def test_a_directory_this_user_cannot_write_is_refused() -> None:
    with unwritable_directory() as (q, run_as):
        uid = run_as.get("user", os.geteuid())
        assert_refused(daemon(str(q), **run_as), f"data directory {q} is not writable by uid {uid}")
        assert_refused(
            daemon(str(q / "sub"), **run_as),
            f"cannot create data directory {q / 'sub'}: permission denied",
        )
        assert list(q.iterdir()) == []


@pytest.mark.parametrize(("fd", "name"), [(1, "stdout"), (0, "stdin")])
def test_a_daemon_started_with_stdout_or_stdin_closed_is_refused(
    tmp_path: Path, fd: int, name: str
) -> None:
    # Closed in the child: stdout=DEVNULL would be an open fd.
    proc = daemon(str(tmp_path / "q"), stdin=None, stdout=None, preexec_fn=lambda: os.close(fd))
    assert_refused(proc, f"{name} (fd {fd}) is closed")
    assert not (tmp_path / "q").exists()


def test_a_daemon_started_with_stderr_closed_runs_and_never_writes_its_logs_elsewhere(
    tmp_path: Path,
) -> None:
    def close_stderr() -> None:
        os.close(2)

    # A refusal has nowhere to go: exit 2, and nothing on stdout, the protocol's stream
    # (print(file=sys.stderr) writes to sys.stdout when there is no stderr).
    refused = subprocess.run(
        [str(SNERDMQ), str(tmp_path / "q")],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
        env={**os.environ, "SNERD_SHARDS": "x"},
        preexec_fn=close_stderr,
    )
    assert (refused.returncode, refused.stdout) == (2, b"")
    # It runs: the logs are lost, and none lands in a file of the queue.
    line = (
        orjson.dumps(
            {
                "action": "enqueue",
                "task_id": "a",
                "task_type": "t",
                "task_data": "{}",
                "max_retries": 0,
                "retry_after_hours": 0,
            }
        )
        + b"\n"
    )
    proc = subprocess.run(
        [str(SNERDMQ), str(tmp_path / "q")],
        input=line,
        capture_output=True,
        timeout=60,
        preexec_fn=close_stderr,
    )
    assert proc.returncode == 0
    messages = [orjson.loads(m) for m in proc.stdout.splitlines()]
    assert {
        "action": "ack",
        "task_id": "a",
        "message": "Enqueued successfully",
        "shard": "shard-0",
    } in messages
    for path in (tmp_path / "q").rglob("*"):
        if path.is_file():
            assert b"[Snerd]" not in path.read_bytes(), path


def test_the_directory_is_made_with_its_parents_and_the_probe_leaves_nothing(
    tmp_path: Path,
) -> None:
    q = tmp_path / "a" / "b" / "q"
    prepare_data_directory(q)
    assert q.is_dir() and list(q.iterdir()) == []
    prepare_data_directory(q)  # again: nothing to do
    (tmp_path / "link").symlink_to(q)  # DIR itself may be a link: whoever starts snerd chose it
    prepare_data_directory(tmp_path / "link")
    assert list(q.iterdir()) == []


def test_a_full_filesystem_is_not_refused(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "small", size="64k") as mnt:
        (mnt / "q").mkdir()
        fill(mnt)
        prepare_data_directory(mnt / "q")


def test_the_engine_raises_the_error_itself_under_trio_and_asyncio(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")

    async def enter(directory: Path) -> None:
        async with Engine(directory):
            raise AssertionError("started on a file")

    async def start(directory: Path) -> None:
        await Engine(directory).start()

    for directory, text in [
        (tmp_path / "f", "is a regular file, not a directory"),
        (tmp_path / "f" / "q", f"{tmp_path / 'f'} is a regular file"),
    ]:
        for host in ("trio", "asyncio"):
            with pytest.raises(snerd.DataDirectoryError) as raised:
                if host == "trio":
                    trio.run(enter, directory)
                else:
                    asyncio.run(start(directory))
            assert text in str(raised.value)
            assert raised.value.filename == str(directory)


def test_the_sdk_says_the_daemons_refusal(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")

    async def main() -> None:
        async with SnerdQueue(storage_path=tmp_path / "f", stderr_prefix="") as q:
            await q.enqueue(None, "t", {})

    with pytest.raises(DaemonExited) as raised:
        trio.run(main)
    assert "exited with code 2" in str(raised.value)
    assert f"data directory {tmp_path / 'f'} is a regular file" in str(raised.value)
