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
    "smoke-slurm": "e3e0f9530f95", "smollm2-mini": "3ece677013b2", "soft-punish-x-ds-mini": "d531096cd63d",
    "table1-mini-fresh": "9ad8af5d6fe6", "table1-mini-v1": "7af609a6adbe", "table1-mini": "d7b696119bd8",
    "table1": "085ed18ce14b",
}
# every key the successors added, at its default (spelled out, so a changed default fails here)
NEW_DEFAULTS = {
    "algo.advantage.std": "group", "algo.advantage.baseline": "mean", "algo.policy_loss": "ppo_clip",
    "algo.gspo.eps_low": 3e-4, "algo.gspo.eps_high": 4e-4, "algo.cispo.eps_low": None, "algo.cispo.eps_high": 0.28,
    "algo.clip_cov.ratio": 2e-4, "algo.clip_cov.lb": 1.0, "algo.clip_cov.ub": 5.0,
    "algo.kl_cov.ratio": 2e-4, "algo.kl_cov.coef": 1.0, "algo.top_entropy_quantile": 1.0,
    "algo.dynamic_sampling.mode": "refill", "algo.dynamic_sampling.min_acc": 0.0,
    "algo.dynamic_sampling.max_acc": 1.0, "data.drop_solved": False,
}


@pytest.mark.parametrize("name", sorted(EXPERIMENT_HASHES))
def test_experiment_hashes_are_unchanged_and_the_defaults_are_not_hashed(name):
    path = REPO / "experiments" / f"{name}.yaml"
    assert config_hash(load_config(path)) == EXPERIMENT_HASHES[name]
    explicit = [f"{k}={'null' if v is None else v}" for k, v in NEW_DEFAULTS.items()]
    assert config_hash(load_config(path, explicit)) == EXPERIMENT_HASHES[name]


def test_every_new_key_is_listed_with_its_default():
    new = {k: v for k, v in flatten(to_dict(load_config())).items() if k in NEW_DEFAULTS}
    assert new == NEW_DEFAULTS


@pytest.mark.parametrize("name", sorted(SWEEP_RUN_IDS))
def test_sweep_run_ids_are_unchanged(name, tmp_path):
    from dapo.sweep.spec import expand
    ids = ",".join(j.run_id for j in expand(REPO / "sweeps" / f"{name}.yaml", tmp_path))
    assert hashlib.sha256(ids.encode()).hexdigest()[:12] == SWEEP_RUN_IDS[name]


def test_a_new_key_off_its_default_is_hashed():
    base = config_hash(load_config())
    seen = {base}
    for ov in ["algo.advantage.std=none", "algo.advantage.std=batch", "algo.advantage.baseline=leave_one_out",
               "algo.policy_loss=gspo", "algo.policy_loss=cispo", "algo.policy_loss=clip_cov", "algo.policy_loss=kl_cov",
               "algo.gspo.eps_high=0.001", "algo.cispo.eps_low=0.5", "algo.clip_cov.ub=6", "algo.kl_cov.coef=0.5",
               "algo.top_entropy_quantile=0.2", "algo.loss_agg=group_token_mean",
               "algo.dynamic_sampling.mode=filter", "algo.dynamic_sampling.mode=mask",
               "algo.dynamic_sampling.min_acc=0.1", "algo.dynamic_sampling.max_acc=0.9", "data.drop_solved=true"]:
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
    with pytest.raises(ConfigError, match="algo.policy_loss = 'sapo'.*'ppo_clip', 'gspo', 'cispo', 'clip_cov', 'kl_cov'"):
        load_config(None, ["algo.policy_loss=sapo"])
    for ov, msg in [("algo.top_entropy_quantile=0", "must be in \\(0, 1\\]"), ("algo.clip_cov.ub=0.5", "must be > algo.clip_cov.lb"),
                    ("algo.kl_cov.ratio=0", "must be in \\(0, 1\\]"), ("algo.cispo.eps_low=1", "or null")]:
        with pytest.raises(ConfigError, match=msg):
            load_config(None, [ov])
    with pytest.raises(ValueError, match=r"valid: \['cispo', 'clip_cov', 'gspo', 'kl_cov', 'ppo_clip'\]"):
        algo.policy_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1), eps_low=0.2,
                         eps_high=0.2, kind="sapo")


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


# ----------------------------------------------------------------------------------------
# Policy losses
# ----------------------------------------------------------------------------------------

def loss_and_grad(kind, logp, old, adv, mask, agg="token_mean", options=None, eps=(0.2, 0.28), **kw):
    """(loss, d loss / d logp, metrics) of algo.policy_loss."""
    logp = logp.clone().requires_grad_()
    loss, met = algo.policy_loss(logp, old, adv, mask, eps_low=eps[0], eps_high=eps[1], agg=agg, kind=kind,
                                 options=options, **kw)
    loss.backward()
    return loss.detach(), logp.grad, met


def random_inputs(seed, n=6, l=7, spread=0.4):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, l, generator=gen, dtype=torch.float64) * 3
    logp = old + spread * torch.randn(n, l, generator=gen, dtype=torch.float64)
    adv = torch.randn(n, generator=gen, dtype=torch.float64)
    lengths = torch.randint(1, l + 1, (n,), generator=gen)
    mask = (torch.arange(l)[None, :] < lengths[:, None]).double()
    return logp, old, adv, mask


def test_gspo_hand():
    # one response, log-ratios 0.1 and 0.3: s = e^0.2 ≈ 1.2214 > 1 + 4e-4.
    old = torch.zeros(1, 2, dtype=torch.float64)
    logp = torch.tensor([[0.1, 0.3]], dtype=torch.float64) - 1.0
    old = old - 1.0
    mask = torch.ones(1, 2, dtype=torch.float64)
    # Â = +1: the clip is active, ℓ = −(1 + 4e-4) per token, no gradient
    loss, grad, met = loss_and_grad("gspo", logp, old, torch.ones(1, dtype=torch.float64), mask)
    assert loss.item() == pytest.approx(-(1 + 4e-4), rel=1e-12) and torch.equal(grad, torch.zeros(1, 2, dtype=torch.float64))
    assert met["seq_clip_frac"] == 1.0
    # Â = −1: min(−s, −clip(s)) = −s, ℓ = s on each token; d(mean ℓ)/d logp_t = s / 2 on each token
    loss, grad, met = loss_and_grad("gspo", logp, old, -torch.ones(1, dtype=torch.float64), mask)
    s = math.exp(0.2)
    assert loss.item() == pytest.approx(s, rel=1e-12) and met["seq_clip_frac"] == 0.0
    torch.testing.assert_close(grad, torch.full((1, 2), s / 2, dtype=torch.float64))


@pytest.mark.parametrize("seed", SEEDS)
def test_gspo_is_the_token_loss_when_every_log_ratio_of_a_sequence_is_equal(seed):
    logp, _, adv, mask = random_inputs(seed)
    delta = 0.3 * torch.randn(logp.shape[0], 1, generator=torch.Generator().manual_seed(seed + 9), dtype=torch.float64)
    old = logp - delta                                                     # log r = δ_i on every token
    for agg in ("token_mean", "seq_mean_token_mean"):
        got = loss_and_grad("gspo", logp, old, adv, mask, agg, options={"eps_low": 0.2, "eps_high": 0.28})
        want = loss_and_grad("ppo_clip", logp, old, adv, mask, agg)
        torch.testing.assert_close(got[0], want[0], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(got[1], want[1], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("seed", SEEDS)
def test_gspo_reference(seed):
    """The paper's Eq.: J = (1/G) Σ_i min(s_i Â_i, clip(s_i, 1−ε_l, 1+ε_h) Â_i),
    s_i = (π_θ(y_i)/π_old(y_i))^(1/|y_i|), written per sequence with a python loop."""
    logp, old, adv, mask = random_inputs(seed, spread=0.05)
    eps_l, eps_h = 0.01, 0.02
    lp = logp.clone().requires_grad_()
    terms = []
    for i in range(lp.shape[0]):
        n = int(mask[i].sum())
        s_i = torch.exp(sum(lp[i, t] - old[i, t] for t in range(n)) / n)
        terms.append(torch.minimum(s_i * adv[i], s_i.clamp(1 - eps_l, 1 + eps_h) * adv[i]))
    ref = -sum(terms) / len(terms)
    ref.backward()
    loss, grad, _ = loss_and_grad("gspo", logp, old, adv, mask, "seq_mean_token_mean",
                                  options={"eps_low": eps_l, "eps_high": eps_h})
    assert loss.item() == pytest.approx(ref.item(), rel=1e-10)
    torch.testing.assert_close(grad, lp.grad, rtol=1e-10, atol=1e-12)


def test_cispo_hand():
    # r = e^0.5 ≈ 1.65 capped at 1.28; r = e^-0.5 ≈ 0.61 kept (no floor); Â = 2, logπ_θ = −1:
    # ℓ = −ŵ·Â·logπ = 2ŵ, d ℓ / d logπ = −2ŵ on every token, the clipped one included.
    logp = torch.tensor([[-1.0, -1.0]], dtype=torch.float64)
    old = torch.tensor([[-1.5, -0.5]], dtype=torch.float64)
    w = torch.tensor([[1.28, math.exp(-0.5)]], dtype=torch.float64)
    loss, grad, met = loss_and_grad("cispo", logp, old, torch.tensor([2.0], dtype=torch.float64),
                                    torch.ones(1, 2, dtype=torch.float64), "seq_mean_token_sum",
                                    options={"eps_low": None, "eps_high": 0.28})
    assert loss.item() == pytest.approx((2 * w).sum().item(), rel=1e-12)
    torch.testing.assert_close(grad, -2 * w)
    assert met["weight_clip_frac"] == 0.5
    # a floor at 1 − 0.2 lifts the second weight to 0.8
    _, grad, met = loss_and_grad("cispo", logp, old, torch.tensor([2.0], dtype=torch.float64),
                                 torch.ones(1, 2, dtype=torch.float64), "seq_mean_token_sum",
                                 options={"eps_low": 0.2, "eps_high": 0.28})
    torch.testing.assert_close(grad, torch.tensor([[-2.56, -1.6]], dtype=torch.float64))
    assert met["weight_clip_frac"] == 1.0


@pytest.mark.parametrize("seed", SEEDS)
def test_cispo_gradient_is_the_clipped_weight_times_the_advantage_on_every_token(seed):
    logp, old, adv, mask = random_inputs(seed, spread=0.6)
    _, grad, _ = loss_and_grad("cispo", logp, old, adv, mask, options={"eps_low": 0.3, "eps_high": 0.2})
    T = mask.sum()
    for i in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            r = math.exp(logp[i, t].item() - old[i, t].item())
            want = -min(max(r, 0.7), 1.2) * adv[i].item() / T.item() if mask[i, t] else 0.0
            assert grad[i, t].item() == pytest.approx(want, rel=1e-10, abs=1e-14)


def test_cispo_matches_trl_on_the_same_tensors():
    """TRL's loss_type="cispo" (trl 1.x, _compute_loss): −clamp(r, max=ε_max).detach()·Â·logπ, token
    sums over the tokens; its ε_max is 1 + eps_high here. Written out from TRL's source, checked there."""
    trl = pytest.importorskip("trl")
    import inspect
    from trl.trainer import grpo_trainer
    src = inspect.getsource(grpo_trainer.GRPOTrainer._compute_loss)
    assert "torch.clamp(coef_1, max=self.epsilon_high).detach()" in src   # the TRL formula this test mirrors
    assert "-clamped_ratios * advantages * per_token_logps" in src
    logp, old, adv, mask = random_inputs(4, spread=0.6)
    lp = logp.clone().requires_grad_()
    per_token = -torch.clamp(torch.exp(lp - old), max=1.0 + 0.28).detach() * adv[:, None] * lp
    ref = (per_token * mask).sum() / mask.sum()
    ref.backward()
    loss, grad, _ = loss_and_grad("cispo", logp, old, adv, mask, options={"eps_low": None, "eps_high": 0.28})
    assert loss.item() == pytest.approx(ref.item(), rel=1e-12)
    torch.testing.assert_close(grad, lp.grad, rtol=1e-12, atol=1e-14)


def cov_reference(adv, logp, mask):
    """{(i, t): (Â_t − mean Â)(logπ_t − mean logπ)} over the tokens of mask, python loops."""
    toks = [(i, t) for i in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[i, t]]
    ma = sum(adv[i].item() for i, _ in toks) / len(toks)
    ml = sum(logp[i, t].item() for i, t in toks) / len(toks)
    return {(i, t): (adv[i].item() - ma) * (logp[i, t].item() - ml) for i, t in toks}


@pytest.mark.parametrize("seed", SEEDS)
def test_clip_cov_cuts_exactly_k_in_band_unclipped_tokens(seed):
    logp, old, adv, mask = random_inputs(seed, n=8, l=10, spread=0.3)
    adv = adv * 3
    T = int(mask.sum())
    cov = cov_reference(adv, logp, mask)
    ppo = loss_and_grad("ppo_clip", logp, old, adv, mask)
    for ratio in (1e-6, 0.05, 0.2, 1.0):
        opts = {"ratio": ratio, "lb": 0.2, "ub": 3.0, "generator": torch.Generator().manual_seed(seed)}
        loss, grad, met = loss_and_grad("clip_cov", logp, old, adv, mask, options=opts)
        r = (logp - old).exp()
        a = adv[:, None].expand_as(r)
        clipped = (r.clamp(0.8, 1.28) * a) < (r * a)
        cand = {k for k, c in cov.items() if 0.2 < c < 3.0 and not clipped[k]}
        cut = {k for k in cov if grad[k] == 0 and ppo[1][k] != 0}
        assert len(cut) == min(max(1, math.floor(ratio * T)), len(cand)) and cut <= cand
        assert met["cov_selected_frac"] == pytest.approx(len(cut) / T)
        keep = torch.ones_like(grad, dtype=torch.bool)
        for k in cut:
            keep[k] = False
        torch.testing.assert_close(grad[keep], ppo[1][keep])           # the rest: PPO's gradient


def test_clip_cov_hand():
    # 4 tokens of 2 responses, r = 1 (no clip); Â = [2, 0], logπ = [[−1, −3], [−1, −3]]:
    # mean Â = 1, mean logπ = −2; cov = (±1)(±1): [[1·1, 1·(−1)], [(−1)·1, (−1)(−1)]] = [[1, −1], [−1, 1]].
    # Band (0.5, 2): tokens (0,0) and (1,1); ratio 0.25 → max(1, ⌊1⌋) = 1 of them is cut.
    logp = torch.tensor([[-1.0, -3.0], [-1.0, -3.0]], dtype=torch.float64)
    adv = torch.tensor([2.0, 0.0], dtype=torch.float64)
    loss, grad, met = loss_and_grad("clip_cov", logp, logp, adv, torch.ones(2, 2, dtype=torch.float64),
                                    options={"ratio": 0.25, "lb": 0.5, "ub": 2.0, "generator": torch.Generator().manual_seed(0)})
    assert met["cov_selected_frac"] == 0.25
    assert grad[0, 0].item() == 0.0 and grad[0, 1].item() == pytest.approx(-2 / 4)   # (1,1) has Â = 0: no gradient anyway
    assert loss.item() == pytest.approx(-2 / 4)                                       # ℓ(0,0) = 0, ℓ(0,1) = −2


def test_kl_cov_hand():
    # Same tokens as Clip-Cov's hand case but cov (0,0) = 1 is made the largest: logπ(0,0) = −0.5, so
    # mean logπ = −1.875, cov = [[1·1.375, 1·(−1.125)], [−1·0.875, −1·(−1.125)]] = [[1.375, −1.125], [−0.875, 1.125]].
    # ratio 0.25 → 1 token, (0,0), gets +β|logπ − logπ_old| = 2·|0.1|; r = e^0.1 there.
    logp = torch.tensor([[-0.5, -3.0], [-1.0, -3.0]], dtype=torch.float64)
    old = logp.clone()
    old[0, 0] = -0.6
    adv = torch.tensor([2.0, 0.0], dtype=torch.float64)
    loss, grad, met = loss_and_grad("kl_cov", logp, old, adv, torch.ones(2, 2, dtype=torch.float64),
                                    options={"ratio": 0.25, "coef": 2.0})
    r = math.exp(0.1)
    assert met["cov_selected_frac"] == 0.25
    assert loss.item() == pytest.approx((-2 * r + 2 * 0.1 - 2.0) / 4, rel=1e-12)
    assert grad[0, 0].item() == pytest.approx((-2 * r + 2.0) / 4, rel=1e-12) and grad[0, 1].item() == pytest.approx(-0.5)


@pytest.mark.parametrize("seed", SEEDS)
def test_kl_cov_reference(seed):
    """Sort the tokens by the covariance (python), penalize the top max(1, ⌊ratio·T⌋), no clip."""
    logp, old, adv, mask = random_inputs(seed, n=8, l=10)
    ratio, coef = 0.1, 0.7
    cov = cov_reference(adv, logp, mask)
    k = max(1, math.floor(ratio * len(cov)))
    top = set(sorted(cov, key=cov.get, reverse=True)[:k])
    lp = logp.clone().requires_grad_()
    terms = []
    for (i, t) in cov:
        term = -adv[i] * torch.exp(lp[i, t] - old[i, t])
        terms.append(term + coef * (lp[i, t] - old[i, t]).abs() if (i, t) in top else term)
    ref = sum(terms) / len(terms)
    ref.backward()
    loss, grad, met = loss_and_grad("kl_cov", logp, old, adv, mask, options={"ratio": ratio, "coef": coef})
    assert loss.item() == pytest.approx(ref.item(), rel=1e-10)
    torch.testing.assert_close(grad, lp.grad, rtol=1e-10, atol=1e-12)
    assert met["cov_selected_frac"] == pytest.approx(k / len(cov))


def test_variant_metrics_appear_only_with_their_variant():
    logp, old, adv, mask = random_inputs(0)
    _, _, met = loss_and_grad("ppo_clip", logp, old, adv, mask)
    assert not set(algo.VARIANT_METRICS.values()) & set(met)
    for kind, name in [("gspo", "seq_clip_frac"), ("cispo", "weight_clip_frac"), ("kl_cov", "cov_selected_frac")]:
        _, _, met = loss_and_grad(kind, logp, old, adv, mask)
        assert set(algo.VARIANT_METRICS.values()) & set(met) == {name}


# ----------------------------------------------------------------------------------------
# Split invariance: the sequence- and token-local losses do not depend on the micro-batches;
# Clip-Cov / KL-Cov select among the tokens of one call, so they do (as in verl)
# ----------------------------------------------------------------------------------------

def split_grad(kind, n_micro, options=None, agg="token_mean"):
    from tests.test_algo import tiny_policy_batch
    weight, ids, mask, old, adv = tiny_policy_batch()
    weight.requires_grad_()
    counts = {"num_tokens": mask.sum(), "num_seqs": (mask.sum(-1) > 0).sum()}
    for rows in torch.arange(ids.shape[0]).chunk(n_micro):
        logp = algo.logprobs_from_logits(weight[ids[rows, :-1]], ids[rows, 1:])
        loss, _ = algo.policy_loss(logp, old[rows], adv[rows], mask[rows], eps_low=0.2, eps_high=0.28, agg=agg,
                                   kind=kind, options=options, **counts)
        loss.backward()
    return weight.grad


@pytest.mark.parametrize("kind, options", [("gspo", {"eps_low": 0.05, "eps_high": 0.05}), ("cispo", None),
                                           ("ppo_clip", None)])
@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
def test_token_and_sequence_local_losses_are_split_invariant(kind, options, agg):
    full = split_grad(kind, 1, options, agg)
    assert full.abs().sum() > 0
    for n in (2, 8):
        torch.testing.assert_close(split_grad(kind, n, options, agg), full, rtol=1e-12, atol=1e-14)


def test_kl_cov_depends_on_the_split():
    opts = {"ratio": 0.05, "coef": 5.0}
    full, split = split_grad("kl_cov", 1, opts), split_grad("kl_cov", 8, opts)
    assert (split - full).abs().max() > 1e-3 * full.abs().max()


@pytest.mark.parametrize("extra", [{"algo.policy_loss": "gspo", "algo.gspo.eps_low": 0.02, "algo.gspo.eps_high": 0.02},
                                   {"algo.policy_loss": "cispo", "algo.cispo.eps_high": 0.01}], ids=["gspo", "cispo"])
def test_update_with_gspo_and_cispo_is_invariant_to_the_micro_batch_split(extra):
    from tests.test_train import _one_update
    ref_steps, ref_delta = _one_update(16, extra=extra)
    steps, delta = _one_update(2, extra=extra)
    assert steps[0].loss == pytest.approx(ref_steps[0].loss, rel=1e-5, abs=1e-7)
    key = {"gspo": "seq_clip_frac", "cispo": "weight_clip_frac"}[extra["algo.policy_loss"]]
    assert getattr(steps[0], key) == pytest.approx(getattr(ref_steps[0], key), rel=1e-6) and getattr(steps[0], key) > 0
    for k in ref_delta:
        torch.testing.assert_close(delta[k], ref_delta[k], rtol=1e-4, atol=1e-6)


# ----------------------------------------------------------------------------------------
# group_token_mean and the top-entropy token mask
# ----------------------------------------------------------------------------------------

def test_group_token_mean_hand():
    # groups of two rows: group 0 has 3 + 1 tokens with values 1,2,3 | 4 → 10/4; group 1 has 2 + 0 tokens
    # with values 6, 8 → 7; mean over the two groups = (2.5 + 7) / 2 = 4.75 (token_mean: 24/6 = 4).
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [6.0, 8.0, 0.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    groups = torch.tensor([0, 0, 1, 1])
    assert algo.aggregate(values, mask, "group_token_mean", groups=groups).item() == pytest.approx(4.75)
    # the step's counts given instead (e.g. rows 2, 3 of a larger step): the same number
    gt = torch.tensor([4.0, 4.0, 2.0, 2.0])
    assert algo.aggregate(values, mask, "group_token_mean", group_tokens=gt, num_groups=2).item() == pytest.approx(4.75)
    with pytest.raises(ValueError, match="needs groups"):
        algo.aggregate(values, mask, "group_token_mean")


@pytest.mark.parametrize("seed", SEEDS)
def test_group_token_mean_is_token_mean_when_every_group_has_the_same_token_count(seed):
    gen = torch.Generator().manual_seed(seed)
    values = torch.randn(6, 5, generator=gen, dtype=torch.float64)
    mask = torch.zeros(6, 5, dtype=torch.float64)
    for g in range(3):                      # each group: 6 tokens, split unevenly over its two rows
        k = int(torch.randint(1, 5, (1,), generator=gen))
        mask[2 * g, :k], mask[2 * g + 1, :6 - k] = 1.0, 1.0
    got = algo.aggregate(values, mask, "group_token_mean", groups=torch.arange(6) // 2)
    assert got.item() == pytest.approx(algo.aggregate(values, mask, "token_mean").item(), rel=1e-12)


def test_top_entropy_mask_hand():
    ent = torch.tensor([[0.5, 2.0, 1.0, 9.0], [3.0, 0.1, 2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])    # T = 7; the 9.0 is padding
    keep = algo.top_entropy_mask(ent, mask, 0.2)                           # ⌈1.4⌉ = 2: 3.0 and the first 2.0
    assert keep.tolist() == [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]
    keep = algo.top_entropy_mask(ent, mask, 0.5)                           # ⌈3.5⌉ = 4: 3.0, 2.0, 2.0, 1.0
    assert keep.tolist() == [[0.0, 1.0, 1.0, 0.0], [1.0, 0.0, 1.0, 0.0]]
    assert torch.equal(algo.top_entropy_mask(ent, mask, 1.0), mask)        # ρ = 1: the identity
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        algo.top_entropy_mask(ent, mask, 0.0)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("q", [0.05, 0.2, 0.8])
def test_top_entropy_mask_keeps_ceil_q_t_of_the_highest(seed, q):
    gen = torch.Generator().manual_seed(seed)
    ent = torch.rand(7, 9, generator=gen)
    mask = (torch.rand(7, 9, generator=gen) > 0.3).float()
    keep = algo.top_entropy_mask(ent, mask, q)
    T = int(mask.sum())
    assert int(keep.sum()) == math.ceil(round(q * T, 9)) and (keep <= mask).all()
    if keep.sum() < T:
        assert ent[keep == 1].min() >= ent[(mask == 1) & (keep == 0)].max()


def test_group_token_mean_update_is_invariant_to_the_split():
    from tests.test_train import _one_update
    ref_steps, ref_delta = _one_update(16, agg="group_token_mean", drop=(3,))
    steps, delta = _one_update(4, agg="group_token_mean", drop=(3,))
    assert steps[0].loss == pytest.approx(ref_steps[0].loss, rel=1e-5, abs=1e-7)
    for k in ref_delta:
        torch.testing.assert_close(delta[k], ref_delta[k], rtol=1e-4, atol=1e-6)


def test_clip_cov_update_is_seeded():
    from tests.test_train import _one_update
    extra = {"algo.policy_loss": "clip_cov", "algo.clip_cov.ratio": 0.1, "algo.clip_cov.lb": -1.0,
             "algo.clip_cov.ub": 1.0}
    a_steps, a = _one_update(4, extra=extra)
    b_steps, b = _one_update(4, extra=extra)
    assert a_steps[0].cov_selected_frac > 0 and a_steps[0].cov_selected_frac == b_steps[0].cov_selected_frac
    for k in a:
        assert torch.equal(a[k], b[k])


# ----------------------------------------------------------------------------------------
# Dynamic sampling's modes (refill / filter / mask), the accuracy band, and data.drop_solved
# ----------------------------------------------------------------------------------------

# five groups of G = 4 with 0, 1, 2, 3, 4 correct: accuracies 0, .25, .5, .75, 1
FIVE = torch.tensor([[False] * 4, [True, False, False, False], [True, True, False, False],
                     [True, True, True, False], [True] * 4])


def test_dynamic_sampling_keep_hand():
    for mode in ("refill", "filter"):                       # the batch is the band: 0 < acc < 1
        batch, loss = algo.dynamic_sampling_keep(FIVE, mode)
        assert batch.tolist() == loss.tolist() == [False, True, True, True, False]
    batch, loss = algo.dynamic_sampling_keep(FIVE, "mask")  # every group stays; the band alone is in the loss
    assert batch.tolist() == [True] * 5 and loss.tolist() == [False, True, True, True, False]
    # the band is exclusive: (0.25, 0.75) keeps only acc 0.5; (0.2, 0.8) keeps .25, .5, .75; (0, 0.6) keeps .25, .5
    assert algo.informative_groups(FIVE, 0.25, 0.75).tolist() == [False, False, True, False, False]
    assert algo.informative_groups(FIVE, 0.2, 0.8).tolist() == [False, True, True, True, False]
    assert algo.informative_groups(FIVE, 0.0, 0.6).tolist() == [False, True, True, False, False]
    assert torch.equal(algo.informative_groups(FIVE), algo.informative_groups(FIVE, 0.0, 1.0))
    with pytest.raises(ValueError, match=r"valid: \['refill', 'filter', 'mask'\]"):
        algo.dynamic_sampling_keep(FIVE, "resample")


def test_mask_groups_zeroes_whole_groups():
    mask = torch.ones(6, 3)                                   # B = 3 groups of G = 2 rows
    out = algo.mask_groups(mask, torch.tensor([True, False, True]))
    assert out.sum(-1).tolist() == [3.0, 3.0, 0.0, 0.0, 3.0, 3.0]
    assert algo.mask_groups(mask, None) is mask


@pytest.mark.parametrize("agg, scale", [("token_mean", 12 / 6), ("seq_mean_token_mean", 6 / 4),
                                        ("group_token_mean", 3 / 2)])
def test_mask_scales_the_step_loss_by_the_counts_it_removes(agg, scale):
    # Three groups of G = 2 with rewards (1, -1), (1, 1), (-1, 1): the middle group is all correct, Â = 0.
    # Rows have 2, 1 | 3, 3 | 1, 2 tokens (T = 12; the masked group holds 6 of them, 2 sequences, 1 group).
    # With logp = old (r = 1) ℓ = -Â per token, Â = ±1/√2 (std of (1, -1) is √2):
    # Σ ℓ·m = -(2 - 1)/√2 - (-1 + 2)/√2 = -√2, the same with or without the mask (Â = 0 there), so
    # token_mean's loss grows by T_all / T_kept = 12 / 6, the sequence mean's by 6 / 4, the group mean's by 3 / 2.
    rewards = torch.tensor([[1.0, -1.0], [1.0, 1.0], [-1.0, 1.0]], dtype=torch.float64)
    adv = algo.group_advantages(rewards).reshape(-1)
    lengths = [2, 1, 3, 3, 1, 2]
    mask = torch.tensor([[1.0] * n + [0.0] * (3 - n) for n in lengths], dtype=torch.float64)
    logp = torch.full((6, 3), -1.0, dtype=torch.float64)
    in_loss = algo.dynamic_sampling_keep(rewards > 0, "mask")[1]
    assert in_loss.tolist() == [True, False, True]
    groups = torch.arange(6) // 2
    kw = dict(eps_low=0.2, eps_high=0.28, agg=agg)
    full, _ = algo.policy_loss(logp, logp, adv, mask, **_group_kw(agg, mask, groups), **kw)
    masked_mask = algo.mask_groups(mask, in_loss)
    masked, _ = algo.policy_loss(logp, logp, adv, masked_mask, **_group_kw(agg, masked_mask, groups), **kw)
    if agg == "token_mean":
        assert full.item() == pytest.approx(-math.sqrt(2) / 12, rel=1e-6)
    assert masked.item() == pytest.approx(full.item() * scale, rel=1e-6)


def _group_kw(agg, mask, groups):
    """group_token_mean's counts (T_g per row, K) of a whole step, as dapo.train.update passes them."""
    if agg != "group_token_mean":
        return {}
    per_group = torch.zeros(int(groups.max()) + 1, dtype=mask.dtype).index_add_(0, groups, mask.sum(-1))
    return {"group_tokens": per_group[groups], "num_groups": float((per_group > 0).sum())}


def _collect(mode, answers, B, **ov):
    """collect_rollouts over scripted groups with dynamic sampling ``mode`` (tests/test_train's fakes)."""
    from dapo.train.rollout import collect_rollouts
    from tests.test_train import ListSampler, ScriptedEngine, _cfg, _examples
    ex = _examples(len(answers))
    tokens = {(e.source, e.index): [e.index] for e in ex}
    cfg = _cfg(**{"train.batch_prompts": B, "algo.dynamic_sampling.mode": mode, **ov})
    engine = ScriptedEngine(answers)
    batch = collect_rollouts(engine, ListSampler(ex, cfg.gen_batch_prompts), tokens, cfg, 1)
    return batch, engine, cfg


# prompts 0, 1: all correct / all wrong; 2: one of four correct (acc .25); 3: three of four (acc .75)
SCRIPT = {0: ["7"] * 4, 1: ["1"] * 4, 2: ["7", "1", "1", "1"], 3: ["7", "7", "7", "2"]}


def test_filter_drops_the_flat_groups_and_never_runs_a_second_round():
    # B = 4, one round of 4 prompts (no oversampling, even with on_exhausted = error): groups 2, 3 stay
    batch, engine, cfg = _collect("filter", SCRIPT, 4, **{"algo.dynamic_sampling.on_exhausted": "error"})
    assert cfg.gen_batch_prompts == 4 and engine.calls == 1
    s = batch.stats
    assert (s["sampling/gen_rounds"], s["sampling/kept_groups"], s["sampling/discarded_groups"]) == (1, 2, 2)
    assert batch.correct.sum(-1).tolist() == [1, 3] and batch.in_loss is None and "sampling/masked_groups" not in s
    # nothing in the band: an empty batch (no update), not an error and not a second round
    batch, engine, _ = _collect("filter", {0: ["7"] * 4, 1: ["1"] * 4}, 2)
    assert engine.calls == 1 and batch.num_groups == 0 and batch.stats["sampling/skipped_update"] == 1.0


def test_mask_keeps_every_group_and_marks_the_flat_ones_out_of_the_loss():
    batch, engine, _ = _collect("mask", SCRIPT, 4)
    s = batch.stats
    assert engine.calls == 1 and batch.num_groups == 4
    assert batch.in_loss.tolist() == [False, False, True, True]
    assert (s["sampling/kept_groups"], s["sampling/discarded_groups"], s["sampling/masked_groups"]) == (4, 0, 2.0)
    assert s["rollout/acc_mean"] == pytest.approx(8 / 16)     # over the whole batch, masked groups included


def test_the_band_decides_in_every_mode():
    # band (0.3, 1): acc .25 (prompt 2) is out, .75 (prompt 3) in
    band = {"algo.dynamic_sampling.min_acc": 0.3}
    batch, engine, _ = _collect("refill", {**SCRIPT, 4: ["7", "7", "1", "1"]}, 2, **band,
                                **{"algo.dynamic_sampling.gen_batch_prompts": 5})
    assert batch.correct.sum(-1).tolist() == [3, 2] and batch.stats["sampling/discarded_groups"] == 3
    batch, _, _ = _collect("filter", SCRIPT, 4, **band)
    assert batch.correct.sum(-1).tolist() == [3]
    batch, _, _ = _collect("mask", SCRIPT, 4, **band)
    assert batch.in_loss.tolist() == [False, False, False, True] and batch.stats["sampling/masked_groups"] == 3.0


def test_mode_and_band_are_validated():
    for ov, msg in [(["algo.dynamic_sampling.mode=again"], "'refill', 'filter', 'mask'"),
                    (["algo.dynamic_sampling.min_acc=0.6", "algo.dynamic_sampling.max_acc=0.5"], "max_acc"),
                    (["algo.dynamic_sampling.min_acc=-0.1"], "min_acc"),
                    (["algo.dynamic_sampling.enabled=false", "algo.dynamic_sampling.mode=mask"],
                     "need algo.dynamic_sampling.enabled=true")]:
        with pytest.raises(ConfigError, match=msg):
            load_config(None, ov)


def test_mask_mode_update_is_the_unmasked_update_scaled(tmp_path):
    """Through dapo.train.update: masking the Â = 0 groups leaves the gradient's direction and multiplies the
    step loss by T_all / T_kept (plain SGD, one step, so the parameter change scales the same way)."""
    from dapo.train.logprobs import old_logprobs
    from dapo.train.update import Policy, update_policy
    from tests.test_train import _cfg, _random_batch, _tiny_policy
    cfg = _cfg(**{"rollout.n": 4, "train.batch_prompts": 4, "train.mini_batch_prompts": 4,
                  "train.micro_batch_seqs": 4, "algo.dynamic_sampling.enabled": "false", "model.autocast_bf16": "false",
                  "train.grad_clip": 1e9})                       # no clipping: the gradient scales as the loss
    batch = _random_batch()
    batch.rewards[1] = 1.0                                    # group 1 all equal: Â = 0
    in_loss = torch.tensor([True, False, True, True])
    out = {}
    for name, keep in (("all", None), ("mask", in_loss)):
        model = _tiny_policy(0)
        old, _, mask = old_logprobs(model, batch, cfg, 0, torch.device("cpu"), False)
        mask = algo.mask_groups(mask, keep)
        adv = algo.group_advantages(batch.rewards).reshape(-1)
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        steps = update_policy(Policy(model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0),
                                     torch.device("cpu")), batch, old - 0.05, adv, mask, cfg)
        out[name] = (steps[0].loss, {k: model.state_dict()[k] - before[k] for k in before}, float(mask.sum()))
    t_all, t_kept = out["all"][2], out["mask"][2]
    assert t_kept < t_all
    assert out["mask"][0] == pytest.approx(out["all"][0] * t_all / t_kept, rel=1e-5)
    for k, d in out["all"][1].items():
        torch.testing.assert_close(out["mask"][1][k], d * t_all / t_kept, rtol=1e-4, atol=1e-6)


def _pool(n=6):
    from tests.test_train import _examples
    return _examples(n)


def _draw(sampler, k):
    return [[e.index for e in sampler.next_batch()] for _ in range(k)]


def test_drop_solved_leaves_the_epoch_alone_and_the_next_epochs_pool_without_the_solved():
    from dapo.data.sampler import PromptSampler
    ex = _pool(6)
    plain, dropping = PromptSampler(ex, 2, seed=3), PromptSampler(ex, 2, seed=3, drop_solved=True)
    first = _draw(dropping, 1)[0]
    assert first == _draw(plain, 1)[0]
    for i in first:                                            # both prompts of the first batch solved
        dropping.mark_solved(ex[i])
        plain.mark_solved(ex[i])                               # without drop_solved: nothing happens
    # the rest of epoch 0 is as without drop_solved (every prompt is drawn once per epoch anyway)
    assert _draw(dropping, 2) == _draw(plain, 2)
    assert dropping.pool_stats() == {"sampling/pool_prompts": 6.0, "sampling/solved_prompts": 2.0}
    # epoch 1: permutation(1) without the two solved prompts: 4 prompts, 2 batches, then epoch 2
    epoch1 = _draw(dropping, 2)
    assert dropping.epoch == 1 and dropping.pool_size == 4 and len(dropping) == 2
    assert [i for b in epoch1 for i in b] == [i for i in dropping.permutation(1) if i not in first]
    assert _draw(plain, 3) != epoch1 + _draw(dropping, 0)      # the plain sampler still draws all 6
    assert sorted(i for b in _draw(dropping, 2) for i in b) == sorted(set(range(6)) - set(first))
    assert dropping.epoch == 2
    # the state: the solved and the left-out prompts, only with drop_solved
    assert set(plain.state_dict()) == {"version", "seed", "epoch", "cursor", "num_examples", "fingerprint"}
    assert dropping.state_dict()["solved"] == dropping.state_dict()["left_out"] == sorted(first)


def test_drop_solved_resumes_exactly_from_a_checkpoint(tmp_path):
    """Mid-epoch, with prompts solved in this epoch and before it: a sampler restored from a real
    checkpoint's state.json draws exactly what the uninterrupted one draws, across the next epochs."""
    from dapo.data.sampler import PromptSampler
    from dapo.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
    ex = _pool(8)
    s = PromptSampler(ex, 2, seed=5, drop_solved=True)
    for k in range(6):                                         # epoch 0 (4 batches) and 2 batches of epoch 1
        batch = s.next_batch()
        if k in (0, 4):
            s.mark_solved(batch[0])                            # one solved in epoch 0, one in epoch 1
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    save_checkpoint(tmp_path, 6, model=model, optimizer=opt, scheduler=None, state={"sampler": s.state_dict()})
    state = load_checkpoint(latest_checkpoint(tmp_path), model=model, optimizer=opt)
    resumed = PromptSampler(ex, 2, seed=5, drop_solved=True)
    resumed.load_state_dict(state["sampler"])
    assert (resumed.epoch, resumed.cursor, resumed.pool_size) == (1, 4, 7)
    assert _draw(resumed, 8) == _draw(s, 8)                    # the rest of epoch 1, then epochs of 6
    assert resumed.pool_size == s.pool_size == 6


def test_drop_solved_refuses_a_pool_smaller_than_a_batch():
    from dapo.data.sampler import PromptSampler
    ex = _pool(4)
    s = PromptSampler(ex, 2, seed=0, drop_solved=True)
    drawn = [i for b in _draw(s, 2) for i in b]
    for i in drawn[:3]:
        s.mark_solved(ex[i])
    with pytest.raises(ValueError, match="data.drop_solved: 3 of 4 training prompts are solved, leaving 1"):
        s.next_batch()


def test_collect_rollouts_marks_all_correct_prompts_solved():
    from dapo.data.sampler import PromptSampler
    from dapo.train.rollout import collect_rollouts
    from tests.test_train import ScriptedEngine, _cfg
    ex = _pool(4)
    tokens = {(e.source, e.index): [e.index] for e in ex}
    cfg = _cfg(**{"train.batch_prompts": 2, "algo.dynamic_sampling.mode": "mask", "data.drop_solved": "true"})
    sampler = PromptSampler(ex, cfg.gen_batch_prompts, seed=0, drop_solved=True)
    for r in (1, 2):                                            # epoch 0: all four prompts, two per step
        batch = collect_rollouts(ScriptedEngine(SCRIPT), sampler, tokens, cfg, r)
    assert sampler.state_dict()["solved"] == [0]                # prompt 0: all four correct
    assert batch.stats["sampling/solved_prompts"] == 1.0 and batch.stats["sampling/pool_prompts"] == 4.0
    drawn = []
    for r in (3, 4, 5):                                         # epochs 1, 2, 3 (one batch of 2 each): no prompt 0
        batch = collect_rollouts(ScriptedEngine(SCRIPT), sampler, tokens, cfg, r)
        drawn += [p[0] for p in batch.prompt_ids]
        assert batch.stats["sampling/pool_prompts"] == 3.0
    assert sampler.epoch == 3 and 0 not in drawn and set(drawn) <= {1, 2, 3}


# ----------------------------------------------------------------------------------------
# The analysis names each successor: sweeps/successors-mini.yaml's arms, from its expansion
# ----------------------------------------------------------------------------------------

# arm → the one toggle it switches on against naive GRPO (dapo: DAPO's four techniques of the mini regime)
SUCCESSOR_ARMS = {
    "clip_higher": "clip_higher", "dr_grpo": "dr_grpo", "rloo": "rloo", "batch_std": "batch_std", "gspo": "gspo",
    "cispo": "cispo", "clip_cov": "clip_cov", "kl_cov": "kl_cov", "top_entropy": "top_entropy",
    "group_token_mean": "group_token_mean", "ds_filter": "ds_filter", "ds_mask": "ds_mask",
}


@pytest.fixture(scope="module")
def successors_sweep(tmp_path_factory):
    """(tidy with one point per job, resolved configs by run, SweepInfo) of the successors sweep's expansion."""
    import pandas as pd

    from analysis.runs import SweepInfo, normalize_tidy
    from dapo.sweep.spec import expand, sweep_info
    path = REPO / "sweeps" / "successors-mini.yaml"
    jobs = expand(path, tmp_path_factory.mktemp("successors"))
    rows = [dict(run=j.run_id, run_id=j.run_id, sweep="successors-mini", arm=j.arm, seed=j.seed, rollout_step=0,
                 grad_step=0, time=0.0, metric="train/entropy", value=1.0) for j in jobs]
    return (normalize_tidy(pd.DataFrame(rows)), {j.run_id: to_dict(j.config) for j in jobs},
            SweepInfo.from_dict(sweep_info(path)))


def test_every_successor_arm_is_named_by_its_toggle(successors_sweep):
    from analysis.arms import DAPO_TOGGLES, TOGGLES, baseline_arm, dapo_arm, exact_pairs, find_pair, flat_arm_configs
    from analysis.tables import _isolates, primary_pairs
    tidy, configs, sweep = successors_sweep
    acfg = flat_arm_configs(tidy, sweep, configs)
    assert set(SUCCESSOR_ARMS) | {"grpo", "dapo"} == {a.name for a in sweep.arms}
    assert baseline_arm(tidy, sweep, configs).name == "grpo" and dapo_arm(tidy, sweep, configs).name == "dapo"
    grpo = sweep.arm("grpo")
    for arm, toggle in SUCCESSOR_ARMS.items():
        assert _isolates(grpo, sweep.arm(arm), acfg) == toggle, arm
        p = find_pair(toggle, tidy, sweep, configs)
        assert (p.off.name, p.on.name) == ("grpo", arm) and p.exact, (arm, p.describe())
        assert TOGGLES[toggle].title in p.describe()
    # exactly one exact pair per successor arm, all against naive GRPO; the primary family is the spec's
    # declared one comparison, CISPO vs GRPO
    assert sorted((p.off.name, p.on.name, p.toggle) for p in exact_pairs(tidy, sweep, configs)) == \
        sorted(("grpo", a, t) for a, t in SUCCESSOR_ARMS.items())
    assert [(a.name, b.name) for a, b in primary_pairs(tidy, sweep, configs)] == [("grpo", "cispo")]
    dapo_on = {t for t in TOGGLES if TOGGLES[t].state(acfg["dapo"])}
    assert dapo_on == set(DAPO_TOGGLES) - {"overlong_filter"}   # the mini regime's DAPO: no overlong filter


def test_toggles_of_older_runs_and_the_paper_steps():
    """A config from before the successors' keys has them off (not unknown), so Table 1's pairs and
    the paper's Δ are as before; a successor has no paper step (NaN), unless both arms carry paper values."""
    from analysis.arms import PAPER_STEP, paper_delta, toggle_states
    from analysis.runs import ArmInfo
    old = {"algo.clip.eps_high": 0.2, "algo.clip.eps_low": 0.2, "algo.loss_agg": "seq_mean_token_mean",
           "algo.overlong.filter": False, "algo.overlong.soft_punish": False, "algo.dynamic_sampling.enabled": False}
    dapo = {**old, "algo.clip.eps_high": 0.28, "algo.loss_agg": "token_mean", "algo.overlong.filter": True,
            "algo.overlong.soft_punish": True, "algo.dynamic_sampling.enabled": True}
    states = toggle_states(old, dapo)
    assert {t for t, (a, b) in states.items() if a != b} == set(PAPER_STEP)
    assert all(a is False and b is False for t, (a, b) in states.items() if t not in PAPER_STEP)
    a, b = ArmInfo("grpo"), ArmInfo("gspo")
    flat = {"grpo": old, "gspo": {**old, "algo.policy_loss": "gspo"},
            "clip": {**old, "algo.clip.eps_high": 0.28}, "dapo": dapo}
    assert math.isnan(paper_delta(a, b, flat))
    assert paper_delta(ArmInfo("grpo", paper=30), ArmInfo("gspo", paper=31)) == 1.0   # no configs: the sweep's values
    assert math.isnan(paper_delta(ArmInfo("grpo", paper=30), ArmInfo("gspo", paper=31), flat))   # configs first
    assert paper_delta(a, ArmInfo("dapo"), flat) == sum(PAPER_STEP.values())


def test_paper_delta_only_where_the_paper_ran_the_comparison():
    """Table 1 ran naive GRPO and each prefix of its techniques: a pair of two of those rows gets their
    difference; a technique isolated anywhere else (Clip-Higher without overlong filtering, a 2 × 2's
    dynamic sampling without soft punishment, a staleness arm) gets NaN, so its verdict can only say 'differs'."""
    from analysis.arms import paper_delta, paper_point
    from analysis.runs import ArmInfo
    grpo = {"algo.clip.eps_high": 0.2, "algo.clip.eps_low": 0.2, "algo.loss_agg": "seq_mean_token_mean",
            "algo.overlong.filter": False, "algo.overlong.soft_punish": False, "algo.dynamic_sampling.enabled": False}
    filt = {**grpo, "algo.overlong.filter": True}
    clip = {**filt, "algo.clip.eps_high": 0.28}
    soft = {**clip, "algo.overlong.soft_punish": True}
    tok = {**soft, "algo.loss_agg": "token_mean"}
    dapo = {**tok, "algo.dynamic_sampling.enabled": True}
    assert [paper_point(c) for c in (grpo, filt, clip, soft, tok, dapo)] == [30, 36, 38, 41, 42, 50]
    ds_no_soft = {**dapo, "algo.overlong.soft_punish": False}
    tok_no_soft = {**tok, "algo.overlong.soft_punish": False}
    flat = {"grpo": grpo, "filt": filt, "clip": clip, "clip_alone": {**grpo, "algo.clip.eps_high": 0.28},
            "tok": tok, "dapo": dapo, "tok_no_soft": tok_no_soft, "ds_no_soft": ds_no_soft,
            "dapo_stale": {**dapo, "train.staleness": 2}, "dapo_no_filter": {**dapo, "algo.overlong.filter": False}, "dapo_other_lr": {**dapo, "optim.lr": 2e-6}}
    d = lambda a, b: paper_delta(ArmInfo(a), ArmInfo(b), flat)  # noqa: E731
    assert (d("filt", "clip"), d("tok", "dapo"), d("grpo", "dapo"), d("clip", "tok")) == (2.0, 8.0, 20.0, 4.0)
    assert paper_point(ds_no_soft) is None and paper_point(flat["clip_alone"]) is None
    no_filter = {**dapo, "algo.overlong.filter": False}          # the final DAPO run: the punishment alone
    assert paper_point(no_filter) == 50 and d("grpo", "dapo_no_filter") == 20.0
    assert math.isnan(d("dapo", "dapo_no_filter"))               # one row of Table 1 twice: no comparison
    for a, b in (("grpo", "clip_alone"), ("tok_no_soft", "ds_no_soft"), ("dapo", "dapo_stale"),
                 ("dapo", "dapo_other_lr")):
        assert math.isnan(d(a, b)), (a, b)


@pytest.mark.slow
def test_runs_with_filter_and_mask_and_drop_solved(tmp_path):
    """tiny-random-smoke on the transformers engine (a random model: every group all wrong), two steps
    each: filter keeps nothing in one round and skips the update; mask trains on every group with all
    of them masked; drop_solved logs its pool and checkpoints the sampler's solved set."""
    import json
    import os
    import subprocess
    import sys

    from mlflow.tracking import MlflowClient
    tiny = ["rollout.engine=hf", "rollout.n=2", "rollout.max_new_tokens=4", "train.batch_prompts=2",
            "train.mini_batch_prompts=1", "train.micro_batch_seqs=2", "train.threads=1", "eval.every=0",
            "eval.at_start=false", "data.train_limit=16", "logging.progress=false", "train.rollout_steps=2",
            "checkpoint.every=1", "algo.dynamic_sampling.enabled=true", "data.drop_solved=true"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    for mode in ("filter", "mask"):
        out = tmp_path / mode
        p = subprocess.run([sys.executable, "-m", "dapo.cli", "train", "experiments/tiny-random-smoke.yaml", *tiny,
                            f"algo.dynamic_sampling.mode={mode}", f"output_dir={out}",
                            f"logging.tracking_uri=sqlite:///{out / 'mlruns.db'}", "--run-dir", str(out / "run")],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
        summary = json.loads((out / "run" / "summary.json").read_text())
        client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlruns.db'}")
        hist = {k: [m.value for m in client.get_metric_history(summary["mlflow_run_id"], k)]
                for k in ("sampling/gen_rounds", "sampling/kept_groups", "sampling/discarded_groups",
                          "sampling/masked_groups", "sampling/skipped_update", "sampling/pool_prompts",
                          "sampling/solved_prompts")}
        assert hist["sampling/gen_rounds"] == [1.0, 1.0] and hist["sampling/pool_prompts"] == [16.0, 16.0]
        if mode == "filter":      # nothing in the band: no group kept, no update, no masked_groups
            assert hist["sampling/kept_groups"] == [0.0, 0.0] and hist["sampling/discarded_groups"] == [2.0, 2.0]
            assert hist["sampling/skipped_update"] == [1.0, 1.0] and hist["sampling/masked_groups"] == []
            assert summary["grad_steps"] == 0
        else:                     # every group in the batch, every one masked, the optimizer steps still taken
            assert hist["sampling/kept_groups"] == [2.0, 2.0] and hist["sampling/masked_groups"] == [2.0, 2.0]
            assert summary["grad_steps"] == 2 * 2
        state = json.loads((out / "run" / "checkpoints" / "step_000002" / "state.json").read_text())
        assert state["sampler"]["solved"] == [] and state["sampler"]["left_out"] == []
