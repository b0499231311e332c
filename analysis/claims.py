"""The claims check: a verdict or mechanism word must cite a decided row or a lead.

A report's numbers are decided by its rule (docs/STATISTICS.md): a row of the primary family gets a
verdict from its Holm-adjusted p; every other row is exploratory, and is a *lead* only when it passes a
Benjamini–Hochberg q ≤ 0.10 within its table. Prose outruns that rule when it says "reproduces",
"moves", "falls", "only", "is level", … of a number that no decided row or lead backs. This module
finds such sentences in Markdown (README.md, results/*/reading.md) with a mechanical rule:

1. **Units.** The text is cut into units: every heading line, every table row (a line starting with
   ``|``), every line of a fenced code block, and every sentence of a prose paragraph (a paragraph
   ends at a blank line, a heading, a table, a fence or a list item's marker; a sentence ends at
   ``.``, ``!`` or ``?`` followed by a space, except after the abbreviations in :data:`ABBREVIATIONS`
   and before a lowercase letter). A bold run-in heading (``**Entropy does not move:**``) is part of
   the sentence that follows it (a bold question, ``**Which variant moves entropy?**``, is a unit of its
   own). Inline code spans (`` `algo.rollout_correction.level` ``) and link
   targets are names, not prose, and are blanked before matching.
2. **Words.** A unit is *claiming* when it holds a word of :data:`VERDICT_WORDS` (whole word,
   case-insensitive, not part of a hyphenated compound such as "token-level" or "read-only"), unless
   a narrow rule of :data:`EXEMPTIONS` says that occurrence is another sense of the word: "level" of
   a test or interval ("95% level", "its true level", "the one-sided level", "at the family's level",
   "a level over seeds"); "only" that does not open a noun phrase at a clause's start ("Only DS
   filter", "the only way" count; "Accelerate only launches", "only when", "only 0.04 %", "seed 0
   only)" do not); "bounded" before a noun other than null ("bounded retries"); "help" as a noun;
   a word in a ' / ' list of the vocabulary; an imperative at the start of a sentence ("Reproduce
   and ablate DAPO"). A unit that ends with "?" asks and claims nothing, and a question in double
   quotes is a section's title ("Do the mechanisms act?") and is blanked.
3. **Evidence.** A claiming unit passes when it cites
   - a decided row: ``p_Holm`` (or ``p Holm``, "TOST p_Holm") followed by its value, e.g.
     ``p_Holm = 0.012``, ``TOST p_Holm 0.020``, ``p_Holm < 0.001`` (a threshold such as
     ``p_Holm ≤ 0.05`` is not a value); or
   - a lead: the word "lead" (or "leads") together with a q value (any in the unit) ≤ :data:`LEAD_Q`, e.g.
     ``lead: p = 0.031, q = 0.06`` (``q ≤ 0.10`` is a threshold, not a value); or
   - nothing, when it *defines* the vocabulary: it lies in a paragraph that opens with
     ``**Decision rule.**``, or it holds a bold verdict word (``**reproduces**``) together with a
     threshold (``≤ 0.05``, ``≤ α``).
4. Every other claiming unit is **flagged**: :func:`check_text` returns it with its line and words.

:func:`warning_lines` gives one line per flagged sentence, for ``dapo figures`` to print;
``tests/test_claims.py`` runs the check over README.md and every committed reading.
Standard library only (``re``, ``dataclasses``, ``pathlib``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["VERDICT_WORDS", "EXEMPTIONS", "ABBREVIATIONS", "LEAD_Q", "Unit", "Flag", "units", "claim_words",
           "has_evidence", "is_definition", "check_text", "check_files", "default_paths", "warning_lines"]

from .stats import LEAD_Q  # noqa: E402  (a lead: BH q within its table at most this)

VERDICT_WORDS: dict[str, str] = {
    # verdicts of the decision rule and of the exploratory tables
    "reproduces": r"reproduce[sd]?|reproducing",
    "replicates": r"replicate[sd]?|replicating",
    "harms": r"harms?|harmed|harming",
    "contradicts": r"contradicts?|contradicted|contradicting",
    "bounded": r"bounded",  # "bounded null", "bounded within ±m", "not bounded"
    "acts": r"acts?|acted|acting",
    "learns": r"learns?|learned|learnt",
    "excluded": r"exclude[sd]?|excluding|rules? out|ruled out",
    # mechanism words: a direction or an equality read off a number
    "level": r"level",
    "only": r"only",
    "moves": r"moves?|moved|moving",
    "falls": r"falls?|fell|fallen|falling",
    "rises": r"rises?|rose|risen|rising",
    "raises": r"raises?|raised|raising",
    "lowers": r"lowers|lowered|lowering",
    "grows": r"grows?|grew|grown|growing",
    "shrinks": r"shrinks?|shrank|shrunk|shrinking",
    "helps": r"helps?|helped|helping",
}
"""The words that state a verdict or a mechanism, each with the forms matched (whole words, any case).
Not listed, on purpose: "lower" (an adjective far more often than a verb: "lower bound", "lower
entropy"), "inconclusive" (claims nothing) and "differs" (the word the rule prescribes where no paper
gives a direction, but in prose mostly the everyday one: "the eval seed differs by training seed")."""

_WORD_RE = {k: re.compile(r"(?<![\w-])(?:" + v + r")(?![\w-])", re.I) for k, v in VERDICT_WORDS.items()}

ABBREVIATIONS = ("e.g.", "i.e.", "vs.", "cf.", "fig.", "figs.", "eq.", "al.", "no.", "approx.", "resp.", "dr.", "et al.")
"""A period ending one of these does not end a sentence."""

_IMPERATIVE_FORMS = {"reproduce", "replicate", "harm", "contradict", "exclude", "act", "learn", "move", "fall",
                     "rise", "raise", "grow", "shrink", "help"}

_LEVEL_BEFORE = re.compile(
    r"(?:\d\s*%|\bsignificance|\bconfidence|\bnominal|\btrue|\bstated|\bcoverage|\bone-sided|\btwo-sided|\bits|"
    r"\btheir|\bfirst|\bfamily's|\btest's|\binterval's|\ba|\bα|\bper-\w+)\s+$", re.I)
_LEVEL_AFTER = re.compile(r"^\s*(?:of\s+\d|\d|α|1\s*[−-]|over\s+seeds)", re.I)
_ONLY_BEFORE = re.compile(r"(?:^|[;:—–(,]|\bthe|\band|\bbut|\bis|\bare|\bwas|\bwere)[\s*_\"']*$", re.I)
_ONLY_AFTER = re.compile(
    r"^\s*(?:when|if|where|once|after|before|because|under|by|for|through|while|until|at|as\b|in\s+direction)|"
    r"^\s*(?:about\s+|≈\s*|~\s*|some\s+)?[+−-]?\d|^\s*a\s+(?:few|fifth|third|quarter|half|small)|^\s*[),.;:(]",
    re.I)

_BOUNDED_ATTRIBUTIVE = re.compile(
    r"^\s+(?!nulls?\b|within\b|inside\b|at\b|by\b|in\b|to\b|either\b|here\b|there\b|too\b|nor\b|or\b|and\b|"
    r"the\b|it\b|them\b)[a-z]", re.I)

EXEMPTIONS = {
    "hyphenated": "a word joined to another by a hyphen is a compound ('token-level', 'read-only')",
    "level of a test": "'level' after a percentage or one of significance, confidence, nominal, true, stated, "
                       "coverage, one-sided, two-sided, its, their, first, family's, test's, interval's, a, α, "
                       "per-…; or before 'of <number>', a number, 'α', '1 −', 'over seeds'",
    "only not opening a noun phrase": "'only' counts where it opens its unit or a clause (after ; : — – ( , "
                                       "and, but, the, is, are, was, were: 'Only DS filter', 'the only way'), "
                                       "and even there not before when, if, where, once, after, before, "
                                       "because, under, by, for, through, while, until, at, as, 'in direction', "
                                       "a number, 'a few/fifth/third/quarter/half/small', or a closing mark "
                                       ") , . ; : (",
    "bounded as an attribute": "'bounded' directly before a noun other than null(s) ('bounded retries')",
    "help as a noun": "'help' after 's, the, its, their, a or -- ('the key's help says …')",
    "a listing of the vocabulary": "the word stands in a list of alternatives separated by ' / ' "
                                   "('reproduces / harms here / bounded null / inconclusive')",
    "a question": "a unit that ends with '?' asks; a question in double quotes is a section's title and is "
                  "blanked ('\"Do the mechanisms act?\"')",
    "imperative": "the sentence's first word is the word's base form ('Reproduce and ablate …')",
}
"""The narrow rules by which an occurrence of a word in :data:`VERDICT_WORDS` is another sense of it."""

_P_HOLM = re.compile(r"\bp[ _]Holm\b\s*(?:=|:)?\s*(?:<\s*)?(?:\d*\.\d+|[01]\b)", re.I)
_LEAD = re.compile(r"(?<![\w-])leads?(?![\w-])", re.I)
_Q_VALUE = re.compile(r"(?<![\w-])q\s*(?:=|:)?\s*(<\s*)?(\d*\.\d+|[01])(?![\d.]*\s*%)", re.I)
_BOLD_VERDICT = re.compile(r"\*\*(?:[^*]*?\s)?(?:" + "|".join(VERDICT_WORDS.values()) + r"|inconclusive)\*\*",
                           re.I)
_THRESHOLD = re.compile(r"≤\s*(?:0?\.\d+|α)")
_DECISION_PARAGRAPH = re.compile(r"^\s*\*\*Decision rule\.\*\*")


@dataclass(frozen=True)
class Unit:
    """One sentence, heading, table row or code line: where it starts and its text."""
    line: int  # 1-based line of the source where the unit starts
    text: str  # as matched (inline code and link targets blanked)
    kind: str  # "sentence", "heading", "table", "code"
    definition: bool = False  # in a paragraph that opens with **Decision rule.**


@dataclass(frozen=True)
class Flag:
    """A unit that holds a verdict or mechanism word and cites no decided row or lead."""
    line: int
    text: str
    words: tuple[str, ...]  # the keys of VERDICT_WORDS it matched


def _blank_code_and_links(s: str) -> str:
    s = re.sub(r"`[^`]*`", "`…`", s)
    s = re.sub(r"\"[^\"\n]*\?\"|“[^”\n]*\?”", "\"…?\"", s)
    s = re.sub(r"\]\([^)\s]*\)", "]", s)
    return s


def _split_sentences(text: str) -> list[tuple[int, str]]:
    """(offset, sentence) for each sentence of one paragraph's text."""
    out, start = [], 0
    for m in re.finditer(r"(?:[.!][\"')\]_]*|\?[\"')\]_*]*)(?=\s)", text):
        end = m.end()
        rest = text[end:].lstrip()
        if not rest:
            continue
        if rest[0].islower():
            continue
        word = text[:m.start() + 1].rsplit(None, 1)[-1].lower().lstrip("(*_\"'")
        if word in ABBREVIATIONS:
            continue
        out.append((start, text[start:end]))
        start = end + (len(text[end:]) - len(rest))
    if text[start:].strip():
        out.append((start, text[start:]))
    return out


_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
_FENCE = re.compile(r"^\s*(```|~~~)")


def units(markdown: str) -> list[Unit]:
    """Cut Markdown into the units the check reads (see the module's rule 1)."""
    result: list[Unit] = []
    para: list[tuple[int, str]] = []

    def flush():
        if not para:
            return
        first = para[0][0]
        text, line_at = "", []
        for ln, s in para:
            if text:
                text += " "
                line_at.append(ln)
            for _ in s:
                line_at.append(ln)
            text += s
        definition = bool(_DECISION_PARAGRAPH.match(text))
        clean = _blank_code_and_links(text)
        # offsets into `clean` differ from `text` where code was blanked; map by a second split of text
        for off, sent in _split_sentences(clean):
            ln = _line_of(text, clean, off, line_at, first)
            result.append(Unit(ln, sent.strip(), "sentence", definition))
        para.clear()

    fence = None
    for i, raw in enumerate(markdown.splitlines(), 1):
        line = raw.rstrip()
        m = _FENCE.match(line)
        if fence is not None:
            if m and m.group(1) == fence:
                fence = None
            elif line.strip():
                result.append(Unit(i, _blank_code_and_links(line.strip()), "code"))
            continue
        if m:
            flush()
            fence = m.group(1)
            continue
        stripped = line.strip()
        if not stripped:
            flush()
        elif re.match(r"#{1,6}(?:\s|$)", stripped):
            flush()
            result.append(Unit(i, _blank_code_and_links(stripped.lstrip("#").strip()), "heading"))
        elif stripped.startswith("|"):  # a table row (header and rule rows too)
            flush()
            result.append(Unit(i, _blank_code_and_links(stripped), "table"))
        elif _LIST_ITEM.match(line):
            flush()
            para.append((i, _LIST_ITEM.sub("", line, count=1).strip()))
        else:
            para.append((i, stripped.lstrip("> ").strip() if stripped.startswith(">") else stripped))
    flush()
    return result


def _line_of(text: str, clean: str, off: int, line_at: list[int], first: int) -> int:
    """The source line of offset ``off`` of ``clean`` (``text`` with code blanked): count the
    characters of ``text`` consumed by the same prefix, re-blanking code spans as we go."""
    if off == 0:
        return first
    # find the text offset whose blanked prefix has length `off`
    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(_blank_code_and_links(text[:mid])) < off:
            lo = mid + 1
        else:
            hi = mid
    return line_at[min(lo, len(line_at) - 1)] if line_at else first


def _exempt(word_key: str, text: str, m: re.Match) -> bool:
    before, after = text[:m.start()], text[m.end():]
    if word_key == "level":
        return bool(_LEVEL_BEFORE.search(before) or _LEVEL_AFTER.match(after))
    if word_key == "only":
        return not _ONLY_BEFORE.search(before) or bool(_ONLY_AFTER.match(after))
    if word_key == "bounded" and _BOUNDED_ATTRIBUTIVE.match(after):
        return True
    if word_key == "helps" and m.group(0).lower() == "help" and re.search(r"(?:['’]s|\bthe|\bits|\btheir|\ba|--)\s*$",
                                                                      before, re.I):
        return True
    if re.search(r"/\s*[*_]*\s*$", before) or re.match(r"^[\w ]{0,12}\s/", after):
        return True
    # an imperative: the unit's first word, in its base form
    first = re.match(r"^[\W_]*(\w+)", text)
    return bool(first and first.start(1) == m.start() and m.group(0).lower() in _IMPERATIVE_FORMS)


def claim_words(text: str) -> tuple[str, ...]:
    """The keys of :data:`VERDICT_WORDS` that ``text`` uses in their verdict sense (rule 2)."""
    found = []
    for key, rx in _WORD_RE.items():
        if any(not _exempt(key, text, m) for m in rx.finditer(text)):
            found.append(key)
    return tuple(found)


def has_evidence(text: str) -> bool:
    """Rule 3: the unit cites a decided row (p_Holm with its value) or a lead (the word "lead" and a
    q value ≤ LEAD_Q)."""
    if _P_HOLM.search(text):
        return True
    if _LEAD.search(text):
        return any(float(m.group(2)) <= LEAD_Q for m in _Q_VALUE.finditer(text))  # "q = 0.06", "q < 0.001"
    return False


def is_definition(text: str) -> bool:
    """Rule 3's last case (without the paragraph): a bold verdict word beside a threshold."""
    return bool(_BOLD_VERDICT.search(text) and _THRESHOLD.search(text))


def check_text(markdown: str) -> list[Flag]:
    """Every unit of ``markdown`` that holds a verdict or mechanism word and cites no decided row or lead."""
    flags = []
    for u in units(markdown):
        if re.sub(r"[\s*_\"')\]]+$", "", u.text).endswith("?"):
            continue  # a question claims nothing
        words = claim_words(u.text)
        if not words or u.definition or is_definition(u.text) or has_evidence(u.text):
            continue
        flags.append(Flag(u.line, u.text, words))
    return flags


def check_files(paths) -> list[tuple[Path, Flag]]:
    """:func:`check_text` over each file, in order."""
    out = []
    for p in map(Path, paths):
        out.extend((p, f) for f in check_text(p.read_text(encoding="utf-8")))
    return out


def default_paths(root: str | Path = ".") -> list[Path]:
    """README.md and every results/*/reading.md under ``root`` (the files the test checks)."""
    root = Path(root)
    paths = [root / "README.md"] if (root / "README.md").exists() else []
    return paths + sorted(root.glob("results/*/reading.md"))


def warning_lines(paths=None, *, root: str | Path = ".") -> list[str]:
    """One line per flagged sentence, ``path:line: claims check: 'word, …' cites no p_Holm or lead (q):
    <sentence>``; ``paths`` default to :func:`default_paths` of ``root``. Empty when the prose passes."""
    paths = default_paths(root) if paths is None else list(paths)
    lines = []
    for p, f in check_files(paths):
        text = f.text if len(f.text) <= 160 else f.text[:157] + "…"
        lines.append(f"{p}:{f.line}: claims check: {', '.join(f.words)} without a p_Holm or a lead with "
                     f"its q: {text}")
    return lines
