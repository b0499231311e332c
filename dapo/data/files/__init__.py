"""Data files shipped with DAPO Lab (read by :mod:`dapo.data.datasets`; see PROVENANCE.md)."""
