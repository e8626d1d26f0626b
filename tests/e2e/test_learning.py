"""The trainer learns: GRPO takes a tiny model on a trivial task from <= 0.2 to >= 0.9 held-out success.

The task (tests/support/word_domain.py): name the fruit of the day, "pear". The starting model is tiny-random
taught (here, by plain supervised steps outside the trainer) to answer with one of eight fruits, pear
rarely (weight 1 of 15), so it answers well-formed but mostly wrong. Only GRPO, through the whole loop
(rollouts -> rewards -> group advantages -> PPO-clip updates -> the engine sees the new weights), can
raise the success; no gold answer is ever shown to the trainer (trainer.sft_steps=0, trainer.sft_replay=0).
"""

import asyncio
import random

import pytest
import torch

from ctu.app.trainer import Trainer
from ctu.config.schema import load_config
from ctu.domains import get_domain
from ctu.episode.env import Episode
from ctu.episode.users.scripted import ScriptedUser
from ctu.rollout.components import build_chat
from ctu.train.policy import build_policy
from ctu.train.update import sft_update, to_sample
from tests.support.word_domain import ANSWER, FRUITS

pytestmark = pytest.mark.slow
DOMAIN = "tests.support.word_domain:load"


def fruit_guesser(out_dir, steps: int = 150):
    """tiny-random after supervised steps on (question -> some fruit) pairs, pear 1/15 of the time."""
    config = load_config("configs/quickstart.yaml", ["model.path=tiny-random", "lora.enabled=false",
                                                     f"env.domains=[{DOMAIN}]"])
    policy = build_policy(config, device="cpu")
    chat = build_chat(config, tokenizer=policy.tokenizer)
    domain = get_domain(DOMAIN)
    samples = []
    for task in domain.split("train"):
        messages = asyncio.run(Episode(domain, task, ScriptedUser().start(domain, task), max_turns=2).reset())
        prompt = chat.prompt_ids(messages, domain.openai_tools())
        for fruit in FRUITS:
            answer = chat.encode(chat.render_assistant_text({"role": "assistant", "content": fruit}))
            sample = to_sample(prompt, answer, [1] * len(answer), [0.0] * len(answer), 0.0)
            samples += [sample] * (1 if fruit == ANSWER else 2)
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=3e-3)
    rng = random.Random(0)
    for _ in range(steps):
        sft_update(policy, optimizer, rng.sample(samples, 32), token_budget=8192)
    policy.model.save_pretrained(out_dir)
    policy.tokenizer.save_pretrained(out_dir)
    return out_dir


def test_grpo_takes_a_tiny_model_from_chance_to_mastery(tmp_path):
    model_dir = fruit_guesser(tmp_path / "guesser")
    config = load_config("configs/quickstart.yaml", [
        f"model.path={model_dir}", "lora.enabled=false", f"env.domains=[{DOMAIN}]", f"run.dir={tmp_path / 'run'}",
        "env.max_turns=2", "sampling.max_tokens=8", "sampling.temperature=1.0", "sampling.top_p=1.0",
        "eval.temperature=1.0", "eval.samples_per_task=8", "trainer.eval_max_tasks=8",
        "trainer.sft_steps=0", "trainer.sft_replay=0", "trainer.max_steps=30", "trainer.tasks_per_step=4", "trainer.samples_per_task=8",
        "trainer.lr=1e-3", "trainer.warmup_steps=0", "trainer.kl_coef=0", "trainer.advantage=grpo", "trainer.ckpt_interval=100",
        "trainer.examples_interval=100", "trainer.export=false"])
    summary = Trainer(config).run()
    before, after = summary["before"]["eval/word/success"], summary["after"]["eval/word/success"]
    print(f"held-out success: {before:.3f} -> {after:.3f}")
    assert before <= 0.2
    assert after >= 0.9
