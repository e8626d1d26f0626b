"""The agent loop: many episodes at once, token-in-token-out, one Trajectory each.

For each episode: env reset -> generate -> parse -> env step ... until the episode is
done, the turn limit, the context budget, or a generation cut by ``max_tokens``.
Generation requests from all running episodes are batched into one engine call;
user-simulator replies run concurrently. The token sequence is only ever appended
to: prompt ids, then each turn's sampled ids verbatim (loss mask 1), then the ids of
the messages that follow (loss mask 0).
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ctu.domains.base import Domain, Task
from ctu.engines.base import Completion, Engine, SamplingParams
from ctu.engines.vllm.remote import RemoteEngineError
from ctu.episode.env import AgentTurn, Episode, ToolCall, system_prompt
from ctu.episode.llm_api import LLMCallError
from ctu.episode.parsing import parse_model_output
from ctu.episode.reward import NLJudge, Reward, compute_reward, nl_verdicts
from ctu.episode.users.base import UserSimulator
from ctu.rollout.chat import ChatFormat, TokenSequence

STOP_REASONS = ("done", "max_turns", "context", "length", "error")


@dataclass
class Trajectory:
    """One finished episode, ready for rewards, training and export."""

    domain: str
    task_id: str
    sample: int
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    assistant_spans: list[tuple[int, int]]
    messages: list[dict[str, Any]]
    reward: float
    components: dict[str, float]
    skipped: list[str]
    reasons: list[str]
    stop_reason: str
    termination: str | None
    turns: int
    parse_failures: int
    tool_calls: int
    timings: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    # aligned with response_ids: the policy version that sampled each token (Completion.version), -1 where the
    # policy sampled nothing (user, tool and template tokens) or the engine gave no version
    token_versions: list[int] = field(default_factory=list)
    # earlier token samples of the episode (ctu.rollout.stitch.TokenSample): an external agent that rewrote its
    # history (docs/agents.md); trained with the episode's advantage, before the trajectory's own tokens
    extra_samples: list[Any] = field(default_factory=list)
    # a branched episode (trainer.branch_k): (sibling index, response index where the siblings diverge); the
    # siblings of one fork come from the same spec, and all but sibling 0 have the shared prefix masked out
    fork: tuple[int, int] | None = None

    @property
    def success(self) -> bool:
        return self.stop_reason != "error" and self.reward >= 1.0

    def to_json(self, with_tokens: bool = False) -> dict[str, Any]:
        row = {
            "domain": self.domain, "task_id": self.task_id, "sample": self.sample, "messages": self.messages,
            "reward": self.reward, "components": self.components, "skipped": self.skipped,
            "reasons": self.reasons, "stop_reason": self.stop_reason, "termination": self.termination,
            "turns": self.turns, "parse_failures": self.parse_failures, "timings": self.timings,
        }
        if self.error:
            row["error"] = self.error
        if with_tokens:
            row.update(prompt_ids=self.prompt_ids, response_ids=self.response_ids, loss_mask=self.loss_mask,
                       token_versions=self.token_versions)
        return row


@dataclass(frozen=True)
class EpisodeSpec:
    domain: Domain
    task: Task
    sample: int = 0


@dataclass
class RolloutLimits:
    max_turns: int = 12
    max_errors: int = 5
    max_context_tokens: int = 4096


def prompt_tokens(chat: ChatFormat, domain: Domain) -> list[int]:
    """Tokens of the system prompt and tool schemas an episode starts with: one count, or one per task where the
    policy depends on the task (banking_knowledge's golden_retrieval)."""
    tools = domain.openai_tools()
    tasks = domain.tasks if domain.task_policy is not None else (None,)
    return [len(chat.prompt_ids([{"role": "system", "content": system_prompt(domain, t)}], tools)) for t in tasks]


def prompt_notes(chat: ChatFormat, domains: Sequence[Domain], max_context_tokens: int) -> list[str]:
    """One line per domain: how much of ``max_context_tokens`` its system prompt and tools take (``ctu plan``)."""
    out = []
    for domain in domains:
        sizes = prompt_tokens(chat, domain)
        size = f"{sizes[0]:,}" if len(sizes) == 1 else f"{min(sizes):,} to {max(sizes):,} (per task)"
        line = f"domain {domain.name}: system prompt and tools {size} tokens of env.max_context_tokens={max_context_tokens:,}"
        if domain.tool("KB_search") is not None:
            line += "; each KB_search answer (10 whole documents) adds about 5,000 more"
        if max(sizes) >= max_context_tokens:
            line += ": episodes end at turn 0 and score 0"
        out.append(line)
    return out


def prompt_budget_warnings(chat: ChatFormat, domains: Sequence[Domain], max_context_tokens: int) -> list[str]:
    """One line per domain whose system prompt and tools alone fill ``max_context_tokens``: its episodes would
    end at turn 0 (stop reason ``context``) and score 0."""
    out = []
    for domain in domains:
        tokens = max(prompt_tokens(chat, domain))
        if tokens >= max_context_tokens:
            out.append(f"domain {domain.name}: the system prompt and tools are {tokens} tokens, at or over "
                       f"env.max_context_tokens={max_context_tokens}: every episode ends at turn 0 and scores 0; "
                       "raise env.max_context_tokens or use a shorter template")
    return out


def warn_prompt_budget(chat: ChatFormat, domains: Sequence[Domain], max_context_tokens: int) -> None:
    """Print :func:`prompt_budget_warnings` to stderr (once per command, before any episode runs)."""
    import sys

    for line in prompt_budget_warnings(chat, domains, max_context_tokens):
        print(f"ctu: warning: {line}", file=sys.stderr, flush=True)


class GenerationBatcher:
    """Collects generation requests from concurrent episodes and serves them in batches."""

    def __init__(self, engine: Engine, max_batch_size: int = 64, seed: int | None = None):
        self.engine = engine
        self.max_batch_size = max_batch_size
        self.seed = seed  # each engine call gets seed + call index: reproducible, yet samples differ
        self._pending: list[tuple[list[int], SamplingParams, asyncio.Future[Completion]]] = []
        self._wakeup: asyncio.Event | None = None
        self._worker: asyncio.Task[None] | None = None
        self.model_seconds = 0.0
        self.calls = 0

    async def generate(self, prompt: list[int], params: SamplingParams) -> Completion:
        """One completion; a ``params.seed`` seeds this request alone (batched with others, as vLLM does)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Completion] = loop.create_future()
        self._pending.append((prompt, params, future))
        if self._wakeup is None:
            self._wakeup = asyncio.Event()
        self._wakeup.set()
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._serve())
        return await future

    async def _serve(self) -> None:
        assert self._wakeup is not None
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            for _ in range(3):  # let other episodes reach their next generation request
                await asyncio.sleep(0)
            if not self._pending:
                continue
            batch = self._pending[: self.max_batch_size]
            self._pending = self._pending[self.max_batch_size:]
            if self._pending:
                self._wakeup.set()
            groups: dict[SamplingParams, list[tuple[list[int], int | None, asyncio.Future[Completion]]]] = {}
            for prompt, params, future in batch:
                groups.setdefault(replace(params, seed=None), []).append((prompt, params.seed, future))
            for params, entries in groups.items():
                started = time.perf_counter()
                items = [(p, f) for p, _, f in entries]
                seeds = [s for _, s, _ in entries]
                per_request = all(s is not None for s in seeds)
                call_params = replace(params, seed=None if self.seed is None else self.seed + self.calls)
                try:
                    outputs = await self.engine.generate([p for p, _ in items], call_params,
                                                         seeds=[s for s in seeds if s is not None] if per_request else None)
                except Exception as exc:  # the engine failed: every waiting episode learns why
                    for _, future in items:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                finally:
                    self.model_seconds += time.perf_counter() - started
                    self.calls += 1
                for (_, future), completions in zip(items, outputs, strict=True):
                    if not future.done():
                        future.set_result(completions[0])

    def release(self, token_ids: Sequence[int]) -> None:
        """An episode ended with ``token_ids``: the engine may free what it cached for it."""
        self.engine.release(token_ids)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()


def _turn_from_text(text: str) -> tuple[AgentTurn, bool]:
    parsed = parse_model_output(text)
    calls = tuple(ToolCall(c.name, c.arguments) for c in parsed.tool_calls)
    return AgentTurn(content=parsed.content, tool_calls=calls), parsed.failed


@dataclass(frozen=True)
class Branching:
    """Branched rollouts (``trainer.branch_k``): after the first tool result of an episode, ``k`` continuations
    of the same token prefix, environment state (the DB after the prefix's tool calls) and user state."""

    k: int = 1
    at: str = "tool_result"


@dataclass
class _Play:
    """An episode being played: what a fork copies."""

    episode: Episode
    seq: TokenSequence
    versions: list[int]  # token_versions, kept beside seq.response_ids
    model_s: float = 0.0
    parse_failures: int = 0
    tool_calls: int = 0
    sibling: int = 0
    fork_at: int = -1  # response index where the siblings diverge (-1: not forked)

    def fork(self, sibling: int) -> _Play:
        """A deep copy (DB, messages, user session, tokens), sharing only the immutable domain and task."""
        domain, task = self.episode.domain, self.episode.task
        clone = copy.deepcopy(self, {id(domain): domain, id(task): task})
        clone.sibling = sibling
        return clone


async def run_episode(
    spec: EpisodeSpec,
    chat: ChatFormat,
    batcher: GenerationBatcher,
    user: UserSimulator,
    params: SamplingParams,
    limits: RolloutLimits,
    judge: NLJudge | None = None,
    seed: int = 0,
) -> Trajectory:
    """Play one episode to its end and score it."""
    return (await run_branched(spec, chat, batcher, user, params, limits, judge, seed=seed))[0]


async def run_branched(spec: EpisodeSpec, chat: ChatFormat, batcher: GenerationBatcher, user: UserSimulator,
                       params: SamplingParams, limits: RolloutLimits, judge: NLJudge | None = None, seed: int = 0,
                       branch: Branching | None = None) -> list[Trajectory]:
    """One episode, and with ``branch`` (k > 1) its k - 1 siblings forked after its first tool result: the
    episode first (exactly what :func:`run_episode` plays), then the siblings; each sibling's loss mask leaves
    the shared prefix out, so the prefix is trained once."""
    domain, task = spec.domain, spec.task
    episode = Episode(domain, task, user.start(domain, task, seed=seed),
                      max_turns=limits.max_turns, max_errors=limits.max_errors)
    messages = await episode.reset()
    state = _Play(episode, TokenSequence.start(chat.prompt_ids(messages, domain.openai_tools())), [])
    return await _play(state, spec, chat, batcher, params, limits, judge, seed, branch)


async def _play(state: _Play, spec: EpisodeSpec, chat: ChatFormat, batcher: GenerationBatcher,
                params: SamplingParams, limits: RolloutLimits, judge: NLJudge | None, seed: int,
                branch: Branching | None) -> list[Trajectory]:
    domain, task, episode, seq = spec.domain, spec.task, state.episode, state.seq
    stop_reason = "done"
    siblings: list[asyncio.Future[list[Trajectory]]] = []
    turn_base = seed + state.sibling * 100_003  # sibling 0 samples as the unbranched episode does
    while not episode.done:
        budget = limits.max_context_tokens - seq.total_length()
        if budget <= 0:
            stop_reason = "context"
            break
        # Seeded per episode and turn: what an episode samples does not depend on what it is batched with.
        turn_seed = None if params.seed is None else (turn_base * 1_000_003 + episode.turns * 7_919 + params.seed) % 2**31
        turn_params = replace(params, max_tokens=min(params.max_tokens, budget), n=1, seed=turn_seed,
                              stop_token_ids=tuple(dict.fromkeys((*params.stop_token_ids, *chat.stop_token_ids))))
        started = time.perf_counter()
        try:
            completion = await batcher.generate(seq.all_ids(), turn_params)
        except RemoteEngineError as exc:  # the model's server failed after its retries: errored, not the run
            stop_reason, episode.error = "error", f"engine: {exc}"
            break
        finally:
            state.model_s += time.perf_counter() - started
        seq.add_generated(list(completion.token_ids), list(completion.logprobs))
        state.versions += completion.versions()
        try:  # the model's output, its tools and their answers: a fault here errors this episode, not the others
            text = chat.decode_generated(completion.token_ids)
            turn, failed = _turn_from_text(text)
            state.parse_failures += failed
            state.tool_calls += len(turn.tool_calls)
            if completion.finish_reason == "length":
                # cut mid-turn: no end-of-turn token, so the template cannot continue from here
                episode.messages.append({"role": "assistant", "content": turn.content})
                stop_reason = "context" if turn_params.max_tokens < params.max_tokens else "length"
                break
            result = await episode.step(turn)
            if episode.done:
                break
            observation = chat.observation_ids(result.observations)
        except Exception as exc:  # noqa: BLE001 - named on the trajectory, which is left out of training and scores
            stop_reason, episode.error = "error", f"episode: {type(exc).__name__}: {exc}"[:500]
            break
        if seq.total_length() + len(observation) >= limits.max_context_tokens:
            stop_reason = "context"  # the next observation would not fit: the sequence stays within budget
            break
        seq.add_observation(observation)
        state.versions += [-1] * len(observation)
        if branch is not None and branch.k > 1 and state.fork_at < 0 and turn.tool_calls:
            state.fork_at = len(seq.response_ids)
            siblings = [asyncio.ensure_future(_play(state.fork(j), spec, chat, batcher, params, limits, judge, seed,
                                                    branch)) for j in range(1, branch.k)]
    batcher.release(seq.all_ids())
    if episode.termination == "user_error":
        stop_reason = "error"
    elif episode.termination == "max_turns":
        stop_reason = "max_turns"
    termination = episode.termination if episode.done else stop_reason
    verdicts = None
    if stop_reason != "error":
        try:
            verdicts = await nl_verdicts(judge, task, episode.messages)
        except LLMCallError as exc:  # the judge failed: the episode is errored, not scored 0
            stop_reason, episode.error = "error", f"judge: {exc}"
    try:
        reward = compute_reward(domain, task, episode.messages, episode.db, termination, verdicts)
    except Exception as exc:  # noqa: BLE001 - a transcript the evaluator cannot read errors this episode only
        stop_reason, episode.error = "error", f"reward: {type(exc).__name__}: {exc}"[:500]
        reward = Reward(0.0, {})
    mask = list(seq.loss_mask) if state.sibling == 0 else [
        0 if i < state.fork_at else m for i, m in enumerate(seq.loss_mask)]
    trajectory = Trajectory(
        domain=domain.name, task_id=task.id, sample=spec.sample,
        prompt_ids=list(seq.prompt_ids), response_ids=list(seq.response_ids), loss_mask=mask,
        logprobs=list(seq.logprobs), assistant_spans=seq.assistant_spans(), messages=list(episode.messages),
        reward=reward.reward if stop_reason != "error" else 0.0, components=dict(reward.components),
        skipped=list(reward.skipped), reasons=list(reward.reasons), stop_reason=stop_reason,
        termination=termination, turns=episode.turns, parse_failures=state.parse_failures,
        tool_calls=state.tool_calls, timings={"model": state.model_s, **episode.timings}, error=episode.error,
        token_versions=state.versions, fork=(state.sibling, state.fork_at) if state.fork_at >= 0 else None,
    )
    return [trajectory, *(t for group in await asyncio.gather(*siblings) for t in group)]


async def rollout(
    specs: Sequence[EpisodeSpec],
    chat: ChatFormat,
    engine: Engine,
    user: UserSimulator,
    params: SamplingParams,
    limits: RolloutLimits,
    *,
    judge: NLJudge | None = None,
    concurrency: int = 64,
    max_batch_size: int = 64,
    seed: int = 0,
    on_done: Callable[[Trajectory], None] | None = None,
    stats: dict[str, Any] | None = None,
    branch: Branching | None = None,
) -> list[Trajectory]:
    """Run many episodes with bounded concurrency; results in the order of ``specs`` (with ``branch``, each
    spec's episode followed by its siblings).

    ``stats``, if given, receives ``model_seconds`` (wall time inside engine calls) and ``engine_calls``.
    """
    if not specs:
        return []
    batcher = GenerationBatcher(engine, max_batch_size, seed=params.seed)
    gate = asyncio.Semaphore(max(1, concurrency))

    async def one(i: int, spec: EpisodeSpec) -> list[Trajectory]:
        async with gate:
            trajectories = await run_branched(spec, chat, batcher, user, params, limits, judge, seed=seed + i,
                                              branch=branch)
        if on_done is not None:
            for trajectory in trajectories:
                on_done(trajectory)
        return trajectories

    try:
        return [t for group in await asyncio.gather(*(one(i, s) for i, s in enumerate(specs))) for t in group]
    finally:
        batcher.close()
        if stats is not None:
            stats.update(model_seconds=batcher.model_seconds, engine_calls=batcher.calls)
