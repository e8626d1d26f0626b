"""Generation takes fewer threads while other programs keep the CPUs busy, and its tokens do not change with it: the
others' CPU time measured from /proc/stat minus this process's own, a thread count with hysteresis, set only in the
generating thread and given back when the generation ends."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ctu.engines import cpu_share
from ctu.engines.base import SamplingParams
from ctu.engines.cpu_share import Sample, Share, busy_seconds, others_busy, share_threads
from ctu.engines.hf import HFEngine
from ctu.engines.models import load_model, load_tokenizer

STAT = """cpu  900 50 300 5000 10 0 5 0 0 0
cpu0 400 40 100 2500 5 0 5 0 0 0
cpu1 500 10 200 2500 5 0 0 0 0 0
intr 12345
ctxt 999
"""


def test_busy_seconds_counts_user_nice_system_irq_softirq_of_the_named_cpus():
    assert busy_seconds(STAT, None, 100.0) == pytest.approx((400 + 40 + 100 + 5 + 500 + 10 + 200) / 100)
    assert busy_seconds(STAT, {1}, 100.0) == pytest.approx(7.1)
    assert busy_seconds(STAT, {7}, 100.0) is None


def test_others_busy_is_the_machines_cpu_time_less_our_own_over_the_wall_time():
    assert others_busy(Sample(0.0, 10.0, 4.0), Sample(2.0, 13.0, 5.0)) == pytest.approx(1.0)
    assert others_busy(Sample(0.0, 10.0, 4.0), Sample(1.0, 10.5, 5.0)) == 0.0  # tick rounding never goes negative
    assert others_busy(Sample(1.0, 0, 0), Sample(1.0, 5, 0)) == 0.0


def test_two_cpus_beside_one_busy_program_generate_with_one_thread_and_take_the_second_back_after():
    assert share_threads(2, 2, 0.67) == 1  # 3 runnable threads on 2 CPUs: a busy loop gets 2/3 of one
    assert share_threads(2, 1, 1.0) == 1  # the loop takes the CPU left to it: stay
    assert share_threads(2, 1, 0.4) == 1  # near the threshold: no switching back and forth
    assert share_threads(2, 1, 0.1) == 2
    assert share_threads(2, 2, 0.3) == 2  # a light neighbour (a shell, an editor) changes nothing
    assert share_threads(8, 8, 3.0) == 5


@given(cap=st.integers(1, 64), current=st.integers(1, 64), others=st.floats(0, 80, allow_nan=False))
def test_share_threads_stays_in_range_settles_in_one_step_and_never_adds_threads_for_busier_neighbours(
        cap, current, others):
    got = share_threads(cap, current, others)
    assert 1 <= got <= cap
    assert share_threads(cap, got, others) == got  # the same neighbours again: no change
    assert share_threads(cap, current, others + 0.5) <= got
    if others == 0:
        assert got == cap


def test_share_decides_from_successive_samples_and_says_a_change_once(monkeypatch):
    monkeypatch.setattr(cpu_share, "INTERVAL_S", 0.0)
    samples = iter([Sample(0.0, 0.0, 0.0), Sample(1.0, 2.0, 1.0), Sample(2.0, 4.0, 2.0), Sample(3.0, 4.9, 2.9)])
    share = Share(2, sampler=lambda: next(samples))  # its first sample: when the process chose its threads
    threads, line = share.decide()  # the others took 1 CPU
    assert threads == 1 and line == "threads: 1 for generation now (other programs keep 1.0 of 2 CPUs busy; updates keep 2)"
    assert share.decide() == (1, None)
    assert share.decide() == (2, None)  # free again: taken back (said at most once a minute)
    assert share.changes == 2


@pytest.fixture(scope="module")
def engine():
    torch.manual_seed(0)
    return HFEngine(load_model("tiny-random"), load_tokenizer("tiny-random"), max_batch_size=8)


def generate(engine, share):
    seen: list[int] = []
    hook = engine.model.register_forward_pre_hook(lambda *_: seen.append(torch.get_num_threads()))
    out: list = []
    engine._net = None
    try:
        from ctu.engines import cpu_threads

        real = cpu_threads.generation_share
        cpu_threads.generation_share = lambda: share  # type: ignore[assignment]
        worker = threading.Thread(target=lambda: out.append(engine.generate_sync(
            [[1, 520, 33, 88], [1, 77, 4000, 5]], SamplingParams(max_tokens=10, temperature=1.0, seed=7, n=2))))
        worker.start()
        worker.join()
    finally:
        cpu_threads.generation_share = real  # type: ignore[assignment]
        hook.remove()
    return [(c.token_ids, c.logprobs) for cs in out[0] for c in cs], seen


class Busy(Share):
    """Other programs take all but one CPU, from the first decode step on."""

    def decide(self):
        return 1, None


def test_generation_beside_busy_programs_runs_on_one_thread_with_the_same_tokens_and_gives_the_thread_back(engine):
    torch.set_num_threads(2)
    fixed, threads_fixed = generate(engine, None)
    shared, threads_shared = generate(engine, Busy(2))
    assert set(threads_fixed) == {2}
    assert set(threads_shared) == {1}, "the generating thread kept its threads beside busy programs"
    assert shared == fixed  # a forward pass gives the same logits with 1 or 2 threads: the same tokens
    assert torch.get_num_threads() == 2  # the trainer's thread kept its count


def test_a_busy_loop_beside_this_process_is_measured_as_about_one_cpu():
    before = cpu_share.sample()
    if before is None:
        pytest.skip("no /proc/stat here")
    loop = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 1.5\nwhile time.time() < end: pass"])
    try:
        time.sleep(1.2)
        after = cpu_share.sample()
    finally:
        loop.wait()
    assert after is not None and others_busy(before, after) >= 0.5  # starting the interpreter takes some of it


@pytest.mark.parametrize("mode", ["", "share"])
def test_updates_keep_their_threads_unless_the_user_lets_them_share(monkeypatch, mode):
    from ctu.config.schema import load_config
    from ctu.distributed.group import LocalTrainer
    from ctu.engines import cpu_threads
    from tests.unit.train.test_update_semantics import samples

    monkeypatch.setattr(cpu_threads, "_applied", cpu_threads.choose(2, None, {"CTU_CPU_THREADS": mode}))
    monkeypatch.setattr(cpu_threads, "_share", Busy(2, training=mode == "share"))
    trainer = LocalTrainer(load_config(None, ["model.path=tiny-random", "model.dtype=float32",
                                              "trainer.micro_batch_tokens=4096"]), device="cpu")
    seen: list[int] = []
    embedding = next(m for m in trainer.policy.model.modules() if isinstance(m, torch.nn.Embedding))
    embedding.register_forward_pre_hook(lambda *_: seen.append(torch.get_num_threads()))
    torch.set_num_threads(2)
    try:
        trainer.update(samples(seed=0, n=2), 1.0, seed=0)
    finally:
        torch.set_num_threads(2)
    assert set(seen) == ({1} if mode == "share" else {2})


def test_refresh_is_not_fooled_by_a_count_sharing_lowered(monkeypatch):
    from ctu.engines import cpu_threads

    monkeypatch.setattr(cpu_threads, "_applied", cpu_threads.choose(2, None, {"CTU_CPU_THREADS": "share"}))
    monkeypatch.setattr(cpu_threads, "affinity_cpus", lambda: 2)
    monkeypatch.setattr(cpu_threads, "cgroup_quota", lambda: None)
    torch.set_num_threads(1)  # lowered beside a busy program
    try:
        assert cpu_threads.refresh() is None  # the CPUs this process may use did not change
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(2)
