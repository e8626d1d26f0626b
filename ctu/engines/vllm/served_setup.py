"""Build the served engine from a config: attach to ``engine.base_url``, or launch a vLLM server (docs/served.md)."""

from __future__ import annotations

import os
from pathlib import Path

from ctu.config.derived import engines_sleep, served_max_loras, weight_sync_mode
from ctu.engines.vllm.served import ServedEngine
from ctu.engines.vllm.served_launch import LaunchedServer, free_port, server_command, server_env


def server_sleeps(config) -> bool:
    """Whether the server ctu launches sleeps through updates: beside the trainer (``engine.colocated``) on CUDA.
    vLLM's CPU platform has no sleep mode (``is_sleep_mode_available``: CUDA, ROCm, XPU), so there it stays awake."""
    import torch

    return engines_sleep(config) and torch.cuda.is_available()


def launch_server(config, keep: int) -> LaunchedServer:
    """Start the server for this run (its log in ``{run.dir}/engine/vllm-server.log``) and wait until healthy."""
    import torch

    from ctu.engines.hf.models import resolve_model
    from ctu.engines.vllm.engine import choose_logprobs_mode, vllm_dtype

    e, port = config.engine, free_port()
    adapter = weight_sync_mode(config) == "adapter"
    command = server_command(resolve_model(config.model.path), config.model.path, port, python=e.launch_python,
                             dtype=vllm_dtype(config.model.dtype, torch.cuda.is_available()), seed=config.run.seed,
                             max_model_len=config.env.max_context_tokens,
                             logprobs_mode=choose_logprobs_mode(config.sampling.temperature, config.sampling.top_p),
                             lora_rank=config.lora.rank if adapter else None, max_loras=keep, extra=e.launch_args,
                             gpu_memory_utilization=e.gpu_memory_utilization if torch.cuda.is_available() else None,
                             fingerprint=e.launch_python is None, sleep_mode=server_sleeps(config))  # its workers import ctu: the same python
    server = LaunchedServer(command, server_env(dict(os.environ), os.environ.get(e.api_key_env)),
                            Path(config.run.dir) / "engine" / "vllm-server.log", port)
    try:
        server.wait_healthy(e.launch_timeout_s)
    except BaseException:
        server.stop()
        raise
    return server


def served_engine(config) -> ServedEngine:
    """A :class:`ServedEngine` checked against its server (:meth:`ServedEngine.connect`)."""
    e = config.engine
    keep = served_max_loras(config)
    server = launch_server(config, keep) if e.launch else None
    url = server.url + "/v1" if server is not None else e.base_url
    engine = ServedEngine(url, config.model.path, weights_dir=e.weights_dir or str(Path(config.run.dir) / "engine"),
                          keep=keep, lora_alpha=config.lora.alpha, server=server, api_key_env=e.api_key_env,
                          timeout=e.timeout, max_retries=e.max_retries, inflight=config.trainer.inflight,
                          sleep_mode=server is not None and server_sleeps(config))
    try:
        engine.connect(weight_sync_mode(config), lora=config.lora.enabled)
    except BaseException:
        engine.close()
        raise
    return engine
