"""KL estimators k1, k2, k3 (Schulman, "Approximating KL divergence", 2020).

Notation: dapo.algo (B, G, N = B·G, L, V; ``mask: [N, L]``).
"""

from __future__ import annotations

from typing import Callable

from torch import Tensor



def _k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    return logp - ref_logp


def _k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    return 0.5 * (logp - ref_logp).square()


def _k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    d = (ref_logp - logp).clamp(-20.0, 20.0)  # log(π_ref/π); clamped for exp's sake (as verl)
    return d.exp() - d - 1.0


KL_KINDS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {"k1": _k1, "k2": _k2, "k3": _k3}


def kl_penalty(logp: Tensor, ref_logp: Tensor, kind: str = "k3") -> Tensor:
    """Per-token estimate of KL(π_θ ‖ π_ref) on tokens sampled from π_θ.

    logp, ref_logp: [N, L] -> [N, L]. With d = ref_logp − logp:
    k1 = −d (unbiased, can be < 0); k2 = d²/2 (biased, ≥ 0); k3 = e^d − d − 1 (unbiased, ≥ 0).
    Unlike verl, k3 is not clamped to [−10, 10] afterwards. Reduce with `aggregate`.
    """
    try:
        fn = KL_KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown KL estimator {kind!r}; valid: {sorted(KL_KINDS)}") from None
    return fn(logp, ref_logp)
