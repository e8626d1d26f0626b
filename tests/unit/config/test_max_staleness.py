"""trainer.max_staleness: 0 (the synchronous loop) by default; negative values and a missing trainer.tis_cap are
refused in one line naming the key; every placement takes k > 0."""

import pytest

from ctu.config.schema import ConfigError, load_config


def test_default_is_the_synchronous_loop():
    assert load_config(None, []).trainer.max_staleness == 0
    assert load_config(None, ["trainer.max_staleness=2", "trainer.tis_cap=2.0"]).trainer.max_staleness == 2


@pytest.mark.parametrize(("overrides", "message"), [
    (["trainer.max_staleness=-1"], r"^trainer\.max_staleness: must be >= 0, got -1$"),
    (["trainer.max_staleness=1.5"], r"^trainer\.max_staleness: expected int"),
    (["trainer.max_staleness=1"], r"^trainer\.tis_cap: trainer\.max_staleness=1 trains on tokens sampled by older"),
    (["trainer.max_staleness=1", "trainer.tis_cap=0.5"], r"^trainer\.tis_cap: must be >= 1 .*replayed demonstration"),
    (["trainer.tis_cap=1e-3"], r"^trainer\.tis_cap: must be >= 1"),
])
def test_bad_values_are_one_line_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message) as info:
        load_config(None, overrides)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("placement", [["engine.kind=vllm"], ["distributed.rollout_workers=2"],
                                       ["distributed.trainer_workers=2"], ["agent.command=python agent.py"],
                                       ["engine.kind=served", "engine.launch=true"],
                                       ["distributed.rollout_workers=1", "distributed.trainer_workers=2"]])
def test_every_placement_takes_a_staleness_bound(placement):
    config = load_config(None, ["trainer.max_staleness=1", "trainer.tis_cap=2.0", *placement])
    assert config.trainer.max_staleness == 1
