"""Tests of snerd.cli: the snerdmq commands and what they print."""
