"""ctu.app.plan's export phase: at the end of a run (ctu/app/trainer.py ``_run``) the merged model is exported after the
final evaluation, with the engine still awake (the pool closes after the export). Each GPU holds the rollout
phase's memory plus the export's transient: one fp32 merge or cast in one process (``ctu.train.weights.export``),
the gathered fp32 stream on every rank of a sharded policy (``TrainerRank.export``, plus the fp32 adapter rank 0
keeps). Rank 0 (or the one process) writes one fp32 model of the full size from host RAM."""

from ctu.app.plan import GiB, _module_shapes, parameter_count, plan, resolve_arch
from ctu.app.plan_terms import VLLM_CUDA_GRAPHS, stream_peak, sync_units
from ctu.config.schema import load_config
from tests.support.plan_helpers import QWEN3_8B, RAY8, SEVEN_B, THREE_B, overhead, part


def test_an_in_process_lora_export_casts_the_embedding_to_fp32_beside_the_awake_engine():
    """merged_named_tensors(dtype=float32): a merged module is an fp32 copy of the base plus the fp32 delta (the
    fp32 result is that copy); an unmerged bf16 weight is cast to fp32, the largest being the embedding (4 V h)."""
    config = load_config(QWEN3_8B)
    a = resolve_arch(config.model.path)
    result = plan(config, 1, 79.2)
    largest = max(i * o for t, (i, o) in _module_shapes(a).items() if t in config.lora.target_modules)
    assert part(result, "export") == max(8 * largest, 4 * a.vocab * a.hidden) == 4 * a.vocab * a.hidden
    persistent = sum(part(result, k) for k in ("weights (base", "weights (LoRA", "optimizer"))
    engine = int(0.45 * 79.2 * GiB) + VLLM_CUDA_GRAPHS  # awake: the final evaluation ran, the pool closes later
    assert result.export_total == overhead(persistent + engine + part(result, "export"))
    assert result.total >= result.export_total > result.rollout_total


def test_full_fine_tuning_in_one_process_exports_its_fp32_masters_without_a_gpu_copy():
    result = plan(load_config(THREE_B), 1, 139.0)
    assert not any(k.startswith("export") for k in result.parts)
    assert result.export_total == result.rollout_total


def test_a_sharded_export_streams_gathered_fp32_units_on_every_rank():
    full = plan(load_config(SEVEN_B, RAY8), None, 79.0)
    a = resolve_arch(load_config(SEVEN_B).model.path)
    assert part(full, "export") == stream_peak(sync_units(a, 2), 4)  # fp32 masters gathered, fp32 clones out
    assert part(full, "export") > part(full, "weight sync")  # the sync sends bf16
    workers = 2  # the trainer rank's context and the rollout worker's
    persistent = sum(part(full, k) for k in ("weights (fp32", "reference", "optimizer"))
    engine = int(0.4 * 79.0 * GiB) + VLLM_CUDA_GRAPHS
    assert full.export_total == overhead(persistent + engine + part(full, "export"), workers)
    config = load_config(QWEN3_8B, RAY8)
    lora = plan(config, None, 79.0)
    units = sync_units(resolve_arch(config.model.path), 2, config.lora.rank, tuple(config.lora.target_modules))
    assert part(lora, "export") == stream_peak(units, 4) + 4 * lora.trainable  # rank 0 keeps the fp32 adapter


def test_rank_0_writes_one_fp32_model_from_host_ram():
    for config, gpus in ((load_config(QWEN3_8B), 1), (load_config(SEVEN_B, RAY8), None)):
        a = resolve_arch(config.model.path)
        result = plan(config, gpus, 79.0)
        # from_pretrained(dtype=float32), and one streamed tensor's host copy (the largest: the embedding)
        assert result.host_export == 4 * parameter_count(a) + 4 * a.vocab * a.hidden
        assert "export phase (peak)" in result.render() and "host (CPU) RAM for the export" in result.render()
    off = plan(load_config(QWEN3_8B, ["trainer.export=false"]), 1, 79.0)
    assert off.host_export == 0 and off.export_total == 0 and not any(k.startswith("export") for k in off.parts)


def test_the_export_phase_can_be_what_does_not_fit():
    config = load_config(SEVEN_B, [*RAY8, "engine.gpu_memory_utilization=0.6"])
    only_export = []
    for tenths in range(500, 1000):
        result = plan(config, None, tenths / 10)
        if result.problems and all(p.startswith("export phase") for p in result.problems):
            only_export.append(result)
    assert only_export
    assert all(r.export_total > r.gpu_memory >= max(r.rollout_total, r.train_total, r.sync_total) for r in only_export)
