"""Discoverable agent tools on a debit card's PIN and limits."""

from __future__ import annotations

import datetime as dt
from typing import Any

from ctu.domains.banking_knowledge import ids
from ctu.domains.banking_knowledge.checks import debit_card, digits, ensure
from ctu.domains.banking_knowledge.debit_cards import check_pin
from ctu.domains.banking_knowledge.store import Bank
from ctu.domains.banking_knowledge.toolkit import discoverable

DEFAULT_ATM_LIMITS = {"blue account": 500, "green account": 600, "light blue account": 400,
                      "green fee-free account": 500, "evergreen account": 750, "bluest account": 1500,
                      "dark green account": 300, "gold years account": 600, "purple account": 1000}
PIN_REMINDER = "Security reminder: Never share your PIN with anyone."


def _check_pin_request(card_id: object, given: str, value: object, label: str, new_pin: object) -> None:
    """The first checks of a PIN reset or change, in tau2's order: card_id, the four digits the customer gives
    (``given``: last_4_digits or current_pin; ``label`` in its error) and new_pin present, those four digits, and
    the new PIN."""
    ensure(all([card_id, value, new_pin]), f"Error: Missing required parameters. Required: card_id, {given}, new_pin.")
    digits(value, 4, f"Error: {label} must be exactly 4 digits.")
    check_pin(new_pin)


@discoverable("write")
def reset_debit_card_pin_6284(self: Bank, card_id: str, last_4_digits: str, new_pin: str) -> str:
    """Reset a debit card PIN when the customer has forgotten it.

    Args:
        card_id (string): The debit card ID to reset PIN for
        last_4_digits (string): Last 4 digits of the card number (for verification)
        new_pin (string): The new 4-digit PIN chosen by the customer

    Returns:
        Debit card PIN reset successfully.
    """
    _check_pin_request(card_id, "last_4_digits", last_4_digits, "Last 4 digits", new_pin)
    card = debit_card(self, card_id)
    ensure(card.get("last_4_digits") == last_4_digits,
           "Error: Card verification failed. The last 4 digits do not match our records.")
    ensure(card.get("status") == "ACTIVE",
           f"Error: Cannot reset PIN. Card status is {card.get('status')}. Only ACTIVE cards can have their PIN reset.")
    self.edit("debit_cards", card_id).update({"pin_last_changed": ids.TODAY, "pin_locked": False,
                                              "pin_attempts_remaining": 3})
    return "\n".join(["Debit Card PIN Reset Successfully", f"Card ID: {card_id}", f"PIN Changed: {ids.TODAY}", "",
                      "The new PIN is effective immediately.", "Your card has been unlocked and is ready to use.",
                      "Customer can use the new PIN for ATM withdrawals and point-of-sale transactions.", "",
                      PIN_REMINDER])


@discoverable("write")
def change_debit_card_pin_6285(self: Bank, card_id: str, current_pin: str, new_pin: str) -> str:
    """Change a debit card PIN when the customer knows their current PIN.

    Args:
        card_id (string): The debit card ID to change PIN for
        current_pin (string): The customer's current 4-digit PIN
        new_pin (string): The new 4-digit PIN chosen by the customer

    Returns:
        Debit card PIN changed successfully.
    """
    _check_pin_request(card_id, "current_pin", current_pin, "Current PIN", new_pin)
    ensure(current_pin != new_pin, "Error: New PIN must be different from current PIN.")
    status = debit_card(self, card_id).get("status")
    ensure(status == "ACTIVE",
           f"Error: Cannot change PIN. Card status is {status}. Only ACTIVE cards can have their PIN changed.")
    self.edit("debit_cards", card_id)["pin_last_changed"] = ids.TODAY
    return "\n".join(["Debit Card PIN Changed Successfully", f"Card ID: {card_id}", f"PIN Changed: {ids.TODAY}", "",
                      "The new PIN is effective immediately.",
                      "Customer can use the new PIN for ATM withdrawals and point-of-sale transactions.", "",
                      PIN_REMINDER])


def _check_limit_card(self: Bank, card_id: object) -> tuple[dict, dict]:
    """tau2's checks on the card and its account before a temporary limit increase: (card, account)."""
    card = debit_card(self, card_id)
    ensure(card.get("status") == "ACTIVE", f"Error: Debit card '{card_id}' is not active. Current status: "
                                           f"{card.get('status')}. Only ACTIVE cards can have limit increases.")
    account_id = card.get("account_id")
    ensure(account_id and self.has("accounts", account_id),
           f"Error: Could not find linked account for debit card '{card_id}'.")
    account: Any = self.get("accounts", account_id)
    ensure(account.get("status") == "OPEN", f"Error: The linked account '{account_id}' is not in good standing. "
                                            f"Account status: {account.get('status')}.")
    opened = account.get("date_opened")
    if opened:
        try:
            age = (dt.datetime.strptime(ids.TODAY, "%m/%d/%Y") - dt.datetime.strptime(opened, "%m/%d/%Y")).days
        except ValueError:
            age = None
        ensure(age is None or not age < 60,
               f"Error: Account must be at least 60 days old for a temporary limit increase. Account age: {age} days.")
    return card, account


def _current_limit(card: dict, account: dict, limit_type: str) -> tuple[Any, str]:
    """(the current limit, its name) for ``limit_type``; an ATM limit defaults from the account level."""
    if limit_type != "atm":
        return card.get("daily_purchase_limit"), "Daily Purchase Limit"
    name = "Daily ATM Withdrawal Limit"
    current = card.get("daily_atm_limit")
    if current is not None:
        return current, name
    level = account.get("level", "").lower()
    ensure("light green" not in level,
           "Error: Light Green Account (teen checking) cards have policy-based limits that cannot be modified. The "
           "daily ATM withdrawal limit of $150 is fixed by account policy for safety reasons. The customer may "
           "request the parent/guardian to withdraw cash from their own account if needed.")
    current = DEFAULT_ATM_LIMITS.get(level)
    ensure(current is not None, f"Error: Could not determine the default ATM limit for account type "
                                f"'{account.get('level')}'. Please verify the account type.")
    return current, name


@discoverable("write")
def request_temporary_debit_card_limit_increase_8374(self: Bank, card_id: str, limit_type: str,
                                                     new_limit: int) -> str:
    """Request a temporary 24-hour increase to a debit card's daily ATM or purchase limit.

    Args:
        card_id (string): The debit card ID to increase limits for
        limit_type (string): Type of limit to increase: 'atm' for daily ATM withdrawal limit, 'purchase' for daily purchase limit
        new_limit (integer): The requested new temporary limit amount in dollars

    Returns:
        Temporary limit increase granted successfully.
    """
    ensure(card_id, "Error: Missing required parameter: card_id.")
    ensure(limit_type, "Error: Missing required parameter: limit_type.")
    ensure(limit_type in ["atm", "purchase"], f"Error: Invalid limit_type '{limit_type}'. Must be 'atm' or 'purchase'.")
    ensure(new_limit is not None, "Error: Missing required parameter: new_limit.")
    try:
        new_limit = float(new_limit)  # type: ignore[assignment]  # tau2 accepts 500.0 for 500
    except (ValueError, TypeError):
        return f"Error: new_limit must be an integer, got '{new_limit}'."
    ensure(new_limit.is_integer(), f"Error: new_limit must be an integer, got '{new_limit}'.")  # type: ignore[attr-defined]
    new_limit = int(new_limit)
    ensure(new_limit > 0, "Error: new_limit must be a positive amount.")
    card, account = _check_limit_card(self, card_id)
    current, name = _current_limit(card, account, limit_type)
    ensure(current is not None, f"Error: The card does not have a {name.lower()} configured. This may be a "
                                f"restricted account type where limits are set by account policy and cannot be "
                                f"modified.")
    ceiling = int(current * 1.5)
    ensure(not new_limit > ceiling, f"Error: Requested limit ${new_limit} exceeds the maximum allowed temporary "
                                    f"increase. Maximum temporary limit is ${ceiling} (150% of current ${current} "
                                    f"limit).")
    ensure(not new_limit <= current,
           f"Error: Requested limit ${new_limit} is not higher than the current limit of ${current}.")
    self.edit("debit_cards", card_id).update({
        "daily_atm_limit" if limit_type == "atm" else "daily_purchase_limit": new_limit,
        f"temporary_{limit_type}_limit_increase": True, f"original_{limit_type}_limit": current,
        f"temporary_{limit_type}_limit_expires": ids.TODAY})
    return "\n".join([
        f"Temporary {name} Increase Granted Successfully", f"Card ID: {card_id}", f"Previous Limit: ${current}",
        f"New Temporary Limit: ${new_limit}", f"Increase Amount: ${new_limit - current}", "", "Important Information:",
        "- This temporary increase expires in 24 hours", f"- After expiration, the limit will revert to ${current}",
        "- Only one temporary increase is allowed per 24-hour period", "",
        "Note: If the customer is at a third-party (non-Rho-Bank) ATM, that ATM may have its own",
        "per-transaction or daily limits that Rho-Bank cannot override. The customer may need to",
        "use a Rho-Bank ATM or make multiple smaller withdrawals at third-party ATMs."])
