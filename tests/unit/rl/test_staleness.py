"""The staleness rule as pure functions: step s trains on a group only if every sampled token has version
>= s - 1 - k; unknown versions are never fresh."""

from hypothesis import given
from hypothesis import strategies as st

from ctu.rl.staleness import (
    fresh_groups,
    is_fresh,
    max_version,
    min_version,
    oldest_allowed,
    sampled_versions,
    token_staleness,
)
from ctu.rollout.loop import Trajectory


def episode(versions, mask=None):
    mask = [1 if v >= 0 else 0 for v in versions] if mask is None else mask
    return Trajectory(domain="mini", task_id="t", sample=0, prompt_ids=[1], response_ids=[5] * len(versions),
                      loss_mask=mask, logprobs=[0.0] * len(versions), assistant_spans=[], messages=[], reward=0.0,
                      components={}, skipped=[], reasons=[], stop_reason="done", termination=None, turns=1,
                      parse_failures=0, tool_calls=0, token_versions=list(versions))


def test_the_rule_at_a_glance():
    assert oldest_allowed(step=5, max_staleness=1) == 3
    group = [episode([3, 3, -1, 4]), episode([4, -1, 4])]
    assert min_version(group) == 3 and max_version(group) == 4
    assert is_fresh(group, step=5, max_staleness=1) and not is_fresh(group, step=6, max_staleness=1)
    assert token_staleness(group, step=5) == [1, 1, 0, 0, 0]


def test_k0_means_sampled_by_the_weights_the_step_updates():
    assert is_fresh([episode([2, 2])], step=3, max_staleness=0)
    assert not is_fresh([episode([1, 2])], step=3, max_staleness=0)


def test_unknown_versions_are_never_fresh_and_empty_groups_always_are():
    assert not is_fresh([episode([5, 5]), episode([-1], mask=[1])], step=1, max_staleness=100)
    unstamped = episode([])
    unstamped.response_ids, unstamped.loss_mask = [5, 6], [1, 0]  # built by code that does not stamp
    assert sampled_versions(unstamped) == [-1] and not is_fresh([unstamped], step=1, max_staleness=3)
    assert min_version([episode([-1, -1])]) is None and is_fresh([episode([])], step=9, max_staleness=0)


@given(st.lists(st.lists(st.lists(st.integers(-1, 8), max_size=6), min_size=1, max_size=3), max_size=6),
       st.integers(1, 10), st.integers(0, 3))
def test_fresh_groups_split_by_the_oldest_sampled_token(groups, step, k):
    built = [[episode(v) for v in g] for g in groups]
    fresh, stale = fresh_groups(built, step, k)
    assert sorted(fresh + stale) == list(range(len(built)))
    for i in fresh:
        assert all(v >= step - 1 - k for t in built[i] for v in sampled_versions(t))
    for i in stale:
        assert any(0 <= v < step - 1 - k for t in built[i] for v in sampled_versions(t))


def test_an_agents_earlier_samples_count_toward_the_groups_age():
    """An agent that rewrote its history leaves earlier samples in ``extra_samples``: they are trained on with the
    episode, so their tokens' versions decide freshness and staleness as the episode's own do."""
    from ctu.rollout.stitch import TokenSample

    old = TokenSample(prompt_ids=[1], response_ids=[7, 8, 9], loss_mask=[1, 0, 1], logprobs=[0.0] * 3,
                      token_versions=[1, -1, 1])
    rewritten = episode([4, 4])
    rewritten.extra_samples = [old]
    assert sampled_versions(rewritten) == [1, 1, 4, 4]
    assert min_version([rewritten]) == 1 and max_version([rewritten]) == 4
    assert not is_fresh([rewritten], step=5, max_staleness=1)  # its first sample is 3 versions old
    assert token_staleness([rewritten], step=5) == [3, 3, 0, 0]
