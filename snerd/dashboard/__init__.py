"""The dashboard: a live web view of a queue directory (`snerdmq dashboard DIR`).

`view.QueueView` reads the queue's files (read-only, incrementally), `app.create_app` serves it
(Starlette: a page, a JSON API, a WebSocket that pushes changes), `serve.dashboard_main` is the
command (hypercorn on trio, loopback unless a token is set). See docs/operations.md.
"""
