

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


def test_a_sweep_job_s_mlflow_run_is_named_by_sweep_arm_and_seed():
    """`<sweep>/<arm>/s<seed>` for a sweep's job; a run outside a sweep keeps its run id as its name."""
    from dapo.tracking.tracker import run_name
    assert run_name("table1-mini", "dapo", 3, "dapo-3-1a2b3c4d") == "table1-mini/dapo/s3"
    assert run_name("", "", 0, "tiny-dapo-0-1a2b3c4d") == "tiny-dapo-0-1a2b3c4d"
