"""DAPO Lab: reproduce and ablate DAPO (arXiv 2503.14476) against GRPO."""
import os as _os

# OpenMP threads that spin while waiting collapse when other processes share the cores
# (measured here: 2 spinning threads ran 4-10x slower than 1 under load). libgomp reads
# this once, when torch is first imported, so it is set here, before any torch import.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
