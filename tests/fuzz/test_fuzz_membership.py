"""Fuzzing membership.json: what people, other programs and broken disks leave in it.

The strategies draw membership documents as snerd and upstream write them (claims, epochs,
heartbeats with task types and caps), then break them the ways a file gets broken: a value of
the wrong type, a key missing, a number out of range (negative, zero, 2**53, beyond 64 bits, a
float, a boolean), nesting, garbage bytes, bad UTF-8, and a cut at any byte. Whether a file is
usable is decided by the core's rule (`snerd.core.ownership.parse_membership`), and the tests
hold everything else to it:

- The rule itself: it never raises anything but `MembershipInvalid`, with a one-line message;
  what it accepts, every ownership function takes, a node driven through the in-memory shell
  starts on, and what snerd writes back from it is accepted again.
- Real daemons, started on a directory holding one drawn file each (a handful in the ci profile,
  started together): a usable file and the daemon starts, serves and ends on stdin EOF; an
  unusable one and it exits 2 with a message naming membership.json and the rule's problem;
  never a traceback, never a hang (every wait is bounded). And one running daemon has its file
  replaced by broken ones: it keeps answering, says each problem once, and owns its shard
  again once the file is fixed.

Example counts come from the hypothesis profile (tests/conftest.py): `make fuzz` runs them long.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import trio
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from snerd.core import events as ev
from snerd.core.node import NodeConfig, NodePhase
from snerd.core.ownership import (
    MAX_COUNT,
    MAX_QUEUE_SHARDS,
    MembershipInvalid,
    Observer,
    OwnershipConfig,
    check_membership,
    claim_epoch,
    claimable,
    give_back,
    live_foreign,
    owned_by,
    parse_membership,
    plan_claims,
    with_claims,
    with_heartbeat,
    withdrawal,
    without_claims,
)
from snerd.core.timefmt import format_rfc3339
from tests.support.daemon import Daemon
from tests.support.fakeshell import SECOND, T0, FakeShell

ME = "me@pid-1-aa"

# --- documents -------------------------------------------------------------------------------

#: Text as JSON carries it: any character but a lone surrogate.
text = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=12)
#: Integers orjson writes (64 bits).
int64 = st.integers(-(2**63), 2**63 - 1)
owners = st.sampled_from([ME, "other@pid-2-bb", "old@pid-4242", "x"]) | text
expiries = st.one_of(
    st.integers(T0 - 3600 * SECOND, T0 + 3600 * SECOND).map(format_rfc3339),
    st.sampled_from(["2999-01-01T00:00:00Z", "tomorrow", ""]),
)
counters = st.one_of(st.integers(0, 50), st.integers(0, MAX_COUNT))
small_shards = st.integers(1, 8)


@st.composite
def claims_of(draw: st.DrawFn, shards: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for shard in draw(st.lists(st.integers(0, shards + 1), max_size=6, unique=True)):
        claim: dict[str, Any] = {"owner": draw(owners), "lease_expiry": draw(expiries)}
        if draw(st.booleans()):  # snerd's additions (upstream writes none)
            claim["epoch"] = draw(counters)
            claim["renewals"] = draw(counters)
        out[f"shard-{shard}"] = claim
    return out


@st.composite
def heartbeats(draw: st.DrawFn) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for node in draw(st.lists(owners, max_size=4, unique=True)):
        beat: dict[str, Any] = {"beat": draw(counters), "seen": draw(expiries)}
        if draw(st.booleans()):
            beat["types"] = draw(st.lists(text, max_size=3))
        if draw(st.booleans()):
            beat["max_shards"] = draw(st.integers(1, 16))
        out[node] = beat
    return out


@st.composite
def valid_docs(draw: st.DrawFn, max_shards: int = MAX_QUEUE_SHARDS) -> dict[str, Any]:
    """A document the rule accepts: snerd's shape, upstream's (no epochs, no heartbeats), or a
    bare one (only `shards`)."""
    shards = draw(small_shards | st.integers(1, max_shards))
    doc: dict[str, Any] = {"shards": shards}
    if draw(st.integers(0, 3)):
        doc["queue"] = draw(st.sampled_from(["snerdmq-daemon", "q"]) | text)
        doc["version"] = draw(counters)
    if draw(st.booleans()):
        doc["claims"] = draw(claims_of(shards))
    if draw(st.booleans()):
        doc["epochs"] = {
            f"shard-{s}": draw(counters) for s in draw(st.lists(st.integers(0, shards), max_size=4))
        }
    if draw(st.booleans()):
        doc["nodes"] = draw(heartbeats())
    if draw(st.booleans()):
        doc["extra"] = draw(st.lists(int64, max_size=2))  # unknown keys are allowed
    return doc


#: Values of every JSON kind, the extreme numbers among them.
json_values = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from([0, -1, 2**53, 2**63 - 1, -(2**63), 1.5, 1e308, -0.0, MAX_QUEUE_SHARDS + 1]),
    int64,
    text,
    st.lists(int64, max_size=2),
    st.dictionaries(text, int64, max_size=2),
)


@st.composite
def broken_docs(draw: st.DrawFn) -> dict[str, Any]:
    """A valid document with one value replaced, at the top or inside a claim or heartbeat, or
    one key removed (the rule may still accept some of these: it decides)."""
    doc = draw(valid_docs(max_shards=16))
    where = draw(st.sampled_from(["top", "claim", "beat", "epochs", "drop"]))
    if where == "top":
        doc[draw(st.sampled_from(["shards", "version", "queue", "claims", "epochs", "nodes"]))] = (
            draw(json_values)
        )
    elif where == "claim" and doc.get("claims"):
        claim = doc["claims"][draw(st.sampled_from(sorted(doc["claims"])))]
        claim[draw(st.sampled_from(["owner", "lease_expiry", "epoch", "renewals"]))] = draw(
            json_values
        )
    elif where == "beat" and doc.get("nodes"):
        beat = doc["nodes"][draw(st.sampled_from(sorted(doc["nodes"])))]
        beat[draw(st.sampled_from(["beat", "seen", "types", "max_shards"]))] = draw(json_values)
    elif where == "epochs" and doc.get("epochs"):
        doc["epochs"][draw(st.sampled_from(sorted(doc["epochs"])))] = draw(json_values)
    else:
        doc.pop(draw(st.sampled_from(sorted(doc))), None)
    return doc


def nested(depth: int) -> bytes:
    return b'{"shards": 1, "nodes": {"a": {"types": ' + b"[" * depth + b"]" * depth + b"}}}"


@dataclass(frozen=True)
class File:
    """The bytes of one membership.json, and how they were made (for a failing example)."""

    data: bytes
    why: str

    def __repr__(self) -> str:
        shown = self.data if len(self.data) <= 200 else self.data[:200] + b"..."
        return f"File({self.why}: {shown!r})"


def dumps(doc: Any) -> bytes:
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2)


@st.composite
def files(draw: st.DrawFn, max_shards: int = MAX_QUEUE_SHARDS) -> File:
    kind = draw(
        st.sampled_from(["valid", "broken", "cut", "garbage", "flipped", "value", "nested"])
    )
    if kind == "valid":
        return File(dumps(draw(valid_docs(max_shards))), kind)
    if kind == "broken":
        return File(dumps(draw(broken_docs())), kind)
    if kind == "value":  # a JSON text that is not an object
        return File(orjson.dumps(draw(json_values)), kind)
    if kind == "nested":
        return File(nested(draw(st.sampled_from([10, 300, 1100]))), kind)
    if kind == "garbage":
        return File(draw(st.binary(max_size=64)), kind)
    data = dumps(draw(valid_docs(max_shards=16)))
    if kind == "cut":
        return File(data[: draw(st.integers(0, len(data) - 1))], kind)
    at = draw(st.integers(0, len(data) - 1))  # a flipped byte: bad UTF-8, a broken token...
    flipped = bytes([data[at] ^ draw(st.integers(1, 255))])
    return File(data[:at] + flipped + data[at + 1 :], kind)


# --- the rule --------------------------------------------------------------------------------

CFG = OwnershipConfig(ttl_us=30 * SECOND, skew_margin_us=5 * SECOND, max_shards=2)


def top_counter(doc: dict[str, Any]) -> int:
    """The largest counter in `doc` (a write counts on from it)."""
    values = [doc.get("version", 0), *(doc.get("epochs") or {}).values()]
    for claim in (doc.get("claims") or {}).values():
        values += [claim.get("epoch", 0), claim.get("renewals", 0)]
    for beat in (doc.get("nodes") or {}).values():
        values.append(beat.get("beat", 0))
    return int(max(values))


@given(files())
def test_the_rule_accepts_or_refuses_with_a_message_and_nothing_else(file: File) -> None:
    try:
        doc = parse_membership(file.data)
    except MembershipInvalid as exc:
        message = str(exc)
        assert message and "\n" not in message and len(message) < 300, message
        return
    assert isinstance(doc, dict)
    shards = doc["shards"]
    assert isinstance(shards, int) and 1 <= shards <= MAX_QUEUE_SHARDS
    # Every ownership function takes what the rule accepted.
    observer = Observer()
    observer.observe(doc, 0)
    observer.observe(doc, 40 * SECOND)
    live = observer.live_nodes(node_id=ME, mono_us=40 * SECOND, config=CFG)
    candidates = claimable(
        doc, node_id=ME, wall_us=T0, config=CFG, observer=observer, mono_us=40 * SECOND
    )
    plan = plan_claims(
        doc, node_id=ME, candidates=candidates, proofs=[], live=len(live), config=CFG
    )
    held = owned_by(doc, ME)
    new_claims = [s for s in plan.wanted if s not in held]
    assert len(new_claims) <= max(0, 2 - len(held))  # nothing claimed past the cap
    give_back(doc, node_id=ME, live=live, config=CFG)
    live_foreign(doc, node_id=ME)
    for shard in range(min(shards, 64)):
        claim_epoch(doc, shard)
    new = with_claims(doc, node_id=ME, shards=plan.wanted, wall_us=T0, config=CFG)
    new = with_heartbeat(new, node_id=ME, wall_us=T0, live=live, types=["t"], max_shards=2)
    gone = without_claims(new, node_id=ME)
    assert owned_by(gone, ME) == []
    withdrawal(new, node_id=ME)
    # What snerd writes back from it, it reads again (away from the counters' ceiling: a
    # daemon counting past it refuses the file at its next read, as any unusable file).
    if top_counter(doc) < MAX_COUNT - 10:
        for written in (new, gone):
            assert parse_membership(orjson.dumps(written)) == written


@given(files(max_shards=32))
def test_a_node_starts_on_any_file_the_rule_accepts_and_refuses_any_other(file: File) -> None:
    try:
        doc = parse_membership(file.data)
    except MembershipInvalid as exc:
        refusing = UnusableShell(NodeConfig(node_id=ME), problem=f"/q/membership.json: {exc}")
        refusing.start()
        assert refusing.exit_code == 2 and refusing.node.phase is NodePhase.STOPPED
        return
    shell = FakeShell(NodeConfig(node_id=ME, lock_proves_liveness=True))
    shell.disk["membership"] = doc
    shell.start()
    shell.register("t")
    for _ in range(3):
        shell.advance(15)  # renewals, lapses, give-backs
    assert shell.node.phase is NodePhase.RUNNING
    if top_counter(doc) < MAX_COUNT - 100:  # (see the test above)
        check_membership(shell.disk["membership"])
    shell.feed(ev.DrainRequested(reason="test", input_closed=True))
    assert shell.exit_code == 0


class UnusableShell(FakeShell):
    """The in-memory shell, its membership.json unusable (as the daemon's shell reports it)."""

    def __init__(self, config: NodeConfig, *, problem: str) -> None:
        super().__init__(config)
        self.problem = problem

    def _do(self, effect: Any) -> None:
        from snerd.core import effects as fx

        if isinstance(effect, fx.ReadMembership):
            self.queue.append(ev.MembershipUnusable(problem=self.problem))
            return
        super()._do(effect)


# --- real daemons ----------------------------------------------------------------------------


def examples(strategy: st.SearchStrategy[File]) -> list[File]:
    """What hypothesis draws from `strategy` in this profile, usable and unusable ones taken
    in turn: a few daemons in the ci profile, more under `make fuzz`."""
    drawn: list[File] = []

    @given(strategy)
    def collect(file: File) -> None:
        drawn.append(file)

    collect()
    good = [f for f in drawn if usable(f)]
    bad = [f for f in drawn if not usable(f)]
    count = max(6, hypothesis_settings().max_examples // 400)
    mixed = [f for pair in zip(good, bad, strict=False) for f in pair]
    mixed += good[len(bad) :] + bad[len(good) :]
    return mixed[:count]


def usable(file: File) -> bool:
    try:
        parse_membership(file.data)
    except MembershipInvalid:
        return False
    return True


#: How long a daemon may take to start, answer or stop here (a hang fails the test).
BOUND_S = 30.0


async def started_on(directory: Path, file: File, nursery: trio.Nursery) -> None:
    """One daemon on `directory`, holding `file` as its membership.json: it starts and serves
    exactly when the rule accepts the file, else exits 2 naming it; it ends on stdin EOF."""
    directory.mkdir(parents=True)
    (directory / "membership.json").write_bytes(file.data)
    d = await Daemon.start(nursery, directory)
    try:
        problem = None
        try:
            parse_membership(file.data)
        except MembershipInvalid as exc:
            problem = str(exc)
        if problem is not None:
            assert await d.wait(timeout=BOUND_S) == 2, (file, d.stderr)
            stderr = d.stderr.decode(errors="replace")
            assert f"{directory / 'membership.json'} is not a usable membership file" in stderr
            assert problem in stderr, (file, stderr)
        else:
            ready = await d.wait_for(lambda m: m.get("action") == "membership", BOUND_S)
            assert ready["shards"] == orjson.loads(file.data)["shards"], file
            await d.send({"action": "stats"})
            await d.wait_for(lambda m: m.get("action") == "stats", BOUND_S)
            await d.close_stdin()
            assert await d.wait(timeout=BOUND_S) == 0, (file, d.stderr)
        assert b"Traceback" not in d.stderr, (file, d.stderr)
    finally:
        d.kill()


async def test_daemons_start_on_usable_files_and_refuse_the_others_with_exit_2(
    tmp_path: Path,
) -> None:
    chosen = examples(files(max_shards=8))
    assert any(usable(f) for f in chosen) and not all(usable(f) for f in chosen)
    limit = trio.CapacityLimiter(6)  # daemons at once (each is a Python process starting)

    async def one(n: int, file: File, nursery: trio.Nursery) -> None:
        async with limit:
            await started_on(tmp_path / f"q{n}", file, nursery)

    with trio.fail_after(len(chosen) * BOUND_S):
        async with trio.open_nursery() as nursery:
            for n, file in enumerate(chosen):
                nursery.start_soon(one, n, file, nursery)


async def test_a_running_daemon_given_broken_files_keeps_answering_and_recovers(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    q = tmp_path / "q"
    env = {"SNERD_LEASE_TTL": "1.5", "SNERD_CLOCK_SKEW_MARGIN": "0.25"}
    d = await Daemon.start(nursery, q, env=env)
    await d.wait_for(lambda m: m.get("action") == "membership" and m["owned"], BOUND_S)
    drawn = examples(files(max_shards=8))
    bad = [f for f in drawn if not usable(f)][: max(3, len(drawn) // 5)]
    assert bad
    good = (q / "membership.json").read_bytes()
    for n, file in enumerate(bad, start=1):
        replace(q / "membership.json", file.data)  # as an editor saves it (rename)
        await until(d, "is not a usable membership file", n)  # said once per episode
        await d.send({"action": "stats"})  # still answering
        await d.wait_for(lambda m: m.get("action") == "stats", BOUND_S)
        replace(q / "membership.json", good)  # fixed: the next round lands again
        await until(d, "membership.json read and updated again", n)
        good = (q / "membership.json").read_bytes()
    with trio.fail_after(BOUND_S):  # it holds its shard again
        while not owns(q):
            await trio.sleep(0.05)
    assert d.stderr.decode().count("is not a usable membership file") == len(bad)
    stderr = d.stderr.decode(errors="replace")
    assert "Traceback" not in stderr
    await d.close_stdin()
    assert await d.wait(timeout=BOUND_S) == 0


def replace(path: Path, data: bytes) -> None:
    """Write `path` whole, by rename: a daemon reading it meanwhile sees the old or the new."""
    tmp = path.with_name(path.name + ".test")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def owns(q: Path) -> bool:
    doc = orjson.loads((q / "membership.json").read_bytes())
    return bool(doc.get("claims"))


async def until(d: Daemon, text: str, count: int) -> None:
    """Wait (bounded) until `d`'s stderr holds `text` `count` times."""
    with trio.fail_after(BOUND_S):
        while d.stderr.decode(errors="replace").count(text) < count:
            await trio.sleep(0.02)
