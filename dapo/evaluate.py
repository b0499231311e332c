"""Evaluation: avg@k, pass@k and cons@k per eval set, from k samples per problem (step 8 of the loop, docs/METRICS.md).

The per-problem numbers come from :mod:`dapo.algo` (``avg_at_k``, ``pass_at_k`` with n = k,
``cons_at_k``); an eval set's number is their mean over its problems.
"""

from __future__ import annotations

import numpy as np

from dapo import algo
from dapo.config import Config
from dapo.rewards import extract_answer, get_scorer
from dapo.rollout import generate_round
from dapo.run_data import example_key

__all__ = ["evaluate", "problem_scores"]


def problem_scores(ex, comps) -> tuple[float, float, float]:
    """(avg@k, pass@k, cons@k) of one problem from its k completions."""
    scorer = get_scorer(ex.scorer)
    corr = [scorer(c.text, ex.answer) > 0 for c in comps]                              # [k]
    answers = [extract_answer(c.text) for c in comps]                                  # [k]
    k = len(comps)
    return algo.avg_at_k(corr), algo.pass_at_k(k, sum(corr), k), algo.cons_at_k(answers, corr)


def evaluate(engine, eval_sets: dict[str, list], prompt_tokens, cfg: Config, seed: int) -> dict[str, float]:
    """avg@k, pass@k, cons@k and the mean response length per eval set, from k samples per problem.

    avg@k = mean correctness over all k·P samples; pass@k = fraction of problems with at
    least one correct sample; cons@k = fraction whose majority-vote answer is correct.
    """
    from dapo.engines import SamplingSpec
    k = cfg.eval.k
    out: dict[str, float] = {}
    for name, examples in eval_sets.items():
        spec = SamplingSpec(n=k, temperature=cfg.eval.temperature, top_p=cfg.eval.top_p,
                            max_tokens=cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens, seed=seed)
        outs = generate_round(engine, [prompt_tokens[example_key(ex)] for ex in examples], spec)   # [P][k]
        scores = [problem_scores(ex, comps) for ex, comps in zip(examples, outs)]             # [P] × 3
        avg, pas, cons = zip(*scores) if scores else ((), (), ())
        lens = [len(c.token_ids) for comps in outs for c in comps]
        short = name.replace("/", "_")
        out[f"eval/{short}/avg_at_{k}"] = float(np.mean(avg))
        out[f"eval/{short}/pass_at_{k}"] = float(np.mean(pas))
        out[f"eval/{short}/cons_at_{k}"] = float(np.mean(cons))
        out[f"eval/{short}/response_len_mean"] = float(np.mean(lens))
    return out
