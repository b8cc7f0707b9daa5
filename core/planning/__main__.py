"""`python -m core.planning`: the capacity planner's command line (see `core.planning.cli`)."""

from core.planning.cli import main

raise SystemExit(main())
