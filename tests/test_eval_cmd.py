"""``dapo eval`` (dapo/commands/eval.py) and its numbers (dapo/algo/eval_metrics.py): the estimators against
enumeration, the curves' invariants, bad inputs (one line, exit 2, nothing written), and a real
tiny run's checkpoint evaluated again: the logged evaluation reproduced bit for bit, a killed
evaluation resumed without counting a sample twice, and the MLflow eval run linked by tag."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dapo import algo
from dapo.algo import eval_metrics as em
from dapo.commands.eval import main as eval_main

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("n", range(1, 7))
def test_pass_at_k_equals_the_fraction_of_k_subsets_with_a_correct_sample(n):
    for c in range(n + 1):
        correct = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(correct, k))
            assert algo.pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets), abs=1e-12)


def test_the_pass_at_k_curve_rises_with_k_and_ends_at_pass_at_n():
    counts, n = [0, 1, 3, 8, 5, 2], 8
    ks = em.curve_ks(n)
    assert ks == [1, 2, 4, 8] and em.curve_ks(6) == [1, 2, 4, 6] and em.curve_ks(1) == [1]
    curve = em.pass_at_k_curve(counts, n, ks)
    assert all(curve[a] <= curve[b] for a, b in zip(ks, ks[1:]))
    assert curve[8] == pytest.approx(sum(c > 0 for c in counts) / len(counts))
    assert curve[1] == pytest.approx(sum(counts) / (n * len(counts)))          # pass@1 = avg@n


def test_maj_at_k_enumerates_subsets_counts_ties_as_1_over_m_and_samples_when_too_many():
    answers, correct = ["4", "4", "5", None, "5", "4"], [True, True, False, False, False, True]
    assert em.maj_at_k(answers, correct, 6) == algo.cons_at_k(answers, correct) == 1.0
    # k = 2 by hand: 15 pairs; "4" wins 3 pairs (4,4) and half of (4,5)x6 and (4,None)x3 counts 1
    pairs = list(itertools.combinations(range(6), 2))
    want = sum(algo.cons_at_k([answers[i] for i in p], [correct[i] for i in p]) for p in pairs) / 15
    assert em.maj_at_k(answers, correct, 2) == pytest.approx(want)
    assert em.maj_at_k(["1", "2"], [True, False], 2) == 0.5                      # a 2-way tie: 1/2
    sampled = em.maj_at_k(answers, correct, 3, max_subsets=10, seed=1)            # C(6,3) = 20 > 10
    assert abs(sampled - em.maj_at_k(answers, correct, 3)) < 0.2
    assert sampled == em.maj_at_k(answers, correct, 3, max_subsets=10, seed=1)   # fixed seed
    with pytest.raises(ValueError, match="1 <= k <= n"):
        em.maj_at_k(answers, correct, 7)


def test_solve_rate_histogram_and_bootstrap_by_hand():
    hist = em.solve_rate_histogram([0, 0, 1, 2, 3, 4, 8, 8, 7], 8)
    assert hist == {"never": 2, "(0, 0.25]": 2, "(0.25, 0.5]": 2, "(0.5, 0.75]": 0, "(0.75, 1)": 1, "always": 2}
    assert list(hist) == ["never", "(0, 0.25]", "(0.25, 0.5]", "(0.5, 0.75]", "(0.75, 1)", "always"]
    mean, lo, hi = em.bootstrap_mean([0.0, 0.25, 0.5, 1.0, 0.75, 0.0, 0.125, 1.0])
    assert mean == pytest.approx(0.453125) and lo < mean < hi
    assert em.bootstrap_mean([0.5, 0.5]) == (0.5, 0.5, 0.5)


def _fake_run(root: Path) -> Path:
    run = root / "run"
    (run / "checkpoints" / "step_000002").mkdir(parents=True)
    (run / "checkpoints" / "step_000002" / "state.json").write_text("{}")
    (run / "config.yaml").write_text("name: x\n")
    return run


@pytest.mark.parametrize("args, message", [
    (["nosuch-model", "--sets", "arith-eval"], "no such model directory"),
    (["tiny-3m", "--sets", "nosuch"], "eval set 'nosuch'"),
    (["tiny-3m", "--sets", "arith-eval", "--k", "0"], "--k must be >= 1"),
    (["tiny-3m", "--sets", "arith-eval", "--protocol", "run"], "--protocol run needs a run dir"),
    (["tiny-3m", "--sets", "arith-eval", "--step", "3"], "--step needs a run dir"),
    (["tiny-3m", "--sets", "arith-eval", "rollout.engine=hf", "--chunk", "4"], "--chunk needs rollout.engine=vllm"),
    (["RUN", "--step", "7"], "no checkpoint at step 7; it has [2]"),
    (["EMPTY"], "neither a run dir"),
])
def test_bad_inputs_give_one_error_line_exit_2_and_write_nothing(tmp_path, capsys, args, message):
    run, empty = _fake_run(tmp_path), tmp_path / "empty"
    empty.mkdir()
    args = [str(run) if a == "RUN" else str(empty) if a == "EMPTY" else a for a in args]
    assert eval_main([*args, "--to", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert not (tmp_path / "out").exists()


def test_a_to_dir_of_other_settings_or_not_an_eval_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert eval_main(["tiny-3m", "--sets", "arith-eval", "--to", str(out)]) == 2
    assert "not an evaluation dir" in capsys.readouterr().err and os.listdir(out) == ["notes.txt"]
    other = tmp_path / "other"
    other.mkdir()
    (other / "request.json").write_text(json.dumps({"k": 3}))
    assert eval_main(["tiny-3m", "--sets", "arith-eval", "--to", str(other)]) == 2
    assert "other settings" in capsys.readouterr().err


# ----------------------------------------------------------------------------- a real run
# tiny-random-smoke on the transformers engine (as tests/test_eval_records.py): 8 eval problems x k = 2,
# evaluated before training and after each of 2 rollout steps; checkpoints after both.
TINY = ["rollout.engine=hf", "rollout.n=2", "rollout.max_new_tokens=4", "train.batch_prompts=2",
        "train.mini_batch_prompts=1", "train.micro_batch_seqs=2", "train.threads=1", "eval.every=1",
        "checkpoint.every=1", "data.train_limit=16", "logging.progress=false"]


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith("DAPO_FAULT_")}
    e.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", **(env or {}))
    return subprocess.run([sys.executable, "-m", "dapo.cli", *args], cwd=REPO, env=e, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
def test_eval_of_a_checkpoint_reproduces_the_logged_evaluation_and_resumes_after_a_kill(tmp_path):
    """(~40 s: a 2-step run, then three evaluations)"""
    from mlflow.tracking import MlflowClient

    from dapo.eval_records import read_records, records_path
    p = _cli("train", "experiments/tiny-random-smoke.yaml", *TINY, f"output_dir={tmp_path}",
             f"logging.tracking_uri=sqlite:///{tmp_path / 'mlruns.db'}", "--run-dir", str(tmp_path / "run"))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    run = tmp_path / "run"
    p = _cli("eval", str(run), "--step", "1", "--to", str(tmp_path / "e1"))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    samples = [json.loads(line) for line in (tmp_path / "e1" / "samples.jsonl").open()]
    assert samples == read_records(records_path(run, 1))                     # the run's own records, bit for bit
    result = json.loads((tmp_path / "e1" / "eval.json").read_text())
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}")
    run_id = json.loads((run / "summary.json").read_text())["mlflow_run_id"]
    logged = {m.step: m.value for m in client.get_metric_history(run_id, "eval/arith-eval/avg_at_2")}
    grad_step = samples[0]["grad_step"]
    assert result["sets"]["arith-eval"]["metrics"]["eval/arith-eval/avg_at_2"] == logged[grad_step]
    assert result["request"]["protocol"] == "run" and result["sets"]["arith-eval"]["problems"] == 8
    assert result["sets"]["arith-eval"]["pass_at_k"]["2"] == pytest.approx(
        client.get_metric_history(run_id, "eval/arith-eval/pass_at_2")[1].value)
    evals = [r for r in client.search_runs([client.get_run(run_id).info.experiment_id])
             if r.data.tags.get("dapo.eval_of") == run_id]
    assert len(evals) == 1 and evals[0].data.metrics["eval/arith-eval/avg_at_2"] == logged[grad_step]
    table = {f.path for f in client.list_artifacts(evals[0].info.run_id, "eval_records")}
    assert table == {"eval_records/samples.json"}                           # the samples as a table in the UI
    # killed after the first of two sets' files, then rerun: the same records, none twice
    two = ["eval", str(run), "--step", "2", "--sets", "arith-eval,arith-fresh", "--limit", "8", "--no-mlflow",
           "--to", str(tmp_path / "e2")]
    p = _cli(*two, env={"DAPO_FAULT_KILL_IN_EVAL": "1"})
    assert p.returncode == -9, p.stderr[-2000:]
    assert not (tmp_path / "e2" / "eval.json").exists()
    p = _cli(*two)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    again = [json.loads(line) for line in (tmp_path / "e2" / "samples.jsonl").open()]
    assert len(again) == 2 * 8 * 2 == len({(r["set"], r["problem"], r["sample"]) for r in again})
    assert [r for r in again if r["set"] == "arith-eval"] == read_records(records_path(run, 2))
    from dapo.data.datasets import load_dataset
    from dapo.data.rewards import get_scorer
    answers = {f"arith-fresh:{e.index}": e.answer for e in load_dataset("arith-fresh", limit=8)[0]}
    assert all((get_scorer("dapo")(r["response"], answers[r["problem"]]) > 0) == r["correct"]
               for r in again if r["set"] == "arith-fresh")
    p = _cli(*two)
    assert p.returncode == 0 and "already done" in p.stdout
    # every kept checkpoint and the start, as the paper's Fig. 1 draws a run: the logged curve again
    p = _cli("eval", str(run), "--step", "all", "--no-mlflow", "--to", str(tmp_path / "all"))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    curve = (tmp_path / "all" / "curve.md").read_text()
    for step in (0, 1, 2):
        res = json.loads((tmp_path / "all" / f"step{step}" / "eval.json").read_text())
        got = res["sets"]["arith-eval"]["metrics"]["eval/arith-eval/avg_at_2"]
        assert got == logged[{0: 0, 1: grad_step, 2: 2 * grad_step}[step]], step
        assert f"| {step} | {100 * got:.2f} [" in curve


def test_dapo_runs_samples_prints_the_latest_evaluation(tmp_path, capsys):
    from dapo.commands.runs import main as runs_main
    from dapo.eval_records import make_record, records_path, write_records
    for step in (0, 5):
        write_records(records_path(tmp_path, step), [
            make_record(set="arith-eval", problem=f"arith-eval:{p}", sample=j, seed=1, prompt_hash="0" * 16,
                        answer=str(p), correct=p == 1, length=9, finished=p != 2, response=f"step {step} p{p} s{j}",
                        step=step, grad_step=3 * step) for p in range(4) for j in range(2)])
    assert runs_main([str(tmp_path), "--samples", "3"]) == 0
    out = capsys.readouterr().out
    assert "eval-step00005" in out and "grad step 15" in out and "step 5 p2 s0" in out
    assert "p3" not in out and "s1" not in out and "step 0" not in out and "(cut)" in out
    assert runs_main([str(tmp_path / "none"), "--samples"]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_protocol_values_and_the_users_overrides_compose_the_users_winning():
    """`dapo eval MODEL --protocol dapo eval.top_p=1.0` (README, issue 41): the protocol sets temperature 1.0,
    top_p 0.7 and k 32; the user's eval.top_p=1.0 replaces its top_p (it was refused as 'given twice'), the
    rest stays the protocol's, and the request records what is used."""
    from dapo.commands.eval import _settings, parser, resolve_target
    a = parser().parse_intermixed_args(["tiny-3m", "--sets", "arith-eval", "--protocol", "dapo", "eval.top_p=1.0"])
    cfg, req = _settings(a, resolve_target(a.target, a.step))
    assert (cfg.eval.top_p, cfg.eval.temperature, cfg.eval.k) == (1.0, 1.0, 32)
    assert (req["top_p"], req["temperature"], req["k"]) == (1.0, 1.0, 32)
    a = parser().parse_intermixed_args(["tiny-3m", "--sets", "arith-eval", "--protocol", "dapo", "--k", "4", "eval.k=8"])
    assert _settings(a, resolve_target(a.target, a.step))[0].eval.k == 8
