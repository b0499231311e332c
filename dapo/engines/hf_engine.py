"""Rollout engine on plain transformers ``generate``: for machines without vLLM, and the
reference ("oracle") the vLLM engine is tested against.

Contract: see :mod:`dapo.engines.base`. Prompts are left-padded into batches; sampling
uses temperature and top_p only (``top_k`` is forced off: transformers' default of 50
would make it a different distribution from vLLM's); ``temperature == 0`` is greedy.
With ``seed`` set, a call is reproducible (the global torch RNG is left untouched), but
samples are not the same as vLLM's for the same seed: only greedy outputs match.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable
from contextlib import nullcontext
from typing import Any

import torch

from dapo.engines.base import (
    Completion,
    SamplingSpec,
    check_full_state_dict,
    per_prompt_seeds,
    split_at_eos,
    strip_wrapper_prefixes,
)

__all__ = ["HFEngine"]


class HFEngine:
    """``RolloutEngine`` on ``model.generate``.

    Args:
        model_path: model directory (for the tokenizer, and the model unless shared).
        dtype: "float32" | "bfloat16" (ignored when ``trainer_model`` is given).
        seed: engine seed, salted into each seeded call's RNG seed (as in the vLLM engine).
        trainer_model: the trainer's live model, unwrapped (``accelerator.unwrap_model``).
            If given, generation uses it directly
            and ``update_weights`` is a no-op; otherwise the engine loads its own copy.
        max_batch_size: sequences (prompts x n) per ``generate`` call; None = all at once.
        tokenizer: a tokenizer to use instead of loading the one in ``model_path``.
    """

    def __init__(
        self,
        model_path: Any,
        *,
        dtype: str = "float32",
        seed: int = 0,
        trainer_model: Any = None,
        max_batch_size: int | None = None,
        tokenizer: Any = None,
    ) -> None:
        from dapo.models import load_model, load_tokenizer

        self.seed = seed
        self.shared = trainer_model is not None
        self.model = trainer_model if self.shared else load_model(model_path, dtype=dtype).eval()
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(model_path)
        gen_eos = self.model.generation_config.eos_token_id
        eos = [gen_eos] if isinstance(gen_eos, int) else list(gen_eos or [])
        if self.tokenizer.eos_token_id is not None:
            eos.append(self.tokenizer.eos_token_id)
        if not eos:
            raise ValueError(f"HFEngine: no EOS token id in {model_path}")
        self.eos_ids: list[int] = sorted(set(eos))
        pad = self.tokenizer.pad_token_id
        self.pad_id: int = self.eos_ids[0] if pad is None else pad
        self.max_batch_size = max_batch_size

    # ------------------------------------------------------------------ generate

    @torch.no_grad()
    def generate(self, prompt_token_ids: list[list[int]], spec: SamplingSpec,
                 seeds: list[int] | None = None) -> list[list[Completion]]:
        from transformers import GenerationConfig

        if seeds is not None:
            raise ValueError("HFEngine: per-prompt seeds are not supported (one call's samples depend on the "
                             "whole batch); use rollout.engine=vllm when several processes split a round")
        if not prompt_token_ids:
            return []
        # Greedy samples are identical: decode each prompt once and copy.
        reps = 1 if spec.greedy else spec.n
        seqs = [p for p in prompt_token_ids for _ in range(reps)]  # [num_prompts * reps]
        # Every knob that shapes the distribution is set explicitly: unset (None) fields
        # are filled from the model's generation_config and transformers' defaults
        # (top_k=50!), which would sample from a different distribution than vLLM.
        cfg = GenerationConfig(
            do_sample=not spec.greedy,
            temperature=spec.temperature if not spec.greedy else 1.0,
            top_p=spec.top_p if not spec.greedy else 1.0,
            top_k=0,
            typical_p=1.0,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            min_length=0,
            max_new_tokens=spec.max_tokens,
            eos_token_id=self.eos_ids,
            pad_token_id=self.pad_id,
            bos_token_id=None,
        )
        device = next(self.model.parameters()).device
        bs = self.max_batch_size or len(seqs)
        was_training = self.model.training
        self.model.eval()
        rng = (
            torch.random.fork_rng(devices=[device] if device.type == "cuda" else [])
            if spec.seed is not None
            else nullcontext()
        )
        new_ids: list[list[int]] = []
        new_lps: list[list[float]] = []
        try:
            with rng:
                if spec.seed is not None:
                    torch.manual_seed(per_prompt_seeds(spec.seed, 1, salt=self.seed)[0])
                for start in range(0, len(seqs), bs):
                    ids, lps = self._generate_batch(seqs[start : start + bs], cfg, device)
                    new_ids += ids
                    new_lps += lps
        finally:
            self.model.train(was_training)

        eos = set(self.eos_ids)
        out: list[list[Completion]] = []
        for i in range(len(prompt_token_ids)):
            group = []
            for j in range(spec.n):
                r = i * reps + (j if reps > 1 else 0)
                ids, finished = split_at_eos(new_ids[r], eos, spec.max_tokens)
                text = self.tokenizer.decode(ids, skip_special_tokens=True)
                group.append(Completion(token_ids=ids, text=text, finished=finished, logprobs=new_lps[r][:len(ids)]))
            out.append(group)
        return out

    def _generate_batch(self, seqs: list[list[int]], cfg, device) -> tuple[list[list[int]], list[list[float]]]:
        """(generated ids, each token's log-prob under the processed scores: after temperature and
        top_p, i.e. the distribution sampled from) of one left-padded batch."""
        width = max(len(s) for s in seqs)
        input_ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(seqs), width), dtype=torch.long)
        for r, s in enumerate(seqs):  # left padding
            input_ids[r, width - len(s) :] = torch.tensor(s, dtype=torch.long)
            attn[r, width - len(s) :] = 1
        out = self.model.generate(
            input_ids=input_ids.to(device), attention_mask=attn.to(device), generation_config=cfg,
            output_scores=True, return_dict_in_generate=True,
        )
        new = out.sequences[:, width:]                                                  # [b, T]
        lps = torch.stack([torch.log_softmax(sc.float(), dim=-1).gather(-1, new[:, t:t + 1])[:, 0]
                           for t, sc in enumerate(out.scores)], dim=1) if out.scores else new.float()[:, :0]
        return new.tolist(), lps.cpu().tolist()  # padded after EOS; split_at_eos cuts it

    # ------------------------------------------------------------------ weights

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load the trainer's full state_dict into this engine's copy (no-op when shared)."""
        if self.shared:
            return
        sd = {strip_wrapper_prefixes(k): v for k, v in named_tensors}
        check_full_state_dict(sd.keys(), self.model.state_dict().keys(), who="HFEngine")
        self.model.load_state_dict(sd, strict=True)

    def sleep(self) -> None:
        """No-op (no sleep mode)."""

    def wake_up(self, tags: list[str] | None = None) -> None:
        """No-op (no sleep mode)."""

    def close(self) -> None:
        if not self.shared:
            del self.model
        self.model = None
        gc.collect()
