"""A config built from a mapping and checked: every value coerced to its field's type (one ConfigError naming
the file, the key, the value and what is allowed), the ranges and combinations, the names and texts."""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from typing import Any, Literal

from dapo.config.sections import Config
from dapo.config.views import to_dict
from dapo.store_checks import scheme as tracking_scheme
from dapo.yaml_io import ConfigError, password_refusal, show, uri_password


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin is typing.Union:
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is tuple:
        return "list"
    if tp is type(None):
        return "null"
    if dataclasses.is_dataclass(tp):
        return "mapping"
    return getattr(tp, "__name__", str(tp))


# values that were renamed, with why: an old file gets the new name in its error line
RENAMED_VALUES = {
    ("algo.loss_agg", "seq_mean_token_sum_norm"):
        "renamed seq_mean_token_sum_const (sum / (S*C); verl's seq-mean-token-sum-norm divides by C only)",
}

_FLOAT_RE = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


def _coerce(value: Any, tp: Any, key: str, where: str) -> Any:
    """Check ``value`` against the annotation ``tp``; return the typed value or raise."""
    def bad(extra: str = "") -> ConfigError:
        return ConfigError(f"{where}: {key} = {show(value)}: expected {_type_name(tp)}{extra}")

    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if value is None:
            value = {}
        if isinstance(value, str) and "name" in {f.name for f in dataclasses.fields(tp)}:
            value = {"name": value}  # shorthand: `datasets: [aime24]`
        if not isinstance(value, dict):
            raise bad()
        return _build(tp, value, key, where)
    if origin is typing.Union:
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key, where)
            except ConfigError:
                pass
        raise bad()
    if origin is Literal:
        if value not in typing.get_args(tp):
            renamed = RENAMED_VALUES.get((key, value)) if isinstance(value, str) else None
            raise bad(f"; {renamed}" if renamed else "")
        return value
    if origin is tuple:
        if isinstance(value, dict) or isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise bad()
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(v, args[0], f"{key}[{i}]", where) for i, v in enumerate(value))
        if len(value) != len(args):
            raise bad(f" of length {len(args)}")
        return tuple(_coerce(v, a, f"{key}[{i}]", where) for i, (v, a) in enumerate(zip(value, args)))
    if tp is bool:
        if not isinstance(value, bool):
            raise bad()
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad()
        return value
    if tp is float:
        if isinstance(value, str) and _FLOAT_RE.fullmatch(value.strip()):
            value = float(value)  # PyYAML reads `1e-6` (no dot) as a string (YAML 1.1)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad()
        if not math.isfinite(value):
            raise bad(" (finite)")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise bad()
        return value
    raise bad()  # pragma: no cover - unknown annotation


def _build(cls: type, data: dict, prefix: str, where: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for k in data:
        if k not in names:
            full = f"{prefix}.{k}" if prefix else str(k)
            raise ConfigError(f"{where}: unknown key {show(full)}; allowed under "
                              f"{prefix or 'the top level'}: {', '.join(sorted(names))}")
    kwargs = {}
    for f in dataclasses.fields(cls):
        full = f"{prefix}.{f.name}" if prefix else f.name
        if f.name in data:
            kwargs[f.name] = _coerce(data[f.name], hints[f.name], full, where)
        elif dataclasses.is_dataclass(hints[f.name]):
            kwargs[f.name] = _build(hints[f.name], {}, full, where)
    return cls(**kwargs)


TRACKING_SCHEMES = ("", "file", "sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks")
"""URI schemes of ``logging.tracking_uri`` MLflow can store runs in ("" = a plain directory path;
``postgresql+psycopg2://`` counts as postgresql)."""


def _check_ranges(cfg: Config, where: str) -> None:
    """Cross-field and range checks. Pure: reads ``cfg``, raises ConfigError."""
    def need(cond: bool, key: str, value: Any, allowed: str) -> None:
        if not cond:
            raise ConfigError(f"{where}: {key} = {show(value)}: {allowed}")

    c, t, r, a, e = cfg.algo.clip, cfg.train, cfg.rollout, cfg.algo, cfg.eval
    need(0 <= c.eps_low < 1, "algo.clip.eps_low", c.eps_low, "must be in [0, 1)")
    need(c.eps_high >= 0, "algo.clip.eps_high", c.eps_high, "must be >= 0")
    need(c.eps_high >= c.eps_low, "algo.clip.eps_high", c.eps_high,
         f"must be >= algo.clip.eps_low ({c.eps_low}); Clip-Higher raises the upper bound")
    need(c.dual_clip_c is None or c.dual_clip_c > 1, "algo.clip.dual_clip_c", c.dual_clip_c, "must be > 1 or null")
    need(a.kl.coef >= 0, "algo.kl.coef", a.kl.coef, "must be >= 0")
    need(a.adv_eps > 0, "algo.adv_eps", a.adv_eps, "must be > 0")
    need(0 <= a.gspo.eps_low < 1, "algo.gspo.eps_low", a.gspo.eps_low, "must be in [0, 1)")
    need(a.gspo.eps_high >= 0, "algo.gspo.eps_high", a.gspo.eps_high, "must be >= 0")
    need(a.cispo.eps_low is None or 0 <= a.cispo.eps_low < 1, "algo.cispo.eps_low", a.cispo.eps_low,
         "must be in [0, 1) or null (no floor)")
    need(a.cispo.eps_high >= 0, "algo.cispo.eps_high", a.cispo.eps_high, "must be >= 0")
    for key, sec in (("clip_cov", a.clip_cov), ("kl_cov", a.kl_cov)):
        need(0 < sec.ratio <= 1, f"algo.{key}.ratio", sec.ratio, "must be in (0, 1]")
    need(a.clip_cov.lb < a.clip_cov.ub, "algo.clip_cov.ub", a.clip_cov.ub, f"must be > algo.clip_cov.lb ({a.clip_cov.lb})")
    need(a.kl_cov.coef >= 0, "algo.kl_cov.coef", a.kl_cov.coef, "must be >= 0")
    need(0 < a.top_entropy_quantile <= 1, "algo.top_entropy_quantile", a.top_entropy_quantile,
         "must be in (0, 1] (1.0 = every token)")
    o = a.overlong
    need(o.max_len > 0, "algo.overlong.max_len", o.max_len, "must be > 0")
    need(0 < o.cache_len <= o.max_len, "algo.overlong.cache_len", o.cache_len,
         f"must be in (0, algo.overlong.max_len = {o.max_len}]")
    need(o.factor >= 0, "algo.overlong.factor", o.factor, "must be >= 0")
    # the penalty is non-zero only for lengths in (max_len − cache_len, ...]; generation stops at
    # max_new_tokens, so a cap at or below max_len − cache_len would leave the punishment inert
    need(not o.soft_punish or r.max_new_tokens > o.max_len - o.cache_len, "rollout.max_new_tokens",
         r.max_new_tokens, f"must be > algo.overlong.max_len - algo.overlong.cache_len "
         f"({o.max_len} - {o.cache_len} = {o.max_len - o.cache_len}) with algo.overlong.soft_punish on, or no "
         f"response is ever punished; set algo.overlong.max_len = rollout.max_new_tokens (as the paper)")
    rc = a.rollout_correction
    need(rc.cap >= 1, "algo.rollout_correction.cap", rc.cap, "must be >= 1")
    need(0 <= rc.lo <= 1, "algo.rollout_correction.lo", rc.lo, "must be in [0, 1]")
    need(rc.hi >= 1, "algo.rollout_correction.hi", rc.hi, "must be >= 1")
    need(rc.mode == "none" or a.old_logprobs == "trainer", "algo.rollout_correction.mode", rc.mode,
         "needs algo.old_logprobs=trainer (with bypass pi_old is pi_rollout: rho = 1, nothing to correct)")
    need(a.top_entropy_quantile >= 1.0 or a.old_logprobs == "trainer", "algo.top_entropy_quantile",
         a.top_entropy_quantile, "< 1 needs algo.old_logprobs=trainer (it ranks tokens by pi_old's entropy, which "
         "the bypass does not compute)")
    ds = a.dynamic_sampling
    need(ds.max_gen_rounds >= 1, "algo.dynamic_sampling.max_gen_rounds", ds.max_gen_rounds, "must be >= 1")
    need(ds.oversample >= 1, "algo.dynamic_sampling.oversample", ds.oversample, "must be >= 1")
    need(ds.gen_batch_prompts is None or ds.gen_batch_prompts >= 1,
         "algo.dynamic_sampling.gen_batch_prompts", ds.gen_batch_prompts, "must be >= 1 or null")
    need(0 <= ds.min_acc < 1, "algo.dynamic_sampling.min_acc", ds.min_acc, "must be in [0, 1)")
    need(ds.min_acc < ds.max_acc <= 1, "algo.dynamic_sampling.max_acc", ds.max_acc,
         f"must be in (algo.dynamic_sampling.min_acc = {ds.min_acc}, 1]")
    need(ds.enabled or (ds.mode == "refill" and (ds.min_acc, ds.max_acc) == (0.0, 1.0)), "algo.dynamic_sampling.mode",
         ds.mode, "and the band (min_acc, max_acc) need algo.dynamic_sampling.enabled=true")
    need(r.n >= 2, "rollout.n", r.n, "G must be >= 2: the group advantage (R - mean(R)) / (std(R) + eps) of a "
         "group of one response is 0, so a single response per prompt gives no gradient")
    need(r.temperature >= 0, "rollout.temperature", r.temperature, "must be >= 0")
    need(0 < r.top_p <= 1, "rollout.top_p", r.top_p, "must be in (0, 1]")
    need(r.max_new_tokens >= 1, "rollout.max_new_tokens", r.max_new_tokens, "must be >= 1")
    need(r.retries >= 0, "rollout.retries", r.retries, "must be >= 0")
    need(0 <= t.seed < 2 ** 32, "train.seed", t.seed, "must be in [0, 2**32) (numpy and torch seeds)")
    need(t.rollout_steps >= 0, "train.rollout_steps", t.rollout_steps, "must be >= 0")
    need(t.batch_prompts >= 1, "train.batch_prompts", t.batch_prompts, "must be >= 1")
    need(t.mini_batch_prompts >= 1, "train.mini_batch_prompts", t.mini_batch_prompts, "must be >= 1")
    need(t.batch_prompts % t.mini_batch_prompts == 0, "train.batch_prompts", t.batch_prompts,
         f"must be divisible by train.mini_batch_prompts ({t.mini_batch_prompts})")
    need(t.micro_batch_seqs >= 1, "train.micro_batch_seqs", t.micro_batch_seqs, "must be >= 1")
    need(t.max_tokens_per_micro_batch is None or t.max_tokens_per_micro_batch >= 1, "train.max_tokens_per_micro_batch",
         t.max_tokens_per_micro_batch, "must be >= 1 or null")
    need(t.logits_chunk_tokens is None or t.logits_chunk_tokens >= 1, "train.logits_chunk_tokens",
         t.logits_chunk_tokens, "must be >= 1 or null")
    # before anything divides by it
    need(cfg.launch.num_processes >= 1, "launch.num_processes", cfg.launch.num_processes, "must be >= 1")
    need(cfg.launch.num_nodes >= 1, "launch.num_nodes", cfg.launch.num_nodes, "must be >= 1")
    per_rank = t.mini_batch_prompts * r.n
    need(per_rank % cfg.launch.num_processes == 0, "train.mini_batch_prompts", t.mini_batch_prompts,
         f"× rollout.n ({r.n}) must be divisible by launch.num_processes ({cfg.launch.num_processes})")
    need((per_rank // cfg.launch.num_processes) % t.micro_batch_seqs == 0, "train.micro_batch_seqs",
         t.micro_batch_seqs, f"must divide the sequences per mini-batch per process "
         f"({per_rank // cfg.launch.num_processes})")
    need(t.ppo_epochs >= 1, "train.ppo_epochs", t.ppo_epochs, "must be >= 1")
    need(t.staleness >= 0, "train.staleness", t.staleness, "must be >= 0")
    need(t.lr > 0, "train.lr", t.lr, "must be > 0")
    need(t.warmup_grad_steps >= 0, "train.warmup_grad_steps", t.warmup_grad_steps, "must be >= 0")
    need(t.weight_decay >= 0, "train.weight_decay", t.weight_decay, "must be >= 0")
    need(t.grad_clip > 0, "train.grad_clip", t.grad_clip, "must be > 0")
    need(all(0 <= b < 1 for b in t.betas), "train.betas", t.betas, "each must be in [0, 1)")
    need(t.threads is None or t.threads >= 1, "train.threads", t.threads, "must be >= 1 or null")
    need(e.every >= 0, "eval.every", e.every, "must be >= 0")
    need(e.k >= 1, "eval.k", e.k, "must be >= 1")
    need(0 < e.top_p <= 1, "eval.top_p", e.top_p, "must be in (0, 1]")
    need(e.temperature >= 0, "eval.temperature", e.temperature, "must be >= 0")
    need(e.max_new_tokens is None or e.max_new_tokens >= 1, "eval.max_new_tokens", e.max_new_tokens, "must be >= 1")
    for i, d in enumerate(e.datasets):
        need(d.limit is None or d.limit >= 1, f"eval.datasets[{i}].limit", d.limit, "must be >= 1 or null")
    need(cfg.data.train_skip >= 0, "data.train_skip", cfg.data.train_skip, "must be >= 0")
    lim = cfg.data.train_limit
    need(lim is None or lim >= 1, "data.train_limit", lim, "must be >= 1 or null (null = every training problem)")
    need(lim is None or lim >= cfg.gen_batch_prompts, "data.train_limit", lim,
         f"fewer training problems than one generation round takes ({cfg.gen_batch_prompts}: "
         + ("algo.dynamic_sampling's gen_batch_prompts / oversample x train.batch_prompts)"
            if cfg.algo.dynamic_sampling.enabled and cfg.algo.dynamic_sampling.mode == "refill"
            else "train.batch_prompts)")
         + "; raise it, or set it to null")
    need(r.vllm_kv_cache_gib > 0, "rollout.vllm_kv_cache_gib", r.vllm_kv_cache_gib,
         "must be > 0 (GiB of KV cache for the CPU vLLM engine; the engine cannot start without one)")
    uri = cfg.logging.tracking_uri
    need(uri is None or tracking_scheme(uri) in TRACKING_SCHEMES, "logging.tracking_uri", uri,
         f"unsupported scheme {tracking_scheme(uri or '')!r}: use sqlite:///<file>, http(s)://<server>, "
         f"postgresql://, mysql://, mssql://, file:// or a directory path (null = <output_dir>/mlruns.db)")
    need(cfg.data.max_prompt_tokens >= 1, "data.max_prompt_tokens", cfg.data.max_prompt_tokens, "must be >= 1")
    need(cfg.checkpoint.every >= 0, "checkpoint.every", cfg.checkpoint.every, "must be >= 0")
    need(cfg.checkpoint.keep_last >= 1, "checkpoint.keep_last", cfg.checkpoint.keep_last, "must be >= 1")
    need(r.max_num_seqs is None or r.max_num_seqs >= 1, "rollout.max_num_seqs", r.max_num_seqs, "must be >= 1 or null")
    need(0 < r.gpu_memory_utilization <= 1, "rollout.gpu_memory_utilization", r.gpu_memory_utilization,
         "must be in (0, 1]")
    need(r.tensor_parallel_size >= 1, "rollout.tensor_parallel_size", r.tensor_parallel_size, "must be >= 1")
    need(cfg.launch.num_processes % r.tensor_parallel_size == 0, "rollout.tensor_parallel_size",
         r.tensor_parallel_size, f"must divide launch.num_processes ({cfg.launch.num_processes}): "
         f"an engine's GPUs are inside one node")
    need(cfg.launch.pg_timeout_s >= 1, "launch.pg_timeout_s", cfg.launch.pg_timeout_s, "must be >= 1")
    need(cfg.launch.rollout_timeout_s is None or cfg.launch.rollout_timeout_s >= 1, "launch.rollout_timeout_s",
         cfg.launch.rollout_timeout_s, "must be >= 1 or null")


# Names that become a path (the run dir <output_dir>/runs/<name>-<hash>, MLflow's artifact folder
# mlartifacts/<experiment>, <output>/sweeps/<sweep>/) or a job-script word: no path separator, no
# "..", nothing a shell or a terminal reads specially. A run dir's name is <name>-<12 hex>, well under
# the 255 bytes of a file name.
NAME_RE = re.compile(r"^[A-Za-z0-9._-]+$")
MAX_NAME_CHARS = 128
# Keys whose value is such a name ("" allowed where the default is ""); every other string value may
# be anything printable (paths, URIs), see _check_text.
NAME_KEYS = {"name": False, "logging.experiment": False, "logging.sweep": True, "logging.arm": True}
# C0/C1 control characters (newline, NUL, ESC of ANSI sequences, CSI), DEL, and the Unicode
# direction controls that reorder what a terminal shows (bidi overrides, isolates, marks), BOM.
UNSHOWABLE_RE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ufeff]")


def name_problem(value: Any) -> str | None:
    """Why ``value`` is not a name (``NAME_RE``, not ``.``/``..``, at most ``MAX_NAME_CHARS``), else None."""
    if not isinstance(value, str) or not NAME_RE.fullmatch(value) or value in (".", ".."):
        return f"expected a name matching {NAME_RE.pattern}"
    if len(value) > MAX_NAME_CHARS:
        return f"expected a name matching {NAME_RE.pattern} of at most {MAX_NAME_CHARS} characters, got {len(value)}"
    return None


def _strings(value: Any, key: str):
    """(dotted key, string) of every string in a config value (``eval.datasets[0].name``)."""
    if isinstance(value, str):
        yield key, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, f"{key}.{k}" if key else str(k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _strings(v, f"{key}[{i}]")


def _check_text(cfg: Config, where: str) -> None:
    """Every string value: no password in a URI (refused before anything is written or printed), no
    control or direction-override character (they reach paths, job scripts and terminals); the
    :data:`NAME_KEYS` are names. Pure: raises ConfigError naming the key, never showing a password."""
    for key, text in _strings(to_dict(cfg), ""):
        if uri_password(text):
            raise ConfigError(password_refusal(f"{where}: {key}", text))
        bad = UNSHOWABLE_RE.search(text)
        if bad:
            raise ConfigError(f"{where}: {key} = {show(text)}: U+{ord(bad.group()):04X} at position {bad.start()}: "
                              f"control characters, ANSI escapes and text-direction overrides are refused (they "
                              f"reach paths, job scripts and terminals)")
        if key in NAME_KEYS and not (NAME_KEYS[key] and text == ""):
            problem = name_problem(text)
            if problem:
                raise ConfigError(f"{where}: {key} = {show(text)}: {problem} (it becomes a directory name: "
                                  f"no '/', no '..', no spaces)")


def build_config(data: dict, where: str = "<config>") -> Config:
    """Build and validate a :class:`Config` from a nested dict (no file I/O)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: the top level must be a mapping, got {type(data).__name__}")
    cfg = _build(Config, data, "", where)
    _check_text(cfg, where)
    _check_ranges(cfg, where)
    return cfg
