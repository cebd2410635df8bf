"""Hypothesis fuzz tests (`make fuzz` runs them long)."""
