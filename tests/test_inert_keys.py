"""Dead keys make separate arms (issue 41): a sweep whose arms differ only in keys that cannot change
training under their other settings is warned about at expand and submit time."""

import subprocess
import sys
from pathlib import Path

from dapo.config import inert_keys, load_config
from dapo.sweep.spec import expand, inert_overrides

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "experiments" / "tiny-dapo.yaml"


def _spec(tmp_path, loss: str) -> Path:
    p = tmp_path / f"{loss}.yaml"
    p.write_text(f"name: g-{loss}\nbase: {TINY}\nbase_overrides: {{algo.policy_loss: {loss}}}\nkind: grid\n"
                 "grid:\n  algo.clip.eps_high: [0.2, 0.28]\nseeds: [0]\nmetric: eval/arith-eval/avg_at_8\n"
                 "resources: {nodes: 1, gpus_per_node: 0, cpus_per_task: 1, mem_gb: 6, time_min: 60}\n")
    return p


def test_the_rules():
    base = inert_keys(load_config(TINY))                                   # ppo_clip, DS on, soft punish on
    assert "algo.clip.eps_high" not in base and "algo.gspo.eps_high" in base and "algo.kl.estimator" in base
    assert "algo.dynamic_sampling.max_gen_rounds" not in base and "algo.rollout_correction.cap" in base
    g = inert_keys(load_config(TINY, ["algo.policy_loss=gspo", "algo.dynamic_sampling.enabled=false",
                                      "algo.overlong.soft_punish=false", "algo.rollout_correction.mode=tis"]))
    assert {"algo.clip.eps_high", "algo.dynamic_sampling.max_gen_rounds", "algo.overlong.cache_len",
            "algo.rollout_correction.lo"} <= set(g)
    assert "algo.gspo.eps_high" not in g and "algo.rollout_correction.cap" not in g
    assert "algo.clip.eps_high" not in inert_keys(load_config(TINY, ["algo.policy_loss=clip_cov"]))


def test_a_grid_of_a_dead_key_is_warned_and_a_live_one_is_not(tmp_path):
    w = inert_overrides(expand(_spec(tmp_path, "gspo"), tmp_path / "out"))
    assert len(w) == 1 and "eps_high-0.2 and eps_high-0.28 train identically" in w[0]
    assert "algo.policy_loss = gspo does not clip" in w[0]
    assert inert_overrides(expand(_spec(tmp_path, "ppo_clip"), tmp_path / "out")) == []
    p = subprocess.run([sys.executable, "-m", "dapo.sweep", "expand", str(_spec(tmp_path, "cispo")), "--output",
                        str(tmp_path / "out")], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert p.returncode == 0 and p.stderr.startswith("warning: arms eps_high-0.2 and eps_high-0.28 train identically")


def test_no_committed_sweep_has_arms_that_train_identically():
    for spec in sorted((REPO / "sweeps").glob("*.yaml")):
        assert inert_overrides(expand(spec, "runs")) == [], spec.name
