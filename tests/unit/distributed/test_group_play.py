"""A Ray rollout worker's shared loop (ctu.distributed.group_play): groups played from several threads at once go
through one batcher, so the engine batches their episodes together."""

import asyncio
import threading

from ctu.distributed.group_play import SharedLoop, group_slots
from ctu.domains import get_domain
from ctu.engines.base import SamplingParams
from ctu.episode.users.scripted import ScriptedUser
from ctu.rollout.loop import EpisodeSpec, RolloutLimits
from tests.unit.distributed.test_async_rollout import LockedEngine

MINI = get_domain("mini")


class CountingEngine(LockedEngine):
    def __init__(self, chat):
        super().__init__(chat)
        self.batches: list[int] = []

    def _generate(self, n):
        self.batches.append(n)
        return super()._generate(n)


def test_groups_played_at_once_share_engine_batches(chat_format):
    engine = CountingEngine(chat_format)
    shared = SharedLoop(engine, chat_format, ScriptedUser(), RolloutLimits(max_turns=2), max_batch_size=16)
    hold = threading.Event()
    loop = shared._started()
    loop.call_soon_threadsafe(hold.wait)  # both groups reach the loop before either begins
    groups = [[EpisodeSpec(MINI, MINI.tasks[t], i) for i in range(2)] for t in range(2)]
    futures = [asyncio.run_coroutine_threadsafe(shared._play(g, SamplingParams(max_tokens=8), 100 * t), loop)
               for t, g in enumerate(groups)]  # what two of the actor's threads calling play() submit
    hold.set()
    out = [f.result(30) for f in futures]
    shared.close()
    assert [[t.task_id for t in g] for g in out] == [[MINI.tasks[t].id] * 2 for t in range(2)]
    assert engine.batches[0] == 4  # one engine call for both groups' first turns


def test_a_worker_plays_k_steps_of_groups_at_once():
    from types import SimpleNamespace

    assert group_slots(SimpleNamespace(trainer=SimpleNamespace(max_staleness=2, tasks_per_step=4))) == 8
    assert group_slots(SimpleNamespace(trainer=SimpleNamespace(max_staleness=0, tasks_per_step=4))) == 1
