"""The ``dapo`` command. Subcommands import their heavy parts lazily so ``--help`` is fast
(``dapo train --help`` and every ``dapo train`` input error return before torch is imported).

    dapo --version                    package version and git commit
    dapo train EXP.yaml [k=v ...]     run or resume one training run
    dapo config EXP.yaml [k=v ...]    print the resolved config; --keys lists every key (EXP's values)
    dapo runs [--sweep SPEC] [--output DIR]   the runs under DIR: arm, seed, status, step, metric, wall
    dapo sweep expand|submit|status|cancel SPEC ...   ablation sweeps (Slurm / local)
    dapo plan EXP [k=v ...] --cluster PROFILE   will it fit the GPUs, how long is a step
    dapo figures SPEC [--runs DIR] [--to DIR]   figures, Table 1 and report.md
    dapo diff RUN_A RUN_B [--metrics A,B] [--json]   config keys that differ, metrics side by side
    dapo export RUN [--step S] --to DIR   a run's checkpoint as a Hugging Face model directory
    dapo base                         build (or reuse) the tiny supervised base model
    dapo demo                         the README's first command: GRPO vs DAPO end to end
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

COMMANDS = {
    "train": ("dapo.train.loop", "run (or resume) one training run: vLLM rollouts, rewards, dynamic sampling, "
                            "policy updates, eval, MLflow, checkpoints"),
    "config": ("dapo.cli", "print an experiment's resolved config (with overrides); --keys documents every key"),
    "runs": ("dapo.commands.runs", "list the runs under an output root (or of a sweep): arm, seed, status, last step, "
                               "final metric, wall time, and the mlflow ui command"),
    "sweep": ("dapo.commands.sweep", "expand / submit / status / cancel an ablation sweep (Slurm via submitit, or local)"),
    "plan": ("dapo.sweep.plan", "per-GPU memory and step time of an experiment on a cluster profile (arithmetic); "
                          "exit 1 when it does not fit"),
    "figures": ("analysis.report", "a sweep's figures, Table 1 and report.md: from the runs in --runs DIR (or "
                                   "--from-snapshot) into --to DIR"),
    "eval": ("dapo.commands.eval", "evaluate a run's checkpoint, a model dir or a named model by a protocol: k samples "
                              "per problem, pass@k / maj@k curves, per-sample records (resumable)"),
    "diff": ("dapo.commands.diff", "two runs compared: the config keys that differ (A's value, B's) and the headline "
                              "metrics side by side at the rollout steps both logged"),
    "export": ("dapo.commands.export", "write a run's checkpoint (--step S, default the latest) as a Hugging Face model "
                                  "dir (safetensors, tokenizer): from_pretrained and `dapo eval DIR` load it"),
    "base": ("dapo.base_model", "build (or reuse) the tiny supervised base model of the mini reproduction"),
    "demo": ("dapo.commands.demo", "GRPO vs DAPO on the tiny model, end to end, into results/demo/"),
}

INTERRUPTED = 130
"""Exit status after Ctrl-C (128 + SIGINT, what a shell reports for a command stopped by it)."""


USAGE = "usage: dapo <command> [args]   (dapo <command> --help for details; dapo --version)\n\ncommands:\n" + "\n".join(
    f"  {name:<8} {text}" for name, (_, text) in COMMANDS.items()) + """

Every command reads the same typed config (dapo/config/). Examples:
  dapo train experiments/tiny-dapo.yaml train.rollout_steps=3
  dapo config experiments/paper-dapo-32b.yaml --keys
  dapo runs --output runs
  dapo sweep expand sweeps/table1.yaml
  dapo plan experiments/paper-dapo-32b.yaml --cluster example-gpu-cluster
  dapo sweep submit sweeps/table1-mini.yaml --cluster local
  dapo figures sweeps/table1-mini.yaml --from-snapshot
  dapo eval runs/<run dir> --step 30
"""


def config_main(argv: list[str]) -> int:
    from dapo.config import ConfigError, field_docs, flatten, load_config, to_dict
    p = argparse.ArgumentParser(prog="dapo config", description="Print the resolved config of an experiment.")
    p.add_argument("experiment", nargs="?", help="experiment YAML (omit with --keys for the defaults)")
    p.add_argument("overrides", nargs="*", help="dotted KEY=VALUE overrides")
    p.add_argument("--keys", action="store_true",
                   help="list every key with its value (EXP's, else the default), allowed values and a one-line doc")
    a = p.parse_args(argv)
    try:
        cfg = load_config(a.experiment, a.overrides) if (a.experiment or a.overrides or not a.keys) else None
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if a.keys:
        import json
        values = flatten(to_dict(cfg)) if cfg is not None else {}
        for key, default, text in field_docs():
            shown = json.dumps(values[key], default=str) if key in values else default
            print(f"{key:<42} {shown:<22} {text}")
        return 0
    import yaml
    print(yaml.safe_dump(to_dict(cfg), sort_keys=False), end="")
    return 0


TRAIN_EXAMPLE = ("example:\n  dapo train experiments/tiny-dapo.yaml train.rollout_steps=5 algo.clip.eps_high=0.2\n"
                 "Running again with the same config resumes from the run directory's last checkpoint;\n"
                 "a finished run exits at once. `dapo config --keys` lists every key.")


def train_parser() -> argparse.ArgumentParser:
    """``dapo train``'s arguments (light: building it imports nothing heavy)."""
    p = argparse.ArgumentParser(
        prog="dapo train",
        description="Run (or resume) one training run: rollouts, rewards, dynamic sampling, "
                    "policy updates, evaluation, MLflow logging and checkpoints.",
        epilog=TRAIN_EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("experiment", help="experiment YAML (see experiments/)")
    p.add_argument("overrides", nargs="*", help="dotted KEY=VALUE overrides, e.g. algo.clip.eps_high=0.28")
    p.add_argument("--run-dir", help="run directory (default: <output_dir>/runs/<name>-<config hash>); one that holds "
                                     "a run of another config, or files no run writes, is refused")
    p.add_argument("--allow-resource-change", action="store_true",
                   help="resume although resource-only keys (train.threads, rollout.tensor_parallel_size, ...: "
                        "dapo.config.UNHASHED_KEYS) differ from the run's config.yaml")
    p.add_argument("--new-mlflow-run", action="store_true",
                   help="resume a run whose MLflow store (or its MLflow run) is gone: go on from the last checkpoint "
                        "and log the remaining steps to a new MLflow run, tagged dapo.history_from_step")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("--verbose", action="store_true",
                   help="show the rollout engine's (vLLM's) log on the terminal too (default: only in "
                        "<run dir>/engine.log)")
    return p


def mlflow_ui_command(uri: str) -> str:
    """The command that browses the MLflow store ``uri`` (a tracking server is its own UI).

    ``mlflow`` is named by the path of this environment's executable unless the one on ``PATH`` is
    that same file: outside an activated venv a bare ``mlflow`` is "command not found"."""
    import shlex
    import shutil
    import sys
    if uri.startswith(("http://", "https://")):
        return f"open {uri} in a browser (the MLflow server serves the UI)"
    exe = "mlflow"
    mine = Path(sys.executable).parent / "mlflow"
    on_path = shutil.which("mlflow")
    if mine.is_file() and not (on_path and Path(on_path).resolve() == mine.resolve()):
        exe = shlex.quote(_short_path(mine))
    return f"{exe} ui --backend-store-uri {shlex.quote(uri)}"


def _short_path(p: Path) -> str:
    """``p`` relative to the working directory when it lies under it (``.venv/bin/mlflow``), else absolute."""
    try:
        return str(p.relative_to(Path.cwd()))
    except ValueError:
        return str(p)


def _check_world(cfg) -> None:
    """The launcher started as many processes as the config says (``launch.num_nodes`` ×
    ``launch.num_processes``): e.g. ``accelerate launch --num_processes 2`` on a machine without GPUs
    and without ``--multi_cpu`` starts one, which would otherwise train alone, unsharded."""
    from dapo.config import ConfigError
    want = cfg.launch.num_nodes * cfg.launch.num_processes
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world != want:
        raise ConfigError(f"launch.num_nodes x launch.num_processes = {want}, but the launcher started {world} "
                          f"process(es) (WORLD_SIZE={world}): start {want} (e.g. python -m torch.distributed.run "
                          f"--nproc_per_node {want} -m dapo.cli train ...) or set launch.num_processes={world}")


def _cuda_available() -> bool:
    import torch
    return torch.cuda.is_available()


def parse_or_usage(parser: argparse.ArgumentParser, argv: list[str] | None, examples: str, *,
                   intermixed: bool = False) -> tuple[list[str], argparse.Namespace] | None:
    """A subcommand's (argv, arguments): ``argv`` (None: ``sys.argv[1:]``) parsed by ``parser``; None after its
    usage and ``examples`` are printed to stderr when no argument was given (the command then exits 2)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print(parser.format_usage() + examples, file=sys.stderr)
        return None
    return argv, (parser.parse_intermixed_args(argv) if intermixed else parser.parse_args(argv))


def train_main(argv: list[str], train_fn=None) -> int:
    """``dapo train``: every input is checked (config, data, model, eval sets) before the run
    directory exists; one line and exit status 2 for each problem. A finished run exits at once.

    ``train_fn`` is :func:`dapo.train.loop.train` (``python -m dapo.train`` passes it; ``dapo train`` loads the
    module by name, as every subcommand is loaded, once the inputs are known to be good)."""
    got = parse_or_usage(train_parser(), argv, TRAIN_EXAMPLE)
    if got is None:
        return 2
    argv, a = got
    from dapo.config import ConfigError, load_config, show, to_dict
    from dapo.preflight import check_history, check_run, check_writable, finished_summary
    from dapo.run_dir import RunDirBusy, check_run_dir, hold_run_dir, run_dir_for
    main_rank = int(os.environ.get("RANK", "0") or 0) == 0   # rank 0 of a multi-process run checks and locks
    try:
        if a.run_dir is not None and (not a.run_dir or any(ord(c) < 32 or ord(c) == 127 for c in a.run_dir)):
            raise ConfigError(f"--run-dir {show(a.run_dir)}: expected a directory path without control characters")
        cfg = load_config(a.experiment, a.overrides)
        if a.print_config:
            import yaml
            print(yaml.safe_dump(to_dict(cfg), sort_keys=False))
            return 0
        check_run(cfg, a.experiment)
        _check_world(cfg)
        run_dir = Path(a.run_dir) if a.run_dir else run_dir_for(cfg)
        if main_rank:
            check_writable(run_dir, "the run directory")
            check_run_dir(cfg, run_dir, allow_resource_change=a.allow_resource_change)
            if not a.new_mlflow_run:
                check_history(run_dir)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    done = finished_summary(run_dir)
    if done is not None:
        if main_rank:
            print(f"already finished: {run_dir}" + (f"\n  browse: {mlflow_ui_command(done['mlflow_uri'])}"
                                                    if isinstance(done.get("mlflow_uri"), str) else ""))
        return 0
    from dapo.dist.distributed import CudaUnavailableError
    from dapo.file_lock import NoLocksError
    from dapo.models import CacheBusyError
    from dapo.preflight import ToolchainError, check_compile_toolchain
    from dapo.run_dir import RunDirNoLocks
    from dapo.tracking.tracker import TrackingError
    from dapo.train.checkpoint import CheckpointError
    try:
        check_compile_toolchain(cfg, _cuda_available)    # vLLM's compiled CUDA path: a compiler, Python.h
        with hold_run_dir(run_dir, enabled=main_rank):   # train() finds it held (re-entrant)
            from dapo.logs import route_engine_logs
            route_engine_logs(run_dir, verbose=a.verbose)
            if train_fn is None:
                import importlib
                train_fn = importlib.import_module(COMMANDS["train"][0]).train
            summary = train_fn(cfg, run_dir, **({"new_mlflow_run": True} if a.new_mlflow_run else {}))
    except (ToolchainError, NoLocksError, RunDirNoLocks, TrackingError) as exc:   # this node cannot compile the engine's kernels,
        # or the file system has no locks: one line, status 1
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except RunDirBusy as exc:   # raised on entry only: another process trains into this run dir
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (CudaUnavailableError, CacheBusyError, CheckpointError) as exc:   # the machine or the files, not the
        # input: one line, status 1 (a checkpoint error names the checkpoint and what is wrong with it)
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:      # a full disk or a read-only file system under the run: one line naming the file
        from dapo.store_checks import write_problem
        problem = write_problem(exc)
        if problem is None:
            raise
        print(f"error: {problem}; {run_dir} keeps its last checkpoint: free space (or make it writable) "
              f"and run the same command to resume", file=sys.stderr)
        return 1
    except KeyboardInterrupt:   # Ctrl-C: train() has ended the MLflow run KILLED; the checkpoints stay
        if main_rank:
            print(f"dapo train: interrupted; {run_dir} keeps its last checkpoint: the same command resumes it",
                  file=sys.stderr, flush=True)
        return INTERRUPTED
    if main_rank and isinstance(summary, dict) and summary.get("mlflow_uri"):
        print(f"[dapo] browse the run: {mlflow_ui_command(summary['mlflow_uri'])}", flush=True)
    return 0


def version() -> str:
    """``dapo <version> (commit <sha>)``."""
    from dapo import __version__
    from dapo.tracking.tracker import git_commit
    return f"dapo {__version__} (commit {git_commit()})"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        rc = _dispatch(argv)
        sys.stdout.flush()       # inside the try: a closed pipe fails here, not in the interpreter's exit
        return rc
    except BrokenPipeError:   # `dapo sweep expand ... | head -1`: the reader left; exit quietly, as other CLIs do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())    # so the interpreter's final flush does not fail again
        return 141                               # 128 + SIGPIPE, what a shell reports for `yes | head -1`
    except OSError as exc:   # a full disk, a read-only file system: one line naming the file, not a traceback
        from dapo.store_checks import write_problem
        problem = write_problem(exc)
        if problem is None:
            raise
        print(f"error: {problem}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C in any command: one line, not a traceback (what was stopped is clean:
        cmd = argv[0] if argv and argv[0] in COMMANDS else ""   # each command leaves resumable state)
        print(f"dapo{' ' + cmd if cmd else ''}: interrupted", file=sys.stderr, flush=True)
        return INTERRUPTED


def _dispatch(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    if argv[0] in ("--version", "-V", "version"):
        print(version())
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(f"dapo: unknown command {cmd!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    if cmd == "config":
        return config_main(rest)
    if cmd == "train":
        return train_main(rest)
    import importlib
    mod = importlib.import_module(COMMANDS[cmd][0])
    return int(mod.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
