"""ctu.plan counts what the weight sync and autocast add: the sync runs with the engine awake, so its transient
(one module's merge, or the adapter) adds to the rollout phase's memory; autocast's bf16 casts of fp32 weights add
to the training forward; vLLM's LoRA slots come out of its fraction."""

from pathlib import Path

import pytest

from ctu.config import load_config
from ctu.plan import _module_shapes, lora_parameter_count, main, plan, resolve_arch

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
QWEN3_8B = str(CONFIGS / "qwen3-8b-lora.yaml")
THREE_B = str(CONFIGS / "qwen2.5-3b-retail.yaml")


def part(result, prefix):
    hits = [v for k, v in result.parts.items() if k.startswith(prefix)]
    assert len(hits) == 1, (prefix, list(result.parts))
    return hits[0]


def test_a_merged_lora_sync_holds_one_module_merge_beside_the_awake_engine():
    config = load_config(QWEN3_8B, ["engine.weight_sync=merged"])
    result = plan(config, 1, 79.2)
    a = resolve_arch(config.model.path)
    largest = max(i * o for t, (i, o) in _module_shapes(a).items() if t in config.lora.target_modules)
    assert part(result, "weight sync") == (4 + 4 + 2) * largest  # fp32 base copy + fp32 delta + bf16 result
    assert result.sync_total > result.rollout_total  # the engine is awake while the weights arrive
    assert result.total >= result.sync_total


def test_an_adapter_sync_sends_the_fp32_adapter_and_vllm_keeps_lora_slots():
    config = load_config(QWEN3_8B)  # the preset's default sync: the adapter
    result = plan(config, 1, 79.2)
    trainable = lora_parameter_count(resolve_arch(config.model.path), config.lora.rank, config.lora.target_modules)
    assert part(result, "weight sync") == 4 * trainable
    assert part(result, "vLLM LoRA slots") == 2 * trainable
    merged = plan(load_config(QWEN3_8B, ["engine.weight_sync=merged"]), 1, 79.2)
    assert "vLLM LoRA slots (bf16)" not in merged.parts
    assert result.parts["vLLM KV cache"] == merged.parts["vLLM KV cache"] - 2 * trainable


def test_the_sync_phase_can_be_what_does_not_fit():
    config = load_config(QWEN3_8B, ["engine.weight_sync=merged", "trainer.micro_batch_tokens=2048",
                                    "env.max_context_tokens=2048", "engine.gpu_memory_utilization=0.7"])  # small training
    only_sync = []
    for tenths in range(200, 800):  # the rollout fits, the sync (rollout + one merge) does not
        result = plan(config, 1, tenths / 10)
        if result.problems and all(p.startswith("weight sync phase") for p in result.problems):
            only_sync.append(result)
    assert only_sync and all(r.sync_total > r.gpu_memory >= max(r.rollout_total, r.train_total) for r in only_sync)


def test_autocast_casts_of_fp32_weights_count_in_one_process_full_fine_tuning():
    result = plan(load_config(THREE_B), 1, 139.8)
    a = resolve_arch(load_config(THREE_B).model.path)
    assert part(result, "autocast") == 2 * a.vocab * a.hidden  # no cast cache: one cast at a time (lm_head)
    saved = plan(load_config(THREE_B, ["trainer.gradient_checkpointing=false"]), 1, 139.8)
    assert part(saved, "autocast") == 2 * saved.trainable  # without checkpointing backward saves every cast
    sharded = plan(load_config(THREE_B), 2, 79.2)  # FSDP2 casts through its gather buffers instead
    assert not any(k.startswith("autocast") for k in sharded.parts)


def test_the_render_shows_the_sync_phase(capsys):
    assert main([QWEN3_8B, "--gpu-memory", "79.2"]) == 0
    out = capsys.readouterr().out
    assert "weight sync phase (peak)" in out and "empty_cache" in out


@pytest.mark.parametrize("device", ["cpu"])
def test_no_sync_transient_when_the_hf_engine_shares_the_policy(device):
    result = plan(load_config(None, ["engine.kind=hf"]), 1, 16.0, device=device)
    assert not any(k.startswith("weight sync") for k in result.parts)
