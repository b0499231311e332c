"""Evaluation noise: how much of a final value, and of a paired difference, is the sampling of k responses.

Two measurements, both in the metric's shown unit (points of % for accuracies,
:func:`analysis.metric_names.metric_scale`):

- **From step 0** (every snapshot has it). At rollout step 0 every arm of a seed evaluates the
  same base model, so across seeds the step-0 value varies only by evaluation draws.
  :func:`step0_noise` takes one value per seed (the arms of a seed share it when they share the
  evaluation seed; where they differ each distinct value counts), their SD over seeds SD₀ and its
  95% χ² interval (:func:`analysis.stats.sd_interval`). A final value (mean of ``final_k``
  evaluations with independent draws) then carries noise SD₀/√final_k, a paired difference of
  finals √2 × that (the two arms' draws taken as independent). :func:`noise_table` sets it beside
  the SD of each primary-family comparison's per-seed differences (``sd`` of
  :func:`analysis.tables.family_table`): noise/SD, and k' = k·(3·noise/median SD)², the samples
  per problem at which the noise would be a third of the median SD (noise falls as 1/√k),
  rounded up to an integer (and, beside it, to the next power of two).
- **From per-problem records** (``snapshot/problems.parquet``, :data:`analysis.runs.PROBLEM_COLUMNS`:
  one row per run, step, eval set and problem with ``n_correct`` of ``k`` samples; written by
  ``dapo figures --runs DIR`` when the runs' ``eval_records/`` are on disk, see
  :func:`problems_from_runs`). :func:`records_noise` gives each evaluation's within-evaluation SD
  of avg@k, the binomial estimate √(Σ_p p̂_p(1 − p̂_p)/(k − 1)) / P with p̂_p = n_correct/k;
  :func:`hierarchical_diff_ci` a bootstrap interval of a paired difference of finals that
  resamples seeds and, within each, problems: a secondary interval (it adds problem-sampling
  noise; over few seeds a percentile bootstrap under-covers, docs/STATISTICS.md), never a verdict.

Pure pandas/numpy; the record files are read through :mod:`dapo.eval_records` (plain gzip + json).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from dapo.config import flatten

from .metric_names import EVAL_RE, metric_scale, metric_short, primary_metric
from .runs import PROBLEM_COLUMNS, SweepInfo, normalize_problems
from .stats import ALPHA, final_points, run_finals, sd_interval

__all__ = ["Step0Noise", "step0_noise", "problems_from_runs", "records_noise", "records_summary",
           "hierarchical_diff_ci", "noise_table", "noise_section", "k_needed", "NOISE_NOTE", "START_KEYS",
           "start_mismatches", "start_section"]

TARGET = 3.0
"""k' puts the noise of a difference at 1/TARGET of the median SD of the family's differences."""


# --------------------------------------------------------------------------- step 0
@dataclass(frozen=True)
class Step0Noise:
    """The spread of the step-0 value over seeds (see :func:`step0_noise`), in the shown unit."""
    metric: str | None
    scale: float = 1.0
    k: int | None = None                      # samples per problem (from ``..._at_<k>``)
    values: pd.Series = field(default_factory=lambda: pd.Series(dtype=float))  # index: seed (repeated if arms differ)
    shared: bool = True                       # every seed's arms share one step-0 value
    mean: float = float("nan")
    sd: float = float("nan")                  # SD (ddof 1) over the values
    lo: float = float("nan")                  # its 95% χ² interval
    hi: float = float("nan")
    note: str = ""                            # why nothing was measured, or that arms of a seed differ

    @property
    def n(self) -> int:
        return int(self.values.size)


def _metric_k(metric: str | None) -> int | None:
    g = EVAL_RE.match(metric or "")
    return int(g["k"]) if g else None


def _step0_rows(tidy: pd.DataFrame, metric: str) -> pd.DataFrame:
    d = tidy[tidy["metric"] == metric]
    rs = d["rollout_step"]
    at0 = (rs == 0).fillna(False).to_numpy(dtype=bool) | (rs.isna().to_numpy() & (d["grad_step"] == 0).to_numpy())
    d = d[at0]
    return d[np.isfinite(d["value"].to_numpy(dtype=float))]


def step0_noise(tidy: pd.DataFrame, metric: str | None, alpha: float = ALPHA) -> Step0Noise:
    """Per-seed step-0 values of ``metric`` and their SD over seeds, with its (1 − α) χ² interval.

    Step 0 is rollout step 0 (grad step 0 where the rollout step is unknown). Within a seed,
    identical values (to 1e-9 of the logged value) are one value: the arms of a seed evaluate the
    same base model with the same evaluation seed. Where the arms of a seed differ, every distinct
    value counts (``shared`` False, and ``note`` says so). Values are in the shown unit (× scale).
    """
    if not metric or not (tidy["metric"] == metric).any():
        return Step0Noise(metric, note=f"no `{metric}` in these runs" if metric else "no evaluation metric")
    scale = metric_scale(tidy, metric)
    d = _step0_rows(tidy, metric)
    if d.empty:
        return Step0Noise(metric, scale, _metric_k(metric),
                          note=f"no step-0 evaluation of `{metric}` in these runs")
    d = d.assign(key=d["value"].round(9))
    per = d.drop_duplicates(["seed", "key"]).sort_values(["seed", "key"], kind="stable")
    shared = bool(per["seed"].is_unique)
    values = pd.Series(per["value"].to_numpy(dtype=float) * scale, index=per["seed"].to_numpy(), name=metric)
    values.index.name = "seed"
    note = "" if shared else (
        "the arms of a seed differ at step 0 (not the same evaluation draws): every distinct value is used")
    sd = float(values.std(ddof=1)) if values.size >= 2 else float("nan")
    lo, hi = sd_interval(sd, int(values.size), alpha)
    if values.size < 2:
        note = note or "one step-0 value: no SD"
    return Step0Noise(metric, scale, _metric_k(metric), values, shared, float(values.mean()), sd, lo, hi, note)


START_KEYS = ("model.", "eval.", "rollout.", "train.seed")
"""The config keys (dotted; a trailing dot: the whole section) that decide a run's step-0 evaluation: the
model, the evaluation, the engine's settings and the seed. Runs equal in all of them evaluate the same
model with the same draws at step 0, so they log the same value."""


def _start_of(config: Mapping | None) -> str:
    """The :data:`START_KEYS` part of a resolved config, as one comparable string ("" without a config)."""
    if not config:
        return ""
    return repr(sorted((k, repr(v)) for k, v in flatten(dict(config)).items()
                       if any(k == key or (key.endswith(".") and k.startswith(key)) for key in START_KEYS)))


def start_mismatches(tidy: pd.DataFrame, configs: Mapping | None, metric: str | None) -> pd.DataFrame:
    """``[seed, arm, value]``, one row per run, for every seed whose runs share the start (equal in
    :data:`START_KEYS`) but not the step-0 value of ``metric`` (to 1e-9): they did not evaluate the same
    model with the same draws, e.g. runs made on machines whose CPU kernels differ (the base model
    itself is built on the machine), or with two builds of the model. Their paired differences then
    carry that difference too. Runs without a config are compared with each other (key ""). Value in
    the shown unit; empty when every seed's like runs agree (or there is no step-0 value)."""
    cols = ["seed", "arm", "value"]
    if not metric or not (tidy["metric"] == metric).any():
        return pd.DataFrame(columns=cols)
    d = _step0_rows(tidy, metric).drop_duplicates("run")
    if d.empty:
        return pd.DataFrame(columns=cols)
    configs = configs or {}
    d = d.assign(start=[_start_of(configs.get(r)) for r in d["run"]], key=d["value"].round(9),
                 value=d["value"] * metric_scale(tidy, metric))
    bad = d.groupby(["seed", "start"])["key"].transform("nunique") > 1
    out = d[bad].sort_values(["seed", "value", "arm"], kind="stable")
    return out[cols].reset_index(drop=True)


def start_section(bad: pd.DataFrame, metric: str | None) -> list[str]:
    """A warning paragraph for the report's top (markdown lines) from :func:`start_mismatches`; none
    when it is empty."""
    if bad is None or not len(bad):
        return []
    name = metric_short(metric) if metric else "the metric"
    seeds = []
    for seed, g in bad.groupby("seed", sort=True):
        parts = [f"{', '.join(sorted(set(h['arm'])))} {v:.4g}" for v, h in g.groupby("value", sort=True)]
        seeds.append(f"seed {seed}: {'; '.join(parts)}")
    return [f"**Warning: runs that should start alike do not.** Runs with the same model, evaluation and "
            f"engine settings and the same seed evaluate the same model with the same draws at step 0, so "
            f"they log the same `{name}` there. These do not ({' | '.join(seeds)}): they started from "
            f"different models, most likely made on machines whose CPU kernels differ (the base model is "
            f"built on the machine that first needs it) or by two builds of it. Their paired differences "
            f"carry that difference too. Rerun such a seed's arms on one machine (one model cache).", ""]


def k_needed(k: int | None, noise: float, sd: float, target: float = TARGET) -> tuple[float, float, float]:
    """``(exact, ceil, power_of_two)``: samples per problem at which ``noise`` (measured at k) would be
    sd/target, noise ∝ 1/√k: k' = k·(target·noise/sd)², rounded up to an integer (at least 1) and to the
    next power of two. NaN when k or the SD is unknown."""
    if not k or not (np.isfinite(noise) and np.isfinite(sd) and sd > 0):
        return float("nan"), float("nan"), float("nan")
    exact = k * (target * noise / sd) ** 2
    up = max(1, math.ceil(exact - 1e-9))
    return float(exact), float(up), float(2 ** math.ceil(math.log2(up) - 1e-12))


# --------------------------------------------------------------------------- per-problem records
def problems_from_runs(runs_dir: str | Path, tidy: pd.DataFrame) -> pd.DataFrame | None:
    """One row per (run, step, set, problem) with ``n_correct`` and ``k`` (:data:`PROBLEM_COLUMNS`), from
    ``<runs_dir>/runs/<run_id>/eval_records/eval-step*.jsonl.gz`` of the runs in ``tidy``; None when no
    run has records. Responses are not kept."""
    from dapo.eval_records import DIRNAME, read_records

    runs = tidy.drop_duplicates("run_id")[["run", "run_id", "arm", "seed"]]
    root = Path(runs_dir) / "runs"
    rows = []
    for run, run_id, arm, seed in runs.itertuples(index=False):
        for f in sorted((root / str(run_id) / DIRNAME).glob("eval-step*.jsonl.gz")):
            file_step = int(f.name[len("eval-step"):].split(".")[0])
            counts: dict[tuple, list] = {}
            step = grad = None
            for r in read_records(f):
                c = counts.setdefault((r.get("set"), r.get("problem")), [0, 0])
                c[0] += bool(r.get("correct"))
                c[1] += 1
                step = r.get("step")
                grad = r.get("grad_step")
            step = file_step if step is None else int(step)
            grad = -1 if grad is None else int(grad)
            rows += [(run, run_id, arm, int(seed), step, grad, s, p, n, k) for (s, p), (n, k) in counts.items()]
    if not rows:
        return None
    return normalize_problems(pd.DataFrame(rows, columns=PROBLEM_COLUMNS))


def _metric_set(problems: pd.DataFrame, metric: str | None, set_name: str | None) -> pd.DataFrame:
    """The rows of the metric's eval set (``eval/<set>/...``), or of ``set_name``; all rows if neither names one."""
    name = set_name or (EVAL_RE.match(metric)["dataset"] if metric and EVAL_RE.match(metric) else None)
    return problems if name is None else problems[problems["set"] == name]


def records_noise(problems: pd.DataFrame, scale: float = 100.0, *, metric: str | None = None,
                  set_name: str | None = None) -> pd.DataFrame:
    """Per evaluation (run, step, set): ``P`` problems, ``k``, ``value`` = avg@k and ``sd`` = its
    within-evaluation sampling SD, both × scale.

    sd = √(Σ_p p̂_p(1 − p̂_p)/(k_p − 1)) / P, p̂_p = n_correct/k_p: avg@k is the mean over P problems of
    p̂_p, each the mean of k Bernoulli(p_p) samples with variance p_p(1 − p_p)/k, estimated without
    bias by p̂_p(1 − p̂_p)/(k − 1). NaN where a problem has fewer than 2 samples."""
    d = _metric_set(problems, metric, set_name)
    cols = ["run", "run_id", "arm", "seed", "step", "grad_step", "set", "P", "k", "value", "sd"]
    if d.empty:
        return pd.DataFrame(columns=cols)
    k = d["k"].to_numpy(dtype=float)
    p = d["n_correct"].to_numpy(dtype=float) / k
    d = d.assign(p=p, v=np.where(k >= 2, p * (1 - p) / np.maximum(k - 1, 1), np.nan))
    g = d.groupby(["run", "run_id", "arm", "seed", "step", "grad_step", "set"], sort=False)
    out = g.agg(P=("problem", "size"), k=("k", "max"), value=("p", "mean"), var=("v", "sum"),
                bad=("v", lambda s: s.isna().any())).reset_index()
    out["sd"] = np.where(out["bad"], np.nan, np.sqrt(out["var"]) / out["P"]) * scale
    out["value"] = out["value"] * scale
    return out[cols].sort_values(["seed", "arm", "step"], kind="stable").reset_index(drop=True)


def _rms(x) -> float:
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    return float(np.sqrt(np.mean(x ** 2))) if x.size else float("nan")


def _last_steps(frame: pd.DataFrame, final_k: int) -> pd.DataFrame:
    """The rows at each run's last ``final_k`` distinct steps after step 0 (never the untrained model's)."""
    steps = frame.loc[frame["step"] > 0, ["run", "step"]].drop_duplicates().sort_values(["run", "step"])
    keep = steps.groupby("run", sort=False).tail(final_k)
    return frame.merge(keep, on=["run", "step"], how="inner")


def records_summary(per_eval: pd.DataFrame, final_k: int) -> dict:
    """Root mean square of the per-evaluation SDs (the mean of their variances): over all evaluations,
    at step 0, and at each run's last ``final_k`` recorded evaluations; with the counts."""
    if per_eval is None or per_eval.empty:
        return {"records_sd": np.nan, "records_n_evals": 0, "records_n_runs": 0, "records_sd_step0": np.nan,
                "records_n_step0": 0, "records_sd_final": np.nan, "records_n_final": 0}
    z = per_eval[per_eval["step"] == 0]
    fin = _last_steps(per_eval, final_k)
    return {"records_sd": _rms(per_eval["sd"]), "records_n_evals": int(len(per_eval)),
            "records_n_runs": int(per_eval["run"].nunique()),
            "records_sd_step0": _rms(z["sd"]), "records_n_step0": int(len(z)),
            "records_sd_final": _rms(fin["sd"]), "records_n_final": int(len(fin))}


def hierarchical_diff_ci(problems: pd.DataFrame, off_arm: str, on_arm: str,
                         final_steps: int | Sequence[int], n_boot: int = 2000, seed: int = 0, *,
                         metric: str | None = None, set_name: str | None = None, scale: float = 100.0,
                         alpha: float = ALPHA) -> tuple[float, float, float]:
    """``(mean, lo, hi)`` of on − off, the paired difference of finals, with a hierarchical percentile
    bootstrap interval (× scale).

    A run's final is the mean over its final evaluations of avg@k (mean over problems of n_correct/k);
    ``final_steps``: the rollout steps of those evaluations, or an int f for each run's last f
    recorded steps. Per seed with both arms and per problem both arms have, d_sp = final share
    correct (on) − (off); mean = mean over seeds of mean over problems of d_sp, which is the plain
    paired mean of finals when every run has every problem. Each of ``n_boot`` resamples draws the
    seeds with replacement and, within each drawn seed, the problems with replacement (the same
    problems for both arms: the difference stays paired by problem), ``numpy.random.default_rng(seed)``.

    Secondary: it adds problem-sampling noise to the seed-level interval, only where records exist;
    over few seeds a percentile bootstrap under-covers (docs/STATISTICS.md) and no verdict uses it.
    NaN with fewer than 2 paired seeds.
    """
    nan3 = (float("nan"),) * 3
    d = _metric_set(problems, metric, set_name)
    d = d[d["arm"].isin([off_arm, on_arm])]
    if isinstance(final_steps, (int, np.integer)):
        d = _last_steps(d, int(final_steps))
    else:
        d = d[d["step"].isin(list(final_steps))]
    if d.empty:
        return nan3
    d = d.assign(acc=d["n_correct"].to_numpy(dtype=float) / d["k"].to_numpy(dtype=float))
    x = d.groupby(["arm", "seed", "problem"], sort=True)["acc"].mean()
    if off_arm not in x.index.get_level_values(0) or on_arm not in x.index.get_level_values(0):
        return nan3
    diff = (x.loc[on_arm] - x.loc[off_arm]).dropna()          # index (seed, problem), pairs only
    mat = diff.unstack("problem")
    mat = mat.loc[:, mat.notna().all(axis=0)]                  # problems every paired seed has
    D = mat.to_numpy(dtype=float)
    S, P = D.shape
    if S < 2 or P < 1:
        return nan3
    rng = np.random.default_rng(seed)
    boot = np.empty(n_boot)
    chunk = max(1, 4_000_000 // (S * P))
    for i in range(0, n_boot, chunk):
        b = min(chunk, n_boot - i)
        si = rng.integers(S, size=(b, S))
        pi = rng.integers(P, size=(b, S, P))
        boot[i:i + b] = D[si[:, :, None], pi].mean(axis=(1, 2))
    lo, hi = np.quantile(boot, [alpha / 2, 1 - alpha / 2])
    return float(D.mean() * scale), float(lo * scale), float(hi * scale)


# --------------------------------------------------------------------------- the table and the report
NOISE_COLUMNS = [
    "comparison", "off", "on", "n_pairs", "sd_diff", "noise_diff", "ratio", "ratio_lo", "ratio_hi",
    "noise_var_frac", "boot_mean", "boot_lo", "boot_hi", "boot_n_seeds",
    "metric", "k", "final_k", "step0_n", "step0_shared", "step0_mean", "step0_sd", "step0_sd_lo", "step0_sd_hi",
    "noise_final", "noise_final_lo", "noise_final_hi", "noise_diff_lo", "noise_diff_hi", "median_sd_diff",
    "ratio_median", "k_needed", "k_needed_exact", "k_needed_pow2", "k_needed_lo", "k_needed_hi",
    "records_sd", "records_n_evals", "records_n_runs", "records_sd_step0", "records_n_step0",
    "records_sd_final", "records_n_final", "noise_diff_records"]
"""The columns of ``eval_noise.csv``: one row per primary-family comparison (one row with an empty
comparison when there is none); the step-0, k' and records columns are the same on every row."""


def _final_problem_rows(problems: pd.DataFrame, tidy: pd.DataFrame, metric: str, final_k: int) -> pd.DataFrame:
    """The problem rows of each run's final evaluations as the tidy table counts them (its last final_k
    points of ``metric``), keeping only runs whose records hold all of them."""
    d = final_points(tidy.loc[tidy["metric"] == metric, ["run", "grad_step", "rollout_step"]], final_k, metric)
    want = d.dropna(subset=["rollout_step"]).assign(step=lambda f: f["rollout_step"].astype("int64"))[["run", "step"]]
    have = problems.merge(want, on=["run", "step"], how="inner")
    got = have.groupby("run")["step"].nunique()
    need = want.groupby("run")["step"].nunique()
    whole = got.index[got.to_numpy() == need.reindex(got.index).to_numpy()]
    return have[have["run"].isin(whole)]


def noise_table(tidy: pd.DataFrame, sweep: SweepInfo | None = None, configs: dict | None = None,
                final_k: int | None = None, *, family: pd.DataFrame | None = None,
                problems: pd.DataFrame | None = None, metric: str | None = None,
                n_boot: int = 2000, alpha: float = ALPHA) -> pd.DataFrame:
    """``eval_noise.csv``: the step-0 noise set beside each primary-family comparison (:data:`NOISE_COLUMNS`).

    ``family``: :func:`analysis.tables.family_table` already computed (else computed here, which
    needs ``sweep``). Per comparison: sd_diff (the SD of its per-seed differences of finals),
    noise_diff (√2·SD₀/√final_k), ratio = noise_diff/sd_diff with ratio_lo/hi from the ends of SD₀'s
    χ² interval, noise_var_frac = ratio² (the share of the differences' variance that the evaluation
    noise alone accounts for); with ``problems``, boot_* from :func:`hierarchical_diff_ci` on each
    run's final evaluations. k_needed: :func:`k_needed` at the median sd_diff, rounded up (_exact before
    rounding, _pow2 the next power of two, _lo/_hi rounded up at the ends of SD₀'s interval).
    noise_diff_records: √(2/final_k) × records_sd_final, the same noise from the records. ``attrs``: note (why nothing was measured), shared_note.
    """
    if family is None:
        from .tables import family_table
        family = family_table(tidy, sweep, configs, final_k)
    final_k = int(final_k or family.attrs.get("final_k") or (sweep.final_k if sweep else 3))
    metric = metric or family.attrs.get("metric") or (sweep.metric if sweep else None) or primary_metric(tidy)
    s0 = step0_noise(tidy, metric, alpha)
    rt = math.sqrt(final_k)
    nf, nf_lo, nf_hi = s0.sd / rt, s0.lo / rt, s0.hi / rt
    nd, nd_lo, nd_hi = (math.sqrt(2) * v for v in (nf, nf_lo, nf_hi))
    sds = family["sd"].to_numpy(dtype=float) if len(family) else np.zeros(0)
    med = float(np.nanmedian(sds)) if np.isfinite(sds).any() else float("nan")
    k_ex, k_up, k2 = k_needed(s0.k, nd, med)
    k_lo = k_needed(s0.k, nd_lo, med)[1]
    k_hi = k_needed(s0.k, nd_hi, med)[1]
    rec = records_summary(None, final_k)
    fin = None
    if problems is not None and len(problems) and metric:
        per = records_noise(problems, s0.scale if metric in set(tidy["metric"]) else 100.0, metric=metric)
        rec = records_summary(per, final_k)
        fin = _final_problem_rows(problems, tidy, metric, final_k)
    glob = {"metric": metric, "k": s0.k if s0.k is not None else np.nan, "final_k": final_k, "step0_n": s0.n,
            "step0_shared": s0.shared, "step0_mean": s0.mean, "step0_sd": s0.sd, "step0_sd_lo": s0.lo,
            "step0_sd_hi": s0.hi, "noise_final": nf, "noise_final_lo": nf_lo, "noise_final_hi": nf_hi,
            "noise_diff_lo": nd_lo, "noise_diff_hi": nd_hi, "median_sd_diff": med,
            "ratio_median": nd / med if med > 0 else np.nan, "k_needed": k_up, "k_needed_exact": k_ex,
            "k_needed_pow2": k2, "k_needed_lo": k_lo, "k_needed_hi": k_hi, **rec,
            "noise_diff_records": math.sqrt(2 / final_k) * rec["records_sd_final"]}
    rows = []
    for r in family.itertuples(index=False):
        sd = float(r.sd)
        ok = np.isfinite(sd) and sd > 0
        boot = (np.nan,) * 3
        nb = 0
        if fin is not None and len(fin):
            boot = hierarchical_diff_ci(fin, r.off, r.on, final_k, n_boot, metric=metric, scale=s0.scale,
                                        alpha=alpha)
            pair = fin[fin["arm"].isin([r.off, r.on])].groupby("seed")["arm"].nunique()
            nb = int((pair == 2).sum()) if np.isfinite(boot[0]) else 0
        rows.append({"comparison": r.comparison, "off": r.off, "on": r.on, "n_pairs": int(r.n), "sd_diff": sd,
                     "noise_diff": nd, "ratio": nd / sd if ok else np.nan,
                     "ratio_lo": nd_lo / sd if ok else np.nan, "ratio_hi": nd_hi / sd if ok else np.nan,
                     "noise_var_frac": (nd / sd) ** 2 if ok else np.nan,
                     "boot_mean": boot[0], "boot_lo": boot[1], "boot_hi": boot[2], "boot_n_seeds": nb, **glob})
    if not rows:
        rows.append({"comparison": "", "off": "", "on": "", "n_pairs": 0, "noise_diff": nd, "boot_n_seeds": 0,
                     **glob})
    out = pd.DataFrame(rows).reindex(columns=NOISE_COLUMNS)
    out.attrs.update(note=s0.note if not np.isfinite(s0.sd) else "", shared_note="" if s0.shared else s0.note,
                     scale=s0.scale, has_records=fin is not None)
    return out


NOISE_NOTE = (
    "Method: at rollout step 0 every arm of a seed evaluates the same base model, so the spread of the step-0 "
    "value over seeds is evaluation noise alone, measured here with its 95% χ² interval (SD₀). A final value "
    "averages final_k evaluations with independent draws, so its noise is SD₀/√final_k; a paired difference of "
    "finals carries √2 times that (the two arms' draws taken as independent; while the policies are close the "
    "shared evaluation seed can correlate them, and then it is smaller). noise/SD sets that beside the SD of each "
    "comparison's per-seed differences; its square is the share of their variance that evaluation noise alone "
    "accounts for, the rest being the seeds' training. Noise falls as 1/√k with k samples per problem, so "
    "k' = k·(3·noise/median SD)², rounded up, is where it would be a third of the median SD "
    "(the SD of the differences held fixed). With per-problem records: the within-evaluation SD of avg@k, "
    "√(Σ_p p̂_p(1 − p̂_p)/(k − 1))/P (the binomial estimate from each problem's k samples, root mean square "
    "over evaluations), which should agree with SD₀ at step 0; and a hierarchical bootstrap of each "
    "comparison's difference (seeds, then problems within each seed; 2,000 resamples, nominal 95% percentile), "
    "a secondary interval that includes problem-sampling noise and decides nothing. Its true level is lower: "
    "a percentile bootstrap over n seeds covers about 74% at 3 seeds, 88% at 6 and 91% at 10 (normal data; "
    "less for skewed, docs/STATISTICS.md).")


def _f(v, digits: int = 2) -> str:
    return "–" if v is None or not np.isfinite(v) else f"{v:.{digits}f}"


def noise_section(table: pd.DataFrame) -> list[str]:
    """The report's "Evaluation noise" section (markdown lines) from :func:`noise_table`."""
    from .tables import to_markdown
    g = table.iloc[0]
    metric = g["metric"]
    head = ["## Evaluation noise", ""]
    scale = table.attrs.get("scale", 1.0)
    unit = " points" if scale == 100 else ""
    files = "Numbers: [eval_noise.csv](eval_noise.csv)."
    if not isinstance(metric, str) or not metric or not np.isfinite(g["step0_sd"]):
        why = table.attrs.get("note") or "no step-0 value to measure it from"
        line = f"Not measured from step 0: {why}."
        if g["records_n_evals"] > 0:
            line += (f" From the per-problem records ({int(g['records_n_evals'])} evaluations): within-evaluation "
                     f"SD {_f(g['records_sd'])}{unit}.")
        return head + [line, "", files, ""]
    name = metric_short(metric)
    seeds = ("the arms of a seed share it" if g["step0_shared"] else table.attrs.get("shared_note", ""))
    k = int(g["k"]) if np.isfinite(g["k"]) else None
    pct = "%" if scale == 100 else ""
    lines = [f"Step-0 `{name}` over {int(g['step0_n'])} seeds: mean {_f(g['step0_mean'])}{pct}, SD₀ "
             f"{_f(g['step0_sd'])} [{_f(g['step0_sd_lo'])}, {_f(g['step0_sd_hi'])}]{unit} (95% χ²; {seeds}). "
             f"Noise of a final (mean of {int(g['final_k'])} evaluations): {_f(g['noise_final'])} "
             f"[{_f(g['noise_final_lo'])}, {_f(g['noise_final_hi'])}]; of a paired difference of finals: "
             f"{_f(g['noise_diff'])} [{_f(g['noise_diff_lo'])}, {_f(g['noise_diff_hi'])}]{unit}."]
    if k and np.isfinite(g["k_needed"]):
        lines[0] += (f" Against the median SD of the family's differences ({_f(g['median_sd_diff'])}) that is "
                     f"{_f(g['ratio_median'])} of it; k' = {int(g['k_needed'])} samples per problem (now {k}; "
                     f"k·(3·noise/SD)² = {_f(g['k_needed_exact'], 1)} rounded up, {int(g['k_needed_pow2'])} as a "
                     f"power of two; {int(g['k_needed_lo'])}–{int(g['k_needed_hi'])} at the ends of SD₀'s "
                     f"interval) would make the noise a third of the median SD.")
    if g["records_n_evals"] > 0:
        lines += ["", f"Per-problem records ({int(g['records_n_evals'])} evaluations of {int(g['records_n_runs'])} "
                  f"runs): within-evaluation SD {_f(g['records_sd'])}{unit}; at step 0 "
                  f"{_f(g['records_sd_step0'])} ({int(g['records_n_step0'])} evaluations; SD₀ above "
                  f"{_f(g['step0_sd'])}); at each run's last {int(g['final_k'])} recorded evaluations "
                  f"{_f(g['records_sd_final'])} ({int(g['records_n_final'])}), so a paired difference of "
                  f"finals carries {_f(g['noise_diff_records'])}{unit} of sampling noise."]
    else:
        lines += ["", "No per-problem records with these runs (problems.parquet absent: older runs, or a "
                  "snapshot made without the runs' eval_records/): no records-based SD or hierarchical interval."]
    fam = table[table["comparison"].astype(str) != ""]
    if len(fam):
        shown = pd.DataFrame({
            "comparison": fam["comparison"],
            f"SD of differences{unit and ' (pp)'}": [_f(v) for v in fam["sd_diff"]],
            "noise / SD [SD₀ interval]": [f"{_f(r)} [{_f(lo)}, {_f(hi)}]" for r, lo, hi
                                           in zip(fam["ratio"], fam["ratio_lo"], fam["ratio_hi"])],
            "share of variance": [(_f(v * 100, 0) + "%" + (" (> 100%: see below)" if v > 1 else ""))
                                  if np.isfinite(v) else "–" for v in fam["noise_var_frac"]],
        })
        if table.attrs.get("has_records"):
            shown["hierarchical bootstrap Δ [nominal 95% pct.: ≈74–91% at 3–10 seeds], seeds"] = [
                f"{_f(m)} [{_f(lo)}, {_f(hi)}], {int(n)}" if np.isfinite(m) else "–"
                for m, lo, hi, n in zip(fam["boot_mean"], fam["boot_lo"], fam["boot_hi"], fam["boot_n_seeds"])]
        lines += ["", to_markdown(shown)]
        if (fam["noise_var_frac"] > 1).any():
            lines += ["A share above 100% means the independent-draws estimate is more than the whole variance of "
                      "those differences: the two arms of a seed evaluate with the same evaluation seed, and while "
                      "their policies are close their draws agree, so the noise in their difference is smaller "
                      "than √2 × that of one final. Read the ratio as an upper bound there."]
    return head + lines + ["", NOISE_NOTE + " " + files, ""]
