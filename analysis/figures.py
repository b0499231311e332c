"""The paper's Figures 1–7, redrawn from logged runs.

Each ``figN(tidy, sweep_info, x="grad_step", *, configs=None)`` returns a matplotlib
Figure (Agg canvas, no pyplot state) or None when the sweep has no arms to draw it (e.g.
Fig. 2 needs two arms that differ in Clip-Higher). :func:`render_all` draws every figure
and says why any is missing; :func:`save_figure` writes PNG (150 dpi) and PDF.

Which arms a figure compares is :mod:`analysis.arms`' answer (read from the resolved
configs, never from arm names); metric names and units are :mod:`analysis.metric_names`.

Curves are the mean over seeds with a 95% Student-t band over the seeds that have a value at
that point, none where only one has (:data:`analysis.stats.BAND_METHOD`, :func:`stats.seed_band`).
When the seeds of an arm log a metric at different x for the same rollout step (the grad step of
a rollout step differs between seeds: dynamic sampling, a resumed run), the arm's curve is aligned
by rollout step (:func:`aligned_band`): per run the points of a rollout step are averaged, the band
is over seeds per rollout step, drawn at the mean over seeds of that rollout step's x. Nothing on
a "mean over seeds" line is one seed's value unless the arm has one seed: such points (n = 1) are
drawn as hollow markers off the line, and the figure's note says so.
Accuracies are logged in [0, 1] and drawn in %; a % axis spans the data (curves and bands),
at least :data:`MIN_SPAN_PCT` points, clipped to [0, 100]. A point logged as 0 only because
the quantity is undefined (``metric_names.UNDEFINED_WHEN_ZERO``: no up-clipped token) is
missing, not 0. Each arm keeps one colour in every figure (palette by the arm's position
in the sweep). Saved files carry no timestamps: the same runs give the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from .arms import TOGGLES, arms_with_runs, baseline_arm, dapo_arm, find_pair, flat_arm_configs
from .metric_names import (EVAL_RE, LABELS, NONNEGATIVE, PROBABILITY, X_LABELS, dataset_name, is_paper_metric, mask_undefined, metric_label,
                           metric_scale, metric_short, primary_metric)
from .runs import ArmInfo, SweepInfo, arm_order
from .stats import ALPHA, BAND_METHOD, seed_band

__all__ = ["FigureResult", "aligned_band", "arm_colors", "BAND_METHOD", "BAND_SHORT", "fig1", "fig2", "fig3", "fig4",
           "fig5", "fig6", "fig7", "fig8", "render_all", "save_figure", "STYLE"]

# --------------------------------------------------------------------------- style
# Okabe–Ito, colour-blind safe; yellow last (weak on white).
PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442"]

STYLE = {
    "font.size": 9, "axes.titlesize": 9.5, "axes.labelsize": 9, "legend.fontsize": 8,
    "xtick.labelsize": 8, "ytick.labelsize": 8, "figure.titlesize": 10.5,
    "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True,
    "grid.alpha": 0.25, "grid.linewidth": 0.6, "axes.linewidth": 0.8,
    "lines.linewidth": 1.6, "legend.frameon": False,
    "font.family": "DejaVu Sans", "axes.titlelocation": "left",
}


def arm_colors(tidy: pd.DataFrame | None, sweep: SweepInfo) -> dict[str, str]:
    """A fixed colour per arm, by its position in the sweep (so every figure agrees)."""
    names = [a.name for a in sweep.arms]
    if tidy is not None:
        names += [n for n in arm_order(tidy) if n not in names]
    if len(names) > len(PALETTE):
        cmap = matplotlib.colormaps["tab20"]
        return {n: matplotlib.colors.to_hex(cmap(i % 20)) for i, n in enumerate(names)}
    return {n: PALETTE[i] for i, n in enumerate(names)}


MIN_SPAN_PCT = 4.0
"""The smallest y range (percentage points) of a % axis: a flat curve is not blown up into noise."""
R1_ZERO_AIME = 47.0
"""DeepSeek-R1-Zero-Qwen-32B on AIME 2024 avg@32, the reference line of the paper's Fig. 1."""
BAND_SHORT = "mean over seeds, 95% t band"
"""The short form of :data:`analysis.stats.BAND_METHOD` that figure titles carry."""
SINGLE_SEED_NOTE = ("hollow markers: points where only one seed has a value (n = 1), "
                    "not part of the mean-over-seeds line")
"""What a figure's note says when it draws such points (see :func:`_draw`)."""


# --------------------------------------------------------------------------- aligned curves
def _arms_to_align(tidy: pd.DataFrame, metric: str, x: str) -> list[str]:
    """Arms whose runs log metric at different x for the same rollout step (first-seen order).

    An arm whose runs all have the same x positions is never aligned; nor one whose runs differ
    only in which rollout steps they reached (a shorter run) while agreeing on the x of every
    rollout step they share; nor one with a point of metric without a rollout step (nothing to
    align it by).
    """
    if x == "rollout_step":
        return []
    d = tidy.loc[tidy["metric"] == metric, ["arm", "run", "rollout_step", x]].dropna(subset=[x])
    out = []
    for arm, g in d.groupby("arm", sort=False):
        runs = g["run"].nunique()
        if (g.groupby(x)["run"].nunique() == runs).all() or g["rollout_step"].isna().any():
            continue                          # every run has every x (same positions); or nothing to align by
        # per rollout step, every x of it is in every run that has that rollout step: positions agree
        at_r = g.groupby("rollout_step")["run"].nunique()
        at_rx = g.groupby(["rollout_step", x])["run"].nunique()
        if (at_rx.to_numpy() != at_r.reindex(at_rx.index.get_level_values(0)).to_numpy()).any():
            out.append(arm)
    return out


def _aligned(tidy: pd.DataFrame, metric: str, x: str = "grad_step", *,
             alpha: float = ALPHA) -> tuple[pd.DataFrame, list[str]]:
    """(:func:`aligned_band`'s frame, the arms it aligned by rollout step)."""
    base = seed_band(tidy, metric, x, alpha=alpha)
    need = _arms_to_align(tidy, metric, x)
    if not need:
        return base, []
    by_r = seed_band(tidy, metric, "rollout_step", arms=need, alpha=alpha)
    d = tidy.loc[(tidy["metric"] == metric) & tidy["arm"].isin(need), ["arm", "run", "rollout_step", x, "value"]]
    d = d.dropna(subset=[x]).astype({"rollout_step": "int64"})
    # per run and rollout step: the mean x of its points, and whether it has a value there
    d["has"] = np.isfinite(d["value"].to_numpy(dtype=float))
    pr = d.groupby(["arm", "run", "rollout_step"], sort=False).agg(x=(x, "mean"), has=("has", "any")).reset_index()
    # x of a rollout step: the mean over the seeds with a value there (over all its seeds if none has)
    pr["xw"] = pr["x"].where(pr["has"])
    agg = pr.groupby(["arm", "rollout_step"], sort=False).agg(xw=("xw", "mean"), xa=("x", "mean")).reset_index()
    agg["xm"] = agg["xw"].fillna(agg["xa"])
    by_r = by_r.merge(agg[["arm", "rollout_step", "xm"]], on=["arm", "rollout_step"], how="left", validate="1:1")
    by_r[x] = by_r["xm"].to_numpy(dtype=float)
    cols = list(base.columns)
    frames = []
    for arm in pd.unique(base["arm"]):
        frames.append(by_r.loc[by_r["arm"] == arm, cols] if arm in need else base[base["arm"] == arm])
    out = pd.concat(frames, ignore_index=True)
    return out.astype({x: float}), need


def aligned_band(tidy: pd.DataFrame, metric: str, x: str = "grad_step", *, alpha: float = ALPHA) -> pd.DataFrame:
    """:func:`analysis.stats.seed_band`, with the runs of an arm aligned by rollout step where needed.

    Columns ``[arm, <x>, mean, lo, hi, n]``, like seed_band. An arm whose runs log metric at
    different x for the same rollout step (e.g. evaluations every N rollout steps that fall at
    grad steps 236, 238, 239 in three seeds) gets ``seed_band(tidy, metric, "rollout_step")``'s
    rows (per run the points of a rollout step averaged, the band over seeds per rollout step,
    n = seeds with a value there), in rollout-step order, each at x = the mean over those seeds
    of the x of that rollout step (float). Every other arm keeps seed_band's rows, and when no
    arm needs aligning the result is seed_band's frame itself (so metrics logged several times
    per rollout step are not collapsed while the seeds agree on x).
    """
    return _aligned(tidy, metric, x, alpha=alpha)[0]


# --------------------------------------------------------------------------- drawing context
@dataclass
class _Ctx:
    tidy: pd.DataFrame
    sweep: SweepInfo
    x: str
    configs: dict | None
    acfg: dict = field(default_factory=dict)
    colors: dict = field(default_factory=dict)
    metric: str | None = None
    tag: str = ""
    bands: dict = field(default_factory=dict)      # (metric, x) → (aligned_band frame (all arms), aligned arms)
    scales: dict = field(default_factory=dict)
    metrics: set = field(default_factory=set)
    seeds: dict = field(default_factory=dict)      # arm → number of runs
    drawn: dict = field(default_factory=dict)      # of the figure being drawn: "aligned"/"single" → {arm label}

    def band(self, metric: str, arm: str) -> pd.DataFrame:
        key = (metric, self.x)
        if key not in self.bands:
            self.bands[key] = _aligned(self.tidy, metric, self.x)
        b = self.bands[key][0]
        return b[b["arm"] == arm]

    def aligned(self, metric: str, arm: str) -> bool:
        """Whether arm's curve of metric was aligned by rollout step (:func:`aligned_band`)."""
        self.band(metric, arm)
        return arm in self.bands[(metric, self.x)][1]

    def n_seeds(self, arm: str) -> int:
        if not self.seeds:
            self.seeds = self.tidy.groupby("arm", sort=False)["run"].nunique().to_dict()
        return int(self.seeds.get(arm, 0))

    def drawn_note(self) -> str:
        """What the figure just drawn did beyond a plain mean over seeds (aligned curves, n = 1 points)."""
        parts = []
        if self.drawn.get("aligned"):
            parts.append(f"{_names(self.drawn['aligned'])}: seeds aligned by rollout step (their "
                         f"{X_LABELS[self.x]}s differ), at the mean {X_LABELS[self.x]} over seeds")
        if self.drawn.get("single"):
            parts.append(f"{_names(self.drawn['single'])}: {SINGLE_SEED_NOTE}")
        return "; ".join(parts)

    def scale(self, metric: str) -> float:
        if metric not in self.scales:
            self.scales[metric] = metric_scale(self.tidy, metric)
        return self.scales[metric]


def _names(labels) -> str:
    return ", ".join(f"“{a}”" for a in labels)


def _context(tidy, sweep, x, configs, ctx=None) -> _Ctx:
    if ctx is not None:
        return ctx
    if x not in X_LABELS:
        raise ValueError(f"x = {x!r}: expected one of {', '.join(X_LABELS)}")
    metric = sweep.metric or primary_metric(tidy)
    tag = sweep.title_tag
    if tag is None:
        tag = "" if metric and "/aime24/" in metric else "mini"
    tidy = mask_undefined(tidy)
    return _Ctx(tidy=tidy, sweep=sweep, x=x, configs=configs,
                acfg=flat_arm_configs(tidy, sweep, configs), colors=arm_colors(tidy, sweep),
                metric=metric, tag=tag, metrics=set(tidy["metric"].unique()))


def _new_figure(ncols: int = 1, nrows: int = 1, size: tuple[float, float] | None = None):
    with matplotlib.rc_context(STYLE):
        w, h = size or (4.6 * ncols if ncols > 1 else 5.2, 3.3 * nrows)
        fig = Figure(figsize=(w, h), layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    return fig, list(axes)


def _draw(ctx: _Ctx, ax, metric: str, arm: ArmInfo, *, color=None, label=None, linestyle="-",
          xvalues: pd.Series | None = None) -> bool:
    """Mean over seeds (line) and its band (fill, :data:`BAND_METHOD`) of one arm; False if nothing logged.

    The band of a fraction drawn in % is clipped to [0, 100], a probability's to [0, 1]; a band point with no band on either side
    (it would draw nothing) is dropped, so it does not size the axis.
    In an arm with several seeds, a point only one seed has (n = 1) is not part of the line (a gap,
    as for a point no seed has; it has no band either): it is drawn as a hollow marker (no label),
    and ``ctx.drawn`` records it for the figure's note. A dense line (no markers) marks a point
    left between two gaps, which would otherwise not show.
    """
    b = ctx.band(metric, arm.name)
    if b.empty:
        return False
    s = ctx.scale(metric)
    xv = b[ctx.x].to_numpy(dtype=float) if xvalues is None else np.asarray(xvalues, dtype=float)
    color = color or ctx.colors.get(arm.name, "#333333")
    mean = b["mean"].to_numpy(dtype=float)
    single = (b["n"].to_numpy() == 1) & np.isfinite(mean) if ctx.n_seeds(arm.name) > 1 else np.zeros(len(b), bool)
    line = np.where(single, np.nan, mean)
    if ctx.aligned(metric, arm.name):
        ctx.drawn.setdefault("aligned", {})[arm.label] = None
    lo, hi = b["lo"].to_numpy(dtype=float) * s, b["hi"].to_numpy(dtype=float) * s
    top = 100.0 if s == 100 else (1.0 if metric in PROBABILITY else None)
    if top is not None:                            # a fraction's or a probability's band stays in its range
        lo, hi = np.clip(lo, 0.0, top), np.clip(hi, 0.0, top)
    elif metric in NONNEGATIVE:
        lo = np.maximum(lo, 0.0)
    has = np.isfinite(lo) & np.isfinite(hi)
    lone = has & ~np.r_[False, has[:-1]] & ~np.r_[has[1:], False]  # a band point between gaps draws nothing
    lo, hi = np.where(lone, np.nan, lo), np.where(lone, np.nan, hi)  # ... and must not size the axis
    with matplotlib.rc_context(STYLE):
        ax.fill_between(xv, lo, hi, color=color, alpha=0.18, linewidth=0)
        sparse = len(b) <= 40
        ok = np.isfinite(line)
        alone = ok & ~np.r_[False, ok[:-1]] & ~np.r_[ok[1:], False]      # finite, both neighbours not
        marks = {"marker": "o", "markersize": 3.2} if sparse else (
            {"marker": "o", "markersize": 2.4, "markevery": np.flatnonzero(alone).tolist()} if alone.any()
            else {"marker": None, "markersize": 0})
        ax.plot(xv, line * s, color=color, linestyle=linestyle,
                label=label if label is not None else arm.label, **marks)
        if single.any():
            ax.plot(xv[single], mean[single] * s, linestyle="none", marker="o", markersize=4.5,
                    markerfacecolor="none", markeredgecolor=color, markeredgewidth=1.0, label="_nolegend_")
            ctx.drawn.setdefault("single", {})[arm.label] = None
    if s == 100:
        ax._dapo_percent = True
    return True


def _data_range(ax) -> tuple[float, float] | None:
    """(min, max) of everything drawn on ax: lines, and bands (fill_between); None if nothing finite."""
    parts = [np.asarray(ln.get_ydata(), dtype=float) for ln in ax.get_lines()]
    for c in ax.collections:
        for path in c.get_paths():
            parts.append(np.asarray(path.vertices, dtype=float)[:, 1])
    ys = np.concatenate(parts) if parts else np.zeros(0)
    ys = ys[np.isfinite(ys)]
    return (float(ys.min()), float(ys.max())) if ys.size else None


def _percent_axis(ax) -> None:
    """A % axis spans its data (at least MIN_SPAN_PCT points, 5% margin each side), kept inside [0, 100]."""
    if not getattr(ax, "_dapo_percent", False):
        return
    r = _data_range(ax)
    if r is None:
        return
    lo, hi = r
    if hi - lo < MIN_SPAN_PCT:
        mid = (lo + hi) / 2
        lo, hi = mid - MIN_SPAN_PCT / 2, mid + MIN_SPAN_PCT / 2
    pad = 0.05 * (hi - lo)
    ax.set_ylim(max(lo - pad, -pad), min(hi + pad, 100 + pad))   # a curve at 0 or 100 stays visible


def _empty_panel(ax, text: str) -> None:
    """A panel with nothing to draw says why, in its middle."""
    with matplotlib.rc_context(STYLE):
        ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize=8, color="#555555",
                wrap=True)
        ax.set_yticks([])


def _finish(ctx: _Ctx, fig: Figure, axes, number: int, title: str, *, ylabels, panel_titles=None,
            note: str | None = None, legend_all: bool = False, xlabel: str | None = None) -> Figure:
    with matplotlib.rc_context(STYLE):
        for i, (ax, yl) in enumerate(zip(axes, ylabels)):
            ax.set_xlabel(xlabel or X_LABELS[ctx.x])
            ax.xaxis.set_major_locator(MaxNLocator(nbins="auto", steps=[1, 2, 5, 10], integer=True))
            ax.set_ylabel(yl)
            if panel_titles:
                ax.set_title(panel_titles[i])
            if (legend_all or i == 0) and ax.get_lines():
                ax.legend(loc="best")
            _percent_axis(ax)
            ax.margins(x=0.01)
        tag = f" ({ctx.tag})" if ctx.tag else ""
        fig.suptitle(f"Fig. {number}{tag}: {title}", x=0.01, ha="left", fontweight="bold")
        note = _join_notes(note, ctx.drawn_note())
        if note:
            _footnote(fig, note)
    return fig


def _join_notes(note: str | None, extra: str) -> str | None:
    """note, then extra as a sentence of its own; note unchanged when there is no extra."""
    if not extra:
        return note
    return (note.rstrip().rstrip(".") + ". " if note else "") + extra + "."


def _footnote(fig: Figure, note: str) -> None:
    """A grey note under the panels (constrained layout keeps room for it), wrapped to the figure's width."""
    import textwrap
    width = int(fig.get_figwidth() * 17)          # characters of 7 pt DejaVu Sans per line (≈ 18/inch)
    if len(note) > width:
        note = "\n".join(textwrap.wrap(note, width))
    with matplotlib.rc_context(STYLE):
        fig.supxlabel(note, x=0.01, ha="left", fontsize=7, color="#555555")


def _acc_title(ctx: _Ctx) -> str:
    return f"{metric_short(ctx.metric)} on {dataset_name(ctx.metric)}"


def _pair_figure(ctx: _Ctx, toggle: str, number: int, metrics: list[str], what: str) -> Figure | None:
    pair = find_pair(toggle, ctx.tidy, ctx.sweep, ctx.configs, _acfg=ctx.acfg)
    metrics = [m for m in metrics if m and m in ctx.metrics]
    if pair is None or not metrics:
        return None
    fig, axes = _new_figure(ncols=len(metrics))
    for ax, m in zip(axes, metrics):
        for arm in (pair.off, pair.on):
            _draw(ctx, ax, m, arm)
    letters = "abcdefgh"
    titles = [f"({letters[i]}) " + (_acc_title(ctx) if m == ctx.metric else LABELS.get(m, m).split(" (")[0])
              for i, m in enumerate(metrics)]
    note = None if pair.exact else "Arms also differ in: " + ", ".join(
        [TOGGLES[t].title for t in pair.other_toggles] + list(pair.other_keys))
    return _finish(ctx, fig, axes, number, f"{what}, with vs without {TOGGLES[toggle].title}",
                   ylabels=[metric_label(m, ctx.scale(m)) for m in metrics], panel_titles=titles,
                   note=note, legend_all=True)


# --------------------------------------------------------------------------- the figures
def _fig1(ctx: _Ctx):
    """(a) avg@k of the baseline beside the DAPO arm (the paper: DAPO vs its R1-Zero reference);
    (b) the DAPO arm's avg@k, pass@k and cons@k."""
    arm = dapo_arm(ctx.tidy, ctx.sweep, ctx.configs, _acfg=ctx.acfg)
    if arm is None or not ctx.metric:
        return None, "no eval metric (eval/<dataset>/avg_at_<k>) was logged" if arm else "no runs"
    base = baseline_arm(ctx.tidy, ctx.sweep, ctx.configs, _acfg=ctx.acfg)
    base = None if base is None or base.name == arm.name else base
    g = EVAL_RE.match(ctx.metric)
    names = [f"eval/{g['dataset']}/{kind}_at_{g['k']}" for kind in ("avg", "pass", "cons")]
    names = [m for m in names if m in ctx.metrics]
    fig, axes = _new_figure(ncols=2 if base else 1)
    titles, notes = [], []
    if base:
        for a in (base, arm):
            _draw(ctx, axes[0], ctx.metric, a)
        if is_paper_metric(ctx.metric):
            with matplotlib.rc_context(STYLE):
                axes[0].axhline(R1_ZERO_AIME, color="#777777", linestyle=":", linewidth=1.2,
                                label=f"DeepSeek-R1-Zero-Qwen-32B (paper): {R1_ZERO_AIME:g}")
        titles.append(f"(a) {_acc_title(ctx)}: baseline vs DAPO")
        notes.append(f"(a) “{base.label}” vs “{arm.label}”")
    ax = axes[-1]
    styles = {"avg": "-", "pass": "--", "cons": "-."}
    shades = {"avg": ctx.colors.get(arm.name), "pass": "#444444", "cons": "#999999"}
    for m in names:
        kind = EVAL_RE.match(m)["kind"]
        _draw(ctx, ax, m, arm, color=shades[kind], linestyle=styles[kind], label=metric_short(m))
    titles.append(("(b) " if base else "") + f"“{arm.label}”: " + ", ".join(metric_short(m) for m in names))
    notes.append(("(b) " if base else "") + f"arm “{arm.label}”: " + ", ".join(metric_short(m) for m in names))
    scale = ctx.scale(ctx.metric)
    fig = _finish(ctx, fig, axes, 1, f"{dataset_name(ctx.metric)} accuracy during training "
                  f"({BAND_SHORT})", ylabels=["accuracy (%)" if scale == 100 else "accuracy"] * len(axes),
                  panel_titles=titles, legend_all=True)
    return fig, "; ".join(notes)


def _toggle_note(ctx: _Ctx, toggle: str) -> str:
    pair = find_pair(toggle, ctx.tidy, ctx.sweep, ctx.configs, _acfg=ctx.acfg)
    if pair is None:
        key = TOGGLES[toggle].keys[0]
        values = ", ".join(f"{a.name}: {ctx.acfg[a.name].get(key, 'unknown')}" for a in arms_with_runs(ctx.tidy, ctx.sweep))
        return f"no two arms of this sweep differ in {TOGGLES[toggle].title} ({key} per arm: {values})"
    return pair.describe()


def _missing(ctx: _Ctx, metrics: list[str]) -> str:
    lost = [m for m in metrics if m not in ctx.metrics]
    return ("; metrics not logged: " + ", ".join(lost)) if lost else ""


def _fig2(ctx):
    ms = [ctx.metric, "train/entropy"]
    fig = _pair_figure(ctx, "clip_higher", 2, ms, f"{metric_short(ctx.metric or '')} and entropy")
    return fig, _toggle_note(ctx, "clip_higher") + _missing(ctx, [m for m in ms if m])


def _fig3(ctx):
    ms = ["train/up_clipped_prob_mean", "sampling/all_correct_frac"]
    pair = find_pair("clip_higher", ctx.tidy, ctx.sweep, ctx.configs, _acfg=ctx.acfg)
    present = [m for m in ms if m in ctx.metrics]
    if not present:
        return None, "no metric to draw" + _missing(ctx, ms)
    if pair is not None:
        arms, note = [pair.off, pair.on], _toggle_note(ctx, "clip_higher")
    else:
        arm = dapo_arm(ctx.tidy, ctx.sweep, ctx.configs, _acfg=ctx.acfg)
        arms, note = [arm], f"no Clip-Higher pair; arm “{arm.label}” alone"
    fig, axes = _new_figure(ncols=len(present))
    for ax, m in zip(axes, present):
        for arm in arms:
            _draw(ctx, ax, m, arm)
    up = "train/up_clipped_prob_mean"
    gap = ""
    if up in present:   # masked by metric_names.mask_undefined: a step without up-clipped tokens has no value
        ax = axes[present.index(up)]
        vals = [ctx.band(up, a.name)["mean"].to_numpy(dtype=float) for a in arms]
        n_all, n_none = sum(v.size for v in vals), sum(int(np.isnan(v).sum()) for v in vals)
        if n_all and n_none == n_all:
            xs = np.concatenate([ctx.band(up, a.name)[ctx.x].to_numpy(dtype=float) for a in arms])
            for artist in list(ax.lines) + list(ax.collections):
                artist.remove()
            ax.set_xlim(xs.min(), xs.max())
            _empty_panel(ax, "no token was clipped at 1 + ε_high\nin any step of these arms")
            gap = " (a): no up-clipped token in any step, so nothing to draw."
        elif n_none:
            gap = f" (a): {n_none} of {n_all} points have no up-clipped token and are left out (gaps)."
    titles = [f"({'ab'[i]}) " + LABELS[m].split(" (")[0] for i, m in enumerate(present)]
    fig = _finish(ctx, fig, axes, 3, "up-clipped token probability and all-correct prompts",
                  ylabels=[metric_label(m, ctx.scale(m)) for m in present], panel_titles=titles,
                  legend_all=True, note=gap.strip() or None)
    return fig, note + gap + _missing(ctx, ms)


def _fig4(ctx):
    ms = ["train/entropy", "rollout/response_len_mean"]
    fig = _pair_figure(ctx, "token_loss", 4, ms, "entropy and response length")
    return fig, _toggle_note(ctx, "token_loss") + _missing(ctx, ms)


def _fig5(ctx):
    ms = [ctx.metric, "train/entropy"]
    fig = _pair_figure(ctx, "overlong_filter", 5, ms, f"{metric_short(ctx.metric or '')} and entropy")
    return fig, _toggle_note(ctx, "overlong_filter") + _missing(ctx, [m for m in ms if m])


def _fig8(ctx):
    """Not in the paper (it shows no figure for the soft punishment alone): what the punishment
    does to length and truncation, and what that costs in accuracy."""
    ms = ["rollout/response_len_mean", "rollout/truncated_frac", ctx.metric]
    fig = _pair_figure(ctx, "soft_punish", 8, ms, "length, truncation and accuracy")
    return fig, "Not in the paper. " + _toggle_note(ctx, "soft_punish") + _missing(ctx, [m for m in ms if m])


def _cum_tokens_at(ctx: _Ctx, arm: ArmInfo, xs: np.ndarray) -> np.ndarray:
    """Mean over seeds of the generated tokens up to each x (sampling/gen_tokens, cumulative)."""
    d = ctx.tidy[(ctx.tidy["metric"] == "sampling/gen_tokens") & (ctx.tidy["arm"] == arm.name)]
    d = d.dropna(subset=[ctx.x]).sort_values(["run", ctx.x])
    cols = []
    for _, g in d.groupby("run", sort=False):
        steps = g[ctx.x].to_numpy(dtype=float)
        cum = np.cumsum(g["value"].to_numpy(dtype=float))
        i = np.searchsorted(steps, xs, side="right") - 1
        cols.append(np.where(i >= 0, cum[np.clip(i, 0, None)], 0.0))
    return np.mean(cols, axis=0) if cols else np.full(len(xs), np.nan)


def _fig6(ctx):
    note = _toggle_note(ctx, "dynamic_sampling") + _missing(ctx, [ctx.metric] if ctx.metric else [])
    pair = find_pair("dynamic_sampling", ctx.tidy, ctx.sweep, ctx.configs, _acfg=ctx.acfg)
    if pair is None or not ctx.metric or ctx.metric not in ctx.metrics:
        return None, note
    tokens = "sampling/gen_tokens" in ctx.metrics
    fig, axes = _new_figure(ncols=2 if tokens else 1)
    for arm in (pair.off, pair.on):
        _draw(ctx, axes[0], ctx.metric, arm)
        if tokens:
            xs = ctx.band(ctx.metric, arm.name)[ctx.x].to_numpy(dtype=float)
            _draw(ctx, axes[1], ctx.metric, arm, xvalues=_cum_tokens_at(ctx, arm, xs) / 1e6)
    ylabel = metric_label(ctx.metric, ctx.scale(ctx.metric))
    differ = None if pair.exact else "Arms also differ in: " + ", ".join(
        [TOGGLES[t].title for t in pair.other_toggles] + list(pair.other_keys))
    fig = _finish(ctx, fig, axes[:1], 6, f"{metric_short(ctx.metric)}, with vs without dynamic sampling",
                  ylabels=[ylabel], panel_titles=[f"(a) {_acc_title(ctx)} per step"] if tokens else
                  [_acc_title(ctx)], note=differ)
    if tokens:
        with matplotlib.rc_context(STYLE):
            ax = axes[1]
            ax.set_xlabel("generated tokens (millions, cumulative)")
            ax.set_ylabel(ylabel)
            ax.set_title(f"(b) {_acc_title(ctx)} per generated token")
            ax.legend(loc="best")
            _percent_axis(ax)
            ax.margins(x=0.01)
    return fig, note


def _fig7(ctx):
    arm = dapo_arm(ctx.tidy, ctx.sweep, ctx.configs, _acfg=ctx.acfg)
    ms = ["rollout/response_len_mean", "rollout/reward_mean", "train/entropy", "train/token_prob_mean"]
    present = [m for m in ms if m in ctx.metrics]
    if arm is None or not present:
        return None, ("no runs" if arm is None else "no metric to draw") + _missing(ctx, ms)
    fig, axes = _new_figure(ncols=2, nrows=2, size=(9.2, 6.2))
    for ax, m in zip(axes, present):
        _draw(ctx, ax, m, arm)
    for ax in axes[len(present):]:
        ax.set_visible(False)
    titles = [f"({'abcd'[i]}) " + LABELS[m].split(" (")[0] for i, m in enumerate(present)]
    fig = _finish(ctx, fig, axes[:len(present)], 7, f"training dynamics of “{arm.label}”",
                  ylabels=[metric_label(m, ctx.scale(m)) for m in present], panel_titles=titles)
    return fig, f"arm “{arm.label}”" + _missing(ctx, ms)


_IMPL = {"fig1": _fig1, "fig2": _fig2, "fig3": _fig3, "fig4": _fig4, "fig5": _fig5,
         "fig6": _fig6, "fig7": _fig7, "fig8": _fig8}
TITLES = {
    "fig1": "accuracy of the baseline beside the DAPO arm, and the DAPO arm's avg@k, pass@k, cons@k",
    "fig2": "accuracy and entropy, with vs without Clip-Higher",
    "fig3": "up-clipped token probability and prompts with accuracy 1",
    "fig4": "entropy and response length, with vs without token-level loss",
    "fig5": "accuracy and entropy, with vs without overlong filtering",
    "fig6": "accuracy, with vs without dynamic sampling",
    "fig7": "response length, reward, entropy and token probability of the DAPO arm",
    "fig8": "response length, truncation and accuracy, with vs without the soft overlong punishment (ours)",
}


def _render(ctx: _Ctx, name: str) -> tuple[Figure | None, str]:
    """(figure, note) of one figure; the note says which curves were aligned by rollout step and
    which points only one seed has (drawn off the mean line), as the figure's footnote does."""
    ctx.drawn = {}
    fig, note = _IMPL[name](ctx)
    extra = ctx.drawn_note() if fig is not None else ""
    ctx.drawn = {}
    return fig, _join_notes(note, extra)


def _public(name: str):
    def f(tidy: pd.DataFrame, sweep_info: SweepInfo, x: str = "grad_step", *,
          configs: dict | None = None) -> Figure | None:
        return _render(_context(tidy, sweep_info, x, configs), name)[0]
    f.__name__ = name
    f.__doc__ = f"Paper Fig. {name[3:]}: {TITLES[name]}. A Figure, or None if the sweep cannot show it."
    return f


fig1, fig2, fig3, fig4, fig5, fig6, fig7, fig8 = (_public(f"fig{i}") for i in range(1, 9))


@dataclass
class FigureResult:
    name: str                 # "fig2"
    title: str                # what the paper figure shows
    figure: Figure | None     # None: not drawable from this sweep
    note: str                 # which arms, or why it is missing


def render_all(tidy: pd.DataFrame, sweep_info: SweepInfo, x: str = "grad_step", *,
               configs: dict | None = None) -> list[FigureResult]:
    """Every figure, sharing one context (bands computed once per metric)."""
    ctx = _context(tidy, sweep_info, x, configs)
    out = []
    for name in _IMPL:
        fig, note = _render(ctx, name)
        out.append(FigureResult(name, TITLES[name], fig, note))
    return out


_NO_DATE = {"pdf": {"CreationDate": None}, "svg": {"Date": None}, "ps": {"CreationDate": None},
            "eps": {"CreationDate": None}}
"""Per format, the savefig metadata that drops the file's timestamp (PNG has none by default)."""


def save_figure(fig: Figure, path_stem: str | Path, formats: tuple[str, ...] = ("png", "pdf")) -> list[Path]:
    """Write ``<stem>.png`` (150 dpi) and ``<stem>.pdf`` (or the given formats); returns the paths.

    No file carries a timestamp or a random id (PDF/PS without CreationDate, SVG without Date
    and with a fixed hash salt), so the same figure gives the same bytes every time.
    """
    stem = Path(path_stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix("." + f) for f in formats]
    with matplotlib.rc_context({**STYLE, "svg.hashsalt": "dapo-lab"}):
        engine = fig.get_layout_engine()
        try:
            for i, p in enumerate(paths):
                fig.savefig(p, dpi=150, facecolor="white",   # the first save lays out (constrained)
                            metadata=_NO_DATE.get(p.suffix.lstrip(".").lower()))
                if i == 0:
                    fig.set_layout_engine("none")            # later formats reuse those positions
        finally:
            fig.set_layout_engine(engine)
    return paths


def passk_figure(curves: pd.DataFrame, sweep: SweepInfo, tidy: pd.DataFrame | None = None) -> Figure | None:
    """pass@k (%) over k (log2 axis) per arm at the runs' last evaluation, mean over seeds with its 95%
    t band, from :func:`analysis.samples.passk_curves`; None when there is no curve."""
    if curves is None or curves.empty:
        return None
    colors, labels = arm_colors(tidy, sweep), {a.name: a.label for a in sweep.arms}
    fig, axes = _new_figure(size=(5.2, 3.4))
    ax = axes[0] if isinstance(axes, (list, tuple, np.ndarray)) else axes
    with matplotlib.rc_context(STYLE):
        for arm in dict.fromkeys(curves["arm"]):
            c = curves[curves["arm"] == arm].sort_values("k")
            color = colors.get(arm, "#333333")
            ax.plot(c["k"], 100 * c["mean"], marker="o", ms=3, color=color, label=labels.get(arm, arm))
            if np.isfinite(c["lo"].to_numpy(dtype=float)).any():
                ax.fill_between(c["k"], 100 * c["lo"], 100 * c["hi"], color=color, alpha=0.12, lw=0)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(curves["k"].unique()), [str(k) for k in sorted(curves["k"].unique())])
        ax.set_xlabel("k (samples per problem)")
        ax.set_ylabel("pass@k (%)")
        ax.set_title(f"pass@k at the last evaluation ({BAND_SHORT})")
        ax.legend(loc="lower right")
    return fig
