"""In the synchronous loop the in-process engine frees its bf16 decode copy's weights (~270 MB for SmolLM2-135M)
before each update and the warm start, and makes them again at its next call (``HFEngine.idle``)."""

from ctu.app.trainer import Trainer
from ctu.config.schema import load_config
from ctu.engines.base import SamplingParams


def test_the_decode_copy_is_released_through_the_warm_start_and_each_update(tmp_path):
    config = load_config("configs/quickstart.yaml", [
        "model.path=tiny-random", f"run.dir={tmp_path}", "engine.decode_dtype=bfloat16", "trainer.sft_steps=1",
        "trainer.tasks_per_step=2", "eval.concurrency=2", "engine.max_batch_size=2", "sampling.max_tokens=4",
        "env.max_turns=1", "trainer.sft_replay=0"])
    trainer = Trainer(config)
    try:
        copies = trainer.engine.decode_copy
        held = []  # whether the copy held weights when the trainer's work began
        for name in ("sft", "update"):
            real = getattr(trainer.group, name)

            def spy(*args, real=real, **kwargs):
                held.append(copies.model is not None and not copies.released)
                return real(*args, **kwargs)
            setattr(trainer.group, name, spy)
        trainer.engine.generate_sync([[1, 2, 3]], SamplingParams(max_tokens=2))  # the copy made, as an evaluation makes it
        assert copies.model is not None
        trainer.warm_start()
        trainer.step += 1
        trainer.train_step()
        assert held == [False, False]  # the old code kept it through both
        assert copies.builds == 1 and copies.model is not None and not copies.released  # filled again by the rollout
    finally:
        trainer.lock.release()
