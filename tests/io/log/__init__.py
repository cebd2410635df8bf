"""Tests of snerd.io.log: the shard log's reader, writer and sync helper."""
