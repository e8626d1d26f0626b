"""The background rollout worker and the staleness filter, in process, with an engine that follows the hf engine's
contract (generation and weight loads exclusive under one lock, each completion stamped with the version it ran
under) and a user simulator whose replies take random times (slow sessions are overtaken by fast ones)."""

import asyncio
import random
import threading
import time
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctu.app.async_loop import AsyncRollouts
from ctu.app.trainer import TaskSampler, TrainingRewards
from ctu.config.schema import load_config
from ctu.distributed.async_pool import AsyncPool
from ctu.distributed.async_rollout import admitted
from ctu.distributed.pool import LocalPool
from ctu.domains import get_domain
from ctu.engines.base import Completion, Engine
from ctu.episode.users.base import UserSession, UserSimulator
from ctu.episode.users.scripted import ScriptedUser
from ctu.rl.staleness import sampled_versions
from ctu.rollout.loop import RolloutLimits
from ctu.train.sync import WeightSync

MINI = get_domain("mini")


class LockedEngine(Engine):
    """Asks "Which order?" (the scripted user answers) to every prompt after ``delay`` seconds; generation and update_weights share one lock."""

    def __init__(self, chat, delay=0.001):
        self.ids = tuple(chat.encode("Which order?") + [chat.stop_token_ids[0]])
        self.delay, self.lock, self.weights_version = delay, threading.Lock(), 0
        self.calls: list[tuple[float, float, int]] = []  # (start, end, version) of every generation call

    async def generate(self, prompts, params, seeds=None):
        return await asyncio.to_thread(self._generate, len(prompts))

    def _generate(self, n):
        with self.lock:
            start, version = time.perf_counter(), self.weights_version
            time.sleep(self.delay)
            self.calls.append((start, time.perf_counter(), version))
            return [[Completion(self.ids, (-0.5,) * len(self.ids), "stop", version)] for _ in range(n)]

    def update_weights(self, named_tensors, version=None):
        with self.lock:
            self.weights_version = version


class SlowUser(UserSimulator):
    """A user who answers every question until the turn limit, each session's replies delayed: ``slow_share`` of
    the sessions by ``slow`` seconds a reply, the others by up to ``fast``."""

    def __init__(self, rng: random.Random, slow_share=0.25, slow=0.08, fast=0.002):
        self.rng, self.slow_share, self.slow, self.fast = rng, slow_share, slow, fast

    def start(self, domain, task, seed=0):
        delay = self.slow if self.rng.random() < self.slow_share else self.rng.uniform(0, self.fast)

        class Session(UserSession):
            async def reply(self, agent_message):
                await asyncio.sleep(delay)
                return "Order O1001, please."

        return Session()


def rollouts_for(chat, engine, user, k, *extra):
    config = load_config(None, ["trainer.tasks_per_step=2", "trainer.samples_per_task=2", "env.max_turns=3",
                                "trainer.max_steps=100", f"trainer.max_staleness={k}", "trainer.tis_cap=2.0",
                                "sampling.max_tokens=8",
                                *extra])
    pool = AsyncPool(LocalPool(engine, chat, user, RolloutLimits(max_turns=3), concurrency=16, max_batch_size=16))
    sync = WeightSync(config, SimpleNamespace(), pool)
    sync.version = 0  # the engine holds version 0 (its stamp)
    trainer = SimpleNamespace(
        config=config, step=0, pool=pool, sync=sync, sampler=TaskSampler([MINI], [1.0], seed=0),
        rewards=lambda batch: TrainingRewards(tuple(t.reward for t in batch), tuple(float(t.sample) for t in batch)))
    return trainer, AsyncRollouts(trainer)


def train(trainer, rollouts, engine, steps, update_s=lambda: 0.0, stop=True, updates=None):
    """The trainer's loop without a model: collect, the update (the weight sync's ``before_update``, then a sleep),
    load version s; what each step trained on. ``updates``: each update's (start, end) is appended to it."""
    out = []
    try:
        for step in range(1, steps + 1):
            trainer.step = step
            started = time.perf_counter()
            trajectories, groups, _, chosen, _ = rollouts.collect()
            trained = [t for t, g in zip(trajectories, groups, strict=True) if g in chosen]
            trainer.sync.before_update()  # engine.colocated (the default): the pool is put to sleep
            update = time.perf_counter()  # the trainer's work: a producer drained before it does not overlap it
            time.sleep(update_s())
            window = (update, time.perf_counter())
            engine.update_weights([], version=step)
            trainer.pool.wake_up()
            trainer.sync.version = step
            if updates is not None:
                updates.append(window)
            out.append((trained, rollouts.step_metrics(time.perf_counter() - started, window)))
    finally:
        if stop:
            rollouts.producer.stop()
    return out


@pytest.fixture
def chat(chat_format):
    return chat_format


def test_admission_is_k_steps_ahead_of_the_step():
    assert admitted(1, 8, 1) == 16 and admitted(2, 3, 4) == 18


@settings(max_examples=6, deadline=None)
@given(k=st.sampled_from([1, 2]), seed=st.integers(0, 2**16))
def test_no_trained_token_is_more_than_k_versions_old(chat_format, k, seed):
    rng = random.Random(seed)
    engine = LockedEngine(chat_format, delay=rng.uniform(0.0005, 0.003))
    trainer, rollouts = rollouts_for(chat_format, engine, SlowUser(rng), k)
    steps = train(trainer, rollouts, engine, 8, update_s=lambda: rng.uniform(0, 0.02))
    for step, (trained, metrics) in enumerate(steps, start=1):
        assert len({(t.task_id, t.sample) for t in trained}) >= 1 and len(trained) == 4
        versions = [v for t in trained for v in sampled_versions(t)]
        assert versions and min(versions) >= step - 1 - k, (step, min(versions))
        assert max(versions) <= step - 1  # nothing from weights the step has not made yet
        assert metrics["staleness_max"] <= k


def test_slow_groups_are_cancelled_once_too_old_and_admission_keeps_the_bound(chat_format):
    """Slow sessions are overtaken by fast ones: each is cancelled as soon as the next step may not train on it
    (counted; it frees its admission), and the producer never has more groups started than (k + step) x batch."""
    engine = LockedEngine(chat_format)
    trainer, rollouts = rollouts_for(chat_format, engine, SlowUser(random.Random(1), slow_share=0.3, slow=0.1), 1)
    seen = []
    real = rollouts.collect

    def collect():
        out = real()
        producer = rollouts.producer
        seen.append((trainer.step, producer.started - producer.given_up))
        return out

    rollouts.collect = collect
    steps = train(trainer, rollouts, engine, 12, update_s=lambda: 0.01)
    cancelled, dropped = (sum(m[key] for _, m in steps) for key in ("cancelled_groups", "dropped_groups"))
    assert cancelled >= 1  # slow sessions would finish several versions late: they are stopped instead
    assert sum(m["dropped_episodes"] for _, m in steps) == 2 * dropped
    assert all(m["staleness_max"] <= 1 for _, m in steps)
    assert all(n <= admitted(1, 2, step) for step, n in seen), seen


def test_generation_overlaps_the_update_on_an_engine_that_keeps_its_memory(chat_format):
    """engine.colocated=true (the default) puts the pool to sleep at every update; an engine whose sleep frees
    nothing (hf, vLLM on CPU) keeps generating through it: calls start while the update runs, and the step's
    async/update_tokens counts what they sampled."""
    engine = LockedEngine(chat_format, delay=0.002)
    trainer, rollouts = rollouts_for(chat_format, engine, SlowUser(random.Random(4), slow_share=0.5, slow=0.02), 1)
    updates = []
    steps = train(trainer, rollouts, engine, 3, update_s=lambda: 0.1, updates=updates)
    during = [start for start, _, _ in engine.calls if any(a <= start <= b for a, b in updates)]
    assert during, "no generation call started while an update ran"
    assert sum(m["update_tokens"] for _, m in steps) > 0


def test_tokens_sampled_after_an_update_carry_the_new_version(chat_format):
    engine = LockedEngine(chat_format, delay=0.002)
    trainer, rollouts = rollouts_for(chat_format, engine, SlowUser(random.Random(2), slow_share=1.0, slow=0.01), 2)
    steps = train(trainer, rollouts, engine, 6, update_s=lambda: 0.03)
    served = [v for _, _, v in engine.calls]
    assert served == sorted(served) and len(set(served)) >= 4  # calls after load v ran under v
    spanning = 0
    for trained, _ in steps:
        for t in trained:
            versions = sampled_versions(t)
            assert versions == sorted(versions)  # an episode's later turns never use older weights
            spanning += len(set(versions)) > 1
    assert spanning >= 1  # some episodes ran across an update and finished under the new weights
    # every call ran under one version and no call overlapped a load: calls are serial and versions never go back
    for (_, end, v), (start, _, w) in zip(engine.calls, engine.calls[1:], strict=False):
        assert end <= start and v <= w


def test_dynamic_sampling_trains_on_informative_groups_only(chat_format):
    engine = LockedEngine(chat_format)
    trainer, rollouts = rollouts_for(chat_format, engine, SlowUser(random.Random(3), slow_share=0.0), 1,
                                     "trainer.dynamic_sampling=true", "trainer.dynamic_sampling_max_draws=0")
    # shaped rewards: the sample index, so every group of two samples is informative
    ((trained, metrics),) = train(trainer, rollouts, engine, 1, stop=False)
    assert len(trained) == 4 and metrics["dropped_groups"] == 0
    trainer.rewards = lambda batch: TrainingRewards((0.0,) * len(batch), (0.0,) * len(batch))  # none informative
    trainer.step = 2
    trajectories, groups, _, chosen, extra = rollouts.collect()
    rollouts.producer.stop()
    assert chosen == set() and len(set(groups)) == 2 and extra == 2  # max_draws=0: tasks_per_step groups, no more


def test_an_engine_failure_reaches_the_trainer(chat_format):
    class Broken(LockedEngine):
        def _generate(self, n):
            raise RuntimeError("engine died")

    engine = Broken(chat_format)
    trainer, rollouts = rollouts_for(chat_format, engine, ScriptedUser(), 1)
    trainer.step = 1
    with pytest.raises(RuntimeError, match="engine died"):
        rollouts.collect()
    rollouts.producer.stop()
    assert not rollouts.producer._thread.is_alive()


def test_an_hf_engine_batch_never_mixes_weights_and_is_stamped_with_its_version():
    """A weight load arriving while the real hf engine generates waits for the batch: the batch is exactly what the
    old weights sample, stamped with the old version; the next batch is the new weights', stamped with the new."""
    import torch

    from ctu.engines.base import SamplingParams
    from ctu.engines.hf.engine import HFEngine
    from ctu.engines.hf.models import load_model, load_tokenizer

    tokenizer = load_tokenizer("tiny-random")
    old, new = load_model("tiny-random"), load_model("tiny-random")
    with torch.no_grad():
        for p in new.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    params = SamplingParams(max_tokens=32, seed=3)
    prompts = [[1, 2, 3, 4]] * 2

    def reference(model):
        return HFEngine(model, tokenizer, kv_reuse=False).generate_sync(prompts, params)

    want_old, want_new = reference(old), reference(new)
    engine = HFEngine(load_model("tiny-random"), tokenizer, kv_reuse=False)
    engine.update_weights(old.named_parameters(), version=0)
    result = {}
    worker = threading.Thread(target=lambda: result.update(out=engine.generate_sync(prompts, params)))
    worker.start()
    while not engine._lock.locked():  # the batch is decoding
        time.sleep(0.0005)
    engine.update_weights([(n, p.detach()) for n, p in new.named_parameters()], version=1)
    worker.join()
    assert [[(c.token_ids, c.version) for c in row] for row in result["out"]] == \
        [[(c.token_ids, 0) for c in row] for row in want_old]
    after = engine.generate_sync(prompts, params)
    assert [[(c.token_ids, c.version) for c in row] for row in after] == \
        [[(c.token_ids, 1) for c in row] for row in want_new]
    assert [c.token_ids for row in want_old for c in row] != [c.token_ids for row in want_new for c in row]


class UnstampedEngine(LockedEngine):
    """An engine whose completions carry no policy version (the in-process vLLM engine did not stamp them)."""

    def _generate(self, n):
        return [[Completion(self.ids, (-0.5,) * len(self.ids), "stop", None)] for _ in range(n)]


def test_an_engine_without_version_stamps_stops_the_step_in_one_line_instead_of_dropping_for_ever(chat_format):
    engine = UnstampedEngine(chat_format)
    trainer, rollouts = rollouts_for(chat_format, engine, SlowUser(random.Random(0), slow_share=0.0), 1)
    trainer.step = 1
    started = time.perf_counter()
    with pytest.raises(RuntimeError, match=r"^asynchronous rollouts: the LocalPool's engine returned tokens without"):
        rollouts.collect()
    assert time.perf_counter() - started < 30
    assert rollouts.producer.stopping


class SlowRelease(threading.Condition):
    """A condition whose release by the producer's thread is slow: any gap between its checks and its counts widens."""

    def __exit__(self, *exc):
        out = super().__exit__(*exc)
        if threading.current_thread().name == "ctu-rollout-producer":
            time.sleep(0.003)
        return out


def test_a_pause_that_returned_sees_every_group_started(chat_format):
    """pause() returns once nothing runs and nothing starts after it: the producer counts a group as started and
    running in the same hold of the condition as its check (else a pause between the two returns, and a group starts
    during an evaluation or on a sleeping engine)."""
    from ctu.distributed.async_rollout import RolloutProducer
    from ctu.engines.base import SamplingParams

    async def instant(specs, params, seed):
        return []

    producer = RolloutProducer(None, None, None, None, SamplingParams(), draw=lambda: (MINI, None), samples_per_task=1,
                               max_staleness=1000, tasks_per_step=100, step=1, seed=lambda i: i, player=instant)
    producer._cond = SlowRelease()
    producer.start()
    rng = random.Random(0)
    try:
        producer.pause()
        for _ in range(40):  # each resume wakes the producer: a pause lands somewhere in its first start
            producer.resume()
            time.sleep(rng.uniform(0, 0.008))
            producer.pause()
            started = producer.started
            time.sleep(0.01)
            assert producer.started == started and producer.running == 0
    finally:
        producer.stop()
