"""``python -m dapo.sweep``: ``dapo sweep``."""

import sys

from dapo.commands.sweep import main

sys.exit(main())
