"""Metric names: which logged names are evaluations, the headline metric, and how a name is shown.

Evaluation metrics are named ``eval/<dataset>/<kind>_at_<k>`` (kind: avg | pass | cons), the
one pattern :data:`EVAL_RE` reads. Accuracies and fractions are logged in [0, 1] and shown in %
(:func:`metric_scale`). Pure: pandas and numpy only.
"""

from __future__ import annotations

import re
from typing import Iterable

import numpy as np
import pandas as pd

__all__ = ["EVAL_RE", "LABELS", "X_LABELS", "PROBABILITY", "PAPER_METRIC", "UNDEFINED_WHEN_ZERO", "eval_metrics", "primary_metric",
           "metric_short", "dataset_name", "metric_scale", "metric_label", "is_paper_metric", "mask_undefined",
           "EQUIVALENCE_MARGINS", "equivalence_margin"]

EVAL_RE = re.compile(r"^eval/(?P<dataset>[^/]+)/(?P<kind>avg|pass|cons)_at_(?P<k>\d+)$")
DATASET_TITLES = {"aime24": "AIME 2024", "aime25": "AIME 2025", "math500": "MATH-500", "gsm8k": "GSM8K",
                  "arith": "arith"}
LABELS = {
    "train/entropy": "entropy (nats/token)",
    "rollout/response_len_mean": "response length (tokens)",
    "rollout/reward_mean": "mean reward",
    "train/token_prob_mean": "mean token probability",
    "train/up_clipped_prob_mean": "mean probability of up-clipped tokens",
    "sampling/all_correct_frac": "prompts with accuracy 1 (%)",
    "sampling/all_wrong_frac": "prompts with accuracy 0 (%)",
    "rollout/acc_mean": "rollout accuracy (%)",
    "rollout/truncated_frac": "truncated responses (%)",
}
"""Axis labels of the non-eval metrics the figures draw."""
PERCENT = {"sampling/all_correct_frac", "sampling/all_wrong_frac", "rollout/acc_mean",
           "rollout/truncated_frac", "train/clip_frac_high", "train/clip_frac_low"}
"""Non-eval metrics that are fractions in [0, 1] (shown in %)."""
PROBABILITY = {"train/token_prob_mean", "train/up_clipped_prob_mean"}
"""Non-eval metrics that are probabilities, shown as logged, in [0, 1] (a band is clipped there)."""
NONNEGATIVE = {"mismatch/k3", "train/entropy", "rollout/response_len_mean"}
"""Non-eval metrics that cannot be negative by construction (a KL estimate, an entropy, a length):
a band's lower end is clipped at 0, where a t interval over few seeds may reach below it."""
X_LABELS = {"grad_step": "gradient step", "rollout_step": "rollout step"}
PAPER_METRIC = "eval/aime24/avg_at_32"
"""The metric of the paper's Table 1 and figures (AIME 2024 avg@32): only a sweep scored by it
is compared with the paper's numbers ("ours − paper")."""
EQUIVALENCE_MARGINS = {
    "eval": 1.0,                          # any eval/<set>/<kind>_at_<k>, in points (%)
    "rollout/acc_mean": 1.0,
    "rollout/reward_mean": 0.02,
    "train/entropy": 0.01,
    "rollout/response_len_mean": 2.0,
    "rollout/truncated_frac": 0.5,
    "train/clip_frac_high": 0.01,
    "train/clip_frac_low": 0.05,
}
"""The declared equivalence margin m per metric, in the unit it is shown in (% for fractions):
a difference whose TOST bounds it inside ±m is a "bounded null". Accuracy: 1 point, the
paper's smallest Table 1 step (token-level loss, +1); entropy: 0.01 nats/token, about a
quarter of naive GRPO's collapse over a mini run (−0.036); length: 2 tokens; truncation:
0.5 points; reward: 0.02. docs/STATISTICS.md says why each."""
UNDEFINED_WHEN_ZERO = {"train/up_clipped_prob_mean": "train/clip_frac_high"}
"""Metrics logged as 0.0 when they are undefined, and the metric whose 0 at the same point says
so: the mean probability of up-clipped tokens is 0.0 in a step that clipped no token at
1 + ε_high (``train/clip_frac_high`` = 0, i.e. an up-clipped count of 0)."""


def eval_metrics(metrics: Iterable[str]) -> list[tuple[str, str, str, int]]:
    """``[(name, dataset, kind, k)]`` for every ``eval/<dataset>/<kind>_at_<k>`` name."""
    out = []
    for m in sorted(set(metrics)):
        g = EVAL_RE.match(m)
        if g:
            out.append((m, g["dataset"], g["kind"], int(g["k"])))
    return out


def primary_metric(tidy_or_metrics: pd.DataFrame | Iterable[str]) -> str | None:
    """The headline metric: ``avg_at_<largest k>`` on aime24 if logged, else the first dataset."""
    metrics = (tidy_or_metrics["metric"].unique() if isinstance(tidy_or_metrics, pd.DataFrame)
               else tidy_or_metrics)
    avg = [e for e in eval_metrics(metrics) if e[2] == "avg"]
    if not avg:
        return None
    datasets = sorted({e[1] for e in avg}, key=lambda d: (d != "aime24", d))
    best = max((e for e in avg if e[1] == datasets[0]), key=lambda e: e[3])
    return best[0]


def metric_short(metric: str) -> str:
    """``eval/aime24/avg_at_32`` → ``avg@32``; other names unchanged."""
    g = EVAL_RE.match(metric)
    return f"{g['kind']}@{g['k']}" if g else metric


def dataset_name(metric: str) -> str:
    """``eval/aime24/avg_at_32`` → ``AIME 2024``; ``""`` for a non-eval metric."""
    g = EVAL_RE.match(metric)
    return DATASET_TITLES.get(g["dataset"], g["dataset"]) if g else ""


def metric_scale(tidy: pd.DataFrame, metric: str) -> float:
    """100 for accuracies/fractions logged in [0, 1] (drawn and tabulated in %), else 1."""
    if not (EVAL_RE.match(metric) or metric in PERCENT):
        return 1.0
    v = tidy.loc[tidy["metric"] == metric, "value"].to_numpy(dtype=float)
    v = v[np.isfinite(v)]
    return 100.0 if v.size and v.min() >= 0 and v.max() <= 1 else 1.0


def metric_label(metric: str, scale: float = 1.0) -> str:
    """The y-axis label of ``metric`` drawn at ``scale`` (100: in %)."""
    if EVAL_RE.match(metric):
        return f"{metric_short(metric)}" + (" (%)" if scale == 100 else "")
    lab = LABELS.get(metric, metric)
    return lab if scale == 100 or "(%)" not in lab else lab.replace(" (%)", " (fraction)")


def equivalence_margin(metric: str | None, declared: dict[str, float] | None = None) -> float | None:
    """The margin of ``metric`` in its shown unit: the sweep's own (``declared``, its spec's
    ``margins``) if it names the metric, else :data:`EQUIVALENCE_MARGINS`; None if neither has one."""
    if not metric:
        return None
    if declared and metric in declared:
        return float(declared[metric])
    if EVAL_RE.match(metric):
        return EQUIVALENCE_MARGINS["eval"]
    return EQUIVALENCE_MARGINS.get(metric)


def is_paper_metric(metric: str | None) -> bool:
    """True for the paper's own task and metric (AIME 2024 avg@32), the only one its numbers compare with."""
    return metric == PAPER_METRIC


def mask_undefined(tidy: pd.DataFrame) -> pd.DataFrame:
    """``tidy`` with the points of :data:`UNDEFINED_WHEN_ZERO` metrics set to NaN where they are undefined.

    A point of ``metric`` is undefined when its witness metric is 0 at the same (run, grad
    step); without the witness logged, a value of exactly 0 is taken as undefined (a mean
    probability of real tokens is never exactly 0). Returns a copy when anything changes.
    """
    out = tidy
    for metric, witness in UNDEFINED_WHEN_ZERO.items():
        sel = tidy["metric"] == metric
        if not sel.any():
            continue
        w = tidy.loc[tidy["metric"] == witness, ["run", "grad_step", "value"]]
        if len(w):
            zero = w[w["value"] == 0][["run", "grad_step"]].drop_duplicates()
            pts = tidy.loc[sel, ["run", "grad_step"]].reset_index()
            hit = pts.merge(zero, on=["run", "grad_step"], how="inner")["index"].to_numpy()
        else:
            hit = tidy.index[sel & (tidy["value"] == 0)].to_numpy()
        if len(hit):
            out = out.copy() if out is tidy else out
            out.loc[hit, "value"] = np.nan
    return out
