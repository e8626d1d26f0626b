"""The example domain of docs/your-domain.md (examples/library/domain.py) is one that ctu accepts: ``ctu env check``
replays every task's gold actions to reward 1.0, a config naming it validates, and a task whose gold actions miss
its assertion is caught."""

from __future__ import annotations

import dataclasses

import pytest

from ctu.app.cli import main
from ctu.config.schema import load_config
from ctu.domains import get_domain

SPEC = "examples.library.domain:load"


def test_env_check_accepts_the_example_domain(capsys):
    assert main(["env", "check", SPEC]) == 0
    assert "8/8 tasks pass on gold actions" in capsys.readouterr().out


def test_a_config_naming_the_example_domain_validates_and_it_has_both_splits():
    config = load_config("configs/quickstart.yaml", [f"env.domains=[{SPEC}]"])
    domain = get_domain(config.env.domains[0])
    assert domain.name == "library" and domain.split("train") and domain.split("test")


def test_env_check_fails_a_task_whose_gold_actions_miss_its_assertion(monkeypatch, capsys):
    from examples.library import domain as library

    broken = dataclasses.replace(library.TASKS[0], actions=library.TASKS[0].actions[:1])  # looks the member up only
    monkeypatch.setattr(library, "TASKS", (broken, *library.TASKS[1:]))
    get_domain.cache_clear()
    try:
        assert main(["env", "check", SPEC]) == 1
        assert "lend-dune: FAIL" in capsys.readouterr().out
    finally:
        get_domain.cache_clear()


def test_env_check_still_refuses_an_unknown_built_in_name(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["env", "check", "nowhere"])
    assert exit_.value.code == 2
    assert "invalid choice: 'nowhere'" in capsys.readouterr().err
