"""`ctu plan` with a GPU memory or count that is not a positive finite number: one line naming the flag."""

import pytest

from ctu.app.cli import main
from ctu.app.plan import plan
from ctu.config.schema import load_config


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-5", "0", "NaN"])
def test_bad_gpu_memory_is_one_line_naming_the_flag(value, capsys):
    assert main(["plan", "model.path=tiny-random", f"--gpu-memory={value}"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"ctu: error: --gpu-memory: must be a finite number of GiB > 0, got {float(value):g}\n"


@pytest.mark.parametrize("value", ["0", "-2"])
def test_bad_gpu_count_is_one_line_naming_the_flag(value, capsys):
    assert main(["plan", "model.path=tiny-random", f"--gpus={value}"]) == 1
    assert capsys.readouterr().err == f"ctu: error: --gpus: must be >= 1, got {value}\n"


@pytest.mark.parametrize("memory", [float("nan"), float("inf"), -1.0])
def test_plan_itself_refuses_what_is_not_a_positive_finite_memory(memory):
    with pytest.raises(ValueError, match="gpu memory must be a finite number of GiB > 0"):
        plan(load_config(None, ["model.path=tiny-random"]), 1, memory)
