"""Runs that lose nothing and steps that never crash: run.dir ownership, stale temporaries, dynamic sampling,
the KL reference after the warm start, and validation before any model is loaded."""

import pytest
import torch

from ctu.app import trainer as trainer_module
from ctu.app.trainer import Trainer, TrainingRewards
from ctu.config.schema import ConfigError, load_config
from ctu.observe.tracking import read_metrics
from ctu.rollout.loop import Trajectory
from ctu.train.checkpoint import list_checkpoints, save_checkpoint
from ctu.train.demos import gold_samples
from ctu.train.update import sequence_kl


def config(run_dir, *extra):
    """The preset's loop on tiny-random, RL alone (no warm start, no replayed demos: the RL mechanics under test)."""
    return load_config("configs/quickstart.yaml", [
        "model.path=tiny-random", f"run.dir={run_dir}", "trainer.tasks_per_step=2", "trainer.samples_per_task=2",
        "trainer.sft_steps=0", "trainer.sft_replay=0", "trainer.eval_max_tasks=2", "sampling.max_tokens=8",
        "env.max_turns=2", "trainer.ckpt_interval=1", "trainer.eval_before_train=false", "trainer.export=false", *extra])


def no_model_load(monkeypatch):
    def refuse(*_a, **_k):
        raise AssertionError("a model was loaded before the config was refused")
    monkeypatch.setattr(trainer_module, "build_trainer_group", refuse)


def test_a_new_run_refuses_a_run_dir_holding_another_run(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    Trainer(config(run_dir, "trainer.max_steps=2")).run()
    with monkeypatch.context() as m:
        no_model_load(m)
        with pytest.raises(ConfigError, match=r"run\.dir: .* holds another run \(step_1, step_2, metrics\.jsonl\)"):
            Trainer(config(run_dir, "trainer.max_steps=1"))
    assert [p.name for p in list_checkpoints(run_dir / "checkpoints")] == ["step_1", "step_2"]  # nothing lost
    Trainer(config(run_dir, "trainer.max_steps=1", "run.overwrite=true")).run()  # told to replace it
    assert [p.name for p in list_checkpoints(run_dir / "checkpoints")] == ["step_1"]
    assert [r["step"] for r in read_metrics(run_dir)] == [1]


def test_pruning_never_deletes_the_checkpoint_just_written(tmp_path):
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    for step in (10, 20):  # an older run's higher-numbered checkpoints
        save_checkpoint(tmp_path, step, model=model, optimizer=opt, scheduler=sched, extra={}, keep=2)
    newest = save_checkpoint(tmp_path, 1, model=model, optimizer=opt, scheduler=sched, extra={}, keep=2)
    assert newest.is_dir() and [p.name for p in list_checkpoints(tmp_path)] == ["step_1", "step_20"]
    save_checkpoint(tmp_path, 2, model=model, optimizer=opt, scheduler=sched, extra={}, keep=1)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_2"]


def test_stale_temporary_checkpoints_are_cleaned_at_start(tmp_path):
    run_dir = tmp_path / "run"
    Trainer(config(run_dir, "trainer.max_steps=1")).run()
    stale = run_dir / "checkpoints" / ".tmp-step_2-abc123"
    stale.mkdir()
    (stale / "trainable.pt").write_bytes(b"half written")
    Trainer(config(run_dir, "trainer.max_steps=2", "trainer.resume=latest")).run()
    assert not stale.exists() and (run_dir / "checkpoints" / "step_2" / "checkpoint.json").is_file()


@pytest.mark.parametrize("overrides,message", [
    (["trainer.dual_clip=1.0"], "trainer.dual_clip"), (["trainer.tis_cap=-1"], "trainer.tis_cap"),
    (["trainer.clip_low=2"], "trainer.clip_low"), (["trainer.clip_low=1.0"], "trainer.clip_low"),
    (["trainer.warmup_steps=-1"], "trainer.warmup_steps"), (["trainer.grad_clip=0"], "trainer.grad_clip"),
    (["trainer.kl_coef=-0.1"], "trainer.kl_coef"), (["lora.dropout=1.0"], "lora.dropout"),
    (["engine.parity_tolerance=0"], "engine.parity_tolerance"),
    (["distributed.trainer_workers=-1"], "distributed.trainer_workers"),
    (["distributed.placement=spread"], "distributed.placement"), (["distributed.trainer_cpus=0"], "trainer_cpus"),
    (["distributed.rollout_workers=2", "engine.kind=vllm"], "distributed.rollout_workers"),
])
def test_values_that_would_fail_an_update_fail_validation(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        config(tmp_path, *overrides)


def test_remote_engine_is_refused_for_training_before_any_model_is_loaded(tmp_path, monkeypatch):
    no_model_load(monkeypatch)
    cfg = config(tmp_path, "engine.kind=remote", "engine.base_url=http://127.0.0.1:9/v1")
    with pytest.raises(ConfigError, match="engine.kind: 'remote' cannot be trained"):
        Trainer(cfg)


def fake_trajectory(spec) -> Trajectory:
    return Trajectory(domain=spec.domain.name, task_id=spec.task.id, sample=spec.sample, prompt_ids=[1, 2, 3],
                      response_ids=[4, 5, 6], loss_mask=[1, 1, 1], logprobs=[-1.0, -1.0, -1.0], assistant_spans=[(0, 3)],
                      messages=[], reward=0.0, components={}, skipped=[], reasons=[], stop_reason="done",
                      termination="agent_stop", turns=1, parse_failures=0, tool_calls=0)


def test_dynamic_sampling_draws_more_groups_until_the_batch_is_informative(tmp_path, monkeypatch):
    trainer = Trainer(config(tmp_path / "run", "trainer.dynamic_sampling=true", "trainer.dynamic_sampling_max_draws=3",
                             "trainer.max_steps=1", "trainer.advantage=grpo"))
    draws = []

    def rollout(specs, temperature, seed, judge=None):
        draws.append(len(specs))
        return [fake_trajectory(s) for s in specs]

    # Draw 0: one of two groups informative; draw 1 (one more group): informative.
    plans = iter([[0, 1, 0, 0], [1, 0]])

    def rewards(trajectories):
        values = tuple(float(r) for r in next(plans))
        return TrainingRewards(values, values)

    monkeypatch.setattr(trainer, "_rollout", rollout)
    monkeypatch.setattr(trainer, "rewards", rewards)
    metrics = trainer.train_step()["metrics"]
    assert draws == [4, 2]  # 2 tasks x 2 samples, then 1 more task
    assert metrics["rollout"]["dynamic_extra_draws"] == 1 and metrics["rollout"]["trained_groups"] == 2
    assert metrics["rollout"]["trained_episodes"] == 4 and metrics["train"]["updates"] == 1


def test_a_step_with_nothing_to_train_on_is_recorded(tmp_path, monkeypatch):
    trainer = Trainer(config(tmp_path / "run", "trainer.dynamic_sampling=true", "trainer.dynamic_sampling_max_draws=2",
                             "trainer.max_steps=1", "trainer.advantage=grpo"))
    monkeypatch.setattr(trainer, "_rollout", lambda specs, temperature, seed, judge=None:
                        [fake_trajectory(s) for s in specs])
    metrics = trainer.train_step()["metrics"]  # every group all-equal (reward 0): nothing informative
    assert metrics["rollout"]["trained_episodes"] == 0 and metrics["rollout"]["dynamic_extra_draws"] == 2
    assert metrics["train"]["updates"] == 0 and metrics["train"]["loss"] == 0.0


@pytest.mark.parametrize("advantage", ["grpo", "reinforce_pp"])
def test_groups_that_always_succeed_train_only_under_the_batch_baseline(tmp_path, monkeypatch, advantage):
    trainer = Trainer(config(tmp_path / "run", "trainer.max_steps=1", f"trainer.advantage={advantage}"))
    monkeypatch.setattr(trainer, "_rollout", lambda specs, temperature, seed, judge=None:
                        [fake_trajectory(s) for s in specs])
    monkeypatch.setattr(trainer, "rewards", lambda trajectories: TrainingRewards((1.0, 1.0, 0.0, 0.0), (1.0, 1.0, 0.0, 0.0)))
    metrics = trainer.train_step()["metrics"]  # group 1 always succeeds, group 2 always fails
    assert metrics["rollout"]["trained_episodes"] == 4
    if advantage == "grpo":  # every group constant: every advantage 0, no policy gradient
        assert metrics["train"]["grad_norm"] == 0
    else:
        assert metrics["train"]["grad_norm"] > 0


@pytest.mark.parametrize("baseline_by", [None, "kind"])
def test_a_baseline_per_kind_pushes_nothing_when_every_kind_s_episodes_score_alike(tmp_path, monkeypatch, baseline_by):
    extra = [] if baseline_by is None else [f"trainer.baseline_by={baseline_by}"]
    trainer = Trainer(config(tmp_path / "run", "trainer.max_steps=1", "trainer.advantage=reinforce_pp",
                             "trainer.samples_per_task=1", "trainer.tasks_per_step=8", *extra))
    monkeypatch.setattr(trainer, "_rollout", lambda specs, temperature, seed, judge=None:
                        [fake_trajectory(s) for s in specs])
    kinds = {t.id: t.description["kind"] for d, tasks in trainer.sampler.pools for t in tasks}
    picked = []

    def rewards(trajectories):  # cancels succeed, every other kind fails: no contrast inside any kind
        picked.extend(kinds[tr.task_id] for tr in trajectories)
        values = tuple(1.0 if kinds[tr.task_id] == "cancel" else 0.0 for tr in trajectories)
        return TrainingRewards(values, values)

    monkeypatch.setattr(trainer, "rewards", rewards)
    metrics = trainer.train_step()["metrics"]
    assert "cancel" in picked and len(set(picked)) > 1  # the seed's 8 draws mix kinds
    if baseline_by is None:  # the batch baseline pushes every cancel up and every other kind down
        assert metrics["train"]["grad_norm"] > 0
    else:
        assert metrics["train"]["grad_norm"] == 0


def test_rft_updates_on_the_successful_episodes_only(tmp_path, monkeypatch):
    trainer = Trainer(config(tmp_path / "run", "trainer.max_steps=1", "trainer.advantage=rft", "trainer.samples_per_task=1",
                             "trainer.tasks_per_step=4"))
    monkeypatch.setattr(trainer, "_rollout", lambda specs, temperature, seed, judge=None:
                        [fake_trajectory(s) for s in specs])
    monkeypatch.setattr(trainer, "rewards", lambda trajectories: TrainingRewards((1.0, 0.0, 1.0, 0.0), (1.0, 0.0, 1.0, 0.0)))
    metrics = trainer.train_step()["metrics"]
    assert metrics["rollout"]["trained_episodes"] == 2 and metrics["train"]["grad_norm"] > 0
    monkeypatch.setattr(trainer, "rewards", lambda trajectories: TrainingRewards((0.0,) * 4, (0.0,) * 4))
    trainer.step += 1  # as Trainer.run does: each step syncs a newer weight version
    metrics = trainer.train_step()["metrics"]  # no success: nothing to imitate, no update
    assert metrics["rollout"]["trained_episodes"] == 0 and metrics["train"]["updates"] == 0


def test_after_the_warm_start_the_kl_reference_is_the_warm_started_policy(tmp_path):
    cfg = config(tmp_path / "run", "trainer.sft_steps=3", "trainer.sft_lr=0.01", "trainer.sft_batch_size=2",
                 "trainer.kl_coef=0.1", "trainer.max_steps=1")
    trainer = Trainer(cfg)
    samples = gold_samples(trainer.chat, trainer.domains[0], trainer.domains[0].split("train")[:2])
    trainer.warm_start()
    kls = sequence_kl(trainer.policy, samples, cfg.trainer, 1.0)
    assert max(abs(k) for k in kls) <= 1e-3 * max(1.0, len(samples[0].ids))
    with torch.no_grad():  # and it is a real reference: moving the policy moves the KL
        for name, p in trainer.policy.model.named_parameters():
            if "lora_B" in name:
                p.add_(0.05)
    assert min(sequence_kl(trainer.policy, samples, cfg.trainer, 1.0)) > 1e-3


def test_remax_plays_one_greedy_episode_per_task_and_trains_on_the_samples_that_differ(tmp_path, monkeypatch):
    trainer = Trainer(config(tmp_path / "run", "trainer.max_steps=1", "trainer.advantage=remax"))
    calls = []

    def rollout(specs, temperature, seed, judge=None):
        calls.append((temperature, [(s.task.id, s.sample) for s in specs]))
        return [fake_trajectory(s) for s in specs]

    plans = iter([(1.0, 0.0, 0.0, 0.0), (0.0, 0.0)])  # samples of tasks A, A, B, B; greedy episodes of A, B

    def rewards(trajectories):
        values = next(plans)
        assert len(values) == len(trajectories)
        return TrainingRewards(values, values)

    monkeypatch.setattr(trainer, "_rollout", rollout)
    monkeypatch.setattr(trainer, "rewards", rewards)
    metrics = trainer.train_step()["metrics"]
    (sampled_t, sampled), (greedy_t, greedy) = calls
    assert sampled_t == trainer.config.sampling.temperature and greedy_t == 0.0
    assert greedy == [(task, 0) for task, _ in sampled[::2]]  # one greedy episode per task, never trained on
    assert metrics["rollout"]["episodes"] == 4 and metrics["rollout"]["greedy_reward"] == 0.0
    assert metrics["rollout"]["trained_episodes"] == 1 and metrics["train"]["grad_norm"] > 0  # A's success only
    plans = iter([(1.0, 1.0, 0.0, 0.0), (1.0, 0.0)])  # every sample did what its task's greedy episode did
    trainer.step += 1  # as Trainer.run does: each step syncs a newer weight version
    metrics = trainer.train_step()["metrics"]
    assert metrics["rollout"]["trained_episodes"] == 0 and metrics["train"]["updates"] == 0
    assert metrics["rollout"]["greedy_reward"] == 0.5


@pytest.mark.parametrize("clash", ["trainer.max_staleness=1", "trainer.dynamic_sampling=true",
                                   "trainer.kl_in_reward=true trainer.kl_coef=0.1"])
def test_remax_refuses_what_its_greedy_baselines_cannot_serve(tmp_path, monkeypatch, clash):
    no_model_load(monkeypatch)
    key = clash.split("=")[0]
    with pytest.raises(ConfigError, match=f"trainer.advantage: remax cannot be combined with {key}"):
        Trainer(config(tmp_path / "run", "trainer.advantage=remax", *clash.split()))


@pytest.mark.parametrize("replay", [0, 3])
def test_sft_replay_adds_gold_demos_to_each_update_as_successful_episodes(tmp_path, monkeypatch, replay):
    trainer = Trainer(config(tmp_path / "run", "trainer.max_steps=1", "trainer.advantage=reinforce_pp",
                             "trainer.samples_per_task=1", "trainer.tasks_per_step=4", f"trainer.sft_replay={replay}"))
    monkeypatch.setattr(trainer, "_rollout", lambda specs, temperature, seed, judge=None:
                        [fake_trajectory(s) for s in specs])
    monkeypatch.setattr(trainer, "rewards", lambda trajectories: TrainingRewards((0.0,) * 4, (0.0,) * 4))
    metrics = trainer.train_step()["metrics"]  # every episode failed alike: the batch baseline pushes nothing
    assert metrics["rollout"]["trained_episodes"] == 4 and metrics["rollout"]["replayed_demos"] == replay
    if replay:  # the demos alone move the policy toward the gold turns
        assert metrics["train"]["grad_norm"] > 0 and metrics["train"]["trained_tokens"] > 0
    else:
        assert metrics["train"]["grad_norm"] == 0


def test_a_run_whose_evaluation_has_no_task_is_refused_before_any_model(tmp_path, monkeypatch):
    no_model_load(monkeypatch)
    with pytest.raises(ConfigError, match=r"nothing to evaluate: .*eval\.splits=\[\].* 0 episodes"):
        Trainer(config(tmp_path / "run", "eval.splits=[]"))


def test_a_step_whose_agent_played_nothing_is_an_error(tmp_path):
    import sys

    from ctu.app.evaluate import NothingScored

    trainer = Trainer(config(tmp_path / "run", "trainer.max_steps=1", f"agent.command={sys.executable} -c pass",
                             "agent.concurrency=2"))
    with pytest.raises(NothingScored, match=r"step 1: nothing to train on: all 4 episode\(s\) errored \(first error: "
                                            r"the agent played nothing"):
        trainer.run()

