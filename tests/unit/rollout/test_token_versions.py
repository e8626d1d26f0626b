"""Version stamps: each completion carries the policy version of the weights that sampled it, and each trajectory
records it per response token (-1 where the policy sampled nothing: user, tool and template tokens)."""

import asyncio
from dataclasses import replace

import pytest

from ctu.engines.base import Completion, SamplingParams
from ctu.episode.users.scripted import ScriptedUser
from ctu.rollout.loop import EpisodeSpec, RolloutLimits, Trajectory, rollout
from tests.unit.rollout.test_rollout import GOLD_TURNS, MINI, TASK, ScriptedModel


@pytest.fixture
def chat(chat_format):
    return chat_format


class VersionedModel(ScriptedModel):
    """The scripted model, its policy version moving on by one after every turn it samples."""

    def __init__(self, chat, turns, first_version=0):
        super().__init__(chat, turns)
        self.weights_version = first_version

    async def generate(self, prompts, params, seeds=None):
        out = await super().generate(prompts, params, seeds)
        stamped = [[replace(c, version=self.weights_version) for c in row] for row in out]
        self.weights_version += 1
        return stamped


def test_a_completion_has_no_version_unless_an_engine_stamps_it():
    assert Completion((1,), (-0.5,), "stop").version is None
    assert Completion((1,), (-0.5,), "stop", version=4).version == 4


def test_every_sampled_token_carries_the_version_of_its_turn_and_the_rest_minus_one(chat):
    (t,) = asyncio.run(rollout([EpisodeSpec(MINI, TASK)], chat, VersionedModel(chat, GOLD_TURNS, first_version=5),
                               ScriptedUser(), SamplingParams(max_tokens=64), RolloutLimits()))
    assert len(t.token_versions) == len(t.response_ids) == len(t.loss_mask)
    for turn, (start, end) in enumerate(t.assistant_spans):
        assert t.token_versions[start:end] == [5 + turn] * (end - start)
    assert all(v == -1 for v, m in zip(t.token_versions, t.loss_mask, strict=True) if not m)


def test_a_completion_without_a_version_is_recorded_as_minus_one(chat):
    (t,) = asyncio.run(rollout([EpisodeSpec(MINI, TASK)], chat, ScriptedModel(chat, GOLD_TURNS), ScriptedUser(),
                               SamplingParams(max_tokens=64), RolloutLimits()))
    assert t.token_versions == [-1] * len(t.response_ids) and sum(t.loss_mask) > 0


def test_trajectories_built_elsewhere_default_to_no_versions():
    t = Trajectory(domain="mini", task_id="t", sample=0, prompt_ids=[1], response_ids=[], loss_mask=[], logprobs=[],
                   assistant_spans=[], messages=[], reward=0.0, components={}, skipped=[], reasons=[],
                   stop_reason="error", termination="error", turns=0, parse_failures=0, tool_calls=0)
    assert t.token_versions == []
    assert "token_versions" in t.to_json(with_tokens=True) and "token_versions" not in t.to_json()


def test_the_hf_engine_stamps_its_weights_version_on_each_completion():
    from ctu.engines.hf.engine import HFEngine
    from ctu.engines.hf.models import load_model, load_tokenizer

    engine = HFEngine(load_model("tiny-random"), load_tokenizer("tiny-random"))
    params = SamplingParams(max_tokens=3, seed=0)
    assert engine.generate_sync([[1, 2, 3]], params)[0][0].version is None  # never synced: unknown
    engine.update_weights([], version=7)
    rows = engine.generate_sync([[1, 2, 3], [4, 5]], replace(params, n=2))
    assert [c.version for row in rows for c in row] == [7, 7, 7, 7]
