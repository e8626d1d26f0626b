"""Trainer ranks as Ray actors: an FSDP2 data-parallel group behind the :class:`TrainerGroup` interface.

``distributed.trainer_workers=N`` starts N :class:`TrainerRank` actors in one Ray placement group. They form a
torch.distributed group (gloo on CPU, NCCL on CUDA, plus gloo for offloaded CPU tensors under
``distributed.cpu_offload``; they rendezvous at a free port of rank 0, listening on 127.0.0.1 alone, or on the
node's address alone where ``distributed.address`` joins a cluster), each builds the policy
from the config with the same seed and shards it with FSDP2 (:func:`shard_policy`: per decoder layer and root,
``MixedPrecisionPolicy`` with fp32 masters and fp32 gradient reduction). Every call goes to every rank at once
(the collectives need all of them); the driver cuts the episodes into contiguous slices, one per rank, and takes
rank 0's answer. ``policy_update``/``sequence_kl``/``sft_update`` with FSDP's ``reduce`` hook make one N-rank
update equal the single-process one (see :mod:`ctu.train.update`).

Placement (``distributed.placement``): ``colocated`` puts rollout worker k in trainer rank k % N's bundle
(sharing its GPU: a colocated vLLM sleeps during updates), ``split`` gives rollout workers bundles of their own.
Checkpoints are DCP (:mod:`ctu.distributed.dcp`), written by every rank into ``run.dir`` (shared storage on a
multi-node cluster). A rank that dies stops the run with :class:`TrainerRankError`; ``trainer.resume=latest``
continues from the last complete checkpoint. Set-ups that cannot fit fail before any actor starts, and every
start-up wait is bounded (``distributed.placement_timeout_s``, ``distributed.start_timeout_s``): see
:mod:`ctu.distributed.ray_setup`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from ctu.distributed.group import TrainerGroup, TrainerRankError, build_optimizer, contiguous_slices
from ctu.distributed.ray_setup import (
    RaySetupError,
    check_room,
    group_demand,
    import_ray,
    local_room,
    placement_bundles,
    rendezvous_endpoint,
    rendezvous_store,
    start_ray,
    wait_started,
)
from ctu.train.update import check_loss

REFERENCE = "reference.pt"


def process_group_backend(cuda: bool, cpu_offload: bool) -> str:
    """The trainer ranks' backend: gloo on CPU, NCCL on CUDA, and with ``cpu_offload`` gloo beside it for CPU
    tensors (``clip_grad_norm_`` all-reduces the norms of offloaded gradients where they are, pytorch#148532)."""
    if not cuda:
        return "gloo"
    return "cuda:nccl,cpu:gloo" if cpu_offload else "nccl"


class TrainerRank:
    """One FSDP2 rank (the body of a Ray actor). ``fault_file``: for fault tests, a file holding ``k``: the
    rank's k-th update kills its process (``os._exit``) mid-update, once."""

    def __init__(self, config, rank: int, world: int, fault_file: str | None = None):
        self.config, self.rank, self.world, self.fault_file = config, rank, world, fault_file
        self.updates = 0

    def endpoint(self) -> str:
        """``tcp://host:port`` for the rendezvous (called on rank 0): loopback on a local cluster, the node's
        address where ``distributed.address`` joins one of several machines."""
        return rendezvous_endpoint(self.config.distributed.address)

    def setup(self, init_method: str) -> int:
        import random

        import torch.distributed as dist

        from ctu.distributed.fsdp import make_reduce, shard_policy
        from ctu.engines.hf.models import load_tokenizer
        from ctu.train.policy import build_policy

        cuda = torch.cuda.is_available()
        dist.init_process_group(backend=process_group_backend(cuda, self.config.distributed.cpu_offload),
                                store=rendezvous_store(init_method, self.rank, self.world), rank=self.rank,
                                world_size=self.world)
        device = "cuda" if cuda else "cpu"
        torch.manual_seed(self.config.run.seed)  # every rank builds the same initial weights as the driver would
        random.seed(self.config.run.seed)
        self.policy = shard_policy(build_policy(self.config, device=device),
                                   cpu_offload=self.config.distributed.cpu_offload)
        self.tokenizer = load_tokenizer(self.config.model.path)
        self.optimizer, self.scheduler = build_optimizer(self.policy, self.config.trainer)
        self.reduce = make_reduce(device=device)
        self.rebased: dict[str, torch.Tensor] = {}
        self.release_memory()  # the full-precision load's cache, before a colocated engine starts
        return os.getpid()

    def precision_note(self) -> str:
        return self.policy.precision_note

    def release_memory(self) -> None:
        from ctu.engines.cpu.host_memory import release_memory

        release_memory()

    def pid(self) -> int:
        return os.getpid()

    # -- the TrainerGroup calls, run on every rank --------------------------------------------------
    def update(self, samples, temperature: float, seed: int) -> dict[str, float]:
        from ctu.train.update import policy_update

        self.updates += 1
        self._maybe_die()
        lr = self.scheduler.get_last_lr()[0]  # this update's rate (the scheduler steps inside it)
        stats = policy_update(self.policy, self.optimizer, self.scheduler, samples, self.config.trainer, temperature,
                              seed=seed, reduce=self.reduce)
        return {**stats, "lr": lr}

    def kl(self, samples, temperature: float) -> list[float]:
        from ctu.train.update import sequence_kl

        return sequence_kl(self.policy, samples, self.config.trainer, temperature, reduce=self.reduce)

    def sft_step(self, samples, lr: float, first: bool) -> float:
        from ctu.engines.cpu.host_memory import release_memory
        from ctu.train.update import sft_update

        if first:
            self.sft_optimizer: torch.optim.AdamW | None = torch.optim.AdamW(self.policy.trainable_parameters(), lr=lr, weight_decay=0.0)
        loss = sft_update(self.policy, self.sft_optimizer, samples, self.config.trainer.micro_batch_tokens,
                          reduce=self.reduce, share_prefix=self.config.trainer.pack_shared_prefix)
        release_memory()
        return loss

    def rebase_reference(self) -> None:
        from ctu.distributed.reference import rebase_sharded_reference

        self.sft_optimizer = None
        self.rebased.update(rebase_sharded_reference(self.policy))

    def merged_weights(self) -> list | None:
        """Rank 0: ``[ref, sums]``: the merged weights it put in the object store, packed in the compute dtype (one
        host copy, :mod:`ctu.distributed.transfer`), and their fingerprint sums in that dtype, taken as they were
        packed (the sync compares them with the engines'); the driver passes the ref on without fetching it."""
        import ray

        from ctu.distributed.fsdp import gathered_named_tensors
        from ctu.distributed.transfer import pack
        from ctu.engines.checks.fingerprint import Accumulator

        dtype = self.policy.compute_dtype
        sums = Accumulator([str(dtype).removeprefix("torch.")]) if self.rank == 0 else None
        packed = pack(gathered_named_tensors(self.policy, dtype=dtype), dtype, sums)  # every rank gathers; rank 0 keeps
        return [ray.put(packed), sums.sums] if sums is not None else None

    def base_weights(self) -> dict | None:
        from ctu.distributed.reference import gathered_base_tensors

        out = gathered_base_tensors(self.policy)
        return out if self.rank == 0 else None

    def adapter_weights(self) -> dict | None:
        from ctu.distributed.fsdp import gathered_lora_tensors

        out = gathered_lora_tensors(self.policy)
        return out if self.rank == 0 else None

    @torch.no_grad()
    def score(self, ids, attn, temperature: float):
        from ctu.train.logprobs import token_logprobs
        from ctu.train.update import release_gathered

        model = self.policy.model
        model.eval()
        try:
            device = self.policy.device
            return token_logprobs(model, ids.to(device), attn.to(device), temperature)[0].cpu()
        finally:
            model.train()
            release_gathered(self.policy)  # the root stayed gathered from the parity probe through the rollouts

    def save(self, root: str, step: int, extra: dict, keep: int, with_reference: bool) -> str:
        from ctu.distributed.dcp import save_sharded
        from ctu.distributed.reference import gathered_reference_state

        reference = gathered_reference_state(self.policy, self.rebased) if with_reference else None
        path = save_sharded(root, step, policy=self.policy, optimizer=self.optimizer, scheduler=self.scheduler,
                            extra=extra, keep=keep, files={REFERENCE: reference} if reference is not None else None)
        return str(path)

    def load(self, path: str) -> tuple[int, dict, bool]:
        from ctu.distributed.dcp import load_sharded
        from ctu.distributed.reference import load_sharded_reference
        from ctu.train.checkpoint import checkpoint_format

        if checkpoint_format(path) != "dcp":
            raise ValueError(f"trainer.resume: {path} was written in one process (trainable.pt), not by Ray trainer "
                             "ranks: resume it with distributed.trainer_workers=0")
        file = Path(path) / REFERENCE
        rebased = file.is_file()
        if rebased:
            state = torch.load(file, map_location="cpu", weights_only=True)
            self.rebased.update(load_sharded_reference(self.policy, state))
        step, extra = load_sharded(path, policy=self.policy, optimizer=self.optimizer, scheduler=self.scheduler)
        return step, extra, rebased

    def export(self, out_dir: str, base_path: str) -> dict | None:
        from ctu.distributed.fsdp import gathered_lora_tensors, gathered_named_tensors
        from ctu.train.weights import export_tensors

        adapter = gathered_lora_tensors(self.policy) if self.policy.lora else None  # small; {} off rank 0
        # a collective every rank runs to the end; rank 0 streams it into the model it writes, one tensor at a
        # time (as the in-process export), instead of a dict of every merged fp32 tensor beside that model
        stream = gathered_named_tensors(self.policy, dtype=torch.float32)
        try:
            if self.rank != 0:
                return None
            config = self.policy.model.peft_config["default"] if self.policy.lora else None
            merged = ((name, tensor.cpu()) for name, tensor in stream)
            return export_tensors(merged, Path(out_dir), base_path, self.tokenizer, adapter=adapter,
                                  peft_config=config)
        finally:
            for _ in stream:  # the gathers rank 0 has not made (other ranks; a failed write) are still made
                pass

    def _maybe_die(self) -> None:
        if not self.fault_file:
            return
        path = Path(self.fault_file)
        at = int(path.read_text().strip() or 0) if path.exists() else 0
        if at and self.updates == at:
            path.write_text("0")
            os._exit(1)


class RayTrainerGroup(TrainerGroup):
    """``config.distributed.trainer_workers`` :class:`TrainerRank` actors in a placement group."""

    def __init__(self, config, fault_files: dict[int, str] | None = None):
        ray = import_ray()
        d = config.distributed
        self.config = config
        if not d.address and not ray.is_initialized():  # this machine, before a local cluster is started
            check_room(ray, *group_demand(d, 1.0 if local_room()["GPU"] >= 1 else 0.0))
        self.started_ray = start_ray(ray, d.address)
        self.ranks: list = []
        self.pg: Any = None
        try:
            self._start(ray, config, fault_files or {})
        except BaseException:
            self.close()
            raise

    def _start(self, ray, config, faults: dict[int, str]) -> None:
        from ray.exceptions import GetTimeoutError
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from ctu.engines.hf.models import load_tokenizer

        d = config.distributed
        n, m = d.trainer_workers, d.rollout_workers
        gpu = 1.0 if ray.cluster_resources().get("GPU", 0) >= 1 else 0.0
        bundles, self.rollout_placement = placement_bundles(n, m, d.placement, d.trainer_cpus, d.worker_cpus, gpu)
        what = group_demand(d, gpu)[1]
        check_room(ray, bundles, what)
        self.tokenizer = load_tokenizer(config.model.path)
        self.pg = placement_group(bundles, strategy="PACK")
        try:
            ray.get(self.pg.ready(), timeout=d.placement_timeout_s)
        except GetTimeoutError:
            free = ray.available_resources()
            raise RaySetupError(
                f"the placement group for {what.rstrip(',')} ({len(bundles)} bundle(s), "
                f"{sum(b.get('CPU', 0) for b in bundles):g} CPUs and {sum(b.get('GPU', 0) for b in bundles):g} "
                f"GPUs) was not ready within distributed.placement_timeout_s={d.placement_timeout_s:g} s; free now: "
                f"{free.get('CPU', 0):g} CPUs, {free.get('GPU', 0):g} GPUs") from None
        if self.rollout_placement is not None:
            self.rollout_placement = {**self.rollout_placement, "pg": self.pg}
        share = self.rollout_placement["trainer_gpu"] if self.rollout_placement else gpu
        for k in range(n):
            actor = ray.remote(TrainerRank).options(
                num_cpus=d.trainer_cpus, num_gpus=share, max_restarts=0, max_task_retries=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=k))
            self.ranks.append(actor.remote(config, k, n, faults.get(k)))
        names = [f"trainer rank {k}" for k in range(n)]
        init = wait_started(ray, [self.ranks[0].endpoint.remote()], names[:1], d.start_timeout_s)[0]
        wait_started(ray, [r.setup.remote(init) for r in self.ranks], names, d.start_timeout_s)

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def precision_note(self) -> str:
        return f"{import_ray().get(self.ranks[0].precision_note.remote())} (rank 0 of {len(self.ranks)})"

    def _all(self, method: str, *args, per_rank: list | None = None, what: str | None = None) -> list:
        """Call ``method`` on every rank at once (``per_rank``: rank k's first argument); their answers."""
        ray = import_ray()
        from ray.exceptions import RayActorError, RayTaskError

        refs = [getattr(r, method).remote(*([per_rank[k]] if per_rank is not None else []), *args)
                for k, r in enumerate(self.ranks)]
        try:  # fail fast: the other ranks may wait in a collective for the one that failed
            pending = list(refs)
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                ray.get(done[0])
            return ray.get(refs)
        except (RayActorError, RayTaskError) as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, BaseException):  # the rank's own exception
                first = f"{type(cause).__name__}: {str(cause).strip().splitlines()[-1] if str(cause).strip() else ''}"
            else:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            dead = [k for k, r in enumerate(self.ranks) if not _alive(ray, r)]
            who = f"trainer rank {dead[0]} died" if dead else "a trainer rank failed"
            raise TrainerRankError(f"{who} during {what or method} ({first}); the run stopped: continue it from "
                                   "its last complete checkpoint with trainer.resume=latest") from exc

    def update(self, samples, temperature, seed):
        slices = list(contiguous_slices(list(samples), self.world_size))
        return self._all("update", temperature, seed, per_rank=slices)[0]

    def kl(self, samples, temperature):
        slices = list(contiguous_slices(list(samples), self.world_size))
        return [v for part in self._all("kl", temperature, per_rank=slices) for v in part]

    def sft(self, demos, batches, on_step=None):
        loss = 0.0
        for i, batch in enumerate(batches):
            slices = list(contiguous_slices([demos[j] for j in batch], self.world_size))
            loss = self._all("sft_step", self.config.trainer.sft_lr, i == 0, per_rank=slices, what="the warm start")[0]
            check_loss(loss, "warm start", i + 1, len(batches), "trainer.sft_lr", self.config.trainer.sft_lr)
            if on_step is not None:
                on_step(loss)
        self._all("rebase_reference")
        return loss

    def release_memory(self) -> None:
        self._all("release_memory")

    def merged_weights(self):
        from ctu.distributed.transfer import PackedRef

        ref, sums = self._all("merged_weights", what="the weight sync")[0]
        return PackedRef(ref, sums)

    def base_weights(self):
        return self._all("base_weights", what="the weight sync")[0].items()

    def adapter_weights(self):
        return self._all("adapter_weights", what="the weight sync")[0].items()

    def score(self, ids, attn, temperature):
        return self._all("score", ids.cpu(), attn.cpu(), temperature, what="the parity probe")[0]

    def save(self, root, step, extra, keep, with_reference):
        return Path(self._all("save", str(root), step, extra, keep, with_reference, what="a checkpoint")[0])

    def load(self, path):
        return tuple(self._all("load", str(path), what="resuming")[0])

    def export(self, out_dir, base_path):
        return self._all("export", str(out_dir), base_path, what="the export")[0]

    def close(self) -> None:
        ray = import_ray()
        from ray.util.placement_group import remove_placement_group

        for rank in self.ranks:
            ray.kill(rank, no_restart=True)
        self.ranks = []
        if self.pg is not None:
            remove_placement_group(self.pg)
            self.pg = None
        if self.started_ray:
            ray.shutdown()
            self.started_ray = False


def _alive(ray, actor) -> bool:
    try:
        ray.get(actor.pid.remote(), timeout=10)
        return True
    except Exception:  # noqa: BLE001 - dead, restarting or unreachable
        return False
