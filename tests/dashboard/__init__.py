"""Tests of snerd.dashboard: the app, its view of a queue and its page."""
