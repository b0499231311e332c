"""The arithmetic mini task (dapo.data.minitask) and its base-model builder (dapo.base_model)."""
from __future__ import annotations

import json
import random
import re

import pytest

from dapo.data import minitask
from dapo.data.minitask import (
                                eval_problems,
                                eval_prompts,
                                evaluate_left_to_right,
                                iter_problems,
                                make_problem,
                                make_split,
                                )
from dapo.data.rewards import dapo_score

PROMPT_RE = re.compile(r"^\d+([-+*]\d+)+=$")


def _train_sample(n: int = 3000, **kw) -> list[dict]:
    return make_split("train", n, minitask.TRAIN_SEED, **kw)


# --------------------------------------------------------------------------- generator


def test_make_problem_hand_example():
    # the format of one 3-operation problem: "a?b?c?d=" / three steps / "Answer: n"
    rng = random.Random(0)
    prompt, solution, answer = make_problem(rng, 3, 12)
    assert PROMPT_RE.match(prompt)
    steps, answer_line = solution.split("\n")
    assert answer_line == f"Answer: {answer}"
    assert len(steps.split(" ")) == 3  # one "a<op>b=c." step per operation


def test_solution_steps_are_left_to_right_and_correct():
    # 7*3-5: 7*3 = 21, then 21-5 = 16 (the module doc's example), recomputed here by hand
    assert evaluate_left_to_right("7*3-5=") == 16
    assert evaluate_left_to_right("3-5+7=") == 5  # 3-5 = -2, -2+7 = 5
    for p in _train_sample(2000) + eval_problems():
        value = None
        for step in p["solution"].split("\n")[0].split(" "):
            m = re.fullmatch(r"(-?\d+)([-+*])(\d+)=(-?\d+)\.", step)
            assert m, (p, step)
            a, op, b, c = int(m[1]), m[2], int(m[3]), int(m[4])
            assert value is None or a == value  # each step starts from the last result
            assert c == {"+": a + b, "-": a - b, "*": a * b}[op]
            value = c
        assert str(value) == p["answer"] == str(evaluate_left_to_right(p["prompt"]))
        # '*' only before '+'/'-': left to right equals the usual precedence
        assert PROMPT_RE.match(p["prompt"])  # digits and +-* only, so eval is safe
        assert eval(p["prompt"][:-1]) == int(p["answer"])  # noqa: S307


def test_same_seed_same_problems_other_seed_other_problems():
    a = [next(it) for it in [iter_problems(5)] for _ in range(50)]
    b = [next(it) for it in [iter_problems(5)] for _ in range(50)]
    c = [next(it) for it in [iter_problems(6)] for _ in range(50)]
    assert a == b
    assert a != c
    assert make_split("train", 100, 3) == make_split("train", 100, 3)
    assert eval_problems() == eval_problems()


def test_n_ops_and_operand_range_respected():
    for p in _train_sample(1000, n_ops=(2, 4), operand_max=7):
        assert 2 <= p["n_ops"] <= 4
        nums = [int(x) for x in re.findall(r"\d+", p["prompt"])]
        assert len(nums) == p["n_ops"] + 1 and all(1 <= x <= 7 for x in nums)
    with pytest.raises(ValueError, match="n_ops"):
        make_problem(random.Random(0), 0, 12)
    with pytest.raises(ValueError, match="n_ops"):
        next(iter_problems(0, n_ops=(3, 1)))
    with pytest.raises(ValueError, match="valid"):
        make_split("dev", 10, 0)


def test_eval_set_fixed_distinct_stratified():
    ev = eval_problems()
    assert len(ev) == minitask.N_EVAL == 200
    assert len({p["prompt"] for p in ev}) == len(ev)
    counts = {k: sum(p["n_ops"] == k for p in ev) for k in (1, 2, 3)}
    assert set(counts.values()) <= {66, 67} and sum(counts.values()) == 200


def test_train_and_eval_disjoint():
    held_out = eval_prompts()
    train = make_split("train", minitask.N_TRAIN, minitask.TRAIN_SEED)
    assert not held_out & {p["prompt"] for p in train}
    # the exclusion is doing work: without it the stream does hit held-out prompts
    raw = iter_problems(minitask.TRAIN_SEED)
    assert any(next(raw)["prompt"] in held_out for _ in range(5000))
    # the supervised stream of the base model excludes them too
    sft = iter_problems("dapo-sft:0", exclude=held_out)
    assert not any(next(sft)["prompt"] in held_out for _ in range(5000))


def test_lengths_vary_so_a_cap_bites():
    train = _train_sample(3000)
    by_ops = {k: [len(p["solution"]) for p in train if p["n_ops"] == k] for k in (1, 2, 3)}
    means = [sum(v) / len(v) for v in by_ops.values()]
    assert means[0] < means[1] < means[2]
    # +1 for EOS: some correct solutions do not fit a 40-token cap, most do
    over = sum(len(p["solution"]) + 1 > 40 for p in train) / len(train)
    assert 0.01 < over < 0.3


def test_every_solution_scores_plus_one_and_wrong_answer_minus_one():
    for p in _train_sample(2000) + eval_problems():
        assert dapo_score(p["solution"], p["answer"]) == 1.0
        assert dapo_score(p["solution"], str(int(p["answer"]) + 1)) == -1.0


def test_only_character_vocabulary():
    from dapo.models import CHAR_VOCAB

    chars = set("".join(p["prompt"] + p["solution"] for p in _train_sample(2000)))
    assert chars <= set(CHAR_VOCAB)


def test_registered_datasets():
    from dapo.data.datasets import dataset_names, load_dataset

    assert {"arith-train", "arith-eval"} <= set(dataset_names())
    ev, rep = load_dataset("arith-eval")
    assert rep.kept == len(ev) == 200 and not rep.bad
    assert [e.prompt for e in ev] == [p["prompt"] for p in eval_problems()]
    assert all(e.scorer == "dapo" and e.source == "arith-eval" for e in ev)
    tr, rep = load_dataset("arith-train", limit=500)
    assert len(tr) == 500 and tr[0].answer == make_split("train", 1, minitask.TRAIN_SEED)[0]["answer"]
    assert not {e.prompt for e in tr} & {e.prompt for e in ev}
    assert all(dapo_score(e.meta["solution"], e.answer) == 1.0 for e in tr)


# --------------------------------------------------------------------------- base model


def test_recipe_validation_names_the_key():
    from dapo.base_model import Recipe

    with pytest.raises(ValueError, match="preset"):
        Recipe(preset="tiny-1b")
    with pytest.raises(ValueError, match="n_ops"):
        Recipe(n_ops=(3, 1))
    with pytest.raises(ValueError, match="eval_problems"):
        Recipe(eval_problems=0)


def test_recipe_hash_stable_and_sensitive():
    from dapo.base_model import Recipe, recipe_hash

    assert recipe_hash(Recipe()) == recipe_hash(Recipe())
    assert recipe_hash(Recipe()) != recipe_hash(Recipe(steps=Recipe().steps + 1))
    assert recipe_hash(Recipe(n_ops=(1, 3))) == recipe_hash(Recipe(n_ops=[1, 3]))  # type: ignore[arg-type]


def test_lr_schedule_warmup_then_linear_decay():
    from dapo.base_model import Recipe, _lr_factor

    r = Recipe(steps=10, warmup_steps=2)
    # warm-up: (s+1)/2 -> 0.5, 1.0; then 1 - (s-2)/8 for s = 2..9 -> 1.0, 0.875, ..., 0.125
    assert [_lr_factor(s, r) for s in range(10)] == [0.5, 1.0, 1.0, 0.875, 0.75, 0.625, 0.5,
                                                       0.375, 0.25, 0.125]


# 1 thread: on a shared 2-core machine, 2 OpenMP threads can be several times slower
TINY = dict(steps=20, batch_size=16, warmup_steps=2, cap=24, report_caps=(16, 24),
            eval_problems=6, eval_samples=2, threads=1)


@pytest.mark.slow
def test_tiny_sft_run_writes_record_and_reuses(tmp_path, monkeypatch):
    from dapo import base_model
    from dapo.models import load_model, load_tokenizer

    out = tmp_path / "base"
    rec = base_model.build_base_model(out, progress=False, **TINY)
    assert rec["reused"] is False
    stored = json.loads((out / "base_model.json").read_text())
    assert stored["recipe_hash"] == rec["recipe_hash"]
    assert stored["recipe"]["steps"] == 20 and stored["seed"] == 0
    assert {"torch", "transformers"} <= set(stored["versions"])
    assert rec["train"]["train_loss_last10pct"] < rec["train"]["train_loss_first"]
    from dapo.hardware import cpu_name, has_bf16
    assert rec["train"]["bf16_autocast"] is has_bf16() and stored["cpu"] == cpu_name()   # bf16 only where native
    m = rec["eval"]["at_cap"]["all"]
    assert m["problems"] == 6 and 0.0 <= m["acc"] <= 1.0
    assert 0 < m["response_len_mean"] <= 24
    assert m["all_correct_frac"] + m["all_wrong_frac"] + m["mixed_frac"] == pytest.approx(1.0)
    assert set(rec["eval"]["by_cap"]) == {"16", "24"}
    # truncation can only grow when the cap shrinks
    assert rec["eval"]["by_cap"]["16"]["truncated_frac"] >= rec["eval"]["by_cap"]["24"]["truncated_frac"]
    # an HF directory with the tokenizer: loads back and tokenizes per character
    model, tok = load_model(out), load_tokenizer(out)
    assert model.config.model_type == "qwen2"
    assert len(tok("7*3-5=", add_special_tokens=False)["input_ids"]) == 6

    # second call: same recipe -> stored numbers, no training
    def boom(*a, **k):
        raise AssertionError("retrained")

    monkeypatch.setattr(base_model, "_train", boom)
    again = base_model.build_base_model(out, progress=False, **TINY)
    assert again["reused"] is True
    assert again["eval"] == rec["eval"] and again["wall_time_s"] == rec["wall_time_s"]
    # another recipe in the same directory does train
    with pytest.raises(AssertionError, match="retrained"):
        base_model.build_base_model(out, progress=False, **{**TINY, "steps": 21})
    assert json.loads((out / "base_model.json").read_text())["recipe"]["steps"] == 20


def test_the_base_model_autocasts_bf16_only_where_the_cpu_has_it(tmp_path, monkeypatch):
    """Emulated bf16 (a CPU without AVX512-BF16 / AMX) is ~20× slower than fp32: the supervised steps then run in
    fp32, as the training loop's bf16_autocast does; a recipe with bf16 off never autocasts."""
    import dataclasses

    import torch

    from dapo import base_model, hardware
    from dapo.models import TINY_PRESETS, build_char_tokenizer, build_tiny_qwen2, load_model
    recipe = base_model.Recipe(**{**{k: v for k, v in TINY.items() if k != "threads"}, "steps": 1, "warmup_steps": 0,
                                  "batch_size": 2})
    tok = build_char_tokenizer()
    build_tiny_qwen2(tmp_path / "init", seed=0, tokenizer=tok, **TINY_PRESETS[recipe.preset])
    seen, real = [], torch.autocast

    def spy(device, dtype=None, enabled=True, **kw):
        seen.append(enabled)
        return real(device, dtype=dtype, enabled=enabled, **kw)

    monkeypatch.setattr(torch, "autocast", spy)
    for native, bf16, want in ((False, True, False), (True, True, True), (True, False, False)):
        monkeypatch.setattr(hardware, "has_bf16", lambda: native)
        seen.clear()
        r = base_model._train(load_model(tmp_path / "init", dtype="float32"), tok,
                              dataclasses.replace(recipe, bf16=bf16), progress=False)
        assert seen and set(seen) == {want} and r["bf16_autocast"] is want


def test_refuses_to_replace_a_foreign_directory(tmp_path):
    from dapo.base_model import build_base_model

    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a base model"):
        build_base_model(tmp_path, progress=False, **TINY)


def test_cli_help_is_fast_and_lists_options(capsys):
    from dapo.base_model import main

    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for opt in ("--out", "--steps", "--preset", "--seed", "--force", "--cap"):
        assert opt in out


def test_exhausted_problem_space_raises_instead_of_looping():
    # operand_max=1, one operation: only "1+1=", "1-1=", "1*1=" exist
    it = iter_problems(0, n_ops=(1, 1), operand_max=1, unique=True)
    assert sorted(next(it)["prompt"] for _ in range(3)) == ["1*1=", "1+1=", "1-1="]
    with pytest.raises(ValueError, match="too few distinct"):
        next(it)


def test_splits_are_frozen():
    # Golden values: a change here changes every base model and every RL run's data;
    # if intended, bump dapo.base_model.RECIPE_VERSION and update these.
    import hashlib

    def digest(obj) -> str:
        return hashlib.sha256(json.dumps(obj).encode()).hexdigest()[:12]

    assert [p["prompt"] for p in eval_problems()[:3]] == ["5-2=", "9*9-4=", "10-5-8+1="]
    assert digest(eval_problems()) == "6e53b5807fef"
    assert digest(make_split("train", minitask.N_TRAIN, minitask.TRAIN_SEED)) == "106ec61bb65f"


# --------------------------------------------------------------------------- solution styles


def test_solve_styles_hand_examples():
    assert minitask.solve("8*6+10-4=", "steps") == "8*6=48. 48+10=58. 58-4=54.\nAnswer: 54"
    # the larger factor counted up as many times as the smaller one
    assert minitask.solve("8*6+10-4=", "sums") == "8*6=8 16 24 32 40 48. 48+10=58. 58-4=54.\nAnswer: 54"
    assert minitask.solve("3*12*2=", "sums") == "3*12=12 24 36. 36*2=36 72.\nAnswer: 72"
    assert minitask.solve("5-9-8=", "sums") == "5-9=-4. -4-8=-12.\nAnswer: -12"  # no product: as steps
    assert minitask.solve("5-9-8=", "answer") == "Answer: -12"
    with pytest.raises(ValueError, match="unknown solution style 'short'"):
        minitask.solve("1+1=", "short")


def test_every_style_is_correct_and_steps_is_make_problem():
    rng = random.Random(3)
    for _ in range(300):
        prompt, solution, answer = make_problem(rng, rng.randint(1, 3), 12)
        assert minitask.solve(prompt, "steps") == solution
        for style in minitask.STYLES:
            text = minitask.solve(prompt, style)
            assert dapo_score(text, answer) == 1.0
            same_as_steps = style == "sums" and text == solution  # no product, or a factor of 1
            assert minitask.style_of(text) == ("steps" if same_as_steps else style)


def test_sums_lengths_span_ten_to_over_a_hundred_tokens():
    it = iter_problems(5)
    lengths = [len(minitask.solve(next(it)["prompt"], "sums")) + 1 for _ in range(3000)]
    assert min(lengths) < 20 and max(lengths) > 120


def test_style_recipe_keeps_old_hash_and_validates():
    from dapo.base_model import NAMED_RECIPES, Recipe, named_recipe, recipe_hash

    assert recipe_hash(Recipe()) == "c97de4e41dc1"  # the v1 base model (results/table1-mini-v1)
    assert "styles" not in Recipe().to_dict() and "length_buckets" not in Recipe().to_dict()
    v2 = Recipe(**NAMED_RECIPES["mini-base-v2"])
    assert recipe_hash(v2) != recipe_hash(Recipe()) and v2.to_dict()["styles"]
    with pytest.raises(ValueError, match="styles"):
        Recipe(styles=(("verbose", 1.0),))
    with pytest.raises(ValueError, match="styles"):
        Recipe(styles=(("steps", 1.0), ("steps", 2.0)))
    assert named_recipe("mini-base-v2:150") == {**NAMED_RECIPES["mini-base-v2"], "steps": 150}
    assert named_recipe("tiny-3m") is None
    with pytest.raises(ValueError, match="mini-base-v2:<supervised steps>"):
        named_recipe("mini-base-v2:many")


def test_length_buckets_sort_rows_and_keep_every_row():
    from dapo.base_model import Recipe, _sft_batches
    from dapo.models import build_char_tokenizer

    tok = build_char_tokenizer()
    styles = (("answer", 1.0), ("sums", 1.0))
    one = next(_sft_batches(Recipe(steps=1, warmup_steps=0, batch_size=12, styles=styles), tok))
    four = next(_sft_batches(Recipe(steps=1, warmup_steps=0, batch_size=12, styles=styles, length_buckets=4), tok))
    assert len(one) == 1 and [c[0].shape[0] for c in four] == [3, 3, 3, 3]
    n_target = lambda chunks: sum(int((lab != -100).sum()) for _, lab, _ in chunks)  # noqa: E731
    assert n_target(one) == n_target(four)  # same rows, same supervised tokens
    widths = [c[0].shape[1] for c in four]
    assert widths == sorted(widths) and sum(int(c[2].sum()) for c in four) == int(one[0][2].sum())


def test_fresh_split_is_unseen_balanced_and_pinned():
    """arith-fresh: 2 and 3 ops in equal shares, distinct, no prompt that arith-eval,
    arith-train or the shipped base models' supervised stream holds; pinned digest; and
    SFT_DRAWS covers every shipped recipe's supervised problems."""
    import hashlib
    import json

    from dapo.base_model import NAMED_RECIPES, Recipe
    from dapo.data.datasets import load_dataset

    fresh = minitask.fresh_problems()
    prompts = [p["prompt"] for p in fresh]
    assert len(prompts) == len(set(prompts)) == minitask.N_FRESH
    assert sorted(p["n_ops"] for p in fresh) == [2] * 100 + [3] * 100
    assert not set(prompts) & minitask.seen_prompts()
    assert all(Recipe(**kw).steps * Recipe(**kw).batch_size <= minitask.SFT_DRAWS for kw in NAMED_RECIPES.values())
    assert hashlib.sha256(json.dumps(fresh).encode()).hexdigest()[:12] == "abca159fea75"
    ex, _ = load_dataset("arith-fresh")
    assert [e.prompt for e in ex] == prompts and all(e.source == "arith-fresh" for e in ex)


def test_half_made_cached_base_model_is_rebuilt_under_the_lock(tmp_path, monkeypatch):
    """A base model left half-made in the cache (tokenizer files only: no config, no record) is
    rebuilt, not refused; the build holds the entry's lock, so other ranks or jobs wait for it."""
    from dapo import base_model, models

    monkeypatch.setenv("DAPO_LAB_CACHE", str(tmp_path))
    kw = {k: v for k, v in TINY.items() if k != "threads"}
    out = base_model.default_out_dir(base_model.Recipe(**{**kw, "report_caps": tuple(kw["report_caps"])}))
    out.mkdir(parents=True)
    models.build_char_tokenizer().save_pretrained(out)

    def fake_train_into(tmp, tok, recipe, h, start, *, progress):
        assert models.lock_path(out).is_file()            # built while holding the lock
        (tmp / "config.json").write_text("{}")
        (tmp / "model.safetensors").write_bytes(b"")
        rec = {"recipe_hash": h, "recipe": recipe.to_dict()}
        (tmp / base_model.RECORD_NAME).write_text(json.dumps(rec))
        return rec

    monkeypatch.setattr(base_model, "_train_into", fake_train_into)
    rec = base_model.build_base_model(progress=False, **TINY)
    assert rec["reused"] is False and rec["model_path"] == str(out)
    assert (out / "config.json").is_file() and (out / models.COMPLETE_MARKER).is_file()
    assert base_model.build_base_model(progress=False, **TINY)["reused"] is True
    assert not models.lock_path(out).exists()
