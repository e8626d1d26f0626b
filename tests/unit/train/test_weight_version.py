"""The weight-version stamp: every sync records the policy version on the engine once its load completed, and the
check after the parity probe compares it with the trainer's. In bf16 a probe cannot see a stale sync at the
presets' learning rates (a step moves logits far less than the tolerance); the stamp can. Here a sync is dropped
while the trainer's weights stay put, so the logprobs still agree and only the version can fail the check."""

import pytest
import torch

from ctu.config.schema import load_config
from ctu.distributed.pool import LocalPool
from ctu.engines.checks.parity import ParityError, probe_parity
from ctu.train.policy import token_logprobs
from ctu.train.sync import WeightSync, adapter_named_tensors, base_named_tensors, parity_tolerance
from tests.unit.engines.vllm.test_engine_vllm import make


class StubGroup:
    """The trainer side of a sync (:class:`ctu.distributed.group.TrainerGroup`'s sync methods) around one model."""

    def __init__(self, model=None, lora_rank: int | None = None):
        from ctu.engines.hf.models import load_model

        model = load_model("tiny-random") if model is None else model
        if lora_rank:
            from peft import LoraConfig, get_peft_model

            torch.manual_seed(0)
            model = get_peft_model(model, LoraConfig(r=lora_rank, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                     init_lora_weights=False))
        self.model = model.eval()

    def release_memory(self):
        pass

    def merged_weights(self):
        return ((n, p.detach()) for n, p in self.model.named_parameters())

    def base_weights(self):
        return base_named_tensors(self.model)

    def adapter_weights(self):
        return adapter_named_tensors(self.model)

    def score(self, ids, attn, temperature):
        return token_logprobs(self.model, ids, attn, temperature)[0]


def config_for(*extra):
    return load_config(None, ["model.path=tiny-random", "model.dtype=float32", *extra])


def drop_syncs(monkeypatch, pool):
    """The bug under test: a pool that takes a sync and loads nothing."""
    monkeypatch.setattr(pool, "update_weights", lambda named, version: None)
    monkeypatch.setattr(pool, "update_adapter", lambda named, version: None)


def assert_only_the_version_fails(monkeypatch, sync, pool, config):
    sync.before_update()
    sync.after_update(1)
    drop_syncs(monkeypatch, pool)
    diff = probe_parity(pool.engine, sync.group.score, temperature=config.sampling.temperature,
                        tokens=config.engine.parity_probe_tokens, seed=config.run.seed)
    assert diff <= parity_tolerance(config)  # the logprobs cannot tell: the trainer's weights did not move
    sync.before_update()
    with pytest.raises(ParityError, match=r"^engine weights are version 1, the trainer's are version 2") as info:
        sync.after_update(2)
    assert "\n" not in str(info.value) and pool.versions() == [1]


def test_check_versions_names_both_versions_on_one_line():
    from ctu.engines.checks.parity import check_versions

    check_versions([4, 4], 4)
    with pytest.raises(ParityError, match=r"^engine weights are version 3, the trainer's are version 4"):
        check_versions([4, 3], 4)
    with pytest.raises(ParityError, match="version None"):  # never synced, or discarded by a level-2 sleep
        check_versions([None], 0)


@pytest.mark.parametrize("colocated", ["true", "false"])
def test_a_dropped_merged_sync_on_vllm_fails_on_the_version(monkeypatch, colocated):
    config = config_for("engine.kind=vllm", "engine.weight_sync=merged", f"engine.colocated={colocated}")
    engine = make(monkeypatch, dtype="float32")  # level 1: a dropped sync keeps the old (still right) weights
    pool = LocalPool(engine, chat=None, user=None, limits=None)
    assert_only_the_version_fails(monkeypatch, WeightSync(config, StubGroup(), pool), pool, config)


def test_a_dropped_adapter_sync_on_vllm_fails_on_the_version(monkeypatch):
    config = config_for("engine.kind=vllm", "engine.weight_sync=adapter", "lora.rank=8", "lora.alpha=8")
    engine = make(monkeypatch, dtype="float32", enable_lora=True, max_lora_rank=8, lora_alpha=8)
    pool = LocalPool(engine, chat=None, user=None, limits=None)
    assert_only_the_version_fails(monkeypatch, WeightSync(config, StubGroup(lora_rank=8), pool), pool, config)
    assert engine.lora_request.lora_name == "ctu-v1"  # the stamp is the adapter's name / id per version


def test_a_dropped_sync_to_a_separate_hf_engine_fails_on_the_version(monkeypatch):
    from ctu.engines.hf.engine import HFEngine
    from ctu.engines.hf.models import load_model, load_tokenizer

    config = config_for("engine.kind=hf")
    engine = HFEngine(load_model("tiny-random"), load_tokenizer("tiny-random"))
    pool = LocalPool(engine, chat=None, user=None, limits=None)
    sync = WeightSync(config, StubGroup(), pool)
    assert not sync.shares_model
    assert_only_the_version_fails(monkeypatch, sync, pool, config)


def test_an_hf_engine_sharing_the_trainers_model_is_stamped_by_the_sync():
    from ctu.engines.hf.engine import HFEngine
    from ctu.engines.hf.models import load_tokenizer

    group = StubGroup()
    engine = HFEngine(group.model, load_tokenizer("tiny-random"))
    pool = LocalPool(engine, chat=None, user=None, limits=None)
    sync = WeightSync(config_for("engine.kind=hf"), group, pool)
    assert sync.shares_model
    sync.after_update(3)
    assert engine.weights_version == 3


def test_the_vllm_stamp_is_set_when_the_load_completes_and_lost_with_discarded_weights(monkeypatch):
    engine = make(monkeypatch, sleep_level=2)
    weights = [(n, p.detach().clone()) for n, p in engine.llm.hf.named_parameters()]
    assert engine.weights_version is None
    engine.update_weights(weights, version=5)
    assert engine.weights_version == 5
    engine.sleep()  # level 2: the weights are gone
    assert engine.weights_version is None
    with pytest.raises(ValueError, match="PEFT"):
        engine.update_weights(weights[:1] + [("base_model.model.x.lora_A.weight", torch.zeros(1))], version=6)
    assert engine.weights_version is None  # a load that failed stamps nothing


def test_a_version_is_never_sent_twice():
    """A version names one set of weights: engines that hold a version skip (Ray workers) or refuse (vLLM adapters)
    it again, so a sync of new weights under a version already sent (the warm start after the setup's version 0)
    stops in one line before anything is sent."""
    from ctu.engines.hf.engine import HFEngine
    from ctu.engines.hf.models import load_model, load_tokenizer

    engine = HFEngine(load_model("tiny-random"), load_tokenizer("tiny-random"))
    pool = LocalPool(engine, chat=None, user=None, limits=None)
    sync = WeightSync(config_for("engine.kind=hf"), StubGroup(), pool)
    sync.after_update(0)
    sent = []
    pool.update_weights = lambda named, version: sent.append(version)
    with pytest.raises(RuntimeError, match=r"^weight sync: version 0 sent after version 0; each sync needs a newer"):
        sync.after_update(0)
    assert sent == []
