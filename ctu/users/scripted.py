"""A deterministic scripted user: no model, same replies every time.

If the task's ``user_scenario`` has a ``script`` (a list of messages, as the ``mini``
domain's tasks do), the user says them in order, one per agent message, and then
ends the conversation with ``###STOP###``. Otherwise (tau2 tasks) it opens with the
scenario's reason for calling and known information, answers requests to confirm with
a yes and other questions with what it knows, ends the conversation when the agent
makes a statement (no question), and in any case stops after ``patience`` replies.
"""

from __future__ import annotations

import re
from typing import Any

from ctu.domains.base import Domain, Task
from ctu.users.base import STOP, UserSession, UserSimulator

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


def _first_person(text: str) -> str:
    """Turn scenario prose ("You want to ...", "Your user id is ...") into the user's voice."""
    swaps = [(r"\bYou are\b", "I am"), (r"\byou are\b", "I am"), (r"\bYour\b", "My"), (r"\byour\b", "my"),
             (r"\bYou\b", "I"), (r"\byou\b", "I"), (r"\byourself\b", "myself")]
    for pattern, repl in swaps:
        text = re.sub(pattern, repl, text)
    return " ".join(text.split())


class ScriptedSession(UserSession):
    def __init__(self, task: Task, patience: int):
        script = task.user_scenario.get("script") if isinstance(task.user_scenario, dict) else None
        self._script = list(script) if script else None
        reason, known = scenario_text(task.user_scenario)
        self._opening = _first_person(f"{known} {reason}".strip()) or "I need help with my account."
        self._known = _first_person(known) or self._opening
        self._patience = patience
        self._replies = 0

    async def reply(self, agent_message: str) -> str:
        self._replies += 1
        if self._script is not None:
            index = self._replies - 1
            return self._script[index] if index < len(self._script) else f"Thank you. {STOP}"
        if self._replies == 1:
            return self._opening
        if self._replies > self._patience:
            return f"Thank you, that is all. {STOP}"
        if _CONFIRM.search(agent_message or ""):
            return "Yes, please go ahead."
        if "?" in (agent_message or ""):
            return self._known
        return f"Thank you, that is all. {STOP}"


class ScriptedUser(UserSimulator):
    """Deterministic user; ``patience`` bounds its replies on tau2 tasks."""

    def __init__(self, patience: int = 8):
        if patience < 1:
            raise ValueError("patience must be >= 1")
        self.patience = patience

    def start(self, domain: Domain, task: Task, seed: int = 0) -> ScriptedSession:
        return ScriptedSession(task, self.patience)
