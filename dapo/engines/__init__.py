"""Rollout engines behind one interface (:class:`RolloutEngine`): ``make_engine("vllm" | "hf", ...)``.

Importing this package does not import vllm; only building a "vllm" engine does.
"""

from dapo.engines.base import (
    ENGINES,
    Completion,
    RolloutEngine,
    SamplingSpec,
    make_engine,
)

__all__ = ["ENGINES", "Completion", "RolloutEngine", "SamplingSpec", "make_engine"]
