"""YAML is loaded with its aliases' expansion bounded: a 'billion laughs' file or override is refused in one line
naming it, at once (it hung `ctu plan` for minutes: every walk of the config visited 9^9 strings)."""

import time

import pytest

from ctu.config.schema import ConfigError, load_config
from ctu.config.yaml_load import MAX_VALUES, load_yaml


def laughs(levels: int = 9) -> str:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    prev = "a"
    for name in "bcdefghijk"[: levels - 1]:
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
        prev = name
    return "\n".join(lines) + "\n"


def test_a_billion_laughs_file_is_refused_at_once_naming_the_file(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(laughs())
    assert len(path.read_bytes()) < 400
    started = time.monotonic()
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert time.monotonic() - started < 5
    text = str(err.value)
    assert str(path) in text and "alias" in text and str(MAX_VALUES) in text.replace(",", "") and "\n" not in text


def test_a_self_referencing_alias_is_refused(tmp_path):
    path = tmp_path / "loop.yaml"
    path.write_text("run: &r\n  dir: x\n  again: *r\n")
    with pytest.raises(ConfigError, match="refers to itself"):
        load_config(path)


def test_an_override_bomb_is_refused_naming_the_override():
    levels = ["a: &a [" + ",".join(["x"] * 9) + "]"]
    levels += [f"k{i}: &k{i} [" + ",".join([f"*{'a' if i == 0 else f'k{i - 1}'}"] * 9) + "]" for i in range(8)]
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"override 'run\.dir'.*alias"):
        load_config(None, ["run.dir={" + ", ".join(levels) + "}"])
    assert time.monotonic() - started < 5


def test_anchors_that_stay_small_still_work(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("common: &c {max_retries: 2, timeout: 5}\nuser: *c\njudge: *c\n")
    with pytest.raises(ConfigError, match="unknown key 'common'"):  # the anchors load; the spare key is refused
        load_config(path)
    assert load_yaml("a: &x [1, 2]\nb: *x\n", "f") == {"a": [1, 2], "b": [1, 2]}
