"""FSDP2 over 2 gloo ranks on CPU: one ``policy_update`` with each rank holding part of the episodes equals the
single-process update on all of them (loss, grad norm, updated weights); bf16 mixed precision trains fp32
masters; DCP checkpoints commit atomically and load at another world size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from tests.support.fsdp_helpers import free_port, spawned_rank
from tests.support.models import save_random_model

WORLD = 2
N_EPISODES = 8
SPLIT = [3, 5]  # unequal slices: the ranks run different numbers of micro-batches
STAT_KEYS = ("loss", "pg_loss", "kl", "entropy", "clip_fraction", "grad_norm", "trained_tokens",
             "sampler_trainer_logprob_diff")
CASES = {  # name: (overrides, lr)
    "lora-token_mean": (["lora.enabled=true", "trainer.loss_aggregation=token_mean"], 0.05),
    "lora-seq_mean_token_mean": (["lora.enabled=true", "trainer.loss_aggregation=seq_mean_token_mean",
                                  "trainer.gradient_checkpointing=true"], 0.05),
    "full-token_mean": (["lora.enabled=false", "trainer.loss_aggregation=token_mean",
                         "trainer.gradient_checkpointing=true"], 0.05),
    "full-seq_mean_token_mean": (["lora.enabled=false", "trainer.loss_aggregation=seq_mean_token_mean"], 0.05),
    # episodes sharing a system prompt, several per micro-batch: the shared-prefix forward must not run a layer
    # twice before its backward under FSDP2 (it freed the resharded weights the prefix pass had saved)
    "lora-shared-prefix": (["lora.enabled=true", "trainer.micro_batch_tokens=400"], 0.05),
}
COMMON = ["trainer.grad_clip=1000000.0", "trainer.kl_coef=0.3", "trainer.entropy_coef=0.01",
          "trainer.micro_batch_tokens=40", "model.dtype=float32"]


def episodes(n: int = N_EPISODES, seed: int = 0, shared: bool = False):
    from tests.unit.train.test_update_semantics import samples

    out = samples(seed, n)
    if shared:  # a common 24-token system prompt in front of every episode
        prefix = [1] + [7 + (3 * k) % 150 for k in range(23)]
        for s in out:
            s.ids = prefix + s.ids[1:]
            s.mask = [0] * (len(prefix) - 1) + s.mask
            s.sampler_logprobs = [0.0] * (len(prefix) - 1) + s.sampler_logprobs
    return out


def make_policy(model_path: str, overrides: list[str]):
    from ctu.config.schema import load_config
    from ctu.train.policy import build_policy

    cfg = load_config(None, [f"model.path={model_path}", *COMMON, *overrides])
    torch.manual_seed(0)
    policy = build_policy(cfg, device="cpu")
    with torch.no_grad():  # off the reference, so that KL and ratios are not trivially 0 / 1
        g = torch.Generator().manual_seed(1)
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
        if not cfg.lora.enabled:
            for p in policy.model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.01)
    return cfg, policy


def trainable_full(policy) -> dict[str, torch.Tensor]:
    """The trainable weights as full tensors (a collective for a sharded policy)."""
    from ctu.distributed.fsdp import _reshard

    _reshard(policy.model)  # registered parameters are the sharded masters, not a stale unsharded copy
    out = {}
    for name, p in policy.model.named_parameters():
        if p.requires_grad:
            t = p.detach()
            out[name] = (t.full_tensor() if hasattr(t, "full_tensor") else t).clone()
    return out


def update(policy, cfg, samples, lr, reduce=None):
    from ctu.train.update import policy_update

    opt = torch.optim.SGD(policy.trainable_parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    return policy_update(policy, opt, sched, samples, cfg.trainer, temperature=0.9, seed=0, reduce=reduce)


def _init(rank: int, world: int, init: str):
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)


def _run(rank: int, world: int, init: str, out: str, job: str, args: dict):
    with spawned_rank(rank, out):
        _init(rank, world, init)
        result = JOBS[job](rank, world, **args)
        if rank == 0:
            torch.save(result, Path(out) / "result.pt")


def spawn(job: str, tmp: Path, world: int = WORLD, **args):
    out = tmp / f"out-{job}"
    out.mkdir()
    init = f"tcp://127.0.0.1:{free_port()}"
    try:
        mp.start_processes(_run, args=(world, init, str(out), job, args), nprocs=world, start_method="spawn")
    except Exception as e:
        errors = "\n".join(p.read_text() for p in sorted(out.glob("error-*.txt")))
        raise AssertionError(f"distributed job {job} failed:\n{errors}") from e
    return torch.load(out / "result.pt", weights_only=False)


# Jobs (run on every rank; rank 0's return value comes back) -------------------------------------------------


def job_equivalence(rank, world, model_path, cases):
    from ctu.distributed.fsdp import make_reduce, shard_policy

    results = {}
    start = sum(SPLIT[:rank])
    for name in cases:
        batch = episodes(shared=name.endswith("shared-prefix"))
        mine = batch[start:start + SPLIT[rank]]
        overrides, lr = CASES[name]
        cfg, policy = make_policy(model_path, overrides)
        shard_policy(policy)
        stats = update(policy, cfg, mine, lr, reduce=make_reduce())
        results[name] = {"stats": stats, "weights": trainable_full(policy)}
    return results


def job_bf16(rank, world, model_path):
    from ctu.distributed.fsdp import gathered_named_tensors, make_reduce, shard_policy

    cfg, policy = make_policy(model_path, ["lora.enabled=true", "model.dtype=bfloat16", "trainer.kl_coef=0.0"])
    shard_policy(policy, compute_dtype=torch.bfloat16)
    before = trainable_full(policy)
    batch = episodes()
    mine = batch[sum(SPLIT[:rank]):sum(SPLIT[:rank + 1])]
    stats = update(policy, cfg, mine, 3e-7, reduce=make_reduce())
    after = trainable_full(policy)
    dtypes = {str(p.dtype) for p in policy.model.parameters() if p.requires_grad}
    merged = dict(gathered_named_tensors(policy))
    return {"stats": stats, "before": before, "after": after, "dtypes": dtypes,
            "merged": {n: merged[n] for n in list(merged)[:4]}, "merged_names": sorted(merged)}


def job_checkpoint(rank, world, model_path, root):
    from ctu.distributed.dcp import load_sharded, save_sharded
    from ctu.distributed.fsdp import make_reduce, shard_policy

    cfg, policy = make_policy(model_path, ["lora.enabled=true"])
    shard_policy(policy)
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    from ctu.train.update import policy_update

    batch = episodes()
    mine = batch[sum(SPLIT[:rank]):sum(SPLIT[:rank + 1])]
    policy_update(policy, opt, sched, mine, cfg.trainer, temperature=0.9, reduce=make_reduce())
    path = save_sharded(root, 1, policy=policy, optimizer=opt, scheduler=sched, extra={"cursor": 7})
    weights = trainable_full(policy)
    # the same ranks reload into a fresh sharded policy
    cfg, fresh = make_policy(model_path, ["lora.enabled=true"])
    shard_policy(fresh)
    opt2 = torch.optim.AdamW(fresh.trainable_parameters(), lr=1e-3)
    sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, lambda _: 1.0)
    step, extra = load_sharded(path, policy=fresh, optimizer=opt2, scheduler=sched2)
    return {"path": str(path), "weights": weights, "reloaded": trainable_full(fresh), "step": step, "extra": extra}


def job_all(rank, world, model_path, cases, root):
    """Every distributed check in one spawn (process start-up and imports dominate the runtime)."""
    return {"equivalence": job_equivalence(rank, world, model_path, cases), "bf16": job_bf16(rank, world, model_path),
            "checkpoint": job_checkpoint(rank, world, model_path, root)}


JOBS = {"equivalence": job_equivalence, "bf16": job_bf16, "checkpoint": job_checkpoint, "all": job_all}


# Tests ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_random_model(tmp_path_factory.mktemp("tiny-llama"), arch="llama", layers=2, hidden=64)


@pytest.fixture(scope="module")
def distributed(model_path, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fsdp")
    got = spawn("all", tmp, model_path=model_path, cases=list(CASES), root=str(tmp / "checkpoints"))
    return {**got["equivalence"], "bf16": got["bf16"], "checkpoint": got["checkpoint"], "root": tmp / "checkpoints"}


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-12)


@pytest.mark.parametrize("case", list(CASES))
def test_two_rank_update_equals_the_single_process_update(case, distributed, model_path):
    overrides, lr = CASES[case]
    cfg, policy = make_policy(model_path, overrides)
    before = trainable_full(policy)
    single = update(policy, cfg, episodes(shared=case.endswith("shared-prefix")), lr)
    got = distributed[case]
    for key in STAT_KEYS:
        assert rel(got["stats"][key], single[key]) <= 1e-4, (key, got["stats"][key], single[key])
    assert single["kl"] > 0 and single["grad_norm"] > 0
    after = trainable_full(policy)
    assert set(after) == set(got["weights"])
    scale = max(float((after[n] - before[n]).abs().max()) for n in after)
    assert scale > 0
    for name in after:  # the update itself (after - before) agrees, relative to the largest step
        diff = float((got["weights"][name] - after[name]).abs().max())
        assert diff <= 1e-4 * scale, (name, diff, scale)


def test_the_reduce_hook_makes_the_denominators_global(model_path):
    """A fake second rank with the same episodes (sums doubled): each rank's loss weights are divided by the
    global token count, so its gradient and step halve while the summed stats stay the same. Without the hook
    each rank would normalise by its own tokens and the 2-rank update would be twice the single-process one."""
    deltas = []
    for reduce in (None, lambda v, op: [x * 2 for x in v] if op == "sum" else v):
        cfg, policy = make_policy(model_path, CASES["lora-token_mean"][0])
        before = trainable_full(policy)
        stats = update(policy, cfg, episodes()[:SPLIT[0]], 0.05, reduce=reduce)
        deltas.append(({n: t - before[n] for n, t in trainable_full(policy).items()}, stats))
    (alone, s_alone), (fake, s_fake) = deltas
    assert rel(s_alone["trained_tokens"] * 2, s_fake["trained_tokens"]) < 1e-9
    assert rel(s_alone["loss"], s_fake["loss"]) < 1e-5
    assert rel(s_alone["grad_norm"], 2 * s_fake["grad_norm"]) < 1e-4
    scale = max(float(d.abs().max()) for d in alone.values())
    for name in alone:
        assert float((alone[name] - 2 * fake[name]).abs().max()) <= 1e-4 * scale, name


def test_bf16_mixed_precision_trains_fp32_masters(model_path, distributed):
    got = distributed["bf16"]
    assert got["dtypes"] == {"torch.float32"}
    assert got["stats"]["updates"] == 1 and got["stats"]["grad_norm"] > 0
    moved = [n for n in got["after"] if not torch.equal(got["after"][n], got["before"][n])]
    assert moved and all("lora_" in n for n in got["after"])
    assert all(not n.startswith("base_model") and "lora_" not in n for n in got["merged_names"])
    assert "model.layers.0.self_attn.q_proj.weight" in got["merged_names"]
    # the single-process bf16 update on all episodes: the same loss within bf16 tolerance
    cfg, policy = make_policy(model_path, ["lora.enabled=true", "model.dtype=bfloat16", "trainer.kl_coef=0.0"])
    single = update(policy, cfg, episodes(), 3e-7)
    assert rel(got["stats"]["loss"], single["loss"]) < 3e-2, (got["stats"]["loss"], single["loss"])
    assert rel(got["stats"]["grad_norm"], single["grad_norm"]) < 3e-2


def test_dcp_checkpoint_commits_atomically_and_loads_at_another_world_size(model_path, distributed):
    from ctu.distributed.dcp import latest_sharded, load_sharded

    root, got = distributed["root"], distributed["checkpoint"]
    path = Path(got["path"])
    assert path == root / "step_1" and json.loads((path / "checkpoint.json").read_text())["step"] == 1
    assert got["step"] == 1 and got["extra"] == {"cursor": 7}
    from ctu.train.checkpoint import checkpoint_problem

    files = json.loads((path / "manifest.json").read_text())["files"]  # written last by rank 0: both ranks' shards
    assert {"state.pt", "checkpoint.json", ".metadata"} <= set(files) and sum(".distcp" in f for f in files) == 2
    assert checkpoint_problem(path) is None
    assert torch.serialization.get_unsafe_globals_in_checkpoint(path / "state.pt") == []
    for name, t in got["weights"].items():
        torch.testing.assert_close(got["reloaded"][name], t, rtol=0, atol=0)
    # a run killed while writing step 2 left a partial temporary directory: resume takes step 1
    partial = root / ".tmp-step_2"
    partial.mkdir()
    (partial / "__0_0.distcp").write_bytes(b"partial")
    assert latest_sharded(root) == path
    # world size 1, no process group, an unsharded policy: the same weights and optimizer state
    cfg, policy = make_policy(model_path, ["lora.enabled=true"])
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    step, extra = load_sharded(path, policy=policy, optimizer=opt, scheduler=sched)
    assert step == 1 and extra == {"cursor": 7}
    loaded = trainable_full(policy)
    assert any(not torch.equal(loaded[n], make_policy(model_path, ["lora.enabled=true"])[1].model.get_parameter(n))
               for n in loaded)
    for name, t in got["weights"].items():
        torch.testing.assert_close(loaded[name], t, rtol=0, atol=0)
    states = [s for s in opt.state.values() if "exp_avg" in s]
    assert len(states) == len(loaded) and all(float(s["exp_avg"].abs().sum()) > 0 for s in states)


def test_a_sharded_checkpoints_state_is_read_as_data_only(model_path, tmp_path):
    """A pickle planted in ``state.pt`` (with a manifest to match) is refused by name, never run."""
    import os

    from ctu.distributed.dcp import load_sharded, save_sharded
    from ctu.train.manifest import DamagedError, write_manifest

    class Touch:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'ran'}",))

    cfg, policy = make_policy(model_path, ["lora.enabled=true"])
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    path = save_sharded(tmp_path / "ck", 1, policy=policy, optimizer=opt, scheduler=sched, extra={"cursor": 7})
    assert load_sharded(path, policy=policy, optimizer=opt, scheduler=sched) == (1, {"cursor": 7})
    torch.save({"scheduler": Touch()}, path / "state.pt")
    write_manifest(path)
    with pytest.raises(DamagedError, match="state.pt: refused"):
        load_sharded(path, policy=policy, optimizer=opt, scheduler=sched)
    assert not (tmp_path / "ran").exists()


def test_a_checkpoint_of_two_fsdp_ranks_resumes_in_one_process(model_path, distributed):
    """``distributed.trainer_workers=0`` resuming a run that Ray trainer ranks checkpointed (DCP shards)."""
    from ctu.config.schema import load_config
    from ctu.distributed.group import LocalTrainer
    from ctu.train.checkpoint import checkpoint_format

    got = distributed["checkpoint"]
    path = Path(got["path"])
    assert checkpoint_format(path) == "dcp" and json.loads((path / "checkpoint.json").read_text())["world_size"] == 2
    local = LocalTrainer(load_config(None, [f"model.path={model_path}", *COMMON, "lora.enabled=true"]), device="cpu")
    step, extra, rebased = local.load(path)
    assert (step, extra, rebased) == (1, {"cursor": 7}, False)
    loaded = trainable_full(local.policy)
    assert sorted(loaded) == sorted(got["weights"])
    for name, t in got["weights"].items():
        torch.testing.assert_close(loaded[name], t, rtol=0, atol=0)
    states = [s for s in local.optimizer.state.values() if "exp_avg" in s]
    assert len(states) == len(loaded) and all(float(s["exp_avg"].abs().sum()) > 0 for s in states)


def test_ray_ranks_refuse_a_one_process_checkpoint_with_one_line(tmp_path):
    from ctu.distributed.ray_trainer import TrainerRank

    (tmp_path / "checkpoint.json").write_text(json.dumps({"step": 3}))  # save_checkpoint's marker: no format
    with pytest.raises(ValueError, match=r"written in one process .* distributed.trainer_workers=0") as err:
        TrainerRank(None, 0, 1).load(str(tmp_path))
    assert "\n" not in str(err.value)
