"""Training a program of yours: a rollout pool whose episodes are played by ``agent.command`` (docs/agents.md).

:class:`AgentPool` is :class:`~ctu.distributed.pool.LocalPool` (one engine in this process: weight syncs, parity,
sleep/wake are the same) whose ``run`` does not play episodes itself. For each spec it opens an episode on the
OpenAI-compatible proxy (:mod:`ctu.rollout.agent_proxy`), starts the agent command once for it (at most
``agent.concurrency`` at a time) with the episode's addresses in its environment, waits for it to exit, and
returns the episode's stitched, scored trajectory. An agent that exits non-zero or outlives ``agent.timeout_s``
gives an errored episode (never a reward of 0); its output is kept in ``<run.dir>/agent/logs/<episode>.log``.
Every trajectory, tokens included, is appended to ``<run.dir>/agent/episodes.jsonl``.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import shlex
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ctu.config.redact import redact, redact_data
from ctu.distributed.pool import LocalPool, NamedTensors, RunsCancelled, limits_of
from ctu.engines.base import Engine, SamplingParams
from ctu.rollout.agent_proxy import AgentProxy
from ctu.rollout.external import ExternalEpisodes
from ctu.rollout.loop import EpisodeSpec, RolloutLimits, Trajectory

# what an agent process gets of ctu's environment (docs/agents.md): nothing else, so no API key ctu holds
# (``*.api_key_env``) reaches the agent, its logs or its episodes; ``agent.pass_env`` names more
BASE_VARIABLES = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR",
                  "PYTHONPATH", "VIRTUAL_ENV")
AGENT_VARIABLES = ("OPENAI_BASE_URL", "OPENAI_API_KEY", "CTU_EPISODE_ID", "CTU_EPISODE_TOKEN", "CTU_ENV_URL",
                   "CTU_MODEL", "CTU_DOMAIN", "CTU_TASK_ID")


LIVE: dict[int, subprocess.Popen] = {}  # agent processes started and not yet reaped, by pid (kill_live_agents)


def kill_live_agents() -> None:
    """SIGKILL every agent process this process started and everything each started (its own session): a second
    SIGINT/SIGTERM ends ctu at once, and agents in their own sessions would outlive it."""
    for pid, process in list(LIVE.items()):
        if process.poll() is None:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        LIVE.pop(pid, None)


@dataclass
class AgentRun:
    """One agent process playing one episode."""

    episode_id: str
    process: subprocess.Popen
    log_path: Path
    started: float

    def outcome(self, timeout_s: float) -> tuple[bool, str | None]:
        """``(finished, error)``: still running -> (False, None); exited 0 -> (True, None)."""
        code = self.process.poll()
        if code is None:
            if time.monotonic() - self.started <= timeout_s:
                return False, None
            self.stop()
            return True, f"agent timed out after {timeout_s:g}s (agent.timeout_s); output in {self.log_path}"
        if code != 0:
            return True, f"agent exited with status {code}: {last_line(self.log_path)} (output in {self.log_path})"
        return True, None

    def stop(self) -> None:
        """Stop the agent and everything it started (its own process group)."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait()
        LIVE.pop(self.process.pid, None)


def last_line(path: Path, limit: int = 300) -> str:
    """The last non-empty line of a log (the agent's error, normally), redacted and cut to ``limit`` characters."""
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no output"
    return redact(lines[-1])[:limit] if lines else "no output"


def base_environment(pass_env: Sequence[str] = (), environ=None) -> dict[str, str]:
    """What an agent process gets of ctu's environment: :data:`BASE_VARIABLES` and the names ``pass_env`` gives."""
    environ = os.environ if environ is None else environ
    return {name: environ[name] for name in (*BASE_VARIABLES, *pass_env) if name in environ}


def redact_file(path: Path) -> None:
    """Rewrite a text file through :func:`~ctu.config.redact.redact` (an agent's kept log)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return
    if redact(text) != text:
        path.write_text(redact(text))


def agent_environment(proxy: AgentProxy, episode_id: str, spec: EpisodeSpec, token: str) -> dict[str, str]:
    """What the agent process is told of its episode (:data:`AGENT_VARIABLES`, on top of :func:`base_environment`):
    its token twice, as the OpenAI SDK's key and by name, for the proxy's every route."""
    return {"OPENAI_BASE_URL": proxy.base_url, "OPENAI_API_KEY": token, "CTU_EPISODE_TOKEN": token,
            "CTU_EPISODE_ID": episode_id,
            "CTU_ENV_URL": proxy.env_url(episode_id), "CTU_MODEL": proxy.episodes.model_name,
            "CTU_DOMAIN": spec.domain.name, "CTU_TASK_ID": spec.task.id}


class AgentPool(LocalPool):
    """Episodes played by the user's agent command through the proxy (see the module docstring)."""

    episodes_in_process = False  # the agent plays them: an asynchronous producer hands it whole groups

    def __init__(self, engine: Engine, chat, user, limits: RolloutLimits, *, command: str, run_dir: str | Path,
                 concurrency: int = 8, timeout_s: float = 600.0, judge=None, max_batch_size: int = 64,
                 pass_env: Sequence[str] = (), name: str = ""):
        super().__init__(engine, chat, user, limits, judge=judge, concurrency=concurrency,
                         max_batch_size=max_batch_size)
        self.command = shlex.split(command)
        self.timeout_s = timeout_s
        self.pass_env = tuple(pass_env)
        self.dir = Path(run_dir) / "agent"
        self.name = name  # a Ray rollout worker's ("w<k>"): its episodes' ids start with it, in the same files
        self.episodes = ExternalEpisodes(chat, engine, user, limits, max_batch_size=max_batch_size)
        self.proxy = AgentProxy(self.episodes).start()
        self._calls = itertools.count()
        self._slots = threading.BoundedSemaphore(max(1, concurrency))  # agents running, over overlapping calls
        self._write = threading.Lock()
        self._cancel = threading.Event()  # cancel_runs: every call stops its agents and raises

    @classmethod
    def from_config(cls, config, engine: Engine, chat, user, judge=None, name: str = "") -> AgentPool:
        a = config.agent
        return cls(engine, chat, user, limits_of(config), command=a.command, run_dir=config.run.dir,
                   concurrency=a.concurrency, timeout_s=a.timeout_s, judge=judge,
                   max_batch_size=config.engine.max_batch_size, pass_env=a.pass_env, name=name)

    def run(self, specs: Sequence[EpisodeSpec], params: SamplingParams, seed: int,
            judge_enabled: bool = False, on_done: Callable[[Trajectory], None] | None = None) -> list[Trajectory]:
        """Calls may overlap (an asynchronous producer's groups): at most ``agent.concurrency`` agents run over
        all of them."""
        call = next(self._calls)
        (self.dir / "logs").mkdir(parents=True, exist_ok=True)
        judge = self.judge if judge_enabled else None
        out: list[Trajectory | None] = [None] * len(specs)
        waiting: deque[int] = deque(range(len(specs)))
        running: dict[int, AgentRun] = {}
        self.proxy.call(lambda: self.episodes.begin(params))
        try:
            while waiting or running:
                if self._cancel.is_set():
                    raise RunsCancelled(f"agent call {call} cancelled: the run is ending")
                while waiting and self._slots.acquire(blocking=False):
                    i = waiting.popleft()
                    try:
                        running[i] = self._launch(f"{self.name}-r{call}-e{i}".lstrip("-"), specs[i], seed + i,
                                                  params)
                    except BaseException:
                        self._slots.release()
                        raise
                time.sleep(0.01)
                for i, agent in list(running.items()):
                    finished, error = agent.outcome(self.timeout_s)
                    if not finished:
                        continue
                    del running[i]
                    self._slots.release()
                    out[i] = done = self._finish(agent, error, judge, call)
                    if on_done is not None:
                        on_done(done)
        finally:
            for agent in running.values():  # interrupted: no agent outlives the run
                agent.stop()
                self._slots.release()
                self.proxy.call(self.episodes.finish(agent.episode_id, "interrupted"))
            self.proxy.call(self.episodes.end)
        return [t for t in out if t is not None]

    def _launch(self, episode_id: str, spec: EpisodeSpec, seed: int, params: SamplingParams) -> AgentRun:
        token = self.proxy.call(self.episodes.open(episode_id, spec, seed, params)).token
        log_path = self.dir / "logs" / f"{episode_id}.log"
        with log_path.open("wb") as log:
            try:
                process = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=log,
                                           stderr=subprocess.STDOUT, start_new_session=True,
                                           env={**base_environment(self.pass_env),
                                                **agent_environment(self.proxy, episode_id, spec, token)})
            except OSError as exc:
                self.proxy.call(self.episodes.finish(episode_id, "not started"))
                raise OSError(f"agent.command: cannot start {self.command[0]!r}: {exc}") from None
        LIVE[process.pid] = process
        for pid, other in list(LIVE.items()):  # the reaped ones go
            if other.returncode is not None:
                LIVE.pop(pid, None)
        return AgentRun(episode_id, process, log_path, time.monotonic())

    def _finish(self, agent: AgentRun, error: str | None, judge, call: int) -> Trajectory:
        agent_s = time.monotonic() - agent.started
        trajectory = self.proxy.call(self.episodes.finish(agent.episode_id, error, judge, agent_s))
        if trajectory.stop_reason != "error":
            agent.log_path.unlink(missing_ok=True)  # kept only where the episode errored
        else:  # kept redacted: what the agent printed goes through the same redaction as ctu's own output
            redact_file(agent.log_path)
            if error is None and trajectory.error and str(agent.log_path) not in trajectory.error:
                trajectory.error = f"{trajectory.error}; output in {agent.log_path}"
        row = {"call": call, "episode_id": agent.episode_id, **trajectory.to_json(with_tokens=True),
               "logprobs": trajectory.logprobs, "token_versions": trajectory.token_versions,
               "extra_samples": [s.to_json() for s in trajectory.extra_samples]}
        if trajectory.stop_reason == "error":
            row["log"] = str(agent.log_path)
        line = json.dumps(redact_data(row)) + "\n"
        with self._write, (self.dir / "episodes.jsonl").open("a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)  # rollout workers on one machine append to the same file: whole lines
            f.write(line)
        return trajectory

    def cancel_runs(self) -> None:
        self._cancel.set()

    def update_weights(self, named_tensors: NamedTensors, version: int) -> None:
        super().update_weights(named_tensors, version)
        self.episodes.version = version

    def update_adapter(self, named_tensors: NamedTensors, version: int) -> None:
        super().update_adapter(named_tensors, version)
        self.episodes.version = version

    def close(self) -> None:
        try:
            self.proxy.close()
        finally:
            super().close()
