"""``trainer.contrast_pairs``: each drawn task is played with its twin (the same request where the order's status
calls for the other outcome) as one group, so a group advantage pushes only what tells the two apart."""

from types import SimpleNamespace

import pytest

from ctu.app.sync_loop import TrainingRewards, collect_now
from ctu.app.task_sampler import TaskSampler
from ctu.config.schema import ConfigError, load_config
from ctu.domains.mini import load
from ctu.rl.advantages import scored_advantages

MINI = load()


def test_pairs_are_a_write_request_then_its_twin_drawn_by_the_task_weights():
    sampler = TaskSampler([MINI], [1.0], seed=0)
    picks = sampler.pairs(500)
    assert len(picks) == 1000
    for (_, task), (_, twin) in zip(picks[::2], picks[1::2], strict=True):
        assert task.description["kind"] != "status" and task.id in MINI.splits["train"]
        assert twin is MINI.twin_of(task) and twin.description["refusal"] != task.description["refusal"]
    assert picks == TaskSampler([MINI], [1.0], seed=0).pairs(500)  # seeded
    refused = sum(t.description["refusal"] for _, t in picks[::2]) / 500
    weighted = TaskSampler([MINI], [1.0], seed=0, task_weights={"refusal": 4.0}).pairs(500)
    assert sum(t.description["refusal"] for _, t in weighted[::2]) / 500 > refused + 0.2


def test_with_contrast_pairs_all_a_task_without_twin_is_drawn_and_played_twice():
    picks = TaskSampler([MINI], [1.0], seed=0).pairs(600, untwinned=True)
    firsts = [t for _, t in picks[::2]]
    status = [t for t in firsts if t.description["kind"] == "status"]
    train = [MINI.task(i) for i in MINI.splits["train"]]
    share = sum(t.description["kind"] == "status" for t in train) / len(train)
    assert abs(len(status) / 600 - share) < 0.06  # drawn as often as without pairs
    for (_, task), (_, second) in zip(picks[::2], picks[1::2], strict=True):
        assert second is (MINI.twin_of(task) or task)
    # the twinned draws are unchanged by the option being there
    assert TaskSampler([MINI], [1.0], seed=0).pairs(50) == TaskSampler([MINI], [1.0], seed=0).pairs(50, False)


def test_contrast_pairs_all_needs_contrast_pairs():
    with pytest.raises(ConfigError, match="trainer.contrast_pairs_all: .* needs trainer.contrast_pairs: true"):
        load_config("configs/quickstart.yaml", ["trainer.contrast_pairs_all=true"])


def test_a_domain_without_twins_is_refused_naming_it():
    from dataclasses import replace

    bare = replace(MINI, name="store", twin=None)
    with pytest.raises(ConfigError, match="contrast_pairs: no training task of store has a contrast twin"):
        TaskSampler([bare], [1.0], seed=0).pairs(1)


@pytest.mark.parametrize(("overrides", "message"), [
    (["trainer.advantage=reinforce_pp"], "trainer.contrast_pairs: a pair is a group"),
    (["trainer.tasks_per_step=5"], "trainer.tasks_per_step: contrast pairs are two tasks each"),
    (["trainer.max_staleness=1"], "trainer.contrast_pairs: cannot be combined with trainer.max_staleness"),
    (["trainer.dynamic_sampling=true"], "trainer.contrast_pairs: cannot be combined with trainer.dynamic_sampling"),
])
def test_settings_a_pair_cannot_work_with_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config("configs/quickstart.yaml", ["trainer.contrast_pairs=true", "trainer.advantage=rloo", *overrides])


def test_a_pair_is_one_group_and_rloo_pushes_its_two_episodes_apart():
    config = load_config("configs/quickstart.yaml", ["trainer.contrast_pairs=true", "trainer.advantage=rloo",
                                                     "trainer.tasks_per_step=8"])
    played = []

    def rollout(specs, temperature, seed):
        played.extend(specs)
        # a policy that writes whatever the status: the allowed request succeeds, its refused twin fails
        return [SimpleNamespace(domain=s.domain.name, task_id=s.task.id, stop_reason="user_stop",
                                reward=float(not s.task.description["refusal"])) for s in specs]

    trainer = SimpleNamespace(config=config, step=1, sampler=TaskSampler([MINI], [1.0], seed=0), _rollout=rollout,
                              rewards=lambda batch: TrainingRewards(*(tuple(tr.reward for tr in batch),) * 2))
    trajectories, groups, rewards, chosen, _ = collect_now(trainer)
    assert len(trajectories) == 8 and len(set(groups)) == 4 and chosen == set(groups)
    for a, b in zip(played[::2], played[1::2], strict=True):
        assert b.task is MINI.twin_of(a.task)
    advantages = scored_advantages("rloo", rewards.shaped, groups, [False] * 8)
    for i in range(0, 8, 2):  # the same tokens pushed up where the status allows them and down where it does not
        allowed = i if not played[i].task.description["refusal"] else i + 1
        assert advantages[allowed] == 1.0 and advantages[(2 * i + 1) - allowed] == -1.0


def test_with_contrast_pairs_all_a_status_request_is_a_group_of_its_two_plays():
    config = load_config("configs/quickstart.yaml", ["trainer.contrast_pairs=true", "trainer.contrast_pairs_all=true",
                                                     "trainer.advantage=rloo", "trainer.tasks_per_step=40"])
    played = []

    def rollout(specs, temperature, seed):
        played.extend(specs)
        return [SimpleNamespace(domain=s.domain.name, task_id=s.task.id, stop_reason="user_stop", reward=1.0)
                for s in specs]

    trainer = SimpleNamespace(config=config, step=1, sampler=TaskSampler([MINI], [1.0], seed=0), _rollout=rollout,
                              rewards=lambda batch: TrainingRewards(*(tuple(tr.reward for tr in batch),) * 2))
    _, groups, _, _, _ = collect_now(trainer)
    assert len(groups) == 40 and len(set(groups)) == 20
    status = [i for i in range(0, 40, 2) if played[i].task.description["kind"] == "status"]
    assert status  # drawn, with its second play in its group
    for i in status:
        assert played[i + 1].task is played[i].task and groups[i] == groups[i + 1]
