"""Trainer groups: where the policy lives and is updated. One small interface, an in-process implementation
(the default) and a Ray one (:mod:`ctu.distributed.ray_trainer`: FSDP2 ranks as Ray actors).

The driver loop (:class:`ctu.app.trainer.Trainer`) talks to a :class:`TrainerGroup` only, as it talks to a
:class:`~ctu.distributed.pool.RolloutPool` for episodes: ``update`` runs one GRPO/PPO update on finished
episodes, ``kl`` scores KL to the reference (KL in the reward), ``sft`` runs the supervised warm start and
makes its result the KL reference, the ``*_weights`` methods give what a weight sync sends, ``score`` is the
trainer's side of the parity probe, ``save``/``load`` checkpoint, ``export`` writes the merged model.

Both implementations run the same functions of :mod:`ctu.train.update`; the Ray group splits the episodes into
contiguous slices, one per rank, and passes FSDP's ``reduce`` hook, so one update over N ranks equals the
in-process update (tests/unit/distributed/test_fsdp.py, tests/e2e/test_train_ray.py).
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from ctu.engines.cpu import cpu_threads
from ctu.engines.cpu.cpu_share import pace_training
from ctu.engines.cpu.cpu_threads import training_share
from ctu.train.update import Sample

NamedTensors = Iterable[tuple[str, torch.Tensor]]


def rows(args) -> int:
    """The rows a forward hook's module computes on: token ids' count (the embeddings), or its input's vectors."""
    x = args[0]
    return x.numel() if not x.is_floating_point() else x.numel() // max(1, x.shape[-1])


class TrainerRankError(RuntimeError):
    """A trainer rank died or failed: the run stops; ``trainer.resume=latest`` continues from the last checkpoint."""


def lr_schedule(cfg, total_steps: int):
    """LR multiplier per optimizer step: linear warmup, then constant or cosine decay."""

    def factor(update: int) -> float:
        if cfg.warmup_steps and update < cfg.warmup_steps:
            return (update + 1) / cfg.warmup_steps
        if cfg.schedule == "cosine":
            progress = (update - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps)
            return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        return 1.0

    return factor


def build_optimizer(policy, cfg):
    """AdamW over the trainable (fp32 master) parameters and its per-optimizer-step LR schedule."""
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    total_updates = cfg.max_steps * cfg.mini_batches * cfg.ppo_epochs
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lr_schedule(cfg, total_updates))


def sft_batches(demos: Sequence[Sample], steps: int, batch_size: int, seed: int,
                strata: Sequence[int] | None = None) -> list[list[int]]:
    """The warm start's batches (indices into ``demos``): the same draws in every trainer group.

    With ``strata`` (one label per demo: ``trainer.sft_balance``) every batch takes its places in turn from each
    stratum (the first stratum a batch starts with rotates; leftover places go to the next strata in turn), each
    stratum dealt from its own shuffled deck, reshuffled when spent: the batches hold the strata in equal shares
    whatever their sizes, and no demo repeats within a stratum before all of it was drawn."""
    rng = random.Random(seed)
    if strata is None:
        return [rng.sample(range(len(demos)), min(len(demos), batch_size)) for _ in range(steps)]
    if len(strata) != len(demos):
        raise ValueError(f"sft_batches: {len(strata)} strata labels for {len(demos)} demos")
    groups = [[i for i, s in enumerate(strata) if s == label] for label in sorted(set(strata))]
    decks: list[list[int]] = [[] for _ in groups]
    batches, turn = [], 0
    for _ in range(steps):
        batch: list[int] = []
        while len(batch) < min(len(demos), batch_size):
            k = turn % len(groups)
            turn += 1
            if not decks[k]:
                decks[k] = rng.sample(groups[k], len(groups[k]))
            pick = decks[k].pop()
            if pick not in batch:
                batch.append(pick)
        batches.append(batch)
    return batches


class TrainerGroup(ABC):
    """The policy and its optimizer, wherever they live."""

    tokenizer: object

    @property
    @abstractmethod
    def world_size(self) -> int: ...

    @property
    @abstractmethod
    def precision_note(self) -> str:
        """The weights' dtype and ``trainer.autocast``'s resolution with its reason (printed once at start)."""

    @abstractmethod
    def update(self, samples: Sequence[Sample], temperature: float, seed: int) -> dict[str, float]:
        """One policy update (``ppo_epochs`` x ``mini_batches`` optimizer steps); its stats and ``lr``."""

    @abstractmethod
    def kl(self, samples: Sequence[Sample], temperature: float) -> list[float]:
        """Per-episode KL to the reference, summed over sampled tokens."""

    @abstractmethod
    def sft(self, demos: Sequence[Sample], batches: Sequence[Sequence[int]], on_step=None) -> float:
        """The supervised warm start on ``demos`` (one step per batch of indices), then the result becomes the KL
        reference; returns the last step's loss. ``on_step(loss)`` after each step (progress)."""

    @abstractmethod
    def merged_weights(self) -> NamedTensors:
        """Every weight, Hugging Face names, LoRA merged in fp32 and cast once to the compute dtype (what a full
        sync sends): an iterable to consume one tensor at a time."""

    @abstractmethod
    def base_weights(self) -> NamedTensors:
        """The frozen base weights (HF names), for an adapter-syncing engine after the base changed."""

    @abstractmethod
    def adapter_weights(self) -> NamedTensors:
        """The LoRA adapter (PEFT names)."""

    @abstractmethod
    def score(self, ids: torch.Tensor, attn: torch.Tensor, temperature: float) -> torch.Tensor:
        """Teacher-forced logprobs of ``ids[:, 1:]`` (eval mode, no gradient): the parity probe's trainer side."""

    @abstractmethod
    def save(self, root: Path, step: int, extra: dict[str, Any], keep: int, with_reference: bool) -> Path: ...

    @abstractmethod
    def load(self, path: Path) -> tuple[int, dict[str, Any], bool]:
        """Restore a checkpoint; (step, extra, whether it carried a rebased KL reference)."""

    @abstractmethod
    def export(self, out_dir: Path, base_path: str) -> dict[str, str]: ...

    def release_memory(self) -> None:
        """Give freed host memory back and empty the CUDA cache (before a colocated engine starts or wakes)."""
        from ctu.engines.cpu.host_memory import release_memory

        release_memory()

    def close(self) -> None:  # noqa: B027 - optional hook
        pass


class LocalTrainer(TrainerGroup):
    """The policy in this process (one device, no process group): today's single-process path."""

    def __init__(self, config, device: str | None = None):
        from ctu.train.policy import build_policy

        self.config = config
        self.policy = build_policy(config, device=device)
        self.tokenizer = self.policy.tokenizer
        self.model = self.policy.model  # an in-process hf engine shares it (no sync needed)
        self.optimizer, self.scheduler = build_optimizer(self.policy, config.trainer)
        if self.policy.device.type == "cpu":  # each forward (a micro-batch): fewer threads beside busy programs
            self.model.get_input_embeddings().register_forward_pre_hook(
                lambda _m, args: pace_training(training_share(), cpu_threads.keeps("training", "body", rows(args))))
            self.model.get_output_embeddings().register_forward_pre_hook(
                lambda _m, args: pace_training(training_share(), cpu_threads.keeps("training", "head", rows(args)),
                                               body=False))

    @property
    def world_size(self) -> int:
        return 1

    @property
    def precision_note(self) -> str:
        return self.policy.precision_note

    def _check_threads(self) -> None:
        """Before a step, the first time other programs are busy: whether the updates may share the CPUs (the same
        gradients with fewer threads; :func:`ctu.engines.cpu.cpu_threads.check`)."""
        if self.policy.device.type != "cpu" or not cpu_threads.due("training"):
            return
        from ctu.train.gradient_probe import micro_batch_gradients

        line = cpu_threads.check("training", micro_batch_gradients(self.model, self.config.trainer.micro_batch_tokens))
        if line:
            print(line, flush=True)

    def update(self, samples, temperature, seed):
        from ctu.train.update import policy_update

        self._check_threads()
        lr = self.scheduler.get_last_lr()[0]  # this update's rate (the scheduler steps inside it)
        stats = policy_update(self.policy, self.optimizer, self.scheduler, samples, self.config.trainer, temperature,
                              seed=seed)
        return {**stats, "lr": lr}

    def kl(self, samples, temperature):
        from ctu.train.update import sequence_kl

        return sequence_kl(self.policy, samples, self.config.trainer, temperature)

    def sft(self, demos, batches, on_step=None):
        from ctu.engines.cpu.host_memory import release_memory
        from ctu.train.update import check_loss, sft_update

        t = self.config.trainer
        optimizer = torch.optim.AdamW(self.policy.trainable_parameters(), lr=t.sft_lr, weight_decay=0.0)
        self._check_threads()
        loss = 0.0
        for n, batch in enumerate(batches, start=1):
            loss = sft_update(self.policy, optimizer, [demos[i] for i in batch], t.micro_batch_tokens,
                              share_prefix=t.pack_shared_prefix)
            release_memory()
            check_loss(loss, "warm start", n, len(batches), "trainer.sft_lr", t.sft_lr)
            if on_step is not None:
                on_step(loss)
        self.policy.rebase_reference()  # the KL reference is now the warm-started policy
        return loss

    def merged_weights(self):
        return self.policy.merged_named_tensors(self.policy.compute_dtype)  # a stream, cast once to bf16 on CUDA

    def base_weights(self):
        from ctu.train.sync import base_named_tensors

        return base_named_tensors(self.policy.model)

    def adapter_weights(self):
        from ctu.train.sync import adapter_named_tensors

        return adapter_named_tensors(self.policy.model)

    @torch.no_grad()
    def score(self, ids, attn, temperature):
        from ctu.train.logprobs import token_logprobs

        model = self.policy.model
        was_training = model.training
        model.eval()
        try:
            device = self.policy.device
            return token_logprobs(model, ids.to(device), attn.to(device), temperature)[0]
        finally:
            model.train(was_training)

    def save(self, root, step, extra, keep, with_reference):
        from ctu.train.checkpoint import save_checkpoint

        return save_checkpoint(root, step, model=self.policy.model, optimizer=self.optimizer, scheduler=self.scheduler,
                               extra=extra, keep=keep,
                               reference=self.policy.reference_state() if with_reference else None)

    def load(self, path):
        """Either format: this process's (``trainable.pt``) or the DCP shards Ray trainer ranks wrote (read
        unsharded here, whatever world size wrote them); both keep the KL reference in ``reference.pt``."""
        from ctu.train.checkpoint import checkpoint_format, load_checkpoint, load_reference

        reference = load_reference(path)
        if reference is not None:
            self.policy.load_reference_state(reference)
        if checkpoint_format(path) == "dcp":
            from ctu.distributed.dcp import load_sharded

            step, extra = load_sharded(path, policy=self.policy, optimizer=self.optimizer, scheduler=self.scheduler)
        else:
            step, extra = load_checkpoint(path, model=self.policy.model, optimizer=self.optimizer,
                                          scheduler=self.scheduler)
        return step, extra, reference is not None

    def export(self, out_dir, base_path):
        from ctu.train.weights import export

        return export(self.policy, out_dir, base_path)


def contiguous_slices(items: Sequence, parts: int) -> Iterator[list]:
    """``items`` cut into ``parts`` contiguous near-equal slices (some empty when there are fewer items)."""
    size, extra = divmod(len(items), parts)
    start = 0
    for k in range(parts):
        stop = start + size + (1 if k < extra else 0)
        yield list(items[start:stop])
        start = stop
