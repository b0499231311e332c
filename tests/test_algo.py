"""dapo.algo, each formula three ways: hand-derived numbers, a slow reference
written from the paper's equations (python loops over tokens) on random inputs, and
invariances. Plus gradient flow and edge cases."""

import itertools
import math
import statistics

import pytest
import torch

from dapo import algo

torch.set_default_dtype(torch.float32)
SEEDS = [0, 1, 2, 3]
EPS_LOW, EPS_HIGH = 0.2, 0.28


def ragged_mask(n, l, gen, empty_rows=()):
    """[n, l] 0/1 float64 mask with random lengths in 1..l; rows in empty_rows fully masked."""
    lengths = torch.randint(1, l + 1, (n,), generator=gen)
    mask = (torch.arange(l)[None, :] < lengths[:, None]).double()
    for i in empty_rows:
        mask[i] = 0.0
    return mask


def random_batch(seed, n=8, l=12, empty_rows=()):
    """logp, old_logp: [n, l] float64 with ratios spread over both clip edges; adv: [n]."""
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, l, generator=gen, dtype=torch.float64) * 4  # log-probs in (-4, 0]
    logp = old + 0.4 * torch.randn(n, l, generator=gen, dtype=torch.float64)  # r ≈ e^{±0.4}
    adv = torch.randn(n, generator=gen, dtype=torch.float64)
    return logp, old, adv, ragged_mask(n, l, gen, empty_rows)


# ----------------------------------------------------------------------------------------
# group_advantages
# ----------------------------------------------------------------------------------------

def test_group_advantages_hand():
    # R = [1, -1, -1, -1]: mean = -0.5; deviations [1.5, -0.5, -0.5, -0.5];
    # unbiased var = (1.5² + 3·0.5²) / (4-1) = (2.25 + 0.75) / 3 = 1 -> std = 1.
    # Â = dev / (1 + 1e-6).
    adv = algo.group_advantages(torch.tensor([[1.0, -1.0, -1.0, -1.0]]))
    expected = torch.tensor([[1.5, -0.5, -0.5, -0.5]]) / (1 + 1e-6)
    torch.testing.assert_close(adv, expected, rtol=1e-7, atol=0)


@pytest.mark.parametrize("seed", SEEDS)
def test_group_advantages_reference(seed):
    # Straight from the definition, per group with python's statistics.stdev (n-1).
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randn(5, 7, generator=gen, dtype=torch.float64)
    adv = algo.group_advantages(rewards, eps=1e-6)
    for b, group in enumerate(rewards.tolist()):
        mu, sd = statistics.fmean(group), statistics.stdev(group)
        for g, r in enumerate(group):
            assert adv[b, g].item() == pytest.approx((r - mu) / (sd + 1e-6), rel=1e-12)


def test_group_advantages_shift_invariant():
    # Â depends on R only through R − mean and std: adding a constant changes nothing.
    rewards = torch.randn(4, 16, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    torch.testing.assert_close(algo.group_advantages(rewards + 3.0), algo.group_advantages(rewards))


def test_group_advantages_zero_variance_and_single_sample():
    # constant groups (including values like 0.1 whose mean is inexact) -> exactly 0, never NaN
    rewards = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0], [0.1, 0.1, 0.1], [1.0, -1.0, 1.0]])
    adv = algo.group_advantages(rewards)
    assert torch.equal(adv[:3], torch.zeros(3, 3))
    assert adv[3].abs().min() > 0
    # G = 1: no baseline, no signal
    single = algo.group_advantages(torch.tensor([[1.0], [-1.0]]))
    assert torch.equal(single, torch.zeros(2, 1))
    # integer rewards are accepted
    assert algo.group_advantages(torch.tensor([[1, 0]])).dtype == torch.get_default_dtype()


# ----------------------------------------------------------------------------------------
# aggregate
# ----------------------------------------------------------------------------------------

HAND_VALUES = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0]])
HAND_MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    "mode, kwargs, expected",
    [
        # tokens 1+2+3+4 = 10 over 4 tokens
        ("token_mean", {}, 10 / 4),
        # the optimizer step holds 20 tokens in all: 10 / 20
        ("token_mean", {"num_tokens": 20}, 10 / 20),
        # per-seq means (1+2+3)/3 = 2 and 4/1 = 4; mean over 2 seqs = 3
        ("seq_mean_token_mean", {}, 3.0),
        # same sum of per-seq means (6) over 6 sequences in the step
        ("seq_mean_token_mean", {"num_seqs": 6}, 1.0),
        # per-seq sums 6 and 4; mean = 5
        ("seq_mean_token_sum", {}, 5.0),
        # Dr.GRPO: 10 / (2 rows · L=4)
        ("seq_mean_token_sum_const", {}, 10 / 8),
        # 10 / (2 rows · 100)
        ("seq_mean_token_sum_const", {"norm_const": 100}, 10 / 200),
        ("seq_mean_token_sum_const", {"num_seqs": 5, "norm_const": 2}, 10 / 10),
    ],
)
def test_aggregate_hand(mode, kwargs, expected):
    assert algo.aggregate(HAND_VALUES, HAND_MASK, mode, **kwargs).item() == pytest.approx(expected, rel=1e-7)


@pytest.mark.parametrize(
    "mode, expected, old_convention",
    [
        # a third, fully masked row (an overlong-filtered response) whose values would add 9s:
        # it counts neither in the sum nor in S; counting it (S = all 3 rows) gave 2/3 of the value
        ("seq_mean_token_mean", (2 + 4) / 2, (2 + 4) / 3),
        ("seq_mean_token_sum", (6 + 4) / 2, (6 + 4) / 3),
        ("seq_mean_token_sum_const", 10 / (2 * 4), 10 / (3 * 4)),
        ("token_mean", 10 / 4, 10 / 4),   # T counts tokens: the row never counted
    ],
)
def test_fully_masked_rows_are_not_sequences(mode, expected, old_convention):
    values = torch.cat([HAND_VALUES, torch.full((1, 4), 9.0)])
    mask = torch.cat([HAND_MASK, torch.zeros(1, 4)])
    assert algo.aggregate(values, mask, mode).item() == pytest.approx(expected, rel=1e-7)
    # what dapo.train.update passes as num_seqs: rows with >= 1 loss token (the value above) ...
    assert algo.aggregate(values, mask, mode, num_seqs=(mask.sum(-1) > 0).sum()).item() == pytest.approx(expected)
    # ... not all rows: that scaled the loss by 1 - (filtered fraction)
    assert algo.aggregate(values, mask, mode, num_seqs=3).item() == pytest.approx(old_convention, rel=1e-7)


def reference_aggregate(values, mask, mode):
    """Loops over tokens, from the definitions (rows with no token do not count as sequences)."""
    vals, msk = values.tolist(), mask.tolist()
    seqs = [[v for v, m in zip(vr, mr) if m] for vr, mr in zip(vals, msk)]
    tokens = [v for s in seqs for v in s]
    nonempty = [s for s in seqs if s]
    if mode == "token_mean":
        return sum(tokens) / len(tokens)
    if mode == "seq_mean_token_mean":
        return sum(sum(s) / len(s) for s in nonempty) / len(nonempty)
    if mode == "seq_mean_token_sum":
        return sum(sum(s) for s in nonempty) / len(nonempty)
    if mode == "seq_mean_token_sum_const":
        return sum(tokens) / (len(nonempty) * len(vals[0]))
    if mode == "group_token_mean":  # groups of two consecutive rows (group_kw)
        groups = [seqs[i] + seqs[i + 1] for i in range(0, len(seqs), 2)]
        groups = [g for g in groups if g]
        return sum(sum(g) / len(g) for g in groups) / len(groups)
    raise AssertionError(mode)


def group_kw(mode, n):
    """group_token_mean needs the group of each row: two consecutive rows per group."""
    return {"groups": torch.arange(n) // 2} if mode == "group_token_mean" else {}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode", sorted(algo.AGG_MODES))
def test_aggregate_reference(seed, mode):
    gen = torch.Generator().manual_seed(seed)
    values = torch.randn(6, 9, generator=gen, dtype=torch.float64)
    mask = ragged_mask(6, 9, gen, empty_rows=(seed % 6,))
    got = algo.aggregate(values, mask, mode, **group_kw(mode, 6)).item()
    assert got == pytest.approx(reference_aggregate(values, mask, mode), rel=1e-12)


@pytest.mark.parametrize("mode", sorted(algo.AGG_MODES))
def test_aggregate_ignores_garbage_and_empty(mode):
    # masked entries may hold inf/NaN (padding); they must not leak into value or gradient
    values = HAND_VALUES.clone()
    values[0, 3], values[1, 1], values[1, 2] = float("nan"), float("inf"), -float("inf")
    values.requires_grad_()
    out = algo.aggregate(values, HAND_MASK, mode, **group_kw(mode, 2))
    out.backward()
    assert out.item() == pytest.approx(algo.aggregate(HAND_VALUES, HAND_MASK, mode, **group_kw(mode, 2)).item())
    assert torch.isfinite(values.grad).all() and (values.grad[HAND_MASK == 0] == 0).all()
    # everything masked -> 0 (not NaN), with a zero gradient
    empty = torch.zeros_like(HAND_MASK)
    v = HAND_VALUES.clone().requires_grad_()
    out = algo.aggregate(v, empty, mode, **group_kw(mode, 2))
    out.backward()
    assert out.item() == 0.0 and torch.equal(v.grad, torch.zeros_like(v))


def test_aggregate_unknown_mode_lists_valid_names():
    with pytest.raises(ValueError, match="seq_mean_token_mean") as err:
        algo.aggregate(HAND_VALUES, HAND_MASK, "token-mean")
    assert all(name in str(err.value) for name in algo.AGG_MODES)


# ----------------------------------------------------------------------------------------
# policy_loss: hand-derived
# ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "ratio, adv, dual_c, loss, grad",
    [
        # A>0, r=1.5 > 1.28: min(1.5·1, 1.28·1) = 1.28 -> ℓ = -1.28, clipped: no gradient
        (1.5, 1.0, None, -1.28, 0.0),
        # A>0, r=0.5: min(0.5, clip(0.5)=0.8) = 0.5 -> ℓ = -0.5; dℓ/dlogp = -r·A = -0.5
        (0.5, 1.0, None, -0.5, -0.5),
        # A>0, r=1.1 inside the band: ℓ = -1.1·2 = -2.2; dℓ/dlogp = -r·A = -2.2
        (1.1, 2.0, None, -2.2, -2.2),
        # A<0, r=0.5 < 0.8: min(-0.5, -0.8) = -0.8 -> ℓ = 0.8, clipped: no gradient
        (0.5, -1.0, None, 0.8, 0.0),
        # A<0, r=1.5: min(-1.5, -1.28) = -1.5 -> ℓ = 1.5 (never clipped above); grad -r·A = 1.5
        (1.5, -1.0, None, 1.5, 1.5),
        # dual clip c=3, A=-1, r=5: ℓ = 5 > c·|A| = 3 -> capped at 3, no gradient
        (5.0, -1.0, 3.0, 3.0, 0.0),
        # dual clip c=3, A=-2, r=1.5: ℓ = 3 < c·|A| = 6 -> untouched; grad -r·A = 3
        (1.5, -2.0, 3.0, 3.0, 3.0),
        # dual clip never touches A>0: r=5, A=1 -> ℓ = -1.28 as without it
        (5.0, 1.0, 3.0, -1.28, 0.0),
    ],
)
def test_policy_loss_hand(ratio, adv, dual_c, loss, grad):
    old = torch.tensor([[math.log(0.2)]], dtype=torch.float64)
    logp = (old + math.log(ratio)).requires_grad_()
    out, _ = algo.policy_loss(
        logp, old, torch.tensor([adv], dtype=torch.float64), torch.ones(1, 1, dtype=torch.float64),
        eps_low=EPS_LOW, eps_high=EPS_HIGH, dual_clip_c=dual_c,
    )
    out.backward()
    assert out.item() == pytest.approx(loss, rel=1e-12)
    assert logp.grad.item() == pytest.approx(grad, rel=1e-12, abs=1e-15)


def test_policy_loss_metrics_hand():
    # 4 real tokens + 1 padding token (ratio 9, must be ignored). Probabilities exp(logp):
    #   t0: old 0.1 -> new 0.2 (r=2.0),  A=+1  -> up-clipped (r > 1.28, A > 0)
    #   t1: old 0.2 -> new 0.3 (r=1.5),  A=+1  -> up-clipped
    #   t2: old 0.5 -> new 0.2 (r=0.4),  A=-1  -> low-clipped (r < 0.8, A < 0); ℓ=0.8 < 3
    #   t3: old 0.1 -> new 0.5 (r=5.0),  A=-1  -> ℓ = 5 > c·|A| = 3: dual clip active
    # clip_frac_high = 2/4, clip_frac_low = 1/4, dual_clip_frac = 1/4
    # up_clipped_prob_mean = (0.2 + 0.3)/2 = 0.25, count 2
    # ratio_mean = (2 + 1.5 + 0.4 + 5)/4 = 2.225, ratio_max = 5
    # approx_kl = mean(r - 1 - ln r); token_prob_mean = (0.2+0.3+0.2+0.5)/4 = 0.3
    old = torch.log(torch.tensor([[0.1, 0.2, 0.5, 0.1, 0.01]], dtype=torch.float64))
    new = torch.log(torch.tensor([[0.2, 0.3, 0.2, 0.5, 0.09]], dtype=torch.float64))
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, 1.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    loss, m = algo.policy_loss(new, old, adv, mask, eps_low=EPS_LOW, eps_high=EPS_HIGH, dual_clip_c=3.0)
    # ℓ = [-1.28, -1.28, 0.8, 3.0] -> token mean = 1.24 / 4
    assert loss.item() == pytest.approx((-1.28 - 1.28 + 0.8 + 3.0) / 4, rel=1e-12)
    ratios = [2.0, 1.5, 0.4, 5.0]
    expected = {
        "clip_frac_high": 0.5, "clip_frac_low": 0.25, "dual_clip_frac": 0.25,
        "up_clipped_prob_mean": 0.25, "up_clipped_count": 2.0,
        "ratio_mean": 2.225, "ratio_max": 5.0, "token_prob_mean": 0.3,
        "approx_kl": sum(r - 1 - math.log(r) for r in ratios) / 4,
    }
    assert set(m) == set(expected)
    for key, value in expected.items():
        assert isinstance(m[key], float), key
        assert m[key] == pytest.approx(value, rel=1e-6), key


def test_policy_loss_on_policy():
    # r = 1 everywhere (first mini-batch of a rollout): nothing clips, ℓ = -Â,
    # loss = -Σ Â·m / Σ m, approx_kl = 0, ratio stats 1.
    logp, _, adv, mask = random_batch(0)
    loss, m = algo.policy_loss(logp, logp.clone(), adv, mask, eps_low=EPS_LOW, eps_high=EPS_HIGH, dual_clip_c=10.0)
    expected = -(adv[:, None] * mask).sum() / mask.sum()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-12)
    assert m["clip_frac_high"] == m["clip_frac_low"] == m["dual_clip_frac"] == m["approx_kl"] == 0.0
    assert m["ratio_mean"] == m["ratio_max"] == 1.0 and m["up_clipped_prob_mean"] == 0.0


# ----------------------------------------------------------------------------------------
# policy_loss: slow reference from the paper's equations
# ----------------------------------------------------------------------------------------

def reference_objective(logp, old, adv, mask, eps_low, eps_high, dual_c, level):
    """-J with J from DAPO Eq. 8 (level='token': 1/Σ|o_i| Σ_i Σ_t) or GRPO Eq. 5
    (level='seq': 1/G Σ_i 1/|o_i| Σ_t), per token min(r Â, clip(r, 1-εl, 1+εh) Â), and verl's
    dual clip for Â<0. Also counts clipped tokens. Pure python loops."""
    per_seq, n_tok, counts = [], 0, {"high": 0, "low": 0, "dual": 0}
    for i in range(len(logp)):
        terms = []
        for t in range(len(logp[i])):
            if not mask[i][t]:
                continue
            r, a = math.exp(logp[i][t] - old[i][t]), adv[i]
            r_clip = min(max(r, 1 - eps_low), 1 + eps_high)
            ell = -min(r * a, r_clip * a)
            counts["high"] += r > 1 + eps_high and a > 0
            counts["low"] += r < 1 - eps_low and a < 0
            if dual_c is not None and a < 0:
                counts["dual"] += ell > dual_c * -a
                ell = min(ell, dual_c * -a)
            terms.append(ell)
        n_tok += len(terms)
        if terms:
            per_seq.append(terms)
    if level == "token":
        loss = sum(sum(s) for s in per_seq) / n_tok
    else:
        loss = sum(sum(s) / len(s) for s in per_seq) / len(per_seq)
    return loss, {k: v / n_tok for k, v in counts.items()}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dual_c", [None, 1.5])
@pytest.mark.parametrize("agg, level", [("token_mean", "token"), ("seq_mean_token_mean", "seq")])
def test_policy_loss_reference(seed, dual_c, agg, level):
    logp, old, adv, mask = random_batch(seed, empty_rows=(seed,))
    loss, m = algo.policy_loss(logp, old, adv, mask, eps_low=EPS_LOW, eps_high=EPS_HIGH, dual_clip_c=dual_c, agg=agg)
    ref, frac = reference_objective(logp.tolist(), old.tolist(), adv.tolist(), mask.tolist(), EPS_LOW, EPS_HIGH, dual_c, level)
    assert loss.item() == pytest.approx(ref, rel=1e-12)
    assert frac["high"] > 0 and frac["low"] > 0  # the random batch exercises both clips
    assert m["clip_frac_high"] == pytest.approx(frac["high"])
    assert m["clip_frac_low"] == pytest.approx(frac["low"])
    assert m["dual_clip_frac"] == pytest.approx(frac["dual"])
    if dual_c is not None:
        assert frac["dual"] > 0


@pytest.mark.parametrize("seed", SEEDS)
def test_policy_loss_gradient_reference(seed):
    # dℓ/dlogp = -r·Â where the unclipped term is the min (r·Â ≤ clip(r)·Â), else 0;
    # token_mean divides by the token count T.
    logp, old, adv, mask = random_batch(seed)
    logp.requires_grad_()
    loss, _ = algo.policy_loss(logp, old, adv, mask, eps_low=EPS_LOW, eps_high=EPS_HIGH)
    loss.backward()
    r = (logp.detach() - old).exp()
    a = adv[:, None].expand_as(r)
    unclipped = r * a <= r.clamp(1 - EPS_LOW, 1 + EPS_HIGH) * a
    expected = torch.where(unclipped, -r * a, torch.zeros_like(r)) * mask / mask.sum()
    torch.testing.assert_close(logp.grad, expected, rtol=1e-12, atol=1e-15)


def test_policy_loss_token_and_row_advantages_agree():
    logp, old, adv, mask = random_batch(5)
    a, ma = algo.policy_loss(logp, old, adv, mask, eps_low=EPS_LOW, eps_high=EPS_HIGH, dual_clip_c=3.0)
    b, mb = algo.policy_loss(logp, old, adv[:, None].expand_as(logp), mask, eps_low=EPS_LOW, eps_high=EPS_HIGH, dual_clip_c=3.0)
    assert a.item() == b.item() and ma == mb


# ----------------------------------------------------------------------------------------
# policy_loss: gradient flow and edge cases
# ----------------------------------------------------------------------------------------

def test_policy_loss_gradient_flow():
    logp, old, adv, mask = random_batch(1)
    logp, old, adv = logp.requires_grad_(), old.requires_grad_(), adv.requires_grad_()
    loss, _ = algo.policy_loss(logp, old, adv, mask, eps_low=EPS_LOW, eps_high=EPS_HIGH, dual_clip_c=3.0)
    loss.backward()
    assert old.grad is None and adv.grad is None  # detached inside
    assert logp.grad is not None and logp.grad.abs().sum() > 0
    assert (logp.grad[mask == 0] == 0).all()


def test_policy_loss_fully_masked():
    # padding holds wild but finite log-probs; an all-padding batch gives loss 0 and zero grads
    logp, old, adv, _ = random_batch(2)
    logp = (logp * 1e3).requires_grad_()
    loss, m = algo.policy_loss(logp, old, adv, torch.zeros_like(logp), eps_low=EPS_LOW, eps_high=EPS_HIGH, dual_clip_c=3.0)
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(logp.grad, torch.zeros_like(logp))
    assert all(v == 0.0 for v in m.values())
    # one fully masked row among real ones changes nothing about the others
    logp, old, adv, mask = random_batch(3, empty_rows=(0,))
    ref, _ = algo.policy_loss(logp[1:], old[1:], adv[1:], mask[1:], eps_low=EPS_LOW, eps_high=EPS_HIGH)
    for agg in ("token_mean", "seq_mean_token_mean"):
        with_empty, _ = algo.policy_loss(logp, old, adv, mask, eps_low=EPS_LOW, eps_high=EPS_HIGH, agg=agg)
        without, _ = algo.policy_loss(logp[1:], old[1:], adv[1:], mask[1:], eps_low=EPS_LOW, eps_high=EPS_HIGH, agg=agg)
        assert with_empty.item() == pytest.approx(without.item(), rel=1e-12)


def test_policy_loss_rejects_bad_dual_clip():
    logp, old, adv, mask = random_batch(0)
    with pytest.raises(ValueError, match="dual_clip_c"):
        algo.policy_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.2, dual_clip_c=1.0)


# ----------------------------------------------------------------------------------------
# Micro-batch invariance (a tiny model, so the check is on parameter gradients)
# ----------------------------------------------------------------------------------------

N_ROWS, LEN, VOCAB = 8, 10, 13


def tiny_policy_batch():
    """A bigram 'policy' (logits = W[prev token]), a batch of sampled ids and a ragged mask
    with two fully masked rows at 1 and 2 (so they fall in different micro-batches)."""
    gen = torch.Generator().manual_seed(7)
    weight = torch.randn(VOCAB, VOCAB, generator=gen, dtype=torch.float64)
    ids = torch.randint(0, VOCAB, (N_ROWS, LEN + 1), generator=gen)
    mask = ragged_mask(N_ROWS, LEN, gen)
    old = algo.logprobs_from_logits(weight[ids[:, :-1]], ids[:, 1:]).double()
    old = old + 0.3 * torch.randn(N_ROWS, LEN, generator=gen, dtype=torch.float64)  # off-policy
    adv = torch.randn(N_ROWS, generator=gen, dtype=torch.float64)
    return weight, ids, mask, old, adv


def accumulated_grad(n_micro, mask, agg, global_counts):
    """Sum of micro-batch gradients of W; each micro-batch loss is divided by n_micro when
    it normalizes by its own counts (the naive accumulation), by nothing when given the
    step's global counts."""
    weight, ids, _, old, adv = tiny_policy_batch()
    weight.requires_grad_()
    counts = {"num_tokens": mask.sum(), "num_seqs": (mask.sum(-1) > 0).sum()} if global_counts else {}
    groups = torch.arange(N_ROWS) // 2                                     # two rows per group
    per_group = torch.zeros(N_ROWS // 2, dtype=mask.dtype).index_add_(0, groups, mask.sum(-1))
    for rows in torch.arange(N_ROWS).chunk(n_micro):
        if agg == "group_token_mean":   # the step's per-group token counts, or this call's groups
            counts = ({"group_tokens": per_group[groups[rows]], "num_groups": (per_group > 0).sum()}
                      if global_counts else {"groups": groups[rows] - groups[rows].min()})
        logits = weight[ids[rows, :-1]]  # [n, L, V]
        logp = algo.logprobs_from_logits(logits, ids[rows, 1:], chunk_size=7)
        loss, _ = algo.policy_loss(logp, old[rows], adv[rows], mask[rows], eps_low=EPS_LOW,
                                   eps_high=EPS_HIGH, dual_clip_c=3.0, agg=agg, **counts)
        (loss if global_counts else loss / n_micro).backward()
    return weight.grad


SPLITS = [1, 2, 8]  # 1x8, 2x4, 8x1


@pytest.mark.parametrize("agg", sorted(algo.AGG_MODES))
def test_microbatch_invariance_with_global_counts(agg):
    mask = tiny_policy_batch()[2]
    mask[1] = mask[2] = 0.0  # two overlong-filtered rows, in different micro-batches
    full = accumulated_grad(1, mask, agg, global_counts=True)
    assert full.abs().sum() > 0
    for n_micro in SPLITS[1:]:
        torch.testing.assert_close(accumulated_grad(n_micro, mask, agg, True), full, rtol=1e-12, atol=1e-14)


def test_token_mean_naive_accumulation_is_not_invariant():
    # Each micro-batch dividing by its own token count weighs tokens of short micro-batches up.
    mask = tiny_policy_batch()[2]
    full = accumulated_grad(1, mask, "token_mean", global_counts=False)
    for n_micro in SPLITS[1:]:
        split = accumulated_grad(n_micro, mask, "token_mean", global_counts=False)
        assert (split - full).abs().max() > 1e-3 * full.abs().max()


def test_seq_mean_token_mean_naive_accumulation():
    # Averaging per-micro-batch sequence means over equal-size micro-batches is still the
    # mean over sequences, as long as every row has a token ...
    mask = tiny_policy_batch()[2]
    full = accumulated_grad(1, mask, "seq_mean_token_mean", global_counts=False)
    for n_micro in SPLITS[1:]:
        torch.testing.assert_close(accumulated_grad(n_micro, mask, "seq_mean_token_mean", False), full, rtol=1e-12, atol=1e-14)
    # ... but overlong-filtered (fully masked) rows drop out of one micro-batch's count only,
    # and the naive accumulation then depends on the split.
    mask[1] = mask[2] = 0.0
    full = accumulated_grad(1, mask, "seq_mean_token_mean", global_counts=False)
    split = accumulated_grad(2, mask, "seq_mean_token_mean", global_counts=False)
    assert (split - full).abs().max() > 1e-3 * full.abs().max()


def test_seq_mean_token_mean_weighs_long_responses_less():
    # r = 1, Â = 1 on two responses of 2 and 8 tokens.
    # token_mean: every token's gradient is -1/10.  seq_mean_token_mean (GRPO): a token of
    # response i gets -1/(G·|o_i|) = -1/4 (short) vs -1/16 (long): the length bias DAPO removes.
    mask = torch.zeros(2, 8, dtype=torch.float64)
    mask[0, :2], mask[1, :] = 1.0, 1.0
    grads = {}
    for agg in ("token_mean", "seq_mean_token_mean"):
        logp = torch.zeros(2, 8, dtype=torch.float64, requires_grad=True)
        loss, _ = algo.policy_loss(logp, logp.detach(), torch.ones(2, dtype=torch.float64), mask,
                                   eps_low=EPS_LOW, eps_high=EPS_HIGH, agg=agg)
        loss.backward()
        grads[agg] = logp.grad
    assert torch.equal(grads["token_mean"][mask == 1], torch.full((10,), -0.1, dtype=torch.float64))
    assert grads["seq_mean_token_mean"][0, 0].item() == pytest.approx(-1 / 4)
    assert grads["seq_mean_token_mean"][1, 0].item() == pytest.approx(-1 / 16)


# ----------------------------------------------------------------------------------------
# kl_penalty
# ----------------------------------------------------------------------------------------

def test_kl_penalty_hand():
    # logp = ln(1/2), ref = ln(1/4) ... use d = ref - logp = -ln 2:
    # k1 = -d = ln 2; k2 = d²/2 = (ln 2)²/2; k3 = e^d - d - 1 = 1/2 + ln 2 - 1
    logp = torch.tensor([[math.log(0.5)]], dtype=torch.float64)
    ref = torch.tensor([[math.log(0.25)]], dtype=torch.float64)
    ln2 = math.log(2)
    assert algo.kl_penalty(logp, ref, "k1").item() == pytest.approx(ln2, rel=1e-12)
    assert algo.kl_penalty(logp, ref, "k2").item() == pytest.approx(ln2**2 / 2, rel=1e-12)
    assert algo.kl_penalty(logp, ref, "k3").item() == pytest.approx(0.5 + ln2 - 1, rel=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_kl_penalty_expectations_are_kl(seed):
    # From the definition: KL(p‖q) = Σ_x p(x) ln(p(x)/q(x)). k1 and k3 are unbiased, so their
    # exact expectation under x ~ p (a p-weighted sum over the vocabulary) equals it.
    gen = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(50, generator=gen, dtype=torch.float64), 0)
    q = torch.softmax(torch.randn(50, generator=gen, dtype=torch.float64), 0)
    kl = sum(pi * math.log(pi / qi) for pi, qi in zip(p.tolist(), q.tolist()))
    for kind in ("k1", "k3"):
        est = algo.kl_penalty(p.log()[None], q.log()[None], kind)[0]
        assert (p * est).sum().item() == pytest.approx(kl, rel=1e-10)
    assert (algo.kl_penalty(p.log()[None], q.log()[None], "k3") >= 0).all()


def test_kl_penalty_unknown_kind():
    with pytest.raises(ValueError, match="k1.*k2.*k3"):
        algo.kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "low_var_kl")


# ----------------------------------------------------------------------------------------
# token_entropy, logprobs_from_logits
# ----------------------------------------------------------------------------------------

def test_entropy_and_logprob_hand():
    # uniform over V=4: H = ln 4. logits [0, ln 3]: p = [1/4, 3/4],
    # H = -(1/4 ln 1/4 + 3/4 ln 3/4), log p(1) = ln 3/4.
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [0.0, math.log(3), -math.inf, -math.inf]]])
    ent = algo.token_entropy(logits)
    assert ent[0, 0].item() == pytest.approx(math.log(4), rel=1e-6)
    assert ent[0, 1].item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), rel=1e-6)
    lp = algo.logprobs_from_logits(logits, torch.tensor([[2, 1]]))
    assert lp[0, 0].item() == pytest.approx(math.log(0.25), rel=1e-6)
    assert lp[0, 1].item() == pytest.approx(math.log(0.75), rel=1e-6)


def reference_entropy(logits):
    """-Σ_v p log p per position, python loop over positions (float64)."""
    out = torch.zeros(logits.shape[:2], dtype=torch.float64)
    for i, j in itertools.product(range(logits.shape[0]), range(logits.shape[1])):
        p = torch.softmax(logits[i, j].double(), 0)
        out[i, j] = -sum(pv * math.log(pv) for pv in p.tolist() if pv > 0)
    return out


@pytest.mark.parametrize("seed", SEEDS[:2])
@pytest.mark.parametrize("chunk_size", [1, 5, 4096])
def test_entropy_and_logprob_reference(seed, chunk_size):
    gen = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(3, 4, 17, generator=gen)
    ids = torch.randint(0, 17, (3, 4), generator=gen)
    ent = algo.token_entropy(logits, chunk_size=chunk_size)
    torch.testing.assert_close(ent.double(), reference_entropy(logits), rtol=1e-5, atol=1e-6)
    lp = algo.logprobs_from_logits(logits, ids, chunk_size=chunk_size)
    expected = torch.log_softmax(logits.double(), -1).gather(-1, ids[..., None])[..., 0]
    torch.testing.assert_close(lp.double(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fn", ["entropy", "logprob"])
def test_chunked_gradients_match_unchunked(fn):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 6, 11, generator=gen, dtype=torch.float64)
    ids = torch.randint(0, 11, (2, 6), generator=gen)
    weights = torch.randn(2, 6, generator=gen, dtype=torch.float64)

    def run(chunk_size):
        x = logits.clone().requires_grad_()
        if fn == "entropy":
            out = algo.token_entropy(x, chunk_size=chunk_size)
        else:
            out = algo.logprobs_from_logits(x, ids, chunk_size=chunk_size)
        (out.double() * weights).sum().backward()
        return x.grad

    # unchunked autograd reference through plain torch ops
    x = logits.clone().requires_grad_()
    if fn == "entropy":
        p = torch.softmax(x, -1)
        ref_out = -(p * torch.log_softmax(x, -1)).sum(-1)
    else:
        ref_out = torch.log_softmax(x, -1).gather(-1, ids[..., None])[..., 0]
    (ref_out * weights).sum().backward()
    for chunk_size in (1, 5, 100):
        torch.testing.assert_close(run(chunk_size), x.grad, rtol=1e-5, atol=1e-6)


def test_entropy_large_vocab_no_grad_and_bf16():
    # a Qwen-sized vocabulary (151,936) in bf16 under no_grad: float32 [N, L] out, chunked
    logits = torch.randn(2, 3, 151_936, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    with torch.no_grad():
        ent = algo.token_entropy(logits, chunk_size=2)
        lp = algo.logprobs_from_logits(logits, torch.zeros(2, 3, dtype=torch.long), chunk_size=2)
    assert ent.shape == lp.shape == (2, 3) and ent.dtype == lp.dtype == torch.float32
    assert (ent > 0).all() and (ent <= math.log(151_936) + 1e-4).all() and (lp < 0).all()
    assert algo.token_entropy(torch.zeros(0, 5, 7)).shape == (0, 5)


# ----------------------------------------------------------------------------------------
# Overlong shaping
# ----------------------------------------------------------------------------------------

def reference_overlong(length, max_len, cache_len, factor):
    """Paper Eq. 13, piecewise, times the penalty factor."""
    if length <= max_len - cache_len:
        return 0.0
    if length <= max_len:
        return ((max_len - cache_len) - length) / cache_len * factor
    return -factor


@pytest.mark.parametrize("factor", [1.0, 0.5])
def test_soft_overlong_penalty_edges_hand(factor):
    # max_len 20, cache 4 -> free up to 16 (inclusive). 17: -1/4, 18: -2/4, 20: -4/4, 21+: -1.
    lengths = torch.tensor([0, 15, 16, 17, 18, 19, 20, 21, 1000])
    expected = torch.tensor([0, 0, 0, -0.25, -0.5, -0.75, -1.0, -1.0, -1.0]) * factor
    got = algo.soft_overlong_penalty(lengths, max_len=20, cache_len=4, factor=factor)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-7)


def test_soft_overlong_penalty_paper_setting_and_reference():
    # Paper: L_max 20480, L_cache 4096: 16384 free, 16385 -> -1/4096, 20480 -> -1, beyond -1.
    max_len, cache_len = 20480, 4096
    edges = [16383, 16384, 16385, 20479, 20480, 20481]
    got = algo.soft_overlong_penalty(torch.tensor(edges), max_len=max_len, cache_len=cache_len).tolist()
    assert got[:2] == [0.0, 0.0] and got[2] == pytest.approx(-1 / 4096) and got[4:] == [-1.0, -1.0]
    lengths = torch.randint(0, 25000, (500,), generator=torch.Generator().manual_seed(0))
    for factor in (1.0, 0.3):
        got = algo.soft_overlong_penalty(lengths, max_len=max_len, cache_len=cache_len, factor=factor)
        for n, g in zip(lengths.tolist(), got.tolist()):
            assert g == pytest.approx(reference_overlong(n, max_len, cache_len, factor), abs=1e-6)


def test_soft_overlong_penalty_validates():
    with pytest.raises(ValueError):
        algo.soft_overlong_penalty(torch.tensor([1]), max_len=10, cache_len=11)
    with pytest.raises(ValueError):
        algo.soft_overlong_penalty(torch.tensor([1]), max_len=10, cache_len=0)


def test_overlong_mask():
    assert algo.overlong_mask(torch.tensor([True, False, True])).tolist() == [0.0, 1.0, 0.0]


# ----------------------------------------------------------------------------------------
# Dynamic-sampling helpers
# ----------------------------------------------------------------------------------------

def test_informative_groups_and_stats():
    correct = torch.tensor([[1, 1, 1], [0, 0, 0], [1, 0, 0], [0, 1, 1]]).bool()
    assert algo.informative_groups(correct).tolist() == [False, False, True, True]
    stats = algo.group_stats(correct)
    assert stats == {"all_correct_frac": 0.25, "all_wrong_frac": 0.25, "mixed_frac": 0.5}
    # G = 1: a group can never be mixed
    assert not algo.informative_groups(torch.tensor([[True], [False]])).any()
    assert algo.group_stats(torch.zeros(0, 4, dtype=torch.bool)) == {
        "all_correct_frac": 0.0, "all_wrong_frac": 0.0, "mixed_frac": 0.0}


# ----------------------------------------------------------------------------------------
# Eval helpers
# ----------------------------------------------------------------------------------------

def test_pass_at_k_hand():
    # n=2, c=1, k=1: half the single draws succeed. n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6.
    assert algo.pass_at_k(2, 1, 1) == pytest.approx(0.5)
    assert algo.pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert algo.pass_at_k(5, 0, 3) == 0.0 and algo.pass_at_k(5, 5, 1) == 1.0 and algo.pass_at_k(5, 3, 3) == 1.0
    for bad in [(3, 4, 1), (3, 1, 0), (3, 1, 4), (3, -1, 1)]:
        with pytest.raises(ValueError):
            algo.pass_at_k(*bad)


@pytest.mark.parametrize("n", [1, 4, 7])
def test_pass_at_k_reference_by_enumeration(n):
    # From the definition: the fraction of all k-subsets of the n samples holding a correct one.
    for c in range(n + 1):
        samples = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(samples, k))
            expected = sum(any(s) for s in subsets) / len(subsets)
            assert algo.pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_majority_answers_avg_and_cons():
    assert algo.majority_answers(["a", "b", None, "b", "a"]) == ["a", "b"]  # a tie: both, first-seen order
    assert algo.majority_answers([None, "7", "3", "3"]) == ["3"]
    assert algo.majority_answers([None, None, None, "4"]) == ["4"]            # None never votes
    assert algo.majority_answers([None, None]) == [] and algo.majority_answers([]) == []
    assert algo.avg_at_k([True, False, True, True]) == 0.75 and algo.avg_at_k([]) == 0.0
    # no tie: the majority answer's correctness
    assert algo.cons_at_k(["5", "3", "3", None], [True, False, False, False]) == 0.0
    assert algo.cons_at_k(["5", "3", "5", None], [True, False, True, False]) == 1.0
    assert algo.cons_at_k([None, None, "5"], [False, False, True]) == 1.0     # 1 vote beats 2 Nones
    # 2-way tie "5" (correct) vs "3": each wins half the time -> 1/2, whichever comes first
    assert algo.cons_at_k(["5", "3", "3", "5"], [True, False, False, True]) == 0.5
    assert algo.cons_at_k(["3", "5", None, "3", "5"], [False, True, False, False, True]) == 0.5
    # 3-way tie "1", "2", "7" (only "7" correct), a lone None beside them -> 1/3
    assert algo.cons_at_k(["1", "2", "7", None], [False, False, True, False]) == pytest.approx(1 / 3)
    assert algo.cons_at_k(["1", "7", "2", "2", "7", "1"], [False, True, False, False, True, False]) == pytest.approx(1 / 3)
    # 2-way tie with both correct (two spellings the scorer accepts) -> 1; both wrong -> 0
    assert algo.cons_at_k(["8", "8.0"], [True, True]) == 1.0
    assert algo.cons_at_k(["1", "2"], [False, False]) == 0.0
    # an answer's correctness is read off its first sample
    assert algo.cons_at_k(["5", "5", "3"], [True, False, False]) == 1.0
    assert algo.cons_at_k([None, None], [False, False]) == 0.0 and algo.cons_at_k([], []) == 0.0
    with pytest.raises(ValueError):
        algo.cons_at_k(["1"], [True, False])


def test_cons_at_k_is_the_mean_over_every_tie_break():
    """By enumeration: cons@k = the mean, over the tied answers each taken as the winner, of
    the winner's correctness (a uniformly random tie-break)."""
    import random
    rng = random.Random(0)
    for _ in range(300):
        k = rng.randint(1, 7)
        answers = [rng.choice([None, "1", "2", "3"]) for _ in range(k)]
        truth = rng.choice(["1", "2", "3"])
        correct = [a == truth for a in answers]
        votes = {a: answers.count(a) for a in answers if a is not None}
        winners = [a for a in votes if votes[a] == max(votes.values())]
        expected = sum(w == truth for w in winners) / len(winners) if winners else 0.0
        assert algo.cons_at_k(answers, correct) == pytest.approx(expected, abs=1e-12)
