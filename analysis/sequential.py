"""A stopping rule that keeps α: the exact sign-flip test over declared looks (group-sequential).

A spec's ``stopping: {looks: [n_1, …, n_K], spending, alpha}`` says, before the runs, at how many
pairs each comparison is tested and how α is spent over the looks. Look k uses the pairs of the
spec's first n_k seeds (in the spec's order), whatever else has run.

**The boundary.** Under H0 the paired differences d_i are symmetric about 0, so given their sizes
|d_i| the signs s_i are independent fair coins, independent of the sizes (the sign-flip argument).
At look k the two-sided exact sign-flip p-value p_k(s) = P(|Σ_{i≤n_k} s'_i|d_i|| ≥ |Σ_{i≤n_k} s_i|d_i||)
depends on the first n_k signs only. Given the sizes seen so far, the joint null law of (p_1, …, p_k)
is exact by enumerating the 2^{n_k} sign vectors (:data:`ENUM_MAX_N` at most; Monte Carlo above).
For a level u the nominal thresholds c_1(u), c_2(u), … are chosen look by look (Lan–DeMets error
spending, conditional on the sizes known at that look): c_k is the largest attainable p-value with

    P_H0(p_j ≤ c_j for some j ≤ k) ≤ α*(t_k; u),   t_k = n_k / n_K,

α*(t; u) the declared spending function: ``obrien_fleming`` 2 − 2Φ(z_{1−u/2}/√t), ``pocock``
u·ln(1 + (e − 1)t). The thresholds of look k use only sizes known at look k, so the rule is fixed
before look k's signs are seen, and its probability of a rejection at any look is ≤ u (given all
sizes, hence unconditionally). A comparison stopped early (decided) only rejects less.

**The repeated p-value** of a comparison at look k is the smallest u at which the rule rejects at
some look ≤ k (on a grid of levels, :func:`repeated_p`). Under H0 it is ≤ u with probability ≤ u however the looks were
stopped, so Holm over a family's repeated p-values keeps the family-wise error at α
(:func:`sequential_family`). TOST uses the same construction on its two one-sided tests.

A look past the declared last one is an **unplanned look**: its pairs are tested with the whole α
already spent at t = 1, and the report marks its verdicts. :func:`simulate_size` checks the size by
simulation (tests/test_sequential.py); :func:`design_power` gives power and expected pairs against a
fixed design (bench/bench_sequential.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .stats import ALPHA, _finite, holm

__all__ = ["SPENDING", "spent", "look_pvalues", "boundaries", "repeated_p", "SequentialResult",
           "sequential_test", "sequential_family", "simulate_size", "design_power", "ENUM_MAX_N"]

ENUM_MAX_N = 18
"""Up to this many pairs the joint null law over looks is enumerated (2^n sign vectors); above,
:data:`MC_VECTORS` random sign vectors from a fixed seed."""
MC_VECTORS = 1 << 17


def _phi(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def _z(q: float) -> float:
    from scipy.stats import norm
    return float(norm.ppf(q))


def _obf(t: float, u: float) -> float:
    return 2 - 2 * _phi(_z(1 - u / 2) / math.sqrt(t)) if t > 0 else 0.0


def _pocock(t: float, u: float) -> float:
    return u * math.log(1 + (math.e - 1) * t)


SPENDING = {"obrien_fleming": _obf, "pocock": _pocock}
"""Cumulative α spent by information fraction t ∈ (0, 1] at overall level u (Lan & DeMets 1983)."""


def spent(t: float, u: float, spending: str) -> float:
    """α*(min(t, 1); u): the α a ``spending`` function has spent by information fraction t."""
    if spending not in SPENDING:
        raise ValueError(f"spending = {spending!r}: expected one of {', '.join(SPENDING)}")
    return SPENDING[spending](min(max(t, 0.0), 1.0), u)


@lru_cache(maxsize=8)
def _signs(n: int) -> np.ndarray:
    """[V, n] sign vectors: all 2^n (n ≤ ENUM_MAX_N) or MC_VECTORS random ones (seed 0)."""
    if n <= ENUM_MAX_N:
        bits = (np.arange(2 ** n)[:, None] >> np.arange(n)[None, :]) & 1
        return (1.0 - 2.0 * bits).astype(np.float64)
    return np.random.default_rng(0).choice([-1.0, 1.0], size=(MC_VECTORS, n))


def _stat(sums: np.ndarray, alternative: str) -> np.ndarray:
    return {"two-sided": np.abs, "greater": lambda s: s, "less": lambda s: -s}[alternative](sums)


def look_pvalues(sizes: np.ndarray, looks: tuple[int, ...], alternative: str = "two-sided"
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(P [V, K], observed [K]): each sign vector's sign-flip p-value at each look, and the observed ones.

    sizes: [n_K] the signed differences in look order (the observed vector is row "all +1" applied to
    them); looks: (n_1 < … < n_K = len(sizes)). P[v, k] = the fraction of vectors whose statistic over the
    first n_k pairs is ≥ vector v's (ties count, relative tolerance 1e-12)."""
    d = np.asarray(sizes, dtype=float)
    a = np.abs(d)
    S = _signs(len(d))                                     # [V, n]
    tol = 1e-12 * max(1.0, float(a.max()) if a.size else 1.0)
    P = np.empty((S.shape[0], len(looks)))
    obs = np.empty(len(looks))
    for k, n in enumerate(looks):
        st = _stat(S[:, :n] @ a[:n], alternative)          # [V] (the flipped statistics)
        srt = np.sort(st)
        P[:, k] = 1.0 - np.searchsorted(srt, st - tol, side="left") / st.size
        o = float(_stat(np.array([d[:n].sum()]), alternative)[0])
        obs[k] = 1.0 - np.searchsorted(srt, o - tol, side="left") / st.size
    return P, obs


def boundaries(P: np.ndarray, fractions: tuple[float, ...], u: float, spending: str) -> np.ndarray:
    """[K] nominal p thresholds c_k(u): look by look the largest attainable p with
    P(p_j ≤ c_j for some j ≤ k) ≤ α*(t_k; u) (0 when none fits)."""
    V, K = P.shape
    hit = np.zeros(V, dtype=bool)
    c = np.zeros(K)
    for k in range(K):
        target = spent(fractions[k], u, spending) + 1e-12
        cand = np.unique(P[~hit, k])                      # attainable values, ascending
        if cand.size == 0:
            continue
        # rejection rate if c = cand[j]: already hit + those not hit with P[:, k] ≤ cand[j]
        newly = np.searchsorted(np.sort(P[~hit, k]), cand, side="right")
        rate = (hit.sum() + newly) / V
        ok = np.flatnonzero(rate <= target)
        if ok.size:
            c[k] = cand[ok[-1]]
            hit |= P[:, k] <= c[k]
    return c


LEVEL_GRID = np.unique(np.concatenate([np.geomspace(1e-4, 1.0, 121), ALPHA / np.arange(1, 11)]))
"""The levels u at which :func:`repeated_p` runs the rule: 121 log-spaced in [1e-4, 1] and α/1 … α/10
(the levels Holm's steps compare with)."""


def repeated_p(P: np.ndarray, obs: np.ndarray, fractions: tuple[float, ...], spending: str) -> tuple[float, int]:
    """(repeated p, the look that decides at that level, 1-based; 0 when p = 1).

    The smallest grid level g such that the rule rejects at *every* grid level ≥ g (scanning down from
    1). The discrete boundaries are not always monotone in u (a larger u spends more at an early look
    and can leave less for a later one), so "the smallest u that rejects" could be reached at a u the
    rule does not reject at; this definition cannot: p ≤ u0 implies a rejection at the grid level
    p ≤ u0, whose probability under H0 is ≤ p ≤ u0. So the repeated p is a valid p-value whatever
    the looks taken."""
    def crosses(u: float) -> int:
        c = boundaries(P, fractions, u, spending)
        at = np.flatnonzero(obs <= c + 1e-12)
        return int(at[0]) + 1 if at.size else 0
    best, look = 1.0, 0
    for g in LEVEL_GRID[::-1]:
        k = crosses(float(g))
        if not k:
            break
        best, look = float(g), k
    if best >= 1.0 and not look:
        return 1.0, 0
    return best, look


@dataclass(frozen=True)
class SequentialResult:
    """One comparison under a declared stopping rule."""
    n: int                 # pairs available (in the declared seed order)
    looks_done: tuple[int, ...]   # the declared looks these pairs complete (plus n when unplanned)
    unplanned: bool        # more pairs than the declared last look
    p: float               # repeated two-sided p at the last look done (NaN: no look done)
    look: int              # 1-based look at which p was reached (0: none)
    p_tost: float          # repeated TOST p (NaN without a margin)
    look_tost: int


def _looks_done(n: int, looks: tuple[int, ...]) -> tuple[tuple[int, ...], bool]:
    done = tuple(x for x in looks if x <= n)
    if n > looks[-1]:
        return done + (n,), True
    return done, False


def sequential_test(diffs_in_seed_order, looks: tuple[int, ...], spending: str, *,
                    margin: float | None = None) -> SequentialResult:
    """The repeated p-values of one comparison: diffs [n] ordered as the declared seeds (NaNs: seeds
    without a pair, which end the usable prefix); looks as declared; margin: TOST's ±margin."""
    d = np.asarray(diffs_in_seed_order, dtype=float)
    bad = np.flatnonzero(~np.isfinite(d))
    d = d[: bad[0]] if bad.size else d
    n = d.size
    done, unplanned = _looks_done(n, tuple(looks))
    if not done:
        return SequentialResult(n, (), False, float("nan"), 0, float("nan"), 0)
    fr = tuple(x / looks[-1] for x in done)
    d = d[: done[-1]]
    P, obs = look_pvalues(d, done, "two-sided")
    p, look = repeated_p(P, obs, fr, spending)
    p_t, look_t = float("nan"), 0
    if margin is not None and np.isfinite(margin) and margin > 0:
        Pl, ol = look_pvalues(d + margin, done, "greater")
        Pu, ou = look_pvalues(d - margin, done, "less")
        (pl, kl), (pu, ku) = repeated_p(Pl, ol, fr, spending), repeated_p(Pu, ou, fr, spending)
        p_t, look_t = max(pl, pu), max(kl, ku) if min(kl, ku) else 0
    return SequentialResult(n, done, unplanned, p, look, p_t, look_t)


def _holm_family(diffs: list, looks: tuple[int, ...], spending: str, margin: float | None):
    res = [sequential_test(d, looks, spending, margin=margin) for d in diffs]
    return res, holm([r.p for r in res]), holm([r.p_tost for r in res])


def sequential_family(diffs: list, looks: tuple[int, ...], spending: str, *, margin: float | None = None,
                      alpha: float = ALPHA) -> list[dict]:
    """Holm over a family's repeated p-values (and, separately, over its repeated TOST p-values).

    diffs: per comparison, [n] in declared seed order. Returns per comparison: n, looks_done,
    unplanned, p_seq, p_seq_holm, p_tost_seq, p_tost_seq_holm, decided (p_seq_holm ≤ α or
    p_tost_seq_holm ≤ α) and look: the first look (1-based) at which the family, analysed with the
    pairs of that look and those before it, decided the row; 0 while undecided."""
    res, ph, th = _holm_family(diffs, looks, spending, margin)
    dec = [bool((np.isfinite(a) and a <= alpha) or (np.isfinite(b) and b <= alpha)) for a, b in zip(ph, th)]
    first = [0] * len(res)
    n_done = max((len(r.looks_done) for r in res), default=0)
    for k in range(1, n_done + 1):          # the family as it stood at look k (its first n_k pairs each)
        cut = [np.asarray(d, dtype=float)[: (r.looks_done[k - 1] if len(r.looks_done) >= k else 0)]
               for d, r in zip(diffs, res)]
        _, pk, tk = _holm_family(cut, looks, spending, margin)
        for i, (a, b) in enumerate(zip(pk, tk)):
            if not first[i] and ((np.isfinite(a) and a <= alpha) or (np.isfinite(b) and b <= alpha)):
                first[i] = k
    return [{"n": r.n, "looks_done": r.looks_done, "unplanned": r.unplanned, "p_seq": r.p,
             "p_seq_holm": float(a), "p_tost_seq": r.p_tost, "p_tost_seq_holm": float(b), "decided": d,
             "look": first[i] if d else 0}
            for i, (r, a, b, d) in enumerate(zip(res, ph, th, dec))]


# --------------------------------------------------------------------------- checks by simulation
def _draw(rng, n: int, effect: float) -> np.ndarray:
    return rng.standard_normal(n) + effect


def simulate_size(looks: tuple[int, ...], spending: str, *, m: int = 1, alpha: float = ALPHA, n_sim: int = 2000,
                  seed: int = 0, continue_all: bool = True) -> float:
    """Family-wise rejection rate under the global null (m comparisons, normal differences, Holm over
    repeated p-values, every look taken): the size the rule keeps, estimated from ``n_sim`` experiments."""
    rng = np.random.default_rng(seed)
    rejections = 0
    for _ in range(n_sim):
        fam = sequential_family([_draw(rng, looks[-1], 0.0) for _ in range(m)], looks, spending, alpha=alpha)
        rejections += any(r["p_seq_holm"] <= alpha for r in fam)
    return rejections / n_sim


def design_power(looks: tuple[int, ...], spending: str, effect_size: float, *, alpha: float = ALPHA,
                 n_sim: int = 500, seed: int = 0) -> tuple[float, float]:
    """(power, expected pairs) of one comparison at Δ/SD = ``effect_size`` under the rule, stopping at the
    first look that decides (rejects); normal differences."""
    rng = np.random.default_rng(seed)
    wins, pairs = 0, 0.0
    for _ in range(n_sim):
        d = _draw(rng, looks[-1], effect_size)
        used = looks[-1]
        for k in range(1, len(looks) + 1):
            r = sequential_test(d[: looks[k - 1]], looks, spending)
            if r.p <= alpha:
                wins += 1
                used = looks[k - 1]
                break
        pairs += used
    return wins / n_sim, pairs / n_sim
