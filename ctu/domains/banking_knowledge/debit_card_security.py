"""Discoverable agent tools on a debit card's PIN and limits."""

from __future__ import annotations

import datetime as dt

from ctu.domains.banking_knowledge import ids
from ctu.domains.banking_knowledge.debit_cards import pin_problem
from ctu.domains.banking_knowledge.store import Bank
from ctu.domains.banking_knowledge.toolkit import discoverable

DEFAULT_ATM_LIMITS = {"blue account": 500, "green account": 600, "light blue account": 400,
                      "green fee-free account": 500, "evergreen account": 750, "bluest account": 1500,
                      "dark green account": 300, "gold years account": 600, "purple account": 1000}
PIN_REMINDER = "Security reminder: Never share your PIN with anyone."


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
    if not all([card_id, last_4_digits, new_pin]):
        return "Error: Missing required parameters. Required: card_id, last_4_digits, new_pin."
    if not last_4_digits.isdigit() or len(last_4_digits) != 4:
        return "Error: Last 4 digits must be exactly 4 digits."
    problem = pin_problem(new_pin)
    if problem:
        return f"Error: {problem}"
    card = self.get("debit_cards", card_id)
    if card is None:
        return f"Error: Debit card '{card_id}' not found."
    if card.get("last_4_digits") != last_4_digits:
        return "Error: Card verification failed. The last 4 digits do not match our records."
    if card.get("status") != "ACTIVE":
        return (f"Error: Cannot reset PIN. Card status is {card.get('status')}. Only ACTIVE cards can have their PIN "
                f"reset.")
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
    if not all([card_id, current_pin, new_pin]):
        return "Error: Missing required parameters. Required: card_id, current_pin, new_pin."
    if not current_pin.isdigit() or len(current_pin) != 4:
        return "Error: Current PIN must be exactly 4 digits."
    problem = pin_problem(new_pin)
    if problem:
        return f"Error: {problem}"
    if current_pin == new_pin:
        return "Error: New PIN must be different from current PIN."
    card = self.get("debit_cards", card_id)
    if card is None:
        return f"Error: Debit card '{card_id}' not found."
    if card.get("status") != "ACTIVE":
        return (f"Error: Cannot change PIN. Card status is {card.get('status')}. Only ACTIVE cards can have their PIN "
                f"changed.")
    self.edit("debit_cards", card_id)["pin_last_changed"] = ids.TODAY
    return "\n".join(["Debit Card PIN Changed Successfully", f"Card ID: {card_id}", f"PIN Changed: {ids.TODAY}", "",
                      "The new PIN is effective immediately.",
                      "Customer can use the new PIN for ATM withdrawals and point-of-sale transactions.", "",
                      PIN_REMINDER])


def _limit_problem(self: Bank, card_id: object, card: dict | None) -> str | None:
    """tau2's checks on the card and its account before a temporary limit increase."""
    if card is None:
        return f"Error: Debit card '{card_id}' not found."
    if card.get("status") != "ACTIVE":
        return (f"Error: Debit card '{card_id}' is not active. Current status: {card.get('status')}. Only ACTIVE "
                f"cards can have limit increases.")
    account_id = card.get("account_id")
    if not account_id or not self.has("accounts", account_id):
        return f"Error: Could not find linked account for debit card '{card_id}'."
    account = self.get("accounts", account_id)
    if account.get("status") != "OPEN":
        return (f"Error: The linked account '{account_id}' is not in good standing. Account status: "
                f"{account.get('status')}.")
    opened = account.get("date_opened")
    if opened:
        try:
            age = (dt.datetime.strptime(ids.TODAY, "%m/%d/%Y") - dt.datetime.strptime(opened, "%m/%d/%Y")).days
            if age < 60:
                return (f"Error: Account must be at least 60 days old for a temporary limit increase. Account age: "
                        f"{age} days.")
        except ValueError:
            pass
    return None


def _current_limit(card: dict, account: dict, limit_type: str) -> tuple[object, str, str | None]:
    """(the current limit, its name, an error) for ``limit_type``; an ATM limit defaults from the account level."""
    if limit_type != "atm":
        return card.get("daily_purchase_limit"), "Daily Purchase Limit", None
    name = "Daily ATM Withdrawal Limit"
    current = card.get("daily_atm_limit")
    if current is not None:
        return current, name, None
    level = account.get("level", "").lower()
    if "light green" in level:
        return None, name, ("Error: Light Green Account (teen checking) cards have policy-based limits that cannot "
                            "be modified. The daily ATM withdrawal limit of $150 is fixed by account policy for safety "
                            "reasons. The customer may request the parent/guardian to withdraw cash from their own "
                            "account if needed.")
    current = DEFAULT_ATM_LIMITS.get(level)
    if current is None:
        return None, name, (f"Error: Could not determine the default ATM limit for account type "
                            f"'{account.get('level')}'. Please verify the account type.")
    return current, name, None


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
    if not card_id:
        return "Error: Missing required parameter: card_id."
    if not limit_type:
        return "Error: Missing required parameter: limit_type."
    if limit_type not in ["atm", "purchase"]:
        return f"Error: Invalid limit_type '{limit_type}'. Must be 'atm' or 'purchase'."
    if new_limit is None:
        return "Error: Missing required parameter: new_limit."
    try:
        new_limit = float(new_limit)
    except (ValueError, TypeError):
        return f"Error: new_limit must be an integer, got '{new_limit}'."
    if not new_limit.is_integer():
        return f"Error: new_limit must be an integer, got '{new_limit}'."
    new_limit = int(new_limit)
    if new_limit <= 0:
        return "Error: new_limit must be a positive amount."
    card = self.get("debit_cards", card_id)
    problem = _limit_problem(self, card_id, card)
    if problem:
        return problem
    current, name, problem = _current_limit(card, self.get("accounts", card.get("account_id")), limit_type)
    if problem:
        return problem
    if current is None:
        return (f"Error: The card does not have a {name.lower()} configured. This may be a restricted account type "
                f"where limits are set by account policy and cannot be modified.")
    ceiling = int(current * 1.5)
    if new_limit > ceiling:
        return (f"Error: Requested limit ${new_limit} exceeds the maximum allowed temporary increase. Maximum "
                f"temporary limit is ${ceiling} (150% of current ${current} limit).")
    if new_limit <= current:
        return f"Error: Requested limit ${new_limit} is not higher than the current limit of ${current}."
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
