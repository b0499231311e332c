"""Sweep specs: one YAML file → validated arms → jobs (arm × seed), each a resolved Config.

A spec names a base experiment, how its arms are built from toggles, the seeds, the
metric the analysis reads and the resources one job needs::

    name: table1                         # ^[A-Za-z0-9._-]+$; the MLflow experiment and dapo.commands.sweep tag
    base: experiments/paper-dapo-32b.yaml  # relative to the repo root or to this file
    base_overrides: {train.rollout_steps: 300}   # dotted keys, applied to every arm
    kind: ladder                         # ladder | one_at_a_time | leave_one_out | grid
    baseline: {name: grpo, label: naive GRPO, overrides: {...}, paper: 30}   # ladder, one_at_a_time,
                                         # leave_one_out (there: the "off" value of every technique key)
    full: {label: DAPO, paper: 50}       # leave_one_out only: the all-techniques arm (name: full)
    techniques:                          # ordered
      - {name: overlong_filter, label: + overlong filtering, overrides: {algo.overlong.filter: true}, paper: 36}
    grid: {algo.clip.eps_high: [0.2, 0.28]}       # kind grid only: the product of the values
    paper: {arm_name: 41.0}              # optional paper value per arm (grid; or any kind)
    margins: {train/entropy: 0.005}      # optional: equivalence (TOST) margins per metric, in the unit
                                         # the report shows (% for accuracies); defaults: docs/STATISTICS.md
    family: [[grpo, dapo]]               # optional: the primary family, declared (pairs [off, on] of arm
                                         # names); default: every pair that isolates one technique + the
                                         # baseline vs DAPO (docs/STATISTICS.md)
    stopping:                            # optional: a group-sequential design (docs/STATISTICS.md)
      looks: [10, 14]                    # pairs per comparison at each look: the first n of `seeds`
      spending: obrien_fleming           # obrien_fleming | pocock: how alpha is spent over the looks
      alpha: 0.05                        # the family's error rate over all looks
    seeds: [0, 1, 2]
    metric: eval/aime24/avg_at_32        # primary eval metric of the analysis
    final_k: 3                           # final value = mean of the last final_k evaluations
    resources: {nodes: 16, gpus_per_node: 8, cpus_per_task: 96, mem_gb: 1000, time_min: 10080}
    max_concurrent: 4                    # jobs of the array running at once
    max_requeues: 3                      # preemptions / time limits survived per job

Arms by kind (T1..Tn the techniques, B the baseline overrides):

- ``ladder``         B, B+T1, B+T1+T2, ... (Table 1: each row adds one technique)
- ``one_at_a_time``  B, B+T1, B+T2, ... (each technique alone on the baseline)
- ``leave_one_out``  full = T1+...+Tn on the base; ``no_<Ti>`` = full with Ti's keys set back
                     to their values in ``baseline.overrides`` (which must name every such key)
- ``grid``           one arm per element of the product of ``grid`` values

A job's config is base + base_overrides + the arm's overrides + ``train.seed``, with
``logging.sweep``/``logging.experiment`` = the spec name, ``logging.arm`` = the arm name and
``output_dir`` = the output root. Its run id is :func:`dapo.config.config_hash` of that config
(which leaves out ``logging.*``, ``output_dir`` and ``name``), so the same run named by two
sweeps is one run, in ``<output root>/runs/<run_id>``.

Loading validates everything (keys, types, ranges, duplicate arm names and configs, a ``metric``
every arm logs, resources against the experiment's launch layout) and raises one
:class:`~dapo.config.ConfigError` naming the file and the key; :func:`check_sources_exist`
(``dapo sweep expand/submit``) checks that data files, eval sets and model paths exist, and
:func:`dapo.sweep.cluster.check_resources` compares resources with a cluster profile's limits before
anything is submitted. Pure: no I/O beyond reading the spec and its base
experiment; imports neither torch nor submitit.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dapo.config import (Config, ConfigError, apply_overrides, build_config, config_hash, field_docs, flatten,
                         read_yaml, show, to_dict)
from dapo.preflight import check_sources, eval_metric_names, finished_summary
from dapo.yaml_checks import (NAME_RE, REPO_ROOT, check_int, check_mapping, check_name, check_number, check_text,
                              find_file,
                              yaml_mapping_file)

__all__ = ["KINDS", "NAME_RE", "Technique", "Resources", "Spec", "Arm", "Job",
           "load_spec", "arms", "expand", "accelerate_config_path", "sweep_info", "check_name", "check_sources_exist", "finished_summary",
           "REPO_ROOT"]

KINDS = ("ladder", "one_at_a_time", "leave_one_out", "grid")
MAX_SWEEP_JOBS = 1000
"""The most runs (arms x seeds) one spec may expand to: the paper's Table 1 is 18; a 10 000-point grid took
minutes to expand and would never be run."""
# Keys the launcher sets itself; a spec may not override them.
RESERVED_KEYS = ("train.seed", "logging.sweep", "logging.arm", "logging.experiment", "logging.declaration",
                 "output_dir")


# =========================================================================== the spec
@dataclass(frozen=True)
class Arm:
    """Named dotted overrides with a label and a paper value: an arm (applied on top of base +
    base_overrides), or what builds arms: a technique, the baseline, the full recipe."""
    name: str
    label: str
    overrides: dict[str, Any]
    paper: float | None = None


Technique = Arm   # a spec's techniques / baseline / full: the same record, before arms are built


@dataclass(frozen=True)
class Resources:
    """What one job of the sweep asks Slurm for."""
    nodes: int = 1
    gpus_per_node: int = 0
    cpus_per_task: int = 2
    mem_gb: float = 4.0
    time_min: int = 60


SPENDING = ("obrien_fleming", "pocock")
"""Alpha-spending functions a ``stopping`` section may name (analysis.sequential implements them)."""


@dataclass(frozen=True)
class Stopping:
    """A declared stopping rule: test at ``looks`` pairs (the first n seeds), spending ``alpha`` over
    the looks by ``spending`` (Lan-DeMets forms; analysis.sequential)."""
    looks: tuple[int, ...]
    spending: str = "obrien_fleming"
    alpha: float = 0.05

    def to_dict(self) -> dict:
        return {"looks": list(self.looks), "spending": self.spending, "alpha": self.alpha}


@dataclass(frozen=True)
class Spec:
    """A validated sweep spec (see the module docstring for the file format)."""
    path: Path
    name: str
    base: Path
    kind: str
    base_overrides: dict[str, Any]
    techniques: tuple[Technique, ...]
    baseline: Technique | None
    full: Technique | None
    grid: tuple[tuple[str, tuple[Any, ...]], ...]
    paper: dict[str, float | None]
    seeds: tuple[int, ...]
    metric: str
    final_k: int
    resources: Resources
    max_concurrent: int
    max_requeues: int
    description: str = ""
    extra_overrides: dict[str, Any] = field(default_factory=dict)   # from --set (already in base_overrides)
    only_arms: tuple[str, ...] = ()   # from --arms: expand only these arms (empty: all); run ids do not depend on it
    margins: dict[str, float] = field(default_factory=dict)   # metric → TOST margin (shown unit), for the analysis
    family: tuple[tuple[str, str], ...] = ()   # the declared primary family, (off, on) arm names; () = the default
    stopping: Stopping | None = None   # the declared looks and alpha spending; None = one fixed look (all seeds)
    declaration: str = ""   # set by `dapo sweep submit`: the id of the declaration record its runs carry


@dataclass(frozen=True)
class Job:
    """One run of the sweep: an arm at one seed."""
    arm: str
    label: str
    seed: int
    run_id: str
    run_dir: Path
    overrides: dict[str, Any]     # resolved values that differ from the base (train.seed aside)
    config: Config
    accelerate_config: Path | None = None   # launch.accelerate_config made absolute (:func:`accelerate_config_path`)

    @property
    def finished(self) -> bool:
        """A finished run (a readable summary.json) is reused, never run again."""
        return finished_summary(self.run_dir) is not None


_TOP_KEYS = {"name", "description", "base", "base_overrides", "kind", "techniques", "baseline", "full",
             "grid", "paper", "seeds", "metric", "final_k", "resources", "max_concurrent", "max_requeues",
             "margins", "family", "stopping"}
_STOPPING_KEYS = {"looks", "spending", "alpha"}
_TECH_KEYS = {"name", "label", "overrides", "paper"}


def _leaf_keys() -> tuple[set[str], set[str]]:
    leaves = {k for k, _, _ in field_docs()}
    sections = {k.rsplit(".", i)[0] for k in leaves for i in range(1, k.count(".") + 1)}
    return leaves, sections


_LEAVES, _SECTIONS = _leaf_keys()


def _overrides(v: Any, key: str, where: str) -> dict[str, Any]:
    """Dotted overrides: every key names a config field (a section's mapping is flattened)."""
    out: dict[str, Any] = {}
    for k, val in check_mapping(v, key, where).items():
        if not isinstance(k, str):
            raise ConfigError(f"{where}: {key}: key {show(k)} is not a dotted config key")
        if k in _SECTIONS and isinstance(val, dict):        # algo.clip: {eps_high: 0.2} → algo.clip.eps_high
            out.update(_overrides({f"{k}.{kk}": vv for kk, vv in val.items()}, key, where))
            continue
        for r in RESERVED_KEYS:
            if k == r or (r == "output_dir" and k.startswith("output_dir")):
                what = "seeds" if r == "train.seed" else "the launcher (spec name / arm name / --output)"
                raise ConfigError(f"{where}: {key}: {show(k)} is set by {what}; remove it")
        apply_overrides({}, {k: val}, where=f"{where}: {key}")  # unknown key → error listing valid ones
        out[k] = val
    return out


def _technique(v: Any, key: str, where: str, *, need_name: bool = True, default_name: str = "") -> Technique:
    v = check_mapping(v, key, where)
    bad = set(v) - _TECH_KEYS
    if bad:
        raise ConfigError(f"{where}: unknown key {key}.{show(sorted(bad, key=str)[0])}; allowed: {', '.join(sorted(_TECH_KEYS))}")
    if need_name and "name" not in v:
        raise ConfigError(f"{where}: {key}.name is missing")
    name = check_name(v.get("name", default_name), f"{key}.name", where)
    label = check_text(v.get("label", name), f"{key}.label", where)
    return Technique(name, label, _overrides(v.get("overrides"), f"{key}.overrides", where),
                     check_number(v.get("paper"), f"{key}.paper", where, allow_none=True))


def _resolve_base(base: Any, spec_path: Path) -> Path:
    """``base:`` relative to the spec's folder, then the current directory, then this package's repo
    (so a spec in another checkout reads that checkout's experiments, not this one's)."""
    base = check_text(base, "base", str(spec_path))
    roots = (spec_path.parent, Path.cwd(), REPO_ROOT)
    p = find_file(base, roots)
    if p is not None:
        return p
    raise ConfigError(f"{spec_path}: base = {show(base)}: no such experiment file (looked relative to "
                      f"{', '.join(str(r.resolve()) for r in roots)})")


def _arm_sources(raw: dict, kind: str, where: str) -> tuple[tuple[Technique, ...], Technique | None,
                                                              Technique | None, tuple]:
    """(techniques, baseline, full, grid) of a spec: what its arms are built from, checked."""
    if kind == "grid":
        for k in ("techniques", "baseline", "full"):
            if k in raw:
                raise ConfigError(f"{where}: {k}: not used by kind grid (use grid: {{key: [values]}})")
        g = check_mapping(raw.get("grid"), "grid", where)
        if not g:
            raise ConfigError(f"{where}: grid is empty: give at least one key with a list of values")
        for k, vals in g.items():
            if not isinstance(k, str) or k in _SECTIONS:
                raise ConfigError(f"{where}: grid.{str(k)[:200]}: a grid key must name a single config field")
            _overrides({k: None}, "grid", where)  # a known, non-reserved key
            if not isinstance(vals, list) or not vals:
                raise ConfigError(f"{where}: grid.{str(k)[:200]} = {show(vals)}: expected a non-empty list of values")
            if len({repr(v) for v in vals}) != len(vals):   # bounded: alias bombs are refused on load
                raise ConfigError(f"{where}: grid.{str(k)[:200]} = {show(vals)}: values repeat")
        return (), None, None, tuple((k, tuple(v)) for k, v in g.items())
    if "grid" in raw:
        raise ConfigError(f"{where}: grid: only used by kind grid (this spec is {kind})")
    ts = raw.get("techniques")
    if not isinstance(ts, list) or not ts:
        raise ConfigError(f"{where}: techniques = {show(ts)}: expected a non-empty list of "
                          f"{{name, label, overrides, paper}}")
    techniques = tuple(_technique(t, f"techniques[{i}]", where) for i, t in enumerate(ts))
    for i, t in enumerate(techniques):
        if not t.overrides:
            raise ConfigError(f"{where}: techniques[{i}] ({t.name}).overrides is empty")
    names = [t.name for t in techniques]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise ConfigError(f"{where}: techniques: the name {dup!r} is used twice")
    if "baseline" not in raw:
        raise ConfigError(f"{where}: baseline is missing (kind {kind} needs {{label, overrides, paper}})")
    baseline = _technique(raw["baseline"], "baseline", where, need_name=False, default_name="baseline")
    full = None
    if kind == "leave_one_out":
        full = _technique(raw.get("full") or {}, "full", where, need_name=False, default_name="full")
        if full.overrides:
            raise ConfigError(f"{where}: full.overrides: the full recipe is base + every technique; "
                              f"put extra keys in base_overrides")
        for i, t in enumerate(techniques):
            missing = [k for k in t.overrides if k not in baseline.overrides]
            if missing:
                raise ConfigError(f"{where}: techniques[{i}] ({t.name}).overrides.{missing[0]}: leave_one_out "
                                  f"reverts it to baseline.overrides, which does not set it")
    elif "full" in raw:
        raise ConfigError(f"{where}: full: only used by kind leave_one_out")
    return techniques, baseline, full, ()


def _resources(value: Any, where: str) -> Resources:
    """The spec's ``resources:`` mapping, checked (defaults: :class:`Resources`)."""
    res = check_mapping(value, "resources", where)
    rkeys = {f.name for f in Resources.__dataclass_fields__.values()}
    if set(res) - rkeys:
        raise ConfigError(f"{where}: unknown key resources.{sorted(set(res) - rkeys, key=str)[0]}; "
                          f"allowed: {', '.join(sorted(rkeys))}")
    d = Resources()
    resources = Resources(
        nodes=check_int(res.get("nodes", d.nodes), "resources.nodes", where, lo=1),
        gpus_per_node=check_int(res.get("gpus_per_node", d.gpus_per_node), "resources.gpus_per_node", where, lo=0),
        cpus_per_task=check_int(res.get("cpus_per_task", d.cpus_per_task), "resources.cpus_per_task", where, lo=1),
        mem_gb=check_number(res.get("mem_gb", d.mem_gb), "resources.mem_gb", where),
        time_min=check_int(res.get("time_min", d.time_min), "resources.time_min", where, lo=1))
    if resources.mem_gb <= 0:
        raise ConfigError(f"{where}: resources.mem_gb = {resources.mem_gb}: must be > 0")
    if resources.gpus_per_node == 0 and resources.nodes != 1:
        raise ConfigError(f"{where}: resources.nodes = {resources.nodes}: CPU jobs (gpus_per_node 0) run on one node")
    return resources


def load_spec(path: str | os.PathLike, extra_overrides: dict[str, Any] | None = None) -> Spec:
    """Read and validate a sweep spec; every arm's config is built and checked.

    ``extra_overrides`` (dotted; e.g. from ``--set``) are added to ``base_overrides``.
    Raises :class:`ConfigError` naming the file and the key.
    """
    path = Path(path)
    where = str(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such sweep spec")
    raw = yaml_mapping_file(path)
    unknown = set(raw) - _TOP_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key {show(sorted(unknown, key=str)[0])}; allowed: {', '.join(sorted(_TOP_KEYS))}")
    for k in ("name", "base", "kind", "seeds", "metric"):
        if k not in raw:
            raise ConfigError(f"{where}: {k} is missing")
    name = check_name(raw["name"], "name", where)
    kind = raw["kind"]
    if kind not in KINDS:
        raise ConfigError(f"{where}: kind = {show(kind)}: expected one of {', '.join(KINDS)}")
    base = _resolve_base(raw["base"], path)
    base_overrides = _overrides(raw.get("base_overrides"), "base_overrides", where)
    if extra_overrides:
        base_overrides.update(_overrides(extra_overrides, "--set", where))

    techniques, baseline, full, grid = _arm_sources(raw, kind, where)
    paper = {}
    for k, v in check_mapping(raw.get("paper"), "paper", where).items():
        paper[check_name(k, "paper (arm name)", where)] = check_number(v, f"paper.{k}", where, allow_none=True)
    seeds = raw["seeds"]
    if not isinstance(seeds, list) or not seeds:
        raise ConfigError(f"{where}: seeds = {show(seeds)}: expected a non-empty list of integers")
    seeds = tuple(check_int(s, f"seeds[{i}]", where, lo=0) for i, s in enumerate(seeds))
    if max(seeds) >= 2 ** 32:
        raise ConfigError(f"{where}: seeds: {max(seeds)} is too large (a seed is in [0, 2**32))")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"{where}: seeds = {show(list(seeds))}: a seed repeats")
    n_arms = math.prod(len(v) for _, v in grid) if grid else len(techniques) + 2
    if n_arms * len(seeds) > MAX_SWEEP_JOBS:
        raise ConfigError(f"{where}: about {n_arms} arms x {len(seeds)} seeds = {n_arms * len(seeds)} runs, more than "
                          f"the {MAX_SWEEP_JOBS} a sweep may hold (dapo.sweep.spec.MAX_SWEEP_JOBS); split it")
    metric = check_text(raw["metric"], "metric", where)
    final_k = check_int(raw.get("final_k", 3), "final_k", where, lo=1)
    margins = {}
    for k, v in check_mapping(raw.get("margins"), "margins", where).items():
        m = check_number(v, f"margins.{k}", where)
        if not m > 0:
            raise ConfigError(f"{where}: margins.{str(k)[:200]} = {show(v)}: an equivalence margin must be > 0")
        margins[check_text(k, "margins (metric name)", where)] = float(m)
    family = _family(raw.get("family"), where)
    stopping = _stopping(raw.get("stopping"), len(seeds), where)
    resources = _resources(raw.get("resources"), where)
    spec = Spec(path=path, name=name, base=base, kind=kind, base_overrides=base_overrides,
                techniques=techniques, baseline=baseline, full=full, grid=grid, paper=paper, seeds=seeds,
                metric=metric, final_k=final_k, resources=resources,
                max_concurrent=check_int(raw.get("max_concurrent", 1), "max_concurrent", where, lo=1),
                max_requeues=check_int(raw.get("max_requeues", 3), "max_requeues", where, lo=0),
                description=str(raw.get("description", "")), extra_overrides=dict(extra_overrides or {}),
                margins=margins, family=family, stopping=stopping)
    names = [a.name for a in arms(spec)]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise ConfigError(f"{where}: two arms are named {dup!r} (e.g. the baseline and a technique); "
                          f"arm names must be unique")
    unknown_paper = set(paper) - set(names)
    if unknown_paper:
        raise ConfigError(f"{where}: paper.{sorted(unknown_paper)[0]}: no such arm "
                          f"(arms: {', '.join(a.name for a in arms(spec))})")
    unknown_family = next((n for pair in family for n in pair if n not in names), None)
    if unknown_family is not None:
        raise ConfigError(f"{where}: family: {unknown_family!r}: no such arm (arms: {', '.join(names)})")
    _check_arms(spec)
    return spec


def _stopping(raw: Any, n_seeds: int, where: str) -> Stopping | None:
    """The spec's ``stopping``: strictly increasing looks of at least 2 pairs, the last at most the
    number of seeds; a known spending function; 0 < alpha < 1. Absent: None."""
    if raw is None:
        return None
    raw = check_mapping(raw, "stopping", where)
    unknown = set(raw) - _STOPPING_KEYS
    if unknown:
        raise ConfigError(f"{where}: stopping.{sorted(map(str, unknown))[0]}: unknown key; allowed: "
                          f"{', '.join(sorted(_STOPPING_KEYS))}")
    looks = raw.get("looks")
    if not isinstance(looks, list) or not looks:
        raise ConfigError(f"{where}: stopping.looks = {show(looks)}: expected a list of pair counts, e.g. [10, 14]")
    looks = tuple(check_int(n, f"stopping.looks[{i}]", where, lo=2) for i, n in enumerate(looks))
    if any(b <= a for a, b in zip(looks, looks[1:])):
        raise ConfigError(f"{where}: stopping.looks = {show(list(looks))}: looks must increase")
    if looks[-1] > n_seeds:
        raise ConfigError(f"{where}: stopping.looks = {show(list(looks))}: the last look needs {looks[-1]} seeds; "
                          f"seeds lists {n_seeds}")
    spending = raw.get("spending", "obrien_fleming")
    if spending not in SPENDING:
        raise ConfigError(f"{where}: stopping.spending = {show(spending)}: expected one of {', '.join(SPENDING)}")
    alpha = check_number(raw.get("alpha", 0.05), "stopping.alpha", where)
    if not 0 < alpha < 1:
        raise ConfigError(f"{where}: stopping.alpha = {show(alpha)}: expected 0 < alpha < 1")
    return Stopping(looks=looks, spending=spending, alpha=float(alpha))


def _family(raw: Any, where: str) -> tuple[tuple[str, str], ...]:
    """The spec's ``family``: a list of ``[off, on]`` arm-name pairs, distinct, each of two different arms
    (the names are checked against the arms by the caller). Absent: ()."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{where}: family = {show(raw)}: expected a non-empty list of [off arm, on arm] pairs")
    out: list[tuple[str, str]] = []
    for i, pair in enumerate(raw):
        if not (isinstance(pair, list) and len(pair) == 2):
            raise ConfigError(f"{where}: family[{i}] = {show(pair)}: expected [off arm, on arm]")
        off, on = (check_name(x, f"family[{i}]", where) for x in pair)
        if off == on:
            raise ConfigError(f"{where}: family[{i}] = [{off}, {on}]: an arm compared with itself")
        if (off, on) in out or (on, off) in out:
            raise ConfigError(f"{where}: family[{i}] = [{off}, {on}]: this pair is already in the family")
        out.append((off, on))
    return tuple(out)


# =========================================================================== arms and jobs
def _grid_keys(grid) -> list[str]:
    """Short names of the grid keys (the last dotted part, unless two keys share it)."""
    short = [k.rsplit(".", 1)[-1] for k, _ in grid]
    return short if len(set(short)) == len(short) else [k for k, _ in grid]


def _grid_label_keys(grid) -> list[str]:
    """The grid keys as arm labels show them: the last two dotted parts (``dynamic_sampling.enabled``,
    ``clip.eps_high``), which say what a bare ``enabled`` or ``mode`` does not."""
    return [".".join(k.split(".")[-2:]) for k, _ in grid]


def _grid_arm_names(grid) -> list[str]:
    """``eps_high-0.28__lr-1e-05``: names that satisfy NAME_RE."""
    def fmt(v: Any) -> str:
        s = json.dumps(v) if not isinstance(v, str) else v
        return re.sub(r"[^A-Za-z0-9.-]+", "_", s).strip("_") or "x"
    keys = _grid_keys(grid)
    names = ["__".join(f"{k}-{fmt(v)}" for k, v in zip(keys, combo))
             for combo in itertools.product(*(vals for _, vals in grid))]
    return [n if names.count(n) == 1 else f"{n}_{i}" for i, n in enumerate(names)]   # "a b" vs "a_b"


def arms(spec: Spec) -> list[Arm]:
    """The spec's arms, in order (ladder: row order)."""
    out: list[Arm] = []
    if spec.kind == "grid":
        combos = list(itertools.product(*(vals for _, vals in spec.grid)))
        for name, combo in zip(_grid_arm_names(spec.grid), combos):
            ov = {k: v for (k, _), v in zip(spec.grid, combo)}
            label = ", ".join(f"{k}={v}" for k, v in zip(_grid_label_keys(spec.grid), combo))
            out.append(Arm(name, label, ov, spec.paper.get(name)))
        return out
    b, ts = spec.baseline, spec.techniques
    if spec.kind == "ladder":
        ov = dict(b.overrides)
        out.append(Arm(b.name, b.label, dict(ov), b.paper))
        for t in ts:
            ov.update(t.overrides)
            out.append(Arm(t.name, t.label, dict(ov), t.paper))
    elif spec.kind == "one_at_a_time":
        out.append(Arm(b.name, b.label, dict(b.overrides), b.paper))
        out += [Arm(t.name, t.label, {**b.overrides, **t.overrides}, t.paper) for t in ts]
    else:  # leave_one_out
        full = {k: v for t in ts for k, v in t.overrides.items()}
        out.append(Arm(spec.full.name, spec.full.label, dict(full), spec.full.paper))
        for t in ts:
            out.append(Arm(f"no_{t.name}", t.label,
                           {**full, **{k: b.overrides[k] for k in t.overrides}}, t.paper))
    # a top-level `paper:` mapping fills in (or sets) arm values
    return [Arm(a.name, a.label, a.overrides, spec.paper.get(a.name, a.paper)) for a in out]


def _base_data(spec: Spec) -> dict:
    return apply_overrides(read_yaml(spec.base), spec.base_overrides, where=f"{spec.path}: base_overrides")


def _arm_config(spec: Spec, base: dict, arm: Arm, seed: int, output: str) -> Config:
    where = f"{spec.path}: arm {arm.name!r} (seed {seed})"
    data = apply_overrides(base, arm.overrides, where=where)
    data = apply_overrides(data, {"train.seed": seed, "logging.sweep": spec.name, "logging.arm": arm.name,
                                  "logging.experiment": spec.name, "output_dir": output,
                                  **({"logging.declaration": spec.declaration} if spec.declaration else {})},
                           where=where)
    return build_config(data, where)


def _check_arms(spec: Spec) -> None:
    """Every arm builds; no two arms resolve to the same config; resources match the launch."""
    base = _base_data(spec)
    seen: dict[str, str] = {}
    for arm in arms(spec):
        cfg = _arm_config(spec, base, arm, spec.seeds[0], "runs")
        h = config_hash(cfg)
        if h in seen:
            raise ConfigError(f"{spec.path}: arms {seen[h]!r} and {arm.name!r} resolve to the same config "
                              f"(run id {h}); an arm must change something")
        seen[h] = arm.name
        if spec.metric not in eval_metric_names(cfg):
            raise ConfigError(f"{spec.path}: metric = {show(spec.metric)}: arm {arm.name!r} does not log it; "
                              f"its eval metrics: {', '.join(eval_metric_names(cfg))}")
        r, launch = spec.resources, cfg.launch
        want = (r.nodes, r.gpus_per_node) if r.gpus_per_node else (1, 1)
        if (launch.num_nodes, launch.num_processes) != want:
            raise ConfigError(
                f"{spec.path}: resources (nodes {r.nodes} × gpus_per_node {r.gpus_per_node}) do not match arm "
                f"{arm.name!r}'s launch.num_nodes = {launch.num_nodes}, launch.num_processes = "
                f"{launch.num_processes} (expected {want[0]} and {want[1]})")


def check_sources_exist(spec: Spec) -> None:
    """Every arm's data sets, eval sets and model.path exist here (:func:`dapo.preflight.check_sources`):
    run by ``dapo sweep expand/submit``, not by :func:`load_spec` (the analysis reads specs anywhere)."""
    base = _base_data(spec)
    for arm in arms(spec):
        check_sources(_arm_config(spec, base, arm, spec.seeds[0], "runs"), f"{spec.path}: arm {arm.name!r}")


def _diff(cfg: Config, base: Config) -> dict[str, Any]:
    skip = ("logging.", "output_dir", "name", "train.seed")
    a, b = flatten(to_dict(cfg)), flatten(to_dict(base))
    return {k: v for k, v in a.items() if b.get(k) != v and not k.startswith(skip)}



_UNSET = object()   # an override one arm has and the other has not


def inert_overrides(jobs: list[Job]) -> list[str]:
    """One warning per pair of arms that train identically: they differ only in keys that cannot change
    training under their other settings (:func:`dapo.config.inert_keys`), so the sweep runs one arm twice
    under two run ids."""
    from dapo.config import flatten, inert_keys, to_dict
    skip = ("train.seed", "name", "output_dir")
    first: dict[str, Job] = {}
    for j in jobs:
        first.setdefault(j.arm, j)
    effective: dict[str, tuple[dict, dict]] = {}
    for arm, j in first.items():
        inert = inert_keys(j.config)
        flat = {k: v for k, v in flatten(to_dict(j.config)).items()
                if k not in inert and not k.startswith("logging.") and k not in skip}
        effective[arm] = (flat, inert)
    out, arms_ = [], list(effective)
    for i, a in enumerate(arms_):
        for b in arms_[i + 1:]:
            if effective[a][0] != effective[b][0]:
                continue
            oa, ob = first[a].overrides, first[b].overrides
            keys = sorted(k for k in oa.keys() | ob.keys() if oa.get(k, _UNSET) != ob.get(k, _UNSET))
            why = "; ".join(f"{k}: {effective[a][1].get(k) or effective[b][1].get(k)}" for k in keys) or "no key"
            out.append(f"warning: arms {a} and {b} train identically: they differ only in keys that have no "
                       f"effect here ({why})")
    return out

def expand(spec: Spec | str | os.PathLike, output: str | os.PathLike = "runs") -> list[Job]:
    """All jobs of a sweep (arm-major, then seed), with run ids and run directories.

    ``output`` is the output root (default ``runs/``): run ``r`` lives in ``<output>/runs/r``.
    """
    if not isinstance(spec, Spec):
        spec = load_spec(spec)
    out_root = Path(output).resolve()
    base = _base_data(spec)
    base_cfg = build_config(base, f"{spec.base}")
    jobs = []
    for arm in arms(spec):
        if spec.only_arms and arm.name not in spec.only_arms:
            continue
        for seed in spec.seeds:
            cfg = _arm_config(spec, base, arm, seed, str(out_root))
            rid = config_hash(cfg)
            jobs.append(Job(arm=arm.name, label=arm.label, seed=seed, run_id=rid, run_dir=out_root / "runs" / rid,
                            overrides=_diff(cfg, base_cfg), config=cfg,
                            accelerate_config=accelerate_config_path(spec, cfg)))
    return jobs


def accelerate_config_path(spec: Spec, cfg: Config) -> Path | None:
    """``launch.accelerate_config`` as an absolute path, read as ``base:`` is: relative to the base
    experiment's folder, the spec's, the current directory, then this package's repo. A job runs from
    wherever it was submitted (submitit sets no directory), so a relative path never reaches it."""
    value = cfg.launch.accelerate_config
    if value is None:
        return None
    roots = tuple(dict.fromkeys((spec.base.parent, spec.path.parent, Path.cwd(), REPO_ROOT)))
    p = find_file(value, roots)
    if p is None:
        raise ConfigError(f"{spec.path}: launch.accelerate_config = {show(value)}: no such file (looked relative "
                          f"to {', '.join(str(r.resolve()) for r in roots)})")
    return p


def sweep_info(spec: Spec | str | os.PathLike) -> dict:
    """What the analysis needs: ``{name, kind, metric, final_k, arms: [{name, label, overrides, paper}]}``."""
    if not isinstance(spec, Spec):
        spec = load_spec(spec)
    return {"name": spec.name, "kind": spec.kind, "metric": spec.metric, "final_k": spec.final_k,
            **({"margins": dict(spec.margins)} if spec.margins else {}),
            **({"family": [list(p) for p in spec.family]} if spec.family else {}),
            **({"stopping": spec.stopping.to_dict(), "seeds": list(spec.seeds)} if spec.stopping else {}),
            "arms": [{"name": a.name, "label": a.label, "overrides": dict(a.overrides), "paper": a.paper}
                     for a in arms(spec)]}
