"""jepsen-lite: a cluster of real `snerdmq` daemons (each spawned by the real SDK in its own
worker process) on a real directory, under a nemesis; a recorded history judged by the same
checker the simulator uses (`sim.check`). See docs/chaos.md.

Modules:

- `worker`: one node: a process running `SnerdQueue`, its handlers, and the enqueues and
  job-control lines the controller asks for; everything it sees goes to stdout as JSON lines, stamped with the
  host's wall clock (one host: that is true time). With `--hosts` it runs on another host,
  started through a command template (ssh), and the hosts' clocks must agree.
- `phases`: one run, phase by phase: the filesystem, setup, chaos, heal, drain, and the
  judging of the history (`run`).
- `config`: what a run is asked to do (`RunConfig`) and what cannot run (`config_problem`).
- `cluster`: the worker processes: started, stopped, killed, sent commands; what they print
  recorded as history entries.
- `load`: the client enqueues of the chaos phase.
- `commands`: the job-control commands of the chaos phase (the simulator's mix,
  `sim.command_mix`), their answers, and the resumes of the drain.
- `faults`: every fault, one routine each (`FAULTS`, the only list of their names), each
  verified to have happened; `nemesis`: the low-level tools they use.
- `history`: the shard logs and inbox files read back into `record` / `inbox_record` entries
  and merged with what the workers saw, in the checker's history format.
- `report`: the summary table; `plot`: a PNG of throughput and faults over time.
"""

__all__: list[str] = []
