"""The user's tools (tau2's ``KnowledgeUserTools``): 6 of their own, and 4 discoverable ones the agent gives them
with ``give_discoverable_user_tool`` and they run with ``call_discoverable_user_tool``.

A discoverable user tool refuses to run unless it was given, and logs every run in
``user_discoverable_tool_calls``; so does tau2.
"""

from __future__ import annotations

import hashlib
import inspect
import json

from ctu.domains.banking_knowledge import ids
from ctu.domains.banking_knowledge.checks import bank_account, check_card_account, ensure, json_arguments
from ctu.domains.banking_knowledge.store import Bank, account_balance, found, lookup, query_database_tool
from ctu.domains.banking_knowledge.toolkit import USER, register, user_discoverable

CARD_TYPES = ["Bronze Rewards Card", "Business Bronze Rewards Card", "Business Gold Rewards Card",
              "Business Platinum Rewards Card", "Business Silver Rewards Card", "Crypto-Cash Back", "Diamond Elite Card",
              "EcoCard", "Gold Rewards Card", "Green Rewards Card", "Platinum Rewards Card", "Silver Rewards Card",
              "Silver Zoom Card"]
# card type -> {category: cash back percent}; "default" for the other categories
REWARD_RATES = {
    "Bronze Rewards Card": {"default": 1.0},
    "Silver Rewards Card": {"Travel": 4.0, "Software": 4.0, "default": 1.0},
    "Gold Rewards Card": {"default": 2.5},
    "Platinum Rewards Card": {"default": 10.0},
    "Business Bronze Rewards Card": {"default": 1.0},
    "Business Silver Rewards Card": {"Travel": 10.0, "Software": 10.0, "default": 1.0},
    "Green Rewards Card": {"Sustainable": 3.0, "default": 1.0},
    "Business Gold Rewards Card": {"Operations": 2.5, "default": 1.0},
    "Business Platinum Rewards Card": {"Travel": 4.0, "Software": 4.0, "Media": 4.0, "default": 1.5},
    "Silver Zoom Card": {"Transportation": 3.0, "default": 1.0},
    "Diamond Elite Card": {"default": 5.0},
    "EcoCard": {"Green": 5.0, "default": 1.0},
    "Crypto-Cash Back": {"default": 2.0},
}


def user_tool(kind: str, **options):
    return register(USER, "KnowledgeUserTools", kind, **options)


def given(self: Bank, tool_name: str, **arguments: object) -> dict:
    """How a discoverable user tool starts, as tau2's: refused unless the agent gave it, else the call is logged in
    ``user_discoverable_tool_calls``; the arguments, as logged."""
    ensure("No records found" not in lookup(self, "user_discoverable_tools", "tool_name", tool_name),
           f"Error: Tool '{tool_name}' has not been given to you by the agent. "
           f"The agent must first use `give_discoverable_user_tool` to give this tool to you.")
    self.add("user_discoverable_tool_calls", ids.user_tool_call_id(tool_name, arguments),
             {"tool_name": tool_name, "arguments": arguments, "called_at": ids.TODAY, "status": "CALLED"})
    return arguments


def ran(tool: str, lead: str, arguments: dict) -> str:
    return f"{lead}\n\nExecuted: {tool}\nArguments: {json.dumps(arguments, indent=2)}\n"


@user_tool("write", discoverable=True)
def submit_cash_back_dispute_0589(self: Bank, user_id: str, transaction_id: str) -> str:
    """Submit a cash back dispute for a specific transaction.

    Args:
        user_id (string): The user's unique identifier in the system
        transaction_id (string): The unique identifier for the transaction with incorrect cash back

    Returns:
        Cash back dispute submitted successfully. Your case has been queued for review.
    """
    arguments = given(self, "submit_cash_back_dispute_0589", user_id=user_id, transaction_id=transaction_id)
    dispute = ids.dispute_id(user_id, transaction_id)
    settings = (self.get("task_config", "dispute_settings") or {}) if self.any("task_config") else {}
    record = {"dispute_id": dispute, "user_id": user_id, "transaction_id": transaction_id, "submitted_at": ids.TODAY}
    if settings.get("auto_resolve_disputes", False):
        record.update(status="RESOLVED", resolution="APPROVED")
        status = ("Status: RESOLVED - The dispute has been reviewed and approved. The transaction rewards need to be "
                  "updated.")
    else:
        record["status"] = "SUBMITTED"
        status = "Status: SUBMITTED - Your dispute has been queued for review."
    note = (f"Dispute ID: {dispute}\n{status}" if self.add("cash_back_disputes", dispute, record)
            else "Note: Dispute may have already been submitted for this transaction.")
    return ran("submit_cash_back_dispute_0589", "Cash back dispute submitted successfully. Your case has been queued "
               "for review.", arguments) + note


@user_tool("write", discoverable=True)
def get_referral_link(self: Bank, user_id: str, card_name: str) -> str:
    """Generate a referral link for a specific credit card to share with friends or family.

    Args:
        user_id (string): The user's unique identifier in the system (the referrer)
        card_name (string): The name of the credit card to create a referral for (e.g., 'Gold Rewards Card')

    Returns:
        Referral link generated successfully. Share this link with the person you want to refer.
    """
    arguments = given(self, "get_referral_link", user_id=user_id, card_name=card_name)
    referral = ids.referral_link_id(user_id, card_name)
    stored = self.add("referrals", referral, {"referral_id": referral, "referrer_id": user_id,
                                              "referred_account_type": card_name, "referral_status": "NO_PROGRESS",
                                              "date": ids.TODAY})
    note = (f"Referral ID: {referral}\nReferral link: https://rhobank.com/refer/{referral}" if stored
            else "Note: A referral link for this card may have already been generated.")
    return ran("get_referral_link", "Referral link generated successfully. Share this link with the person you want "
               "to refer.", arguments) + note


@user_tool("read", discoverable=True)
def get_card_last_4_digits(self: Bank, credit_card_account_id: str) -> str:
    """Look up the last 4 digits of a credit card number.

    Args:
        credit_card_account_id (string): The credit card account ID to look up (e.g., 'cc_76ad9cc60e_gold')

    Returns:
        Card information retrieved successfully.
    """
    arguments = given(self, "get_card_last_4_digits", credit_card_account_id=credit_card_account_id)
    check_card_account(self, credit_card_account_id)
    digest = hashlib.sha256(f"card_last4:{credit_card_account_id}".encode()).hexdigest()
    last4 = "".join(c for c in digest if c.isdigit())[:4].ljust(4, "0")
    return ran("get_card_last_4_digits", "Card information retrieved successfully.", arguments) + \
        f"Last 4 digits of card: {last4}"


@user_tool("write", discoverable=True)
def deposit_check_3847(self: Bank, account_id: str, check_amount: float) -> str:
    """Deposit a check into a checking or savings account. The user takes a photo of the check and submits it through their mobile banking app.

    Args:
        account_id (string): The bank account ID to deposit the check into
        check_amount (number): The amount of the check in USD

    Returns:
        Check deposited successfully. Funds will be available according to your account's deposit policy.
    """
    arguments = given(self, "deposit_check_3847", account_id=account_id, check_amount=check_amount)
    try:
        amount = float(check_amount)
    except (ValueError, TypeError):
        return f"Error: Invalid check amount '{check_amount}'. Must be a number."
    ensure(not amount <= 0, "Error: Check amount must be positive.")
    account = bank_account(self, account_id)
    ensure(account.get("status") in ("ACTIVE", "OPEN"), f"Error: Account '{account_id}' is not active.")
    current = account_balance(account)
    new = current + amount
    self.edit("accounts", account_id)["current_holdings"] = f"${new:.2f}"
    return ran("deposit_check_3847", "Check deposited successfully. Funds will be available according to your "
               "account's deposit policy.", arguments) + \
        (f"Check deposit processed!\n  - Account: {account_id}\n  - Check Amount: ${amount:.2f}\n"
         f"  - Previous Balance: ${current:.2f}\n  - New Balance: ${new:.2f}")


@user_tool("write")
def apply_for_credit_card(self: Bank, card_type: str, customer_name: str, annual_income: float,
                          rho_bank_subscription: bool = False) -> str:
    """Apply for a credit card.

    Args:
        card_type: Type of credit card
        customer_name: Full legal name
        annual_income: Annual income in USD
        rho_bank_subscription: Whether user has Rho-Bank+ subscription
    """
    ensure(card_type in CARD_TYPES, f"Error: Invalid card_type '{card_type}'. Must be one of: {CARD_TYPES}")
    try:
        income = float(annual_income)
    except (TypeError, ValueError):
        return "Error: Invalid annual_income. Must be a number."
    application = ids.application_id(card_type, customer_name, income, rho_bank_subscription)
    record = {"application_id": application, "card_type": card_type, "customer_name": customer_name,
              "annual_income": income, "rho_bank_subscription": rho_bank_subscription, "status": "PENDING",
              "date": ids.TODAY}
    ensure(self.add("credit_card_applications", application, record),
           f"Failed to submit application: Record ID '{application}' may already exist.")
    return ("Credit card application submitted:\nYour application has been successfully submitted. "
            "You will receive a decision within 5-7 business days via email.")


@user_tool("write")
def submit_referral(self: Bank, user_id: str, account_type: str) -> str:
    """Submit a referral request to refer someone to open an account.

    Args:
        user_id: Your user ID (the referrer)
        account_type: The type of account you are referring someone to open
    """
    referral = ids.referral_id(user_id, account_type)
    if not self.add("referrals", referral, {"referral_id": referral, "referrer_id": user_id,
                                            "referred_account_type": account_type, "referral_status": "NO_PROGRESS",
                                            "date": ids.TODAY}):
        return f"Failed to submit referral: Record ID '{referral}' may already exist."
    return (f"Referral request submitted successfully!\n  - Referral ID: {referral}\n  - Referrer ID: {user_id}\n"
            f"  - Account Type: {account_type}\n  - Status: NO_PROGRESS\n  - Date: {ids.TODAY}\n\n"
            f"Share your referral ID with the person you're referring. "
            f"They will need to use this when applying for their account.")


@user_tool("write")
def call_discoverable_user_tool(self: Bank, discoverable_tool_name: str, arguments: str = "{}") -> str:
    """Call a tool that was given to you by the agent.

    Use this when the agent has instructed you to perform an action using
    a discoverable tool. The agent will have told you the tool name and arguments.

    This simulates you performing the action in the real world (e.g., opening
    a webpage, navigating to a section, clicking a button).

    Args:
        discoverable_tool_name: The name of the discoverable tool to call (e.g., "open_webpage")
        arguments: JSON string of arguments for the tool (e.g., '{"url": "https://example.com"}')

    Returns:
        The result of executing the discoverable tool
    """
    method = user_discoverable(discoverable_tool_name)
    given = json_arguments(arguments, parse_int=float)
    parameters = dict(list(inspect.signature(method.fn).parameters.items())[1:])  # the bound method's
    for name, param in parameters.items():
        ensure(param.default is not inspect.Parameter.empty or name in given,
               f"Error: Missing required parameter: {name}")
    for name in given:
        ensure(name in parameters, f"Error: Unexpected parameter: {name}")
    try:
        return method(self, given)
    except TypeError as exc:
        return f"Error: Invalid arguments for tool '{discoverable_tool_name}': {exc}"


@user_tool("read")
def list_discoverable_user_tools(self: Bank) -> str:
    """List all tools that have been given to you by the agent.

    Use this to see what actions the agent has instructed you to perform.

    Returns:
        A list of tools that have been given to you
    """
    result = query_database_tool(self, "user_discoverable_tools", "{}")
    if "No results found" in result:  # never true (an empty table answers "No records found"): tau2's test
        return "No tools have been given to you yet by the agent."
    return f"Tools given to you by the agent:\n{result}"


@user_tool("write")
def request_human_agent_transfer(self: Bank) -> str:
    """Request to be transferred to a human agent for assistance.

    Use this when you want to speak with a real human agent instead of
    the automated system. Each request will be logged and processed.

    Returns:
        Confirmation that your transfer request has been submitted
    """
    existing = query_database_tool(self, "human_transfer_requests", "{}")
    # tau2 counts the requests by the field name's occurrences in the listing
    count = 1 if not found(existing) else existing.count("request_id") + 1
    request_id = f"transfer_request_{count}"
    self.add("human_transfer_requests", request_id, {"request_id": request_id, "request_number": count,
                                                     "requested_at": ids.TODAY, "status": "PENDING"})
    return f"Transfer request #{count} submitted.\nThe agent will process your request."


@user_tool("write")
def submit_transaction(self: Bank, user_id: str, credit_card_type: str, merchant_name: str, amount: float,
                       category: str) -> str:
    """Submit a credit card transaction.

    Args:
        user_id: Your user ID
        credit_card_type: Type of credit card used (e.g., "Bronze Rewards Card", "Gold Rewards Card")
        merchant_name: Name of the merchant where the purchase was made
        amount: Transaction amount in USD (e.g., 127.43)
        category: Transaction category (e.g., "Groceries", "Dining", "Travel", "Software", "Entertainment", "Utilities", "Shopping")
    """
    ensure(credit_card_type in REWARD_RATES,
           f"Error: Unknown credit card type '{credit_card_type}'. Available types: {list(REWARD_RATES)}")
    txn = ids.transaction_id(user_id, credit_card_type, merchant_name, amount, category)
    rates = REWARD_RATES[credit_card_type]
    rate = rates.get(category, rates["default"])
    points = int(amount * rate)
    record = {"transaction_id": txn, "user_id": user_id, "credit_card_type": credit_card_type,
              "merchant_name": merchant_name, "transaction_amount": f"${amount:.2f}", "transaction_date": ids.TODAY,
              "category": category, "status": "COMPLETED", "rewards_earned": f"{points} points"}
    ensure(self.add("credit_card_transaction_history", txn, record),
           f"Failed to submit transaction: Record ID '{txn}' may already exist.")
    return (f"Transaction submitted successfully!\n  - Transaction ID: {txn}\n  - User ID: {user_id}\n"
            f"  - Card Type: {credit_card_type}\n  - Merchant: {merchant_name}\n  - Amount: ${amount:.2f}\n"
            f"  - Category: {category}\n  - Date: {ids.TODAY}\n"
            f"  - Rewards Earned: {points} points ({rate}% cashback rate)\n")
