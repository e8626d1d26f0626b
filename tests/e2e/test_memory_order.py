"""Accelerator memory around a colocated vLLM engine (the fake of tests/fakes): the trainer hands its cached CUDA
memory back (``torch.cuda.empty_cache``) after every update and before the engine starts or wakes, because vLLM
allocates outside torch's caching allocator; and the warm start, like an update, runs with the engine asleep.

No GPU here: ``torch.cuda.empty_cache``/``is_initialized`` are recorded (the only stand-ins), everything else is the
production path."""

import torch

from tests.e2e.test_train import judge  # noqa: F401 - the autouse shaping-judge fixture
from tests.e2e.test_train_vllm_fake import vllm_config
from tests.fakes import fake_vllm


def recording(monkeypatch, events):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: events.append("empty_cache"))
    init, sleep, wake = fake_vllm.LLM.__init__, fake_vllm.LLM.sleep, fake_vllm.LLM.wake_up

    def on_init(self, *a, **k):
        events.append("engine_start")
        init(self, *a, **k)

    def on_sleep(self, *a, **k):
        events.append("sleep")
        return sleep(self, *a, **k)

    def on_wake(self, *a, **k):
        events.append("wake")
        return wake(self, *a, **k)

    monkeypatch.setattr(fake_vllm.LLM, "__init__", on_init)
    monkeypatch.setattr(fake_vllm.LLM, "sleep", on_sleep)
    monkeypatch.setattr(fake_vllm.LLM, "wake_up", on_wake)


def wrap(obj, name, events):
    inner = getattr(obj, name)

    def call(*a, **k):
        events.append(name)
        out = inner(*a, **k)
        events.append(f"{name}_done")
        return out

    setattr(obj, name, call)


def freed_before(events, what):
    """Every ``what`` comes after an ``empty_cache`` that follows the last trainer work before it."""
    for i, e in enumerate(events):
        if e != what:
            continue
        before = events[:i]
        work = [j for j, x in enumerate(before) if x in ("update_done", "sft_done", "build_done")]
        frees = [j for j, x in enumerate(before) if x == "empty_cache"]
        assert frees and (not work or frees[-1] > work[-1]), (what, i, events)


def test_trainer_frees_cached_memory_before_the_engine_starts_and_wakes(tmp_path, monkeypatch):
    from ctu.app import trainer as trainer_module
    from ctu.app.trainer import Trainer

    fake_vllm.install(monkeypatch)
    events: list[str] = []
    recording(monkeypatch, events)
    build = trainer_module.build_trainer_group

    def built(config):
        events.append("build")
        out = build(config)
        events.append("build_done")
        return out

    monkeypatch.setattr("ctu.app.trainer.build_trainer_group", built)
    trainer = Trainer(vllm_config(tmp_path / "run"))
    wrap(trainer.group, "update", events)
    wrap(trainer.group, "sft", events)
    trainer.warm_start()
    trainer.step = 1
    trainer.train_step()
    assert events.count("update") == 1 and events.count("sft") == 1 and "wake" in events
    freed_before(events, "engine_start")
    freed_before(events, "wake")


def test_the_warm_start_runs_with_a_colocated_engine_asleep(tmp_path, monkeypatch):
    from ctu.app.trainer import Trainer

    fake_vllm.install(monkeypatch)
    events: list[str] = []
    recording(monkeypatch, events)
    trainer = Trainer(vllm_config(tmp_path / "run"))
    wrap(trainer.group, "sft", events)
    trainer.warm_start()
    sft = events.index("sft")
    assert "sleep" in events[:sft] and events.index("wake") > events.index("sft_done"), events


def test_kl_in_the_reward_is_scored_with_a_colocated_engine_asleep(tmp_path, monkeypatch):
    """KL-in-reward scoring is trainer work: it runs inside the update's sleep (before_update), not beside an awake
    engine's KV cache and weights; the penalty it gives is the one the step records."""
    from ctu.app.trainer import Trainer

    fake_vllm.install(monkeypatch)
    trainer = Trainer(vllm_config(tmp_path / "run", "trainer.sft_steps=0", "trainer.kl_coef=0.5",
                                  "trainer.kl_in_reward=true"))
    llm = trainer.engine.llm
    seen, scored = [], []
    kl = trainer.group.kl

    def recorded(samples, temperature):
        seen.append(llm.sleep_level)
        out = kl(samples, temperature)
        scored.extend(out)
        return out

    trainer.group.kl = recorded
    trainer.step = 1
    metrics = trainer.train_step()["metrics"]
    assert seen and all(level is not None for level in seen), seen  # asleep while scoring
    assert llm.sleep_level is None  # awake again for the next rollouts
    assert abs(metrics["rollout"]["kl_penalty"] - 0.5 * sum(scored) / len(scored)) < 1e-12
