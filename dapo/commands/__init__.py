"""The ``dapo`` subcommands that are more than a call into one package: sweep, eval, diff, export,
runs, demo (``dapo train`` is dapo.cli.train_main calling dapo.train.loop.train; ``dapo plan`` dapo.sweep.plan; ``dapo figures``
analysis.report)."""
