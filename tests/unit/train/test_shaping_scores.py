"""A shaping judge's score earns a bonus only when it is a finite number: NaN, an infinity or an integer beyond a
float earns none (NaN, clamped, was the largest bonus)."""

import asyncio

import httpx
import pytest
import respx

from ctu.config.schema import ShapingConfig
from ctu.train.shaping import JudgeShaper
from tests.fakes.chat_server import completion

URL = "http://api.test/v1/chat/completions"


@pytest.mark.parametrize("reply, bonus", [
    ('{"score": NaN}', 0.0), ('{"score": nan}', 0.0), ('{"score": Infinity}', 0.0), ('{"score": -Infinity}', 0.0),
    ('{"score": 1' + "0" * 400 + "}", 0.0), ('{"score": 0.5}', 0.05), ('{"score": 7}', 0.1), ('{"score": -3}', -0.1),
])
@respx.mock
def test_only_a_finite_score_earns_a_bonus(reply, bonus):
    respx.post(URL).mock(return_value=httpx.Response(200, json=completion(reply)))
    shaper = JudgeShaper(ShapingConfig(enabled=True, base_url="http://api.test/v1", max_retries=0, max_bonus=0.1,
                                       api_key_env="SHAPING_SCORES_TEST_KEY"), sleep=lambda s: asyncio.sleep(0))
    got, why = asyncio.run(shaper._bonus([{"role": "user", "content": "hi"}]))
    assert got == pytest.approx(bonus)
    assert (why is None) == (bonus != 0.0), why
