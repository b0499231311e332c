"""Checks of a resolved config before anything is created: its data, its model and its metric.

    check_sources(cfg, where)   data.train and every eval set name a registered data set, an
                                ``hf:`` id or an existing .jsonl/.json/.parquet file; model.path is
                                a preset, ``mini-base[:STEPS]``, a model directory or a hub id.
                                No network, no file read: ``dapo sweep expand/submit`` runs it per arm.
    check_run(cfg, where)       ``dapo train``: the above, plus a hub id must be reachable (cached, or
                                the hub answers), the local and registered data files are read with
                                ``data.on_bad`` (a bad row under ``fail``, a non-UTF-8 file, fewer
                                training problems than one generation round, an empty eval set),
                                ``output_dir`` is a directory (or can be one) and the MLflow store
                                is usable (an SQLite file, a server that answers).
    eval_metric_names(cfg)      the eval metrics a run of ``cfg`` logs (what a spec's ``metric`` may name)
    check_compile_toolchain(cfg, cuda)   in the job, before the engine starts: vLLM on CUDA with CUDA graphs
                                compiles kernels, which needs a C compiler and Python's headers on the node
    finished_summary(run_dir)   a finished run's summary.json, or None

Each problem is one :class:`~dapo.config.ConfigError` naming the key, the value and what to do,
raised before a run directory exists. Pure: imports neither torch nor vllm (dapo.models and
dapo.data.datasets import them lazily).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from dapo.config import Config, ConfigError, show

__all__ = ["check_sources", "check_run", "check_store", "check_output_dir", "check_writable", "check_history", "lost_store", "sqlite_problem", "eval_metric_names",
           "finished_summary", "ToolchainError", "toolchain_problem", "check_compile_toolchain"]

C_COMPILERS = ("gcc", "clang")   # what Triton looks for when $CC is unset


class ToolchainError(RuntimeError):
    """The node lacks what the configured engine needs to compile its kernels (the machine, not the input)."""


def toolchain_problem(which=None, include_dir: str | None = None) -> str | None:
    """What this node lacks to compile Triton/Inductor kernels: a C compiler (``$CC``, else gcc or clang on
    PATH, as Triton looks) and Python's headers (``Python.h``); None when both are there."""
    import shutil
    import sysconfig
    which = which or shutil.which
    cc = os.environ.get("CC")
    missing = []
    if not any(which(c) for c in ((cc,) if cc else ()) + C_COMPILERS):
        missing.append(f"a C compiler ({'$CC = ' + show(cc) + ', ' if cc else '$CC unset, '}no gcc or clang on PATH)")
    include = include_dir if include_dir is not None else sysconfig.get_paths()["include"]
    if not (Path(include) / "Python.h").is_file():
        missing.append(f"Python's headers (no Python.h in {include})")
    return " and ".join(missing) or None


def check_compile_toolchain(cfg: Config, cuda: bool | Callable[[], bool], *, which=None,
                            include_dir: str | None = None) -> None:
    """vLLM on CUDA with CUDA graphs (``rollout.enforce_eager`` not true) runs torch.compile (Dynamo,
    Inductor, Triton) at every engine start and requeue: without a C compiler and Python's headers on the
    compute node that fails deep inside the engine. Raises :class:`ToolchainError` (one line naming what
    is missing and ``rollout.enforce_eager=true``) before the model or the engine is loaded. ``cuda``:
    whether this job's engine runs on CUDA, or a function that asks (called only when it matters: ``dapo
    train`` asks torch; a sweep job knows from its resources). Called where a job starts:
    ``dapo.sweep.jobs.RunJob`` on every node, ``dapo train``."""
    if cfg.rollout.engine != "vllm" or cfg.rollout.enforce_eager or not (cuda() if callable(cuda) else cuda):
        return
    problem = toolchain_problem(which, include_dir)
    if problem:
        import socket
        raise ToolchainError(f"rollout.engine = vllm on CUDA compiles its kernels (torch.compile, Triton) at each "
                             f"engine start, and this node ({socket.gethostname()}) lacks {problem}: install "
                             f"them on the compute nodes (or load them in the profile's setup), or run without "
                             f"compilation: rollout.enforce_eager=true (no CUDA graphs, slower decode; "
                             f"docs/SCALING.md)")


def finished_summary(run_dir: str | os.PathLike) -> dict | None:
    """The run's ``summary.json`` if it is a finished run's summary (a JSON object), else None:
    a missing, empty, truncated or garbage file does not count as done."""
    path = Path(run_dir) / "summary.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _eval_set_key(name: str) -> str:
    """The eval set's name in metric names (as :mod:`dapo.data.run_data` and :mod:`dapo.train.evaluate` build it)."""
    short = Path(name).stem if os.sep in name else name
    return short.replace("/", "_")


def eval_metric_names(cfg: Config) -> list[str]:
    """``eval/<set>/{avg,pass,cons}_at_<k>`` and ``eval/<set>/response_len_mean`` of every eval set."""
    k = cfg.eval.k
    return [f"eval/{_eval_set_key(d.name)}/{m}" for d in cfg.eval.datasets
            for m in (f"avg_at_{k}", f"pass_at_{k}", f"cons_at_{k}", "response_len_mean")]


def _check_data(name: str, key: str, where: str) -> Path | None:
    """Raise unless ``name`` is a registered data set, ``hf:...`` or an existing data file; the file's path."""
    from dapo.data.datasets import DATASETS
    from dapo.data.readers import READERS
    if name in DATASETS or name.startswith("hf:"):
        return None
    p = Path(name).expanduser()
    if p.suffix.lower() not in READERS:
        raise ConfigError(f"{where}: {key} = {show(name)}: not a registered data set ({', '.join(sorted(DATASETS))}), "
                          f"nor a .jsonl/.json/.parquet file, nor hf:<dataset id>")
    if not p.is_file():
        raise ConfigError(f"{where}: {key} = {show(name)}: no such data file ({p.resolve()}); a relative path is "
                          f"read from the current directory {Path.cwd()}")
    return p


def _is_hub_id(name: str) -> bool:
    return name.count("/") == 1 and not name.startswith((".", "/", "~")) and all(name.split("/"))


def _check_model(name: str, where: str) -> bool:
    """Raise unless model.path can name a model; True when it is a hub id (not a local directory)."""
    from dapo.base_model import NAMED_RECIPES, named_recipe
    from dapo.models import SMOLLM2_NAME, TINY_PRESETS
    if name in TINY_PRESETS or name == SMOLLM2_NAME:
        return False
    try:
        if named_recipe(name) is not None:
            return False
    except ValueError as exc:  # a known recipe name with a bad :STEPS suffix
        raise ConfigError(f"{where}: {exc}") from None
    p = Path(name).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ConfigError(f"{where}: model.path = {show(name)}: {p.resolve()} is not a Hugging Face model "
                              f"directory (no config.json)")
        return False
    if _is_hub_id(name) and not p.exists():
        return True
    presets = ", ".join(sorted([*TINY_PRESETS, SMOLLM2_NAME, *NAMED_RECIPES]))
    raise ConfigError(f"{where}: model.path = {show(name)}: no such model directory ({p.resolve()}); give a "
                      f"directory with config.json, a preset ({presets}) or a hub id org/name")


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _check_hub_model(name: str, where: str) -> None:
    """A hub id is usable when the local Hugging Face cache has it, or (online) the hub knows it."""
    try:
        from huggingface_hub import try_to_load_from_cache
        if isinstance(try_to_load_from_cache(name, "config.json"), str):
            return
    except Exception:  # noqa: BLE001 - a malformed id: the hub check below names it
        pass
    fix = f"download it where there is internet (huggingface-cli download {name}) or give a local model directory"
    if _offline():
        raise ConfigError(f"{where}: model.path = {show(name)}: a hub id that is not in the local Hugging Face "
                          f"cache, and HF_HUB_OFFLINE is set; {fix}")
    try:
        from huggingface_hub import HfApi
        HfApi().model_info(name, timeout=15)
    except Exception as exc:  # noqa: BLE001 - no network, no such repo, gated: all one line
        raise ConfigError(f"{where}: model.path = {show(name)}: the Hugging Face hub cannot serve it "
                          f"({type(exc).__name__}: {show(str(exc).splitlines()[0] if str(exc) else '', 160)}); "
                          f"{fix}") from None


def check_sources(cfg: Config, where: str) -> None:
    """Data sets, eval set names and model.path name things that exist (no network, no data read)."""
    _check_data(cfg.data.train, "data.train", where)
    for i, d in enumerate(cfg.eval.datasets):
        _check_data(d.name, f"eval.datasets[{i}].name", where)
    keys = [_eval_set_key(d.name) for d in cfg.eval.datasets]
    dup = next((k for k in keys if keys.count(k) > 1), None)
    if dup:
        raise ConfigError(f"{where}: eval.datasets: two eval sets are both logged as {dup!r}; give each once")
    _check_model(cfg.model.path, where)


def check_model(name: str, where: str) -> None:
    """Raise ConfigError unless ``name`` names a model this machine can load (a hub id: reachable or cached)."""
    if _check_model(name, where):
        _check_hub_model(name, where)


def check_output_dir(cfg: Config, where: str) -> None:
    """``output_dir`` is a directory, or can become one: no part of it is a file."""
    p = Path(cfg.output_dir).expanduser()
    for q in (p, *p.parents):
        if q.exists() or q.is_symlink():
            if not q.is_dir():
                what = "is a file" if q == p else f"is inside {q}, which is a file"
                raise ConfigError(f"{where}: output_dir = {show(cfg.output_dir)}: {what}; give a directory "
                                  f"(the run directories and the MLflow store go under it)")
            return


def check_writable(path: str | os.PathLike, what: str) -> None:
    """ConfigError naming ``what`` and ``path`` when nothing can be written there
    (:func:`dapo.store_checks.writable_problem`: read-only, no permission, a full disk); nothing is written."""
    from dapo.store_checks import writable_problem
    problem = writable_problem(path)
    if problem:
        raise ConfigError(f"{what} {show(str(path))}: {problem}; give a writable directory")


def lost_store(run_dir: str | os.PathLike) -> tuple[str, Path] | None:
    """(MLflow run id, SQLite file) when the run in ``run_dir`` logged to an SQLite MLflow store that no longer
    exists (resuming or logging there would start an empty store without its history); else None."""
    from dapo.store_checks import sqlite_path
    try:
        info = json.loads((Path(run_dir) / "mlflow_run.json").read_text())
    except (OSError, ValueError):
        return None                    # a new run, or no MLflow run recorded yet
    db = sqlite_path(str(info.get("tracking_uri") or ""))
    return (str(info["run_id"]), db) if info.get("run_id") and db is not None and not db.exists() else None


def check_history(run_dir: str | os.PathLike) -> None:
    """ConfigError when :func:`lost_store` finds the run's store gone, saying how to go on
    (:func:`dapo.tracking.tracker.lost_history`; ``dapo train --new-mlflow-run`` skips this check)."""
    from dapo.tracking.tracker import lost_history
    lost = lost_store(run_dir)
    if lost:
        raise ConfigError(lost_history(lost[0], f"was logged to {lost[1]}, which no longer exists"))


def check_store(uri: str, where: str, key: str = "logging.tracking_uri") -> None:
    """Raise ConfigError unless the MLflow store behind ``uri`` can be used: an existing ``sqlite:///``
    file must be an SQLite database (a missing one is created by the run); a server or database URI must
    answer (:func:`dapo.tracking.tracker.check_server`, a few seconds at most)."""
    from dapo.store_checks import SERVER_SCHEMES, scheme, sqlite_path
    from dapo.tracking.tracker import TrackingError, check_server, redact
    db = sqlite_path(uri)
    if db is not None:
        problem = sqlite_problem(db)
        if problem:
            raise ConfigError(f"{where}: {key} = {redact(uri)}: {problem}")
        return
    if scheme(uri) in SERVER_SCHEMES:
        try:
            check_server(uri, timeout_s=5.0)
        except TrackingError as exc:
            raise ConfigError(f"{where}: {key}: {exc}; start it, or give another store") from None


def sqlite_problem(db: Path) -> str | None:
    """Why the sqlite file ``db`` cannot be an MLflow store (None when it can, or does not exist yet)."""
    from dapo.store_checks import sqlite_file_problem
    return sqlite_file_problem(db, missing_ok=True)


def check_run(cfg: Config, where: str) -> None:
    """:func:`check_sources`, a reachable hub id, the local data files read as the run will read them
    (enough training problems for one generation round), ``output_dir`` and the MLflow store."""
    from dapo.data.datasets import DATASETS, load_dataset
    from dapo.data.prompts import DataError
    check_sources(cfg, where)
    check_model(cfg.model.path, where)
    check_output_dir(cfg, where)
    if cfg.logging.tracking_uri:
        check_store(cfg.logging.tracking_uri, where)
    else:
        problem = sqlite_problem(Path(cfg.output_dir).expanduser() / "mlruns.db")
        if problem:
            raise ConfigError(f"{where}: the MLflow store of output_dir = {show(cfg.output_dir)}: {problem}")
    template = None if cfg.data.template == "default" else cfg.data.template
    sources = [("data.train", cfg.data.train, template)] + [
        (f"eval.datasets[{i}].name", d.name, None) for i, d in enumerate(cfg.eval.datasets)]
    for key, name, tmpl in sources:
        is_file = _check_data(name, key, where) is not None
        if not is_file and not (key == "data.train" and name in DATASETS):
            continue   # a registered eval set (shipped, checked by the tests) or hf: (read at start-up)
        limit = None
        if key == "data.train" and cfg.data.train_limit is not None:
            limit = cfg.data.train_skip + cfg.data.train_limit
        try:
            rows, report = load_dataset(name, on_bad=cfg.data.on_bad, template=tmpl, limit=limit)
        except (DataError, ValueError, OSError) as exc:
            raise ConfigError(f"{where}: {key}: {exc}") from None
        if key == "data.train":
            _check_enough_rows(cfg, where, len(rows), report)
        elif not rows:
            raise ConfigError(f"{where}: {key} = {show(name)}: no usable rows ({report.kept} of {report.total} "
                              f"rows kept)")


def _check_enough_rows(cfg: Config, where: str, n_rows: int, report) -> None:
    """One generation round draws ``cfg.gen_batch_prompts`` distinct training problems."""
    n = max(0, n_rows - cfg.data.train_skip)
    need = cfg.gen_batch_prompts
    if n >= need:
        return
    after = [k for k, v in (("data.train_skip", cfg.data.train_skip), ("data.train_limit", cfg.data.train_limit))
             if v]
    round_ = (f"algo.dynamic_sampling's round: gen_batch_prompts or oversample x train.batch_prompts = {need}"
              if cfg.algo.dynamic_sampling.enabled and cfg.algo.dynamic_sampling.mode == "refill"
              else f"train.batch_prompts = {need}")
    raise ConfigError(f"{where}: data.train = {show(cfg.data.train)}: {n} usable training problem"
                      f"{'' if n == 1 else 's'}{' after ' + ' and '.join(after) if after else ''} "
                      f"({report.kept} of {report.total} rows kept), fewer than one generation round takes ({round_}); give more "
                      f"rows or lower train.batch_prompts")
