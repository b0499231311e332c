"""``dapo plan EXP [k=v ...] --cluster PROFILE``: does a run fit its GPUs, and how long is a step?

Arithmetic from stated assumptions, not a measurement: every number it prints is derived from
the config, the model's shape, the cluster profile's ``gpu_memory_gib`` and the assumptions in
:class:`Assumptions` (each printed, each a flag). Pure: imports neither torch nor vLLM.

Memory per GPU, in three phases of a rollout step (the peak is the largest):

- **generation**: the trainer's resident shards (parameters + AdamW moments; gradients are
  freed after each optimizer step) + vLLM's reservation ``gpu_memory_utilization × GPU``;
  inside that reservation: weights ``2·P / TP`` + activations + KV cache, which must hold at
  least one full-length sequence.
- **update**: parameter, gradient and AdamW shards under FSDP FULL_SHARD (``1 / (nodes ×
  GPUs)`` each) + the gathered bf16 working set (one [V, h] matrix: the lm_head unit at the turn
  from forward to backward, or a tied embedding in the root; and two decoder layers: the one
  computing and the one prefetched) + the unsharded bf16 gradient of the largest unit and its
  fp32 copy for the reduce-scatter (``reduce_dtype`` fp32) + activations at the token budget
  (with gradient checkpointing: each layer's bf16 input, plus one layer recomputed) + logits of
  the response positions only (``logits_to_keep``; bf16 under autocast, else fp32) kept for
  backward, their gradient (same size), and in one ``logits_chunk_tokens`` chunk's backward its
  fp32 log-softmax and the gradients into and out of it (unset: ~16 MiB of fp32 rows,
  ``dapo.config.default_chunk_rows``), with more than one chunk their gradients once more before
  they are concatenated + without FSDP under autocast, autocast's bf16 copy of every weight +
  what vLLM keeps while it sleeps (everything, without sleep mode).
- **weight sync**: resident shards + vLLM's weights (awake) + one parameter gathered in the
  rollout dtype (each shard is cast before the gather, ``dapo.engines.weight_sync``).

Time per rollout step: generation rounds at the cluster's decode throughput, but no shorter
than one full-length response at a single sequence's decode speed; the update at
``(6 + 2·checkpointing)·P`` FLOP per trained token (+ ``2·P`` for the old-log-prob forward when a
batch feeds several optimizer steps) and a stated MFU; the weight sync as one all-gather of the
model in the rollout dtype (bf16) (sleep level 2 drops vLLM's weights; the push refills them).
The peak is the cluster profile's GPU's (:func:`gpu_peak`: ``gpu_peak_tflops``, else ``gpu`` looked up
in :data:`GPU_PEAKS`; an unknown GPU without a stated peak is refused; ``--peak-tflops`` overrides both).
Evaluation (:func:`eval_time`): every ``eval.every`` steps (and at the start and the end), the eval sets'
problems × ``eval.k`` samples generated like a rollout round, amortized per step.
Checkpoints (:func:`checkpoint_time`): what the loop waits for each one, synchronous or
``checkpoint.async_save``, amortized per step, and the host memory an asynchronous one holds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from dapo.config import Config, ConfigError, default_chunk_rows, load_config
from dapo.helptext import help_text

__all__ = ["ModelShape", "KNOWN_MODELS", "model_shape", "Assumptions", "GPU_PEAKS", "gpu_peak", "Term", "Plan",
           "memory_plan", "step_time", "eval_time", "checkpoint_time", "render", "render_checkpoints", "check_fits", "check_sweep", "main"]

GiB = 2 ** 30


# --------------------------------------------------------------------------- model shapes
@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer (Qwen2 / Llama layout: RMSNorm, GQA attention, SwiGLU MLP)."""
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool = False            # lm_head shares the embedding matrix
    qkv_bias: bool = True         # Qwen2: q/k/v projections have a bias; Llama: none
    source: str = ""

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * (self.hidden // self.heads)

    @property
    def layer_params(self) -> int:
        h, kv = self.hidden, self.kv_dim
        attn = 2 * h * h + 2 * h * kv + ((h + 2 * kv) if self.qkv_bias else 0)
        return attn + 3 * h * self.intermediate + 2 * h           # + 2 RMSNorm weights

    @property
    def root_params(self) -> int:
        """Embeddings + lm_head (+ the final norm): every parameter outside the decoder layers."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    @property
    def largest_unit_params(self) -> int:
        """The largest FSDP unit (``dapo.dist.distributed.shard_causal_lm``): a decoder layer, or one [V, h]
        matrix (an untied embedding or lm_head is a unit of its own; a tied one sits in the root)."""
        return max(self.layer_params, self.vocab * self.hidden + (self.hidden if self.tied else 0))

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.root_params

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """K and V of every layer for one token."""
        return 2 * self.layers * self.kv_dim * dtype_bytes

    @property
    def act_values_per_token(self) -> int:
        """bf16 values one decoder layer keeps per token for its backward: input-norm output, q,
        attention output, o-proj output, residual, post-attention-norm output (6·h), k and v
        (2·kv), MLP gate, up, act(gate) and act(gate)·up (4·I). Flash/SDPA attention keeps no
        L×L matrix."""
        return 6 * self.hidden + 2 * self.kv_dim + 4 * self.intermediate


def _tiny_shapes() -> dict[str, ModelShape]:
    from dapo.models import BYTE_OFFSET, TINY_PRESETS   # stdlib-only module: no torch
    return {name: ModelShape(name, p["hidden_size"], p["num_layers"], p["num_heads"], p["num_kv_heads"],
                             3 * p["hidden_size"], BYTE_OFFSET + 256, tied=True,
                             source="dapo.models.TINY_PRESETS")
            for name, p in TINY_PRESETS.items()}


#: Shapes from each model's config.json on the Hugging Face hub (so no download is needed).
KNOWN_MODELS: dict[str, ModelShape] = {
    "Qwen/Qwen2.5-32B": ModelShape("Qwen/Qwen2.5-32B", 5120, 64, 40, 8, 27648, 152064,
                                   source="config.json of Qwen/Qwen2.5-32B"),
    "Qwen/Qwen2.5-Math-7B": ModelShape("Qwen/Qwen2.5-Math-7B", 3584, 28, 28, 4, 18944, 152064,
                                       source="config.json of Qwen/Qwen2.5-Math-7B"),
    "Qwen/Qwen2.5-7B": ModelShape("Qwen/Qwen2.5-7B", 3584, 28, 28, 4, 18944, 152064,
                                  source="config.json of Qwen/Qwen2.5-7B"),
    "smollm2-135m-instruct": ModelShape("smollm2-135m-instruct", 576, 30, 9, 3, 1536, 49152, tied=True,
                                        qkv_bias=False, source="config.json of HuggingFaceTB/SmolLM2-135M-Instruct"),
    **_tiny_shapes(),
}


def model_shape(path: str) -> ModelShape:
    """``model.path`` → its shape: a local directory's config.json, else the table above."""
    cfg_file = Path(path) / "config.json"
    if cfg_file.is_file():
        try:
            c = json.loads(cfg_file.read_text())
            return ModelShape(path, c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"],
                              c.get("num_key_value_heads", c["num_attention_heads"]), c["intermediate_size"],
                              c["vocab_size"], tied=bool(c.get("tie_word_embeddings", False)),
                              qkv_bias=c.get("model_type") == "qwen2" or bool(c.get("attention_bias", False)),
                              source=str(cfg_file))
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{cfg_file}: not a usable transformer config.json ({exc!r} missing or bad)") from None
    from dapo.base_model import named_recipe
    try:
        recipe = named_recipe(path)   # a tiny supervised base model (dapo base)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if recipe is not None:
        return dataclasses.replace(KNOWN_MODELS[recipe.get("preset", "tiny-3m")], name=path)
    key = {k.lower(): k for k in KNOWN_MODELS}.get(path.lower())
    if key is None:
        raise ConfigError(f"model.path = {path!r}: unknown shape for dapo plan; known: {', '.join(KNOWN_MODELS)}, "
                          f"or a local directory with a config.json")
    return KNOWN_MODELS[key]


# --------------------------------------------------------------------------- assumptions
@dataclass(frozen=True)
class Assumptions:
    """Every number the plan takes on faith (each is a `dapo plan` flag)."""
    peak_tflops: float = 989.0           # dense bf16 peak of one GPU: the profile's (gpu_peak), else an H100 SXM's
    mfu: float = 0.35                    # update FLOP utilisation (large FSDP runs report 30-45%)
    decode_tps_32b: float = 2500.0       # vLLM decode tokens/s per GPU for a 32B model, large batches;
                                         # scaled by 32.76B / P for other sizes (decode is memory-bound)
    seq_decode_tps: float = 40.0         # one sequence's decode speed inside a full batch (the round's tail)
    mean_prompt_tokens: float = 200.0    # DAPO-Math-17k prompts with the template
    mean_response_tokens: Optional[float] = None   # None: min(4000, max_new_tokens / 2) (paper Fig. 7: ~4k)
    rounds: float = 1.0                  # dynamic-sampling generation rounds per step (one round of
                                         # gen_batch_prompts usually fills the batch)
    allgather_gbs: float = 25.0          # GB/s per GPU of the weight-sync all-gather (inter-node)
    overhead_gib: float = 3.0            # CUDA context, NCCL buffers, allocator fragmentation
    vllm_act_gib: float = 2.0            # vLLM's activations and CUDA graphs inside its reservation
    vllm_sleep_gib: float = 1.0          # what a sleeping engine still holds (sleep level 2 drops weights
                                         # and KV cache; the next weight push refills them)
    fs_write_gbs: float = 10.0           # GB/s all ranks together write checkpoint shards to the shared FS
    d2h_gbs: float = 20.0                # GB/s per GPU of the device-to-host copy (async checkpoints)
    eval_problems: Optional[float] = None   # problems per evaluation; None: counted from eval.datasets

    def check(self) -> "Assumptions":
        """Every assumption finite and in its range (a zero MFU would divide by zero, a negative overhead
        would make anything fit); ConfigError naming the flag otherwise."""
        lo_open = {"peak_tflops", "decode_tps_32b", "seq_decode_tps", "allgather_gbs", "mean_response_tokens",
                   "fs_write_gbs", "d2h_gbs"}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            flag = "--" + f.name.replace("_", "-")
            if v is None and f.name in ("mean_response_tokens", "eval_problems"):
                continue
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                raise ConfigError(f"{flag} = {v!r}: expected a finite number")
            if f.name == "mfu" and not 0 < v <= 1:
                raise ConfigError(f"{flag} = {v:g}: a FLOP utilisation must be in (0, 1]")
            if f.name == "rounds" and v < 1:
                raise ConfigError(f"{flag} = {v:g}: a step takes at least one generation round")
            if f.name in lo_open and v <= 0:
                raise ConfigError(f"{flag} = {v:g}: must be > 0")
            if v < 0:
                raise ConfigError(f"{flag} = {v:g}: must be >= 0")
        return self

    def decode_tps(self, params: int) -> float:
        return self.decode_tps_32b * 32.76e9 / params

    def response_tokens(self, cfg: Config) -> float:
        return self.mean_response_tokens if self.mean_response_tokens is not None else \
            min(4000.0, cfg.rollout.max_new_tokens / 2)


#: Dense (no sparsity) bf16 tensor-core peak of one GPU, TFLOP/s, from NVIDIA's data sheets. Keys are
#: compared without case, spaces, dashes or dots ("H100 SXM" = "h100-sxm"); a bare "H100" is the SXM part.
GPU_PEAKS: dict[str, float] = {
    "H100-SXM": 989.0, "H100": 989.0, "H100-NVL": 835.0, "H100-PCIe": 756.0, "H800": 989.0,
    "H200": 989.0, "GH200": 989.0, "H20": 148.0, "B200": 2250.0, "A100": 312.0, "A800": 312.0, "L40S": 362.0,
}


def _gpu_key(name: str) -> str:
    return "".join(c for c in name.lower() if c.isalnum())


def gpu_peak(profile) -> tuple[float, str]:
    """(dense bf16 TFLOP/s of one of the profile's GPUs, where that number comes from).

    ``gpu_peak_tflops`` if the profile states it; else its ``gpu`` looked up in :data:`GPU_PEAKS`; a GPU not
    there is refused (ConfigError: state its peak). A profile that names no GPU gets an H100 SXM's peak,
    said so in the returned source (the plan prints it)."""
    where = f"cluster profile {profile.name!r} ({profile.path or 'embedded'})"
    gpu = getattr(profile, "gpu", None)
    stated = getattr(profile, "gpu_peak_tflops", None)
    if stated is not None:
        return float(stated), f"the profile's gpu_peak_tflops" + (f" ({gpu})" if gpu else "")
    if gpu is None:
        return GPU_PEAKS["H100-SXM"], "an H100 SXM's: the profile names no gpu (add gpu: or gpu_peak_tflops: to it)"
    peaks = {_gpu_key(k): v for k, v in GPU_PEAKS.items()}
    if _gpu_key(gpu) not in peaks:
        raise ConfigError(f"{where}: gpu = {gpu!r} has no known peak: add gpu_peak_tflops: <its dense bf16 "
                          f"TFLOP/s> to the profile, or pass --peak-tflops (known: {', '.join(GPU_PEAKS)})")
    return peaks[_gpu_key(gpu)], f"the profile's gpu {gpu}, dapo.sweep.plan.GPU_PEAKS"


# --------------------------------------------------------------------------- memory
@dataclass(frozen=True)
class Term:
    name: str
    bytes: float
    knob: str          # the config key that shrinks this term


@dataclass(frozen=True)
class Phase:
    name: str
    terms: tuple[Term, ...]

    @property
    def total(self) -> float:
        return sum(t.bytes for t in self.terms)

    @property
    def largest(self) -> Term:
        return max(self.terms, key=lambda t: t.bytes)


@dataclass(frozen=True)
class Plan:
    cfg: Config
    shape: ModelShape
    gpu_gib: float
    gpus: int                       # nodes × GPUs per node
    shard: int                      # FSDP shard degree
    tokens_per_micro_batch: int
    phases: tuple[Phase, ...]
    vllm: dict                      # inside vLLM's reservation: weights, act, kv, need, reservation (bytes)
    notes: tuple[str, ...]

    @property
    def peak(self) -> Phase:
        return max(self.phases, key=lambda p: p.total)

    @property
    def failure(self) -> Optional[tuple[str, str]]:
        """(largest term, knob) when the run does not fit; None when it does."""
        v = self.vllm
        if v["weights"] + v["act"] + v["kv_one_seq"] > v["reservation"]:
            return (f"vLLM weights {v['weights'] / GiB:.1f} + activations {v['act'] / GiB:.1f} + KV of one "
                    f"sequence {v['kv_one_seq'] / GiB:.1f} GiB exceed its reservation "
                    f"{v['reservation'] / GiB:.1f} GiB", "rollout.tensor_parallel_size")
        if self.peak.total > self.gpu_gib * GiB:
            t = self.peak.largest
            return f"{t.name} {t.bytes / GiB:.1f} GiB in the {self.peak.name} phase", t.knob
        return None


def micro_batch_tokens(cfg: Config) -> tuple[int, Optional[str]]:
    """Tokens one forward/backward holds per GPU, and a note when the budget cannot be met."""
    seq = cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens
    budget = cfg.train.max_tokens_per_micro_batch
    if budget is None:
        return cfg.train.micro_batch_seqs * seq, None   # padded to the longest sequence: the worst case
    if budget < seq:
        return seq, (f"train.max_tokens_per_micro_batch = {budget} is below one full-length sequence "
                     f"({seq} tokens): such a sequence is a micro-batch of its own, planned at {seq}")
    return budget, None


def memory_plan(cfg: Config, shape: ModelShape, gpu_gib: float, a: Assumptions = Assumptions()) -> Plan:
    """Per-GPU memory of each phase of a rollout step (bytes). Pure."""
    L, r, t = cfg.launch, cfg.rollout, cfg.train
    if r.engine != "vllm":
        raise ConfigError(f"rollout.engine = {r.engine!r}: dapo plan models colocated vLLM rollouts only")
    gpus = L.num_nodes * L.num_processes
    shard = gpus if L.fsdp else 1
    P = shape.params
    pb = 4 if cfg.model.train_dtype == "float32" else 2
    T, note = micro_batch_tokens(cfg)
    notes = [note] if note else []
    total = gpu_gib * GiB
    fsdp = "launch.fsdp" if not L.fsdp else "launch.num_nodes"
    params = Term(f"parameter shard ({'fp32' if pb == 4 else 'bf16'}, 1/{shard})", P * pb / shard, fsdp)
    grads = Term(f"gradient shard ({'fp32' if pb == 4 else 'bf16'}, 1/{shard})", P * pb / shard, fsdp)
    optim = Term(f"AdamW moments shard (2 × {'fp32' if pb == 4 else 'bf16'}, 1/{shard})", 2 * P * pb / shard, fsdp)
    over = Term("runtime overhead (CUDA context, NCCL, fragmentation)", a.overhead_gib * GiB, "a larger GPU")
    update = [params, grads, optim]
    autocast = cfg.model.autocast_bf16
    if L.fsdp:
        update.append(Term("gathered bf16 parameters ([V, h] unit + 2 layers)",
                           2 * (shape.vocab * shape.hidden + shape.hidden + 2 * shape.layer_params), "launch.fsdp"))
        unit = shape.largest_unit_params
        update.append(Term("unsharded gradient of the largest unit (bf16)" if autocast else
                           "unsharded gradient of the largest unit", unit * (2 if autocast else pb), "launch.fsdp"))
        if autocast:   # MixedPrecisionPolicy(reduce_dtype=float32): the reduce-scatter input is an fp32 copy
            update.append(Term("fp32 reduce-scatter staging of that unit", unit * 4, "launch.fsdp"))
    elif autocast and pb == 4:   # autocast caches a bf16 copy of every fp32 weight for the forward
        update.append(Term("autocast's bf16 weight copies (no FSDP)", 2 * P, "launch.fsdp"))
    layer_act = T * shape.act_values_per_token * 2
    if cfg.model.gradient_checkpointing:
        update.append(Term(f"activations: layer checkpoints ({T} tokens × {shape.layers} layers)",
                           T * shape.hidden * shape.layers * 2, "train.max_tokens_per_micro_batch"))
        update.append(Term("activations: one layer recomputed", layer_act, "train.max_tokens_per_micro_batch"))
    else:
        update.append(Term(f"activations: {shape.layers} layers, no checkpointing", layer_act * shape.layers,
                           "model.gradient_checkpointing"))
    # logits only at the response positions (logits_to_keep): T × max_new / (prompt + max_new), exact at full length
    T_resp = math.ceil(T * r.max_new_tokens / (cfg.data.max_prompt_tokens + r.max_new_tokens))
    lb, lname = (2, "bf16") if autocast else (pb, "fp32" if pb == 4 else "bf16")
    chunk = min(t.logits_chunk_tokens or default_chunk_rows(shape.vocab), T_resp)
    update.append(Term(f"logits kept for backward ({lname}, {T_resp} response tokens)", T_resp * shape.vocab * lb,
                       "train.max_tokens_per_micro_batch"))
    update.append(Term(f"logits gradient ({lname}, {T_resp} response tokens)", T_resp * shape.vocab * lb,
                       "train.max_tokens_per_micro_batch"))
    # a chunk's backward: its fp32 log-softmax (saved), the gradient arriving at it and the one leaving it
    update.append(Term(f"logits chunk: fp32 log-softmax + 2 gradients ({chunk} tokens)", chunk * shape.vocab * 4 * 3,
                       "train.logits_chunk_tokens"))
    if chunk < T_resp:   # torch.split's backward holds every chunk's gradient until it concatenates them
        update.append(Term(f"logits chunks' gradients before their concatenation ({lname})",
                           T_resp * shape.vocab * lb, "train.logits_chunk_tokens"))
    reservation = r.gpu_memory_utilization * total
    update.append(Term("vLLM asleep" if r.sleep_mode else "vLLM reservation held (no sleep mode)",
                       a.vllm_sleep_gib * GiB if r.sleep_mode else reservation, "rollout.sleep_mode"))
    update.append(over)
    resident = [params, optim]
    tp = r.tensor_parallel_size
    w = 2 * P / tp
    gen = resident + [Term(f"vLLM reservation ({r.gpu_memory_utilization} × {gpu_gib} GiB)", reservation,
                           "rollout.gpu_memory_utilization"), over]
    biggest = max(shape.vocab * shape.hidden, shape.hidden * shape.intermediate)
    sync = resident + [Term(f"vLLM weights awake (bf16, TP {tp})", w, "rollout.tensor_parallel_size"),
                       Term("one gathered parameter (bf16: the shard is cast first)", biggest * 2, "launch.fsdp"),
                       over]
    seq = cfg.data.max_prompt_tokens + r.max_new_tokens
    kv_tok = shape.kv_bytes_per_token() / tp
    kv = max(0.0, reservation - w - a.vllm_act_gib * GiB)
    vllm = {"weights": w, "act": a.vllm_act_gib * GiB, "kv": kv, "kv_one_seq": kv_tok * seq,
            "reservation": reservation, "kv_tokens": kv / kv_tok, "seqs": kv / (kv_tok * seq)}
    phases = (Phase("generation", tuple(gen)), Phase("update", tuple(update)), Phase("weight sync", tuple(sync)))
    return Plan(cfg, shape, gpu_gib, gpus, shard, T, phases, vllm, tuple(notes))


# --------------------------------------------------------------------------- time
def step_time(cfg: Config, shape: ModelShape, a: Assumptions = Assumptions()) -> dict[str, float]:
    """Seconds per rollout step by phase, and the token counts behind them. Pure."""
    L, r, t = cfg.launch, cfg.rollout, cfg.train
    gpus = L.num_nodes * L.num_processes
    P = shape.params
    resp = a.response_tokens(cfg)
    gen_tokens = a.rounds * cfg.gen_batch_prompts * r.n * resp
    round_s = max(gen_tokens / a.rounds / (gpus * a.decode_tps(P)), r.max_new_tokens / a.seq_decode_tps)
    trained = t.batch_prompts * r.n * (a.mean_prompt_tokens + resp)
    per_token = (6 + (2 if cfg.model.gradient_checkpointing else 0)) * P
    flops = per_token * trained * t.ppo_epochs + (2 * P * trained if cfg.grad_steps_per_rollout > 1 else 0)
    update_s = flops / (gpus * a.peak_tflops * 1e12 * a.mfu)
    w = 2 * P
    sync_s = w / (a.allgather_gbs * 1e9)     # every rank gathers the whole bf16 model, one tensor at a time
    gen_s = a.rounds * round_s
    return {"generated_tokens": gen_tokens, "trained_tokens": trained, "update_flop": flops,
            "generation_s": gen_s, "round_s": round_s, "update_s": update_s, "sync_s": sync_s,
            "step_s": gen_s + update_s + sync_s}


def eval_problems(cfg: Config, a: Assumptions = Assumptions()) -> float:
    """Problems one evaluation generates for: ``--eval-problems``, else each eval set's ``limit`` or its
    row count (the registry's shipped sets are read; plain Python, no torch)."""
    if a.eval_problems is not None:
        return a.eval_problems
    from dapo.data.datasets import load_dataset
    n = 0
    for i, d in enumerate(cfg.eval.datasets):
        if d.limit is not None:
            n += d.limit
            continue
        try:
            n += load_dataset(d.name)[1].kept
        except Exception as exc:   # an hf: set offline, a missing file: the plan cannot count it
            raise ConfigError(f"eval.datasets[{i}].name = {d.name!r}: dapo plan cannot count its problems ({exc}); "
                              f"pass --eval-problems N") from None
    return float(n)


def eval_time(cfg: Config, shape: ModelShape, a: Assumptions = Assumptions(),
              problems: Optional[float] = None) -> dict[str, float]:
    """Evaluation's cost (``dapo.train.evaluate``): ``eval.k`` samples of each problem, generated like a rollout
    round on every GPU: the tokens at the decode throughput, but no shorter than one response of the eval
    cap (``eval.max_new_tokens`` or ``rollout.max_new_tokens``) at one sequence's speed. The loop evaluates
    at the start (``eval.at_start``), every ``eval.every`` steps and at the end. Keys: problems, tokens (per
    evaluation), each_s, evals (in the run), per_step_s (amortized over ``train.rollout_steps``). Pure
    (``problems`` given; None counts them, :func:`eval_problems`)."""
    e, steps = cfg.eval, cfg.train.rollout_steps
    gpus = cfg.launch.num_nodes * cfg.launch.num_processes
    n = eval_problems(cfg, a) if problems is None else problems
    cap = e.max_new_tokens or cfg.rollout.max_new_tokens
    resp = a.mean_response_tokens if a.mean_response_tokens is not None else min(4000.0, cap / 2)
    tokens = n * e.k * resp
    each = max(tokens / (gpus * a.decode_tps(shape.params)), cap / a.seq_decode_tps) if tokens else 0.0
    evals = int(e.at_start) + (steps // e.every if e.every else 0) + (1 if not e.every or steps % e.every else 0)
    return {"problems": n, "tokens": tokens, "each_s": each, "evals": evals,
            "per_step_s": each * evals / max(steps, 1)}


def checkpoint_time(cfg: Config, shape: ModelShape, step_s: float, a: Assumptions = Assumptions()) -> dict[str, float]:
    """What checkpoints cost the loop (``dapo.train.checkpoint``). Pure.

    A checkpoint holds the fp32 master weights and AdamW's two fp32 moments, 12·P bytes over all ranks
    (+ 4·P per step of ``train.staleness``: the lagged weights), each rank writing its shard. Synchronous,
    the loop waits for the whole write at ``fs_write_gbs`` (all ranks together). With
    ``checkpoint.async_save`` it waits only for its shard's copy to host memory at ``d2h_gbs``, and each
    node holds its GPUs' shards in host memory while the write runs; the write must end within
    ``every`` steps, or the next checkpoint waits for the rest. ``every`` 0 saves once, at the end.
    Keys: bytes, host_bytes_per_node, write_s, copy_s and late_s (async), wait_s (per checkpoint), per_step_s
    (wait / every), saves."""
    L, c = cfg.launch, cfg.checkpoint
    gpus = L.num_nodes * L.num_processes
    total = (12 + 4 * cfg.train.staleness) * shape.params
    write_s = total / (a.fs_write_gbs * 1e9)
    every = c.every or cfg.train.rollout_steps
    if c.async_save:
        copy_s = total / gpus / (a.d2h_gbs * 1e9)
        late_s = max(0.0, write_s - every * step_s)        # a write still running when the next checkpoint begins
        host, wait_s = total / L.num_nodes, copy_s + late_s
    else:
        copy_s, late_s, host, wait_s = 0.0, 0.0, 0.0, write_s
    return {"bytes": total, "host_bytes_per_node": host, "write_s": write_s, "copy_s": copy_s, "late_s": late_s,
            "wait_s": wait_s, "per_step_s": wait_s / every, "saves": math.ceil(cfg.train.rollout_steps / every)}


def overlapped_step_time(cfg: Config, shape: ModelShape, a: Assumptions = Assumptions()) -> Optional[dict[str, float]]:
    """The one-step-off layout, priced (not built; ``train.staleness=1`` is its deterministic reference):
    g of the G GPUs generate step r + 1 while the other G − g update on step r, so a step takes
    max(generation on g, update on G − g) + the weight sync. g runs over whole nodes (whole tensor-parallel
    engines on one node), and the fastest split is returned: {gen_gpus, train_gpus, generation_s, update_s,
    sync_s, step_s}; None with fewer than two such units. Generation keeps its floor (one full-length
    response at ``seq_decode_tps``), which is why it pays: colocated, every GPU waits for that tail. Pure."""
    base = step_time(cfg, shape, a)
    L, r = cfg.launch, cfg.rollout
    gpus = L.num_nodes * L.num_processes
    unit = L.num_processes if L.num_nodes > 1 else max(r.tensor_parallel_size, 1)
    best = None
    for g in range(unit, gpus, unit):
        per_round = base["generated_tokens"] / a.rounds
        gen_s = a.rounds * max(per_round / (g * a.decode_tps(shape.params)), r.max_new_tokens / a.seq_decode_tps)
        update_s = base["update_flop"] / ((gpus - g) * a.peak_tflops * 1e12 * a.mfu)
        step = max(gen_s, update_s) + base["sync_s"]
        if best is None or step < best["step_s"]:
            best = {"gen_gpus": g, "train_gpus": gpus - g, "generation_s": gen_s, "update_s": update_s,
                    "sync_s": base["sync_s"], "step_s": step}
    return best


# --------------------------------------------------------------------------- output
def render(plan: Plan, times: dict[str, float], a: Assumptions, where: str, ev: Optional[dict[str, float]] = None,
           peak_source: str = "--peak-tflops") -> list[str]:
    cfg, s, r, L = plan.cfg, plan.shape, plan.cfg.rollout, plan.cfg.launch
    g = lambda b: f"{b / GiB:7.2f}"  # noqa: E731
    engines = plan.gpus // r.tensor_parallel_size
    out = [f"# dapo plan: {where} (arithmetic from stated assumptions, not a measurement)",
           f"model {s.name}: {s.params / 1e9:.2f} B parameters (hidden {s.hidden}, {s.layers} layers, {s.heads} heads / "
           f"{s.kv_heads} KV heads, MLP {s.intermediate}, vocab {s.vocab}, {'tied' if s.tied else 'untied'} "
           f"embeddings; from {s.source})",
           f"GPUs: {L.num_nodes} nodes × {L.num_processes} = {plan.gpus} × {plan.gpu_gib} GiB; "
           + (f"FSDP FULL_SHARD over {plan.shard}" if L.fsdp else "no sharding (launch.fsdp false)")
           + f"; {engines} vLLM engines × TP {r.tensor_parallel_size}, gpu_memory_utilization "
             f"{r.gpu_memory_utilization}, sleep mode {'on' if r.sleep_mode else 'off'}",
           f"micro-batch: {plan.tokens_per_micro_batch} tokens per GPU ("
           + (f"train.max_tokens_per_micro_batch" if cfg.train.max_tokens_per_micro_batch else
              f"train.micro_batch_seqs {cfg.train.micro_batch_seqs} × {cfg.data.max_prompt_tokens + r.max_new_tokens} "
              f"tokens, padded") + f"); gradient checkpointing {'on' if cfg.model.gradient_checkpointing else 'off'}; "
           f"logits chunk {cfg.train.logits_chunk_tokens or f'{default_chunk_rows(s.vocab)} tokens (default)'}",
           *[f"note: {n}" for n in plan.notes], "", "## Memory per GPU (GiB)"]
    for ph in plan.phases:
        out.append(f"{ph.name}:")
        out += [f"  {g(tm.bytes)}  {tm.name}" for tm in ph.terms]
        out.append(f"  {g(ph.total)}  total{'  <- peak' if ph is plan.peak else ''}")
    v = plan.vllm
    out.append(f"inside vLLM's reservation ({g(v['reservation']).strip()} GiB): weights {g(v['weights']).strip()} + "
               f"activations {g(v['act']).strip()} + KV cache {g(v['kv']).strip()} GiB = {v['kv_tokens']:,.0f} tokens "
               f"= {v['seqs']:.1f} full-length sequences per engine")
    if r.max_num_seqs is None or r.max_num_seqs > max(1.0, v["seqs"]):
        out.append(f"note: rollout.max_num_seqs {r.max_num_seqs or 'unset (vLLM default: 1,024 on H100/H200)'} lets "
                   f"vLLM start more sequences than its KV cache holds at full length ({v['seqs']:.1f}); long "
                   f"responses are then preempted and recomputed. rollout.max_num_seqs={max(1, int(v['seqs']))} "
                   f"caps it there (more fit while responses are short)")
    t = times
    out += ["", "## Time per rollout step (s)",
            f"  {t['generation_s']:8.0f}  generation: {cfg.gen_batch_prompts} prompts × {r.n} × "
            f"{a.response_tokens(cfg):.0f} tokens × {a.rounds} rounds = {t['generated_tokens'] / 1e6:.1f} M tokens "
            f"on {plan.gpus} GPUs at {a.decode_tps(s.params):.0f} tok/s each, no shorter than one "
            f"{r.max_new_tokens}-token response at {a.seq_decode_tps:.0f} tok/s ({t['round_s']:.0f} s a round)",
            f"  {t['update_s']:8.0f}  update: {t['update_flop']:.3g} FLOP ({6 + 2 * cfg.model.gradient_checkpointing}·P "
            f"per trained token{' + 2·P old-log-prob forward' if cfg.grad_steps_per_rollout > 1 else ''}, "
            f"{t['trained_tokens'] / 1e6:.1f} M tokens) at {a.mfu:.0%} of {a.peak_tflops:.0f} TFLOP/s (peak: {peak_source})",
            f"  {t['sync_s']:8.1f}  weight sync: the {2 * s.params / 1e9:.1f} GB bf16 model all-gathered at "
            f"{a.allgather_gbs} GB/s per GPU",
            f"  {t['step_s']:8.0f}  step",
            *render_eval(cfg, ev, a),
            *render_run(cfg, t, ev, plan.gpus),
            *render_checkpoints(cfg, checkpoint_time(cfg, s, t["step_s"], a), a),
            "", "assumptions: " + ", ".join(f"{f.name}={getattr(a, f.name)}" for f in dataclasses.fields(a))]
    return out


def render_eval(cfg: Config, ev: Optional[dict[str, float]], a: Assumptions) -> list[str]:
    """The evaluation line of the plan (:func:`eval_time`); none when it was not priced."""
    if ev is None:
        return []
    e = cfg.eval
    cap = e.max_new_tokens or cfg.rollout.max_new_tokens
    return [f"  {ev['per_step_s']:8.0f}  evaluation, per step amortized: {ev['evals']} evaluations in the run "
            f"(every {e.every} steps{', the start' if e.at_start else ''} and the end), each {ev['problems']:.0f} "
            f"problems × {e.k} samples = {ev['tokens'] / 1e6:.2f} M tokens, {ev['each_s']:.0f} s (no shorter than "
            f"one {cap}-token response at {a.seq_decode_tps:.0f} tok/s)"]


def render_run(cfg: Config, t: dict[str, float], ev: Optional[dict[str, float]], gpus: int) -> list[str]:
    """The run's total: steps + evaluation (checkpoints: their own section)."""
    steps = cfg.train.rollout_steps
    ev_s = ev["per_step_s"] if ev else 0.0
    hours = (t["step_s"] + ev_s) * steps / 3600
    counted = f"evaluation {ev_s / (t['step_s'] + ev_s):.0%} of it; checkpoints not counted" if ev else \
        "evaluation and checkpoints not counted"
    return [f"  {t['step_s'] + ev_s:8.0f}  step with evaluation; {steps} steps ≈ {hours:.1f} h = "
            f"{hours * gpus:,.0f} GPU-hours ({counted})"]


def render_checkpoints(cfg: Config, ck: dict[str, float], a: Assumptions) -> list[str]:
    """The checkpoint lines of the plan (:func:`checkpoint_time`)."""
    c = cfg.checkpoint
    every = f"every {c.every} steps" if c.every else "at the end only"
    out = ["", f"## Checkpoints ({every}, {ck['saves']:.0f} in the run; "
               f"{'async_save: written in the background' if c.async_save else 'synchronous'})",
           f"  {ck['bytes'] / 1e9:8.1f}  GB per checkpoint: fp32 master + AdamW's two moments (12·P"
           f"{f' + 4·P × staleness {cfg.train.staleness}' if cfg.train.staleness else ''}), "
           f"written at {a.fs_write_gbs:g} GB/s in {ck['write_s']:.0f} s"]
    if c.async_save:
        late = f", + {ck['late_s']:.0f} s for the write still running from the one before" if ck["late_s"] else ""
        out.append(f"  {ck['wait_s']:8.1f}  s the loop waits per checkpoint: its shard copied to host memory at "
                   f"{a.d2h_gbs:g} GB/s per GPU{late}")
        out.append(f"  {ck['host_bytes_per_node'] / GiB:8.1f}  GiB of host memory per node held while it is written")
    else:
        out.append(f"  {ck['wait_s']:8.1f}  s the loop waits per checkpoint (the whole write; "
                   f"checkpoint.async_save=true waits only for the copy to host memory)")
    out.append(f"  {ck['per_step_s']:8.1f}  s per rollout step, amortized")
    return out


def render_overlapped(o: Optional[dict[str, float]], times: dict[str, float]) -> list[str]:
    """``--layout overlapped``: the priced one-step-off split beside today's colocated step."""
    out = ["", "## Overlapped layout (one-step-off; priced, not built: train.staleness=1 is its reference)"]
    if o is None:
        return out + ["  needs at least two nodes (or two tensor-parallel engines on one node) to split"]
    return out + [
        f"  {o['gen_gpus']} GPUs generate step r+1 while {o['train_gpus']} update on step r: generation "
        f"{o['generation_s']:.0f} s, update {o['update_s']:.0f} s, weight sync {o['sync_s']:.1f} s",
        f"  {o['step_s']:8.0f}  step (colocated, today: {times['step_s']:.0f} s; ×{times['step_s'] / o['step_s']:.2f})",
        "  the rollouts are then one update old: their effect on the result is what train.staleness=1 measures;",
        f"  the memory above is the colocated layout's: the update's shards over {o['train_gpus']} GPUs are not checked"]


def verdict(plan: Plan) -> str:
    """The plan's last line."""
    head = f"peak GiB per GPU: {plan.peak.total / GiB:.1f} of {plan.gpu_gib:g}"
    fail = plan.failure
    return f"{head} -> fits" if fail is None else f"{head} -> does not fit: {fail[0]}, try {fail[1]}"


def _gpu_gib(profile, where: str) -> float:
    if profile.max_gpus_per_node == 0:
        raise ConfigError(f"cluster profile {profile.name!r} ({where}) has no GPUs (limits.gpus_per_node = 0): "
                          f"nothing to plan")
    if profile.gpu_memory_gib is None:
        raise ConfigError(f"cluster profile {profile.name!r} ({where}) has no gpu_memory_gib: add the memory of "
                          f"one GPU (e.g. gpu_memory_gib: 79.6 for an H100 80GB)")
    return profile.gpu_memory_gib


def _check_layout(cfg: Config, profile) -> None:
    """The launch layout is one the profile can give (a plan for more nodes or GPUs than it has means nothing)."""
    for key, want, limit, what in (("launch.num_nodes", cfg.launch.num_nodes, profile.max_nodes, "limits.nodes"),
                                   ("launch.num_processes", cfg.launch.num_processes, profile.max_gpus_per_node,
                                    "limits.gpus_per_node")):
        if want > limit:
            raise ConfigError(f"{key} = {want}: cluster profile {profile.name!r} ({profile.path or 'embedded'}) has at "
                              f"most {limit} ({what})")


def check_fits(cfg: Config, profile, a: Assumptions = Assumptions()) -> Plan:
    """The plan of ``cfg`` on ``profile`` (raises ConfigError when the profile cannot be planned for: no GPU
    memory, a launch layout beyond its limits, an assumption out of range)."""
    gpu_gib = _gpu_gib(profile, str(profile.path or "embedded"))
    _check_layout(cfg, profile)
    return memory_plan(cfg, model_shape(cfg.model.path), gpu_gib, a.check())


def run_seconds(cfg: Config, profile) -> Optional[float]:
    """A run's expected wall seconds on ``profile`` by the plan: its steps with the amortized evaluation, at the
    profile's GPU peak and the default assumptions (checkpoints not counted); None where the plan cannot price
    it (a CPU profile, no gpu_memory_gib, a model shape it does not know, an arm that does not fit)."""
    try:
        peak, _ = gpu_peak(profile)
        a = Assumptions(peak_tflops=peak)
        plan = check_fits(cfg, profile, a)
    except ConfigError:
        return None
    if plan.failure is not None:
        return None
    ev = eval_time(cfg, plan.shape, a)
    return (step_time(cfg, plan.shape, a)["step_s"] + (ev["per_step_s"] if ev else 0.0)) * cfg.train.rollout_steps


def check_sweep(spec, profile, log=print) -> None:
    """Refuse (ConfigError) a sweep with an arm that does not fit the profile's GPUs.

    Nothing to check on a CPU profile or spec; a GPU profile without ``gpu_memory_gib``, or an
    arm whose model shape is unknown, is reported through ``log`` and not checked.
    """
    from dapo.sweep.spec import expand
    if profile.max_gpus_per_node == 0 or not spec.resources.gpus_per_node:
        return
    if profile.gpu_memory_gib is None:
        log(f"note: cluster profile {profile.name!r} has no gpu_memory_gib: the memory plan of each arm is not checked")
        return
    seen = set()
    for job in expand(spec):
        if job.arm in seen:
            continue
        seen.add(job.arm)
        try:
            plan = check_fits(job.config, profile)
        except ConfigError as exc:
            log(f"note: arm {job.arm!r}: memory plan not checked: {exc}")
            continue
        if plan.failure is not None:
            raise ConfigError(f"{spec.path}: arm {job.arm!r} does not fit cluster profile {profile.name!r}: "
                              f"{verdict(plan)} (see `dapo plan {spec.base} ... --cluster {profile.name}`)")


# --------------------------------------------------------------------------- command line
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dapo plan", description=help_text(__doc__),
                                epilog="Exit 0 when the run fits, 1 when it does not, 2 on bad input.")
    p.add_argument("experiment", help="experiment YAML")
    p.add_argument("overrides", nargs="*", help="dotted KEY=VALUE overrides")
    p.add_argument("--cluster", required=True, help="cluster profile: slurm/NAME.yaml or a path (needs gpu_memory_gib)")
    p.add_argument("--layout", choices=["colocated", "overlapped"], default="colocated",
                   help="also price the one-step-off layout (generation beside the update, on separate GPUs)")
    d = Assumptions()
    for f in dataclasses.fields(Assumptions):
        default = None if f.name == "peak_tflops" else getattr(d, f.name)
        p.add_argument("--" + f.name.replace("_", "-"), type=float, default=default,
                       help="assumption (default: the cluster profile's GPU, dapo.sweep.plan.gpu_peak)"
                       if f.name == "peak_tflops" else f"assumption (default {default})")
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    from dapo.sweep.cluster import load_profile
    try:
        cfg = load_config(a.experiment, a.overrides)
        profile = load_profile(a.cluster)
        peak, peak_source = (a.peak_tflops, "--peak-tflops") if a.peak_tflops is not None else gpu_peak(profile)
        assume = Assumptions(**{f.name: getattr(a, f.name) for f in dataclasses.fields(Assumptions)
                                if f.name != "peak_tflops"}, peak_tflops=peak)
        plan = check_fits(cfg, profile, assume)
        ev = eval_time(cfg, plan.shape, assume)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    where = f"{a.experiment}{' ' + ' '.join(a.overrides) if a.overrides else ''} on {profile.name}"
    times = step_time(cfg, plan.shape, assume)
    print("\n".join(render(plan, times, assume, where, ev, peak_source)))
    if a.layout == "overlapped":
        print("\n".join(render_overlapped(overlapped_step_time(cfg, plan.shape, assume), times)))
    print(verdict(plan))
    return 0 if plan.failure is None else 1


if __name__ == "__main__":
    sys.exit(main())
