"""The transformers calls whose names changed across the versions ctu supports (pyproject: transformers >= 4.57).

Recent transformers (5.2x) renamed a model's KV cache argument and output field ``past_key_values`` to ``cache`` and
``gradient_checkpointing_enable`` / ``is_gradient_checkpointing`` to ``activation_checkpointing_*``; the old names
still work there but warn (a FutureWarning per call, a ``[transformers] ... deprecated`` log line). ctu calls the
name the installed version has, found by looking at transformers itself rather than at its version number.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import fields
from typing import Any

from transformers import PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

# the keyword a model's forward takes its KV cache by, and the output field that returns it
CACHE = "cache" if "cache" in {f.name for f in fields(CausalLMOutputWithPast)} else "past_key_values"
_ACTIVATION = hasattr(PreTrainedModel, "activation_checkpointing_enable")


def with_cache(cache: Any) -> dict[str, Any]:
    """``model(..., **with_cache(cache))``: the KV cache under the name the installed transformers takes."""
    return {CACHE: cache}


def cache_of(output: Any) -> Any:
    """The KV cache a forward pass returned (None when it returned none)."""
    return getattr(output, CACHE, None)


def enable_checkpointing(model: Any, use_reentrant: bool | None = None) -> None:
    """Turn on gradient (activation) checkpointing; ``use_reentrant`` goes to ``torch.utils.checkpoint``."""
    kwargs = None if use_reentrant is None else {"use_reentrant": use_reentrant}
    if _ACTIVATION:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def disable_checkpointing(model: Any) -> None:
    if _ACTIVATION:
        model.activation_checkpointing_disable()
    else:
        model.gradient_checkpointing_disable()


def checkpointing_enabled(model: Any) -> bool:
    """Whether any module of ``model`` checkpoints its activations (the flag transformers sets per layer)."""
    return any(getattr(m, "gradient_checkpointing", False) for m in model.modules())


@contextlib.contextmanager
def quiet_peft_wrap() -> Iterator[None]:
    """peft (0.21) asks the model ``is_gradient_checkpointing`` while wrapping it, which recent transformers warns
    about: a third-party call the user cannot change, so only that one warning is silenced, only in the block."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield
