"""`python -m core.planning`: the planner's command line (`core.planning.commands.dispatch`)."""

from core.planning.commands.dispatch import main

raise SystemExit(main())
