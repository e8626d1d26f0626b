"""verl's own entry points on ctu's parquet tasks (``nox -s interop_verl``): the custom reward function loader
(``reward.custom_reward_function.path=pkg://ctu.app.integrations.verl_reward``) and the naive reward manager that
decodes a rollout's response ids and calls it. A gold response scores 1.0, one without its DB changes 0.0."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

verl = pytest.importorskip("verl")  # only in the interop_verl venv

import numpy as np  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager  # noqa: E402
from verl.trainer.ppo.reward import get_custom_reward_fn  # noqa: E402
from verl.utils.reward_score import default_compute_score  # noqa: E402

import ctu.app.integrations.verl_reward as verl_reward  # noqa: E402
from ctu.domains import get_domain  # noqa: E402
from ctu.engines.hf.models import smollm2_tokenizer_dir  # noqa: E402
from ctu.episode.data.conversations import gold_conversation  # noqa: E402
from ctu.episode.data.prompts import row_task  # noqa: E402
from ctu.episode.env import agent_view  # noqa: E402
from ctu.rollout.chat import ChatFormat  # noqa: E402
from tests.unit.app.test_integrations import without_mutations  # noqa: E402


@pytest.fixture(scope="module")
def chat():
    return ChatFormat(AutoTokenizer.from_pretrained(smollm2_tokenizer_dir()), "hermes")


def exported_rows(tmp_path, name: str, n: int = 3):
    out = tmp_path / f"{name}.parquet"
    subprocess.run([sys.executable, "-m", "ctu", "data", "export", "--domain", name, "--split", "train",
                    "--format", "parquet", "--out", str(out)], check=True)
    domain = get_domain(name)
    rows = [r for r in pq.read_table(out).to_pylist()
            if any(domain.tool(a.name).mutates for a in row_task(r)[1].actions if a.requestor == "assistant")]
    return domain, rows[:n]


def rollout_ids(chat, row, messages, tools):
    """(prompt ids, response ids) as verl's tool agent loop leaves them: the prompt rendered with the generation
    prompt, then every assistant turn with the tool results / user turns between them."""
    prompt = chat.render(row["prompt"], tools, add_generation_prompt=True)
    full = chat.render(agent_view(messages), tools)
    assert full.startswith(prompt)
    return chat.encode(prompt), chat.encode(full[len(prompt):])


def manager_score(manager, row, prompt_ids, response_ids, tool_extra_fields=None):
    """NaiveRewardManager.run_single on a one-sample DataProto (left-padded prompt, right-padded response)."""
    width = len(response_ids) + 5
    responses = torch.tensor([response_ids + [0] * 5])
    prompts = torch.tensor([prompt_ids])
    attention = torch.tensor([[1] * len(prompt_ids) + [1] * len(response_ids) + [0] * 5])
    assert responses.shape[1] == width
    data = DataProto.from_dict(
        tensors={"prompts": prompts, "responses": responses, "attention_mask": attention},
        non_tensors={"data_source": np.array([row["data_source"]], dtype=object),
                     "reward_model": np.array([row["reward_model"]], dtype=object),
                     "extra_info": np.array([dict(row["extra_info"])], dtype=object),
                     **({"tool_extra_fields": np.array([tool_extra_fields], dtype=object)} if tool_extra_fields
                        else {})})
    return manager.loop.run_until_complete(manager.run_single(data))  # the loop verl bound it to


@pytest.mark.parametrize("path", ["pkg://ctu.app.integrations.verl_reward", "file"])
def test_verl_loads_ctus_reward_function_and_its_manager_scores_gold_1_and_wrong_0(tmp_path, chat, path):
    if path == "file":  # the other spelling verl accepts: the module's file
        path = str(Path(verl_reward.__file__).resolve())
    config = OmegaConf.create({"reward": {"custom_reward_function": {"path": path, "name": "compute_score",
                                                                      "reward_kwargs": {}}}})
    fn = get_custom_reward_fn(config)
    manager = NaiveRewardManager(OmegaConf.create({}), chat.tokenizer, fn)
    for name in ("mini", "retail", "airline"):
        domain, rows = exported_rows(tmp_path, name)
        assert rows and all(r["data_source"] == f"ctu/{name}" for r in rows)
        for row in rows:
            gold = gold_conversation(domain, row_task(row)[1])
            prompt_ids, response_ids = rollout_ids(chat, row, gold.messages, gold.tools)
            result = manager_score(manager, row, prompt_ids, response_ids)
            assert result["reward_score"] == 1.0, (name, row["extra_info"], result)
            assert result["reward_extra_info"]["acc"] == 1.0
            wrong_ids = rollout_ids(chat, row, without_mutations(domain, gold.messages), gold.tools)
            assert manager_score(manager, row, *wrong_ids)["reward_score"] == 0.0
            # the loaded function itself, as verl's other reward managers call it
            text = chat.tokenizer.decode(response_ids, skip_special_tokens=True)
            assert fn(data_source=row["data_source"], solution_str=text, ground_truth=row["reward_model"]
                      ["ground_truth"], extra_info=dict(row["extra_info"]))["score"] == 1.0


def test_verls_default_dispatch_has_no_ctu_rows_and_ctus_function_hands_it_the_rest():
    with pytest.raises(NotImplementedError):
        default_compute_score("ctu/retail", "", "{}")
    gsm8k = "The answer is #### 42"
    assert verl_reward.compute_score("openai/gsm8k", gsm8k, "42") == default_compute_score("openai/gsm8k", gsm8k,
                                                                                            "42") == 1.0
    assert verl_reward.compute_score("openai/gsm8k", "#### 41", "42") == 0.0


def test_dual_control_is_scored_from_the_transcript_an_agent_loop_records(tmp_path, chat):
    """telecom: the user's phone actions are not in the response text; an agent loop that keeps the transcript in
    its extra_fields (merged into extra_info by verl's manager) gets it scored."""
    fn = get_custom_reward_fn(OmegaConf.create({"reward": {"custom_reward_function": {
        "path": "pkg://ctu.app.integrations.verl_reward", "name": "compute_score"}}}))
    manager = NaiveRewardManager(OmegaConf.create({}), chat.tokenizer, fn)
    domain, rows = exported_rows(tmp_path, "telecom", 2)
    for row in rows:
        gold = gold_conversation(domain, row_task(row)[1])
        ids = rollout_ids(chat, row, gold.messages, gold.tools)
        assert manager_score(manager, row, *ids, {"messages": gold.messages})["reward_score"] == 1.0
        wrong = without_mutations(domain, gold.messages)
        assert manager_score(manager, row, *ids, {"messages": wrong})["reward_score"] == 0.0
        with pytest.raises(ValueError, match="dual control"):
            manager_score(manager, row, *ids)
