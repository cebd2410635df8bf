"""The log record codec: one JSON object per line, with a checksum snerd can verify.

This module owns the byte format of a line in `tasks.log` and in the inbox logs: how a record is
encoded (`encode_record`), how one line is checked and decoded (`decode_record`), and how a
buffer is split into lines without ever letting one bad line hide the ones after it (`scan`).
It is pure: no file access, no clocks, no threads. The shell (`snerd.io.log`) reads and writes
the bytes; this module only judges them.

Format. A task record keeps upstream SnerdMQ's keys and casing (`taskId`, `taskType`,
`taskData`, `retryCount`, ... see docs/storage.md; each key is spelled once, in
`snerd.core.schema`), so upstream tools and SDK dashboards can read a snerd log. snerd adds
keys old readers ignore: `snerdKind` (absent: a task state record; otherwise e.g. "dispatch",
"claim"), `snerdNode`, `snerdEpoch`, and, always last, the checksum::

    {"taskId":"a",...,"snerdEpoch":3,"snerdCrc":"9c1d2e3f4a5b6c7d"}\\n

`snerdCrc` is the 16 lowercase hex digits of xxh3_64 (seed 0) over every byte of the line before
`,"snerdCrc"` — i.e. over orjson's output without its closing brace — so a flipped byte anywhere
in the line is caught (the checksum bytes themselves are compared, so flips there are caught
too). For the empty object the covered bytes are just `{` and the line is
`{"snerdCrc":"..."}`. A line without a checksum (written by upstream SnerdMQ) is accepted as it
is: it still has to be a JSON object in valid UTF-8.

Why the checksum tail is matched so carefully: a flip inside the letters of the key
`"snerdCrc"` would otherwise turn a checksummed line into a plausible "upstream" line with a
key like `snerdCrC`, and the damage would go unnoticed. A line whose last 30 bytes are within
one byte of the checksum tail's fixed bytes is therefore treated as a damaged checksummed line,
not as an upstream one. Upstream records never end in an 8-letter key close to `snerdCrc`.

The last line of a file. The bytes after a log's last newline are judged as the line they
would be with their newline (`scan_tail`): when that line holds a record, the record is whole —
the checksum covers every byte before it, and no strict prefix of a JSON object is one — and
only its newline was lost (a short write that stopped one byte early, a filesystem that lost
the last byte, someone's `truncate -s -1`). Such a record may have been acknowledged, so its
owner restores the newline and keeps it; only a last line that holds no record (a torn write,
which was never acknowledged: an ack follows the whole write) is cut. Every reader of a whole
file — the daemon's recovery, `fsck`, compaction, the simulator's model of the file — asks this
one rule.

This module must never: read or write files, parse a line it cannot verify as something else
than what it is, or stop at a bad line (upstream bug 6.1.2: one invalid UTF-8 byte made upstream
ignore the rest of the file and the next compaction destroyed it).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import orjson
import xxhash

from snerd.core.effects import NewRecord
from snerd.core.events import LogRecord
from snerd.core.fields import (
    MAX_ATTEMPTS,
    MAX_NESTING,
    BadField,
    adopt_cron,
    check_backoff,
    check_backoff_max_seconds,
    check_max_execution_seconds,
    check_max_per_minute,
    check_max_retries,
    check_name,
    check_not_empty,
    check_parents,
    check_rate_limit,
    check_retry_after_hours,
    check_task_id,
    check_time,
    check_unique_until,
    check_urgency,
    check_webhook_url,
    nests_deeper,
)
from snerd.core.ownership import MAX_COUNT
from snerd.core.schema import (
    AUTO_DEDUPE,
    CLAIM_EPOCH,
    CLAIM_NODE,
    COMMAND_ACTION,
    COMMAND_BEFORE,
    COMMAND_STAMP,
    COMMAND_TASK,
    COMMAND_TYPE,
    CRON_EXPRESSION,
    DELETED_AT,
    DISPATCH_ATTEMPT,
    DISPATCH_GROUP,
    DISPATCH_TASK,
    DROP_AT,
    DROP_ERROR,
    DROP_OF,
    DROP_TASK,
    EXECUTE_AT,
    INBOX_ANSWERS,
    INBOX_DROPPED,
    INBOX_FROM,
    INBOX_NODE,
    INBOX_OFFSET,
    KIND_CLAIM,
    KIND_COMMAND,
    KIND_DISPATCH,
    KIND_INBOX,
    KIND_PAUSE,
    KIND_PURGE,
    KIND_SCHEDULE,
    LAST_ERROR_OBJ,
    LAST_JOB_ERROR,
    MAX_EXECUTION_SECONDS,
    MAX_PER_MINUTE,
    MAX_RETRIES,
    PAUSE_PAUSED,
    PAUSE_STAMP,
    PAUSE_TYPE,
    PAYLOAD_HASH,
    POOL,
    PURGE_TASKS,
    RATE_LIMIT_GROUP,
    RECORD_AT,
    RETRY_AFTER_HOURS,
    RETRY_AFTER_TIME,
    RETRY_COUNT,
    SCHEDULE_CATCH_UP,
    SCHEDULE_FIRED,
    SCHEDULE_MISFIRE,
    SCHEDULE_NAME,
    SCHEDULE_OVERLAP,
    SCHEDULE_REMOVED,
    SCHEDULE_TASK,
    SCHEDULE_TIMEZONE,
    SNERD_BACKOFF,
    SNERD_BACKOFF_MAX,
    SNERD_CRC,
    SNERD_EPOCH,
    SNERD_KIND,
    SNERD_NODE,
    SNERD_OUTCOME,
    SNERD_REPLAYED_AT,
    SNERD_RESULT,
    SNERD_SEQ,
    SNERD_UNIQUE_UNTIL,
    SNERD_VIA,
    TASK_DATA,
    TASK_ID,
    TASK_TYPE,
    TRIGGER_AFTER_IDS,
    URGENCY_SCORE,
    WEBHOOK_URL,
)
from snerd.core.slots import slot_constructor

__all__ = [
    "CHECKSUM_KEY",
    "LINE_LIMIT",
    "CorruptRecord",
    "ScanResult",
    "check_record",
    "checksum_hex",
    "decode_line",
    "decode_line_at",
    "decode_record",
    "encode_record",
    "merge_base",
    "scan",
    "scan_tail",
    "task_problem",
]

#: The key of the checksum, always the last key of a line snerd writes.
CHECKSUM_KEY = SNERD_CRC

#: The longest line (newline included) snerd writes or accepts when reading a log back. A writer
#: refuses bigger records (`encode_record` raises), so nothing is ever written that a reader
#: would refuse; a reader reports a longer run of bytes without a newline as corrupt and
#: resynchronises at the next newline instead of buffering it without bound.
LINE_LIMIT = 64 * 1024 * 1024

_TAIL_HEAD = f'"{SNERD_CRC}":"'.encode()  # 12 bytes
# `encode_record`, which every record written goes through, spells the tail as a literal (one
# `%` format, no concatenation); it must be this one:
assert _TAIL_HEAD == b'"snerdCrc":"', "encode_record's checksum key differs from the schema's"
_TAIL_END = b'"}'  # 2 bytes
#: `"snerdCrc":"` + 16 hex digits + `"}`.
_TAIL_LEN = len(_TAIL_HEAD) + 16 + len(_TAIL_END)  # 30
#: The comma before the tail is part of the tail too.
_SUFFIX_LEN = _TAIL_LEN + 1  # 31
_HEX = frozenset(b"0123456789abcdef")
#: Resynchronisation marker for lines glued together by upstream's torn writes (bug 6.1.1):
#: upstream writes `taskId` first, and inside a JSON string a quote is always escaped, so an
#: unescaped `{"taskId":` can only start an object.
_TASK_START = f'{{"{TASK_ID}":'.encode()

_dumps = orjson.dumps
_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError
_xxh3_hex = xxhash.xxh3_64_hexdigest


class CorruptRecord(ValueError):
    """A line read from a log is not a valid record (bad input from disk, never a caller bug).

    `reason` is a short human text: "checksum mismatch", "not JSON: ...", "not an object", ...
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def checksum_hex(covered: bytes) -> str:
    """The checksum text for the covered bytes: 16 lowercase hex digits of xxh3_64, seed 0."""
    return _xxh3_hex(covered)


def encode_record(fields: Mapping[str, Any]) -> bytes:
    """Encode one record as a complete log line: JSON object, checksum last, newline.

    The result is one bytes object so the writer can put it in the file with a single write.
    Caller bugs raise: `ValueError` when `fields` already holds `snerdCrc` or the line would
    exceed `LINE_LIMIT`; `orjson.JSONEncodeError` (a `TypeError`) for what orjson cannot
    serialise (non-str keys, integers beyond 64 bits, unsupported types). orjson writes NaN and
    infinities as `null`: do not store them.
    """
    if CHECKSUM_KEY in fields:
        raise ValueError(f"record fields must not contain {CHECKSUM_KEY!r}; encode_record adds it")
    body = _dumps(fields)
    # orjson output for a mapping always starts with `{` and ends with `}`, with no whitespace.
    covered = body[:-1]
    if len(body) > 2:
        line = b'%b,"snerdCrc":"%b"}\n' % (covered, _xxh3_hex(covered).encode())
    else:
        line = b'{"snerdCrc":"' + _xxh3_hex(covered).encode() + b'"}\n'
    if len(line) > LINE_LIMIT:
        raise ValueError(f"record of {len(line)} bytes exceeds LINE_LIMIT ({LINE_LIMIT})")
    return line


def decode_record(line: bytes | bytearray) -> dict[str, Any]:
    """Verify and decode one line (without its newline) and hold it to the record rule
    (`check_record`); return the record's fields.

    Every reader of a log or an inbox decodes with this, so whatever the core is given from
    disk has the types and ranges it runs with. Raises `CorruptRecord` for a line that is not
    a record (`decode_line`) or a record that breaks the rule; its reason names the record and
    the key ("task t1's record has maxExecutionSeconds 'abc', not an integer").
    """
    fields = decode_line(line)
    check_record(fields)
    return fields


def decode_line_at(data: bytes | bytearray, where: str) -> dict[str, Any]:
    """Decode the record whose whole line, newline included, is `data` (the bytes read at a
    record's location; `where` names the location in the error). Raises `CorruptRecord` when
    `data` is not one complete line or not a record (`decode_record`).

    Every shell reads a record by location through this: a dispatch's payload, the base of a
    `NewRecord`.
    """
    if len(data) < 2 or data[-1] != 0x0A:
        raise CorruptRecord(f"no complete line at {where}")
    return decode_record(data[:-1])


def merge_base(base: Mapping[str, Any], record: NewRecord) -> dict[str, Any]:
    """The fields of the line a `NewRecord` with a base stands for: the base record's fields
    (`base`, as read at `record.base`), `record.fields` on top, `record.remove` dropped.

    This is how the core writes a retry, a cron re-arm or a tombstone as a whole upstream-shaped
    task record without holding payloads. A base must be a task record: one without `taskData`
    raises `CorruptRecord` (the append fails for good; the daemon, the simulated shell and the
    fake shell all hold it to this one rule).
    """
    loc = record.base
    if TASK_DATA not in base:
        where = "?" if loc is None else f"shard {loc.shard} offset {loc.offset}"
        raise CorruptRecord(f"record at {where} has no taskData")
    merged = {**base, **record.fields}
    for key in record.remove:
        merged.pop(key, None)
    return merged


def decode_line(line: bytes | bytearray) -> dict[str, Any]:
    """Verify and decode one line (without its newline) as a JSON object, whatever its keys
    hold: the byte format alone. Readers use `decode_record`.

    The checksum key is verified and removed, so `decode_line(encode_record(f)[:-1]) == f`.
    A line without a checksum (upstream SnerdMQ) is accepted when it is a JSON object. Raises
    `CorruptRecord` for a checksum mismatch, a damaged checksum, invalid UTF-8, text that is not
    JSON, or JSON that is not an object.
    """
    n = len(line)
    if n >= _SUFFIX_LEN and line[-_TAIL_LEN:-18] == _TAIL_HEAD and line[-2:] == _TAIL_END:
        sep = line[-_SUFFIX_LEN]
        if sep == 0x2C:  # ',': the usual case
            covered = line[:-_SUFFIX_LEN]
        elif sep == 0x7B and n == _SUFFIX_LEN:  # '{': the empty object
            covered = line[:1]
        else:
            raise CorruptRecord("damaged checksum separator")
        if _xxh3_hex(covered).encode() != line[-18:-2]:
            raise CorruptRecord("checksum mismatch")
        try:
            value = _loads(line)
        except _JSONDecodeError as exc:  # only a buggy writer gets here: the checksum matched
            raise CorruptRecord(f"not JSON: {exc}") from None
        if type(value) is not dict:
            raise CorruptRecord(f"not an object: {type(value).__name__}")
        # Parsing the whole line and dropping the key is cheaper than building `covered + "}"`.
        del value[CHECKSUM_KEY]
        return value
    else:
        if n >= _SUFFIX_LEN and _near_checksum_tail(line):
            raise CorruptRecord("damaged checksum")
        try:
            value = _loads(line)
        except _JSONDecodeError as exc:
            raise CorruptRecord(f"not JSON: {exc}") from None
    if type(value) is not dict:
        raise CorruptRecord(f"not an object: {type(value).__name__}")
    return value


def _near_checksum_tail(line: bytes | bytearray) -> bool:
    """True when the last 30 bytes differ from a checksum tail's fixed bytes in exactly one place
    (the hex digits are not fixed, so they are only required to be hex, or one of them to be the
    damaged byte)."""
    tail = line[-_TAIL_LEN:]
    diffs = 0
    for got, want in zip(tail[:12], _TAIL_HEAD, strict=True):
        if got != want:
            diffs += 1
    for got in tail[12:28]:
        if got not in _HEX:
            diffs += 1
    for got, want in zip(tail[28:], _TAIL_END, strict=True):
        if got != want:
            diffs += 1
    # Zero differences cannot happen here (the exact tail was matched before); a damaged
    # separator before an intact tail is caught by the exact branch.
    return diffs == 1


_make_record = slot_constructor(LogRecord, "offset", "length", "fields")


class ScanResult(NamedTuple):
    """What `scan` found in a buffer."""

    #: Every well-formed record of a complete line, in buffer order.
    records: list[LogRecord]
    #: Every complete line that is not a record: (absolute offset, reason), in buffer order.
    corrupt: list[tuple[int, str]]
    #: Absolute offset just past the last complete line (where an unterminated fragment, if
    #: any, starts). `end - base_offset` bytes of the buffer were consumed.
    end: int


def scan(data: bytes | bytearray, *, base_offset: int = 0, at_eof: bool = False) -> ScanResult:
    """Split a buffer into lines and decode each complete one.

    `base_offset` is the position of `data[0]` in the file; offsets reported are absolute.
    Blank lines (empty, or only spaces, tabs or `\\r`) are skipped. A corrupt line is reported
    and scanning goes on with the next line: nothing after it is hidden. The bytes after the
    last newline are not a record — they are a torn tail or the start of a line the next chunk
    completes — and are left unconsumed: `end` says where they start.

    With `at_eof` the buffer ends where the file ends, and its last line is judged by
    `scan_tail`: when it holds a record (whose newline was lost), that line is consumed like
    the others (`end` is then the end of the buffer); otherwise it is left unconsumed.

    Lines glued together by upstream's torn writes (a partial record, then a full one, on one
    line) yield the full record at its own offset and report the partial part as corrupt.
    """
    records: list[LogRecord] = []
    corrupt: list[tuple[int, str]] = []
    append_record = records.append
    make_record = _make_record
    find = data.find
    pos = 0
    while True:
        nl = find(b"\n", pos)
        if nl < 0:
            break
        if nl > pos:
            line = data[pos:nl]
            try:
                fields = decode_record(line)
            except CorruptRecord as exc:
                if line.strip(b" \t\r"):  # a blank line is skipped, not reported
                    _salvage(line, base_offset + pos, exc.reason, records, corrupt)
            else:
                append_record(make_record(base_offset + pos, nl + 1 - pos, fields))
        pos = nl + 1
    if at_eof and pos < len(data):
        tail = scan_tail(data[pos:], offset=base_offset + pos)
        if tail.records:
            records.extend(tail.records)
            corrupt.extend(tail.corrupt)
            pos = len(data)
    return ScanResult(records, corrupt, base_offset + pos)


def scan_tail(fragment: bytes | bytearray, *, offset: int = 0) -> ScanResult:
    """Judge a file's last line, which lacks its newline: `fragment` holds the bytes after the
    file's last newline, and `offset` is where they start.

    The line is judged exactly as `scan` judges it once its newline is there, so a reader that
    restores the newline and a reader that does not read the same records. When `records` is
    not empty, the line holds a whole record and only its newline was lost: keep the line,
    restore the newline (each record's `length` counts that newline) and report `corrupt`, if
    any, as for any line. When `records` is empty, the line is a torn write (never
    acknowledged) and is cut; `corrupt` then says why (empty for blank bytes). `end` is where
    the fragment ends when it is kept (`offset + len(fragment)`), else `offset`.
    """
    if len(fragment) >= LINE_LIMIT:  # no writer writes such a line (`encode_record`)
        return ScanResult([], [(offset, f"line longer than {LINE_LIMIT} bytes")], offset)
    result = scan(bytes(fragment) + b"\n", base_offset=offset)
    if not result.records:
        return ScanResult([], result.corrupt, offset)
    return ScanResult(result.records, result.corrupt, offset + len(fragment))


def _salvage(
    line: bytes | bytearray,
    offset: int,
    reason: str,
    records: list[LogRecord],
    corrupt: list[tuple[int, str]],
) -> None:
    """Report a corrupt line, recovering a whole task record glued onto its end, if any."""
    corrupt.append((offset, reason))
    start = line.find(_TASK_START, 1)
    while start > 0:
        try:
            fields = decode_record(line[start:])
        except CorruptRecord:
            start = line.find(_TASK_START, start + 1)
            continue
        records.append(
            LogRecord(offset=offset + start, length=len(line) + 1 - start, fields=fields)
        )
        return


# --------------------------------------------------------------------------------------------
# The record rule: what each key of a record may hold
# --------------------------------------------------------------------------------------------


class _WrongType(Exception):
    """A value of the wrong JSON type (internal to `check_record`)."""

    def __init__(self, value: Any, expected: str) -> None:
        self.value = value
        self.expected = expected


def _str(key: str, value: Any) -> None:
    if type(value) is not str:
        raise _WrongType(value, "a string")


def _node_id(key: str, value: Any) -> None:
    if type(value) is not str:
        raise _WrongType(value, "a string")
    if not value:
        raise BadField(f"{key} must not be empty")


def _task_id(key: str, value: Any) -> None:
    if type(value) is not str:
        raise _WrongType(value, "a string")
    check_task_id(key, value)


def _task_type(key: str, value: Any) -> None:
    if type(value) is not str:
        raise _WrongType(value, "a string")
    check_not_empty(key, value)
    check_name(key, value)


def _optional_name(key: str, value: Any) -> None:
    # An empty group or pool means none, as on the wire.
    if type(value) is not str:
        raise _WrongType(value, "a string")
    check_name(key, value)


def _count(key: str, value: Any) -> None:
    if type(value) is not int:
        raise _WrongType(value, "an integer")
    if not 0 <= value <= MAX_COUNT:
        raise BadField(f"{key} must be 0 to {MAX_COUNT}, got {value}")


def _retry_count(key: str, value: Any) -> None:
    if type(value) is not int:
        raise _WrongType(value, "an integer")
    if not 0 <= value <= MAX_ATTEMPTS:
        raise BadField(f"{key} must be 0 to {MAX_ATTEMPTS}, got {value}")


def _attempt(key: str, value: Any) -> None:
    if type(value) is not int:
        raise _WrongType(value, "an integer")
    if not 1 <= value <= MAX_ATTEMPTS:
        raise BadField(f"{key} must be 1 to {MAX_ATTEMPTS}, got {value}")


def _max_retries(key: str, value: Any) -> None:
    if type(value) is not int:
        raise _WrongType(value, "an integer")
    check_max_retries(key, value)


def _max_per_minute(key: str, value: Any) -> None:
    if type(value) is not int:
        raise _WrongType(value, "an integer")
    check_max_per_minute(key, value)


def _max_execution_seconds(key: str, value: Any) -> None:
    if type(value) is not int:
        raise _WrongType(value, "an integer")
    check_max_execution_seconds(key, value)


def _retry_after_hours(key: str, value: Any) -> None:
    kind = type(value)
    if kind is not float and kind is not int:
        raise _WrongType(value, "a number")
    check_retry_after_hours(key, value)


def _urgency(key: str, value: Any) -> None:
    kind = type(value)
    if kind is not float and kind is not int:
        raise _WrongType(value, "a number")
    check_urgency(key, value)


def _bool(key: str, value: Any) -> None:
    if type(value) is not bool:
        raise _WrongType(value, "a boolean")


def _time(key: str, value: Any) -> None:
    if type(value) is not str:
        raise _WrongType(value, "a string")
    check_time(key, value)


def _cron(key: str, value: Any) -> None:
    if type(value) is not str:
        raise _WrongType(value, "a string")
    if value:  # empty: no cron, as on the wire
        adopt_cron(key, value)


def _webhook_url(key: str, value: Any) -> None:
    if type(value) is not str:
        raise _WrongType(value, "a string")
    if value:  # empty: no webhook, as on the wire
        check_webhook_url(key, value)


def _payload_hash(key: str, value: Any) -> None:
    if type(value) is not str:
        raise _WrongType(value, "a string")
    if _PAYLOAD_HASH.fullmatch(value) is None:
        raise BadField(f"{key} must be 1 to 16 lowercase hex digits (an xxh64 fingerprint)")


def _parents(key: str, value: Any) -> None:
    # The range (count, ids, the task's own id) is checked with the whole record in hand.
    if type(value) is not list or any(type(item) is not str for item in value):
        raise _WrongType(value, "an array of strings")


def _task_ids(key: str, value: Any) -> None:
    if type(value) is not list:
        raise _WrongType(value, "an array of task ids")
    for item in value:
        _task_id(f"{key}[]", item)


def _object(key: str, value: Any) -> None:
    if type(value) is not dict:
        raise _WrongType(value, "an object")


def _any_json(key: str, value: Any) -> None:
    """Any JSON value (a handler's result): whatever decoded is one; its nesting is held to
    `MAX_NESTING` as every key's is."""


def _backoff(key: str, value: Any) -> None:
    if type(value) is not str:
        raise _WrongType(value, "a string")
    check_backoff(key, value)


def _backoff_max(key: str, value: Any) -> None:
    if type(value) is not int:
        raise _WrongType(value, "an integer")
    check_backoff_max_seconds(key, value)


def _unique_until(key: str, value: Any) -> None:
    if type(value) is not str and type(value) is not int:
        raise _WrongType(value, "a string or an integer")
    check_unique_until(key, value, True)


def _dropped(key: str, value: Any) -> None:
    """The records an ingest did not take in: `[{"task": id, "at": offset, "of": id}]` or with
    `"error"` instead of `"of"`."""
    if type(value) is not list or any(type(item) is not dict for item in value):
        raise _WrongType(value, "an array of objects")
    for item in value:
        _task_id(f"{key}[].{DROP_TASK}", item.get(DROP_TASK))
        _count(f"{key}[].{DROP_AT}", item.get(DROP_AT))
        of, error = item.get(DROP_OF), item.get(DROP_ERROR)
        if of is not None:
            _task_id(f"{key}[].{DROP_OF}", of)
        elif type(error) is not str:
            raise BadField(f"{key} holds an entry with neither {DROP_OF} nor {DROP_ERROR}")


def _answers(key: str, value: Any) -> None:
    """An ingest's answers to the commands it read: `[{"at": offset, "found": state, "done":
    bool}]` (`snerd.core.control.answer_entry`)."""
    if type(value) is not list or any(type(item) is not dict for item in value):
        raise _WrongType(value, "an array of objects")
    for item in value:
        _count(f"{key}[].{DROP_AT}", item.get(DROP_AT))
        if type(item.get("found")) is not str or type(item.get("done")) is not bool:
            raise BadField(f"{key} holds an entry without a found state or a done flag")
        if item.get("count") is not None:
            _count(f"{key}[].count", item["count"])


def _stamp(key: str, value: Any) -> None:
    """A pause's `[wall µs, node id]`."""
    if (
        type(value) is not list
        or len(value) != 2
        or type(value[0]) is not int
        or type(value[1]) is not str
    ):
        raise _WrongType(value, "an array of an integer and a string")


def _last_job_error(key: str, value: Any) -> None:
    if type(value) is not dict:
        raise _WrongType(value, "an object")
    error = value.get("error")
    if error is not None and type(error) is not str:
        raise BadField(f"{key} has an error that is not a string")
    worthy = value.get("retry_worthy")
    if worthy is not None and type(worthy) is not bool:
        raise BadField(f"{key} has a retry_worthy that is not a boolean")


_PAYLOAD_HASH = re.compile(r"[0-9a-f]{1,16}", re.ASCII)

_Check = Callable[[str, Any], None]

#: Keys every record may carry (snerd's own).
_COMMON: dict[str, _Check] = {
    SNERD_KIND: _str,
    SNERD_NODE: _node_id,
    SNERD_EPOCH: _count,
}

#: What makes a task record (no `snerdKind`) one: the keys readers place it by (its task, its
#: order, whether it ends the task). A record that breaks these is not one.
_TASK_SHAPE: dict[str, _Check] = {
    **_COMMON,
    TASK_ID: _task_id,
    TASK_TYPE: _str,
    DELETED_AT: _str,  # a tombstone ends its task; its time is only shown
    SNERD_SEQ: _count,
    SNERD_RESULT: _any_json,  # a completed task's result, read back as it was stored
}
_TASK_REQUIRED: tuple[str, ...] = (TASK_ID,)

#: What a live task runs with: upstream's keys, then snerd's (`task_problem`).
_TASK_VALUES: dict[str, _Check] = {
    TASK_TYPE: _task_type,
    TASK_DATA: _str,
    RETRY_COUNT: _retry_count,
    MAX_RETRIES: _max_retries,
    RETRY_AFTER_HOURS: _retry_after_hours,
    RETRY_AFTER_TIME: _time,
    EXECUTE_AT: _time,
    LAST_ERROR_OBJ: _str,
    LAST_JOB_ERROR: _last_job_error,
    RATE_LIMIT_GROUP: _optional_name,
    MAX_PER_MINUTE: _max_per_minute,
    AUTO_DEDUPE: _bool,
    URGENCY_SCORE: _urgency,
    PAYLOAD_HASH: _payload_hash,
    POOL: _optional_name,
    TRIGGER_AFTER_IDS: _parents,
    CRON_EXPRESSION: _cron,
    WEBHOOK_URL: _webhook_url,
    MAX_EXECUTION_SECONDS: _max_execution_seconds,
    SNERD_VIA: _node_id,
    SNERD_OUTCOME: _str,
    SNERD_REPLAYED_AT: _time,
    SNERD_UNIQUE_UNTIL: _unique_until,
    SNERD_BACKOFF: _backoff,
    SNERD_BACKOFF_MAX: _backoff_max,
}
#: What a live task cannot run without.
_LIVE_REQUIRED = (TASK_TYPE, TASK_DATA)

#: The kinds snerd adds (`snerd.core.schema`: KIND_DISPATCH, KIND_CLAIM, KIND_INBOX): every
#: key they have is what makes them one.
_KINDS: dict[str, tuple[dict[str, _Check], tuple[str, ...]]] = {
    KIND_DISPATCH: (
        {
            **_COMMON,
            DISPATCH_TASK: _task_id,
            DISPATCH_ATTEMPT: _attempt,
            RECORD_AT: _time,
            DISPATCH_GROUP: _optional_name,
        },
        (DISPATCH_TASK, DISPATCH_ATTEMPT),
    ),
    KIND_CLAIM: (
        {**_COMMON, CLAIM_EPOCH: _count, CLAIM_NODE: _node_id, RECORD_AT: _time},
        (CLAIM_EPOCH, CLAIM_NODE),
    ),
    KIND_SCHEDULE: (
        {
            **_COMMON,
            SCHEDULE_NAME: _task_id,
            SCHEDULE_TASK: _object,
            SCHEDULE_TIMEZONE: _str,
            SCHEDULE_MISFIRE: _str,
            SCHEDULE_CATCH_UP: _count,
            SCHEDULE_OVERLAP: _str,
            SCHEDULE_FIRED: _time,
            SCHEDULE_REMOVED: _bool,
            RECORD_AT: _time,
        },
        (SCHEDULE_NAME,),
    ),
    KIND_INBOX: (
        {
            **_COMMON,
            INBOX_NODE: _node_id,
            INBOX_OFFSET: _count,
            INBOX_FROM: _count,
            INBOX_DROPPED: _dropped,
            INBOX_ANSWERS: _answers,
        },
        (INBOX_NODE, INBOX_OFFSET),
    ),
    KIND_PAUSE: (
        {**_COMMON, PAUSE_TYPE: _task_type, PAUSE_PAUSED: _bool, PAUSE_STAMP: _stamp},
        (PAUSE_PAUSED, PAUSE_STAMP),
    ),
    KIND_COMMAND: (
        {
            **_COMMON,
            COMMAND_ACTION: _str,
            COMMAND_TASK: _task_id,
            COMMAND_TYPE: _task_type,
            COMMAND_STAMP: _stamp,
            COMMAND_BEFORE: _count,
        },
        (COMMAND_ACTION,),
    ),
    KIND_PURGE: (
        {
            **_COMMON,
            PURGE_TASKS: _task_ids,
            COMMAND_TYPE: _task_type,
            COMMAND_BEFORE: _count,
            RECORD_AT: _time,
        },
        (PURGE_TASKS,),
    ),
}
#: A kind this snerd does not know (a newer one wrote it; it is skipped): only the keys every
#: record has are checked.
_UNKNOWN_KIND: tuple[dict[str, _Check], tuple[str, ...]] = (_COMMON, ())


def check_record(fields: dict[str, Any]) -> None:
    """Hold a decoded record to the first half of the record rule, what makes it a record;
    raise `CorruptRecord` naming the record (its task id when it has one), the key and what
    is wrong with its value. A line that breaks it is a corrupt line.

    A dispatch, claim or inbox record is held to it whole: each of its keys has a type and a
    range. A task record is held to the keys readers place it by: a `taskId` (a task id), a
    string `taskType` and `deletedAt` (a tombstone only ends its task: its time is shown as
    written), snerd's `snerdEpoch` (fencing), `snerdSeq` (enqueue order) and `snerdNode`.
    Whether its task can run is `task_problem`'s question, asked of a live task's latest
    record. Every record: `null` means absent (`taskId`, a dispatch's `task` and `attempt`, a
    claim's `epoch` and `node`, an inbox record's `node` and `offset` may not be absent);
    nothing nests deeper than `MAX_NESTING`, and `snerdCrc` is only the checksum at the end, so
    that a record built on this one can be written back.
    """
    kind = fields.get(SNERD_KIND)
    if kind is None:
        checks, required = _TASK_SHAPE, _TASK_REQUIRED
    elif type(kind) is not str:
        raise CorruptRecord(f"a record has snerdKind {_shown(kind)}, not a string")
    else:
        checks, required = _KINDS.get(kind, _UNKNOWN_KIND)
    if CHECKSUM_KEY in fields:  # left in by a line without a verified checksum tail
        raise CorruptRecord(
            f"{_record_name(fields, kind)}: {CHECKSUM_KEY} is not the checksum at the end of "
            "the line"
        )
    key = ""
    try:
        for key, check in checks.items():
            value = fields.get(key)
            if value is not None:
                check(key, value)
        kinds = set(map(type, fields.values()))  # one C pass: most records hold no container
        if dict in kinds or list in kinds:
            for key, value in fields.items():
                if (type(value) is dict or type(value) is list) and nests_deeper(
                    value, MAX_NESTING - 1
                ):
                    # (Any key: shown so that the message stays one line.)
                    raise BadField(f"{_shown_id(key)} is nested deeper than {MAX_NESTING} levels")
        for key in required:
            if fields.get(key) is None:
                raise CorruptRecord(f"{_record_name(fields, kind)} has no {key}")
    except _WrongType as wrong:
        raise CorruptRecord(_wrong_type(fields, kind, key, wrong)) from None
    except BadField as bad:
        raise CorruptRecord(f"{_record_name(fields, kind)}: {_one_line(bad.detail)}") from None


def task_problem(fields: dict[str, Any]) -> str | None:
    """Why the task of a live task's record (one `check_record` took) cannot run, or None.

    The second half of the record rule: every key a task runs with has the type and range an
    enqueue is held to (`snerd.core.fields`, with the record's names: `maxRetries` for
    `max_retries`), and the record's own `retryCount` is an attempt count. `null` means absent,
    but a live task needs its `taskType` and `taskData`; an empty `rateLimitGroup`, `pool`,
    `cronExpression` or `webhookUrl` means none, as on the wire. The answer names the task and
    the first key at fault: "task t1's record has maxExecutionSeconds 'abc', not an integer".
    (A daemon dead-letters such a task with that reason instead of running it.) None for
    a record of another kind and for a tombstone, which only ends its task.
    """
    if fields.get(SNERD_KIND) is not None or fields.get(DELETED_AT) is not None:
        return None
    key = ""
    try:
        for key in _LIVE_REQUIRED:
            if fields.get(key) is None:
                return f"{_record_name(fields, None)} has no {key}"
        for key, value in fields.items():
            check = _TASK_VALUES.get(key)
            if check is not None and value is not None:
                check(key, value)
        key = ""
        check_rate_limit(
            (RATE_LIMIT_GROUP, MAX_PER_MINUTE),
            fields.get(RATE_LIMIT_GROUP) or None,
            fields.get(MAX_PER_MINUTE),
        )
        parents = fields.get(TRIGGER_AFTER_IDS)
        if parents:
            check_parents(TRIGGER_AFTER_IDS, fields[TASK_ID], parents)
    except _WrongType as wrong:
        return _wrong_type(fields, None, key, wrong)
    except BadField as bad:
        return f"{_record_name(fields, None)}: {_one_line(bad.detail)}"
    return None


def _wrong_type(fields: dict[str, Any], kind: Any, key: str, wrong: _WrongType) -> str:
    return f"{_record_name(fields, kind)} has {key} {_shown(wrong.value)}, not {wrong.expected}"


def _record_name(fields: dict[str, Any], kind: Any) -> str:
    """What a message calls a record: "task t1's record", "task t1's dispatch record", "a
    claim record"."""
    task_id = fields.get(TASK_ID if kind is None else DISPATCH_TASK)
    what = "record" if kind is None else f"{_shown_kind(kind)} record"
    if type(task_id) is str and task_id and (kind is None or kind == KIND_DISPATCH):
        return f"task {_shown_id(task_id)}'s {what}"
    if kind is None:
        return "a task record"
    return f"an {what}" if what[0] in "aeiou" else f"a {what}"


def _one_line(text: str) -> str:
    """`text` with what is not printable escaped (a value quoted in a rule's reason may hold a
    newline; a reason is one line on stderr)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _shown_kind(kind: str) -> str:
    return kind if kind.isidentifier() and len(kind) <= 32 else _shown(kind)


def _shown_id(task_id: str) -> str:
    """A task id (or a key) in a message: as it is when it is short and printable (one line on
    stderr), else quoted."""
    if len(task_id) <= 200 and task_id.isprintable():
        return task_id
    return _shown(task_id)


def _shown(value: Any) -> str:
    """A bad value in a message: strings quoted and cut short, containers by their kind."""
    if type(value) is str:
        return repr(value if len(value) <= 60 else value[:60] + "…")
    if type(value) is bool:
        return "true" if value else "false"
    if value is None:
        return "null"
    if type(value) is list:
        return "an array"
    if type(value) is dict:
        return "an object"
    return repr(value)
