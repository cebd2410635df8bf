"""jepsen-lite: a cluster of real `snerdmq` daemons (each spawned by the real SDK in its own
worker process) on a real directory, under a nemesis; a recorded history judged by the same
checker the simulator uses (`sim.checker`). See docs/chaos.md.

Modules:

- `worker`: one node: a process running `SnerdQueue`, its handlers, and the enqueues the
  controller asks for; everything it sees goes to stdout as JSON lines, stamped with the
  host's wall clock (one host: that is true time). With `--hosts` it runs on another host,
  started through a command template (ssh), and the hosts' clocks must agree.
- `control`: the run: the filesystem, the workers, the client load, the nemesis, the heal and
  drain, the history, the verdict.
- `nemesis`: the faults, each verified to have happened.
- `history`: the shard logs and inbox files read back into `record` / `inbox_record` entries
  and merged with what the workers saw, in the checker's history format.
- `report`: the summary table; `plot`: a PNG of throughput and faults over time.
"""

__all__: list[str] = []
