"""Asynchronous rollouts (``trainer.max_staleness = k > 0``): a background worker keeps sampling groups while the
trainer updates.

:class:`RolloutProducer` runs in a thread with its own asyncio loop. It draws one task at a time and plays a
*group* (``trainer.samples_per_task`` episodes of that task, drawn together) through one shared
:class:`~ctu.rollout.loop.GenerationBatcher`, so episodes of different groups share engine batches. Admission: while
the trainer collects or updates step ``s`` it starts a group only while fewer than ``(k + s) x tasks_per_step``
groups are started and not given up (:func:`admitted`; given up: dropped as too old, or taken and not trained on),
so every group it starts would be trained within the bound if groups were taken in the order they start. The trainer
takes them in the order they finish (:meth:`RolloutProducer.take`): a group overtaken far enough is too old by then;
one played here is cancelled as soon as the next step may no longer train on it (nothing beyond the bound is
generated), one a pool plays elsewhere is dropped when it comes back. Both are counted.

In-flight episodes at an update: they go on, and their next turns sample from the new weights. The engine's lock
makes a generation call and a weight load mutually exclusive (a batch never mixes weights), and every completion
carries the version it ran under, so every token keeps its own version (``Trajectory.token_versions``). What a step
may train on is decided by those stamps (:mod:`ctu.rl.staleness`), not by when a group started.

Where episodes run: in this process (the producer plays them through one batcher on the pool's engine, so groups
share engine batches), or wherever the pool runs them (:class:`~ctu.distributed.ray_pool.RayPool` workers, each
with its engine and weights loaded by version; :class:`~ctu.distributed.agent_pool.AgentPool`, the user's agent program):
the producer then hands each group to the pool as one call (:meth:`~ctu.distributed.async_pool.AsyncPool.play`).
:class:`~ctu.distributed.async_pool.AsyncPool` wraps any pool with the producer beside it.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

from ctu.distributed.busy import BusyClock, SpanLog
from ctu.engines.base import Engine, SamplingParams
from ctu.rollout.loop import EpisodeSpec, GenerationBatcher, RolloutLimits, Trajectory, run_episode

Draw = Callable[[], tuple]  # () -> (domain, task): the next training task
# (the group's specs, its sampling params, its seed) -> its trajectories, episode i seeded seed + i
Player = Callable[[Sequence[EpisodeSpec], SamplingParams, int], Awaitable[Sequence[Trajectory]]]


def admitted(max_staleness: int, tasks_per_step: int, step: int) -> int:
    """How many groups (started, not given up) the producer may have started while the trainer is at ``step``:
    ``(k + step) x tasks_per_step``. Steps 1..step-1 trained ``(step - 1) x tasks_per_step`` of them; the rest are
    step ``step``'s and the next k steps'. A group started at ``step`` samples from version ``step - 1`` or newer
    and, taken in start order, is trained by step ``step + k`` (staleness ``k``, :mod:`ctu.rl.staleness`)."""
    return max(1, (max_staleness + step) * tasks_per_step)


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


class Tally(Engine):
    """The engine the producer's batcher calls: the same engine, each call's span and sampled tokens noted (what
    overlapped an update, :meth:`RolloutProducer.sampled_between` and :meth:`RolloutProducer.generating_during`)."""

    def __init__(self, engine: Engine, spans: SpanLog):
        self.inner, self.spans = engine, spans

    async def generate(self, prompts, params, seeds=None):
        span = self.spans.begin()
        tokens = 0
        try:
            out = await self.inner.generate(prompts, params, seeds)
            tokens = sum(len(c.token_ids) for row in out for c in row)
            return out
        finally:
            self.spans.end(span, tokens)

    def update_weights(self, named_tensors, version=None) -> None:
        self.inner.update_weights(named_tensors, version)

    def release(self, token_ids) -> None:
        self.inner.release(token_ids)


class RolloutProducer:
    """Samples groups in a background thread; the trainer takes them with :meth:`take`.

    ``max_staleness`` and ``tasks_per_step`` bound what it starts (:func:`admitted`); the trainer says where it is
    with :meth:`at_step` (the step that trains on the weights the engines hold now) and gives groups up with
    :meth:`give_up`."""

    def __init__(self, engine: Engine | None, chat, user, limits: RolloutLimits | None, params: SamplingParams, *,
                 draw: Draw, samples_per_task: int, max_staleness: int, tasks_per_step: int, step: int,
                 seed: Callable[[int], int], concurrency: int = 64, max_batch_size: int = 64,
                 player: Player | None = None):
        self.engine, self.chat, self.user, self.limits, self.params = engine, chat, user, limits, params
        self.draw, self.samples_per_task, self.seed = draw, samples_per_task, seed
        self.max_staleness, self.tasks_per_step = max_staleness, tasks_per_step
        self.concurrency, self.max_batch_size = concurrency, max_batch_size
        self.player = player  # None: episodes played here, through one shared batcher on ``engine``
        self.groups_busy = BusyClock()  # while a player played any group (its engines' own busy time is not seen)
        self.done: queue.Queue = queue.Queue()  # finished Groups (or the exception that stopped the producer)
        self._cond = threading.Condition()
        self.step = step  # the step that trains on the engines' weights (it collects now, or next)
        self.started = 0  # groups started
        self.given_up = 0  # groups dropped as too old or taken and not trained on: they free their admission
        self.cancelled = 0  # groups played here stopped once the next step could no longer train on them
        self.taken = 0  # groups handed to the trainer
        self.running = 0  # groups in flight
        self.paused = 0  # pause() calls not yet resumed
        self.stopping = False
        self.spans = SpanLog()  # each engine call's or player group's (start, end, tokens), and those in flight
        self.batcher: GenerationBatcher | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._tasks: dict[int, tuple[asyncio.Task, int | None]] = {}  # groups played here: (task, started version)

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

    def at_step(self, step: int) -> None:
        """The engines hold the weights step ``step`` trains on (version ``step - 1``): admission grows, and groups
        played here that step ``step`` may not train on (started on weights older than ``step - 1 - k``) are
        cancelled."""
        with self._cond:
            self.step = max(self.step, step)
        self._poke()

    def give_up(self, groups: int = 1) -> None:
        """``groups`` taken groups will not be trained on (too old, or not informative): others may start."""
        with self._cond:
            self.given_up += groups
        self._poke()

    def engine_seconds(self) -> float:
        """Wall time spent inside engine calls so far (the engine's busy time); with a player (rollout workers,
        agents), the time in which any group was played (overlapping groups counted once): their engines are
        elsewhere."""
        if self.player is not None:
            return self.groups_busy.seconds()
        return 0.0 if self.batcher is None else self.batcher.model_seconds

    def sampled_between(self, start: float, end: float) -> float:
        """Tokens sampled in ``[start, end]`` (``time.perf_counter``): each engine call's tokens (with a player,
        each group's response tokens) in the share of its span that lies in the window, at an even rate over the
        span (a group that was playing through the window counts whether it came back in it or later)."""
        return self.spans.tokens_in(start, end)

    def generating_during(self, start: float, end: float) -> float:
        """Seconds of ``[start, end]`` in which an engine call or a played group was in flight (those still in
        flight included: a group a worker plays through an update comes back after it, its tokens unknown then)."""
        return self.spans.seconds_in(start, end)

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
        """Cancel the groups in flight and end the thread (an engine call running finishes first); raises where
        the thread is still alive after ``timeout`` seconds."""
        with self._cond:
            self.stopping = True
        self._poke()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                raise RuntimeError(f"the rollout producer did not stop within {timeout:g}s: a group it started is "
                                   "still running")

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- the producer's thread ------------------------------------------------------------------------------------
    def _poke(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:  # the loop just closed
                pass

    def _claim(self) -> int | None:
        """The index of a group that may start now, counted as started and running in the same hold of the
        condition (a :meth:`pause` never returns while a group it did not see starts); None: none may."""
        with self._cond:
            room = admitted(self.max_staleness, self.tasks_per_step, self.step)
            if self.paused or self.stopping or self.started - self.given_up >= room:
                return None
            index = self.started
            self.started += 1
            self.running += 1
            return index

    def _cancel_stale(self) -> None:
        """Cancel the groups played here that the next step may not train on (their first tokens are older than
        its oldest allowed version): they would only be dropped."""
        oldest = self.step - 1 - self.max_staleness
        for task, version in list(self._tasks.values()):
            if version is not None and 0 <= version < oldest and not task.done():
                task.cancel()

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
            self.batcher = GenerationBatcher(Tally(self.engine, self.spans), self.max_batch_size)
        gate = asyncio.Semaphore(max(1, self.concurrency))
        tasks: set[asyncio.Task] = set()
        failure: list[BaseException] = []
        try:
            while not self.stopping and not failure:
                self._cancel_stale()
                index = self._claim()
                if index is not None:
                    task = asyncio.create_task(self._group(index, self.draw(), gate))
                    tasks.add(task)
                    task.add_done_callback(functools.partial(self._finished, index=index, tasks=tasks,
                                                             failure=failure))
                    continue
                self._wake.clear()
                if self.stopping:
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

    def _finished(self, task: asyncio.Task, index: int, tasks: set, failure: list) -> None:
        tasks.discard(task)
        self._tasks.pop(index, None)
        with self._cond:
            self.running -= 1
            if task.cancelled() and not self.stopping:  # too old for the next step: it frees its admission
                self.cancelled += 1
                self.given_up += 1
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
            started, span = self.groups_busy.begin(), self.spans.begin()
            specs = [EpisodeSpec(domain, task, i) for i in range(self.samples_per_task)]
            trajectories: list[Trajectory] = []
            try:
                trajectories = list(await self.player(specs, params, seed))
            finally:
                seconds = self.groups_busy.end(started)
                self.spans.end(span, sum(sum(t.loss_mask) for t in trajectories))
            self.done.put(Group(index, trajectories, None, seconds))
            return
        assert self.engine is not None and self.batcher is not None and self.limits is not None  # played here
        started, version = time.perf_counter(), self.engine.weights_version
        current = asyncio.current_task()
        assert current is not None
        self._tasks[index] = (current, version)
        batcher, limits = self.batcher, self.limits

        async def one(i: int) -> Trajectory:
            async with gate:
                return await run_episode(EpisodeSpec(domain, task, i), self.chat, batcher, self.user, params,
                                         limits, None, seed=seed + i)

        trajectories = list(await asyncio.gather(*(one(i) for i in range(self.samples_per_task))))
        self.done.put(Group(index, trajectories, version, time.perf_counter() - started))
