"""``trainer.sft_balance``: warm-start batches in equal shares across strata of demonstrations (mini: ``[kind=status]``
— half report-only demos, half writes, where uniform draws gave 20, 29 or 32 status demos of 80 by the seed)."""

import collections
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctu.app.trainer import Trainer
from ctu.config.schema import ConfigError, load_config
from ctu.distributed.group import sft_batches
from ctu.domains.mini import load
from ctu.rollout import components as build
from ctu.train.demos import warm_start_samples


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 40), min_size=1, max_size=4), batch=st.integers(1, 12),
       steps=st.integers(1, 12), seed=st.integers(0, 10))
def test_every_batch_holds_the_strata_in_equal_shares(sizes, batch, steps, seed):
    strata = [k for k, n in enumerate(sizes) for _ in range(n)]
    random.Random(seed).shuffle(strata)
    demos = [object()] * len(strata)
    batches = sft_batches(demos, steps, batch, seed, strata=strata)
    assert len(batches) == steps
    for b in batches:
        assert len(b) == len(set(b)) == min(batch, len(strata))
        if all(n >= batch for n in sizes):  # no stratum runs short inside one batch: shares within one of each other
            counts = collections.Counter(strata[i] for i in b)
            assert max(counts.get(k, 0) for k in range(len(sizes))) - min(counts.get(k, 0)
                                                                           for k in range(len(sizes))) <= 1


def test_a_stratum_is_dealt_in_full_before_any_of_it_repeats():
    strata = [0] * 5 + [1] * 50
    drawn = [i for b in sft_batches([None] * 55, 5, 2, seed=3, strata=strata) for i in b if strata[i] == 0]
    assert sorted(drawn) == list(range(5))


def test_without_strata_the_draws_are_the_uniform_ones_as_before():
    rng = random.Random(7)
    assert sft_batches([None] * 30, 4, 8, 7) == [rng.sample(range(30), 8) for _ in range(4)]


def _mini_demos(balance, exclude=("refusal",)):
    config = load_config("configs/quickstart.yaml", ["model.path=tiny-random"])
    return warm_start_samples(build.build_chat(config), [load()], None, 1024, exclude=exclude, balance=balance)


def test_mini_status_balance_puts_40_status_demos_of_80_in_every_seed():
    demos = _mini_demos(["kind=status"])
    assert collections.Counter(demos.strata) == {0: 63, 1: 126}
    for seed in range(3):
        batches = sft_batches(demos, 10, 8, seed, strata=demos.strata)
        assert [sum(demos.strata[i] == 0 for i in b) for b in batches] == [4] * 10
    assert _mini_demos([]).strata is None


def test_a_key_no_demonstration_matches_is_a_config_error_naming_the_field():
    with pytest.raises(ConfigError, match=r"trainer\.sft_balance: refusal matches no demonstration"):
        _mini_demos(["refusal"])  # every refusal demo is excluded


def test_a_file_cannot_be_balanced(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}\n')
    with pytest.raises(ConfigError, match=r"trainer\.sft_balance: balances gold demonstrations"):
        load_config(None, [f"trainer.sft_data={data}", "trainer.sft_balance=[kind=status]", "trainer.sft_steps=2"])


def test_the_trainer_warm_starts_on_the_balanced_batches(tmp_path):
    config = load_config("configs/quickstart.yaml", ["model.path=tiny-random", f"run.dir={tmp_path}",
                                                     "trainer.sft_balance=[kind=status]", "trainer.sft_steps=3"])
    trainer = Trainer(config)
    try:
        seen = []
        trainer.group.sft = lambda demos, batches, on_step=None: seen.append((demos, batches)) or 0.0
        trainer.warm_start()
        [(demos, batches)] = seen
        assert len(batches) == 3
        assert [sum(demos.strata[i] == 0 for i in b) for b in batches] == [4, 4, 4]
    finally:
        trainer.lock.release()
