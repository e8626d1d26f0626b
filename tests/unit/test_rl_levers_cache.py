"""benchmarks/rl_levers.py's warm-start cache, made by a fresh warm start: the warm start syncs the engine and the
cache adds no second sync of the same version (weight versions never repeat: that sync failed the run)."""

from benchmarks.rl_levers import from_cache
from ctu.app.trainer import Trainer
from ctu.config.schema import load_config


def test_a_fresh_warm_start_leaves_the_engine_on_version_0_and_a_cache(tmp_path):
    trainer = Trainer(load_config("configs/quickstart.yaml", [
        "model.path=tiny-random", "trainer.sft_steps=1", "trainer.eval_max_tasks=1", "sampling.max_tokens=4",
        "eval.concurrency=1", "engine.max_batch_size=1", f"run.dir={tmp_path}"]))
    try:
        start = from_cache(trainer, tmp_path / "ws.pt")
        assert (tmp_path / "ws.pt").exists() and 0.0 <= start["success"] <= 1.0
        assert trainer.sync.version == 0
    finally:
        trainer.lock.release()
