"""The agent loop's edge cases, with the real SmolLM2 tokenizer and a scripted stand-in for the model."""

import asyncio
import json

import httpx
import pytest
import respx

from ctu.domains import get_domain
from ctu.engines.base import Completion, Engine, SamplingParams
from ctu.engines.vllm.remote import RemoteEngine
from ctu.episode.reward import score_transcript
from ctu.episode.users.base import UserSession, UserSimulator, UserSimulatorError
from ctu.episode.users.scripted import ScriptedUser
from ctu.rollout.chat import ChatFormat
from ctu.rollout.loop import EpisodeSpec, RolloutLimits, rollout


class ScriptedModel(Engine):
    """Stands in for a model server: replies with given texts (or raw ids), in order, per prompt row."""

    def __init__(self, chat, turns, finish=None):
        self.chat, self.turns, self.finish = chat, list(turns), finish or {}
        self.calls = 0
        self.seen_prompts = []

    async def generate(self, prompts, params, seeds=None):
        out = []
        for prompt in prompts:
            self.seen_prompts.append(list(prompt))
            i = min(self.calls, len(self.turns) - 1)
            turn = self.turns[i]
            ids = turn if isinstance(turn, list) else self.chat.encode(turn) + [self.chat.stop_token_ids[0]]
            reason = self.finish.get(i, "stop")
            if reason == "length":
                ids = ids[: params.max_tokens]
            out.append([Completion(tuple(ids), tuple([-0.1] * len(ids)), reason)])
            self.calls += 1
        return out

    def update_weights(self, named_tensors):
        raise NotImplementedError


@pytest.fixture(scope="module")
def chat():
    from transformers import AutoTokenizer

    from ctu.engines.hf.models import smollm2_tokenizer_dir

    return ChatFormat(AutoTokenizer.from_pretrained(smollm2_tokenizer_dir()))


MINI = get_domain("mini")
TASK = next(t for t in MINI.tasks if t.description["kind"] == "cancel" and not t.description["refusal"])
OID = TASK.actions[0].arguments["order_id"]
GOLD_TURNS = [f'<tool_call>{{"name": "get_order", "arguments": {{"order_id": "{OID}"}}}}</tool_call>',
              f'<tool_call>{{"name": "cancel_order", "arguments": {{"order_id": "{OID}"}}}}</tool_call>',
              "Your order is cancelled."]


def run(chat, engine, user=None, limits=None, specs=None):
    return asyncio.run(rollout(specs or [EpisodeSpec(MINI, TASK)], chat, engine, user or ScriptedUser(),
                               SamplingParams(temperature=1.0, max_tokens=64), limits or RolloutLimits()))


def test_a_good_episode_is_token_exact_and_rescores_the_same(chat):
    engine = ScriptedModel(chat, GOLD_TURNS)
    (t,) = run(chat, engine)
    assert t.stop_reason == "done" and t.termination == "user_stop" and t.reward == 1.0 and t.turns == 3
    assert t.tool_calls == 2 and t.parse_failures == 0
    assert len(t.assistant_spans) == 3
    for (start, end), text in zip(t.assistant_spans, GOLD_TURNS, strict=True):
        assert chat.tokenizer.decode(t.response_ids[start:end]) == text + "<|im_end|>"
        assert all(t.loss_mask[i] == 1 for i in range(start, end))
    assert sum(t.loss_mask) == sum(e - s for s, e in t.assistant_spans)
    # every prompt the model saw is the previous sequence extended, never re-tokenized
    for earlier, later in zip(engine.seen_prompts, engine.seen_prompts[1:], strict=False):
        assert later[: len(earlier)] == earlier
    assert (t.prompt_ids + t.response_ids)[: len(engine.seen_prompts[-1])] == engine.seen_prompts[-1]
    text = json.dumps(t.messages)
    assert "<|im_start|>" not in text and "<|im_end|>" not in text and "<tool_call>" not in text
    assert score_transcript(MINI, TASK, t.messages, t.termination).reward == t.reward


def test_empty_generation_and_a_model_that_never_speaks(chat):
    (t,) = run(chat, ScriptedModel(chat, [[]]))  # nothing at all, not even an end-of-turn token
    assert t.stop_reason in ("done", "max_turns") and t.reward == 0.0
    (t,) = run(chat, ScriptedModel(chat, [[chat.stop_token_ids[0]]]), limits=RolloutLimits(max_turns=3))
    assert t.turns >= 1 and t.reward == 0.0 and t.stop_reason in ("done", "max_turns")
    assert all(m.get("content") == "" for m in t.messages if m["role"] == "assistant" and m is not t.messages[1])


def test_generation_cut_mid_json_by_max_tokens_is_a_length_stop(chat):
    engine = ScriptedModel(chat, GOLD_TURNS, finish={0: "length"})
    (t,) = asyncio.run(rollout([EpisodeSpec(MINI, TASK)], chat, engine, ScriptedUser(),
                               SamplingParams(max_tokens=9), RolloutLimits()))
    assert t.stop_reason == "length" and t.reward == 0.0 and len(t.response_ids) == 9
    assert t.response_ids[-1] not in chat.stop_token_ids


def test_context_budget_ends_the_episode(chat):
    (t,) = run(chat, ScriptedModel(chat, GOLD_TURNS), limits=RolloutLimits(max_context_tokens=700))
    assert t.stop_reason == "context" and len(t.prompt_ids) + len(t.response_ids) <= 700


class BrokenUser(UserSimulator):
    def start(self, domain, task, seed=0):
        class Session(UserSession):
            async def reply(self, agent_message):
                raise UserSimulatorError("simulator unreachable after 5 attempts")

        return Session()


def test_user_simulator_failure_marks_the_episode_errored(chat):
    from ctu.app.evaluate import summarize

    (t,) = run(chat, ScriptedModel(chat, GOLD_TURNS), user=BrokenUser())
    assert t.stop_reason == "error" and "unreachable" in t.error and t.reward == 0.0
    (good,) = run(chat, ScriptedModel(chat, GOLD_TURNS))
    report = summarize([t, good])
    assert report["overall"]["errored"] == 1 and report["overall"]["success_rate"] == 1.0


def test_many_episodes_are_batched_and_keep_their_order(chat):
    specs = [EpisodeSpec(MINI, task, s) for task in MINI.split("test")[:5] for s in range(2)]
    engine = ScriptedModel(chat, ["Sorry, I cannot help with that."])
    out = run(chat, engine, specs=specs)
    assert [(t.task_id, t.sample) for t in out] == [(s.task.id, s.sample) for s in specs]
    assert engine.calls == len(specs)
    assert asyncio.run(rollout([], chat, engine, ScriptedUser(), SamplingParams(), RolloutLimits())) == []


@respx.mock
def test_an_engine_server_that_keeps_failing_errors_the_episode_not_the_run(chat):
    # a 200 with a body that is not JSON, on every attempt: the run goes on, this episode is errored and says why
    respx.post("http://vllm.test/v1/completions").mock(return_value=httpx.Response(200, text="{not json"))

    async def no_sleep(seconds):
        pass

    engine = RemoteEngine("http://vllm.test/v1", "m", max_retries=1, sleep=no_sleep)
    (t,) = run(chat, engine)
    assert t.stop_reason == "error" and t.reward == 0.0 and t.error.startswith("engine: ")
    assert "http://vllm.test/v1/completions failed after 2 attempts" in t.error and "'{not json'" in t.error


def test_a_python_set_argument_does_not_stop_the_evaluation(chat):
    # a Python literal JSON has no value for: not a call (the text goes to the user), never a TypeError of the run
    (t,) = run(chat, ScriptedModel(chat, ["```python\nget_order(order_id={1, 2})\n```"]),
               limits=RolloutLimits(max_turns=2))
    assert t.stop_reason in ("done", "max_turns") and t.tool_calls == 0 and t.error is None


def test_a_fault_inside_one_episode_errors_that_episode_only(chat, monkeypatch):
    real_call, calls = type(MINI).call, []

    def faulty_call(domain, requestor, name, arguments, db):  # a domain's bug on its first call
        calls.append(name)
        if len(calls) == 1:
            raise KeyError("payment_history")
        return real_call(domain, requestor, name, arguments, db)

    monkeypatch.setattr(type(MINI), "call", faulty_call)
    engine = ScriptedModel(chat, [GOLD_TURNS[0], *GOLD_TURNS])
    specs = [EpisodeSpec(MINI, TASK, 0), EpisodeSpec(MINI, TASK, 1)]
    bad, good = asyncio.run(rollout(specs, chat, engine, ScriptedUser(), SamplingParams(temperature=1.0, max_tokens=64),
                                    RolloutLimits(), concurrency=1))
    assert bad.stop_reason == "error" and bad.error == "episode: KeyError: 'payment_history'" and bad.reward == 0.0
    assert good.stop_reason == "done" and good.reward == 1.0
