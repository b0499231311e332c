"""The behaviour policy (dapo/corrections.py): each correction on hand-derived tensors, the weights
detached, the mismatch metrics by hand, the engines' log-probs against the trainer's, and the
config defaults leaving every hash alone."""

from __future__ import annotations

import math

import pytest
import torch

from dapo.corrections import apply, correction, mismatch_metrics

# two responses: row 0 has 3 tokens, row 1 has 2 (+1 padding). log rho = old - rollout:
#   row 0: log(1.5), log(0.25), 0        -> rho 1.5, 0.25, 1.0   (prod 0.375, geo mean 0.375^(1/3) = 0.721)
#   row 1: log(3.0), log(1.1), (pad)     -> rho 3.0, 1.1         (prod 3.3,   geo mean sqrt(3.3) = 1.817)
ROLL = torch.tensor([[-1.0, -2.0, -0.5], [-1.2, -0.3, -9.0]])
RHO = torch.tensor([[1.5, 0.25, 1.0], [3.0, 1.1, 1.0]])
OLD = ROLL + RHO.log()
OLD[1, 2] = 5.0                                  # padding: any value, masked
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def test_token_tis_truncates_each_weight_and_rejects_nothing():
    w, keep = correction(OLD, ROLL, MASK, "tis", cap=2.0)
    assert torch.allclose(w, torch.tensor([[1.5, 0.25, 1.0], [2.0, 1.1, 0.0]]), atol=1e-6)
    assert torch.equal(keep, MASK)


def test_sequence_tis_uses_the_product_and_broadcasts_it():
    w, _ = correction(OLD, ROLL, MASK, "tis", level="sequence", cap=2.0)
    assert torch.allclose(w, torch.tensor([[0.375] * 3, [2.0, 2.0, 0.0]]), atol=1e-6)   # 3.3 capped at 2


def test_mis_keeps_the_weight_inside_the_band_and_rejects_outside():
    w, keep = correction(OLD, ROLL, MASK, "mis", lo=0.5, hi=2.0)
    assert torch.equal(keep, torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]))      # 0.25 and 3.0 out
    assert torch.allclose(w, torch.tensor([[1.5, 0.0, 1.0], [0.0, 1.1, 0.0]]), atol=1e-6)
    _, keep = correction(OLD, ROLL, MASK, "mis", level="sequence", lo=0.5, hi=2.0)   # 0.375 and 3.3: both out
    assert keep.sum() == 0


def test_icepop_and_geometric_rejection():
    w, keep = correction(OLD, ROLL, MASK, "icepop", lo=0.5, hi=2.0)
    assert torch.equal(keep, torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])) and torch.equal(w, keep)
    w, keep = correction(OLD, ROLL, MASK, "geo_rs", lo=0.7, hi=1.5)                  # 0.721 in, 1.817 out
    assert torch.equal(keep, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])) and torch.equal(w, keep)
    with pytest.raises(ValueError, match="valid: \\['none', 'tis'"):
        correction(OLD, ROLL, MASK, "nope")


def test_weights_are_detached_and_reach_the_loss_through_the_advantages():
    old = OLD.clone().requires_grad_(True)
    w, keep = correction(old, ROLL, MASK, "tis", cap=2.0)
    assert not w.requires_grad and not keep.requires_grad
    adv, lm = apply(torch.tensor([1.0, -2.0]), MASK, w, keep)
    assert torch.allclose(adv, torch.tensor([[1.5, 0.25, 1.0], [-4.0, -2.2, 0.0]]), atol=1e-6)
    assert torch.equal(lm, MASK)
    # w·l(A) == l(w·A) for the clipped surrogate (w >= 0), what makes the advantage route exact
    from dapo import algo
    logp = (ROLL + torch.tensor([[0.3, -0.4, 0.05], [0.2, 0.0, 0.0]])).requires_grad_(True)
    l_w, _ = algo.policy_loss(logp, ROLL, adv, MASK, eps_low=0.2, eps_high=0.28, agg="token_mean", num_tokens=5)
    r = (logp - ROLL).exp()
    a = torch.tensor([[1.0] * 3, [-2.0] * 3])
    tok = -torch.minimum(r * a, r.clamp(0.8, 1.28) * a) * w
    assert float(l_w) == pytest.approx(float((tok * MASK).sum() / 5), abs=1e-6)


def test_mismatch_metrics_by_hand():
    m = mismatch_metrics(OLD, ROLL, MASK)
    lr = torch.tensor([math.log(1.5), math.log(0.25), 0.0, math.log(3.0), math.log(1.1)])
    rho = lr.exp()
    assert m["mismatch/kl"] == pytest.approx(float(-lr.mean()), abs=1e-6)
    assert m["mismatch/k3"] == pytest.approx(float((rho - lr - 1).mean()), abs=1e-6) and m["mismatch/k3"] > 0
    assert m["mismatch/abs_diff_max"] == pytest.approx(math.log(4.0), abs=1e-6)
    assert m["mismatch/chi2_token"] == pytest.approx(float((rho ** 2).mean() - 1), abs=1e-5)
    assert m["mismatch/chi2_seq"] == pytest.approx((0.375 ** 2 + 3.3 ** 2) / 2 - 1, abs=1e-5)
    assert m["mismatch/ppl_ratio"] == pytest.approx((0.375 ** (-1 / 3) + 3.3 ** (-1 / 2)) / 2, abs=1e-5)
    assert set(k for k in m if "len" in k) == {"mismatch/k3_len_le16"}
    w, keep = correction(OLD, ROLL, MASK, "mis", lo=0.5, hi=2.0)
    m = mismatch_metrics(OLD, ROLL, MASK, w, keep)
    assert m["mismatch/masked_frac"] == pytest.approx(2 / 5)
    ws = torch.tensor([1.5, 1.0, 1.1])
    assert m["mismatch/ess"] == pytest.approx(float(ws.sum() ** 2 / (3 * (ws ** 2).sum())), abs=1e-6)
    assert (m["mismatch/is_weight_min"], m["mismatch/is_weight_max"]) == pytest.approx((1.0, 1.5))
    same = mismatch_metrics(ROLL, ROLL, MASK)
    assert same["mismatch/k3"] == 0 and same["mismatch/chi2_seq"] == pytest.approx(0, abs=1e-7)


def test_new_keys_at_their_defaults_change_no_hash():
    from dapo.config import config_hash, load_config
    base = load_config("experiments/mini-dapo.yaml")
    same = load_config("experiments/mini-dapo.yaml", ["algo.rollout_correction.mode=none", "algo.old_logprobs=trainer"])
    assert config_hash(base) == config_hash(same) == "8f2461b542bb"
    assert config_hash(load_config("experiments/mini-dapo.yaml", ["algo.rollout_correction.mode=tis"])) != "8f2461b542bb"
    from dapo.config import ConfigError
    with pytest.raises(ConfigError, match="needs algo.old_logprobs=trainer"):
        load_config("experiments/mini-dapo.yaml", ["algo.rollout_correction.mode=tis", "algo.old_logprobs=rollout"])


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 1.0)])
def test_the_hf_engine_returns_the_trainers_log_probs_in_fp32(temperature, top_p):
    """The same fp32 weights on both sides: |log π_rollout − log π_old| <= 1e-5 per token (the raw-logit
    bug would give ~log-ratios of the temperature's size at T = 0.7)."""
    from dapo.engines import SamplingSpec, make_engine
    from dapo.logprobs import response_logits, token_logprobs
    from dapo.models import load_model, load_tokenizer, resolve_model
    path = resolve_model("tiny-3m")
    model, tok = load_model(path), load_tokenizer(path)
    eng = make_engine("hf", path, dtype="float32", seed=0, trainer_model=model)
    prompts = [tok("7*3-5=", add_special_tokens=False)["input_ids"], tok("12+4=", add_special_tokens=False)["input_ids"]]
    outs = eng.generate(prompts, SamplingSpec(n=3, temperature=temperature, top_p=top_p, max_tokens=12, seed=3))
    P, R = [p for p, cs in zip(prompts, outs) for _ in cs], [c.token_ids for cs in outs for c in cs]
    logits, tgt, mask = response_logits(model.eval(), P, R, tok.pad_token_id or 0, torch.device("cpu"), False)
    lp = token_logprobs(logits, tgt, temperature=temperature)
    for i, c in enumerate(c for cs in outs for c in cs):
        assert c.logprobs is not None and len(c.logprobs) == len(c.token_ids)
        assert torch.allclose(torch.tensor(c.logprobs), lp[i, :len(c.token_ids)].float(), atol=1e-5)


@pytest.mark.slow
def test_a_run_with_a_correction_logs_the_mismatch_and_bypass_runs(tmp_path):
    """tiny-random-smoke on the transformers engine, fp32 on both sides: the token TIS run logs
    mismatch/* every step with weights 1 to 1e-4; so does a run with one optimizer step per rollout and
    no correction (no pi_old pass: the update's own forward is compared); a bypass run (pi_old :=
    pi_rollout) finishes and logs none (~90 s)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from mlflow.tracking import MlflowClient
    repo = Path(__file__).resolve().parents[1]
    tiny = ["rollout.engine=hf", "rollout.n=2", "rollout.max_new_tokens=4", "train.batch_prompts=2",
            "train.micro_batch_seqs=2", "train.threads=1", "eval.every=0",
            "eval.at_start=false", "data.train_limit=16", "logging.progress=false", "train.rollout_steps=2"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    for name, extra in (("tis", ["algo.rollout_correction.mode=tis", "model.autocast_bf16=false",
                                 "train.mini_batch_prompts=1"]),
                        ("single", ["train.mini_batch_prompts=2", "model.autocast_bf16=false"]),
                        ("bypass", ["algo.old_logprobs=rollout", "train.mini_batch_prompts=1"])):
        out = tmp_path / name
        p = subprocess.run([sys.executable, "-m", "dapo.cli", "train", "experiments/tiny-random-smoke.yaml", *tiny,
                            *extra, f"output_dir={out}", f"logging.tracking_uri=sqlite:///{out / 'mlruns.db'}",
                            "--run-dir", str(out / "run")], cwd=repo, env=env, capture_output=True, text=True,
                           timeout=600)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
        summary = json.loads((out / "run" / "summary.json").read_text())
        client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlruns.db'}")
        metrics = client.get_run(summary["mlflow_run_id"]).data.metrics
        if name == "tis":
            for key in ("mismatch/k3", "mismatch/abs_diff_max", "mismatch/is_weight_mean", "mismatch/ess"):
                assert len(client.get_metric_history(summary["mlflow_run_id"], key)) == 2, key
            assert abs(metrics["mismatch/is_weight_mean"] - 1) < 1e-4 and metrics["mismatch/abs_diff_max"] < 1e-4
        elif name == "single":
            assert len(client.get_metric_history(summary["mlflow_run_id"], "mismatch/k3")) == 2
            assert metrics["mismatch/abs_diff_max"] < 1e-4 and "mismatch/is_weight_mean" not in metrics
            assert "train/entropy" in metrics                        # the mode ran: no separate pi_old pass
        else:
            assert not any(k.startswith("mismatch/") for k in metrics)   # one policy: nothing to compare
