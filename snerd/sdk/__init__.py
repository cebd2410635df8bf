"""The SDK's plumbing, shared by the two public faces: `SnerdQueue` (`snerd.client`, which
spawns a daemon) and `Engine` (`snerd.engine`, the same queue in-process).

- `face`: `QueueFace`, the base of both faces: lifecycle, handler registry, `enqueue` and
  `stats`, job control (`cancel`, `retry`, `get`, `result`, `pause`), the dispatch of the
  daemon's messages, the embedded dashboard.
- `workers`: running handlers: the worker tasks, worker reuse, the SDK-side attempt timeout,
  the stop of a cancelled attempt.
- `messages`: the protocol messages as the SDK writes and reads them (`build_enqueue_message`,
  `parse_task_data`, `Enqueued`, `Cancelled`, `TaskDetails`).
- `isolation`: a sync handler's attempt in a child process of its own, killed at its deadline
  or on a cancel.
- `context`: the attempt a handler runs in (`current_task`, `yield_progress`).
- `signals`: loop-neutral wake-ups of waiting calls and idle workers.
- `errors`: `SnerdError` and its kinds.

Applications import the public names from `snerd` itself; this package re-exports nothing, so
importing one of its modules (the errors, say) costs only that module and what it imports.
"""
