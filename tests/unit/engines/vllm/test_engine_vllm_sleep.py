"""vLLM sleep levels and staged wake-up, against the fake (tests/fakes/fake_vllm.py), which follows vLLM 0.33
(vllm/entrypoints/llm.py, vllm/v1/engine/core.py, vllm/v1/executor/abstract.py, vllm/v1/worker/gpu_worker.py,
vllm/device_allocator/sleep_mode_backend.py): level 1 offloads the weights to host RAM and keeps them, level 2
discards them (what waking gives back is not the model until weights are reloaded); ``wake_up(tags)`` wakes
``weights`` and ``kv_cache`` separately, and the scheduler runs again only once both are awake.

A merged sync overwrites every weight: the engine sleeps at level 2 (nothing copied to pinned host RAM and back)
and a sync wakes the weights, loads, and only then wakes the KV cache. An adapter sync keeps the base: level 1."""

import pytest
import torch

from ctu.config.schema import load_config
from tests.fakes import fake_vllm
from tests.unit.engines.vllm.test_engine_vllm import PROMPT, assert_close, gen, make, peft_adapter, teacher_forced


def full_update(model, scale=0.3, seed=0):
    """Every weight, moved: what a merged sync sends (level 2 keeps nothing, so a partial update would not do)."""
    g = torch.Generator().manual_seed(seed)
    return [(n, p.detach() + scale * torch.randn(p.shape, generator=g)) for n, p in model.named_parameters()]


def record(monkeypatch, llm):
    """The fake LLM's wake_up / reload_weights calls, in order."""
    events = []
    wake, reload = llm.wake_up, fake_vllm._Worker.reload_weights

    def logged_wake(tags=None):
        events.append(("wake_up", None if tags is None else sorted(tags)))
        return wake(tags)

    def logged_reload(worker, *args, **kwargs):
        events.append(("reload_weights", sorted(llm.sleeping_tags)))
        return reload(worker, *args, **kwargs)

    monkeypatch.setattr(llm, "wake_up", logged_wake)
    monkeypatch.setattr(fake_vllm._Worker, "reload_weights", logged_reload)
    return events


# -- the fake follows vLLM --------------------------------------------------------------------------------------


def test_fake_level_1_keeps_the_weights_and_level_2_discards_them(monkeypatch):
    fake_vllm.install(monkeypatch)
    llm = fake_vllm.LLM("tiny-random", enable_sleep_mode=True)
    before = {n: p.detach().clone() for n, p in llm.hf.named_parameters()}
    llm.sleep(level=1)
    assert llm.wake_up() is True
    assert all(torch.equal(p, before[n]) for n, p in llm.hf.named_parameters())
    llm.sleep(level=2)
    llm.wake_up()
    assert not any(torch.equal(p, before[n]) for n, p in llm.hf.named_parameters() if before[n].abs().sum() > 0)


def test_fake_wakes_by_tag_and_serves_only_when_fully_awake(monkeypatch):
    fake_vllm.install(monkeypatch)
    llm = fake_vllm.LLM("tiny-random", enable_sleep_mode=True)
    params = fake_vllm.SamplingParams(max_tokens=1, logprobs=0)
    llm.sleep(level=1)
    assert llm.sleeping_tags == {"weights", "kv_cache"}
    assert llm.wake_up(tags=["weights"]) is False  # partial: the scheduler stays paused
    with pytest.raises(RuntimeError, match="sleep"):
        llm.generate([{"prompt_token_ids": [1, 2]}], params)
    assert llm.wake_up(tags=["weights"]) is False and llm.sleeping_tags == {"kv_cache"}  # not asleep: ignored
    assert llm.wake_up(tags=["kv_cache"]) is True and not llm.sleeping_tags
    llm.generate([{"prompt_token_ids": [1, 2]}], params)


def test_fake_refuses_to_load_weights_into_sleeping_weights_but_not_with_the_kv_cache_asleep(monkeypatch):
    fake_vllm.install(monkeypatch)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the iterator route: an in-process engine core
    llm = fake_vllm.LLM("tiny-random", enable_sleep_mode=True)
    weights = full_update(llm.hf)
    llm.sleep(level=2)
    with pytest.raises(RuntimeError, match="wake_up"):
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
    llm.wake_up(tags=["weights"])
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
    assert llm.sleeping_tags == {"kv_cache"}


# -- the engine ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "level"), [("merged", 2), ("adapter", 1)])
def test_the_sleep_level_follows_what_a_sync_sends(monkeypatch, mode, level):
    """Merged: every weight is overwritten, so vLLM's advice for weight updates (level 2: nothing kept on the
    host). Adapter: the base stays, so it must be kept (level 1)."""
    from ctu.rollout.components import build_engine

    fake_vllm.install(monkeypatch)
    engine = build_engine(load_config(None, ["engine.kind=vllm", "model.path=tiny-random", "model.dtype=float32",
                                             f"engine.weight_sync={mode}"]))
    engine.sleep()
    assert engine.llm.sleep_level == level


def test_a_merged_sync_wakes_the_weights_loads_then_wakes_the_kv_cache(monkeypatch):
    engine = make(monkeypatch, sleep_level=2)
    weights = full_update(engine.llm.hf)
    engine.sleep()
    events = record(monkeypatch, engine.llm)
    engine.update_weights(weights)
    assert events == [("wake_up", ["weights"]), ("reload_weights", ["kv_cache"]), ("wake_up", ["kv_cache"])]
    assert not engine.sleeping
    (c,) = gen(engine, [PROMPT], temperature=0.0, max_tokens=3)[0]
    assert_close(c.logprobs, teacher_forced(engine.llm.hf, PROMPT, c, 0.0))
    params = dict(engine.llm.hf.named_parameters())
    assert all(torch.equal(params[n], t) for n, t in weights)


def test_an_adapter_sync_at_level_1_keeps_the_base_and_wakes_in_two_stages(monkeypatch):
    engine = make(monkeypatch, enable_lora=True, max_lora_rank=8, lora_alpha=8)
    base = {n: p.detach().clone() for n, p in engine.llm.hf.named_parameters()}
    tensors, config, _ = peft_adapter(engine.llm.hf, seed=0)
    engine.sleep()
    events = record(monkeypatch, engine.llm)
    engine.update_adapter(tensors, version=0, peft_config=config)
    assert events == [("wake_up", ["weights"]), ("wake_up", ["kv_cache"])]
    assert all(torch.equal(p, base[n]) for n, p in engine.llm.hf.named_parameters())  # level 1: the base came back
    gen(engine, [PROMPT], temperature=0.0, max_tokens=2)


def test_after_level_2_the_engine_refuses_to_serve_until_weights_are_reloaded(monkeypatch):
    """Waking from level 2 without a reload gives memory that is not the model (vLLM would sample garbage)."""
    engine = make(monkeypatch, sleep_level=2)
    engine.sleep()
    engine.wake_up()
    assert not engine.sleeping
    with pytest.raises(RuntimeError, match="discarded"):
        gen(engine, [PROMPT], temperature=0.0, max_tokens=2)
    engine.update_weights(full_update(engine.llm.hf))
    gen(engine, [PROMPT], temperature=0.0, max_tokens=2)


def test_sleep_level_must_be_1_or_2(monkeypatch):
    with pytest.raises(ValueError, match="sleep_level"):
        make(monkeypatch, sleep_level=3)


def test_the_trainers_sync_does_not_wake_the_kv_cache_before_loading(monkeypatch):
    """WeightSync.after_update used to call pool.wake_up() (every tag) before sending the weights."""
    from ctu.distributed.pool import LocalPool
    from ctu.train.sync import WeightSync
    from tests.unit.train.test_weight_version import StubGroup

    engine = make(monkeypatch, sleep_level=2, dtype="float32")
    group = StubGroup()
    pool = LocalPool(engine, chat=None, user=None, limits=None)
    config = load_config(None, ["engine.kind=vllm", "model.path=tiny-random", "model.dtype=float32",
                                "engine.weight_sync=merged"])
    sync = WeightSync(config, group, pool)
    sync.before_update()
    events = record(monkeypatch, engine.llm)
    sync.after_update(1)
    assert events[0] == ("wake_up", ["weights"]) and ("wake_up", None) not in events
    assert events.index(("wake_up", ["kv_cache"])) > events.index(("reload_weights", ["kv_cache"]))


def test_split_placement_engines_stay_awake_through_updates():
    """Split rollout workers have GPUs of their own: before_update must not sleep them (it did every step)."""
    from ctu.config.schema import engines_sleep, load_config
    from ctu.train.sync import WeightSync

    class Pool:
        slept = 0

        def sleep(self):
            self.slept += 1

    base = ["distributed.rollout_workers=2", "distributed.trainer_workers=2"]
    split = load_config(None, [*base, "distributed.placement=split"])
    colocated = load_config(None, base)
    assert not engines_sleep(split) and engines_sleep(colocated)
    assert engines_sleep(load_config(None, [])) and not engines_sleep(load_config(None, ["engine.colocated=false"]))
    for config, slept in ((split, 0), (colocated, 1)):
        pool = Pool()
        WeightSync(config, object(), pool).before_update()
        assert pool.slept == slept
