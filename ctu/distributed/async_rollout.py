"""Asynchronous rollouts (``trainer.max_staleness = k > 0``): a background worker keeps sampling groups while the
trainer updates.

:class:`RolloutProducer` runs in a thread with its own asyncio loop. It draws one task at a time and plays a
*group* (``trainer.samples_per_task`` episodes of that task, drawn together) through one shared
:class:`~ctu.rollout.loop.GenerationBatcher`, so episodes of different groups share engine batches. It keeps at most
``capacity`` groups started and not yet taken by the trainer (:func:`async_capacity`: k steps' worth); the trainer
takes finished groups in the order they finish (:meth:`RolloutProducer.take`).

In-flight episodes at an update: they go on, and their next turns sample from the new weights. The engine's lock
makes a generation call and a weight load mutually exclusive (a batch never mixes weights), and every completion
carries the version it ran under, so every token keeps its own version (``Trajectory.token_versions``). What a step
may train on is decided by those stamps (:mod:`ctu.rl.staleness`), not by when a group started.

Where episodes run: in this process (the producer plays them through one batcher on the pool's engine, so groups
share engine batches), or wherever the pool runs them (:class:`~ctu.distributed.ray_pool.RayPool` workers, each
with its engine and weights loaded by version; :class:`~ctu.distributed.agent_pool.AgentPool`, the user's agent program):
the producer then hands each group to the pool as one call (:meth:`AsyncPool.play`). :class:`AsyncPool` wraps any
pool with the producer beside it: an evaluation (``run``) first lets the producer's in-flight groups finish and
starts nothing new until it is done; a sleeping engine gets no generation; ``close`` stops the producer.
"""

from __future__ import annotations

import asyncio
import copy
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

from ctu.distributed.busy import BusyClock
from ctu.distributed.pool import NamedTensors, RolloutPool
from ctu.engines.base import Engine, SamplingParams
from ctu.rollout.loop import EpisodeSpec, GenerationBatcher, RolloutLimits, Trajectory, run_episode

Draw = Callable[[], tuple]  # () -> (domain, task): the next training task
# (the group's specs, its sampling params, its seed) -> its trajectories, episode i seeded seed + i
Player = Callable[[Sequence[EpisodeSpec], SamplingParams, int], Awaitable[Sequence[Trajectory]]]


def async_capacity(max_staleness: int, tasks_per_step: int) -> int:
    """Groups the producer may have started and not handed over: k steps' worth. A group started while the trainer
    holds version v is taken by step v + k + 1 at the latest when each step takes at least ``tasks_per_step`` groups
    in the order they start; groups overtaken by faster ones can be older and are dropped by the staleness filter."""
    return max(1, max_staleness * tasks_per_step)


def group_seed(run_seed: int, first_step: int, index: int) -> int:
    """The sampling seed of the producer's group ``index`` (episode i: seed + i), distinct per run start."""
    return (run_seed * 1_000_003 + first_step * 15_485_863 + index * 104_729 + 7_777_777) % 2**31


def engine_model(group, config):
    """The model an in-process hf engine runs: the trainer's own (shared, synchronous loop), a separate copy
    (``trainer.max_staleness > 0``: the optimizer must not move weights under a rollout), or None (load by path)."""
    model = getattr(group, "model", None)
    return engine_copy(model) if model is not None and config.trainer.max_staleness else model


def engine_copy(model):
    """A separate copy of the trainer's model for the engine (the optimizer must not move weights under a rollout):
    LoRA merged in, no gradients; same device and dtype."""
    import torch

    with torch.no_grad():
        twin = copy.deepcopy(model)
        if hasattr(twin, "merge_and_unload"):
            twin = twin.merge_and_unload()
    twin.requires_grad_(False)
    return twin.eval()


@dataclass
class Group:
    """Episodes of one task drawn together, as the producer finished them."""

    index: int
    trajectories: list[Trajectory]
    started_version: int | None
    seconds: float


class RolloutProducer:
    """Samples groups in a background thread; the trainer takes them with :meth:`take`."""

    def __init__(self, engine: Engine | None, chat, user, limits: RolloutLimits | None, params: SamplingParams, *,
                 draw: Draw, samples_per_task: int, capacity: int, seed: Callable[[int], int], concurrency: int = 64,
                 max_batch_size: int = 64, player: Player | None = None):
        self.engine, self.chat, self.user, self.limits, self.params = engine, chat, user, limits, params
        self.draw, self.samples_per_task, self.capacity, self.seed = draw, samples_per_task, capacity, seed
        self.concurrency, self.max_batch_size = concurrency, max_batch_size
        self.player = player  # None: episodes played here, through one shared batcher on ``engine``
        self.groups_busy = BusyClock()  # while a player played any group (its engines' own busy time is not seen)
        self.done: queue.Queue = queue.Queue()  # finished Groups (or the exception that stopped the producer)
        self._cond = threading.Condition()
        self.started = 0  # groups started
        self.taken = 0  # groups handed to the trainer
        self.running = 0  # groups in flight
        self.paused = 0  # pause() calls not yet resumed
        self.stopping = False
        self.batcher: GenerationBatcher | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    # -- the trainer's side ---------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._main, name="ctu-rollout-producer", daemon=True)
            self._thread.start()

    def take(self) -> Group:
        """The next finished group (blocks until one is); re-raises what stopped the producer."""
        self.start()
        item = self.done.get()
        if isinstance(item, BaseException):
            self.done.put(item)  # every later take fails the same way
            raise item
        with self._cond:
            self.taken += 1
        self._poke()
        return item

    def engine_seconds(self) -> float:
        """Wall time spent inside engine calls so far (the engine's busy time); with a player (rollout workers,
        agents), the time in which any group was played (overlapping groups counted once): their engines are
        elsewhere."""
        if self.player is not None:
            return self.groups_busy.seconds()
        return 0.0 if self.batcher is None else self.batcher.model_seconds

    def pause(self) -> None:
        """Start no group and wait until the groups in flight have finished (they stay queued for the trainer).
        Pauses nest: the producer goes on after as many :meth:`resume` calls."""
        with self._cond:
            self.paused += 1
            self._cond.wait_for(lambda: self.running == 0 or self._thread is None or not self._thread.is_alive())

    def resume(self) -> None:
        with self._cond:
            self.paused = max(0, self.paused - 1)
        self._poke()

    @contextmanager
    def quiet(self):
        """:meth:`pause` for the block (an evaluation: the engine and user simulator serve it alone)."""
        self.pause()
        try:
            yield
        finally:
            self.resume()

    def stop(self, timeout: float = 60.0) -> None:
        """Cancel the episodes in flight and end the thread (the engine call running finishes first)."""
        with self._cond:
            self.stopping = True
        self._poke()
        if self._thread is not None:
            self._thread.join(timeout)

    # -- the producer's thread ------------------------------------------------------------------------------------
    def _poke(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:  # the loop just closed
                pass

    def _may_start(self) -> bool:
        with self._cond:
            return not (self.paused or self.stopping) and self.started - self.taken < self.capacity

    def _main(self) -> None:
        try:
            asyncio.run(self._produce())
        except BaseException as exc:  # noqa: BLE001 - handed to the trainer, which raises it
            self.done.put(exc)
        else:  # stopped: a take after this fails instead of waiting for ever
            self.done.put(RuntimeError("the rollout producer was stopped: no more groups"))
        finally:
            with self._cond:
                self.running = 0
                self._cond.notify_all()

    async def _produce(self) -> None:
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        if self.player is None:
            assert self.engine is not None  # no player: episodes are played here, on this engine
            self.batcher = GenerationBatcher(self.engine, self.max_batch_size)
        gate = asyncio.Semaphore(max(1, self.concurrency))
        tasks: set[asyncio.Task] = set()
        failure: list[BaseException] = []
        try:
            while not self.stopping and not failure:
                if self._may_start():
                    index = self.started
                    with self._cond:
                        self.started += 1
                        self.running += 1
                    task = asyncio.create_task(self._group(index, self.draw(), gate))
                    tasks.add(task)
                    task.add_done_callback(lambda t: self._finished(t, tasks, failure))
                    continue
                self._wake.clear()
                if self._may_start() or self.stopping:
                    continue
                await self._wake.wait()
            if failure:
                raise failure[0]
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self.batcher is not None:
                self.batcher.close()

    def _finished(self, task: asyncio.Task, tasks: set, failure: list) -> None:
        tasks.discard(task)
        with self._cond:
            self.running -= 1
            self._cond.notify_all()
        if not task.cancelled() and task.exception() is not None:
            failure.append(task.exception())
        if self._wake is not None:
            self._wake.set()

    async def _group(self, index: int, pick: tuple, gate: asyncio.Semaphore) -> None:
        domain, task = pick
        seed = self.seed(index)
        params = replace(self.params, seed=seed)
        if self.player is not None:  # rollout workers or agent processes play it: seeds as a synchronous call's
            started = self.groups_busy.begin()
            specs = [EpisodeSpec(domain, task, i) for i in range(self.samples_per_task)]
            try:
                trajectories = list(await self.player(specs, params, seed))
            finally:
                seconds = self.groups_busy.end(started)
            self.done.put(Group(index, trajectories, None, seconds))
            return
        assert self.engine is not None and self.batcher is not None and self.limits is not None  # played here
        started, version = time.perf_counter(), self.engine.weights_version
        batcher, limits = self.batcher, self.limits

        async def one(i: int) -> Trajectory:
            async with gate:
                return await run_episode(EpisodeSpec(domain, task, i), self.chat, batcher, self.user, params,
                                         limits, None, seed=seed + i)

        trajectories = list(await asyncio.gather(*(one(i) for i in range(self.samples_per_task))))
        self.done.put(Group(index, trajectories, version, time.perf_counter() - started))


class AsyncPool(RolloutPool):
    """Any rollout pool with a :class:`RolloutProducer` beside it (``producer`` is set by whoever builds it):
    the same interface, so the trainer's loop does not know which placement it drives.

    What the producer must not overlap: an evaluation (``run``: the producer starts nothing new and lets its
    groups in flight finish first), an engine's sleep (``sleep`` pauses the producer before the engines free
    their memory, ``wake_up`` resumes it after), and the end (``close`` stops the producer before the workers
    go). Weight loads and parity probes go straight to the pool: the engines' own locks order them with
    generation, and every token keeps the version that sampled it."""

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
        processes): one group as a synchronous call of the wrapped pool, in a thread; whole on one Ray worker
        where the pool can (``play_group``: :mod:`ctu.distributed.group_play`)."""
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

    def sleep(self) -> None:
        if self.producer is not None and not self._sleeping:
            self.producer.pause()  # no generation may reach an engine that is freeing its memory
            self._sleeping = True
        self.inner.sleep()

    def wake_up(self) -> None:
        self.inner.wake_up()
        if self._sleeping and self.producer is not None:
            self._sleeping = False
            self.producer.resume()

    def close(self) -> None:
        try:
            if self.producer is not None:
                self.producer.stop()
        finally:
            self.inner.close()
