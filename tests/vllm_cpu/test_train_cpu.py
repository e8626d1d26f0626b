"""`ctu eval` and 3 steps of training with engine.kind=vllm on real vLLM (CPU): both weight-sync modes, the
parity probe passing after every sync (mirrors tests/e2e/test_train_vllm_fake.py, which uses the fake)."""

import json
import os

import pytest

from ctu.app.cli import main
from ctu.app.trainer import Trainer
from ctu.observe.tracking import read_metrics
from tests.e2e.test_train import config, judge  # noqa: F401 - judge: the autouse shaping-judge fixture

pytestmark = pytest.mark.vllm_cpu


def test_ctu_eval_on_vllm(tmp_path, tiny_llama):
    run_dir = tmp_path / "eval"
    assert main(["eval", f"model.path={tiny_llama}", "engine.kind=vllm", "sampling.max_tokens=12", "env.max_turns=2",
                 "eval.max_tasks=3", f"run.dir={run_dir}"]) == 0
    report = json.loads((run_dir / "report.json").read_text())
    assert report["overall"]["episodes"] == 3 and report["overall"].get("errored", 0) == 0


@pytest.mark.parametrize("mode", ["merged", "adapter"])
def test_three_steps_pass_the_parity_probe_after_every_sync(tmp_path, tiny_llama, mode, monkeypatch):
    from ctu.engines.vllm.engine import VLLMEngine

    on_disk = []  # the adapter directories after each adapter sync
    update_adapter = VLLMEngine.update_adapter

    def watched(self, *args, **kwargs):
        update_adapter(self, *args, **kwargs)
        on_disk.append((self._adapter_root.name, sorted(os.listdir(self._adapter_root.name))))

    monkeypatch.setattr(VLLMEngine, "update_adapter", watched)
    run_dir = tmp_path / mode
    trainer = Trainer(config(run_dir, f"model.path={tiny_llama}", "engine.kind=vllm", f"engine.weight_sync={mode}",
                             "trainer.max_steps=3", "trainer.eval_before_train=false", "trainer.export=false",
                             "trainer.lr=0.05", "trainer.sft_steps=1", "trainer.sft_lr=0.05",
                             "trainer.sft_batch_size=2", "lora.rank=8"))
    trainer.run()
    rows = read_metrics(run_dir)
    assert [r["sync/version"] for r in rows] == [1.0, 2.0, 3.0]
    assert all(r["sync/logprob_max_abs_diff"] <= 0.05 for r in rows)  # bf16 engine vs fp32 trainer: ~4e-3
    assert any(r["train/grad_norm"] > 0 for r in rows)  # the weights really moved between syncs
    if mode == "adapter":
        assert trainer.engine.lora_request.lora_int_id == 4
        assert [names for _, names in on_disk] == [["v0"], ["v1"], ["v2"], ["v3"]]  # one version's directory at a time
        # (v0: the sync after the supervised warm start)
        assert not os.path.exists(on_disk[-1][0])  # and none once the run closed the engine
