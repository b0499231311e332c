"""One-GPU check of the training half (scripts/device-check.sh runs it): no vLLM, no MLflow.

    python scripts/device_check.py                 # CUDA + NCCL, the full shapes (a few minutes on an H200)
    python scripts/device_check.py --cpu           # CPU + gloo, small shapes: the same code paths, for CI

Phases, each driven directly (``dapo train`` needs MLflow; vLLM is not imported: any import of
``vllm``, ``mlflow`` or ``submitit`` fails at once):

1. the bf16 (CPU: fp32) matmul rate of this device, measured;
1b. the probes (``scripts/device_probes.py``, ``--probes only``/``none``), one line each beside ``dapo
   plan``'s number, a failing one reported in its line: the runtime's memory overhead, the paper-shape
   logits path, one Qwen2.5-32B-shaped decoder layer at the paper's length, a DCP ``async_save`` of a
   few GB, the compiler toolchain and one ``torch.compile``d step;
2. for each shape (``tiny-25m`` and a Qwen2.5-0.5B-shaped random model; ``--cpu``: ``tiny-3m`` and
   a narrower 0.5B-like model), a 1-rank process group (NCCL for CUDA tensors + gloo; ``--cpu``:
   gloo), the model loaded FSDP2-sharded (``dapo.dist.distributed.load_sharded_causal_lm``: bf16
   compute, fp32 master and reduce), gradient checkpointing, chunked log-probs, one optimizer
   step of ``dapo.train.update.update_policy`` at the config's token budget, timed after a warm-up:
   MFU = 6·P·tokens / time / measured matmul rate (and 8·P: with the recomputed forward); peak memory
   (``torch.cuda.max_memory_allocated``) against ``dapo plan``'s update phase for the same shape
   and budget (less vLLM and the runtime overhead, which this check does not have);
2b. the padding-free update (``train.packed``) on the larger shape: packed log-probs equal padded
   ones on a mixed-length batch (fp32, limit 1e-4: this transformers and attention kernel keep packed
   sequences apart), then the update's MFU on uniform and on mixed lengths (L/8..L), padded and
   packed, with mixed/uniform per layout (target for packed: >= 0.90);
3. a DCP checkpoint of the sharded model and optimizer (``dapo.train.checkpoint.save_checkpoint``), loaded
   into a fresh sharded model and optimizer: every weight and AdamW moment equal, bit for bit;
4. 2 rollout steps with the plain-transformers engine on the device (generate, score, advantages,
   update; the engine shares the trainer's weights): the tiny config's loop phases.

Prints one line per result and ``device-check: OK`` at the end (exit 0; naming the probes that failed,
if any), or the first failure of phases 2-4 (exit 1).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
import device_probes as probes  # noqa: E402 - stdlib-only at import; torch is imported inside its probes
FORBIDDEN = ("vllm", "mlflow", "submitit")
NEEDED = ("torch", "transformers", "accelerate", "safetensors", "tokenizers", "yaml", "numpy")

#: Qwen2.5-0.5B's config.json (hidden 896, 24 layers, 14 heads / 2 KV heads, MLP 4864, vocab 151936, tied)
QWEN_05B = dict(hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2, intermediate_size=4864)
QWEN_05B_VOCAB = 151936
#: --cpu: the same layout, narrower and shallower (and the byte vocabulary padded to 8192)
CPU_05B = dict(hidden_size=128, num_layers=4, num_heads=2, num_kv_heads=1, intermediate_size=704)
CPU_05B_VOCAB = 8192


def say(msg: str) -> None:
    print(f"[device-check] {msg}", flush=True)


def matmul_tflops(device, dtype, n: int, reps: int = 10) -> float:
    """The best of ``reps`` n×n @ n×n matmuls after a warm-up, TFLOP/s."""
    import torch
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for k in range(reps + 1):
        _sync(device)
        t = time.perf_counter()
        torch.matmul(a, b)
        _sync(device)
        if k:
            best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best / 1e12


def _sync(device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def init_group(cuda: bool):
    """A 1-rank process group (NCCL for CUDA tensors, gloo for CPU ones) and this rank's DistInfo."""
    import socket

    import torch
    import torch.distributed as dist

    from dapo.dist.distributed import DistInfo
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(backend="cpu:gloo,cuda:nccl" if cuda else "gloo", rank=0, world_size=1,
                            **({"device_id": device} if cuda else {}))
    say(f"process group: world 1, backend {dist.get_backend()}")
    return DistInfo(rank=0, world=1, local_rank=0, device=device)


def build_models(root: Path, cpu: bool) -> dict[str, Path]:
    """The two shapes as HF directories (random weights, the byte tokenizer)."""
    from dapo.models import TINY_PRESETS, build_char_tokenizer, build_tiny_qwen2
    tok = build_char_tokenizer()
    tiny = "tiny-3m" if cpu else "tiny-25m"
    big, vocab = (CPU_05B, CPU_05B_VOCAB) if cpu else (QWEN_05B, QWEN_05B_VOCAB)
    out = {tiny: build_tiny_qwen2(root / tiny, seed=0, **TINY_PRESETS[tiny])}
    path = build_tiny_qwen2(root / "qwen2.5-0.5b-shape", seed=0, max_position_embeddings=4096, **big)
    # the real vocabulary size: resize the saved embedding (random rows; the byte tokenizer uses the first 259)
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(path)
    m.resize_token_embeddings(vocab, mean_resizing=False)
    m.save_pretrained(path)
    tok.save_pretrained(path)
    out["qwen2.5-0.5b-shape"] = path
    return out


def check_config(model_path: Path, cpu: bool, tokens: int, chunk: int, packed: bool = False):
    """The update's config: the tiny experiments' loop, this model, one micro-batch of ``tokens`` tokens
    (``packed``: ``train.packed``, the padding-free layout)."""
    from dapo.config import load_config
    resp = tokens // 2 // 4
    return load_config(REPO / "experiments" / "tiny-random-smoke.yaml", [
        f"model.path={model_path}", "model.autocast_bf16=true", "model.gradient_checkpointing=true",
        "rollout.engine=vllm", "launch.fsdp=true", "rollout.n=4", "train.batch_prompts=2",
        "train.mini_batch_prompts=2", "train.micro_batch_seqs=8", f"train.max_tokens_per_micro_batch={tokens}",
        f"data.max_prompt_tokens={resp}", f"rollout.max_new_tokens={resp}", f"algo.overlong.max_len={resp}",
        f"algo.overlong.cache_len={max(1, resp // 4)}", f"train.logits_chunk_tokens={chunk}",
        "algo.dynamic_sampling.enabled=false", f"train.packed={str(packed).lower()}"])


def full_length_batch(cfg, vocab: int, seed: int = 0, mixed: bool = False):
    """A RolloutBatch of batch_prompts × n sequences: max prompt tokens each, and max response tokens
    each (``mixed``: prompt and response lengths drawn uniformly from [P/8, P] and [L/8, L], an RL
    batch's spread, so that short sequences share a packed row)."""
    import torch

    from dapo.train.rollout import RolloutBatch
    g = torch.Generator().manual_seed(seed)
    B, n = cfg.train.batch_prompts, cfg.rollout.n
    P, L = cfg.data.max_prompt_tokens, cfg.rollout.max_new_tokens
    draw = lambda top, k: [int(torch.randint(max(1, top // 8), top + 1, (1,), generator=g)) if mixed else top
                           for _ in range(k)]
    lens = draw(L, B * n)
    prompts = [torch.randint(3, vocab, (p,), generator=g).tolist() for p in draw(P, B)]
    correct = torch.tensor([[(b + k) % 2 == 0 for k in range(n)] for b in range(B)])
    return RolloutBatch([p for p in prompts for _ in range(n)],
                        [torch.randint(3, vocab, (l,), generator=g).tolist() for l in lens],
                        torch.ones(B * n, dtype=torch.bool), correct, correct.float() * 2 - 1, torch.zeros(B, n))


def sharded_policy(cfg, path: Path, d):
    import torch

    from dapo.dist.distributed import load_sharded_causal_lm
    from dapo.train.update import Policy
    model = load_sharded_causal_lm(path, dtype="float32", dist_info=d, bf16=True, gradient_checkpointing=True)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    return Policy(model, opt, sched, d.device, autocast=True, pad_id=0, world=1)


def update_phase(name: str, path: Path, d, cpu: bool, tflops: float, tokens: int, chunk: int) -> dict:
    """Phase 2 on one shape: MFU and peak memory against the plan; returns the policy and config."""
    import torch

    from dapo import algo
    from dapo.sweep import plan
    from dapo.train.logprobs import response_mask
    from dapo.train.update import update_policy
    cfg = check_config(path, cpu, tokens, chunk)
    policy = sharded_policy(cfg, path, d)
    P = sum(p.numel() for p in policy.model.parameters())
    vocab = policy.model.config.vocab_size
    batch = full_length_batch(cfg, vocab)
    adv = algo.group_advantages(batch.rewards).reshape(-1)
    mask = response_mask(batch)
    update_policy(policy, batch, None, adv, mask, cfg)                       # warm-up (AdamW moments appear)
    cuda = d.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    _sync(d.device)
    t = time.perf_counter()
    steps = update_policy(policy, batch, None, adv, mask, cfg)
    _sync(d.device)
    dt = time.perf_counter() - t
    trained = sum(len(p) + len(r) for p, r in zip(batch.prompt_ids, batch.response_ids))
    mfu = 6 * P * trained / dt / (tflops * 1e12)          # model FLOPs (6·P per token)
    hfu = 8 * P * trained / dt / (tflops * 1e12)          # + the recomputed forward of checkpointing
    pl = plan.memory_plan(cfg, plan.model_shape(str(path)), gpu_gib=80.0)
    upd = next(ph for ph in pl.phases if ph.name == "update")
    planned = sum(t.bytes for t in upd.terms if not t.name.startswith(("vLLM", "runtime overhead")))
    say(f"{name}: {P / 1e6:.1f}M parameters, {trained} tokens in {len(steps)} optimizer step(s) of "
        f"{pl.tokens_per_micro_batch}-token micro-batches: {dt:.3f} s; MFU {100 * mfu:.1f}% "
        f"(6·P per token; with the recomputed forward {100 * hfu:.1f}%) of the measured matmul rate "
        f"({tflops:.1f} TFLOP/s)")
    if cuda:
        peak = torch.cuda.max_memory_allocated()
        say(f"{name}: peak allocated {peak / 2**30:.2f} GiB (reserved {torch.cuda.max_memory_reserved() / 2**30:.2f}); "
            f"dapo plan's update phase for this shape and budget {planned / 2**30:.2f} GiB "
            f"(measured / plan = {peak / planned:.2f})")
    else:
        say(f"{name}: dapo plan's update phase for this shape and budget {planned / 2**30:.3f} GiB "
            f"(peak memory is measured on CUDA only)")
    for t_ in upd.terms:
        off = " (not in this check)" if t_.name.startswith(("vLLM", "runtime overhead")) else ""
        say(f"    plan term {t_.bytes / 2**30:8.3f} GiB  {t_.name}{off}")
    ok = all(map(lambda s: s.grad_norm == s.grad_norm, steps))
    if not ok:
        raise SystemExit(f"device-check: {name}: non-finite gradient norm")
    return {"policy": policy, "cfg": cfg, "batch": batch, "adv": adv, "mask": mask}


def packed_phase(name: str, path: Path, d, cpu: bool, tflops: float, tokens: int, chunk: int,
                 repeats: int = 2) -> None:
    """Phase 2b, the padding-free update on this device: (a) packed log-probs equal padded ones on
    a mixed-length batch (the fp32 model unsharded, no autocast: block-causal attention per sequence
    in this transformers and this attention kernel, or the packed update is silently wrong);
    (b) update time and MFU of uniform vs mixed lengths, padded vs packed (the median of
    ``repeats`` after a warm-up), with mixed/uniform for each layout (target for packed: >= 0.90)."""
    import statistics

    import torch

    from dapo import algo
    from dapo.models import load_model
    from dapo.train.logprobs import old_logprobs, response_forward, response_mask
    from dapo.train.update import update_policy
    cfgs = {lay: check_config(path, cpu, tokens, chunk, packed=lay == "packed") for lay in ("padded", "packed")}
    plain = load_model(path, dtype="float32").to(d.device).eval()
    batches = {k: full_length_batch(cfgs["padded"], plain.config.vocab_size, seed=1, mixed=k == "mixed")
               for k in ("uniform", "mixed")}
    with torch.no_grad():
        lp = {lay: old_logprobs(plain, batches["mixed"], cfgs[lay], 0, d.device, False) for lay in cfgs}
    m = lp["padded"][2].bool()
    diff = float((lp["packed"][0] - lp["padded"][0])[m].abs().max())
    mixed = batches["mixed"]
    rows = response_forward(plain, mixed.prompt_ids, mixed.response_ids, 0, d.device, False, packed=True).logits.shape[0]
    say(f"{name}: packed vs padded log-probs (fp32, mixed lengths, {int(m.sum())} response tokens, "
        f"{len(mixed.response_ids)} sequences in {rows} packed rows): max |difference| {diff:.2e} "
        f"(limit 1e-4; attention {plain.config._attn_implementation})")
    del plain
    if rows >= len(mixed.response_ids):
        raise SystemExit(f"device-check: {name}: no two sequences share a packed row; the check would prove nothing")
    if not diff <= 1e-4:
        raise SystemExit(f"device-check: {name}: packed log-probs differ from padded ones by {diff:.2e}: "
                         "this transformers/attention does not keep packed sequences apart")
    policy = sharded_policy(cfgs["padded"], path, d)
    P = sum(p.numel() for p in policy.model.parameters())
    times: dict[tuple[str, str], list[float]] = {}
    for rep in range(repeats + 1):                       # alternate the four, so drift hits all alike
        for kind, batch in batches.items():
            adv = algo.group_advantages(batch.rewards).reshape(-1)
            mask = response_mask(batch)
            for lay, cfg in cfgs.items():
                _sync(d.device)
                t = time.perf_counter()
                update_policy(policy, batch, None, adv, mask, cfg)
                _sync(d.device)
                if rep:                                  # the first round is the warm-up
                    times.setdefault((kind, lay), []).append(time.perf_counter() - t)
    mfu = {}
    for (kind, lay), ts in times.items():
        b = batches[kind]
        real = sum(len(p) + len(r) for p, r in zip(b.prompt_ids, b.response_ids))
        mfu[kind, lay] = 6 * P * real / statistics.median(ts) / (tflops * 1e12)
        say(f"{name}: {kind:7s} lengths, {lay:6s}: {real} real tokens, update {statistics.median(ts):.3f} s, "
            f"MFU {100 * mfu[kind, lay]:.1f}%")
    for lay in cfgs:
        say(f"{name}: {lay}: mixed/uniform MFU {mfu['mixed', lay] / mfu['uniform', lay]:.2f}"
            + (" (target >= 0.90)" if lay == "packed" else ""))


def checkpoint_phase(state: dict, path: Path, d, root: Path) -> None:
    """Phase 3: DCP save of the sharded model + optimizer, load into fresh ones, compare bit for bit."""
    import torch

    from dapo.dist.distributed import full_tensor
    from dapo.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
    p = state["policy"]
    run_dir = root / "run"
    t = time.perf_counter()
    save_checkpoint(run_dir, 1, model=p.model, optimizer=p.optimizer, scheduler=p.scheduler,
                    state={"rollout_step": 1}, keep_last=1)
    saved_s = time.perf_counter() - t
    fresh = sharded_policy(state["cfg"], path, d)
    t = time.perf_counter()
    got = load_checkpoint(latest_checkpoint(run_dir), model=fresh.model, optimizer=fresh.optimizer,
                          scheduler=fresh.scheduler)
    loaded_s = time.perf_counter() - t
    a = {k: full_tensor(v) for k, v in p.model.state_dict().items()}
    b = {k: full_tensor(v) for k, v in fresh.model.state_dict().items()}
    same_w = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    sa, sb = p.optimizer.state_dict()["state"], fresh.optimizer.state_dict()["state"]
    same_o = sa.keys() == sb.keys() and all(
        torch.equal(full_tensor(sa[i][m]), full_tensor(sb[i][m])) for i in sa for m in ("exp_avg", "exp_avg_sq"))
    say(f"DCP checkpoint: saved in {saved_s:.2f} s, loaded in {loaded_s:.2f} s; weights equal: {same_w}, "
        f"AdamW moments equal: {same_o}, state {got}")
    if not (same_w and same_o and got == {"rollout_step": 1}):
        raise SystemExit("device-check: the resumed checkpoint differs from the saved state")


def rollout_phase(path: Path, d, steps: int = 2) -> None:
    """Phase 4: ``steps`` rollout steps of the tiny config with the transformers engine on the device."""
    from dapo import algo
    from dapo.config import load_config
    from dapo.data.run_data import load_run_data
    from dapo.engines import make_engine
    from dapo.models import load_tokenizer
    from dapo.train.logprobs import response_loss_mask, response_mask
    from dapo.train.rollout import collect_rollouts
    from dapo.train.update import build_policy, update_policy
    cfg = load_config(REPO / "experiments" / "tiny-random-smoke.yaml",
                      [f"model.path={path}", "rollout.engine=hf", "launch.fsdp=false", "eval.datasets=[]"])
    tok = load_tokenizer(path)
    from dapo.dist.distributed import DistInfo
    policy = build_policy(cfg, path, DistInfo(device=d.device), tok.pad_token_id or 0)
    sampler, prompt_tokens, _, _ = load_run_data(cfg, tok, lambda *a: None)
    engine = make_engine("hf", path, seed=cfg.train.seed, trainer_model=policy.module)
    for r in range(1, steps + 1):
        t = time.perf_counter()
        batch = collect_rollouts(engine, sampler, prompt_tokens, cfg, r)
        t_gen = time.perf_counter() - t
        adv = algo.group_advantages(batch.rewards).reshape(-1)
        mask = response_loss_mask(response_mask(batch), batch.finished, cfg.algo.overlong.filter)
        t = time.perf_counter()
        stats = update_policy(policy, batch, None, adv, mask, cfg, shuffle_seed=r)
        say(f"rollout step {r}/{steps} ({d.device.type}, transformers engine): {len(batch.response_ids)} responses, "
            f"mean length {sum(map(len, batch.response_ids)) / len(batch.response_ids):.1f}, "
            f"acc {float(batch.correct.float().mean()):.2f}, generation {t_gen:.2f} s, "
            f"update {time.perf_counter() - t:.2f} s ({len(stats)} optimizer steps)")


def training_phases(d, root: Path, cpu: bool, tflops: float, tokens: int, chunk: int) -> None:
    """Phases 2-4 on the two shapes (built under ``root``)."""
    import torch
    cuda = d.device.type == "cuda"
    t = time.perf_counter()
    models = build_models(root / "models", cpu)
    say(f"models built in {time.perf_counter() - t:.1f} s: {', '.join(models)}")
    first = None
    for name, path in models.items():
        state = update_phase(name, path, d, cpu, tflops, tokens, chunk)
        if first is None:
            first = (state, path)
        else:
            del state
        if cuda:
            torch.cuda.empty_cache()
    big = list(models)[-1]
    packed_phase(big, models[big], d, cpu, tflops, tokens, chunk)
    if cuda:
        torch.cuda.empty_cache()
    checkpoint_phase(first[0], first[1], d, root)
    rollout_phase(next(iter(models.values())), d)


def add_wheels(folder: Path, site: Path) -> list[str]:
    """Unpack every ``*.whl`` in ``folder`` into ``site`` (a wheel is a zip of its import tree; no pip,
    no index) and append ``site`` to ``sys.path``: a package the image has wins over a carried one.
    Returns the wheels' names."""
    import zipfile
    wheels = sorted(folder.glob("*.whl"))
    if not wheels:
        raise SystemExit(f"device-check: --wheels {folder}: no .whl files there")
    site.mkdir(parents=True, exist_ok=True)
    for w in wheels:
        with zipfile.ZipFile(w) as z:
            z.extractall(site)
    sys.path.append(str(site))
    return [w.name.split("-")[0] + " " + w.name.split("-")[1] for w in wheels]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", action="store_true", help="CPU + gloo, small shapes (tests the script's logic)")
    ap.add_argument("--tokens", type=int, default=None, help="token budget per micro-batch (default 16384; --cpu 256)")
    ap.add_argument("--chunk", type=int, default=None, help="train.logits_chunk_tokens (default 2048; --cpu 64)")
    ap.add_argument("--probes", choices=("all", "only", "none"), default="all",
                    help="run the probes (scripts/device_probes.py) and phases 2-4 (all), only the probes, or none")
    ap.add_argument("--workdir", default=None, help="where the models and the checkpoint go (default: a temp dir)")
    ap.add_argument("--wheels", default=None, help="a folder of carried wheels (e.g. accelerate, psutil) for "
                    "packages the image lacks: unpacked under the workdir and put after the image's own")
    a = ap.parse_args(argv)
    for name in FORBIDDEN:     # as if not installed: `import` raises, importlib.util.find_spec says None
        sys.modules[name] = None   # type: ignore[assignment]
    if a.wheels:
        say(f"carried wheels: {', '.join(add_wheels(Path(a.wheels), Path(a.workdir or tempfile.mkdtemp()) / 'site'))}")
    import importlib.util
    missing = [m for m in NEEDED if importlib.util.find_spec(m) is None]
    if missing:
        print(f"device-check: missing Python packages {missing}: carry their wheels (pip download --no-deps "
              f"on a machine with an index) and pip install --no-index them here", file=sys.stderr)
        return 4
    import torch
    cuda = not a.cpu
    if cuda and not torch.cuda.is_available():
        print("device-check: CUDA is not available here (use --cpu to check the script on a CPU)", file=sys.stderr)
        return 3
    tokens = a.tokens or (256 if a.cpu else 16384)
    chunk = a.chunk or (64 if a.cpu else 2048)
    if a.cpu:
        torch.set_num_threads(1)
    import transformers
    say(f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
        f"transformers {transformers.__version__}" +
        (f", {torch.cuda.get_device_name(0)}, {torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB"
         if cuda else ", CPU"))
    t0 = time.perf_counter()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    snaps: list[dict[str, float]] = []
    probes.take_snapshot(snaps, device)                     # CUDA: creates the context, nothing allocated yet
    tflops = matmul_tflops(device, dtype, 8192 if cuda else 512)
    probes.take_snapshot(snaps, device)
    say(f"matmul rate ({'bf16' if cuda else 'fp32'}, measured): {tflops:.2f} TFLOP/s")
    if a.workdir:
        Path(a.workdir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=a.workdir) as tmp:
        root = Path(tmp)
        d = init_group(cuda)
        probes.take_snapshot(snaps, device)
        failed = probes.run_probes(device, a.cpu, tflops, snaps, root / "probes") if a.probes != "none" else []
        if a.probes != "only":
            training_phases(d, root, a.cpu, tflops, tokens, chunk)
        torch.distributed.destroy_process_group()
    loaded = sorted(m for m, mod in sys.modules.items() if m.split(".")[0] in FORBIDDEN and mod is not None)
    if loaded:
        raise SystemExit(f"device-check: imported {loaded}")
    note = f" (probes failed: {', '.join(failed)})" if failed else ""
    say(f"device-check: OK in {time.perf_counter() - t0:.0f} s{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
