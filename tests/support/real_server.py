"""A real third-party OpenAI-compatible server for tests: ``transformers serve`` on 127.0.0.1, as a subprocess.

The model is ctu's ``tiny-random`` (a few MB, built offline) with a generation config that makes its text
useful for protocol tests: greedy (deterministic at any temperature) and ``no_repeat_ngram_size=1`` (no token
of the prompt or of the reply twice), so every reply is non-empty, different for different prompts, and runs
to ``max_tokens`` (the prompt's end-of-turn token is banned). It needs ``transformers[serving]``'s FastAPI and
uvicorn (ctu's ``dev`` extra installs them).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def serving_available() -> bool:
    from transformers.utils.import_utils import is_serve_available

    return is_serve_available()


def protocol_model(out: Path) -> str:
    """tiny-random's weights and tokenizer (linked) with the greedy, never-repeating generation config."""
    from ctu.engines.hf.models import resolve_model

    source = Path(resolve_model("tiny-random"))
    out.mkdir(parents=True, exist_ok=True)
    for name in MODEL_FILES:
        if (source / name).exists() and not (out / name).exists():
            (out / name).symlink_to(source / name)
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "do_sample": False, "no_repeat_ngram_size": 1}))
    return str(out)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TransformersServer:
    """``start()`` blocks until ``/health`` answers; ``kill()`` is SIGKILL (no graceful shutdown)."""

    def __init__(self, model: str, log_dir: Path, port: int | None = None):
        self.model = model
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.log_dir = log_dir
        self.lives: list[Path] = []  # one log per start
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 180.0) -> float:
        """Start and wait until healthy; returns the seconds it took."""
        log = self.log_dir / f"server-{len(self.lives)}.log"
        self.lives.append(log)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1", "OMP_NUM_THREADS": "1",
               "TRANSFORMERS_VERBOSITY": "error"}
        started = time.perf_counter()
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "transformers.cli.transformers", "serve", self.model, "--host", "127.0.0.1",
                 "--port", str(self.port), "--device", "cpu", "--log-level", "error"],
                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        while time.perf_counter() - started < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"transformers serve exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as response:
                    if response.status == 200:
                        return time.perf_counter() - started
            except OSError:
                time.sleep(0.2)
        self.kill()
        raise RuntimeError(f"transformers serve not healthy after {timeout:.0f} s:\n{self.log_tail()}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def requests(self, life: int = -1) -> int:
        """Chat completions this life of the server has answered (uvicorn's access log)."""
        return self.lives[life].read_text(errors="replace").count("POST /v1/chat/completions")

    def log_tail(self, chars: int = 3000) -> str:
        return self.lives[-1].read_text(errors="replace")[-chars:] if self.lives else ""
