"""Tests of snerd.core.node: a Node driven through tests.support.fakeshell."""
