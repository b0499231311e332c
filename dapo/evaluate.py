"""Evaluation: avg@k, pass@k and cons@k per eval set, from k samples per problem (step 8 of the loop, docs/METRICS.md).

The per-problem numbers come from :mod:`dapo.algo` (``avg_at_k``, ``pass_at_k`` with n = k,
``cons_at_k``); an eval set's number is their mean over its problems. Every sample is also
kept as a record (:mod:`dapo.eval_records`), from which the numbers can be recomputed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dapo import algo
from dapo.config import Config
from dapo.eval_records import make_record, problem_id, prompt_hash
from dapo.rewards import extract_answer, get_scorer
from dapo.rollout import generate_round
from dapo.run_data import example_key

__all__ = ["evaluate", "problem_scores"]


def _judge(ex, comps) -> tuple[list[bool], list[str | None]]:
    """([k] correct by the problem's scorer, [k] extracted answers) of one problem's k completions."""
    scorer = get_scorer(ex.scorer)
    return [scorer(c.text, ex.answer) > 0 for c in comps], [extract_answer(c.text) for c in comps]


def _scores(corr: list[bool], answers: list[str | None]) -> tuple[float, float, float]:
    k = len(corr)
    return algo.avg_at_k(corr), algo.pass_at_k(k, sum(corr), k), algo.cons_at_k(answers, corr)


def problem_scores(ex, comps) -> tuple[float, float, float]:
    """(avg@k, pass@k, cons@k) of one problem from its k completions."""
    return _scores(*_judge(ex, comps))


def evaluate(engine, eval_sets: dict[str, list], prompt_tokens, cfg: Config,
             seed: int) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """avg@k, pass@k, cons@k and the mean response length per eval set, from k samples per problem;
    and the k·P records of each set, one per sample (``step`` and ``grad_step`` left null for the caller).

    avg@k = mean correctness over all k·P samples; pass@k = fraction of problems with at
    least one correct sample; cons@k = mean over problems of the majority-vote answer's
    correctness (ties: the mean over the tied answers, ``algo.cons_at_k``).
    """
    from dapo.engines import SamplingSpec
    k = cfg.eval.k
    out: dict[str, float] = {}
    records: list[dict[str, Any]] = []
    for name, examples in eval_sets.items():
        spec = SamplingSpec(n=k, temperature=cfg.eval.temperature, top_p=cfg.eval.top_p,
                            max_tokens=cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens, seed=seed)
        prompts = [prompt_tokens[example_key(ex)] for ex in examples]                           # [P]
        outs = generate_round(engine, prompts, spec)                                           # [P][k]
        judged = [_judge(ex, comps) for ex, comps in zip(examples, outs)]                      # [P] × ([k], [k])
        scores = [_scores(corr, answers) for corr, answers in judged]                          # [P] × 3
        avg, pas, cons = zip(*scores) if scores else ((), (), ())
        lens = [len(c.token_ids) for comps in outs for c in comps]
        short = name.replace("/", "_")
        out[f"eval/{short}/avg_at_{k}"] = float(np.mean(avg))
        out[f"eval/{short}/pass_at_{k}"] = float(np.mean(pas))
        out[f"eval/{short}/cons_at_{k}"] = float(np.mean(cons))
        out[f"eval/{short}/response_len_mean"] = float(np.mean(lens))
        for ex, ids, comps, (corr, answers) in zip(examples, prompts, outs, judged):
            records += [make_record(set=short, problem=problem_id(example_key(ex)), sample=j, seed=seed,
                                    prompt_hash=prompt_hash(ids), answer=answers[j], correct=corr[j],
                                    length=len(c.token_ids), finished=bool(c.finished), response=c.text)
                        for j, c in enumerate(comps)]
    return out, records
