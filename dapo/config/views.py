"""Views of a built config: as a dict, flattened to dotted keys, its run id (``config_hash``, with the keys
left out of it and those hashed only when set), the keys that differ between two, the inert keys of an arm,
and every key's doc (``dapo config --keys``)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import typing
from typing import Any, Literal

from dapo.config.sections import (AdvantageConfig, CISPOConfig, ClipCovConfig, Config, GSPOConfig, KLCovConfig,
                                  RolloutCorrectionConfig)


def to_dict(cfg: Any) -> dict:
    """Config → plain nested dict (tuples as lists), YAML/JSON friendly."""
    def conv(v: Any) -> Any:
        if dataclasses.is_dataclass(v):
            return {f.name: conv(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, (list, tuple)):
            return [conv(x) for x in v]
        return v
    return conv(cfg)


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """Nested dict → ``{"algo.clip.eps_high": 0.28, ...}`` (lists kept as values)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict):
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out


def inert_keys(cfg: Config) -> dict[str, str]:
    """Keys (dotted) whose value cannot change this config's training, given its other settings, each
    with the reason: a sweep that varies one of them makes arms that train identically.

    algo.clip.* goes to the losses that clip the PPO ratio (ppo_clip, clip_cov); each policy loss's own
    group (algo.gspo/cispo/clip_cov/kl_cov) only to that loss; algo.kl.estimator only with algo.kl.coef > 0;
    the soft punishment's cache_len/factor only with soft_punish; dynamic sampling's round keys only when
    it refills; the rollout correction's level/cap/lo/hi only with the modes that read them.
    """
    a = cfg.algo
    out: dict[str, str] = {}
    if a.policy_loss not in ("ppo_clip", "clip_cov"):
        for k in ("eps_low", "eps_high", "dual_clip_c"):
            out[f"algo.clip.{k}"] = f"algo.policy_loss = {a.policy_loss} does not clip the PPO ratio with algo.clip"
    for loss, cls in (("gspo", GSPOConfig), ("cispo", CISPOConfig), ("clip_cov", ClipCovConfig),
                      ("kl_cov", KLCovConfig)):
        if a.policy_loss != loss:
            for f in dataclasses.fields(cls):
                out[f"algo.{loss}.{f.name}"] = f"only algo.policy_loss = {loss} reads it (here {a.policy_loss})"
    if a.kl.coef == 0:
        out["algo.kl.estimator"] = "algo.kl.coef = 0: no KL penalty"
    if not a.overlong.soft_punish:
        for k in ("cache_len", "factor"):
            out[f"algo.overlong.{k}"] = "algo.overlong.soft_punish is false"
    ds = a.dynamic_sampling
    if not (ds.enabled and ds.mode == "refill"):
        why = "dynamic sampling is off" if not ds.enabled else f"algo.dynamic_sampling.mode = {ds.mode} (one round)"
        for k in ("gen_batch_prompts", "oversample", "max_gen_rounds", "on_exhausted"):
            out[f"algo.dynamic_sampling.{k}"] = why
    rc = a.rollout_correction
    uses = {"level": ("tis", "mis"), "cap": ("tis",), "lo": ("mis", "icepop", "geo_rs"), "hi": ("mis", "icepop", "geo_rs")}
    for k, modes in uses.items():
        if rc.mode not in modes:
            out[f"algo.rollout_correction.{k}"] = f"algo.rollout_correction.mode = {rc.mode} does not read it"
    return out


# Resource knobs: how a run uses its machines, never what it computes (a resumed run may change them).
# tensor_parallel_size and logits_chunk_tokens only reorder floating-point sums, like the engine's batch.
UNHASHED_KEYS = ("train.threads", "rollout.tensor_parallel_size", "rollout.sleep_mode", "rollout.enforce_eager",
                 "rollout.max_num_seqs",
                 "checkpoint.final_model_dtype", "checkpoint.on_preempt", "checkpoint.async_save",
                 "train.logits_chunk_tokens", "launch.pg_timeout_s", "launch.rollout_timeout_s")
# Keys added after runs existed that do change the numbers: hashed only when they differ from the value
# below (the behaviour before they existed), so every older run id stays valid.
HASHED_WHEN_NOT = {"data.train_skip": 0, "train.max_tokens_per_micro_batch": None, "train.staleness": 0,
                   "train.packed": False}   # packed: a token budget groups other sequences (Clip-Cov draws per micro-batch)


def _defaults(cls: type, prefix: str) -> dict[str, Any]:
    """``{"prefix.field": default}`` of every leaf of a config section (nested sections included)."""
    out: dict[str, Any] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            out.update(_defaults(hints[f.name], f"{prefix}.{f.name}"))
        else:
            out[f"{prefix}.{f.name}"] = to_dict(f.default) if isinstance(f.default, tuple) else f.default
    return out


# The behaviour policy and DAPO's successors: every key at its default is the March-2025 recipe, left out of the hash;
# a section all of whose keys are left out is left out too (config_hash drops emptied sections).
HASHED_WHEN_NOT.update(_defaults(AdvantageConfig, "algo.advantage"))
HASHED_WHEN_NOT.update({"algo.dynamic_sampling.mode": "refill", "algo.dynamic_sampling.min_acc": 0.0,
                        "algo.dynamic_sampling.max_acc": 1.0, "data.drop_solved": False})
HASHED_WHEN_NOT.update({"algo.policy_loss": "ppo_clip", "algo.top_entropy_quantile": 1.0, "algo.old_logprobs": "trainer"})
HASHED_WHEN_NOT.update(_defaults(RolloutCorrectionConfig, "algo.rollout_correction"))
for _cls, _key in ((GSPOConfig, "gspo"), (CISPOConfig, "cispo"), (ClipCovConfig, "clip_cov"), (KLCovConfig, "kl_cov")):
    HASHED_WHEN_NOT.update(_defaults(_cls, f"algo.{_key}"))


_NAMING = ("logging", "output_dir", "name")   # config_hash's default exclude: where a run is named and logged


def config_hash(cfg: Config, *, exclude: tuple[str, ...] = _NAMING) -> str:
    """A stable 12-hex-digit hash of everything that changes the run's numbers.

    ``exclude`` (top-level sections), :data:`UNHASHED_KEYS` and :data:`HASHED_WHEN_NOT` at their
    old value are left out; ``tests/test_config.py`` pins the hash of every shipped experiment.
    """
    d = to_dict(cfg)
    for k in exclude:
        d.pop(k, None)
    for key in UNHASHED_KEYS + tuple(k for k, v in HASHED_WHEN_NOT.items() if _get(d, k, v) == v):
        section, _, leaf = key.rpartition(".")
        _get(d, section, {}).pop(leaf, None)
        while section and _get(d, section) == {}:   # a section emptied by the pops: as if it did not exist
            parent, _, name = section.rpartition(".")
            (_get(d, parent, {}) if parent else d).pop(name, None)
            section = parent
    blob = json.dumps(d, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def config_diff(old: Config, new: Config) -> dict[str, dict[str, tuple[Any, Any]]]:
    """The keys whose values differ between two configs, ``key → (old, new)``, by what they change:

    ``"run"``: the run's numbers (the keys :func:`config_hash` reads, so the run id differs);
    ``"resources"``: :data:`UNHASHED_KEYS`, how the run uses its machines;
    ``"naming"``: ``name``, ``output_dir`` and ``logging.*``, where it is named, tagged and logged.
    """
    a, b = flatten(to_dict(old)), flatten(to_dict(new))
    out: dict[str, dict[str, tuple[Any, Any]]] = {"run": {}, "resources": {}, "naming": {}}
    for key in sorted(set(a) | set(b)):
        if a.get(key) == b.get(key):
            continue
        group = ("resources" if key in UNHASHED_KEYS else
                 "naming" if key.split(".", 1)[0] in _NAMING else "run")
        out[group][key] = (a.get(key), b.get(key))
    return out


def _get(d: dict, dotted: str, default: Any = None) -> Any:
    """``_get({"a": {"b": 1}}, "a.b")`` → 1; ``default`` when a part is missing."""
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return default
        d = d[part]
    return d


def _literal_choices(tp: Any) -> tuple:
    """The allowed values of a ``Literal[...]`` (or ``Optional[Literal[...]]``) annotation, else ()."""
    if typing.get_origin(tp) is Literal:
        return typing.get_args(tp)
    if typing.get_origin(tp) is typing.Union:
        return tuple(v for a in typing.get_args(tp) for v in _literal_choices(a))
    return ()


def field_docs(cls: type = Config, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default, doc) for every field; used by ``dapo config --keys``."""
    rows = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}.{f.name}" if prefix else f.name
        if dataclasses.is_dataclass(hints[f.name]):
            rows.extend(field_docs(hints[f.name], key))
        else:
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else "")
            text = f.metadata.get("doc", "")
            choices = _literal_choices(hints[f.name])
            if choices:
                text += f" [one of: {', '.join(map(str, choices))}]"
            rows.append((key, json.dumps(to_dict(default) if dataclasses.is_dataclass(default) else
                                         to_dict(default) if isinstance(default, tuple) else default,
                                         default=str), text))
    return rows
