"""Branched rollouts (trainer.branch_k): siblings forked after the first tool result share its tokens and state."""

import asyncio

import pytest

from ctu.config.checks import config_problems
from ctu.config.schema import load_config
from ctu.config.yaml_load import ConfigError
from ctu.domains import get_domain
from ctu.engines.base import Completion, Engine, SamplingParams
from ctu.episode.users.scripted import ScriptedUser
from ctu.rollout.chat import ChatFormat
from ctu.rollout.loop import Branching, EpisodeSpec, RolloutLimits, rollout

MINI = get_domain("mini")
TASK = next(t for t in MINI.tasks if t.description["kind"] == "cancel" and not t.description["refusal"])
OID = TASK.actions[0].arguments["order_id"]
LOOKUP = f'<tool_call>{{"name": "get_order", "arguments": {{"order_id": "{OID}"}}}}</tool_call>'
CANCEL = f'<tool_call>{{"name": "cancel_order", "arguments": {{"order_id": "{OID}"}}}}</tool_call>'


class DecidingModel(Engine):
    """Looks the order up, then takes the next of ``choices`` at the decision, then closes."""

    def __init__(self, chat, choices):
        self.chat, self.choices, self.base = chat, list(choices), None

    async def generate(self, prompts, params, seeds=None):
        out = []
        for prompt in prompts:
            text = self.chat.tokenizer.decode(prompt)
            self.base = text.count("<tool_call>") if self.base is None else self.base
            calls = text.count("<tool_call>") - self.base
            reply = LOOKUP if calls == 0 and "I cannot" not in text else (
                self.choices.pop(0) if calls == 1 and "I cannot" not in text else "Your order is cancelled.")
            ids = self.chat.encode(reply) + [self.chat.stop_token_ids[0]]
            out.append([Completion(tuple(ids), tuple([-0.1] * len(ids)), "stop")])
        return out

    def update_weights(self, named_tensors):
        raise NotImplementedError


@pytest.fixture(scope="module")
def chat():
    from transformers import AutoTokenizer

    from ctu.engines.hf.models import smollm2_tokenizer_dir

    return ChatFormat(AutoTokenizer.from_pretrained(smollm2_tokenizer_dir()))


def play(chat, choices, branch):
    return asyncio.run(rollout([EpisodeSpec(MINI, TASK)], chat, DecidingModel(chat, choices), ScriptedUser(),
                               SamplingParams(temperature=1.0, max_tokens=64, seed=3), RolloutLimits(),
                               branch=branch))


def test_siblings_share_the_prefix_train_it_once_and_each_own_a_copy_of_the_db(chat):
    (alone,) = play(chat, [CANCEL], None)
    root, second, refused = play(chat, [CANCEL, CANCEL, "I cannot cancel it: it has shipped."], Branching(3))
    assert alone.fork is None and root.response_ids == alone.response_ids and root.loss_mask == alone.loss_mask
    fork_at = root.fork[1]
    assert [t.fork for t in (root, second, refused)] == [(0, fork_at), (1, fork_at), (2, fork_at)]
    assert 0 < fork_at < len(root.response_ids)
    for sibling in (second, refused):
        assert sibling.prompt_ids == root.prompt_ids and sibling.response_ids[:fork_at] == root.response_ids[:fork_at]
        assert not any(sibling.loss_mask[:fork_at]) and sibling.loss_mask[fork_at:] == [
            1 if any(s <= i < e for s, e in sibling.assistant_spans) else 0
            for i in range(fork_at, len(sibling.response_ids))]
        assert len(sibling.token_versions) == len(sibling.response_ids)
    # the second cancel succeeds on its own copy of the DB: the root's write did not reach it
    assert [t.reward for t in (root, second, refused)] == [1.0, 1.0, 0.0]


def test_branching_is_refused_where_the_loop_cannot_fork():
    for key in ("trainer.max_staleness=1", "distributed.rollout_workers=2", "user.kind=llm"):
        with pytest.raises(ConfigError, match=f"^trainer.branch_k: 4 cannot be combined with {key.split('=')[0]} "):
            load_config(None, ["trainer.branch_k=4", key, "trainer.tis_cap=2.0"])
    assert not any("branch_k" in p for p in config_problems(load_config(None, ["trainer.branch_k=4"])))
