"""A SkyRL (``skyrl_gym``) text environment for ctu's parquet tasks: one per domain, ``ctu_<domain>``, the
``env_class`` that ``ctu data export --format parquet`` writes.

Register them where SkyRL makes environments (your entrypoint, before training starts)::

    from ctu.app.integrations.skyrl_env import register
    register()                      # ctu_mini, ctu_retail, ctu_airline, ctu_telecom

SkyRL then calls ``skyrl_gym.make(env_class, env_config=..., extras=row)``: the row's
``reward_spec.ground_truth`` is the tau2 task and ``extra_info.domain`` its domain. ``init(prompt)`` opens a
ctu :class:`~ctu.episode.env.Episode` against the scripted user (the prompt is the episode's opening, as exported);
``step(text)`` parses one assistant turn as ctu's rollouts do (hermes ``<tool_call>`` and the other formats of
:mod:`ctu.episode.parsing`), runs its tool calls or sends its text to the user, and returns the tool results / user
reply as observations. The reward is 0 until the episode ends, then ctu's tau2 reward. ``env_config`` may set
``max_turns`` (30), ``max_errors`` (10), ``patience`` (the scripted user's replies, 8) and ``data_dir``;
``extras.max_turns`` overrides ``max_turns`` per row.

:class:`CtuTextEnv` holds the logic and needs no SkyRL; :func:`make_env` (the registered entry point) mixes it
with SkyRL's ``BaseTextEnv``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from ctu.app.integrations.common import plain, run_sync, strip_end, task_of
from ctu.domains import DOMAINS
from ctu.episode.env import AgentTurn, Episode, ToolCall
from ctu.episode.parsing import parse_model_output
from ctu.episode.users.scripted import ScriptedUser

ENV_PREFIX = "ctu_"
ENTRY_POINT = "ctu.app.integrations.skyrl_env:make_env"


def _setting(config: Any, key: str, default: Any) -> Any:
    if config is None:
        return default
    value = config.get(key, None) if hasattr(config, "get") else getattr(config, key, None)
    return default if value is None else value


class CtuTextEnv:
    """SkyRL's ``BaseTextEnv`` protocol over a ctu episode (``init``, ``step``, ``close``, ``get_metrics``)."""

    def __init__(self, env_config: Any = None, extras: Mapping[str, Any] | None = None, domain: str | None = None):
        super().__init__()  # BaseTextEnv's, when mixed with it
        extras = plain(extras or {})
        info = dict(extras.get("extra_info") or {})
        if domain and not info.get("domain"):
            info["domain"] = domain
        truth = (extras.get("reward_spec") or {}).get("ground_truth") or \
            (extras.get("reward_model") or {}).get("ground_truth")
        self.domain, self.task = task_of(truth, info, extras.get("data_source"),
                                         _setting(env_config, "data_dir", None))
        self.max_turns = int(extras.get("max_turns") or _setting(env_config, "max_turns", 30))
        user = ScriptedUser(int(_setting(env_config, "patience", 8))).start(self.domain, self.task)
        self.episode = Episode(self.domain, self.task, user, max_turns=self.max_turns,
                               max_errors=int(_setting(env_config, "max_errors", 10)))
        self.turns = 0
        self.parse_failures = 0
        self.reward = 0.0
        self.opening: list[dict[str, str]] = []

    def init(self, prompt: list[dict[str, Any]] | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Start the episode; the prompt (the exported opening) is returned as is, else the episode's opening."""
        self.opening = [{"role": m["role"], "content": m.get("content") or ""}
                        for m in run_sync(self.episode.reset())]
        prompt = plain(prompt) if prompt is not None else None
        return (prompt if prompt else list(self.opening)), {"domain": self.domain.name, "task_id": self.task.id}

    def step(self, action: str) -> dict[str, Any]:
        """One assistant turn (the model's raw text) in; observations, reward, done and metadata out."""
        if not self.opening:
            self.init()
        self.turns += 1
        parsed = parse_model_output(strip_end(action or ""))
        self.parse_failures += parsed.failed
        turn = AgentTurn(parsed.content, tuple(ToolCall(c.name, c.arguments) for c in parsed.tool_calls))
        result = run_sync(self.episode.step(turn))
        metadata: dict[str, Any] = {"tool_calls": len(turn.tool_calls), "parse_failed": parsed.failed}
        if result.done:
            reward = self.episode.reward()
            self.reward = reward.reward
            metadata.update(termination=reward.termination, components=dict(reward.components),
                            reasons=list(reward.reasons))
            return {"observations": [], "reward": float(reward.reward), "done": True, "metadata": metadata}
        observations = [{"role": m["role"], "content": m.get("content") or ""} for m in result.observations]
        return {"observations": observations, "reward": 0.0, "done": False, "metadata": metadata}

    def close(self) -> None:
        pass

    def get_metrics(self) -> dict[str, Any]:
        return {"turns": self.turns, "reward": self.reward, "tool_errors": self.episode.tool_errors,
                "parse_failures": self.parse_failures}


@functools.cache
def env_class() -> type:
    """:class:`CtuTextEnv` mixed with SkyRL's ``BaseTextEnv`` (imports skyrl_gym)."""
    from skyrl_gym.envs.base_text_env import BaseTextEnv

    return type("CtuSkyRLEnv", (CtuTextEnv, BaseTextEnv), {"__module__": __name__})


def make_env(env_config: Any = None, extras: Mapping[str, Any] | None = None, domain: str | None = None):
    """SkyRL's entry point for ``ctu_<domain>``."""
    return env_class()(env_config=env_config, extras=extras, domain=domain)


def register(domains: tuple[str, ...] | list[str] = DOMAINS) -> list[str]:
    """Register ``ctu_<domain>`` with skyrl_gym for each domain (a name, or ``package.module:function``);
    returns the ids. Already registered ids are left as they are."""
    import skyrl_gym

    ids = []
    for name in domains:
        env_id = ENV_PREFIX + name
        if env_id not in skyrl_gym.registry:
            skyrl_gym.register(id=env_id, entry_point=ENTRY_POINT, kwargs={"domain": name})
        ids.append(env_id)
    return ids
