"""`ctu train` never succeeds silently: a step or an evaluation whose every episode errored stops the run with a
non-zero exit and one line (how many errored, the first error, how to continue); what was written is kept and the
run resumes. Some episodes erroring is no failure: they are counted (``rollout/errored``) and the run goes on."""

import json

import pytest

from ctu.app.cli import main
from ctu.app.evaluate import NothingScored
from ctu.app.trainer import Trainer
from ctu.config.runlock import RunDirLock
from ctu.config.schema import load_config
from ctu.observe.tracking import read_evals, read_metrics
from ctu.rollout.loop import Trajectory
from ctu.train.checkpoint import list_checkpoints

FAST = ["model.path=tiny-random", "trainer.max_steps=2", "trainer.tasks_per_step=2", "trainer.samples_per_task=2", "trainer.sft_steps=0",
        "trainer.eval_max_tasks=1", "sampling.max_tokens=8", "env.max_turns=2", "trainer.ckpt_interval=1",
        "trainer.export=false", "trainer.advantage=grpo", "sampling.temperature=1.0", "eval.temperature=0.0"]
# the reproduction: nothing listens on port 1, so every episode errors at the user's first message
UNREACHABLE = ["user.kind=llm", "user.base_url=http://127.0.0.1:1/v1", "user.api_key_env=CTU_TEST_USER_KEY",
               "user.max_retries=0"]


def config(run_dir, *extra):
    return load_config("configs/quickstart.yaml", [*FAST, f"run.dir={run_dir}", "trainer.eval_before_train=false",
                                                   *extra])


def errored(spec, error="user: connection refused") -> Trajectory:
    return Trajectory(domain=spec.domain.name, task_id=spec.task.id, sample=spec.sample, prompt_ids=[1], response_ids=[],
                      loss_mask=[], logprobs=[], assistant_spans=[], messages=[], reward=0.0, components={},
                      skipped=[], reasons=[], stop_reason="error", termination="user_error", turns=0,
                      parse_failures=0, tool_calls=0, error=f"{error} ({spec.task.id})")


def failing(trainer, monkeypatch, when):
    """Rollouts for which ``when(trainer, temperature)`` holds come back all errored; the others are real."""
    real = trainer._rollout

    def rollout(specs, temperature, seed, judge=None, on_done=None):
        if when(trainer, temperature):
            return [errored(s) for s in specs]
        return real(specs, temperature, seed, judge=judge, on_done=on_done)

    monkeypatch.setattr(trainer, "_rollout", rollout)
    return trainer


def error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("ctu:")]
    assert len(lines) == 1, err
    return lines[0]


def test_train_stops_before_training_when_the_base_evaluation_all_errored(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CTU_TEST_USER_KEY", "k")
    run_dir = tmp_path / "run"
    assert main(["train", "configs/quickstart.yaml", *FAST, *UNREACHABLE, f"run.dir={run_dir}"]) == 1
    line = error_line(capsys)
    assert line.startswith("ctu: error: evaluation step_0 (before training): no episode could be scored: "
                           "all 1 episode(s) errored (first error: "), line
    assert "127.0.0.1:1" in line and "trainer.resume=latest" in line
    assert read_metrics(run_dir) == [] and list_checkpoints(run_dir / "checkpoints") == []  # nothing trained
    report = json.loads((run_dir / "eval" / "step_0" / "report.json").read_text())
    assert report["overall"]["errored"] == 1  # the trajectories, errors included, are kept for reading
    assert read_evals(run_dir) == []  # no false 0.0 in the evaluation history


def test_a_step_whose_every_episode_errored_exits_non_zero(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CTU_TEST_USER_KEY", "k")
    run_dir = tmp_path / "run"
    assert main(["train", "configs/quickstart.yaml", *FAST, *UNREACHABLE, f"run.dir={run_dir}",
                 "trainer.eval_before_train=false"]) == 1
    line = error_line(capsys)
    assert line.startswith("ctu: error: step 1: nothing to train on: all 4 episode(s) errored (first error: "), line
    assert read_metrics(run_dir) == []


def test_what_was_written_is_kept_and_the_run_resumes(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    trainer = failing(Trainer(config(run_dir)), monkeypatch, lambda t, _temperature: t.step == 2)
    with pytest.raises(NothingScored) as caught:
        trainer.run()
    message = str(caught.value)
    assert message.startswith("step 2: nothing to train on: all 4 episode(s) errored (first error: user: connection "
                              "refused (")
    assert "continue with trainer.resume=latest (from checkpoint step_1)" in message and "\n" not in message
    assert [r["step"] for r in read_metrics(run_dir)] == [1]
    assert [p.name for p in list_checkpoints(run_dir / "checkpoints")] == ["step_1"]
    RunDirLock(run_dir).acquire().release()  # the lock was given back
    Trainer(config(run_dir, "trainer.resume=latest")).run()
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2]
    assert [e["phase"] for e in read_evals(run_dir)] == ["final"]


def test_a_final_evaluation_all_errored_fails_after_the_last_checkpoint(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    trainer = failing(Trainer(config(run_dir)), monkeypatch,
                      lambda _t, temperature: temperature == 0.0)  # evaluation rollouts only
    with pytest.raises(NothingScored, match=r"^evaluation step_2 \(final\): no episode could be scored: all 1 "):
        trainer.run()
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2] and read_evals(run_dir) == []
    assert [p.name for p in list_checkpoints(run_dir / "checkpoints")] == ["step_1", "step_2"]
    summary = Trainer(config(run_dir, "trainer.resume=latest")).run()
    assert "eval/overall/success" in summary["after"] and [e["phase"] for e in read_evals(run_dir)] == ["final"]


def test_a_periodic_evaluation_all_errored_keeps_its_step(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    trainer = failing(Trainer(config(run_dir, "trainer.eval_interval=1")), monkeypatch,
                      lambda _t, temperature: temperature == 0.0)
    with pytest.raises(NothingScored, match=r"^evaluation step_1 \(periodic\): no episode could be scored"):
        trainer.run()
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1] and not any(k.startswith("eval/") for k in rows[0])
    assert [p.name for p in list_checkpoints(run_dir / "checkpoints")] == ["step_1"]


def test_some_episodes_errored_is_counted_and_the_run_succeeds(tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "run"
    trainer = Trainer(config(run_dir, "trainer.max_steps=1", "trainer.eval_max_tasks=2"))
    real = trainer._rollout

    def rollout(specs, temperature, seed, judge=None, on_done=None):  # the first episode of every batch errors
        return [errored(specs[0]), *real(specs[1:], temperature, seed, judge=judge, on_done=on_done)]

    monkeypatch.setattr(trainer, "_rollout", rollout)
    assert trainer.run()["after"]
    (row,) = read_metrics(run_dir)
    assert row["rollout/errored"] == 1 and row["rollout/episodes"] == 4
    assert "; 1 errored, not scored" in capsys.readouterr().out  # the console says what its success rate leaves out
