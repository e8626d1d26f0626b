"""Deterministic record ids and the domain's fixed clock (tau2 banking_knowledge's, so DB hashes match).

Every id is a prefix and the first bytes of a SHA-256 of a seed string; the seeds name the record's
defining fields in a fixed order. "Today" is 11/14/2025, "now" 2025-11-14 03:40:00 (EST).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from typing import Any

NOW = dt.datetime(2025, 11, 14, 3, 40, 0)
TODAY = NOW.strftime("%m/%d/%Y")  # 11/14/2025
CURRENT_TIME = "2025-11-14 03:40:00 EST"


def hex_id(seed: str, length: int = 16) -> str:
    """The first ``length`` hex digits (``length // 2`` bytes) of the seed's SHA-256."""
    return hashlib.sha256(seed.encode()).digest()[: length // 2].hex()


def transaction_id(user_id: Any, card_type: Any, merchant: Any, amount: Any, category: Any) -> str:
    return "txn_" + hex_id(":".join(["transaction", user_id, card_type, merchant, f"{amount:.2f}", category]), 12)


def referral_id(referrer_id: Any, account_type: Any) -> str:
    return hex_id(":".join(["referral", referrer_id, account_type]))


def application_id(card_type: Any, name: Any, income: Any, subscription: Any) -> str:
    return hex_id(f"credit_card:{card_type}:{name}:{income}:{subscription}")


def verification_id(user_id: Any, time_verified: Any) -> str:
    return f"{user_id}_{time_verified.replace(' ', '_').replace(':', '').replace('-', '')}"


def user_tool_record_id(tool_name: Any) -> str:
    return hex_id(f"user_discoverable_tool:{tool_name}")


def user_tool_call_id(tool_name: str, arguments: dict[str, Any]) -> str:
    return hex_id(f"user_discoverable_tool_call:{tool_name}:{json.dumps(arguments, sort_keys=True)}")


def agent_tool_record_id(tool_name: str) -> str:
    return hex_id(f"agent_discoverable_tool:{tool_name}")


def dispute_id(user_id: Any, transaction: Any) -> str:
    return "dsp_" + hex_id(f"dispute:{user_id}:{transaction}", 12)


def referral_link_id(user_id: Any, card_name: Any) -> str:
    return hex_id(f"referral_link:{user_id}:{card_name}")


def credit_card_order_id(account_id: Any, user_id: Any, reason: Any) -> str:
    return "ccord_" + hex_id(f"credit_card_order:{account_id}:{user_id}:{reason}", 12)


def closure_reason_id(account_id: Any, user_id: Any) -> str:
    return "clsr_" + hex_id(f"closure_reason:{account_id}:{user_id}", 12)


def account_flag_id(account_id: Any, flag_type: Any, expiration_date: Any) -> str:
    return "ccflag_" + hex_id(f"account_flag:{account_id}:{flag_type}:{expiration_date}", 12)


def credit_limit_request_id(account_id: Any, user_id: Any, amount: Any) -> str:
    return "cli_" + hex_id(f"cli_request:{account_id}:{user_id}:{amount:.2f}", 12)


def debit_card_order_id(account_id: Any, user_id: Any, delivery_option: Any) -> str:
    return "dcord_" + hex_id(f"debit_card_order:{account_id}:{user_id}:{delivery_option}", 12)


def debit_card_id(account_id: Any, user_id: Any, issue_date: Any) -> str:
    return "dbc_" + hex_id(f"debit_card:{account_id}:{user_id}:{issue_date}", 12)
