"""Config: typed, frozen, validated with errors that name file, key, value and what is allowed."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from dapo.config import (Config, ConfigError, apply_overrides, build_config, config_hash, field_docs,
                         flatten, load_config, parse_overrides, to_dict)

REPO = Path(__file__).resolve().parents[1]


def test_import_config_does_not_import_torch():
    code = "import dapo.config, sys; assert 'torch' not in sys.modules and 'vllm' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_defaults_are_the_dapo_recipe_and_frozen():
    cfg = load_config()
    assert (cfg.algo.clip.eps_low, cfg.algo.clip.eps_high) == (0.2, 0.28)
    assert cfg.algo.loss_agg == "token_mean" and cfg.algo.kl.coef == 0.0
    assert cfg.algo.dynamic_sampling.enabled and cfg.algo.overlong.soft_punish
    assert cfg.grad_steps_per_rollout == 512 // 32
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.algo.clip.eps_high = 0.3  # type: ignore[misc]


def test_dotted_overrides_with_yaml_values():
    cfg = load_config(None, ["algo.clip.eps_high=0.3", "algo.dynamic_sampling.enabled=false",
                             "eval.datasets=[aime24, {name: math500, limit: 10}]", "train.betas=[0.9, 0.95]"])
    assert cfg.algo.clip.eps_high == 0.3 and cfg.algo.dynamic_sampling.enabled is False
    assert [d.name for d in cfg.eval.datasets] == ["aime24", "math500"] and cfg.eval.datasets[1].limit == 10
    assert cfg.train.betas == (0.9, 0.95)
    assert parse_overrides(["a.b=1", "c=x", "d=[1, 2]"]) == {"a.b": 1, "c": "x", "d": [1, 2]}


@pytest.mark.parametrize("override, needle", [
    ("algo.clip.eps_hgh=0.3", "unknown key 'algo.clip.eps_hgh'; keys under 'algo.clip': algo.clip.dual_clip_c"),
    ("rollout.n=many", "rollout.n = 'many': expected int"),
    ("algo.loss_agg=mean", "algo.loss_agg = 'mean': expected one of 'token_mean'"),
    ("algo.clip.eps_high=0.1", "algo.clip.eps_high = 0.1: must be >= algo.clip.eps_low (0.2)"),
    ("algo.overlong.cache_len=30000", "algo.overlong.cache_len = 30000: must be in (0, algo.overlong.max_len = 20480]"),
    ("train.batch_prompts=100", "train.batch_prompts = 100: must be divisible by train.mini_batch_prompts (32)"),
    ("train.lr=-1", "train.lr = -1.0: must be > 0"),
    ("algo.dynamic_sampling.enabled=maybe", "expected bool"),
    ("eval.top_p=0", "eval.top_p = 0.0: must be in (0, 1]"),
    ("train.micro_batch_seqs=7", "train.micro_batch_seqs = 7: must divide the sequences per mini-batch"),
    ("algo.clip.dual_clip_c=0.5", "algo.clip.dual_clip_c = 0.5: must be > 1 or null"),
])
def test_bad_values_raise_one_clear_error(override, needle):
    with pytest.raises(ConfigError) as exc:
        load_config(None, [override])
    assert needle in str(exc.value)


@pytest.mark.parametrize("cap, max_len, cache_len, soft, ok", [
    # penalty ≠ 0 only for lengths in (max_len − cache_len, ...]; generation stops at the cap
    (16, 20480, 4096, "true", False),      # the cap far below: never punished
    (16384, 20480, 4096, "true", False),   # = max_len − cache_len: the longest response gets 0
    (16385, 20480, 4096, "true", True),    # one token more: -1/4096
    (20480, 20480, 4096, "true", True),    # the paper: max_len = the cap
    (40, 32, 8, "true", True),             # a cap beyond max_len: -factor from 33 on
    (16, 20480, 4096, "false", True),      # no punishment: the lengths do not matter
])
def test_soft_punishment_must_be_reachable_by_the_generation_cap(cap, max_len, cache_len, soft, ok):
    ov = [f"rollout.max_new_tokens={cap}", f"algo.overlong.max_len={max_len}",
          f"algo.overlong.cache_len={cache_len}", f"algo.overlong.soft_punish={soft}"]
    if ok:
        assert load_config(None, ov).rollout.max_new_tokens == cap
        return
    with pytest.raises(ConfigError) as exc:
        load_config(None, ov)
    msg = str(exc.value)
    assert f"rollout.max_new_tokens = {cap}: must be > algo.overlong.max_len - algo.overlong.cache_len " \
           f"({max_len} - {cache_len} = {max_len - cache_len}) with algo.overlong.soft_punish on" in msg
    assert "\n" not in msg


def test_the_renamed_loss_agg_value_names_its_new_name():
    with pytest.raises(ConfigError) as exc:
        load_config(None, ["algo.loss_agg=seq_mean_token_sum_norm"])
    assert "algo.loss_agg = 'seq_mean_token_sum_norm': expected one of" in str(exc.value)
    assert "renamed seq_mean_token_sum_const" in str(exc.value)
    assert load_config(None, ["algo.loss_agg=seq_mean_token_sum_const"]).algo.loss_agg == "seq_mean_token_sum_const"


def test_bad_files_name_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("algo:\n  clip: {eps_high: [1}\n")
    with pytest.raises(ConfigError, match="bad.yaml: not valid YAML"):
        load_config(bad)
    bad.write_text("algo:\n  clip:\n    eps_higher: 0.3\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: unknown key 'algo.clip.eps_higher'"):
        load_config(bad)
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="bad.yaml: the top level must be a mapping"):
        load_config(bad)
    with pytest.raises(ConfigError, match="missing.yaml: no such experiment file"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        load_config(None, ["algo.clip.eps_high"])


def test_inherit_merges_and_detects_cycles(tmp_path):
    (tmp_path / "a.yaml").write_text("name: a\nalgo: {clip: {eps_high: 0.3}}\ntrain: {lr: 0.001}\n")
    (tmp_path / "b.yaml").write_text("inherit: a.yaml\nname: b\nalgo: {clip: {eps_low: 0.1}}\n")
    cfg = load_config(tmp_path / "b.yaml")
    assert (cfg.name, cfg.algo.clip.eps_low, cfg.algo.clip.eps_high, cfg.train.lr) == ("b", 0.1, 0.3, 0.001)
    (tmp_path / "c.yaml").write_text("inherit: d.yaml\n")
    (tmp_path / "d.yaml").write_text("inherit: c.yaml\n")
    with pytest.raises(ConfigError, match="inherit cycle"):
        load_config(tmp_path / "c.yaml")


def test_validation_has_no_side_effects(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    load_config(REPO / "experiments" / "paper-dapo-32b.yaml", ["output_dir=somewhere"])
    assert list(tmp_path.iterdir()) == []


def test_round_trip_and_hash():
    cfg = load_config(None, ["algo.clip.eps_high=0.3"])
    again = build_config(to_dict(cfg))
    assert again == cfg and config_hash(again) == config_hash(cfg)
    assert config_hash(load_config(None, ["logging.arm=x"])) == config_hash(load_config())  # tags only
    assert config_hash(load_config(None, ["train.seed=1"])) != config_hash(load_config())
    flat = flatten(to_dict(cfg))
    assert flat["algo.clip.eps_high"] == 0.3
    assert apply_overrides({}, {"train.seed": 3}) == {"train": {"seed": 3}}


def test_every_field_has_a_doc():
    rows = field_docs()
    assert len(rows) > 60
    assert all(doc for _, _, doc in rows), [k for k, _, d in rows if not d]


@pytest.mark.parametrize("path", sorted((REPO / "experiments").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_experiment_loads(path):
    cfg = load_config(path)
    assert isinstance(cfg, Config)


def test_paper_experiment_has_the_paper_hyperparameters():
    cfg = load_config(REPO / "experiments" / "paper-dapo-32b.yaml")
    assert cfg.train.lr == 1e-6 and cfg.train.weight_decay == 0.1 and cfg.train.grad_clip == 1.0
    assert cfg.rollout.n == 16 and cfg.rollout.max_new_tokens == 20480 and cfg.train.batch_prompts == 512
    assert cfg.grad_steps_per_rollout == 16
    assert (cfg.algo.overlong.max_len, cfg.algo.overlong.cache_len) == (20480, 4096)
    assert (cfg.eval.k, cfg.eval.temperature, cfg.eval.top_p) == (32, 1.0, 0.7)
    grpo = load_config(REPO / "experiments" / "paper-grpo-32b.yaml")
    assert grpo.algo.clip.eps_high == 0.2 and grpo.algo.loss_agg == "seq_mean_token_mean"
    assert not grpo.algo.dynamic_sampling.enabled and not grpo.algo.overlong.soft_punish


def test_cli_help_and_config_errors():
    out = subprocess.run([sys.executable, "-m", "dapo.cli", "--help"], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0 and "train" in out.stdout and "sweep" in out.stdout and "figures" in out.stdout
    out = subprocess.run([sys.executable, "-m", "dapo.cli", "config", "experiments/tiny-dapo.yaml",
                          "algo.clip.eps_high=0.1"], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 2 and "algo.clip.eps_high = 0.1" in out.stderr


# Hashes of every shipped experiment and sweep, computed at f852402 (before the issue-12 keys existed).
# A run id is this hash: changing one orphans every run directory and MLflow run made with it.
SHIPPED_HASHES = {
    "smollm2-135m-gsm8k": "d89a6f5c0ca3", "tiny-dapo": "a374d841c0e9", "tiny-grpo": "22cd8b30822f",
    "tiny-random-smoke": "ca75636b37a6", "mini-dapo": "8f2461b542bb",
}
# The paper-scale experiments got realistic resource values with issue 12; with those put back the
# hash must be the old one (the new keys at their defaults add nothing to it).
PAPER_HASHES = {"paper-dapo-32b": "cb8a4829fd46", "paper-grpo-32b": "405a44b149f3",
                "qwen2.5-math-7b-dapo": "32d9e87e7184"}
PAPER_OLD_VALUES = ["rollout.gpu_memory_utilization=0.6", "train.max_tokens_per_micro_batch=null",
                    "rollout.tensor_parallel_size=1", "rollout.sleep_mode=true", "train.logits_chunk_tokens=null",
                    "launch.pg_timeout_s=600"]
SWEEP_IDS = {  # sha256 of the comma-joined run ids of `expand`, first 12 hex digits
    "clip-higher-eps-mini": "cd20f74d4b1f", "demo": "6ebc4c17eb2a", "grpo-vs-dapo-mini": "9d07188d964c",
    "leave-one-out-mini": "1b0574efeb70", "smoke-slurm": "e3e0f9530f95",
    "table1-mini": "d7b696119bd8",  # seeds 0-9; its seeds 0-5 below are the runs of the first snapshot
    "table1-mini-v1": "7af609a6adbe",  # the v1 regime: the same runs as results/table1-mini-v1
    "clip-higher-stress-mini": "0e2caa91fe82",  # the runs behind results/clip-higher-stress-mini
    "smollm2-mini": "3ece677013b2",  # seeds 0-5; its seeds 0-2 below are the runs of the first snapshot
    "soft-punish-x-ds-mini": "d531096cd63d",  # the runs behind results/soft-punish-x-ds-mini
}


@pytest.mark.parametrize("name", sorted(SHIPPED_HASHES))
def test_shipped_experiment_hashes_are_unchanged(name):
    assert config_hash(load_config(REPO / "experiments" / f"{name}.yaml")) == SHIPPED_HASHES[name]


def test_default_config_hash_is_unchanged():
    assert config_hash(load_config()) == "c39bbb3a30db"


@pytest.mark.parametrize("name", sorted(PAPER_HASHES))
def test_paper_experiment_hashes_with_old_values_are_unchanged(name):
    path = REPO / "experiments" / f"{name}.yaml"
    assert config_hash(load_config(path, PAPER_OLD_VALUES)) == PAPER_HASHES[name]
    assert config_hash(load_config(path)) != PAPER_HASHES[name]  # the shipped values are new


SWEEP_IDS_FIRST_SEEDS = {"table1-mini": (6, "4fe12b3f0605"), "smollm2-mini": (3, "478ffedda72e")}
"""A sweep extended with more seeds: the run ids of its first seeds, pinned before the extension."""


@pytest.mark.parametrize("name", sorted(SWEEP_IDS))
def test_shipped_sweep_run_ids_are_unchanged(name, tmp_path):
    import hashlib
    from dapo.sweep.spec import expand, load_spec
    jobs = expand(REPO / "sweeps" / f"{name}.yaml", tmp_path)
    ids = ",".join(j.run_id for j in jobs)
    assert hashlib.sha256(ids.encode()).hexdigest()[:12] == SWEEP_IDS[name]
    if name in SWEEP_IDS_FIRST_SEEDS:
        k, pin = SWEEP_IDS_FIRST_SEEDS[name]
        first = set(load_spec(REPO / "sweeps" / f"{name}.yaml").seeds[:k])
        ids = ",".join(j.run_id for j in jobs if j.seed in first)
        assert hashlib.sha256(ids.encode()).hexdigest()[:12] == pin


def test_resource_knobs_are_not_in_the_run_id_but_the_token_budget_is():
    base = config_hash(load_config())
    for ov in ["rollout.tensor_parallel_size=2", "rollout.sleep_mode=false", "train.logits_chunk_tokens=256",
               "launch.pg_timeout_s=60", "train.threads=1", "launch.rollout_timeout_s=3600"]:
        assert config_hash(load_config(None, ["launch.num_processes=2", ov])) == \
            config_hash(load_config(None, ["launch.num_processes=2"])), ov
    assert config_hash(load_config(None, ["train.max_tokens_per_micro_batch=4096"])) != base
    assert config_hash(load_config(None, ["data.train_skip=3"])) != base


@pytest.mark.parametrize("override, message", [
    ("rollout.tensor_parallel_size=0", "rollout.tensor_parallel_size = 0: must be >= 1"),
    ("rollout.tensor_parallel_size=3", "must divide launch.num_processes (1)"),
    ("rollout.sleep_mode=maybe", "rollout.sleep_mode = 'maybe': expected bool"),
    ("train.max_tokens_per_micro_batch=0", "train.max_tokens_per_micro_batch = 0: must be >= 1 or null"),
    ("train.logits_chunk_tokens=-1", "train.logits_chunk_tokens = -1: must be >= 1 or null"),
    ("train.logits_chunk_tokens=1.5", "train.logits_chunk_tokens = 1.5: expected int or null"),
    ("launch.pg_timeout_s=0", "launch.pg_timeout_s = 0: must be >= 1"),
    ("launch.rollout_timeout_s=0", "launch.rollout_timeout_s = 0: must be >= 1 or null"),
])
def test_issue12_keys_are_validated(override, message):
    with pytest.raises(ConfigError, match=__import__("re").escape(message)):
        load_config(None, [override])


def test_issue12_keys_defaults():
    cfg = load_config()
    assert (cfg.rollout.tensor_parallel_size, cfg.rollout.sleep_mode, cfg.train.max_tokens_per_micro_batch,
            cfg.train.logits_chunk_tokens, cfg.launch.pg_timeout_s, cfg.launch.rollout_timeout_s) == \
        (1, True, None, None, 600, None)
    assert load_config(None, ["launch.num_processes=8", "rollout.tensor_parallel_size=4"]).rollout.tensor_parallel_size == 4


# --------------------------------------------------------------------------- YAML aliases, long values
def _alias_doc(items: int, aliases: int) -> str:
    """`a` holds ``items`` scalars; `b` lists ``aliases`` aliases of it: each adds items + 1 nodes.
    Written: the mapping, keys a and b, both lists and the scalars = items + 5 nodes."""
    return f"a: &a [{', '.join(['x'] * items)}]\nb: [{', '.join(['*a'] * aliases)}]\n"


def test_aliases_may_add_at_most_max_alias_nodes():
    from dapo.config import MAX_ALIAS_NODES, safe_yaml_text
    assert MAX_ALIAS_NODES == 10_000
    assert len(safe_yaml_text(_alias_doc(99, 100), "t")["b"]) == 100        # 100 × (99 + 1) = 10 000: allowed
    with pytest.raises(ConfigError, match=r"t: aliases \(\*name\) expand to 10204 nodes, more than 10000 beyond "
                                          r"the 104 written"):
        safe_yaml_text(_alias_doc(99, 101), "t")                              # 10 100 added: refused
    with pytest.raises(ConfigError, match="recursive alias"):
        safe_yaml_text("a: &a [1, *a]\n", "t")


def test_merge_keys_may_be_overridden_but_a_plain_key_not_repeated():
    from dapo.config import safe_yaml_text
    assert safe_yaml_text("base: &b {x: 1, y: 2}\nc: {<<: *b, x: 3}\n", "t")["c"] == {"x": 3, "y": 2}
    with pytest.raises(ConfigError, match=r"t: line 2: key 'x' is given twice in one mapping \(first on line 1\)"):
        safe_yaml_text("x: 1\nx: 2\n", "t")


def test_error_messages_show_at_most_200_characters_of_a_value():
    from dapo.config import show
    assert show("ab") == "'ab'" and show([1, 2]) == "[1, 2]"
    assert len(show("x" * 10**6)) <= 200 and len(show(list(range(10**6)))) <= 200
    with pytest.raises(ConfigError) as e:
        load_config(None, ["train.lr=" + "y" * 100_000])
    assert len(str(e.value)) < 400 and "train.lr = 'yyy" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"rollout.n=[{', '.join(['1'] * 10_000)}]"])
    assert len(str(e.value)) < 400


def test_no_help_prints_raw_restructuredtext():
    """Module docstrings reached ``--help`` with ``literals`` and :func:`roles` in them."""
    from dapo.helptext import help_text
    assert help_text("``dapo x``: see :func:`dapo.a.b` and :mod:`~dapo.c`.\n\nsecond") == "dapo x: see dapo.a.b and dapo.c."
    assert help_text("a\n\nb ``c``", None) == "a\n\nb c"
    for cmd in ("sweep", "runs", "plan", "demo", "train", "config", "eval", "figures", "base"):
        out = subprocess.run([sys.executable, "-m", "dapo.cli", cmd, "--help"], capture_output=True, text=True,
                             cwd=REPO, timeout=120)
        assert out.returncode == 0, (cmd, out.stderr[-500:])
        assert "``" not in out.stdout and ":func:`" not in out.stdout and ":class:`" not in out.stdout, (cmd, out.stdout)
