"""Which arms to compare: the DAPO techniques read off resolved configs, the (off, on) pair that
isolates each one, the full-DAPO arm, and a sweep description inferred from the runs alone.

Arms are compared by their resolved configs (flattened dotted keys), never by their names:
for a technique (see :data:`TOGGLES`), the pair (off, on) that differs in the fewest other
techniques, then in the fewest other config keys, then by the sweep's shape (ladder:
consecutive rows; leave-one-out: the full arm vs the arm without it; one-at-a-time: the
baseline vs the arm with it alone). Figures, tables and the report all ask this module.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pandas as pd

from dapo.config import flatten

from .metric_names import primary_metric
from .runs import ArmInfo, SweepInfo, arm_order

__all__ = ["TOGGLES", "DAPO_TOGGLES", "PAPER_STEP", "PAPER_FULL_STEP", "PAPER_BASE", "paper_point", "paper_delta", "arm_paper_value", "Toggle", "Pair", "dapo_pairs", "toggle_state", "arm_configs", "flat_arm_configs", "arms_with_runs",
           "find_pair", "exact_pairs", "toggle_states", "dapo_arm", "baseline_arm", "infer_sweep_info",
           "grid_change"]


# --------------------------------------------------------------------------- techniques
@dataclass(frozen=True)
class Toggle:
    """One technique (DAPO's or a successor's), read off a flattened resolved config."""
    title: str                                       # "Clip-Higher"
    keys: tuple[str, ...]                            # the config keys that define it
    state: Callable[[dict[str, Any]], bool]          # flat config → on?
    prefer: tuple[str, float] | None = None          # among equal pairs, the "on" value nearest the paper's
    absent: bool | None = None                       # its state in a config without keys[0] (None: unknown;
                                                     # False for keys added later: such a config had the default)


def _truthy(v: Any) -> bool:
    if isinstance(v, str):
        return v.strip().lower() in ("1", "true", "yes", "on")
    return bool(v)


TOGGLES: dict[str, Toggle] = {
    "overlong_filter": Toggle("overlong filtering", ("algo.overlong.filter",),
                              lambda c: _truthy(c["algo.overlong.filter"])),
    "clip_higher": Toggle("Clip-Higher", ("algo.clip.eps_high", "algo.clip.eps_low"),
                          lambda c: float(c["algo.clip.eps_high"]) > float(c.get("algo.clip.eps_low", 0.2)),
                          prefer=("algo.clip.eps_high", 0.28)),
    "soft_punish": Toggle("soft overlong punishment", ("algo.overlong.soft_punish",),
                          lambda c: _truthy(c["algo.overlong.soft_punish"])),
    "token_loss": Toggle("token-level loss", ("algo.loss_agg",),
                         lambda c: str(c["algo.loss_agg"]) == "token_mean"),
    "dynamic_sampling": Toggle("dynamic sampling", ("algo.dynamic_sampling.enabled", "algo.dynamic_sampling.mode"),
                               lambda c: _ds_mode(c) == "refill"),
    # DAPO's successors (issue 24; README, "The algorithm, as toggles"): one toggle per variant, so an
    # arm of a one-at-a-time sweep differs from its baseline in exactly one of them
    # Dr. GRPO is two changes: no std in Â (its state) and its constant normalizer; algo.loss_agg is among its
    # keys, so a pair that also switches to seq_mean_token_sum_const still isolates it
    "dr_grpo": Toggle("Dr. GRPO (no std)", ("algo.advantage.std", "algo.loss_agg"),
                      lambda c: c["algo.advantage.std"] == "none", absent=False),
    "batch_std": Toggle("batch std (LitePPO)", ("algo.advantage.std",),
                        lambda c: c["algo.advantage.std"] == "batch", absent=False),
    "rloo": Toggle("RLOO baseline", ("algo.advantage.baseline",),
                   lambda c: c["algo.advantage.baseline"] == "leave_one_out", absent=False),
    **{kind: Toggle(title, ("algo.policy_loss",), lambda c, k=kind: c["algo.policy_loss"] == k, absent=False)
       for kind, title in (("gspo", "GSPO"), ("cispo", "CISPO"), ("clip_cov", "Clip-Cov"), ("kl_cov", "KL-Cov"))},
    "top_entropy": Toggle("top-entropy tokens", ("algo.top_entropy_quantile",),
                          lambda c: float(c["algo.top_entropy_quantile"]) < 1.0,
                          prefer=("algo.top_entropy_quantile", 0.2), absent=False),
    "group_token_mean": Toggle("per-prompt token mean", ("algo.loss_agg",),
                               lambda c: c["algo.loss_agg"] == "group_token_mean"),
    "ds_filter": Toggle("dynamic sampling, filter", ("algo.dynamic_sampling.mode", "algo.dynamic_sampling.enabled"),
                        lambda c: _ds_mode(c) == "filter", absent=False),
    "ds_mask": Toggle("dynamic sampling, mask", ("algo.dynamic_sampling.mode", "algo.dynamic_sampling.enabled"),
                      lambda c: _ds_mode(c) == "mask", absent=False),
    # the behaviour policy (issue 23): the engine serving the policy in bf16 (explicitly: "auto" reads as
    # off, it is fp32 on CPUs), and a rollout correction of any mode
    "bf16_rollout": Toggle("bf16 rollout", ("model.rollout_dtype",),
                           lambda c: c["model.rollout_dtype"] == "bfloat16", absent=False),
    "rollout_correction": Toggle("rollout correction", ("algo.rollout_correction.mode",),
                                 lambda c: str(c["algo.rollout_correction.mode"]).lower() not in ("none", "false"),
                                 absent=False),
    "acc_band": Toggle("accuracy band", ("algo.dynamic_sampling.min_acc", "algo.dynamic_sampling.max_acc"),
                       lambda c: _ds_mode(c) is not None and (float(c["algo.dynamic_sampling.min_acc"]) > 0
                                                               or float(c.get("algo.dynamic_sampling.max_acc", 1)) < 1),
                       absent=False),
    "drop_solved": Toggle("drop solved prompts", ("data.drop_solved",), lambda c: _truthy(c["data.drop_solved"]),
                          absent=False),
    # off-policyness (issue 26): rollouts sampled with weights k updates old (any k > 0), and the bypass
    # objective (π_old := π_rollout, so the lag reaches the clipped ratio instead of a correction)
    "staleness": Toggle("stale rollouts", ("train.staleness",), lambda c: int(c["train.staleness"]) > 0,
                        absent=False),
    "bypass": Toggle("bypass objective (π_old = π_rollout)", ("algo.old_logprobs",),
                     lambda c: c["algo.old_logprobs"] == "rollout", absent=False),
}
DAPO_TOGGLES = ("overlong_filter", "clip_higher", "soft_punish", "token_loss", "dynamic_sampling")
"""The paper's five techniques (Table 1); the other toggles are its successors'."""


def _ds_mode(c: dict[str, Any]) -> str | None:
    """Dynamic sampling's mode in a flat config, None when it is off (a config from before the modes: refill)."""
    if not _truthy(c.get("algo.dynamic_sampling.enabled", False)):
        return None
    return str(c.get("algo.dynamic_sampling.mode", "refill"))


PAPER_STEP: dict[str, float] = {"overlong_filter": 6.0, "clip_higher": 2.0, "soft_punish": 3.0,
                                 "token_loss": 1.0, "dynamic_sampling": 8.0}
"""The paper's Table 1 step for each technique alone (AIME 2024 avg@32 points: 30 → 36 → 38 → 41 → 42 → 50)."""
PAPER_FULL_STEP = sum(PAPER_STEP.values())
"""The paper's naive GRPO → DAPO difference (30 → 50): the sum of the steps."""


PAPER_BASE = 30.0
"""Naive GRPO in the paper's Table 1 (AIME 2024 avg@32); each further row adds the next :data:`PAPER_STEP`."""


def _toggles_known(flat_cfg: dict[str, Any]) -> bool:
    """Whether every toggle's state can be read off the config (a sweep's overrides alone often cannot)."""
    return all(toggle_state(flat_cfg, t) is not None for t in TOGGLES)


def paper_point(flat_cfg: dict[str, Any]) -> float | None:
    """The paper's Table 1 value of a configuration the paper ran, else None.

    Table 1 ran six configurations: naive GRPO (30) and each prefix of its techniques in their order
    (overlong filtering 36, + Clip-Higher 38, + soft punishment 41, + token-level loss 42, + dynamic
    sampling 50). A configuration is one of them when its DAPO toggles are such a prefix and no
    successor's toggle is on; once soft punishment is on, overlong filtering may be either (Table 1
    stacks both, the final DAPO run used the punishment alone). Any other configuration (a technique
    on while an earlier one is off, GSPO, staleness, a toggle whose key the config lacks) is one the
    paper never ran."""
    states = {t: toggle_state(flat_cfg, t) for t in TOGGLES}
    if not _toggles_known(flat_cfg) or any(states[t] for t in TOGGLES if t not in DAPO_TOGGLES):
        return None
    on = [bool(states[t]) or (t == "overlong_filter" and bool(states["soft_punish"])) for t in DAPO_TOGGLES]
    j = sum(on)
    return PAPER_BASE + sum(PAPER_STEP[t] for t in DAPO_TOGGLES[:j]) if all(on[:j]) else None


def paper_delta(off: ArmInfo, on: ArmInfo, flat: dict[str, dict] | None = None) -> float:
    """The paper's Δ for the pair ``off`` → ``on``, only where the paper has that comparison.

    With both arms' flattened configs (``flat``: {arm: config}, :func:`flat_arm_configs`, every toggle
    readable), both must be configurations Table 1 ran (:func:`paper_point`) and differ in nothing but
    the DAPO techniques' keys, in two different rows;
    the Δ is then the difference of their rows (+ Clip-Higher after overlong filtering: +2; naive GRPO →
    DAPO: +20). A technique isolated in another context (dynamic sampling without soft punishment, a
    2 × 2's off-ladder corner, a successor's arm) gets NaN: the paper never ran it, so it predicts no
    direction there. Without both configs: on.paper − off.paper when the sweep gives both, else NaN."""
    if flat and off.name in flat and on.name in flat and all(map(_toggles_known, (flat[off.name], flat[on.name]))):
        a, b = flat[off.name], flat[on.name]
        p_off, p_on = paper_point(a), paper_point(b)
        technique_keys = {k for t in DAPO_TOGGLES for k in TOGGLES[t].keys}
        others_equal = not any(_differ(a.get(k), b.get(k)) for k in set(a) | set(b) if k not in technique_keys)
        ran = p_off is not None and p_on is not None and p_off != p_on and others_equal
        return p_on - p_off if ran else float("nan")
    if off.paper is not None and on.paper is not None:
        return float(on.paper) - float(off.paper)
    return float("nan")


def arm_paper_value(arm: ArmInfo, flat: dict[str, dict] | None = None) -> float:
    """The paper's Table 1 value beside an arm: :func:`paper_point` of its config when every toggle can
    be read off it (NaN for a configuration the paper never ran, whatever the sweep's ``paper:`` says),
    else the sweep's value, else NaN."""
    if flat and arm.name in flat and _toggles_known(flat[arm.name]):
        v = paper_point(flat[arm.name])
        return float("nan") if v is None else float(v)
    return float(arm.paper) if arm.paper is not None else float("nan")


def _settings(label: str) -> dict[str, str] | None:
    """``"model.rollout_dtype=float32, rollout_correction.mode=none"`` (a grid arm's label) → its settings;
    None for any other label."""
    parts = [p.partition("=") for p in label.split(", ")]
    return {k: v for k, _, v in parts} if all(k and eq for k, eq, _ in parts) else None


def grid_change(off: ArmInfo, on: ArmInfo) -> str | None:
    """What differs between two grid arms with the same keys, then what they share:
    ``"rollout_correction.mode none → tis (model.rollout_dtype=float32)"``; None for other arms."""
    a, b = _settings(off.label or ""), _settings(on.label or "")
    if a is None or b is None or a.keys() != b.keys() or a == b:
        return None
    diff = ", ".join(f"{k} {a[k]} → {b[k]}" for k in a if a[k] != b[k])
    same = ", ".join(f"{k}={a[k]}" for k in a if a[k] == b[k])
    return f"{diff} ({same})" if same else diff


def toggle_states(off_cfg: dict[str, Any], on_cfg: dict[str, Any]) -> dict[str, tuple[bool | None, bool | None]]:
    """{technique: (its state in off_cfg, in on_cfg)} for every technique of :data:`TOGGLES` (None: not known)."""
    return {t: (toggle_state(off_cfg, t), toggle_state(on_cfg, t)) for t in TOGGLES}


def toggle_state(flat_cfg: dict[str, Any], toggle: str) -> bool | None:
    """Whether ``toggle`` is on in a flattened config; None if its key is not there (the toggle's
    ``absent`` state for a key added after older runs existed)."""
    t = TOGGLES[toggle]
    if t.keys[0] not in flat_cfg:
        return t.absent
    try:
        return bool(t.state(flat_cfg))
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class Pair:
    """Two arms compared for one technique."""
    toggle: str
    off: ArmInfo
    on: ArmInfo
    other_toggles: tuple[str, ...] = ()   # techniques that also differ
    other_keys: tuple[str, ...] = ()      # other config keys that also differ

    @property
    def exact(self) -> bool:
        return not self.other_toggles and not self.other_keys

    def describe(self) -> str:
        s = f"“{self.off.label}” (without) vs “{self.on.label}” (with {TOGGLES[self.toggle].title})"
        if self.exact:
            return s + "; they differ only in this technique."
        extra = [TOGGLES[t].title for t in self.other_toggles] + list(self.other_keys)
        return s + "; they also differ in: " + ", ".join(extra) + "."


def flat_arm_configs(tidy: pd.DataFrame, sweep: SweepInfo, configs: dict | None) -> dict[str, dict]:
    """Per arm: the flattened resolved config keys (from runs) filled in with the sweep's overrides."""
    from_runs = arm_configs(tidy, configs) if configs else {}
    out = {}
    for a in arms_with_runs(tidy, sweep):
        c = dict(flatten(a.overrides)) if a.overrides else {}
        c.update(from_runs.get(a.name, {}))
        out[a.name] = c
    return out


def arms_with_runs(tidy: pd.DataFrame, sweep: SweepInfo) -> list[ArmInfo]:
    """The sweep's arms that have runs, in sweep order (then any arm only the runs know)."""
    present = arm_order(tidy)
    arms = [a for a in sweep.arms if a.name in present]
    known = {a.name for a in arms}
    arms += [ArmInfo(name=n) for n in present if n not in known and n not in {a.name for a in sweep.arms}]
    return arms


def _differ(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        try:
            return not np.isclose(float(a), float(b), rtol=1e-9, atol=0)
        except (TypeError, ValueError):
            pass
    return a != b


def _other_keys(co: dict[str, Any], cn: dict[str, Any], own: set[str]) -> list[str]:
    """The keys outside ``own`` whose values differ between two flat configs (sorted)."""
    return sorted(k for k in set(co) | set(cn) if k not in own and _differ(co.get(k), cn.get(k)))


def find_pair(toggle: str, tidy: pd.DataFrame, sweep: SweepInfo, configs: dict | None = None,
              *, _acfg: dict | None = None) -> Pair | None:
    """The (off, on) arms that isolate ``toggle`` best, or None if no arm pair differs in it."""
    arms = arms_with_runs(tidy, sweep)
    acfg = _acfg if _acfg is not None else flat_arm_configs(tidy, sweep, configs)
    state = {a.name: toggle_state(acfg[a.name], toggle) for a in arms}
    pos = {a.name: i for i, a in enumerate(arms)}
    n_on = {a.name: sum(bool(toggle_state(acfg[a.name], t)) for t in TOGGLES) for a in arms}
    full = max(arms, key=lambda a: (n_on[a.name], pos[a.name])).name if arms else None
    base = min(arms, key=lambda a: (n_on[a.name], pos[a.name])).name if arms else None
    own = set(TOGGLES[toggle].keys)
    best, best_key = None, None
    for off in arms:
        for on in arms:
            if state[off.name] is not False or state[on.name] is not True:
                continue
            co, cn = acfg[off.name], acfg[on.name]
            others = tuple(t for t in TOGGLES if t != toggle
                           and toggle_state(co, t) != toggle_state(cn, t))
            tkeys = {k for t in others for k in TOGGLES[t].keys}
            keys = tuple(_other_keys(co, cn, own | tkeys))
            if sweep.kind == "ladder":
                shape = abs(pos[on.name] - pos[off.name]) - 1
            elif sweep.kind == "leave_one_out":
                shape = int(on.name != full)
            elif sweep.kind == "one_at_a_time":
                shape = int(off.name != base)
            else:
                shape = 0
            near = 0.0
            if TOGGLES[toggle].prefer:  # e.g. an ε_high grid: compare 0.2 with 0.28, the paper's value
                k, v = TOGGLES[toggle].prefer
                try:
                    near = abs(float(cn.get(k)) - v)
                except (TypeError, ValueError):
                    pass
            key = (len(others), len(keys), shape, near, pos[on.name], pos[off.name])
            if best_key is None or key < best_key:
                best, best_key = Pair(toggle, off, on, others, keys), key
    return best


def exact_pairs(tidy: pd.DataFrame, sweep: SweepInfo, configs: dict | None = None,
                *, _acfg: dict | None = None) -> list[Pair]:
    """Every (off, on) pair of arms that differs in exactly one technique and in nothing else, by
    technique (:data:`TOGGLES` order) then arm order: a 2 × 2 grid gives four, a leave-one-out sweep
    one per technique."""
    arms = arms_with_runs(tidy, sweep)
    acfg = _acfg if _acfg is not None else flat_arm_configs(tidy, sweep, configs)
    out = []
    for off in arms:
        for on in arms:
            co, cn = acfg[off.name], acfg[on.name]
            diff = [(t, s) for t, s in toggle_states(co, cn).items() if s[0] != s[1]]
            if len(diff) != 1 or diff[0][1] != (False, True):
                continue
            own = set(TOGGLES[diff[0][0]].keys)
            if not _other_keys(co, cn, own):
                out.append(Pair(diff[0][0], off, on))
    order = list(TOGGLES)
    return sorted(out, key=lambda p: order.index(p.toggle))           # stable: arm order within a technique


def dapo_pairs(tidy: pd.DataFrame, sweep: SweepInfo, configs: dict | None = None,
               *, _acfg: dict | None = None) -> list[tuple[ArmInfo, ArmInfo, str]]:
    """Every (off, on, setting) where ``on`` is ``off`` with all of DAPO's techniques switched on and
    nothing else changed: naive GRPO → DAPO once per setting of the other keys (a staleness sweep:
    at k = 0, 1, 2). ``setting``: ``off``'s values of the keys that differ among the pairs' ``off`` arms
    ("train.staleness=1"; "" when there is one pair). In arm order."""
    arms = arms_with_runs(tidy, sweep)
    acfg = _acfg if _acfg is not None else flat_arm_configs(tidy, sweep, configs)
    dkeys = {k for t in DAPO_TOGGLES for k in TOGGLES[t].keys}
    out: list[tuple[ArmInfo, ArmInfo]] = []
    for off in arms:
        for on in arms:
            co, cn = acfg[off.name], acfg[on.name]
            states = toggle_states(co, cn)
            # overlong filtering is off in the paper's DAPO: either state, the same in both arms
            if any(states[t] != (False, True) for t in DAPO_TOGGLES if t != "overlong_filter") \
                    or any(a != b for t, (a, b) in states.items() if t not in DAPO_TOGGLES[1:]):
                continue
            if not _other_keys(co, cn, dkeys):
                out.append((off, on))
    if not out:
        return []
    offs = [acfg[off.name] for off, _ in out]
    varying = sorted(k for k in set().union(*offs) if any(_differ(offs[0].get(k), c.get(k)) for c in offs[1:]))
    return [(off, on, ", ".join(f"{k}={acfg[off.name].get(k)}" for k in varying)) for off, on in out]


def dapo_arm(tidy: pd.DataFrame, sweep: SweepInfo, configs: dict | None = None,
             *, _acfg: dict | None = None) -> ArmInfo | None:
    """The full-DAPO arm: a ladder's last row; else the arm named "dapo"; else the one with most
    techniques (ties: the later arm). None without runs."""
    return _end_arm(tidy, sweep, configs, _acfg, ladder_index=-1, name="dapo", choose=max, toggles=DAPO_TOGGLES)


def baseline_arm(tidy: pd.DataFrame, sweep: SweepInfo, configs: dict | None = None,
                 *, _acfg: dict | None = None) -> ArmInfo | None:
    """The baseline arm (GRPO): a ladder's first row; else the arm named "grpo"; else the one with
    fewest techniques (ties: the earlier arm). None without runs."""
    return _end_arm(tidy, sweep, configs, _acfg, ladder_index=0, name="grpo", choose=min, toggles=tuple(TOGGLES))


def _end_arm(tidy: pd.DataFrame, sweep: SweepInfo, configs: dict | None, acfg: dict | None, *,
             ladder_index: int, name: str, choose, toggles: tuple[str, ...]) -> ArmInfo | None:
    """One end of the technique count: a ladder's row ``ladder_index``, else the arm called ``name``,
    else ``choose`` (min/max) over (techniques of ``toggles`` on, arm order)."""
    arms = arms_with_runs(tidy, sweep)
    if not arms:
        return None
    if sweep.kind == "ladder":
        return arms[ladder_index]
    for a in arms:
        if a.name.lower() == name:
            return a
    acfg = acfg if acfg is not None else flat_arm_configs(tidy, sweep, configs)
    return choose(arms, key=lambda a: (sum(bool(toggle_state(acfg[a.name], t)) for t in toggles),
                                       [x.name for x in arms].index(a.name)))


# --------------------------------------------------------------------------- arms from configs
_NOISE_KEY = re.compile(r"^(name|output_dir)$|^(logging|launch|checkpoint)\.|(^|\.)seed$|^train\.threads$")


def _hashable(v: Any) -> Any:
    return json.dumps(v, sort_keys=True, default=str) if isinstance(v, (list, dict)) else v


def arm_configs(tidy: pd.DataFrame, configs: dict[str, dict]) -> dict[str, dict[str, Any]]:
    """Per arm: the flattened resolved config keys shared by all its runs (noise keys removed).

    Keys whose value differs between runs of one arm (seeds, output paths) and bookkeeping
    keys (``logging.*``, ``launch.*``, ``checkpoint.*``, ``*.seed``) are dropped.
    """
    out: dict[str, dict[str, Any]] = {}
    pairs = tidy[["arm", "run"]].drop_duplicates()
    for arm, runs in pairs.groupby("arm", sort=False)["run"]:
        flats = [flatten(configs[r]) for r in runs if r in configs]
        if not flats:
            continue
        common = {}
        for k, v in flats[0].items():
            if _NOISE_KEY.search(k):
                continue
            if all(k in f and _hashable(f[k]) == _hashable(v) for f in flats[1:]):
                common[k] = v
        out[arm] = common
    return out


def infer_sweep_info(tidy: pd.DataFrame, configs: dict[str, dict], sweep_name: str | None = None,
                     *, kind: str | None = None) -> SweepInfo:
    """A SweepInfo from the runs alone (no sweep file): arms from the ``dapo.arm`` tags.

    Arms are ordered by how many DAPO techniques they enable (GRPO first), ties by start;
    overrides are the config keys that differ between arms; a chain of strictly growing
    technique sets is called a ladder, anything else a grid. No paper values.
    """
    name = sweep_name or (tidy["sweep"].iloc[0] if len(tidy) else "sweep")
    order = arm_order(tidy)
    acfg = arm_configs(tidy, configs)
    on = {a: frozenset(t for t in TOGGLES if toggle_state(acfg.get(a, {}), t)) for a in order}
    order = sorted(order, key=lambda a: (len(on[a]), order.index(a)))
    keys = sorted({k for c in acfg.values() for k in c})
    varying = [k for k in keys if len({_hashable(acfg.get(a, {}).get(k, None)) for a in order}) > 1]
    arms = tuple(ArmInfo(name=a, label=a, overrides={k: acfg.get(a, {}).get(k) for k in varying})
                 for a in order)
    if kind is None:
        chain = len(order) > 1 and all(on[x] < on[y] for x, y in zip(order, order[1:]))
        kind = "ladder" if chain else "grid"
    return SweepInfo(name=name, kind=kind, arms=arms, metric=primary_metric(tidy))
