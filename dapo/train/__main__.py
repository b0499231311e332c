"""``python -m dapo.train``: ``dapo train`` (what ``accelerate launch`` starts on every rank). The command
line, the input checks and the finished-run check live in :func:`dapo.cli.train_main`."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from dapo.cli import train_main
    from dapo.train.loop import train
    return train_main(sys.argv[1:] if argv is None else list(argv), train)


if __name__ == "__main__":
    sys.exit(main())
