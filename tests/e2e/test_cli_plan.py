"""`ctu plan` prints every preset's plan; the 7B preset is refused on one GPU and fits the hardware it names."""

import re
from pathlib import Path

import pytest

from ctu.app.cli import main

PRESETS = sorted(Path("configs").glob("*.yaml"))


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
def test_every_preset_prints_a_plan_that_fits_its_named_hardware(preset, capsys):
    text = preset.read_text()
    named = re.search(r"hardware:.*?(\d+)\s*x\s*(\d+)\s*GiB", text)
    args = ["plan", str(preset)] + (["--gpus", named.group(1), "--gpu-memory", named.group(2)] if named else [])
    assert main(args) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "weights" in out and "fits" in out


def test_the_7b_preset_is_refused_on_one_gpu(capsys):
    assert main(["plan", "configs/qwen2.5-7b-multidomain.yaml", "--gpus", "1", "--gpu-memory", "79"]) == 1
    assert "DOES NOT FIT" in capsys.readouterr().out


def test_plan_says_when_a_retrieval_variant_cannot_fit_the_context(capsys, tau2_bench_data):
    assert main(["plan", "model.path=tiny-random", "env.domains=[banking_knowledge]",
                 f"env.tau2_data_dir={tau2_bench_data}", "env.retrieval_variant=full_kb",
                 "env.max_context_tokens=32768"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"note: domain banking_knowledge: system prompt and tools [\d,]+ tokens of "
                     r"env.max_context_tokens=32,768: episodes end at turn 0 and score 0", out), out
    assert main(["plan", "model.path=tiny-random", "env.domains=[banking_knowledge]",
                 f"env.tau2_data_dir={tau2_bench_data}", "env.max_context_tokens=32768"]) == 0
    assert "each KB_search answer (10 whole documents) adds about 5,000 more\n" in capsys.readouterr().out
