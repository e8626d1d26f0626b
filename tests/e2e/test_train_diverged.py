"""A learning rate that makes the weights diverge stops the run at the first non-finite loss, naming the step and
the key (a NaN loss used to train on for every step, then fail in sampling with "probability tensor contains
either `inf`, `nan` or element < 0")."""

from ctu.app.cli import main

FAST = ["configs/quickstart.yaml", "model.path=tiny-random", "trainer.export=false", "trainer.max_steps=1",
        "trainer.sft_batch_size=2", "trainer.sft_exclude=[]", "trainer.sft_replay=0", "trainer.eval_before_train=false",
        "trainer.eval_max_tasks=1", "trainer.tasks_per_step=1", "trainer.samples_per_task=2", "sampling.max_tokens=8",
        "env.max_turns=2"]


def test_a_diverging_warm_start_stops_at_the_first_nan_loss_naming_sft_lr(tmp_path, capsys):
    code = main(["train", *FAST, f"run.dir={tmp_path / 'run'}", "trainer.sft_steps=4", "trainer.sft_lr=1e30"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("ctu: error: warm start step 2 of 4: the loss is nan"), last
    assert "trainer.sft_lr (1e+30)" in last
