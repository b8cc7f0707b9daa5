"""`python -m core.planning`: the capacity planner's command line (see `core.planning.commands.capacity`)."""

from core.planning.commands.capacity import main

raise SystemExit(main())
