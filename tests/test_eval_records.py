"""Per-sample evaluation records (dapo/eval_records.py): the file format, the records an
evaluation returns beside its aggregates (they agree), and a real run leaving one file per
evaluation in its run dir and in MLflow."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from dapo import algo
from dapo.eval_records import (FIELDS, RECORD_VERSION, make_record, problem_id, prompt_hash, read_records,
                               records_frame, records_path, table_columns, write_records)

REPO = Path(__file__).resolve().parents[1]


def _record(i: int, **kw):
    base = dict(set="arith-eval", problem=f"arith-eval:{i // 2}", sample=i % 2, seed=7,
                prompt_hash=prompt_hash([i // 2, 5]), answer=None if i == 3 else str(i), correct=i % 3 == 0,
                length=4 + i, finished=i != 2, response=f"… Answer: {i} ✓")
    return make_record(**{**base, **kw})


# ----------------------------------------------------------------------------- the format
def test_write_then_read_gives_the_records_back(tmp_path):
    recs = [_record(i, step=5, grad_step=80) for i in range(4)]
    path = write_records(records_path(tmp_path, 5), recs)
    assert path == tmp_path / "eval_records" / "eval-step00005.jsonl.gz"
    assert read_records(path) == recs
    assert list(recs[0]) == list(FIELDS) and recs[0]["version"] == RECORD_VERSION == 1
    with gzip.open(path, "rt", encoding="utf-8") as f:                       # one JSON object a line
        assert [json.loads(line) for line in f] == recs
    # the frame: one row per sample, over files or a run's folder
    write_records(records_path(tmp_path, 10), [_record(i, step=10, grad_step=160) for i in range(2)])
    frame = records_frame(tmp_path / "eval_records")
    assert list(frame.columns) == list(FIELDS) and len(frame) == 6
    assert frame["step"].tolist() == [5] * 4 + [10] * 2
    assert len(records_frame([path])) == 4 and len(records_frame([])) == 0


def test_the_write_is_atomic_and_a_rewrite_replaces(tmp_path):
    path = records_path(tmp_path, 0)
    write_records(path, [_record(i) for i in range(4)])
    write_records(path, [_record(i) for i in range(2)])                   # the step evaluated again
    assert len(read_records(path)) == 2
    assert sorted(os.listdir(path.parent)) == [path.name]                  # no temporary file left

    def broken():
        yield _record(0)
        raise RuntimeError("the writer dies half way")
    with pytest.raises(RuntimeError):
        write_records(path, broken())
    assert len(read_records(path)) == 2 and sorted(os.listdir(path.parent)) == [path.name]
    # the gzip bytes do not depend on when they were written
    a, b = tmp_path / "a.jsonl.gz", tmp_path / "b.jsonl.gz"
    write_records(a, [_record(1)]); write_records(b, [_record(1)])
    assert a.read_bytes() == b.read_bytes()


def test_fields_are_checked_and_newer_versions_refused(tmp_path):
    assert make_record(**{k: 0 for k in FIELDS if k not in ("version", "step", "grad_step")})["step"] is None
    with pytest.raises(ValueError, match="missing \\['response'\\]"):
        make_record(**{k: 0 for k in FIELDS if k not in ("version", "response")})
    with pytest.raises(ValueError, match="unknown \\['extra'\\]"):
        _record(0, extra=1)
    path = tmp_path / "new.jsonl.gz"
    write_records(path, [{**_record(0), "version": RECORD_VERSION + 1}])
    with pytest.raises(ValueError, match="newer"):
        read_records(path)
    assert problem_id(("arith-eval", 3)) == "arith-eval:3" and problem_id(("hf:x/y", 0)) == "hf:x/y:0"
    assert prompt_hash([1, 2, 3]) == prompt_hash([1, 2, 3]) != prompt_hash([1, 2, 4])
    assert len(prompt_hash([1])) == 16
    cols = table_columns([_record(0, response="x" * 50 + "Answer: 1")], response_chars=10)
    assert cols["response_tail"] == ["xAnswer: 1"] and "response" not in cols


# ----------------------------------------------------------------------------- evaluate's records
class ScriptedEngine:
    """Prompt ``[i, ...]`` gets the responses ``script[i]`` (text, finished), k of them."""

    def __init__(self, script):
        self.script = script

    def generate(self, prompts, spec):
        from dapo.engines import Completion
        return [[Completion(token_ids=[1] * (2 + j), text=t, finished=fin)
                 for j, (t, fin) in enumerate(self.script[p[0]][:spec.n])] for p in prompts]


def _ans(a):
    return (f"steps\nAnswer: {a}", True) if a is not None else ("no answer, cut at the cap", False)


# answer "7" is right for every problem. cons@4 by hand: p0 "7" ×3 → 1; p1 2-way tie 7/3 → 1/2;
# p2 3-way tie 1/2/7 + None → 1/3; p3 all None → 0; p4 "5" ×2 beats "7" → 0.
SCRIPT = {0: ["7", "7", "7", "3"], 1: ["3", "7", "3", "7"], 2: ["1", "2", None, "7"],
          3: [None, None, None, None], 4: ["5", "7", "5", None], 5: ["7", "7", "7", "7"]}


def _evaluate(rank: int = 0, world: int = 1):
    from dapo.config import load_config
    from dapo.data.datasets import Example
    from dapo.train.evaluate import evaluate
    sets = {"main": [Example(prompt=f"q{i}", answer="7", source="arith-eval", index=i, scorer="dapo")
                     for i in range(5)],
            "dir/other": [Example(prompt="q5", answer="7", source="other.jsonl", index=0, scorer="dapo")]}
    tokens = {("arith-eval", i): [i, 100 + i] for i in range(5)} | {("other.jsonl", 0): [5, 9]}
    cfg = load_config(None, ["eval.k=4"])
    engine = ScriptedEngine({i: [_ans(a) for a in answers] for i, answers in SCRIPT.items()})
    return evaluate(engine, sets, tokens, cfg, seed=123, rank=rank, world=world)


def test_evaluate_returns_records_that_agree_with_its_aggregates():
    metrics, recs = _evaluate()
    assert len(recs) == 4 * 6 and all(list(r) == list(FIELDS) for r in recs)
    assert metrics["eval/main/cons_at_4"] == pytest.approx((1 + 1 / 2 + 1 / 3 + 0 + 0) / 5)   # by hand
    assert metrics["eval/main/avg_at_4"] == pytest.approx(7 / 20) and metrics["eval/main/pass_at_4"] == 0.8
    by_set = defaultdict(lambda: defaultdict(list))
    for r in recs:
        by_set[r["set"]][r["problem"]].append(r)
    assert set(by_set) == {"main", "dir_other"}                    # the names of the metrics
    for s, problems in by_set.items():
        rows = [r for rs in problems.values() for r in rs]
        assert metrics[f"eval/{s}/avg_at_4"] == pytest.approx(sum(r["correct"] for r in rows) / len(rows))
        assert metrics[f"eval/{s}/pass_at_4"] == pytest.approx(
            sum(any(r["correct"] for r in rs) for rs in problems.values()) / len(problems))
        assert metrics[f"eval/{s}/cons_at_4"] == pytest.approx(
            sum(algo.cons_at_k([r["answer"] for r in rs], [r["correct"] for r in rs])
                for rs in problems.values()) / len(problems))
        assert metrics[f"eval/{s}/response_len_mean"] == pytest.approx(sum(r["length"] for r in rows) / len(rows))
        for rs in problems.values():
            assert [r["sample"] for r in rs] == [0, 1, 2, 3] and len({r["prompt_hash"] for r in rs}) == 1
    p2 = by_set["main"]["arith-eval:2"]
    assert [r["answer"] for r in p2] == ["1", "2", None, "7"]
    assert [r["correct"] for r in p2] == [False, False, False, True]
    assert [r["finished"] for r in p2] == [True, True, False, True] and [r["length"] for r in p2] == [2, 3, 4, 5]
    assert p2[3]["response"] == "steps\nAnswer: 7" and p2[0]["prompt_hash"] == prompt_hash([2, 102])
    assert {r["seed"] for r in recs} == {123} and {r["step"] for r in recs} == {None}


def _eval_worker(rank, world, port, out_path):
    """One rank of a 2-process evaluate on gloo: the records, the metrics and the problems it judged."""
    import datetime

    import torch
    import torch.distributed as dist

    from dapo.train import evaluate as ev
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    judged, judge = [], ev._judge
    ev._judge = lambda ex, comps: (judged.append(ex.prompt), judge(ex, comps))[1]
    metrics, recs = _evaluate(rank=rank, world=world)
    torch.save({"metrics": metrics, "records": recs, "judged": judged}, f"{out_path}.rank{rank}")
    dist.destroy_process_group()


def test_two_processes_judge_each_problem_once_and_agree_with_one(tmp_path):
    """evaluate on 2 ranks: every rank returns the one-process records and metrics, and each problem
    was judged (scored, its answers extracted) on exactly one rank."""
    import socket

    import torch
    import torch.multiprocessing as mp
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(_eval_worker, args=(2, port, str(tmp_path / "ev")), nprocs=2, join=True)
    ranks = [torch.load(f"{tmp_path / 'ev'}.rank{r}") for r in range(2)]
    metrics, recs = _evaluate()
    for r in ranks:
        assert r["metrics"] == metrics and r["records"] == recs
    assert sorted(ranks[0]["judged"] + ranks[1]["judged"]) == sorted(f"q{i}" for i in range(6))
    assert ranks[0]["judged"] and ranks[1]["judged"]


def test_records_survive_the_file_and_recompute_the_metrics(tmp_path):
    metrics, recs = _evaluate()
    write_records(records_path(tmp_path, 0), recs)
    frame = records_frame(tmp_path / "eval_records")
    per_problem = frame.groupby(["set", "problem"])
    assert frame.groupby("set")["correct"].mean().to_dict() == pytest.approx(
        {"main": metrics["eval/main/avg_at_4"], "dir_other": metrics["eval/dir_other/avg_at_4"]})
    cons = per_problem.apply(lambda g: algo.cons_at_k(g["answer"].tolist(), g["correct"].tolist()))
    assert cons.groupby(level="set").mean()["main"] == pytest.approx(metrics["eval/main/cons_at_4"])


# ----------------------------------------------------------------------------- MLflow
def test_the_tracker_logs_the_file_and_a_table_once(tmp_path):
    """Logged again (a step re-evaluated after a resume), the file is replaced and the table kept,
    not appended to (MLflow's log_table appends): each sample is in MLflow once."""
    from mlflow.tracking import MlflowClient
    from dapo.tracking.tracker import Tracker
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    tracker = Tracker(uri, "records", "r")
    recs = [_record(i, step=3, grad_step=6) for i in range(4)]
    for _ in range(2):
        path = write_records(records_path(tmp_path / "run", 3), recs)
        tracker.log_artifact(path, "eval_records")
        tracker.log_table(table_columns(recs), "eval_records/step00003.json")
    client = MlflowClient(tracking_uri=uri)
    assert {f.path for f in client.list_artifacts(tracker.run_uuid, "eval_records")} == {
        "eval_records/eval-step00003.jsonl.gz", "eval_records/step00003.json"}
    local = Path(client.download_artifacts(tracker.run_uuid, "eval_records", str(tmp_path / "dl")))
    assert read_records(local / "eval-step00003.jsonl.gz") == recs
    table = json.loads((local / "step00003.json").read_text())
    assert len(table["data"]) == 4 and table["columns"][-1] == "response_tail"


# ----------------------------------------------------------------------------- a real run
# tiny-random-smoke on the transformers engine, 8 eval problems × k = 2, 4-token responses:
# evaluation before training and after each of 2 rollout steps, a checkpoint after step 2 only.
TINY = ["rollout.engine=hf", "rollout.n=2", "rollout.max_new_tokens=4", "train.batch_prompts=2",
        "train.mini_batch_prompts=1", "train.micro_batch_seqs=2", "train.threads=1", "eval.every=1",
        "checkpoint.every=2", "data.train_limit=16", "logging.progress=false"]


def _train(out: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith("DAPO_FAULT_")}
    e.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", **(env or {}))
    return subprocess.run([sys.executable, "-m", "dapo.cli", "train", "experiments/tiny-random-smoke.yaml", *TINY,
                           f"output_dir={out}", f"logging.tracking_uri=sqlite:///{out / 'mlruns.db'}",
                           "--run-dir", str(out / "run")], cwd=REPO, env=e, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
def test_a_run_leaves_one_record_file_per_evaluation_and_a_resume_counts_none_twice(tmp_path):
    """Straight: files for rollout steps 0, 1, 2 of 16 records each, in the run dir and MLflow.
    Killed after step 2's update (evaluations 0 and 1 written, no checkpoint yet), then resumed:
    steps 0 and 1 are evaluated again and replace their files, so the records equal the
    straight run's and MLflow's tables hold each sample once (~40 s: three processes)."""
    from mlflow.tracking import MlflowClient
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    p = _train(straight)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    p = _train(killed, env={"DAPO_FAULT_KILL_AT_STEP": "2"})
    assert p.returncode == -9, p.stderr[-2000:]
    assert sorted(os.listdir(killed / "run" / "eval_records")) == ["eval-step00000.jsonl.gz", "eval-step00001.jsonl.gz"]
    p = _train(killed)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    names = ["eval-step00000.jsonl.gz", "eval-step00001.jsonl.gz", "eval-step00002.jsonl.gz"]
    for out in (straight, killed):
        summary = json.loads((out / "run" / "summary.json").read_text())
        assert sorted(os.listdir(out / "run" / "eval_records")) == names
        client, run_id = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlruns.db'}"), summary["mlflow_run_id"]
        history = {int(m.value): m.step for m in client.get_metric_history(run_id, "progress/rollout_step")}
        assert sorted(history) == [0, 1, 2]
        for step in (0, 1, 2):
            recs = read_records(records_path(out / "run", step))
            assert recs == read_records(records_path(straight / "run", step))       # the resume changed nothing
            assert len(recs) == 8 * 2 and len({(r["problem"], r["sample"]) for r in recs}) == 16
            assert {(r["step"], r["grad_step"], r["set"]) for r in recs} == {(step, history[step], "arith-eval")}
            assert all(r["length"] <= 4 and (r["finished"] or r["length"] == 4) for r in recs)
            avg = client.get_metric_history(run_id, "eval/arith-eval/avg_at_2")
            assert [m.value for m in avg if m.step == history[step]] == [pytest.approx(
                sum(r["correct"] for r in recs) / 16)]
        local = Path(client.download_artifacts(run_id, "eval_records", str(out / "dl")))
        assert sorted(f.name for f in local.iterdir()) == sorted(
            names + ["step00000.json", "step00001.json", "step00002.json"])
        assert all(len(json.loads((local / f"step{s:05d}.json").read_text())["data"]) == 16 for s in (0, 1, 2))
