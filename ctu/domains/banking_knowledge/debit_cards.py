"""Discoverable agent tools that issue debit cards: ordering, the three activations, listing, temporary limits."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ctu.domains.banking_knowledge import ids
from ctu.domains.banking_knowledge.checks import (
    bank_account,
    card_status,
    debit_card,
    digits,
    ensure,
    linked_account_open,
    one_of,
)
from ctu.domains.banking_knowledge.credit_cards import titled
from ctu.domains.banking_knowledge.store import Bank
from ctu.domains.banking_knowledge.toolkit import discoverable

DELIVERY_TIMES = {"STANDARD": "7-10 business days", "EXPEDITED": "3-5 business days", "RUSH": "1-2 business days"}
DESIGNS = ["CLASSIC", "PREMIUM", "CUSTOM"]
SEQUENTIAL_PINS = ["0123", "1234", "2345", "3456", "4567", "5678", "6789", "9876", "8765", "7654", "6543", "5432",
                   "4321", "3210"]
# the activation tool for each issue reason
ACTIVATION_TOOL = {"new_account": "activate_debit_card_8291", "first_card": "activate_debit_card_8291",
                   "lost": "activate_debit_card_8292", "stolen": "activate_debit_card_8292",
                   "fraud": "activate_debit_card_8292", "expired": "activate_debit_card_8293",
                   "damaged": "activate_debit_card_8293", "upgrade": "activate_debit_card_8293",
                   "bank_reissue": "activate_debit_card_8293"}


def check_pin(pin: Any) -> None:
    """tau2's rules for a new PIN: 4 digits, not sequential, not one digit repeated."""
    ensure(pin and pin.isdigit() and len(pin) == 4, "Error: PIN must be exactly 4 digits.")
    ensure(pin not in SEQUENTIAL_PINS, "Error: PIN cannot be sequential (e.g., 1234). Please choose a more secure PIN.")
    ensure(len(set(pin)) != 1,
           "Error: PIN cannot be all the same digit (e.g., 1111). Please choose a more secure PIN.")


def expiry(issue_date: str) -> str:
    """Four years after the issue month, on the month's last day (February: the 28th)."""
    month, _, year = issue_date.split("/")
    day = "31" if month in ["01", "03", "05", "07", "08", "10", "12"] else "28" if month == "02" else "30"
    return f"{month}/{day}/{int(year) + 4}"


def _issue_reason(cards: list[dict]) -> str:
    """Why a new card is issued: the reason the account's first closed card was lost, else first card/new account."""
    closed = next((c for c in cards if c.get("status") == "CLOSED"), None)
    if closed is not None:
        reason = closed.get("closure_reason", "first_card")
        if reason in ["lost", "stolen", "fraud", "fraud_suspected"]:
            return reason if reason != "fraud_suspected" else "fraud"
        return "first_card"
    return "first_card" if cards else "new_account"


def _fees(delivery: float, design: float, excess: float, sep: str) -> list[str]:
    out = [f"Delivery{sep}${delivery}"] if delivery > 0 else []
    out += [f"Design{sep}${design}"] if design > 0 else []
    return out + ([f"Excess Replacement{sep}${excess:.0f}"] if excess > 0 else [])


def _check_order(self: Bank, account_id: object, user_id: object) -> float:
    """tau2's checks of the account before an order (an open checking account of the user's, with $25 at least,
    no pending order, no active card); its balance."""
    account = bank_account(self, account_id)
    ensure(account.get("class") == "checking", f"Error: Debit cards can only be ordered for checking accounts. "
                                               f"Account '{account_id}' is a {account.get('class')} account.")
    ensure(account.get("status") == "OPEN",
           f"Error: Account must be OPEN. Account '{account_id}' has status: {account.get('status')}")
    ensure(account.get("user_id") == user_id, f"Error: Account '{account_id}' does not belong to user '{user_id}'.")
    try:
        balance = float(str(account.get("current_holdings", "0")).replace(",", ""))
    except ValueError:
        balance = 0.0
    ensure(not balance < 25.0, f"Error: Account must have a minimum balance of $25. Current balance: ${balance:.2f}")
    ensure(not any(o.get("account_id") == account_id and o.get("status") == "PENDING"
                   for o in self.values("debit_card_orders")),
           f"Error: There is already a pending debit card order for account '{account_id}'.")
    ensure(not sum(1 for c in self.values("debit_cards") if c.get("account_id") == account_id
                   and c.get("status") == "ACTIVE"),
           f"Error: Account '{account_id}' already has an active debit card. Maximum 1 active card per checking "
           f"account.")
    return balance


@discoverable("write")
def order_debit_card_5739(self: Bank, account_id: str, user_id: str, delivery_option: str, delivery_fee: float,
                          card_design: str, design_fee: float, shipping_address: str,
                          excess_replacement_fee: float | None = None) -> str:
    """Order a new debit card for a customer's checking account.

    Args:
        account_id (string): The checking account ID to link the debit card to
        user_id (string): The customer's unique identifier
        delivery_option (string): Shipping speed: STANDARD, EXPEDITED, or RUSH
        delivery_fee (number): Fee to charge for delivery in dollars
        card_design (string): Card design: CLASSIC, PREMIUM, or CUSTOM
        design_fee (number): Fee to charge for card design in dollars
        shipping_address (string): Full shipping address for card delivery
        excess_replacement_fee (number, optional): Fee for exceeding replacement limit, if applicable

    Returns:
        Debit card order placed successfully.
    """
    excess_replacement_fee = excess_replacement_fee or 0
    try:
        delivery_fee = float(delivery_fee) if delivery_fee is not None else None
    except (TypeError, ValueError):
        return "Error: delivery_fee must be a number."
    try:
        design_fee = float(design_fee) if design_fee is not None else None
    except (TypeError, ValueError):
        return "Error: design_fee must be a number."
    try:
        excess_replacement_fee = float(excess_replacement_fee)
    except (TypeError, ValueError):
        excess_replacement_fee = 0
    if not all([account_id, user_id, delivery_option, delivery_fee is not None, card_design, design_fee is not None,
                shipping_address]):
        return ("Error: Missing required parameters. Required: account_id, user_id, delivery_option, delivery_fee, "
                "card_design, design_fee, shipping_address.")
    delivery_option = delivery_option.upper()
    one_of("delivery_option", delivery_option, list(DELIVERY_TIMES))
    card_design = card_design.upper()
    one_of("card_design", card_design, DESIGNS)
    balance = _check_order(self, account_id, user_id)
    total = delivery_fee + design_fee + excess_replacement_fee
    ensure(not (total > 0 and balance < total),
           f"Error: Insufficient funds for fees. Total fees: ${total:.2f}. Current balance: ${balance:.2f}")
    order_id = ids.debit_card_order_id(account_id, user_id, delivery_option)
    order = {"order_id": order_id, "account_id": account_id, "user_id": user_id, "delivery_option": delivery_option,
             "card_design": card_design, "shipping_address": shipping_address, "delivery_fee": delivery_fee,
             "design_fee": design_fee, "excess_replacement_fee": excess_replacement_fee, "total_fee": total,
             "order_date": ids.TODAY, "expected_delivery": DELIVERY_TIMES[delivery_option], "status": "PENDING"}
    ensure(self.add("debit_card_orders", order_id, order),
           "Error: Failed to create debit card order. Order may already exist.")
    if total > 0:
        self.edit("accounts", account_id)["current_holdings"] = f"{balance - total:.2f}"
        fee_txn = f"btxn_dcfee_{order_id[-8:]}"
        self.add("bank_account_transaction_history", fee_txn, {
            "transaction_id": fee_txn, "account_id": account_id, "date": ids.TODAY,
            "description": f"DEBIT CARD ORDER FEE - {', '.join(_fees(delivery_fee, design_fee, excess_replacement_fee, ' '))}",
            "amount": -total, "type": "debit_card_fee", "status": "posted"})
    card_id = ids.debit_card_id(account_id, user_id, ids.TODAY)
    last4 = "".join(c for c in ids.hex_id(f"card_details:{card_id}:last4", 8) if c.isdigit())[:4].zfill(4)
    cvv = "".join(c for c in ids.hex_id(f"card_details:{card_id}:cvv", 6) if c.isdigit())[:3].zfill(3)
    holder = self.get("users", user_id)
    holder_name = holder.get("name", "CARDHOLDER").upper() if holder is not None else "CARDHOLDER"
    cards = [c for c in self.values("debit_cards") if c.get("account_id") == account_id]
    self.add("debit_cards", card_id, {
        "card_id": card_id, "account_id": account_id, "user_id": user_id, "cardholder_name": holder_name,
        "last_4_digits": last4, "cvv": cvv, "status": "PENDING", "issue_date": ids.TODAY,
        "expiration_date": expiry(ids.TODAY), "card_design": card_design, "issue_reason": _issue_reason(cards)})
    parts = ["Debit Card Order Confirmed", f"Order ID: {order_id}", f"Card ID: {card_id}", f"Linked Account: {account_id}",
             f"Delivery Option: {delivery_option}", f"Card Design: {card_design}", f"Shipping Address: {shipping_address}",
             f"Expected Delivery: {DELIVERY_TIMES[delivery_option]}", "",
             "Note: Card will arrive with status PENDING. Customer must call to activate after receiving the card."]
    if total > 0:
        fees = ", ".join(_fees(delivery_fee, design_fee, excess_replacement_fee, ": "))
        parts += [f"Total Fees: ${total:.2f} ({fees}) - CHARGED to account {account_id}",
                  f"New Account Balance: ${balance - total:.2f}"]
    else:
        parts.append("Total Fees: $0 (No additional charges)")
    return "\n".join(parts)


ACTIVATION_ARGS = """

    Args:
        card_id (string): The debit card ID to activate
        last_4_digits (string): Last 4 digits of the card number (for verification)
        expiration_date (string): Card expiration date in MM/YY format
        cvv (string): 3-digit CVV from the back of the card
        pin (string): 4-digit PIN chosen by the customer

    Returns:
        {returns}
    """


def activation_doc(returns: str) -> Callable[[Callable], Callable]:
    """Decorator completing an activation tool's docstring (its first line) with the Args the three share."""

    def wrap(fn: Callable) -> Callable:
        fn.__doc__ += ACTIVATION_ARGS.format(returns=returns)  # type: ignore[operator]  # every activation tool has one
        return fn

    return wrap


def _check_activation(self: Bank, tool: str, card_id: object, last_4_digits: object, expiration_date: object,
                      cvv: object, pin: object) -> str:
    """tau2's checks before an activation with ``tool``, in its order; the card's issue reason."""
    ensure(all([card_id, last_4_digits, expiration_date, cvv, pin]),
           "Error: Missing required parameters. Required: card_id, last_4_digits, expiration_date, cvv, pin.")
    check_pin(pin)
    digits(cvv, 3, "Error: CVV must be exactly 3 digits.")
    digits(last_4_digits, 4, "Error: Last 4 digits must be exactly 4 digits.")
    card = debit_card(self, card_id)
    reason = card.get("issue_reason", "new_account")
    ensure(reason in [r for r, t in ACTIVATION_TOOL.items() if t == tool],
           f"Error: Wrong activation tool. This card has issue_reason='{reason}'. Please use "
           f"{ACTIVATION_TOOL.get(reason, 'unknown')} instead of {tool}.")
    card_status(card_id, card, already="ACTIVE", required="PENDING", verb="activated")
    ensure(card.get("last_4_digits") == last_4_digits,
           "Error: Card verification failed. The last 4 digits do not match our records.")
    linked_account_open(self, card, "activated")
    return reason


def _activate(self: Bank, card_id: object, new_status: str, stamp: str, why: str) -> list[str]:
    """Activate the card; give the account's other active cards ``new_status`` (dated ``stamp``, reason ``why``):
    their ids."""
    card = self.edit("debit_cards", card_id)
    card["status"] = "ACTIVE"
    card["activated_date"] = ids.TODAY
    account_id, changed = card.get("account_id"), []
    for other_id, other in list(self.rows("debit_cards")):
        if other_id != card_id and other.get("account_id") == account_id and other.get("status") == "ACTIVE":
            other = self.edit("debit_cards", other_id)
            other.update({"status": new_status, stamp: ids.TODAY, "deactivation_reason": why})
            changed.append(other_id)
    return changed


@discoverable("write")
@activation_doc("New debit card activated successfully.")
def activate_debit_card_8291(self: Bank, card_id: str, last_4_digits: str, expiration_date: str, cvv: str,
                             pin: str) -> str:
    """Activate a NEW debit card for a customer. Use ONLY for first-time cards on a checking account (issue_reason = 'new_account' or 'first_card'). For replacement or reissued cards, use the appropriate variant."""
    _check_activation(self, "activate_debit_card_8291", card_id, last_4_digits, expiration_date, cvv, pin)
    changed = _activate(self, card_id, "DEACTIVATED", "deactivated_date", "New card activated")
    parts = ["New Debit Card Activation Successful", f"Card ID: {card_id}", "Status: ACTIVE",
             f"Activation Date: {ids.TODAY}", "", "Your card is now ready to use at any ATM or point of sale terminal.",
             "For security, please sign the back of your card."]
    if changed:
        parts.append(f"\nNote: Previous card(s) have been deactivated: {', '.join(changed)}")
    return "\n".join(parts)


@discoverable("write")
@activation_doc("Replacement debit card activated successfully.")
def activate_debit_card_8292(self: Bank, card_id: str, last_4_digits: str, expiration_date: str, cvv: str,
                             pin: str) -> str:
    """Activate a REPLACEMENT debit card. Use ONLY for cards replacing lost, stolen, or fraud-suspected cards (issue_reason = 'lost', 'stolen', or 'fraud'). For new or reissued cards, use the appropriate variant."""
    reason = _check_activation(self, "activate_debit_card_8292", card_id, last_4_digits, expiration_date, cvv, pin)
    changed = _activate(self, card_id, "DEACTIVATED", "deactivated_date", f"Replacement card activated ({reason})")
    parts = ["Replacement Debit Card Activation Successful", f"Card ID: {card_id}",
             f"Replacement Reason: {titled(reason)}", "Status: ACTIVE", f"Activation Date: {ids.TODAY}", "",
             "Your replacement card is now ready to use.", "", "IMPORTANT SECURITY REMINDERS:",
             "- Please review your recent transactions for any unauthorized charges",
             "- Report any suspicious activity immediately"]
    if reason == "fraud":
        parts.append("- Since fraud was suspected, we recommend changing your online banking password")
    if changed:
        parts.append(f"\nPrevious card(s) have been deactivated for security: {', '.join(changed)}")
    return "\n".join(parts)


@discoverable("write")
@activation_doc("Reissued debit card activated successfully.")
def activate_debit_card_8293(self: Bank, card_id: str, last_4_digits: str, expiration_date: str, cvv: str,
                             pin: str) -> str:
    """Activate a REISSUED debit card. Use ONLY for cards reissued due to expiration, damage, design upgrade, or bank-initiated replacement (issue_reason = 'expired', 'damaged', 'upgrade', or 'bank_reissue'). For new or replacement cards, use the appropriate variant."""
    reason = _check_activation(self, "activate_debit_card_8293", card_id, last_4_digits, expiration_date, cvv, pin)
    changed = _activate(self, card_id, "GRACE_PERIOD", "grace_period_ends", f"Reissued card activated ({reason})")
    parts = ["Reissued Debit Card Activation Successful", f"Card ID: {card_id}", f"Reissue Reason: {titled(reason)}",
             "Status: ACTIVE", f"Activation Date: {ids.TODAY}", "", "Your reissued card is now ready to use."]
    if changed:
        parts += [f"\nNote: Your previous card(s) ({', '.join(changed)}) will remain active for 24 hours as a grace "
                  f"period.", "After 24 hours, the old card(s) will be automatically deactivated."]
    if reason in ["expired", "bank_reissue"]:
        parts.append("\nReminder: If your card number changed, please update any recurring payments with your new "
                     "card details.")
    return "\n".join(parts)


@discoverable("read")
def get_debit_cards_by_account_id_7823(self: Bank, account_id: str) -> str:
    """Retrieve all debit cards associated with a checking account. Returns card details including status, issue reason, and expiration date.

    Args:
        account_id (string): The checking account ID to retrieve debit cards for

    Returns:
        Debit cards retrieved successfully.
    """
    ensure(account_id, "Error: Missing required parameter 'account_id'.")
    ensure(bank_account(self, account_id).get("class", "").lower() in ["checking", "business_checking"],
           f"Error: Account '{account_id}' is not a checking account. Debit cards are only available for checking "
           f"accounts.")
    cards = []
    for card_id, card in self.rows("debit_cards"):
        if card.get("account_id") == account_id:
            info = {"card_id": card_id, **card}
            if "last_4_digits" in info and "card_number_last_4" not in info:
                info["card_number_last_4"] = info.pop("last_4_digits")
            if "issue_date" in info and "date_issued" not in info:
                info["date_issued"] = info.pop("issue_date")
            elif "created_date" in info and "date_issued" not in info:
                info["date_issued"] = info.pop("created_date")
            cards.append(info)
    if not cards:
        return f"No debit cards found for account '{account_id}'."
    cards.sort(key=lambda c: c.get("date_issued") or "", reverse=True)
    return json.dumps(cards, indent=2)
