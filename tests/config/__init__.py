"""Tests of snerd.config: the daemon's and the tools' settings."""
