"""Every integer key that counts or sizes something is validated, with a one-line error naming the key: a
property test over all of them, found by walking the config's dataclasses (a new int key must be listed here)."""

import dataclasses
import types
import typing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctu.app.cli import main
from ctu.config.schema import Config, ConfigError, load_config

# key -> the smallest valid value (counts of things that may be absent start at 0; None stays allowed where typed)
COUNT_MINIMUMS = {
    "engine.max_batch_size": 1, "engine.max_retries": 0, "engine.parity_probe_tokens": 1, "engine.kv_cache_tokens": 1, "engine.max_loras": 1,
    "sampling.max_tokens": 1, "sampling.top_k": 0,
    "user.max_retries": 0, "user.max_tokens": 1, "user.patience": 1,
    "judge.max_retries": 0, "judge.max_tokens": 1, "shaping.max_retries": 0, "shaping.max_tokens": 1,
    "env.max_turns": 1, "env.max_errors": 1, "env.max_context_tokens": 1,
    "filters.max_assistant_tokens": 1,
    "eval.samples_per_task": 1, "eval.max_tasks": 1, "eval.concurrency": 1,
    "lora.rank": 1, "lora.alpha": 1,
    "trainer.max_steps": 1, "trainer.tasks_per_step": 1, "trainer.samples_per_task": 1, "trainer.mini_batches": 1,
    "trainer.ppo_epochs": 1, "trainer.micro_batch_tokens": 1, "trainer.logit_chunk_mib": 1, "trainer.warmup_steps": 0,
    "trainer.dynamic_sampling_max_draws": 0, "trainer.max_staleness": 0, "trainer.sft_steps": 0,
    "trainer.sft_replay": 0, "trainer.branch_k": 1,
    "trainer.sft_batch_size": 1,
    "trainer.ckpt_interval": 1, "trainer.keep_checkpoints": 1, "trainer.eval_interval": 0,
    "trainer.eval_max_tasks": 1, "trainer.examples_interval": 1, "trainer.examples_count": 0,
    "distributed.rollout_workers": 0, "distributed.trainer_workers": 0, "agent.concurrency": 1,
}
NOT_COUNTS = {"sampling.seed", "run.seed"}  # any integer is a seed
BASE = ["trainer.advantage=rloo"]  # one sample per task is then valid, so every key's minimum is too


def int_keys(cls=Config, prefix=""):
    """(dotted key, allows None) of every int field of the config."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp, key = hints[f.name], f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            yield from int_keys(tp, f"{key}.")
            continue
        args = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
        if int in args:
            yield key, type(None) in args


def test_every_int_key_is_known_as_a_count_or_a_seed():
    assert {k for k, _ in int_keys()} == set(COUNT_MINIMUMS) | NOT_COUNTS


@pytest.mark.parametrize("key", sorted(COUNT_MINIMUMS))
@settings(max_examples=8, deadline=None)
@given(below=st.integers(min_value=1, max_value=10**6))
def test_a_count_below_its_minimum_is_one_line_naming_the_key(key, below):
    value = COUNT_MINIMUMS[key] - below
    with pytest.raises(ConfigError) as caught:
        load_config(None, [*BASE, f"{key}={value}"])
    message = str(caught.value)
    assert message.startswith(f"{key}: must be ") and message.endswith(f"got {value}") and "\n" not in message


@pytest.mark.parametrize("key", sorted(COUNT_MINIMUMS))
def test_each_count_accepts_its_minimum(key):
    node = load_config(None, [*BASE, f"{key}={COUNT_MINIMUMS[key]}"])
    for part in key.split("."):
        node = getattr(node, part)
    assert node == COUNT_MINIMUMS[key]


def test_eval_max_tasks_mistakes_fail_on_the_command_line(tmp_path, capsys):
    for value in (-1, 0):
        assert main(["eval", "model.path=tiny-random", f"run.dir={tmp_path}", f"eval.max_tasks={value}"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"ctu: config error: eval.max_tasks: must be >= 1 (or null for every task), got {v}" for v in (-1, 0)]
    assert not tmp_path.joinpath("config.yaml").exists()
