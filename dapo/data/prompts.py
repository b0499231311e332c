"""Prompts: the :class:`Example` record, the templates, and the exact text the policy reads.

A problem becomes a prompt in two steps. Loading (:func:`dapo.data.datasets.load_dataset`) wraps it
in a template (:func:`apply_template`): ``"dapo"`` asks for a final ``Answer:`` line, which
the DAPO scorer reads; ``"boxed"`` asks for ``\\boxed{}``, which math-verify reads
(:data:`TEMPLATE_SCORER`). Rendering (:func:`render_prompt`) turns the templated prompt into
the string fed to the policy, through the tokenizer's chat template when it has one;
:func:`drop_long_prompts` counts its tokens and drops the prompts over the budget.

Plain Python: no torch, no transformers import (tokenizers are passed in as objects), and
nothing from the rest of ``dapo`` (the data layer's leaf).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # only the annotation of drop_long_prompts' report
    from dapo.data.datasets import LoadReport

__all__ = [
    "BOXED_TEMPLATE_SUFFIX",
    "DAPO_TEMPLATE_PREFIX",
    "DAPO_TEMPLATE_SUFFIX",
    "SCORERS",
    "TEMPLATES",
    "TEMPLATE_SCORER",
    "DataError",
    "Example",
    "apply_template",
    "drop_long_prompts",
    "prompt_chars",
    "prompt_key",
    "render_prompt",
    "wrap_boxed",
    "wrap_dapo",
]


class DataError(ValueError):
    """A data set could not be loaded or a prompt rendered; the message names the path (and row) at fault."""


@dataclass(frozen=True)
class Example:
    """One prompt with its ground truth.

    prompt: the user text, already wrapped in its template, or a list of chat messages
        ``[{"role": "user", "content": ...}, ...]``.
    answer: ground truth as a string (ints are converted).
    source: data set name (or path) it came from.
    index: 0-based row number in the source stream (file line / parquet row).
    scorer: ``"dapo"`` (last ``Answer:`` line) or ``"math_verify"`` (``\\boxed{}``).
    meta: extra fields kept for analysis (e.g. MATH-500 ``level``); not part of equality.
    """

    prompt: str | list[dict]
    answer: str
    source: str
    index: int
    scorer: str
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)


# --------------------------------------------------------------------------- templates

DAPO_TEMPLATE_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should "
    "be of the form Answer: $Answer (without quotes) where $Answer is the answer to the "
    "problem.\n\n"
)
DAPO_TEMPLATE_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'
BOXED_TEMPLATE_SUFFIX = (
    "\n\nPlease reason step by step, and put your final answer within \\boxed{}."
)

Template = Literal["dapo", "boxed", "none"]
TEMPLATES: tuple[str, ...] = ("dapo", "boxed", "none")
SCORERS: tuple[str, ...] = ("dapo", "math_verify")
TEMPLATE_SCORER = {"dapo": "dapo", "boxed": "math_verify"}
"""The scorer a template asks for (``"none"``: the data set's own)."""


def wrap_dapo(problem: str) -> str:
    """The DAPO user message: prefix + problem + suffix, concatenated exactly (no strip)."""
    return DAPO_TEMPLATE_PREFIX + problem + DAPO_TEMPLATE_SUFFIX


def wrap_boxed(problem: str) -> str:
    """Problem followed by the usual "put your final answer within \\boxed{}" instruction."""
    return problem + BOXED_TEMPLATE_SUFFIX


def _apply_template(text: str, template: str) -> str:
    if template == "dapo":
        return wrap_dapo(text)
    if template == "boxed":
        return wrap_boxed(text)
    return text


def apply_template(prompt: str | list[dict], template: str) -> str | list[dict]:
    """``prompt`` wrapped in ``template``; chat messages: the last user message's content is wrapped."""
    if template == "none":
        return prompt
    if isinstance(prompt, str):
        return _apply_template(prompt, template)
    # chat messages: wrap the last user message's content
    out = [dict(m) for m in prompt]
    for m in reversed(out):
        if m["role"] == "user":
            m["content"] = _apply_template(m["content"], template)
            break
    return out


def prompt_key(prompt: str | list[dict]) -> str:
    """A string that is equal for equal prompts (deduplication, fingerprints)."""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, ensure_ascii=False)


def prompt_chars(prompt: str | list[dict]) -> int:
    """Characters of a prompt (chat messages: of their contents)."""
    return len(prompt) if isinstance(prompt, str) else sum(len(m["content"]) for m in prompt)


# --------------------------------------------------------------------------- rendering and token counts


_CHAT_ALIASES: dict[Any, Any] = {"yes": True, "no": False}  # config spells them so


def render_prompt(
    example: Example | str | list[dict],
    tokenizer: Any = None,
    use_chat_template: bool | Literal["auto"] = "auto",
) -> str:
    """The exact string fed to the policy.

    With a tokenizer that has a chat template and ``use_chat_template`` True or "auto":
    ``tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)``,
    where a string prompt becomes ``[{"role": "user", "content": text}]``. Otherwise the raw
    text (chat messages without a template: their contents joined by a blank line).
    ``use_chat_template=True`` without a chat template is an error; ``"yes"`` / ``"no"``
    (the config's spelling) mean True / False.
    """
    use_chat_template = _CHAT_ALIASES.get(use_chat_template, use_chat_template)  # type: ignore[arg-type]
    prompt = example.prompt if isinstance(example, Example) else example
    has_template = tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))
    if use_chat_template not in (True, False, "auto"):
        raise ValueError(
            f"use_chat_template={use_chat_template!r}; allowed: True, False, 'auto', 'yes', 'no'"
        )
    if use_chat_template is True and not has_template:
        raise DataError(
            "use_chat_template=True but "
            + ("no tokenizer was given" if tokenizer is None else "the tokenizer has no chat_template")
        )
    if use_chat_template and has_template:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if not isinstance(text, str):  # pragma: no cover - defensive, depends on tokenizer
            raise DataError(f"apply_chat_template returned {type(text).__name__}, expected str")
        return text
    if isinstance(prompt, str):
        return prompt
    return "\n\n".join(m["content"] for m in prompt)


def drop_long_prompts(
    examples: Sequence[Example],
    tokenizer: Any,
    max_tokens: int,
    *,
    use_chat_template: bool | str = "auto",
    on_bad: Literal["drop", "fail"] = "drop",
    report: "LoadReport | None" = None,
) -> list[Example]:
    """Keep examples whose rendered prompt is at most ``max_tokens`` tokens.

    Tokens are counted on ``render_prompt(ex, tokenizer, use_chat_template)`` with
    ``add_special_tokens=False`` (the chat template already holds its special tokens).
    Dropped rows are added to ``report`` under "prompt too long (tokens)"; with
    ``on_bad="fail"`` the first one raises a DataError naming its source and index.
    """
    if max_tokens <= 0:
        raise ValueError(f"max_tokens={max_tokens!r} must be > 0")
    texts = [render_prompt(ex, tokenizer, use_chat_template) for ex in examples]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    reason = "prompt too long (tokens)"
    kept: list[Example] = []
    for ex, toks in zip(examples, ids):
        if len(toks) <= max_tokens:
            kept.append(ex)
            continue
        msg = f"row {ex.index}: {reason} ({len(toks)} > {max_tokens})"
        if on_bad == "fail":
            raise DataError(f"{ex.source}: {msg}")
        if report is not None:
            report.add_bad(reason, msg)
    if report is not None:
        report.kept -= len(examples) - len(kept)
    return kept
