"""Tests of dapo.data.datasets, dapo.data.prompts, dapo.data.readers and dapo.data.sampler: shipped files, loaders, templates, bad rows,
registry, sampler, rendering."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dapo.data import datasets as data
from dapo.data.datasets import DATASET_DIR, DATASETS, load_dataset, register
from dapo.data.prompts import (
                               BOXED_TEMPLATE_SUFFIX,
                               DAPO_TEMPLATE_PREFIX,
                               DAPO_TEMPLATE_SUFFIX,
                               DataError,
                               Example,
                               drop_long_prompts,
                               render_prompt,
                               wrap_dapo,
                               )
from dapo.data.sampler import PromptSampler, batches

SHIPPED = ("dapo-math-17k", "aime24", "aime25", "math500", "gsm8k")


def _jsonl(name: str) -> list[dict]:
    with (DATASET_DIR / name).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _report_adds_up(r: data.LoadReport) -> bool:
    return r.total == r.kept + sum(r.bad.values()) + (r.duplicates if r.deduplicated else 0) + r.limited


# --------------------------------------------------------------------------- shipped files


def _provenance_table() -> dict[str, tuple[int, int, str]]:
    """file -> (rows, bytes, sha256), parsed from the table in PROVENANCE.md."""
    text = (DATASET_DIR / "PROVENANCE.md").read_text(encoding="utf-8")
    rows = re.findall(
        r"^\| `([^`]+)` \| \w+ \| (\d+) \| (\d+) \| `([0-9a-f]{64})` \|$", text, flags=re.M
    )
    return {f: (int(n), int(b), h) for f, n, b, h in rows}


def test_provenance_lists_every_shipped_file():
    table = _provenance_table()
    on_disk = {p.name for p in DATASET_DIR.iterdir() if p.suffix in (".jsonl", ".json", ".parquet")}
    assert set(table) == on_disk
    assert len(table) == 5


@pytest.mark.parametrize("filename", sorted(_provenance_table()))
def test_shipped_file_matches_provenance_sha256(filename):
    rows, size, sha = _provenance_table()[filename]
    raw = (DATASET_DIR / filename).read_bytes()
    assert hashlib.sha256(raw).hexdigest() == sha
    assert len(raw) == size
    assert raw.count(b"\n") == rows


def test_registered_files_live_inside_the_package():
    for name in SHIPPED:
        path = Path(DATASETS[name].path)
        assert path.parent == DATASET_DIR and path.is_file(), name
        assert "shared" not in path.parts


# --------------------------------------------------------------------------- registry loads


# The shipped dapo_math_17k file is already deduplicated by exact problem text, and the
# template is the same for every row, so the defensive dedup of the loader finds nothing:
# 17,290 rows in, 17,290 out (the official block has 17,398 distinct texts only because it
# kept trailing newlines; see PROVENANCE.md).
EXPECTED = {
    "dapo-math-17k": (17290, "dapo", "dapo"),
    "aime24": (30, "dapo", "dapo"),
    "aime25": (30, "dapo", "dapo"),
    "math500": (500, "boxed", "math_verify"),
    "gsm8k": (1319, "dapo", "dapo"),
}


@pytest.mark.parametrize("name", SHIPPED)
def test_registry_dataset_counts(name):
    n, template, scorer = EXPECTED[name]
    examples, report = load_dataset(name)
    assert len(examples) == report.kept == report.total == n
    assert report.bad == {} and report.duplicates == 0 and report.limited == 0
    assert report.template == template and report.scorer == scorer
    assert {ex.scorer for ex in examples} == {scorer}
    assert {ex.source for ex in examples} == {name}
    assert [ex.index for ex in examples] == list(range(n))
    assert all(isinstance(ex.prompt, str) and isinstance(ex.answer, str) for ex in examples)
    assert _report_adds_up(report)


def test_dapo_math_17k_dedup_is_on_and_templated():
    examples, report = load_dataset("dapo-math-17k")
    assert report.deduplicated
    raw = _jsonl("dapo_math_17k.dedup.jsonl")
    for ex, row in zip(examples, raw):
        assert ex.prompt == DAPO_TEMPLATE_PREFIX + row["prompt"][0]["content"] + DAPO_TEMPLATE_SUFFIX
        assert ex.answer == row["reward_model"]["ground_truth"]
        assert ex.meta["block_index"] == row["extra_info"]["index"]
    by_block = {ex.meta["block_index"]: ex.answer for ex in examples}
    # README spot checks: block rows 5, 8, 12, 17914; row 21 is the known wrong label (kept).
    assert (by_block[5], by_block[8], by_block[12], by_block[17914]) == ("10", "509", "5", "18")
    assert by_block[21] == "1"
    assert len({ex.prompt for ex in examples}) == len(examples)


def test_aime24_template_is_exact_and_answers_match_the_key():
    examples, _ = load_dataset("aime24")
    raw = _jsonl("aime-2024.dedup.jsonl")
    for ex, row in zip(examples, raw):
        assert ex.prompt == DAPO_TEMPLATE_PREFIX + row["extra_info"]["raw_problem"] + DAPO_TEMPLATE_SUFFIX
        assert ex.prompt == row["prompt"][0]["content"]  # identical to the file's own prompt
    assert examples[0].answer == "45"
    assert (examples[1].answer, examples[2].answer) == ("116", "540")
    key = [23, 25, 33, 45, 55, 73, 80, 104, 104, 110, 113, 116, 127, 197, 204, 211, 236, 294,
           315, 321, 371, 385, 468, 480, 540, 601, 699, 721, 809, 902]
    assert sorted(int(ex.answer) for ex in examples) == key


def test_aime24_other_templates_use_the_raw_problem():
    raw = _jsonl("aime-2024.dedup.jsonl")
    bare, r = load_dataset("aime24", template="none")
    assert bare[0].prompt == raw[0]["extra_info"]["raw_problem"] and r.scorer == "dapo"
    boxed, r = load_dataset("aime24", template="boxed")
    assert boxed[0].prompt == raw[0]["extra_info"]["raw_problem"] + BOXED_TEMPLATE_SUFFIX
    assert r.scorer == "math_verify"


def test_aime25_wrapped_and_int_answers_become_strings():
    examples, _ = load_dataset("aime25")
    raw = _jsonl("aime25.math-ai.test.jsonl")
    assert [ex.prompt for ex in examples] == [wrap_dapo(r["problem"]) for r in raw]
    assert [ex.answer for ex in examples][:3] == ["70", "588", "16"]
    assert examples[-1].answer == "240"


def test_math500_boxed_instruction_and_answers_as_given():
    examples, _ = load_dataset("math500")
    raw = _jsonl("math-500.test.jsonl")
    assert [ex.prompt for ex in examples] == [r["problem"] + BOXED_TEMPLATE_SUFFIX for r in raw]
    assert [ex.answer for ex in examples] == [r["answer"] for r in raw]
    assert examples[0].answer == r"\left( 3, \frac{\pi}{2} \right)"
    assert examples[2].answer == r"\frac{14}{3}"
    assert examples[0].meta["unique_id"] == raw[0]["unique_id"]
    assert {ex.meta["level"] for ex in examples} == {1, 2, 3, 4, 5}


def test_gsm8k_answers_after_hashes_without_commas():
    examples, _ = load_dataset("gsm8k")
    raw = _jsonl("gsm8k.test.jsonl")
    assert [ex.answer for ex in examples[:3]] == ["18", "3", "70000"]
    assert all(re.fullmatch(r"-?\d+", ex.answer) for ex in examples)
    with_comma = next(i for i, r in enumerate(raw) if "," in r["answer"].split("####")[-1])
    assert examples[with_comma].answer == raw[with_comma]["answer"].split("####")[-1].strip().replace(",", "")
    assert examples[0].prompt == wrap_dapo(raw[0]["question"])


def test_gsm8k_boxed_variant_uses_math_verify():
    examples, report = load_dataset("gsm8k", template="boxed", limit=3)
    assert report.scorer == "math_verify" and examples[0].scorer == "math_verify"
    assert examples[0].prompt.endswith(BOXED_TEMPLATE_SUFFIX)
    assert report.kept == 3 and report.limited == 1316 and _report_adds_up(report)


def test_scorer_override_and_default_alias():
    ex, r = load_dataset("math500", template="dapo", scorer="math_verify", limit=1)
    assert ex[0].scorer == "math_verify" and ex[0].prompt.startswith(DAPO_TEMPLATE_PREFIX)
    ex2, r2 = load_dataset("math500", template="default", limit=1)
    assert r2.template == "boxed"


def test_split_checks():
    assert len(load_dataset("aime24", split="test")[0]) == 30
    with pytest.raises(DataError, match="no split 'train'.*test"):
        load_dataset("aime24", split="train")


# --------------------------------------------------------------------------- files and bad rows


def _write_jsonl(path: Path, rows: list) -> Path:
    with path.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(r if isinstance(r, str) else json.dumps(r))
            f.write("\n")
    return path


@pytest.fixture
def messy(tmp_path) -> Path:
    return _write_jsonl(tmp_path / "messy.jsonl", [
        {"problem": "1+1?", "answer": "2"},              # row 0 ok
        {"problem": "no answer here"},                   # row 1 missing answer
        {"problem": 12345, "answer": "3"},               # row 2 non-string prompt
        {"problem": "x" * 500, "answer": "4"},           # row 3 too long (max 100)
        {"problem": "answer is None", "answer": None},   # row 4 missing answer
        {"problem": "int answer", "answer": 7},          # row 5 ok, "7"
        {"problem": "empty answer", "answer": "  "},     # row 6 empty answer
        "{not json",                                     # row 7 invalid JSON
        {"problem": "bool answer", "answer": True},      # row 8 non-string answer
        {"problem": "1+1?", "answer": "2"},              # row 9 duplicate of row 0
    ])


def test_bad_rows_are_counted_and_dropped(messy):
    examples, r = load_dataset(str(messy), max_prompt_chars=100)
    assert [(ex.index, ex.prompt, ex.answer) for ex in examples] == [
        (0, "1+1?", "2"), (5, "int answer", "7"), (9, "1+1?", "2")
    ]
    assert r.bad == {
        "missing answer": 2,
        "non-string prompt": 1,
        "prompt too long": 1,
        "empty answer": 1,
        "invalid JSON (Expecting property name enclosed in double quotes)": 1,
        "non-string answer": 1,
    }
    assert r.total == 10 and r.kept == 3
    assert r.duplicates == 1 and not r.deduplicated  # files keep duplicates, but count them
    assert r.examples_of_bad[:3] == [
        "row 1: missing answer", "row 2: non-string prompt", "row 3: prompt too long"
    ]
    assert len(r.examples_of_bad) == 5
    assert r.template == "none" and r.scorer == "dapo"
    assert _report_adds_up(r)


def test_dedup_on_request(messy):
    examples, r = load_dataset(str(messy), dedup=True)
    assert [ex.index for ex in examples] == [0, 3, 5]
    assert r.deduplicated and r.duplicates == 1 and _report_adds_up(r)


def test_max_prompt_chars_counts_the_template(tmp_path):
    p = _write_jsonl(tmp_path / "t.jsonl", [{"question": "q" * 10, "answer": "1"}])
    assert load_dataset(str(p), max_prompt_chars=10)[1].kept == 1
    _, r = load_dataset(str(p), max_prompt_chars=10, template="dapo")
    assert r.bad == {"prompt too long": 1}


@pytest.mark.parametrize("row, reason", [(1, "missing answer"), (2, "non-string prompt"), (3, "prompt too long")])
def test_on_bad_fail_names_path_and_row(tmp_path, messy, row, reason):
    lines = messy.read_text().splitlines()
    p = _write_jsonl(tmp_path / "one.jsonl", [lines[0], lines[row]])
    with pytest.raises(DataError) as e:
        load_dataset(str(p), on_bad="fail", max_prompt_chars=100)
    assert str(p) in str(e.value) and f"row 1: {reason}" in str(e.value)


def test_missing_file_names_the_path_and_the_registry(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(DataError) as e:
        load_dataset(str(missing))
    msg = str(e.value)
    assert str(missing) in msg
    for name in SHIPPED:
        assert name in msg


def test_unknown_name_lists_registry():
    with pytest.raises(DataError, match="unknown dataset 'aime2024'.*aime24.*gsm8k"):
        load_dataset("aime2024")


def test_unsupported_extension_and_undetectable_columns(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text("a,b\n")
    with pytest.raises(DataError, match="x.csv"):
        load_dataset(str(p))
    q = _write_jsonl(tmp_path / "cols.jsonl", [{"text": "hi", "label": "1"}])
    with pytest.raises(DataError, match=r"no prompt column.*\['label', 'text'\]"):
        load_dataset(str(q))
    ex, _ = load_dataset(str(q), prompt_field="text", answer_field="label")
    assert (ex[0].prompt, ex[0].answer) == ("hi", "1")


def test_verl_style_parquet_and_json(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {"prompt": [{"role": "user", "content": "What is 2+2?"}],
         "reward_model": {"ground_truth": "4", "style": "rule"}, "data_source": "toy"},
        {"prompt": [{"role": "user", "content": "What is 3+3?"}],
         "reward_model": {"ground_truth": "6", "style": "rule"}, "data_source": "toy"},
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "v.parquet")
    ex, r = load_dataset(str(tmp_path / "v.parquet"))
    assert ex[0].prompt == [{"role": "user", "content": "What is 2+2?"}]
    assert [e.answer for e in ex] == ["4", "6"] and ex[0].meta["data_source"] == "toy"
    ex, _ = load_dataset(str(tmp_path / "v.parquet"), template="dapo")
    assert ex[1].prompt[0]["content"] == wrap_dapo("What is 3+3?")

    (tmp_path / "v.json").write_text(json.dumps({"data": [{"question": "q?", "ground_truth": 3}]}))
    ex, _ = load_dataset(str(tmp_path / "v.json"))
    assert (ex[0].prompt, ex[0].answer) == ("q?", "3")


def test_generic_file_reduces_gsm8k_style_answers(tmp_path):
    p = _write_jsonl(tmp_path / "g.jsonl", [{"question": "q", "answer": "work\n#### 1,234"}])
    assert load_dataset(str(p))[0][0].answer == "1234"


def test_hf_without_datasets_package_is_a_clear_error():
    try:
        import datasets  # noqa: F401
    except ImportError:
        with pytest.raises(DataError, match="optional 'datasets' package"):
            load_dataset("hf:openai/gsm8k:test")
    else:  # pragma: no cover
        pytest.skip("datasets is installed here")


def test_argument_validation():
    with pytest.raises(ValueError, match="on_bad"):
        load_dataset("aime24", on_bad="keep")
    with pytest.raises(ValueError, match="template"):
        load_dataset("aime24", template="chatml")


# --------------------------------------------------------------------------- registry plugins


def test_register_generated_dataset(monkeypatch):
    monkeypatch.setattr(data, "DATASETS", dict(DATASETS))

    @register("toy-gen", splits=("train", "eval"))
    def toy(split=None):
        """Toy generated set."""
        n = 3 if split == "eval" else 5
        return [Example(prompt=f"{i}+1=", answer=str(i + 1), source="toy-gen", index=i,
                        scorer="dapo") for i in range(n)] + [{"prompt": "9+1=", "answer": None}]

    ex, r = data.load_dataset("toy-gen", split="eval")
    assert [e.prompt for e in ex] == ["0+1=", "1+1=", "2+1="]
    assert r.bad == {"missing answer": 1} and r.template == "none"
    assert data.DATASETS["toy-gen"].description == "Toy generated set."
    ex, _ = data.load_dataset("toy-gen", template="dapo")
    assert len(ex) == 5 and ex[0].prompt == wrap_dapo("0+1=")

    register("toy-gen")(toy)  # same function again (module reload) is fine
    with pytest.raises(ValueError, match="already registered"):
        register("toy-gen")(lambda: [])
    register("toy-gen", lambda: [{"question": "a", "answer": "b"}], overwrite=True)
    assert data.load_dataset("toy-gen")[0][0].prompt == "a"
    with pytest.raises(DataError, match="takes no split"):
        data.load_dataset("toy-gen", split="train")


def test_missing_minitask_is_tolerated(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "dapo.data.minitask", None)  # import raises ModuleNotFoundError
    p = _write_jsonl(tmp_path / "a.jsonl", [{"prompt": "p", "answer": "a"}])
    assert load_dataset(str(p))[1].kept == 1


@pytest.mark.parametrize("first", ["dapo.data.minitask", "dapo.data.datasets"])
def test_minitask_registers_without_an_import_cycle(first):
    """dapo.data.datasets imports dapo.data.minitask (which imports nothing from dapo) and registers its splits."""
    pytest.importorskip("dapo.data.minitask")
    code = (f"import {first}\nimport dapo.data.datasets\n"
            "ex, r = dapo.data.datasets.load_dataset('arith-eval')\n"
            "print(sorted(dapo.data.datasets.DATASETS), r.kept)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "'arith-train'" in out.stdout and "'aime24'" in out.stdout


# --------------------------------------------------------------------------- sampler


def _toy_examples(n: int) -> list[Example]:
    return [Example(prompt=f"p{i}", answer=str(i), source="toy", index=i, scorer="dapo") for i in range(n)]


def _ids(batch: list[Example]) -> list[int]:
    return [ex.index for ex in batch]


def test_sampler_is_deterministic_and_covers_each_epoch():
    exs = _toy_examples(10)
    a = PromptSampler(exs, 3, seed=7)
    b = PromptSampler(exs, 3, seed=7)
    seq_a = [_ids(a.next_batch()) for _ in range(9)]
    assert seq_a == [_ids(b.next_batch()) for _ in range(9)]
    assert seq_a != [_ids(PromptSampler(exs, 3, seed=8).next_batch()) for _ in range(9)]
    # drop_last: 3 full batches per epoch, the 10th example of each epoch is skipped
    assert len(a) == 3
    for e in range(3):
        epoch_ids = sum(seq_a[3 * e: 3 * e + 3], [])
        assert epoch_ids == a.permutation(e)[:9]
    assert a.permutation(0) != a.permutation(1)
    assert sorted(a.permutation(1)) == list(range(10))


def test_sampler_resume_is_exact_across_epochs():
    exs = _toy_examples(10)
    ref = PromptSampler(exs, 4, seed=3)
    full = [_ids(ref.next_batch()) for _ in range(12)]
    for stop in range(12):
        s = PromptSampler(exs, 4, seed=3)
        head = [_ids(s.next_batch()) for _ in range(stop)]
        state = json.loads(json.dumps(s.state_dict()))  # survives a checkpoint round-trip
        resumed = PromptSampler(exs, 4, seed=3)
        resumed.load_state_dict(state)
        assert head + [_ids(resumed.next_batch()) for _ in range(12 - stop)] == full
    it = batches(exs, 4, seed=3, epoch_start=state["epoch"], cursor=state["cursor"])
    assert [_ids(next(it))] == full[11:]


def test_sampler_variable_batch_and_no_drop_last():
    exs = _toy_examples(5)
    s = PromptSampler(exs, 2, seed=0, drop_last=False)
    sizes = [len(s.next_batch()) for _ in range(4)]
    assert sizes == [2, 2, 1, 2] and s.epoch == 1 and len(s) == 3
    t = PromptSampler(exs, 2, seed=0)
    assert len(t.next_batch(4)) == 4 and len(t.next_batch(2)) == 2 and t.epoch == 1


def test_sampler_state_mismatch_is_refused():
    s = PromptSampler(_toy_examples(10), 2, seed=1)
    s.next_batch()
    other = PromptSampler(_toy_examples(11), 2, seed=1)
    with pytest.raises(ValueError, match="num_examples"):
        other.load_state_dict(s.state_dict())
    with pytest.raises(ValueError, match="seed"):
        PromptSampler(_toy_examples(10), 2, seed=2).load_state_dict(s.state_dict())
    other.load_state_dict(s.state_dict(), strict=False)
    assert (other.epoch, other.cursor) == (0, 2)
    with pytest.raises(ValueError, match="batch_size=20"):
        PromptSampler(_toy_examples(10), 20, seed=0)


# --------------------------------------------------------------------------- rendering


@pytest.fixture(scope="module")
def tokenizers():
    """(with chat template, without): tiny word-level PreTrainedTokenizerFast objects."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    def build():
        vocab = {"[UNK]": 0, "<|user|>": 1, "<|assistant|>": 2}
        for w in "what is 2+2 ? hello a b c".split():
            vocab.setdefault(w, len(vocab))
        tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")

    chat = build()
    chat.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|> {% endif %}"
    )
    return chat, build()


def test_render_prompt_with_and_without_chat_template(tokenizers):
    chat, plain = tokenizers
    ex = Example(prompt="what is 2+2 ?", answer="4", source="t", index=0, scorer="dapo")
    assert render_prompt(ex, chat) == "<|user|> what is 2+2 ?\n<|assistant|> "
    assert render_prompt(ex, chat, use_chat_template="yes") == render_prompt(ex, chat, True)
    assert render_prompt(ex, chat, use_chat_template=False) == "what is 2+2 ?"
    assert render_prompt(ex, plain) == "what is 2+2 ?"
    assert render_prompt(ex) == "what is 2+2 ?"
    with pytest.raises(DataError, match="no chat_template"):
        render_prompt(ex, plain, use_chat_template=True)
    msgs = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "a"},
            {"role": "user", "content": "b"}]
    assert render_prompt(msgs, chat) == "<|user|> hello\n<|assistant|> a\n<|user|> b\n<|assistant|> "
    assert render_prompt(msgs, plain) == "hello\n\na\n\nb"


def test_drop_long_prompts_counts_tokens_of_the_rendered_prompt(tokenizers):
    chat, _ = tokenizers
    exs = [Example(prompt=p, answer="1", source="t", index=i, scorer="dapo")
           for i, p in enumerate(["a", "a b c hello", "b"])]
    report = data.LoadReport(source="t", path="t", total=3, kept=3)
    # rendered "<|user|> a\n<|assistant|> " is 3 words = 3 tokens; "a b c hello" gives 2 + 4 = 6
    kept = drop_long_prompts(exs, chat, 4, report=report)
    assert [e.index for e in kept] == [0, 2]
    assert report.bad == {"prompt too long (tokens)": 1} and report.kept == 2 and _report_adds_up(report)
    assert len(drop_long_prompts(exs, chat, 4, use_chat_template=False)) == 3  # raw: 4 tokens
    with pytest.raises(DataError, match=r"row 1: prompt too long \(tokens\) \(6 > 4\)"):
        drop_long_prompts(exs, chat, 4, on_bad="fail")


# --------------------------------------------------------------------------- hygiene


def test_import_and_load_do_not_import_torch():
    code = (
        "import sys, dapo.data.datasets\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'import'\n"
        "dapo.data.datasets.load_dataset('aime24')\n"
        "bad = [m for m in ('torch', 'transformers', 'vllm') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_cli_lists_and_loads(capsys):
    assert data._main([]) == 0
    listing = capsys.readouterr().out
    assert all(name in listing for name in SHIPPED)
    assert data._main(["aime24", "--limit", "1"]) == 0
    assert "aime24" in capsys.readouterr().out


def test_run_data_puts_eval_sets_in_the_training_template(tokenizers):
    """``data.template`` applies to the eval sets too: the policy is evaluated on prompts in the
    form it is trained on (and scored by the scorer that template implies)."""
    from dapo.config import load_config
    from dapo.data.run_data import load_run_data
    chat, _ = tokenizers
    cfg = load_config(Path(__file__).resolve().parents[1] / "experiments" / "tiny-random-smoke.yaml",
                      {"data.template": "boxed", "data.use_chat_template": "no", "data.max_prompt_tokens": 4096})
    _, _, evals, _ = load_run_data(cfg, chat, log=lambda *_: None)
    [ex, *_] = evals["arith-eval"]
    plain, _ = data.load_dataset("arith-eval", limit=1)
    assert ex.prompt != plain[0].prompt and plain[0].prompt in ex.prompt and "boxed" in ex.prompt
    assert ex.scorer == data.TEMPLATE_SCORER["boxed"] != plain[0].scorer


def test_python_m_dapo_data_lists_the_sets_and_reports_a_file(tmp_path):
    """The data checker: no name lists the registered sets; a file is loaded as a run would, its rows counted."""
    repo = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-m", "dapo.data"], capture_output=True, text=True, cwd=repo, check=True).stdout
    assert "arith-eval" in out and "aime24" in out
    f = tmp_path / "mine.jsonl"
    f.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2="}\n')
    p = subprocess.run([sys.executable, "-m", "dapo.data", str(f), "--show", "0"], capture_output=True, text=True, cwd=repo)
    assert p.returncode == 0 and "1/2 rows kept" in p.stdout and "missing answer: 1" in p.stdout, p.stdout + p.stderr
