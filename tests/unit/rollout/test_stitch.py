"""The stitcher: an episode's requests (prompt ids, sampled ids, logprobs, version) -> token-exact samples.

A request whose prompt starts with the previous prompt + sampled ids continues the sample (the new tail is loss
mask 0); any other request starts a new sample. Checked against ctu's own TokenSequence (the loop's path)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ctu.rollout.chat import TokenSequence
from ctu.rollout.stitch import TurnRecord, extends, stitch, trajectory_samples

ids = st.lists(st.integers(0, 50), max_size=6)


@st.composite
def extending_records(draw, version_max=5):
    """Records as an agent that only appends makes them: (sampled ids, tail ids) per turn."""
    prompt = draw(st.lists(st.integers(0, 50), min_size=1, max_size=6))
    turns = draw(st.lists(st.tuples(ids, ids, st.integers(0, version_max)), min_size=1, max_size=5))
    records, seen = [], list(prompt)
    for sampled, tail, version in turns:
        records.append(TurnRecord(tuple(seen), tuple(sampled), tuple(float(-(t % 7)) for t in sampled), version))
        seen = seen + list(sampled) + list(tail)
    return prompt, turns, records


@settings(max_examples=200, deadline=None)
@given(extending_records())
def test_appending_agent_gives_one_sample_equal_to_the_loops_token_sequence(case):
    prompt, turns, records = case
    (sample,) = stitch(records)
    seq, versions = TokenSequence.start(prompt), []
    for k, (sampled, tail, version) in enumerate(turns):
        seq.add_generated(sampled, [float(-(t % 7)) for t in sampled])
        versions += [version] * len(sampled)
        if k + 1 < len(turns):
            seq.add_observation(tail)
            versions += [-1] * len(tail)
    assert sample.prompt_ids == seq.prompt_ids
    assert sample.response_ids == seq.response_ids
    assert sample.loss_mask == seq.loss_mask
    assert sample.logprobs == seq.logprobs
    assert sample.assistant_spans == seq.assistant_spans()
    assert sample.token_versions == versions
    assert sample.turns == len(turns)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=4), ids, st.integers(0, 3)),
                min_size=1, max_size=6))
def test_any_requests_split_where_a_prompt_does_not_extend_and_lose_no_sampled_token(raw):
    records = [TurnRecord(tuple(p), tuple(s), tuple(-1.0 for _ in s), v) for p, s, v in raw]
    samples = stitch(records)
    breaks = sum(not extends(a.prompt_ids + a.completion_ids, b.prompt_ids) for a, b in zip(records, records[1:], strict=False))
    assert len(samples) == 1 + breaks
    assert sum(s.turns for s in samples) == len(records)
    sampled = [t for s in samples for t, m in zip(s.response_ids, s.loss_mask, strict=True) if m]
    assert sampled == [t for r in records for t in r.completion_ids]
    for s in samples:
        assert len(s.response_ids) == len(s.loss_mask) == len(s.logprobs) == len(s.token_versions)
        assert all((v == -1) == (m == 0) for v, m in zip(s.token_versions, s.loss_mask, strict=True))
    ends = [k for k in range(len(records)) if k + 1 == len(records)
            or not extends(records[k].prompt_ids + records[k].completion_ids, records[k + 1].prompt_ids)]
    for s, k in zip(samples, ends, strict=True):  # each sample ends with exactly what its last request saw + sampled
        assert s.prompt_ids + s.response_ids == list(records[k].prompt_ids + records[k].completion_ids)


def test_a_rewritten_history_starts_a_new_sample():
    records = [TurnRecord((1, 2), (3, 4), (-0.5, -0.25), 0), TurnRecord((1, 2, 3, 4, 9), (5,), (-1.0,), 1),
               TurnRecord((1, 7), (8,), (-2.0,), 1)]  # the agent dropped its history: not an extension
    first, second = stitch(records)
    assert (first.prompt_ids, first.response_ids, first.loss_mask) == ([1, 2], [3, 4, 9, 5], [1, 1, 0, 1])
    assert first.token_versions == [0, 0, -1, 1]
    assert (second.prompt_ids, second.response_ids, second.loss_mask, second.logprobs) == ([1, 7], [8], [1], [-2.0])


def test_no_requests_no_samples_and_trajectory_samples_list_the_earlier_ones_first():
    assert stitch([]) == []

    class Tr:
        prompt_ids, response_ids, loss_mask, logprobs = [1], [2], [1], [-1.0]
        extra_samples = stitch([TurnRecord((5,), (6,), (-3.0,), 0)])

    assert trajectory_samples(Tr()) == [([5], [6], [1], [-3.0]), ([1], [2], [1], [-1.0])]
