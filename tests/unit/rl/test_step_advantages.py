"""Step-level advantages (ctu.rl.step_advantages): siblings forked from one state, GiGPO's anchor states."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ctu.rl.losses import ppo_clip_per_token
from ctu.rl.step_advantages import anchor_step_advantages, episode_token_advantages, fork_mask, spec_indices
from ctu.train.update import collate, to_sample

PROMPT = [1, 2, 3]
PREFIX = [10, 11, 12, 20, 21]  # a sampled turn (10-12), then its tool result (20, 21)
SPANS_PREFIX = [(0, 3)]


def _siblings(actions):
    """K episodes forked after PREFIX: each samples its own one-turn continuation."""
    responses = [PREFIX + list(a) for a in actions]
    spans = [SPANS_PREFIX + [(len(PREFIX), len(PREFIX) + len(a))] for a in actions]
    forks = [(j, len(PREFIX)) for j in range(len(actions))]
    return responses, spans, forks


actions_st = st.lists(st.lists(st.integers(30, 40), min_size=1, max_size=4), min_size=2, max_size=6, unique_by=tuple)


@settings(max_examples=40, deadline=None)
@given(actions_st, st.floats(0, 1), st.floats(0.1, 3))
def test_siblings_of_equal_reward_get_no_step_credit(actions, reward, weight):
    responses, spans, forks = _siblings(actions)
    k = len(actions)
    episode = {i: 0.3 for i in range(k)}
    out = episode_token_advantages(episode, [reward] * k, ["g"] * k, [PROMPT] * k, responses, spans, forks,
                                   weight=weight)
    assert all(a == 0.3 for row in out.values() for a in row)


@settings(max_examples=40, deadline=None)
@given(actions_st, st.data(), st.floats(0.1, 3))
def test_a_sibling_that_alone_succeeds_gets_the_step_credit_after_the_fork_and_none_before(actions, data, weight):
    responses, spans, forks = _siblings(actions)
    k = len(actions)
    winner = data.draw(st.integers(0, k - 1))
    rewards = [1.0 if i == winner else 0.0 for i in range(k)]
    episode = dict.fromkeys(range(k), 0.0)  # the episode term alone is tested elsewhere: here only the step term
    out = episode_token_advantages(episode, rewards, ["g"] * k, [PROMPT] * k, responses, spans, forks, weight=weight)
    fork_at = len(PREFIX)
    for i in range(k):
        assert all(a == 0.0 for a in out[i][:fork_at])  # the shared prefix: no step credit
    after = [sum(out[i][fork_at:]) / len(actions[i]) for i in range(k)]
    assert abs(after[winner] - weight * (1 - 1 / k)) < 1e-9
    assert all(abs(after[i] + weight / k) < 1e-9 for i in range(k) if i != winner)


def test_the_shared_prefix_is_trained_once_with_the_siblings_mean_episode_advantage():
    responses, spans, forks = _siblings([[30], [31], [32]])
    out = episode_token_advantages({0: 0.9, 1: -0.3, 2: 0.0}, [1, 0, 0], ["g"] * 3, [PROMPT] * 3, responses, spans,
                                   forks, weight=0.0)
    assert out[0][: len(PREFIX)] == pytest.approx([0.2] * len(PREFIX)) and out[0][len(PREFIX):] == [0.9]
    assert fork_mask([1, 1, 1, 0, 0, 1], 5, 1) == [0, 0, 0, 0, 0, 1] and fork_mask([1, 1, 0], 2, 0) == [1, 1, 0]
    assert spec_indices([None, (0, 5), (1, 5), (2, 5), None]) == [0, 1, 1, 1, 2]


def test_anchor_states_group_episodes_of_a_task_without_forks():
    # two independent samples of a task start from the same state and act differently; a third group's is apart
    turns = [[("s0", "a")], [("s0", "b")], [("s0", "a")]]
    step = anchor_step_advantages([1.0, 0.0, 0.0], turns, ["t", "t", "u"])
    assert step == [[0.5], [-0.5], [0.0]]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(30, 40), min_size=1, max_size=5), st.floats(-2, 2), st.floats(0, 1), st.floats(0, 3))
def test_the_loss_equals_the_unbranched_loss_when_k_is_1(action, advantage, reward, weight):
    (response,), (spans,), (fork,) = _siblings([action])
    per_token = episode_token_advantages({0: advantage}, [reward], ["g"], [PROMPT], [response], [spans], [fork],
                                         weight=weight)[0]
    mask = [1, 1, 1, 0, 0] + [1] * len(action)
    logprobs = [-0.5] * len(mask)
    plain = collate([to_sample(PROMPT, response, mask, logprobs, advantage)], "cpu")
    branched = collate([to_sample(PROMPT, response, mask, logprobs, advantage, per_token)], "cpu")
    torch.manual_seed(0)
    logp = -torch.rand(plain["mask"].shape)
    loss = [(ppo_clip_per_token(logp, plain["sampler"], b["adv"])[0] * b["mask"]).sum() for b in (plain, branched)]
    assert torch.allclose(loss[0], loss[1])
