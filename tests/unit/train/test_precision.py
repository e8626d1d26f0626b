"""Mixed precision on CPU in bf16: fp32 master weights, bf16 frozen weights and compute, fp32 merging,
updates at the GPU presets' learning rate (3e-7) that reach the weights and the sampler; rebasing the
KL reference onto the current policy."""

import pytest
import torch

from ctu.config.schema import load_config

LR = 3e-7


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from tests.support.models import save_random_model

    return save_random_model(tmp_path_factory.mktemp("tiny-qwen2"), "qwen2", layers=2, hidden=64, intermediate=128)


def policy_for(path, *overrides, dtype="bfloat16"):
    from ctu.train.policy import build_policy

    config = load_config(None, [f"model.path={path}", f"model.dtype={dtype}", *overrides])
    torch.manual_seed(1)
    return config, build_policy(config, device="cpu")


def samples():
    from ctu.train.update import to_sample

    prompt = list(range(20, 60))  # a shared prefix (longer than MIN_SHARED)
    return [to_sample(prompt + [100 + i], [7 + i, 300 + 5 * i, 2, 41], [1, 1, 1, 1], [-3.0] * 4, adv)
            for i, adv in enumerate((1.0, -1.0, 0.5, -0.5))]


def update(policy, config, lr=LR, steps=2):
    from ctu.train.update import policy_update

    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    for _ in range(steps):  # LoRA: the first step moves lora_B only (lora_A's gradient is 0 while B = 0)
        policy_update(policy, opt, sched, samples(), config.trainer, temperature=1.0)
    return opt


def probe_logprobs(model):
    from ctu.train.policy import token_logprobs
    from ctu.train.update import collate

    b = collate(samples(), "cpu")
    with torch.no_grad():
        return token_logprobs(model, b["ids"], b["attn"], needed=b["mask"])[0] * b["mask"]


@pytest.mark.parametrize("lora", [True, False])
def test_precision_policy_fp32_masters_bf16_frozen_and_compute(model_path, lora):
    from ctu.train.policy import assert_precision_policy

    _, policy = policy_for(model_path, f"lora.enabled={str(lora).lower()}")
    assert assert_precision_policy(policy.model, torch.bfloat16, policy.reference) == torch.bfloat16
    trainable = policy.trainable_parameters()
    assert trainable and all(p.dtype == torch.float32 for p in trainable)
    frozen = [p for p in policy.model.parameters() if not p.requires_grad]
    if policy.reference is not None:
        frozen += list(policy.reference.parameters())
    assert frozen and all(p.dtype == torch.bfloat16 for p in frozen)
    # compute happens in bf16: every matmul of a forward under policy.compute() produces bf16 — except the rotary
    # frequencies (inv_freq [.., d/2, 1] @ positions [.., 1, s]: a contraction over 1), which transformers < 5
    # computes in fp32 with autocast disabled on purpose
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Matmuls(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm):
                first = args[1] if func.overloadpacket is torch.ops.aten.addmm else args[0]
                if first.shape[-1] > 1:
                    seen.append(out.dtype)
            return out

    with Matmuls(), policy.compute(), torch.no_grad():
        policy.model(input_ids=torch.tensor([[5, 6, 7, 8]]))
    assert seen and set(seen) == {torch.bfloat16}


@pytest.mark.parametrize("lora", [True, False])
def test_an_update_at_lr_3e_7_moves_the_trainable_weights(model_path, lora):
    config, policy = policy_for(model_path, f"lora.enabled={str(lora).lower()}")
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
    opt = update(policy, config)
    moved = touched = 0
    for n, p in policy.model.named_parameters():
        if p.requires_grad:
            had_gradient = opt.state[p]["exp_avg"] != 0
            touched += int(had_gradient.sum())
            moved += int(((p.detach() != before[n]) & had_gradient).sum())
    assert touched > 0
    assert moved / touched > 0.95  # all-bf16 (old): full FT 0.5%, LoRA 50% (lora_A never moves)


def test_the_sampler_sees_an_update_at_lr_3e_7(model_path):
    from ctu.engines.hf.engine import HFEngine
    from ctu.engines.hf.models import load_model

    config, policy = policy_for(model_path)  # LoRA, bf16 trainer
    engine = HFEngine(load_model(model_path, dtype=torch.float32, device="cpu").eval(), tokenizer=None)
    engine.update_weights(policy.merged_named_tensors())
    sampler_before = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
    lp_before = probe_logprobs(engine.model)
    update(policy, config)
    from ctu.train.weights import lora_deltas

    deltas = {n.replace("base_model.model.", "").replace(".base_layer", ""): d for n, d in
              lora_deltas(policy.model).items()}
    assert deltas and max(float(d.abs().max()) for d in deltas.values()) < 1e-4  # far below bf16 spacing at 0.02
    engine.update_weights(policy.merged_named_tensors())
    for name, delta in deltas.items():  # the sampler got base + the fp32 delta, not a bf16-rounded sum
        change = engine.model.get_parameter(name).detach() - sampler_before[name]
        torch.testing.assert_close(change, delta, rtol=1e-2, atol=1e-2 * float(delta.abs().max()))
    lp_after = probe_logprobs(engine.model)
    assert not torch.equal(lp_after, lp_before)


def test_merging_is_fp32_then_one_cast(model_path):
    _, policy = policy_for(model_path)
    with torch.no_grad():
        for n, p in policy.model.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn_like(p) * 1e-3)
    params = dict(policy.model.named_parameters())
    name = next(n for n in params if n.endswith("q_proj.base_layer.weight"))
    module = policy.model.get_submodule(name.rsplit(".", 2)[0])
    a = params[name.replace("base_layer.weight", "lora_A.default.weight")].detach()
    b = params[name.replace("base_layer.weight", "lora_B.default.weight")].detach()
    reference = params[name].detach().float() + (b @ a) * module.scaling["default"]
    target = name.replace("base_model.model.", "").replace(".base_layer", "")
    merged32 = dict(policy.merged_named_tensors())[target]
    assert merged32.dtype == torch.float32
    torch.testing.assert_close(merged32, reference, rtol=1e-6, atol=1e-6 * float(reference.abs().max()))
    merged16 = dict(policy.merged_named_tensors(dtype=torch.bfloat16))[target]
    assert merged16.dtype == torch.bfloat16 and torch.equal(merged16, merged32.to(torch.bfloat16))
    assert not torch.equal(merged16.float(), params[name].detach().float())  # the delta survived the cast


@pytest.mark.parametrize("lora", [True, False])
def test_rebase_reference_makes_the_current_policy_the_reference(model_path, lora):
    flag = f"lora.enabled={str(lora).lower()}"
    config, policy = policy_for(model_path, flag, dtype="float32")
    update(policy, config, lr=1e-2)
    current = probe_logprobs(policy.model)
    with policy.as_reference() as ref:
        assert (probe_logprobs(ref) - current).abs().max() > 1e-3  # the update moved the policy
    policy.rebase_reference()

    def close(actual):
        torch.testing.assert_close(actual, current, rtol=1e-4, atol=1e-4 * max(1.0, float(current.abs().max())))

    close(probe_logprobs(policy.model))
    with policy.as_reference() as ref:
        close(probe_logprobs(ref))
    _, fresh = policy_for(model_path, flag, dtype="float32")
    fresh.load_reference_state(policy.reference_state())
    with fresh.as_reference() as ref:
        close(probe_logprobs(ref))


def test_a_lora_rebase_keeps_no_second_copy_of_the_base_weights(model_path):
    """After the warm start is merged (rebase_reference), the rebased base weights are the model's own frozen
    tensors: the policy keeps no copy of them (SmolLM2-135M: 425 MB of fp32 held for the whole run, and one more
    copy at every checkpoint), and a checkpoint's reference state still round-trips into a fresh policy."""
    config, policy = policy_for(model_path, "lora.enabled=true", dtype="float32")
    update(policy, config, lr=1e-2)
    policy.rebase_reference()
    params = {n: p for n, p in policy.model.named_parameters()}

    def aliases(state):
        return {n: t.untyped_storage().data_ptr() == params[n].untyped_storage().data_ptr() for n, t in state.items()}

    state = policy.reference_state()
    assert state and all(aliases(state).values()), "reference_state copied the base weights"
    assert all(aliases(policy._rebased).values()), "the policy holds a copy of the rebased base weights"
    saved = {n: t.clone() for n, t in state.items()}  # as read back from a checkpoint: separate tensors
    _, fresh = policy_for(model_path, "lora.enabled=true", dtype="float32")
    fresh.load_reference_state(saved)
    fresh_params = dict(fresh.model.named_parameters())
    for name, tensor in fresh.reference_state().items():
        assert torch.equal(tensor, saved[name])
        assert tensor.untyped_storage().data_ptr() == fresh_params[name].untyped_storage().data_ptr()
