"""A trivial domain for the learning test: the customer asks for the store's fruit of the day; it is "pear".

No tools: an episode is one question and one answer, and the reward is COMMUNICATE ("pear" said).
Loaded by the trainer as ``env.domains=[tests.support.word_domain:load]``.
"""

from __future__ import annotations

from ctu.domains.base import Domain, Task

ANSWER = "pear"
FRUITS = ("apple", "plum", "fig", "kiwi", "lime", "melon", "grape", ANSWER)
QUESTIONS = ("What is the fruit of the day?", "Which fruit is on offer today?", "Tell me today's fruit.",
             "What fruit do you recommend today?", "Fruit of the day, please.", "Which fruit should I buy today?",
             "What is today's special fruit?", "Any fruit of the day?")


def load(data_dir: str | None = None) -> Domain:
    tasks = []
    for n in range(40):
        question = f"{QUESTIONS[n % len(QUESTIONS)]} (ticket {n})"
        tasks.append(Task(id=f"word-{n:02d}", user_scenario={"instructions": question, "script": [question]},
                          actions=(), communicate_info=(ANSWER,), reward_basis=("COMMUNICATE",)))
    ids = [t.id for t in tasks]
    return Domain(name="word", policy="Answer with the fruit of the day, in one word.", tools=(), db={},
                  tasks=tuple(tasks), splits={"train": tuple(ids[:32]), "test": tuple(ids[32:])},
                  transfer_tool=None, agent_instruction="You work in a fruit shop.")
