"""YAML read strictly for configs: every problem is one line naming the file (or override) and the line.

- A key given twice in one mapping (a second ``trainer:`` block) is refused: YAML keeps only the last, silently.
- Bytes that are not UTF-8 name their line.
- An integer too long for Python to read (more digits than ``sys.get_int_max_str_digits()``) names its line instead
  of Python's "Exceeds the limit (4300 digits) for integer string conversion".
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml


class YamlError(ValueError):
    """A YAML text that cannot be read as a config; the message names where."""


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys and names overlong integers."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = key_node.value
                if key in seen:
                    raise YamlError(f"{_line(key_node)}: key '{key}' appears twice in one mapping (first on line "
                                    f"{seen[key]}); merge them")
                seen[key] = _line(key_node)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        try:
            return super().construct_yaml_int(node)
        except ValueError:
            digits = sum(c.isdigit() for c in node.value)
            raise YamlError(f"{_line(node)}: an integer of {digits} digits: more than Python reads "
                            f"({sys.get_int_max_str_digits()}); no setting needs one this long") from None


_StrictLoader.add_constructor("tag:yaml.org,2002:map", _StrictLoader.construct_yaml_map)  # type: ignore[type-var]
_StrictLoader.add_constructor("tag:yaml.org,2002:int", _StrictLoader.construct_yaml_int)


def load_text(text: str) -> Any:
    """The YAML value of ``text``; a :class:`YamlError` starting with ``LINE:`` for a repeated key or an overlong
    integer, ``yaml.YAMLError`` for text that is not YAML."""
    return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass


def read_yaml(path: Path) -> Any:
    """The YAML value of the file ``path``; every problem is a :class:`YamlError` naming ``path:LINE``."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise YamlError(f"{path}:{line}: not valid UTF-8 (byte 0x{data[exc.start]:02x})") from None
    try:
        return load_text(text)
    except YamlError as exc:
        raise YamlError(f"{path}:{exc}") from None
    except RecursionError:
        raise YamlError(f"{path}: nested too deeply") from None
    except yaml.YAMLError as exc:
        raise YamlError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
