"""What the tests share: the fake shell, a daemon process, SDK fixtures, a GlusterFS volume."""
