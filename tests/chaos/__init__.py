"""Tests of jepsen-lite: its configuration, faults, phases and a short real run."""
