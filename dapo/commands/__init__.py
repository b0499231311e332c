"""The ``dapo`` subcommands that are more than a call into one package: sweep, eval, diff, export,
runs, demo (``dapo train`` is dapo.train.loop.main; ``dapo plan`` dapo.sweep.plan; ``dapo figures``
analysis.report)."""
