"""``trainer.autocast: auto``: bf16 where the device computes it natively (CUDA; CPUs with AVX512-BF16 or AMX), fp32
elsewhere, the choice and its reason printed once at start.

A Zen 4 or Sapphire Rapids machine checks the Zen 3 (AVX2) path by forcing the CPU capability down in a subprocess
(``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2``): there torch's bf16 matmuls are emulated, ~60x slower than
fp32 (benchmarks/cpu_precision.py), so ``auto`` must not pick them. The default test run pins ``CTU_NATIVE_BF16=0``
(conftest.py) so every CPU runs the same numbers; these tests lift the pin where they test the detection."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ctu.config.schema import load_config
from ctu.engines.cpu.precision import cpu_bf16_support, resolve_autocast

ROOT = Path(__file__).resolve().parents[3]
FORCED_AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
NATIVE_HERE = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()

PROBE = """
import json, sys, torch
from ctu.config.schema import load_config
from ctu.engines.cpu.precision import TRAIN_DTYPE_ATTR
from ctu.train.policy import build_policy
from ctu.train.logprobs import token_logprobs
from tests.unit.train.test_autocast import MatmulDtypes
config = load_config(None, [f"model.path={sys.argv[1]}", *sys.argv[2:]])
policy = build_policy(config, device="cpu")
ids = torch.tensor([[5, 17, 33, 2, 90, 41]])
with MatmulDtypes() as mode:
    token_logprobs(policy.model, ids, torch.ones_like(ids))[0].sum().backward()
print(json.dumps({"train_dtype": str(getattr(policy.model, TRAIN_DTYPE_ATTR)), "note": policy.precision_note,
                  "matmuls": sorted(str(d) for d in mode.seen), "capability": torch.backends.cpu.get_cpu_capability()}))
"""


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from tests.support.models import save_random_model

    return save_random_model(tmp_path_factory.mktemp("tiny-auto"), "qwen2", layers=1, hidden=32, intermediate=64)


def probe(model_path, *overrides, **env):
    clean = {k: v for k, v in os.environ.items() if k not in ("CTU_NATIVE_BF16", *FORCED_AVX2)}
    out = subprocess.run([sys.executable, "-c", PROBE, str(model_path), *overrides], capture_output=True, text=True,
                         cwd=ROOT, env={**clean, "PYTHONPATH": str(ROOT), **env}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_auto_is_the_default():
    assert load_config(None, []).trainer.autocast == "auto"


def test_auto_resolves_by_device_and_the_reason_says_why(monkeypatch):
    monkeypatch.setenv("CTU_NATIVE_BF16", "1")
    dtype, why = resolve_autocast("auto", "cpu")
    assert dtype == torch.bfloat16 and "CTU_NATIVE_BF16=1" in why
    monkeypatch.setenv("CTU_NATIVE_BF16", "0")
    dtype, why = resolve_autocast("auto", "cpu")
    assert dtype is None and "fp32" in why
    assert resolve_autocast("auto", "cuda:0")[0] == torch.bfloat16
    assert resolve_autocast("off", "cuda")[0] is None
    dtype, why = resolve_autocast("bfloat16", "cpu")  # asked for: kept, with the cost said
    assert dtype == torch.bfloat16 and "emulated" in why


@pytest.mark.parametrize("isa", ["AVX2", "AVX512_CORE", "avx2_vnni"])
def test_a_onednn_cap_below_bf16_is_no_native_bf16(isa):
    native, why = cpu_bf16_support({"ONEDNN_MAX_CPU_ISA": isa})
    assert not native and isa.upper() in why


def test_the_detection_matches_the_cpu_flags():
    native, why = cpu_bf16_support({})
    assert native == (NATIVE_HERE and torch.ops.mkldnn._is_mkldnn_bf16_supported()), why


def test_forced_to_avx2_auto_trains_in_fp32_and_says_so(model_path):
    """The Zen 3 path on any machine: no bf16 matmul in a gradient pass, and the reason names the missing ISA."""
    out = probe(model_path, **FORCED_AVX2)
    assert out["capability"] == "AVX2"
    assert out["train_dtype"] == "None" and out["matmuls"] == ["torch.float32"], out
    assert "no native bf16" in out["note"] or "ONEDNN_MAX_CPU_ISA=AVX2" in out["note"], out["note"]
    assert "trainer.autocast=auto: fp32" in out["note"], out["note"]


@pytest.mark.skipif(not NATIVE_HERE, reason="this CPU has neither AVX512-BF16 nor AMX")
def test_on_a_native_bf16_cpu_auto_trains_in_bf16(model_path):
    out = probe(model_path)
    assert out["train_dtype"] == "torch.bfloat16" and "torch.bfloat16" in out["matmuls"], out
    assert "natively" in out["note"], out["note"]


def test_off_and_explicit_bf16_are_kept_whatever_the_cpu(model_path):
    assert probe(model_path, "trainer.autocast=off")["matmuls"] == ["torch.float32"]
    forced = probe(model_path, "trainer.autocast=bfloat16", **FORCED_AVX2)
    assert "torch.bfloat16" in forced["matmuls"] and "emulated" in forced["note"], forced


def test_the_trainer_prints_the_choice_once(tmp_path, capsys):
    from ctu.app.trainer import Trainer

    config = load_config(None, ["model.path=tiny-random", f"run.dir={tmp_path}/run", "env.domains=[mini]",
                                "trainer.max_steps=1", "trainer.eval_before_train=false", "trainer.export=false"])
    Trainer(config).lock.release()
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("precision:")]
    assert len(lines) == 1 and "trainer.autocast=auto: fp32; CTU_NATIVE_BF16=0" in lines[0], lines
