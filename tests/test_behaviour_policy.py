"""Step 5, the behaviour policy (dapo/train/behaviour.py): each mode of the registry on a hand-made batch of
4 responses (2 groups of 2) with the trainer's forwards faked, checking which log-probs are π_old and
π_rollout, the loss mask, the token weights and the metric keys; which modes a config runs; and that
the loop that calls them stays short."""

from __future__ import annotations

import inspect
import math
from dataclasses import replace

import pytest
import torch

from dapo.config import load_config
from dapo.train import behaviour as bp
from dapo.train.rollout import RolloutBatch

# 4 responses of 3, 2, 3 and 1 tokens (L = 3); log rho = old - rollout on the real tokens:
#   row 0: log 1.5, log 0.25, 0     row 1: log 3.0, log 1.1     row 2: 0, 0, log 0.5     row 3: log 1.2
LENS = (3, 2, 3, 1)
MASK = torch.tensor([[1.0, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]])
ROLL = torch.tensor([[-1.0, -2.0, -0.5], [-1.2, -0.3, 0.0], [-0.7, -0.1, -2.0], [-0.4, 0.0, 0.0]])
RHO = torch.tensor([[1.5, 0.25, 1.0], [3.0, 1.1, 1.0], [1.0, 1.0, 0.5], [1.2, 1.0, 1.0]])
OLD = (ROLL + RHO.log()) * MASK                                 # [N, L] log pi_old, 0 at padding
ENT = torch.tensor([[0.1, 0.9, 0.5], [0.8, 0.2, 0.0], [0.3, 0.7, 0.4], [0.6, 0.0, 0.0]])
ADV = torch.tensor([1.0, -1.0, 0.0, 0.0])                       # [N]


def _cfg(*overrides: str):
    """Two groups, one mini-batch of one group: two optimizer steps (not on-policy) unless overridden."""
    base = {"rollout.n": "2", "train.batch_prompts": "2", "train.mini_batch_prompts": "1", "train.micro_batch_seqs": "2",
            **dict(o.split("=", 1) for o in overrides)}
    return load_config(None, [f"{k}={v}" for k, v in base.items()])


def _batch(rollout: bool = True, finished=(True, True, True, True), in_loss=None) -> RolloutBatch:
    resp = [[5 + j for j in range(n)] for n in LENS]
    lps = [ROLL[i, :n].tolist() for i, n in enumerate(LENS)] if rollout else None
    return RolloutBatch([[1, 2]] * 4, resp, torch.tensor(finished), torch.zeros(2, 2, dtype=torch.bool),
                        torch.zeros(2, 2), torch.zeros(2, 2), rollout_logprobs=lps, in_loss=in_loss)


class FakeForwards:
    """The trainer's forwards: π_old = OLD (entropy ENT, or None for ``none``); the lagged weights' log-probs
    ``lag``; every call recorded."""

    def __init__(self, lag: torch.Tensor | None = None):
        self.calls: list[str] = []
        self.lag = lag

    def forward(self, entropy: str):
        self.calls.append(entropy)
        return OLD.clone(), None if entropy == "none" else ENT.clone(), MASK.clone()

    def lag_forward(self) -> torch.Tensor:
        self.calls.append("lag")
        return self.lag.clone()


def _inputs(cfg, batch, fw: FakeForwards, world: int = 1) -> bp.Inputs:
    return bp.Inputs(cfg, batch, ADV, fw.forward, fw.lag_forward if fw.lag is not None else None, world)


def _blank(batch: RolloutBatch, loss_mask: torch.Tensor = MASK) -> bp.Behaviour:
    """What :func:`bp.behaviour_policy` starts the modes from."""
    rollout = None if batch.rollout_logprobs is None else ROLL * MASK
    return bp.Behaviour("trainer", rollout, MASK.clone(), loss_mask.clone())


def _mismatch_keys(metrics) -> set[str]:
    return {k for k in metrics if k.startswith("mismatch/")}


# =========================================================================== which modes a config runs
@pytest.mark.parametrize("overrides, rollout, lagged, expected", [
    ((), True, False, ("trainer", "mismatch")),
    ((), False, False, ("trainer",)),
    (("train.mini_batch_prompts=2",), True, True, ("on_policy",)),           # one step: no pass, no lag split
    (("train.mini_batch_prompts=2", "train.ppo_epochs=2"), True, False, ("trainer", "mismatch")),
    (("algo.old_logprobs=rollout",), True, True, ("bypass",)),
    (("algo.old_logprobs=rollout", "train.mini_batch_prompts=2"), True, False, ("bypass",)),
    (("algo.top_entropy_quantile=0.5", "train.mini_batch_prompts=2"), True, False,
     ("trainer", "top_entropy", "mismatch")),                                # the selection needs pi_old's pass
    (("algo.rollout_correction.mode=tis", "train.mini_batch_prompts=2"), True, False, ("trainer", "correction")),
    (("algo.rollout_correction.mode=mis",), True, True, ("trainer", "correction", "lag_split")),
    ((), True, True, ("trainer", "mismatch", "lag_split")),
    ((), False, True, ("trainer",)),                                         # no engine log-probs: nothing to split
])
def test_the_modes_a_config_runs(overrides, rollout, lagged, expected):
    assert bp.modes(_cfg(*overrides), 2, rollout, lagged) == expected


def test_every_mode_is_registered_with_its_source_named():
    assert set(bp.SOURCES) <= set(bp.MODES)
    for name, fn in bp.MODES.items():
        assert fn.__doc__ and len(fn.__doc__) > 80, name
    assert "80/20" in bp.top_entropy.__doc__ and "bypass" in bp.bypass.__doc__ and "Yao et al." in bp.bypass.__doc__


# =========================================================================== the sources of pi_old
def test_trainer_pass_uses_the_trainers_logprobs_and_logs_pi_old():
    fw = FakeForwards()
    b = bp.behaviour_policy(_inputs(_cfg(), _batch(), fw))
    assert fw.calls == ["local"]                                 # this rank's entropies: a metric only
    assert b.source == "trainer" and torch.equal(b.old_lp, OLD) and torch.equal(b.entropy, ENT)
    assert torch.equal(b.rollout_lp, ROLL * MASK) and torch.equal(b.resp_mask, MASK)
    assert torch.equal(b.loss_mask, MASK) and b.weight is None and b.own_lp is None
    assert {"train/entropy", "train/token_prob_mean", "mismatch/k3", "mismatch/kl", "mismatch/k3_len_le16",
            "rollout/adv_abs_mean", "rollout/adv_zero_frac"} <= set(b.metrics)
    assert not {"mismatch/is_weight_mean", "mismatch/lag/k3", "train/entropy_kept_frac"} & set(b.metrics)
    assert b.metrics["train/entropy"] == pytest.approx(float((ENT * MASK).sum()) / 9)
    assert b.metrics["rollout/adv_abs_mean"] == pytest.approx(5 / 9)          # |A| = 1 on rows 0, 1 (3 + 2 tokens)
    assert b.after_update() == b.metrics                                       # nothing left for after the update


def test_the_loss_mask_drops_overlong_rows_and_masked_groups():
    cfg = _cfg("algo.overlong.filter=true")
    b = bp.behaviour_policy(_inputs(cfg, _batch(finished=(True, False, True, True),
                                                in_loss=torch.tensor([True, False])), FakeForwards()))
    assert torch.equal(b.loss_mask, MASK * torch.tensor([1.0, 0, 0, 0])[:, None])   # row 1 truncated, group 1 out
    assert torch.equal(b.resp_mask, MASK)                                           # the metrics keep every token


def test_on_policy_single_step_makes_no_pass_and_compares_the_updates_own_forward():
    cfg, fw = _cfg("train.mini_batch_prompts=2"), FakeForwards()
    b = bp.behaviour_policy(_inputs(cfg, _batch(), fw))
    assert fw.calls == [] and b.source == "on_policy"
    assert b.old_lp is None and b.entropy is None and b.weight is None and torch.equal(b.loss_mask, MASK)
    assert torch.equal(b.own_lp, torch.zeros(4, 3)) and b.own_lp.dtype == torch.float32
    assert not _mismatch_keys(b.metrics) and "train/entropy" not in b.metrics   # the update logs pi_old's entropy
    b.own_lp.copy_(OLD)                                                          # what the update writes
    after = b.after_update(world=1)
    assert after["mismatch/k3"] == pytest.approx(float(((RHO - RHO.log() - 1) * MASK).sum()) / 9)
    assert after["rollout/adv_abs_mean"] == b.metrics["rollout/adv_abs_mean"]
    # without the engine's log-probs there is nothing to compare: no buffer, no mismatch
    b = bp.behaviour_policy(_inputs(cfg, _batch(rollout=False), fw))
    assert b.own_lp is None and b.rollout_lp is None and not _mismatch_keys(b.after_update())


def test_bypass_takes_pi_old_from_the_engine_and_logs_no_mismatch():
    cfg, fw = _cfg("algo.old_logprobs=rollout"), FakeForwards()
    b = bp.behaviour_policy(_inputs(cfg, _batch(), fw))
    assert fw.calls == [] and b.source == "bypass"
    assert b.old_lp is b.rollout_lp and torch.equal(b.old_lp, ROLL * MASK)
    assert b.entropy is None and b.weight is None and b.own_lp is None and torch.equal(b.loss_mask, MASK)
    assert not _mismatch_keys(b.after_update()) and "train/entropy" not in b.metrics
    with pytest.raises(RuntimeError, match="returned none"):
        bp.bypass(_blank(_batch(rollout=False)), _inputs(cfg, _batch(rollout=False), fw))


# =========================================================================== the stages after the trainer's pass
def test_top_entropy_keeps_the_highest_entropy_loss_tokens_of_every_row():
    cfg, fw = _cfg("algo.top_entropy_quantile=0.5"), FakeForwards()
    b = bp.behaviour_policy(_inputs(cfg, _batch(), fw, world=2))   # world 2: the entropies are every row's,
    assert fw.calls == ["rows"]                                     # so no cross-rank sum (none here) is needed
    # 9 loss tokens, keep ceil(4.5) = 5: entropies 0.9, 0.8, 0.7, 0.6, 0.5
    kept = torch.tensor([[0.0, 1, 1], [1, 0, 0], [0, 1, 0], [1, 0, 0]])
    assert torch.equal(b.loss_mask, kept) and torch.equal(b.resp_mask, MASK) and b.weight is None
    assert b.metrics["train/entropy_kept_frac"] == pytest.approx(5 / 9)
    assert b.metrics["rollout/adv_abs_mean"] == pytest.approx(3 / 5)       # over the kept tokens
    # the mode alone, on a loss mask that already lost row 0
    x = _inputs(cfg, _batch(), fw)
    alone = bp.top_entropy(bp.trainer_pass(_blank(_batch(), MASK * torch.tensor([0.0, 1, 1, 1])[:, None]), x), x)
    assert torch.equal(alone.loss_mask, torch.tensor([[0.0, 0, 0], [1, 0, 0], [0, 1, 0], [1, 0, 0]]))
    assert alone.metrics["train/entropy_kept_frac"] == pytest.approx(3 / 6)


def test_tis_weights_every_token_and_rejects_none():
    cfg = _cfg("algo.rollout_correction.mode=tis", "algo.rollout_correction.cap=2.0")
    b = bp.behaviour_policy(_inputs(cfg, _batch(), FakeForwards()))
    assert torch.allclose(b.weight, RHO.clamp(max=2.0) * MASK, atol=1e-6)
    assert torch.equal(b.loss_mask, MASK) and torch.equal(b.old_lp, OLD)
    assert {"mismatch/is_weight_mean", "mismatch/is_weight_min", "mismatch/is_weight_max", "mismatch/ess",
            "mismatch/masked_frac", "mismatch/k3"} <= set(b.metrics)
    assert b.metrics["mismatch/masked_frac"] == 0.0 and b.metrics["mismatch/is_weight_max"] == pytest.approx(2.0)
    # |A·w| over the loss tokens: row 0 (A = 1) 1.5 + 0.25 + 1, row 1 (A = -1) 2 + 1.1
    assert b.metrics["rollout/adv_abs_mean"] == pytest.approx((2.75 + 3.1) / 9, rel=1e-6)


def test_mis_rejects_the_tokens_outside_the_band():
    cfg = _cfg("algo.rollout_correction.mode=mis", "algo.rollout_correction.lo=0.5", "algo.rollout_correction.hi=2.0")
    b = bp.correction(replace(_blank(_batch()), old_lp=OLD), _inputs(cfg, _batch(), FakeForwards()))
    keep = MASK * ((RHO >= 0.5) & (RHO <= 2.0)).float()          # rho 0.25 (row 0) and 3.0 (row 1) out
    assert torch.equal(b.loss_mask, keep) and torch.allclose(b.weight, RHO * keep, atol=1e-6)
    assert b.metrics["mismatch/masked_frac"] == pytest.approx(2 / 9)
    assert "rollout/adv_abs_mean" not in b.metrics               # the mode alone: no advantage stats yet
    with pytest.raises(RuntimeError, match="returned none"):
        bp.behaviour_policy(_inputs(cfg, _batch(rollout=False), FakeForwards()))


def test_staleness_splits_the_mismatch_at_the_lagged_weights():
    lag = ROLL * MASK + 0.1 * MASK                               # pi_lag: the sampling weights in the trainer
    fw = FakeForwards(lag=lag)
    b = bp.behaviour_policy(_inputs(_cfg(), _batch(), fw))
    assert fw.calls == ["local", "lag"] and torch.equal(b.old_lp, OLD) and b.weight is None
    parts = {k for k in b.metrics if k.startswith(("mismatch/kernel/", "mismatch/lag/"))}
    assert {"mismatch/kernel/k3", "mismatch/lag/k3", "mismatch/kernel/abs_diff_max", "mismatch/lag/kl"} <= parts
    assert not any("_len_" in k for k in parts) and "mismatch/k3_len_le16" in b.metrics
    # log rho = (old - lag) + (lag - rollout): the kernel part is the constant 0.1 here
    assert b.metrics["mismatch/kernel/abs_diff_max"] == pytest.approx(0.1, abs=1e-6)
    assert b.metrics["mismatch/kernel/kl"] == pytest.approx(-0.1, abs=1e-6)
    # on-policy single step and bypass never run the lagged forward
    for cfg in (_cfg("train.mini_batch_prompts=2"), _cfg("algo.old_logprobs=rollout")):
        fw = FakeForwards(lag=lag)
        b = bp.behaviour_policy(_inputs(cfg, _batch(), fw))
        assert "lag" not in fw.calls and not any(k.startswith("mismatch/lag/") for k in b.after_update())


def test_the_modes_leave_their_input_alone():
    """Each mode returns a new Behaviour (frozen): the one it was given keeps its mask and metrics."""
    cfg = _cfg("algo.rollout_correction.mode=mis", "algo.top_entropy_quantile=0.5")
    x = _inputs(cfg, _batch(), FakeForwards())
    start = bp.trainer_pass(_blank(_batch()), x)
    metrics = dict(start.metrics)
    for name in ("top_entropy", "correction", "mismatch"):
        out = bp.MODES[name](start, x)
        assert out is not start and torch.equal(start.loss_mask, MASK) and start.metrics == metrics
    with pytest.raises(Exception):
        start.old_lp = None


def test_advantage_stats_count_only_the_loss_tokens():
    s = bp.advantage_stats(ADV, MASK * torch.tensor([1.0, 0, 1, 1])[:, None], torch.full((4, 3), 2.0))
    assert s == {"rollout/adv_abs_mean": pytest.approx(6 / 7), "rollout/adv_zero_frac": pytest.approx(4 / 7)}
    assert bp.advantage_stats(ADV, torch.zeros(4, 3)) == {}
    assert math.isclose(bp.advantage_stats(ADV, MASK)["rollout/adv_zero_frac"], 4 / 9)


# =========================================================================== the loop
def test_the_training_loop_reads_as_algorithm_1_in_at_most_60_lines():
    from dapo.train import loop as train
    src = inspect.getsource(train._train)
    assert len(src.rstrip("\n").splitlines()) <= 60
    assert "_behaviour(run, batch, adv, r)" in src and "after_update" in src
    assert "old_logprobs(" not in src and "single_step_on_policy" not in src    # the modes live in dapo.train.behaviour
