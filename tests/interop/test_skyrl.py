"""SkyRL's own entry point on ctu's parquet tasks (``nox -s interop_skyrl``): ``register()`` then
``skyrl_gym.make(env_class, env_config=, extras=row)`` as SkyRL's generator calls it; gold turns score 1.0,
turns without the DB changes 0.0."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

skyrl_gym = pytest.importorskip("skyrl_gym")  # only in the interop_skyrl venv

import pyarrow.parquet as pq  # noqa: E402
from omegaconf import DictConfig  # noqa: E402
from skyrl_gym.envs.base_text_env import BaseTextEnv  # noqa: E402

from ctu.app.integrations.skyrl_env import register  # noqa: E402
from ctu.domains import get_domain  # noqa: E402
from ctu.episode.data.conversations import gold_conversation  # noqa: E402
from ctu.episode.data.prompts import row_task  # noqa: E402
from ctu.episode.env import agent_view  # noqa: E402
from tests.unit.app.test_integrations import without_mutations  # noqa: E402


def hermes_turn(message) -> str:
    """An assistant message as the model writes it in ctu's hermes format (no tokenizer needed here)."""
    parts = [message.get("content") or ""] if message.get("content") else []
    for call in message.get("tool_calls") or []:
        fn = call["function"]
        parts.append(f'<tool_call>\n{{"name": {json.dumps(fn["name"])}, "arguments": {fn["arguments"]}}}\n</tool_call>')
    return "\n".join(parts) + "<|im_end|>"


def turns(messages) -> list[str]:
    return [hermes_turn(m) for m in agent_view(messages)[3:] if m["role"] == "assistant"]


def exported_rows(tmp_path, name: str, n: int = 4):
    out = tmp_path / f"{name}.parquet"
    subprocess.run([sys.executable, "-m", "ctu", "data", "export", "--domain", name, "--split", "train",
                    "--format", "parquet", "--out", str(out)], check=True)
    domain = get_domain(name)
    rows = [r for r in pq.read_table(out).to_pylist()
            if any(domain.tool(a.name).mutates for a in row_task(r)[1].actions if a.requestor == "assistant")]
    return domain, rows[:n]


def episode(row, turns_text, max_turns=40):
    """SkyRL's generator loop, minus the model: make, init, step each turn's text until done."""
    extras = {k: v for k, v in row.items() if k not in ("prompt", "env_class")}
    extras["max_turns"] = max_turns  # the generator sets it from generator.max_turns
    env = skyrl_gym.make(row["env_class"], env_config=DictConfig({"patience": 30}), extras=extras)
    assert isinstance(env, BaseTextEnv) and isinstance(env, skyrl_gym.Env)
    history, _ = env.init(row["prompt"])
    assert history == row["prompt"]
    out = None
    for text in turns_text:
        out = env.step(text)
        if out["done"]:
            break
        history += out["observations"]
    env.close()
    return out, env.get_metrics()


@pytest.mark.parametrize("name", ["mini", "retail", "airline", "telecom"])
def test_gold_turns_score_1_and_turns_without_the_db_changes_0(tmp_path, name):
    assert f"ctu_{name}" in register()
    domain, rows = exported_rows(tmp_path, name)
    assert rows
    for row in rows:
        assert row["env_class"] == f"ctu_{name}"
        gold = gold_conversation(domain, row_task(row)[1])
        out, metrics = episode(row, turns(gold.messages))
        assert out["done"] and out["reward"] == 1.0, out["metadata"]["reasons"]
        assert metrics["reward"] == 1.0 and metrics["parse_failures"] == 0
        out, _ = episode(row, turns(without_mutations(domain, gold.messages)))
        assert out["done"] and out["reward"] == 0.0


def test_registering_twice_keeps_one_entry_and_max_turns_ends_an_episode_with_0(tmp_path):
    ids = register(["retail"])
    assert register(["retail"]) == ids == ["ctu_retail"]
    _, rows = exported_rows(tmp_path, "retail", 1)
    out, metrics = episode(rows[0], ['<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>'] * 3, max_turns=2)
    assert out["done"] and out["reward"] == 0.0 and out["metadata"]["termination"] == "max_turns"
    assert metrics["turns"] == 2
