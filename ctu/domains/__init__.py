"""Domains: retail and airline (tau2-bench semantics over tau2's data files), and mini."""

from __future__ import annotations

import functools
import importlib

from ctu.domains.base import Domain

DOMAINS = ("mini", "retail", "airline")


@functools.cache
def get_domain(name: str, data_dir: str | None = None) -> Domain:
    """Load a domain by name (cached: the base DB is shared read-only by all episodes)."""
    if name not in DOMAINS:
        raise KeyError(f"unknown domain '{name}' (known: {', '.join(DOMAINS)})")
    module = importlib.import_module(f"ctu.domains.{name}")
    return module.load(data_dir)
