"""The checks tau2's tools open with, shared: a record looked up or a required value present, else tau2's text.

tau2's tools *return* their refusals (``"Error: Debit card 'x' not found."``) as normal results. A check here
raises :class:`Refusal` with that text instead, and :class:`~.toolkit.Method` answers the call with it: a tool
reads as its steps (``card = debit_card(self, card_id)``) and still answers, and changes the DB, exactly as tau2's.
"""

from __future__ import annotations

import json
from typing import Any

from ctu.domains.banking_knowledge.store import Bank, found, lookup


class Refusal(Exception):
    """A tool's early answer: tau2's returned ``"Error: ..."`` text (a result, not a tool error)."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text


def ensure(condition: object, text: str) -> None:
    """Refuse with ``text`` unless ``condition`` holds (is truthy, as tau2's ``if not ...: return``)."""
    if not condition:
        raise Refusal(text)


def one_of(name: str, value: object, allowed: list) -> None:
    """tau2's ``Error: Invalid <name>. Must be one of: [...]`` unless ``value`` is allowed."""
    ensure(value in allowed, f"Error: Invalid {name}. Must be one of: {allowed}")


def json_arguments(text: Any, **options: Any) -> Any:
    """A discoverable tool call's ``arguments`` parsed (``options``: ``json.loads``'s); bad JSON is refused."""
    try:
        return json.loads(text, **options)
    except json.JSONDecodeError as exc:
        raise Refusal(f"Error: Invalid JSON in arguments: {exc}") from None


def digits(value: Any, count: int, text: str) -> None:
    """Refuse with ``text`` unless ``value`` is exactly ``count`` digits."""
    ensure(value.isdigit() and len(value) == count, text)


def record(self: Bank, table: str, key: Any, missing: str) -> dict:
    """The record ``table[key]``; refused with ``missing`` when there is none."""
    value: Any = self.get(table, key)
    ensure(value is not None, missing)
    return value


def debit_card(self: Bank, card_id: Any) -> dict:
    return record(self, "debit_cards", card_id, f"Error: Debit card '{card_id}' not found.")


def bank_account(self: Bank, account_id: Any) -> dict:
    return record(self, "accounts", account_id, f"Error: Account '{account_id}' not found.")


def check_card_account(self: Bank, account_id: Any) -> None:
    """tau2's existence check on a credit card account: a query on its ``account_id`` field finds it."""
    ensure(found(lookup(self, "credit_card_accounts", "account_id", account_id)),
           f"Error: Credit card account '{account_id}' not found.")


def owned_card(self: Bank, account_id: Any, user_id: Any) -> dict:
    """The credit card account, refused when it does not exist or is not the user's."""
    card = record(self, "credit_card_accounts", account_id, f"Error: Credit card account '{account_id}' not found.")
    ensure(card.get("user_id") == user_id,
           f"Error: Credit card account '{account_id}' does not belong to user '{user_id}'.")
    return card


def card_status(card_id: Any, card: dict, already: str, required: str, verb: str) -> None:
    """tau2's checks before a debit card is ``verb`` (frozen, unfrozen, activated): not already in status
    ``already``, and in status ``required``."""
    status = card.get("status")
    ensure(status != already, f"Error: Debit card '{card_id}' is already {already.lower()}.")
    ensure(status == required, f"Error: Debit card '{card_id}' cannot be {verb}. Current status: {status}. "
                               f"Only {required} cards can be {verb}.")


def linked_account_open(self: Bank, card: dict, verb: str) -> None:
    """A card's checking account, when it has one on record, must still be open before it is ``verb``."""
    account_id = card.get("account_id")
    if account_id and self.has("accounts", account_id):
        ensure(self.get("accounts", account_id).get("status") == "OPEN",  # type: ignore[union-attr]
               f"Error: The linked checking account '{account_id}' is no longer open. Card cannot be {verb}.")
