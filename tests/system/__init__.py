"""Real processes: daemons on real directories, clusters, crashes, GlusterFS, upstream SDKs."""
