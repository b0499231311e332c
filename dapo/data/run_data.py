"""The prompts of one run: the training set (as a resumable sampler) and the eval sets,
loaded, checked against ``data.max_prompt_tokens`` and tokenized once.

``prompt_tokens`` maps each example's key (:func:`example_key`) to its prompt's
token ids; rollouts and evaluation read prompts only through it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dapo.config import Config

__all__ = ["load_run_data", "load_eval_sets", "short_prompts", "example_key"]


def example_key(ex) -> tuple:
    """The key of an example's prompt token ids in ``prompt_tokens``: (source, row index)."""
    return (ex.source, ex.index)


def _template(cfg: Config):
    return None if cfg.data.template == "default" else cfg.data.template


def _use_chat(cfg: Config):
    return {"auto": "auto", "yes": True, "no": False}[cfg.data.use_chat_template]


def _read_eval_sets(cfg: Config, log) -> dict[str, list]:
    """``eval.datasets`` loaded in ``data.template``, by set name (a path's stem)."""
    from dapo.data.datasets import load_dataset
    eval_sets = {}
    for es in cfg.eval.datasets:
        ex, rep = load_dataset(es.name, limit=es.limit, on_bad=cfg.data.on_bad, template=_template(cfg))
        log(f"eval data {es.name}: {rep.summary()}")
        eval_sets[Path(es.name).stem if os.sep in es.name else es.name] = ex
    return eval_sets


def _tokenize(examples: list, tokenizer, use_chat) -> dict[tuple, list[int]]:
    from dapo.data.prompts import render_prompt
    ids = tokenizer([render_prompt(e, tokenizer, use_chat) for e in examples], add_special_tokens=False)["input_ids"]
    return {example_key(e): t for e, t in zip(examples, ids)}


def load_eval_sets(cfg: Config, tokenizer, log) -> tuple[dict[str, list], dict[tuple, list[int]]]:
    """The eval sets alone (``dapo eval``), prepared exactly as :func:`load_run_data` prepares them:
    (eval sets by name, prompt token ids by example key)."""
    use_chat = _use_chat(cfg)
    eval_sets = {k: short_prompts(v, tokenizer, use_chat, cfg) for k, v in _read_eval_sets(cfg, log).items()}
    return eval_sets, _tokenize([e for v in eval_sets.values() for e in v], tokenizer, use_chat)


def load_run_data(cfg: Config, tokenizer, log) -> tuple[Any, dict[tuple, list[int]], dict[str, list], dict]:
    """Training prompts (as a resumable sampler) and eval sets, both in ``data.template`` (so the
    policy is evaluated on the prompts it is trained on, and scored the same way), without
    prompts longer than ``data.max_prompt_tokens``; returns (sampler, prompt token ids by example key, eval sets, MLflow tags)."""
    from dapo.data.datasets import load_dataset
    from dapo.data.sampler import PromptSampler
    use_chat = _use_chat(cfg)
    skip = cfg.data.train_skip
    train_examples, report = load_dataset(cfg.data.train, on_bad=cfg.data.on_bad, template=_template(cfg),
                                          limit=None if cfg.data.train_limit is None else skip + cfg.data.train_limit)
    train_examples = train_examples[skip:]
    log(f"train data {cfg.data.train}: {report.summary()}")
    eval_sets = _read_eval_sets(cfg, log)
    train_keys = {example_key(e) for e in train_examples}
    overlap = {k: sum(example_key(e) in train_keys for e in v) for k, v in eval_sets.items()}
    for k, n in overlap.items():
        if n:
            log(f"WARNING: {n} of the {len(eval_sets[k])} problems of eval set {k!r} are also training "
                f"problems (same file and row); set data.train_skip to hold them out")
    n_all = len(train_examples) + sum(map(len, eval_sets.values()))
    train_examples = short_prompts(train_examples, tokenizer, use_chat, cfg)
    eval_sets = {k: short_prompts(v, tokenizer, use_chat, cfg) for k, v in eval_sets.items()}
    kept = train_examples + [e for v in eval_sets.values() for e in v]
    too_long = n_all - len(kept)
    if too_long:
        log(f"dropped {too_long} prompts longer than data.max_prompt_tokens={cfg.data.max_prompt_tokens}")
    if not train_examples:
        raise ValueError(f"data.train={cfg.data.train!r}: no usable training rows")
    prompt_tokens = _tokenize(kept, tokenizer, use_chat)
    sampler = PromptSampler(train_examples, batch_size=cfg.gen_batch_prompts, seed=cfg.train.seed,
                            drop_solved=cfg.data.drop_solved)
    tags = {"dapo.data.train": report.summary(), "dapo.data.too_long_prompts": too_long,
            "dapo.data.train_eval_overlap": sum(overlap.values())}
    return sampler, prompt_tokens, eval_sets, tags


def short_prompts(examples: list, tokenizer, use_chat, cfg: Config) -> list:
    """``examples`` whose rendered prompt has at most ``data.max_prompt_tokens`` tokens (data.on_bad=fail: raise)."""
    from dapo.data.prompts import DataError, drop_long_prompts
    try:
        return drop_long_prompts(examples, tokenizer, cfg.data.max_prompt_tokens, use_chat_template=use_chat,
                                 on_bad=cfg.data.on_bad)
    except DataError as exc:
        raise DataError(f"{exc}: raise data.max_prompt_tokens={cfg.data.max_prompt_tokens} "
                        f"or set data.on_bad=drop") from None
