"""Shard logs on disk: writing (group commit), reading back, repair, compaction.

The package's parts, each with its own header:

- `writer`: `GroupCommitLog`, the daemon's one log writer (appends, compaction installs);
- `reader`: `read_log`, `repair_tail` / `recover_log`, `LogReader`, `materialize`;
- `compact`: the copy a compaction writes, and its temp file's name;
- `fsync_helper` / `fsync_child`: the child process that fsyncs for the trio thread, parent
  side and program;
- the durable-file steps they share (`fsync_dir`, `atomic_replace`) are `snerd.io.files`'.

Every name importers use is re-exported here: `from snerd.io.log import X` is the public path.
"""

from __future__ import annotations

from snerd.io.files import atomic_replace, atomic_write, fsync_dir
from snerd.io.log.compact import CompactOutcome, CompactResult, compaction_tmp_path
from snerd.io.log.reader import (
    DEFAULT_CHUNK_BYTES,
    LogChunk,
    LogReader,
    RecordReader,
    TailRepair,
    materialize,
    read_log,
    read_record,
    recover_log,
    repair_tail,
)
from snerd.io.log.writer import (
    DEFAULT_FSYNC_INTERVAL_MS,
    FSYNC_POLICIES,
    AppendOutcome,
    GroupCommitLog,
    LogStatistics,
)

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_FSYNC_INTERVAL_MS",
    "FSYNC_POLICIES",
    "AppendOutcome",
    "CompactOutcome",
    "CompactResult",
    "GroupCommitLog",
    "LogChunk",
    "LogReader",
    "LogStatistics",
    "RecordReader",
    "TailRepair",
    "atomic_replace",
    "atomic_write",
    "compaction_tmp_path",
    "fsync_dir",
    "materialize",
    "read_log",
    "read_record",
    "recover_log",
    "repair_tail",
]
