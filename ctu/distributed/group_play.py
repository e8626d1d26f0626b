"""Asynchronous groups on Ray rollout workers, each group whole on one worker.

A synchronous step splits its episodes over every worker, so each engine batches a step's share. The asynchronous
producer hands the pool one group at a time; split the same way, each engine got ``samples_per_task / workers``
episodes of a group and, a worker running one call at a time, batched no more than that. Here a group goes whole
to the live worker with the fewest groups in flight (:func:`play_on_one_worker`), and a worker plays the groups it
holds at once (its ``play`` concurrency group: :func:`group_slots` calls) on one event loop through one
:class:`~ctu.rollout.loop.GenerationBatcher` (:class:`SharedLoop`), so its engine batches the episodes of every
group in flight there: a step's worth once the producer keeps that many groups going.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

from ctu.engines.base import Engine, SamplingParams
from ctu.rollout.loop import EpisodeSpec, GenerationBatcher, RolloutLimits, Trajectory, run_episode

PLAY = "play"  # the workers' concurrency group for the producer's groups


def group_slots(config) -> int:
    """Groups one worker plays at once: as many as the producer may have started (k steps' worth)."""
    return max(1, int(config.trainer.max_staleness) * int(config.trainer.tasks_per_step))


class SharedLoop:
    """An event loop in a thread of its own with one batcher on ``engine``: groups played from several threads at
    once (the actor's) share engine batches. Episode ``i`` of a group is seeded ``seed + i``, as in any pool."""

    def __init__(self, engine: Engine, chat, user, limits: RolloutLimits, *, max_batch_size: int = 64,
                 concurrency: int = 64):
        self.engine, self.chat, self.user, self.limits = engine, chat, user, limits
        self.max_batch_size, self.concurrency = max_batch_size, concurrency
        self.batcher = GenerationBatcher(engine, max_batch_size)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._gate: asyncio.Semaphore | None = None
        self._lock = threading.Lock()

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=_run, args=(loop,), name="ctu-worker-groups", daemon=True).start()
                self._loop = loop
            return self._loop

    def play(self, specs: Sequence[EpisodeSpec], params: SamplingParams, seed: int) -> list[Trajectory]:
        """One group's trajectories, in the order of ``specs`` (blocks this thread, not the loop)."""
        return asyncio.run_coroutine_threadsafe(self._play(specs, params, seed), self._started()).result()

    async def _play(self, specs: Sequence[EpisodeSpec], params: SamplingParams, seed: int) -> list[Trajectory]:
        if self._gate is None:
            self._gate = asyncio.Semaphore(max(1, self.concurrency))
        gate = self._gate

        async def one(i: int, spec: EpisodeSpec) -> Trajectory:
            async with gate:
                return await run_episode(spec, self.chat, self.batcher, self.user, params, self.limits, None,
                                         seed=seed + i)

        return list(await asyncio.gather(*(one(i, s) for i, s in enumerate(specs))))

    def close(self) -> None:
        """Cancel what still runs on the loop (the batcher's server, episodes in flight) and end its thread."""
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(_cancel_all(), loop).result(30)
        finally:
            loop.call_soon_threadsafe(loop.stop)


def _run(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        loop.close()


async def _cancel_all() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def play_on_one_worker(pool, specs: Sequence[EpisodeSpec], params: SamplingParams, seed: int) -> list[Trajectory]:
    """One group, whole, on the live worker of ``pool`` (a :class:`~ctu.distributed.ray_pool.RayPool`) with the
    fewest groups in flight. A worker that dies under it: the group goes through ``pool.run`` (its re-run and
    errored-episode rules)."""
    from ray.exceptions import RayActorError

    from ctu.distributed.pool import SpecKey
    from ctu.distributed.ray_setup import import_ray

    ray = import_ray()
    with pool.playing_lock:
        live = pool.live()
        if not live:
            raise RuntimeError("every rollout worker has died: no worker left to run episodes")
        k = min(live, key=lambda w: pool.playing.get(w, 0))
        pool.playing[k] = pool.playing.get(k, 0) + 1
    try:
        box, version = pool.latest  # one read: the weights and their version together
        keys = [SpecKey.of(s) for s in specs]
        ref = pool.workers[k].play_group.options(concurrency_group=PLAY).remote(keys, params, seed, box, version)
        return ray.get(ref)
    except RayActorError:
        return pool.run(specs, params, seed)
    finally:
        with pool.playing_lock:
            pool.playing[k] -= 1
