"""Discoverable agent tools on a debit card's status: Regulation E disputes, recurring blocks, closing, freezing,
fraud alerts."""

from __future__ import annotations

from typing import Any

from ctu.domains.banking_knowledge import ids
from ctu.domains.banking_knowledge.checks import card_status, debit_card, ensure, linked_account_open, one_of
from ctu.domains.banking_knowledge.credit_cards import titled
from ctu.domains.banking_knowledge.store import Bank
from ctu.domains.banking_knowledge.toolkit import discoverable

DISPUTE_CATEGORIES = ["unauthorized_transaction", "atm_cash_discrepancy", "atm_deposit_not_credited",
                      "duplicate_charge", "incorrect_amount", "goods_services_not_received",
                      "recurring_charge_after_cancellation", "card_present_fraud", "card_not_present_fraud"]
TRANSACTION_TYPES = ["pin_purchase", "signature_purchase", "online_purchase", "atm_withdrawal", "atm_deposit",
                     "recurring_payment", "person_to_person"]
PIN_STATUSES = ["yes_shared", "yes_observed", "no", "unknown"]
CARD_ACTIONS = ["keep_active", "freeze_pending_investigation", "close_and_reissue"]
FRAUD = ["unauthorized_transaction", "card_present_fraud", "card_not_present_fraud"]
CLOSE_REASONS = ["lost", "stolen", "fraud_suspected", "damaged", "no_longer_needed", "account_closing"]


def _check_dispute(values: dict[str, Any]) -> None:
    """tau2's checks of a debit card dispute's fields, in its order."""
    required = [values[k] for k in ("transaction_id", "account_id", "card_id", "user_id", "dispute_category",
                                    "transaction_date", "discovery_date", "disputed_amount", "transaction_type",
                                    "pin_compromised", "card_action")]
    ensure(all(required), "Error: Missing required parameters.")
    ensure(values["customer_max_liability_amount"] is not None, "Error: customer_max_liability_amount is required.")
    ensure(all(values[k] is not None for k in ("card_in_possession", "contacted_merchant", "police_report_filed",
                                               "written_statement_provided")),
           "Error: card_in_possession, contacted_merchant, police_report_filed, and written_statement_provided are "
           "required boolean fields.")
    for field, allowed in (("dispute_category", DISPUTE_CATEGORIES), ("transaction_type", TRANSACTION_TYPES),
                           ("pin_compromised", PIN_STATUSES), ("card_action", CARD_ACTIONS)):
        one_of(field, values[field], allowed)
    ensure(not values["disputed_amount"] <= 0, "Error: disputed_amount must be a positive number.")


@discoverable("write")
def file_debit_card_transaction_dispute_6281(
        self: Bank, transaction_id: str, account_id: str, card_id: str, user_id: str, dispute_category: str,
        transaction_date: str, discovery_date: str, disputed_amount: float, transaction_type: str,
        card_in_possession: bool, pin_compromised: str, contacted_merchant: bool, police_report_filed: bool,
        written_statement_provided: bool, provisional_credit_eligible: bool, customer_max_liability_amount: float,
        card_action: str) -> str:
    """File a formal dispute for a debit card transaction under Regulation E. Debit card disputes affect actual bank funds and have different liability rules based on reporting timing.

    Args:
        transaction_id (string): The unique identifier for the transaction being disputed
        account_id (string): The checking account ID linked to the debit card
        card_id (string): The debit card ID
        user_id (string): The user's unique identifier in the system
        dispute_category (string): Category of the dispute. Must be one of: 'unauthorized_transaction', 'atm_cash_discrepancy', 'atm_deposit_not_credited', 'duplicate_charge', 'incorrect_amount', 'goods_services_not_received', 'recurring_charge_after_cancellation', 'card_present_fraud', 'card_not_present_fraud'
        transaction_date (string): Date when the transaction occurred, format MM/DD/YYYY
        discovery_date (string): Date when the user first noticed the issue, format MM/DD/YYYY
        disputed_amount (number): The dollar amount being disputed
        transaction_type (string): Type of transaction. Must be one of: 'pin_purchase', 'signature_purchase', 'online_purchase', 'atm_withdrawal', 'atm_deposit', 'recurring_payment', 'person_to_person'
        card_in_possession (boolean): Whether the customer still has their physical debit card in their possession
        pin_compromised (string): Whether the customer's PIN may have been compromised. Must be one of: 'yes_shared', 'yes_observed', 'no', 'unknown'
        contacted_merchant (boolean): Whether the user attempted to resolve the issue with the merchant first
        police_report_filed (boolean): Whether a police report has been filed (recommended for fraud over $500)
        written_statement_provided (boolean): Whether the customer has provided a written statement describing what happened (required for Reg E provisional credit)
        provisional_credit_eligible (boolean): Whether the user is eligible for provisional credit based on Debit Card Provisional Credit Guidelines
        customer_max_liability_amount (number): The maximum dollar amount the customer could be liable for based on Regulation E reporting timing rules and the disputed amount. Use -1 for unlimited liability.
        card_action (string): Action to take on the card. Must be one of: 'keep_active', 'freeze_pending_investigation', 'close_and_reissue'

    Returns:
        Debit card transaction dispute filed successfully. A case has been opened and provisional credit determination has been recorded.
    """
    _check_dispute(locals())
    dispute = ids.dispute_id(user_id, transaction_id)
    fraud = dispute_category in FRAUD
    pin_shared = pin_compromised == "yes_shared"
    record = {"dispute_id": dispute, "transaction_id": transaction_id, "account_id": account_id, "card_id": card_id,
              "user_id": user_id, "dispute_category": dispute_category, "transaction_date": transaction_date,
              "discovery_date": discovery_date, "disputed_amount": disputed_amount,
              "transaction_type": transaction_type, "card_in_possession": card_in_possession,
              "pin_compromised": pin_compromised, "contacted_merchant": contacted_merchant,
              "police_report_filed": police_report_filed, "written_statement_provided": written_statement_provided,
              "provisional_credit_eligible": provisional_credit_eligible,
              "provisional_credit_issued": provisional_credit_eligible,
              "provisional_credit_amount": disputed_amount if provisional_credit_eligible else None,
              "customer_max_liability_amount": customer_max_liability_amount, "card_action": card_action,
              "is_fraud_category": fraud, "pin_shared_voluntarily": pin_shared, "submitted_at": ids.TODAY,
              "status": "OPEN"}
    ensure(self.add("debit_card_disputes", dispute, record),
           "Error: Dispute may have already been filed for this transaction.")
    parts = [f"Dispute ID: {dispute}", f"Transaction: {transaction_id}", f"Account: {account_id}",
             f"Category: {titled(dispute_category)}", f"Disputed Amount: ${disputed_amount:.2f}",
             f"Card Action: {titled(card_action)}"]
    if provisional_credit_eligible:
        parts.append(f"Provisional Credit: ISSUED - ${disputed_amount:.2f} credited within 10 business days per "
                     f"Regulation E.")
    else:
        parts.append("Provisional Credit: Not eligible - see Debit Card Provisional Credit Guidelines for details.")
    if pin_shared:
        parts.append("WARNING: Customer indicated PIN was shared voluntarily. This may affect liability "
                     "determination.")
    if fraud and not police_report_filed and disputed_amount > 500:
        parts.append("RECOMMENDATION: For fraud disputes over $500, filing a police report is recommended.")
    return "\n".join(parts)


@discoverable("write")
def set_debit_card_recurring_block_7382(self: Bank, card_id: str, block_recurring: bool) -> str:
    """Block or unblock all recurring payments on a debit card. When blocked, all recurring/subscription charges will be declined. One-time purchases are not affected.

    Args:
        card_id (string): The debit card ID to update
        block_recurring (boolean): True to block all recurring payments, False to unblock/allow recurring payments

    Returns:
        Debit card recurring payment settings updated successfully.
    """
    ensure(card_id, "Error: Missing required parameter: card_id")
    card: Any = self.get("debit_cards", card_id)
    ensure(card, f"Error: Debit card '{card_id}' not found.")
    status = card.get("status", "").upper()
    ensure(status == "ACTIVE",
           f"Error: Cannot update recurring block settings for a card with status '{status}'. Card must be ACTIVE.")
    self.edit("debit_cards", card_id)["recurring_blocked"] = block_recurring
    if block_recurring:
        return (f"Recurring payments BLOCKED for debit card {card_id}.\nAll recurring/subscription charges will be "
                f"declined.\nOne-time purchases are not affected.\nThis change takes effect within 24 hours.")
    return (f"Recurring payments UNBLOCKED for debit card {card_id}.\nRecurring/subscription charges will now be "
            f"allowed.\nThis change takes effect within 24 hours.")


@discoverable("write")
def close_debit_card_4721(self: Bank, card_id: str, reason: str) -> str:
    """Close or cancel a debit card permanently.

    Args:
        card_id (string): The debit card ID to close
        reason (string): Reason for closing: lost, stolen, fraud_suspected, damaged, no_longer_needed, or account_closing

    Returns:
        Debit card closed successfully.
    """
    ensure(card_id and reason, "Error: Missing required parameters. Required: card_id, reason.")
    reason = reason.lower()
    one_of("reason", reason, CLOSE_REASONS)
    previous = debit_card(self, card_id).get("status")
    ensure(previous in ["ACTIVE", "PENDING"], f"Error: Debit card '{card_id}' cannot be closed. Current status: "
                                              f"{previous}. Only ACTIVE or PENDING cards can be closed.")
    self.edit("debit_cards", card_id).update({"status": "CLOSED", "closed_date": ids.TODAY, "closure_reason": reason})
    parts = ["Debit Card Closed Successfully", f"Card ID: {card_id}", f"Previous Status: {previous}", "New Status: CLOSED",
             f"Closure Reason: {titled(reason)}", f"Closure Date: {ids.TODAY}", ""]
    if reason in ["lost", "stolen", "fraud_suspected"]:
        parts += ["IMPORTANT: This card has been immediately deactivated for security.",
                  "Any pending transactions may still be processed."]
        if reason == "fraud_suspected":
            parts += ["Please advise the customer to review recent transactions and file disputes for any "
                      "unauthorized charges.", "Also recommend changing their online banking password."]
    parts += ["", "Note: This card cannot be reactivated. If the customer needs a new card, they can order one "
              "through the standard ordering process.",
              "Any recurring payments linked to this card will need to be updated with new payment information."]
    return "\n".join(parts)


@discoverable("write")
def freeze_debit_card_3892(self: Bank, card_id: str) -> str:
    """Temporarily freeze a debit card. The card can be unfrozen later.

    Args:
        card_id (string): The debit card ID to freeze

    Returns:
        Debit card frozen successfully.
    """
    ensure(card_id, "Error: Missing required parameter: card_id.")
    card_status(card_id, debit_card(self, card_id), already="FROZEN", required="ACTIVE", verb="frozen")
    self.edit("debit_cards", card_id).update({"status": "FROZEN", "frozen_date": ids.TODAY})
    return "\n".join(["Debit Card Frozen Successfully", f"Card ID: {card_id}", "Status: FROZEN",
                      f"Frozen Date: {ids.TODAY}", "", "While frozen:", "- All new purchase transactions will be declined",
                      "- Recurring payments and subscriptions will be declined",
                      "- Pending transactions already authorized may still process", "",
                      "To unfreeze, the customer can call customer service or use the mobile app.",
                      "If the card is confirmed lost or stolen, recommend closing the card permanently instead."])


@discoverable("write")
def unfreeze_debit_card_3893(self: Bank, card_id: str) -> str:
    """Unfreeze a previously frozen debit card.

    Args:
        card_id (string): The debit card ID to unfreeze

    Returns:
        Debit card unfrozen successfully.
    """
    ensure(card_id, "Error: Missing required parameter: card_id.")
    card = debit_card(self, card_id)
    card_status(card_id, card, already="ACTIVE", required="FROZEN", verb="unfrozen")
    linked_account_open(self, card, "unfrozen")
    self.edit("debit_cards", card_id).update({"status": "ACTIVE", "unfrozen_date": ids.TODAY})
    return "\n".join(["Debit Card Unfrozen Successfully", f"Card ID: {card_id}", "Status: ACTIVE",
                      f"Unfrozen Date: {ids.TODAY}", "", "The card is now active and ready to use immediately.",
                      "All transactions will process normally."])


@discoverable("write")
def clear_debit_card_fraud_alert_4892(self: Bank, card_id: str, reason: str) -> str:
    """Clear a fraud alert or velocity block on a debit card.

    Args:
        card_id (string): The debit card ID to clear the alert/block for
        reason (string): Reason for clearing: 'customer_verified' (for fraud alerts after customer verification) or 'velocity_clear' (for velocity blocks after identity verification)

    Returns:
        Fraud alert/velocity block cleared successfully.
    """
    ensure(card_id, "Error: Missing required parameter: card_id.")
    ensure(reason, "Error: Missing required parameter: reason.")
    reasons = ["customer_verified", "velocity_clear"]
    ensure(reason in reasons, f"Error: Invalid reason '{reason}'. Must be one of: {', '.join(reasons)}")
    card = debit_card(self, card_id)
    if reason == "velocity_clear":
        ensure(card.get("velocity_blocked", False),
               f"Error: Debit card '{card_id}' does not have an active velocity block.")
        self.edit("debit_cards", card_id).update({"velocity_blocked": False, "velocity_cleared_date": ids.TODAY})
        return "\n".join(["Velocity Block Cleared Successfully", f"Card ID: {card_id}", f"Cleared Date: {ids.TODAY}", "",
                          "The card is now unblocked and ready for normal use.",
                          "The velocity monitoring will continue - if the same unusual patterns recur,",
                          "the card may be blocked again automatically."])
    ensure(card.get("fraud_alert_active", False), f"Error: Debit card '{card_id}' does not have an active fraud alert.")
    ensure(card.get("alert_source") != "bank_initiated",
           "Error: BANK_INITIATED_ALERT - This fraud alert was initiated by the bank's fraud detection system and "
           "cannot be cleared by customer service agents. Please transfer the customer to the security team using "
           "transfer_to_human_agents.")
    self.edit("debit_cards", card_id).update({"fraud_alert_active": False, "alert_source": None,
                                              "fraud_alert_cleared_date": ids.TODAY})
    return "\n".join(["Fraud Alert Cleared Successfully", f"Card ID: {card_id}", f"Cleared Date: {ids.TODAY}", "",
                      "The fraud alert has been removed from the card.", "All transactions will process normally.", "",
                      "Remind the customer to review recent transactions and report any unauthorized charges."])
