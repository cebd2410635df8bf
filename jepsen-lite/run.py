"""`python jepsen-lite/run.py ...` from anywhere: puts jepsen-lite/ and the repository root on
sys.path, then runs `jepsen_lite.cli.main`."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for p in (HERE, HERE.parent):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from jepsen_lite.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
