"""The dashboard server's former module path, kept for the SDK's `start_dashboard`, which
imports `EmbeddedDashboard` and `check_exposure` from here; both live in
`snerd.dashboard.server` (and are exported by `snerd.dashboard`). Remove once no importer is
left."""

from __future__ import annotations

from snerd.dashboard.server import EmbeddedDashboard, check_exposure

__all__ = ["EmbeddedDashboard", "check_exposure"]
