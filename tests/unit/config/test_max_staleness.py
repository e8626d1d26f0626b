"""trainer.max_staleness: 0 (the synchronous loop) by default; negative values and set-ups the background
rollout worker does not run are refused in one line naming the key."""

import pytest

from ctu.config.schema import ConfigError, load_config


def test_default_is_the_synchronous_loop():
    assert load_config(None, []).trainer.max_staleness == 0
    assert load_config(None, ["trainer.max_staleness=2", "trainer.tis_cap=2.0"]).trainer.max_staleness == 2


@pytest.mark.parametrize(("overrides", "message"), [
    (["trainer.max_staleness=-1"], r"^trainer\.max_staleness: must be >= 0, got -1$"),
    (["trainer.max_staleness=1.5"], r"^trainer\.max_staleness: expected int"),
    (["trainer.max_staleness=1", "engine.kind=vllm"], r"^trainer\.max_staleness: .*engine\.kind=hf"),
    (["trainer.max_staleness=1", "distributed.rollout_workers=2"], r"^trainer\.max_staleness: .*rollout_workers=0"),
    (["trainer.max_staleness=1", "distributed.trainer_workers=2"], r"^trainer\.max_staleness: .*trainer_workers=0"),
    (["trainer.max_staleness=1"], r"^trainer\.tis_cap: trainer\.max_staleness=1 trains on tokens sampled by older"),
])
def test_bad_values_are_one_line_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message) as info:
        load_config(None, overrides)
    assert "\n" not in str(info.value)
