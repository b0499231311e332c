"""Data files shipped with DAPO Lab (read by :mod:`dapo.data`; see PROVENANCE.md)."""
