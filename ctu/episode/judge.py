"""LLM judge for NL_ASSERTION (evaluation) through an OpenAI-compatible chat API.

The judge grades each natural-language assertion of a task against the conversation, as
tau2-bench's NL-assertion evaluator does, and returns (met, reasoning) per assertion. A reply
that cannot be read as one verdict per assertion is an error, never a silent pass.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ctu.config.redact import redact
from ctu.episode.llm_api import ChatAPIConfig, ChatClient, LLMCallError
from ctu.episode.parsing import repair_json

JUDGE_PROMPT = """You are given a list of expected outcomes and a conversation between a customer service agent
and a customer. Decide, for each expected outcome separately, whether the agent satisfied it.
Answer with a JSON object only:
{"results": [{"expectedOutcome": "<the outcome>", "reasoning": "<short reason>", "metExpectation": true or false}]}
with one result per expected outcome, in the same order."""


class JudgeError(LLMCallError):
    """The judge could not be reached or gave an unreadable verdict."""


def conversation_text(messages: Sequence[Mapping[str, Any]]) -> str:
    return "\n".join(f"{m.get('role')}: {m.get('content') or ''}" for m in messages if m.get("role") != "system")


def read_verdicts(text: str, n: int) -> list[tuple[bool, str]]:
    match = re.search(r"\{.*\}", text, re.S)
    parsed = repair_json(match.group(0)) if match else None
    results = parsed[0].get("results") if parsed and isinstance(parsed[0], dict) else None
    if not isinstance(results, list) or len(results) != n:
        raise JudgeError(f"judge reply is not {n} verdict(s): {text[:200]!r}")
    verdicts = []
    for item in results:
        met = item.get("metExpectation") if isinstance(item, dict) else None
        if not isinstance(met, bool):
            raise JudgeError(f"judge verdict without a boolean metExpectation: {item!r}")
        verdicts.append((met, str(item.get("reasoning", ""))))
    return verdicts


class LLMJudge:
    """Grades NL assertions; implements ``ctu.episode.reward.NLJudge``."""

    def __init__(self, model: str | ChatAPIConfig, base_url: str | None = None, api_key_env: str = "OPENAI_API_KEY",
                 sleep=None, max_tokens: int = 512):
        """``model``: a model name (with ``base_url``/``api_key_env``) or a whole ChatAPIConfig (retry budget too)."""
        config = model if isinstance(model, ChatAPIConfig) else ChatAPIConfig(model, base_url, api_key_env)
        self.client = ChatClient(config) if sleep is None else ChatClient(config, sleep=sleep)
        self.max_tokens = max_tokens

    def __repr__(self) -> str:
        url = redact(self.client.config.base_url) if self.client.config.base_url else None
        return f"LLMJudge(model={self.client.config.model!r}, base_url={url!r})"

    async def judge(self, assertions: Sequence[str], messages: Sequence[Mapping[str, Any]]) -> list[tuple[bool, str]]:
        prompt = f"conversation:\n{conversation_text(messages)}\n\nexpectedOutcomes:\n{json.dumps(list(assertions))}"
        text = await self.client.complete([{"role": "system", "content": JUDGE_PROMPT},
                                           {"role": "user", "content": prompt}], temperature=0.0,
                                          max_tokens=self.max_tokens)
        return read_verdicts(text, len(assertions))
