import asyncio
import json

import httpx
import pytest
import respx

from ctu.episode.judge import JudgeError, LLMJudge, read_verdicts
from ctu.episode.reward import nl_verdicts, score_transcript
from tests.support.toy_domain import make_toy_domain

BASE = "http://judge.test/v1"


def completion(text):
    return httpx.Response(200, json={"id": "x", "object": "chat.completion", "created": 0, "model": "j", "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}]})


@respx.mock
def test_judge_verdicts_feed_the_nl_component(monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", "k")
    verdict = {"results": [{"expectedOutcome": "Agent is polite.", "reasoning": "rude", "metExpectation": False}]}
    route = respx.post(f"{BASE}/chat/completions").mock(return_value=completion("```json\n" + json.dumps(verdict) + "\n```"))
    domain = make_toy_domain()
    task = domain.task("judged")
    msgs = [{"role": "assistant", "content": "go away"}, {"role": "user", "content": "###STOP###"}]
    judge = LLMJudge("judge-model", base_url=BASE, api_key_env="JUDGE_KEY")
    verdicts = asyncio.run(nl_verdicts(judge, task, msgs))
    reward = score_transcript(domain, task, msgs, "user_stop", verdicts=verdicts)
    assert reward.components["NL_ASSERTION"] == 0.0 and "rude" in reward.reasons[0]
    body = json.loads(route.calls[0].request.content)
    assert "assistant: go away" in body["messages"][1]["content"] and "Agent is polite." in body["messages"][1]["content"]


def test_unreadable_verdicts_are_errors_not_passes():
    with pytest.raises(JudgeError):
        read_verdicts("I think yes", 1)
    with pytest.raises(JudgeError):
        read_verdicts('{"results": []}', 1)
    with pytest.raises(JudgeError):
        read_verdicts('{"results": [{"metExpectation": "yes"}]}', 1)
    assert read_verdicts('{"results": [{"metExpectation": true, "reasoning": "ok"}]}', 1) == [(True, "ok")]
