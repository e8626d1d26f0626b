"""A Ray rollout worker with the vLLM engine (the fake from tests/fakes, run in process: the body of the actor is
plain Python): it builds its own vLLM, sleeps through an update, takes merged weights, passes the parity probe on
them and plays episodes — what ``distributed.rollout_workers`` with ``engine.kind=vllm`` runs on every GPU."""

from dataclasses import replace

import torch

from ctu.app.evaluate import episode_specs
from ctu.config.schema import load_config
from ctu.distributed.pool import ResultsEngine, SpecKey
from ctu.distributed.ray_pool import RolloutWorker
from ctu.engines.checks.parity import PROBE_PROMPT, probe_parity
from ctu.engines.hf.models import load_model
from ctu.rollout import components as build
from ctu.train.logprobs import token_logprobs
from tests.fakes import fake_vllm


def test_a_rollout_worker_runs_vllm_sleeps_takes_merged_weights_and_passes_parity(tmp_path, monkeypatch):
    fake_vllm.install(monkeypatch)
    from ctu.engines.vllm.engine import VLLMEngine

    config = load_config("configs/quickstart.yaml", [
        "model.path=tiny-random", f"run.dir={tmp_path / 'run'}", "sampling.max_tokens=8", "env.max_turns=2",
        "trainer.sft_steps=0", "engine.kind=vllm", "lora.enabled=false",
        "distributed.trainer_workers=1", "distributed.rollout_workers=1"])  # validates: vLLM workers are allowed
    worker = RolloutWorker(config)
    assert isinstance(worker.engine, VLLMEngine)

    model = load_model(config.model.path)  # a new policy version: the base plus seeded noise
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}

    def score(ids, attn, temperature):
        return token_logprobs(model.eval(), ids, attn, temperature)[0]

    def probe() -> float:
        params = replace(build.sampling_params(config), temperature=1.0, top_p=1.0, max_tokens=16, seed=0)
        samples = worker.generate([list(PROBE_PROMPT)], params)
        return probe_parity(ResultsEngine(lambda _p, _s: samples), score, PROBE_PROMPT, tokens=16, seed=0)

    assert probe() > 1e-2  # the base model is not the new version: the probe sees the difference
    worker.sleep()
    assert worker.engine.sleeping
    assert worker.load_weights(weights, 1) == 1 and not worker.engine.sleeping  # loading wakes it first
    assert probe() < 1e-4  # fp32 on CPU: the same weights, scored two ways

    specs = episode_specs(build.build_domains(config), ["test"], samples=1, max_tasks=2)
    out = worker.run([SpecKey.of(s) for s in specs], build.sampling_params(config), 7, 0, False, None, 1)
    assert [(t.task_id, t.stop_reason != "error") for t in out] == [(s.task.id, True) for s in specs]
    assert all(t.response_ids for t in out)
