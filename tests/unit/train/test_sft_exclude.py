"""``trainer.sft_exclude``: the warm start leaves out the gold demonstrations of tasks whose description matches
(mini: ``refusal`` — a 135M policy that never reads the order's status refuses at random after refusal demos)."""

import pytest

from ctu.app.trainer import Trainer
from ctu.config.schema import ConfigError, load_config
from ctu.domains.mini import load
from ctu.train.demos import demo_tasks, warm_start_samples


def test_excluded_tasks_give_no_demonstration_and_the_others_all_do(tmp_path):
    config = load_config("configs/quickstart.yaml", ["model.path=tiny-random", f"run.dir={tmp_path}",
                                                     "trainer.sft_exclude=[refusal]"])
    trainer = Trainer(config)
    try:
        train = trainer.domains[0].split("train")
        kept = [t for t in train if not t.description["refusal"]]
        assert 0 < len(kept) < len(train)
        everything = warm_start_samples(trainer.chat, trainer.domains)
        assert len(everything) == len(train)
        seen = []
        real = trainer.group.sft
        trainer.group.sft = lambda demos, batches, on_step=None: seen.append(demos) or real(demos, batches, on_step)
        trainer.config.trainer.sft_steps = 1
        trainer.warm_start()
        assert len(seen) == 1 and len(seen[0]) == len(kept)
        by_ids = {tuple(s.ids) for s in everything}
        assert {tuple(s.ids) for s in seen[0]} <= by_ids
        refusal_ids = {tuple(s.ids) for s, t in zip(everything, train, strict=True) if t.description["refusal"]}
        assert not refusal_ids & {tuple(s.ids) for s in seen[0]}
    finally:
        trainer.lock.release()


def test_field_value_keys_match_like_task_weights():
    mini = load()
    [(domain, tasks)] = demo_tasks([mini], exclude=["kind=status", "kind=return"])
    train = mini.split("train")
    assert domain is mini
    assert [t.id for t in tasks] == [t.id for t in train if t.description["kind"] not in ("status", "return")]
    assert [t.id for t in demo_tasks([mini])[0][1]] == [t.id for t in train]


def test_a_key_no_training_task_matches_is_a_config_error_naming_it(tmp_path):
    with pytest.raises(ConfigError, match=r"trainer\.sft_exclude: refusal=yes matches no training task's description "
                                          r"in mini"):
        Trainer(load_config("configs/quickstart.yaml", ["model.path=tiny-random", f"run.dir={tmp_path}",
                                                        "trainer.sft_exclude=[refusal=yes]"]))


def test_it_applies_to_gold_demonstrations_only(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}\n')
    with pytest.raises(ConfigError, match=r"trainer\.sft_exclude: selects gold demonstrations; it cannot filter "
                                          r"trainer\.sft_data"):
        load_config(None, [f"trainer.sft_data={data}", "trainer.sft_exclude=[refusal]", "trainer.sft_steps=2"])
