"""snerd.io: the trio shell. It executes what snerd.core decides and feeds back what happened.

No queue semantics live here: files, flock, fsync, pipes, processes, HTTP and timers only.
"""
