"""Judge shaping ("taxonomy feedback"), training only: an LLM judge names a trajectory's failure
modes and ctu adds a bounded bonus or penalty to the training reward.

The bonus is ``max_bonus`` x (score in [-1, 1]) from the judge's verdict. It only ever reaches
``TrainingRewards.shaped``; evaluation reports read ``Trajectory.reward`` (the environment's).
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections.abc import Sequence

from ctu.config.redact import redact
from ctu.config.schema import ShapingConfig
from ctu.episode.judge import conversation_text
from ctu.episode.llm_api import ChatAPIConfig, ChatClient, LLMCallError
from ctu.episode.parsing import repair_json

log = logging.getLogger(__name__)
FAILURE_MODES = ("wrong_tool", "wrong_arguments", "policy_violation", "missing_confirmation",
                 "hallucinated_information", "gave_up_early", "none")
PROMPT = f"""You review a customer-service agent's conversation. Name its failure modes, from this list:
{", ".join(FAILURE_MODES)}. Then score the agent's process from -1 (harmful) to 1 (exemplary).
Answer with JSON only: {{"failure_modes": [...], "score": <number between -1 and 1>}}"""


def _finite(score: int | float) -> float | None:
    """The score as a finite float, or None (NaN, an infinity, an integer too large for a float)."""
    try:
        value = float(score)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


class JudgeShaper:
    def __init__(self, config: ShapingConfig, sleep=None):
        api = ChatAPIConfig(model=config.model, base_url=config.base_url, api_key_env=config.api_key_env,
                            max_retries=config.max_retries, backoff_initial=config.backoff_initial,
                            backoff_max=config.backoff_max, timeout=config.timeout)
        self.client = ChatClient(api) if sleep is None else ChatClient(api, sleep=sleep)
        self.max_bonus = config.max_bonus
        self.max_tokens = config.max_tokens

    async def bonus(self, messages) -> float:
        return (await self._bonus(messages))[0]

    async def _bonus(self, messages) -> tuple[float, str | None]:
        """The bonus, and why there is none (None when the judge gave a score)."""
        try:
            text = await self.client.complete([{"role": "system", "content": PROMPT},
                                               {"role": "user", "content": conversation_text(messages)}],
                                              max_tokens=self.max_tokens)
        except LLMCallError as exc:
            return 0.0, str(exc)  # no verdict, no shaping: the env reward stands alone
        match = re.search(r"\{.*\}", text, re.S)
        parsed = repair_json(match.group(0)) if match else None
        score = parsed[0].get("score") if parsed and isinstance(parsed[0], dict) else None
        if not isinstance(score, (int, float)) or isinstance(score, bool):
            return 0.0, f"the shaping judge's reply has no numeric score: {text[:200]!r}"
        value = _finite(score)
        if value is None:  # NaN compares false with both bounds: clamped, it was the largest bonus
            return 0.0, f"the shaping judge's score is not a finite number: {text[:200]!r}"
        return self.max_bonus * max(-1.0, min(1.0, value)), None

    async def bonuses(self, trajectories: Sequence) -> list[float]:
        """One bonus per trajectory; those without one (the judge failed or gave no score) are counted in one
        warning line with the first reason."""
        results = await asyncio.gather(*(self._bonus(t.messages) for t in trajectories))
        missed = [why for _, why in results if why is not None]
        if missed:
            log.warning("%s", redact(f"shaping: no bonus for {len(missed)} of {len(results)} episode(s) "
                                     f"(first: {missed[0]})"))
        return [bonus for bonus, _ in results]
