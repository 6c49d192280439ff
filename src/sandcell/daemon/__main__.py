"""`python -m sandcell.daemon`: the daemon's lean entry point (no CLI framework imported)."""

import sys

from sandcell.daemon.server import main

sys.exit(main())
