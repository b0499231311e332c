"""``dapo sweep``: expand, submit, watch and cancel an ablation sweep.

    dapo sweep expand SPEC [--json] [--output DIR] [--cluster NAME]   the job table (arm, seed, run id, overrides)
    dapo sweep submit SPEC --cluster NAME [--executor slurm|local] [--output DIR] [--dry-run]
    dapo sweep next-look SPEC --cluster NAME [--dry-run]   a declared stopping rule's next look: the seeds
                                                     of the comparisons still undecided, their arms only
    dapo sweep status SPEC [--output DIR] [--json]   per run: pending / running / requeued / done / failed
    dapo sweep cancel SPEC [--output DIR]            scancel the sweep's unfinished jobs

Every subcommand takes ``--seeds LIST`` (a subset of the spec's seeds, e.g. ``6-9``) and
``--arms NAMES`` (a subset of its arms): run ids do not depend on either.

The spec format and the expansion are in :mod:`dapo.sweep.spec`, cluster profiles in
:mod:`dapo.sweep.cluster`; submission through submitit
(Slurm job array or LocalExecutor) in :mod:`dapo.sweep.launcher`. This module is the command line
plus the names the analysis imports (``sweep_info``, ``expand``, ``load_spec``). ``expand``
needs neither torch nor submitit, so it is fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path

from dapo.config import ConfigError, parse_overrides
from dapo.helptext import help_text
from dapo.sweep.cluster import ClusterProfile, check_resources, load_profile
from dapo.sweep.plan import check_sweep, run_seconds
from dapo.sweep.spec import Arm, Job, Spec, arms, check_sources_exist, expand, inert_overrides, load_spec, sweep_info
from dapo.yaml_checks import check_path

__all__ = ["Arm", "ClusterProfile", "Job", "Spec", "arms", "check_resources", "expand", "load_profile",
           "load_spec", "sweep_info", "main"]


def _fmt_value(v) -> str:
    return json.dumps(v) if not isinstance(v, str) else v


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda r: "  ".join(str(x).ljust(w) for x, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def _spec(args, *, from_records: bool = False) -> Spec:
    check_path(args.output, "--output", "command line")   # reaches #SBATCH --output=... lines
    extra = parse_overrides(args.set) if args.set else None
    if extra is None and from_records:   # status/cancel: the --set of the latest submission
        from dapo.sweep.launcher import load_records
        probe = load_spec(args.spec)
        subs = load_records(args.output, probe.name)["submissions"]
        if subs and subs[-1].get("set"):
            return load_spec(args.spec, subs[-1]["set"])
        return probe
    return _only_arms(_only_seeds(load_spec(args.spec, extra), getattr(args, "seeds", None)),
                      getattr(args, "arms", None))


def parse_seeds(text: str) -> tuple[int, ...]:
    """``"6-9"`` / ``"6,7,9"`` / ``"0-2,5"`` → (6, 7, 8, 9) ...; ConfigError naming the bad part."""
    out: list[int] = []
    for part in (p.strip() for p in str(text).split(",")):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m or (m.group(2) is not None and int(m.group(2)) < int(m.group(1))):
            raise ConfigError(f"--seeds {text}: {part!r} is not a seed or a range LO-HI (e.g. 6-9 or 6,7,8)")
        lo, hi = int(m.group(1)), int(m.group(2) if m.group(2) is not None else m.group(1))
        out += [s for s in range(lo, hi + 1) if s not in out]
    return tuple(out)


def _only_seeds(spec: Spec, text: str | None) -> Spec:
    """The spec restricted to the seeds of ``--seeds`` (each must be one of the spec's): run ids are
    per (arm, seed), so a subset names exactly the runs it would have anyway."""
    if text is None:
        return spec
    seeds = parse_seeds(text)
    extra = [s for s in seeds if s not in spec.seeds]
    if extra:
        raise ConfigError(f"--seeds {text}: seed(s) {extra} are not in {spec.path}'s seeds {list(spec.seeds)}")
    return dataclasses.replace(spec, seeds=tuple(s for s in spec.seeds if s in seeds))


def _only_arms(spec: Spec, text: str | None) -> Spec:
    """The spec restricted to the arms of ``--arms a,b`` (names as ``dapo sweep expand`` prints them)."""
    if text is None:
        return spec
    names = [a.name for a in arms(spec)]
    want = [x.strip() for x in str(text).split(",") if x.strip()]
    bad = [x for x in want if x not in names]
    if bad or not want:
        raise ConfigError(f"--arms {text}: {', '.join(map(repr, bad)) or 'no arm'} not among {spec.path}'s "
                          f"arms: {', '.join(names)}")
    return dataclasses.replace(spec, only_arms=tuple(want))


def cmd_expand(args) -> int:
    spec = _spec(args)
    check_sources_exist(spec)          # data files, model directories, eval sets: here, not on the cluster
    if args.cluster:
        check_resources(spec, load_profile(args.cluster))
        check_sweep(spec, load_profile(args.cluster), log=lambda m: print(m, file=sys.stderr))
    jobs = expand(spec, args.output)
    for w in inert_overrides(jobs):
        print(w, file=sys.stderr)
    if args.json:
        print(json.dumps([{"arm": j.arm, "label": j.label, "seed": j.seed, "run_id": j.run_id,
                           "run_dir": str(j.run_dir), "finished": j.finished, "overrides": j.overrides}
                          for j in jobs], indent=1))
        return 0
    n_arms = len(spec.only_arms) or len(arms(spec))
    print(f"sweep {spec.name} ({spec.kind}): {n_arms} arms x {len(spec.seeds)} seeds = {len(jobs)} jobs; "
          f"base {spec.base}; {sum(j.finished for j in jobs)} finished")
    if spec.base_overrides:
        print("base_overrides (every job): " + " ".join(f"{k}={_fmt_value(v)}" for k, v in spec.base_overrides.items()))
    rows = [[j.arm, j.seed, j.run_id, "done" if j.finished else "",
             " ".join(f"{k}={_fmt_value(v)}" for k, v in j.overrides.items()) or "(base)"] for j in jobs]
    print(_table(rows, ["arm", "seed", "run_id", "state", "overrides vs base"]))
    return 0


def _first_look(spec: Spec, args) -> Spec:
    """Under a declared stopping rule a plain submit runs the first look's seeds only; later looks come
    from ``dapo sweep next-look`` (which adds seeds only where a comparison is still undecided)."""
    if spec.stopping is None or getattr(args, "seeds", None):
        return spec
    n = spec.stopping.looks[0]
    print(f"stopping rule: look 1 of {len(spec.stopping.looks)} runs seeds {list(spec.seeds[:n])}; "
          f"`dapo sweep next-look {args.spec}` decides which comparisons need the next look's seeds",
          file=sys.stderr)
    spec = dataclasses.replace(spec, seeds=spec.seeds[:n])
    if spec.family and not getattr(args, "arms", None):   # a declared family: only its arms are needed
        spec = _family_arms(spec)
    return spec


def _family_arms(spec: Spec) -> Spec:
    """The spec restricted to the arms its declared family compares."""
    return _only_arms(spec, ",".join(dict.fromkeys(a for pair in spec.family for a in pair)))


def _checked_submit(spec: Spec, profile: ClusterProfile, args, held: set[str] = frozenset()) -> dict:
    """Check that every arm fits the GPUs (dapo plan), then submit, declaring first (sources: checked
    by the caller, before anything else it prints); ``held``: run ids an earlier snapshot has (skipped)."""
    from dapo.preflight import check_writable
    from dapo.sweep import launcher
    check_sweep(spec, profile, log=lambda m: print(m, file=sys.stderr))
    if not args.dry_run:
        check_writable(args.output, "--output")     # the declaration, submission records and run dirs go there
    return launcher.submit(spec, profile, args.output, dry_run=args.dry_run, executor=args.executor,
                           declare=lambda s: _declared(s, args), held=held)


def _declared(spec: Spec, args) -> Spec:
    """Write (or reuse) the sweep's declaration record before any job starts; the jobs carry its id."""
    from dapo.sweep.declaration import declarations_dir, declare
    full = load_spec(args.spec, parse_overrides(args.set) if args.set else None)
    record, new = declare(full, args.output)
    where = declarations_dir(args.output, full.name) / f"{record['id']}.json"
    print(f"{'declared' if new else 'declaration unchanged'}: {record['time']} ({record['id']}); {where}",
          file=sys.stderr)
    return dataclasses.replace(spec, declaration=record["id"])


def cmd_submit(args) -> int:
    spec = _first_look(_spec(args), args)
    check_sources_exist(spec)
    for w in inert_overrides(expand(spec, args.output)):
        print(w, file=sys.stderr)
    profile = load_profile(args.cluster)
    rec = _checked_submit(spec, profile, args)
    if args.dry_run:
        print(f"dry run: {len(rec['jobs'])} job(s) would go to {profile.name} ({args.executor or profile.executor}); "
              f"{len(rec['skipped'])} skipped")
        for j in rec["jobs"]:
            print(f"  {j['arm']:<24} seed {j['seed']:<3} {j['run_id']}  {j['run_dir']}")
        if rec["jobs"]:
            print("\nwhat each array task runs (the same as these commands, in-process):")
            for i, j in enumerate(rec["jobs"]):
                print(f"  task {i}: {j['command']}")
        if rec["jobs"]:
            todo = {j["run_id"] for j in rec["jobs"]}
            parallel = (spec.max_concurrent if (args.executor or profile.executor) == "local"
                        else min(spec.max_concurrent, profile.max_array_parallel))
            print("\n" + "\n".join(time_estimate(spec, [j for j in expand(spec, args.output) if j.run_id in todo],
                                                  profile, args.output, parallel)))
        print("\nsbatch script (one array; submitit writes the same):\n" + rec["script"])
        return 0
    if rec.get("executor") == "local" and rec["jobs"]:
        return cmd_status(args)
    return 0


def time_estimate(spec: Spec, todo: list, profile: ClusterProfile, output, parallel: int) -> list[str]:
    """How long the jobs ``todo`` would take: each from the finished runs of its arm under ``output`` (their mean
    wall time: measured), else from the plan on ``profile`` (:func:`dapo.sweep.plan.run_seconds`); the whole
    at ``parallel`` jobs at a time, in submission order, each job taking the first free slot. Queue waits and
    requeues are not counted."""
    from dapo.preflight import finished_summary
    walls: dict[str, list[float]] = {}
    for j in expand(spec, output):
        wall = (finished_summary(j.run_dir) or {}).get("wall_s")
        if isinstance(wall, (int, float)) and not isinstance(wall, bool) and wall > 0:
            walls.setdefault(j.arm, []).append(float(wall))
    each: list[tuple[str, float | None, str]] = []
    planned: dict[str, float | None] = {}
    for j in todo:
        if walls.get(j.arm):
            w = walls[j.arm]
            each.append((j.arm, sum(w) / len(w), f"measured: mean of {len(w)} finished run(s)"))
        else:
            if j.arm not in planned:
                planned[j.arm] = run_seconds(j.config, profile)
            each.append((j.arm, planned[j.arm], f"dapo plan on {profile.name}"))
    out = ["time estimate (queue waits and requeues not counted):"]
    for arm, secs, how in dict((e[0], e) for e in each).values():
        out.append(f"  {arm:<24} " + (f"{secs / 3600:.2f} h a run ({how})" if secs is not None else
                                      f"no estimate (no finished run of this arm under {output}; "
                                      f"the plan prices GPU profiles only)"))
    known = [s for _, s, _ in each if s is not None]
    if known:
        slots = [0.0] * max(1, parallel)
        for s in known:
            i = slots.index(min(slots))
            slots[i] += s
        out.append(f"  {len(known)} job(s), {parallel} at a time: ≈ {max(slots) / 3600:.1f} h "
                   f"({sum(known) / 3600:.1f} h of runs)")
    return out


def cmd_status(args) -> int:
    from dapo.sweep import launcher
    spec = _spec(args, from_records=True)
    rows = launcher.status(spec, args.output)
    if getattr(args, "json", False):
        print(json.dumps(rows, indent=1, default=str))
        return 0
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    print(f"sweep {spec.name}: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    print(_table([[r["arm"], r["seed"], r["run_id"], r["state"], r["step"], r["requeues"], r["job_id"] or "-",
                   r["detail"]] for r in rows],
                 ["arm", "seed", "run_id", "state", "step", "requeues", "job", "detail"]))
    for r in rows:
        if r["state"] == "failed" and r["log"]:
            print(f"\n--- {r['arm']} seed {r['seed']} ({r['run_id']}) failed: {r['detail']}; "
                  f"last lines of {r['log']}:\n{r['log_tail']}")
    if rows and counts.get("done") == len(rows):
        print("\n" + "\n".join(end_summary(spec, expand(spec, args.output), args)))
    return 1 if counts.get("failed") else 0


def end_summary(spec: Spec, jobs: list[Job], args) -> list[str]:
    """What a finished sweep prints: its metric at each run's last evaluation (summary.json), mean per arm,
    and the command that makes its report (whose final value is the mean of the last final_k evaluations)."""
    import statistics
    metric = spec.metric
    per_arm: dict[str, list[float]] = {}
    for j in jobs:
        try:
            v = json.loads((j.run_dir / "summary.json").read_text()).get("final_eval", {}).get(metric)
        except (OSError, ValueError):
            v = None
        if isinstance(v, (int, float)):
            per_arm.setdefault(j.label, []).append(float(v))
    out = [f"every run of {spec.name} is done. {metric} at each run's last evaluation, mean over seeds "
           f"(descriptive; the report tests the differences):"]
    out += [f"  {label:<32} {statistics.fmean(v):.4f}  ({len(v)} seed{'s' if len(v) != 1 else ''})"
            for label, v in per_arm.items()] or ["  (no run wrote a summary.json with that metric)"]
    cmd = f"dapo figures {args.spec}" + ("" if str(args.output) == "runs" else f" --runs {args.output}")
    return out + [f"report: {cmd}"]


def cmd_cancel(args) -> int:
    from dapo.sweep import launcher
    launcher.cancel(_spec(args, from_records=True), args.output)
    return 0


def _runs_so_far(uri: str, full: Spec, jobs: list[Job], snapshots: list[str]):
    """(tidy, configs, held): the finished runs of ``full`` in its store, plus those of earlier snapshots
    (``--with-snapshot DIR``, as ``dapo figures``; matched by run id) the store does not have; ``held`` is the
    run ids that only a snapshot holds (their jobs are not run again). No store is fine when a snapshot is given."""
    import pandas as pd

    from analysis.runs import TIDY_COLUMNS, SnapshotError, load_runs, merge_snapshot, store_problem
    problem = store_problem(uri)
    if problem and not (snapshots and "does not exist" in problem):
        raise ConfigError(f"{problem} (no look has been run: `dapo sweep submit {full.path}` runs look 1"
                          f"{'' if snapshots else '; --with-snapshot DIR adds the runs of a committed snapshot'})")
    tidy, configs = (pd.DataFrame(columns=TIDY_COLUMNS), {}) if problem else \
        load_runs(uri, full.name, finished_only=True)
    have = set(tidy["run_id"].astype(str)) if len(tidy) else set()
    arm_of = {j.run_id: j.arm for j in jobs}
    for d in snapshots:
        if not (Path(d) / "runs.parquet").is_file():
            inner = Path(d) / "snapshot"
            raise ConfigError(f"--with-snapshot {d}: no snapshot there (runs.parquet missing"
                              + (f"; {inner} has one)" if (inner / "runs.parquet").is_file() else ")"))
        try:
            tidy, configs, rec = merge_snapshot(tidy, configs, d, arm_of=arm_of, sweep_name=full.name)
        except (SnapshotError, OSError) as exc:
            raise ConfigError(f"--with-snapshot {d}: {exc}") from None
        print(f"{rec['n_runs']} runs from the snapshot {d} (commit {rec['commit']})", file=sys.stderr)
    held = (set(tidy["run_id"].astype(str)) if len(tidy) else set()) - have
    return tidy, configs, held


def cmd_next_look(args) -> int:
    """Under a declared stopping rule: test the looks done, then run the next look's seeds for the arms
    of the comparisons still undecided only (analysis.looks). Run ids are those of the full spec."""
    from analysis.looks import plan_next_look
    from analysis.runs import SweepInfo
    from analysis.tables import family_table
    from dapo.sweep import launcher
    full = load_spec(args.spec, parse_overrides(args.set) if args.set else None)
    if full.stopping is None:
        raise ConfigError(f"{args.spec}: no stopping rule (a 'stopping:' section declares looks); "
                          f"`dapo sweep submit` runs every seed")
    profile = load_profile(args.cluster)
    jobs = expand(full, args.output)
    tidy, configs, held = _runs_so_far(launcher.job_tracking_uri(jobs[0], profile), full, jobs, args.with_snapshot)
    sweep = SweepInfo.from_dict(sweep_info(args.spec))
    fam = family_table(tidy, sweep, configs) if len(tidy) else None
    looks = full.stopping.looks
    plan = plan_next_look(fam, looks, full.seeds, tuple(a.name for a in arms(full)))
    print(f"stopping rule: looks at {list(looks)} pairs, {full.stopping.spending} spending, "
          f"alpha {full.stopping.alpha}; looks done: {plan.done}")
    for d in plan.decided:
        print(f"  decided: {d}")
    for u in plan.undecided:
        print(f"  undecided: {u}")
    print(plan.reason)
    if plan.next_look is None:
        return 0
    spec = dataclasses.replace(full, seeds=plan.seeds)
    if plan.arms:
        spec = _only_arms(spec, ",".join(plan.arms))
    elif full.family:
        spec = _family_arms(spec)
    check_sources_exist(spec)
    rec = _checked_submit(spec, profile, args, held=held)
    if args.dry_run:
        print(f"dry run: look {plan.next_look} would run {len(rec['jobs'])} job(s) ({len(rec['skipped'])} finished "
              f"or queued)")
        for j in rec["jobs"]:
            print(f"  {j['arm']:<24} seed {j['seed']:<3} {j['run_id']}")
        return 0
    if rec.get("executor") == "local" and rec["jobs"]:
        return cmd_status(args)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dapo sweep", description=help_text(__doc__),
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Spec format: see dapo/sweep/spec.py and slurm/README.md.")
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp):
        sp.add_argument("spec", help="sweep spec YAML (see sweeps/)")
        sp.add_argument("--output", default="runs", metavar="DIR",
                        help="output root: runs in DIR/runs/<run_id>, records in DIR/sweeps/<name>/ (default: runs)")
        sp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="extra dotted override for every job (added to base_overrides; repeatable)")
        sp.add_argument("--arms", metavar="NAMES",
                        help="only these arms, comma-separated (e.g. the cells of a grid not yet run elsewhere)")
        sp.add_argument("--seeds", metavar="LIST",
                        help="only these of the spec's seeds, e.g. 6-9 or 0,2 (extend a sweep whose other "
                             "seeds ran elsewhere; run ids do not depend on it)")

    e = sub.add_parser("expand", help="print the job table (arm, seed, run id, overrides vs the base)")
    common(e)
    e.add_argument("--json", action="store_true", help="machine-readable output")
    e.add_argument("--cluster", help="also check the resources against this cluster profile")
    e.set_defaults(fn=cmd_expand)
    s = sub.add_parser("submit", help="submit unfinished runs as one Slurm job array (or run them locally)")
    common(s)
    s.add_argument("--cluster", default="local",
                   help="cluster profile: slurm/NAME.yaml or a path (default: local = this machine)")
    s.add_argument("--executor", choices=["slurm", "local"],
                   help="override the profile's executor (e.g. --cluster local --executor slurm for the local test Slurm)")
    s.add_argument("--dry-run", action="store_true", help="validate and print the jobs and the sbatch script; submit nothing")
    s.set_defaults(fn=cmd_submit)
    nl = sub.add_parser("next-look", help="under a declared stopping rule: test the looks done and run the next "
                                          "look's seeds for the undecided comparisons' arms only")
    common(nl)
    nl.add_argument("--cluster", default="local",
                    help="cluster profile: a name in slurm/ (local, example-gpu-cluster) or a YAML path")
    nl.add_argument("--executor", choices=["slurm", "local"], help="override the profile's executor")
    nl.add_argument("--dry-run", action="store_true", help="print the test and the jobs the next look would run")
    nl.add_argument("--with-snapshot", action="append", default=[], metavar="DIR",
                    help="also count the runs of an earlier snapshot (e.g. results/<sweep>/, as dapo figures "
                         "--with-snapshot): they are tested with the store's and never run again (repeatable)")
    nl.set_defaults(fn=cmd_next_look)
    st = sub.add_parser("status", help="per run: pending / running / requeued / done / failed (+ failed logs)")
    common(st)
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.set_defaults(fn=cmd_status)
    c = sub.add_parser("cancel", help="scancel the sweep's unfinished jobs")
    common(c)
    c.set_defaults(fn=cmd_cancel)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from dapo.file_lock import NoLocksError
    from dapo.tracking.tracker import TrackingError   # light: imports no mlflow
    try:
        return int(args.fn(args) or 0)
    except (ConfigError, TrackingError) as exc:   # a bad spec / profile, or a tracking server that does not answer
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except NoLocksError as exc:   # the output's file system has no locks (the submission record's): the machine
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
