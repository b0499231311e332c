"""Module docstrings as ``--help`` text: the reStructuredText markup a terminal would print raw, removed.

``:func:`dapo.x.y``` → ``dapo.x.y``, double backquotes → nothing, single ones kept as plain quotes
of a name. A leaf (standard library only), so every command's parser can use it.
"""

from __future__ import annotations

import re

__all__ = ["help_text"]

_ROLE = re.compile(r":(?:func|class|mod|meth|data|attr|obj|exc|ref|doc):`~?([^`<]*?)(?:\s*<[^>]*>)?`")
_LITERAL = re.compile(r"``(.+?)``", re.S)


def help_text(doc: str | None, paragraphs: int | None = 1) -> str:
    """The first ``paragraphs`` paragraphs of ``doc`` (all with None), without RST roles or literals."""
    text = (doc or "").strip()
    if paragraphs is not None:
        text = "\n\n".join(text.split("\n\n")[:paragraphs])
    return _LITERAL.sub(r"\1", _ROLE.sub(r"\1", text))
