"""Tests of snerd.core: the pure rules, each module on its own."""
