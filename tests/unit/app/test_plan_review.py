"""ctu.app.plan counts what the GPU review (issue 30, item 8) found missing: the whole FSDP unit a sharded LoRA sync
holds, vLLM's batched-token default on >= 70 GiB GPUs, its CUDA graphs and a Ray worker's own CUDA context outside
its fraction, gradients freed before rollouts, host RAM pinned by sleep level 1 (none at level 2), and split
placement without sleep/wake (its engine GPU checked on its own)."""

import json

from ctu.app.plan import CUDA_CONTEXT, FRAGMENTATION, GiB, _module_shapes, parameter_count, plan, resolve_arch
from ctu.app.plan_terms import VLLM_CUDA_GRAPHS
from ctu.config.schema import load_config
from tests.support.plan_helpers import QWEN3_8B, RAY8, SEVEN_B, THREE_B, part


def test_a_sharded_lora_sync_holds_the_gathered_root_and_its_bf16_clone_on_every_rank():
    """ctu.distributed.fsdp.gathered_named_tensors, every rank: the root unit (embedding, final norm, lm_head) is
    gathered in bf16 and each tensor cloned into ``out`` (a bf16 no-op cast shares storage): 2 x 2 bytes x root."""
    config = load_config(QWEN3_8B, RAY8)  # Ray rollout workers: the sync is merged
    a = resolve_arch(config.model.path)
    root = a.vocab * a.hidden * 2 + a.hidden  # untied embedding + lm_head, final norm
    result = plan(config, None, 79.0)
    assert part(result, "weight sync") == 2 * 2 * root  # 4.98e9 bytes at 8B (the old plan said 2.99e9)


def test_a_sharded_lora_sync_of_a_small_vocabulary_holds_two_layers_deltas_and_clones(tmp_path):
    """Where a decoder layer outweighs the root, the peak is the gather of layer k+1 while layer k's gathered
    weights (``params``), fp32 deltas (``deltas``) and bf16 results (``out``) are still referenced."""
    shape = {"model_type": "qwen2", "hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8,
             "num_key_value_heads": 2, "intermediate_size": 2048, "vocab_size": 256, "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(shape))
    config = load_config(QWEN3_8B, [f"model.path={tmp_path}", *RAY8])
    a = resolve_arch(str(tmp_path))
    layer = (parameter_count(a) - a.vocab * a.hidden - a.hidden) // a.layers
    adapted = sum(i * o for t, (i, o) in _module_shapes(a).items() if t in config.lora.target_modules)
    lora = sum(config.lora.rank * (i + o) for t, (i, o) in _module_shapes(a).items() if t in config.lora.target_modules)
    gathered, deltas, clones = 2 * layer + 4 * lora, 4 * adapted, 2 * layer
    assert part(plan(config, None, 79.0), "weight sync") == 2 * gathered + deltas + clones


def test_vllm_profiles_16384_batched_tokens_on_gpus_of_70_gib_or_more():
    """vllm/engine/arg_utils.py: the LLM class defaults max_num_batched_tokens to 16384 where the device has
    >= 70 GiB and is not an A100, 8192 elsewhere."""
    a = resolve_arch(load_config(QWEN3_8B).model.path)
    mlp = (4 * a.intermediate + 4 * a.hidden) * 2
    assert part(plan(load_config(QWEN3_8B), 1, 79.2), "vLLM profiling peak") == GiB + 16384 * mlp
    assert part(plan(load_config(QWEN3_8B), 1, 44.0), "vLLM profiling peak") == GiB + 8192 * mlp


def test_vllm_cuda_graphs_count_outside_its_fraction_awake_and_asleep():
    result = plan(load_config(QWEN3_8B), 1, 79.2)
    assert part(result, "vLLM CUDA graphs") == VLLM_CUDA_GRAPHS
    awake = plan(load_config(QWEN3_8B, ["engine.colocated=false"]), 1, 79.2)
    fraction = int(0.45 * 79.2 * GiB)
    overhead = lambda x: int(x * (1 + FRAGMENTATION)) + CUDA_CONTEXT  # noqa: E731
    persistent = (part(result, "weights (base") + part(result, "weights (LoRA") + part(result, "optimizer"))
    assert result.rollout_total == overhead(persistent + fraction + VLLM_CUDA_GRAPHS)
    assert abs(awake.train_total - result.train_total - int(fraction * (1 + FRAGMENTATION))) <= 1  # asleep: graphs only


def test_gradients_are_freed_after_the_step_and_do_not_meet_the_engine():
    result = plan(load_config(THREE_B), 1, 139.0)
    persistent = sum(part(result, k) for k in ("weights (fp32", "reference", "optimizer"))
    engine = int(0.45 * 139.0 * GiB) + VLLM_CUDA_GRAPHS
    assert result.rollout_total == int((persistent + engine) * (1 + FRAGMENTATION)) + CUDA_CONTEXT
    assert result.train_total > result.rollout_total - engine  # they still count while training


def test_ray_rollout_workers_bring_their_own_cuda_context_to_the_gpu_they_share():
    one = plan(load_config(SEVEN_B, RAY8), None, 79.0)
    assert part(one, "rollout workers' CUDA context") == CUDA_CONTEXT
    two = plan(load_config(SEVEN_B, ["distributed.trainer_workers=4", "distributed.rollout_workers=8"]), None, 79.0)
    assert part(two, "rollout workers' CUDA context") == 2 * CUDA_CONTEXT
    assert not any(k.startswith("rollout workers' CUDA") for k in plan(load_config(QWEN3_8B), 1, 79.0).parts)


def test_sleep_level_one_pins_the_engine_weights_in_host_ram_and_level_two_pins_nothing():
    adapter = plan(load_config(QWEN3_8B), 1, 79.2)  # LoRA adapter sync: level 1 keeps the base weights on the host
    assert adapter.host_pinned == 2 * adapter.parameters
    assert "host" in adapter.render() and "sleep level 1" in adapter.render()
    merged = plan(load_config(QWEN3_8B, ["engine.weight_sync=merged"]), 1, 79.2)
    assert merged.host_pinned == 0 and "sleep level 2" in merged.render()
    assert plan(load_config(SEVEN_B, RAY8), None, 79.0).host_pinned == 0  # merged over Ray: level 2


def test_split_placement_has_no_sleep_or_wake_and_checks_its_engine_gpu():
    split = ["distributed.trainer_workers=16", "distributed.rollout_workers=8", "distributed.placement=split"]
    result = plan(load_config(SEVEN_B, split), None, 79.0)
    assert result.fits and result.host_pinned == 0
    assert not any("asleep" in k or "CUDA graphs" in k for k in result.parts)  # the trainer GPUs hold no engine
    assert any("split placement" in n and "no sleep" in n for n in result.notes)
    full = plan(load_config(SEVEN_B, [*split, "engine.gpu_memory_utilization=0.99"]), None, 79.0)
    assert any(p.startswith("split rollout GPU") for p in full.problems)  # 0.99 x 79 + graphs + context > 79
