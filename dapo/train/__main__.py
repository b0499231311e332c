"""``python -m dapo.train``: ``dapo train`` (what ``accelerate launch`` starts on every rank)."""

import sys

from dapo.train.loop import main

sys.exit(main())
