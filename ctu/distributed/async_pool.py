"""The rollout pool of an asynchronous run (``trainer.max_staleness = k > 0``): any pool with a
:class:`~ctu.distributed.async_rollout.RolloutProducer` beside it, and where such a run is refused."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence

from ctu.distributed.async_rollout import RolloutProducer
from ctu.distributed.pool import NamedTensors, RolloutPool
from ctu.engines.base import SamplingParams
from ctu.rollout.loop import EpisodeSpec, Trajectory


def sleep_refusal(pool: RolloutPool, max_staleness: int) -> str | None:
    """Why ``trainer.max_staleness`` cannot run on ``pool``, in one line naming ``engine.colocated``: its engines
    free the GPU they share with the trainer by sleeping through every update, so no generation could overlap one
    (the producer would drain its groups before each update: the synchronous loop, tokens a version older);
    None where the engines keep their memory (hf, vLLM on CPU, a server not sleeping, Ray workers that stay awake)."""
    if not pool.frees_memory_asleep():
        return None
    return (f"trainer.max_staleness={max_staleness}: the rollout engine sleeps through every update to free the GPU "
            "it shares with the trainer (engine.colocated=true), so no generation could overlap an update; set "
            "engine.colocated=false (the engine keeps its GPU memory: lower engine.gpu_memory_utilization to leave "
            "the trainer room) or trainer.max_staleness=0")


class AsyncPool(RolloutPool):
    """Any rollout pool with a :class:`RolloutProducer` beside it (``producer`` is set by whoever builds it):
    the same interface, so the trainer's loop does not know which placement it drives.

    What the producer must not overlap: an evaluation (``run``: the producer starts nothing new and lets its
    groups in flight finish first), and the end (``close`` stops the producer's runs and then the producer before
    the workers go). Updates, weight loads and parity probes run beside it: the engines' own locks order loads
    with generation, and every token keeps the version that sampled it. Engines that free their memory asleep
    are refused (:func:`sleep_refusal`); ``sleep`` still pauses the producer around one, should one be here."""

    def __init__(self, inner: RolloutPool):
        self.inner = inner
        self.producer: RolloutProducer | None = None
        self._sleeping = False

    def __getattr__(self, name: str):  # engine, chat, user, limits, concurrency, ... of the pool it wraps
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def num_workers(self) -> int:
        return self.inner.num_workers

    def run(self, specs: Sequence[EpisodeSpec], params: SamplingParams, seed: int, judge_enabled: bool = False,
            on_done=None) -> list[Trajectory]:
        if self.producer is None:
            return self.inner.run(specs, params, seed, judge_enabled, on_done)
        with self.producer.quiet():  # the engines and the user simulator serve the evaluation alone
            return self.inner.run(specs, params, seed, judge_enabled, on_done)

    def play(self, specs: Sequence[EpisodeSpec], params: SamplingParams, seed: int) -> Awaitable[list[Trajectory]]:
        """The producer's :data:`Player` for pools whose episodes run elsewhere (rollout workers, agent
        processes): one group as a synchronous call of the wrapped pool, in a thread (ended early by
        :meth:`RolloutPool.cancel_runs` at the end); whole on one Ray worker where the pool can (``play_group``:
        :mod:`ctu.distributed.group_play`)."""
        return asyncio.to_thread(getattr(self.inner, "play_group", self.inner.run), specs, params, seed)

    def update_weights(self, named_tensors: NamedTensors, version: int) -> None:
        self.inner.update_weights(named_tensors, version)

    def update_adapter(self, named_tensors: NamedTensors, version: int) -> None:
        self.inner.update_adapter(named_tensors, version)

    def parity(self, score_fn, **kwargs) -> list[float]:
        return self.inner.parity(score_fn, **kwargs)

    def versions(self) -> list[int | None]:
        return self.inner.versions()

    def fingerprints(self) -> list:
        return self.inner.fingerprints()

    def frees_memory_asleep(self) -> bool:
        return self.inner.frees_memory_asleep()

    def sleep(self) -> None:
        if self.producer is not None and not self._sleeping and self.inner.frees_memory_asleep():
            self.producer.pause()  # no generation may reach an engine that is freeing its memory
            self._sleeping = True
        self.inner.sleep()

    def wake_up(self) -> None:
        self.inner.wake_up()
        if self._sleeping and self.producer is not None:
            self._sleeping = False
            self.producer.resume()

    def close(self) -> None:
        """The producer's runs on the wrapped pool are told to end, the producer stopped (it raises where it did not
        stop in time), then the wrapped pool closed all the same: nothing it started outlives the run."""
        try:
            if self.producer is not None:
                self.inner.cancel_runs()
                self.producer.stop()
        finally:
            self.inner.close()
