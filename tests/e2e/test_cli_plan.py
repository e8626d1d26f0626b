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
