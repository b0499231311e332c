"""Benchmark: a sweep's jobs logging at once, embedded sqlite (file lock) vs an MLflow server on PostgreSQL.

N writer processes (default 12) each log S steps (200) of M metrics (30), the way a training
job does: :class:`dapo.tracking.tracker.Tracker` records one point per step (M metrics plus the two
``progress/*`` ones), "checkpoints" every ``--checkpoint-every`` steps (the run id and the
unsent points, to a JSON file) and flushes: one ``log_batch`` per point. Stores:

- ``sqlite``: every writer opens ``sqlite:///<tmp>/mlruns.db`` itself (the embedded default;
  store creation under the ``flock``, writes serialised by sqlite's own lock, "database is
  locked" retried by :func:`dapo.tracking.tracker.call_with_retry`);
- ``server``: an MLflow server (:mod:`dapo.tracking.mlflow_server`, 1 worker) over a throwaway
  PostgreSQL cluster (``scripts/setup-postgres.sh``), writers talk HTTP to it;
- ``postgres`` (optional): every writer opens the PostgreSQL store itself (no server).

Wall time runs from a common start signal (after every writer has imported MLflow and
created its run) to the last writer's end; p50/p99 are over every ``log_batch`` of every
writer. Afterwards the store is read back: each (run, metric, step) must be there once.

    .venv/bin/python -m bench.bench_tracking [--writers 12] [--steps 200] [--metrics 30]
        [--stores sqlite,server] [--out results/bench/tracking.md]

The writer (:func:`run_writer`) is also what ``tests/test_tracking_server.py`` kills and restarts.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROGRESS = ("progress/rollout_step", "progress/grad_step")


def metric_value(writer: int, step: int, m: int) -> float:
    """The value writer ``writer`` logs for metric ``m`` at ``step`` (exact in binary floating point)."""
    return writer * 10_000.0 + step + m / 64.0


def metric_names(n: int) -> list[str]:
    return [f"bench/m{m:02d}" for m in range(n)]


def _save(path: Path, state: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)


def run_writer(uri: str, experiment: str, writer: int, state_path: str | os.PathLike, *, steps: int,
               metrics: int, checkpoint_every: int = 10, step_sleep: float = 0.0,
               go_file: str | None = None, timings_path: str | None = None) -> None:
    """One job's logging: resumable from ``state_path`` (run id, last checkpointed step, unsent points).

    Like the training loop, a point is flushed only after the checkpoint that holds it, so a
    writer killed at any moment and restarted ends with every step in MLflow exactly once.
    """
    from dapo.tracking.tracker import Tracker
    state_path = Path(state_path)
    state = json.loads(state_path.read_text()) if state_path.exists() else {"run_id": None, "step": 0, "pending": []}
    tracker = Tracker(uri, experiment, f"w{writer:02d}", run_uuid=state["run_id"])
    if state["run_id"] is None:
        state["run_id"] = tracker.run_uuid
        _save(state_path, state)          # at once, like mlflow_run.json: a crash before step 1 resumes this run
    times: list[float] = []
    log_batch = tracker.client.log_batch

    def timed(*a, **k):
        t = time.perf_counter()
        out = log_batch(*a, **k)
        times.append(time.perf_counter() - t)
        return out
    tracker.client.log_batch = timed      # what a flush calls once per point
    tracker.buffer = list(state["pending"])
    tracker.flush()                       # points checkpointed but not sent when the last process died
    names = metric_names(metrics)
    if go_file:
        while not os.path.exists(go_file):
            time.sleep(0.01)
    t0 = time.time()
    for step in range(state["step"] + 1, steps + 1):
        tracker.record({n: metric_value(writer, step, m) for m, n in enumerate(names)},
                       rollout_step=step, grad_step=step)
        if step_sleep:
            time.sleep(step_sleep)
        if step % checkpoint_every == 0 or step == steps:
            state.update(step=step, pending=tracker.buffer)
            _save(state_path, state)
            tracker.flush()
    tracker.finish()
    if timings_path:
        Path(timings_path).write_text(json.dumps({"start": t0, "end": time.time(), "log_batch_s": times}))


def read_points(uri: str, experiment: str) -> dict[str, dict[tuple[str, int], list[float]]]:
    """run name → {(metric, step): [values stored]} (every stored row, duplicates included)."""
    from mlflow.tracking import MlflowClient

    from dapo.tracking.tracker import use_credentials
    use_credentials(uri)                  # a postgresql:// store: the password file named in the environment
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    out: dict[str, dict[tuple[str, int], list[float]]] = {}
    for run in client.search_runs([exp.experiment_id], max_results=1000):
        pts = out.setdefault(run.info.run_name, {})
        for key in run.data.metrics:
            for m in client.get_metric_history(run.info.run_id, key):
                pts.setdefault((key, m.step), []).append(m.value)
    return out


def check_points(points: dict[str, dict[tuple[str, int], list[float]]], writers: list[int], *, steps: int,
                 metrics: int) -> list[str]:
    """Problems (empty = every writer's run has every (metric, step) once, with the right value)."""
    errors = []
    for w in writers:
        pts = points.get(f"w{w:02d}")
        if pts is None:
            errors.append(f"w{w:02d}: no run")
            continue
        want = {(n, s): metric_value(w, s, m) for m, n in enumerate(metric_names(metrics)) for s in range(1, steps + 1)}
        want.update({(p, s): float(s) for p in PROGRESS for s in range(1, steps + 1)})
        missing = [k for k in want if k not in pts]
        dup = [k for k, v in pts.items() if len(v) > 1]
        wrong = [k for k, v in pts.items() if k in want and v[0] != want[k]]
        extra = [k for k in pts if k not in want]
        for what, ks in (("missing", missing), ("duplicated", dup), ("wrong value", wrong), ("unexpected", extra)):
            if ks:
                errors.append(f"w{w:02d}: {len(ks)} point(s) {what}, e.g. {sorted(ks)[:3]}")
    return errors


def _pctl(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def bench_store(label: str, uri: str, work: Path, *, writers: int, steps: int, metrics: int,
                checkpoint_every: int, env: dict[str, str], experiment: str = "bench") -> dict:
    """Start ``writers`` processes against ``uri``, release them together, time them, check the store."""
    work.mkdir(parents=True, exist_ok=True)
    go = work / "go"
    procs = []
    for w in range(writers):
        args = json.dumps({"uri": uri, "experiment": experiment, "writer": w, "state_path": str(work / f"w{w}.json"),
                           "steps": steps, "metrics": metrics, "checkpoint_every": checkpoint_every,
                           "go_file": str(go), "timings_path": str(work / f"t{w}.json")})
        procs.append(subprocess.Popen([sys.executable, "-m", "bench.bench_tracking", "--writer", args], cwd=REPO,
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    while not all((work / f"w{w}.json").exists() for w in range(writers)):   # every run created
        if any(p.poll() not in (None, 0) for p in procs):
            break
        time.sleep(0.05)
    go.touch()
    outs = [p.communicate(timeout=3600)[0] for p in procs]
    failed = [(w, p.returncode, o[-2000:]) for w, (p, o) in enumerate(zip(procs, outs)) if p.returncode != 0]
    if failed:
        raise RuntimeError(f"{label}: writer(s) failed: " + "; ".join(f"w{w} rc {rc}: {o}" for w, rc, o in failed))
    res = [json.loads((work / f"t{w}.json").read_text()) for w in range(writers)]
    lat = [t for r in res for t in r["log_batch_s"]]
    errors = check_points(read_points(uri, experiment), list(range(writers)), steps=steps, metrics=metrics)
    return {"store": label, "wall_s": max(r["end"] for r in res) - min(r["start"] for r in res),
            "log_batches": len(lat), "p50_ms": 1000 * statistics.median(lat), "p99_ms": 1000 * _pctl(lat, 0.99),
            "max_ms": 1000 * max(lat), "points_ok": not errors, "errors": errors[:5]}


def start_postgres(work: Path) -> dict[str, str]:
    """A throwaway cluster via scripts/setup-postgres.sh; returns its exported variables."""
    p = subprocess.run(["bash", str(REPO / "scripts" / "setup-postgres.sh"), "start"], capture_output=True,
                       text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"scripts/setup-postgres.sh start failed:\n{p.stderr[-3000:]}")
    return dict(line[len("export "):].split("=", 1) for line in p.stdout.splitlines() if line.startswith("export "))


def stop_postgres(pg: dict[str, str]) -> None:
    subprocess.run(["bash", str(REPO / "scripts" / "setup-postgres.sh"), "stop", pg["DAPO_PG_DIR"]],
                   capture_output=True, timeout=120)
    shutil.rmtree(pg["DAPO_PG_DIR"], ignore_errors=True)


def table(rows: list[dict], writers: int, steps: int, metrics: int) -> str:
    head = (f"{writers} writers x {steps} steps x {metrics} metrics (+2 progress/*): one log_batch per step and "
            f"writer, {writers * steps} in all")
    lines = [head, "", "| store | wall s | log_batch p50 ms | p99 ms | max ms | each point once |",
             "|---|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['store']} | {r['wall_s']:.1f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['max_ms']:.0f} | "
                     f"{'yes' if r['points_ok'] else 'NO: ' + '; '.join(r['errors'])} |")
    return "\n".join(lines)


STORES = {"sqlite": "sqlite, every writer opens the file (file lock)",
          "server": "MLflow server (1 worker) on PostgreSQL",
          "postgres": "PostgreSQL, every writer connects itself"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bench_tracking", description=__doc__.split("\n\n")[0])
    ap.add_argument("--writers", type=int, default=12)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--metrics", type=int, default=30)
    ap.add_argument("--checkpoint-every", type=int, default=10)
    ap.add_argument("--stores", default="sqlite,server", help=f"comma-separated, of {', '.join(STORES)}")
    ap.add_argument("--out", help="also write the table (markdown, with the command and machine) here")
    ap.add_argument("--writer", help=argparse.SUPPRESS)   # internal: one writer process (JSON arguments)
    a = ap.parse_args(argv)
    if a.writer:
        kw = json.loads(a.writer)
        run_writer(kw.pop("uri"), kw.pop("experiment"), kw.pop("writer"), kw.pop("state_path"), **kw)
        return 0
    stores = a.stores.split(",")
    if set(stores) - set(STORES):
        ap.error(f"--stores: unknown {sorted(set(stores) - set(STORES))}; choose from {', '.join(STORES)}")
    from dapo.tracking.mlflow_server import start_server
    load_start = os.getloadavg()[0]
    rows = []
    env = {**os.environ, "DAPO_MLFLOW_RETRIES": "20", "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory(prefix="bench-tracking-") as tmp:
        tmp_p = Path(tmp)
        pg = start_postgres(tmp_p) if {"server", "postgres"} & set(stores) else None
        try:
            for store in stores:
                kw = dict(writers=a.writers, steps=a.steps, metrics=a.metrics, checkpoint_every=a.checkpoint_every)
                if store == "sqlite":
                    rows.append(bench_store(STORES[store], f"sqlite:///{tmp_p / 'sqlite' / 'mlruns.db'}",
                                            tmp_p / "sqlite", env=env, **kw))
                elif store == "server":
                    with start_server(tmp_p / "server", backend_store_uri=pg["DAPO_PG_URI"],
                                      password_file=pg["DAPO_PG_PASSWORD_FILE"]) as srv:
                        rows.append(bench_store(STORES[store], srv.uri, tmp_p / "server-writers", env=env, **kw))
                else:   # the server's database, another experiment
                    penv = {**env, "DAPO_TRACKING_PASSWORD_FILE": pg["DAPO_PG_PASSWORD_FILE"]}
                    os.environ["DAPO_TRACKING_PASSWORD_FILE"] = pg["DAPO_PG_PASSWORD_FILE"]   # the read-back
                    rows.append(bench_store(STORES[store], pg["DAPO_PG_URI"], tmp_p / "pg-writers", env=penv,
                                            experiment="bench-direct", **kw))
                print(f"[bench_tracking] {rows[-1]['store']}: {rows[-1]['wall_s']:.1f} s", file=sys.stderr, flush=True)
        finally:
            if pg:
                stop_postgres(pg)
    text = table(rows, a.writers, a.steps, a.metrics)
    print(text)
    if a.out:
        cmd = "python -m bench.bench_tracking " + " ".join(argv if argv is not None else sys.argv[1:])
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                text=True).stdout.strip()
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(
            f"# Tracking at sweep scale ({time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}, commit {commit})\n\n"
            f"`{cmd.strip()}` on {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
            f"load average {load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end\n\n{text}\n")
    return 0 if all(r["points_ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
