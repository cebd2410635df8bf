"""`python -m snerd.cli`: the `snerdmq` command (what tests and benchmarks run as the daemon)."""

import sys

from snerd.cli import main

sys.exit(main())
