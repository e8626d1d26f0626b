"""The interface every simulated user implements.

A :class:`UserSimulator` is shared across episodes and creates one :class:`UserSession`
per episode (its private conversation state). Sessions are async so that many
episodes' user turns can run concurrently in one process.

Stop tokens follow tau2-bench: a user message containing any of them ends the episode.

Dual control: in a domain where the user has tools of their own (telecom's phone), the episode
binds a :class:`UserToolbox` to the session before the first reply; a session that can act calls
``toolbox.act`` while composing its reply. Sessions that ignore it never touch their device.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ctu.domains.base import Domain, Task

STOP = "###STOP###"
TRANSFER = "###TRANSFER###"
OUT_OF_SCOPE = "###OUT-OF-SCOPE###"
STOP_TOKENS = (STOP, TRANSFER, OUT_OF_SCOPE)

AGENT_GREETING = "Hi! How can I help you today?"


def is_stop(user_text: str | None) -> bool:
    """tau2's ``UserSimulator.is_stop``: the text contains a stop token."""
    if not user_text:
        return False
    return any(token in user_text for token in STOP_TOKENS)


class UserSimulatorError(RuntimeError):
    """The user simulator could not produce a reply (after its retries).

    The episode is marked errored and excluded from rewards; it never scores a silent 0.
    """


@dataclass(frozen=True)
class UserToolbox:
    """The user's own tools in one episode: their OpenAI schemas, and ``act`` to call them.

    ``act([(name, arguments), ...])`` runs the calls in order on the episode's state, records them in
    the transcript, and returns each call's result text (``"Error: ..."`` for a failed call).
    """

    schemas: list[dict[str, Any]]
    act: Callable[[list[tuple[str, Any]]], list[str]] = field(repr=False)

    @property
    def names(self) -> list[str]:
        return [s["function"]["name"] for s in self.schemas]


class UserSession(ABC):
    """One episode's simulated user."""

    toolbox: UserToolbox | None = None

    def bind_tools(self, toolbox: UserToolbox) -> None:
        """Give the session the user's own tools (called by the episode in dual-control domains)."""
        self.toolbox = toolbox

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
