"""One compute-dtype policy for trainer and hf engine, on CPU in bf16: the hf engine generates under the trainer's
autocast (its logprobs are the trainer's, not fp32 ones), and autocast caches no bf16 copy of every fp32 weight
(one region over a whole forward used to keep a cast of each fp32 master alive until it ended: ~14 GiB at 7B)."""

import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ctu.config.schema import load_config

MATMULS = (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm, torch.ops.aten.linear, torch.ops.aten.matmul)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from tests.support.models import save_random_model

    return save_random_model(tmp_path_factory.mktemp("tiny-qwen2-ac"), "qwen2", layers=2, hidden=64, intermediate=128)


def policy_for(path, *overrides):
    from ctu.train.policy import build_policy

    config = load_config(None, [f"model.path={path}", "model.dtype=bfloat16", *overrides])
    torch.manual_seed(1)
    policy = build_policy(config, device="cpu")
    with torch.no_grad():  # a trained adapter, so the fp32 adapters matter
        for n, p in policy.model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn_like(p) * 0.05)
    return policy


class MatmulDtypes(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in MATMULS:
            self.seen.add(out.dtype)
        return out


def test_the_hf_engine_generates_in_the_trainers_compute_dtype(model_path):
    from ctu.engines.base import SamplingParams
    from ctu.engines.hf.engine import HFEngine
    from ctu.train.logprobs import token_logprobs

    policy = policy_for(model_path)
    engine = HFEngine(policy.model, tokenizer=policy.tokenizer, kv_reuse=False)
    prompt = [5, 17, 33, 2, 90, 41]
    with MatmulDtypes() as mode:
        out = engine.generate_sync([prompt], SamplingParams(temperature=1.0, max_tokens=8, seed=3))[0][0]
    assert mode.seen == {torch.bfloat16}, mode.seen  # fp32 adapter matmuls before
    ids = torch.tensor([prompt + list(out.token_ids)])
    with torch.no_grad():
        trainer = token_logprobs(policy.model.eval(), ids, torch.ones_like(ids), 1.0)[0][0, len(prompt) - 1:]
    engine_lp = torch.tensor(out.logprobs)
    assert float((trainer - engine_lp).abs().max()) < 0.05  # bf16 noise (cached decode vs one forward)


class CastsOfWeights(TorchDispatchMode):
    """Weak references to every bf16 cast of an fp32 weight (shape-matched ``_to_copy`` outputs)."""

    def __init__(self, shapes):
        super().__init__()
        self.shapes, self.casts = shapes, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket is torch.ops.aten._to_copy and isinstance(out, torch.Tensor):
            if out.dtype == torch.bfloat16 and args[0].dtype == torch.float32 and tuple(out.shape) in self.shapes:
                self.casts.append(weakref.ref(out))
        return out

    def live_bytes(self):
        return sum(t.numel() * t.element_size() for t in (r() for r in self.casts) if t is not None)


def test_a_forward_does_not_keep_a_cast_of_every_fp32_weight(model_path):
    policy = policy_for(model_path, "lora.enabled=false")  # full fine-tuning: fp32 masters, bf16 compute
    model = policy.model
    layer_weights = [p for n, p in model.named_parameters() if ".layers." in n and p.dim() == 2]
    shapes = {tuple(p.shape) for p in layer_weights}
    at_the_end = []
    mode = CastsOfWeights(shapes)
    hook = model.model.norm.register_forward_hook(lambda *_: at_the_end.append(mode.live_bytes()))
    try:
        with mode, torch.no_grad(), policy.compute():
            model(input_ids=torch.tensor([[5, 6, 7, 8, 9]]))
    finally:
        hook.remove()
    every = sum(p.numel() * 2 for p in layer_weights)
    largest = max(p.numel() * 2 for p in layer_weights)
    assert mode.casts, "no autocast casts seen: the forward did not run in bf16"
    assert at_the_end and at_the_end[0] <= largest < every, (at_the_end, largest, every)
