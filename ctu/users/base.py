"""The interface every simulated user implements.

A :class:`UserSimulator` is shared across episodes and creates one :class:`UserSession`
per episode (its private conversation state). Sessions are async so that many
episodes' user turns can run concurrently in one process.

Stop tokens follow tau2-bench: a user message containing any of them ends the episode.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ctu.domains.base import Domain, Task

STOP = "###STOP###"
TRANSFER = "###TRANSFER###"
OUT_OF_SCOPE = "###OUT-OF-SCOPE###"
STOP_TOKENS = (STOP, TRANSFER, OUT_OF_SCOPE)

AGENT_GREETING = "Hi! How can I help you today?"


def is_stop(user_text: str | None) -> bool:
    """tau2's ``UserSimulator.is_stop``: the text contains a stop token."""
    return bool(user_text) and any(token in user_text for token in STOP_TOKENS)


class UserSimulatorError(RuntimeError):
    """The user simulator could not produce a reply (after its retries).

    The episode is marked errored and excluded from rewards; it never scores a silent 0.
    """


class UserSession(ABC):
    """One episode's simulated user."""

    @abstractmethod
    async def reply(self, agent_message: str) -> str:
        """The user's next message, given the agent's latest message to the user.

        The first call receives the agent's greeting. Raises UserSimulatorError on failure.
        """


class UserSimulator(ABC):
    """Creates user sessions for tasks."""

    @abstractmethod
    def start(self, domain: Domain, task: Task, seed: int = 0) -> UserSession:
        """A fresh session for one episode of ``task``."""
