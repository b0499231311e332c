"""``dapo runs [--sweep SPEC] [--output DIR]``: the runs under an output root, from their run directories.

One row per run: arm, seed, run id, status (done / failed / running / stopped / not started; running:
a process holds the run's ``run.lock``, stopped: none does, rerun to resume), last rollout step
of total, final metric, wall time; then the ``mlflow ui`` command for the store(s) the runs log to.
``--cost`` adds what each run cost: threads, thread-seconds (loop wall time × ``train.threads``: runs
record wall time, not CPU time) and generated / trained tokens from ``summary.json``
(``gen_tokens``, ``trained_tokens``: the loop's checkpointed totals; "-" for runs made before
it wrote them, whose totals are in MLflow, see the report's cost ledger).
``dapo runs RUN_DIR --samples [N]`` prints what the policy wrote at the run's latest evaluation:
sample 0 of its first N problems (default 5) per eval set, with correctness, length and answer.
Reads only run directories (``config.yaml``, ``summary.json``, ``failed.json``, checkpoints'
``state.json``, ``mlflow_run.json``): no MLflow, no torch, so it is instant and works on a copy.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from dapo.config import ConfigError, safe_yaml_file, show
from dapo.helptext import help_text
from dapo.preflight import finished_summary
from dapo.run_dir import run_dir_holder

__all__ = ["run_rows", "main"]


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def _last_checkpoint(run_dir: Path) -> tuple[int, dict | None]:
    """(rollout step, state.json) of the newest complete checkpoint, or (0, None)."""
    ck = run_dir / "checkpoints"
    steps = sorted(p for p in ck.glob("step_*") if (p / "state.json").is_file()) if ck.is_dir() else []
    if not steps:
        return 0, None
    try:
        return int(steps[-1].name.split("_")[1]), _json(steps[-1] / "state.json")
    except ValueError:
        return 0, None


def _config(run_dir: Path) -> dict:
    try:
        cfg = safe_yaml_file(run_dir / "config.yaml") if (run_dir / "config.yaml").is_file() else {}
    except ConfigError:
        cfg = {}
    return cfg if isinstance(cfg, dict) else {}


def _number(v: Any) -> float | None:
    """``v`` as a float if it is a number (not a bool), else None."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _final_metric(summary: dict | None, metric: str | None) -> tuple[str, float | None]:
    """(metric name, value) from summary.json's final_eval: ``metric`` if given, else the first avg@k."""
    ev = (summary or {}).get("final_eval") or {}
    if not isinstance(ev, dict):
        return metric or "", None
    name = metric or next((k for k in ev if "/avg_at_" in k), next(iter(ev), ""))
    return name, _number(ev.get(name))


def run_row(run_dir: Path, metric: str | None = None, arm: str = "", seed: Any = "",
            total: int | None = None) -> dict[str, Any]:
    """One run directory → {arm, seed, run_id, status, step, total, metric, value, wall_s, tracking_uri,
    threads, thread_s, gen_tokens, trained_tokens}.

    total: the run's rollout steps from its config.yaml, else ``total`` (a sweep job's, before its run
    dir exists), else None.
    thread_s = wall_s × train.threads (None when threads is null, i.e. set from the environment, or wall unknown);
    gen_tokens / trained_tokens: summary.json's totals when it has them, else None.
    """
    cfg = _config(run_dir)
    log, tr = cfg.get("logging") or {}, cfg.get("train") or {}
    summary = finished_summary(run_dir)
    step, state = _last_checkpoint(run_dir)
    if summary is not None:
        status = "done"
        step = summary.get("rollout_steps", step)
    elif (run_dir / "failed.json").is_file():
        status = "failed"
    elif run_dir.is_dir():      # started, not finished: running now (its run.lock is held), else stopped
        status = "running" if run_dir_holder(run_dir) else "stopped"   # (killed or interrupted: rerun to resume)
    else:
        status = "not started"
    name, value = _final_metric(summary, metric)
    wall = (summary or {}).get("wall_s", (state or {}).get("wall_s"))
    uri = (_json(run_dir / "mlflow_run.json") or {}).get("tracking_uri") or (summary or {}).get("mlflow_uri")
    wall = _number(wall)
    threads = _number(tr.get("threads"))
    return {"arm": log.get("arm") or arm or "-", "seed": tr.get("seed", seed), "run_id": run_dir.name,
            "status": status, "step": step, "total": tr.get("rollout_steps", total), "metric": name, "value": value,
            "wall_s": wall, "tracking_uri": uri, "threads": threads,
            "thread_s": wall * threads if wall is not None and threads is not None else None,
            "gen_tokens": _number((summary or {}).get("gen_tokens")),
            "trained_tokens": _number((summary or {}).get("trained_tokens"))}


def run_rows(output: str | Path = "runs", spec: str | None = None) -> list[dict[str, Any]]:
    """Rows for every run under ``<output>/runs/`` (sorted), or for every job of the sweep ``spec``."""
    out = Path(output)
    if spec is not None:
        from dapo.sweep.spec import expand, load_spec
        s = load_spec(spec)
        return [run_row(j.run_dir, s.metric, j.arm, j.seed, j.config.train.rollout_steps) for j in expand(s, out)]
    root = out / "runs"
    dirs = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    return [run_row(d) for d in dirs]


def _fmt_wall(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _fmt_count(v: float | None) -> str:
    if v is None:
        return "-"
    for div, suf in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.1f}{suf}"
    return f"{v:.0f}"


def table_rows(rows: list[dict[str, Any]], cost: bool = False) -> tuple[list[list[Any]], list[str]]:
    """(cells, header) of the printed table; ``cost`` adds threads, thread-s, gen tok, trained tok."""
    metric = next((r["metric"] for r in rows if r["metric"]), "final metric")
    head = ["arm", "seed", "run_id", "status", "step", metric, "wall"]
    cells = [[r["arm"], r["seed"], r["run_id"], r["status"],
              f"{r['step']}/{r['total']}" if r["total"] is not None else f"{r['step']}/-",
              "-" if r["value"] is None else f"{r['value']:.4f}", _fmt_wall(r["wall_s"])] for r in rows]
    if cost:
        head += ["threads", "thread-s", "gen_tok", "trained_tok"]
        for c, r in zip(cells, rows):
            c += ["-" if r["threads"] is None else f"{r['threads']:.0f}",
                  "-" if r["thread_s"] is None else f"{r['thread_s']:.0f}",
                  _fmt_count(r["gen_tokens"]), _fmt_count(r["trained_tokens"])]
    return cells, head


def latest_samples(run_dir: str | Path, n: int) -> tuple[Path, list[dict[str, Any]]]:
    """(the latest record file, sample 0 of its first ``n`` problems per eval set); ValueError if none."""
    from dapo.eval_records import DIRNAME, read_records
    files = sorted((Path(run_dir) / DIRNAME).glob("eval-step*.jsonl.gz"))
    if not files:
        raise ValueError(f"{run_dir}: no evaluation records ({DIRNAME}/eval-step*.jsonl.gz)")
    shown: dict[str, list[dict[str, Any]]] = {}
    for rec in read_records(files[-1]):
        if rec["sample"] == 0 and len(shown.setdefault(rec["set"], [])) < n:
            shown[rec["set"]].append(rec)
    return files[-1], [r for recs in shown.values() for r in recs]


def print_samples(run_dir: str | None, n: int) -> int:
    """``dapo runs RUN_DIR --samples N``: one block per sample; exit 2 on a bad run dir or N."""
    if not run_dir or n < 1:
        print("error: --samples needs RUN_DIR and N >= 1 (dapo runs RUN_DIR --samples 5)", file=sys.stderr)
        return 2
    try:
        path, recs = latest_samples(run_dir, n)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{path} (rollout step {recs[0]['step'] if recs else '?'}, grad step {recs[0]['grad_step'] if recs else '?'})")
    for r in recs:
        mark = "correct" if r["correct"] else "wrong"
        print(f"\n--- {r['problem']} sample 0: {mark}, {r['length']} tokens{'' if r['finished'] else ' (cut)'}, "
              f"answer {r['answer']!r}\n{r['response']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dapo runs", description=help_text(__doc__))
    p.add_argument("--output", default="runs", metavar="DIR", help="output root: runs in DIR/runs/ (default: runs)")
    p.add_argument("--sweep", metavar="SPEC", help="only the jobs of this sweep spec (its metric is shown)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--cost", action="store_true",
                   help="add threads, thread-seconds (wall × train.threads) and generated/trained tokens")
    p.add_argument("run_dir", nargs="?", metavar="RUN_DIR", help="with --samples: the run whose samples to print")
    p.add_argument("--samples", nargs="?", const=5, type=int, metavar="N",
                   help="print sample 0 of the first N problems (default 5) of RUN_DIR's latest evaluation")
    a = p.parse_args(argv)
    if a.samples is not None or a.run_dir:
        return print_samples(a.run_dir, 5 if a.samples is None else a.samples)
    out = Path(a.output)
    if not out.is_dir():
        print(f"error: --output {show(a.output)}: " + ("not a directory" if out.exists() else
              f"no such directory ({out.resolve()}); nothing has run there: give the output root of the runs "
              f"(output_dir of dapo train, --output of dapo sweep submit)"), file=sys.stderr)
        return 2
    try:
        rows = run_rows(a.output, a.sweep)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    if not rows:
        print(f"no runs under {Path(a.output).resolve() / 'runs'}")
        return 0
    from dapo.commands.sweep import _table
    print(_table(*table_rows(rows, a.cost)))
    from dapo.cli import mlflow_ui_command
    from dapo.tracking.tracker import default_tracking_uri
    uris = list(dict.fromkeys(r["tracking_uri"] for r in rows if r["tracking_uri"]))
    if not uris:
        uris = [default_tracking_uri(a.output)] if (Path(a.output) / "mlruns.db").is_file() else []
    for uri in uris:
        print(f"browse: {mlflow_ui_command(uri)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
