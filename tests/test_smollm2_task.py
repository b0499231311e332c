"""The SmolLM2-135M arithmetic task (issue #14 Part 3): the arith1-* data sets, their prompts,
and the experiment + sweep that use them (docs/SMOLLM2_TASK.md). No model, no engine."""
from __future__ import annotations

from pathlib import Path

from dapo.config import load_config
from dapo.data.datasets import ARITH1_SHOTS, load_dataset
from dapo.data.minitask import evaluate_left_to_right, eval_prompts
from dapo.data.prompts import render_prompt
from dapo.sweep.spec import expand, load_spec

ROOT = Path(__file__).resolve().parents[1]


def _problem(ex) -> str:
    return ex.prompt[-1]["content"]


def test_arith1_splits_are_one_op_disjoint_and_few_shot():
    train, _ = load_dataset("arith1-train")
    ev, _ = load_dataset("arith1-eval")
    assert len(ev) == 67 and len(train) == 5953
    train_p, eval_p = {_problem(e) for e in train}, [_problem(e) for e in ev]
    assert len(train_p) == 364 and len(set(eval_p)) == 67
    assert not train_p & set(eval_p)                                   # never overlap
    assert not {q for q, _ in ARITH1_SHOTS} & (train_p | eval_prompts())  # no shot is a problem
    for e in train[:200] + ev:
        assert e.scorer == "dapo" and e.meta["n_ops"] == 1
        p = _problem(e)
        assert sum(p.count(op) for op in "+-*") == 1 and p.endswith("=")
        assert int(e.answer) == evaluate_left_to_right(p)
        roles = [m["role"] for m in e.prompt]
        assert roles == ["user", "assistant"] * len(ARITH1_SHOTS) + ["user"]
    assert [e.index for e in ev] == list(range(67))


class _ChatTok:
    """Just enough of a tokenizer for render_prompt: a chat template that joins the turns."""
    chat_template = "x"

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        text = "".join(f"<{m['role']}>{m['content']}</>" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")


def test_arith1_prompt_renders_shots_then_problem():
    ex = load_dataset("arith1-eval", limit=1)[0][0]
    text = render_prompt(ex, _ChatTok(), True)
    assert text.startswith("<user>2*4+3=</><assistant>2*4=8. 8+3=11.\nAnswer: 11</>")
    assert text.endswith(f"<user>{_problem(ex)}</><assistant>")


def test_experiment_and_sweep_resolve():
    cfg = load_config(ROOT / "experiments/smollm2-135m-arith.yaml")
    assert cfg.data.train == "arith1-train" and cfg.data.use_chat_template == "yes"
    assert [d.name for d in cfg.eval.datasets] == ["arith1-eval"]
    assert cfg.train.threads == 1 and cfg.rollout.max_new_tokens == cfg.algo.overlong.max_len
    assert cfg.train.batch_prompts // cfg.train.mini_batch_prompts == 8      # grad steps per rollout step
    spec = load_spec(ROOT / "sweeps/smollm2-mini.yaml")
    assert spec.metric == f"eval/arith1-eval/avg_at_{cfg.eval.k}"
    jobs = expand(spec, output="/tmp/smol-test-runs")
    assert len(jobs) == 12 and len({j.run_id for j in jobs}) == 12
