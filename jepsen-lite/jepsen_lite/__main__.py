"""`python -m jepsen_lite ...` (from jepsen-lite/, or with it on sys.path)."""

import sys

from jepsen_lite.cli import main

sys.exit(main())
