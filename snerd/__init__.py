"""snerd: a background job queue with no server to run (a SnerdMQ-compatible daemon, SDK and
embedded engine)."""

from __future__ import annotations

__all__: list[str] = []
__version__ = "0.1.0"
