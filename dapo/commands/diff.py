"""``dapo diff RUN_A RUN_B``: what two runs were told differently, and what they logged side by side.

Prints (a) each run's id, MLflow run id and status, (b) the config keys whose values differ (the
runs' resolved ``config.yaml`` files, flattened to dotted keys by ``dapo.config.flatten``; a key
only one run has shows ``(absent)`` on the other side), and (c) the headline metrics at the rollout
steps both runs logged them: A's value, B's, and B - A. The default metrics are every eval metric
(``eval/<set>/<kind>_at_<k>``) plus ``rollout/reward_mean``, ``rollout/acc_mean``, ``train/entropy``
and ``rollout/response_len_mean``, those both runs logged (the others are named on one line);
``--metrics a,b`` chooses, ``--steps 0,10,last`` restricts the steps. ``--json`` prints the same as
one JSON object (NaN as null).

Metrics are read from each run's MLflow store (its ``mlflow_run.json``) by the analysis' reader,
``analysis.runs.load_runs``: the run's MLflow run, at its logged rollout steps. A path that is not a
run directory, a run without an MLflow run, an unreadable store, or a metric or step that is not
there is one ``error: ...`` line naming it, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from pathlib import Path
from typing import Any

from dapo.config import ConfigError, flatten, safe_yaml_file, show
from dapo.helptext import help_text

__all__ = ["TRAIN_METRICS", "DiffError", "read_run", "config_diff", "default_metrics", "metric_diff", "main"]

TRAIN_METRICS = ("rollout/reward_mean", "rollout/acc_mean", "train/entropy", "rollout/response_len_mean")
"""The non-eval metrics ``dapo diff`` shows by default (with every eval metric)."""

ABSENT = "(absent)"

EXAMPLES = """examples:
  dapo diff runs/runs/RUN_A runs/runs/RUN_B
  dapo diff runs/runs/RUN_A runs/runs/RUN_B --metrics eval/arith-eval/avg_at_8,train/entropy --steps 0,last
  dapo diff runs/runs/RUN_A runs/runs/RUN_B --json
"""


class DiffError(ValueError):
    """A bad run dir, metric or step: one ``error:`` line, exit 2."""


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def read_run(path: str | Path, label: str) -> dict[str, Any]:
    """A run dir's config and MLflow identity: {label, dir, run_id, config (flat), mlflow_run_id,
    tracking_uri, experiment, status, step, total}; DiffError naming ``path`` when it is not a run dir."""
    from dapo.commands.runs import run_row
    p = Path(path).expanduser()
    if not p.is_dir():
        raise DiffError(f"{label} {show(str(path))}: " + ("not a directory" if p.exists() else "no such directory"))
    if not (p / "config.yaml").is_file():
        raise DiffError(f"{label} {show(str(path))}: not a run directory (no config.yaml; a run dir is "
                        f"<output>/runs/<run id>/, as `dapo runs` lists them)")
    try:
        cfg = safe_yaml_file(p / "config.yaml")
    except ConfigError as exc:
        raise DiffError(f"{label} {exc}") from None
    if not isinstance(cfg, dict):
        raise DiffError(f"{label} {p / 'config.yaml'}: not a mapping (a run's resolved config)")
    meta = _json(p / "mlflow_run.json")
    if not isinstance(meta, dict) or not meta.get("run_id") or not meta.get("tracking_uri"):
        raise DiffError(f"{label} {show(str(path))}: the run has no MLflow run (no readable mlflow_run.json): "
                        f"it has not logged anything yet")
    row = run_row(p)
    return {"label": label, "dir": str(p), "run_id": p.name, "config": flatten(cfg),
            "mlflow_run_id": meta["run_id"], "tracking_uri": meta["tracking_uri"],
            "experiment": (cfg.get("logging") or {}).get("experiment") or "dapo-lab",
            "status": row["status"], "step": row["step"], "total": row["total"]}


def config_diff(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """[{key, a, b}] for every flat config key whose values differ (ABSENT where a run lacks the key), sorted."""
    keys = sorted(set(a) | set(b))
    return [{"key": k, "a": a.get(k, ABSENT), "b": b.get(k, ABSENT)} for k in keys
            if k not in a or k not in b or a[k] != b[k]]


def _points(run: dict[str, Any], cache: dict[tuple[str, str], Any]) -> dict[str, dict[int, float]]:
    """{metric: {rollout step: value}} of the run's MLflow run, read by analysis.runs.load_runs (one
    read per store and experiment)."""
    from analysis.runs import load_runs, store_problem
    from dapo.yaml_io import redact
    uri, exp = run["tracking_uri"], run["experiment"]
    key = (uri, exp)
    if key not in cache:
        problem = store_problem(uri)
        if problem:
            raise DiffError(f"{run['label']} {run['dir']}: {problem}")
        quiet = logging.getLogger("analysis.runs")
        level = quiet.level
        quiet.setLevel(logging.ERROR)     # "N runs not finished": the status line says so for these two
        try:
            cache[key] = load_runs(uri, exp, configs_from_artifacts=False)[0]
        except ValueError as exc:         # no such experiment
            raise DiffError(f"{run['label']} {run['dir']}: {exc}") from None
        except Exception as exc:  # noqa: BLE001 -- a store failing while read: one line
            first = " ".join(str(exc).split())[:300]
            raise DiffError(f"{run['label']} {run['dir']}: tracking store {redact(uri)} could not be read "
                            f"({type(exc).__name__}: {first})") from None
        finally:
            quiet.setLevel(level)
    tidy = cache[key]
    mine = tidy[tidy["run"] == run["mlflow_run_id"]]
    if not len(mine):
        raise DiffError(f"{run['label']} {run['dir']}: no metrics of its MLflow run {run['mlflow_run_id']} in "
                        f"{redact(uri)} (experiment {exp!r})")
    out: dict[str, dict[int, float]] = {}
    mine = mine[mine["rollout_step"].notna()].sort_values("grad_step", kind="stable")
    for metric, step, value in mine[["metric", "rollout_step", "value"]].itertuples(index=False):
        out.setdefault(metric, {})[int(step)] = float(value)   # one point per rollout step (the last)
    return out


def default_metrics(a: dict[str, dict], b: dict[str, dict]) -> tuple[list[str], list[str], list[str]]:
    """(metrics both runs logged, of the eval metrics and TRAIN_METRICS; those only A has; only B)."""
    from analysis.metric_names import eval_metrics
    evals = [m for m, *_ in eval_metrics(set(a) | set(b))]
    wanted = evals + [m for m in TRAIN_METRICS if m in a or m in b]
    return ([m for m in wanted if m in a and m in b], [m for m in wanted if m in a and m not in b],
            [m for m in wanted if m in b and m not in a])


def _steps_arg(text: str | None, common: list[int]) -> list[int]:
    if not text:
        return common
    out = []
    for word in (w.strip() for w in text.split(",")):
        if not word:
            continue
        if word == "last":
            if common:
                out.append(common[-1])
            continue
        try:
            step = int(word)
        except ValueError:
            raise DiffError(f"--steps {show(text)}: {show(word)} is not a step number or 'last'") from None
        if step not in common:
            raise DiffError(f"--steps {step}: not a rollout step both runs logged these metrics at "
                            f"(both have: {_compact(common)})")
        out.append(step)
    return sorted(set(out))


def _compact(steps: list[int]) -> str:
    return ", ".join(map(str, steps)) if len(steps) <= 12 else \
        ", ".join(map(str, steps[:5])) + ", ..., " + ", ".join(map(str, steps[-5:]))


def _finite(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


def metric_diff(pa: dict[str, dict[int, float]], pb: dict[str, dict[int, float]], metrics: list[str],
                steps: str | None = None) -> tuple[list[int], dict[str, list[dict[str, Any]]]]:
    """(the steps shown, {metric: [{step, a, b, diff}]}) at the rollout steps both runs logged each metric
    at; ``steps``: the --steps text (a comma list of steps and 'last'), else all of them."""
    common = sorted(set().union(*(set(pa[m]) & set(pb[m]) for m in metrics))) if metrics else []
    shown = _steps_arg(steps, common)
    out = {}
    for m in metrics:
        rows = []
        for s in shown:
            if s in pa[m] and s in pb[m]:
                va, vb = _finite(pa[m][s]), _finite(pb[m][s])
                rows.append({"step": s, "a": va, "b": vb,
                             "diff": vb - va if va is not None and vb is not None else None})
        out[m] = rows
    return shown, out


def _chosen(text: str, pa: dict, pb: dict, a: dict, b: dict) -> list[str]:
    names = list(dict.fromkeys(w.strip() for w in text.split(",") if w.strip()))
    if not names:
        raise DiffError(f"--metrics {show(text)} names no metric")
    for m in names:
        for points, run in ((pa, a), (pb, b)):
            if m not in points:
                near = sorted(k for k in points if k.split("/")[0] == m.split("/")[0])[:8] or sorted(points)[:8]
                raise DiffError(f"--metrics {show(m)}: not logged by {run['label']} {run['dir']} "
                                f"(it logs e.g. {', '.join(near)})")
    return names


def _value(v: Any) -> str:
    return v if v == ABSENT else json.dumps(v, default=str)


def _num(v: float | None, signed: bool = False) -> str:
    if v is None:
        return "nan"
    return f"{v:+.6g}" if signed else f"{v:.6g}"


def report(a: dict, b: dict, cfg: list[dict], steps: list[int], metrics: dict[str, list[dict]],
           only_a: list[str], only_b: list[str]) -> str:
    from dapo.commands.sweep import _table
    lines = [f"{r['label']}: {r['dir']}  (run id {r['run_id']}, MLflow run {r['mlflow_run_id']}, {r['status']}, "
             f"step {r['step']}/{r['total'] if r['total'] is not None else '-'})" for r in (a, b)]
    lines.append("")
    if cfg:
        lines.append(f"config: {len(cfg)} key{'s' if len(cfg) != 1 else ''} differ{'s' if len(cfg) == 1 else ''}")
        lines.append(_table([[d["key"], _value(d["a"]), _value(d["b"])] for d in cfg], ["key", "A", "B"]))
    else:
        lines.append("config: the same (no key differs)")
    lines.append("")
    rows = [[m if i == 0 else "", r["step"], _num(r["a"]), _num(r["b"]), _num(r["diff"], signed=True)]
            for m, rs in metrics.items() for i, r in enumerate(rs)]
    if rows:
        lines.append(f"metrics at the rollout steps both runs logged ({len(steps)} step"
                     f"{'s' if len(steps) != 1 else ''}: {_compact(steps)}):")
        lines.append(_table(rows, ["metric", "step", "A", "B", "B-A"]))
    else:
        lines.append("metrics: no rollout step at which both runs logged them")
    for label, only in (("A", only_a), ("B", only_b)):
        if only:
            lines.append(f"only {label} logged: {', '.join(only)}")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dapo diff", description=help_text(__doc__, None), epilog=EXAMPLES,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_a", metavar="RUN_A", help="a run directory (<output>/runs/<run id>)")
    p.add_argument("run_b", metavar="RUN_B", help="another run directory")
    p.add_argument("--metrics", metavar="A,B", help="comma-separated metric names (default: the eval metrics and "
                   + ", ".join(TRAIN_METRICS) + ", those both runs logged)")
    p.add_argument("--steps", metavar="S,S", help="comma-separated rollout steps, 'last' for the last one both "
                                                  "have (default: every step both logged)")
    p.add_argument("--json", action="store_true", help="machine-readable output (one JSON object)")
    return p


def main(argv: list[str] | None = None) -> int:
    from dapo.cli import parse_or_usage
    got = parse_or_usage(parser(), argv, EXAMPLES)
    if got is None:
        return 2
    _, a = got
    try:
        ra, rb = read_run(a.run_a, "RUN_A"), read_run(a.run_b, "RUN_B")
        cfg = config_diff(ra["config"], rb["config"])
        cache: dict = {}
        pa, pb = _points(ra, cache), _points(rb, cache)
        if a.metrics:
            names, only_a, only_b = _chosen(a.metrics, pa, pb, ra, rb), [], []
        else:
            names, only_a, only_b = default_metrics(pa, pb)
        steps, metrics = metric_diff(pa, pb, names, a.steps)
    except DiffError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if a.json:
        runs = {k: {f: r[f] for f in ("dir", "run_id", "mlflow_run_id", "tracking_uri", "status", "step", "total")}
                for k, r in (("a", ra), ("b", rb))}
        print(json.dumps({**runs, "config": cfg, "steps": steps, "metrics": metrics, "only_a": only_a,
                          "only_b": only_b}, indent=1, default=str))
        return 0
    print(report(ra, rb, cfg, steps, metrics, only_a, only_b))
    return 0


if __name__ == "__main__":
    sys.exit(main())
