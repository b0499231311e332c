"""The behaviour policy (dapo/algo/corrections.py): each correction on hand-derived tensors, the weights
detached, the mismatch metrics by hand, the engines' log-probs against the trainer's, and the
config defaults leaving every hash alone."""

from __future__ import annotations

import math

import pytest
import torch

from dapo.algo.corrections import apply, correction, mismatch_metrics

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


def test_weights_are_detached_and_reach_the_loss_as_token_weights():
    old = OLD.clone().requires_grad_(True)
    w, keep = correction(old, ROLL, MASK, "tis", cap=2.0)
    assert not w.requires_grad and not keep.requires_grad
    tw, lm = apply(MASK, w, keep)
    assert torch.allclose(tw, torch.tensor([[1.5, 0.25, 1.0], [2.0, 1.1, 0.0]]), atol=1e-6)
    assert torch.equal(lm, MASK)
    w, keep = correction(OLD, ROLL, MASK, "mis", lo=0.5, hi=2.0)
    tw, lm = apply(MASK, w, keep)
    assert torch.equal(lm, keep) and torch.equal(tw, w)          # rejected: out of the mask, weight 0


# ------------------------------------------------------------------ the weight × every policy loss
def _ref_covariance(a, lp, m):
    """Cov_t = (Â_t − mean Â)(logπ_t − mean logπ), means over the loss tokens; python loops, float64."""
    toks = [(i, t) for i in range(m.shape[0]) for t in range(m.shape[1]) if m[i, t]]
    ma = sum(float(a[i, t]) for i, t in toks) / len(toks)
    ml = sum(float(lp[i, t]) for i, t in toks) / len(toks)
    return {(i, t): (float(a[i, t]) - ma) * (float(lp[i, t]) - ml) for i, t in toks}


def _ref_weighted_loss(kind, logp, old, adv, m, w, opt):
    """The reference: ℓ_t(Â) chosen on the unweighted Â (Clip-Cov / KL-Cov select by Cov(Â, logπ)),
    the whole per-token loss times w_t, token mean. logp [N, L] with grad; the rest detached."""
    r = (logp - old).exp()
    cov = _ref_covariance(adv, logp.detach(), m)
    total = logp.new_zeros(())
    if kind == "clip_cov":   # ratio large enough that every candidate is cut: no random draw
        rd = r.detach()
        clipped = {k for k in cov if float(rd[k] * adv[k]) > float(rd[k].clamp(0.8, 1.28) * adv[k])}
        cut = {k for k, c in cov.items() if opt["lb"] < c < opt["ub"] and k not in clipped}
    if kind == "kl_cov":
        n_sel = max(1, math.floor(opt["ratio"] * len(cov)))
        pen = set(sorted(cov, key=lambda k: -cov[k])[:n_sel])
    for k in cov:
        if kind == "clip_cov":
            tok = 0.0 * logp[k] if k in cut else -torch.minimum(r[k] * adv[k], r[k].clamp(0.8, 1.28) * adv[k])
        else:
            tok = -adv[k] * r[k] + (opt["coef"] * (logp[k] - old[k]).abs() if k in pen else 0.0)
        total = total + w[k] * tok
    return total / len(cov)


@pytest.mark.parametrize("kind,opt", [("clip_cov", {"ratio": 1.0, "lb": -0.05, "ub": 5.0}),
                                      ("kl_cov", {"ratio": 0.2, "coef": 1.0})])
@pytest.mark.parametrize("mode", ["tis", "mis"])
def test_a_correction_weights_the_whole_token_loss_of_clip_cov_and_kl_cov(kind, opt, mode):
    """Issue 38, defect 1: with the weight folded into the advantage (Â·w), Clip-Cov and KL-Cov chose their
    tokens by Cov(Â·w, logπ) and KL-Cov's penalty went unweighted. The route the trainer takes (correction →
    apply → policy_loss's token_weight) must equal the slow reference: w × the whole per-token loss."""
    from dapo import algo
    g = torch.Generator().manual_seed(3)
    n, l = 8, 12
    m = (torch.arange(l)[None, :] < torch.randint(4, l + 1, (n, 1), generator=g)).float()
    roll = -torch.rand(n, l, generator=g) * 3
    old = roll + torch.randn(n, l, generator=g) * 0.6                 # |log ρ| up to ~2
    logp = (old + torch.randn(n, l, generator=g) * 0.3).requires_grad_(True)
    adv = torch.randn(n, generator=g)[:, None].expand(n, l).contiguous()
    w, keep = correction(old, roll, m, mode, cap=2.0, lo=0.3, hi=3.0)
    tw, lm = apply(m, w, keep)
    got, met = algo.policy_loss(logp, old, adv, lm, eps_low=0.2, eps_high=0.28, agg="token_mean", kind=kind,
                                options=dict(opt), token_weight=tw)
    (g_got,) = torch.autograd.grad(got, logp)
    lp64 = logp.detach().double().requires_grad_(True)
    ref = _ref_weighted_loss(kind, lp64, old.double(), adv.double(), lm.bool(), tw.double(), opt)
    (g_ref,) = torch.autograd.grad(ref, lp64)
    assert met["cov_selected_frac"] > 0
    assert float(got) == pytest.approx(float(ref), rel=1e-5, abs=1e-7)
    assert torch.allclose(g_got.double(), g_ref, atol=1e-7, rtol=1e-5)
    # the old route, ℓ(Â·w), is not this loss (what the test is for)
    folded, _ = algo.policy_loss(logp, old, adv * tw, lm, eps_low=0.2, eps_high=0.28, agg="token_mean", kind=kind,
                                 options=dict(opt))
    (g_folded,) = torch.autograd.grad(folded, logp)
    assert not torch.allclose(g_folded.double(), g_ref, atol=1e-5)


@pytest.mark.parametrize("kind", ["ppo_clip", "gspo", "cispo"])
def test_for_the_homogeneous_losses_weighting_the_loss_is_weighting_the_advantage(kind):
    """w·ℓ(Â) = ℓ(w·Â) for w ≥ 0 where ℓ is positively homogeneous in Â (the module docstring's claim)."""
    from dapo import algo
    g = torch.Generator().manual_seed(5)
    n, l = 6, 9
    m = (torch.arange(l)[None, :] < torch.randint(2, l + 1, (n, 1), generator=g)).float()
    old = -torch.rand(n, l, generator=g) * 3
    logp = (old + torch.randn(n, l, generator=g) * 0.4).requires_grad_(True)
    adv = torch.randn(n, generator=g)[:, None].expand(n, l)
    w = torch.rand(n, l, generator=g) * 2 * m
    kw = dict(eps_low=0.2, eps_high=0.28, dual_clip_c=3.0 if kind == "ppo_clip" else None, agg="token_mean", kind=kind,
              options={} if kind == "ppo_clip" else {"eps_low": 0.2, "eps_high": 0.28})
    a, _ = algo.policy_loss(logp, old, adv, m, token_weight=w, **kw)
    b, _ = algo.policy_loss(logp, old, adv * w, m, **kw)
    ga, gb = (torch.autograd.grad(x, logp)[0] for x in (a, b))
    assert float(a) == pytest.approx(float(b), rel=1e-5, abs=1e-7) and torch.allclose(ga, gb, atol=1e-7)


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
    from dapo.models import load_model, load_tokenizer, resolve_model
    from dapo.train.logprobs import response_logits, token_logprobs
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


def test_the_update_passes_each_micro_batch_its_rows_of_the_weights():
    """update_policy(token_weight=w) slices w as it slices the batch: for the clipped surrogate it must move
    the model exactly as the advantage route ℓ(Â·w) does, over shuffled mini-batches and micro-batches."""
    from dapo import algo
    from dapo.train.logprobs import old_logprobs
    from dapo.train.update import Policy, update_policy
    from tests.test_train import _cfg, _random_batch, _tiny_policy
    cfg = _cfg(**{"rollout.n": 4, "train.batch_prompts": 4, "train.mini_batch_prompts": 2, "train.micro_batch_seqs": 4,
                  "algo.dynamic_sampling.enabled": "false", "model.autocast_bf16": "false"})
    batch = _random_batch()
    models = []
    for folded in (False, True):
        model = _tiny_policy(0)
        old, _, mask = old_logprobs(model, batch, cfg, 0, torch.device("cpu"), False)
        w = (torch.rand(mask.shape, generator=torch.Generator().manual_seed(1)) * 2 + 0.1) * mask
        adv = algo.group_advantages(batch.rewards).reshape(-1)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        p = Policy(model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0), torch.device("cpu"))
        if folded:
            update_policy(p, batch, old - 0.1, adv[:, None] * w, mask, cfg)
        else:
            update_policy(p, batch, old - 0.1, adv, mask, cfg, token_weight=w)
        models.append(model)
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        assert torch.allclose(a, b, atol=1e-6)
