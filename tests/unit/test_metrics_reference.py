"""docs/metrics.md documents exactly the keys a training step can write to metrics.jsonl (and W&B): the keys are read
out of the code (scripts/metrics_reference.py: the record ``Trainer.train_step`` builds and where each of its
sections is made), so a metric added or renamed without a line on the page, or a documented one the code dropped,
fails here."""

from __future__ import annotations

import ast

import pytest

from scripts import metrics_reference as ref


def test_every_logged_key_is_documented_and_every_documented_key_is_logged():
    code, docs = ref.code_keys(), ref.documented_keys()
    assert {"rollout/reward", "train/loss", "sync/logprob_max_abs_diff", "async/staleness_max",
            "per_domain/<domain>/success", "rollout/stop_reasons/<stop_reason>"} <= code
    assert not code - docs, f"logged but not in docs/metrics.md: {sorted(code - docs)}"
    assert not docs - code, f"in docs/metrics.md but no longer logged: {sorted(docs - code)}"


def test_the_collector_reads_spread_conditional_and_formatted_keys():
    source = ('x = {"a": 1, **({"b": 2} if c else {}), f"e/{scope.name}/s": 3}\n'
              'y = {"n": distribution(z), "m": {d.name: {"r": 1} for d in ds}}\n')
    x, y = (ast.parse(source).body[i].value for i in (0, 1))
    assert [k for k, _ in ref._dict_keys(x)] == ["a", "b", "e/<name>/s"]
    assert ref._section("rollout", y) == {"rollout/n/<stop_reason>", "rollout/m"}
    assert ref._section("per_domain", y.values[1]) == {"per_domain/<domain>/r"}
    with pytest.raises(ValueError, match="SECTIONS does not know"):
        ref._section("brand_new", None)


def test_documented_keys_are_the_tables_first_column():
    page = ("| key | meaning |\n|---|---|\n| `a/b`, `a/c` | uses `x/y` in its text |\n"
            "Prose naming `p/q`.\n| `train/loss` | — |\n")
    assert ref.documented_keys(page) == {"a/b", "a/c", "train/loss"}
