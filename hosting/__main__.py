import sys

from hosting.launcher import main

sys.exit(main())
