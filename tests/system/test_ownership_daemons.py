"""Ownership at the edge, with real daemons: a daemon dying by an exception, capped daemons, and
a membership.json that cannot be used.

- A daemon that dies by an exception (here a real fault: it runs out of memory under
  RLIMIT_AS reading a huge line) withdraws its claims and lets its locks go unmarked, so the
  next daemon takes its shards at once, not after the lease (30 s + 5 s margin by default).
- Capped daemons (SNERD_MAX_SHARDS) never claim beyond their cap, and say why shards stay free.
- SIGTERM and stdin EOF end a daemon whose membership rounds fail at start; a membership.json
  corrupted while a daemon runs is said once, and the daemon keeps serving within its lease.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import trio

from tests.support.daemon import Daemon


def owning(count: int) -> Any:
    return lambda m: m.get("action") == "membership" and len(m["owned"]) == count


def claims(q: Path) -> dict[str, str]:
    doc = orjson.loads((q / "membership.json").read_bytes())
    return {k: c["owner"] for k, c in doc["claims"].items()}


async def run_out_of_memory(daemon: Daemon) -> int:
    """Make `daemon` die by an exception, a real one: its address space capped a little above
    what it uses now (RLIMIT_AS), then a line far larger than that (SNERD_MAX_LINE_BYTES is
    raised for it). Returns its exit code, once it has exited."""
    pid = daemon.proc.pid
    with open(f"/proc/{pid}/status") as f:
        vm = next(line for line in f if line.startswith("VmSize:"))
    size = int(vm.split()[1]) * 1024
    resource.prlimit(pid, resource.RLIMIT_AS, (size + (48 << 20), resource.RLIM_INFINITY))
    chunk = b"x" * (1 << 20)
    try:
        for _ in range(400):  # no newline: the line only grows
            await daemon.send_raw(chunk)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # it died before taking it all
    return await daemon.wait(timeout=30)


CRASHABLE = {"SNERD_MAX_LINE_BYTES": str(1 << 30)}


async def test_a_daemon_dying_by_an_exception_is_taken_over_at_once_not_after_its_lease(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    q = tmp_path / "q"
    a = await Daemon.start(nursery, q, env=CRASHABLE)  # the default lease: 30 s + 5 s
    await a.wait_for(owning(1))
    a_id = claims(q)["shard-0"]
    assert await run_out_of_memory(a) == 1
    died = trio.current_time()
    stderr = a.stderr.decode()
    assert "MemoryError" in stderr  # it did die by an exception, unwinding
    assert "this daemon's claims are withdrawn from membership.json" in stderr
    assert claims(q) == {}
    assert a_id not in orjson.loads((q / "membership.json").read_bytes()).get("nodes", {})
    # Its lock let go unmarked, as after kill -9: a prober may take it for gone.
    assert "released" not in (q / "shard-0" / ".lock").read_text()
    b = await Daemon.start(nursery, q)
    await b.wait_for(owning(1), timeout=30)
    took = trio.current_time() - died
    print(f"restarted daemon owns shard-0 {took:.2f} s after the first died")
    assert took < 10  # (before: the lease and margin, 35 s and more)
    assert "taken over" not in b.stderr.decode()  # nothing to prove: the shard was free
    await b.close_stdin()
    assert await b.wait() == 0


async def test_a_running_daemon_takes_the_shard_of_one_dying_by_an_exception_within_seconds(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    q = tmp_path / "q"
    env = {"SNERD_SHARDS": "2"}
    a = await Daemon.start(nursery, q, env={**env, **CRASHABLE, "SNERD_MAX_SHARDS": "1"})
    await a.wait_for(owning(1))
    b = await Daemon.start(nursery, q, env=env)
    await b.wait_for(owning(1))
    assert sorted(claims(q)) == ["shard-0", "shard-1"]
    assert await run_out_of_memory(a) == 1
    died = trio.current_time()
    await b.wait_for(owning(2), timeout=30)
    took = trio.current_time() - died
    print(f"the running daemon owns both shards {took:.2f} s after the other died")
    assert took < 10  # (before: 35 s and more)
    await b.close_stdin()
    assert await b.wait() == 0


#: A short lease, so that a dead daemon's heartbeat lapses within two seconds.
SHORT = {"SNERD_LEASE_TTL": "1.5", "SNERD_CLOCK_SKEW_MARGIN": "0.25"}


async def test_capped_daemons_never_claim_past_their_cap_and_say_why_shards_stay_free(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    q = tmp_path / "q"
    env = {**SHORT, "SNERD_SHARDS": "4", "SNERD_MAX_SHARDS": "2"}
    a = await Daemon.start(nursery, q, env=env)
    await a.wait_for(owning(2))
    await a.wait_stderr("shard-2, shard-3 left free: this daemon holds its cap of 2")
    b = await Daemon.start(nursery, q, env=env)
    await b.wait_for(owning(2))
    b_id = next(o for o in claims(q).values() if o not in claims_of_first(q, a))
    a.kill()  # kill -9
    await a.wait()
    # For a few leases: b never claims a third shard (not even for a moment, to hand it back).
    with trio.move_on_after(5):
        while True:
            held = [k for k, owner in claims(q).items() if owner == b_id]
            assert len(held) <= 2, held
            await trio.sleep(0.01)
    text = b.stderr.decode()
    assert "taken over" not in text and "handing it over" not in text
    assert "fair share" not in text
    said = [ln for ln in text.splitlines() if "left free: this daemon holds its cap of 2" in ln]
    assert len(said) == 1, said  # once
    validate = subprocess.run(
        [sys.executable, "-m", "snerd.cli", "validate", str(q)],
        capture_output=True,
        text=True,
        env={**os.environ, **SHORT},
        timeout=60,
    )
    assert validate.returncode == 1, validate.stdout
    assert "Status: DEGRADED" in validate.stdout
    assert "raise SNERD_MAX_SHARDS or start another daemon" in validate.stdout
    await b.close_stdin()
    assert await b.wait() == 0


def claims_of_first(q: Path, a: Daemon) -> set[str]:
    """The owner names in membership.json that are `a`'s (its node id holds its pid)."""
    return {o for o in claims(q).values() if f"@pid-{a.proc.pid}-" in o}


async def test_sigterm_and_stdin_eof_end_a_daemon_that_cannot_read_membership_at_start(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    for how in ("SIGTERM", "stdin EOF"):
        q = tmp_path / how.replace(" ", "-")
        (q / ".membership.lock").mkdir(parents=True)  # every membership round fails
        d = await Daemon.start(nursery, q)
        await d.wait_stderr("membership.json not updated")
        await d.enqueue("early")
        if how == "SIGTERM":
            d.signal(signal.SIGTERM)
        else:
            await d.close_stdin()
        assert await d.wait(timeout=10) == 0  # (before: never, only SIGKILL ended it)
        assert "before this daemon could start" in d.stderr.decode()
        if how == "SIGTERM":
            error = await d.wait_for(lambda m: m.get("task_id") == "early")
            assert error["action"] == "error"  # refused, not left unanswered
        text = d.stderr.decode()
        assert text.count("membership.json not updated") == 1  # said once, not per retry


async def test_a_membership_file_corrupted_while_running_is_said_once_and_the_daemon_serves_on(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    q = tmp_path / "q"
    env = {"SNERD_LEASE_TTL": "3", "SNERD_CLOCK_SKEW_MARGIN": "0.5"}
    d = await Daemon.start(nursery, q, env=env)
    await d.wait_for(owning(1))
    await d.send({"action": "register", "task_type": "t"})
    good = (q / "membership.json").read_bytes()
    (q / "membership.json").write_bytes(b'{"queue": "q", "shards": "x"}')  # by hand
    await d.wait_stderr("is not a usable membership file: 'shards' is \"x\"")
    await d.enqueue("during")
    execute = await d.wait_for(lambda m: m.get("action") == "execute")
    assert execute["task_id"] == "during"  # still served, within its lease
    await trio.sleep(1.5)  # three renewals, each failing
    assert d.stderr.decode().count("is not a usable membership file") == 1
    (q / "membership.json").write_bytes(good)
    await d.wait_stderr("membership.json read and updated again")
    await d.close_stdin()
    assert await d.wait() == 0
