"""``env.task_weights``: training tasks drawn by their description (a refusal-aware task mix)."""

import random

import pytest

from ctu.app.task_sampler import TaskSampler, task_weight
from ctu.config.schema import ConfigError, load_config
from ctu.domains.base.tasks import Task
from ctu.domains.mini import load


def T(**description):
    return Task(id="t", user_scenario={}, description=description)


def test_a_task_weighs_the_product_of_the_keys_its_description_matches():
    weights = {"refusal": 3.0, "kind=cancel": 2.0}
    assert task_weight(T(kind="cancel", refusal=True), weights) == 6.0
    assert task_weight(T(kind="cancel", refusal=False), weights) == 2.0
    assert task_weight(T(kind="return", refusal=True), weights) == 3.0
    assert task_weight(T(kind="status"), weights) == 1.0
    assert task_weight(T(), {}) == 1.0


def test_refusals_are_drawn_in_proportion_to_their_weight():
    mini = load()
    train = mini.split("train")
    refusals = sum(1 for t in train if t.description["refusal"])
    sampler = TaskSampler([mini], [1.0], seed=0, task_weights={"refusal": 3.0})
    draws = [t for _, t in sampler.sample(6000)]
    share = sum(1 for t in draws if t.description["refusal"]) / len(draws)
    expected = 3 * refusals / (3 * refusals + len(train) - refusals)
    assert abs(share - expected) <= 0.05 * expected  # 6000 draws: sd ~ 0.0065 around ~0.5
    plain = [t for _, t in TaskSampler([mini], [1.0], seed=0).sample(6000)]
    assert sum(1 for t in plain if t.description["refusal"]) / len(plain) < 0.7 * share


def test_without_task_weights_the_draws_are_the_same_as_before():
    mini = load()
    train = mini.split("train")
    sampler = TaskSampler([mini, mini], [1.0, 2.0], seed=5)
    rng = random.Random(5)  # the sampler's draws before task weights existed
    old = []
    for _ in range(50):
        rng.choices([0, 1], weights=[1.0, 2.0])
        old.append(rng.choice(train))
    assert [t.id for _, t in sampler.sample(50)] == [t.id for t in old]


def test_a_key_no_task_matches_is_a_config_error_naming_it():
    with pytest.raises(ConfigError, match="env.task_weights: refusal=yes matches no training task"):
        TaskSampler([load()], [1.0], seed=0, task_weights={"refusal=yes": 2.0})


def test_a_weight_must_be_positive():
    with pytest.raises(ConfigError, match=r"env.task_weights.refusal: must be > 0"):
        load_config(None, ["env.task_weights={refusal: 0}"])
