"""The ``dapo`` command. Subcommands import their heavy parts lazily so ``--help`` is fast.

    dapo train EXP.yaml [k=v ...]     run or resume one training run
    dapo config EXP.yaml [k=v ...]    print the resolved config; --keys lists every key
    dapo sweep expand|submit|status|cancel SPEC ...   ablation sweeps (Slurm / local)
    dapo plan EXP [k=v ...] --cluster PROFILE   will it fit the GPUs, how long is a step
    dapo figures SPEC [--runs DIR] [--to DIR]   figures, Table 1 and report.md
    dapo base                         build (or reuse) the tiny supervised base model
    dapo demo                         the README's first command: GRPO vs DAPO end to end
"""

from __future__ import annotations

import sys

COMMANDS = {
    "train": ("dapo.train", "run (or resume) one training run: vLLM rollouts, rewards, dynamic sampling, "
                            "policy updates, eval, MLflow, checkpoints"),
    "config": ("dapo.cli", "print an experiment's resolved config (with overrides); --keys documents every key"),
    "sweep": ("dapo.sweep", "expand / submit / status / cancel an ablation sweep (Slurm via submitit, or local)"),
    "plan": ("dapo.plan", "per-GPU memory and step time of an experiment on a cluster profile (arithmetic); "
                          "exit 1 when it does not fit"),
    "figures": ("analysis.report", "a sweep's figures, Table 1 and report.md: from the runs in --runs DIR (or "
                                   "--from-snapshot) into --to DIR"),
    "base": ("dapo.base_model", "build (or reuse) the tiny supervised base model of the mini reproduction"),
    "demo": ("dapo.demo", "GRPO vs DAPO on the tiny model, end to end, into results/demo/"),
}

USAGE = "usage: dapo <command> [args]   (dapo <command> --help for details)\n\ncommands:\n" + "\n".join(
    f"  {name:<8} {text}" for name, (_, text) in COMMANDS.items()) + """

Every command reads the same typed config (dapo/config.py). Examples:
  dapo train experiments/tiny-dapo.yaml train.rollout_steps=3
  dapo config experiments/paper-dapo-32b.yaml --keys
  dapo sweep expand sweeps/table1.yaml
  dapo plan experiments/paper-dapo-32b.yaml --cluster example-gpu-cluster
  dapo sweep submit sweeps/table1-mini.yaml --cluster local
  dapo figures sweeps/table1-mini.yaml --from-snapshot
"""


def config_main(argv: list[str]) -> int:
    import argparse
    from dapo.config import ConfigError, field_docs, load_config, to_dict
    p = argparse.ArgumentParser(prog="dapo config", description="Print the resolved config of an experiment.")
    p.add_argument("experiment", nargs="?", help="experiment YAML (omit with --keys for the defaults)")
    p.add_argument("overrides", nargs="*", help="dotted KEY=VALUE overrides")
    p.add_argument("--keys", action="store_true", help="list every key with its default and a one-line doc")
    a = p.parse_args(argv)
    if a.keys:
        for key, default, text in field_docs():
            print(f"{key:<42} {default:<22} {text}")
        return 0
    try:
        cfg = load_config(a.experiment, a.overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import yaml
    print(yaml.safe_dump(to_dict(cfg), sort_keys=False), end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(f"dapo: unknown command {cmd!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    if cmd == "config":
        return config_main(rest)
    import importlib
    mod = importlib.import_module(COMMANDS[cmd][0])
    return int(mod.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
