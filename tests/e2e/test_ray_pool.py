"""Rollouts on Ray workers give the in-process numbers: same specs -> same trajectories, before and after a
weight update; every worker passes the parity probe; a worker killed mid-step is restarted and its episodes
re-run once on the latest weights (then errored). CPU, tiny-random, one local Ray cluster with 2 CPUs."""

import asyncio
import os
from dataclasses import replace

import pytest
import torch

from ctu.app.evaluate import episode_specs
from ctu.config.schema import load_config
from ctu.distributed.async_pool import AsyncPool
from ctu.distributed.pool import LocalPool, RolloutPool, contiguous_chunks
from ctu.distributed.ray_pool import RayPool  # imports without ray; a RayPool needs it
from ctu.engines.checks.parity import check_parity
from ctu.engines.hf.models import load_model
from ctu.rollout import components as build
from ctu.train.logprobs import token_logprobs

SEED = 4242
REL = 1e-5  # logprobs: the same model on the same CPU, batched differently (fp32)


def make_config(tmp_path):
    return load_config("configs/quickstart.yaml", [
        "model.path=tiny-random", f"run.dir={tmp_path / 'run'}", "sampling.max_tokens=8", "env.max_turns=2",
        "trainer.sft_steps=0"])


@pytest.fixture(scope="module")
def ray():
    return pytest.importorskip("ray", reason="Ray rollout workers need the distributed extra: "
                                             "pip install 'ctu[distributed]'")


@pytest.fixture(scope="module")
def cluster(ray):
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def setup(cluster, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ray_pool")
    config = make_config(tmp)
    fault_file = tmp / "faults"
    fault_file.write_text("0")
    local = LocalPool.from_config(config, build.build_engine(config), build.build_chat(config), build.build_user(config))
    pool = RayPool(config, num_workers=2, fault_files={0: str(fault_file)})
    specs = episode_specs(build.build_domains(config), ["test"], samples=2, max_tasks=3)  # 6 episodes
    params = replace(build.sampling_params(config), seed=SEED)
    yield config, local, pool, specs, params, fault_file
    pool.close()


def assert_same(local, remote):
    assert len(local) == len(remote)
    for a, b in zip(local, remote, strict=True):
        assert (a.domain, a.task_id, a.sample) == (b.domain, b.task_id, b.sample)
        assert a.prompt_ids == b.prompt_ids
        assert a.response_ids == b.response_ids
        assert a.loss_mask == b.loss_mask
        assert (a.reward, a.stop_reason, a.turns, a.error) == (b.reward, b.stop_reason, b.turns, b.error)
        assert a.messages == b.messages
        assert a.logprobs == pytest.approx(b.logprobs, rel=REL, abs=1e-6)


def perturbed_weights(config, scale=0.05):
    """Named HF tensors of a new policy version: the base model plus seeded noise (and that model, to score)."""
    model = load_model(config.model.path)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)
    return model, [(n, p.detach().clone()) for n, p in model.named_parameters()]


def scorer(model):
    def score(ids, attn, temperature):
        return token_logprobs(model.eval(), ids, attn, temperature)[0]
    return score


def test_contiguous_chunks_cover_every_index_once():
    for n in range(0, 9):
        for parts in range(1, 5):
            chunks = contiguous_chunks(n, parts)
            assert [i for a, b in chunks for i in range(a, b)] == list(range(n))
            assert len(chunks) == min(n, parts)
    assert contiguous_chunks(5, 2) == [(0, 3), (3, 5)]


def test_same_trajectories_before_and_after_a_weight_update(setup):
    config, local, pool, specs, params, _ = setup
    assert isinstance(pool, RolloutPool) and pool.num_workers == 2
    before = local.run(specs, params, seed=SEED)
    assert_same(before, pool.run(specs, params, seed=SEED))
    other = local.run(specs, params, seed=SEED + 1)  # the seeds matter: a wrong episode seed would show
    assert any(a.response_ids != b.response_ids for a, b in zip(before, other, strict=True))
    assert sum(len(t.response_ids) for t in before) > 0

    model, weights = perturbed_weights(config)
    local.update_weights(weights, version=1)
    pool.update_weights(weights, version=1)
    after = local.run(specs, params, seed=SEED)
    assert_same(after, pool.run(specs, params, seed=SEED))
    assert any(a.response_ids != b.response_ids for a, b in zip(before, after, strict=True))

    temperature = config.sampling.temperature
    diffs = pool.parity(scorer(model), temperature=temperature, tokens=config.engine.parity_probe_tokens, seed=0)
    assert len(diffs) == 2
    for diff in diffs:
        check_parity(diff, 1e-4)
    assert local.parity(scorer(model), temperature=temperature, seed=0)[0] <= 1e-4
    stale = pool.parity(scorer(load_model(config.model.path)), temperature=temperature, seed=0)
    assert all(d > 1e-2 for d in stale)  # the probe tells the old weights from the new


def test_the_producers_groups_go_whole_to_one_worker_each(setup, ray):
    # each group was one RayPool.run split over every worker, a worker running one call at a time: an engine
    # batched samples_per_task / workers episodes of a group, not the groups in flight
    config, local, pool, specs, params, _ = setup
    groups = [specs[0:2], specs[2:4]]  # two tasks, two samples each
    before = ray.get([w.groups_played.remote() for w in pool.workers])
    player = AsyncPool(pool)

    async def both():
        return await asyncio.gather(*(player.play(g, params, SEED + 10 * i) for i, g in enumerate(groups)))

    played = asyncio.run(both())
    for i, (group, trajectories) in enumerate(zip(groups, played, strict=True)):
        assert_same(local.run(group, params, seed=SEED + 10 * i), trajectories)
    after = ray.get([w.groups_played.remote() for w in pool.workers])
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 1]  # each group whole on one worker


def test_killed_idle_worker_restarts_with_the_latest_weights(setup, ray):
    config, local, pool, specs, params, _ = setup
    assert pool.version == 1  # after the update above
    pid = ray.get(pool.workers[1].pid.remote())
    ray.kill(pool.workers[1], no_restart=False)
    played = pool.run(specs, params, seed=SEED + 5)  # the restarted worker plays its chunk
    assert [(t.task_id, t.sample, t.error) for t in played] == [(s.task.id, s.sample, None) for s in specs]
    assert ray.get(pool.workers[1].pid.remote()) != pid
    # with the latest weights: the parity probe (the sampled tokens themselves may differ from the local engine's
    # where a fresh process rounds a logit's last bit otherwise and one uniform lands on a neighbouring token)
    model, _ = perturbed_weights(config)
    assert all(d <= 1e-4 for d in pool.parity(scorer(model), temperature=config.sampling.temperature, seed=0))
    assert pool.dead == set()


def test_worker_dying_mid_step_reruns_once_then_errors(setup, ray):
    config, local, pool, specs, params, fault_file = setup
    expected = local.run(specs, params, seed=SEED + 9)
    pid = ray.get(pool.workers[0].pid.remote())
    reruns = pool.reruns

    fault_file.write_text("1")  # worker 0 dies after its first finished episode, once
    assert_same(expected, pool.run(specs, params, seed=SEED + 9))  # rerun on the restarted worker, new weights
    assert pool.reruns == reruns + 1
    assert fault_file.read_text() == "0"
    assert ray.get(pool.workers[0].pid.remote()) != pid

    fault_file.write_text("2")  # it dies again on the rerun: its chunk comes back errored
    out = pool.run(specs, params, seed=SEED + 9)
    (a, b), _ = contiguous_chunks(len(specs), 2)
    for t, e in zip(out[a:b], expected[a:b], strict=True):
        assert t.stop_reason == "error" and t.reward == 0.0 and t.response_ids == []
        assert (t.domain, t.task_id, t.sample) == (e.domain, e.task_id, e.sample)
        assert "rollout worker 0 died twice" in t.error
    assert_same(expected[b:], out[b:])
    assert pool.reruns == reruns + 2 and pool.dead == {0}

    # worker 0 gets no more episodes; worker 1 runs them all with the same seeds by global index
    assert_same(expected, pool.run(specs, params, seed=SEED + 9))
    diffs = pool.parity(scorer(load_model(config.model.path)), temperature=config.sampling.temperature, seed=0)
    assert diffs[0] != diffs[0] and diffs[1] > 1e-2  # NaN for the retired worker; worker 1 has the new weights
