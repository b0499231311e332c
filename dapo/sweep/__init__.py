"""Sweeps: a declarative spec expanded into runs and submitted.

    spec         the sweep spec: arms, seeds, grids, its checks; expand()
    declaration  the pre-registration record of a sweep's family (made before the runs)
    cluster      cluster profiles (local, Slurm): partitions, GPUs, modules, env
    plan         memory and step time of an experiment on a profile (arithmetic)
    launcher     job commands, the job body, submission records, status / submit / cancel

``python -m dapo.sweep`` is ``dapo sweep`` (dapo.commands.sweep).
"""
