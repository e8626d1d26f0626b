"""An optimizer step under bf16 autocast holds one cast of each frozen weight and one copy of equal saved
activations, and moves the weights by the same bits as without (:mod:`ctu.train.cast_once`).

Before, a step kept its shared prefix's graph (with a bf16 cast of every frozen weight) while each micro-batch cast
every weight again, and every consumer of the normed hidden states saved its own bf16 copy of them: SmolLM2-135M's
replay update peaked at 3.27 GiB, 2.98 with one cast (``benchmarks/rl_levers.py --phase-rss`` measures a step).
"""

from __future__ import annotations

import contextlib

import torch

import ctu.train.cast_once as cast_once
import ctu.train.update as update
from ctu.config.schema import load_config
from ctu.train.policy import build_policy
from tests.unit.train.test_step_prefix import BUDGET
from tests.unit.train.test_update_semantics import prompt_shared_samples

BF16 = ["trainer.autocast=bfloat16", f"trainer.micro_batch_tokens={BUDGET}"]


def saved_tensors(root) -> list[torch.Tensor]:
    """Every tensor the autograd graph under ``root`` saved for backward (through its hooks' unpack)."""
    found, seen, todo = [], set(), [root]
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        for name in dir(node):
            if name.startswith("_saved_"):
                value = getattr(node, name)
                for v in value if isinstance(value, (tuple, list)) else [value]:
                    if isinstance(v, torch.Tensor):
                        found.append(v)
        todo.extend(fn for fn, _ in node.next_functions)
    return found


def step(monkeypatch, off: bool, graphs: list | None = None):
    """One RL optimizer step (shared prompt run once, several micro-batches) in bf16 autocast; the weight change,
    and each micro-batch's saved tensors in ``graphs``."""
    if off:
        monkeypatch.setattr(update, "cast_once", lambda model: contextlib.nullcontext())
    prefix: list = []
    if graphs is not None:  # each micro-batch's graph, and the step prefix's (alive through all of them)
        plain, plain_many = torch.Tensor.backward, torch.autograd.backward

        def backward(self, *args, **kwargs):
            graphs.append(saved_tensors(self.grad_fn))
            return plain(self, *args, **kwargs)

        def backward_many(tensors, *args, **kwargs):
            if isinstance(tensors, (list, tuple)):  # the prefix's (Tensor.backward passes one tensor)
                prefix.extend(t for out in tensors for t in saved_tensors(out.grad_fn))
            return plain_many(tensors, *args, **kwargs)
        monkeypatch.setattr(torch.Tensor, "backward", backward)
        monkeypatch.setattr(torch.autograd, "backward", backward_many)
    cfg = load_config(None, ["model.path=tiny-random", "trainer.grad_clip=1000000.0", *BF16])
    torch.manual_seed(0)
    policy = build_policy(cfg, device="cpu")
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
    opt = torch.optim.SGD(policy.trainable_parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    stats = update.policy_update(policy, opt, sched, prompt_shared_samples(), cfg.trainer, temperature=0.9, seed=0)
    monkeypatch.undo()
    if graphs is not None:
        assert prefix and len(graphs) >= 2  # a step prefix and several micro-batches continuing from it
        graphs[:] = [prefix + g for g in graphs]
    frozen = [m.weight for m in cast_once._frozen_linears(policy.model)]
    trainable = {tuple(p.shape) for p in policy.trainable_parameters()}
    step.policy = policy
    step.trainable = trainable | {s[::-1] for s in trainable}  # LoRA's own casts, a few KB: made at each use
    return stats, {n: p.detach() - before[n] for n, p in policy.model.named_parameters() if p.requires_grad}, frozen


def test_the_step_moves_the_weights_by_the_same_bits(monkeypatch):
    stats, delta, _ = step(monkeypatch, off=False)
    old_stats, old_delta, _ = step(monkeypatch, off=True)
    assert stats["loss"] == old_stats["loss"] and stats["grad_norm"] == old_stats["grad_norm"]
    assert any(d.abs().max() > 0 for d in delta.values())
    assert all(torch.equal(delta[n], old_delta[n]) for n in delta)


def test_each_frozen_weight_is_cast_once_and_equal_activations_are_saved_once(monkeypatch):
    monkeypatch.setattr(cast_once, "SMALLEST", 1)  # the tiny model's tensors are small
    graphs: list = []
    _, _, frozen = step(monkeypatch, off=False, graphs=graphs)
    shapes = {tuple(w.shape) for w in frozen} | {tuple(w.shape[::-1]) for w in frozen}
    for saved in graphs:
        bf16 = {t.untyped_storage().data_ptr(): t for t in saved if t.dtype == torch.bfloat16}
        casts = [t for t in bf16.values() if tuple(t.shape) in shapes and t.dim() == 2]
        assert 0 < len(casts) <= len(frozen)  # old code: the prefix's casts and the micro-batch's, 2x
        tensors = [t for t in bf16.values() if tuple(t.shape) not in step.trainable]
        equal = [(a.shape, b.shape) for i, a in enumerate(tensors) for b in tensors[i + 1:]
                 if a.shape == b.shape and a.stride() == b.stride() and torch.equal(a, b)]
        assert not equal  # old code: q, k, v and each LoRA A saved their own cast of the same hidden states


def test_the_old_code_holds_two_casts_and_equal_copies(monkeypatch):
    """The measure above tells the old step from the new one (else its assertions could not fail)."""
    graphs: list = []
    _, _, frozen = step(monkeypatch, off=True, graphs=graphs)
    shapes = {tuple(w.shape) for w in frozen} | {tuple(w.shape[::-1]) for w in frozen}
    for saved in graphs:
        bf16 = {t.untyped_storage().data_ptr(): t for t in saved if t.dtype == torch.bfloat16}
        assert len([t for t in bf16.values() if tuple(t.shape) in shapes and t.dim() == 2]) > len(frozen)


def test_a_step_without_autocast_is_left_as_it_is():
    cfg = load_config(None, ["model.path=tiny-random", "trainer.autocast=off"])
    policy = build_policy(cfg, device="cpu")
    opt = torch.optim.SGD(policy.trainable_parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    update.policy_update(policy, opt, sched, prompt_shared_samples(), cfg.trainer, temperature=0.9, seed=0)
    assert not any(getattr(m, cast_once.PATCHED, False) for m in policy.model.modules())


def test_nothing_saved_for_backward_outlives_the_step(monkeypatch):
    """A saved tensor kept with its own grad_fn holds the graph that holds it: a cycle nothing frees where
    backward does not pass (it leaked ~0.18 GiB a SmolLM2-135M update)."""
    import gc

    made = []

    class Recording(cast_once._SavedOnce):
        def __init__(self):
            super().__init__()
            made.append(self)
    monkeypatch.setattr(cast_once, "_SavedOnce", Recording)
    monkeypatch.setattr(cast_once, "SMALLEST", 1)
    step(monkeypatch, off=False)
    gc.collect()
    refs = [ref for saved in made for window in saved.recent.values() for ref in window]
    assert made and refs and all(ref() is None for ref in refs)


def test_a_copy_of_the_model_made_after_a_step_computes_with_its_own_weights(monkeypatch):
    """The engine's decode copy is a deep copy of the policy, made at its first generation, which may come after an
    update (``trainer.eval_before_train=false``): its layers must not call back into the fp32 policy's."""
    from ctu.engines.hf.decode_copy import DecodeCopy

    step(monkeypatch, off=False)
    policy = step.policy
    made = DecodeCopy(torch.bfloat16).get(policy.model, version=1)
    ids = torch.tensor([[1, 5, 9, 13, 2]])
    with torch.no_grad():
        logits = made(input_ids=ids).logits
        reference = DecodeCopy(torch.bfloat16).get(policy.model, version=1)(input_ids=ids).logits
    assert logits.dtype == torch.bfloat16 and torch.equal(logits, reference)
