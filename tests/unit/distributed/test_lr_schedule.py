"""The RL learning rate's schedule (``trainer.schedule``, ``trainer.warmup_steps``): a linear warmup, then constant or a
cosine decay over the run's updates; the scheduler follows it per optimizer step, and the ``lr`` a step reports is
the one its update used."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ctu.config.schema import load_config
from ctu.distributed.group import build_optimizer, lr_schedule


def cfg(**overrides):
    return load_config(None, [f"trainer.{k}={v}" for k, v in overrides.items()]).trainer


@given(st.integers(0, 5), st.integers(1, 40), st.sampled_from(["constant", "cosine"]))
def test_warmup_ramps_linearly_then_the_schedule(warmup, after, schedule):
    total = warmup + after
    f = lr_schedule(cfg(warmup_steps=warmup, schedule=schedule), total)
    factors = [f(u) for u in range(total)]
    assert factors[:warmup] == pytest.approx([(u + 1) / warmup for u in range(warmup)])
    assert factors[warmup] == pytest.approx(1.0)
    assert all(0.0 <= x <= 1.0 for x in factors)
    tail = factors[warmup:]
    if schedule == "constant":
        assert tail == pytest.approx([1.0] * after)
    else:
        assert all(b <= a for a, b in zip(tail, tail[1:], strict=False))
        assert tail[-1] == pytest.approx(0.5 * (1 + math.cos(math.pi * (after - 1) / after)))


def test_the_scheduler_follows_it_per_optimizer_step():
    model = torch.nn.Linear(2, 2)

    class Policy:
        def trainable_parameters(self):
            return list(model.parameters())

    t = cfg(lr=1e-3, max_steps=5, warmup_steps=1, schedule="cosine")
    optimizer, scheduler = build_optimizer(Policy(), t)
    f = lr_schedule(t, 5)
    seen = []
    for _ in range(5):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx([1e-3 * f(u) for u in range(5)])


def test_a_step_reports_the_lr_its_update_used():
    """``lr`` in metrics.jsonl was the scheduler's rate *after* the step (the next update's): under a decay every
    step's figure was one step ahead."""
    from ctu.distributed.group import LocalTrainer
    from tests.unit.train.test_update_semantics import samples

    config = load_config(None, ["model.path=tiny-random", "model.dtype=float32", "trainer.lr=1e-3",
                                "trainer.max_steps=3", "trainer.warmup_steps=0", "trainer.schedule=cosine",
                                "trainer.micro_batch_tokens=4096"])
    trainer = LocalTrainer(config, device="cpu")
    f = lr_schedule(config.trainer, 3)
    reported = [trainer.update(samples(seed=s, n=4), 1.0, seed=s)["lr"] for s in range(3)]
    assert reported == pytest.approx([1e-3 * f(u) for u in range(3)])  # 1.0, 0.75, 0.25 of 1e-3
