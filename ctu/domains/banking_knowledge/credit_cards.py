"""Discoverable agent tools on credit card accounts: disputes, replacements, closures, credits, flags, payments."""

from __future__ import annotations

import json

from ctu.domains.banking_knowledge import ids
from ctu.domains.banking_knowledge.checks import check_card_account, ensure, one_of, owned_card, record
from ctu.domains.banking_knowledge.misc_tools import history_tool
from ctu.domains.banking_knowledge.store import Bank, account_balance, dollars
from ctu.domains.banking_knowledge.toolkit import discoverable

DISPUTE_REASONS = ["unauthorized_fraudulent_charge", "duplicate_charge", "incorrect_amount",
                   "goods_services_not_received", "goods_services_not_as_described",
                   "canceled_subscription_still_charging", "refund_never_processed"]
REPLACEMENT_REASONS = ["fraud_suspected", "lost", "stolen", "damaged", "expired", "other"]
CLOSURE_REASONS = ["annual_fee", "not_using_card", "found_better_card", "unhappy_with_rewards", "simplifying_finances",
                   "negative_experience", "other"]
CREDIT_REASONS = ["goodwill_adjustment", "promotional_credit", "annual_fee_reversal", "late_fee_reversal",
                  "interest_charge_reversal", "dispute_resolution", "price_match", "retention_offer", "error_correction",
                  "other"]
FLAG_TYPES = ["annual_fee_waived", "promotional_apr", "rewards_bonus", "other"]
FLAG_REASONS = ["retention_offer", "loyalty_benefit", "promotional", "error_correction", "other"]


def titled(code: str) -> str:
    """``"late_fee_reversal"`` -> ``"Late Fee Reversal"``."""
    return code.replace("_", " ").title()


@discoverable("write")
def file_credit_card_transaction_dispute_4829(
        self: Bank, transaction_id: str, card_action: str, card_last_4_digits: str, full_name: str, user_id: str,
        phone: str, email: str, address: str, contacted_merchant: bool, purchase_date: str, issue_noticed_date: str,
        dispute_reason: str, resolution_requested: str, eligible_for_provisional_credit: bool,
        partial_refund_amount: float | None = None) -> str:
    """File a formal dispute for a credit card transaction.

    Args:
        transaction_id (string): The unique identifier for the transaction being disputed
        card_action (string): Flag indicating the card's status. Must be one of: 'keep_active' (card remains active, dispute only), 'cancel_and_reissue' (card is being cancelled and replaced). This is for record-keeping only and does NOT order a replacement card.
        card_last_4_digits (string): Last 4 digits of the credit card number
        full_name (string): Full legal name of the cardholder
        user_id (string): The user's unique identifier in the system
        phone (string): Contact phone number
        email (string): Contact email address
        address (string): Contact mailing address
        contacted_merchant (boolean): Whether the user attempted to resolve the issue with the merchant first
        purchase_date (string): Date when the purchase was made, format MM/DD/YYYY
        issue_noticed_date (string): Date when the user noticed the issue, format MM/DD/YYYY
        dispute_reason (string): Reason for the dispute. Must be one of: 'unauthorized_fraudulent_charge', 'duplicate_charge', 'incorrect_amount', 'goods_services_not_received', 'goods_services_not_as_described', 'canceled_subscription_still_charging', 'refund_never_processed'
        resolution_requested (string): Resolution being requested. Must be one of: 'full_refund', 'partial_refund'
        eligible_for_provisional_credit (boolean): Whether the user is eligible for provisional credit
        partial_refund_amount (number, optional): Amount requested for partial refund (required only if resolution_requested is 'partial_refund')

    Returns:
        Credit card transaction dispute filed successfully. A case has been opened and will be reviewed within 10 business days.
    """
    ensure(transaction_id and user_id, "Error: Missing required parameters.")
    one_of("card_action", card_action, ["keep_active", "cancel_and_reissue"])
    one_of("dispute_reason", dispute_reason, DISPUTE_REASONS)
    one_of("resolution_requested", resolution_requested, ["full_refund", "partial_refund"])
    ensure(not (resolution_requested == "partial_refund" and partial_refund_amount is None),
           "Error: partial_refund_amount is required when resolution_requested is 'partial_refund'.")
    dispute = ids.dispute_id(user_id, transaction_id)
    record = {"dispute_id": dispute, "transaction_id": transaction_id, "user_id": user_id, "card_action": card_action,
              "card_last_4_digits": card_last_4_digits, "full_name": full_name, "phone": phone, "email": email,
              "address": address, "contacted_merchant": contacted_merchant, "purchase_date": purchase_date,
              "issue_noticed_date": issue_noticed_date, "dispute_reason": dispute_reason,
              "resolution_requested": resolution_requested, "partial_refund_amount": partial_refund_amount,
              "eligible_for_provisional_credit": eligible_for_provisional_credit,
              "provisional_credit_given": eligible_for_provisional_credit, "submitted_at": ids.TODAY,
              "status": "SUBMITTED"}
    ensure(self.add("transaction_disputes", dispute, record),
           "Error: Dispute may have already been filed for this transaction.")
    parts = ["Credit card transaction dispute filed successfully. A case has been opened and will be reviewed "
             "within 10 business days.", "", "Executed: file_credit_card_transaction_dispute_4829",
             f"Dispute ID: {dispute}", f"Transaction: {transaction_id}", f"Reason: {titled(dispute_reason)}",
             f"Resolution Requested: {titled(resolution_requested)}"]
    if partial_refund_amount:
        parts.append(f"Partial Refund Amount: ${partial_refund_amount:.2f}")
    parts.append("Provisional Credit: ELIGIBLE - Credit will be applied within 2 business days."
                 if eligible_for_provisional_credit else "Provisional Credit: Not eligible at this time.")
    return "\n".join(parts)


@discoverable("write")
def order_replacement_credit_card_7291(self: Bank, credit_card_account_id: str, user_id: str, shipping_address: str,
                                       reason: str, expedited_shipping: bool = False) -> str:
    """Order a replacement credit card for a customer. The old card will be automatically cancelled when the replacement is ordered.

    Args:
        credit_card_account_id (string): The credit card account ID for the card being replaced
        user_id (string): The user's unique identifier in the system
        shipping_address (string): Full shipping address where the new card should be sent
        reason (string): Reason for replacement. Must be one of: 'fraud_suspected', 'lost', 'stolen', 'damaged', 'expired', 'other'
        expedited_shipping (boolean, optional): Whether to use expedited shipping (2-3 business days instead of 7-10)

    Returns:
        Replacement credit card order placed successfully. The old card has been cancelled for security.
    """
    ensure(credit_card_account_id and user_id and shipping_address and reason,
           "Error: Missing required parameters (credit_card_account_id, user_id, shipping_address, reason).")
    one_of("reason", reason, REPLACEMENT_REASONS)
    check_card_account(self, credit_card_account_id)
    order_id = ids.credit_card_order_id(credit_card_account_id, user_id, reason)
    record = {"order_id": order_id, "credit_card_account_id": credit_card_account_id, "user_id": user_id,
              "shipping_address": shipping_address, "reason": reason, "expedited_shipping": expedited_shipping,
              "order_date": ids.TODAY, "status": "ORDERED", "old_card_cancelled": True}
    ensure(self.add("credit_card_orders", order_id, record),
           "Error: Order may have already been placed for this card replacement.")
    if self.has("credit_card_accounts", credit_card_account_id):
        account = self.edit("credit_card_accounts", credit_card_account_id)
        account["status"] = "CLOSED"
        account["closed_date"] = ids.TODAY
    return "\n".join([
        f"Order ID: {order_id}", f"Card Account: {credit_card_account_id}", f"Reason: {titled(reason)}",
        f"Shipping Address: {shipping_address}", f"Shipping Method: {'Expedited' if expedited_shipping else 'Standard'}",
        f"Expected Delivery: {'2-3 business days' if expedited_shipping else '7-10 business days'}", "",
        "The old card has been cancelled for security. The new card will have the same account number but a new "
        "card number and CVV."])


history_tool("get_pending_replacement_orders_5765", "credit_card_account_id",
             "The credit card account ID to check for pending replacement orders", "credit_card_orders",
             "Check if a credit card account has any pending replacement card orders.",
             "Pending replacement orders check completed.", "Replacement orders for credit card account {}:",
             "\nNo pending replacement orders found for this credit card account.", __name__)


@discoverable("write")
def log_credit_card_closure_reason_4521(self: Bank, credit_card_account_id: str, user_id: str,
                                        closure_reason: str) -> str:
    """Log the reason why a customer wants to close their credit card account.

    Args:
        credit_card_account_id (string): The credit card account ID the customer wants to close
        user_id (string): The user's unique identifier in the system
        closure_reason (string): Reason for closure. Must be one of: 'annual_fee', 'not_using_card', 'found_better_card', 'unhappy_with_rewards', 'simplifying_finances', 'negative_experience', 'other'

    Returns:
        Closure reason logged successfully.
    """
    ensure(credit_card_account_id and user_id and closure_reason, "Error: Missing required parameters.")
    one_of("closure_reason", closure_reason, CLOSURE_REASONS)
    record_id = ids.closure_reason_id(credit_card_account_id, user_id)
    self.add("credit_card_closure_reasons", record_id,
             {"record_id": record_id, "credit_card_account_id": credit_card_account_id, "user_id": user_id,
              "closure_reason": closure_reason, "logged_at": ids.TODAY, "status": "LOGGED"})
    shown = json.dumps({"credit_card_account_id": credit_card_account_id, "user_id": user_id,
                        "closure_reason": closure_reason}, indent=2)
    return (f"Closure reason logged successfully.\n\nExecuted: log_credit_card_closure_reason_4521\nArguments: {shown}\n"
            f"Closure reason '{closure_reason}' logged for account {credit_card_account_id}.")


history_tool("get_closure_reason_history_8293", "credit_card_account_id",
             "The credit card account ID to check for previous closure attempts", "credit_card_closure_reasons",
             "Retrieve the closure reason history for a specific credit card account.",
             "Closure reason history retrieved successfully.", "Closure reason history for credit card account {}:",
             "\nNo closure reason records found for this credit card account.", __name__)


@discoverable("write")
def apply_statement_credit_8472(self: Bank, user_id: str, credit_card_account_id: str, amount: float,
                                reason: str) -> str:
    """Apply a statement credit to a customer's credit card account.

    Args:
        user_id (string): The user's unique identifier in the system
        credit_card_account_id (string): The credit card account ID to apply the credit to
        amount (number): The credit amount in dollars (e.g., 25.00 for a $25 credit)
        reason (string): Reason for the statement credit. Must be one of: 'goodwill_adjustment', 'promotional_credit', 'annual_fee_reversal', 'late_fee_reversal', 'interest_charge_reversal', 'dispute_resolution', 'price_match', 'retention_offer', 'error_correction', 'other'

    Returns:
        Statement credit applied successfully.
    """
    ensure(user_id and credit_card_account_id and amount is not None and reason,
           "Error: Missing required parameters (user_id, credit_card_account_id, amount, reason).")
    ensure(not amount <= 0, "Error: Credit amount must be positive.")
    one_of("reason", reason, CREDIT_REASONS)
    check_card_account(self, credit_card_account_id)
    txn = ids.transaction_id(user_id, "STATEMENT_CREDIT", reason, amount, "Statement Credit")
    record = {"transaction_id": txn, "user_id": user_id, "credit_card_account_id": credit_card_account_id,
              "credit_card_type": "N/A", "merchant_name": "Rho-Bank Statement Credit",
              "transaction_amount": f"-${amount:.2f}", "transaction_date": ids.TODAY, "category": "Statement Credit",
              "status": "COMPLETED", "rewards_earned": "0 points", "credit_reason": reason}
    ensure(self.add("credit_card_transaction_history", txn, record),
           f"Error: Failed to apply statement credit. Transaction ID '{txn}' may already exist.")
    return (f"Statement credit applied successfully.\n\nExecuted: apply_statement_credit_8472\n"
            f"  - Transaction ID: {txn}\n  - User ID: {user_id}\n  - Account: {credit_card_account_id}\n"
            f"  - Credit Amount: ${amount:.2f}\n  - Reason: {titled(reason)}\n  - Date: {ids.TODAY}")


@discoverable("write")
def apply_credit_card_account_flag_6147(self: Bank, credit_card_account_id: str, user_id: str, flag_type: str,
                                        expiration_date: str, reason: str) -> str:
    """Apply a flag to a customer's credit card account. Flags can include annual fee waivers, promotional APR rates, rewards bonuses, or other account-level modifiers. Each flag has an effective date and expiration date.

    Args:
        credit_card_account_id (string): The credit card account ID to apply the flag to
        user_id (string): The user's unique identifier in the system
        flag_type (string): Type of flag to apply. Must be one of: 'annual_fee_waived', 'promotional_apr', 'rewards_bonus', 'other'
        expiration_date (string): Date when the flag expires (MM/DD/YYYY format)
        reason (string): Reason for applying this flag. Must be one of: 'retention_offer', 'loyalty_benefit', 'promotional', 'error_correction', 'other'

    Returns:
        Account flag applied successfully.
    """
    ensure(credit_card_account_id and user_id and flag_type and expiration_date and reason,
           "Error: Missing required parameters (credit_card_account_id, user_id, flag_type, expiration_date, reason).")
    one_of("flag_type", flag_type, FLAG_TYPES)
    one_of("reason", reason, FLAG_REASONS)
    check_card_account(self, credit_card_account_id)
    flag_id = ids.account_flag_id(credit_card_account_id, flag_type, expiration_date)
    record = {"flag_id": flag_id, "credit_card_account_id": credit_card_account_id, "user_id": user_id,
              "flag_type": flag_type, "effective_date": ids.TODAY, "expiration_date": expiration_date,
              "reason": reason, "applied_at": ids.TODAY, "status": "ACTIVE"}
    ensure(self.add("credit_card_account_flags", flag_id, record),
           f"Error: Failed to apply account flag. Flag ID '{flag_id}' may already exist.")
    return (f"Account flag applied successfully!\n  - Flag ID: {flag_id}\n  - Account: {credit_card_account_id}\n"
            f"  - User ID: {user_id}\n  - Flag Type: {titled(flag_type)}\n  - Effective Date: {ids.TODAY}\n"
            f"  - Expiration Date: {expiration_date}\n  - Reason: {titled(reason)}")


@discoverable("write")
def close_credit_card_account_7834(self: Bank, credit_card_account_id: str, user_id: str) -> str:
    """Close a customer's credit card account permanently.

    Args:
        credit_card_account_id (string): The credit card account ID to close
        user_id (string): The user's unique identifier in the system

    Returns:
        Credit card account closed successfully.
    """
    ensure(credit_card_account_id and user_id, "Error: Missing required parameters (credit_card_account_id, user_id).")
    check_card_account(self, credit_card_account_id)
    ensure(self.update("credit_card_accounts", credit_card_account_id,
                       {"status": "CLOSED", "closed_date": ids.TODAY, "closed_by": user_id}),
           f"Error: Failed to close credit card account '{credit_card_account_id}'.")
    shown = json.dumps({"credit_card_account_id": credit_card_account_id, "user_id": user_id}, indent=2)
    return (f"Credit card account closed successfully.\n\nExecuted: close_credit_card_account_7834\n"
            f"Arguments: {shown}\nAccount {credit_card_account_id} has been closed.")


@discoverable("write")
def pay_credit_card_from_checking_9182(self: Bank, user_id: str, checking_account_id: str,
                                       credit_card_account_id: str, amount: float) -> str:
    """Pay off a credit card balance using funds from the customer's Rho-Bank checking account. This deducts the specified amount from the checking account and reduces the credit card balance by the same amount.

    Args:
        user_id (string): The customer's unique identifier in the system
        checking_account_id (string): The ID of the Rho-Bank checking account to debit funds from
        credit_card_account_id (string): The ID of the credit card account to apply the payment to
        amount (number): The payment amount in dollars. Must be a positive number.

    Returns:
        Credit card payment processed successfully.
    """
    ensure(user_id and checking_account_id and credit_card_account_id and amount is not None,
           "Error: Missing required parameters (user_id, checking_account_id, credit_card_account_id, amount).")
    try:
        amount = float(amount)
    except (ValueError, TypeError):
        return "Error: Invalid payment amount. Must be a positive number."
    ensure(not amount <= 0, "Error: Payment amount must be a positive number.")
    checking = record(self, "accounts", checking_account_id,
                      f"Error: Checking account '{checking_account_id}' not found.")
    ensure(checking.get("user_id") == user_id,
           f"Error: Checking account '{checking_account_id}' does not belong to user '{user_id}'.")
    ensure(checking.get("class") == "checking", f"Error: Account '{checking_account_id}' is not a checking account.")
    available = account_balance(checking)
    ensure(not amount > available, f"Error: Insufficient funds in checking account. Available balance: "
                                   f"${available:.2f}, requested payment: ${amount:.2f}.")
    owed = dollars(owned_card(self, credit_card_account_id, user_id).get("current_balance", "$0.00"))
    ensure(not amount > owed, f"Error: Payment amount (${amount:.2f}) exceeds credit card balance (${owed:.2f}). "
                              f"Please specify an amount up to the outstanding balance.")
    new_checking, new_card = available - amount, owed - amount
    self.edit("accounts", checking_account_id)["current_holdings"] = f"{new_checking:.2f}"
    self.edit("credit_card_accounts", credit_card_account_id)["current_balance"] = f"${new_card:.2f}"
    return (f"Payment processed successfully!\n  - Payment Amount: ${amount:.2f}\n"
            f"  - From Checking Account: {checking_account_id}\n  - To Credit Card Account: {credit_card_account_id}\n"
            f"  - New Checking Balance: ${new_checking:.2f}\n  - New Credit Card Balance: ${new_card:.2f}\n"
            f"The payment has been applied immediately.")
