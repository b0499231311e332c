"""Checks of a resolved config before anything is created: its data, its model and its metric.

    check_sources(cfg, where)   data.train and every eval set name a registered data set, an
                                ``hf:`` id or an existing .jsonl/.json/.parquet file; model.path is
                                a preset, ``mini-base[:STEPS]``, a model directory or a hub id.
                                No network, no file read: ``dapo sweep expand/submit`` runs it per arm.
    check_run(cfg, where)       ``dapo train``: the above, plus a hub id must be reachable (cached, or
                                the hub answers) and the local data files are read with
                                ``data.on_bad`` (a bad row under ``fail``, a non-UTF-8 file).
    eval_metric_names(cfg)      the eval metrics a run of ``cfg`` logs (what a spec's ``metric`` may name)
    finished_summary(run_dir)   a finished run's summary.json, or None

Each problem is one :class:`~dapo.config.ConfigError` naming the key, the value and what to do,
raised before a run directory exists. Pure: imports neither torch nor vllm (dapo.models and
dapo.data import them lazily).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from dapo.config import Config, ConfigError, show

__all__ = ["check_sources", "check_run", "eval_metric_names", "finished_summary"]


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
    """The eval set's name in metric names (as :mod:`dapo.run_data` and :mod:`dapo.evaluate` build it)."""
    short = Path(name).stem if os.sep in name else name
    return short.replace("/", "_")


def eval_metric_names(cfg: Config) -> list[str]:
    """``eval/<set>/{avg,pass,cons}_at_<k>`` and ``eval/<set>/response_len_mean`` of every eval set."""
    k = cfg.eval.k
    return [f"eval/{_eval_set_key(d.name)}/{m}" for d in cfg.eval.datasets
            for m in (f"avg_at_{k}", f"pass_at_{k}", f"cons_at_{k}", "response_len_mean")]


def _check_data(name: str, key: str, where: str) -> Path | None:
    """Raise unless ``name`` is a registered data set, ``hf:...`` or an existing data file; the file's path."""
    from dapo.data import DATASETS
    from dapo.readers import READERS
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


def check_run(cfg: Config, where: str) -> None:
    """:func:`check_sources`, a reachable hub id, and the local data files read as the run will read them."""
    from dapo.data import load_dataset
    from dapo.prompts import DataError
    check_sources(cfg, where)
    check_model(cfg.model.path, where)
    template = None if cfg.data.template == "default" else cfg.data.template
    sources = [("data.train", cfg.data.train, template)] + [
        (f"eval.datasets[{i}].name", d.name, None) for i, d in enumerate(cfg.eval.datasets)]
    for key, name, tmpl in sources:
        if _check_data(name, key, where) is None:
            continue   # registered (shipped, checked by the tests) or hf: (read at start-up)
        try:
            load_dataset(name, on_bad=cfg.data.on_bad, template=tmpl)
        except (DataError, ValueError, OSError) as exc:
            raise ConfigError(f"{where}: {key}: {exc}") from None
