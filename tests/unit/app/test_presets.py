"""Presets that start: every GPU command README.md, docs/ and the presets' headers give passes config validation and the
memory plan on the hardware it is for; ``ctu train`` plans the GPUs a run uses, not every GPU it can see."""

import re
import shlex
from pathlib import Path

import pytest

from ctu.app.plan import CUDA_CONTEXT, VLLM_CUDA_GRAPHS, check_fits, layout, plan
from ctu.config.schema import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = ROOT / "configs"
GPU_PRESETS = sorted(p.name for p in CONFIGS.glob("qwen*.yaml"))


def commands(text: str, comment: bool = False) -> list[list[str]]:
    """``ctu train|plan configs/qwen...`` commands in ``text`` (README and docs code blocks, or ``# command:`` header
    lines), continuation lines joined, as argument lists without the leading ``ctu``."""
    if comment:
        text = "\n".join(ln.split("command:", 1)[1] for ln in text.splitlines() if ln.startswith("# command:"))
    text = text.replace("\\\n", " ")
    return [shlex.split(ln.strip())[1:] for ln in text.splitlines() if re.match(r"\s*ctu (train|plan) configs/qwen", ln)]


def named_memory(preset: str) -> float:
    """The GiB per GPU the preset's ``# hardware:`` line names first ("4x79 GiB" -> 79)."""
    found = re.search(r"# hardware: \d+x(\d+(?:\.\d+)?) GiB", (CONFIGS / preset).read_text())
    assert found, f"{preset} names no hardware"
    return float(found.group(1))


def docs_text() -> str:
    return "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])


def all_commands() -> list[list[str]]:
    out = commands(docs_text())
    for preset in GPU_PRESETS:
        out += commands((CONFIGS / preset).read_text(), comment=True)
    return out


def split(args: list[str]) -> tuple[str, list[str], int | None, float | None]:
    """(preset file name, overrides, --gpus, --gpu-memory) of one command."""
    preset, rest, gpus, memory, overrides = Path(args[1]).name, args[2:], None, None, []
    while rest:
        head = rest.pop(0)
        if head == "--gpus":
            gpus = int(rest.pop(0))
        elif head == "--gpu-memory":
            memory = float(rest.pop(0))
        else:
            overrides.append(head)
    return preset, overrides, gpus, memory


def test_readme_and_every_gpu_preset_give_commands():
    found = {split(c)[0] for c in all_commands()}
    assert len(commands(docs_text())) >= 4
    assert set(GPU_PRESETS) <= found, f"presets without a command: {set(GPU_PRESETS) - found}"


@pytest.mark.parametrize("args", all_commands(), ids=lambda a: " ".join(a))
def test_every_command_validates_and_fits_the_hardware_it_is_for(args, tmp_path):
    preset, overrides, gpus, memory = split(args)
    config = load_config(CONFIGS / preset, [*overrides, f"run.dir={tmp_path / 'run'}"])  # raises on a bad config
    result = plan(config, gpus, memory or named_memory(preset))
    assert result.fits, (args, result.render())
    if args[0] == "train":  # what `ctu train` checks on CUDA before loading anything
        assert check_fits(config, None, memory or named_memory(preset)).fits


def test_vllm_rollout_workers_need_trainer_ranks_for_their_gpus():
    with pytest.raises(ConfigError, match="distributed.trainer_workers >= 1"):
        load_config(CONFIGS / "qwen3-4b-lora.yaml", ["distributed.rollout_workers=2"])
    with pytest.raises(ConfigError, match="engine.weight_sync=merged"):
        load_config(CONFIGS / "qwen3-4b-lora.yaml", ["distributed.rollout_workers=1", "distributed.trainer_workers=1",
                                                     "engine.weight_sync=adapter"])


def test_layout_counts_the_gpus_a_run_uses():
    seven = CONFIGS / "qwen2.5-7b-multidomain.yaml"
    assert layout(load_config(seven)).needed == 1  # in process: one GPU whatever the machine has
    colocated = layout(load_config(seven, ["distributed.trainer_workers=8", "distributed.rollout_workers=8"]))
    assert (colocated.ranks, colocated.engines, colocated.needed) == (8, 1, 8)
    two_each = layout(load_config(seven, ["distributed.trainer_workers=2", "distributed.rollout_workers=4"]))
    assert (two_each.ranks, two_each.engines) == (2, 2)
    apart = layout(load_config(seven, ["distributed.trainer_workers=16", "distributed.rollout_workers=8",
                                       "distributed.placement=split"]))
    assert (apart.ranks, apart.engines, apart.engine_gpus, apart.needed) == (16, 0, 8, 24)
    short = plan(load_config(seven, ["distributed.trainer_workers=16", "distributed.rollout_workers=8",
                                     "distributed.placement=split"]), 16, 79.0)
    assert not short.fits and "need 24 GPUs, 16 given" in short.problems[0]


def test_two_vllm_engines_on_one_gpu_count_twice():
    seven = CONFIGS / "qwen2.5-7b-multidomain.yaml"
    one = plan(load_config(seven, ["distributed.trainer_workers=4", "distributed.rollout_workers=4"]), None, 79.0)
    two = plan(load_config(seven, ["distributed.trainer_workers=4", "distributed.rollout_workers=8"]), None, 79.0)
    engine = (0.4 * 79 * 2**30 + VLLM_CUDA_GRAPHS) * 1.05 + CUDA_CONTEXT  # its fraction, graphs, own process's context
    assert two.rollout_total - one.rollout_total == pytest.approx(engine, rel=0.01)


def test_train_plans_one_gpu_in_process_whatever_the_machine_has(tmp_path, monkeypatch):
    """The 7B preset needs ~169 GiB on one GPU: an in-process run on a machine with 8 x 80 GB GPUs still uses one
    of them, so ``ctu train`` must refuse it before loading anything (it planned 8-way sharding)."""
    import ctu.app.plan
    from ctu.app.trainer import Trainer

    monkeypatch.setattr(ctu.app.plan, "cuda_hardware", lambda: (8, 79.2))
    config = load_config(CONFIGS / "qwen2.5-7b-multidomain.yaml", [f"run.dir={tmp_path / 'run'}"])
    with pytest.raises(ValueError, match=r"does not fit on 1 x 79.2 GiB.*distributed.trainer_workers=N"):
        Trainer(config)
    assert not (tmp_path / "run").exists()
    sharded = load_config(CONFIGS / "qwen2.5-7b-multidomain.yaml", ["distributed.trainer_workers=8",
                                                                    "distributed.rollout_workers=8"])
    assert check_fits(sharded, None, 79.2).gpus == 8
