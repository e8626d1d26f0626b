"""ctu.app.plan counts what the weight sync and autocast add: the sync's transient (one module's merge, the gathered
stream, or the adapter) beside the engine in the state the code leaves it in while that transient lives (a merged
sync in one process loads into the woken weights with the KV cache still asleep; Ray ranks gather and pack before
any engine wakes; an adapter is written to host before the wake; an engine that never sleeps is awake);
autocast's bf16 casts of fp32 weights add to the training forward; vLLM's LoRA slots come out of its fraction."""

import pytest

from ctu.app.plan import GiB, _module_shapes, lora_parameter_count, main, plan, resolve_arch
from ctu.app.plan_terms import VLLM_CUDA_GRAPHS
from ctu.config.schema import load_config
from tests.support.plan_helpers import QWEN3_8B, RAY8, SEVEN_B, THREE_B, overhead, part


def test_a_merged_lora_sync_holds_one_module_merge_beside_the_engine_weights_with_its_kv_cache_asleep():
    """VLLMEngine.update_weights: wake_up(["weights"]), reload_weights from the stream, then wake_up(["kv_cache"]):
    while the merges are alive the engine holds its bf16 weights and CUDA graphs, not its whole fraction."""
    config = load_config(QWEN3_8B, ["engine.weight_sync=merged"])
    result = plan(config, 1, 79.2)
    a = resolve_arch(config.model.path)
    largest = max(i * o for t, (i, o) in _module_shapes(a).items() if t in config.lora.target_modules)
    assert part(result, "weight sync") == (4 + 4 + 2) * largest  # fp32 base copy + fp32 delta + bf16 result
    persistent = sum(part(result, k) for k in ("weights (base", "weights (LoRA", "optimizer"))
    engine = part(result, "vLLM weights") + VLLM_CUDA_GRAPHS
    assert result.sync_total == overhead(persistent + engine + part(result, "weight sync"))
    assert result.sync_total < result.rollout_total and result.total >= result.sync_total


def test_ray_ranks_gather_and_pack_the_weights_before_the_engines_wake():
    """RayTrainerGroup.merged_weights gathers on every rank and packs to the object store (host) before
    pool.update_weights wakes any engine: the stream's peak meets an engine that holds only its CUDA graphs."""
    result = plan(load_config(SEVEN_B, RAY8), None, 79.0)
    persistent = sum(part(result, k) for k in ("weights (fp32", "reference", "optimizer"))
    raw = persistent + VLLM_CUDA_GRAPHS + part(result, "weight sync")
    assert result.sync_total == overhead(raw, contexts=2)  # the trainer rank's and the rollout worker's contexts


def test_an_adapter_is_written_to_host_before_the_engine_wakes():
    """VLLMEngine.update_adapter writes the adapter (``.cpu()``) before wake_up(["weights"]), ["kv_cache"]."""
    result = plan(load_config(QWEN3_8B), 1, 79.2)
    persistent = sum(part(result, k) for k in ("weights (base", "weights (LoRA", "optimizer"))
    assert result.sync_total == overhead(persistent + VLLM_CUDA_GRAPHS + part(result, "weight sync"))
    assert result.sync_total < result.rollout_total


def test_an_engine_that_does_not_sleep_is_awake_through_the_sync():
    result = plan(load_config(QWEN3_8B, ["engine.weight_sync=merged", "engine.colocated=false"]), 1, 79.2)
    persistent = sum(part(result, k) for k in ("weights (base", "weights (LoRA", "optimizer"))
    engine = int(0.45 * 79.2 * GiB) + VLLM_CUDA_GRAPHS
    assert result.sync_total == overhead(persistent + engine + part(result, "weight sync")) > result.rollout_total


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
    """An engine that stays awake (engine.colocated=false) meets the merge; a tiny adapter and micro-batch keep the
    training phase (which also holds the awake engine) below it."""
    config = load_config(QWEN3_8B, ["engine.weight_sync=merged", "engine.colocated=false", "trainer.export=false",
                                    "lora.rank=8", "lora.target_modules=[gate_proj]", "trainer.micro_batch_tokens=64",
                                    "env.max_context_tokens=64", "sampling.max_tokens=16",
                                    "engine.gpu_memory_utilization=0.7"])  # small training
    only_sync = []
    for tenths in range(200, 800):  # the rollout and training fit, the sync (rollout + one merge) does not
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


def test_a_launched_server_keeps_lora_slots_for_every_adapter_version_it_holds():
    """served_setup launches vLLM with --max-loras engine.max_loras, or k + 1 (every version a step may train on
    with trainer.max_staleness=k): each slot is one adapter at lora.rank out of its fraction. The plan counted one."""
    served = ["engine.kind=served", "engine.launch=true", "engine.colocated=false"]
    one = plan(load_config(QWEN3_8B, served), 1, 79.2)
    async2 = plan(load_config(QWEN3_8B, [*served, "trainer.max_staleness=2", "trainer.tis_cap=2.0"]), 1, 79.2)
    four = plan(load_config(QWEN3_8B, [*served, "engine.max_loras=4"]), 1, 79.2)
    slot = part(one, "vLLM LoRA slots")
    assert part(async2, "vLLM LoRA slots") == 3 * slot and part(four, "vLLM LoRA slots") == 4 * slot
    assert async2.parts["vLLM KV cache"] == one.parts["vLLM KV cache"] - 2 * slot
    in_process = plan(load_config(QWEN3_8B, ["trainer.max_staleness=2", "trainer.tis_cap=2.0"]), 1, 79.2)
    assert part(in_process, "vLLM LoRA slots") == slot  # the in-process engine's LLM keeps vLLM's max_loras=1
