"""The config's text: YAML files (:func:`load_yaml`) and dotted overrides (:func:`parse_override`), read safely and
with their size bounded; :class:`ConfigError`, the one error of a bad configuration.

``yaml.safe_load`` builds no objects of arbitrary classes, but it shares an anchored node wherever an alias names it:
371 bytes of nested aliases ("billion laughs") load at once as a tree of 9^9 strings that every later walk of the
config (collecting its secrets, checking its types, quoting it in an error) visits one by one. So the loaded tree's
values are counted as aliases expand them, each shared node once (``MAX_VALUES`` at most), and a node that contains
itself is refused.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from ctu.config.yaml_read import YamlError, load_text, read_yaml

MAX_VALUES = 100_000  # scalars, lists and mappings of a config, counted with every alias expanded


class ConfigError(ValueError):
    """A bad configuration; the message names the key (or the file, or the override)."""


def expanded_size(node: Any, limit: int = MAX_VALUES) -> int:
    """How many values ``node`` holds with every shared (aliased) node counted each time it appears; raises
    :class:`ConfigError` past ``limit`` or for a node inside itself. Shared nodes are sized once (memoized)."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(value: Any) -> int:
        if not isinstance(value, dict | list):
            return 1
        key = id(value)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise ConfigError("an alias refers to itself (a node inside itself)")
        open_nodes.add(key)
        total = 1
        for child in (x for pair in value.items() for x in pair) if isinstance(value, dict) else value:
            total += size(child)
            if total > limit:
                raise ConfigError(f"its aliases expand to more than {limit} values (a YAML alias bomb?); "
                                    "write the values out or use fewer nested aliases")
        open_nodes.discard(key)
        sizes[key] = total
        return total

    try:
        return size(node)
    except RecursionError:
        raise ConfigError("nested too deeply") from None


def bounded(value: Any, where: str) -> Any:
    """``value``, refused in one line starting with ``where`` when its aliases expand past ``MAX_VALUES`` values."""
    try:
        expanded_size(value)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return value


def read_config_file(path: Path) -> Any:
    """The YAML value of the config file ``path``, read strictly (:mod:`ctu.config.yaml_read`: repeated keys,
    non-UTF-8 bytes and overlong integers name ``path:LINE``) and refused when its aliases expand past
    ``MAX_VALUES`` values."""
    try:
        value = read_yaml(path)
    except YamlError as exc:
        raise ConfigError(str(exc)) from None
    return bounded(value, str(path))


def load_yaml(text: str, where: str) -> Any:
    """The YAML value of ``text``, read strictly, refused in one line starting with ``where`` (a file, an
    override) when it is not YAML or its aliases expand past ``MAX_VALUES`` values."""
    try:
        value = load_text(text)
    except YamlError as exc:
        raise ConfigError(f"{where}:{exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise ConfigError(f"{where}: nested too deeply") from None
    return bounded(value, where)


def set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override '{dotted}': '{part}' is not a section")
        node = child
    node[parts[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """``a.b=value`` -> ("a.b", YAML-parsed value)."""
    if "=" not in text or not re.match(r"^[A-Za-z_][\w.]*=", text):
        raise ConfigError(f"override '{text}' must look like section.key=value")
    key, raw = text.split("=", 1)
    try:
        value = load_text(raw) if raw.strip() else ""
    except YamlError as exc:  # an overlong integer
        raise ConfigError(f"override '{key}': {str(exc).split(': ', 1)[1]}") from None
    except yaml.YAMLError:
        value = raw
    except RecursionError:
        raise ConfigError(f"override '{key}': nested too deeply") from None
    return key, bounded(value, f"override '{key}'")
