"""ctu's own transformers calls use the installed version's current API: building a training policy (LoRA,
gradient checkpointing), an update over episodes sharing a prompt, sharding it with FSDP2, and the hf engine's
generation (KV reuse, two turns; plain prefill) emit no DeprecationWarning or FutureWarning and no transformers
deprecation log line (``[transformers] `past_key_values`/`cache_params` are deprecated``)."""

import asyncio
import contextlib
import logging
import warnings

import pytest
import torch

from ctu.config.schema import load_config

TRAINING = ["model.path=tiny-random", "model.dtype=float32", "lora.enabled=true", "trainer.gradient_checkpointing=true"]


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "deprecat" in record.getMessage().lower():
            self.lines.append(f"[{record.name}] {record.getMessage()}")


@contextlib.contextmanager
def deprecations():
    """Every deprecation warned or logged inside the block, as text (transformers' once-only log cache cleared)."""
    once = getattr(logging.Logger, "warning_once", None)
    if hasattr(once, "cache_clear"):
        once.cache_clear()  # transformers logs each deprecation once per process: another test may have seen it
    handler, hf_log = _Records(), logging.getLogger("transformers")
    level = hf_log.level
    hf_log.addHandler(handler)
    hf_log.setLevel(logging.WARNING)
    found: list[str] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield found
    finally:
        hf_log.removeHandler(handler)
        hf_log.setLevel(level)
    found += handler.lines
    found += [f"{w.category.__name__} ({w.filename}:{w.lineno}): {w.message}" for w in caught
              if issubclass(w.category, (DeprecationWarning, FutureWarning))]


def samples():
    from ctu.train.update import to_sample

    prompt = list(range(20, 80))  # a shared prefix longer than the shared-prefix pass's minimum
    return [to_sample(prompt + [100 + i], [7 + i, 300 + i, 2, 41, 9, 12], [1] * 6, [-3.0] * 6, adv)
            for i, adv in enumerate((1.0, -1.0, 0.5, -0.5))]


def update(policy, config):
    from ctu.train.update import policy_update

    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    return policy_update(policy, opt, sched, samples(), config.trainer, temperature=1.0)


def test_building_and_updating_a_checkpointed_lora_policy_warns_no_deprecation():
    from ctu.train.policy import build_policy

    config = load_config(None, TRAINING)
    torch.manual_seed(0)
    with deprecations() as found:
        policy = build_policy(config, device="cpu")
        update(policy, config)
    assert found == []


@pytest.mark.parametrize("kv_reuse", [True, False])
def test_hf_generation_warns_no_deprecation(kv_reuse):
    from ctu.engines.base import SamplingParams
    from ctu.engines.hf.engine import HFEngine
    from ctu.engines.hf.models import load_model, load_tokenizer

    torch.manual_seed(0)
    engine = HFEngine(load_model("tiny-random"), load_tokenizer("tiny-random"), max_batch_size=4, kv_reuse=kv_reuse)
    system = list(range(30, 70))  # rows sharing a prompt prefix: the shared-prefix pass runs
    prompts = [system + [100 + i, 5, 6] for i in range(3)]
    params = SamplingParams(temperature=1.0, max_tokens=4, seed=1)
    with deprecations() as found:
        first = asyncio.run(engine.generate(prompts, params))
        nexts = [p + list(c[0].token_ids) + [9, 10] for p, c in zip(prompts, first, strict=True)]
        asyncio.run(engine.generate(nexts, params))  # the second turn: cached KV reused when kv_reuse
    assert found == []


def test_sharding_a_checkpointed_policy_warns_no_deprecation():
    from ctu.distributed.fsdp import make_reduce, shard_policy
    from ctu.train.policy import build_policy
    from tests.support.fsdp_helpers import single_process_group

    config = load_config(None, TRAINING)
    torch.manual_seed(0)
    with single_process_group("gloo"):
        policy = build_policy(config, device="cpu")
        with deprecations() as found:
            shard_policy(policy)
            from ctu.train.update import policy_update

            opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-3)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
            policy_update(policy, opt, sched, samples(), config.trainer, temperature=1.0, reduce=make_reduce())
    assert found == []


def test_older_transformers_get_the_names_they_have(monkeypatch):
    """transformers 4.57-5.1x have no ``activation_checkpointing_*`` and name the cache ``past_key_values``."""
    from ctu.engines.hf import hf_api
    calls = []

    class Old:
        def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
            calls.append(("enable", gradient_checkpointing_kwargs))

        def gradient_checkpointing_disable(self):
            calls.append(("disable", None))

    monkeypatch.setattr(hf_api, "_ACTIVATION", False)
    hf_api.enable_checkpointing(Old(), use_reentrant=False)
    hf_api.enable_checkpointing(Old())
    hf_api.disable_checkpointing(Old())
    assert calls == [("enable", {"use_reentrant": False}), ("enable", None), ("disable", None)]
    monkeypatch.setattr(hf_api, "CACHE", "past_key_values")

    class Output:
        past_key_values = "kv"

    assert hf_api.with_cache("kv") == {"past_key_values": "kv"} and hf_api.cache_of(Output()) == "kv"
