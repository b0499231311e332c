"""Weight sync: push the trainer's current weights into the rollout engine (step 7 of the loop, docs/METRICS.md)."""

from __future__ import annotations

__all__ = ["push_weights"]


def push_weights(policy, engine) -> None:
    """Load ``policy`` (a :class:`dapo.update.Policy`) into ``engine`` in-process.

    The full ``state_dict`` of the unwrapped model is sent (tied ``lm_head.weight`` included).
    """
    engine.update_weights(list(policy.module.state_dict().items()))
