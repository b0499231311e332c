"""The training loop: dynamic sampling on designed groups, micro-batch / process
invariance of the update, and real end-to-end runs (vLLM, MLflow, checkpoints, resume)."""

from __future__ import annotations

import datetime
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dapo.config import load_config
from dapo.engines import Completion
from dapo.train.logprobs import old_logprobs, response_loss_mask
from dapo.train.rollout import DynamicSamplingExhausted, RolloutBatch, collect_rollouts
from dapo.train.update import Policy, update_policy

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable


# ----------------------------------------------------------------------------- fakes for unit tests
class ScriptedEngine:
    """A unit-test stand-in: prompt token ``[k]`` answers ``answers[k]`` for its G samples."""

    def __init__(self, answers: dict[int, list[str]]):
        self.answers = answers
        self.calls = 0

    def generate(self, prompts, spec):
        self.calls += 1
        out = []
        for p in prompts:
            texts = self.answers[p[0]]
            out.append([Completion(token_ids=[1] * (3 + i), text=f"Answer: {t}", finished=True)
                        for i, t in enumerate(texts[:spec.n])])
        return out


class ListSampler:
    def __init__(self, examples, batch_size):
        self.examples, self.batch_size, self.cursor = examples, batch_size, 0

    def next_batch(self):
        out = [self.examples[(self.cursor + i) % len(self.examples)] for i in range(self.batch_size)]
        self.cursor += self.batch_size
        return out


def _examples(n):
    from dapo.data.datasets import Example
    return [Example(prompt=f"q{k}", answer="7", source="t", index=k, scorer="dapo") for k in range(n)]


def _cfg(**ov):
    base = {"rollout.n": 4, "train.batch_prompts": 2, "train.mini_batch_prompts": 1,
            "train.micro_batch_seqs": 2, "algo.dynamic_sampling.gen_batch_prompts": 2,
            "algo.dynamic_sampling.max_gen_rounds": 3, "algo.overlong.max_len": 8,
            "algo.overlong.cache_len": 2, "rollout.max_new_tokens": 8}
    base.update(ov)
    return load_config(None, [f"{k}={v}" for k, v in base.items()])


def test_dynamic_sampling_keeps_only_mixed_groups_and_refills():
    # prompts 0,1: all-correct / all-wrong (dropped); 2,3: mixed (kept). Round 1 sees 0,1 →
    # keeps nothing; round 2 sees 2,3 → keeps both: gen_rounds 2, kept 2, discarded 2.
    answers = {0: ["7"] * 4, 1: ["1"] * 4, 2: ["7", "1", "1", "1"], 3: ["7", "7", "7", "2"]}
    ex = _examples(4)
    tokens = {(e.source, e.index): [e.index] for e in ex}
    cfg = _cfg()
    batch = collect_rollouts(ScriptedEngine(answers), ListSampler(ex, 2), tokens, cfg, rollout_step=1)
    s = batch.stats
    assert (s["sampling/gen_rounds"], s["sampling/kept_groups"], s["sampling/discarded_groups"]) == (2, 2, 2)
    assert s["sampling/all_correct_frac"] == 0.25 and s["sampling/all_wrong_frac"] == 0.25
    assert batch.correct.tolist() == [[True, False, False, False], [True, True, True, False]]
    assert s["rollout/acc_mean"] == pytest.approx(4 / 8)
    # every kept group is informative
    assert all(0 < int(g.sum()) < 4 for g in batch.correct)


def test_dynamic_sampling_exhausted_errors_or_proceeds():
    answers = {0: ["7"] * 4, 1: ["1"] * 4, 2: ["7", "1", "1", "1"]}
    ex = _examples(3)
    tokens = {(e.source, e.index): [e.index] for e in ex}
    # only prompt 2 is mixed; gen batch of 1 prompt per round, 2 rounds → at most 1 kept of 2
    cfg = _cfg(**{"algo.dynamic_sampling.gen_batch_prompts": 1, "algo.dynamic_sampling.max_gen_rounds": 2})
    with pytest.raises(DynamicSamplingExhausted, match="kept 0/2 groups after 2 rounds"):
        collect_rollouts(ScriptedEngine(answers), ListSampler(ex, 1), tokens, cfg, 1)
    cfg = _cfg(**{"algo.dynamic_sampling.gen_batch_prompts": 1, "algo.dynamic_sampling.max_gen_rounds": 3,
                  "algo.dynamic_sampling.on_exhausted": "proceed"})
    b = collect_rollouts(ScriptedEngine(answers), ListSampler(ex, 1), tokens, cfg, 1)
    assert b.num_groups == 1 and b.stats["sampling/gen_rounds"] == 3


def test_without_dynamic_sampling_every_group_is_kept_and_penalty_applies():
    answers = {0: ["7"] * 4, 1: ["1"] * 4}
    ex = _examples(2)
    tokens = {(e.source, e.index): [e.index] for e in ex}
    cfg = _cfg(**{"algo.dynamic_sampling.enabled": "false", "algo.overlong.soft_punish": "true",
                  "algo.overlong.max_len": 7})
    b = collect_rollouts(ScriptedEngine(answers), ListSampler(ex, 2), tokens, cfg, 1)
    assert b.num_groups == 2 and b.stats["sampling/discarded_groups"] == 0
    # lengths 3,4,5,6 with L_max 7, L_cache 2: no penalty up to 7-2 = 5; 6 → (5-6)/2 = -0.5
    assert b.penalty[0].tolist() == pytest.approx([0.0, 0.0, 0.0, -0.5])
    assert b.rewards[0].tolist() == pytest.approx([1.0, 1.0, 1.0, 0.5])


# ----------------------------------------------------------------------------- update invariance
def _tiny_policy(seed=0):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg)


def _random_batch(G=4, B=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts, resps = [], []
    for b in range(B):
        p = torch.randint(3, 32, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g).tolist()
        for _ in range(G):
            n = int(torch.randint(1, 9, (1,), generator=g))
            prompts.append(p)
            resps.append(torch.randint(3, 32, (n,), generator=g).tolist())
    correct = torch.rand(B, G, generator=g) > 0.5
    rewards = correct.float() * 2 - 1
    return RolloutBatch(prompts, resps, torch.ones(B * G, dtype=torch.bool), correct, rewards,
                        torch.zeros(B, G))


def _one_update(micro, world=1, rank=0, agg="token_mean", seed=0, budget=None, chunk=None, wrap=None, drop=(),
                extra=None, batch=None, seen=None):
    """One optimizer step of a tiny policy on a fixed batch: (StepStats list, parameter deltas).
    ``wrap``: e.g. DistributedDataParallel, for the update to go through (rank ``rank`` of ``world``).
    ``drop``: rows whose loss mask is zeroed (overlong-filtered responses); ``extra``: more config overrides;
    ``batch``: instead of `_random_batch()`; ``seen``: a list that gets the token count of each forward of the update."""
    from dapo import algo
    cfg = _cfg(**{"rollout.n": 4, "train.batch_prompts": 4, "train.mini_batch_prompts": 4,
                  "train.micro_batch_seqs": micro, "algo.loss_agg": agg, "train.lr": 1e-2,
                  "launch.num_processes": world,
                  "algo.dynamic_sampling.enabled": "false", "model.autocast_bf16": "false",
                  **({} if budget is None else {"train.max_tokens_per_micro_batch": budget}),
                  **({} if chunk is None else {"train.logits_chunk_tokens": chunk}), **(extra or {})})
    model = _tiny_policy(seed)
    batch = _random_batch() if batch is None else batch
    old, _, mask = old_logprobs(model, batch, cfg, 0, torch.device("cpu"), False)
    old = old - 0.05  # a stale policy, so ratios differ from 1 and clipping can act
    if seen is not None:
        model.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["input_ids"].numel()), with_kwargs=True)
    mask[list(drop)] = 0.0
    adv = algo.group_advantages(batch.rewards).reshape(-1)
    trained = model if wrap is None else wrap(model)
    opt = torch.optim.SGD(trained.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    steps = update_policy(Policy(trained, opt, sched, torch.device("cpu"), rank=rank, world=world),
                          batch, old, adv, mask, cfg)
    delta = {k: (model.state_dict()[k] - before[k]) for k in before}
    return steps, delta


@pytest.mark.parametrize("micro", [1, 2, 4, 8, 16])
def test_token_mean_update_is_invariant_to_micro_batch_split(micro):
    ref_steps, ref_delta = _one_update(16)
    steps, delta = _one_update(micro)
    assert steps[0].loss == pytest.approx(ref_steps[0].loss, rel=1e-5, abs=1e-7)
    for k in ref_delta:
        torch.testing.assert_close(delta[k], ref_delta[k], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("agg", ["seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_const"])
@pytest.mark.parametrize("micro", [1, 2, 4])
def test_sequence_mean_update_with_filtered_rows_is_invariant_to_the_split(agg, micro):
    """Overlong-filtered rows (3 and 9, in different micro-batches) drop out of the sequence count
    of the whole mini-batch, not of one micro-batch, so the split does not change the update."""
    ref_steps, ref_delta = _one_update(16, agg=agg, drop=(3, 9))
    steps, delta = _one_update(micro, agg=agg, drop=(3, 9))
    assert steps[0].loss == pytest.approx(ref_steps[0].loss, rel=1e-5, abs=1e-7)
    for k in ref_delta:
        torch.testing.assert_close(delta[k], ref_delta[k], rtol=1e-4, atol=1e-6)


# one group, rewards +1 +1 -1 -1: Â = ±a, a = 1 / (std + 1e-6), std = sqrt(4/3) (unbiased).
# π_old = π_θ - 0.05 on every token, so r = e^0.05 inside the clip range and ℓ = -r·Â per token.
# Responses of 3, 2, 4, 1 tokens; the first is overlong-filtered (loss mask 0), leaving
# Â = +a, -a, -a on 2, 4, 1 tokens: Σ_i Â_i = -a, Σ_i |o_i|·Â_i = 2a - 4a - a = -3a.
_A = 1.0 / (math.sqrt(4.0 / 3.0) + 1e-6)
_R = math.exp(0.05)
FILTERED_LOSS = {                                   # S = 3 kept responses; C = rollout.max_new_tokens = 8
    "seq_mean_token_mean": _R * _A / 3,             # -r·Σ_i Â_i / S
    "seq_mean_token_sum": _R * 3 * _A / 3,          # -r·Σ_i |o_i|·Â_i / S
    "seq_mean_token_sum_const": _R * 3 * _A / (3 * 8),
    "token_mean": _R * 3 * _A / 7,                  # T = 7 kept tokens (never counted the filtered row)
}


@pytest.mark.parametrize("agg", sorted(FILTERED_LOSS))
def test_filtered_responses_do_not_count_as_sequences(agg):
    """The step loss by hand. Counting the filtered response in S (all 4 rows) gave 3/4 of it."""
    from dapo import algo
    cfg = _cfg(**{"rollout.n": 4, "train.batch_prompts": 1, "train.mini_batch_prompts": 1,
                  "train.micro_batch_seqs": 2, "algo.loss_agg": agg, "algo.overlong.filter": "true",
                  "algo.dynamic_sampling.enabled": "false", "model.autocast_bf16": "false"})
    batch = RolloutBatch([[5, 6]] * 4, [[7] * 3, [8] * 2, [9] * 4, [10]], torch.tensor([False, True, True, True]),
                         torch.tensor([[True, True, False, False]]), torch.tensor([[1.0, 1.0, -1.0, -1.0]]),
                         torch.zeros(1, 4))
    model = _tiny_policy(2)
    old, _, mask = old_logprobs(model, batch, cfg, 0, torch.device("cpu"), False)
    mask = response_loss_mask(mask, batch.finished, True)            # the truncated first one: all 0
    assert mask.sum(-1).tolist() == [0.0, 2.0, 4.0, 1.0]
    adv = algo.group_advantages(batch.rewards).reshape(-1)
    assert adv.tolist() == pytest.approx([_A, _A, -_A, -_A], rel=1e-6)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    steps = update_policy(Policy(model, opt, sched, torch.device("cpu")), batch, old - 0.05, adv, mask, cfg)
    assert len(steps) == 1
    assert steps[0].loss == pytest.approx(FILTERED_LOSS[agg], rel=1e-5)


def test_logged_lr_is_the_one_the_step_used(tmp_path):
    """Linear warm-up over 4 gradient steps: the k-th step uses lr·k/4 and logs it (not the next one's)."""
    from types import SimpleNamespace
    from dapo import algo
    from dapo.train.update import build_policy
    _tiny_policy(0).save_pretrained(tmp_path / "m")
    cfg = _cfg(**{"rollout.n": 4, "train.batch_prompts": 4, "train.mini_batch_prompts": 2,
                  "train.micro_batch_seqs": 4, "train.lr": 1e-3, "train.warmup_grad_steps": 4,
                  "train.ppo_epochs": 2, "algo.dynamic_sampling.enabled": "false",
                  "model.autocast_bf16": "false", "model.gradient_checkpointing": "false"})
    p = build_policy(cfg, tmp_path / "m", SimpleNamespace(device=torch.device("cpu"), rank=0, world=1), pad_id=0)
    batch = _random_batch()
    old, _, mask = old_logprobs(p.model, batch, cfg, 0, torch.device("cpu"), False)
    steps = update_policy(p, batch, old, algo.group_advantages(batch.rewards).reshape(-1), mask, cfg)
    assert [s.lr for s in steps] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3], rel=1e-9)
    assert p.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)   # the fifth step's


@pytest.mark.parametrize("fault", [None, "grad"])
def test_gradients_are_freed_right_after_the_update(fault):
    """Issue 25 item 13: no parameter holds a gradient once the update is done (they were kept through
    the weight sync and generation until the next step's zero_grad), whether the last optimizer step was
    taken or skipped for a non-finite gradient."""
    from dapo import algo
    cfg = _cfg(**{"rollout.n": 4, "train.batch_prompts": 4, "train.mini_batch_prompts": 2, "train.micro_batch_seqs": 4,
                  "algo.dynamic_sampling.enabled": "false", "model.autocast_bf16": "false"})
    model, batch = _tiny_policy(0), _random_batch()
    old, _, mask = old_logprobs(model, batch, cfg, 0, torch.device("cpu"), False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    if fault:   # every step's gradient inf: both steps skipped
        next(model.parameters()).register_hook(lambda g: torch.full_like(g, float("inf")))
    steps = update_policy(Policy(model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0),
                                 torch.device("cpu")), batch, old, algo.group_advantages(batch.rewards).reshape(-1),
                          mask, cfg)
    assert [s.skipped_step for s in steps] == ([1.0, 1.0] if fault else [0.0, 0.0])
    moved = any(not torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert moved != bool(fault)
    assert [n for n, p in model.named_parameters() if p.grad is not None] == []


@pytest.mark.parametrize("budget", [1, 12, 25, 40, 10_000])
def test_token_budget_micro_batches_give_the_same_update(budget):
    """train.max_tokens_per_micro_batch splits by padded tokens instead of sequence counts (budget 1: one
    sequence per forward; 10 000: the whole mini-batch at once): the update must not change."""
    ref_steps, ref_delta = _one_update(16)
    steps, delta = _one_update(16, budget=budget)
    assert steps[0].loss == pytest.approx(ref_steps[0].loss, rel=1e-5, abs=1e-7)
    for k in ref_delta:
        torch.testing.assert_close(delta[k], ref_delta[k], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("chunk", [1, 5, 24])
def test_logits_chunking_leaves_the_update_unchanged(chunk):
    ref_steps, ref_delta = _one_update(4)
    steps, delta = _one_update(4, chunk=chunk)
    assert steps[0].loss == pytest.approx(ref_steps[0].loss, rel=1e-6, abs=1e-8)
    for k in ref_delta:
        torch.testing.assert_close(delta[k], ref_delta[k], rtol=1e-5, atol=1e-7)


def test_token_budget_micro_batches_fill_greedily_by_padded_size():
    from dapo.train.logprobs import length_sorted, micro_batches
    # prompts of 2 tokens, responses of 6, 4, 3, 1: padded sizes n·(2 + longest response)
    batch = RolloutBatch([[5, 5]] * 4, [[7] * 6, [7] * 4, [7] * 3, [7]], torch.ones(4, dtype=torch.bool),
                         torch.ones(1, 4, dtype=torch.bool), torch.ones(1, 4), torch.zeros(1, 4))
    order = length_sorted([3, 2, 1, 0], batch)
    assert order == [0, 1, 2, 3]
    cfg = lambda b: _cfg(**{"train.max_tokens_per_micro_batch": b, "train.micro_batch_seqs": 1})
    assert micro_batches(order, batch, cfg(16)) == [[0, 1], [2, 3]]        # 2·8 = 16; then 2·5 = 10
    assert micro_batches(order, batch, cfg(10)) == [[0], [1], [2, 3]]      # 2·8 > 10, 2·6 > 10, 2·5 = 10
    assert micro_batches(order, batch, cfg(9)) == [[0], [1], [2], [3]]
    assert micro_batches(order, batch, cfg(3)) == [[0], [1], [2], [3]]     # longer than the budget: alone
    assert micro_batches(order, batch, cfg(32)) == [[0, 1, 2, 3]]          # 4·8 = 32
    assert micro_batches(order, batch, _cfg(**{"train.micro_batch_seqs": 2})) == [[0, 1], [2, 3]]   # no budget
    big = _random_batch(seed=5)
    order = length_sorted(list(range(len(big.response_ids))), big)
    for b in (1, 13, 30, 100):
        mbs = micro_batches(order, big, cfg(b))
        assert [i for mb in mbs for i in mb] == order
        for mb in mbs:
            pad = len(mb) * (max(len(big.prompt_ids[i]) for i in mb) + max(len(big.response_ids[i]) for i in mb))
            assert len(mb) == 1 or pad <= b


def _on_policy_update(use_none: bool, micro: int = 4):
    from dapo import algo
    cfg = _cfg(**{"rollout.n": 4, "train.batch_prompts": 4, "train.mini_batch_prompts": 4,
                  "train.micro_batch_seqs": micro, "train.lr": 1e-2,
                  "algo.dynamic_sampling.enabled": "false", "model.autocast_bf16": "false"})
    model = _tiny_policy(1)
    batch = _random_batch(seed=3)
    old, ent, mask = old_logprobs(model, batch, cfg, 0, torch.device("cpu"), False)
    adv = algo.group_advantages(batch.rewards).reshape(-1)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    own = torch.zeros(mask.shape) if use_none else None
    steps = update_policy(Policy(model, opt, sched, torch.device("cpu")), batch, None if use_none else old,
                          adv, mask, cfg, own_logp=own)
    if use_none:   # the update's own forward, recorded for the mismatch metrics, is π_old's
        torch.testing.assert_close(own, old * mask, rtol=1e-5, atol=1e-6)
    delta = {k: (model.state_dict()[k] - before[k]) for k in before}
    return steps, delta, float((ent * mask).sum() / mask.sum()), float((old.exp() * mask).sum() / mask.sum())


def test_single_step_on_policy_skips_old_logprobs_with_the_same_update():
    """One optimizer step per rollout batch: using the update's own detached log-probs as π_old
    gives the same loss, gradient step, entropy and token probability as a separate forward."""
    from dapo.train.logprobs import single_step_on_policy
    assert single_step_on_policy(_cfg(**{"train.batch_prompts": 4, "train.mini_batch_prompts": 4}), 4)
    assert not single_step_on_policy(_cfg(**{"train.batch_prompts": 4, "train.mini_batch_prompts": 2}), 4)
    assert not single_step_on_policy(_cfg(**{"train.batch_prompts": 4, "train.mini_batch_prompts": 4,
                                             "train.ppo_epochs": 2}), 4)
    ref_steps, ref_delta, ent, prob = _on_policy_update(False)
    for micro in (1, 4, 16):
        steps, delta, _, _ = _on_policy_update(True, micro)
        assert steps[0].loss == pytest.approx(ref_steps[0].loss, rel=1e-5, abs=1e-7)
        assert steps[0].ratio_mean == pytest.approx(1.0, abs=1e-7)
        assert steps[0].entropy == pytest.approx(ent, rel=1e-5)
        assert steps[0].token_prob_mean == pytest.approx(prob, rel=1e-5)
        for k in ref_delta:
            torch.testing.assert_close(delta[k], ref_delta[k], rtol=1e-4, atol=1e-6)
        assert any(float(d.abs().max()) > 0 for d in delta.values())


@pytest.mark.parametrize("micro", [1, 2, 8])
def test_ratio_max_is_the_largest_ratio_whatever_the_micro_batches(micro):
    """train/ratio_max: π_old shifted down by δ per token (π_θ unchanged, lr 0) makes r = e^δ; the largest
    over the loss tokens, e^0.7 here, whatever the micro-batch split; 2 optimizer steps of a rollout
    step log their max (e^0.7), not their mean, while ratio_mean is the mean."""
    from dapo import algo
    from dapo.train.update import mean_metrics
    ov = {"rollout.n": 4, "train.batch_prompts": 4, "train.mini_batch_prompts": 2, "train.micro_batch_seqs": micro,
          "algo.dynamic_sampling.enabled": "false", "model.autocast_bf16": "false"}
    model, batch = _tiny_policy(2), _random_batch(seed=4)
    old, _, mask = old_logprobs(model, batch, _cfg(**ov), 0, torch.device("cpu"), False)
    delta = torch.zeros_like(old)
    delta[0, 0], delta[9, 1] = 0.3, 0.7                 # row 0 in the groups of one step, row 9 in the other's
    assert mask[0, 0] and mask[9, 1]
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    steps = update_policy(Policy(model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0),
                                 torch.device("cpu")), batch, old - delta,
                          algo.group_advantages(batch.rewards).reshape(-1), mask, _cfg(**ov))
    assert len(steps) == 2
    assert sorted(s.ratio_max for s in steps) == pytest.approx([math.exp(0.3), math.exp(0.7)], rel=1e-5)
    logged = mean_metrics(steps)
    assert logged["train/ratio_max"] == pytest.approx(math.exp(0.7), rel=1e-5)
    assert logged["train/ratio_mean"] == pytest.approx((steps[0].ratio_mean + steps[1].ratio_mean) / 2)


class FixedLogits(torch.nn.Module):
    """A stand-in policy whose logits are ``z`` at every position (plus a trainable 0, for the update)."""

    def __init__(self, z):
        super().__init__()
        self.z, self.zero = torch.tensor(z), torch.nn.Parameter(torch.zeros(()))

    def forward(self, input_ids, logits_to_keep, **_):
        from types import SimpleNamespace
        return SimpleNamespace(logits=(self.z + self.zero).expand(input_ids.shape[0], logits_to_keep, -1))


def _one_sequence_batch(response):
    return RolloutBatch([[1]], [response], torch.ones(1, dtype=torch.bool), torch.ones(1, 1, dtype=torch.bool),
                        torch.ones(1, 1), torch.zeros(1, 1))


def test_trainer_logprobs_and_entropy_use_the_rollout_temperature():
    """π = softmax(z / T) with T = rollout.temperature. By hand, z = (1, 2, 3), T = 2: z/T = (.5, 1, 1.5),
    logsumexp = ln(e^.5 + e^1 + e^1.5) = 2.1802697, so log π(0) = .5 - 2.1802697 = -1.6802697,
    log π(2) = 1.5 - 2.1802697 = -0.6802697, entropy -Σ π ln π = 1.0201913."""
    model, batch = FixedLogits([1.0, 2.0, 3.0]), _one_sequence_batch([0, 2])
    logp, ent, mask = old_logprobs(model, batch, _cfg(**{"rollout.temperature": 2.0}), 0, torch.device("cpu"), False)
    assert logp[0].tolist() == pytest.approx([-1.6802697, -0.6802697], abs=1e-6)
    assert ent[0].tolist() == pytest.approx([1.0201913] * 2, abs=1e-6)
    # T = 1: z itself; ln(e + e^2 + e^3) = 3.4076059, so log π(0) = -2.4076059, log π(2) = -0.4076059
    logp1, _, _ = old_logprobs(model, batch, _cfg(), 0, torch.device("cpu"), False)
    assert logp1[0].tolist() == pytest.approx([-2.4076059, -0.4076059], abs=1e-6)
    # greedy rollouts (T = 0) have no sampling distribution: read as T = 1
    logp0, _, _ = old_logprobs(model, batch, _cfg(**{"rollout.temperature": 0.0}), 0, torch.device("cpu"), False)
    assert logp0.tolist() == logp1.tolist()


@pytest.mark.parametrize("old_temperature, ratio_is_one", [(0.7, True), (1.0, False)])
def test_the_update_uses_the_rollout_temperature_like_the_old_logprobs(old_temperature, ratio_is_one):
    """A first optimizer step sees π_θ = π_old, so every ratio is 1 — only if the update reads log-probs at
    the same temperature as the old log-probs (rollout.temperature = 0.7 here)."""
    from dapo import algo
    ov = {"rollout.n": 4, "train.batch_prompts": 4, "train.mini_batch_prompts": 4, "train.micro_batch_seqs": 4,
          "algo.dynamic_sampling.enabled": "false", "model.autocast_bf16": "false"}
    model, batch = _tiny_policy(2), _random_batch(seed=4)
    old, _, mask = old_logprobs(model, batch, _cfg(**ov, **{"rollout.temperature": old_temperature}), 0,
                                torch.device("cpu"), False)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    steps = update_policy(Policy(model, opt, sched, torch.device("cpu")), batch, old,
                          algo.group_advantages(batch.rewards).reshape(-1), mask, _cfg(**ov, **{"rollout.temperature": 0.7}))
    assert (steps[0].ratio_mean == pytest.approx(1.0, abs=1e-6)) is ratio_is_one
    assert (steps[0].approx_kl == pytest.approx(0.0, abs=1e-9)) is ratio_is_one


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logprobs_and_entropy_equal_the_unchunked_ones(dtype, temperature):
    """train.logits_chunk_tokens: log-probs and entropy computed a few positions at a time (float32 per
    chunk, from bf16 or fp32 logits) equal the all-at-once values, and so do their gradients."""
    from dapo.train.logprobs import token_entropy, token_logprobs
    g = torch.Generator().manual_seed(0)
    base = (torch.randn(3, 7, 11, generator=g) * 3).to(dtype)                # [n, L + 1, V] like a forward
    tgt = torch.randint(0, 11, (3, 6), generator=g)
    w = torch.randn(3, 6, generator=g)

    def run(chunk):
        x = base.clone().requires_grad_(True)
        logits = x[:, :6]                                                     # [n, L, V] view, as response_logits
        lp = token_logprobs(logits, tgt, temperature, chunk)
        ent = token_entropy(logits, temperature, chunk)
        ((lp * w).sum() + (ent * w).sum()).backward()
        return lp.detach(), ent.detach(), x.grad

    ref = run(None)
    assert ref[0].dtype == torch.float32 and ref[1].shape == (3, 6)
    for chunk in (1, 3, 4, 9, 17, 10_000):                                    # 1..6 positions per chunk
        for a, b in zip(run(chunk), ref):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_chunked_logprobs_keep_no_float32_copy_of_all_logits_for_the_backward():
    """What autograd saves between forward and backward: an unchunked float32 log-softmax keeps float32
    [n·L, V] (the logsumexp input); chunked, no saved float32 tensor is larger than one chunk, and an
    unset chunk (train.logits_chunk_tokens null) is chunked too, even where one chunk holds every
    position (the checkpoint keeps the bf16 logits only)."""
    from dapo import algo
    from dapo.train.logprobs import token_logprobs
    n, L, V = 4, 8, 16
    logits = torch.randn(n, L + 1, V, dtype=torch.bfloat16, requires_grad=True)[:, :L]
    tgt = torch.randint(0, V, (n, L))

    def largest_saved_fp32(f):
        sizes = [0]

        def pack_hook(t):
            if t.dtype == torch.float32:
                sizes.append(t.numel())
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack_hook, lambda t: t):
            f().sum().backward()
        return max(sizes)

    assert largest_saved_fp32(lambda: algo.logprobs_from_logits(logits.float(), tgt)) >= n * L * V
    assert largest_saved_fp32(lambda: token_logprobs(logits, tgt, 1.0, 2 * n)) <= 2 * n * V   # 2 positions × n
    assert largest_saved_fp32(lambda: token_logprobs(logits, tgt, 1.0, None)) == 0


def test_length_sorted_micro_batches_pad_less():
    from dapo.train.logprobs import length_sorted
    batch = _random_batch(seed=5)
    idx = length_sorted(list(range(len(batch.response_ids))), batch)
    assert sorted(idx) == list(range(len(batch.response_ids)))
    lens = [len(batch.response_ids[i]) for i in idx]
    assert lens == sorted(lens, reverse=True)


def _dist_worker(rank, world, port, out_path, skewed=False):
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    torch.set_num_threads(1)
    seen: list[int] = []
    kw = dict(batch=_skewed_batch(), **SKEWED) if skewed else {}
    steps, delta = _one_update(2, world=world, rank=rank, wrap=torch.nn.parallel.DistributedDataParallel,
                               seen=seen, **kw)
    torch.save({"loss": steps[0].loss, "grad_norm": steps[0].grad_norm, "metrics": steps[0].metrics(),
                "delta": delta, "seen": seen}, f"{out_path}.rank{rank}")
    dist.destroy_process_group()


def _two_processes(tmp_path, skewed=False) -> list[dict]:
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "dist.pt"
    mp.spawn(_dist_worker, args=(2, port, str(out), skewed), nprocs=2, join=True)
    return [torch.load(f"{out}.rank{r}") for r in range(2)]


def test_two_processes_give_the_same_update_as_one(tmp_path):
    two = _two_processes(tmp_path)[0]
    ref_steps, ref_delta = _one_update(2)
    assert two["loss"] == pytest.approx(ref_steps[0].loss, rel=1e-5, abs=1e-7)
    for k in ref_delta:
        torch.testing.assert_close(two["delta"][k], ref_delta[k], rtol=1e-4, atol=1e-6)


# --------------------------------------------------------------------------- packed micro-batches, balanced ranks
def _skewed_batch() -> RolloutBatch:
    """4 groups of 4 on prompts of 2 tokens: one response of 56 tokens, the other 15 of 1 token
    (58 tokens against 15 x 3 = 45: token balancing gives the long one a rank of its own)."""
    g = torch.Generator().manual_seed(7)
    prompts = [[3 + b, 4 + b] for b in range(4) for _ in range(4)]
    resps = [torch.randint(3, 32, (56 if i == 0 else 1,), generator=g).tolist() for i in range(16)]
    correct = torch.tensor([[True, False, True, False]] * 4)
    return RolloutBatch(prompts, resps, torch.ones(16, dtype=torch.bool), correct, correct.float() * 2 - 1,
                        torch.zeros(4, 4))


# packed, 10 tokens per micro-batch: rank 1's 15 short sequences make 5 micro-batches (3 x 3 tokens each),
# rank 0 has one sequence: 1 pass + 4 fillers
SKEWED = {"extra": {"train.packed": "true"}, "budget": 10}


def test_packed_logprobs_and_entropies_equal_the_padded_ones():
    """16 packed sequences (an empty response among them) against 16 padded rows:
    equal to 1e-6 in fp32 on every response token. The same row with an all-ones attention mask
    (which turns transformers' packed-sequence detection off) attends across sequences and differs:
    the equality is the block-causal attention, not a coincidence."""
    from dapo.train.logprobs import ResponseLogits, layer_costs, pack_flat, packed_row_len, response_forward
    model = _tiny_policy(3).eval()
    batch = _random_batch(seed=2)
    batch.response_ids[5] = []
    cpu = torch.device("cpu")
    padded, packed = (old_logprobs(model, batch, _cfg(**{"train.mini_batch_prompts": 4, "train.batch_prompts": 4,
                                                          "train.micro_batch_seqs": 16, "train.packed": v}),
                                   0, cpu, False) for v in ("false", "true"))
    mask = padded[2].bool()
    assert mask.sum() == sum(len(r) for r in batch.response_ids) and torch.equal(packed[2], padded[2])
    for a, b in zip(packed[:2], padded[:2]):
        torch.testing.assert_close(a[mask], b[mask], rtol=0, atol=1e-6)
        assert float(a[~mask].abs().max()) == 0.0 == float(b[~mask].abs().max())   # old_logprobs: 0 at padding
    # one forward of either layout computes the empty response's one position too (target: pad), as
    # padded column 0
    computed = mask.clone()
    computed[5, 0] = True
    with torch.no_grad():
        pad_fw = response_forward(model, batch.prompt_ids, batch.response_ids, 0, cpu, False, packed=False)
        pad_lp, pad_ent = pad_fw.logprobs(), pad_fw.entropy()
    assert float(pad_lp[5, 0]) < 0.0
    # sdpa packs into rows capped by packed_row_len; one row (flash-attention's layout) and chunked
    # log-probs agree too
    rows = response_forward(model, batch.prompt_ids, batch.response_ids, 0, cpu, False, packed=True)
    cap = packed_row_len(list(map(len, batch.prompt_ids)), list(map(len, batch.response_ids)), layer_costs(model.config))
    assert 1 < rows.logits.shape[0] < 16 and rows.logits.shape[1] <= cap
    fw = response_forward(model, batch.prompt_ids, batch.response_ids, 0, cpu, False, packed=True, one_row=True)
    assert fw.logits.shape[0] == 1
    torch.testing.assert_close(rows.logprobs()[computed], pad_lp[computed], rtol=0, atol=1e-6)
    torch.testing.assert_close(fw.logprobs(chunk_tokens=5)[computed], pad_lp[computed], rtol=0, atol=1e-6)
    torch.testing.assert_close(fw.entropy()[computed], pad_ent[computed], rtol=0, atol=1e-6)
    ids, pos, keep, tgt, where, _ = pack_flat(batch.prompt_ids, batch.response_ids, 0, cpu)
    assert ids.shape[1] == sum(len(p) + len(r) for p, r in zip(batch.prompt_ids, batch.response_ids))
    with torch.no_grad():
        leaky = model(input_ids=ids, attention_mask=torch.ones_like(ids), position_ids=pos,
                      logits_to_keep=keep).logits.float().log_softmax(-1).gather(-1, tgt[..., None])[..., 0]
    leaky = ResponseLogits(None, None, padded[2], where).layout(leaky)
    assert float((leaky - padded[0])[mask].abs().max()) > 1e-2


def test_packed_rows_widen_only_where_padding_costs_more_than_attention():
    """Six sequences of 10, 10, 10, 10, 2, 2 tokens. Rows of the longest (10): four alone and [2, 2], 5 × 10 =
    50 row tokens, 500 token pairs. Rows of 12 (1.25×): [10, 2] twice and two [10], 4 × 12 = 48 tokens,
    576 pairs. With cost R·W·(a + b·W): attention-free (b = 0) the 12-token rows win, 48 < 50; with
    b = a (attention-heavy) the 10-token rows, 550 < 624; without the model's sizes, the longest.
    Random batches: the chosen rows never hold more token pairs than the padded layout."""
    import random
    from types import SimpleNamespace

    from dapo.train.logprobs import ROW_CAP_FACTORS, ffd_rows, layer_costs, length_sorted, packed_row_len
    # micro-batches of a packed layout group sequences by whole length (a row holds prompt + response)
    b = SimpleNamespace(prompt_ids=[[3] * 30, [3] * 2, [3] * 10], response_ids=[[4] * 5, [4] * 20, [4] * 20])
    assert length_sorted([0, 1, 2], b) == [2, 1, 0] and length_sorted([0, 1, 2], b, packed=True) == [0, 2, 1]
    P, R = [1] * 6, [9, 9, 9, 9, 1, 1]
    assert ffd_rows([p + r for p, r in zip(P, R)], 12) == [[0, 4], [1, 5], [2], [3]]
    assert packed_row_len(P, R, None) == 10
    assert packed_row_len(P, R, (1.0, 0.0)) == 12
    assert packed_row_len(P, R, (1.0, 1.0)) == 10
    cfg = _tiny_policy(0).config
    a, b = layer_costs(cfg)
    h, i, heads, kv = cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads
    hd = h // heads
    assert (a, b) == (2 * (2 * h * heads * hd + 2 * h * kv * hd + 3 * h * i), 4 * heads * hd)
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 24)
        P = [rng.randint(1, 40) for _ in range(n)]
        R = [rng.randint(0, 200) for _ in range(n)]
        lens = [p + r for p, r in zip(P, R)]
        costs = (rng.choice([1.0, 1e3, 1e6]), rng.choice([0.0, 1.0, 1e3]))
        cap = packed_row_len(P, R, costs)
        assert cap in {int(c * max(lens)) for c in ROW_CAP_FACTORS}
        rows = ffd_rows(lens, cap)
        W = max(sum(lens[j] for j in r) for r in rows)
        assert len(rows) * W * W <= n * (max(P) + max(max(R), 1)) ** 2 or cap == max(lens)
        cost = lambda rows, W: len(rows) * W * (costs[0] + costs[1] * W)
        r1 = ffd_rows(lens, 0)
        assert cost(rows, W) <= cost(r1, max(sum(lens[j] for j in r) for r in r1))


@pytest.mark.parametrize("micro,budget", [(16, None), (4, None), (16, 25)])
def test_packed_update_equals_the_padded_one(micro, budget):
    """One optimizer step, packed vs padded: loss, grad norm, every metric and the weight change."""
    ref_steps, ref_delta = _one_update(micro, budget=budget, extra={"algo.entropy_coef": 0.01})
    steps, delta = _one_update(micro, budget=budget, extra={"algo.entropy_coef": 0.01, "train.packed": "true"})
    a, b = steps[0].metrics(), ref_steps[0].metrics()
    assert a.keys() == b.keys()
    for k in b:
        assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-7), k
    for k in ref_delta:
        torch.testing.assert_close(delta[k], ref_delta[k], rtol=1e-4, atol=1e-6)


def test_ranks_get_equal_tokens_and_as_many_passes_and_fillers_are_one_token():
    from dapo.train.logprobs import FILLER, filler_forward, micro_cost, rank_micro_batches
    g = torch.Generator().manual_seed(0)     # 64 responses, lengths heavy-tailed (a few 10x the median)
    lens = [int(4 * 1.6 ** float(torch.rand(1, generator=g) * 8)) for _ in range(64)]
    batch = RolloutBatch([[3, 4, 5]] * 64, [[7] * n for n in lens], torch.ones(64, dtype=torch.bool),
                         torch.ones(16, 4, dtype=torch.bool), torch.ones(16, 4), torch.zeros(16, 4))
    idx = list(range(64))
    tok = lambda i: 3 + lens[i]
    longest = max(tok(i) for i in idx)
    for packed, budget in (("false", None), ("true", 200), ("false", 200)):
        cfg = _cfg(**{"train.packed": packed, "train.micro_batch_seqs": 4,
                      **({} if budget is None else {"train.max_tokens_per_micro_batch": budget})})
        plan = rank_micro_batches(idx, batch, cfg, 4)
        assert len({len(m) for m in plan}) == 1                                 # as many passes everywhere
        assert sorted(i for m in plan for mb in m for i in mb) == idx           # every sequence once
        loads = [sum(tok(i) for mb in m for i in mb) for m in plan]
        assert max(loads) - min(loads) <= longest, loads                        # LPT: within one sequence
        if budget:
            assert all(len(mb) <= 1 or micro_cost(mb, batch, packed == "true") <= budget for m in plan for mb in m)
    rr = [sum(tok(i) for i in sorted(idx, key=lambda i: -lens[i])[r::4]) for r in range(4)]   # the old deal
    assert max(loads) - min(loads) < (max(rr) - min(rr)) / 4, (loads, rr)
    # the skewed batch: rank 0 holds the long sequence and runs 4 fillers, each a forward of one token
    skew = _skewed_batch()
    plan = rank_micro_batches(list(range(16)), skew, _cfg(**{"train.packed": "true",
                                                               "train.max_tokens_per_micro_batch": 10}), 2)
    assert plan[0] == [[0], FILLER, FILLER, FILLER, FILLER] and len(plan[1]) == 5
    seen = []
    model = _tiny_policy(0)
    model.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["input_ids"].shape), with_kwargs=True)
    assert filler_forward(model, 0, torch.device("cpu"), False).shape == (1, 1, 32) and seen == [(1, 1)]


def test_two_processes_packed_with_filler_passes_equal_one_process(tmp_path):
    """Skewed lengths, packed, a token budget: rank 0 runs its one sequence then 4 one-token fillers
    while rank 1 runs 5 micro-batches; loss, grad norm, every metric and the weight change are those
    of one process."""
    r0, r1 = _two_processes(tmp_path, skewed=True)
    assert r0["seen"] == [58, 1, 1, 1, 1] and r1["seen"] == [9] * 5
    seen: list[int] = []
    ref_steps, ref_delta = _one_update(2, batch=_skewed_batch(), seen=seen, **SKEWED)
    assert seen == [58] + [9] * 5
    for r in (r0, r1):
        for k, v in ref_steps[0].metrics().items():
            assert r["metrics"][k] == pytest.approx(v, rel=1e-5, abs=1e-7), k
        for k in ref_delta:
            torch.testing.assert_close(r["delta"][k], ref_delta[k], rtol=1e-4, atol=1e-6)


# ----------------------------------------------------------------------------- end to end (real)
def _run(args, env=None, check=True, timeout=900):
    e = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    p = subprocess.run([PY, "-m", "dapo.cli", "train", *args], cwd=REPO, env=e, capture_output=True,
                       text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"dapo train failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}")
    return p


def _history(uri, run_uuid):
    from mlflow.tracking import MlflowClient
    c = MlflowClient(tracking_uri=uri)
    run = c.get_run(run_uuid)
    hist = {k: [(m.step, m.value) for m in sorted(c.get_metric_history(run_uuid, k), key=lambda m: m.step)]
            for k in run.data.metrics}
    return run, hist


@pytest.fixture(scope="session")
def base_model_path():
    """A quickly trained tiny base model (cached by recipe hash across test runs)."""
    from dapo.base_model import resolve_policy_path
    return str(resolve_policy_path("mini-base:150"))


E2E = ["train.rollout_steps=3", "train.batch_prompts=4", "train.mini_batch_prompts=2",
       "train.micro_batch_seqs=16", "rollout.n=8", "eval.every=0", "eval.datasets=[{name: arith-eval, limit: 16}]",
       "eval.k=4", "checkpoint.every=1", "logging.progress=false"]


@pytest.mark.slow
@pytest.mark.parametrize("exp", ["tiny-dapo", "tiny-grpo"])
def test_three_step_runs_with_vllm_log_sane_metrics(tmp_path, base_model_path, exp):
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    p = _run([f"experiments/{exp}.yaml", *E2E, f"model.path={base_model_path}", f"output_dir={tmp_path}",
              f"logging.tracking_uri={uri}", "algo.dynamic_sampling.on_exhausted=proceed",
              "--run-dir", str(tmp_path / "run")])
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["rollout_steps"] == 3 and summary["grad_steps"] == 3 * 2
    run, hist = _history(uri, summary["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert [s for s, _ in hist["progress/rollout_step"]] == [0, 2, 4, 6]       # eval@0 then 3 steps
    for key in ["rollout/reward_mean", "rollout/acc_mean", "train/entropy", "train/loss", "train/grad_norm",
                "train/clip_frac_high", "sampling/kept_groups", "time/step_s", "eval/arith-eval/avg_at_4"]:
        assert key in hist, key
        assert all(v == v and abs(v) < 1e6 for _, v in hist[key]), key
    for (_, acc), (_, kept), (_, ac), (_, aw) in zip(hist["rollout/acc_mean"], hist["sampling/kept_groups"],
                                                       hist["sampling/all_correct_frac"], hist["sampling/all_wrong_frac"]):
        assert 0 <= acc <= 1 and 0 <= ac + aw <= 1 and 1 <= kept <= 4
        if exp == "tiny-dapo":
            assert 0 < acc < 1          # kept groups are mixed
    for _, v in hist["eval/arith-eval/pass_at_4"]:
        assert 0 <= v <= 1
    avg = dict(hist["eval/arith-eval/avg_at_4"]); pas = dict(hist["eval/arith-eval/pass_at_4"])
    assert all(avg[s] <= pas[s] + 1e-9 for s in avg)
    # the run's token totals (summary.json, read by `dapo runs --cost`) are the sums of its steps
    assert summary["gen_tokens"] == sum(v for _, v in hist["sampling/gen_tokens"]) > 0
    trained = sum(r * t for (_, r), (_, t) in zip(hist["perf/train_tokens_per_s"], hist["time/train_s"]))
    assert summary["trained_tokens"] == pytest.approx(trained, rel=1e-6) and summary["trained_tokens"] > 0
    assert run.data.tags["dapo.git_commit"] and "dapo.version.torch" in run.data.tags
    assert run.data.params["algo.clip.eps_high"] == ("0.28" if exp == "tiny-dapo" else "0.2")
    assert "step 3/3" in p.stdout and "done:" in p.stdout


@pytest.mark.slow
def test_interrupted_run_resumes_to_the_same_metrics(tmp_path, base_model_path):
    """kill -9 after step 3's update (before its checkpoint) → rerun resumes from step 2 and
    ends with exactly the metrics of an uninterrupted run; MLflow has each step once."""
    mine = ["train.rollout_steps=4", f"model.path={base_model_path}", "rollout.engine=hf", "eval.every=2",
            "algo.dynamic_sampling.on_exhausted=proceed"]
    keys = {o.split("=", 1)[0] for o in mine}                              # a key given twice is refused
    common = ["experiments/tiny-dapo.yaml", *[o for o in E2E if o.split("=", 1)[0] not in keys], *mine]
    res = {}
    for name in ["straight", "killed"]:
        uri = f"sqlite:///{tmp_path / name / 'mlruns.db'}"
        args = [*common, f"output_dir={tmp_path / name}", f"logging.tracking_uri={uri}",
                "--run-dir", str(tmp_path / name / "run")]
        if name == "killed":
            p = _run(args, env={"DAPO_FAULT_KILL_AT_STEP": "3"}, check=False)
            assert p.returncode == -9, p.stderr[-2000:]
            assert not (tmp_path / name / "run" / "summary.json").exists()
            p = _run(args)
            assert "resuming from" in p.stdout
        else:
            _run(args)
        summary = json.loads((tmp_path / name / "run" / "summary.json").read_text())
        res[name] = _history(uri, summary["mlflow_run_id"])[1]
        res[name + " tokens"] = (summary["gen_tokens"], summary["trained_tokens"])
    assert res["killed tokens"] == res["straight tokens"]      # the totals survive the resume, counted once
    a, b = res["straight"], res["killed"]
    assert [s for s, _ in b["progress/rollout_step"]] == [s for s, _ in a["progress/rollout_step"]]
    for key in a:
        if key.startswith(("time/", "perf/")):
            continue
        assert b[key] == a[key], key


@pytest.mark.slow
def test_smollm2_one_rollout_and_one_update_on_cpu(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    _run(["experiments/smollm2-135m-gsm8k.yaml", "train.rollout_steps=1", "train.batch_prompts=2",
          "train.mini_batch_prompts=2", "train.micro_batch_seqs=4", "rollout.n=2", "rollout.max_new_tokens=32",
          "algo.overlong.max_len=32", "algo.overlong.cache_len=8", "algo.dynamic_sampling.enabled=false",
          "eval.at_start=false", "eval.datasets=[{name: gsm8k, limit: 2}]", "eval.k=1",
          "logging.progress=false", f"output_dir={tmp_path}", f"logging.tracking_uri={uri}",
          "--run-dir", str(tmp_path / "run")], timeout=1200)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["grad_steps"] == 1


def test_overlong_filter_masks_truncated_not_finished_responses():
    from dapo.train.logprobs import response_loss_mask
    resp = torch.ones(3, 4)
    finished = torch.tensor([True, False, True])          # the middle one hit the length cap
    assert response_loss_mask(resp, finished, False).tolist() == resp.tolist()
    assert response_loss_mask(resp, finished, True).sum(1).tolist() == [4.0, 0.0, 4.0]
