from hypothesis import given
from hypothesis import strategies as st

from ctu.rl.filters import filter_loss_mask, filter_reward, spans_lengths, too_long

lengths = st.lists(st.integers(min_value=0, max_value=500), max_size=30)
reasons = st.sampled_from(["done", "max_turns", "context", "length", "error"])
rewards = st.floats(min_value=-1, max_value=2, allow_nan=False)


@given(rewards, lengths, reasons)
def test_filters_are_off_by_default(reward, lens, reason):
    assert filter_reward(reward, lens, reason) == reward
    mask = [1, 0, 1]
    assert filter_loss_mask(mask, reason) == mask


@given(rewards, st.integers(min_value=1, max_value=200), st.integers(min_value=1, max_value=60), reasons.filter(lambda r: r != "length"))
def test_many_short_messages_keep_their_reward_however_long_the_episode(reward, cap, turns, reason):
    per_message = [cap] * turns  # each message exactly at the cap; the sum can be far above it
    assert filter_reward(reward, per_message, reason, max_assistant_tokens=cap) == reward


@given(rewards, lengths, st.integers(min_value=0, max_value=300), reasons)
def test_reward_is_zeroed_iff_some_single_message_exceeds_the_cap(reward, lens, cap, reason):
    out = filter_reward(reward, lens, reason, max_assistant_tokens=cap)
    if any(n > cap for n in lens):
        assert out == 0.0
    else:
        assert out == reward


@given(rewards, lengths, reasons)
def test_length_stop_zeroing_and_masking(reward, lens, reason):
    out = filter_reward(reward, lens, reason, zero_on_length_stop=True)
    assert out == (0.0 if reason == "length" else reward)
    mask = [1] * 5 + [0] * 3
    masked = filter_loss_mask(mask, reason, mask_length_stop=True)
    assert masked == ([0] * 8 if reason == "length" else mask)


def test_span_lengths_and_empty_inputs():
    assert spans_lengths([(0, 3), (10, 10), (12, 20)]) == [3, 0, 8]
    assert not too_long([], 1)
    assert filter_reward(1.0, [], "done", max_assistant_tokens=0) == 1.0
