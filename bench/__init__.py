"""snerd's benchmarks: the daemon against the physical limit (a raw append+fsync loop) and
against a peer (Huey's SqliteHuey with fsync on), side by side in one run.

Run everything and print the table: `python -m bench` (or `make bench`); `--quick` for a short
run, `--only NAME` for some rows, `--help` for the rest. What each row measures is in
`docs/performance.md` and in the docstrings of `bench.raw`, `bench.huey_bench`, `bench.daemon`
and `bench.sdk`.
"""

__all__: list[str] = []
