"""DAPO's successors as toggles (issue 24): each formula hand-derived, against a slow reference
written from its paper's equations, and at its defaults invisible to every shipped run id."""

import hashlib
import math
import statistics
from pathlib import Path

import pytest
import torch

from dapo import algo
from dapo.config import ConfigError, config_hash, flatten, load_config, to_dict

REPO = Path(__file__).resolve().parents[1]
SEEDS = [0, 1, 2]

# ----------------------------------------------------------------------------------------
# The new keys at their defaults change no run id
# ----------------------------------------------------------------------------------------

# Pinned before the successors' keys existed: config_hash of every experiment file, and sha256 of the
# comma-joined run ids of `expand` of every sweep spec (first 12 hex digits).
EXPERIMENT_HASHES = {
    "mini-dapo": "8f2461b542bb", "paper-dapo-32b": "cae0d4a64b3b", "paper-grpo-32b": "30a1ec065909",
    "qwen2.5-math-7b-dapo": "ab865e1c33ad", "smollm2-135m-arith": "b9e756991aa4",
    "smollm2-135m-gsm8k": "d89a6f5c0ca3", "tiny-dapo": "a374d841c0e9", "tiny-grpo": "22cd8b30822f",
    "tiny-random-smoke": "ca75636b37a6",
}
SWEEP_RUN_IDS = {
    "clip-higher-eps-mini": "cd20f74d4b1f", "clip-higher-eps": "d7019501131d",
    "clip-higher-stress-mini": "0e2caa91fe82", "demo": "6ebc4c17eb2a", "grpo-vs-dapo-mini": "9d07188d964c",
    "grpo-vs-dapo": "06b2adb516dc", "leave-one-out-mini": "1b0574efeb70", "leave-one-out": "f9255d13595d",
    "smoke-slurm": "e3e0f9530f95", "smollm2-mini": "478ffedda72e", "soft-punish-x-ds-mini": "d531096cd63d",
    "table1-mini-fresh": "9ad8af5d6fe6", "table1-mini-v1": "7af609a6adbe", "table1-mini": "d7b696119bd8",
    "table1": "085ed18ce14b",
}
# every key the successors added, at its default (spelled out, so a changed default fails here)
NEW_DEFAULTS = {
    "algo.advantage.std": "group", "algo.advantage.baseline": "mean",
}


@pytest.mark.parametrize("name", sorted(EXPERIMENT_HASHES))
def test_experiment_hashes_are_unchanged_and_the_defaults_are_not_hashed(name):
    path = REPO / "experiments" / f"{name}.yaml"
    assert config_hash(load_config(path)) == EXPERIMENT_HASHES[name]
    assert config_hash(load_config(path, [f"{k}={v}" for k, v in NEW_DEFAULTS.items()])) == EXPERIMENT_HASHES[name]


def test_every_new_key_is_listed_with_its_default():
    new = {k: v for k, v in flatten(to_dict(load_config())).items() if k in NEW_DEFAULTS}
    assert new == NEW_DEFAULTS


@pytest.mark.parametrize("name", sorted(SWEEP_RUN_IDS))
def test_sweep_run_ids_are_unchanged(name, tmp_path):
    from dapo.sweep_spec import expand
    ids = ",".join(j.run_id for j in expand(REPO / "sweeps" / f"{name}.yaml", tmp_path))
    assert hashlib.sha256(ids.encode()).hexdigest()[:12] == SWEEP_RUN_IDS[name]


def test_a_new_key_off_its_default_is_hashed():
    base = config_hash(load_config())
    seen = {base}
    for ov in ["algo.advantage.std=none", "algo.advantage.std=batch", "algo.advantage.baseline=leave_one_out"]:
        h = config_hash(load_config(None, [ov]))
        assert h not in seen, ov
        seen.add(h)


def test_dr_grpo_experiment_is_grpo_without_std_and_with_the_constant_normalizer():
    cfg = load_config(REPO / "experiments" / "mini-dr-grpo.yaml")
    assert (cfg.algo.advantage.std, cfg.algo.advantage.baseline, cfg.algo.loss_agg) == \
        ("none", "mean", "seq_mean_token_sum_const")
    assert (cfg.algo.clip.eps_high, cfg.algo.dynamic_sampling.enabled, cfg.algo.overlong.soft_punish) == (0.2, False, False)


def test_bad_choices_name_the_valid_ones():
    with pytest.raises(ConfigError, match="algo.advantage.std = 'rms'.*'group', 'batch', 'none'"):
        load_config(None, ["algo.advantage.std=rms"])


# ----------------------------------------------------------------------------------------
# Advantages: batch std, no std (Dr. GRPO), leave-one-out (RLOO)
# ----------------------------------------------------------------------------------------

def test_advantages_hand():
    # R = [1, -1, -1, -1]: mean -0.5, deviations [1.5, -0.5, -0.5, -0.5], group std 1 (unbiased).
    r = torch.tensor([[1.0, -1.0, -1.0, -1.0]], dtype=torch.float64)
    dev = torch.tensor([[1.5, -0.5, -0.5, -0.5]], dtype=torch.float64)
    torch.testing.assert_close(algo.group_advantages(r, std="none"), dev, rtol=0, atol=0)
    # RLOO: R_1 − mean(-1, -1, -1) = 2; R_2 − mean(1, -1, -1) = -1 - (-1/3) = -2/3 = 4/3 · (-0.5)
    torch.testing.assert_close(algo.group_advantages(r, std="none", baseline="leave_one_out"),
                               torch.tensor([[2.0, -2 / 3, -2 / 3, -2 / 3]], dtype=torch.float64))
    torch.testing.assert_close(algo.group_advantages(r, baseline="leave_one_out"),
                               torch.tensor([[2.0, -2 / 3, -2 / 3, -2 / 3]], dtype=torch.float64) / (1 + 1e-6))
    # batch std: two groups [1, -1] and [1, 1]: group means 0 and 1; batch std of (1, -1, 1, 1) =
    # sqrt((3·0.5² + 1.5²)/3) = 1; the constant group stays exactly 0.
    r2 = torch.tensor([[1.0, -1.0], [1.0, 1.0]], dtype=torch.float64)
    torch.testing.assert_close(algo.group_advantages(r2, std="batch", eps=0.0),
                               torch.tensor([[1.0, -1.0], [0.0, 0.0]], dtype=torch.float64))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("std", algo.ADV_STDS)
@pytest.mark.parametrize("baseline", sorted(algo.ADV_BASELINES))
def test_advantages_reference(seed, std, baseline):
    """From the definitions, with python loops: b_i the group mean or the mean of the others."""
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randn(4, 5, generator=gen, dtype=torch.float64)
    adv = algo.group_advantages(rewards, eps=1e-6, std=std, baseline=baseline)
    flat = [x for g in rewards.tolist() for x in g]
    for b, group in enumerate(rewards.tolist()):
        sd = {"group": statistics.stdev(group), "batch": statistics.stdev(flat), "none": None}[std]
        for i, r in enumerate(group):
            others = group[:i] + group[i + 1:]
            base = statistics.fmean(group) if baseline == "mean" else statistics.fmean(others)
            want = (r - base) / (sd + 1e-6) if sd is not None else r - base
            assert adv[b, i].item() == pytest.approx(want, rel=1e-10, abs=1e-12)


def test_advantages_defaults_are_grpo_bit_for_bit_and_constant_groups_stay_zero():
    r = torch.randn(6, 8, generator=torch.Generator().manual_seed(3))
    r[2] = 0.1
    assert torch.equal(algo.group_advantages(r), algo.group_advantages(r, std="group", baseline="mean"))
    for std in algo.ADV_STDS:
        for baseline in algo.ADV_BASELINES:
            assert torch.equal(algo.group_advantages(r, std=std, baseline=baseline)[2], torch.zeros(8))
    with pytest.raises(ValueError, match=r"valid: \['batch', 'group', 'none'\]"):
        algo.group_advantages(r, std="rms")
    with pytest.raises(ValueError, match=r"valid: \['leave_one_out', 'mean'\]"):
        algo.group_advantages(r, baseline="median")
