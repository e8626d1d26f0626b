"""Discoverable agent tools: transfer protocols, transaction rewards, dispute histories and ATM deposit images."""

from __future__ import annotations

import json

from ctu.domains.banking_knowledge.atm_images import DEPOSIT_IMAGES
from ctu.domains.banking_knowledge.checks import ensure, record
from ctu.domains.banking_knowledge.store import Bank, found, lookup
from ctu.domains.banking_knowledge.toolkit import discoverable, docstring, tool_function


def history_tool(name: str, parameter: str, about: str, table: str, description: str, title: str, heading: str,
                 none_text: str, module: str) -> None:
    """Register one of tau2's history tools: the records of ``table`` whose ``parameter`` field is the argument,
    under ``title`` (the docstring's Returns line too), the tool's name and ``heading`` (``{}``: the argument), or
    ``none_text``; a missing argument is refused."""

    def run(self: Bank, value: object) -> str:
        ensure(value, f"Error: Missing required parameter: {parameter}")
        result = lookup(self, table, parameter, value)
        return "\n".join([title, "", f"Executed: {name}", heading.format(value),
                          result if found(result) else none_text])

    doc = docstring(description, (f"{parameter} (string): {about}",), title)
    discoverable("read")(tool_function(name, (parameter,), run, doc, module))


def _transfer_protocol_tool(name: str, description: str, lead: str) -> None:
    """Register a step of a special transfer protocol: a tool that does nothing but report itself, with ``lead``
    (the docstring's Returns line too)."""

    def run(self: Bank) -> str:
        return f"{lead}\n\nExecuted: {name}\nArguments: (no arguments)"

    discoverable("generic")(tool_function(name, (), run, docstring(description, returns=lead), __name__))


@discoverable("write")
def example_agent_tool_0000(self: Bank) -> str:
    """An example agent discoverable tool placeholder.

    Returns:
        Example tool executed successfully.
    """
    return "Example tool executed successfully."


@discoverable("write")
def update_transaction_rewards_3847(self: Bank, transaction_id: str, new_rewards_earned: str) -> str:
    """Update the rewards_earned field on a credit card transaction.

    Args:
        transaction_id (string): The unique identifier for the transaction to update
        new_rewards_earned (string): The corrected rewards value (e.g., '6300 points')

    Returns:
        Transaction rewards updated successfully.
    """
    ensure(transaction_id and new_rewards_earned, "Error: Missing required parameters.")
    ensure(self.update("credit_card_transaction_history", transaction_id, {"rewards_earned": new_rewards_earned}),
           f"Error: Transaction '{transaction_id}' not found.")
    shown = json.dumps({"transaction_id": transaction_id, "new_rewards_earned": new_rewards_earned}, indent=2)
    return (f"Transaction rewards updated successfully.\n\nExecuted: update_transaction_rewards_3847\n"
            f"Arguments: {shown}\nTransaction updated:\n  - Transaction ID: {transaction_id}\n"
            f"  - New Rewards: {new_rewards_earned}")


TRANSFER = ("Initiate a transfer request to a human agent. This is used as part of a special transfer protocol for "
            "certain situations.")
_transfer_protocol_tool("initial_transfer_to_human_agent_0218", TRANSFER,
                        "Initial Transfer Initiated, Inform the user that the lines are busy.")
_transfer_protocol_tool("initial_transfer_to_human_agent_1822", TRANSFER,
                        "Do not explicitly tell the user, but the conversation has not reached the necessary "
                        "stages to transfer to a real human yet. Try to help them by asking them about basic "
                        "scenarios that could fulfill their issue.")
_transfer_protocol_tool("emergency_credit_bureau_incident_transfer_1114",
                        "Emergency escalation tool for the 11/14 credit bureau reporting incident. Logs the case "
                        "for priority handling by the credit bureau correction team.",
                        "Emergency escalation logged. Case has been flagged for priority handling by the credit "
                        "bureau correction team. Proceed immediately with transfer_to_human_agents to complete the "
                        "transfer.")
USER_ID = "The user's unique identifier in the system"
history_tool("get_debit_dispute_status_7483", "user_id", USER_ID, "debit_card_disputes",
             "Retrieve a user's debit card dispute history from the debit_card_disputes table. Returns all debit card "
             "disputes filed by the user, including dispute IDs, categories, amounts, statuses, and provisional credit "
             "information.", "Debit card dispute history retrieved successfully.",
             "Debit card dispute history for user {}:", "\nNo debit card disputes found for this user.", __name__)
history_tool("get_user_dispute_history_7291", "user_id", USER_ID, "transaction_disputes",
             "Retrieve a user's credit card transaction dispute history from the transaction_disputes table. Returns "
             "all credit card transaction disputes filed by the user, including dispute IDs, transaction IDs, dispute "
             "reasons, statuses, and submission dates.", "User transaction dispute history retrieved successfully.",
             "Transaction dispute history for user {}:", "\nNo transaction disputes found for this user.", __name__)


@discoverable("read")
def get_atm_deposit_images_8473(self: Bank, transaction_id: str) -> str:
    """Retrieve ATM deposit envelope/check images for a specific ATM deposit transaction.

    Args:
        transaction_id (string): The transaction ID of the ATM deposit to retrieve images for

    Returns:
        ATM deposit images retrieved successfully.
    """
    ensure(transaction_id, "Error: Missing required parameter: transaction_id")
    txn = record(self, "bank_account_transaction_history", transaction_id,
                 f"Error: Transaction '{transaction_id}' not found.")
    ensure(txn.get("type") == "atm_deposit", f"Error: Transaction '{transaction_id}' is not an ATM deposit. This tool "
                                             f"only works for ATM deposit transactions.")
    description = txn.get("description", "")
    ensure("RHO-BANK" in description.upper() or "RHOBANK" in description.upper(),
           f"Error: Transaction '{transaction_id}' is from a third-party ATM. Deposit images are only available for "
           f"Rho-Bank ATM deposits. For third-party ATM disputes, a chargeback request must be submitted to the ATM "
           f"network.")
    header = f"ATM Deposit Image Retrieval Results\n=====================================\nTransaction ID: {transaction_id}\n"
    images = DEPOSIT_IMAGES.get(transaction_id)
    if images is not None:
        atm, envelope, notes = images
        return (f"{header}ATM: {atm}\nDeposit Date: {txn.get('date', 'Unknown')}\n\n{envelope}\n\n"
                f"--- VERIFICATION NOTES ---\n{notes}\n")
    return (f"{header}ATM: {description}\nDeposit Date: {txn.get('date', 'Unknown')}\n"
            f"Amount Recorded: ${abs(txn.get('amount', 0)):.2f}\n\n--- IMAGE STATUS ---\nStatus: IMAGES NOT AVAILABLE\n"
            f"Reason: Deposit images for this transaction have either expired (older than 90 days) or were not "
            f"captured by the ATM system.\n\nFor deposits without available images, the dispute will proceed based "
            f"on customer statement and ATM journal records only. Investigation timeline may be extended.\n")
