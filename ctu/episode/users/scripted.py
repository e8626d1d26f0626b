"""A deterministic scripted user: no model, same replies every time.

If the task's ``user_scenario`` has a ``script`` (a list of messages, as the ``mini``
domain's tasks do), the user says them in order, one per agent message, and then
ends the conversation with ``###STOP###``. Otherwise (tau2 tasks) it opens with the
scenario's reason for calling and known information, answers requests to confirm with
a yes and other questions with what it knows, ends the conversation when the agent
makes a statement (no question), and in any case stops after ``patience`` replies.

Dual control (telecom): when the agent's message names one of the user's tools (``toggle_roaming``
or "toggle roaming"), the user performs it before replying — with the task's gold arguments when it
is one of the task's user-side gold actions (the first pending run of that tool's consecutive gold calls),
with no arguments when the tool takes none — and replies with what the phone showed.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from ctu.domains.base import Domain, Task
from ctu.episode.users.base import STOP, STOP_TOKENS, UserSession, UserSimulator

_CONFIRM = re.compile(r"\b(confirm|proceed|yes or no|shall i|should i|would you like me to|do you want me to)\b", re.I)


def scenario_text(scenario: dict[str, Any]) -> tuple[str, str]:
    """(reason for calling, known info) of a tau2 user scenario; instructions may be a string."""
    instructions = scenario.get("instructions") if isinstance(scenario, dict) else None
    if isinstance(instructions, str):
        return instructions.strip(), ""
    if isinstance(instructions, dict):
        reason = (instructions.get("reason_for_call") or "").strip()
        known = (instructions.get("known_info") or "").strip()
        return reason, known
    return "", ""


@functools.lru_cache(maxsize=4096)  # a pure function of long scenario texts, asked again every episode
def _first_person(text: str) -> str:
    """Turn scenario prose ("You want to ...", "Your user id is ...") into the user's voice, without the stop
    tokens instructions may quote (banking_knowledge: "end the conversation with ###STOP###"): read out, they
    would end the call."""
    swaps = [(r"\bYou are\b", "I am"), (r"\byou are\b", "I am"), (r"\bYour\b", "My"), (r"\byour\b", "my"),
             (r"\bYou\b", "I"), (r"\byou\b", "I"), (r"\byourself\b", "myself")]
    for pattern, repl in swaps:
        text = re.sub(pattern, repl, text)
    for token in STOP_TOKENS:
        text = text.replace(token, "")
    return " ".join(text.split())


def _user_runs(task: Task) -> list[list]:
    """The task's user-side gold actions in runs: consecutive gold actions of one user tool (banking_knowledge's
    four transfer requests come as two runs of two, with the agent's actions between them)."""
    runs: list[list] = []
    previous = None
    for action in task.actions:
        if action.requestor == "user":
            if previous is not None and previous.requestor == "user" and previous.name == action.name:
                runs[-1].append(action)
            else:
                runs.append([action])
        previous = action
    return runs


class ScriptedSession(UserSession):
    def __init__(self, task: Task, patience: int):
        script = task.user_scenario.get("script") if isinstance(task.user_scenario, dict) else None
        self._script = list(script) if script else None
        reason, known = scenario_text(task.user_scenario)
        self._opening = _first_person(f"{known} {reason}".strip()) or "I need help with my account."
        self._known = _first_person(known) or self._opening
        self._patience = patience
        self._replies = 0
        self._pending = _user_runs(task)  # user-side gold actions not yet done, in runs

    async def reply(self, agent_message: str) -> str:
        self._replies += 1
        if self._script is not None:
            index = self._replies - 1
            return self._script[index] if index < len(self._script) else f"Thank you. {STOP}"
        if self._replies == 1:
            return self._opening
        if self._replies > self._patience:
            return f"Thank you, that is all. {STOP}"
        done = self._act(agent_message or "")
        if done:
            return "I did that on my phone. " + " ".join(f"{name}: {result}" for name, result in done)
        if _CONFIRM.search(agent_message or ""):
            return "Yes, please go ahead."
        if "?" in (agent_message or ""):
            return self._known
        return f"Thank you, that is all. {STOP}"


    def _requested(self, agent_message: str) -> list[str]:
        """The user's tools the agent's message names, in the order it names them (the longest name wins:
        "toggle_wifi_calling" is not also "toggle_wifi")."""
        text = agent_message.lower()
        found = []
        for name in self.toolbox.names if self.toolbox else []:
            for form in (name, name.replace("_", " ")):
                found += [(m.start(), m.end(), name) for m in re.finditer(rf"(?<![\w]){re.escape(form)}(?![\w])", text)]
        kept: list[tuple[int, int, str]] = []
        for start, end, name in sorted(found, key=lambda f: f[0] - f[1]):
            if all(end <= s or start >= e for s, e, _ in kept):
                kept.append((start, end, name))
        return list(dict.fromkeys(name for _, _, name in sorted(kept)))

    def _act(self, agent_message: str) -> list[tuple[str, str]]:
        """Perform the tools the agent asked for; (name, result text) of each call made."""
        if self.toolbox is None:
            return []
        required = {s["function"]["name"]: s["function"]["parameters"].get("required", [])
                    for s in self.toolbox.schemas}
        calls: list[tuple[str, Any]] = []
        for name in self._requested(agent_message):
            run = next((r for r in self._pending if r[0].name == name), None)
            if run is not None:
                self._pending.remove(run)
                calls += [(name, dict(a.arguments)) for a in run]
            elif not required.get(name):
                calls.append((name, {}))
        if not calls:
            return []
        results = self.toolbox.act(calls)
        return [(name, result) for (name, _), result in zip(calls, results, strict=True)]


class ScriptedUser(UserSimulator):
    """Deterministic user; ``patience`` bounds its replies on tau2 tasks."""

    def __init__(self, patience: int = 8):
        if patience < 1:
            raise ValueError("patience must be >= 1")
        self.patience = patience

    def start(self, domain: Domain, task: Task, seed: int = 0) -> ScriptedSession:
        return ScriptedSession(task, self.patience)
