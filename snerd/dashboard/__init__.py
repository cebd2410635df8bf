"""The dashboard: a live web view of a queue directory (`snerdmq dashboard DIR`, or served by an
SDK: `SnerdQueue.start_dashboard` / `Engine.start_dashboard`).

`view.QueueView` reads the queue's files (read-only, incrementally, through `snerd.queuedir`;
task states by `snerd.core.status`), `app.create_app` serves it (Starlette: a page, a JSON API,
a WebSocket that pushes changes), `server` listens and serves it (hypercorn; loopback unless a
token is set: `check_exposure`), for the command (`snerd.cli.dashboard`) and for an SDK
(`EmbeddedDashboard`). See docs/operations.md.
"""

from snerd.dashboard.server import EmbeddedDashboard, check_exposure

__all__ = ["EmbeddedDashboard", "check_exposure"]
