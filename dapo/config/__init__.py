"""Typed, frozen experiment configuration.

An experiment is one YAML file (optionally ``inherit:``-ing another) plus dotted
overrides (``algo.clip.eps_high=0.28``). Loading builds the frozen dataclasses below,
checks every type and range, and raises one :class:`ConfigError` that names the file,
the key, the bad value and what is allowed. Loading has no side effects: nothing is
created, downloaded or imported beyond the standard library and PyYAML.

Every DAPO technique is one toggle group under ``algo``:

- ``algo.clip``              Clip-Higher (eps_low 0.2 / eps_high 0.28; GRPO: 0.2 / 0.2)
- ``algo.loss_agg``          token-level loss (``token_mean``) vs GRPO's ``seq_mean_token_mean``
- ``algo.overlong``          overlong filtering (``filter``) and soft overlong punishment
- ``algo.dynamic_sampling``  drop all-correct / all-wrong groups and refill the batch
- ``algo.kl``                KL penalty (off in DAPO)

and DAPO's successors are toggles beside them (README, "The algorithm, as toggles"):

- ``algo.advantage``         the std of Â (group / batch / none: Dr. GRPO) and the baseline (mean / RLOO)
- ``algo.policy_loss``       ppo_clip / gspo / cispo / clip_cov / kl_cov, each with its own group of keys
- ``algo.top_entropy_quantile``  only the highest-entropy tokens in the loss (1.0 = off)
- ``algo.dynamic_sampling.mode`` / ``min_acc`` / ``max_acc``  refill, filter or mask; the accuracy band
- ``data.drop_solved``       a prompt every response solved is not drawn again from the next epoch on

The package: ``sections`` (the dataclasses), ``checks`` (built from a mapping and checked), ``load`` (a
YAML file and overrides), ``views`` (dict, flat keys, the run id, diffs, key docs); every name is
imported from here (``from dapo.config import Config``). ``import dapo.config`` must not import torch
(tests check it).
"""

from __future__ import annotations

from dapo.config.checks import (build_config, _coerce, MAX_NAME_CHARS, NAME_KEYS, name_problem, NAME_RE,
                                RENAMED_VALUES, TRACKING_SCHEMES, UNSHOWABLE_RE)  # noqa: F401
from dapo.config.load import (apply_overrides, load_config, parse_overrides, parse_value, read_yaml)  # noqa: F401
from dapo.config.sections import (AdvantageConfig, AlgoConfig, CheckpointConfig, CISPOConfig, ClipConfig,
                                  ClipCovConfig, Config, DataConfig, default_chunk_rows, doc, DynamicSamplingConfig,
                                  EvalConfig, EvalSetConfig, GSPOConfig, KLConfig, KLCovConfig, LaunchConfig,
                                  LoggingConfig, ModelConfig, OverlongConfig, RolloutConfig, RolloutCorrectionConfig,
                                  TrainConfig)  # noqa: F401
from dapo.config.views import (config_diff, config_hash, field_docs, flatten, HASHED_WHEN_NOT, inert_keys, to_dict,
                               UNHASHED_KEYS)  # noqa: F401
from dapo.yaml_io import (MAX_ALIAS_NODES, ConfigError, RefusedYaml, password_refusal, safe_yaml_file, safe_yaml_text,
                          show, uri_password)

__all__ = [
    "ConfigError", "Config", "load_config", "build_config", "parse_overrides",
    "apply_overrides", "to_dict", "flatten", "config_hash", "config_diff", "field_docs", "show", "safe_yaml_text",
    "safe_yaml_file", "MAX_ALIAS_NODES", "NAME_RE", "MAX_NAME_CHARS", "name_problem",
]

