"""The retail domain: ctu's implementation of tau2-bench's retail tools over tau2's data files.

Semantics follow tau2-bench's ``domains/retail/tools.py`` exactly, quirks included:
``modify_pending_order_items`` prices every modified item at the *last* new variant's
price and options; refunds credit gift cards immediately (rounded to cents) and are
applied payment by payment, so a missing payment method fails part-way with earlier
credits kept; ``exchange_delivered_order_items`` rounds the price difference while
``modify_pending_order_items`` does not. Records are the JSON tau2's pydantic models dump.
"""

from __future__ import annotations

from ctu.domains.base import Domain
from ctu.domains.retail.tools import ORDER_OPTIONAL_FIELDS, TOOLS
from ctu.domains.tau2_data import read_domain_files

__all__ = ["TOOLS", "load"]


def _as_dumped(db: dict) -> dict:
    """Give every order the optional fields tau2's Order model dumps (None when unset)."""
    for order in db.get("orders", {}).values():
        for name in ORDER_OPTIONAL_FIELDS:
            order.setdefault(name, None)
    return db


def load(data_dir: str | None = None) -> Domain:
    files = read_domain_files("retail", data_dir)
    return Domain(name="retail", policy=files["policy"], tools=TOOLS, db=_as_dumped(files["db"]),
                  tasks=files["tasks"], splits=files["splits"], transfer_tool="transfer_to_human_agents")
