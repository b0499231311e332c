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
from dapo.data.rewards import extract_answer, get_scorer
from dapo.data.run_data import example_key
from dapo.eval_records import make_record, problem_id, prompt_hash
from dapo.train.rollout import generate_round, round_seed

__all__ = ["evaluate", "problem_scores", "eval_seed", "sampling_spec", "sample_records", "set_metrics",
           "by_problem"]


def _judge(ex, comps) -> tuple[list[bool], list[str | None]]:
    """([k] correct by the problem's scorer, [k] extracted answers) of one problem's k completions."""
    scorer = get_scorer(ex.scorer)
    return [scorer(c.text, ex.answer) > 0 for c in comps], [extract_answer(c.text) for c in comps]


def _judge_round(examples: list, outs: list[list[Any]], rank: int = 0,
                 world: int = 1) -> list[tuple[list[bool], list[str | None]]]:
    """:func:`_judge` of every problem of a round, judged ONCE over the ranks: rank r judges problems
    r, r + world, ... and the verdicts are gathered, so every rank returns the same [P] list (as the
    rollout's `dapo.train.rollout.score_round`; a scorer with a wall-clock limit cannot make ranks disagree).
    A collective with ``world`` > 1: every rank calls it with the same round."""
    if world == 1:
        return [_judge(ex, comps) for ex, comps in zip(examples, outs)]
    from dapo.dist.distributed import all_gather_object, rollout_group, split_for_rank
    mine = {i: _judge(examples[i], outs[i]) for i in split_for_rank(len(outs), rank, world)}
    merged: dict[int, tuple[list[bool], list[str | None]]] = {}
    for part in all_gather_object(mine, world, group=rollout_group()):
        merged.update(part)
    return [merged[i] for i in range(len(outs))]


def _scores(corr: list[bool], answers: list[str | None]) -> tuple[float, float, float]:
    k = len(corr)
    return algo.avg_at_k(corr), algo.pass_at_k(k, sum(corr), k), algo.cons_at_k(answers, corr)


def problem_scores(ex, comps) -> tuple[float, float, float]:
    """(avg@k, pass@k, cons@k) of one problem from its k completions."""
    return _scores(*_judge(ex, comps))


def eval_seed(train_seed: int, rollout_step: int) -> int:
    """The seed of the evaluation at ``rollout_step`` of a run with ``train.seed`` = ``train_seed``
    (``dapo eval RUN --step S`` uses it to reproduce the logged evaluation)."""
    return round_seed(train_seed, rollout_step, 0, salt=99)


def sampling_spec(cfg: Config, seed: int | None):
    """The evaluation's sampling settings: ``eval.k`` samples, ``eval.temperature``/``top_p``,
    cap ``eval.max_new_tokens`` (else ``rollout.max_new_tokens``)."""
    from dapo.engines import SamplingSpec
    return SamplingSpec(n=cfg.eval.k, temperature=cfg.eval.temperature, top_p=cfg.eval.top_p,
                        max_tokens=cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens, seed=seed)


def sample_records(engine, set_name: str, examples: list, prompt_tokens, spec,
                   seeds: list[int] | None = None, *, rank: int = 0, world: int = 1) -> list[dict[str, Any]]:
    """``spec.n`` samples of each example as records (:mod:`dapo.eval_records`; ``step`` and
    ``grad_step`` null), problem-major, scored by each problem's scorer (each problem on one of the
    ``world`` ranks, :func:`_judge_round`). ``seeds``: one per example, overriding the ones the engine
    derives from ``spec.seed`` (a slice of a longer call's)."""
    prompts = [prompt_tokens[example_key(ex)] for ex in examples]                               # [P]
    outs = engine.generate(prompts, spec, seeds=seeds) if seeds is not None else generate_round(engine, prompts, spec)
    records = []
    for ex, ids, comps, (corr, answers) in zip(examples, prompts, outs,
                                               _judge_round(examples, outs, rank, world)):     # [P][k]
        records += [make_record(set=set_name, problem=problem_id(example_key(ex)), sample=j, seed=spec.seed,
                                prompt_hash=prompt_hash(ids), answer=answers[j], correct=corr[j],
                                length=len(c.token_ids), finished=bool(c.finished), response=c.text)
                    for j, c in enumerate(comps)]
    return records


def by_problem(records: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Records grouped by problem, in first-seen order (each group in sample order as given)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        groups.setdefault(rec["problem"], []).append(rec)
    return list(groups.values())


def set_metrics(set_name: str, records: list[dict[str, Any]], k: int) -> dict[str, float]:
    """``eval/<set>/avg_at_k``, ``pass_at_k``, ``cons_at_k`` and ``response_len_mean`` of one set's
    records (k per problem): the per-problem numbers of :mod:`dapo.algo`, then their mean."""
    scores = [_scores([r["correct"] for r in g], [r["answer"] for r in g]) for g in by_problem(records)]
    avg, pas, cons = zip(*scores) if scores else ((), (), ())
    short = set_name.replace("/", "_")
    return {f"eval/{short}/avg_at_{k}": float(np.mean(avg)), f"eval/{short}/pass_at_{k}": float(np.mean(pas)),
            f"eval/{short}/cons_at_{k}": float(np.mean(cons)),
            f"eval/{short}/response_len_mean": float(np.mean([r["length"] for r in records]))}


def evaluate(engine, eval_sets: dict[str, list], prompt_tokens, cfg: Config,
             seed: int, *, rank: int = 0, world: int = 1) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """avg@k, pass@k, cons@k and the mean response length per eval set, from k samples per problem;
    and the k·P records of each set, one per sample (``step`` and ``grad_step`` left null for the caller).

    avg@k = mean correctness over all k·P samples; pass@k = fraction of problems with at
    least one correct sample; cons@k = mean over problems of the majority-vote answer's
    correctness (ties: the mean over the tied answers, ``algo.cons_at_k``). With ``world`` > 1 a
    collective: every rank calls it; each scores its share of the problems.
    """
    spec = sampling_spec(cfg, seed)
    out: dict[str, float] = {}
    records: list[dict[str, Any]] = []
    for name, examples in eval_sets.items():
        short = name.replace("/", "_")
        recs = sample_records(engine, short, examples, prompt_tokens, spec, rank=rank, world=world)
        out.update(set_metrics(short, recs, spec.n))
        records += recs
    return out, records
