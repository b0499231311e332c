"""DAPO Lab: reproduce and ablate DAPO."""
__version__ = "0.1.0"
