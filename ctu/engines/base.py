"""The engine interface: token ids in, token ids + per-token logprobs out.

Engines never see text conversations: the ``chat`` module turns messages into token
ids, and the rollout appends exactly the ids an engine returned (token-in-token-out).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings; ``stop_token_ids`` end generation and are included in the output."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    n: int = 1
    seed: int | None = None
    top_k: int = 0  # the k most likely tokens only (0: all)

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0: off), got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")


@dataclass(frozen=True)
class Completion:
    """One sampled continuation: its ids (a stop token included), their logprobs, why it ended.

    ``finish_reason`` is "stop" when a stop token/string or EOS ended it, "length" when
    ``max_tokens`` did. ``token_ids`` may be empty (an immediate stop is still one token,
    but a remote server may return nothing). ``version`` is the policy version (the engine's
    :attr:`Engine.weights_version`) of the weights that sampled it; None where the engine does not know it.
    """

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    version: int | None = None
    # per token, where weights changed mid-completion (``trainer.inflight=continue``); None: all ``version``
    token_versions: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(f"{len(self.token_ids)} token ids but {len(self.logprobs)} logprobs")
        if self.token_versions is not None and len(self.token_versions) != len(self.token_ids):
            raise ValueError(f"{len(self.token_ids)} token ids but {len(self.token_versions)} versions")

    def versions(self) -> list[int]:
        """The version of each token (-1 where unknown)."""
        if self.token_versions is not None:
            return list(self.token_versions)
        return [-1 if self.version is None else self.version] * len(self.token_ids)


class Engine(ABC):
    """Generates from token-id prompts; can take new weights from the trainer.

    Sampler logprobs have one meaning for every engine: the trainer's, ``log_softmax(logits / temperature)``
    of the sampled token taken *before* top-k/top-p truncation (plain ``log_softmax`` when temperature is 0).
    ``accepts_weights`` is False for engines that cannot take weights from this process (remote): they can
    serve evaluation, not training.
    """

    accepts_weights: bool = True
    weights_version: int | None = None  # the policy version of the weights served (stamped by a completed sync)
    sleep_mode: bool = False  # sleep() frees accelerator memory (vLLM's sleep mode on a GPU): no generation then

    @abstractmethod
    async def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                       seeds: Sequence[int] | None = None) -> list[list[Completion]]:
        """For each prompt, ``params.n`` completions. An empty ``prompts`` gives ``[]``.

        ``seeds`` (one per prompt) seed each request on its own, as vLLM seeds each request: completion j of
        prompt i samples from a generator seeded ``seeds[i] + j``, whatever else is in the batch. Without
        ``seeds``, ``params.seed`` seeds the call as a whole (two identical prompts still get different samples).
        """

    @abstractmethod
    def update_weights(self, named_tensors: Iterable[tuple[str, object]], version: int | None = None) -> None:
        """Load new weights (Hugging Face parameter names, merged — no LoRA/PEFT prefixes); once loaded,
        ``version`` (the policy version: the trainer's step) is :attr:`weights_version`."""

    def fingerprint(self):
        """The :class:`~ctu.engines.checks.fingerprint.Fingerprint` of the weights this engine holds, computed from its own
        tensors; None where it cannot tell (then only the version stamp and the parity probe check a load)."""
        return None

    def release(self, token_ids: Sequence[int]) -> None:  # noqa: B027 - optional hook
        """The conversation that ended with ``token_ids`` will not continue: an engine that keeps its KV cache
        across calls may free it."""

    def sleep(self) -> None:  # noqa: B027 - optional hook
        """Free accelerator memory while the trainer runs (colocated engines)."""

    def idle(self) -> None:  # noqa: B027 - optional hook
        """Nothing generates until the trainer's next weights are in (the in-process synchronous loop): an engine
        may free what the update makes stale (the hf engine: its decode copy's weights and kept KV)."""

    def wake_up(self) -> None:  # noqa: B027 - optional hook
        """Undo ``sleep``."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""
