"""The mini reproduction's base model: a tiny Qwen2 taught the arithmetic task a little.

DAPO's mechanisms need a policy that is neither hopeless nor done: groups of G samples
that are sometimes all correct, often all wrong, often mixed, and responses whose
length meets the generation cap. :func:`build_base_model` makes one on a CPU in a few
minutes:

1. random-init a :data:`dapo.models.TINY_PRESETS` model with the character tokenizer;
2. supervised training on ``prompt + solution + EOS`` from :mod:`dapo.data.minitask`
   (teacher forcing, loss on solution and EOS tokens only; AdamW, linear warm-up then
   linear decay to 0, grad clip 1.0, bf16 autocast over fp32 master weights);
3. evaluation on ``arith-eval`` (200 problems): ``eval_samples`` samples per problem at
   temperature 1.0 (top-k and top-p off), scored with :func:`dapo.data.rewards.dapo_score`
   on the text the cap leaves, reported at the recipe's ``cap`` and at a few other caps;
4. ``save_pretrained`` model + tokenizer into ``out_dir`` (loadable by transformers and
   vLLM) and ``out_dir/base_model.json`` with the recipe, its hash, package versions,
   the numbers and wall times.

A call whose ``out_dir/base_model.json`` holds the same recipe hash returns the stored
record without training (``force=True`` rebuilds). The default ``out_dir`` is
``<cache>/base/<recipe hash>`` with ``<cache>`` = ``$DAPO_LAB_CACHE`` or
``~/.cache/dapo-lab``.

Lengths are in tokens, and with the character tokenizer one character is one token.
A response's length counts its EOS token; a response is *truncated* at cap ``c`` when
no EOS appears among its first ``c`` tokens (it is then scored on those ``c`` tokens,
as the RL loop does). Metrics at a cap ``c`` are taken from samples generated up to
``max(caps)`` tokens, cut at ``c``: the first ``c`` tokens of a sample are distributed
exactly as a sample generated with ``max_new_tokens = c``.

CLI: ``python -m dapo.base_model --help`` (wired as ``dapo base``).
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import platform
import random
import re
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dapo.data.minitask import N_EVAL, STYLES

__all__ = ["RECIPE_VERSION", "Recipe", "build_base_model", "default_out_dir", "evaluate", "main", "recipe_hash",
           "resolve_policy_path", "summary"]

RECIPE_VERSION = 1
"""Bumped whenever the code changes what a recipe produces (invalidates reuse)."""

RECORD_NAME = "base_model.json"


class RecipeError(ValueError):
    """A :class:`Recipe` field out of range: ``key``, ``value``, ``why``."""

    def __init__(self, key: str, value: Any, why: str):
        super().__init__(f"base model recipe: {key}={value!r} {why}")
        self.key, self.value, self.why = key, value, why


@dataclasses.dataclass(frozen=True)
class Recipe:
    """Everything that determines the base model and its reported numbers."""

    preset: str = "tiny-3m"  # dapo.models.TINY_PRESETS name
    steps: int = 400  # supervised optimizer steps
    batch_size: int = 128  # problems per step
    lr: float = 2e-3  # peak AdamW learning rate
    warmup_steps: int = 10  # linear warm-up, then linear decay to 0 at `steps`
    weight_decay: float = 0.0  # AdamW weight decay
    grad_clip: float = 1.0  # max global gradient norm
    seed: int = 0  # model init, data stream ("sft:<seed>") and eval sampling
    n_ops: tuple[int, int] = (1, 3)  # operations per training problem, drawn uniformly
    operand_max: int = 12  # operands are integers in [1, operand_max]
    bf16: bool = True  # bf16 autocast for the supervised forward/backward, where the CPU has bf16 (hardware.has_bf16)
    cap: int = 40  # response-length cap (tokens, EOS included) the numbers refer to
    report_caps: tuple[int, ...] = (32, 36, 40, 44, 48)  # caps also reported
    eval_problems: int = 200  # first k problems of arith-eval (stratified: 1,2,3,1,2,3,...)
    eval_samples: int = 8  # samples per held-out problem (the group size G)
    eval_temperature: float = 1.0
    styles: tuple[tuple[str, float], ...] = (("steps", 1.0),)  # solution styles (minitask.STYLES) and weights
    length_buckets: int = 1  # split each batch into this many length-sorted chunks (less padding, same loss)
    version: int = RECIPE_VERSION

    def __post_init__(self) -> None:
        from dapo.models import TINY_PRESETS

        def need(ok: bool, key: str, why: str) -> None:
            if not ok:
                raise RecipeError(key, getattr(self, key), why)

        need(self.preset in TINY_PRESETS, "preset", f"is not one of {sorted(TINY_PRESETS)}")
        need(self.steps >= 1, "steps", "must be >= 1")
        need(self.batch_size >= 1, "batch_size", "must be >= 1")
        need(self.lr > 0, "lr", "must be > 0")
        need(0 <= self.warmup_steps <= self.steps, "warmup_steps", "must be in [0, steps]")
        need(len(self.n_ops) == 2 and 1 <= self.n_ops[0] <= self.n_ops[1], "n_ops",
             "must be (lo, hi) with 1 <= lo <= hi")
        need(self.operand_max >= 1, "operand_max", "must be >= 1")
        need(self.cap >= 1, "cap", "must be >= 1")
        need(all(c >= 1 for c in self.report_caps), "report_caps", "must all be >= 1")
        need(1 <= self.eval_problems <= N_EVAL, "eval_problems", f"must be in [1, {N_EVAL}]")
        need(self.eval_samples >= 1, "eval_samples", "must be >= 1")
        need(self.eval_temperature > 0, "eval_temperature", "must be > 0")
        need(1 <= self.length_buckets <= self.batch_size, "length_buckets", "must be in [1, batch_size]")
        need(len(self.styles) >= 1 and all(st in STYLES and w > 0 for st, w in self.styles)
             and len({st for st, _ in self.styles}) == len(self.styles), "styles",
             f"must be distinct (style, weight > 0) pairs with style in {list(STYLES)}")

    @property
    def caps(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.report_caps) | {self.cap}))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields; ``styles`` and ``length_buckets`` only when not at their defaults
        (so recipes from before they existed keep their hash)."""
        d = dataclasses.asdict(self)
        for key in ("styles", "length_buckets"):  # fields added later: absent at their default
            if getattr(self, key) == getattr(Recipe, key):
                del d[key]
        if "styles" in d:
            d["styles"] = [[st, w] for st, w in self.styles]
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


def recipe_hash(recipe: Recipe) -> str:
    """First 12 hex digits of sha256 over the recipe's canonical JSON."""
    blob = json.dumps(recipe.to_dict(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def default_out_dir(recipe: Recipe) -> Path:
    from dapo.models import default_cache_dir

    return default_cache_dir() / "base" / recipe_hash(recipe)


# --------------------------------------------------------------------------- data


def _encode(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    return tokenizer(list(texts), add_special_tokens=False)["input_ids"]


def _rows_to_tensors(p_ids: list[list[int]], s_ids: list[list[int]], eos: int, pad: int):
    """(input_ids [B, T], labels [B, T], attention_mask [B, T]) for prompt + solution + EOS rows,
    right-padded to the longest; labels are -100 on prompt and pad."""
    import torch

    T = max(len(a) + len(b) + 1 for a, b in zip(p_ids, s_ids))
    ids = torch.full((len(p_ids), T), pad, dtype=torch.long)
    labels = torch.full((len(p_ids), T), -100, dtype=torch.long)
    mask = torch.zeros((len(p_ids), T), dtype=torch.long)
    for i, (a, b) in enumerate(zip(p_ids, s_ids)):
        row = a + b + [eos]
        ids[i, : len(row)] = torch.tensor(row)
        labels[i, len(a) : len(row)] = torch.tensor(b + [eos])
        mask[i, : len(row)] = 1
    return ids, labels, mask


def _sft_batches(recipe: Recipe, tokenizer):
    """Yield, for each step, a list of ``recipe.length_buckets`` chunks (ids, labels, mask), each
    [B_c, T_c] (see :func:`_rows_to_tensors`); with several, rows are sorted by length first."""
    from dapo.data.minitask import sft_stream, solve

    stream = sft_stream(recipe.seed, n_ops=recipe.n_ops, operand_max=recipe.operand_max)
    style_rng = random.Random(f"dapo-sft-style:{recipe.seed}")
    names, weights = zip(*recipe.styles)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    for _ in range(recipe.steps):
        probs = [next(stream) for _ in range(recipe.batch_size)]
        p_ids = _encode(tokenizer, [p["prompt"] for p in probs])
        # style draws use their own stream, so the problems (and v1's steps-only batches) do not change
        sols = [solve(p["prompt"], st) for p, st in zip(probs, style_rng.choices(names, weights, k=len(probs)))]
        s_ids = _encode(tokenizer, sols)
        order = sorted(range(len(probs)), key=lambda i: len(p_ids[i]) + len(s_ids[i])) \
            if recipe.length_buckets > 1 else list(range(len(probs)))
        size = -(-len(order) // recipe.length_buckets)
        yield [_rows_to_tensors([p_ids[i] for i in part], [s_ids[i] for i in part], eos, pad)
               for part in (order[k : k + size] for k in range(0, len(order), size))]


def _lr_factor(step: int, recipe: Recipe) -> float:
    """Linear warm-up over warmup_steps, then linear decay to 0 at `steps` (step is 0-based)."""
    if step < recipe.warmup_steps:
        return (step + 1) / recipe.warmup_steps
    span = max(1, recipe.steps - recipe.warmup_steps)
    return max(0.0, 1.0 - (step - recipe.warmup_steps) / span)


def _train(model, tokenizer, recipe: Recipe, *, progress: bool = True) -> dict[str, float]:
    import torch
    import torch.nn.functional as F
    from tqdm import tqdm

    from dapo.hardware import has_bf16

    model.train()
    bf16 = recipe.bf16 and has_bf16()   # as training (dapo.train.update.bf16_autocast): emulated bf16 is ~20x slower
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=(0.9, 0.95),
                            weight_decay=recipe.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, recipe))
    losses: list[float] = []
    n_tokens = 0
    bar = tqdm(_sft_batches(recipe, tokenizer), total=recipe.steps, desc="base sft",
               disable=not progress, dynamic_ncols=True)
    for chunks in bar:
        opt.zero_grad(set_to_none=True)
        n_target = sum(int((labels[:, 1:] != -100).sum()) for _, labels, _ in chunks)
        loss = 0.0
        for ids, labels, mask in chunks:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                logits = model(input_ids=ids, attention_mask=mask).logits  # [B_c, T_c, V]
            ce = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), labels[:, 1:].flatten(),
                                 ignore_index=-100, reduction="mean" if len(chunks) == 1 else "sum")
            part = ce if len(chunks) == 1 else ce / n_target  # mean over the batch's solution + EOS tokens
            part.backward()
            loss += part.item()
            n_tokens += int(mask.sum())
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
        opt.step()
        sched.step()
        losses.append(loss)
        bar.set_postfix(loss=f"{losses[-1]:.3f}", lr=f"{sched.get_last_lr()[0]:.1e}")
    bar.close()
    tail = losses[-max(1, len(losses) // 10):]
    return {"train_loss_first": losses[0], "train_loss_last10pct": sum(tail) / len(tail),
            "train_tokens": n_tokens, "bf16_autocast": bf16}


# --------------------------------------------------------------------------- eval


def _generate(model, tokenizer, prompts: Sequence[str], *, n: int, max_new_tokens: int,
              temperature: float, seed: int, batch_prompts: int = 50) -> list[list[list[int]]]:
    """``n`` samples per prompt with transformers' ``generate`` (left padding, top-k/top-p off).

    Returns out[prompt][sample] = generated ids, cut after the first EOS.
    """
    import torch

    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    model.eval()
    out: list[list[list[int]]] = []
    gen = torch.Generator().manual_seed(seed)
    for start in range(0, len(prompts), batch_prompts):
        chunk = prompts[start : start + batch_prompts]
        enc = _encode(tokenizer, chunk)
        L = max(map(len, enc))
        ids = torch.full((len(enc) * n, L), pad, dtype=torch.long)
        att = torch.zeros_like(ids)
        for i, e in enumerate(enc):
            for j in range(n):
                ids[i * n + j, L - len(e):] = torch.tensor(e)
                att[i * n + j, L - len(e):] = 1
        torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
        with torch.no_grad():
            seqs = model.generate(input_ids=ids, attention_mask=att, do_sample=True,
                                  temperature=temperature, top_k=0, top_p=1.0,
                                  max_new_tokens=max_new_tokens, eos_token_id=eos,
                                  pad_token_id=pad)
        new = seqs[:, L:].tolist()
        for i in range(len(enc)):
            group = []
            for row in new[i * n : (i + 1) * n]:
                cut = row.index(eos) + 1 if eos in row else len(row)
                group.append(row[:cut])
            out.append(group)
    return out


def _metrics_at_cap(groups: list[list[list[int]]], problems: list[dict], tokenizer,
                    cap: int) -> dict[str, Any]:
    """Accuracy, group fractions, lengths and truncation when responses are cut at ``cap``."""
    from dapo.data.minitask import style_of
    from dapo.data.rewards import dapo_score

    eos = tokenizer.eos_token_id
    per: dict[str, dict[str, list[float]]] = {}

    def add(key: str, name: str, v: float) -> None:
        per.setdefault(key, {}).setdefault(name, []).append(v)

    for prob, group in zip(problems, groups):
        n_correct = 0
        for toks in group:
            cut = toks[:cap]
            truncated = eos not in cut
            text = tokenizer.decode([t for t in cut if t != eos], skip_special_tokens=True)
            ok = dapo_score(text, prob["answer"]) > 0
            n_correct += ok
            add("style", style_of(text), float(ok))
            for key in ("all", f"ops{prob['n_ops']}"):
                add(key, "acc", float(ok))
                add(key, "len", float(len(cut)))
                add(key, "truncated", float(truncated))
                if ok:
                    add(key, "len_correct", float(len(cut)))
        for key in ("all", f"ops{prob['n_ops']}"):
            add(key, "all_correct", float(n_correct == len(group)))
            add(key, "all_wrong", float(n_correct == 0))
            add(key, "pass", float(n_correct > 0))

    def mean(xs: list[float] | None) -> float | None:
        return round(sum(xs) / len(xs), 4) if xs else None

    out: dict[str, Any] = {}
    by_style = per.pop("style", {})
    n_resp = sum(len(v) for v in by_style.values())
    for key in sorted(per, key=lambda k: (k != "all", k)):
        d = per[key]
        out[key] = {
            "problems": len(d["all_correct"]),
            "acc": mean(d["acc"]),
            "pass_at_g": mean(d["pass"]),
            "all_correct_frac": mean(d["all_correct"]),
            "all_wrong_frac": mean(d["all_wrong"]),
            "mixed_frac": round(1 - mean(d["all_correct"]) - mean(d["all_wrong"]), 4),
            "response_len_mean": mean(d["len"]),
            "correct_len_mean": mean(d.get("len_correct")),
            "truncated_frac": mean(d["truncated"]),
        }
    out["all"]["styles"] = {st: {"share": round(len(v) / n_resp, 4), "acc": mean(v)}
                            for st, v in sorted(by_style.items())}
    return out


def evaluate(model, tokenizer, recipe: Recipe, problems: list[dict] | None = None) -> dict[str, Any]:
    """Held-out numbers of ``model`` at every cap in ``recipe.caps`` (see module doc)."""
    from dapo.data.minitask import eval_problems

    problems = problems if problems is not None else eval_problems()[: recipe.eval_problems]
    t0 = time.perf_counter()
    groups = _generate(model, tokenizer, [p["prompt"] for p in problems], n=recipe.eval_samples,
                       max_new_tokens=max(recipe.caps), temperature=recipe.eval_temperature,
                       seed=recipe.seed)
    gen_s = time.perf_counter() - t0
    n_tok = sum(len(t) for g in groups for t in g)
    result: dict[str, Any] = {
        "cap": recipe.cap,
        "at_cap": _metrics_at_cap(groups, problems, tokenizer, recipe.cap),
        "by_cap": {str(c): _metrics_at_cap(groups, problems, tokenizer, c)["all"]
                   for c in recipe.caps},
        "generation": {
            "sequences": sum(len(g) for g in groups),
            "max_new_tokens": max(recipe.caps),
            "generated_tokens": n_tok,
            "seconds": round(gen_s, 2),
            "tokens_per_s": round(n_tok / gen_s, 1),
            "engine": "transformers.generate fp32 (batches of 50 prompts x G)",
        },
        "examples": [
            {"prompt": p["prompt"], "answer": p["answer"],
             "samples": [tokenizer.decode(t, skip_special_tokens=True) for t in g[:3]]}
            for p, g in list(zip(problems, groups))[:6]
        ],
    }
    return result


# --------------------------------------------------------------------------- build


def _versions() -> dict[str, str]:
    import tokenizers
    import torch
    import transformers

    import dapo
    from dapo.hardware import cpu_name

    return {"python": platform.python_version(), "cpu": cpu_name(), "torch": torch.__version__,
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
            "dapo_lab": getattr(dapo, "__version__", "?")}


def _read_record(out_dir: Path) -> dict[str, Any] | None:
    f = out_dir / RECORD_NAME
    if not f.is_file() or not (out_dir / "config.json").is_file():
        return None
    try:
        return json.loads(f.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _train_into(tmp: Path, tok, recipe: Recipe, h: str, start: tuple, *, progress: bool) -> dict[str, Any]:
    """Init, train and evaluate the base model; save it, its tokenizer and its record into ``tmp``.

    ``start``: (perf_counter, process_time, 1-min load average) when the build began.
    Returns the record (the content of base_model.json).
    """
    import torch

    from dapo.hardware import cpu_name
    from dapo.models import TINY_PRESETS, build_tiny_qwen2, load_model, save_pretrained

    t_start, cpu_start, load_start = start
    build_tiny_qwen2(tmp / "init", seed=recipe.seed, tokenizer=tok, **TINY_PRESETS[recipe.preset])
    model = load_model(tmp / "init", dtype="float32")
    shutil.rmtree(tmp / "init")
    n_params = sum(p.numel() for p in model.parameters())
    torch.manual_seed(recipe.seed)
    t0 = time.perf_counter()
    train = _train(model, tok, recipe, progress=progress)
    train_s = time.perf_counter() - t0
    ev = evaluate(model, tok, recipe)
    save_pretrained(model, tok, tmp)
    record: dict[str, Any] = {
        "recipe": recipe.to_dict(),
        "recipe_hash": h,
        "seed": recipe.seed,
        "parameters": n_params,
        "versions": _versions(),
        "threads": torch.get_num_threads(),
        "cpu": cpu_name(),
        "train": {**train, "seconds": round(train_s, 1),
                  "seconds_per_step": round(train_s / recipe.steps, 3)},
        "eval": ev,
        "wall_time_s": round(time.perf_counter() - t_start, 1),
        "cpu_time_s": round(time.process_time() - cpu_start, 1),
        "load_avg_1min": {"start": load_start,
                          "end": os.getloadavg()[0] if hasattr(os, "getloadavg") else None},
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (tmp / RECORD_NAME).write_text(json.dumps(record, indent=1) + "\n")
    return record


def build_base_model(
    out_dir: str | os.PathLike | None = None,
    *,
    force: bool = False,
    progress: bool = True,
    threads: int | None = None,
    **recipe_kw: Any,
) -> dict[str, Any]:
    """Train (or reuse) the base model; return its record (the content of base_model.json).

    ``recipe_kw`` are :class:`Recipe` fields (preset, steps, batch_size, lr, seed, n_ops,
    operand_max, bf16, cap, ...). ``out_dir`` defaults to ``<cache>/base/<recipe hash>``.
    An existing ``out_dir`` is replaced only if it is empty or an earlier base model
    (it holds base_model.json or config.json); anything else is an error.
    ``threads``: torch threads (default ``os.cpu_count()``); not part of the recipe.
    With other processes busy on the same cores, 1 thread can be several times faster
    than 2 (OpenMP threads wait on each other when a core is taken away).
    The returned dict also has ``"reused"``: True when nothing was trained.
    """
    for k in ("n_ops", "report_caps"):
        if k in recipe_kw and recipe_kw[k] is not None:
            recipe_kw[k] = tuple(recipe_kw[k])
    if recipe_kw.get("styles") is not None:
        recipe_kw["styles"] = tuple((str(st), float(w)) for st, w in recipe_kw["styles"])
    recipe = Recipe(**recipe_kw)
    h = recipe_hash(recipe)
    out = Path(out_dir).expanduser() if out_dir is not None else default_out_dir(recipe)
    if not force and (old := _reused(out, h)) is not None:
        return old
    from dapo.models import build_lock

    with build_lock(out):   # ranks or jobs building the same base model at once: one trains, the others wait
        if not force and (old := _reused(out, h)) is not None:
            return old
        if out_dir is not None and out.exists() and any(out.iterdir()) and not (
            (out / RECORD_NAME).exists() or (out / "config.json").exists()
        ):
            raise FileExistsError(f"{out} exists and is not a base model directory; refusing to replace it")
        if progress:
            print(f"[dapo] building the base model {out.name} ({recipe.steps} supervised steps of preset "
                  f"{recipe.preset}; ~7 min per 400 steps on an idle 2-core CPU, longer beside other work); it is built once and reused "
                  f"from {out}", file=sys.stderr, flush=True)
        record = _build(out, recipe, h, threads=threads, progress=progress)
    record["reused"] = False
    record["model_path"] = str(out)
    return record


def _reused(out: Path, h: str) -> dict[str, Any] | None:
    """The record of the base model already built into ``out`` from recipe hash ``h``, else None
    (a half-made cache entry has no record: it is rebuilt)."""
    old = _read_record(out)
    if old is None or old.get("recipe_hash") != h:
        return None
    return {**old, "reused": True, "model_path": str(out)}


def _build(out: Path, recipe: Recipe, h: str, *, threads: int | None, progress: bool) -> dict[str, Any]:
    """Train the base model of ``recipe`` and publish it atomically into ``out``; its record."""
    import torch

    from dapo.models import build_char_tokenizer, publish_dir

    prev_threads = torch.get_num_threads()
    torch.set_num_threads(threads or os.cpu_count() or 1)
    start = (time.perf_counter(), time.process_time(), os.getloadavg()[0] if hasattr(os, "getloadavg") else None)
    tok = build_char_tokenizer()
    record: dict[str, Any] = {}
    try:
        publish_dir(out, lambda tmp: record.update(_train_into(tmp, tok, recipe, h, start, progress=progress)))
    finally:
        torch.set_num_threads(prev_threads)
    return record


NAMED_RECIPES: dict[str, dict[str, Any]] = {
    "mini-base": {},  # v1: worked steps only, 400 steps (results/table1-mini-v1)
    # v2: three solution styles (a short guess, worked steps, long running sums), so the
    # policy starts with real diversity and lengths from ~10 to ~150 tokens (docs/MINI_TASK.md)
    "mini-base-v2": {"styles": (("answer", 1.0), ("steps", 1.0), ("sums", 1.0)), "length_buckets": 8,
                     "cap": 160, "report_caps": (40, 64, 96, 128)},
}
"""``model.path`` names of base-model recipes (:class:`Recipe` fields that differ from the
defaults). ``<name>:STEPS`` is the same recipe with another number of supervised steps."""


def named_recipe(name: str) -> dict[str, Any] | None:
    """The recipe fields ``name`` (``mini-base``, ``mini-base-v2:150``, ...) stands for, else None.

    Raises ValueError for a known name with a bad ``:STEPS`` suffix: not a number, or one no
    :class:`Recipe` can take (0, fewer than its warm-up steps, more than :data:`MAX_NAMED_STEPS`)."""
    base, sep, steps = name.partition(":")
    if base not in NAMED_RECIPES:
        return None
    if sep and not re.fullmatch(r"[0-9]{1,12}", steps):
        raise ValueError(f"model.path = {name!r}: expected {base}:<supervised steps>, e.g. {base}:150")
    kw = {**NAMED_RECIPES[base], **({"steps": int(steps)} if sep else {})}
    n = kw.get("steps", Recipe.steps)
    warm = kw.get("warmup_steps", Recipe.warmup_steps)
    if not warm <= n <= MAX_NAMED_STEPS:
        raise ValueError(f"model.path = {name!r}: {base}:<supervised steps> takes {warm} to {MAX_NAMED_STEPS} steps "
                         f"(at least its {warm} warm-up steps; {Recipe.steps} by default, ~7 min on an idle 2-core CPU), "
                         f"e.g. {base}:150")
    Recipe(**kw)      # every other field checked as a build would check it
    return kw


MAX_NAMED_STEPS = 100_000
"""The most supervised steps ``<recipe>:STEPS`` may ask for (400 take ~7 min on an idle 2-core CPU: 100 000, about a day)."""


def resolve_policy_path(name: str) -> Path | str:
    """A :data:`NAMED_RECIPES` name (``mini-base``, ``mini-base-v2:STEPS``, ...) → this module's
    base model (built once, cached by recipe hash); anything else →
    :func:`dapo.models.resolve_model` (hub ids allowed)."""
    kw = named_recipe(name)
    if kw is not None:
        return Path(build_base_model(**kw)["model_path"])
    from dapo.models import resolve_model
    return resolve_model(name, allow_hub=True)


# --------------------------------------------------------------------------- CLI


def _fmt(x: Any) -> str:
    return "-" if x is None else f"{x:.3f}" if isinstance(x, float) else str(x)


def summary(record: dict[str, Any]) -> str:
    """A few lines: where, how long, and the held-out numbers at the cap."""
    ev = record["eval"]
    lines = [f"base model: {record.get('model_path', '?')} (recipe {record['recipe_hash']}"
             f"{', reused' if record.get('reused') else ''}); wall {record['wall_time_s']} s, "
             f"train {record['train']['seconds']} s"]
    lines.append(f"held-out, G={record['recipe']['eval_samples']}, T={record['recipe']['eval_temperature']}, "
                 f"cap {ev['cap']}:")
    lines.append("  split    acc    pass@G  all-correct  all-wrong  len   truncated")
    for k, m in ev["at_cap"].items():
        lines.append(f"  {k:7s} {_fmt(m['acc']):>6s} {_fmt(m['pass_at_g']):>7s} "
                     f"{_fmt(m['all_correct_frac']):>11s} {_fmt(m['all_wrong_frac']):>10s} "
                     f"{_fmt(m['response_len_mean']):>6s} {_fmt(m['truncated_frac']):>9s}")
    styles = ev["at_cap"]["all"].get("styles")
    if styles:
        lines.append("  styles: " + "; ".join(f"{st} {m['share']:.0%} of responses, acc {_fmt(m['acc'])}"
                                              for st, m in styles.items()))
    lines.append("  by cap: " + "; ".join(
        f"{c}: acc {_fmt(m['acc'])} trunc {_fmt(m['truncated_frac'])}" for c, m in ev["by_cap"].items()))
    g = ev["generation"]
    lines.append(f"  generation: {g['generated_tokens']} tokens in {g['seconds']} s "
                 f"({g['tokens_per_s']} tok/s, {g['engine']})")
    return "\n".join(lines)


def _ints(s: str) -> tuple[int, ...]:
    return tuple(int(x) for x in s.replace(",", " ").replace("-", " ").split())


def _styles(s: str) -> tuple[tuple[str, float], ...]:
    """``"answer:1,steps:2"`` → ``(("answer", 1.0), ("steps", 2.0))``."""
    out = []
    for item in s.split(","):
        name, _, w = item.strip().partition(":")
        if name not in STYLES:
            raise argparse.ArgumentTypeError(f"unknown style {name!r}; valid: {', '.join(STYLES)}")
        try:
            out.append((name, float(w or 1)))
        except ValueError:
            raise argparse.ArgumentTypeError(f"style {name!r}: weight {w!r} is not a number") from None
    return tuple(out)


def main(argv: Sequence[str] | None = None) -> int:
    d = Recipe()
    p = argparse.ArgumentParser(prog="dapo base", description=(
        "Build (or reuse) the mini task's base model: a tiny Qwen2 trained briefly on "
        "generated arithmetic, then evaluated on arith-eval. Prints the held-out numbers."))
    p.add_argument("--recipe", default="mini-base", choices=sorted(NAMED_RECIPES),
                   help="named recipe to start from (mini-base: worked steps only, the v1 regime; "
                        "mini-base-v2: three solution styles, the current mini reproduction); "
                        "the options below override its fields")
    p.add_argument("--out", help="output directory (default: <cache>/base/<recipe hash>)")
    p.add_argument("--preset", default=d.preset, help=f"tiny model preset (default {d.preset})")
    p.add_argument("--steps", type=int, default=d.steps, help=f"SFT steps (default {d.steps})")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help=f"(default {d.batch_size})")
    p.add_argument("--lr", type=float, default=d.lr, help=f"peak lr (default {d.lr})")
    p.add_argument("--warmup-steps", type=int, default=d.warmup_steps, help=f"(default {d.warmup_steps})")
    p.add_argument("--seed", type=int, default=d.seed, help=f"(default {d.seed})")
    p.add_argument("--n-ops", type=_ints, default=d.n_ops, help="'lo,hi' operations per problem (default 1,3)")
    p.add_argument("--operand-max", type=int, default=d.operand_max, help=f"(default {d.operand_max})")
    p.add_argument("--cap", type=int, default=d.cap, help=f"response cap in tokens (default {d.cap})")
    p.add_argument("--report-caps", type=_ints, default=d.report_caps,
                   help="other caps to report, 'a,b,c' (default 32,36,40,44,48)")
    p.add_argument("--styles", type=_styles, default=d.styles,
                   help=f"solution styles and weights, e.g. 'answer:1,steps:1,sums:1' (styles: "
                        f"{', '.join(STYLES)}; default steps only)")
    p.add_argument("--eval-samples", type=int, default=d.eval_samples, help=f"G (default {d.eval_samples})")
    p.add_argument("--length-buckets", type=int, default=d.length_buckets,
                   help=f"length-sorted chunks per batch (default {d.length_buckets})")
    p.add_argument("--no-bf16", dest="bf16", action="store_false", help="train in fp32")
    p.add_argument("--force", action="store_true", help="rebuild even if the recipe was built")
    p.add_argument("--threads", type=int, help="torch threads (default: all cores)")
    p.add_argument("--json", action="store_true", help="print the whole record as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    named, _ = p.parse_known_args(argv)
    p.set_defaults(**{k.replace("-", "_"): v for k, v in NAMED_RECIPES[named.recipe].items()})
    a = p.parse_args(argv)
    fields = dict(preset=a.preset, steps=a.steps, batch_size=a.batch_size, lr=a.lr, warmup_steps=a.warmup_steps,
                  seed=a.seed, n_ops=tuple(a.n_ops), operand_max=a.operand_max, cap=a.cap, eval_samples=a.eval_samples,
                  bf16=a.bf16, report_caps=tuple(a.report_caps), styles=a.styles, length_buckets=a.length_buckets)
    try:   # every flag checked before anything is built: one line each, as every dapo command
        if a.threads is not None and a.threads < 1:
            raise ValueError(f"--threads {a.threads}: must be >= 1")
        if a.out and Path(a.out).expanduser().exists() and not Path(a.out).expanduser().is_dir():
            raise ValueError(f"--out {a.out}: not a directory")
        if not math.isfinite(a.lr):
            raise ValueError(f"--lr {a.lr}: expected a finite number")
        try:
            Recipe(**fields)
        except RecipeError as exc:
            flag = f"--{exc.key.replace('_', '-')}"
            raise ValueError(f"{flag if flag in p._option_string_actions else exc.key} {exc.value!r}: {exc.why}") \
                from None
    except ValueError as exc:
        print(f"error: dapo base: {exc}", file=sys.stderr)
        return 2
    try:
        rec = build_base_model(a.out, force=a.force, progress=not a.quiet, threads=a.threads, **fields)
    except FileExistsError as exc:     # --out holds something that is not a base model: refused before any work
        print(f"error: dapo base: --out: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(rec, indent=1) if a.json else summary(rec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
