"""The probes of scripts/device_check.py: five measurements of what ``dapo plan`` takes on faith.

Each probe prints one line, ``[device-check] probe NAME: ...``, with its measured number beside the
plan's for the same term (where the plan has one) and the seconds the probe took. A probe that fails
prints ``probe NAME: FAILED (...)`` with the reason in one line, and the others still run.

1. ``toolchain+compile``: the C compiler and Python headers Inductor/Triton build their kernels with,
   then one ``torch.compile``d training step (forward, backward, AdamW) of a small model, timed:
   the first call (compiling) and the next one, against the eager step. The plan has no term for it.
2. ``runtime overhead``: device memory outside the caching allocator (CUDA context, then cuBLAS and
   the kernels' modules, then NCCL) and the allocator's reserve, against the plan's ``overhead_gib``.
   On CPU: ``n/a on CPU`` and the process's resident-memory growth.
3. ``logits``: the paper's logits path for one chunk, 2,048 positions × 152,064 vocabulary from
   hidden 5,120: the lm_head matmul, ``dapo.train.logprobs.token_logprobs`` (chunked, checkpointed),
   backward; time and peak memory against the plan's logits terms (+ the lm_head's gradient).
4. ``decoder layer``: one Qwen2.5-32B-shaped ``Qwen2DecoderLayer`` (bf16) at the paper's sequence
   length (2,048 + 20,480; halved until it fits), forward + backward with only the flash and
   memory-efficient SDPA kernels allowed; TFLOP/s and MFU against the plan's MFU and peak, and
   peak memory against the plan's one-layer activations.
5. ``DCP async_save``: fp32 weights + two AdamW moments (12·P bytes, a few GB) saved with
   ``torch.distributed.checkpoint.async_save``: what the caller waits and when the write ends,
   against the plan's ``checkpoint_time`` (copy to host at ``d2h_gbs``, write at ``fs_write_gbs``).

They run in the order 2, 3, 4, 5, 1 (the compile, the slowest, last), after the process group exists.
``--cpu`` runs the same code at tiny shapes (:data:`CPU_SIZES`).
"""

from __future__ import annotations

import dataclasses
import gc
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
GiB = 2 ** 30


def say(msg: str) -> None:
    """One output line, prefixed as scripts/device_check.py prefixes its own."""
    print(f"[device-check] {msg}", flush=True)


class ProbeError(RuntimeError):
    """A probe could not measure what it measures (the reason is its message)."""


@dataclass(frozen=True)
class Sizes:
    """The shapes of the probes."""
    positions: int          # logits: response positions of one micro-batch chunk
    logits_chunk: int       # train.logits_chunk_tokens
    vocab: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    prompt: int             # decoder layer: sequence = prompt + response
    response: int
    dcp_hidden: int         # DCP: a model shape whose 12·P bytes are written
    dcp_intermediate: int
    compile_hidden: int     # torch.compile: the small model
    compile_seq: int


#: The paper's run: Qwen2.5-32B (hidden 5120, 40 / 8 heads, MLP 27648, vocab 152064), 2,048-token
#: logits chunks, 2,048 prompt + 20,480 response tokens; a 250M-parameter model's checkpoint (3 GB).
GPU_SIZES = Sizes(2048, 2048, 152064, 5120, 40, 8, 27648, 2048, 20480, 2048, 8192, 512, 512)
#: --cpu: the same layout, tiny (a 0.2 GB checkpoint).
CPU_SIZES = Sizes(128, 128, 8192, 160, 5, 1, 864, 128, 896, 256, 1024, 64, 64)


# --------------------------------------------------------------------------- helpers
def _sync(device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free(device) -> None:
    """Drop what a probe left (its tensors are out of scope by now)."""
    gc.collect()
    if device.type == "cuda":
        import torch
        torch.cuda.empty_cache()


def _reason(exc: BaseException) -> str:
    """An exception in one line of at most 300 characters."""
    text = " ".join(str(exc).split()) or "(no message)"
    return f"{type(exc).__name__}: {text[:300]}{'…' if len(text) > 300 else ''}"


def guarded(name: str, probe: Callable[[], str], device) -> bool:
    """Run ``probe`` (which returns its line), print ``probe NAME: line [seconds]``; on any exception print
    ``probe NAME: FAILED`` with the reason. True when it measured."""
    t = time.perf_counter()
    try:
        line = probe()
        ok = True
    except Exception as exc:  # noqa: BLE001 - one failing probe must not stop the others
        line, ok = f"FAILED: {_reason(exc)}", False
    try:
        _free(device)
    except Exception:  # noqa: BLE001 - a device too broken to free memory reports through the next probe
        pass
    say(f"probe {name}: {line} [{time.perf_counter() - t:.1f} s]")
    return ok


def _timed(fn: Callable[[], Any], device, reps: int = 2) -> float:
    """The best of ``reps`` calls of ``fn`` after one warm-up call, seconds."""
    fn()
    best = float("inf")
    for _ in range(reps):
        _sync(device)
        t = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t)
    return best


def _peak_above_base(fn: Callable[[], Any], device) -> Optional[float]:
    """Bytes ``fn()`` allocated at its peak above what was allocated before it (CUDA); None on CPU."""
    if device.type != "cuda":
        fn()
        return None
    import torch
    _sync(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    _sync(device)
    return float(torch.cuda.max_memory_allocated(device) - base)


def device_peak(device, measured_tflops: float) -> tuple[float, str]:
    """(dense bf16 TFLOP/s of this device, where it comes from): the plan's table for a GPU it names
    (the longest matching name), else the measured matmul rate."""
    from dapo.sweep.plan import GPU_PEAKS
    if device.type == "cuda":
        import torch
        name = "".join(c for c in torch.cuda.get_device_name(device).lower() if c.isalnum())
        hits = [(len(k), k, v) for k, v in GPU_PEAKS.items() if "".join(c for c in k.lower() if c.isalnum()) in name]
        if hits:
            _, key, value = max(hits)
            return value, f"plan GPU_PEAKS[{key!r}]"
    return measured_tflops, "the measured matmul rate"


def plan_update_terms(s: Sizes, prompt: int, response: int, chunk: int) -> dict[str, float]:
    """The plan's update-phase terms (bytes by name) for the paper's config at ``prompt + response``
    tokens per micro-batch and ``chunk``-token logits chunks, on the 32B-like shape of ``s``."""
    from dapo.config import load_config
    from dapo.sweep import plan
    cfg = load_config(REPO / "experiments" / "paper-dapo-32b.yaml", [
        f"data.max_prompt_tokens={prompt}", f"rollout.max_new_tokens={response}",
        f"train.max_tokens_per_micro_batch={prompt + response}", f"train.logits_chunk_tokens={chunk}",
        f"algo.overlong.max_len={response}", f"algo.overlong.cache_len={max(1, response // 4)}"])
    upd = next(ph for ph in plan.memory_plan(cfg, _layer_shape(s), gpu_gib=80.0).phases if ph.name == "update")
    return {t.name: t.bytes for t in upd.terms}


def _layer_shape(s: Sizes):
    """The plan's ModelShape of the 32B-like model of ``s`` (Qwen2.5-32B's, with the sizes of ``s``)."""
    from dapo.sweep import plan
    return dataclasses.replace(plan.KNOWN_MODELS["Qwen/Qwen2.5-32B"], hidden=s.hidden, heads=s.heads,
                               kv_heads=s.kv_heads, intermediate=s.intermediate, vocab=s.vocab)


# --------------------------------------------------------------------------- 1. toolchain + torch.compile
def toolchain() -> tuple[str, Optional[str]]:
    """(what this machine has to build Inductor/Triton kernels, what it lacks or None)."""
    from dapo.preflight import toolchain_problem
    found = []
    for role, names in (("C", ((os.environ["CC"],) if os.environ.get("CC") else ()) + ("gcc", "clang", "cc")),
                        ("C++", ((os.environ["CXX"],) if os.environ.get("CXX") else ()) + ("g++", "clang++"))):
        path = next((p for p in map(shutil.which, names) if p), None)
        found.append(f"{role} {_compiler_version(path) if path else 'none on PATH'}")
    include = sysconfig.get_paths()["include"]
    headers = f"Python.h {'in' if (Path(include) / 'Python.h').is_file() else 'missing from'} {include}"
    try:
        import triton
        found.append(f"triton {triton.__version__}")
    except ImportError:
        found.append("no triton")
    return ", ".join(found + [headers]), toolchain_problem()


def _compiler_version(path: str) -> str:
    """``path`` and the first line of its ``--version``."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20).stdout
        return f"{path} ({(out.splitlines() or ['?'])[0].strip()})"
    except (OSError, subprocess.SubprocessError):
        return f"{path} (no --version)"


def _small_lm(vocab: int, hidden: int, layers: int = 2):
    """A small language model of MLP blocks: embedding, ``layers`` residual blocks (RMSNorm, Linear, SiLU,
    Linear), a final norm and an untied head (enough ops for Inductor to fuse and generate kernels)."""
    import torch
    from torch import nn

    class SmallLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(vocab, hidden)
            self.blocks = nn.ModuleList(nn.Sequential(nn.RMSNorm(hidden), nn.Linear(hidden, 4 * hidden), nn.SiLU(),
                                                      nn.Linear(4 * hidden, hidden)) for _ in range(layers))
            self.norm = nn.RMSNorm(hidden)
            self.head = nn.Linear(hidden, vocab, bias=False)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            x = self.emb(ids)
            for block in self.blocks:
                x = x + block(x)
            return self.head(self.norm(x))
    return SmallLM()


def _compiled_steps(device, s: Sizes) -> dict[str, float]:
    """One ``torch.compile``d training step (forward, loss, backward, AdamW) of :func:`_small_lm`, timed:
    first (compiling), again (best of 2), eager (best of 2); rel_diff: the first compiled loss against the
    eager one at the same weights; params."""
    import torch
    import torch.nn.functional as F
    torch.manual_seed(0)
    model = _small_lm(512, s.compile_hidden).to(device)
    ids = torch.randint(0, 512, (4, s.compile_seq + 1), device=device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loss_of = lambda m: F.cross_entropy(m(ids[:, :-1]).flatten(0, 1).float(), ids[:, 1:].flatten())  # noqa: E731
    compiled = torch.compile(model)

    def step(m) -> float:
        opt.zero_grad(set_to_none=True)
        loss = loss_of(m)
        loss.backward()
        opt.step()
        return float(loss.detach())
    with torch.no_grad():
        eager_loss = float(loss_of(model))
    t = time.perf_counter()
    first_loss = step(compiled)
    _sync(device)
    first = time.perf_counter() - t
    again, eager = _timed(lambda: step(compiled), device), _timed(lambda: step(model), device)
    return {"first": first, "again": again, "eager": eager,
            "rel_diff": abs(first_loss - eager_loss) / max(abs(eager_loss), 1e-9),
            "params": float(sum(p.numel() for p in model.parameters()))}


def compile_probe(device, s: Sizes, workdir: Path) -> str:
    """The toolchain, then :func:`_compiled_steps` with empty Inductor and Triton caches (a temporary folder
    under ``workdir``, so the first call compiles everything; on CPU one compile thread, no worker pool)."""
    import torch
    import torch._inductor.config as inductor_config
    import torch._inductor.utils as inductor_utils
    tools, lacks = toolchain()
    fresh = getattr(inductor_utils, "fresh_cache", None) or inductor_utils.fresh_inductor_cache
    t = time.perf_counter()
    try:
        with fresh(dir=str(workdir)), inductor_config.patch({"compile_threads": 1} if device.type == "cpu" else {}):
            r = _compiled_steps(device, s)
    except Exception as exc:  # noqa: BLE001
        raise ProbeError(f"{tools}; the compiled step failed after {time.perf_counter() - t:.1f} s"
                         f"{f' (toolchain lacks {lacks})' if lacks else ''}: {_reason(exc)}") from None
    finally:
        torch._dynamo.reset()
    if not r["rel_diff"] < 1e-3:
        raise ProbeError(f"{tools}; the compiled loss differs from the eager one by {r['rel_diff']:.1e} (relative)")
    return (f"{tools}; compiled step (forward, backward, AdamW) of a {r['params'] / 1e6:.2f}M-parameter model on "
            f"4 x {s.compile_seq} tokens: first call {r['first']:.1f} s (compile), then {1e3 * r['again']:.1f} ms vs "
            f"eager {1e3 * r['eager']:.1f} ms (x{r['eager'] / r['again']:.2f}); loss = eager's to {r['rel_diff']:.0e}; "
            f"plan: no compile term (it prices eager training)")


# --------------------------------------------------------------------------- 2. runtime overhead
def take_snapshot(snaps: list[dict[str, float]], device) -> None:
    """Append :func:`memory_snapshot` to ``snaps``; nothing when it fails (the overhead probe then says so)."""
    try:
        snaps.append(memory_snapshot(device))
    except Exception:  # noqa: BLE001 - a broken device fails the run at its first matmul anyway
        pass


def memory_snapshot(device) -> dict[str, float]:
    """Device memory in use (all of it, by every process) and the caching allocator's reserved and allocated
    bytes (CUDA; the first call creates the CUDA context); on CPU the process's resident bytes."""
    if device.type != "cuda":
        return {"rss": _rss_bytes()}
    import torch
    free, total = torch.cuda.mem_get_info(device)
    return {"used": float(total - free), "reserved": float(torch.cuda.memory_reserved(device)),
            "allocated": float(torch.cuda.memory_allocated(device)), "total": float(total)}


def _rss_bytes() -> float:
    """This process's resident set, bytes (Linux /proc; NaN elsewhere)."""
    try:
        return float(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return float("nan")


def overhead_probe(snaps: list[dict[str, float]], device) -> str:
    """``snaps``: at the context's creation, after the first matmuls (cuBLAS), after the process group;
    one NCCL all-reduce is run here first, so its communicator's buffers count."""
    from dapo.sweep.plan import Assumptions
    plan_gib = Assumptions().overhead_gib
    if len(snaps) < 3:
        raise ProbeError(f"only {len(snaps)} of 3 memory snapshots were taken")
    if device.type != "cuda":
        grew = (snaps[-1]["rss"] - snaps[0]["rss"]) / 2 ** 20
        return (f"n/a on CPU (no CUDA context; process RSS grew {grew:.0f} MiB over the matmul and the gloo "
                f"group); plan's runtime overhead {plan_gib:g} GiB per GPU")
    import torch
    import torch.distributed as dist
    if dist.is_initialized():
        x = torch.ones(1, device=device)
        dist.all_reduce(x)
        _sync(device)
        del x
    torch.cuda.empty_cache()                                  # the matmul rate's freed blocks are no overhead
    snaps = [*snaps[:2], memory_snapshot(device)]
    outside = [s["used"] - s["reserved"] for s in snaps]     # what the caching allocator does not hold
    ctx, blas, nccl = outside[0], outside[1] - outside[0], outside[2] - outside[1]
    slack = snaps[2]["reserved"] - snaps[2]["allocated"]
    total = outside[2] + slack
    return (f"{total / GiB:.2f} GiB of {snaps[2]['total'] / GiB:.0f} = CUDA context {ctx / GiB:.2f} + cuBLAS/kernels "
            f"{blas / GiB:.2f} + NCCL {nccl / GiB:.2f} GiB outside the caching allocator + its idle reserve "
            f"{slack / GiB:.2f} GiB (under load: the update phases' reserved vs allocated); plan's runtime overhead "
            f"{plan_gib:g} GiB (measured / plan = {total / GiB / plan_gib:.2f})")


# --------------------------------------------------------------------------- 3. the logits path
def logits_probe(device, s: Sizes, peak: tuple[float, str]) -> str:
    """hidden [1, N, h] @ lm_head [V, h]ᵀ → bf16 logits → token_logprobs (chunks of ``logits_chunk``) → mean
    → backward into hidden and lm_head: best time of 2 after a warm-up, peak memory above the inputs."""
    import torch

    from dapo.sweep.plan import Assumptions
    from dapo.train.logprobs import token_logprobs
    N, V, H = s.positions, s.vocab, s.hidden
    torch.manual_seed(0)
    h = torch.randn(1, N, H, device=device, dtype=torch.bfloat16).requires_grad_()
    w = (torch.randn(V, H, device=device, dtype=torch.bfloat16) * H ** -0.5).requires_grad_()
    ids = torch.randint(0, V, (1, N), device=device)
    out: dict[str, torch.Tensor] = {}

    def step() -> None:
        h.grad = w.grad = None
        lp = token_logprobs(torch.nn.functional.linear(h, w), ids, 1.0, s.logits_chunk)
        (-lp.mean()).backward()
        out["lp"] = lp.detach()
    dt = _timed(step, device)
    h.grad = w.grad = None
    peak_b = _peak_above_base(step, device)
    if not bool(torch.isfinite(out["lp"]).all()) or not bool(torch.isfinite(w.grad).all()):
        raise ProbeError("non-finite log-probs or lm_head gradient")
    terms = {k: v for k, v in plan_update_terms(s, s.positions, s.positions, s.logits_chunk).items()
             if k.startswith("logits")}
    planned, head_grad = sum(terms.values()), 2.0 * V * H
    a = Assumptions()
    flop = 6.0 * N * H * V
    mem = (f"peak {peak_b / GiB:.2f} GiB above the inputs vs plan {(planned + head_grad) / GiB:.2f} GiB (logits terms "
           f"{planned / GiB:.2f} + lm_head bf16 gradient {head_grad / GiB:.2f}; measured / plan = "
           f"{peak_b / (planned + head_grad):.2f})" if peak_b is not None else
           f"peak memory measured on CUDA only; plan {(planned + head_grad) / GiB:.3f} GiB (logits terms "
           f"{planned / GiB:.3f} + lm_head bf16 gradient {head_grad / GiB:.3f})")
    return (f"{N} positions x {V} vocabulary from hidden {H}, chunks of {s.logits_chunk}: forward+backward "
            f"{1e3 * dt:.1f} ms ({flop / dt / 1e12:.3g} TFLOP/s of the 6·N·h·V matmul FLOPs, "
            f"{flop / dt / 1e12 / peak[0]:.0%} of {peak[0]:.3g} from {peak[1]}; plan at MFU {a.mfu:.0%} of it: "
            f"{1e3 * flop / (peak[0] * 1e12 * a.mfu):.1f} ms); {mem}; plan terms (GiB): "
            + ", ".join(f"{k.split(' (')[0]} {v / GiB:.3f}" for k, v in terms.items()))


# --------------------------------------------------------------------------- 4. one decoder layer
def _qwen2_layer(s: Sizes, seq: int, device):
    """A bf16 ``Qwen2DecoderLayer`` of the 32B-like shape of ``s`` on ``device``, and its rotary embedding."""
    import torch
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RotaryEmbedding
    cfg = Qwen2Config(hidden_size=s.hidden, num_attention_heads=s.heads, num_key_value_heads=s.kv_heads,
                      intermediate_size=s.intermediate, num_hidden_layers=1, max_position_embeddings=seq,
                      vocab_size=s.vocab, attn_implementation="sdpa")
    with torch.device(device):
        layer = Qwen2DecoderLayer(cfg, layer_idx=0)
        rotary = Qwen2RotaryEmbedding(cfg)
    return layer.to(torch.bfloat16).train(), rotary


def _layer_run(layer, rotary, seq: int, device) -> tuple[float, Optional[float]]:
    """(best forward+backward seconds, peak bytes above the inputs) at ``seq`` tokens, flash/efficient
    SDPA only (no math fallback: a shape they refuse raises)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    x = torch.randn(1, seq, layer.hidden_size, device=device, dtype=torch.bfloat16).requires_grad_()
    pos = torch.arange(seq, device=device)[None]
    cos, sin = rotary(x, pos)
    gy = torch.randn_like(x)

    def clear() -> None:
        for p in layer.parameters():
            p.grad = None
        x.grad = None

    def step() -> None:
        clear()
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
            y = layer(x, attention_mask=None, position_ids=pos, position_embeddings=(cos, sin))
            (y[0] if isinstance(y, tuple) else y).backward(gy)
    dt = _timed(step, device)
    clear()                                          # the peak counts the gradients it allocates
    return dt, _peak_above_base(step, device)


def _fitting_run(layer, rotary, full: int, device) -> tuple[int, float, Optional[float]]:
    """(tokens, seconds, peak bytes) of :func:`_layer_run` at ``full`` tokens, else the first of full/2,
    full/4, full/8 that does not run out of CUDA memory."""
    import torch
    for seq in (full, full // 2, full // 4, full // 8):
        try:
            return (seq, *_layer_run(layer, rotary, seq, device))
        except torch.cuda.OutOfMemoryError:
            pass
        _free(device)                                # outside the except: its frames held the tensors
    raise ProbeError(f"out of CUDA memory at {full // 8} tokens and above")


def _run_flash_only(layer, rotary, full: int, device) -> tuple[int, float, Optional[float], str]:
    """:func:`_fitting_run`; where no flash/efficient kernel takes ``enable_gqa`` (transformers passes it
    for grouped K/V heads), once more with the K/V heads repeated, said in the returned note."""
    import transformers.integrations.sdpa_attention as sdpa
    try:
        return (*_fitting_run(layer, rotary, full, device), "")
    except RuntimeError as exc:
        if "kernel" not in str(exc).lower():
            raise
        note = f" (K/V heads repeated: with enable_gqa {_reason(exc)[:100]})"
    _free(device)
    original = sdpa.use_gqa_in_sdpa
    sdpa.use_gqa_in_sdpa = lambda *args, **kwargs: False
    try:
        return (*_fitting_run(layer, rotary, full, device), note)
    finally:
        sdpa.use_gqa_in_sdpa = original


def layer_probe(device, s: Sizes, peak: tuple[float, str]) -> str:
    """One layer at prompt + response tokens (on a CUDA out-of-memory error: half as many, down to 1/8)."""
    from dapo.sweep.plan import Assumptions
    full = s.prompt + s.response
    layer, rotary = _qwen2_layer(s, full, device)
    seq, dt, peak_b, gqa = _run_flash_only(layer, rotary, full, device)
    shape, a = _layer_shape(s), Assumptions()
    P = shape.layer_params
    model_flop = 6.0 * P * seq                       # the plan's 6·P per token
    attn_flop = 3 * 2.0 * seq * seq * s.hidden       # causal QKᵀ and AV, forward + backward (3x forward)
    rate = model_flop / dt / 1e12
    length = f"{seq} tokens" + ("" if seq == full else f" (full {full} did not fit)")
    prompt = seq * s.prompt // full
    act = plan_update_terms(s, prompt, seq - prompt, s.logits_chunk)["activations: one layer recomputed"]
    grad = 2.0 * P
    mem = (f"peak {peak_b / GiB:.2f} GiB above weights and input vs plan {(act + grad) / GiB:.2f} GiB (one layer's "
           f"activations {act / GiB:.2f} + its bf16 gradient {grad / GiB:.2f}; measured / plan = "
           f"{peak_b / (act + grad):.2f})" if peak_b is not None else
           f"peak memory measured on CUDA only; plan {(act + grad) / GiB:.3f} GiB (activations + bf16 gradient)")
    return (f"Qwen2DecoderLayer hidden {s.hidden}, {s.heads}/{s.kv_heads} heads, MLP {s.intermediate}, bf16, "
            f"{length}, flash/efficient SDPA only{gqa}: forward+backward {dt:.3f} s = {rate:.3g} TFLOP/s of 6·P·T "
            f"(MFU {rate / peak[0]:.1%} of {peak[0]:.3g} from {peak[1]}; with attention "
            f"{(model_flop + attn_flop) / dt / 1e12:.3g} TFLOP/s); plan: MFU {a.mfu:.0%} of it = "
            f"{model_flop / (a.mfu * peak[0] * 1e12):.3f} s (measured / plan = "
            f"{dt * a.mfu * peak[0] * 1e12 / model_flop:.2f}); {mem}")


# --------------------------------------------------------------------------- 5. DCP async_save
def _dcp_shape(s: Sizes):
    """A ModelShape whose checkpoint (12·P bytes) is the probe's payload."""
    from dapo.sweep.plan import ModelShape
    return ModelShape("dcp-probe", s.dcp_hidden, 2, 16 if s.dcp_hidden >= 1024 else 4, 2, s.dcp_intermediate,
                      32000, source="scripts/device_probes.py")


def _dcp_state(P: int, device, parts: int = 8) -> dict[str, Any]:
    """fp32 weights and two AdamW moments of P values each, in ``parts`` tensors apiece."""
    import torch
    sizes = [P // parts + (1 if i < P % parts else 0) for i in range(parts)]
    make = lambda: {f"t{i}": torch.rand(n, device=device) for i, n in enumerate(sizes)}  # noqa: E731
    return {"model": make(), "optim": {"exp_avg": make(), "exp_avg_sq": make()}}


def _wait_all(response) -> float:
    """Wait for an ``async_save`` (a Future, or a response with staging and upload futures); seconds
    spent waiting for its staging here (0 when async_save staged before returning)."""
    if hasattr(response, "upload_completion"):
        t = time.perf_counter()
        response.staging_completion.result()
        staged = time.perf_counter() - t
        response.upload_completion.result()
        return staged
    response.result()
    return 0.0


def dcp_probe(device, s: Sizes, workdir: Path) -> str:
    """async_save of 12·P bytes to ``workdir`` (a gloo group of its own, as dapo.train.checkpoint does);
    the seconds the caller is blocked and those until the files are written, against the plan for 1 GPU."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from dapo.config import load_config
    from dapo.dist.distributed import background_group
    from dapo.sweep import plan
    shape = _dcp_shape(s)
    state = _dcp_state(shape.params, device)
    nbytes = 12.0 * shape.params
    target = workdir / "dcp-probe"
    shutil.rmtree(target, ignore_errors=True)
    group = background_group() if dist.is_initialized() else None
    _sync(device)
    t = time.perf_counter()
    response = dcp.async_save(state, checkpoint_id=str(target), process_group=group,
                              **({} if group is not None else {"no_dist": True}))
    returned = time.perf_counter() - t
    blocked = returned + _wait_all(response)
    total = time.perf_counter() - t
    on_disk = sum(f.stat().st_size for f in target.rglob("*") if f.is_file())
    shutil.rmtree(target, ignore_errors=True)
    cfg = load_config(REPO / "experiments" / "tiny-random-smoke.yaml",
                      ["checkpoint.async_save=true", "launch.num_nodes=1", "launch.num_processes=1"])
    a = plan.Assumptions()
    ck = plan.checkpoint_time(cfg, shape, step_s=1e9, a=a)
    return (f"{nbytes / 1e9:.2f} GB (12·P, P = {shape.params / 1e6:.0f}M: fp32 weights + 2 AdamW moments, on "
            f"{device.type}; {on_disk / 1e9:.2f} GB on disk): the caller waited {blocked:.2f} s "
            f"({nbytes / blocked / 1e9:.1f} GB/s), the write ended after {total:.2f} s ({nbytes / total / 1e9:.1f} "
            f"GB/s); plan for 1 GPU: waits {ck['wait_s']:.2f} s (copy to host at {a.d2h_gbs:g} GB/s), writes in "
            f"{ck['write_s']:.2f} s (at {a.fs_write_gbs:g} GB/s, all ranks together); measured / plan: wait "
            f"{blocked / ck['wait_s']:.2f}, write {total / ck['write_s']:.2f}")


# --------------------------------------------------------------------------- all of them
def run_probes(device, cpu: bool, measured_tflops: float, snaps: list[dict[str, float]], workdir: Path) -> list[str]:
    """Every probe, each guarded; the names of those that failed."""
    s = CPU_SIZES if cpu else GPU_SIZES
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        peak = device_peak(device, measured_tflops)
    except Exception:  # noqa: BLE001
        peak = (measured_tflops, "the measured matmul rate")
    probes: list[tuple[str, Callable[[], str]]] = [
        ("runtime overhead", lambda: overhead_probe(snaps, device)),
        ("logits", lambda: logits_probe(device, s, peak)),
        ("decoder layer", lambda: layer_probe(device, s, peak)),
        ("DCP async_save", lambda: dcp_probe(device, s, workdir)),
        ("toolchain+compile", lambda: compile_probe(device, s, workdir)),
    ]
    return [name for name, fn in probes if not guarded(name, fn, device)]
