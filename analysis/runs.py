"""Logged runs → one tidy table, and results snapshots.

The tidy table has one row per logged point::

    run  run_id  sweep  arm  seed  rollout_step  grad_step  time  metric  value

- ``run``: the MLflow run id (uuid); ``run_id``: the stable dapo hash (tag ``dapo.run_id``).
- ``grad_step`` is MLflow's ``step``; ``rollout_step`` is joined from the
  ``progress/rollout_step`` metric logged at the same (run, step). ``progress/*`` metrics
  are bookkeeping and are not rows of the table.
- ``time``: seconds since the run started (MLflow timestamp − run start time).
- ``value`` is stored as logged (accuracies in [0, 1]); figures and tables show them in %.

``configs`` maps each MLflow run id to its resolved config (a nested dict, from the
``config.yaml`` artifact, else rebuilt from the dotted params).

A snapshot (``results/<sweep>/snapshot/``) freezes both, plus the sweep description, so
figures and tables can be regenerated without the tracking server:
``runs.parquet``, ``configs.json``, ``sweep.json``, ``meta.json``, and ``problems.parquet`` when
the runs' per-sample evaluation records were on disk (:data:`PROBLEM_COLUMNS`, read back by
:func:`load_problems`; None for snapshots without it).

Metric histories are read in bulk: one SQL query from a ``sqlite:`` / ``postgresql:`` store,
one request per (metric, 100 runs) from an MLflow server (``http(s)://``); one request per
(run, metric) only as a fallback.

This module only reads and writes (MLflow, snapshot files); which arms to compare is
:mod:`analysis.arms`, metric naming :mod:`analysis.metric_names`. It imports neither torch
nor vllm; mlflow is imported only inside :func:`load_runs`.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dapo.sweep.spec import KINDS as SWEEP_KINDS

__all__ = [
    "ArmInfo", "SweepInfo", "TIDY_COLUMNS", "load_runs", "snapshot", "load_snapshot", "merge_snapshot",
    "arm_order", "normalize_tidy", "read_meta", "PROBLEM_COLUMNS", "normalize_problems", "load_problems",
    "SnapshotError", "check_tidy", "store_problem", "spec_runs",
]

log = logging.getLogger(__name__)

TIDY_COLUMNS = ["run", "run_id", "sweep", "arm", "seed", "rollout_step", "grad_step",
                "time", "metric", "value"]
_STR_COLS = ["run", "run_id", "sweep", "arm", "metric"]
PROBLEM_COLUMNS = ["run", "run_id", "arm", "seed", "step", "grad_step", "set", "problem", "n_correct", "k"]
"""``problems.parquet``: one row per (run, rollout step, eval set, problem) of the runs' per-sample
evaluation records (docs/METRICS.md): ``n_correct`` of its ``k`` samples scored correct; ``grad_step``
−1 where the records have none. Built by :func:`analysis.eval_noise.problems_from_runs`."""


# --------------------------------------------------------------------------- sweep description
@dataclass(frozen=True)
class ArmInfo:
    """One arm of a sweep."""
    name: str                                  # the ``dapo.arm`` tag
    label: str = ""                            # legend / table label (default: name)
    overrides: dict[str, Any] = field(default_factory=dict)  # dotted key → value, vs the sweep base
    paper: float | None = None                 # the paper's value for Table 1, in % (None: no row value)

    def __post_init__(self):
        if not self.label:
            object.__setattr__(self, "label", self.name)


@dataclass(frozen=True)
class SweepInfo:
    """What the analysis needs to know about a sweep."""
    name: str                                  # sweep name = MLflow experiment name
    kind: str = "grid"                         # ladder | one_at_a_time | leave_one_out | grid
    arms: tuple[ArmInfo, ...] = ()             # in sweep order (ladder: row order)
    metric: str | None = None                  # primary eval metric (None: metric_names.primary_metric)
    final_k: int = 3                           # "final" = mean of the last final_k evaluations
    title_tag: str | None = None               # figure titles "Fig. 2 (<tag>): ..."; None: "mini" unless AIME
    margins: dict[str, float] = field(default_factory=dict)  # metric → declared TOST margin (the spec's ``margins``)
    family: tuple[tuple[str, str], ...] = ()   # the declared primary family, (off, on) arm names (the spec's
                                               # ``family``); () = the default (analysis.tables.primary_pairs)
    stopping: dict | None = None               # the spec's ``stopping`` {looks, spending, alpha}; None: one fixed look
    seeds: tuple[int, ...] = ()                # the spec's seeds in declared order (a look's pairs: the first n)

    def __post_init__(self):
        if self.kind not in SWEEP_KINDS:
            raise ValueError(f"SweepInfo.kind = {self.kind!r}: expected one of {', '.join(SWEEP_KINDS)}")
        object.__setattr__(self, "arms", tuple(
            a if isinstance(a, ArmInfo) else ArmInfo(**a) for a in self.arms))
        object.__setattr__(self, "family", tuple((str(off), str(on)) for off, on in self.family))
        object.__setattr__(self, "seeds", tuple(int(s) for s in self.seeds))

    def arm(self, name: str) -> ArmInfo:
        for a in self.arms:
            if a.name == name:
                return a
        raise KeyError(f"arm {name!r} not in sweep {self.name!r} (arms: {[a.name for a in self.arms]})")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["arms"] = [asdict(a) for a in self.arms]
        if not self.family:
            d.pop("family")     # a sweep.json without a declared family stays as it was
        else:
            d["family"] = [list(p) for p in self.family]
        for key in ("stopping", "seeds"):   # absent unless declared: an older sweep.json stays as it was
            if not d.get(key):
                d.pop(key)
            elif key == "seeds":
                d[key] = list(self.seeds)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "SweepInfo":
        d = dict(d)
        d["arms"] = tuple(ArmInfo(**a) for a in d.get("arms", ()))
        return cls(**d)


# --------------------------------------------------------------------------- helpers
def _unflatten(flat: dict[str, Any]) -> dict:
    out: dict = {}
    for key, v in flat.items():
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            nxt = node.setdefault(p, {})
            if not isinstance(nxt, dict):  # a scalar and a subtree under one key: keep the scalar
                break
            node = nxt
        else:
            node[parts[-1]] = v
    return out


def _parse_param(s: str) -> Any:
    """MLflow params are strings; recover the YAML value ('0.28' → 0.28, 'True' → True)."""
    if s in ("None", "null"):
        return None
    for conv in (int, float):  # YAML 1.1 reads '1e-06' as a string
        try:
            return conv(s)
        except ValueError:
            pass
    try:
        import yaml
        return yaml.safe_load(s)
    except Exception:
        return s


def normalize_tidy(df: pd.DataFrame) -> pd.DataFrame:
    """Column order and dtypes of the tidy table (the same after load_runs and load_snapshot)."""
    df = df.reindex(columns=TIDY_COLUMNS)
    for c in _STR_COLS:
        df[c] = df[c].astype(object).where(df[c].notna(), "").astype(str)
    df["seed"] = df["seed"].astype("int64")
    df["grad_step"] = df["grad_step"].astype("int64")
    df["rollout_step"] = df["rollout_step"].astype("Int64")  # nullable: unknown if never logged
    df["time"] = df["time"].astype("float64")
    df["value"] = df["value"].astype("float64")
    return df.reset_index(drop=True)


# --------------------------------------------------------------------------- loading from MLflow
def _bulk_sql_metrics(tracking_uri: str, run_ids: list[str]) -> pd.DataFrame | None:
    """One SQL query for all metric histories (SQL stores only); None if not possible."""
    if not tracking_uri.startswith(("sqlite:", "postgresql", "mysql", "mssql")):
        return None
    try:
        import sqlalchemy as sa
        eng = sa.create_engine(tracking_uri)
        frames = []
        with eng.connect() as conn:
            for i in range(0, len(run_ids), 500):
                chunk = run_ids[i:i + 500]
                q = sa.text("SELECT run_uuid, key, value, timestamp, step, is_nan FROM metrics "
                            "WHERE run_uuid IN :ids").bindparams(sa.bindparam("ids", expanding=True))
                frames.append(pd.DataFrame(conn.execute(q, {"ids": chunk}).fetchall(),
                                           columns=["run", "metric", "value", "timestamp", "step", "is_nan"]))
        eng.dispose()
        df = pd.concat(frames, ignore_index=True)
        df["value"] = df["value"].astype("float64").where(~df["is_nan"].astype(bool), np.nan)
        return df.drop(columns="is_nan")
    except Exception as exc:  # schema changed, driver missing, ...: use the client
        log.info("bulk SQL read failed (%s); falling back to get_metric_history", exc)
        return None


BULK_RUNS = 100        # the most run ids the server's get-history-bulk accepts per request
BULK_ROWS = 25_000     # the most rows it returns (more: the batch is split)


def _server_metrics(tracking_uri: str, runs) -> pd.DataFrame | None:
    """Metric histories through an MLflow server: one request per (metric, batch of 100 runs).

    Uses the server's ``/ajax-api/2.0/mlflow/metrics/get-history-bulk`` (one SQL query on
    its side); a batch that hits the row cap is split in halves. None if the URI is not
    ``http(s)://`` or the server lacks the endpoint (then the per-run client read is used).
    Credentials: ``MLFLOW_TRACKING_USERNAME`` / ``_PASSWORD`` or ``MLFLOW_TRACKING_TOKEN``.
    """
    if not tracking_uri.startswith(("http://", "https://")):
        return None
    import requests
    session = requests.Session()
    if os.environ.get("MLFLOW_TRACKING_TOKEN"):
        session.headers["Authorization"] = f"Bearer {os.environ['MLFLOW_TRACKING_TOKEN']}"
    elif os.environ.get("MLFLOW_TRACKING_USERNAME"):
        session.auth = (os.environ["MLFLOW_TRACKING_USERNAME"], os.environ.get("MLFLOW_TRACKING_PASSWORD", ""))
    if os.environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() == "true":
        session.verify = False
    elif os.environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH"):
        session.verify = os.environ["MLFLOW_TRACKING_SERVER_CERT_PATH"]
    url = tracking_uri.rstrip("/") + "/ajax-api/2.0/mlflow/metrics/get-history-bulk"

    def fetch(key: str, ids: list[str]) -> list[tuple]:
        r = session.get(url, params={"run_id": ids, "metric_key": key, "max_results": BULK_ROWS}, timeout=300)
        r.raise_for_status()
        ms = r.json().get("metrics", [])
        if len(ms) >= BULK_ROWS:              # truncated: split the batch (one run: its own history)
            if len(ids) == 1:
                raise RuntimeError(f"run {ids[0]} has more than {BULK_ROWS} points of {key}")
            h = len(ids) // 2
            return fetch(key, ids[:h]) + fetch(key, ids[h:])
        return [(m["run_id"], key, float(m["value"]), int(m["timestamp"]), int(m.get("step", 0))) for m in ms]

    keys = sorted({k for r in runs for k in r.data.metrics})
    have = {k: [r.info.run_id for r in runs if k in r.data.metrics] for k in keys}
    jobs = [(k, ids[i:i + BULK_RUNS]) for k, ids in have.items() for i in range(0, len(ids), BULK_RUNS)]
    try:
        with ThreadPoolExecutor(max_workers=4) as ex:
            rows = [row for part in ex.map(lambda j: fetch(*j), jobs) for row in part]
    except Exception as exc:  # an old server without the endpoint, a huge run: the per-run client read
        log.info("bulk metric read from %s failed (%s); falling back to get_metric_history", tracking_uri, exc)
        return None
    finally:
        session.close()
    return pd.DataFrame(rows, columns=["run", "metric", "value", "timestamp", "step"])


def _client_metrics(client, runs) -> pd.DataFrame:
    """Per-(run, key) get_metric_history, threaded (works with every store)."""
    jobs = [(r.info.run_id, k) for r in runs for k in r.data.metrics]

    def fetch(job):
        rid, key = job
        return [(rid, key, m.value, m.timestamp, m.step) for m in client.get_metric_history(rid, key)]

    with ThreadPoolExecutor(max_workers=8) as ex:
        rows = [row for part in ex.map(fetch, jobs) for row in part]
    return pd.DataFrame(rows, columns=["run", "metric", "value", "timestamp", "step"])


def _run_config(client, run) -> dict:
    """The resolved config: the ``config.yaml`` artifact, else the params unflattened."""
    try:
        names = {a.path for a in client.list_artifacts(run.info.run_id)}
        if "config.yaml" in names:
            import yaml
            with tempfile.TemporaryDirectory() as tmp:
                path = client.download_artifacts(run.info.run_id, "config.yaml", tmp)
                cfg = yaml.safe_load(Path(path).read_text())
            if isinstance(cfg, dict):
                return cfg
    except Exception as exc:
        log.info("run %s: no readable config.yaml (%s); using params", run.info.run_id, exc)
    return _unflatten({k: _parse_param(v) for k, v in run.data.params.items()})


def store_problem(tracking_uri: str, timeout_s: float = 5.0) -> str | None:
    """Why the MLflow store ``tracking_uri`` cannot be read (one line, password masked), or None.

    ``sqlite:///`` file: it exists and is an SQLite database (`dapo.store_checks.sqlite_file_problem`).
    A server or database: it answers within ``timeout_s`` (`dapo.store_checks.server_problem`)."""
    from dapo.store_checks import server_problem, sqlite_file_problem, sqlite_path
    db = sqlite_path(tracking_uri)
    if db is not None:
        if not db.exists() and not db.is_symlink():
            return f"no tracking store at {tracking_uri} ({db} does not exist)"
        problem = sqlite_file_problem(db, missing_ok=False)
        return f"tracking store {tracking_uri}: {problem}" if problem else None
    return server_problem(tracking_uri, timeout_s)


def load_runs(tracking_uri: str, sweep_name: str, *, finished_only: bool = False,
              configs_from_artifacts: bool = True) -> tuple[pd.DataFrame, dict[str, dict]]:
    """All runs of the MLflow experiment ``sweep_name`` → (tidy table, {run uuid: config}).

    Runs of one job that were restarted under a new MLflow run (same ``dapo.run_id``)
    are deduplicated: the finished one, else the latest, is kept. A point logged twice at
    the same (run, metric, step) keeps its last value.
    """
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(sweep_name)
    if exp is None:
        names = [e.name for e in client.search_experiments()]
        raise ValueError(f"no MLflow experiment {sweep_name!r} at {tracking_uri} (experiments: {names})")
    runs, token = [], None
    while True:
        page = client.search_runs([exp.experiment_id], max_results=1000, page_token=token,
                                  order_by=["attributes.start_time ASC"])
        runs.extend(page)
        token = page.token
        if not token:
            break

    by_job: dict[str, Any] = {}
    for r in runs:
        tags = r.data.tags
        status = tags.get("dapo.status", "").lower()
        if finished_only and status != "finished":
            continue
        job = tags.get("dapo.run_id") or r.info.run_id
        prev = by_job.get(job)
        rank = (status == "finished", r.info.start_time or 0)
        if prev is None or rank >= prev[0]:
            if prev is not None:
                log.warning("job %s has several MLflow runs; keeping %s", job, r.info.run_id)
            by_job[job] = (rank, r)
    runs = sorted((v[1] for v in by_job.values()), key=lambda r: r.info.start_time or 0)
    unfinished = [r.data.tags.get("dapo.arm", "?") + "/" + r.data.tags.get("dapo.seed", "?")
                  for r in runs if r.data.tags.get("dapo.status", "").lower() != "finished"]
    if unfinished:
        log.warning("sweep %s: %d run(s) not finished: %s", sweep_name, len(unfinished), ", ".join(unfinished))

    empty = normalize_tidy(pd.DataFrame(columns=TIDY_COLUMNS))
    if not runs:
        return empty, {}
    ids = [r.info.run_id for r in runs]
    pts = _bulk_sql_metrics(tracking_uri, ids)
    if pts is None:
        pts = _server_metrics(tracking_uri, runs)
    if pts is None:
        pts = _client_metrics(client, runs)

    meta = pd.DataFrame({
        "run": ids,
        "run_id": [r.data.tags.get("dapo.run_id", r.info.run_id) for r in runs],
        "sweep": [r.data.tags.get("dapo.sweep", sweep_name) for r in runs],
        "arm": [r.data.tags.get("dapo.arm", r.info.run_name or "") for r in runs],
        "seed": [int(float(r.data.tags.get("dapo.seed", r.data.params.get("train.seed", 0)))) for r in runs],
        "start": [float(r.info.start_time or 0) for r in runs],
        "order": range(len(runs)),
    })
    tidy = _assemble(pts, meta)
    bar = os.environ.get("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR")
    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"  # one bar per config.yaml is noise
    try:
        configs = {r.info.run_id: _run_config(client, r) if configs_from_artifacts
                   else _unflatten({k: _parse_param(v) for k, v in r.data.params.items()}) for r in runs}
    finally:
        if bar is None:
            os.environ.pop("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", None)
        else:
            os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = bar
    return tidy, configs


def _iso(ms) -> str | None:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="seconds") if ms else None


def run_times(tracking_uri: str, sweep_name: str) -> dict[str, dict[str, str | None]]:
    """{run id (``dapo.run_id``): {"start", "end"}}: absolute UTC times (ISO 8601) of the sweep's runs, the
    first start and the last end over a run's MLflow runs (a resumed run keeps its first start); end None
    while it runs. What a report needs to place a declaration record before or after the runs."""
    from mlflow.tracking import MlflowClient
    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(sweep_name)
    if exp is None:
        return {}
    out: dict[str, dict[str, str | None]] = {}
    token = None
    while True:
        page = client.search_runs([exp.experiment_id], max_results=1000, page_token=token)
        for r in page:
            rid = r.data.tags.get("dapo.run_id") or r.info.run_id
            start, end = r.info.start_time, r.info.end_time
            cur = out.setdefault(rid, {"start": start, "end": end})
            cur["start"] = min(x for x in (cur["start"], start) if x) if (cur["start"] or start) else None
            cur["end"] = max(x for x in (cur["end"], end) if x) if (cur["end"] or end) else None
        token = page.token
        if not token:
            break
    return {k: {"start": _iso(v["start"]), "end": _iso(v["end"])} for k, v in sorted(out.items())}


def _assemble(pts: pd.DataFrame, meta: pd.DataFrame) -> pd.DataFrame:
    """Raw points (run, metric, value, timestamp[ms], step) + run metadata → tidy table."""
    pts = pts[pts["run"].isin(meta["run"])]
    # A point re-logged at the same step (resume) keeps its last value.
    pts = pts.sort_values(["run", "metric", "step", "timestamp"], kind="stable")
    pts = pts.drop_duplicates(["run", "metric", "step"], keep="last")
    prog = pts[pts["metric"] == "progress/rollout_step"][["run", "step", "value"]]
    prog = prog.rename(columns={"value": "rollout_step"})
    pts = pts[~pts["metric"].str.startswith("progress/")]
    df = pts.merge(prog, on=["run", "step"], how="left")
    # Points without their own progress record take the last rollout step at or before them.
    missing = df["rollout_step"].isna()
    if missing.any() and len(prog):
        left = df.loc[missing, ["run", "step"]].reset_index().sort_values("step")
        filled = pd.merge_asof(left, prog.sort_values("step"), on="step", by="run", direction="backward")
        df.loc[filled["index"].to_numpy(), "rollout_step"] = filled["rollout_step"].to_numpy()
        still = df["rollout_step"].isna() & (df["step"] == 0)
        df.loc[still, "rollout_step"] = 0.0  # evaluation before training
    df = df.merge(meta, on="run", how="left")
    df["time"] = (df["timestamp"].astype("float64") - df["start"]) / 1000.0
    df = df.rename(columns={"step": "grad_step"})
    df["rollout_step"] = df["rollout_step"].round().astype("Int64")
    df = df.sort_values(["order", "metric", "grad_step"], kind="stable")
    return normalize_tidy(df)


# --------------------------------------------------------------------------- arms
def arm_order(tidy: pd.DataFrame) -> list[str]:
    """Arms in first-logged order (load_runs orders runs by start time)."""
    return list(dict.fromkeys(tidy["arm"].tolist()))


# --------------------------------------------------------------------------- snapshots
def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    return str(o)


def snapshot(tidy: pd.DataFrame, configs: dict[str, dict], sweep_info: SweepInfo | None,
             out_dir: str | Path, command: str = "", commit: str = "",
             tracking_uri: str | None = None, extra: dict | None = None,
             problems: pd.DataFrame | None = None, samples: pd.DataFrame | None = None) -> Path:
    """Freeze runs into ``out_dir`` (usually ``results/<sweep>/snapshot``); returns the dir.
    ``samples``: the responses a report shows (``analysis.samples.SAMPLE_COLUMNS``) → ``samples.parquet``,
    removed when None, as ``problems.parquet``.
    ``extra``: more keys for meta.json (e.g. ``merged``: the earlier snapshots whose runs were added).
    ``problems``: per-problem outcomes (:data:`PROBLEM_COLUMNS`) → ``problems.parquet``; None: no file
    (one left from an earlier snapshot in ``out_dir`` is removed, so it never describes other runs)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    normalize_tidy(tidy).to_parquet(out / "runs.parquet", index=False)
    if problems is not None and len(problems):
        normalize_problems(problems).to_parquet(out / "problems.parquet", index=False)
    else:
        (out / "problems.parquet").unlink(missing_ok=True)
    if samples is not None and len(samples):
        samples.to_parquet(out / "samples.parquet", index=False)
    else:
        (out / "samples.parquet").unlink(missing_ok=True)
    (out / "configs.json").write_text(json.dumps(configs, indent=1, sort_keys=True, default=_json_default))
    sweep = sweep_info.to_dict() if sweep_info is not None else None
    (out / "sweep.json").write_text(json.dumps(sweep, indent=1, default=_json_default))
    meta = {
        "command": command,
        "commit": commit,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "mlflow_uri": tracking_uri,
        "n_runs": int(tidy["run"].nunique()),
        "n_points": int(len(tidy)),
        "arms": arm_order(tidy),
        **({"n_problem_rows": int(len(problems))} if problems is not None and len(problems) else {}),
        **(extra or {}),
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1, default=_json_default))
    return out


class SnapshotError(ValueError):
    """A snapshot that reads but cannot make a report: a needed column missing or empty, no rows."""


SNAPSHOT_NOT_NULL = ["run", "arm", "seed", "grad_step", "metric"]
"""Columns of ``runs.parquet`` no row may leave empty (a report groups by them)."""


def check_tidy(raw: pd.DataFrame, where: str) -> None:
    """Raise :class:`SnapshotError` unless ``raw`` (a ``runs.parquet`` as read) has every column of
    :data:`TIDY_COLUMNS`, at least one row, and no empty value in :data:`SNAPSHOT_NOT_NULL`."""
    missing = [c for c in TIDY_COLUMNS if c not in raw.columns]
    if missing:
        raise SnapshotError(f"{where} lacks the column{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                            f"(a snapshot has {', '.join(TIDY_COLUMNS)})")
    if raw.empty:
        raise SnapshotError(f"{where} holds no logged points")
    for c in SNAPSHOT_NOT_NULL:
        n = int(raw[c].isna().sum()) + (int((raw[c].astype(str) == "").sum()) if raw[c].dtype == object else 0)
        if n:
            raise SnapshotError(f"{where}: column {c} is empty in {n} of {len(raw)} rows")


def load_snapshot(snapshot_dir: str | Path) -> tuple[pd.DataFrame, dict[str, dict], SweepInfo | None]:
    """``(tidy, configs, sweep_info)`` exactly as they were given to :func:`snapshot`; a ``runs.parquet``
    lacking a needed column is a :class:`SnapshotError` (a report from it would be silently wrong)."""
    d = Path(snapshot_dir)
    raw = pd.read_parquet(d / "runs.parquet")
    check_tidy(raw, str(d / "runs.parquet"))
    tidy = normalize_tidy(raw)
    configs = json.loads((d / "configs.json").read_text())
    sweep = json.loads((d / "sweep.json").read_text())
    return tidy, configs, (SweepInfo.from_dict(sweep) if sweep else None)


def normalize_problems(df: pd.DataFrame) -> pd.DataFrame:
    """Column order and dtypes of ``problems.parquet`` (:data:`PROBLEM_COLUMNS`), sorted by run, step, set, problem."""
    df = df.reindex(columns=PROBLEM_COLUMNS)
    for c in ("run", "run_id", "arm", "set", "problem"):
        df[c] = df[c].astype(object).where(df[c].notna(), "").astype(str)
    for c in ("seed", "step", "grad_step", "n_correct", "k"):
        df[c] = df[c].astype("int64")
    return df.sort_values(["run", "step", "set", "problem"], kind="stable").reset_index(drop=True)


def load_problems(snapshot_dir: str | Path) -> pd.DataFrame | None:
    """The snapshot's per-problem outcomes (``problems.parquet``, :data:`PROBLEM_COLUMNS`); None when it has
    none (snapshots of runs that predate the per-sample records, or made without them on disk)."""
    p = Path(snapshot_dir) / "problems.parquet"
    return normalize_problems(pd.read_parquet(p)) if p.exists() else None


def spec_runs(tidy: pd.DataFrame, arm_of: dict[str, str], sweep_name: str | None = None) -> pd.DataFrame:
    """The rows of ``tidy`` whose ``run_id`` is one of a sweep's (``arm_of``: {run_id: arm}, from its
    expansion), under that sweep's arm names (and ``sweep_name``): a run launched by another sweep
    with the same resolved config is the same run."""
    out = tidy[tidy["run_id"].astype(str).isin(set(arm_of))].copy()
    out["arm"] = out["run_id"].astype(str).map(arm_of)
    if sweep_name:
        out["sweep"] = sweep_name
    return out


def merge_snapshot(tidy: pd.DataFrame, configs: dict[str, dict], snapshot_dir: str | Path, *,
                   arm_of: dict[str, str] | None = None, sweep_name: str | None = None
                   ) -> tuple[pd.DataFrame, dict[str, dict], dict]:
    """``tidy``/``configs`` plus the runs of an earlier snapshot that they do not have (matched by
    ``run_id``, the config hash: a run in both is taken from ``tidy``, the live store), and a record
    of what was added: ``{dir, commit, created, command, n_runs}`` for meta.json's ``merged`` list.

    ``arm_of`` ({run_id: arm}, from the sweep's expansion): only the snapshot's runs with those run
    ids are added, under the sweep's arm names (and ``sweep_name``): a run launched by another sweep
    with the same resolved config is the same run."""
    old, old_cfg, _ = load_snapshot(snapshot_dir)
    have = set(tidy["run_id"].astype(str)) if len(tidy) else set()
    add = old[~old["run_id"].astype(str).isin(have)]
    if arm_of is not None:
        add = spec_runs(add, arm_of, sweep_name)
    runs = set(add["run"])
    merged = normalize_tidy(pd.concat([old.iloc[:0], tidy, add], ignore_index=True)) if len(add) else tidy
    cfg = {**{r: c for r, c in old_cfg.items() if r in runs}, **configs}
    m = read_meta(snapshot_dir)
    rec = {"dir": str(snapshot_dir), "commit": m.get("commit"), "created": m.get("created"),
           "command": m.get("command"), "n_runs": len(runs)}
    return merged, cfg, rec


def read_meta(snapshot_dir: str | Path) -> dict:
    """The snapshot's ``meta.json`` (command, commit, created, mlflow_uri, ...)."""
    p = Path(snapshot_dir) / "meta.json"
    return json.loads(p.read_text()) if p.exists() else {}
