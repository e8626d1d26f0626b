"""The oracle tier's setup: no network (tau2's litellm would fetch a price list at import), quiet tau2 logs, and a
summary of how many transcripts each domain drew and how ctu and tau2 scored them."""

from __future__ import annotations

import os
import socket
from collections import defaultdict

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm reads its bundled copy, no download
os.environ.setdefault("LITELLM_LOG", "ERROR")

NETWORK_ATTEMPTS: list[str] = []
_connect = socket.socket.connect


def _no_network(self, address):
    if isinstance(address, tuple) and address and address[0] not in ("127.0.0.1", "::1", "localhost"):
        NETWORK_ATTEMPTS.append(repr(address))
        raise OSError(f"the oracle tier makes no network calls (tried {address!r})")
    return _connect(self, address)


socket.socket.connect = _no_network

# domain -> kind -> {transcript key: tau2 reward}; a transcript hypothesis replays counts once
SEEN: dict[str, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
DISAGREEMENTS: list[str] = []


def record(domain: str, kind: str, key: str, reward: float, agreed: bool, what: str = "") -> None:
    if key not in SEEN[domain][kind] and not agreed:
        DISAGREEMENTS.append(f"{domain} {kind}: {what}")
    SEEN[domain][kind][key] = reward


def pytest_configure(config: pytest.Config) -> None:
    try:
        from loguru import logger
    except ImportError:
        return
    logger.remove()  # tau2 logs every tool response at DEBUG


def pytest_terminal_summary(terminalreporter) -> None:
    if not SEEN and not NETWORK_ATTEMPTS:
        return
    write = terminalreporter.write_line
    write("oracle (ctu vs tau2's own evaluator):")
    for domain, kinds in SEEN.items():
        rewards = [r for k in kinds.values() for r in k.values()]
        write(f"  {domain}: {len(rewards)} transcripts ({sum(r == 1.0 for r in rewards)} reward 1.0, "
              f"{sum(r == 0.0 for r in rewards)} reward 0.0) over {len(kinds)} kinds")
        for kind in sorted(kinds, key=lambda k: -len(kinds[k]))[:12]:
            write(f"      {kind}: {len(kinds[kind])}")
    write(f"  disagreements: {len(DISAGREEMENTS)}")
    for line in DISAGREEMENTS[:20]:
        write(f"    {line}")
    write(f"  network attempts: {len(NETWORK_ATTEMPTS)} {NETWORK_ATTEMPTS[:3]}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if NETWORK_ATTEMPTS and exitstatus == 0:
        session.exitstatus = 1
