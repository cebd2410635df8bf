"""Tests of the simulator (sim): its clock, filesystem, world and checker."""
