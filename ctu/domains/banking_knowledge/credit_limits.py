"""Discoverable agent tools on credit limits: increase requests and decisions, their history, payment history."""

from __future__ import annotations

from ctu.domains.banking_knowledge import ids
from ctu.domains.banking_knowledge.checks import ensure, owned_card
from ctu.domains.banking_knowledge.misc_tools import history_tool
from ctu.domains.banking_knowledge.store import Bank, dollars
from ctu.domains.banking_knowledge.toolkit import discoverable

DENIAL_REASONS = ["insufficient_account_age", "cooldown_period_active", "pending_disputes", "pending_replacement_card",
                  "past_due_balance", "high_utilization", "insufficient_payment_history",
                  "requested_amount_exceeds_limit", "other"]


@discoverable("write")
def submit_credit_limit_increase_request_7392(self: Bank, credit_card_account_id: str, user_id: str,
                                              requested_increase_amount: int) -> str:
    """Submit a credit limit increase request for a customer's credit card.

    Args:
        credit_card_account_id (string): The credit card account ID to request increase for
        user_id (string): The customer's unique identifier in the system
        requested_increase_amount (integer): The dollar amount by which to increase the credit limit (e.g., 2500 for $2,500)

    Returns:
        Credit limit increase request submitted successfully.
    """
    ensure(credit_card_account_id and user_id and requested_increase_amount is not None,
           "Error: Missing required parameters.")
    try:
        amount = float(requested_increase_amount)
    except (TypeError, ValueError):
        return "Error: Invalid requested_increase_amount. Must be a whole number."
    ensure(amount.is_integer(), "Error: Invalid requested_increase_amount. Must be a whole number of dollars.")
    amount = int(amount)
    ensure(amount > 0, "Error: Requested increase amount must be positive.")
    owned_card(self, credit_card_account_id, user_id)
    request_id = ids.credit_limit_request_id(credit_card_account_id, user_id, amount)
    record = {"request_id": request_id, "credit_card_account_id": credit_card_account_id, "user_id": user_id,
              "requested_increase_amount": amount, "submitted_at": ids.TODAY, "status": "PENDING"}
    ensure(self.add("credit_limit_increase_requests", request_id, record),
           "Error: A similar request may already exist.")
    return (f"Credit limit increase request submitted successfully.\n\n"
            f"Executed: submit_credit_limit_increase_request_7392\n  - Request ID: {request_id}\n"
            f"  - Account: {credit_card_account_id}\n  - Requested Increase: ${amount:,}\n  - Status: PENDING")


history_tool("get_credit_limit_increase_history_4829", "credit_card_account_id",
             "The credit card account ID to check for CLI history", "credit_limit_increase_requests",
             "Retrieve the credit limit increase request history for a specific credit card account. Returns all "
             "previous CLI requests including dates, amounts, and statuses.",
             "Credit limit increase history retrieved.",
             "Credit limit increase history for account {}:",
             "\nNo credit limit increase requests found for this account.", __name__)


@discoverable("read")
def get_payment_history_6183(self: Bank, credit_card_account_id: str, months: int) -> str:
    """Retrieve payment history for a credit card account.

    Args:
        credit_card_account_id (string): The credit card account ID to check payment history for
        months (integer): Number of months of payment history to retrieve

    Returns:
        Payment history retrieved.
    """
    ensure(credit_card_account_id and months is not None,
           "Error: Missing required parameters (credit_card_account_id, months).")
    try:
        months = int(months)
    except (ValueError, TypeError):
        return "Error: Invalid months value. Must be a positive integer."
    ensure(months > 0, "Error: months must be a positive integer.")
    payments = [p for p in self.values("payment_history") if p.get("credit_card_account_id") == credit_card_account_id]
    if not payments:
        return f"No payment history found for account '{credit_card_account_id}'."
    payments.sort(key=lambda p: p.get("payment_date") or "", reverse=True)
    payments = payments[:months]
    on_time = 0
    for payment in payments:
        if payment.get("status") != "ON_TIME":
            break
        on_time += 1
    parts = [f"Payment history for account '{credit_card_account_id}' (last {months} months):",
             f"Consecutive on-time payments: {on_time}"]
    parts += [f"\n  - Payment Date: {p.get('payment_date')}\n    Amount: {p.get('amount')}\n    Status: {p.get('status')}"
              for p in payments]
    return "\n".join(parts)


def _blocked(self: Bank, card: dict, account_id: object, user_id: object) -> bool:
    """tau2's eligibility checks for an approval: a pending dispute of the user, a pending replacement of the
    card, or an account not in good standing."""
    for dispute in self.values("transaction_disputes"):
        if dispute.get("user_id") == user_id and dispute.get("status") in ["SUBMITTED", "UNDER_REVIEW", "PENDING"]:
            return True
    for order in self.values("credit_card_orders"):
        if order.get("credit_card_account_id") == account_id and order.get("status") in ["PENDING", "PROCESSING",
                                                                                          "SHIPPED"]:
            return True
    return card.get("account_status", "").upper() in ["PAST_DUE", "DELINQUENT", "COLLECTIONS", "CLOSED"]


@discoverable("write")
def approve_credit_limit_increase_5847(self: Bank, credit_card_account_id: str, user_id: str,
                                       new_credit_limit: int) -> str:
    """Approve and apply a credit limit increase for a customer's credit card.

    Args:
        credit_card_account_id (string): The credit card account ID
        user_id (string): The customer's unique identifier in the system
        new_credit_limit (integer): The new total credit limit in dollars (e.g., 7500 for $7,500)

    Returns:
        Credit limit increase approved and applied successfully.
    """
    ensure(credit_card_account_id and user_id and new_credit_limit is not None, "Error: Missing required parameters.")
    card = owned_card(self, credit_card_account_id, user_id)
    ensure(not _blocked(self, card, credit_card_account_id, user_id),
           "Error: Credit limit increase request cannot be approved at this time.")
    current = dollars(card.get("credit_limit", "$0.00"))
    new_limit = float(new_credit_limit)
    self.edit("credit_card_accounts", credit_card_account_id)["credit_limit"] = f"${new_limit:.2f}"
    request_id = ids.credit_limit_request_id(credit_card_account_id, user_id, new_limit - current)
    self.add("credit_limit_increase_requests", request_id,
             {"request_id": request_id, "credit_card_account_id": credit_card_account_id, "user_id": user_id,
              "previous_limit": f"${current:.2f}", "new_limit": f"${new_limit:.2f}",
              "increase_amount": f"${new_limit - current:.2f}", "decision_date": ids.TODAY, "status": "APPROVED"})
    return (f"Credit limit increase approved!\n  - Account: {credit_card_account_id}\n"
            f"  - Previous Limit: ${current:.2f}\n  - New Limit: ${new_limit:.2f}\n"
            f"  - Increase: ${new_limit - current:.2f}\n  - Effective Date: {ids.TODAY}\n"
            f"The customer will receive a confirmation email.")


@discoverable("write")
def deny_credit_limit_increase_5848(self: Bank, credit_card_account_id: str, user_id: str, denial_reason: str) -> str:
    """Deny a credit limit increase request for a customer's credit card.

    Args:
        credit_card_account_id (string): The credit card account ID
        user_id (string): The customer's unique identifier in the system
        denial_reason (string): The reason for denying the request. Must be one of: 'insufficient_account_age', 'cooldown_period_active', 'pending_disputes', 'pending_replacement_card', 'past_due_balance', 'high_utilization', 'insufficient_payment_history', 'requested_amount_exceeds_limit', 'other'

    Returns:
        Credit limit increase request denied.
    """
    ensure(credit_card_account_id and user_id and denial_reason, "Error: Missing required parameters.")
    ensure(denial_reason in DENIAL_REASONS,
           f"Error: Invalid denial_reason. Must be one of: {', '.join(DENIAL_REASONS)}")
    ensure(self.has("credit_card_accounts", credit_card_account_id),
           f"Error: Credit card account '{credit_card_account_id}' not found.")
    request_id = ids.credit_limit_request_id(credit_card_account_id, user_id, 0.0)
    self.add("credit_limit_increase_requests", request_id,
             {"request_id": request_id, "credit_card_account_id": credit_card_account_id, "user_id": user_id,
              "denial_reason": denial_reason, "decision_date": ids.TODAY, "status": "DENIED"})
    return (f"Credit limit increase request denied.\n  - Account: {credit_card_account_id}\n"
            f"  - Denial Reason: {denial_reason}\n  - Date: {ids.TODAY}\n"
            f"The customer will receive a notification explaining the denial.")
