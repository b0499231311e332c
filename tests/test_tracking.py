

def test_the_cpu_a_run_computed_on_is_named_in_its_tags():
    """CPU kernels differ by model and instruction set, and so do a run's numbers (the base model too):
    the tags name the CPU's model and its bf16 instructions, not just "x86_64"."""
    from pathlib import Path
    from dapo.hardware import cpu_name, has_bf16
    from dapo.tracking.tracker import environment_tags
    info = Path("/proc/cpuinfo").read_text()
    model = next(ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name"))
    assert cpu_name().startswith(model)
    assert ("amx_bf16" in cpu_name()) == (" amx_bf16" in info)
    assert has_bf16() == (" amx_bf16" in info or " avx512_bf16" in info)     # bf16 autocast's test too
    assert environment_tags()["dapo.device"] == f"cpu:{cpu_name()}"
