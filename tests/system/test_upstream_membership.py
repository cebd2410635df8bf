"""The membership.json a snerd cluster writes, read the way upstream SnerdMQ v0.3.0 reads it.

Upstream (`speed-nerd/snerdmq`, `src/membership.rs` and `cmd_validate` in `src/main.rs`)
deserialises membership.json with serde into

    struct Membership { queue: String, shards: u32, version: u64,
                        #[serde(default)] claims: HashMap<String, Claim> }
    struct Claim { owner: String, lease_expiry: DateTime<Utc> }

with no `deny_unknown_fields`, so extra keys at either level are ignored, but a missing or
ill-typed upstream key (a float version, a `null` claims map, an unparseable expiry) makes the
whole file `Corrupt`. It reads under an exclusive flock on `.membership.lock`. `validate` then
walks `shard-0 .. shard-(shards-1)`: a missing `shard-<i>/` directory is degraded; no claim is
"free"; a claim is "LAPSED" (degraded) when `now > lease_expiry + skew`, with skew the integer
seconds of `SNERD_CLOCK_SKEW_MARGIN` (default 5, unparseable -> 5, negative -> 0), else
"active"; a `shard-<k>/` directory with k >= shards is "ORPHANED" (degraded).

`read_like_upstream` and `validate_like_upstream` below mirror exactly that, and the tests run
real snerd daemons on one directory and check the file they write against it: same keys and
types, the same meaning (one owner per shard, naming the process that holds it; the lease
expiry a wall-clock instant about one lease ahead; the version a counter of writes), and
snerd's extra fields (`epochs`, `nodes`, a claim's `epoch` and `renewals`) alongside.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import trio

from tests.support.daemon import Daemon

TTL_S = 2.0
SKEW_S = 1  # an integer, so that upstream's parse of SNERD_CLOCK_SKEW_MARGIN reads the same
ENV = {
    "SNERD_SHARDS": "4",
    "SNERD_LEASE_TTL": str(TTL_S),
    "SNERD_CLOCK_SKEW_MARGIN": str(SKEW_S),
}

UPSTREAM_TOP = {"queue", "shards", "version", "claims"}
UPSTREAM_CLAIM = {"owner", "lease_expiry"}
SNERD_TOP = {"epochs", "nodes"}
SNERD_CLAIM = {"epoch", "renewals"}

#: What chrono's `DateTime<Utc>` deserialiser (`DateTime<FixedOffset>::from_str`) accepts:
#: RFC 3339, with a space allowed between date and time; an offset is required.
_RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(?:\.(\d{1,9}))?(?:[Zz]|[+-]\d{2}:\d{2})\Z",
    re.ASCII,
)
#: What upstream writes (chrono's serde output for `Utc::now()` values) and snerd writes too.
_UPSTREAM_WRITTEN = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z\Z", re.ASCII)


class Corrupt(Exception):
    """Upstream's `MembershipError::Corrupt`: serde could not read the file into its struct."""


@dataclass(frozen=True)
class UpstreamClaim:
    owner: str
    lease_expiry: datetime


@dataclass(frozen=True)
class UpstreamMembership:
    queue: str
    shards: int
    version: int
    claims: dict[str, UpstreamClaim]


def _unsigned(doc: dict[str, Any], key: str, bits: int) -> int:
    value = doc.get(key)
    # serde_json does not coerce: a bool, a float (even 3.0) or a string is an error.
    if type(value) is not int or not 0 <= value < 2**bits:
        raise Corrupt(f"{key}: expected u{bits}, got {value!r}")
    return value


def _string(doc: dict[str, Any], key: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str):
        raise Corrupt(f"{key}: expected a string, got {value!r}")
    return value


def _chrono_utc(text: object) -> datetime:
    if not isinstance(text, str) or not (m := _RFC3339.match(text)):
        raise Corrupt(f"lease_expiry: not an RFC 3339 date-time: {text!r}")
    fraction = m.group(1) or ""
    trimmed = text.replace("." + fraction, "." + fraction[:6]) if fraction else text
    parsed = datetime.fromisoformat(trimmed.upper())
    return parsed.astimezone(UTC)


def parse_like_upstream(raw: bytes) -> UpstreamMembership:
    """`serde_json::from_str::<Membership>`: upstream's keys and types; unknown keys ignored."""
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise Corrupt(str(exc)) from None
    if not isinstance(doc, dict):
        raise Corrupt("not a JSON object")
    queue = _string(doc, "queue")
    shards = _unsigned(doc, "shards", 32)
    version = _unsigned(doc, "version", 64)
    raw_claims = doc.get("claims", {})  # #[serde(default)]: absent is empty, null is an error
    if not isinstance(raw_claims, dict):
        raise Corrupt(f"claims: expected a map, got {raw_claims!r}")
    claims: dict[str, UpstreamClaim] = {}
    for key, value in raw_claims.items():
        if not isinstance(value, dict):
            raise Corrupt(f"claims.{key}: expected a struct Claim, got {value!r}")
        claims[key] = UpstreamClaim(
            owner=_string(value, "owner"), lease_expiry=_chrono_utc(value.get("lease_expiry"))
        )
    return UpstreamMembership(queue=queue, shards=shards, version=version, claims=claims)


def read_like_upstream(directory: Path) -> tuple[UpstreamMembership, dict[str, Any]]:
    """`MembershipStore::load`: under an exclusive flock on `.membership.lock` (a blocking
    one, like fs3's `lock_exclusive`), read membership.json and parse it. Also returns the raw
    document for the checks of snerd's extra fields."""
    fd = os.open(directory / ".membership.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        raw = (directory / "membership.json").read_bytes()
    finally:
        os.close(fd)  # closing the fd drops the flock
    return parse_like_upstream(raw), json.loads(raw)


def skew_like_upstream(value: str | None) -> timedelta:
    """`skew_margin_from`: integer seconds, unparseable -> 5, negative -> 0."""
    try:
        secs = int(value) if value is not None and re.fullmatch(r"[+-]?\d+", value) else 5
    except ValueError:
        secs = 5
    return timedelta(seconds=max(secs, 0))


@dataclass(frozen=True)
class Verdict:
    healthy: bool
    #: Per shard key: "free", "active" or "LAPSED"; plus "MISSING" and "ORPHANED" notes.
    states: dict[str, str]
    notes: list[str]


def validate_like_upstream(directory: Path, now: datetime, skew: timedelta) -> Verdict:
    """`cmd_validate`, returning what it prints instead of printing it."""
    m, _ = read_like_upstream(directory)
    healthy = True
    states: dict[str, str] = {}
    notes: list[str] = []
    for i in range(m.shards):
        key = f"shard-{i}"
        if not (directory / key).exists():
            notes.append(f"MISSING {key}")
            healthy = False
        claim = m.claims.get(key)
        if claim is None:
            states[key] = "free"
        elif now > claim.lease_expiry + skew:
            states[key] = "LAPSED"
            healthy = False
        else:
            states[key] = "active"
    for entry in os.listdir(directory):
        if entry.startswith("shard-"):
            index = entry.removeprefix("shard-")
            if index.isdigit() and int(index) >= m.shards:
                notes.append(f"ORPHANED {entry}")
                healthy = False
    return Verdict(healthy=healthy, states=states, notes=notes)


def owning(count: int) -> Any:
    return lambda m: m.get("action") == "membership" and len(m["owned"]) == count


def pid_of(owner: str) -> int:
    """The process id in an owner id: upstream's `<host>@pid-<pid>`, snerd's
    `<host>@pid-<pid>-<6 hex>`."""
    match = re.fullmatch(r".+@pid-(\d+)(?:-[0-9a-f]{6})?", owner)
    assert match, owner
    return int(match.group(1))


async def read_when(directory: Path, pred: Any, timeout: float = 10.0) -> Any:
    """The first upstream reading of membership.json for which `pred(m, raw)` holds."""
    with trio.fail_after(timeout):
        while True:
            m, raw = await trio.to_thread.run_sync(read_like_upstream, directory)
            if pred(m, raw):
                return m, raw
            await trio.sleep(0.05)


async def test_two_sharing_daemons_write_a_file_upstream_validate_reads_as_healthy(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    q = tmp_path / "q"
    a = await Daemon.start(nursery, q, env=ENV)
    await a.wait_for(owning(4))
    b = await Daemon.start(nursery, q, env=ENV)
    got_a = await a.wait_for(owning(2))
    got_b = await b.wait_for(owning(2))
    owned = {a.proc.pid: set(got_a["owned"]), b.proc.pid: set(got_b["owned"])}
    assert owned[a.proc.pid] | owned[b.proc.pid] == {f"shard-{i}" for i in range(4)}

    # Once shared, the file names per shard the process that announced it (both daemons'
    # claims are written by the time each one announces; the give-back is written before).
    def settled(m: UpstreamMembership, raw: dict[str, Any]) -> bool:
        return set(m.claims) == {f"shard-{i}" for i in range(4)} and all(
            key in owned[pid_of(c.owner)] for key, c in m.claims.items()
        )

    m, raw = await read_when(q, settled)
    now = datetime.now(UTC)

    # Upstream's struct: the queue name upstream hard-codes, the shard count, u64 version.
    assert m.queue == "snerdmq-daemon"
    assert m.shards == 4
    assert m.version >= 1
    # One owner per shard, each the process that holds it (its shard lock says so too), and
    # one owner id per daemon.
    owners = {pid_of(c.owner): c.owner for c in m.claims.values()}
    assert set(owners) == {a.proc.pid, b.proc.pid}
    for key, claim in m.claims.items():
        lock_text = (q / key / ".lock").read_text().split("\n")
        assert lock_text[:2] == [str(pid_of(claim.owner)), claim.owner]
    # Lease expiry: a UTC instant in upstream's written form, at most one lease ahead.
    for key, claim in m.claims.items():
        text = raw["claims"][key]["lease_expiry"]
        assert _UPSTREAM_WRITTEN.match(text), text
        assert claim.lease_expiry.tzinfo is UTC
        assert claim.lease_expiry <= now + timedelta(seconds=TTL_S + 0.5), (key, text, now)

    # upstream's validate: every shard active, every shard directory present, nothing orphaned.
    verdict = validate_like_upstream(q, now, skew_like_upstream(ENV["SNERD_CLOCK_SKEW_MARGIN"]))
    assert verdict.healthy, verdict
    assert verdict.states == {f"shard-{i}": "active" for i in range(4)}

    # snerd's fields sit alongside, and only alongside: no upstream key is renamed or dropped.
    assert set(raw) == UPSTREAM_TOP | SNERD_TOP
    for key, claim_doc in raw["claims"].items():
        assert set(claim_doc) == UPSTREAM_CLAIM | SNERD_CLAIM
        assert claim_doc["owner"] == m.claims[key].owner
        epoch = claim_doc["epoch"]
        assert type(epoch) is int and epoch >= 1
        assert type(claim_doc["renewals"]) is int and claim_doc["renewals"] >= 0
        assert raw["epochs"][key] == epoch  # the highest epoch given out is the claim's own
    # The shards a gave back to b were claimed anew: a higher epoch than a's first claim.
    for key in owned[b.proc.pid]:
        assert raw["claims"][key]["epoch"] >= 2
    assert set(raw["nodes"]) == set(owners.values())
    for beat in raw["nodes"].values():
        assert type(beat["beat"]) is int and beat["beat"] >= 1
        assert _UPSTREAM_WRITTEN.match(beat["seen"])

    # version: upstream's change counter, bumped by every write, renewals included.
    later, _ = await read_when(q, lambda m2, _raw: m2.version > m.version)
    assert later.claims.keys() == m.claims.keys()
    assert {k: c.owner for k, c in later.claims.items()} == {
        k: c.owner for k, c in m.claims.items()
    }
    assert all(later.claims[k].lease_expiry >= m.claims[k].lease_expiry for k in m.claims)

    # Drained: claims released, so upstream's validate sees every shard free, still healthy;
    # snerd's epochs survive the release (the next claim must get a higher one).
    for d in (a, b):
        await d.close_stdin()
        assert await d.wait() == 0
    m_end, raw_end = read_like_upstream(q)
    assert m_end.claims == {}
    assert m_end.version > later.version
    verdict = validate_like_upstream(q, datetime.now(UTC), skew_like_upstream(None))
    assert verdict.healthy, verdict
    assert verdict.states == {f"shard-{i}": "free" for i in range(4)}
    # Neither took the other for dead: a shard handed over keeps its lock until its claim is
    # out of the file (a prober finding it free meanwhile once dropped the giver's heartbeat).
    for d in (a, b):
        assert "process is gone" not in d.stderr.decode()
    assert set(raw_end["epochs"]) == {f"shard-{i}" for i in range(4)}


async def test_a_killed_clusters_leases_lapse_for_upstream_validate_after_expiry_and_skew(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """`lease_expiry` means what upstream takes it to mean: once the wall clock passes it plus
    the skew margin with no renewal, upstream's validate calls the claim LAPSED."""
    q = tmp_path / "q"
    env = {**ENV, "SNERD_SHARDS": "2"}
    a = await Daemon.start(nursery, q, env=env)
    await a.wait_for(owning(2))
    m, _ = await read_when(q, lambda m, _raw: len(m.claims) == 2)
    a.signal(signal.SIGKILL)
    await a.wait()
    killed_at = datetime.now(UTC)
    m, _ = read_like_upstream(q)  # nobody renews any more: this is the last word
    assert {pid_of(c.owner) for c in m.claims.values()} == {a.proc.pid}
    skew = skew_like_upstream(env["SNERD_CLOCK_SKEW_MARGIN"])
    last = max(c.lease_expiry for c in m.claims.values())
    assert last <= killed_at + timedelta(seconds=TTL_S + 0.5)
    # Right at the boundary upstream still calls them active; a moment past it, LAPSED.
    at_edge = validate_like_upstream(q, min(c.lease_expiry for c in m.claims.values()) + skew, skew)
    assert set(at_edge.states.values()) == {"active"} and at_edge.healthy
    wait = (last + skew - datetime.now(UTC)).total_seconds() + 0.2
    await trio.sleep(max(0.0, wait))
    verdict = validate_like_upstream(q, datetime.now(UTC), skew)
    assert not verdict.healthy
    assert verdict.states == {"shard-0": "LAPSED", "shard-1": "LAPSED"}


def test_the_upstream_reader_rejects_what_serde_would() -> None:
    """The mirror is as strict as serde: these would make upstream call the file Corrupt."""
    good = {
        "queue": "snerdmq-daemon",
        "shards": 1,
        "version": 3,
        "claims": {"shard-0": {"owner": "h@pid-1", "lease_expiry": "2026-09-07T11:05:55.083436Z"}},
    }
    assert parse_like_upstream(json.dumps(good).encode()).claims["shard-0"].owner == "h@pid-1"
    # serde(default): an absent claims map is an empty one; unknown keys are ignored.
    assert parse_like_upstream(
        json.dumps({"queue": "q", "shards": 0, "version": 0, "extra": [1]}).encode()
    ).claims == {}
    bad: list[dict[str, Any]] = [
        {**good, "version": 3.0},
        {**good, "version": -1},
        {**good, "shards": True},
        {**good, "shards": 2**32},
        {**good, "claims": None},
        {k: v for k, v in good.items() if k != "queue"},
        {**good, "claims": {"shard-0": {"owner": "h@pid-1"}}},
        {**good, "claims": {"shard-0": {"owner": "h", "lease_expiry": "2026-09-07 11:05"}}},
        {**good, "claims": {"shard-0": {"owner": "h", "lease_expiry": "2026-09-07T11:05:55"}}},
    ]
    for doc in bad:
        try:
            parse_like_upstream(json.dumps(doc).encode())
        except Corrupt:
            continue
        raise AssertionError(f"upstream would not read {doc}")
