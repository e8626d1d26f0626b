"""Engine busy time where groups overlap (rollout workers, agent programs play several groups at once): the union
of the intervals in which at least one group ran, not the sum of their wall times."""

import asyncio
import time

from ctu.distributed.async_rollout import RolloutProducer
from ctu.distributed.busy import BusyClock
from ctu.domains import get_domain
from ctu.engines.base import SamplingParams

MINI = get_domain("mini")


def test_overlapping_intervals_count_once():
    now = [0.0]
    clock = BusyClock(lambda: now[0])
    a = clock.begin()  # a: 0-2, b: 1-3, c: 5-6 -> busy 3 + 1
    now[0] = 1.0
    b = clock.begin()
    now[0] = 2.0
    clock.end(a)
    assert clock.seconds() == 2.0  # b still running
    now[0] = 3.0
    clock.end(b)
    now[0] = 5.0
    with clock.busy():
        now[0] = 6.0
    now[0] = 9.0
    assert clock.seconds() == 4.0


def test_groups_played_at_once_count_their_shared_time_once():
    # engine_seconds summed each group's wall time: two groups played together for 0.3 s gave 0.6 s of a 0.3 s step,
    # so async/engine_idle_s clamped to 0 whatever the engines did
    async def player(specs, params, seed):
        await asyncio.sleep(0.3)
        return []

    producer = RolloutProducer(None, None, None, None, SamplingParams(), draw=lambda: (MINI, MINI.tasks[0]),
                               samples_per_task=1, max_staleness=1, tasks_per_step=1, step=1,
                               seed=lambda i: i, player=player)  # admits 2 groups at once
    try:
        producer.take()
        producer.take()
        assert 0.3 <= producer.engine_seconds() < 0.45
    finally:
        producer.stop()


def test_a_group_played_through_an_update_counts_though_it_came_back_after():
    # update_tokens counted a player's group only where it came back inside the update: a Ray worker's group that
    # sampled through the whole update and returned just after counted 0 (seen: async/update_tokens 0 on 3 steps); its seconds count while it is still out
    from ctu.distributed.busy import covered_seconds, overlap_share

    async def player(specs, params, seed):
        await asyncio.sleep(0.4)
        return [type("T", (), {"loss_mask": [1] * 100})()]

    producer = RolloutProducer(None, None, None, None, SamplingParams(), draw=lambda: (MINI, MINI.tasks[0]),
                               samples_per_task=1, max_staleness=0, tasks_per_step=1, step=1,
                               seed=lambda i: i, player=player)
    try:
        producer.start()
        time.sleep(0.1)
        window = (time.perf_counter(), time.perf_counter() + 0.2)  # the update: inside the group's play
        time.sleep(0.2)
        assert 0.15 <= producer.generating_during(*window) <= 0.2 + 1e-3  # in flight: seconds known, tokens not yet
        assert producer.sampled_between(*window) == 0
        producer.take()
        assert 100 * 0.3 <= producer.sampled_between(*window) <= 100 * 0.7
    finally:
        producer.stop()
    assert overlap_share(0, 4, 1, 2) == 0.25 and overlap_share(0, 4, 5, 6) == 0 and overlap_share(2, 2, 1, 3) == 1
    assert covered_seconds([(0, 2), (1, 3), (5, 9)], 1, 6) == 3 and covered_seconds([], 0, 1) == 0
