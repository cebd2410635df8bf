"""Tests of the SDK faces: snerd.client, snerd.engine, snerd.sdk and the package's exports."""
