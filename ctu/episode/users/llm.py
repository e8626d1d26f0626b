"""An LLM-played user through any OpenAI-compatible chat API, prompted as tau2-bench does.

The simulator sees the conversation from the customer's side: the agent's messages are
``user`` turns for it, its own replies ``assistant`` turns. Strategies (tau-bench's):
- ``llm``: one completion per reply;
- ``react``: the model writes ``Thought:`` then ``User Response:``; only the response is sent;
- ``verify``: a second call checks the reply against the scenario; a rejected reply is
  regenerated with the rejection in the prompt (up to ``max_verify_rounds`` times);
- ``reflection``: like verify, but a rejected reply is first reflected on, and the
  reflection's revised response is used (only a clean ``Response:``; never its scaffolding).
Failures after retries raise UserSimulatorError: the episode is marked errored.

Dual control (telecom): the user's own tools go to the chat API as ``tools``; a reply that calls
tools is executed on the user's device, the calls and their results join the user model's history
(its ``assistant`` tool calls, ``tool`` results), and the model is asked again, until it writes
text for the agent (at most ``max_tool_rounds`` rounds), as tau2's user simulator does.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from ctu.config.redact import redact
from ctu.domains.base import Domain, Task
from ctu.episode.llm_api import (
    DEFAULT_BACKOFF_INITIAL,
    DEFAULT_BACKOFF_MAX,
    DEFAULT_MAX_RETRIES,
    DEFAULT_TIMEOUT,
    ChatAPIConfig,
    ChatClient,
    LLMCallError,
)
from ctu.episode.users.base import UserSession, UserSimulator, UserSimulatorError

GUIDELINES = """# User simulation guidelines
You play a customer contacting a customer service agent. Follow the scenario instructions below.
- Write one message at a time, like a real customer would.
- Follow the scenario strictly. Never invent information the scenario does not give you; treat it as unknown.
- Do not copy the instructions word for word: paraphrase them naturally.
- Reveal information progressively: wait for the agent to ask before giving details.
- Keep going until the task is complete. When your goal is satisfied, write '###STOP###' to end the conversation.
- If you are transferred to another agent, write '###TRANSFER###'.
- If the scenario does not give you enough information to continue, write '###OUT-OF-SCOPE###'."""

TOOLS_GUIDELINES = """
- You have tools that act on your own phone. When the agent asks you to check or change something on
  your phone, call the matching tool, then tell the agent what it showed. Never make up tool results;
  ground everything you say about your phone on what your tools returned."""

REACT_SUFFIX = """
Format every reply as:
Thought:
<your reasoning about what to say next>

User Response:
<the message to send to the agent>"""

VERIFY_PROMPT = """You supervise a simulated customer. Given the scenario and the conversation so far, decide whether
the customer's latest reply is consistent with the scenario: it reveals no invented information, follows the
instructions, and ends with '###STOP###' only when the goal is met. Answer with one word: true or false.

<scenario>
{scenario}
</scenario>

<conversation>
{conversation}
</conversation>

Latest customer reply: {reply}"""

REFLECT_PROMPT = VERIFY_PROMPT + """

The reply was judged inconsistent with the scenario. Reflect on what is wrong, then write a better reply, as:
Reflection:
<what was wrong>

Response:
<the corrected customer reply>"""

Strategy = Literal["llm", "react", "verify", "reflection"]


@dataclass(frozen=True)
class LLMUserConfig:
    model: str
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    strategy: Strategy = "llm"
    temperature: float = 0.0
    max_tokens: int = 512
    max_retries: int = DEFAULT_MAX_RETRIES
    backoff_initial: float = DEFAULT_BACKOFF_INITIAL
    backoff_max: float = DEFAULT_BACKOFF_MAX
    timeout: float = DEFAULT_TIMEOUT
    max_verify_rounds: int = 2
    max_tool_rounds: int = 10


def scenario_prompt(task: Task) -> str:
    """tau2's rendering of a user scenario (persona, then the structured instructions)."""
    scenario = task.user_scenario or {}
    lines = []
    if scenario.get("persona"):
        lines += ["Persona:", "\t" + str(scenario["persona"]).replace("\n", "\n\t")]
    instructions = scenario.get("instructions")
    if isinstance(instructions, dict):
        parts = [f"Domain: {instructions.get('domain', '')}",
                 "Reason for call:\n\t" + str(instructions.get("reason_for_call") or "").replace("\n", "\n\t")]
        for key, title in (("known_info", "Known info"), ("unknown_info", "Unknown info")):
            if instructions.get(key) is not None:
                parts.append(f"{title}:\n\t" + str(instructions[key]).replace("\n", "\n\t"))
        parts.append("Task instructions:\n\t" + str(instructions.get("task_instructions") or "").replace("\n", "\n\t"))
        text = "\n".join(parts)
    else:
        text = str(instructions or "")
    lines += ["Instructions:", "\t" + text.replace("\n", "\n\t")]
    return "\n".join(lines)


def system_prompt(task: Task, strategy: Strategy, with_tools: bool = False) -> str:
    guidelines = GUIDELINES + TOOLS_GUIDELINES if with_tools else GUIDELINES
    base = f"{guidelines}\n\n<scenario>\n{scenario_prompt(task)}\n</scenario>"
    return base + REACT_SUFFIX if strategy == "react" else base


SCAFFOLD = re.compile(r"^\s*(?:Thought|Reflection|User Response|Response)\s*:", re.I | re.M)
PLACEHOLDER = re.compile(r"^<[^<>\n]*>$")  # a template slot echoed back, e.g. "<the corrected customer reply>"
REJECTED = ("(A note from the simulation's supervisor, not from the agent: your last reply was rejected because "
            "{problem}. Write a different reply to the agent's last message, following the scenario.)")


def _labelled(label: str, text: str) -> str | None:
    """What follows the last ``label:``; None when the label is missing or what follows is empty, a template
    placeholder or more scaffolding (such text must never reach the agent)."""
    parts = re.split(rf"\b{label}\s*:", text, flags=re.I)
    body = parts[-1].strip() if len(parts) > 1 else ""
    return body if body and not PLACEHOLDER.match(body) and not SCAFFOLD.search(body) else None


class LLMUserSession(UserSession):
    def __init__(self, client: ChatClient, config: LLMUserConfig, task: Task, seed: int):
        self.client = client
        self.config = config
        self.task = task
        self.seed = seed
        self.history: list[dict[str, Any]] = [{"role": "system", "content": system_prompt(task, config.strategy)}]

    def bind_tools(self, toolbox) -> None:
        super().bind_tools(toolbox)
        self.history[0]["content"] = system_prompt(self.task, self.config.strategy, with_tools=True)

    async def _complete(self, messages: list[dict[str, Any]], tools: list[dict] | None = None) -> Any:
        try:
            return await self.client.complete(messages, temperature=self.config.temperature,
                                              max_tokens=self.config.max_tokens, seed=self.seed, tools=tools)
        except LLMCallError as exc:
            raise UserSimulatorError(f"user simulator: {exc}") from None

    async def _complete_acting(self) -> str:
        """Ask the model for a reply; run the tool calls it makes on the user's device until it writes text."""
        tools = self.toolbox.schemas if self.toolbox is not None else None
        for _ in range(self.config.max_tool_rounds + 1):
            reply = await self._complete(self.history, tools)
            if isinstance(reply, str):
                return reply
            calls = [(c.function.name, _decode(c.function.arguments)) for c in reply.tool_calls]
            self.history.append({"role": "assistant", "content": reply.content or "", "tool_calls": [
                {"id": c.id, "type": "function", "function": {"name": c.function.name,
                                                              "arguments": c.function.arguments}}
                for c in reply.tool_calls]})
            results = self.toolbox.act(calls)  # type: ignore[union-attr]  # tool calls come only with a toolbox
            self.history += [{"role": "tool", "tool_call_id": c.id, "content": r}
                             for c, r in zip(reply.tool_calls, results, strict=True)]
        raise UserSimulatorError(f"user simulator model '{self.config.model}' kept calling tools: more than "
                                 f"{self.config.max_tool_rounds} rounds without a message to the agent")

    def _transcript(self) -> str:
        who = {"user": "agent", "assistant": "customer"}
        return "\n".join(f"{who[m['role']]}: {m['content']}" for m in self.history
                         if m["role"] in who and m.get("content"))

    async def _verified(self, reply: str) -> bool:
        verdict = await self._complete([{"role": "user", "content": VERIFY_PROMPT.format(
            scenario=scenario_prompt(self.task), conversation=self._transcript(), reply=reply)}])
        return "true" in verdict.strip().lower()[:10]

    async def _reflect(self, reply: str) -> str | None:
        reflection = await self._complete([{"role": "user", "content": REFLECT_PROMPT.format(
            scenario=scenario_prompt(self.task), conversation=self._transcript(), reply=reply)}])
        return _labelled("Response", reflection)

    def _message(self, raw: str) -> str | None:
        """The customer's message in a completion; None if it holds only scaffolding (react's Thought)."""
        if self.config.strategy != "react":
            return raw.strip() or None
        found = _labelled("User Response", raw)
        return found if found is not None or SCAFFOLD.search(raw) else raw.strip() or None

    async def reply(self, agent_message: str) -> str:
        """The next customer message. verify/reflection check it against the scenario; a rejected reply (or a
        react reply without its ``User Response:``) is regenerated with the rejection in the prompt, so that it
        changes even at temperature 0; reflection's revision replaces it only when it has a clean ``Response:``."""
        self.history.append({"role": "user", "content": agent_message})
        raw = await self._complete_acting()
        reply = self._message(raw)
        problem = ""
        for _ in range(self.config.max_verify_rounds):
            if reply is None:
                problem = "it had no 'User Response:' section"
            elif self.config.strategy not in ("verify", "reflection") or await self._verified(reply):
                break
            else:
                problem = "it is not consistent with the scenario"
                if self.config.strategy == "reflection":
                    revised = await self._reflect(reply)
                    if revised is not None:
                        raw = reply = revised
                        continue
            raw = await self._complete([*self.history, {"role": "assistant", "content": raw},
                                        {"role": "user", "content": REJECTED.format(problem=problem)}])
            reply = self._message(raw)
        if not reply:
            raise UserSimulatorError(f"user simulator model '{self.config.model}' gave no usable reply after "
                                     f"{self.config.max_verify_rounds + 1} tries ({problem})")
        self.history.append({"role": "assistant", "content": reply})
        return reply


def _decode(arguments: Any) -> Any:
    """A tool call's JSON-string arguments as an object (left as given if not JSON: the tool reports it)."""
    if not isinstance(arguments, str):
        return arguments
    try:
        return json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
        return arguments


class LLMUser(UserSimulator):
    """A user simulator played by an LLM; one HTTP client shared by all sessions."""

    def __init__(self, config: LLMUserConfig, sleep=None):
        self.config = config
        api = ChatAPIConfig(model=config.model, base_url=config.base_url, api_key_env=config.api_key_env,
                            max_retries=config.max_retries, backoff_initial=config.backoff_initial,
                            backoff_max=config.backoff_max, timeout=config.timeout)
        try:
            self.client = ChatClient(api) if sleep is None else ChatClient(api, sleep=sleep)
        except LLMCallError as exc:
            raise UserSimulatorError(str(exc)) from None

    def __repr__(self) -> str:
        url = redact(self.config.base_url) if self.config.base_url else None
        return f"LLMUser(model={self.config.model!r}, base_url={url!r}, strategy={self.config.strategy!r})"

    def start(self, domain: Domain, task: Task, seed: int = 0) -> LLMUserSession:
        return LLMUserSession(self.client, self.config, task, seed)
