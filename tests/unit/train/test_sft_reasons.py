"""``trainer.sft_reasons``: gold demonstrations state why before a call (mini: the order status the lookup
returned, then the write it allows), so the decision follows a token the policy has just written."""

import json

import pytest

from ctu.config.schema import ConfigError, load_config
from ctu.domains import get_domain
from ctu.episode.data.conversations import gold_conversation
from ctu.episode.reward import score_transcript
from ctu.episode.transcripts import ending
from ctu.train.demos import warm_start_samples
from tests.unit.episode.test_data_sft import MINI, assert_a_rollout_gives_its_tokens, mini_tasks


def test_each_gold_write_states_the_looked_up_status_first_and_the_rest_is_unchanged():
    for task in mini_tasks():
        plain = gold_conversation(MINI, task).messages
        reasoned = gold_conversation(MINI, task, reasons=True).messages
        assert score_transcript(MINI, task, reasoned, ending(reasoned, "user_stop")).reward == 1.0
        writes = [i for i, m in enumerate(reasoned) if m.get("tool_calls") and
                  m["tool_calls"][0]["function"]["name"] != "get_order"]
        assert len(writes) == (task.description["kind"] != "status" and not task.description["refusal"])
        for i in writes:
            looked_up = json.loads(reasoned[i - 1]["content"])["status"]
            assert reasoned[i]["content"].startswith(f"The order status is {looked_up}, so I will ")
            assert reasoned[i]["tool_calls"] == plain[i]["tool_calls"]
        assert [m for i, m in enumerate(reasoned) if i not in writes] == \
            [m for i, m in enumerate(plain) if i not in writes]


def test_a_reasoned_demos_tokens_are_what_a_rollout_of_the_same_turns_gives(chat_format):
    """The stated reason and the call in one turn parse back into both: the warm start trains on rollout tokens."""
    for task in mini_tasks():
        assert_a_rollout_gives_its_tokens(chat_format, MINI, task, gold_conversation(MINI, task, reasons=True))


def test_a_domain_without_reasons_and_a_file_are_refused_naming_the_field(chat_format, tmp_path):
    with pytest.raises(ConfigError, match=r"trainer\.sft_reasons: no domain of airline gives reasons"):
        warm_start_samples(chat_format, [get_domain("airline")], reasons=True)
    data = tmp_path / "d.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}\n')
    with pytest.raises(ConfigError, match=r"trainer\.sft_reasons: states reasons in gold demonstrations"):
        load_config(None, [f"trainer.sft_data={data}", "trainer.sft_reasons=true", "trainer.sft_steps=2"])
