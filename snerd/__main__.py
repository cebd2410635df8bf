"""`python -m snerd`: the `snerdmq` command."""

import sys

from snerd.cli import main

sys.exit(main())
