"""Launching a server for engine.kind=served: the command and environment, and one-line errors naming the log
when the process exits or never becomes healthy (a stand-in process: no vLLM needed)."""

import sys

import pytest

from ctu.engines.vllm.served_launch import LaunchedServer, ServerStartError, free_port, server_command, server_env


def test_command_and_environment_carry_what_weight_syncs_need():
    cmd = server_command("/m", "tiny", 8000, python="/py", dtype="float32", lora_rank=8, max_loras=3)
    assert cmd[:3] == ["/py", "-m", "vllm.entrypoints.openai.api_server"]
    assert " ".join(cmd).endswith("--logprobs-mode processed_logprobs --enable-lora --max-lora-rank 8 --max-loras 3")
    env = server_env({"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PATH": "/bin"}, "sk-key")
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True" and env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env["VLLM_API_KEY"] == "sk-key" and "sk-key" not in " ".join(cmd)
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in env


def test_a_server_that_exits_is_one_line_naming_its_log(tmp_path):
    log = tmp_path / "engine" / "vllm-server.log"
    server = LaunchedServer([sys.executable, "-c", "print('boom: no such model'); raise SystemExit(3)"], {}, log,
                            free_port())
    with pytest.raises(ServerStartError) as caught:
        server.wait_healthy(60, progress=lambda _: None, poll_s=0.1)
    message = str(caught.value)
    assert "exited with code 3" in message and str(log) in message and "boom: no such model" in message
    assert "\n" not in message


def test_a_server_never_healthy_is_stopped_after_the_timeout(tmp_path):
    said = []
    server = LaunchedServer([sys.executable, "-c", "import time; time.sleep(60)"], {}, tmp_path / "s.log", free_port())
    with pytest.raises(ServerStartError, match=r"not healthy after 1.5s \(engine.launch_timeout_s\)"):
        server.wait_healthy(1.5, progress=said.append, every_s=0.5, poll_s=0.2)
    assert server.process.poll() is not None and said and "waiting for the vLLM server" in said[0]


def test_a_launched_server_on_cuda_takes_the_configs_memory_fraction_not_vllms_default(monkeypatch, tmp_path):
    """vLLM's default --gpu-memory-utilization is 0.9: beside a trainer already on the GPU that runs out of memory
    or is refused. The launched server gets engine.gpu_memory_utilization (on CUDA; the CPU build sizes its KV
    cache otherwise)."""
    import torch

    from ctu.config.schema import load_config
    from ctu.engines.vllm import served_setup
    seen = {}

    class Stub:
        def __init__(self, command, env, log_path, port):
            seen["command"] = command

        def wait_healthy(self, timeout_s):
            pass

    monkeypatch.setattr(served_setup, "LaunchedServer", Stub)
    monkeypatch.setattr(served_setup, "resolve_model", lambda path: "/m", raising=False)
    monkeypatch.setattr("ctu.engines.hf.models.resolve_model", lambda path: "/m")
    config = load_config(None, ["engine.kind=served", "engine.launch=true", "engine.gpu_memory_utilization=0.35",
                                f"run.dir={tmp_path}"])
    for cuda, want in ((True, ["--gpu-memory-utilization", "0.35"]), (False, None)):
        monkeypatch.setattr(torch.cuda, "is_available", lambda cuda=cuda: cuda)
        served_setup.launch_server(config, keep=2)
        cmd = seen["command"]
        flag = cmd[cmd.index("--gpu-memory-utilization"):][:2] if "--gpu-memory-utilization" in cmd else None
        assert flag == want


def test_a_launched_colocated_server_on_cuda_can_sleep_and_one_on_cpu_cannot(monkeypatch, tmp_path):
    """vLLM sleeps only where its platform has a sleep mode (vllm/platforms/interface.py is_sleep_mode_available:
    CUDA, ROCm, XPU; not CPU): a server ctu launches on CUDA beside the trainer (engine.colocated) gets
    --enable-sleep-mode; on CPU, or with engine.colocated=false, it does not, and the engine never sleeps."""
    import torch

    from ctu.config.schema import load_config
    from ctu.engines.vllm import served_setup
    seen = {}

    class Stub:
        url = "http://127.0.0.1:1"

        def __init__(self, command, env, log_path, port):
            seen["command"], seen["env"] = command, env

        def wait_healthy(self, timeout_s):
            pass

    monkeypatch.setattr(served_setup, "LaunchedServer", Stub)
    monkeypatch.setattr("ctu.engines.hf.models.resolve_model", lambda path: "/m")
    for cuda, colocated, want in ((True, True, True), (False, True, False), (True, False, False)):
        config = load_config(None, ["engine.kind=served", "engine.launch=true", f"engine.colocated={colocated}",
                                    f"run.dir={tmp_path}"])
        monkeypatch.setattr(torch.cuda, "is_available", lambda cuda=cuda: cuda)
        assert served_setup.server_sleeps(config) == want
        served_setup.launch_server(config, keep=2)
        assert ("--enable-sleep-mode" in seen["command"]) == want and seen["env"]["VLLM_SERVER_DEV_MODE"] == "1"
