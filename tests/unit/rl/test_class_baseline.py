"""``trainer.baseline_by``: the batch baseline taken per class of tasks (e.g. the request's kind), not per batch.

A step's 16 episodes mix request kinds whose success rates differ (cancels 80% sampled, status requests 25%): under
one batch baseline every success of an easy kind is pushed up and every failure of a hard kind pushed down, so the
step's direction is decided by the batch's mix of kinds. A baseline per class compares episodes only with episodes
of the same kind; any baseline that depends on the task alone leaves the policy gradient unbiased.
"""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ctu.app.task_sampler import TaskSampler
from ctu.config.schema import ConfigError, load_config
from ctu.domains.mini import load
from ctu.rl.advantages import batch_advantages, class_baseline_advantages, scored_advantages

rows = st.lists(st.tuples(st.floats(0, 1), st.sampled_from("abc")), min_size=2, max_size=24)


@given(rows, st.floats(-1, 1))
def test_shifting_one_class_s_rewards_changes_no_advantage(rows, shift):
    rewards, classes = [r for r, _ in rows], [c for _, c in rows]
    shifted = [r + shift if c == "a" else r for r, c in rows]
    torch.testing.assert_close(class_baseline_advantages(shifted, classes),
                               class_baseline_advantages(rewards, classes), rtol=1e-4, atol=1e-4)


@given(rows)
def test_advantages_sum_to_zero_within_each_class_and_a_class_of_one_gets_zero(rows):
    rewards, classes = [r for r, _ in rows], [c for _, c in rows]
    adv = class_baseline_advantages(rewards, classes)
    for c in set(classes):
        idx = [i for i, k in enumerate(classes) if k == c]
        assert abs(float(adv[idx].sum())) <= 1e-4 * max(1.0, float(adv.abs().max()))
        if len(idx) == 1:
            assert adv[idx[0]] == 0.0


def test_an_easy_kind_s_successes_are_not_pushed_up_against_a_hard_kind_s_failures():
    # 4 cancels that all succeed, 4 status requests of which 1 succeeds
    rewards = [1, 1, 1, 1, 1, 0, 0, 0]
    classes = ["cancel"] * 4 + ["status"] * 4
    batch = batch_advantages(rewards)
    assert (batch[:4] > 0).all()  # the batch baseline reinforces every cancel
    adv = class_baseline_advantages(rewards, classes)
    assert (adv[:4] == 0).all()
    assert adv[4] > 0 and (adv[5:] < 0).all()
    # the scale is the batch's: one class's contrast is not blown up by its own small std
    centred = torch.tensor([0, 0, 0, 0, 0.75, -0.25, -0.25, -0.25], dtype=torch.float64)
    torch.testing.assert_close(adv, (centred / centred.std()).float(), rtol=1e-4, atol=1e-6)


def test_equal_rewards_within_every_class_push_nothing():
    assert (class_baseline_advantages([1, 1, 0, 0], ["a", "a", "b", "b"]) == 0).all()


def test_scored_advantages_uses_the_classes_under_reinforce_pp_and_leaves_errored_episodes_out():
    rewards = [1.0, 0.0, 1.0, 0.0, 0.3]
    classes = ["a", "a", "b", "b", "b"]
    out = scored_advantages("reinforce_pp", rewards, ["g0", "g1", "g2", "g3", "g4"], [False] * 4 + [True],
                            classes=classes)
    assert set(out) == {0, 1, 2, 3}
    expected = class_baseline_advantages(rewards[:4], classes[:4]).tolist()
    assert [out[i] for i in range(4)] == pytest.approx(expected)
    plain = scored_advantages("reinforce_pp", rewards, ["g"] * 5, [False] * 5)
    assert plain != scored_advantages("reinforce_pp", rewards, ["g"] * 5, [False] * 5, classes=classes)


def test_the_class_of_a_mini_task_is_its_kind():
    mini = load()
    sampler = TaskSampler([mini], [1.0], seed=0)
    train = mini.split("train")
    kinds = {sampler.task_class(mini.name, t.id, "kind") for t in train}
    assert kinds == {f"{mini.name}/{k}" for k in ("cancel", "change_address", "return", "status")}


def test_a_field_no_training_task_has_is_a_config_error_naming_it():
    with pytest.raises(ConfigError, match="trainer.baseline_by: no training task's description has 'colour'"):
        TaskSampler([load()], [1.0], seed=0).check_class_field("colour")


def test_baseline_by_needs_the_batch_baseline():
    with pytest.raises(ConfigError, match="trainer.baseline_by: .*reinforce_pp"):
        load_config(None, ["trainer.baseline_by=kind", "trainer.advantage=grpo", "trainer.samples_per_task=2"])
    load_config(None, ["trainer.baseline_by=kind", "trainer.advantage=reinforce_pp"])
