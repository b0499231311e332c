"""``python -m dapo.data [NAME|FILE|hf:ID] [--template T] [--limit N] [--show K]``: load a data set as a run
would and report its rows (kept, and bad ones by reason); without a name, list the registered sets."""

from dapo.data.datasets import _main

raise SystemExit(_main())
