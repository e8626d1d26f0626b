"""YAML read safely and with its size bounded: :func:`load_yaml`.

``yaml.safe_load`` builds no objects of arbitrary classes, but it shares an anchored node wherever an alias names it:
371 bytes of nested aliases ("billion laughs") load at once as a tree of 9^9 strings that every later walk of the
config (collecting its secrets, checking its types, quoting it in an error) visits one by one. So the loaded tree's
values are counted as aliases expand them, each shared node once (``MAX_VALUES`` at most), and a node that contains
itself is refused.
"""

from __future__ import annotations

from typing import Any

import yaml

MAX_VALUES = 100_000  # scalars, lists and mappings of a config, counted with every alias expanded


class YAMLLoadError(ValueError):
    """Text that is not YAML, or YAML whose aliases expand too far (the message names ``where``)."""


def expanded_size(node: Any, limit: int = MAX_VALUES) -> int:
    """How many values ``node`` holds with every shared (aliased) node counted each time it appears; raises
    :class:`YAMLLoadError` past ``limit`` or for a node inside itself. Shared nodes are sized once (memoized)."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(value: Any) -> int:
        if not isinstance(value, dict | list):
            return 1
        key = id(value)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise YAMLLoadError("an alias refers to itself (a node inside itself)")
        open_nodes.add(key)
        total = 1
        for child in (x for pair in value.items() for x in pair) if isinstance(value, dict) else value:
            total += size(child)
            if total > limit:
                raise YAMLLoadError(f"its aliases expand to more than {limit} values (a YAML alias bomb?); "
                                    "write the values out or use fewer nested aliases")
        open_nodes.discard(key)
        sizes[key] = total
        return total

    try:
        return size(node)
    except RecursionError:
        raise YAMLLoadError("nested too deeply") from None


def load_yaml(text: str, where: str) -> Any:
    """``yaml.safe_load(text)``, refused in one line starting with ``where`` (a file, an override) when it is not
    YAML or its aliases expand past ``MAX_VALUES`` values."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise YAMLLoadError(f"{where}: not valid YAML: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise YAMLLoadError(f"{where}: nested too deeply") from None
    try:
        expanded_size(value)
    except YAMLLoadError as exc:
        raise YAMLLoadError(f"{where}: {exc}") from None
    return value
