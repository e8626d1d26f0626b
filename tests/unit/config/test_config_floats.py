"""Every float of the config is finite (or, where the field says so, ``inf`` for "no limit"): NaN and infinities
are refused with one line naming the key, before any model loads. The float fields are found by walking the
config's dataclasses, so a new float field (scalar, Optional, in a list or a dict, in a nested section) is covered
without being listed here."""

import dataclasses
import math
import os
import subprocess
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ctu.app.cli import main
from ctu.config.checks import UNLIMITED, nonfinite_problems
from ctu.config.schema import Config, ConfigError, TrainerConfig, load_config, validate

BAD = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _options(tp):
    """The non-None types of an annotation (``float | None`` -> (float,))."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return tuple(a for a in typing.get_args(tp) if a is not type(None))
    return (tp,)


def float_paths(tp):
    """(path, build) for every float a value of annotation ``tp`` can hold: ``path`` as an error names it
    (``.lr``, ``.mini``, ``[0]``), ``build(v)`` the YAML text of a whole value of ``tp`` holding ``v`` there."""
    for option in _options(tp):
        origin = typing.get_origin(option)
        if option is float:
            yield "", lambda v: v
        elif dataclasses.is_dataclass(option):
            hints = typing.get_type_hints(option)
            for f in dataclasses.fields(option):
                for path, build in float_paths(hints[f.name]):
                    yield f".{f.name}{path}", lambda v, name=f.name, b=build: f"{{{name}: {b(v)}}}"
        elif origin is list:
            for path, build in float_paths(typing.get_args(option)[0]):
                yield f"[0]{path}", lambda v, b=build: f"[{b(v)}]"
        elif origin is dict:
            for path, build in float_paths(typing.get_args(option)[1]):
                yield f".mini{path}", lambda v, b=build: f"{{mini: {b(v)}}}"


def config_floats():
    """dotted key -> the override that puts a value there, for every float of :class:`Config`."""
    hints = typing.get_type_hints(Config)
    return {f"{f.name}{path}": (lambda v, name=f.name, b=build: f"{name}={b(v)}")
            for f in dataclasses.fields(Config) for path, build in float_paths(hints[f.name])}


FLOATS = config_floats()


def test_the_walk_finds_every_kind_of_float_field():
    for key in ("trainer.lr", "trainer.grad_clip", "trainer.dual_clip", "engine.parity_tolerance", "user.timeout",
                "judge.backoff_max", "shaping.max_bonus", "eval.temperature", "sampling.temperature",
                "env.weights.mini", "env.task_weights.mini", "distributed.start_timeout_s", "lora.dropout"):
        assert key in FLOATS, key
    assert len(FLOATS) >= 30


@pytest.mark.parametrize("key", sorted(FLOATS))
@pytest.mark.parametrize("bad", sorted(BAD))
def test_every_float_field_refuses_nan_and_infinities_naming_the_key(key, bad):
    if bad == "inf" and key in UNLIMITED:
        node = load_config(None, [FLOATS[key](".inf")])
        for part in key.split("."):
            node = getattr(node, part)
        assert node == math.inf
        return
    with pytest.raises(ConfigError) as caught:
        load_config(None, [FLOATS[key](bad)])
    message = str(caught.value)
    assert message.startswith(f"{key}: must be a finite number") and message.endswith(f"got {bad}"), message
    assert "\n" not in message


@pytest.mark.parametrize("spelling,shown", [
    (".nan", "nan"), (".NaN", "nan"), ("NaN", "nan"), ("nan", "nan"), ('"nan"', "nan"), ("'NAN'", "nan"),
    (".inf", "inf"), ("+.inf", "inf"), (".Inf", "inf"), ("inf", "inf"), ("Infinity", "inf"), ('"inf"', "inf"),
    ("1e999", "inf"), ("1.0e+999", "inf"),
    ("-.inf", "-inf"), ("-.INF", "-inf"), ("-inf", "-inf"), ("-Infinity", "-inf"), ("'-inf'", "-inf"),
    ("-1e999", "-inf"),
])
def test_every_spelling_of_nan_and_inf_is_refused(spelling, shown):
    with pytest.raises(ConfigError, match=rf"^trainer\.lr: must be a finite number, got {shown}$"):
        load_config(None, [f"trainer.lr={spelling}"])


def test_yaml_file_spellings_are_refused_naming_the_key(tmp_path):
    for text, key in (("trainer:\n  kl_coef: .nan\n", "trainer.kl_coef"),
                      ("eval:\n  temperature: .inf\n", "eval.temperature"),
                      ("user:\n  timeout: -.inf\n", "user.timeout"),
                      ("env:\n  weights:\n    mini: .nan\n", "env.weights.mini")):
        path = tmp_path / "c.yaml"
        path.write_text(text)
        with pytest.raises(ConfigError, match=rf"^{re_key(key)}: must be a finite number"):
            load_config(path)


def re_key(key: str) -> str:
    return key.replace(".", r"\.")


def test_inf_where_it_means_no_limit_is_documented_and_nan_still_refused():
    assert UNLIMITED == {"trainer.grad_clip": "no gradient clipping"}
    assert load_config(None, ["trainer.grad_clip=.inf"]).trainer.grad_clip == math.inf
    with pytest.raises(ConfigError, match=r"^trainer\.grad_clip: must be a finite number or inf \(no gradient "
                                          r"clipping\), got nan$"):
        load_config(None, ["trainer.grad_clip=nan"])


def test_a_config_built_in_code_is_checked_too():
    with pytest.raises(ConfigError, match=r"^trainer\.lr: must be a finite number, got nan$"):
        validate(Config(trainer=TrainerConfig(lr=math.nan)))


@dataclass
class _Inner:
    scale: float = 1.0
    bounds: list[float] = field(default_factory=lambda: [0.0, 1.0])


@dataclass
class _Outer:
    inner: _Inner = field(default_factory=_Inner)
    maybe: float | None = None
    table: dict[str, list[float]] = field(default_factory=dict)
    many: list[_Inner] = field(default_factory=list)
    name: str = "nan"  # a string that reads as NaN is no float


def test_the_check_walks_nested_optional_list_and_dict_floats():
    assert nonfinite_problems(_Outer()) == []
    bad = _Outer(inner=_Inner(scale=math.inf, bounds=[0.0, math.nan]), maybe=-math.inf,
                 table={"a": [1.0, math.nan]}, many=[_Inner(), _Inner(scale=math.nan)])
    assert nonfinite_problems(bad) == [
        "inner.scale: must be a finite number, got inf", "inner.bounds[1]: must be a finite number, got nan",
        "maybe: must be a finite number, got -inf", "table.a[1]: must be a finite number, got nan",
        "many[1].scale: must be a finite number, got nan"]


def test_train_refuses_nan_before_any_model_loads(tmp_path, capsys, monkeypatch):
    import ctu.app.trainer

    def refuse(*_a, **_k):
        raise AssertionError("a model was loaded before the config was refused")

    monkeypatch.setattr(ctu.app.trainer, "build_trainer_group", refuse)
    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained", refuse)
    run_dir = tmp_path / "run"
    assert main(["train", "configs/quickstart.yaml", "trainer.lr=nan", "model.path=tiny-random",
                 f"run.dir={run_dir}"]) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == ["ctu: config error: trainer.lr: must be a finite number, got nan"], err
    assert not run_dir.exists()


def test_train_command_line_fails_fast_naming_the_key(tmp_path):
    """The real command line, in a fresh process: a model path that does not exist shows that nothing was loaded
    (loading it would fail naming the model instead)."""
    env = {**os.environ, "PYTHONPATH": str(Path.cwd())}
    result = subprocess.run([sys.executable, "-m", "ctu", "train", "configs/quickstart.yaml", "trainer.lr=nan",
                             f"model.path={tmp_path / 'no-such-model'}", f"run.dir={tmp_path / 'run'}"],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == ["ctu: config error: trainer.lr: must be a finite number, got nan"]
    assert not (tmp_path / "run").exists()
