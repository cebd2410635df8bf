"""The deterministic simulator: the real `snerd.core` nodes in a virtual world.

One seed reproduces one run: virtual true time in integer microseconds, per-node clocks with
offset, drift and steps, a shared filesystem model with faults, processes that crash and pause,
a workload of producers and handlers, and checkers that judge the recorded history
(`sim.check`, shared with jepsen-lite). It never imports `snerd.io`.
"""
