"""ReMax (``trainer.advantage=remax``): each episode's reward minus the reward of a greedy episode of its task."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ctu.rl.advantages import greedy_baseline_advantages, scored_advantages

outcome = st.sampled_from([0.0, 0.5, 1.0])


@given(st.lists(st.tuples(outcome, st.one_of(st.none(), outcome), st.booleans()), min_size=1, max_size=24))
def test_remax_trains_only_where_a_sample_did_better_or_worse_than_the_greedy_episode(rows):
    rewards = [r for r, _, _ in rows]
    baselines = [b for _, b, _ in rows]
    errored = [e for _, _, e in rows]
    adv = scored_advantages("remax", rewards, [f"t{i}" for i in range(len(rows))], errored, baselines=baselines)
    expected = {i: r - b for i, (r, b, bad) in enumerate(rows) if not bad and b is not None and r != b}
    assert adv.keys() == expected.keys()
    assert all(abs(adv[i] - e) <= 1e-6 for i, e in expected.items())


def test_a_batch_that_does_what_the_greedy_policy_does_pushes_nothing_whatever_its_mix():
    """The batch baseline's noise, shown: 3 status requests the policy fails and 13 writes it gets right (or the
    other way round) give every episode a full-size push under ``reinforce_pp``, toward whichever kind the batch
    happened to hold more of; under ``remax`` the same episodes, each as its task's greedy episode, push nothing."""
    for successes in (3, 13):
        rewards = [1.0] * successes + [0.0] * (16 - successes)
        groups = [f"t{i}" for i in range(16)]
        assert len(scored_advantages("reinforce_pp", rewards, groups, [False] * 16)) == 16
        assert scored_advantages("remax", rewards, groups, [False] * 16, baselines=rewards) == {}
    # one sample that reported where the greedy episode wrote (and succeeded): only that one is trained on
    assert scored_advantages("remax", [1.0, 0.0, 1.0], ["a", "b", "c"], [False] * 3, baselines=[0.0, 0.0, 1.0]) == {0: 1.0}


def test_remax_without_baselines_is_an_error_not_a_zero_step():
    with pytest.raises(ValueError, match="remax: needs one greedy baseline per episode, got none for 2 episodes"):
        scored_advantages("remax", [1.0, 0.0], ["a", "b"], [False, False])
    with pytest.raises(ValueError, match="2 rewards but 1 baselines"):
        greedy_baseline_advantages([1.0, 0.0], [1.0])
