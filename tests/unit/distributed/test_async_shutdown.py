"""The end of an asynchronous run: the producer's groups that a pool plays elsewhere (Ray workers, agent processes)
are ended before the pool closes, and a producer that cannot stop says so."""

import threading
import time

import pytest

from ctu.distributed.async_pool import AsyncPool
from ctu.distributed.async_rollout import RolloutProducer
from ctu.distributed.pool import RolloutPool, RunsCancelled
from ctu.domains import get_domain
from ctu.engines.base import SamplingParams

MINI = get_domain("mini")


class BlockingPool(RolloutPool):
    """A pool whose calls play for ``seconds`` unless :meth:`cancel_runs` ends them; it notes what happened."""

    episodes_in_process = False

    def __init__(self, seconds: float):
        self.seconds, self.events, self.lock = seconds, [], threading.Lock()
        self.cancelled = threading.Event()

    def note(self, event):
        with self.lock:
            self.events.append(event)

    @property
    def num_workers(self):
        return 1

    def run(self, specs, params, seed, judge_enabled=False, on_done=None):
        self.note("run")
        cut = self.cancelled.wait(self.seconds)
        self.note("ended")
        if cut:
            raise RunsCancelled("cancelled")
        return []

    def cancel_runs(self):
        self.note("cancel")
        self.cancelled.set()

    def close(self):
        self.note("close")

    def update_weights(self, named_tensors, version):
        pass

    def parity(self, score_fn, **kwargs):
        return [0.0]

    def versions(self):
        return [0]


def producer_for(player, step=1):
    return RolloutProducer(None, None, None, None, SamplingParams(), draw=lambda: (MINI, None), samples_per_task=1,
                           max_staleness=1, tasks_per_step=1, step=step, seed=lambda i: i, player=player)


def test_closing_ends_the_producers_runs_before_the_pool_closes():
    inner = BlockingPool(seconds=5.0)
    pool = AsyncPool(inner)
    pool.producer = producer_for(pool.play)
    pool.producer.start()
    while inner.events.count("run") < 2:  # (k + step) x 1 = 2 groups admitted
        time.sleep(0.01)
    started = time.perf_counter()
    pool.close()
    assert time.perf_counter() - started < 2.0  # not the runs' 5 s
    assert inner.events[-1] == "close" and inner.events.count("ended") == 2
    assert inner.events.index("cancel") < inner.events.index("ended")


def test_a_producer_that_does_not_stop_in_time_says_so():
    inner = BlockingPool(seconds=3.0)
    pool = AsyncPool(inner)
    producer = producer_for(pool.play)
    producer.start()
    while "run" not in inner.events:
        time.sleep(0.01)
    with pytest.raises(RuntimeError, match=r"^the rollout producer did not stop within 0.2s"):
        producer.stop(timeout=0.2)
    inner.cancel_runs()
    producer.stop()
    assert not producer.alive()
