"""One typed configuration: the dataclasses of :mod:`ctu.config.fields` read from YAML with dotted ``a.b.c=value``
overrides.

Unknown keys, wrong types and inconsistent values fail before any work, with a message
naming the key. ``save`` writes the resolved config with secrets removed.

Imports point one way inside the package: ``fields`` <- ``derived`` <- ``checks`` <- ``schema``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml

from ctu.config.atomic import atomic_write_text
from ctu.config.checks import config_problems, training_problems
from ctu.config.derived import engines_sleep, weight_sync_mode
from ctu.config.fields import (
    AgentConfig,
    ChatAPIBudget,
    Config,
    DistributedConfig,
    EngineConfig,
    EnvConfig,
    EvalConfig,
    FilterConfig,
    JudgeConfig,
    LoraConfig,
    ModelConfig,
    RunConfig,
    SamplingConfig,
    ShapingConfig,
    TrainerConfig,
    UserConfig,
    WandbConfig,
)
from ctu.config.redact import redact_data, remember_in
from ctu.config.yaml_load import ConfigError, read_config_file, set_dotted
from ctu.config.yaml_load import parse_override as parse_override  # re-exported

# the config's classes and what derives from them are imported from here
__all__ = [
    "AgentConfig",
    "ChatAPIBudget",
    "Config",
    "ConfigError",
    "DistributedConfig",
    "EngineConfig",
    "EnvConfig",
    "EvalConfig",
    "FilterConfig",
    "JudgeConfig",
    "LoraConfig",
    "ModelConfig",
    "RunConfig",
    "SamplingConfig",
    "ShapingConfig",
    "TrainerConfig",
    "UserConfig",
    "WandbConfig",
    "engines_sleep",
    "load_config",
    "parse_override",
    "save_config",
    "to_dict",
    "training_problems",
    "validate",
    "weight_sync_mode",
]


# ------------------------------------------------------------------------------------
# loading
# ------------------------------------------------------------------------------------


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against annotation ``tp`` (ints are accepted for floats)."""
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        options = get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0])
    if origin is Literal:
        if isinstance(value, bool) and ("on" if value else "off") in get_args(tp):
            return "on" if value else "off"  # YAML 1.1 reads a bare on/off as a bool
        if isinstance(value, bool) or value not in get_args(tp):
            allowed = ", ".join(repr(v) for v in get_args(tp))
            raise ConfigError(f"{key}: must be one of {allowed}, got {value!r}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {type(value).__name__} {value!r}")
        (item,) = get_args(tp)
        return [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__} {value!r}")
        _, val_tp = get_args(tp)
        return {str(k): _coerce(v, val_tp, f"{key}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return _build(typing.cast(type, tp), value, key)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):  # YAML 1.1 reads 1e-5 as a string
        try:
            return float(value)
        except ValueError:
            pass
    if tp is Any or (isinstance(tp, type) and isinstance(value, tp) and not (tp is int and isinstance(value, bool))):
        return value
    raise ConfigError(f"{key}: expected {_type_name(tp)}, got {type(value).__name__} {value!r}")


def _build(cls: type, data: Any, prefix: str = "") -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        where = f"{prefix}." if prefix else ""
        raise ConfigError(f"unknown key '{where}{unknown[0]}' (known: {', '.join(sorted(names))})")
    kwargs = {name: _coerce(value, hints[name], f"{prefix}.{name}" if prefix else name) for name, value in data.items()}
    return cls(**kwargs)


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (), cls: type = Config) -> Config:
    """Read YAML (optional), apply overrides, type-check, validate."""
    tree: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist")
        tree = read_config_file(p) or {}
        if not isinstance(tree, dict):
            raise ConfigError(f"{p}: the top level must be a mapping")
    for text in overrides:
        key, value = parse_override(text)
        set_dotted(tree, key, value)
    remember_in(tree)  # first: the credentials in its URLs never show, even in its errors
    config: Config = _build(cls, tree)
    validate(config)
    return config


def validate(config: Any) -> None:
    """Cross-field checks (``ctu.config.checks.config_problems``); the first problem is raised, naming its key."""
    for problem in config_problems(config):
        raise ConfigError(problem)


def to_dict(config: Any) -> dict[str, Any]:
    """The config as plain data with secrets removed (``ctu.config.redact.redact_data``: names of env vars are kept, values
    never; URLs lose their userinfo and secret query values)."""
    return typing.cast(dict[str, Any], redact_data(dataclasses.asdict(config)))


def save_config(config: Any, path: str | Path) -> None:
    """Written whole or not at all (a full disk or ``ulimit -f`` leaves no cut file; the error names ``path``)."""
    atomic_write_text(path, yaml.safe_dump(to_dict(config), sort_keys=False))
