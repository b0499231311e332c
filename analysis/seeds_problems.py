"""Seeds × problems: how much of a paired difference is evaluation noise, which problems carry it, what
generalises beyond the problem set, and how many seeds × samples per problem a stated Δ needs.

The data are the per-problem records (``problems.parquet``, :data:`analysis.runs.PROBLEM_COLUMNS`) at
each run's final evaluations (the ones the tidy table's final value averages, taken with
:func:`analysis.eval_noise._final_problem_rows`). For a pair of arms (off, on), per seed s and problem p:

    d_sp = ȳ_on,sp − ȳ_off,sp        (share correct over the final evaluations' k samples each)

and its evaluation-noise variance v_sp, the binomial estimate summed over the two arms: per evaluation
p̂(1 − p̂)/(k − 1), divided by the number of final evaluations squared and summed over them (the arms'
draws taken as independent). The model is the two-way crossed random-effects model of a paired
difference without replication (Searle, Casella & McCulloch 1992, ch. 4):

    d_sp = μ + a_s + b_p + e_sp,   a_s ~ (0, σ²_seed), b_p ~ (0, σ²_problem), e_sp ~ (0, σ²_resid)

a_s: what training with seed s does to the difference (arm × seed); b_p: how much more problem p gains
than the average (arm × problem); e_sp: evaluation noise (v̄ = mean v_sp) plus the seed × problem
interaction. (The problem's own difficulty and the seed's shared draws cancel in the paired difference.)
The variance components come from the ANOVA mean squares of the S × P matrix (:func:`crossed_anova`;
equal to REML where none is truncated at 0; the mean squares are tested against statsmodels'
``anova_lm`` in tests/test_seeds_problems.py). From them:

- **the share of the variance of a paired difference that is evaluation noise**: the per-seed
  difference d̄_s = mean_p d_sp has variance MS_seed / P over seeds, of which v̄ / P is evaluation
  noise, so share = v̄ / MS_seed (from the records, not from step 0 as in :mod:`analysis.eval_noise`);
- **which problems carry the effect**: each problem's mean over seeds of d_sp with its exact
  sign-flip p (:func:`analysis.stats.sign_flip_p`), Benjamini–Hochberg q over the problems
  (statsmodels ``multipletests``), and the F-test of σ²_problem = 0 (MS_problem / MS_resid); a figure;
- **an arm effect that generalises beyond the problem set** (the problems a random draw from a
  population like them): μ̂ = the grand mean with Var(μ̂) = σ²_seed/S + σ²_problem/P + σ²_resid/(SP) =
  (MS_seed + MS_problem − MS_resid)/(SP) (each component truncated at 0), a Student-t interval with
  Satterthwaite's degrees of freedom. Its coverage is measured by simulation (:func:`coverage_simulation`;
  tests and docs/STATISTICS.md state it). The seed-level interval of the primary family treats the
  problems as fixed; this one is wider by the problem term.

:func:`plan_nk` prices the seeds × samples-per-problem combinations reaching 80% power for a stated Δ:
the SD of the per-seed difference at k samples per problem is √(σ²_train + V_eval · k₀/k), σ²_train =
MS_seed/P − v̄/P (what does not shrink with k) and V_eval = v̄/P measured at k₀; seeds from
:func:`analysis.stats.seeds_needed_sign_flip` (the test the reports print); cost = seeds × 2 arms ×
(training thread-s + evaluation thread-s × k/k₀), from the runs' own ``time/step_s``, ``time/eval_s`` and
``train.threads`` (the cost ledger's thread-s split into training and evaluation).
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .metric_names import equivalence_margin, metric_scale, metric_short, primary_metric
from .runs import SweepInfo
from .stats import LEAD_Q, SEEDS_MAX_SIMULATED, ALPHA, bh_q, seeds_needed, seeds_needed_sign_flip, sign_flip_p

__all__ = ["cell_matrix", "CrossedFit", "crossed_anova", "problem_effects", "simulate_cells",
           "coverage_simulation", "plan_nk", "run_costs", "problems_figure", "seeds_problems_section",
           "SEEDS_PROBLEMS_NOTE", "PLAN_KS"]

PLAN_KS = (1, 2, 4, 8, 16, 32, 64)
"""Samples per problem the planner prices."""
DELTA_MULTIPLES = (1, 2, 5)
"""The section plans for Δ = these multiples of the stated Δ (default: the metric's equivalence margin)."""


# --------------------------------------------------------------------------- the cells
def cell_matrix(problems: pd.DataFrame, off: str, on: str) -> tuple[np.ndarray, np.ndarray, list, list]:
    """``(D, V, seeds, problem ids)`` of arm ``on`` − arm ``off`` from final-evaluation problem rows.

    problems: rows of :data:`analysis.runs.PROBLEM_COLUMNS` already restricted to each run's final
    evaluations and one eval set. D: [S, P], d_sp = mean over the run's rows of n_correct/k (on) − the
    same (off), as a fraction; V: [S, P], its binomial evaluation variance Σ_arms Σ_evals
    p̂(1 − p̂)/(k − 1) / n_evals² (NaN where k < 2). Seeds with both arms, problems every such seed has
    in both arms (sorted)."""
    d = problems[problems["arm"].isin([off, on])]
    if d.empty:
        return np.zeros((0, 0)), np.zeros((0, 0)), [], []
    k = d["k"].to_numpy(dtype=float)
    p = d["n_correct"].to_numpy(dtype=float) / k
    d = d.assign(acc=p, v=np.where(k >= 2, p * (1 - p) / np.maximum(k - 1, 1), np.nan))
    g = d.groupby(["arm", "seed", "problem"], sort=True).agg(acc=("acc", "mean"), v=("v", "sum"), n=("acc", "size"))
    g["v"] = g["v"] / g["n"] ** 2
    arms = set(g.index.get_level_values(0))
    if off not in arms or on not in arms:
        return np.zeros((0, 0)), np.zeros((0, 0)), [], []
    a, b = g.loc[off], g.loc[on]
    diff = (b["acc"] - a["acc"]).dropna()
    var = (b["v"] + a["v"]).reindex(diff.index)
    Dm = diff.unstack("problem")
    Vm = var.unstack("problem")
    keep = Dm.notna().all(axis=0)
    Dm, Vm = Dm.loc[:, keep], Vm.loc[:, keep]
    return (Dm.to_numpy(dtype=float), Vm.to_numpy(dtype=float), [int(s) for s in Dm.index],
            [str(c) for c in Dm.columns])


# --------------------------------------------------------------------------- the crossed model
@dataclass(frozen=True)
class CrossedFit:
    """The two-way crossed random-effects fit of a paired difference (fractions; see the module docstring)."""
    S: int
    P: int
    mean: float               # μ̂, the grand mean of d_sp
    ms_seed: float
    ms_problem: float
    ms_resid: float
    var_seed: float           # σ²_seed (truncated at 0)
    var_problem: float        # σ²_problem (truncated at 0)
    var_resid: float          # MS_resid
    eval_var: float           # v̄: mean evaluation-noise variance of a cell (NaN without V)
    se: float                 # √Var(μ̂) generalising over problems
    df: float                 # its Satterthwaite degrees of freedom
    lo: float
    hi: float                 # (1 − α) t interval of μ over seeds and problems
    se_fixed: float           # √(MS_seed/(SP)): the problems held fixed (the seed-level t interval)
    lo_fixed: float
    hi_fixed: float
    f_problem_p: float        # p of the F-test σ²_problem = 0: MS_problem / MS_resid on (P − 1, (S − 1)(P − 1))
    level: float

    @property
    def eval_share(self) -> float:
        """Share of the variance of the per-seed difference (MS_seed/P) that is evaluation noise (v̄/P)."""
        return self.eval_var / self.ms_seed if self.ms_seed > 0 else float("nan")

    def eval_share_interval(self, alpha: float = ALPHA) -> tuple[float, float]:
        """The eval share's (1 − α) range from MS_seed's χ² interval on S − 1 df (v̄ held fixed):
        [v̄·χ²_{α/2}/(S − 1)/MS_seed, v̄·χ²_{1−α/2}/(S − 1)/MS_seed]."""
        from scipy.stats import chi2
        if not (self.ms_seed > 0 and np.isfinite(self.eval_var)):
            return float("nan"), float("nan")
        df = self.S - 1
        return (self.eval_share * float(chi2.ppf(alpha / 2, df)) / df,
                self.eval_share * float(chi2.ppf(1 - alpha / 2, df)) / df)

    @property
    def var_seed_diff(self) -> float:
        """Variance over seeds of the per-seed difference d̄_s, MS_seed/P (fraction²)."""
        return self.ms_seed / self.P

    @property
    def var_train(self) -> float:
        """Of it, what does not shrink with k: MS_seed/P − v̄/P, at least 0."""
        return max(0.0, (self.ms_seed - self.eval_var) / self.P) if np.isfinite(self.eval_var) else self.ms_seed / self.P


def crossed_anova(D, V=None, alpha: float = ALPHA) -> CrossedFit | None:
    """The crossed fit of D: [S, P] (S ≥ 2 seeds, P ≥ 2 problems, no NaN); V: [S, P] cell evaluation
    variances (optional). Mean squares of the two-way layout without replication:
    MS_seed = P·Σ_s(d̄_s − d̄)²/(S − 1), MS_problem = S·Σ_p(d̄_p − d̄)²/(P − 1),
    MS_resid = Σ(d_sp − d̄_s − d̄_p + d̄)²/((S − 1)(P − 1)). Components σ²_seed = (MS_seed − MS_resid)/P and
    σ²_problem = (MS_problem − MS_resid)/S, each truncated at 0; SP·Var(μ̂) = c_s·MS_seed + c_p·MS_problem +
    c_e·MS_resid with (c_s, c_p, c_e) = (1, 1, −1) when neither is truncated (one truncated: its MS
    and one −MS_resid drop; both: MS_resid alone); Satterthwaite df = (Σ c·MS)² / Σ (c·MS)²/df.
    None when the matrix is smaller than 2 × 2."""
    from scipy.stats import f as f_dist, t as t_dist
    D = np.asarray(D, dtype=float)
    if D.ndim != 2 or D.shape[0] < 2 or D.shape[1] < 2 or not np.isfinite(D).all():
        return None
    S, P = D.shape
    g = D.mean()
    rs, cp = D.mean(axis=1), D.mean(axis=0)
    df_s, df_p, df_e = S - 1, P - 1, (S - 1) * (P - 1)
    ms_s = P * float(((rs - g) ** 2).sum()) / df_s
    ms_p = S * float(((cp - g) ** 2).sum()) / df_p
    ms_e = float(((D - rs[:, None] - cp[None, :] + g) ** 2).sum()) / df_e
    c_s, c_p = float(ms_s > ms_e), float(ms_p > ms_e)          # a component truncated at 0 drops its MS
    parts = [(c_s, ms_s, df_s), (c_p, ms_p, df_p), (1.0 - c_s - c_p, ms_e, df_e)]
    total = sum(c * ms for c, ms, _ in parts)                  # S·P·Var(μ̂)
    denom = sum((c * ms) ** 2 / df for c, ms, df in parts if c)
    var_mu = max(total, 0.0) / (S * P)
    dof = total ** 2 / denom if denom > 0 else float("nan")
    se = math.sqrt(var_mu)
    q = float(t_dist.ppf(1 - alpha / 2, dof)) if np.isfinite(dof) and dof > 0 else float("nan")
    se_fixed = math.sqrt(ms_s / (S * P))
    q_fixed = float(t_dist.ppf(1 - alpha / 2, df_s))
    ev = float(np.nanmean(V)) if V is not None and np.isfinite(np.asarray(V, dtype=float)).any() else float("nan")
    fp = float(f_dist.sf(ms_p / ms_e, df_p, df_e)) if ms_e > 0 else float("nan")
    return CrossedFit(S, P, float(g), ms_s, ms_p, ms_e, max(0.0, (ms_s - ms_e) / P), max(0.0, (ms_p - ms_e) / S),
                      ms_e, ev, se, dof, g - q * se, g + q * se, se_fixed, g - q_fixed * se_fixed,
                      g + q_fixed * se_fixed, fp, 1 - alpha)


def problem_effects(D, problem_ids, fit: CrossedFit) -> pd.DataFrame:
    """Per problem: ``problem, mean`` (over seeds, fraction), ``shrunk`` (the BLUP d̄ + w·(d̄_p − d̄),
    w = σ²_problem / (σ²_problem + MS_resid/S)), ``p`` (exact two-sided sign-flip test over the seeds;
    with S ≤ 5 seeds it cannot reach 0.05), ``q`` (Benjamini–Hochberg over the problems,
    statsmodels ``multipletests(method="fdr_bh")``), ``lead`` (q ≤ :data:`LEAD_Q`). Sorted by mean."""
    D = np.asarray(D, dtype=float)
    cp = D.mean(axis=0)
    denom = fit.var_problem + fit.ms_resid / fit.S
    w = fit.var_problem / denom if denom > 0 else 0.0
    ps = np.array([sign_flip_p(D[:, j])[0] for j in range(D.shape[1])])
    q = bh_q(ps)
    out = pd.DataFrame({"problem": list(problem_ids), "mean": cp, "shrunk": fit.mean + w * (cp - fit.mean),
                        "p": ps, "q": q})
    out["lead"] = out["q"] <= LEAD_Q
    return out.sort_values("mean", kind="stable").reset_index(drop=True)


# --------------------------------------------------------------------------- coverage, by simulation
def simulate_cells(rng, S: int, P: int, mu: float, sd_seed: float, sd_problem: float, sd_inter: float,
                   k: int, n_evals: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """One simulated paired experiment: (D, V), [S, P] each, from the crossed model on the probability scale.

    Problem base rates q_p ~ U(0.3, 0.7); off arm p = q_p + u_sp/2, on arm p = q_p + μ + a_s + b_p − u_sp/2
    with a_s ~ N(0, sd_seed²), b_p ~ N(0, sd_problem²), u_sp ~ N(0, sd_inter²), clipped to [0, 1] (rarely
    binding at the sizes the test uses); each arm's cell: n_evals evaluations of k Bernoulli samples.
    E[d] = μ, the arm effect over the population of seeds and problems."""
    q = rng.uniform(0.3, 0.7, size=P)
    a = rng.normal(0, sd_seed, size=S)
    b = rng.normal(0, sd_problem, size=P)
    u = rng.normal(0, sd_inter, size=(S, P))
    p_off = np.clip(q[None, :] + u / 2, 0, 1)
    p_on = np.clip(q[None, :] + mu + a[:, None] + b[None, :] - u / 2, 0, 1)
    y_off = rng.binomial(k, p_off[None].repeat(n_evals, 0)) / k             # [n_evals, S, P]
    y_on = rng.binomial(k, p_on[None].repeat(n_evals, 0)) / k
    var = lambda y: (y * (1 - y) / (k - 1)).sum(axis=0) / n_evals ** 2      # noqa: E731
    return y_on.mean(axis=0) - y_off.mean(axis=0), var(y_on) + var(y_off)


def coverage_simulation(n_sim: int, S: int, P: int, *, mu: float = 0.02, sd_seed: float = 0.02,
                        sd_problem: float = 0.05, sd_inter: float = 0.05, k: int = 8, n_evals: int = 2,
                        seed: int = 0) -> dict:
    """Coverage of μ by :func:`crossed_anova`'s two intervals over ``n_sim`` simulated experiments
    (:func:`simulate_cells`, ``default_rng(seed)``): ``{"generalising": share covering, "fixed": share of
    the problems-fixed interval covering, "level": stated, "share_eval": mean estimated eval share}``."""
    rng = np.random.default_rng(seed)
    cov = fixed = 0
    shares = []
    for _ in range(n_sim):
        D, V = simulate_cells(rng, S, P, mu, sd_seed, sd_problem, sd_inter, k, n_evals)
        f = crossed_anova(D, V)
        cov += f.lo <= mu <= f.hi
        fixed += f.lo_fixed <= mu <= f.hi_fixed
        shares.append(f.eval_share)
    return {"generalising": cov / n_sim, "fixed": fixed / n_sim, "level": 1 - ALPHA,
            "share_eval": float(np.nanmean(shares))}


# --------------------------------------------------------------------------- the n × k planner
def _seeds(sd: float, delta: float, power: float, alpha: float) -> int | None:
    """:func:`analysis.stats.seeds_needed_sign_flip`, without its simulations where the paired t-test already
    needs more than :data:`analysis.stats.SEEDS_MAX_SIMULATED` + 5 pairs: there it returns the t-test count
    (the sign-flip test, never more powerful than the t-test on normal differences, does not reach the
    power below 31 pairs), and that count is returned directly."""
    n_t = seeds_needed(sd, delta, power, alpha)
    if n_t is None:
        return None
    if n_t > SEEDS_MAX_SIMULATED + 5:
        return max(SEEDS_MAX_SIMULATED + 1, n_t)
    return seeds_needed_sign_flip(sd, delta, power, alpha)


def plan_nk(var_train: float, eval_var: float, k0: int, delta: float, train_cost: float, eval_cost: float, *,
            ks=PLAN_KS, power: float = 0.8, alpha: float = ALPHA) -> pd.DataFrame:
    """Seeds × samples per problem for ``power`` against a mean paired difference ``delta``.

    var_train: the variance over seeds of the per-seed difference that does not shrink with k (unit²);
    eval_var: its evaluation-noise part measured at k0 samples per problem (unit²), which scales as k0/k;
    train_cost, eval_cost: one run's training and (all of its) evaluation cost at k0 (e.g. thread-s).
    Per k: sd = √(var_train + eval_var·k0/k); seeds = :func:`analysis.stats.seeds_needed_sign_flip`
    (sd, delta, power, alpha) (:func:`_seeds`); cost = seeds × 2 arms × (train_cost + eval_cost·k/k0); ``cheapest``
    marks the least cost. Columns ``k, sd, seeds, cost_per_run, cost, cheapest``."""
    rows = []
    for k in ks:
        sd = math.sqrt(max(var_train, 0.0) + max(eval_var, 0.0) * k0 / k)
        n = _seeds(sd, delta, power, alpha)
        per = train_cost + eval_cost * k / k0
        rows.append({"k": int(k), "sd": sd, "seeds": float(n) if n is not None else np.nan, "cost_per_run": per,
                     "cost": (2 * n * per) if n is not None else np.nan})
    out = pd.DataFrame(rows)
    out["cheapest"] = out["cost"] == out["cost"].min() if out["cost"].notna().any() else False
    return out


def run_costs(tidy: pd.DataFrame, configs: dict | None, arms: list[str]) -> tuple[float, float]:
    """(training thread-s, evaluation thread-s) per run, means over the runs of ``arms``: thread-s as the cost
    ledger counts them (:func:`analysis.tables.loop_seconds` × ``train.threads``), of which Σ ``time/eval_s``
    × threads is evaluation. NaN where threads is unknown."""
    from .tables import _threads, loop_seconds
    runs = tidy.loc[tidy["arm"].isin(arms), "run"].unique()
    loop = loop_seconds(tidy)
    ev = tidy.loc[tidy["metric"] == "time/eval_s"].groupby("run")["value"].sum()
    tr, es = [], []
    for r in runs:
        th = _threads(configs, r)
        total = float(loop.get(r, np.nan)) * th
        e = float(ev.get(r, 0.0)) * th
        tr.append(total - e)
        es.append(e)
    return (float(np.nanmean(tr)) if tr else np.nan, float(np.nanmean(es)) if es else np.nan)


# --------------------------------------------------------------------------- the figure
def problems_figure(effects: dict[str, pd.DataFrame], scale: float = 100.0):
    """Which problems carry the effect: per comparison a panel of every problem's mean paired difference
    over seeds (points, sorted) and its shrunk estimate (line); problems with BH q ≤ 0.10 filled."""
    import matplotlib

    from .figures import STYLE, _footnote, _new_figure
    if not effects:
        return None
    n = len(effects)
    ncols = min(3, n)
    nrows = -(-n // ncols)
    fig, axes = _new_figure(ncols=ncols, nrows=nrows, size=(3.6 * ncols + 0.4, 2.6 * nrows + 0.8))
    with matplotlib.rc_context(STYLE):
        for ax, (label, e) in zip(axes, effects.items()):
            x = np.arange(len(e))
            lead = e["lead"].to_numpy(dtype=bool)
            ax.axhline(0, color="#777777", linewidth=0.8)
            ax.plot(x[~lead], e["mean"].to_numpy()[~lead] * scale, "o", ms=2.4, mfc="none", color="#0072B2",
                    alpha=0.7)
            ax.plot(x[lead], e["mean"].to_numpy()[lead] * scale, "o", ms=3.2, color="#D55E00")
            ax.plot(x, e["shrunk"].to_numpy() * scale, "-", color="#333333", linewidth=1.0)
            ax.set_title("\n".join(textwrap.wrap(label, 42)), fontsize=8)
            ax.set_xlabel("problems, sorted by their mean difference")
            ax.set_ylabel("on − off (points)" if scale == 100 else "on − off")
        for ax in axes[n:]:
            ax.set_visible(False)
        fig.suptitle("Fig. P1: which problems carry the effect", x=0.01, ha="left", fontweight="bold")
        _footnote(fig, "Points: each problem's paired difference of final share correct, mean over seeds (filled: "
                       "Benjamini–Hochberg q ≤ 0.10 over the problems, exact sign-flip p per problem; exploratory). "
                       "Line: the shrunk (BLUP) estimate of the crossed model, flat when the problems' effects "
                       "do not vary beyond noise.")
    return fig


# --------------------------------------------------------------------------- the report section
SEEDS_PROBLEMS_NOTE = (
    "Method: per pair of arms, d_sp = final share correct (on − off) of problem p in seed s from the per-problem "
    "records at each run's final evaluations, fitted by the two-way crossed random-effects model d_sp = μ + a_s "
    "+ b_p + e_sp (seed: training; problem: arm × problem; residual: evaluation noise and seed × problem) with "
    "ANOVA (method-of-moments) components truncated at 0. Eval share: binomial evaluation variance of a cell "
    "(p̂(1 − p̂)/(k − 1) per evaluation, both arms) over the mean square between seeds, i.e. the share of the "
    "variance of a per-seed paired difference that more samples per problem would remove. Generalising "
    "interval: μ over seeds and problems (the problem set one draw from a population like it), Var = "
    "(MS_seed + MS_problem − MS_resid)/(SP), Student-t with Satterthwaite df; its coverage, measured by "
    "simulation, is in docs/STATISTICS.md. Problems: exact sign-flip p over seeds per problem, "
    "Benjamini–Hochberg q over the problems, exploratory. Secondary: no verdict uses these numbers. "
    "docs/STATISTICS.md, \"Seeds × problems\".")


def _pct(v) -> str:
    return "–" if not np.isfinite(v) else f"{100 * v:.0f}%"


def _f(v, d: int = 2, signed: bool = False) -> str:
    if v is None or not np.isfinite(v):
        return "–"
    return f"{v:+.{d}f}" if signed else f"{v:.{d}f}"


def seeds_problems_section(tidy: pd.DataFrame, sweep: SweepInfo, configs: dict | None,
                           problems: pd.DataFrame | None, out_dir=None, *, metric: str | None = None,
                           final_k: int | None = None, delta: float | None = None,
                           pairs: list[tuple[str, str, str]] | None = None,
                           formats: tuple[str, ...] = ("png",)) -> list[str]:
    """The report's "Seeds × problems" section (markdown lines): per primary-family pair with records, the
    crossed fit (:func:`crossed_anova`), the problems that carry the effect (:func:`problem_effects`,
    figure ``figures/fig_problems.*``), and the n × k plan (:func:`plan_nk`) for ``delta`` × :data:`DELTA_MULTIPLES`
    (``delta`` default: the metric's equivalence margin, in its shown unit) from the median components over those pairs, priced by
    :func:`run_costs`. With ``out_dir``: writes seeds_problems.csv, problem_effects.csv, plan_nk.csv."""
    from .eval_noise import _final_problem_rows, _metric_set
    from .tables import comparison_label, primary_pairs, to_markdown
    head = ["## Seeds × problems: evaluation noise, problems, and seeds × samples", ""]
    metric = metric or sweep.metric or primary_metric(tidy)
    final_k = int(final_k or sweep.final_k)
    if problems is None or problems.empty or not metric:
        return head + ["No per-problem records with these runs (problems.parquet absent): no seeds × problems "
                       "model.", ""]
    scale = metric_scale(tidy, metric)
    unit = " (pp)" if scale == 100 else ""
    fin = _final_problem_rows(_metric_set(problems, metric, None), tidy, metric, final_k)
    if pairs is None:
        pairs = [(comparison_label(on, off), off.name, on.name) for off, on in primary_pairs(tidy, sweep, configs)]
    k0 = int(fin["k"].max()) if len(fin) else 0
    rows, effects = [], {}
    for label, off, on in pairs:
        D, V, seeds, probs = cell_matrix(fin, off, on)
        fit = crossed_anova(D, V)
        if fit is None:
            rows.append({"comparison": label, "off": off, "on": on, "seeds": len(seeds), "problems": len(probs)})
            continue
        eff = problem_effects(D, probs, fit)
        effects[label] = eff
        rows.append({"comparison": label, "off": off, "on": on, "seeds": fit.S, "problems": fit.P,
                     "mean": fit.mean * scale, "lo": fit.lo * scale, "hi": fit.hi * scale, "df": fit.df,
                     "lo_fixed": fit.lo_fixed * scale, "hi_fixed": fit.hi_fixed * scale,
                     "sd_seed": math.sqrt(fit.var_seed) * scale, "sd_problem": math.sqrt(fit.var_problem) * scale,
                     "sd_resid": math.sqrt(fit.var_resid) * scale, "eval_var_cell": fit.eval_var * scale ** 2,
                     "eval_share": fit.eval_share, "eval_share_lo": fit.eval_share_interval()[0],
                     "eval_share_hi": fit.eval_share_interval()[1], "var_train": fit.var_train * scale ** 2,
                     "eval_var_diff": fit.eval_var / fit.P * scale ** 2, "f_problem_p": fit.f_problem_p,
                     "leads": int(eff["lead"].sum()), "k": k0})
    table = pd.DataFrame(rows)
    if table.empty or "mean" not in table or table["mean"].isna().all():
        return head + [f"The per-problem records do not hold both arms of any compared pair at two or more "
                       f"seeds' final evaluations: no seeds × problems model.", ""]
    fitted = table.dropna(subset=["mean"])
    if delta is None:
        delta = equivalence_margin(metric, sweep.margins) or (1.0 if scale == 100 else float("nan"))
    var_train = float(fitted["var_train"].median())
    eval_var = float(fitted["eval_var_diff"].median())
    train_c, eval_c = run_costs(tidy, configs, sorted(set(fitted["off"]) | set(fitted["on"])))
    deltas = [delta * m for m in DELTA_MULTIPLES] if np.isfinite(delta) else []
    plans = {d: plan_nk(var_train, eval_var, k0, d, train_c, eval_c) for d in deltas}
    plan = pd.concat([p.assign(delta=d) for d, p in plans.items()], ignore_index=True) if plans else pd.DataFrame()
    fig = None
    if out_dir is not None:
        out = Path(out_dir)
        (out / "figures").mkdir(parents=True, exist_ok=True)
        table.to_csv(out / "seeds_problems.csv", index=False)
        pd.concat([e.assign(comparison=lbl) for lbl, e in effects.items()], ignore_index=True).to_csv(
            out / "problem_effects.csv", index=False)
        plan.assign(k0=k0, var_train=var_train, eval_var=eval_var).to_csv(out / "plan_nk.csv", index=False)
        fig = problems_figure(effects, scale)
        if fig is not None:
            from .figures import save_figure
            save_figure(fig, out / "figures" / "fig_problems", formats)
            fig.clear()
    shown = pd.DataFrame({
        "comparison": fitted["comparison"],
        "seeds × problems": [f"{int(s)} × {int(p)}" for s, p in zip(fitted["seeds"], fitted["problems"])],
        f"μ{unit} [95% t, generalising; df]": [f"{_f(m, 1, True)} [{_f(lo, 1, True)}, {_f(hi, 1, True)}]; {_f(d, 1)}"
                                              for m, lo, hi, d in zip(fitted["mean"], fitted["lo"], fitted["hi"],
                                                                      fitted["df"])],
        f"[95% t, problems fixed]": [f"[{_f(lo, 1, True)}, {_f(hi, 1, True)}]"
                                     for lo, hi in zip(fitted["lo_fixed"], fitted["hi_fixed"])],
        f"SD seed / problem / resid{unit}": [f"{_f(a)} / {_f(b)} / {_f(c)}" for a, b, c in
                                             zip(fitted["sd_seed"], fitted["sd_problem"], fitted["sd_resid"])],
        "eval share [95% χ²]": [f"{_pct(v)} [{_pct(lo)}, {_pct(hi)}]" if np.isfinite(v) else "–"
                                for v, lo, hi in zip(fitted["eval_share"], fitted["eval_share_lo"],
                                                     fitted["eval_share_hi"])],
        "problems differ (F p)": [_f(p, 3) for p in fitted["f_problem_p"]],
        "problems with q ≤ 0.10": fitted["leads"].astype(int).astype(str),
    })
    missing = table[table["mean"].isna()] if "mean" in table else table.iloc[:0]
    lines = head + [f"From the per-problem records of `{metric_short(metric)}` at each run's last {final_k} "
                    f"evaluations ({k0} samples per problem), paired by seed and problem.", "",
                    to_markdown(shown), ""]
    if len(missing):
        lines += ["No model (fewer than two seeds with records in both arms): " +
                  "; ".join(f"{r.comparison} ({int(r.seeds)} seed(s))" for r in missing.itertuples(index=False))
                  + ".", ""]
    carriers = fitted[fitted["f_problem_p"] <= ALPHA]
    for r in carriers.itertuples(index=False):
        e = effects[r.comparison]
        top = e.reindex(e["shrunk"].sub(r.mean / scale).abs().sort_values(ascending=False).index).head(3)
        lines += [f"{r.comparison}: the problems' effects differ (F p = {_f(r.f_problem_p, 3)}; SD of the "
                  f"problem effect {_f(r.sd_problem)}{unit}); largest shrunk effects: " + ", ".join(
                      f"`{t.problem}` {_f(t.shrunk * scale, 1, True)}" for t in top.itertuples(index=False)) + ".", ""]
    if (fitted["eval_share"] > 1).any():
        lines += ["An eval share above 100% means the evaluation noise estimated from the records exceeds the whole "
                  "spread of the per-seed differences: with few seeds the mean square between seeds is itself "
                  "noisy (its χ² range is printed), and the arms of a seed share evaluation draws, which makes "
                  "their noise correlate while their policies are close.", ""]
    if plans:
        unit_cost = "thread-s" if np.isfinite(train_c) else "runs"
        cols = {"k (samples per problem)": [str(k) for k in PLAN_KS],
                f"SD of a per-seed difference{unit}": [_f(v) for v in plans[deltas[0]]["sd"]]}
        for d, p in plans.items():
            cols[f"Δ = {_f(d, 1)}: seeds, total {unit_cost}"] = [
                (f"{int(n)}, {_f(c, 0)}" + (" ←" if ch else "")) if np.isfinite(n) else "–"
                for n, c, ch in zip(p["seeds"], p["cost"], p["cheapest"])]
        lines += [f"**Seeds × samples per problem for 80% power** (the exact sign-flip test at α = 0.05; Δ in "
                  f"multiples of the metric's margin), from the median components over the pairs above: training "
                  f"variance of a per-seed difference {_f(var_train)} and its evaluation noise {_f(eval_var)} at "
                  f"k = {k0} (which scales as {k0}/k){unit and ' (pp²)'}; a run costs {_f(train_c, 0)} training + "
                  f"{_f(eval_c, 0)} evaluation thread-s at k = {k0} (measured: `time/step_s` − `time/eval_s`, and "
                  f"`time/eval_s`, × `train.threads`; evaluation scaled by k/{k0}). Total = seeds × 2 arms × "
                  f"per-run cost; ← the cheapest k for that Δ.", "", to_markdown(pd.DataFrame(cols)), ""]
    if fig is not None:
        lines += ["![problems](figures/fig_problems.png)", ""]
    files = ("Numbers: [seeds_problems.csv](seeds_problems.csv), [problem_effects.csv](problem_effects.csv), "
             "[plan_nk.csv](plan_nk.csv).") if out_dir is not None else ""
    return lines + [SEEDS_PROBLEMS_NOTE + (" " + files if files else ""), ""]
