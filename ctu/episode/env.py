"""One episode of a domain: the agent's turns in, tool results and user replies out.

``reset`` greets the user and returns the opening messages; ``step`` takes one
assistant turn (text to the user and/or tool calls). Tool calls are run against
the episode's own copy-on-write DB; text goes to the simulated user. The episode
ends as in tau2-bench: a user stop token, an agent stop token, the transfer tool,
too many tool errors, or the turn limit. It never shares mutable state with other
episodes, so thousands can run concurrently in one process.

Dual control (telecom): the DB starts from the task's initial state, and the user acts on their
own side of it with the domain's user tools (:class:`UserDevice`). Their tool calls are recorded
in ``messages`` as tau2 records a simulation (a ``user`` message with ``tool_calls``, answered by
``tool`` messages with ``"requestor": "user"``), but the agent only sees the user's text.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from ctu.domains.base import DBView, Domain, Task
from ctu.episode.reward import Reward, Verdicts, compute_reward
from ctu.episode.users.base import AGENT_GREETING, STOP, UserSession, UserSimulatorError, UserToolbox, is_stop

AGENT_INSTRUCTION = (
    "You are a customer service agent that helps the user according to the <policy> provided below.\n"
    "In each turn you can either:\n- Send a message to the user.\n- Make a tool call.\n"
    "You cannot do both at the same time.\n\n"
    "Try to be helpful and always follow the policy. Always make sure you generate valid JSON only."
)

# How an episode ended. Only user_stop and agent_stop count as normal endings for the reward.
TERMINATIONS = ("user_stop", "agent_stop", "max_turns", "too_many_errors", "user_error")


def system_prompt(domain: Domain, task: Task | None = None) -> str:
    """The agent's system prompt, as tau2's LLM agent writes it (with the domain's own instruction if it has one;
    the task's own policy where the domain builds one per task)."""
    instruction = domain.agent_instruction or AGENT_INSTRUCTION
    return f"<instructions>\n{instruction}\n</instructions>\n<policy>\n{domain.policy_for(task)}\n</policy>"


@dataclass(frozen=True)
class ToolCall:
    """A tool call made by the agent; ``arguments`` is what the model gave (normally a dict)."""

    name: str
    arguments: Any
    id: str = ""


@dataclass(frozen=True)
class AgentTurn:
    """One assistant turn: text for the user and/or tool calls."""

    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()


@dataclass
class StepResult:
    observations: list[dict[str, Any]]
    done: bool
    termination: str | None = None
    info: dict[str, Any] = field(default_factory=dict)


class Episode:
    """A single conversation between an agent and a simulated user over one task."""

    def __init__(self, domain: Domain, task: Task, user: UserSession, *, max_turns: int = 30, max_errors: int = 10):
        if max_turns < 1 or max_errors < 1:
            raise ValueError("max_turns and max_errors must be >= 1")
        self.domain = domain
        self.task = task
        self.user = user
        self.max_turns = max_turns
        self.max_errors = max_errors
        self.db: DBView = domain.initial_db(task)
        self.messages: list[dict[str, Any]] = []
        self.turns = 0
        self.tool_errors = 0
        self.done = False
        self.termination: str | None = None
        self.error: str | None = None
        self.timings = {"env": 0.0, "user": 0.0}  # seconds spent running tools / waiting for the user
        self._call_counter = 0
        user_tools = domain.user_tools_for(task)
        if user_tools:
            user.bind_tools(UserToolbox([t.openai_schema() for t in user_tools], self._user_act))

    # -- lifecycle -----------------------------------------------------------------
    async def reset(self) -> list[dict[str, Any]]:
        """Start the conversation: system prompt, the agent's greeting, the user's first message."""
        self.messages = [
            {"role": "system", "content": system_prompt(self.domain, self.task)},
            {"role": "assistant", "content": AGENT_GREETING},
        ]
        await self._ask_user(AGENT_GREETING)
        return agent_view(self.messages)

    async def step(self, turn: AgentTurn) -> StepResult:
        """Apply one assistant turn and return what the agent observes next."""
        if self.done:
            raise RuntimeError("episode is done; call reset() on a new Episode")
        self.turns += 1
        calls = [self._with_id(c) for c in turn.tool_calls]
        message: dict[str, Any] = {"role": "assistant", "content": turn.content or ""}
        if calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": _arguments_text(c.arguments)}}
                for c in calls
            ]
        self.messages.append(message)
        observations: list[dict[str, Any]] = []
        info: dict[str, Any] = {}
        if calls:
            transferred = False
            started = time.perf_counter()
            for call in calls:
                result = self.domain.call("assistant", call.name, call.arguments, self.db)
                self.tool_errors += result.error
                transferred |= call.name == self.domain.transfer_tool and not result.error
                obs = {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": result.content}
                self.messages.append(obs)
                observations.append(obs)
            info["tool_errors"] = self.tool_errors
            self.timings["env"] += time.perf_counter() - started
            if transferred:
                self._finish("agent_stop")
            elif self.tool_errors >= self.max_errors:
                self._finish("too_many_errors")
        elif STOP in (turn.content or ""):
            self._finish("agent_stop")
        else:
            before = len(self.messages)
            reply = await self._ask_user(turn.content or "")
            observations.extend(agent_view(self.messages[before:]))
            if reply is not None and is_stop(reply):
                self._finish("user_stop")
        if not self.done and self.turns >= self.max_turns:
            self._finish("max_turns")
        return StepResult(observations, self.done, self.termination, info)

    def reward(self, verdicts: Verdicts | None = None) -> Reward:
        """The tau2 reward of the episode so far (normally called once it is done)."""
        return compute_reward(self.domain, self.task, self.messages, self.db, self.termination, verdicts)

    # -- helpers ---------------------------------------------------------------------
    async def _ask_user(self, agent_text: str) -> str | None:
        started = time.perf_counter()
        try:
            reply = await self.user.reply(agent_text)
        except UserSimulatorError as exc:
            self.error = str(exc)
            self._finish("user_error")
            return None
        finally:
            self.timings["user"] += time.perf_counter() - started
        self.messages.append({"role": "user", "content": reply})
        if is_stop(reply):
            self._finish("user_stop")
        return reply

    def _user_act(self, calls: list[tuple[str, Any]]) -> list[str]:
        """Run the user's own tool calls on the episode's DB, record them, and return their results."""
        started = time.perf_counter()
        ids = []
        for _ in calls:
            self._call_counter += 1
            ids.append(f"user_call_{self.turns}_{self._call_counter}")
        self.messages.append({"role": "user", "content": "", "tool_calls": [
            {"id": i, "type": "function", "function": {"name": name, "arguments": _arguments_text(arguments)}}
            for i, (name, arguments) in zip(ids, calls, strict=True)]})
        results = []
        for call_id, (name, arguments) in zip(ids, calls, strict=True):
            result = self.domain.call("user", name, arguments, self.db)
            self.tool_errors += result.error
            self.messages.append({"role": "tool", "tool_call_id": call_id, "name": name, "content": result.content,
                                  "requestor": "user"})
            results.append(result.content)
        self.timings["env"] += time.perf_counter() - started
        return results

    def _finish(self, termination: str) -> None:
        if not self.done:
            self.done = True
            self.termination = termination

    def _with_id(self, call: ToolCall) -> ToolCall:
        self._call_counter += 1
        if call.id:
            return call
        return ToolCall(call.name, call.arguments, f"call_{self.turns}_{self._call_counter}")


def agent_view(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages the agent sees: without the user's own tool calls and their results."""
    return [m for m in messages
            if not (m.get("role") == "user" and m.get("tool_calls")) and m.get("requestor") != "user"]


def _arguments_text(arguments: Any) -> str:
    """OpenAI messages carry arguments as a JSON string; a raw string stays as the model wrote it. What JSON has no
    value for (a set from a hand-made turn) is written as Python shows it, never an error of the episode."""
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False, default=repr)
