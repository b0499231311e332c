"""`dapo runs --cost`: threads, thread-seconds (wall × train.threads) and token totals, from run directories only."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from dapo.commands.runs import main, run_row, table_rows


def _run(root: Path, name: str, *, threads, wall=None, summary_extra=None) -> Path:
    d = root / "runs" / name
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(yaml.safe_dump(
        {"logging": {"arm": "grpo"}, "train": {"seed": 0, "rollout_steps": 2, "threads": threads}}))
    if wall is not None:
        (d / "summary.json").write_text(json.dumps({"rollout_steps": 2, "wall_s": wall,
                                                    "final_eval": {"eval/arith-eval/avg_at_8": 0.5},
                                                    **(summary_extra or {})}))
    return d


def test_run_row_thread_seconds_and_tokens(tmp_path):
    r = run_row(_run(tmp_path, "a", threads=2, wall=100.0, summary_extra={"gen_tokens": 12345, "trained_tokens": 999}))
    assert r["threads"] == 2 and r["thread_s"] == 200.0
    assert r["gen_tokens"] == 12345 and r["trained_tokens"] == 999
    n = run_row(_run(tmp_path, "b", threads=None, wall=100.0))          # all cores: count unknown
    assert n["threads"] is None and n["thread_s"] is None and n["gen_tokens"] is None
    s = run_row(_run(tmp_path, "c", threads=1))                          # not started/finished: no wall
    assert s["thread_s"] is None


def test_table_has_cost_columns_only_when_asked(tmp_path):
    rows = [run_row(_run(tmp_path, "a", threads=2, wall=100.0, summary_extra={"gen_tokens": 12345}))]
    cells, head = table_rows(rows)
    assert head == ["arm", "seed", "run_id", "status", "step", "eval/arith-eval/avg_at_8", "wall"]
    cells, head = table_rows(rows, cost=True)
    assert head[-4:] == ["threads", "thread-s", "gen_tok", "trained_tok"]
    assert cells[0][-4:] == ["2", "200", "12.3k", "-"]


def test_main_cost_flag(tmp_path, capsys):
    _run(tmp_path, "a", threads=1, wall=65.0)
    assert main(["--output", str(tmp_path), "--cost"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[-4:] == ["threads", "thread-s", "gen_tok", "trained_tok"]
    assert lines[2].split()[-5:] == ["1m05s", "1", "65", "-", "-"]
    assert main(["--output", str(tmp_path), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)[0]
    assert row["thread_s"] == 65.0 and row["threads"] == 1.0
