"""Compaction's file work: copying the kept ranges of a log into its temp file, durably.

Owns the temp file's name (`compaction_tmp_path`), the copy (`write_compacted`, run in a thread
of its own by `GroupCommitLog.submit_compaction`, so appends to other files go on meanwhile)
and what a compaction answers (`CompactResult`, `CompactOutcome`). The copy is checked as it
goes: every kept range must be whole lines of the file as it is, and the file must still have
the size the writer knows; otherwise the copy fails and the log is left as it was. The rename
over the log is not here: it must be ordered with the appends to that log, so the writer
thread does it (`GroupCommitLog._install`).

It must never: write to the log itself, follow a link (the temp file is created exclusively,
a leftover or planted entry unlinked first), or decide what to keep (that is the core's
`Compact` effect).
"""

from __future__ import annotations

import contextlib
import errno
import os
from typing import NamedTuple

from snerd.core.effects import KeepRange
from snerd.io.files import create_exclusive, open_file, unlink_file, write_all

__all__ = [
    "CompactOutcome",
    "CompactResult",
    "Copied",
    "compaction_tmp_path",
    "write_compacted",
]

#: Compaction output is written in pieces of about this size.
_COPY_BUFFER = 1 << 20


class CompactResult(NamedTuple):
    """A finished compaction: new offset and length of each kept range (in the order given),
    then of each extra line; and the size of the new log."""

    offsets: tuple[int, ...]
    lengths: tuple[int, ...]
    size: int


#: What a compaction's `on_done` receives.
CompactOutcome = CompactResult | OSError


def compaction_tmp_path(path: str | os.PathLike[str]) -> str:
    """The temp file compaction writes beside a log: `tasks.log` -> `tasks.tmp` (upstream's
    name, so a leftover from either daemon is recognised)."""
    root, _ext = os.path.splitext(os.fspath(path))
    return root + ".tmp"


class Copied(NamedTuple):
    """The copy in the temp file: where each kept range and extra line landed, its size, and
    the identity and size of the log it was copied from (checked again at the rename)."""

    offsets: tuple[int, ...]
    lengths: tuple[int, ...]
    size: int
    src_ino: int
    src_dev: int
    src_size: int


def write_compacted(
    path: str,
    tmp: str,
    keep: tuple[KeepRange, ...],
    extra: list[bytes],
    expected_size: int | None,
    root: str | None = None,
) -> Copied:
    """Helper thread: copy `keep` then `extra` from the log at `path` into `tmp`, fsync it.
    `expected_size` is the size the writer knows the log to have (None: it has not opened it).
    `tmp` is created exclusively (`snerd.io.files.create_exclusive`): a link planted there is removed, and
    the copy never lands in a file someone else chose."""
    src = open_file(path, os.O_RDONLY, root=root)
    try:
        st = os.fstat(src)
        src_size = st.st_size
        if expected_size is not None and src_size != expected_size:
            raise OSError(
                errno.EAGAIN,
                f"log changed before compaction ({expected_size} -> {src_size} bytes)",
                path,
            )
        out = create_exclusive(tmp, root)
        try:
            offsets: list[int] = []
            lengths: list[int] = []
            pending: list[bytes] = []
            pending_len = 0
            written = 0
            i = 0
            n = len(keep)
            while i < n:
                # Coalesce ranges that follow each other in the old file into one pread.
                first = keep[i]
                j = i + 1
                run_end = first.offset + first.length
                while j < n and keep[j].offset == run_end:
                    run_end += keep[j].length
                    j += 1
                run_len = run_end - first.offset
                if first.offset < 0 or run_end > src_size or any(r.length <= 0 for r in keep[i:j]):
                    raise ValueError(
                        f"keep range {first.offset}+{run_len} outside {path} ({src_size} bytes)"
                    )
                data = os.pread(src, run_len, first.offset)
                if len(data) != run_len:
                    raise OSError(errno.EIO, "short read while compacting", path)
                base = written + pending_len - first.offset
                for r in keep[i:j]:
                    if data[r.offset + r.length - 1 - first.offset] != 0x0A:
                        raise ValueError(f"keep range {r.offset}+{r.length} is not a whole line")
                    offsets.append(base + r.offset)
                    lengths.append(r.length)
                pending.append(data)
                pending_len += run_len
                if pending_len >= _COPY_BUFFER:
                    write_all(out, b"".join(pending))
                    written += pending_len
                    pending, pending_len = [], 0
                i = j
            for line in extra:
                offsets.append(written + pending_len)
                lengths.append(len(line))
                pending.append(line)
                pending_len += len(line)
            if pending:
                write_all(out, b"".join(pending))
                written += pending_len
            os.fsync(out)
        finally:
            os.close(out)
    except BaseException:
        with contextlib.suppress(OSError):
            unlink_file(tmp, root=root)
        raise
    finally:
        os.close(src)
    return Copied(tuple(offsets), tuple(lengths), written, st.st_ino, st.st_dev, src_size)
