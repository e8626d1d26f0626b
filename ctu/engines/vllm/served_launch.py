"""Start, health-check and stop a vLLM OpenAI server for ``engine.kind=served`` with ``engine.launch=true``.

The server runs ``python -m vllm.entrypoints.openai.api_server`` (what ``vllm serve`` runs) as a child in its own
process group, with the environment that weight syncs need: ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` (the
``/v1/load_lora_adapter`` routes) and ``VLLM_SERVER_DEV_MODE=1`` (``/reset_prefix_cache``, ``/server_info``,
``/collective_rpc``, ``/update_weight_version``); the API key, if any, goes as ``VLLM_API_KEY`` in its environment
(never on the command line, never to a file). Its output goes to a log file in the run directory. It is stopped
when the engine closes, at interpreter exit, and (Linux) when this process dies (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx


class ServerStartError(RuntimeError):
    """The server exited or did not become healthy in time (one line naming its log file)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_command(model_dir: str, served_name: str, port: int, *, python: str | None = None, dtype: str = "auto",
                   seed: int = 0, max_model_len: int | None = None, logprobs_mode: str = "processed_logprobs",
                   lora_rank: int | None = None, max_loras: int = 1, extra: Sequence[str] = (),
                   gpu_memory_utilization: float | None = None, fingerprint: bool = False,
                   sleep_mode: bool = False) -> list[str]:
    """The server's command line; ``lora_rank``: serve LoRA adapters up to that rank (``--enable-lora``);
    ``gpu_memory_utilization``: its share of the GPU (vLLM's default, 0.9, leaves no room for a trainer beside it);
    ``sleep_mode``: ``--enable-sleep-mode`` (``/sleep`` and ``/wake_up``, dev routes; CUDA only)."""
    cmd = [python or sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
           "--served-model-name", served_name, "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype,
           "--seed", str(seed), "--logprobs-mode", logprobs_mode]
    if max_model_len is not None:
        cmd += ["--max-model-len", str(max_model_len)]
    if gpu_memory_utilization is not None:
        cmd += ["--gpu-memory-utilization", f"{gpu_memory_utilization:g}"]
    if fingerprint:  # its workers answer collective_rpc("ctu_fingerprint") (ctu.engines.checks.fingerprint)
        from ctu.engines.checks.fingerprint import EXTENSION

        cmd += ["--worker-extension-cls", EXTENSION]
    if sleep_mode:
        cmd += ["--enable-sleep-mode"]
    if lora_rank is not None:
        cmd += ["--enable-lora", "--max-lora-rank", str(lora_rank), "--max-loras", str(max_loras)]
    return cmd + list(extra)


def server_env(base: dict[str, str], api_key: str | None) -> dict[str, str]:
    env = {**base, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "VLLM_SERVER_DEV_MODE": "1"}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # ctu's in-process engine sets it; a server runs its own core
    if api_key:
        env["VLLM_API_KEY"] = api_key
    return env


def _die_with_parent() -> None:  # runs in the child before exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def last_line(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""


class LaunchedServer:
    """A server process this run started: :meth:`wait_healthy` after start, :meth:`stop` at the end."""

    def __init__(self, command: Sequence[str], env: dict[str, str], log_path: Path, port: int):
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.url = f"http://127.0.0.1:{port}"
        with open(self.log_path, "ab") as out:
            self.process = subprocess.Popen(list(command), env=env, stdout=out, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True,
                                            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
        atexit.register(self.stop)

    def wait_healthy(self, timeout_s: float, progress: Callable[[str], None] = print, every_s: float = 15.0,
                     poll_s: float = 1.0) -> None:
        """Poll ``GET /health`` until 200; one line per ``every_s`` while waiting. Exiting first, or not being
        healthy within ``timeout_s``, stops it and raises :class:`ServerStartError` naming the log."""
        started = last_said = time.monotonic()
        while True:
            code = self.process.poll()
            if code is not None:
                raise ServerStartError(f"the vLLM server exited with code {code} before it was healthy: see "
                                       f"{self.log_path} (last line: {last_line(self.log_path)})")
            try:
                if httpx.get(self.url + "/health", timeout=5.0).status_code == 200:
                    progress(f"vLLM server healthy at {self.url} after {time.monotonic() - started:.0f}s "
                             f"(log: {self.log_path})")
                    return
            except httpx.HTTPError:
                pass
            now = time.monotonic()
            if now - started > timeout_s:
                self.stop()
                raise ServerStartError(f"the vLLM server was not healthy after {timeout_s:g}s "
                                       f"(engine.launch_timeout_s): see {self.log_path} (last line: "
                                       f"{last_line(self.log_path)})")
            if now - last_said >= every_s:
                last_said = now
                progress(f"waiting for the vLLM server ({now - started:.0f}s; log: {self.log_path})")
            time.sleep(poll_s)

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM to its process group, SIGKILL after ``grace_s``; idempotent."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
            except ProcessLookupError:
                pass
        atexit.unregister(self.stop)
