"""Trainer -> engine weight sync, and the parity probe that proves the engine uses the new weights.

Order around an update (what vLLM needs when it shares the GPU with the trainer): ``before_update`` puts a
colocated engine to sleep (frees its KV cache and weights: level 2, discarded, for merged syncs; level 1 for
adapter syncs); ``after_update`` empties the trainer's CUDA cache, sends the new weights (merged Hugging Face
tensors, or the LoRA adapter under a new id per version: the engine wakes its weights, loads, then wakes its KV
cache), and then scores a fixed probe with the engine and with the trainer. The largest per-token logprob
difference is logged as ``sync/logprob_max_abs_diff``; above ``engine.parity_tolerance`` the run stops with a
clear error. Every sync also stamps the policy version on the engines; a stamp other than the trainer's stops
the run too (a bf16 probe cannot see a stale sync at small learning rates).
"""

from __future__ import annotations

import logging
import time

import torch

from ctu.config.schema import Config, engines_sleep, weight_sync_mode
from ctu.engines.checks.fingerprint import Accumulator, hidden, mismatch
from ctu.engines.checks.parity import ParityError, check_parity, check_versions, default_parity_tolerance
from ctu.engines.hf.decode_copy import resolve_decode_dtype
from ctu.train.weights import hf_name

log = logging.getLogger(__name__)


def base_named_tensors(model: torch.nn.Module):
    """The frozen base weights with Hugging Face names (no adapter merged in)."""
    for name, param in model.named_parameters():
        target = hf_name(name)
        if target is not None and not param.requires_grad:
            yield target, param.detach()


def adapter_named_tensors(model: torch.nn.Module):
    """The LoRA adapter's tensors with their PEFT names (what a PEFT adapter directory holds)."""
    for name, param in model.named_parameters():
        if ".lora_" in name:
            yield name, param.detach()


def parity_dtypes(config: Config) -> tuple[str, str]:
    """(the trainer's compute dtype, the engine's): ``model.dtype``; "auto" is fp32 only where the run is known to
    be on CPU (in process, no CUDA), else bf16 (``build_policy`` on CUDA; Ray ranks may have GPUs the driver
    lacks; the coarser guess cannot stop a run falsely). vLLM runs the same (``ctu.engines.vllm.engine.vllm_dtype``); the
    hf engine on CPU decodes in bf16 where ``engine.decode_dtype`` makes it a bf16 copy."""
    on_cpu = not torch.cuda.is_available() and not config.distributed.trainer_workers
    trainer = config.model.dtype if config.model.dtype != "auto" else ("float32" if on_cpu else "bfloat16")
    if on_cpu and config.engine.kind == "hf" and resolve_decode_dtype(config.engine.decode_dtype, "cpu")[0] is not None:
        return trainer, "bfloat16"  # engine.decode_dtype: the hf engine decodes with a bf16 copy
    return trainer, trainer


def parity_tolerance(config: Config) -> float:
    """``engine.parity_tolerance``, or the default for the run's dtypes at the probe's (sampling) temperature."""
    if config.engine.parity_tolerance is not None:
        return config.engine.parity_tolerance
    return default_parity_tolerance(parity_dtypes(config), config.sampling.temperature)


class WeightSync:
    """Sync to a rollout pool (:mod:`ctu.distributed.pool`): the in-process engine or every Ray worker."""

    def __init__(self, config: Config, group, pool):
        self.config = config
        self.group = group  # a TrainerGroup (ctu/distributed/group.py)
        self.pool = pool
        model = getattr(group, "model", None)
        self.shares_model = model is not None and getattr(getattr(pool, "engine", None), "model", None) is model
        self.version = -1
        self.base_changed = False  # the engine's base weights must be (re)sent before adapter-only syncs
        self._warned_blind = False

    def base_change_problem(self, key: str, why: str) -> str | None:
        """Why this run's engine cannot take a new base (the warm start or a resumed rebase merged into it), in
        one line naming ``key``; None where it can."""
        engine = getattr(self.pool, "engine", None)
        if weight_sync_mode(self.config) != "adapter" or getattr(engine, "reloads_base", True):
            return None
        return (f"{key}: {why} merges into the base weights, which the served engine reloads only through the "
                "server's dev routes, and its server has none: start it with VLLM_SERVER_DEV_MODE=1, or train "
                "without a warm start (trainer.sft_steps=0)")

    def _check_fingerprints(self, held: list, sent: Accumulator, version: int) -> None:
        if problem := mismatch(held, sent, version):
            raise ParityError(problem)  # acknowledged and stamped, yet not what was sent
        blind = [(f.count, w.count) for f in held if f is not None and (w := sent.fingerprint(f.dtype)) is not None
                 and hidden(f, w)]
        if blind and not self._warned_blind:
            self._warned_blind = True
            log.warning("the engine's parameters hold %d values of the %d sent (its kernels keep weights outside "
                        "them): loads are checked by version and parity only", *blind[0])

    def _sums(self) -> Accumulator:
        return Accumulator(sorted({parity_dtypes(self.config)[1], "float32"}))

    @staticmethod
    def _fingerprinted(weights, sent: Accumulator):
        """``weights`` fingerprinted as they stream to the engines; weights already in Ray's object store (trainer
        rank 0's ``PackedRef``) pass as they are, with the sums rank 0 took as it packed them (in the wire dtype;
        where they are unknown nothing is compared)."""
        if hasattr(weights, "ref"):
            sent.sums = {dtype: list(acc) for dtype, acc in (getattr(weights, "sums", None) or {}).items()}
            return weights
        return sent.stream(weights)

    def before_update(self) -> None:
        if engines_sleep(self.config):
            self.pool.sleep()

    def after_update(self, version: int) -> dict[str, float]:
        """Send the weights of policy ``version`` (the global step), wake, probe parity and check the engines'
        weight version; this sync's metrics (``seconds`` belongs with the step's timings, the rest is
        deterministic). The engines wake their weights to load them and their KV cache after (vLLM:
        ``wake_up(tags=["weights"])``, load, ``wake_up(tags=["kv_cache"])``); ``pool.wake_up()`` then wakes
        whatever still sleeps (an engine that shares the trainer's model loads nothing)."""
        if version <= self.version:  # a version names one set of weights: engines skip or refuse one they hold
            raise RuntimeError(f"weight sync: version {version} sent after version {self.version}; each sync needs "
                               "a newer version")
        started = time.perf_counter()
        self.group.release_memory()  # the trainer's cached CUDA memory back before vLLM (outside torch's cache) wakes
        self.version = version
        sent: Accumulator | None = None  # the fingerprint of full weights sent (adapters: checked by name)
        if self.shares_model:  # the engine computes with the trainer's own tensors: its weights are this version
            self.pool.engine.weights_version = version
        elif weight_sync_mode(self.config) == "adapter":
            if self.base_changed:  # e.g. after the warm start was merged into the base (rebase_reference)
                self.pool.update_weights(self._fingerprinted(self.group.base_weights(), sent := self._sums()), version)
            self.pool.update_adapter(self.group.adapter_weights(), version)
        else:
            self.pool.update_weights(self._fingerprinted(self.group.merged_weights(), sent := self._sums()), version)
        self.pool.wake_up()
        self.base_changed = False
        diffs = self.pool.parity(self.group.score, temperature=self.config.sampling.temperature,
                                 tokens=self.config.engine.parity_probe_tokens, seed=self.config.run.seed)
        diff = max(diffs) if all(d == d for d in diffs) else float("nan")  # a dead worker reports NaN
        check_versions(self.pool.versions(), version)
        if sent is not None and sent.sums:
            self._check_fingerprints(self.pool.fingerprints(), sent, version)
        check_parity(diff, parity_tolerance(self.config))
        return {"logprob_max_abs_diff": diff, "version": float(self.version),
                "seconds": time.perf_counter() - started}
