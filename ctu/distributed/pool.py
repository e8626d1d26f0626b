"""Rollout pools: where episodes run. One small interface, an in-process pool (the default) and a Ray one.

The driver loop talks to a :class:`RolloutPool` only: ``run`` plays episodes and returns their trajectories in the
order of the specs, ``update_weights`` sends the trainer's merged Hugging Face weights of a policy version,
``sleep``/``wake_up`` bracket an update (colocated engines), ``parity`` scores the parity probe on every worker.

Same numbers wherever an episode runs: :func:`ctu.rollout.loop.rollout` seeds episode ``i`` of a call with
``seed + i`` (its user session and every turn's sampling seed derive from it). A pool that splits a call's
episodes into contiguous chunks and runs chunk ``specs[a:b]`` as ``rollout(specs[a:b], ..., seed=seed + a)``
gives every episode the seed of its global index, so which worker runs it does not change what it samples.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ctu.engines.base import Engine, SamplingParams
from ctu.engines.checks.parity import PROBE_PROMPT, ScoreFn, probe_parity
from ctu.rollout.loop import Branching, EpisodeSpec, RolloutLimits, Trajectory, rollout

NamedTensors = Iterable[tuple[str, object]]


@dataclass(frozen=True)
class SpecKey:
    """A picklable stand-in for an :class:`EpisodeSpec`: rebuilt in a worker from its own domains."""

    domain: str
    task_id: str
    sample: int = 0

    @classmethod
    def of(cls, spec: EpisodeSpec) -> SpecKey:
        return cls(spec.domain.name, spec.task.id, spec.sample)


def rebuild_specs(keys: Sequence[SpecKey], domains) -> list[EpisodeSpec]:
    """The specs named by ``keys``, with this process's domain and task objects."""
    by_name = {d.name: d for d in domains}
    specs = []
    for key in keys:
        if key.domain not in by_name:
            raise KeyError(f"rollout worker has no domain '{key.domain}' (it has: {', '.join(by_name)})")
        domain = by_name[key.domain]
        specs.append(EpisodeSpec(domain, domain.task(key.task_id), key.sample))
    return specs


def contiguous_chunks(n: int, parts: int) -> list[tuple[int, int]]:
    """``[start, stop)`` ranges splitting ``n`` items into at most ``parts`` contiguous, near-equal chunks
    (the first ``n % parts`` one longer); empty chunks are left out."""
    parts = max(1, min(parts, n))
    size, extra = divmod(n, parts)
    out, start = [], 0
    for k in range(parts):
        stop = start + size + (1 if k < extra else 0)
        if stop > start:
            out.append((start, stop))
        start = stop
    return out


def errored_trajectory(key: SpecKey, message: str) -> Trajectory:
    """An episode that could not be played (its worker died twice): errored, no tokens, reward 0."""
    return Trajectory(domain=key.domain, task_id=key.task_id, sample=key.sample, prompt_ids=[], response_ids=[],
                      loss_mask=[], logprobs=[], assistant_spans=[], messages=[], reward=0.0, components={},
                      skipped=[], reasons=[], stop_reason="error", termination="error", turns=0, parse_failures=0,
                      tool_calls=0, timings={}, error=message)


def limits_of(config) -> RolloutLimits:
    return RolloutLimits(config.env.max_turns, config.env.max_errors, config.env.max_context_tokens)


def run_chunk(specs: Sequence[EpisodeSpec], chat, engine: Engine, user, params: SamplingParams,
              limits: RolloutLimits, *, seed: int, start: int = 0, judge=None, concurrency: int = 64,
              max_batch_size: int = 64, on_done=None) -> list[Trajectory]:
    """Episodes ``start .. start + len(specs)`` of a call seeded ``seed``: exactly what the whole call would
    give them (episode seeds are ``seed + global index``)."""
    return asyncio.run(rollout(specs, chat, engine, user, params, limits, judge=judge, concurrency=concurrency,
                               max_batch_size=max_batch_size, seed=seed + start, on_done=on_done))


class RolloutPool(ABC):
    """Where rollouts run. Implementations: :class:`LocalPool` (this process) and
    :class:`ctu.distributed.ray_pool.RayPool` (Ray actors, one engine each)."""

    # ctu's own loop plays the episodes on this process's ``engine`` (so an asynchronous producer can batch its
    # groups together); False: the pool plays them elsewhere (workers, an agent program), a call at a time
    episodes_in_process = False

    @property
    @abstractmethod
    def num_workers(self) -> int:
        """How many engines serve rollouts."""

    @abstractmethod
    def run(self, specs: Sequence[EpisodeSpec], params: SamplingParams, seed: int,
            judge_enabled: bool = False, on_done: Callable[[Trajectory], None] | None = None) -> list[Trajectory]:
        """One trajectory per spec, in the order of ``specs``; episode ``i`` is seeded ``seed + i``.
        ``judge_enabled``: score NL assertions with the configured judge (evaluation), else they are skipped.
        ``on_done`` is called with each trajectory as it finishes (progress bars)."""

    def run_branched(self, specs: Sequence[EpisodeSpec], params: SamplingParams, seed: int,
                     branch: Branching) -> list[Trajectory]:
        """:meth:`run` with branched episodes (each spec's episode, then its siblings); only ctu's own loop in
        this process forks (the config check refuses the other placements)."""
        raise NotImplementedError(f"{type(self).__name__} cannot branch episodes (trainer.branch_k)")

    @abstractmethod
    def update_weights(self, named_tensors: NamedTensors, version: int) -> None:
        """Send policy ``version``'s merged, Hugging Face-named weights to every engine."""

    def update_adapter(self, named_tensors: NamedTensors, version: int) -> None:
        """Send policy ``version``'s LoRA adapter (PEFT names) to every engine."""
        raise NotImplementedError(f"{type(self).__name__} takes merged weights only (engine.weight_sync=merged)")

    @abstractmethod
    def parity(self, score_fn: ScoreFn, *, temperature: float = 1.0, tokens: int = 16, seed: int = 0,
               prompt_ids: Sequence[int] = PROBE_PROMPT) -> list[float]:
        """The parity probe (:func:`ctu.engines.checks.parity.probe_parity`) on every engine: one max |engine logprob -
        trainer logprob| per worker, scored by ``score_fn`` (the trainer's, run in this process)."""

    @abstractmethod
    def versions(self) -> list[int | None]:
        """Every live engine's stamped weight version (:attr:`ctu.engines.base.Engine.weights_version`)."""

    def fingerprints(self) -> list:
        """Every live engine's :class:`~ctu.engines.checks.fingerprint.Fingerprint` of the weights it holds (None where it
        cannot tell)."""
        return [None] * self.num_workers

    def frees_memory_asleep(self) -> bool:
        """Whether :meth:`sleep` frees the engines' accelerator memory (vLLM's sleep mode on a GPU); where it does
        not (hf, vLLM on CPU, a server without sleep mode) the engines may generate while the trainer updates."""
        return False

    def cancel_runs(self) -> None:  # noqa: B027 - optional hook
        """End the ``run`` calls in progress soon (the end of an asynchronous run): pools whose episodes run
        elsewhere stop them and raise :class:`RunsCancelled` from those calls."""

    def sleep(self) -> None:  # noqa: B027 - optional hook
        """Free accelerator memory on every engine while the trainer updates (colocated engines)."""

    def wake_up(self) -> None:  # noqa: B027 - optional hook
        """Undo :meth:`sleep`."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the workers."""

    def __enter__(self) -> RolloutPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class RunsCancelled(RuntimeError):
    """A ``run`` ended early by :meth:`RolloutPool.cancel_runs`."""


class LocalPool(RolloutPool):
    """Today's path: one engine in this process, ``asyncio.run(rollout(...))`` exactly as the trainer ran it.

    ``judge`` is used when ``run(..., judge_enabled=True)``; ``concurrency`` and ``max_batch_size`` default to
    ``config.eval.concurrency`` and ``config.engine.max_batch_size`` (what ``Trainer._rollout`` passes).
    """

    episodes_in_process = True

    def __init__(self, engine: Engine, chat, user, limits: RolloutLimits, *, judge=None, concurrency: int = 64,
                 max_batch_size: int = 64):
        self.engine = engine
        self.chat = chat
        self.user = user
        self.limits = limits
        self.judge = judge
        self.concurrency = concurrency
        self.max_batch_size = max_batch_size
        self.version = -1

    @classmethod
    def from_config(cls, config, engine: Engine, chat, user, judge=None) -> LocalPool:
        return cls(engine, chat, user, limits_of(config), judge=judge, concurrency=config.eval.concurrency,
                   max_batch_size=config.engine.max_batch_size)

    @property
    def num_workers(self) -> int:
        return 1

    def run(self, specs: Sequence[EpisodeSpec], params: SamplingParams, seed: int,
            judge_enabled: bool = False, on_done: Callable[[Trajectory], None] | None = None) -> list[Trajectory]:
        return asyncio.run(rollout(specs, self.chat, self.engine, self.user, params, self.limits,
                                   judge=self.judge if judge_enabled else None, concurrency=self.concurrency,
                                   max_batch_size=self.max_batch_size, seed=seed, on_done=on_done))

    def run_branched(self, specs: Sequence[EpisodeSpec], params: SamplingParams, seed: int,
                     branch: Branching) -> list[Trajectory]:
        return asyncio.run(rollout(specs, self.chat, self.engine, self.user, params, self.limits,
                                   concurrency=self.concurrency, max_batch_size=self.max_batch_size, seed=seed,
                                   branch=branch))

    def update_weights(self, named_tensors: NamedTensors, version: int) -> None:
        self.engine.update_weights(named_tensors, version=version)
        self.version = version

    def update_adapter(self, named_tensors: NamedTensors, version: int) -> None:
        update = getattr(self.engine, "update_adapter", None)
        if update is None:
            super().update_adapter(named_tensors, version)  # raises: this engine takes merged weights only
        update(named_tensors, version)  # type: ignore[misc]
        self.version = version

    def parity(self, score_fn: ScoreFn, *, temperature: float = 1.0, tokens: int = 16, seed: int = 0,
               prompt_ids: Sequence[int] = PROBE_PROMPT) -> list[float]:
        return [probe_parity(self.engine, score_fn, prompt_ids, temperature=temperature, tokens=tokens, seed=seed)]

    def versions(self) -> list[int | None]:
        return [self.engine.weights_version]

    def fingerprints(self) -> list:
        return [self.engine.fingerprint()]

    def frees_memory_asleep(self) -> bool:
        return bool(getattr(self.engine, "sleep_mode", False))

    def sleep(self) -> None:
        self.engine.sleep()

    def wake_up(self) -> None:
        self.engine.wake_up()

    def close(self) -> None:
        self.engine.close()


class ResultsEngine(Engine):
    """An engine stand-in that answers ``generate_sync`` with completions computed elsewhere (a remote worker's
    probe samples), so :func:`probe_parity` scores them unchanged."""

    def __init__(self, fetch: Callable[[list[list[int]], SamplingParams], list]):
        self._fetch = fetch

    def generate_sync(self, prompts, params, seeds=None):
        return self._fetch([list(p) for p in prompts], params)

    async def generate(self, prompts, params, seeds=None):
        return self.generate_sync(prompts, params, seeds)

    def update_weights(self, named_tensors, version=None) -> None:
        raise NotImplementedError
