"""engine.kind=served against a real vLLM OpenAI server on CPU (`nox -s vllm_cpu`): 3 LoRA adapter versions
hot-loaded into the running server with the parity probe and the version stamp after each, an adapter load midway
through a long completion (trainer.inflight=continue: /pause, /resume, the rest sampled by the new adapter), and
2 steps of `ctu train` with a server that ctu launches, health-checks and stops itself."""

import os
import time

import httpx
import pytest
import torch

from ctu.app.trainer import Trainer
from ctu.engines.base import SamplingParams
from ctu.engines.checks.parity import check_parity, check_versions, probe_parity
from ctu.engines.vllm.served import ServedEngine
from ctu.engines.vllm.served_launch import LaunchedServer, free_port, server_command, server_env
from ctu.observe.tracking import read_metrics
from ctu.train.logprobs import token_logprobs
from ctu.train.sync import adapter_named_tensors
from tests.e2e.test_train import config, judge  # noqa: F401 - judge: the autouse shaping-judge fixture (respx)

pytestmark = pytest.mark.vllm_cpu


@pytest.fixture(autouse=True)
def local_server_passes(judge):  # noqa: F811 - respx mocks every httpx call; the server is real HTTP
    judge.route(host="127.0.0.1").pass_through()


def launch(model: str, name: str, tmp_path_factory) -> LaunchedServer:
    port = free_port()
    log = tmp_path_factory.mktemp("served") / "vllm-server.log"
    command = server_command(model, name, port, dtype="float32", max_model_len=2048, lora_rank=8, max_loras=2)
    started = time.monotonic()
    launched = LaunchedServer(command, server_env(dict(os.environ), None), log, port)
    launched.wait_healthy(900)
    print(f"server start {time.monotonic() - started:.0f}s")
    return launched


@pytest.fixture(scope="module")
def server(tiny_llama, tmp_path_factory):
    launched = launch(tiny_llama, "tiny-llama", tmp_path_factory)
    yield launched
    launched.stop()


@pytest.fixture
def small_server(small_llama, tmp_path_factory):
    launched = launch(small_llama, "small-llama", tmp_path_factory)
    yield launched
    launched.stop()


def test_three_adapter_versions_hot_loaded_into_a_real_server(server, tiny_llama, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    policy = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32),
                            LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)).eval()
    engine = ServedEngine(server.url + "/v1", "tiny-llama", weights_dir=str(tmp_path / "w"), keep=2, lora_alpha=16)
    engine.connect("adapter", lora=True)
    assert engine.logprobs_mode == "processed_logprobs"
    diffs = []
    for version in (1, 2, 3):
        g = torch.Generator().manual_seed(version)
        with torch.no_grad():
            for name, p in policy.named_parameters():
                if ".lora_" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        started = time.monotonic()
        engine.update_adapter(adapter_named_tensors(policy), version)
        load_s = time.monotonic() - started
        diff = probe_parity(engine, lambda ids, attn, t: token_logprobs(policy, ids, attn, t)[0], temperature=0.7,
                            tokens=16, seed=version)
        diffs.append(diff)
        print(f"v{version}: load {load_s:.2f}s, parity {diff:.2e}")
        check_parity(diff, 1e-2)
        check_versions([engine.weights_version], version)
        assert engine.listed_versions() == [v for v in (version - 1, version) if v >= 1]  # the newest keep=2 stay
    engine.close()
    assert max(diffs) < 1e-3, diffs


def test_an_adapter_load_midway_through_a_long_completion_continues_it_on_a_real_server(small_server, small_llama,
                                                                                      tmp_path):
    """trainer.inflight=continue: the load pauses the server (POST /pause?mode=abort), whose running request answers
    with its tokens so far and finish_reason "abort"; after /resume ctu sends prompt + those tokens to the new adapter
    with what is left of max_tokens. Each token's version and logprob are those of the weights that sampled it.
    The small Llama's server: with the tiny one the API process answers /pause only once the request is done."""
    import contextlib
    import threading

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    policy = get_peft_model(AutoModelForCausalLM.from_pretrained(small_llama, dtype=torch.float32),
                            LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)).eval()
    engine = ServedEngine(small_server.url + "/v1", "small-llama", weights_dir=str(tmp_path / "w"), keep=2,
                          lora_alpha=16, inflight="continue")
    engine.connect("adapter", lora=True)
    prompt = [1, 520, 33, 88, 2, 198, 1, 520]
    params = SamplingParams(temperature=1.0, max_tokens=400, seed=3)

    def timed() -> float:  # seconds one request of ``params`` takes now
        started = time.monotonic()
        out["c"] = engine.generate_sync([prompt], params)[0][0]
        return time.monotonic() - started

    out: dict = {}
    durations: list[float] = []
    took = min(timed(), timed())  # the server's first requests are slower
    print(f"{len(out['c'].token_ids)} tokens in {took:.2f}s without a load")
    for version, fraction in enumerate((1 / 3, 1 / 6, 1 / 2), start=1):  # fractions: no CPU's speed assumed
        thread = threading.Thread(target=lambda: durations.append(timed()))
        thread.start()
        time.sleep(took * fraction)
        g = torch.Generator().manual_seed(10 + version)
        with torch.no_grad():
            for name, p in policy.named_parameters():
                if ".lora_" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        engine.update_adapter(adapter_named_tensors(policy), version)
        thread.join(300)
        if engine.interrupted_rows:
            break
        took = min(took, durations[-1])
    else:
        raise AssertionError(f"no load stopped a request mid-way (a request takes {took:.2f}s without a load)")
    previous = version - 1
    c = out["c"]
    versions = c.versions()
    assert engine.interrupted_rows == 1 and version in versions and versions[0] == previous, versions[:4]
    switch = versions.index(version)
    assert versions == [previous] * switch + [version] * (len(versions) - switch) and c.version == previous
    ids = torch.tensor([prompt + list(c.token_ids)])
    attn = torch.ones_like(ids)
    with torch.no_grad():
        after = token_logprobs(policy, ids, attn, 1.0)[0][0, len(prompt) - 1:]
        if previous:  # the adapter that sampled the first tokens
            g = torch.Generator().manual_seed(10 + previous)
            for name, p in policy.named_parameters():
                if ".lora_" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        with policy.disable_adapter() if not previous else contextlib.nullcontext():
            before = token_logprobs(policy, ids, attn, 1.0)[0][0, len(prompt) - 1:]
    got = torch.tensor(c.logprobs)
    print(f"{len(versions)} tokens, the load of version {version} at token {switch}; "
          f"max |diff| old {(got[:switch] - before[:switch]).abs().max():.2e}, "
          f"new {(got[switch:] - after[switch:]).abs().max():.2e}")
    torch.testing.assert_close(got[:switch], before[:switch], rtol=0, atol=1e-3)
    torch.testing.assert_close(got[switch:], after[switch:], rtol=0, atol=1e-3)
    engine.close()


def test_merged_weights_reload_into_a_real_server_through_the_dev_routes(server, tiny_llama, tmp_path):
    """After the adapter test on the same server: the base reloaded from safetensors on disk, stamped, probed."""
    from transformers import AutoModelForCausalLM

    from ctu.train.weights import hf_name

    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    engine = ServedEngine(server.url + "/v1", "tiny-llama", weights_dir=str(tmp_path / "w"), keep=2)
    engine.connect("merged", lora=False)
    for version in (1, 2):
        with torch.no_grad():
            model.model.layers[0].mlp.down_proj.weight.mul_(1.5)
        started = time.monotonic()
        engine.update_weights(((hf_name(n) or n, p.detach()) for n, p in model.named_parameters()), version)
        load_s = time.monotonic() - started
        diff = probe_parity(engine, lambda ids, attn, t: token_logprobs(model, ids, attn, t)[0], temperature=0.7,
                            tokens=16, seed=version)
        print(f"merged v{version}: reload {load_s:.2f}s, parity {diff:.2e}")
        check_parity(diff, 1e-2)
        check_versions([engine.weights_version], version)
    engine.close()



def test_two_steps_of_ctu_train_with_a_launched_server(tmp_path, tiny_llama, monkeypatch):
    run_dir = tmp_path / "run"
    key = "sk-served-cpu-secret"
    monkeypatch.setenv("CTU_SERVED_KEY", key)  # the launched server requires it on /v1 (VLLM_API_KEY)
    trainer = Trainer(config(run_dir, f"model.path={tiny_llama}", "engine.kind=served", "engine.launch=true",
                             "model.dtype=float32", "trainer.max_steps=2", "trainer.eval_before_train=false",
                             "trainer.export=false", "trainer.lr=0.05", "trainer.sft_steps=1", "trainer.sft_lr=0.05",
                             "trainer.sft_batch_size=2", "lora.rank=8", "engine.api_key_env=CTU_SERVED_KEY"))
    server = trainer.engine.server
    assert httpx.get(server.url + "/v1/models").status_code == 401  # the key is really required
    trainer.run()
    rows = read_metrics(run_dir)
    assert [r["sync/version"] for r in rows] == [1.0, 2.0]
    assert all(r["sync/logprob_max_abs_diff"] <= 1e-2 for r in rows), rows
    assert server.process.poll() is not None  # stopped with the run
    assert (run_dir / "engine" / "vllm-server.log").stat().st_size > 0
    written = [p for p in run_dir.rglob("*") if p.is_file() and key.encode() in p.read_bytes()]
    assert not written, written
