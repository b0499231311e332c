"""What the policies wrote and how pass@k grows with k, in a sweep's report (docs/METRICS.md).

- **pass@k over k** from the per-problem outcomes (``problems.parquet``): at each run's last
  evaluation, pass@k of every problem by the unbiased estimator from its ``n_correct`` of ``k``
  (:func:`dapo.algo.eval_metrics.pass_at_k`), averaged over problems; then per arm the mean over seeds
  with a 95% Student-t interval (:func:`analysis.stats.t_interval`), for k = 1, 2, 4, ... and the
  evaluation's k (:func:`passk_curves`). pass@1 is avg@k; a falling pass@k at large k with a
  rising pass@1 is the narrowing that RL for reasoning is known for.
- **Samples** (``samples.parquet``, :data:`SAMPLE_COLUMNS`): for one seed (the smallest that every
  arm has records for), at each arm's first and last evaluation, sample 0 of the same three
  problems for every arm, chosen by a fixed rule (:func:`pick_problems`): the first problem, in
  problem order, that every arm's last evaluation solved in some sample ("solved by all"), the
  first that none solved ("solved by none"), and the one unsolved by every arm at the first
  evaluation that the most arms solved at the last ("flipped"). Responses are clipped to
  :data:`CLIP` characters.

Pure pandas/numpy; the record files are read through :mod:`dapo.eval_records`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dapo.algo.eval_metrics import curve_ks, pass_at_k

from .metric_names import EVAL_RE
from .stats import t_interval

__all__ = ["SAMPLE_COLUMNS", "CLIP", "passk_curves", "passk_section", "pick_problems", "samples_from_runs",
           "samples_section", "normalize_samples", "load_samples"]

SAMPLE_COLUMNS = ["arm", "seed", "run_id", "step", "grad_step", "set", "problem", "kind", "sample", "correct",
                  "length", "finished", "answer", "response"]
"""``samples.parquet``: one row per shown sample."""
CLIP = 400
"""Characters of a response kept (its end, where the answer is, if longer)."""
KINDS = ("solved by all", "solved by none", "flipped")


def _set_rows(problems: pd.DataFrame, metric: str | None) -> pd.DataFrame:
    name = EVAL_RE.match(metric)["dataset"] if metric and EVAL_RE.match(metric) else None
    return problems if name is None else problems[problems["set"] == name]


def _last_eval(d: pd.DataFrame) -> pd.DataFrame:
    last = d.groupby("run")["step"].transform("max")
    return d[d["step"] == last]


def passk_curves(problems: pd.DataFrame | None, metric: str | None, arms: list[str]) -> pd.DataFrame:
    """Columns arm, k, mean, lo, hi, seeds: pass@k (fraction) at each run's last evaluation, mean
    over the arm's seeds with a 95% t interval clipped to [0, 1]; k = :func:`curve_ks` of the evaluation's k (the
    smallest k among the runs if they differ). Empty without problems."""
    cols = ["arm", "k", "mean", "lo", "hi", "seeds"]
    if problems is None or problems.empty:
        return pd.DataFrame(columns=cols)
    d = _last_eval(_set_rows(problems, metric))
    if d.empty:
        return pd.DataFrame(columns=cols)
    n = int(d["k"].min())
    rows = []
    for k in curve_ks(n):
        per = d.assign(p=[pass_at_k(int(kk), int(c), k) for kk, c in zip(d["k"], d["n_correct"])])
        by_run = per.groupby(["arm", "run"])["p"].mean().reset_index()
        for arm in [a for a in arms if a in set(by_run["arm"])]:
            iv = t_interval(by_run.loc[by_run["arm"] == arm, "p"].to_numpy())
            rows.append((arm, k, iv.mean, float(np.clip(iv.lo, 0, 1)), float(np.clip(iv.hi, 0, 1)), iv.n))  # NaN stays NaN
    return pd.DataFrame(rows, columns=cols)


def passk_section(curves: pd.DataFrame, labels: dict[str, str], scale: float = 100.0) -> list[str]:
    """Markdown: a table arms × k of pass@k (mean [95% t] over seeds), or why there is none."""
    lines = ["## pass@k over k", ""]
    if curves.empty:
        return lines + ["No per-problem records with these runs (problems.parquet absent): no pass@k curve.", ""]
    ks = sorted(curves["k"].unique())
    head = "| arm | " + " | ".join(f"pass@{k} (%)" for k in ks) + " | seeds |"
    lines += [head, "|" + "---|" * (len(ks) + 2)]
    for arm in dict.fromkeys(curves["arm"]):
        c = curves[curves["arm"] == arm].set_index("k")
        cells = [f"{scale * c.loc[k, 'mean']:.1f}" + (f" [{scale * c.loc[k, 'lo']:.1f}, {scale * c.loc[k, 'hi']:.1f}]"
                                                     if np.isfinite(c.loc[k, "lo"]) else "") for k in ks]
        lines.append(f"| {labels.get(arm, arm)} | " + " | ".join(cells) + f" | {int(c['seeds'].iloc[0])} |")
    lines += ["", f"At each run's last evaluation: pass@k per problem by the unbiased estimator from its n_correct "
                  f"of k samples, averaged over problems, then the mean over seeds [95% Student-t]. pass@1 = avg@k. "
                  f"Descriptive: no test is run on these columns.", ""]
    return lines


def pick_problems(problems: pd.DataFrame, metric: str | None, seed: int) -> dict[str, str]:
    """{kind: problem id} for the seed's runs (module docstring); a kind no problem fits is left out."""
    d = _set_rows(problems, metric)
    d = d[d["seed"] == seed]
    first = d[d["step"] == d.groupby("run")["step"].transform("min")]
    last = _last_eval(d)
    solved_last = last.groupby("problem")["n_correct"].apply(lambda s: (s > 0).tolist())
    solved_first = first.groupby("problem")["n_correct"].apply(lambda s: (s > 0).tolist())
    order = list(dict.fromkeys(d.sort_values(["problem"], kind="stable", key=_problem_key)["problem"]))
    out: dict[str, str] = {}
    for p in order:
        if "solved by all" not in out and p in solved_last and all(solved_last[p]):
            out["solved by all"] = p
        if "solved by none" not in out and p in solved_last and not any(solved_last[p]):
            out["solved by none"] = p
    flips = [(sum(solved_last.get(p, [])), p) for p in order
             if p in solved_first and not any(solved_first[p]) and any(solved_last.get(p, []))]
    if flips:
        best = max(n for n, _ in flips)
        out["flipped"] = next(p for n, p in flips if n == best)
    return {k: out[k] for k in KINDS if k in out}


def _problem_key(s: pd.Series) -> pd.Series:
    """Problems in row order: ``arith-eval:10`` after ``arith-eval:9``."""
    return s.map(lambda p: (p.rpartition(":")[0], int(p.rpartition(":")[2]) if p.rpartition(":")[2].isdigit() else 0))


def samples_from_runs(runs_dir: str | Path, tidy: pd.DataFrame, problems: pd.DataFrame | None,
                      metric: str | None) -> pd.DataFrame | None:
    """The shown samples (:data:`SAMPLE_COLUMNS`) from ``<runs_dir>/runs/<run_id>/eval_records/``; None
    when the records are not there for every arm at one seed."""
    from dapo.eval_records import read_records, records_path
    if problems is None or problems.empty:
        return None
    d = _set_rows(problems, metric)
    arms = set(tidy["arm"])
    seeds = sorted(s for s, g in d.groupby("seed") if set(g["arm"]) >= arms)
    if not seeds:
        return None
    seed = seeds[0]
    chosen = pick_problems(problems, metric, seed)
    rows = []
    for run, g in d[d["seed"] == seed].groupby("run"):
        run_id, arm = str(g["run_id"].iloc[0]), str(g["arm"].iloc[0])
        for step in sorted({int(g["step"].min()), int(g["step"].max())}):
            path = records_path(Path(runs_dir) / "runs" / run_id, step)
            if not path.is_file():
                return None
            recs = {(r["problem"], r["sample"]): r for r in read_records(path)}
            for kind, prob in chosen.items():
                r = recs.get((prob, 0))
                if r is None:
                    continue
                rows.append((arm, seed, run_id, step, -1 if r.get("grad_step") is None else int(r["grad_step"]),
                             r["set"], prob, kind, 0, bool(r["correct"]), int(r["length"]), bool(r["finished"]),
                             r.get("answer"), _clip(r["response"])))
    return normalize_samples(pd.DataFrame(rows, columns=SAMPLE_COLUMNS)) if rows else None


def _clip(text: str) -> str:
    return text if len(text) <= CLIP else "…" + text[-CLIP:]


def normalize_samples(df: pd.DataFrame) -> pd.DataFrame:
    """Column order and dtypes of ``samples.parquet``, sorted by kind, arm, step."""
    df = df.reindex(columns=SAMPLE_COLUMNS)
    for c in ("arm", "run_id", "set", "problem", "kind", "response"):
        df[c] = df[c].astype(str)
    df["answer"] = df["answer"].astype(object).where(df["answer"].notna(), None)
    for c in ("seed", "step", "grad_step", "sample", "length"):
        df[c] = df[c].astype("int64")
    for c in ("correct", "finished"):
        df[c] = df[c].astype(bool)
    order = {k: i for i, k in enumerate(KINDS)}
    return df.sort_values(["kind", "arm", "step"], key=lambda s: s.map(order) if s.name == "kind" else s,
                          kind="stable").reset_index(drop=True)


def load_samples(snapshot_dir: str | Path) -> pd.DataFrame | None:
    """The snapshot's shown samples (``samples.parquet``), None when it has none."""
    p = Path(snapshot_dir) / "samples.parquet"
    return normalize_samples(pd.read_parquet(p)) if p.exists() else None


def samples_section(samples: pd.DataFrame | None, labels: dict[str, str], arms: list[str]) -> list[str]:
    """Markdown: per chosen problem, each arm's sample 0 at its first and last evaluation."""
    lines = ["## What the policies wrote", ""]
    if samples is None or samples.empty:
        return lines + ["No per-sample records with these runs (samples.parquet absent: runs that predate the "
                        "records, or a snapshot made without the runs' eval_records/ on disk).", ""]
    seed = int(samples["seed"].iloc[0])
    lines += [f"Seed {seed}, sample 0 of each arm at its first and last evaluation, for problems chosen by a fixed "
              f"rule (analysis/samples.py): the first problem that every arm's last evaluation solved in at least one "
              f"of its samples, the first that no arm's did, and one that no arm solved at its first evaluation and "
              f"the most arms solved at the last. Sample 0 is one draw: it can be wrong where the problem counts as "
              f"solved. "
              f"Responses clipped to their last {CLIP} characters.", ""]
    for kind in KINDS:
        s = samples[samples["kind"] == kind]
        if s.empty:
            continue
        lines += [f"### {kind}: `{s['problem'].iloc[0]}` ({s['set'].iloc[0]})", "",
                  "| arm | step | correct | length | response |", "|---|---|---|---|---|"]
        for arm in [a for a in arms if a in set(s["arm"])]:
            for r in s[s["arm"] == arm].itertuples(index=False):
                text = r.response.replace("|", "\\|").replace("\n", "⏎").replace("`", "'")
                lines.append(f"| {labels.get(arm, arm)} | {r.step} | {'yes' if r.correct else 'no'} | "
                             f"{r.length}{'' if r.finished else ' (cut)'} | `{text}` |")
        lines.append("")
    return lines
