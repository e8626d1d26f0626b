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

from ctu.engines.base import SamplingParams
from ctu.engines.cpu import cpu_share
from ctu.engines.cpu.cpu_share import Sample, Share, busy_seconds, others_busy, share_threads
from ctu.engines.hf.engine import HFEngine
from ctu.engines.hf.models import load_model, load_tokenizer

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


@pytest.mark.parametrize(("generation", "updates", "who"), [
    (True, False, "threads: 1 for generation now (other programs keep 1.0 of 2 CPUs busy; the updates keep 2)"),
    (False, True, "threads: 1 for the updates now (other programs keep 1.0 of 2 CPUs busy; generation keeps 2)"),
    (True, True, "threads: 1 now (other programs keep 1.0 of 2 CPUs busy)")])
def test_share_decides_from_successive_samples_and_says_a_change_once(monkeypatch, generation, updates, who):
    """The line names what shares: where generation keeps its threads (a Zen 3's MKL) and the updates share, it
    said "1 for generation now ... updates keep 2", the reverse of what ran."""
    monkeypatch.setattr(cpu_share, "INTERVAL_S", 0.0)
    samples = iter([Sample(0.0, 0.0, 0.0), Sample(1.0, 2.0, 1.0), Sample(2.0, 4.0, 2.0), Sample(3.0, 4.9, 2.9)])
    share = Share(2, sampler=lambda: next(samples))  # its first sample: when the process chose its threads
    share.sharing.update(generation=generation, training=updates)  # what the checks found
    threads, line = share.decide()  # the others took 1 CPU
    assert threads == 1 and line == who
    assert share.decide() == (1, None)
    assert share.decide() == (2, None)  # free again: taken back (said at most once a minute)
    assert share.changes == 2


@pytest.fixture(scope="module")
def engine():
    torch.manual_seed(0)
    return HFEngine(load_model("tiny-random"), load_tokenizer("tiny-random"), max_batch_size=8)


def generate(engine, share, monkeypatch, check=True):
    """Two prompts, 2 samples each, generated in another thread with ``share`` as the process's share (its sharing
    check run first, so that its forwards are not counted); the tokens and logprobs, and each forward's threads."""
    from ctu.engines.cpu import cpu_threads
    if check:
        monkeypatch.setattr(cpu_threads, "_share", share)
        monkeypatch.setattr(cpu_threads, "_invariant", {})
        engine._net = engine.model
        engine._check_sharing()
    seen: list[int] = []
    hook = engine.model.register_forward_pre_hook(lambda *_: seen.append(torch.get_num_threads()))
    out: list = []
    engine._net = None
    try:
        worker = threading.Thread(target=lambda: out.append(engine.generate_sync(
            [[1, 520, 33, 88], [1, 77, 4000, 5]], SamplingParams(max_tokens=10, temperature=1.0, seed=7, n=2))))
        worker.start()
        worker.join()
    finally:
        hook.remove()
    return [(c.token_ids, c.logprobs) for cs in out[0] for c in cs], seen


class Busy(Share):
    """Other programs take all but one CPU, from the first decode step on."""

    def decide(self):
        return 1, None

    def peek(self):
        return 1


class Quiet(Share):
    """Nothing else runs."""

    def decide(self):
        return self.cap, None

    def peek(self):
        return self.cap


def test_a_quiet_machine_never_runs_the_sharing_checks(engine, monkeypatch):
    """Each check runs its pass at the full count and at every count sharing could pick: 19 s of the 13.5-minute
    quickstart on a 2-core Zen 4 (the updates' 13.4 s, generation's 5.6 s) and the probe's activations at the run's
    peak RSS, for an answer nothing asks while no other program is busy."""
    from ctu.config.schema import load_config
    from ctu.distributed.group import LocalTrainer
    from ctu.engines.cpu import cpu_threads
    from tests.unit.train.test_update_semantics import samples

    monkeypatch.setattr(cpu_threads, "_applied", cpu_threads.choose(2, None, {}))
    monkeypatch.setattr(cpu_threads, "_share", Quiet(2))
    monkeypatch.setattr(cpu_threads, "_invariant", {})
    monkeypatch.setattr(cpu_threads, "check", lambda *_: pytest.fail("a sharing check ran on a quiet machine"))
    torch.set_num_threads(2)
    _, threads = generate(engine, None, monkeypatch, check=False)
    torch.manual_seed(0)
    trainer = LocalTrainer(load_config(None, ["model.path=tiny-random", "model.dtype=float32"]), device="cpu")
    trainer.update(samples(seed=0, n=2), 1.0, seed=0)
    assert set(threads) == {2} and cpu_threads._invariant == {}


def test_each_check_runs_when_other_programs_first_take_a_cpu(engine, monkeypatch):
    """Then generation and the updates share only where their check found the same bits, as before."""
    from ctu.config.schema import load_config
    from ctu.distributed.group import LocalTrainer
    from ctu.engines.cpu import cpu_threads
    from tests.unit.train.test_update_semantics import samples

    monkeypatch.setattr(cpu_threads, "_applied", cpu_threads.choose(2, None, {}))
    monkeypatch.setattr(cpu_threads, "_share", Busy(2))
    monkeypatch.setattr(cpu_threads, "_invariant", {})
    torch.set_num_threads(2)
    try:
        _, threads = generate(engine, None, monkeypatch, check=False)
        assert "generation" in cpu_threads._invariant, "generation shared (or kept its threads) unchecked"
        assert threads[-1] == (1 if cpu_threads._invariant["generation"] else 2)  # the check's forwards ran first
        torch.manual_seed(0)
        trainer = LocalTrainer(load_config(None, ["model.path=tiny-random", "model.dtype=float32"]), device="cpu")
        trainer.update(samples(seed=0, n=2), 1.0, seed=0)
        assert "training" in cpu_threads._invariant, "the updates never checked whether they may share"
    finally:
        torch.set_num_threads(2)


def test_generation_beside_busy_programs_shares_only_where_fewer_threads_give_the_same_tokens(engine, monkeypatch):
    from ctu.engines.cpu import cpu_threads
    torch.set_num_threads(2)
    fixed, threads_fixed = generate(engine, None, monkeypatch)
    shared, threads_shared = generate(engine, Busy(2), monkeypatch)
    assert set(threads_fixed) == {2}
    assert "generation" in cpu_threads._invariant, "generation shared without checking its logits"
    if cpu_threads._invariant["generation"]:
        assert set(threads_shared) == {1}, "the generating thread kept its threads beside busy programs"
    else:  # this CPU's products sum in another order with fewer threads for this model's shapes
        assert set(threads_shared) == {2}
    assert shared == fixed  # the same tokens and logprobs whatever else runs
    assert torch.get_num_threads() == 2  # the trainer's thread kept its count


def virtual_blas(monkeypatch, differ, full: int) -> None:
    """A BLAS whose products of ``differ`` rows change their last bit on fewer than ``full`` threads, the thread
    counts kept apart from torch's: this CPU's own kernels run alike on every count."""
    real = torch.nn.functional.linear
    count = [full]

    def blas(x, w, b=None):
        y = real(x, w, b)
        if x.numel() // x.shape[-1] in differ and count[0] < full:
            y = torch.nextafter(y, torch.full_like(y, float("inf")))  # the last bit
        return y

    monkeypatch.setattr(torch.nn.functional, "linear", blas)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: count.__setitem__(0, n))
    monkeypatch.setattr(torch, "get_num_threads", lambda: count[0])


@pytest.mark.parametrize("differ", [(5, 6, 7), ()])
def test_generation_keeps_its_threads_where_fewer_change_a_smaller_batchs_products(engine, monkeypatch, differ):
    """As MKL on a Zen 3 EPYC: fp32 products of 5-7 rows sum in another order on fewer threads, those of 16 rows do
    not. A decode's batch shrinks as its rows finish, so the check must see every row count, not only a full
    batch's (a check of the full batch alone let generation share there, and a seed's numbers changed)."""
    from ctu.engines.cpu import cpu_threads
    virtual_blas(monkeypatch, differ, 2)
    monkeypatch.setattr(cpu_threads, "_share", Busy(2))
    monkeypatch.setattr(cpu_threads, "_invariant", {})
    engine._net = engine.model
    try:
        with torch.no_grad():
            engine._check_sharing()
    finally:
        engine._net = None
    assert cpu_threads._invariant == {"generation": not differ}
    assert (cpu_threads.generation_share() is None) == bool(differ)


def test_generations_check_runs_at_the_counts_it_compares_whatever_share_the_engine_last_paced_by(engine, monkeypatch):
    """The check's decode paced itself between steps by the share the engine's last generation left: a quiet share
    set 2 threads back after the first step, the products ran at 2 on both sides and "the same bits" let generation
    share where 5-7-row products differ (README's test command on a Sapphire Rapids)."""
    from ctu.engines.cpu import cpu_threads
    virtual_blas(monkeypatch, (5, 6, 7), 2)
    monkeypatch.setattr(cpu_threads, "_share", Busy(2))
    monkeypatch.setattr(cpu_threads, "_invariant", {})
    engine._net, engine._share = engine.model, Quiet(2)  # what a generation on a quiet machine leaves
    try:
        with torch.no_grad():
            engine._check_sharing()
        assert engine._share is not None  # given back after the probe
    finally:
        engine._net, engine._share = None, None
    assert cpu_threads._invariant == {"generation": False}


def test_a_check_whose_pass_changes_its_own_thread_count_vouches_for_nothing(monkeypatch):
    from ctu.engines.cpu import cpu_threads
    monkeypatch.setattr(cpu_threads, "_share", Busy(2))
    monkeypatch.setattr(cpu_threads, "_invariant", {})
    monkeypatch.setattr(cpu_threads, "_differ_at", {})
    before = torch.get_num_threads()
    try:
        def compute():
            torch.set_num_threads(2)  # as a pass paced back to the full count would
            return [torch.ones(3)]

        line = cpu_threads.check("generation", compute)
    finally:
        torch.set_num_threads(before)
    assert cpu_threads._invariant == {"generation": False} and "keeps 2" in line


def test_generation_that_keeps_its_threads_keeps_them_after_an_update_shared(engine, monkeypatch):
    """A shared update leaves torch's last-set count at 1, and a thread that first computes after it (asyncio's
    workers, new each rollout) would take that count: generation that must keep its threads (its decode differs on
    fewer) decoded on 1 thread beside busy programs, and sampled other tokens than alone."""
    from ctu.engines.cpu import cpu_threads
    monkeypatch.setattr(cpu_threads, "_applied", cpu_threads.choose(2, None, {}))
    torch.set_num_threads(2)
    fixed, _ = generate(engine, None, monkeypatch)
    monkeypatch.setattr(cpu_threads, "_invariant", {"generation": False, "training": True})
    monkeypatch.setattr(cpu_threads, "checked", lambda kind: True)
    monkeypatch.setattr(cpu_threads, "_share", Share(2))
    torch.set_num_threads(1)  # what an update beside a busy program leaves
    try:
        after, threads = generate(engine, cpu_threads._share, monkeypatch, check=False)
    finally:
        torch.set_num_threads(2)
    assert set(threads) == {2}
    assert after == fixed


def test_generation_shares_anyway_when_the_user_says_so(engine, monkeypatch):
    from ctu.engines.cpu import cpu_threads
    torch.set_num_threads(2)
    _, threads = generate(engine, Busy(2, training=True), monkeypatch)  # CTU_CPU_THREADS=share
    assert set(threads) == {1} and "generation" not in cpu_threads._invariant
    assert torch.get_num_threads() == 2


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


def _update_beside_busy(monkeypatch, mode: str):
    """One update of the tiny model beside programs that take a CPU; the thread counts its forwards ran with and the
    trained weights."""
    from ctu.config.schema import load_config
    from ctu.distributed.group import LocalTrainer
    from ctu.engines.cpu import cpu_threads
    from tests.unit.train.test_update_semantics import samples

    monkeypatch.setattr(cpu_threads, "_applied", cpu_threads.choose(2, None, {"CTU_CPU_THREADS": mode}))
    share = Busy(2, training=mode == "share") if mode != "fixed" else None
    monkeypatch.setattr(cpu_threads, "_share", share)
    monkeypatch.setattr(cpu_threads, "_invariant", {})
    torch.manual_seed(0)
    trainer = LocalTrainer(load_config(None, ["model.path=tiny-random", "model.dtype=float32",
                                              "trainer.micro_batch_tokens=4096"]), device="cpu")
    seen: list[int] = []
    embedding = next(m for m in trainer.policy.model.modules() if isinstance(m, torch.nn.Embedding))
    torch.set_num_threads(2)
    trainer._check_threads()  # what update() does first (its forwards are not the update's)
    hook = embedding.register_forward_pre_hook(lambda *_: seen.append(torch.get_num_threads()))
    try:
        trainer.update(samples(seed=0, n=2), 1.0, seed=0)
    finally:
        torch.set_num_threads(2)
        hook.remove()
    return seen, {n: p.detach().clone() for n, p in trainer.policy.model.named_parameters() if p.requires_grad}


def test_updates_share_the_cpus_where_fewer_threads_give_the_same_gradients_and_train_the_same_weights(monkeypatch):
    from ctu.engines.cpu import cpu_threads
    seen_fixed, fixed = _update_beside_busy(monkeypatch, "fixed")
    seen, shared = _update_beside_busy(monkeypatch, "")
    assert set(seen_fixed) == {2}
    assert "training" in cpu_threads._invariant, "the updates never checked whether they may share"
    if not cpu_threads._invariant["training"]:  # this CPU's products sum in another order with fewer threads: they keep 2
        assert set(seen) == {2}
        return
    assert set(seen) == {1}, "the updates kept both threads beside a busy program although fewer give the same gradients"
    assert fixed.keys() == shared.keys()
    assert all(torch.equal(fixed[n], shared[n]) for n in fixed), "sharing changed the trained weights"


def test_updates_share_anyway_when_the_user_says_so(monkeypatch):
    from ctu.engines.cpu import cpu_threads
    seen, _ = _update_beside_busy(monkeypatch, "share")
    assert set(seen) == {1} and "training" not in cpu_threads._invariant  # nothing to check: the user chose


def _check(monkeypatch, gradients):
    from ctu.engines.cpu import cpu_threads
    monkeypatch.setattr(cpu_threads, "_share", Busy(4))
    monkeypatch.setattr(cpu_threads, "_invariant", {})
    before = torch.get_num_threads()
    line = cpu_threads.check("training", gradients)
    assert torch.get_num_threads() == before
    return line, cpu_threads.training_share()


def test_gradients_that_change_with_the_thread_count_keep_the_updates_threads(monkeypatch):
    counts: list[int] = []

    def gradients():
        counts.append(torch.get_num_threads())
        return [torch.tensor([1.0, 2.0]), torch.tensor([0.1 * (torch.get_num_threads() == 3)])]

    line, share = _check(monkeypatch, gradients)
    assert sorted(counts) == [1, 2, 3, 4]  # the full count, then each count sharing would pick on 4 CPUs
    assert share is None and line is not None
    assert "keep 4" in line and "on 3 threads differ" in line and "CTU_CPU_THREADS=share" in line


def test_gradients_the_same_on_every_count_let_the_updates_share(monkeypatch):
    from ctu.engines.cpu import cpu_threads
    line, share = _check(monkeypatch, lambda: [torch.ones(3), torch.zeros(2)])
    assert share is cpu_threads._share and line is not None and "share the CPUs while other programs are busy" in line
    assert cpu_threads.check("training", lambda: pytest.fail("checked twice")) is None


def test_the_probe_leaves_grads_and_random_state_alone():
    from ctu.train.gradient_probe import micro_batch_gradients

    torch.manual_seed(0)
    model = load_model("tiny-random", dtype=torch.float32)
    for p in model.parameters():
        p.requires_grad_(False)
    model.get_output_embeddings().weight.requires_grad_(True)
    state = torch.get_rng_state()
    grads = micro_batch_gradients(model, 64)()
    assert torch.equal(torch.get_rng_state(), state)
    assert all(p.grad is None for p in model.parameters())
    assert grads[0].shape == model.get_output_embeddings().weight.shape and grads[0].abs().sum() > 0


def test_the_probe_scores_an_episodes_share_of_its_tokens_in_one_lm_head_chunk():
    """Like a real micro-batch, where the prompt is most of an episode, the probe scores the last quarter of each
    row's tokens: its logits fit one lm_head chunk (no recompute) and do not raise the run's peak memory."""
    from ctu.train.gradient_probe import micro_batch_gradients
    from ctu.train.logprobs import LOGIT_BUDGET_ATTR

    torch.manual_seed(0)
    model = load_model("tiny-random", dtype=torch.float32)
    vocab = model.get_output_embeddings().out_features
    tokens = 256
    setattr(model, LOGIT_BUDGET_ATTR, tokens * vocab // 2)  # half the micro-batch's logits: one chunk must do
    rows = []
    hook = model.get_output_embeddings().register_forward_hook(
        lambda _m, args, _o: rows.append(args[0].shape[:2]) if args[0].dim() == 3 else None)  # (not the layer sweep)
    try:
        micro_batch_gradients(model, tokens)()
    finally:
        hook.remove()
        delattr(model, LOGIT_BUDGET_ATTR)
    assert len(rows) == 1  # one chunk, kept for backward
    assert rows[0][0] * rows[0][1] <= tokens // 2


def test_the_probes_whole_pass_holds_half_a_micro_batchs_activations():
    """At the run's full micro-batch the probe's activations were the quickstart's largest (peak RSS 3.73 GiB
    against below 3 without it, AVX2 EPYC); the products of larger token counts run in its layer sweep."""
    from ctu.train.gradient_probe import micro_batch_gradients

    torch.manual_seed(0)
    model = load_model("tiny-random", dtype=torch.float32)
    seen = []
    hook = model.get_input_embeddings().register_forward_hook(lambda _m, args, _o: seen.append(args[0].numel()))
    try:
        micro_batch_gradients(model, 256)()
    finally:
        hook.remove()
    assert seen and max(seen) <= 128


def test_refresh_is_not_fooled_by_a_count_sharing_lowered(monkeypatch):
    from ctu.engines.cpu import cpu_threads
    monkeypatch.setattr(cpu_threads, "_applied", cpu_threads.choose(2, None, {"CTU_CPU_THREADS": "share"}))
    monkeypatch.setattr(cpu_threads, "affinity_cpus", lambda: 2)
    monkeypatch.setattr(cpu_threads, "cgroup_quota", lambda: None)
    torch.set_num_threads(1)  # lowered beside a busy program
    try:
        assert cpu_threads.refresh() is None  # the CPUs this process may use did not change
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(2)


@pytest.mark.parametrize("differ, expected", [((5, 6, 7, 37), [(5, 8), (37, 38)]), ((), [])])
def test_the_updates_keep_their_threads_where_fewer_change_another_micro_batch_sizes_products(monkeypatch, differ,
                                                                                            expected):
    """A micro-batch's rows x width is whatever its episodes' lengths make it (mostly one row of ~520 tokens in the
    quickstart), and a BLAS may split the sums of some token counts' products by thread only (MKL on a Zen 3 EPYC:
    5-7 and 9-11 rows). A check of the run's full micro-batch alone (2 x 32 tokens here) let the updates share where
    a smaller one's products, forward or backward, change on fewer threads. One check finds a range and a single
    count apart (each check walks every count to 64 at every thread count: a minute under CI's load)."""
    from ctu.config.schema import load_config
    from ctu.engines.cpu import cpu_threads
    from ctu.train.gradient_probe import micro_batch_gradients
    from ctu.train.policy import build_policy

    torch.manual_seed(0)
    policy = build_policy(load_config(None, ["model.path=tiny-random"]), device="cpu")
    virtual_blas(monkeypatch, differ, 4)
    line, share = _check(monkeypatch, micro_batch_gradients(policy.model, 64))
    # they share, but a pass with products of a differing size keeps its threads
    assert cpu_threads._invariant == {"training": True} and share is not None
    ranges = cpu_threads._differ_at["training"]
    if differ:
        assert ranges["body"] == expected and "except: body products of" in line
        assert all(cpu_threads.keeps("training", "body", n) for n in differ)
        assert not any(cpu_threads.keeps("training", "body", n) for n in (4, 8, 36, 38))
    else:
        assert ranges == {} and "except" not in line


def test_a_pass_with_products_of_a_differing_size_keeps_its_threads(monkeypatch):
    """Where the check found products of 5-7 tokens differ with fewer threads (a Zen 3's MKL), a micro-batch of 6
    tokens, or one whose LM head scores 6 positions, keeps its threads beside a busy program; others share."""
    from ctu.config.schema import load_config
    from ctu.distributed.group import LocalTrainer
    from ctu.engines.cpu import cpu_threads
    torch.manual_seed(0)
    trainer = LocalTrainer(load_config(None, ["model.path=tiny-random"]), device="cpu")
    monkeypatch.setattr(cpu_threads, "_invariant", {"training": True})
    monkeypatch.setattr(cpu_threads, "_differ_at", {"training": {"body": [(5, 8)], "head": [(5, 8)]}})
    monkeypatch.setattr(cpu_threads, "_share", Busy(2))
    seen: list[int] = []  # the count the LM head's products and everything after run at
    hook = trainer.model.get_output_embeddings().register_forward_hook(lambda *_: seen.append(torch.get_num_threads()))
    head = trainer.model.get_output_embeddings()
    try:
        for ids, expect in (([1] * 6, 2), ([1] * 20, 1)):
            torch.set_num_threads(2)
            trainer.model(torch.tensor([ids]))
            assert seen[-1] == expect
        torch.set_num_threads(1)  # a body that shared, then a head of 6 positions
        head(torch.zeros((1, 6, head.in_features)))
        assert seen[-1] == 2
        head(torch.zeros((1, 20, head.in_features)))  # the head never lowers the body's count
        assert seen[-1] == 2
    finally:
        hook.remove()
        torch.set_num_threads(2)


def test_the_probe_runs_each_distinct_layer_on_every_small_count_and_spaced_larger_ones():
    from ctu.config.schema import load_config
    from ctu.train.gradient_probe import layers, row_counts
    from ctu.train.policy import build_policy

    assert row_counts(10, 64, 1.125) == list(range(1, 11))
    counts = row_counts(1024, 64, 1.125)
    assert counts[:64] == list(range(1, 65)) and counts[-1] == 1024
    assert all(b / a <= 1.13 for a, b in zip(counts[63:], counts[64:], strict=False))
    torch.manual_seed(0)
    model = build_policy(load_config(None, ["model.path=tiny-random"]), device="cpu").model
    picked = layers(model)
    assert picked[-1] is model.get_output_embeddings()
    assert all(hasattr(m, "lora_A") for m in picked[:-1])  # the LoRA layers, each with its adapter, once a shape
    shapes = {tuple(m.base_layer.weight.shape) for m in picked[:-1]}
    assert len(shapes) == len(picked) - 1


def test_generation_with_the_trainers_own_model_keeps_its_threads_where_only_the_updates_share(monkeypatch):
    """The in-process engine decodes with the trainer's model, whose forwards ask the updates' share for their
    thread count (a hook on its embeddings): where only the updates share (a Zen 3's MKL), every decode step beside
    a busy program took 1 thread, though generation's check had found its tokens differ on fewer."""
    from ctu.config.schema import load_config
    from ctu.distributed.group import LocalTrainer
    from ctu.engines.cpu import cpu_threads
    torch.manual_seed(0)
    trainer = LocalTrainer(load_config(None, ["model.path=tiny-random"]), device="cpu")
    engine = HFEngine(trainer.model, trainer.tokenizer, max_batch_size=8)
    monkeypatch.setattr(cpu_threads, "_applied", cpu_threads.choose(2, None, {}))
    monkeypatch.setattr(cpu_threads, "_invariant", {"generation": False, "training": True})
    monkeypatch.setattr(cpu_threads, "checked", lambda kind: True)
    monkeypatch.setattr(cpu_threads, "_share", Busy(2))
    torch.set_num_threads(2)
    seen: list[int] = []  # each forward's count after the embeddings' hook
    hook = trainer.model.get_output_embeddings().register_forward_pre_hook(
        lambda *_: seen.append(torch.get_num_threads()))
    try:
        generate(engine, cpu_threads._share, monkeypatch, check=False)
        assert len(seen) > 3 and set(seen) == {2}
        seen.clear()
        trainer.model(torch.tensor([[1, 5, 9]]))  # a trainer pass still shares
        assert seen == [1]
    finally:
        hook.remove()
        torch.set_num_threads(2)


def test_generations_check_runs_over_a_packed_bf16_decode_copy(monkeypatch):
    """The check's products read each Linear's plain weight, which a packed bf16 decode copy had freed: ``ctu
    train`` crashed at its first evaluation whenever other programs were busy (a Sapphire Rapids, two busy loops
    beside README's command). They multiply by the packed layout, as the copy's own steps do."""
    from ctu.engines.cpu import cpu_threads
    from ctu.engines.hf import packed_linear
    monkeypatch.delenv("CTU_NATIVE_BF16", raising=False)  # the default run pins it to 0: ask the CPU itself
    if not packed_linear.available(torch.bfloat16):
        pytest.skip("this CPU does not pack bf16 weights (no AVX512-BF16)")
    torch.manual_seed(0)
    engine = HFEngine(load_model("tiny-random"), load_tokenizer("tiny-random"), max_batch_size=4,
                      decode_dtype="bfloat16")
    monkeypatch.setattr(cpu_threads, "_share", Busy(2))
    monkeypatch.setattr(cpu_threads, "_invariant", {})
    out = engine.generate_sync([[1, 520, 33, 88]], SamplingParams(max_tokens=4, temperature=1.0, seed=7))
    assert len(out[0][0].token_ids) == 4
    assert engine._net is not engine.model and any(getattr(m, "packed", None) is not None for m in engine._net.modules())
    assert "generation" in cpu_threads._invariant  # the check ran over the packed copy, to a verdict
