"""Cluster profiles (``slurm/<name>.yaml``): where a sweep's jobs go and what one job may ask for.

A profile names the executor (``slurm``, or ``local`` = submitit's LocalExecutor on this
machine), the partition / account / qos / constraint, the per-job limits, the setup lines and
environment of a job script, and the python that runs it::

    name: example-gpu-cluster
    executor: slurm                      # slurm | local
    partition: gpu                       # also account, qos, constraint (optional)
    limits: {nodes: 32, gpus_per_node: 8, cpus_per_task: 96, mem_gb: 1000, time_min: 10080}
    max_array_parallel: 4
    setup: [module load cuda/12.4]       # one simple command per line
    python: /shared/dapo-lab/.venv/bin/python
    env: {NCCL_DEBUG: WARN}
    gpu_memory_gib: 79.6                 # one GPU's memory: `dapo plan` and `sweep submit` budget against it
    gpu: H100-SXM                        # its model: `dapo plan` prices the update at its peak (dapo.sweep.plan.GPU_PEAKS)
    gpu_peak_tflops: 989                 # or state the dense bf16 peak itself (needed for a GPU not in that table)
    tracking_uri: http://mlflow.lab.example:5000   # every job logs here (see slurm/README.md)
    tracking_password_file: ~/.dapo/mlflow-password   # or tracking_password_env: VAR; never in the URI

``--cluster local`` without a ``slurm/local.yaml`` is an embedded default (this machine).
:func:`load_profile` checks every value that reaches a job script; :func:`check_resources`
compares a spec's resources with the limits before anything is submitted. Pure: reads YAML
only; imports neither torch nor submitit (tests check it).
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dapo.config import ConfigError, show
from dapo.yaml_checks import REPO_ROOT, check_int, check_mapping, check_name, check_number, yaml_mapping_file

if TYPE_CHECKING:
    from dapo.sweep.spec import Spec

__all__ = ["ClusterProfile", "load_profile", "check_resources"]


@dataclass(frozen=True)
class ClusterProfile:
    """A cluster profile (``slurm/<name>.yaml``): where jobs go and what a job may ask for."""
    name: str
    path: Path | None
    executor: str = "slurm"                   # slurm | local (submitit's LocalExecutor)
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    max_nodes: int = 1
    max_gpus_per_node: int = 0
    max_cpus_per_task: int = 2
    max_mem_gb: float = 4.0
    max_time_min: int = 60
    max_array_parallel: int = 2
    setup: tuple[str, ...] = ()
    python: str | None = None                 # the job's python (None: the submitting interpreter)
    env: dict[str, str] = field(default_factory=dict)
    signal_delay_s: int = 120
    gpu_memory_gib: float | None = None       # memory of one GPU (what `dapo plan` budgets against)
    gpu: str | None = None                    # its model (H100-SXM, H20, ...): `dapo plan` looks up its peak
    gpu_peak_tflops: float | None = None      # its dense bf16 peak, TFLOP/s (overrides the table)
    tracking_uri: str | None = None           # MLflow server / database every job of a sweep logs to
    tracking_password_env: str | None = None  # names the variable holding its password (never the URI)
    tracking_password_file: str | None = None  # names the file holding it


_PROFILE_KEYS = {"name", "description", "executor", "partition", "account", "qos", "constraint", "limits",
                 "max_array_parallel", "setup", "python", "env", "signal_delay_s", "gpu_memory_gib", "gpu",
                 "gpu_peak_tflops",
                 "tracking_uri", "tracking_password_env", "tracking_password_file"}
_TRACKING_SCHEMES = {"http", "https", "postgresql", "mysql", "mssql", "sqlite"}   # SQLAlchemy: no postgres://
_LIMIT_KEYS = {"nodes", "gpus_per_node", "cpus_per_task", "mem_gb", "time_min"}
_CONSTRAINT_RE = re.compile(r"^[A-Za-z0-9._,&|\[\]*:-]+$")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _local_default() -> dict:
    """The embedded default profile: this machine, through submitit's LocalExecutor."""
    mem = 4.0
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30
    except (ValueError, OSError, AttributeError):
        pass
    n = os.cpu_count() or 1
    return {"name": "local", "executor": "local", "partition": "local", "max_array_parallel": max(1, n // 2),
            "limits": {"nodes": 1, "gpus_per_node": 0, "cpus_per_task": n, "mem_gb": round(mem, 1),
                       "time_min": 7 * 24 * 60}}


def load_profile(name: str | os.PathLike) -> ClusterProfile:
    """``--cluster NAME`` → ``slurm/NAME.yaml`` (the current directory first, then the repo root of
    this package) or a path to a YAML file.

    ``local`` without a file falls back to an embedded default (this machine, LocalExecutor).
    Every value that reaches a job script is checked here.
    """
    text = str(name)
    if text.endswith((".yaml", ".yml")) or os.sep in text:
        path: Path | None = Path(text)
        if not path.is_file():
            raise ConfigError(f"{path}: no such cluster profile")
    else:
        check_name(text, "--cluster", "command line")
        cands = [Path.cwd() / "slurm" / f"{text}.yaml", REPO_ROOT / "slurm" / f"{text}.yaml"]
        path = next((p for p in cands if p.is_file()), None)
        if path is None and text != "local":
            have = sorted(p.stem for p in (REPO_ROOT / "slurm").glob("*.yaml") if p.stem != "accelerate-fsdp")
            raise ConfigError(f"--cluster {text}: no profile slurm/{text}.yaml (profiles: {', '.join(have)})")
    if path is None:
        raw, where = _local_default(), "<embedded local profile>"
    else:
        raw, where = yaml_mapping_file(path), str(path)
    unknown = set(raw) - _PROFILE_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key {show(sorted(unknown, key=str)[0])}; allowed: {', '.join(sorted(_PROFILE_KEYS))}")
    executor = raw.get("executor", "slurm")
    if executor not in ("slurm", "local"):
        raise ConfigError(f"{where}: executor = {show(executor)}: expected slurm or local")
    opt = {k: (check_name(raw[k], k, where) if raw.get(k) is not None else None)
           for k in ("partition", "account", "qos")}
    constraint = raw.get("constraint")
    if constraint is not None and (not isinstance(constraint, str) or not _CONSTRAINT_RE.fullmatch(constraint)):
        raise ConfigError(f"{where}: constraint = {show(constraint)}: expected {_CONSTRAINT_RE.pattern}")
    lim = check_mapping(raw.get("limits"), "limits", where)
    if set(lim) - _LIMIT_KEYS:
        raise ConfigError(f"{where}: unknown key limits.{sorted(set(lim) - _LIMIT_KEYS, key=str)[0]}; "
                          f"allowed: {', '.join(sorted(_LIMIT_KEYS))}")
    for k in _LIMIT_KEYS:
        if k not in lim:
            raise ConfigError(f"{where}: limits.{k} is missing")
    setup = raw.get("setup") or []
    if not isinstance(setup, list) or not all(isinstance(s, str) for s in setup):
        raise ConfigError(f"{where}: setup = {show(setup)}: expected a list of strings (one command each)")
    for i, line in enumerate(setup):
        if any(c in line for c in "\n\r\0") or not line.strip():
            raise ConfigError(f"{where}: setup[{i}] = {show(line)}: expected one non-empty line")
        try:
            shlex.split(line)
        except ValueError as exc:   # an unbalanced quote
            raise ConfigError(f"{where}: setup[{i}] = {show(line)}: {exc} (one simple command per line; "
                              f"quote with ' or \" in pairs)") from None
    env = check_mapping(raw.get("env"), "env", where)
    for k, v in env.items():
        if not isinstance(k, str) or not _ENV_RE.fullmatch(k):
            raise ConfigError(f"{where}: env: {show(k)} is not a valid variable name ({_ENV_RE.pattern})")
        if not isinstance(v, (str, int, float)) or isinstance(v, bool) or "\0" in str(v):
            raise ConfigError(f"{where}: env.{k} = {show(v)}: expected a string or a number")
    gpu_mem = check_number(raw.get("gpu_memory_gib"), "gpu_memory_gib", where, allow_none=True)
    if gpu_mem is not None and gpu_mem <= 0:
        raise ConfigError(f"{where}: gpu_memory_gib = {show(gpu_mem)}: expected a number > 0")
    gpu = raw.get("gpu")
    if gpu is not None and (not isinstance(gpu, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9 ._-]{0,63}", gpu)):
        raise ConfigError(f"{where}: gpu = {show(gpu)}: expected a GPU model name such as H100-SXM or H20")
    peak = check_number(raw.get("gpu_peak_tflops"), "gpu_peak_tflops", where, allow_none=True)
    if peak is not None and peak <= 0:
        raise ConfigError(f"{where}: gpu_peak_tflops = {show(peak)}: expected a number > 0 (dense bf16 TFLOP/s)")
    python = raw.get("python")
    if python is not None and (not isinstance(python, str) or any(c in python for c in "\n\r\0") or not python):
        raise ConfigError(f"{where}: python = {show(python)}: expected the path of a python interpreter")
    tracking = _tracking_keys(raw, where)
    pname = raw.get("name", path.stem if path else "local")
    return ClusterProfile(
        name=check_name(pname, "name", where), path=path, executor=executor, constraint=constraint, **opt,
        max_nodes=check_int(lim["nodes"], "limits.nodes", where, lo=1),
        max_gpus_per_node=check_int(lim["gpus_per_node"], "limits.gpus_per_node", where, lo=0),
        max_cpus_per_task=check_int(lim["cpus_per_task"], "limits.cpus_per_task", where, lo=1),
        max_mem_gb=check_number(lim["mem_gb"], "limits.mem_gb", where),
        max_time_min=check_int(lim["time_min"], "limits.time_min", where, lo=1),
        max_array_parallel=check_int(raw.get("max_array_parallel", 1), "max_array_parallel", where, lo=1),
        setup=tuple(setup), python=python, env={k: str(v) for k, v in env.items()},
        signal_delay_s=check_int(raw.get("signal_delay_s", 120), "signal_delay_s", where, lo=1),
        gpu_memory_gib=gpu_mem, gpu=gpu, gpu_peak_tflops=peak, **tracking)


def _tracking_keys(raw: dict, where: str) -> dict[str, str | None]:
    """``tracking_uri`` (no password in it) and at most one of ``tracking_password_env`` / ``_file``."""
    from dapo.tracking.tracker import redact, uri_password
    out: dict[str, str | None] = {}
    for k in ("tracking_uri", "tracking_password_env", "tracking_password_file"):
        v = raw.get(k)
        if v is not None and (not isinstance(v, str) or not v.strip() or any(c in v for c in "\n\r\0")):
            raise ConfigError(f"{where}: {k}: expected one non-empty line of text")
        out[k] = v
    uri = out["tracking_uri"]
    if uri is not None:
        scheme = uri.split("://", 1)[0].split("+")[0].lower() if "://" in uri else ""
        if scheme not in _TRACKING_SCHEMES:
            raise ConfigError(f"{where}: tracking_uri = {redact(uri)!r}: expected an MLflow tracking URI "
                              f"({', '.join(s + '://' for s in sorted(_TRACKING_SCHEMES))})")
        if uri_password(uri):
            raise ConfigError(f"{where}: tracking_uri = {redact(uri)!r} holds a password (it would reach job "
                              f"scripts, run directories and MLflow): remove it and name a file "
                              f"(tracking_password_file) or an environment variable (tracking_password_env)")
    if out["tracking_password_env"] and out["tracking_password_file"]:
        raise ConfigError(f"{where}: give tracking_password_env or tracking_password_file, not both")
    if out["tracking_password_env"] and not _ENV_RE.fullmatch(out["tracking_password_env"]):
        raise ConfigError(f"{where}: tracking_password_env = {show(out['tracking_password_env'])} is not a valid "
                          f"variable name ({_ENV_RE.pattern})")
    if (out["tracking_password_env"] or out["tracking_password_file"]) and not uri:
        raise ConfigError(f"{where}: a tracking password is named but tracking_uri is not set")
    return out


def check_resources(spec: "Spec", profile: ClusterProfile) -> None:
    """Raise ConfigError if one job asks for more than the profile allows (names spec, key and limit)."""
    r, p = spec.resources, profile
    pairs = [("nodes", r.nodes, p.max_nodes), ("gpus_per_node", r.gpus_per_node, p.max_gpus_per_node),
             ("cpus_per_task", r.cpus_per_task, p.max_cpus_per_task), ("mem_gb", r.mem_gb, p.max_mem_gb),
             ("time_min", r.time_min, p.max_time_min)]
    for key, want, limit in pairs:
        if want > limit:
            raise ConfigError(f"{spec.path}: resources.{key} = {want}: cluster profile {p.name!r} "
                              f"({p.path or 'embedded'}) allows at most {limit}")
    if p.executor == "local" and r.nodes > 1:
        raise ConfigError(f"{spec.path}: resources.nodes = {r.nodes}: the local executor runs one node")
