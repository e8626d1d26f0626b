"""glibc's heap and freed tensors: with ``CTU_HEAP_BOUND=1`` (:func:`bound_heap`) tensors freed below a live one
leave the process's RSS, with glibc's defaults they stay, and :func:`trim_heap` (run after every micro-batch)
hands them back too. Each case runs in a fresh process (the threshold is per process)."""

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or os.environ.get("MALLOC_MMAP_THRESHOLD_"),
                                reason="glibc's malloc on Linux, without MALLOC_MMAP_THRESHOLD_ set")

SCRIPT = textwrap.dedent("""
    import sys
    import torch
    from ctu.engines.cpu.host_memory import bound_heap, trim_heap

    def rss_mib():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024

    if sys.argv[1] == "bound":
        assert bound_heap()  # CTU_HEAP_BOUND=1 in this process's environment
    first = torch.ones(16 * 2**18)  # 16 MiB, freed: glibc's default then serves up to 16 MiB from the heap
    del first
    before = rss_mib()
    temporaries, pins = [], []
    for _ in range(12):  # 96 MiB of 8 MiB tensors (activations, logits) between small live ones (no trim from
        temporaries.append(torch.ones(8 * 2**18))  # the heap's top can free them)
        pins.append(torch.ones(1000))
    del temporaries
    if sys.argv[1] == "trim":
        trim_heap()
    print(rss_mib() - before)
""")


def kept_after_free(mode: str) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "CTU_HEAP_BOUND"}
    env["OMP_NUM_THREADS"] = "1"
    if mode == "bound":
        env["CTU_HEAP_BOUND"] = "1"
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    return float(out.stdout.strip().splitlines()[-1])


def test_freed_tensors_leave_the_rss_once_the_heap_is_bounded_or_trimmed():
    # MiB of the 96 freed: glibc's defaults keep some resident (32, 64 or all 96 here, by where the heap's small
    # chunks landed, by ASLR); the fixed threshold returned them on free, malloc_trim returns free pages inside the heap
    assert kept_after_free("default") > 16
    assert kept_after_free("bound") < 8
    assert kept_after_free("trim") < 8


def test_the_bound_is_opt_in_and_an_explicit_glibc_setting_wins(monkeypatch):
    from ctu.engines.cpu.host_memory import bound_heap

    monkeypatch.delenv("CTU_HEAP_BOUND", raising=False)
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    assert bound_heap() is False  # off unless asked: it costs ~1.7x an update's time
    monkeypatch.setenv("CTU_HEAP_BOUND", "1")
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "1048576")
    assert bound_heap() is False


def test_every_micro_batch_of_an_update_trims_the_heap(monkeypatch):
    import torch

    import ctu.train.update as update
    from ctu.config.schema import load_config
    from ctu.train.policy import build_policy

    calls = []
    monkeypatch.setattr(update, "trim_heap", lambda: calls.append(1))
    cfg = load_config(None, ["model.path=tiny-random", "trainer.micro_batch_tokens=16"])
    policy = build_policy(cfg, device="cpu")
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    samples = [update.to_sample([1, 5, 6, 7], [8, 9, 10, 11], [1, 1, 1, 1], [-1.0] * 4, a) for a in (1.0, -1.0, 0.5)]
    stats = update.policy_update(policy, opt, sched, samples, cfg.trainer, temperature=1.0)
    assert stats["updates"] == 1.0
    assert len(calls) == len(update.micro_batches([8, 8, 8], 16)) == 2  # one trim after each backward
