"""`python -m sim`: run one seed or a batch of seeds of the deterministic simulator."""

from sim.cli import main

raise SystemExit(main())
