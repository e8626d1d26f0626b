"""The pure parts of benchmarks/update_noise.py (gradient agreement between batches) and
benchmarks/exploration_cost.py (why sampled episodes fail, per task kind)."""

from types import SimpleNamespace

import pytest
import torch

from benchmarks.exploration_cost import decision_right, tally
from benchmarks.update_noise import GradientRecorder, episodes_for, mean_pairwise


def test_agreement_of_noisy_batches_matches_the_signal_share():
    torch.manual_seed(0)
    signal = torch.randn(20_000, dtype=torch.float64)
    # noise variance 4x the signal's: rho = 1 / (1 + 4) = 0.2
    batches = [signal + 2.0 * torch.randn(20_000, dtype=torch.float64) for _ in range(6)]
    assert mean_pairwise(batches) == pytest.approx(0.2, rel=0.1)
    # 4x the episodes: noise variance / 4, rho = 1 / (1 + 1) = 0.5
    assert episodes_for(0.2, 16) == pytest.approx(64)
    assert episodes_for(0.6, 16) == 16 and episodes_for(0.0, 16) == float("inf")


def test_the_recorder_keeps_the_gradient_instead_of_stepping():
    layer = torch.nn.Linear(3, 2)
    before = [p.detach().clone() for p in layer.parameters()]
    recorder = GradientRecorder(layer.parameters())
    recorder.zero_grad()
    layer(torch.ones(1, 3)).sum().backward()
    recorder.step()
    recorder.zero_grad()
    expected = torch.cat([torch.ones(2, 3).flatten(), torch.ones(2)]).double()
    assert torch.equal(recorder.grad, expected)
    assert all(torch.equal(a, b) for a, b in zip(before, layer.parameters(), strict=True))  # nothing moved
    assert all(p.grad is None for p in layer.parameters())


def episode(reward, tools, db=0.0):
    calls = [{"function": {"name": name}} for name in ("get_order", *tools)]
    return SimpleNamespace(reward=reward, components={"DB": db},
                           messages=[{"role": "assistant", "tool_calls": [c]} for c in calls])


def test_failures_split_into_wrong_decisions_and_wrong_details():
    kinds = ["change_address/allowed", "change_address/allowed", "change_address/allowed", "status/allowed",
             "cancel/refusal", "cancel/refusal"]
    episodes = [episode(1.0, ["change_address"], 1.0),
                episode(0.0, ["change_address"]),  # the right tool, a wrong address
                episode(0.0, []),  # reported instead of writing
                episode(0.0, ["return_order"]),  # wrote on a status request
                episode(0.0, ["cancel_order"], 1.0),  # the refused write changed nothing: the message was wrong
                episode(0.0, [])]
    assert not decision_right("status/allowed", episodes[3]) and decision_right("cancel/refusal", episodes[4])
    assert dict(tally(kinds, episodes)) == {"change_address/allowed": [3, 1, 1, 1], "status/allowed": [1, 0, 1, 0],
                                            "cancel/refusal": [2, 0, 0, 2]}
