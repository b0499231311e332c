"""The device check's probes (scripts/device_probes.py): rehearsed on CPU at tiny shapes.

On a GPU each probe prints one line with its measured number beside ``dapo plan``'s; here the same code
runs on CPU (``scripts/device_check.py --cpu --probes only``), and each line must be there, with a number,
and not a failure. A failing probe prints one line and the others still run.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PROBES = ("runtime overhead", "logits", "decoder layer", "DCP async_save", "toolchain+compile")
NUMBER = re.compile(r"\d+(\.\d+)?")


def _probes():
    """scripts/device_probes.py as a module."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        return importlib.import_module("device_probes")
    finally:
        sys.path.remove(str(REPO / "scripts"))


@pytest.mark.slow
def test_the_cpu_rehearsal_prints_one_measured_line_per_probe(tmp_path):
    """``--cpu --probes only``: the five probe lines, each with a number and its elapsed seconds, none failed;
    the plan's number beside the measured one where the plan has a term (memory on CPU: the plan's only)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    p = subprocess.run([sys.executable, "scripts/device_check.py", "--cpu", "--probes", "only", "--workdir",
                        str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    lines = [line for line in out.splitlines() if line.startswith("[device-check] probe ")]
    assert len(lines) == len(PROBES), lines
    for name, line in zip(PROBES, lines):
        assert line.startswith(f"[device-check] probe {name}: "), line
        assert "FAILED" not in line, line
        assert re.search(r"\[\d+\.\d s\]$", line), line                      # elapsed per probe
        assert NUMBER.search(line.split(": ", 1)[1]), line
    by = dict(zip(PROBES, lines))
    assert "n/a on CPU" in by["runtime overhead"] and "plan's runtime overhead 3 GiB" in by["runtime overhead"]
    assert re.search(r"forward\+backward \d+\.\d ms .*plan \d\.\d+ GiB \(logits terms", by["logits"])
    assert "flash/efficient SDPA only" in by["decoder layer"] and "1024 tokens" in by["decoder layer"]
    assert re.search(r"plan: MFU 35% of it = \d", by["decoder layer"])
    assert re.search(r"the caller waited \d+\.\d+ s .* the write ended after \d+\.\d+ s", by["DCP async_save"])
    assert "plan for 1 GPU: waits" in by["DCP async_save"]
    assert re.search(r"first call \d+\.\d s \(compile\), then \d+\.\d ms vs eager", by["toolchain+compile"])
    assert out.strip().splitlines()[-1].startswith("[device-check] device-check: OK")
    assert not any(tmp_path.rglob("dcp-probe")) and not any(tmp_path.rglob("*.distcp"))   # the probe's files removed


def test_a_failing_probe_prints_one_line_and_the_next_still_runs(capsys):
    """guarded(): an exception becomes one ``probe NAME: FAILED: Type: message [s]`` line (newlines folded,
    at most 300 characters of message); the next probe runs and prints its own line."""
    import torch
    probes = _probes()

    def broken() -> str:
        raise RuntimeError("no kernel\nfor this\n" + "x" * 400)
    cpu = torch.device("cpu")
    assert probes.guarded("first", broken, cpu) is False
    assert probes.guarded("second", lambda: "42 units", cpu) is True
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert re.fullmatch(r"\[device-check\] probe first: FAILED: RuntimeError: no kernel for this x+… \[\d+\.\d s\]",
                        lines[0]) and len(lines[0]) < 380, lines[0]
    assert re.fullmatch(r"\[device-check\] probe second: 42 units \[\d+\.\d s\]", lines[1]), lines[1]


def test_the_layer_probe_repeats_kv_heads_only_where_no_kernel_takes_grouped_ones(monkeypatch):
    """Where flash/efficient SDPA refuses ``enable_gqa``, the layer runs once more with transformers repeating
    the K/V heads (said in the line), and transformers' own choice is restored afterwards."""
    import torch
    import transformers.integrations.sdpa_attention as sdpa
    probes = _probes()
    seen = []

    def fake(layer, rotary, full, device):
        seen.append(sdpa.use_gqa_in_sdpa(None, torch.zeros(1, 1, 1, 8), torch.zeros(1, 1, 1, 8)))
        if len(seen) == 1:
            raise RuntimeError("No available kernel. Aborting execution.")
        return full, 0.5, None
    original = sdpa.use_gqa_in_sdpa
    monkeypatch.setattr(probes, "_fitting_run", fake)
    seq, dt, peak, note = probes._run_flash_only(None, None, 64, torch.device("cpu"))
    assert (seq, dt, peak) == (64, 0.5, None) and seen == [True, False]
    assert note.startswith(" (K/V heads repeated: with enable_gqa RuntimeError: No available kernel")
    assert sdpa.use_gqa_in_sdpa is original


def test_the_logits_plan_terms_are_the_paper_chunks():
    """At the GPU sizes (2,048 positions, one 2,048-token chunk, vocabulary 152,064) the plan's logits terms are
    the bf16 logits and their gradient, and one chunk's fp32 log-softmax with two gradients: 16·N·V bytes."""
    probes = _probes()
    s = probes.GPU_SIZES
    terms = {k: v for k, v in probes.plan_update_terms(s, s.positions, s.positions, s.logits_chunk).items()
             if k.startswith("logits")}
    assert len(terms) == 3, terms
    assert sum(terms.values()) == 16 * 2048 * 152064
