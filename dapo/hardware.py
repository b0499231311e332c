"""What CPU this process runs on: its model name and instruction flags, read once from /proc/cpuinfo.

CPU kernels differ by model and instruction set, and so do the numbers a run computes on them: bf16
autocast is used only where the CPU has bf16 instructions (:func:`has_bf16`), runs and benches name the
CPU they ran on (:func:`cpu_name`), and a base model is built on the machine that first needs it.
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path

#: the instructions that make CPU bf16 matmuls native (AVX512-BF16, AMX)
BF16_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> tuple[str, frozenset[str]]:
    """(model name, flags) of the first processor in /proc/cpuinfo; ("", {}) where there is none."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return "", frozenset()
    field = lambda key: next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith(key)), "")
    return field("model name"), frozenset(field("flags").split())


def cpu_model() -> str:
    """The CPU's model name, e.g. ``AMD EPYC 7B13`` (elsewhere: the platform's processor or machine)."""
    return _cpuinfo()[0] or platform.processor() or platform.machine() or "unknown"


def cpu_flags() -> frozenset[str]:
    """The CPU's instruction flags (empty where /proc/cpuinfo is absent)."""
    return _cpuinfo()[1]


def has_bf16() -> bool:
    """Whether this CPU has native bf16 instructions (:data:`BF16_FLAGS`)."""
    return bool(cpu_flags() & BF16_FLAGS)


def cpu_name() -> str:
    """The CPU's model name and its bf16 instructions, e.g. ``Intel(R) Xeon(R) Processor (amx_bf16,
    avx512_bf16)``."""
    bf16 = sorted(cpu_flags() & BF16_FLAGS)
    return cpu_model() + (f" ({', '.join(bf16)})" if bf16 else "")
