"""Domains: retail, airline, telecom and banking_knowledge (tau2-bench semantics over tau2's data files), and mini.

Your own domain: name it ``package.module:function`` in ``env.domains``; ``function(data_dir)`` returns a
:class:`~ctu.domains.base.Domain`.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterable

from ctu.domains.base import Domain

DOMAINS = ("mini", "retail", "airline", "telecom", "banking_knowledge")


def get_domain(name: str, data_dir: str | None = None, retrieval_variant: str | None = None) -> Domain:
    """Load a domain by name or ``module:function`` (cached: the base DB is shared read-only by all episodes).

    ``retrieval_variant`` (config key ``env.retrieval_variant``) picks banking_knowledge's knowledge-base access
    (default ``bm25``); other domains have none and ignore it (one cached domain whatever it says).
    """
    variant = (retrieval_variant or "bm25") if name == "banking_knowledge" else None
    return _load_domain(name, data_dir, variant)


@functools.cache
def _load_domain(name: str, data_dir: str | None, retrieval_variant: str | None) -> Domain:
    if ":" in name:
        return _load_custom(name, data_dir)
    if name not in DOMAINS:
        raise KeyError(f"unknown domain '{name}' (known: {', '.join(DOMAINS)})")
    module = importlib.import_module(f"ctu.domains.{name}")
    if name == "banking_knowledge":
        return module.load(data_dir, retrieval_variant)
    return module.load(data_dir)


get_domain.cache_clear = _load_domain.cache_clear  # type: ignore[attr-defined]


def registered_domain(name: object, data_dir: str | None = None, retrieval_variant: str | None = None,
                      registered: Iterable[str] = ()) -> Domain:
    """The domain a data file names (a transcript line, a trajectory, a parquet row): a built-in one, or one of
    ``registered`` (the ``module:function`` names the run's config or command line gave). Nothing named only by the
    data is imported: a data line's ``"shutil:rmtree"`` is a :class:`KeyError`, never a call."""
    allowed = set(registered)
    if not isinstance(name, str) or (name not in DOMAINS and name not in allowed):
        custom = sorted(n for n in allowed if n not in DOMAINS)
        also = f"; or one the config or command line names ({', '.join(custom)})" if custom else \
            "; a custom domain (package.module:function) is named by the config or command line, never by a data file"
        raise KeyError(f"unknown domain {repr(name)[:200]} "
                       f"(a data file may name: {', '.join(DOMAINS)}{also})")
    return get_domain(name, data_dir, retrieval_variant)


def _load_custom(spec: str, data_dir: str | None) -> Domain:
    module_name, _, attr = spec.partition(":")
    try:
        loader = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise KeyError(f"domain '{spec}': cannot load {attr!r} from module {module_name!r} ({exc})") from exc
    if not callable(loader):
        raise TypeError(f"domain '{spec}': {attr} is not callable (expected a function returning a Domain)")
    domain = loader(data_dir)
    if not isinstance(domain, Domain):
        raise TypeError(f"domain '{spec}': {attr}() returned {type(domain).__name__}, not a ctu Domain")
    return domain
