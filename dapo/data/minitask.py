"""The mini task: integer arithmetic with worked steps, in DAPO's ``Answer:`` format.

A problem is a chain of operations (default 1–3) on positive integers, written without
spaces and ending in ``=``; the solution evaluates it one step at a time and ends
with the answer line DAPO's scorer reads::

    prompt   "7*3-5="
    solution "7*3=21. 21-5=16.\\nAnswer: 16"
    answer   "16"

Evaluation order. The solution always works left to right. To keep that identical
to the usual precedence rules, every ``*`` comes before any ``+`` or ``-`` in a
problem (``3*4+5-2`` can be generated, ``3+4*5`` cannot), so each prompt has one
answer under either reading. Intermediate results (and answers) may be negative:
``3-5=-2. -2+7=5.``.

Everything is made from a seed with ``random.Random`` (int or str seeds; its
``randint``/``choice`` draws are stable across CPython 3 versions and platforms), so a
split is the same list everywhere. Only characters of the character vocabulary are used: digits, ``+-*=.``,
space, newline and the letters of ``Answer:``.

Splits (registered by :mod:`dapo.data.datasets` under the names below, scorer ``"dapo"``; this module
imports nothing from ``dapo``):

- ``arith-eval``: the fixed held-out set, 200 problems, seed ``EVAL_SEED``, equal
  shares of 1, 2 and 3 operations (the ``ops`` range the base model was trained on).
- ``arith-train``: 20 000 problems, seed ``TRAIN_SEED``, never containing an
  ``arith-eval`` prompt (problems are drawn and rejected by prompt string; a rejected
  draw is redrawn from scratch, number of operations included, so one-operation
  problems, which hit the held-out set most often, are 29.9% of the split rather than
  a third). Short problems repeat: there are only 12·12·3 = 432 distinct
  one-operation problems with operands 1–12, so the train split samples with
  replacement (12,470 distinct prompts among the 20,000).

- ``arith-fresh``: a second held-out set made after the v2 regime was calibrated on
  ``arith-eval`` (so no choice of the regime saw it): 200 distinct problems, seed
  ``FRESH_SEED``, 2 and 3 operations in equal shares, none of them a prompt that any
  stage saw: not in ``arith-eval``, ``arith-train`` or the first ``SFT_DRAWS`` problems of
  the supervised stream of seed 0 (what the shipped base recipes train on). It has no
  one-operation problem because none is left unseen (all 432 are in ``arith-eval`` or the
  supervised stream), and its 2-operation problems are the ~15% of that space the
  supervised stream missed, so its accuracy is not comparable with ``arith-eval``'s; the
  differences between arms are what it checks.

The supervised warm-up (:mod:`dapo.base_model`) draws its own stream (:func:`sft_stream`)
with another seed, with the same exclusion of ``arith-eval`` prompts.
"""
from __future__ import annotations

import random
import re
from typing import Iterator

OPS = "+-*"
"""Operators; ``*`` is drawn like the others and then moved to the front."""

EVAL_SEED = 20250314
TRAIN_SEED = 1
N_EVAL = 200
N_TRAIN = 20_000
FRESH_SEED = 20261204
N_FRESH = 200
FRESH_N_OPS: tuple[int, int] = (2, 3)
SFT_DRAWS = 51_200
"""Problems of the supervised stream that ``arith-fresh`` avoids: the shipped base recipes'
400 steps x 128 problems (a test checks this against :data:`dapo.base_model.NAMED_RECIPES`)."""
DEFAULT_OPERAND_MAX = 12
DEFAULT_N_OPS: tuple[int, int] = (1, 3)


def _apply(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    raise ValueError(f"unknown operator {op!r}; valid: {list(OPS)}")


def make_problem(rng: random.Random, n_ops: int, operand_max: int) -> tuple[str, str, str]:
    """One problem with ``n_ops`` operations on integers in ``[1, operand_max]``.

    Returns ``(prompt, solution, answer)``: ``prompt`` like ``"7*3-5="``, ``solution``
    the worked steps plus ``"\\nAnswer: <n>"``, ``answer`` the integer as a string.
    """
    if n_ops < 1:
        raise ValueError(f"n_ops must be >= 1, got {n_ops}")
    if operand_max < 1:
        raise ValueError(f"operand_max must be >= 1, got {operand_max}")
    operands = [rng.randint(1, operand_max) for _ in range(n_ops + 1)]
    ops = [rng.choice(OPS) for _ in range(n_ops)]
    ops.sort(key=lambda o: o != "*")  # stable: all '*' first, then '+'/'-' in draw order
    prompt = str(operands[0]) + "".join(op + str(x) for op, x in zip(ops, operands[1:])) + "="
    value = operands[0]
    steps = []
    for op, x in zip(ops, operands[1:]):
        new = _apply(value, op, x)
        steps.append(f"{value}{op}{x}={new}.")
        value = new
    answer = str(value)
    solution = " ".join(steps) + f"\nAnswer: {answer}"
    return prompt, solution, answer


STYLES = ("answer", "steps", "sums")
"""Ways to write a solution (the supervised stage can mix them; RL then picks among them):

- ``answer``: the answer line only, ``"Answer: 16"`` (short, guessed in one go);
- ``steps``: one step per operation, as :func:`make_problem` writes it;
- ``sums``: like ``steps``, but each product is counted up as a running sum of its
  larger factor, ``"7*3=7 14 21."`` (long: up to ~150 tokens for ``12*12*12*12``).
"""


def _parse(prompt: str) -> tuple[list[int], list[str]]:
    """``"7*3-5="`` → ``([7, 3, 5], ["*", "-"])`` (operands are positive, as generated)."""
    parts = re.split(r"([+*-])", prompt.rstrip("="))
    return [int(x) for x in parts[0::2]], parts[1::2]


def solve(prompt: str, style: str) -> str:
    """The solution of a generated ``prompt`` written in ``style`` (one of :data:`STYLES`).

    ``solve(p, "steps")`` equals :func:`make_problem`'s solution for the same problem.
    """
    if style not in STYLES:
        raise ValueError(f"unknown solution style {style!r}; valid: {list(STYLES)}")
    operands, ops = _parse(prompt)
    value, steps = operands[0], []
    for op, x in zip(ops, operands[1:]):
        new = _apply(value, op, x)
        if style == "sums" and op == "*":
            big, times = max(value, x), min(value, x)  # products come first: both are positive
            steps.append(f"{value}*{x}=" + " ".join(str(big * k) for k in range(1, times + 1)) + ".")
        else:
            steps.append(f"{value}{op}{x}={new}.")
        value = new
    answer = f"Answer: {value}"
    return answer if style == "answer" else " ".join(steps) + "\n" + answer


def style_of(response: str) -> str:
    """Which of :data:`STYLES` a generated response is written in (``"steps"`` when unsure):
    ``answer`` if it starts with ``Answer:``, ``sums`` if some step counts up (``"=7 14"``)."""
    text = response.lstrip()
    if text.startswith("Answer:"):
        return "answer"
    return "sums" if re.search(r"=-?\d+ -?\d", text) else "steps"


def evaluate_left_to_right(prompt: str) -> int:
    """Recompute a prompt's value from its string (an independent check of the generator)."""
    expr = prompt.rstrip("=")
    value, num, op = None, "", None
    for ch in expr + "\0":
        if ch.isdigit():
            num += ch
            continue
        x = int(num)
        value = x if value is None else _apply(value, op, x)
        num, op = "", ch
    assert value is not None
    return value


def _n_ops_for(i: int, rng: random.Random, n_ops: tuple[int, int], stratified: bool) -> int:
    lo, hi = n_ops
    if stratified:
        return lo + i % (hi - lo + 1)
    return rng.randint(lo, hi)


MAX_REJECTS = 100_000
"""Consecutive rejected draws after which a stream gives up (its space is exhausted)."""


def iter_problems(
    seed: int | str,
    *,
    n_ops: tuple[int, int] = DEFAULT_N_OPS,
    operand_max: int = DEFAULT_OPERAND_MAX,
    exclude: frozenset[str] | set[str] = frozenset(),
    stratified: bool = False,
    unique: bool = False,
) -> Iterator[dict]:
    """An endless stream of problem dicts ``{prompt, solution, answer, n_ops}``.

    ``exclude``: prompts never yielded. ``stratified``: cycle the number of
    operations lo, lo+1, …, hi instead of drawing it. ``unique``: skip repeats.
    """
    lo, hi = n_ops
    if not 1 <= lo <= hi:
        raise ValueError(f"n_ops must be (lo, hi) with 1 <= lo <= hi, got {n_ops}")
    rng = random.Random(seed)
    seen: set[str] = set()
    i = rejects = 0
    while True:
        k = _n_ops_for(i, rng, n_ops, stratified)  # stratified: same k until accepted
        prompt, solution, answer = make_problem(rng, k, operand_max)
        if prompt in exclude or (unique and prompt in seen):
            rejects += 1
            if rejects >= MAX_REJECTS:
                raise ValueError(
                    f"iter_problems: {rejects} draws in a row were excluded or repeats; "
                    f"n_ops={n_ops}, operand_max={operand_max} has too few distinct problems"
                )
            continue
        rejects = 0
        if unique:
            seen.add(prompt)
        i += 1
        yield {"prompt": prompt, "solution": solution, "answer": answer, "n_ops": k}


def eval_problems(
    n: int = N_EVAL,
    seed: int = EVAL_SEED,
    *,
    n_ops: tuple[int, int] = DEFAULT_N_OPS,
    operand_max: int = DEFAULT_OPERAND_MAX,
) -> list[dict]:
    """The fixed held-out set: ``n`` distinct problems, difficulties in equal shares."""
    it = iter_problems(seed, n_ops=n_ops, operand_max=operand_max, stratified=True, unique=True)
    return [next(it) for _ in range(n)]


def eval_prompts(**kwargs) -> frozenset[str]:
    """Prompt strings of the held-out set (what every training stream excludes)."""
    return frozenset(p["prompt"] for p in eval_problems(**kwargs))


def sft_stream(seed: int, *, n_ops: tuple[int, int] = DEFAULT_N_OPS,
               operand_max: int = DEFAULT_OPERAND_MAX) -> Iterator[dict]:
    """The supervised stage's endless problem stream for base-recipe seed ``seed`` (no
    ``arith-eval`` prompt); :mod:`dapo.base_model` takes ``steps x batch_size`` from it."""
    return iter_problems(f"dapo-sft:{seed}", n_ops=n_ops, operand_max=operand_max, exclude=eval_prompts())


def seen_prompts() -> frozenset[str]:
    """Every prompt a shipped stage saw: ``arith-eval``, ``arith-train`` and the first
    :data:`SFT_DRAWS` problems of seed 0's supervised stream."""
    sft = sft_stream(0)
    return (eval_prompts() | {p["prompt"] for p in make_split("train", N_TRAIN, TRAIN_SEED)}
            | {next(sft)["prompt"] for _ in range(SFT_DRAWS)})


def fresh_problems(n: int = N_FRESH, seed: int = FRESH_SEED) -> list[dict]:
    """The second held-out set ``arith-fresh``: ``n`` distinct problems, 2 and 3 operations
    in equal shares, none in :func:`seen_prompts`."""
    it = iter_problems(seed, n_ops=FRESH_N_OPS, stratified=True, unique=True, exclude=seen_prompts())
    return [next(it) for _ in range(n)]


def make_split(
    name: str,
    n: int,
    seed: int,
    *,
    n_ops: tuple[int, int] = DEFAULT_N_OPS,
    operand_max: int = DEFAULT_OPERAND_MAX,
    exclude: frozenset[str] | set[str] = frozenset(),
) -> list[dict]:
    """``n`` problems of split ``name``: ``"eval"`` (distinct, stratified by difficulty)
    or ``"train"`` (difficulty drawn uniformly, repeats allowed, ``exclude`` plus the
    default held-out prompts removed)."""
    if name == "eval":
        return eval_problems(n, seed, n_ops=n_ops, operand_max=operand_max)
    if name == "train":
        excl = frozenset(exclude) | eval_prompts()
        it = iter_problems(seed, n_ops=n_ops, operand_max=operand_max, exclude=excl)
        return [next(it) for _ in range(n)]
    raise ValueError(f"unknown split {name!r}; valid: ['eval', 'train']")
