"""One command from logged runs to a results folder: figures, Table 1, comparisons, report.md.

    dapo figures sweeps/table1-mini.yaml                  # MLflow at runs/mlruns.db → runs/figures/table1-mini/
    dapo figures sweeps/table1-mini.yaml --runs runs/table1-mini --to results/table1-mini   # publish
    dapo figures sweeps/table1-mini.yaml --from-snapshot  # results/table1-mini/snapshot → results/table1-mini/
    python -m analysis.report --tracking-uri sqlite:///runs/mlruns.db --sweep table1-mini
    python -m analysis.report --from-snapshot results/table1-mini/snapshot   (no sweep file needed)

Two directories, two names: ``--runs DIR`` is where the sweep's runs are (its output root,
holding ``mlruns.db``); ``--to DIR`` is where the figures go. (``--output`` and ``--out``,
the old spellings, still work and say so.)

Where the files go by default:

- from MLflow: ``<runs>/figures/<sweep>/``, beside the runs and out of git. The committed
  ``results/<sweep>/`` is rewritten only when asked (``--to results/<sweep>``): fresh runs
  should not silently replace published numbers.
- ``--from-snapshot``: the folder holding the snapshot (``results/<sweep>/`` for the
  default one). That rewrites what the snapshot made, with the same bytes when neither the
  snapshot nor the code changed: figures carry no timestamps and the report's "generated"
  line is the snapshot's creation time, not the clock.

writes::

    snapshot/   runs.parquet configs.json sweep.json meta.json   (only when reading MLflow)
                problems.parquet   (also, when the runs' eval_records/ are under --runs: per-problem outcomes)
    figures/    fig1..fig7 .png + .pdf (a figure the sweep cannot show is listed, not drawn)
    table1.md table1.csv table1.tex family.csv eval_noise.csv compare.md cost.csv mechanisms.csv learning.csv
    gain.csv, figures/fig_gain.*   only when DAPO vs GRPO is run in two or more settings (analysis.gain)
    mismatch.csv, figures/fig_mismatch.*   only when the runs logged mismatch/* (analysis.behaviour)
    report.md
    reading.md  the human-written reading; never overwritten unless a new one is given
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from dapo.sweep.declaration import read_declarations

from .behaviour import behaviour_section, mismatch_figure, mismatch_table
from .gain import GAIN_NOTE, format_gain, gain_figure, gain_table
from .mechanisms import MECHANISMS_NOTE, format_mechanisms, mechanism_table
from .learning import LEARNING_NOTE, format_learning, learning_table
from .arms import TOGGLES, arms_with_runs, dapo_arm, find_pair, flat_arm_configs, infer_sweep_info
from .declared import declaration_sentence
from .eval_noise import noise_section, noise_table, problems_from_runs, start_mismatches, start_section
from .seeds_problems import seeds_problems_section
from .samples import load_samples, passk_section, passk_curves, samples_from_runs, samples_section
from .runs import (SnapshotError, SweepInfo, load_problems, load_runs, load_snapshot, merge_snapshot, read_meta, run_times,
                   snapshot, spec_runs, store_problem)
from .metric_names import primary_metric
from .stats import BAND_METHOD
from .curves import curves_section
from .findings import what_this_shows
from .matched import MATCHED_NOTE, format_matched, matched_table
from .tables import (COST_NOTE, compare_table, cost_ledger, decidable_note, decision_rule, family_table, format_cost,
                     format_family, format_table1, loop_seconds, paired_line, table1, table1_footnote, to_csv, to_latex,
                     to_markdown)

__all__ = ["write_report", "main"]

UNPLANNED_NOTE = ("**Unplanned look.** These runs hold more pairs than the declared stopping rule's last look; "
                  "the extra pairs are tested with the whole α already spent, and each verdict they touch is "
                  "marked \"(unplanned look)\".")
_NO_READING = ("_No reading yet. Write one in `reading.md` next to this file (or pass `reading=`); "
               "it is kept when the report is regenerated._")


def _pair_md(tidy, off, on, metric: str | None, final_k: int, cost: pd.DataFrame, configs, sweep) -> list[str]:
    """One pair's section body: the paired line on the sweep's metric, the two arms' cost, every metric."""
    out = [paired_line(tidy, off, on, metric, final_k, configs=configs, sweep=sweep)] if metric else []
    two = cost[cost["arm"].isin([off.name, on.name])]
    if len(two):
        two = two.set_index("arm").loc[[a for a in (off.name, on.name) if a in set(two["arm"])]].reset_index()
        two.attrs.update(cost.attrs)
        out += ["Cost (per run, mean over seeds; see report.md's cost ledger for what is counted):\n",
                to_markdown(format_cost(two))]
    out.append(to_markdown(compare_table(tidy, off.name, on.name, final_k=final_k)))
    return out


def _compare_md(tidy, configs, sweep: SweepInfo, final_k: int) -> str:
    acfg = flat_arm_configs(tidy, sweep, configs)
    metric = sweep.metric or primary_metric(tidy)
    cost = cost_ledger(tidy, sweep, configs, metric=metric, final_k=final_k)
    parts = [f"# {sweep.name}: arm-vs-arm comparison\n",
             f"Final value per run = mean of its last {final_k} logged points; mean over seeds. "
             "`diff` = second arm − first arm. Accuracies and fractions in %. "
             "`paired_diff` [`paired_lo`, `paired_hi`]: the same difference paired by seed (seeds both arms "
             "ran), with its interval's `level` and `method` (exact sign-flip interval up to 16 pairs); `p`: "
             "two-sided exact sign-flip test of the paired mean difference (all 2^n flips); `n_pairs`: seeds in "
             "both arms. **Exploratory**: every p here is unadjusted over the many rows (about one in twenty "
             "metrics with no effect at all shows p ≤ 0.05); the findings are the primary family's, in "
             "report.md.\n"]
    seen = set()
    for t in TOGGLES:
        p = find_pair(t, tidy, sweep, configs, _acfg=acfg)
        if p is None or (p.off.name, p.on.name) in seen:
            continue
        seen.add((p.off.name, p.on.name))
        parts += [f"## {TOGGLES[t].title}: {p.off.label} → {p.on.label}\n", p.describe() + "\n",
                  *_pair_md(tidy, p.off, p.on, metric, final_k, cost, configs, sweep)]
    arms = arms_with_runs(tidy, sweep)
    full = dapo_arm(tidy, sweep, configs, _acfg=acfg)
    if arms and full is not None and arms[0].name != full.name and (arms[0].name, full.name) not in seen:
        parts += [f"## First arm vs DAPO arm: {arms[0].label} → {full.label}\n",
                  *_pair_md(tidy, arms[0], full, metric, final_k, cost, configs, sweep)]
    if len(parts) == 2:
        parts.append("_Fewer than two arms: nothing to compare._\n")
    return "\n".join(parts)


def _runs_md(tidy: pd.DataFrame, sweep: SweepInfo) -> str:
    per = tidy.groupby(["arm", "run"], sort=False).agg(
        seed=("seed", "first"), grad=("grad_step", "max")).reset_index()
    loop = loop_seconds(tidy)
    rows = []
    for arm in arms_with_runs(tidy, sweep):
        g = per[per["arm"] == arm.name]
        rows.append({"arm": arm.label, "seeds": ", ".join(str(s) for s in sorted(g["seed"])),
                     "last grad step (min–max)": f"{g['grad'].min()}–{g['grad'].max()}",
                     "loop (min, sum over seeds)": f"{g['run'].map(loop).sum() / 60:.1f}"})
    missing = [a.label for a in sweep.arms if a.name not in set(per["arm"])]
    text = to_markdown(pd.DataFrame(rows))
    if missing:
        text += "\nArms of the sweep with no runs yet: " + ", ".join(missing) + "\n"
    return text


def write_report(tidy: pd.DataFrame, configs: dict, sweep_info: SweepInfo | None, out_dir, *,
                 x: str = "grad_step", final_k: int = 3, reading: str | None = None,
                 meta: dict | None = None, formats: tuple[str, ...] = ("png", "pdf"),
                 problems: pd.DataFrame | None = None, samples: pd.DataFrame | None = None) -> list[Path]:
    """Write figures, tables, compare.md and report.md into out_dir; return the written paths.

    ``reading``: a human-written interpretation. Given, it is saved to ``reading.md``; not
    given, an existing ``reading.md`` is kept and embedded. ``formats``: figure files to
    write (the report links the PNG, and the PDF when written). ``problems``: per-problem outcomes
    (:func:`analysis.runs.load_problems`) for the evaluation-noise section's records-based numbers and
    the pass@k curves; ``samples``: the responses shown (:mod:`analysis.samples`).
    """
    from .figures import passk_figure, render_all, save_figure  # here: matplotlib only when figures are drawn
    out = Path(out_dir)
    (out / "figures").mkdir(parents=True, exist_ok=True)
    sweep = sweep_info or infer_sweep_info(tidy, configs)
    written: list[Path] = []

    results = render_all(tidy, sweep, x, configs=configs)
    for r in results:
        if r.figure is not None:
            written += save_figure(r.figure, out / "figures" / r.name, formats)

    curves = passk_curves(problems, sweep.metric or primary_metric(tidy), [a.name for a in arms_with_runs(tidy, sweep)])
    pfig = passk_figure(curves, sweep, tidy)
    if pfig is not None:
        written += save_figure(pfig, out / "figures" / "fig_passk", formats)
        pfig.clear()
    else:
        for old in (out / "figures").glob("fig_passk.*"):   # from an earlier report with records
            old.unlink()
    fam = family_table(tidy, sweep, configs, final_k)
    written.append(to_csv(fam, out / "family.csv"))
    noise = noise_table(tidy, sweep, configs, final_k, family=fam, problems=problems)
    written.append(to_csv(noise, out / "eval_noise.csv"))
    t1 = table1(tidy, sweep, final_k=final_k, configs=configs, family=fam)
    shown = format_table1(t1)
    footnote = table1_footnote(t1)
    (out / "table1.md").write_text(to_markdown(shown) + "\n" + footnote + "\n")
    written.append(out / "table1.md")
    written.append(to_csv(t1, out / "table1.csv"))
    caption = (f"{sweep.name}: final {t1.attrs.get('metric')} (mean of the last {final_k} evaluations "
               f"per seed; 95% Student-t interval over seeds) vs the paper. Δ vs previous arm: paired by seed, "
               f"exact sign-flip interval; p: exact paired sign-flip test, Holm-adjusted over the primary family "
               f"of {t1.attrs.get('m', 0)}; seeds for the paper's Δ at 80% power.")
    to_latex(shown, out / "table1.tex", caption=caption, label=f"tab:{sweep.name}")
    written.append(out / "table1.tex")
    (out / "compare.md").write_text(_compare_md(tidy, configs, sweep, final_k))
    written.append(out / "compare.md")
    cost = cost_ledger(tidy, sweep, configs, metric=t1.attrs.get("metric"), final_k=final_k)
    written.append(to_csv(cost, out / "cost.csv"))
    mech = mechanism_table(tidy, sweep, configs)
    written.append(to_csv(mech, out / "mechanisms.csv"))
    gain = gain_table(tidy, sweep, configs, final_k)
    if len(gain):
        written.append(to_csv(gain, out / "gain.csv"))
        gfig = gain_figure(gain, tidy, sweep, configs, final_k)
        written += save_figure(gfig, out / "figures" / "fig_gain", formats)
        gfig.clear()
    behaviour = mismatch_table(tidy, sweep)
    mfig = mismatch_figure(tidy, sweep, configs) if len(behaviour) else None
    if len(behaviour):
        written.append(to_csv(behaviour, out / "mismatch.csv"))
    if mfig is not None:
        written += save_figure(mfig, out / "figures" / "fig_mismatch", formats)
        mfig.clear()
    else:
        for old in (out / "figures").glob("fig_mismatch.*"):   # from an earlier report of these runs
            old.unlink()
    learn = learning_table(tidy, sweep, final_k=final_k)
    written.append(to_csv(learn, out / "learning.csv"))
    ceiling = curves_section(tidy, sweep, configs, out, formats=formats)
    crossed = seeds_problems_section(tidy, sweep, configs, problems, out, final_k=final_k, formats=formats)
    unit = " points" if float(fam.attrs.get("scale", 1.0)) == 100.0 else ""
    matched = matched_table(tidy, fam, fam.attrs.get("metric"), configs, final_k, float(fam.attrs.get("scale", 1.0)))
    written.append(to_csv(matched, out / "matched.csv"))

    reading_path = out / "reading.md"
    if reading is not None:
        reading_path.write_text(reading.rstrip() + "\n")
        written.append(reading_path)
    reading_text = reading_path.read_text().strip() if reading_path.exists() else _NO_READING

    meta = meta or {}
    arm_names = [a.name for a in arms_with_runs(tidy, sweep)]
    labels = {a.name: a.label for a in arms_with_runs(tidy, sweep)}
    vs_paper = bool(t1.attrs.get("vs_paper"))
    paper_note = ("Paper: Qwen2.5-32B base, AIME 2024 avg@32, the same metric as ours; "
                  "`ours − paper` is their difference." if vs_paper else
                  f"The paper's values are its own (Qwen2.5-32B base, AIME 2024 avg@32), shown for reference "
                  f"only: this sweep measures `{t1.attrs.get('metric')}`, so no difference is computed.")
    lines = [f"# {sweep.name}: DAPO vs GRPO ablation report", "",
             f"- sweep kind: {sweep.kind}; arms: {len(arms_with_runs(tidy, sweep))}; runs: {tidy['run'].nunique()}",
             f"- x axis: {'gradient step' if x == 'grad_step' else 'rollout step'}; final = mean of the last {final_k} evaluations of "
             f"`{t1.attrs.get('metric')}`",
             "- generated from the runs as snapshotted " + (meta.get("created") or "(no snapshot date)")
             + (f" from {meta['mlflow_uri']}" if meta.get("mlflow_uri") else "")
             + (f"; analysis commit {meta['commit']}" if meta.get("commit") else "")
             + (f"; report regenerated from that snapshot at commit {meta['report_commit']}"
                if meta.get("report_commit") not in (None, meta.get("commit")) else "")
             + "".join(f"; plus {m['n_runs']} runs from the snapshot of {m.get('created')} (commit {m.get('commit')})"
                       for m in meta.get("merged") or []),
             "", *start_section(start_mismatches(tidy, configs, t1.attrs.get("metric")), t1.attrs.get("metric")),
             declaration_sentence(meta.get("declarations") or [], meta.get("run_times") or {},
                                  sorted(set(tidy["run_id"]))), "",
             *([UNPLANNED_NOTE, ""] if fam.attrs.get("unplanned") else []),
             *what_this_shows(fam, matched, {"mechanisms": mech, "learning": learn, "equal compute": matched}, unit),
             decision_rule(int(fam.attrs.get("m", len(fam))), declared=bool(sweep.family),
                           stopping=fam.attrs.get("stopping")), "",
             *([note, ""] if (note := decidable_note(int(fam.attrs.get("m", len(fam))),
                                                     int(fam["n"].min()) if len(fam) else 0)) else []),
             "## The primary family", "",
             to_markdown(format_family(fam)) if len(fam) else "Fewer than two arms with runs: no comparison.",
             "Numbers: [family.csv](family.csv). TOST ±m: the metric's declared equivalence margin "
             "(analysis/metric_names.py). Seeds: paired seeds at which the exact sign-flip test has 80% power "
             "for the paper's Δ at α/m, at the measured SD (in parentheses: at the ends of the SD's 95% "
             "χ² interval).", "",
             *(["### The same comparisons at equal compute", "", to_markdown(format_matched(matched)),
                MATCHED_NOTE + " Numbers: [matched.csv](matched.csv).", ""] if len(matched) else []),
             *noise_section(noise),
             "## Table 1", "", to_markdown(shown),
             paper_note + " Ours: see the sweep config.", "",
             footnote, "",
             "Files: [table1.csv](table1.csv), [table1.tex](table1.tex), "
             "[arm-vs-arm comparison](compare.md).", "",
             *passk_section(curves, labels),
             *([f"![pass@k](figures/fig_passk.png)", ""] if pfig is not None else []),
             *(["## Does DAPO's gain hold in every setting?", "", to_markdown(format_gain(gain)),
                GAIN_NOTE + " Numbers: [gain.csv](gain.csv).", "", "![gain](figures/fig_gain.png)", ""]
               if len(gain) else []),
             "## Do the mechanisms act?", "",
             to_markdown(format_mechanisms(mech)) if len(mech) else "No mechanism metric in these runs.",
             MECHANISMS_NOTE + " Numbers: [mechanisms.csv](mechanisms.csv).", "",
             *behaviour_section(behaviour, labels, mfig is not None),
             "## Does the policy learn?", "",
             to_markdown(format_learning(learn)) if len(learn) else "No evaluation or rollout reward in these runs.",
             LEARNING_NOTE + " Numbers: [learning.csv](learning.csv).", "",
             *ceiling, *crossed,
             "## Cost ledger", "", to_markdown(format_cost(cost)), COST_NOTE + " Numbers: [cost.csv](cost.csv).", "",
             *samples_section(samples, labels, arm_names),
             "## Runs", "", _runs_md(tidy, sweep), "## Figures", "",
             f"Curves: {BAND_METHOD}.", ""]
    for r in results:
        number = r.name[3:]
        lines.append(f"### Fig. {number}: {r.title}")
        lines.append("")
        if r.figure is not None:
            pdf = f" ([PDF](figures/{r.name}.pdf))" if "pdf" in formats else ""
            lines += [f"![Fig. {number}](figures/{r.name}.png)", "", f"{r.note}{pdf}", ""]
        else:
            lines += [f"Not drawn: {r.note}", ""]
    lines += ["## Reading", "", reading_text, ""]
    (out / "report.md").write_text("\n".join(lines))
    written.append(out / "report.md")
    for r in results:  # release figure memory
        if r.figure is not None:
            r.figure.clear()
    return written


def _git_commit() -> str:
    """The commit of the code writing the report: HEAD, with ``-dirty`` when a tracked file under
    ``analysis/`` or ``dapo/`` differs from it (the report then comes from code no commit holds)."""
    try:
        root = Path(__file__).resolve().parent.parent
        git = lambda *a: subprocess.run(["git", *a], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()
        sha = git("rev-parse", "HEAD")
        if sha and git("status", "--porcelain", "--untracked-files=no", "--", "analysis", "dapo"):
            sha += "-dirty"
        return sha or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


DEPRECATED = {"--output": "--runs", "--out": "--to"}
"""Old option spellings → their names now (they still work, with one line saying so)."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dapo figures", description=(
        "Regenerate the paper's figures and Table 1 from MLflow runs or a results snapshot. "
        "--runs says where the runs are, --to where the figures go."))
    p.add_argument("spec", nargs="?", help="the sweep YAML (sweeps/NAME.yaml): arms, labels, paper values; "
                   "without it the arms are inferred from the runs' tags")
    p.add_argument("--tracking-uri", default=None,
                   help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///<runs>/mlruns.db)")
    p.add_argument("--runs", default=None, metavar="DIR",
                   help="where the runs are: the sweep's output root, holding mlruns.db (default: runs)")
    p.add_argument("--sweep", help="sweep name = MLflow experiment name (default: the spec's name); with a SPEC of "
                        "another name, the SPEC's runs that sweep launched (the same run ids), e.g. the arms two "
                        "sweeps share")
    p.add_argument("--from-snapshot", nargs="?", const="", metavar="DIR",
                   help="read a results snapshot instead of MLflow (no DIR: results/<sweep>/snapshot)")
    p.add_argument("--to", metavar="DIR", default=None,
                   help="where the figures, tables and report go (default: from MLflow <runs>/figures/<sweep>/, "
                        "out of git; from a snapshot, the folder that holds it)")
    p.add_argument("--output", dest="runs_old", metavar="DIR", help=argparse.SUPPRESS)   # old name of --runs
    p.add_argument("--out", dest="to_old", metavar="DIR", help=argparse.SUPPRESS)        # old name of --to
    p.add_argument("--x", choices=["grad_step", "rollout_step"], default="grad_step",
                   help="x axis of the curves (default: grad_step, as in the paper)")
    p.add_argument("--final-k", type=int, default=None,
                   help="final value = mean of the last K evaluations (default: the sweep's, else 3)")
    p.add_argument("--formats", default="png,pdf", help="figure formats, comma-separated (default: png,pdf)")
    p.add_argument("--reading", metavar="FILE", help="a markdown file with the human reading to embed")
    p.add_argument("--no-snapshot", action="store_true", help="do not write a snapshot when reading MLflow")
    p.add_argument("--with-snapshot", action="append", default=[], metavar="DIR",
                   help="also take the runs of an earlier snapshot that the store does not have (by run id): a "
                        "sweep extended with more seeds whose first seeds ran elsewhere (repeatable; recorded in "
                        "meta.json's 'merged')")
    p.add_argument("--finished-only", action="store_true",
                   help="only runs that have finished (a sweep still running: its partial runs left out)")
    return p


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse, folding the old spellings into --runs/--to (one line each on stderr; both given: an error)."""
    args = parser.parse_args(argv)
    for old, new, dest in (("--output", "--runs", "runs"), ("--out", "--to", "to")):
        value = getattr(args, dest + "_old")
        if value is None:
            continue
        if getattr(args, dest) is not None:
            parser.error(f"{old} is the old name of {new}: give one of them")
        print(f"[figures] {old} is deprecated: use {new} {value}", file=sys.stderr)
        setattr(args, dest, value)
    args.runs = args.runs or "runs"
    return args


def _spec_sweep_info(path: str) -> SweepInfo:
    """SweepInfo from a sweep YAML, via the sweep module (imported only here)."""
    from dapo.sweep.spec import sweep_info  # noqa: WPS433 (lazy: keeps analysis independent of dapo)
    return SweepInfo.from_dict(sweep_info(path))


def _spec_run_arms(path: str) -> dict[str, str]:
    """{run_id: arm} of a sweep YAML's expansion (the runs that belong to it, whoever launched them)."""
    from dapo.sweep.spec import expand  # noqa: WPS433 (lazy, as _spec_sweep_info)
    return {j.run_id: j.arm for j in expand(path, "runs")}


class InputError(Exception):
    """A bad input of ``dapo figures``: one line on stderr, exit code 2."""


def main(argv: list[str] | None = None, *, sweep_info: SweepInfo | None = None) -> int:
    """CLI entry (``dapo figures``); ``sweep_info`` lets a caller pass an already parsed sweep.

    A bad input (spec, snapshot, store, sweep name) is one line on stderr and exit code 2."""
    from dapo.store_checks import write_problem
    try:
        return _main(argv, sweep_info)
    except InputError as exc:
        print(f"dapo figures: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:       # a full disk, or a directory that turned read-only: the machine, status 1
        args = _parse(build_parser(), list(sys.argv[1:] if argv is None else argv))
        problem = write_problem(exc, into=args.to or "the figures' directory")
        if problem is None:
            raise
        print(f"dapo figures: error: {problem}; the figures there may be incomplete: free space (or make it "
              f"writable) and run the same command again", file=sys.stderr)
        return 1


def _problems(runs_dir: str, tidy: pd.DataFrame, earlier: list) -> pd.DataFrame | None:
    """Per-problem outcomes of the runs in ``tidy``: from their eval_records/ under ``runs_dir``, plus the
    rows of earlier snapshots (``--with-snapshot``) for runs that have none on disk; None if nobody has any."""
    found = problems_from_runs(runs_dir, tidy)
    parts = [found] if found is not None else []
    have = set(found["run"]) if found is not None else set()
    for old in earlier:
        if old is not None:
            add = old[old["run"].isin(set(tidy["run"]) - have)]
            parts.append(add)
            have |= set(add["run"])
    parts = [p for p in parts if len(p)]
    if not parts:
        return None
    print(f"[figures] per-problem records of {len(have)} runs", file=sys.stderr)
    out = pd.concat(parts, ignore_index=True)
    runs = tidy.drop_duplicates("run").set_index("run")
    return out.assign(arm=out["run"].map(runs["arm"]), seed=out["run"].map(runs["seed"]))  # the arms as merged


def _load_runs(uri: str, name: str, finished_only: bool):
    """:func:`load_runs`, with MLflow's HTTP retries bounded (2, not 7 over ~4 minutes) and a store
    that fails while being read reported as one line."""
    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import SQLAlchemyError
    from dapo.yaml_io import redact
    var = "MLFLOW_HTTP_REQUEST_MAX_RETRIES"
    old = os.environ.get(var)
    os.environ.setdefault(var, "2")
    try:
        return load_runs(uri, name, finished_only=finished_only)
    except ValueError as exc:                 # no such experiment: the message lists the ones there
        raise InputError(str(exc)) from None
    except (MlflowException, SQLAlchemyError, OSError) as exc:
        first = " ".join(str(getattr(exc, "orig", None) or exc).split())[:300]
        raise InputError(f"tracking store {redact(uri)} could not be read ({type(exc).__name__}: "
                         f"{redact(first)})") from None
    finally:
        if old is None:
            os.environ.pop(var, None)


def _writable(out: Path) -> Path:
    """``out``, or InputError naming it when nothing can be written there (read-only, no permission, full)."""
    from dapo.store_checks import writable_problem
    problem = writable_problem(out)
    if problem:
        raise InputError(f"--to {out}: {problem}; give a writable directory")
    return out


def _main(argv: list[str] | None, sweep_info: SweepInfo | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = _parse(parser, argv)
    formats = tuple(f.strip().lstrip(".") for f in args.formats.split(",") if f.strip())
    if not formats or formats[0] != "png":
        raise InputError("--formats must start with png (the report embeds the PNGs)")
    if args.reading and not Path(args.reading).is_file():
        raise InputError(f"--reading {args.reading}: no such file")
    if args.final_k is not None and args.final_k < 1:
        raise InputError(f"--final-k {args.final_k}: expected an integer >= 1 (the number of last evaluations "
                         f"a run's final value is the mean of)")
    if sweep_info is None and args.spec:
        from dapo.config import ConfigError
        try:
            sweep_info = _spec_sweep_info(args.spec)
        except ConfigError as exc:
            raise InputError(str(exc)) from None
    name = args.sweep or (sweep_info.name if sweep_info else None)
    meta: dict = {}
    if args.from_snapshot is not None:
        snap_dir = args.from_snapshot or (str(Path("results") / name / "snapshot") if name else None)
        if not snap_dir:
            raise InputError("--from-snapshot without DIR needs the sweep (SPEC or --sweep)")
        if not (Path(snap_dir) / "runs.parquet").exists():
            raise InputError(f"no snapshot in {snap_dir} (runs.parquet missing)")
        try:
            tidy, configs, snap_sweep = load_snapshot(snap_dir)
            problems = load_problems(snap_dir)
            samples = load_samples(snap_dir)
            meta = {**read_meta(snap_dir), "report_commit": _git_commit()}
        except SnapshotError as exc:       # reads, but a report from it would be wrong
            raise InputError(f"snapshot {exc}") from None
        except (OSError, ValueError, KeyError, TypeError) as exc:   # corrupt parquet/json, a missing file
            raise InputError(f"snapshot {snap_dir} is unreadable: {type(exc).__name__}: "
                             f"{str(exc).splitlines()[0][:300] if str(exc) else ''}") from None
        if sweep_info is not None:      # a spec given: the snapshot must be of that sweep
            names, source = (({snap_sweep.name}, "its sweep.json") if snap_sweep is not None
                             else (set(tidy["sweep"]) - {""}, "its runs' sweep column"))
            if names and sweep_info.name not in names:
                raise InputError(f"snapshot {snap_dir} is of sweep {', '.join(map(repr, sorted(names)))} ({source}), "
                                 f"not of {args.spec or 'the given sweep'} ({sweep_info.name!r}); give that "
                                 f"sweep's spec, or no spec")
        sweep = sweep_info or snap_sweep or infer_sweep_info(tidy, configs, name)
        out = _writable(Path(args.to) if args.to else Path(snap_dir).resolve().parent)
    else:
        if not name:
            raise InputError("give the sweep (SPEC or --sweep NAME), or --from-snapshot DIR")
        uri = args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            db = Path(args.runs).resolve() / "mlruns.db"
            if not db.exists():
                raise InputError(f"no tracking store: give --tracking-uri, set $MLFLOW_TRACKING_URI, "
                             f"or point --runs at the sweep's output root ({db} does not exist)")
            uri = f"sqlite:///{db}"
        problem = store_problem(uri)   # a missing sqlite file (MLflow would create an empty store there),
        if problem:                    # a damaged one, a server that does not answer (MLflow retries ~4 min)
            raise InputError(problem)
        tidy, configs = _load_runs(uri, name, finished_only=args.finished_only)
        other = bool(args.spec and sweep_info is not None and name != sweep_info.name)
        arm_of = _spec_run_arms(args.spec) if args.spec and (args.with_snapshot or other) else None
        if other:       # the spec's runs, launched by sweep NAME (same resolved configs: the same run ids)
            n_store = tidy["run_id"].nunique() if len(tidy) else 0
            tidy = spec_runs(tidy, arm_of, sweep_info.name) if len(tidy) else tidy
            configs = {r: c for r, c in configs.items() if r in set(tidy["run"])}
            if tidy.empty:
                raise InputError(f"none of the {len(arm_of)} runs of {args.spec} are in sweep {name!r}'s store "
                                 f"({n_store} runs there)")
            print(f"[figures] {tidy['run_id'].nunique()} of sweep {name!r}'s {n_store} runs are {args.spec}'s",
                  file=sys.stderr)
        merged, earlier = [], []
        for d in args.with_snapshot:
            if not (Path(d) / "runs.parquet").exists():
                raise InputError(f"--with-snapshot {d}: no snapshot there (runs.parquet missing)")
            try:
                tidy, configs, rec = merge_snapshot(tidy, configs, d, arm_of=arm_of, sweep_name=name)
            except SnapshotError as exc:
                raise InputError(f"--with-snapshot {exc}") from None
            merged.append(rec)
            earlier.append(load_problems(d))
            print(f"[figures] {rec['n_runs']} runs added from {d} (commit {rec['commit']})", file=sys.stderr)
        if tidy.empty:
            print(f"[figures] sweep {name!r} has no logged points yet", file=sys.stderr)
            return 1
        sweep = sweep_info or infer_sweep_info(tidy, configs, name)
        out = _writable(Path(args.to) if args.to else Path(args.runs) / "figures" / name)
        problems = _problems(args.runs, tidy, earlier)
        samples = samples_from_runs(args.runs, tidy, problems, sweep.metric or primary_metric(tidy))
        if samples is None:     # the runs' records are elsewhere: an earlier snapshot's samples, if any
            samples = next((s for s in (load_samples(d) for d in args.with_snapshot) if s is not None), None)
        commit = _git_commit()
        decl = read_declarations(Path(args.runs) / "sweeps" / name / "declarations")
        times = {**next((read_meta(d).get("run_times") or {} for d in args.with_snapshot), {}), **run_times(uri, name)}
        extra = {**({"merged": merged} if merged else {}), "declarations": decl, "run_times": times}
        meta = {"mlflow_uri": uri, "commit": commit, "declarations": decl, "run_times": times,
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        if not args.no_snapshot:
            cmd = "dapo figures " + " ".join(shlex.quote(a) for a in argv)
            snap = snapshot(tidy, configs, sweep, out / "snapshot", command=cmd, commit=commit,
                            tracking_uri=uri, extra=extra, problems=problems,
                            samples=samples)
            meta = read_meta(snap)
            print(f"[figures] snapshot: {snap}")
    reading = Path(args.reading).read_text() if args.reading else None
    final_k = args.final_k or sweep.final_k
    paths = write_report(tidy, configs, sweep, out, x=args.x, final_k=final_k, reading=reading, meta=meta,
                         formats=formats, problems=problems, samples=samples)
    print(f"[figures] {len(paths)} files in {out} (report: {out / 'report.md'})")
    if args.from_snapshot is None and not args.to:
        print(f"[figures] to publish them: --to results/{name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
