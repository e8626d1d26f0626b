"""Supervised warm-start data: conversations tokenized exactly as rollouts are.

A conversation becomes one sample: the prompt is every message before the first trained assistant turn
(rendered with the tools and the generation prompt), each assistant turn is the template's text for it through
its end-of-turn token (loss mask 1; 0 for an assistant message with ``weight: 0``), and the messages between
turns are observation ids (mask 0) — what a rollout appends. Trailing messages after the last assistant turn
carry nothing to train on and are left out.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ctu.episode.data.conversations import DataError, gold_conversations, gold_turns
from ctu.episode.env import agent_view
from ctu.train.update import Sample, to_sample

__all__ = ["Demos", "conversation_sample", "demo_tasks", "file_samples", "fit_context", "gold_samples", "gold_turns",
           "prepared_samples", "replay_note", "replayed_demos", "warm_start_samples"]


class Demos(list):
    """The warm start's samples; ``strata[i]`` (with ``trainer.sft_balance``) is the index of the first balance key
    sample i's task matches, ``len(keys)`` for none: :func:`ctu.distributed.group.sft_batches` draws every batch
    evenly across the strata. None: no balance (a file, or no keys)."""

    strata: list[int] | None = None


def conversation_sample(chat, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]) -> Sample:
    messages = agent_view(list(messages))  # type: ignore[arg-type]  # the agent never sees the user's own tool calls (dual control)
    trained = [i for i, m in enumerate(messages) if m.get("role") == "assistant" and m.get("weight", 1) != 0]
    if not trained:
        raise ValueError("no assistant turn to train on")
    if trained[0] == 0:
        raise ValueError("the conversation starts with an assistant turn: no prompt before it")
    prompt = chat.prompt_ids(messages[: trained[0]], tools)
    response: list[int] = []
    mask: list[int] = []
    i = trained[0]
    while i <= trained[-1]:
        if messages[i].get("role") == "assistant":
            ids = chat.encode(chat.render_assistant_text(messages[i]))
            response += ids
            mask += [int(messages[i].get("weight", 1) != 0)] * len(ids)
            i += 1
            continue
        j = i
        while messages[j].get("role") != "assistant":
            j += 1
        ids = chat.observation_ids(messages[i:j])
        response += ids
        mask += [0] * len(ids)
        i = j
    return to_sample(prompt, response, mask, [0.0] * len(mask), 0.0)


def gold_samples(chat, domain, tasks, reasons: bool = False) -> list[Sample]:
    """Token sequences of gold demonstrations (for the supervised warm start), built like rollouts; ``reasons``:
    see :func:`ctu.episode.data.conversations.gold_conversation`."""
    return [conversation_sample(chat, c.messages, c.tools) for c in gold_conversations(domain, list(tasks), reasons)]


def file_samples(chat, path: str, where: list[str] | None = None) -> list[Sample]:
    """Samples of every conversation in an OpenAI chat JSONL or sharegpt file; errors name the file and line.
    ``where``, if given, receives each sample's ``file:line``."""
    from ctu.episode.data.sft import read_conversations

    samples = []
    for conversation in read_conversations(path):
        try:
            samples.append(conversation_sample(chat, conversation.messages, conversation.tools))
        except ValueError as exc:
            raise DataError(f"{path}:{conversation.extra.get('line')}: {exc}") from None
        if where is not None:
            where.append(f"{path}:{conversation.extra.get('line')}")
    return samples


def fit_context(samples: Sequence[Sample], max_tokens: int, source: str,
                where: Sequence[str]) -> tuple[list[Sample], str | None]:
    """(the samples of at most ``max_tokens`` tokens, a one-line note counting the dropped ones or None).

    A longer conversation is dropped, not truncated: a rollout never gets that far (``env.max_context_tokens``
    ends the episode), and a cut conversation would train on an unfinished turn. Nothing left is an error."""
    kept = [s for s in samples if len(s.ids) <= max_tokens]
    if len(kept) == len(samples):
        return list(samples), None
    longest = max(range(len(samples)), key=lambda i: len(samples[i].ids))
    note = (f"{source}: dropped {len(samples) - len(kept)} of {len(samples)} conversation(s) longer than "
            f"env.max_context_tokens={max_tokens} tokens (longest: {len(samples[longest].ids)} tokens at "
            f"{where[longest]})")
    if not kept:
        raise DataError(f"{note}; nothing is left to train on: raise env.max_context_tokens or shorten the data")
    return kept, note


def demo_tasks(domains, exclude: Sequence[str] = ()) -> list[tuple[Any, list]]:
    """(domain, its train tasks — all if it has no train split — that match none of ``exclude``) per domain.
    A key that matches no training task is a ConfigError naming ``trainer.sft_exclude``."""
    pools = [(d, d.split("train") if "train" in d.splits else list(d.tasks)) for d in domains]
    unmatched = [k for k in exclude if not any(t.matches(k) for _, tasks in pools for t in tasks)]
    if unmatched:
        from ctu.config.schema import ConfigError

        raise ConfigError(f"trainer.sft_exclude: {', '.join(unmatched)} matches no training task's description "
                          f"in {', '.join(d.name for d, _ in pools)}")
    return [(d, [t for t in tasks if not any(t.matches(k) for k in exclude)]) for d, tasks in pools]


def warm_start_samples(chat, domains, sft_data: str | None = None, max_tokens: int | None = None,
                       exclude: Sequence[str] = (), balance: Sequence[str] = (), reasons: bool = False) -> Demos:
    """The warm start's data: the file ``sft_data`` when given, else every domain's gold demonstrations of its
    train split (all tasks if it has none) but those matching ``exclude`` (``trainer.sft_exclude``). With
    ``max_tokens`` (``env.max_context_tokens``), longer conversations are dropped with one warning line on stderr
    counting them (see :func:`fit_context`). ``balance`` (``trainer.sft_balance``, gold demonstrations only): label
    each sample with its stratum (:class:`Demos`); a key that matches no demonstration is a ConfigError. ``reasons``
    (``trainer.sft_reasons``): gold calls state their domain's reason first."""
    where: list[str] = []
    strata: list[int] | None = None
    if sft_data:
        try:
            samples, source = file_samples(chat, sft_data, where), f"trainer.sft_data: {sft_data}"
        except DataError as exc:
            raise DataError(f"trainer.sft_data: {exc}") from None
    else:
        samples, source = [], "gold demonstrations"
        if reasons and not any(d.reason is not None for d in domains):
            from ctu.config.schema import ConfigError

            raise ConfigError(f"trainer.sft_reasons: no domain of {', '.join(d.name for d in domains)} gives reasons "
                              "for its calls (mini does): set trainer.sft_reasons=false")
        pools = demo_tasks(domains, exclude)
        for d, tasks in pools:
            samples += gold_samples(chat, d, tasks, reasons)
            where += [f"{d.name} task {t.id}" for t in tasks]
        if balance:
            strata = [_stratum(t, balance) for _, tasks in pools for t in tasks]
            unmatched = [k for i, k in enumerate(balance) if i not in strata]
            if unmatched:
                from ctu.config.schema import ConfigError

                raise ConfigError(f"trainer.sft_balance: {', '.join(unmatched)} matches no demonstration left by "
                                  f"trainer.sft_exclude (first matching key wins)")
    if max_tokens is not None:
        kept, note = fit_context(samples, max_tokens, source, where)
        if note:
            print(f"ctu: warning: {note}", file=sys.stderr, flush=True)
        if strata is not None:
            strata = [k for k, s in zip(strata, samples, strict=True) if len(s.ids) <= max_tokens]
        samples = kept
    out = Demos(samples)
    out.strata = strata
    return out


def replayed_demos(pool: Sequence[Sample], count: int, advantage: float, seed: int) -> list[Sample]:
    """``trainer.sft_replay``: ``count`` demonstrations of ``pool`` (the warm start's data), drawn without replacement
    with ``seed``, as successful episodes of advantage ``advantage`` (``trainer.sft_replay_advantage``). On policy
    their policy-gradient term is ``advantage`` times the supervised loss; they carry no sampler logprobs."""
    picks = random.Random(seed).sample(range(len(pool)), min(count, len(pool)))
    return [replace(pool[i], advantage=float(advantage), replayed=True) for i in sorted(picks)]


def replay_note(trainer) -> str | None:
    """The line a run prints once at start when ``trainer.sft_replay`` puts demonstrations into every RL update."""
    if not trainer.sft_replay:
        return None
    source = f"trainer.sft_data ({trainer.sft_data})" if trainer.sft_data else "the gold demonstrations"
    return (f"trainer.sft_replay={trainer.sft_replay}: every RL update also trains on {trainer.sft_replay} of "
            f"{source} as successful episodes (advantage {trainer.sft_replay_advantage:g}); "
            f"trainer.sft_replay=0 for RL alone")


def _stratum(task, keys: Sequence[str]) -> int:
    return next((i for i, k in enumerate(keys) if task.matches(k)), len(keys))


def prepared_samples(config, domains) -> list[Sample] | None:
    """The warm start's samples for a run about to start, made with the tokenizer alone: every problem with its
    data (a bad file, named by path and line; nothing left within ``env.max_context_tokens``) is a ConfigError
    before any model loads, any evaluation runs or ``run.dir`` changes. None when no warm start will run
    (``trainer.sft_steps`` 0, or a run resuming from a checkpoint)."""
    from ctu.config.schema import ConfigError
    from ctu.rollout import components as build
    from ctu.train.checkpoint import resolve_resume

    t = config.trainer
    if t.sft_steps <= 0 or resolve_resume(Path(config.run.dir) / "checkpoints", t.resume) is not None:
        return None
    try:
        return warm_start_samples(build.build_chat(config), domains, t.sft_data, config.env.max_context_tokens,
                                  exclude=t.sft_exclude, balance=t.sft_balance, reasons=t.sft_reasons)
    except DataError as exc:
        raise ConfigError(str(exc)) from None
