"""`ctu train` on banking_knowledge (bm25) end to end on CPU with tiny-random: one GRPO step and its evaluations."""

import pytest

from ctu.app.trainer import Trainer
from ctu.config.schema import load_config
from ctu.observe.tracking import read_metrics


@pytest.mark.slow  # ~60 s on a shared 2-core CPU: 4k-token prompts through tiny-random
def test_one_grpo_step_on_banking_knowledge(tmp_path, tau2_bench_data):
    run_dir = tmp_path / "run"
    config = load_config("configs/quickstart.yaml", [
        "model.path=tiny-random", f"run.dir={run_dir}", "env.domains=[banking_knowledge]",
        f"env.tau2_data_dir={tau2_bench_data}", "env.retrieval_variant=bm25", "eval.splits=[all]",
        "env.max_context_tokens=8192", "trainer.tasks_per_step=2", "trainer.samples_per_task=2", "trainer.sft_steps=0",
        "trainer.eval_max_tasks=1", "sampling.max_tokens=8", "env.max_turns=2", "trainer.max_steps=1",
        "trainer.export=false"])
    summary = Trainer(config).run()
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1] and "per_domain/banking_knowledge/reward" in rows[0]
    assert "eval/overall/success" in summary["before"]
