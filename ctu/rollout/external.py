"""Episodes played by an agent outside ctu (bring your own agent, docs/agents.md).

The agent drives; ctu serves. For each episode it holds ctu's environment (:class:`~ctu.episode.env.Episode`: the
task, the tools, the simulated user, the reward) and answers the agent's chat-completion requests with the engine,
token-in-token-out: a request that continues the conversation the proxy last answered gets the previous prompt +
sampled ids + the template's ids of its new tool/user messages (what ctu's loop would append); any other request is
rendered whole. Each request is recorded (:class:`~ctu.rollout.stitch.TurnRecord`) and :meth:`ExternalEpisodes.finish`
stitches them into a :class:`~ctu.rollout.loop.Trajectory` scored by the environment (or by a reward the agent posted).

Everything here runs on one asyncio loop (the proxy's); ``ctu.rollout.agent_proxy`` puts HTTP in front of it.
"""

from __future__ import annotations

import hmac
import json
import math
import secrets
import time
from dataclasses import dataclass, field, replace
from typing import Any

from ctu.engines.base import Engine, SamplingParams
from ctu.episode.env import AgentTurn, Episode, ToolCall
from ctu.episode.llm_api import LLMCallError
from ctu.episode.parsing import parse_model_output
from ctu.episode.reward import NLJudge, Reward, compute_reward, nl_verdicts
from ctu.episode.users.base import UserSimulator
from ctu.rollout import openai_wire as wire
from ctu.rollout.chat import ChatFormat
from ctu.rollout.loop import EpisodeSpec, GenerationBatcher, RolloutLimits, Trajectory
from ctu.rollout.openai_wire import WireError
from ctu.rollout.stitch import TokenSample, TurnRecord, stitch

REWARD_RANGE = (0.0, 1.0)  # every domain's reward (tau2's: a product of checks in [0, 1]); a posted one too


@dataclass
class ExternalEpisode:
    """One episode's environment and what the proxy served it."""

    id: str
    spec: EpisodeSpec
    seed: int
    env: Episode
    tools: list[dict[str, Any]]
    opening: list[dict[str, Any]]
    records: list[TurnRecord] = field(default_factory=list)
    history: list[dict[str, Any]] | None = None  # the last request's messages + the reply the proxy gave
    seen: list[int] = field(default_factory=list)  # the last prompt + sampled ids
    tools_sent: list[dict[str, Any]] | None = None  # the tools of the last request
    last_finish: str | None = None
    stopped: str | None = None  # "length" / "context": ended by the proxy, as ctu's loop ends an episode
    agent_reward: float | None = None
    parse_failures: int = 0
    tool_calls: int = 0
    model_s: float = 0.0
    started: float = field(default_factory=time.perf_counter)
    params: SamplingParams = field(default_factory=SamplingParams)  # the sampling of the call that opened it
    token: str = ""  # the episode's secret (CTU_EPISODE_TOKEN): every request about it carries it


def turn_seed(episode_seed: int, turn: int, params: SamplingParams) -> int | None:
    """The sampling seed of an episode's turn, as ctu's loop seeds it (``run_episode``)."""
    return None if params.seed is None else (episode_seed * 1_000_003 + turn * 7_919 + params.seed) % 2**31


def agent_turn(message: Any) -> AgentTurn:
    """An OpenAI assistant message (what the proxy answered, as the agent echoes it) as the environment's turn."""
    if not isinstance(message, dict) or message.get("role", "assistant") != "assistant":
        raise WireError(400, "message: must be the assistant message the completion returned", "message")
    calls = []
    for i, call in enumerate(message.get("tool_calls") or []):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise WireError(400, f"message.tool_calls[{i}]: must have function.name and function.arguments",
                            f"message.tool_calls[{i}]")
        calls.append(ToolCall(fn["name"], tool_arguments(fn.get("arguments")), call.get("id") or ""))
    content = message.get("content")
    return AgentTurn(content=content if isinstance(content, str) else "", tool_calls=tuple(calls))


def tool_arguments(raw: Any) -> Any:
    if not isinstance(raw, str):
        return raw if raw is not None else {}
    try:
        return json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError:
        return raw


class ExternalEpisodes:
    """The episodes an outside agent plays, by id; :meth:`begin` / :meth:`end` bracket one batch of them."""

    def __init__(self, chat: ChatFormat, engine: Engine, user: UserSimulator, limits: RolloutLimits, *,
                 model_name: str = "ctu", max_batch_size: int = 64):
        self.chat, self.engine, self.user, self.limits = chat, engine, user, limits
        self.model_name = model_name
        self.max_batch_size = max_batch_size
        self.episodes: dict[str, ExternalEpisode] = {}
        self.tokens: dict[str, str] = {}  # token -> the id of the open episode it belongs to
        self.params = SamplingParams()
        self.batcher: GenerationBatcher | None = None
        self.version = 0  # the policy version served when the engine stamps none (initial weights: 0)
        self.active = 0  # pool calls begun and not ended

    # -- lifecycle (called by the pool) -------------------------------------------------
    def begin(self, params: SamplingParams) -> None:
        """One pool call starts: its episodes sample with ``params``. Calls may overlap (an asynchronous producer
        plays groups while another is running): they share one batcher, open until the last call ends."""
        self.params = params
        self.active += 1
        if self.batcher is None:
            self.batcher = GenerationBatcher(self.engine, self.max_batch_size, seed=params.seed)

    def end(self) -> None:
        self.active = max(0, self.active - 1)
        if self.active == 0 and self.batcher is not None:
            self.batcher.close()
            self.batcher = None

    async def open(self, episode_id: str, spec: EpisodeSpec, seed: int,
                   params: SamplingParams | None = None) -> ExternalEpisode:
        domain, task = spec.domain, spec.task
        env = Episode(domain, task, self.user.start(domain, task, seed=seed), max_turns=self.limits.max_turns,
                      max_errors=self.limits.max_errors)
        opening = await env.reset()
        state = ExternalEpisode(episode_id, spec, seed, env, domain.openai_tools(), opening,
                                params=self.params if params is None else params, token=secrets.token_urlsafe(32))
        self.episodes[episode_id] = state
        self.tokens[state.token] = episode_id
        return state

    def authorize(self, token: str | None, episode_id: str | None = None) -> ExternalEpisode:
        """The open episode ``token`` belongs to (401 for no token or one of no open episode); where the request
        names an episode too, it must be that one (403: one episode's token never opens another)."""
        if not token:
            raise WireError(401, "no episode token: send the header 'Authorization: Bearer <CTU_EPISODE_TOKEN>' (the "
                                 "OpenAI SDK sends OPENAI_API_KEY, which holds it)", None, "missing_token")
        owner = self.tokens.get(token)
        if owner is None or not hmac.compare_digest(self.episodes[owner].token, token):
            raise WireError(401, "the episode token is not an open episode's", None, "invalid_token")
        if episode_id is not None and episode_id != owner:
            raise WireError(403, f"the episode token is not episode {episode_id[:80]!r}'s", None, "wrong_episode")
        return self.episodes[owner]

    def get(self, episode_id: str | None) -> ExternalEpisode:
        if not episode_id:
            raise WireError(400, "no episode id: send the header X-Episode-Id (or the request's 'user' field) with "
                                 "the id ctu gave the agent in CTU_EPISODE_ID", "user", "missing_episode_id")
        state = self.episodes.get(episode_id)
        if state is None:
            raise WireError(404, f"episode {episode_id!r} is not open on this proxy", "user", "unknown_episode")
        return state

    # -- the environment API -------------------------------------------------------------
    def start_info(self, episode_id: str) -> dict[str, Any]:
        state = self.get(episode_id)
        return {"episode_id": state.id, "domain": state.spec.domain.name, "task_id": state.spec.task.id,
                "messages": state.opening, "tools": state.tools, "system_prompt": state.opening[0]["content"],
                "done": state.env.done, "termination": state.env.termination}

    async def step(self, episode_id: str, turn: AgentTurn) -> dict[str, Any]:
        state = self.get(episode_id)
        if state.stopped is not None:  # the last turn was cut by max_tokens: over, as in ctu's loop
            return {"observations": [], "done": True, "termination": state.stopped}
        if state.env.done:
            raise WireError(409, f"episode {episode_id!r} is over ({state.env.termination})", None, "episode_done")
        result = await state.env.step(turn)
        return {"observations": result.observations, "done": result.done, "termination": result.termination}

    def post_reward(self, episode_id: str, body: Any) -> dict[str, Any]:
        state = self.get(episode_id)
        reward = body.get("reward") if isinstance(body, dict) else None
        low, high = REWARD_RANGE
        if isinstance(reward, bool) or not isinstance(reward, int | float):
            raise WireError(400, f"reward: must be a number, got {str(reward)[:80]!r}", "reward")
        value = float(reward) if not isinstance(reward, int) or reward.bit_length() < 1000 else math.inf
        if not (math.isfinite(value) and low <= value <= high):
            raise WireError(400, f"reward: must be from {low:g} to {high:g}, got {str(value)[:80]}", "reward")
        state.agent_reward = value
        return {"episode_id": episode_id, "reward": state.agent_reward}

    # -- chat completions ----------------------------------------------------------------
    def _prompt(self, state: ExternalEpisode, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[int]:
        if state.history is not None and state.last_finish != "length" and tools == state.tools_sent:
            tail = wire.continuation(state.history, messages)
            if tail is not None:
                return state.seen + self.chat.observation_ids(tail)
        return self.chat.prompt_ids(messages, tools)

    async def complete(self, episode_id: str, body: dict[str, Any]) -> dict[str, Any]:
        state = self.get(episode_id)
        if self.batcher is None:
            raise WireError(409, "no rollout is running on this proxy", None, "not_running")
        if state.env.done or state.stopped is not None:
            raise WireError(409, f"episode {episode_id!r} is over ({state.env.termination or state.stopped})",
                            None, "episode_done")
        messages, tools = wire.request_conversation(body)
        prompt = self._prompt(state, messages, tools)
        budget = self.limits.max_context_tokens - len(prompt)
        if budget <= 0:
            state.stopped = "context"
            raise WireError(400, f"the prompt is {len(prompt)} tokens, at or over env.max_context_tokens="
                                 f"{self.limits.max_context_tokens}", "messages", "context_length_exceeded")
        wanted = wire.requested_max_tokens(body) or state.params.max_tokens
        turn = len(state.records)
        params = replace(state.params, max_tokens=min(state.params.max_tokens, wanted, budget), n=1,
                         seed=turn_seed(state.seed, turn, state.params),
                         stop_token_ids=tuple(dict.fromkeys((*state.params.stop_token_ids, *self.chat.stop_token_ids))))
        started = time.perf_counter()
        completion = await self.batcher.generate(prompt, params)
        state.model_s += time.perf_counter() - started
        version = completion.version if completion.version is not None else self.engine.weights_version
        ids, logprobs = list(completion.token_ids), [float(x) for x in completion.logprobs]
        state.records.append(TurnRecord(tuple(prompt), tuple(ids), tuple(logprobs),
                                        self.version if version is None else version, completion.token_versions))
        parsed = parse_model_output(self.chat.decode_generated(ids))
        state.parse_failures += parsed.failed
        state.tool_calls += len(parsed.tool_calls)
        message = wire.assistant_message(parsed, episode_id, turn)
        state.history, state.seen, state.tools_sent = [*messages, message], prompt + ids, tools
        state.last_finish = completion.finish_reason
        if completion.finish_reason == "length":  # cut mid-turn: no end-of-turn token; ctu's loop ends here too
            state.env.messages.append({"role": "assistant", "content": parsed.content})
            state.stopped = "context" if budget < min(state.params.max_tokens, wanted) else "length"
        logprobs_out = None
        if body.get("logprobs"):
            logprobs_out = wire.logprobs_block([self.chat.tokenizer.decode([t]) for t in ids], logprobs)
        return wire.completion_body(episode_id=episode_id, turn=turn, model=self.model_name, message=message,
                                    reason=wire.finish_reason(parsed, completion.finish_reason),
                                    prompt_tokens=len(prompt), completion_tokens=len(ids), logprobs=logprobs_out)

    # -- the end -------------------------------------------------------------------------
    async def finish(self, episode_id: str, agent_error: str | None = None, judge: NLJudge | None = None,
                     agent_s: float = 0.0) -> Trajectory:
        """The episode's trajectory, scored; it is closed (its id answers 404 from now on)."""
        state = self.episodes.pop(episode_id)
        self.tokens.pop(state.token, None)
        env, spec = state.env, state.spec
        samples = stitch(state.records)
        for sample in samples:
            if self.batcher is not None:
                self.batcher.release(sample.prompt_ids + sample.response_ids)
        main = samples[-1] if samples else TokenSample([], [], [], [], [])
        stop_reason, error = stop_of(state, agent_error)
        termination = env.termination if env.done else (state.stopped or "agent_exit")
        verdicts = None
        if stop_reason != "error":
            try:
                verdicts = await nl_verdicts(judge, spec.task, env.messages)
            except LLMCallError as exc:  # the judge failed: errored, not scored 0
                stop_reason, error = "error", f"judge: {exc}"
        try:
            reward = compute_reward(spec.domain, spec.task, env.messages, env.db, termination, verdicts)
        except Exception as exc:  # noqa: BLE001 - a transcript the evaluator cannot read errors this episode only
            stop_reason, error = "error", f"reward: {type(exc).__name__}: {exc}"[:500]
            reward = Reward(0.0, {})
        value, reasons = reward.reward, list(reward.reasons)
        if state.agent_reward is not None:
            value = state.agent_reward
            reasons.append(f"reward {value} posted by the agent (the environment's: {reward.reward})")
        return Trajectory(
            domain=spec.domain.name, task_id=spec.task.id, sample=spec.sample, prompt_ids=main.prompt_ids,
            response_ids=main.response_ids, loss_mask=main.loss_mask, logprobs=main.logprobs,
            assistant_spans=main.assistant_spans, messages=list(env.messages),
            reward=value if stop_reason != "error" else 0.0, components=dict(reward.components),
            skipped=list(reward.skipped), reasons=reasons, stop_reason=stop_reason, termination=termination,
            turns=env.turns, parse_failures=state.parse_failures, tool_calls=state.tool_calls,
            timings={"model": state.model_s, **env.timings, "agent": agent_s}, error=error,
            token_versions=main.token_versions, extra_samples=samples[:-1])


def stop_of(state: ExternalEpisode, agent_error: str | None) -> tuple[str, str | None]:
    """``(stop_reason, error)`` of a finished external episode (the loop's stop reasons)."""
    env = state.env
    if agent_error is not None:
        return "error", agent_error
    if env.termination == "user_error":
        return "error", env.error
    if env.termination == "max_turns":
        return "max_turns", None
    if state.stopped is not None and not env.done:
        return state.stopped, None
    if not (state.records or env.turns or env.done or state.stopped):  # left unplayed: errored, never a reward of 0
        return "error", ("the agent played nothing: it exited 0 without a chat-completion request to ctu's endpoint "
                         "(OPENAI_BASE_URL) or a turn of the episode, which was not over")
    return "done", None
