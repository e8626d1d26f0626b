"""Discoverable agent tools on bank accounts: opening, closing, transfers, credits, interest reports, statements."""

from __future__ import annotations

import datetime as dt
from typing import Any

from ctu.domains.banking_knowledge import ids
from ctu.domains.banking_knowledge.checks import bank_account, ensure, one_of, record
from ctu.domains.banking_knowledge.store import Bank, account_balance, format_records, found, lookup, query_db
from ctu.domains.banking_knowledge.toolkit import discoverable

ACCOUNT_TYPES = ["checking", "savings", "business_checking", "business_savings"]
# early closure: account level -> (fee in dollars, window in days since opening)
CHECKING_EARLY_CLOSURE = {"Light Blue Account": (15, 30), "Light Green Account": (15, 30),
                          "Green Fee-Free Account": (15, 30), "Blue Account": (25, 60), "Green Account": (25, 60),
                          "Evergreen Account": (50, 90), "Bluest Account": (100, 180)}
SAVINGS_EARLY_CLOSURE = {"Bronze Account": (20, 60), "Silver Account": (35, 90), "Silver Plus Account": (35, 90),
                         "Gold Account": (75, 180), "Gold Plus Account": (75, 180), "Gold Years Account": (75, 180),
                         "Platinum Account": (150, 270), "Platinum Plus Account": (150, 270),
                         "Diamond Elite Account": (150, 270)}
OPEN = ("ACTIVE", "OPEN")


def age_days(account: dict) -> int:
    """Days from the account's opening date to now (0 when the date does not parse)."""
    try:
        opened = dt.datetime.strptime(account.get("date_opened", ""), "%m/%d/%Y")
    except ValueError:
        return 0
    return (ids.NOW - opened).days


def _kind(account: dict) -> object:
    return account.get("account_type", account.get("class", ""))


def _eligible(accounts: list[dict], account_type: str) -> bool:
    """tau2's rules for opening a savings, business checking or business savings account."""
    personal = ["checking", "personal_checking"]
    if account_type == "savings":
        return any(_kind(a) in personal and a.get("status", "") in ["OPEN", "ACTIVE"] and age_days(a) >= 14
                   for a in accounts)
    if account_type == "business_checking":
        if any(a.get("status") == "CLOSED" for a in accounts):
            return False
        return any(_kind(a) in personal and a.get("status", "") in ["OPEN", "ACTIVE"] for a in accounts)
    if account_type == "business_savings":
        if any(account_balance(a) < 0 for a in accounts):
            return False
        return any(_kind(a) == "business_checking" and a.get("status", "") in ["OPEN", "ACTIVE"] and age_days(a) >= 30
                   for a in accounts)
    return True


@discoverable("write")
def open_bank_account_4821(self: Bank, user_id: str, account_type: str, account_class: str) -> str:
    """Open a new bank account for a customer.

    Args:
        user_id (string): The customer's unique identifier in the system
        account_type (string): Type of account to open. Must be one of: 'checking' (personal checking), 'savings' (personal savings), 'business_checking', 'business_savings'
        account_class (string): The full official account class name

    Returns:
        Bank account opened successfully.
    """
    ensure(user_id and account_type and account_class, "Error: Missing required parameters.")
    one_of("account_type", account_type, ACCOUNT_TYPES)
    ensure(_eligible([a for a in self.values("accounts") if a.get("user_id") == user_id], account_type),
           "Error: Account eligibility requirements not met.")
    account_id = ids.hex_id(f"account:{user_id}:{account_type}:{account_class}")
    record = {"account_id": account_id, "user_id": user_id, "account_type": account_type,
              "account_class": account_class, "current_holdings": "0.00", "status": "OPEN", "date_opened": ids.TODAY}
    ensure(self.add("accounts", account_id, record),
           f"Failed to open account: Account ID '{account_id}' may already exist.")
    return (f"Bank account opened successfully!\n  - Account ID: {account_id}\n  - User ID: {user_id}\n"
            f"  - Account Type: {account_type}\n  - Account Class: {account_class}\n  - Status: OPEN\n"
            f"  - Initial Balance: $0.00\n  - Date Opened: {ids.TODAY}")


def _early_closure_fee(account: dict, balance: float) -> float | None:
    """The early closure fee due (0 outside the window), or None when the balance cannot cover it."""
    level, kind, opened = account.get("level", ""), account.get("class", ""), account.get("date_opened", "")
    rule = None
    if kind == "checking":
        rule = CHECKING_EARLY_CLOSURE.get(level)
    elif kind == "savings":
        rule = SAVINGS_EARLY_CLOSURE.get(level)
    if not rule or not opened:
        return 0.0
    try:
        age = (ids.NOW - dt.datetime.strptime(opened, "%m/%d/%Y")).days
    except ValueError:
        return 0.0
    fee, window = rule
    if age >= window:
        return 0.0
    return None if balance < fee else fee


@discoverable("write")
def close_bank_account_7392(self: Bank, account_id: str, reason: str = "Customer requested closure",
                            waive_early_closure_fee: bool = False) -> str:
    """Close a customer's bank account (checking or savings).

    Args:
        account_id (string): The ID of the bank account to close
        reason (string, optional): The reason for closing the account
        waive_early_closure_fee (boolean, optional): Whether to waive early closure fees

    Returns:
        Bank account closed successfully.
    """
    ensure(account_id, "Error: Missing required parameter (account_id).")
    account = bank_account(self, account_id)
    ensure(account.get("status") != "CLOSED", f"Error: Account '{account_id}' is already closed.")
    balance = account_balance(account)
    fee = 0.0 if waive_early_closure_fee else _early_closure_fee(account, balance)
    ensure(fee is not None, "Error: Account unable to be closed.")
    ensure(balance - fee == 0,  # type: ignore[operator]  # fee is not None: ensured above
           f"Error: Account balance must be $0.00 before closing. Current balance: ${balance:.2f}")
    account = self.edit("accounts", account_id)
    account.update(status="CLOSED", date_closed=ids.TODAY, closure_reason=reason,
                   early_closure_fee_waived=waive_early_closure_fee)
    return (f"Bank account closed successfully!\n  - Account ID: {account_id}\n"
            f"  - Account Type: {account.get('account_type', 'N/A')}\n"
            f"  - Account Class: {account.get('account_class', 'N/A')}\n  - Status: CLOSED\n"
            f"  - Date Closed: {ids.TODAY}\n  - Reason: {reason}\n"
            f"  - Early Closure Fee Waived: {'Yes' if waive_early_closure_fee else 'No'}")


@discoverable("read")
def get_all_user_accounts_by_user_id_3847(self: Bank, user_id: str) -> str:
    """Retrieve all accounts (checking, savings, credit cards) for a customer.

    Args:
        user_id (string): The customer's unique identifier in the system

    Returns:
        User accounts retrieved successfully.
    """
    ensure(user_id, "Error: Missing required parameter: user_id")
    bank = lookup(self, "accounts", "user_id", user_id)
    cards = lookup(self, "credit_card_accounts", "user_id", user_id)
    return "\n".join(["User accounts retrieved successfully.", "", "Executed: get_all_user_accounts_by_user_id_3847",
                      f"Accounts for user {user_id}:", "", "Bank Accounts:",
                      bank if found(bank) else "  No bank accounts found.", "\nCredit Card Accounts:",
                      cards if found(cards) else "  No credit card accounts found."])


@discoverable("write")
def transfer_funds_between_bank_accounts_7291(self: Bank, source_account_id: str, destination_account_id: str,
                                              amount: float) -> str:
    """Transfer funds from one bank account to another.

    Args:
        source_account_id (string): The account ID to transfer funds from
        destination_account_id (string): The account ID to transfer funds to
        amount (number): The amount to transfer in USD

    Returns:
        Funds transferred successfully.
    """
    ensure(source_account_id and destination_account_id and amount is not None,
           "Error: Missing required parameters (source_account_id, destination_account_id, amount).")
    try:
        amount = float(amount)
    except (ValueError, TypeError):
        return f"Error: Invalid amount '{amount}'. Must be a number."
    ensure(not amount <= 0, "Error: Transfer amount must be positive.")
    ensure(source_account_id != destination_account_id, "Error: Source and destination accounts cannot be the same.")
    source = record(self, "accounts", source_account_id, f"Error: Source account '{source_account_id}' not found.")
    dest = record(self, "accounts", destination_account_id,
                  f"Error: Destination account '{destination_account_id}' not found.")
    ensure(source.get("status") in OPEN, f"Error: Source account '{source_account_id}' is not active.")
    ensure(dest.get("status") in OPEN, f"Error: Destination account '{destination_account_id}' is not active.")
    source_balance = account_balance(source)
    ensure(not source_balance < amount, f"Error: Insufficient funds. Source account balance is ${source_balance:.2f}, "
                                        f"but transfer amount is ${amount:.2f}.")
    new_source, new_dest = source_balance - amount, account_balance(dest) + amount
    self.edit("accounts", source_account_id)["current_holdings"] = f"${new_source:.2f}"
    self.edit("accounts", destination_account_id)["current_holdings"] = f"${new_dest:.2f}"
    return (f"Transfer completed successfully!\n  - Amount: ${amount:.2f}\n"
            f"  - From: {source_account_id} (new balance: ${new_source:.2f})\n"
            f"  - To: {destination_account_id} (new balance: ${new_dest:.2f})")


def _credit(self: Bank, account_id: Any, amount: Any, credit_type: Any, kinds: tuple[str, ...],
            types: dict[str, str], not_kind: str, seed: str, dollar: str) -> str:
    """The shared body of the checking and savings credits (tau2 writes the two balances differently: ``dollar``)."""
    ensure(account_id and amount is not None and credit_type, "Error: Missing required parameters.")
    try:
        amount = float(amount)
    except (TypeError, ValueError):
        return "Error: Invalid credit amount. Must be a number."
    ensure(not amount <= 0, "Error: Credit amount must be positive.")
    one_of("credit_type", credit_type, list(types))
    account = bank_account(self, account_id)
    ensure(account.get("class", "").lower() in kinds, f"Error: Account '{account_id}' is not {not_kind}")
    ensure(account.get("status") in OPEN, f"Error: Account '{account_id}' is not active.")
    current = account_balance(account)
    new = current + amount
    self.edit("accounts", account_id)["current_holdings"] = f"{dollar}{new:.2f}"
    txn = f"txn_{ids.hex_id(f'{seed}:{account_id}:{credit_type}:{amount}:{ids.TODAY}')}"
    self.put("bank_account_transaction_history", txn,
             {"transaction_id": txn, "account_id": account_id, "date": ids.TODAY, "description": types[credit_type],
              "amount": amount, "type": credit_type, "status": "posted"})
    return (f"\nCredit applied successfully!\n  - Transaction ID: {txn}\n  - Account: {account_id}\n"
            f"  - Credit Type: {credit_type}\n  - Amount: ${amount:.2f}\n  - Previous Balance: ${current:.2f}\n"
            f"  - New Balance: ${new:.2f}")


@discoverable("write")
def apply_checking_account_credit_5829(self: Bank, account_id: str, amount: float, credit_type: str) -> str:
    """Apply a credit to a customer's checking account.

    Args:
        account_id (string): The checking account ID to credit
        amount (number): The positive dollar amount to credit (must be greater than 0)
        credit_type (string): The type of credit: 'rebate_credit' for missing rebates, 'fee_refund' for incorrect fee charges

    Returns:
        Credit applied to checking account successfully.
    """
    return _credit(self, account_id, amount, credit_type, ("checking",),
                   {"rebate_credit": "REBATE CREDIT - CUSTOMER SERVICE", "fee_refund": "FEE REFUND - CUSTOMER SERVICE"},
                   "a checking account. Credits can only be applied to checking accounts.", "checking_credit", "$")


@discoverable("write")
def apply_savings_account_credit_6831(self: Bank, account_id: str, amount: float, credit_type: str) -> str:
    """Apply a credit to a customer's savings account for interest corrections, fee refunds, or goodwill adjustments.

    Args:
        account_id (string): The savings account ID to credit
        amount (number): The positive dollar amount to credit (must be greater than 0)
        credit_type (string): The type of credit: 'interest_correction' for APY/interest calculation errors, 'fee_refund' for incorrect fee charges, 'goodwill_credit' for customer service gestures

    Returns:
        Credit applied to savings account successfully.
    """
    return _credit(self, account_id, amount, credit_type, ("saving", "savings"),
                   {"interest_correction": "INTEREST CORRECTION - CUSTOMER SERVICE",
                    "fee_refund": "FEE REFUND - CUSTOMER SERVICE", "goodwill_credit": "GOODWILL CREDIT - CUSTOMER SERVICE"},
                   "a savings account. This tool only applies to savings accounts.", "savings_credit", "")


@discoverable("write")
def submit_interest_discrepancy_report_7294(self: Bank, account_id: str, user_id: str, expected_apy: float,
                                            actual_apy: float, amount_difference: float) -> str:
    """Submit a report for interest calculation discrepancies to the backend team for investigation. Use this when the interest credited to a customer's account does not match expected APY calculations.

    Args:
        account_id (string): The savings account ID with the discrepancy
        user_id (string): The customer's unique identifier
        expected_apy (number): The APY percentage the customer should have received (e.g., 2.775 for 2.775%)
        actual_apy (number): The APY percentage that was actually applied (e.g., 2.5 for 2.5%)
        amount_difference (number): The dollar amount difference between expected and actual interest credited

    Returns:
        Interest discrepancy report submitted successfully. Backend team will investigate.
    """
    ensure(account_id and user_id and all(v is not None for v in (expected_apy, actual_apy, amount_difference)),
           "Error: Missing required parameters.")
    try:
        expected_apy, actual_apy, amount_difference = float(expected_apy), float(actual_apy), float(amount_difference)
    except (ValueError, TypeError):
        return "Error: expected_apy, actual_apy, and amount_difference must be numbers."
    account = bank_account(self, account_id)
    user = record(self, "users", user_id, f"Error: User '{user_id}' not found.")
    report_id = f"IDR_{ids.hex_id(f'interest_report:{account_id}:{user_id}:{expected_apy}:{actual_apy}:{ids.TODAY}')}"
    # tau2 files the report in a table its DB does not have: nothing is stored
    self.add("interest_discrepancy_reports", report_id, {"report_id": report_id})
    return (f"\nInterest Discrepancy Report Submitted Successfully!\n  - Report ID: {report_id}\n"
            f"  - Account: {account_id} ({account.get('level', 'Unknown')})\n"
            f"  - Customer: {user.get('name', 'Unknown')}\n  - Expected APY: {expected_apy}%\n"
            f"  - Actual APY: {actual_apy}%\n  - APY Difference: {round(expected_apy - actual_apy, 4)}%\n"
            f"  - Amount Difference: ${amount_difference:.2f}\n  - Status: PENDING_REVIEW\n"
            f"\nThe backend team will investigate this discrepancy and ensure "
            f"correct APY calculations are applied going forward.")


def _posted_at(item: tuple[str, dict]) -> dt.datetime:
    text = str(item[1].get("date", ""))
    for fmt in ("%m/%d/%Y %H:%M:%S", "%m/%d/%Y"):
        try:
            return dt.datetime.strptime(text, fmt)
        except ValueError:
            continue
    return dt.datetime.min


@discoverable("read")
def get_bank_account_transactions_9173(self: Bank, account_id: str) -> str:
    """Retrieve the transaction history for a bank account.

    Transactions are returned in reverse chronological order (most recent
    first).

    Args:
        account_id (string): The bank account ID to retrieve transactions for

    Returns:
        Bank account transactions retrieved successfully.
    """
    ensure(account_id, "Error: Missing required parameter: account_id")
    bank_account(self, account_id)
    # newest first; a stable sort keeps same-date records in stored order
    txns = sorted(query_db("bank_account_transaction_history", db=self, return_ids=True, account_id=account_id),
                  key=_posted_at, reverse=True)
    body = format_records("bank_account_transaction_history", txns) if txns else "\nNo transactions found for this account."
    return "\n".join(["Bank account transactions retrieved successfully.", "",
                      "Executed: get_bank_account_transactions_9173", f"Transactions for account {account_id}:", body])
