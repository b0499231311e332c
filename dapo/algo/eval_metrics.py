"""Evaluation metrics from n samples per problem (docs/METRICS.md): the per-problem avg@k,
pass@k and cons@k every evaluation logs (re-exported by :mod:`dapo.algo`), and what ``dapo eval``
adds. Plain Python and numpy (no torch), so :mod:`analysis` may use them too.

``n`` samples of a problem, ``c`` of them correct.

- pass@k for every k <= n: the unbiased estimator 1 - C(n-c, k) / C(n, k) (Chen et al. 2021,
  "Evaluating Large Language Models Trained on Code", arXiv 2107.03374), averaged over
  problems (:func:`pass_at_k_curve`).
- maj@k (cons@k) for k <= n: the expected majority-vote correctness over the k-subsets of the n
  samples, ties counted as the mean over the tied answers (as ``dapo.cons_at_k``); exact by
  enumeration while C(n, k) <= ``max_subsets``, else the mean over ``max_subsets`` random
  k-subsets drawn with a fixed seed (:func:`maj_at_k`).
- avg@n with a percentile bootstrap over problems (:func:`bootstrap_mean`): many units, so its
  coverage is close to its label (docs/STATISTICS.md); it says nothing about seeds.
- The solve-rate histogram: how many problems are never / sometimes / always solved
  (:func:`solve_rate_histogram`), what dynamic sampling feeds on.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from collections.abc import Sequence
from typing import Optional

import numpy as np

__all__ = ["pass_at_k", "avg_at_k", "majority_answers", "cons_at_k", "curve_ks", "pass_at_k_curve", "maj_at_k", "maj_at_k_curve", "bootstrap_mean", "solve_rate_histogram"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021): 1 − C(n−c, k)/C(n, k),
    computed as a stable product. Needs 0 ≤ c ≤ n and 1 ≤ k ≤ n."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def avg_at_k(correct: Sequence[bool]) -> float:
    """avg@k: fraction of the k samples that are correct (0.0 for none)."""
    return sum(map(bool, correct)) / len(correct) if len(correct) else 0.0


def majority_answers(answers: Sequence[Optional[str]]) -> list[str]:
    """The answers with the most votes: [k] answers -> the m ≥ 1 tied for the top count, in
    first-seen order; None (no answer extracted) never votes, so [] if every answer is None."""
    counts = Counter(a for a in answers if a is not None)  # keeps first-seen order
    top = max(counts.values(), default=0)
    return [a for a, n in counts.items() if n == top]


def cons_at_k(answers: Sequence[Optional[str]], correct: Sequence[bool]) -> float:
    """cons@k of one problem: the expected correctness of the majority-vote answer, ties broken
    uniformly at random.

    answers: [k] extracted answers (e.g. `dapo.data.rewards.extract_answer`; None never wins a vote);
    correct: [k] whether each sample was scored correct. With m answers tied for the most votes
    (`majority_answers`), each wins with probability 1/m, so cons@k = (correct ones among the m) / m:
    1.0 or 0.0 without a tie, 0.5 for a 2-way tie with one correct, 1/3 for a 3-way tie with one;
    0.0 if every answer is None. Correctness belongs to a sample: an answer's is read off its first
    sample (its samples share the answer, so the `dapo` scorer, which reads only that answer,
    scores them all alike).
    """
    if len(answers) != len(correct):
        raise ValueError(f"answers and correct differ in length: {len(answers)} vs {len(correct)}")
    tied = majority_answers(answers)
    if not tied:
        return 0.0
    first: dict[str, bool] = {}                   # answer -> correctness of its first sample
    for a, c in zip(answers, correct):
        first.setdefault(a, bool(c))
    return sum(first[a] for a in tied) / len(tied)


def curve_ks(n: int) -> list[int]:
    """The k of a curve over n samples: 1, 2, 4, ... below n, and n."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return [2 ** i for i in range(n.bit_length()) if 2 ** i < n] + [n]


def pass_at_k_curve(correct_counts: Sequence[int], n: int, ks: Sequence[int]) -> dict[int, float]:
    """{k: mean over problems of the unbiased pass@k} for problems with ``correct_counts`` [P] of n."""
    return {k: float(np.mean([pass_at_k(n, c, k) for c in correct_counts])) for k in ks}


def maj_at_k(answers: Sequence[str | None], correct: Sequence[bool], k: int, *, max_subsets: int = 2000,
             seed: int = 0) -> float:
    """Expected majority-vote correctness of one problem over the k-subsets of its n samples.

    answers, correct: [n]. Exact (every subset) while C(n, k) <= ``max_subsets``, else the mean over
    ``max_subsets`` k-subsets drawn uniformly with ``random.Random(seed)``. At k = n it is
    ``cons_at_k(answers, correct)``."""
    n = len(answers)
    if not 1 <= k <= n:
        raise ValueError(f"maj@k needs 1 <= k <= n = {n}, got k = {k}")
    if math.comb(n, k) <= max_subsets:
        subsets = itertools.combinations(range(n), k)
    else:
        rng = random.Random(seed)
        subsets = (rng.sample(range(n), k) for _ in range(max_subsets))
    vals = [cons_at_k([answers[i] for i in s], [correct[i] for i in s]) for s in subsets]
    return float(np.mean(vals))


def maj_at_k_curve(problems: Sequence[tuple[Sequence[str | None], Sequence[bool]]], ks: Sequence[int],
                   **kw) -> dict[int, float]:
    """{k: mean over problems of :func:`maj_at_k`}; ``problems``: [P] (answers [n], correct [n])."""
    return {k: float(np.mean([maj_at_k(a, c, k, **kw) for a, c in problems])) for k in ks}


def bootstrap_mean(values: Sequence[float], *, level: float = 0.95, resamples: int = 2000,
                   seed: int = 0) -> tuple[float, float, float]:
    """(mean, lo, hi): the mean of ``values`` [P] (one per problem) and its percentile bootstrap
    interval over problems (``scipy.stats.bootstrap``); (mean, nan, nan) with fewer than 2 values."""
    x = np.asarray(values, dtype=float)
    mean = float(x.mean()) if x.size else float("nan")
    if x.size < 2 or np.all(x == x[0]):
        return (mean, mean, mean) if x.size >= 2 else (mean, float("nan"), float("nan"))
    from scipy.stats import bootstrap
    res = bootstrap((x,), np.mean, confidence_level=level, n_resamples=resamples, method="percentile",
                    random_state=np.random.default_rng(seed))
    return mean, float(res.confidence_interval.low), float(res.confidence_interval.high)


def solve_rate_histogram(correct_counts: Sequence[int], n: int, bins: int = 4) -> dict[str, int]:
    """Problems by solve rate c/n: ``never`` (c = 0), ``always`` (c = n), and ``bins`` equal bins of
    the rates strictly between, named by their range (``"(0, 0.25]"``, ..., ``"(0.75, 1)"``)."""
    out = {"never": 0}
    edges = [i / bins for i in range(bins + 1)]
    names = [f"({edges[i]:g}, {edges[i + 1]:g}{')' if i == bins - 1 else ']'}" for i in range(bins)]
    out.update({name: 0 for name in names})
    out["always"] = 0
    for c in correct_counts:
        if c == 0:
            out["never"] += 1
        elif c == n:
            out["always"] += 1
        else:
            rate = c / n
            out[names[min(bins - 1, max(0, math.ceil(rate * bins) - 1))]] += 1
    return out
