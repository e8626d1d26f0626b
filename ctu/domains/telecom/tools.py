"""The telecom agent's tools over the carrier's records (tau2-bench ``domains/telecom/tools.py`` semantics).

Rules kept from tau2, quirks included: "today" is 2025-02-25; a customer found by phone is the
first whose primary number or one of whose lines has it (a customer listing a missing line fails
the lookup); ``get_details_by_id`` dispatches on the id's first letter; ``send_payment_request``
does not check whether the bill is already paid; a data refuel is charged to the customer's first
draft bill, or to a new draft bill for next month (tau2 names it ``B`` + 8 random hex digits; ctu
derives the digits from the customer and their bill count, so replays are reproducible);
``refuel_data`` does not check the line's status. Besides the tools, tasks may call
``set_data_usage`` and ``suspend_line_for_overdue_bill`` (initial states) and the ``assert_*``
functions (env assertions).
"""

from __future__ import annotations

import datetime as dt
import hashlib
from typing import Annotated, Any

from ctu.domains.base import DBView, ToolError, tool

TODAY = dt.date(2025, 2, 25)

CustomerId = Annotated[str, "ID of the customer who owns the line."]
LineId = Annotated[str, "ID of the line."]


# -- lookups (tau2's helpers; they raise tau2's ValueError messages) ---------------------
def _customer(db: DBView, customer_id: str) -> dict:
    customer = db.get("customers", customer_id)
    if customer is None:
        raise ToolError(f"Customer with ID {customer_id} not found")
    return customer


def _line(db: DBView, line_id: str) -> dict:
    line = db.get("lines", line_id)
    if line is None:
        raise ToolError(f"Line with ID {line_id} not found")
    return line


def _plan(db: DBView, plan_id: str) -> dict:
    plan = db.get("plans", plan_id)
    if plan is None:
        raise ToolError(f"Plan with ID {plan_id} not found")
    return plan


def _bill(db: DBView, bill_id: str) -> dict:
    bill = db.get("bills", bill_id)
    if bill is None:
        raise ToolError(f"Bill with ID {bill_id} not found")
    return bill


def _device(db: DBView, device_id: str) -> dict:
    device = db.get("devices", device_id)
    if device is None:
        raise ToolError(f"Device with ID {device_id} not found")
    return device


def line_by_phone(db: DBView, phone_number: str) -> dict:
    for _, line in db.items("lines"):
        if line["phone_number"] == phone_number:
            return line
    raise ToolError(f"Line with phone number {phone_number} not found")


def customer_by_phone(db: DBView, phone_number: str) -> dict:
    for _, customer in db.items("customers"):
        if customer["phone_number"] == phone_number:
            return customer
        for line_id in customer["line_ids"]:
            if _line(db, line_id)["phone_number"] == phone_number:
                return customer
    raise ToolError(f"Customer with phone number {phone_number} not found")


def _target_line(db: DBView, customer_id: str, line_id: str) -> dict:
    customer = _customer(db, customer_id)
    if line_id not in customer["line_ids"]:
        raise ToolError(f"Line {line_id} not found for customer {customer_id}")
    return _line(db, line_id)


def bills_awaiting_payment(db: DBView, customer: dict) -> list[dict]:
    return [b for b in (_bill(db, i) for i in customer["bill_ids"]) if b["status"] == "Awaiting Payment"]


def set_bill_paid(db: DBView, bill_id: str) -> None:
    _bill(db, bill_id)
    db.edit("bills", bill_id)["status"] = "Paid"


def _month_after(day: dt.date) -> dt.date:
    return (day.replace(day=1) + dt.timedelta(days=32)).replace(day=1)


def _apply_one_time_charge(db: DBView, customer_id: str, amount: float, description: str) -> None:
    customer = _customer(db, customer_id)
    draft_id = next((i for i in customer["bill_ids"] if _bill(db, i)["status"] == "Draft"), None)
    if draft_id is None:
        start = _month_after(TODAY)
        digest = hashlib.sha256(f"{customer_id}/{len(customer['bill_ids'])}".encode()).hexdigest()
        draft_id = f"B{digest[:8]}"
        db.put("bills", draft_id, {
            "bill_id": draft_id, "customer_id": customer_id, "period_start": str(start),
            "period_end": str(_month_after(start) - dt.timedelta(days=1)), "issue_date": str(start),
            "total_due": 0.0, "due_date": str(start + dt.timedelta(days=14)), "line_items": [], "status": "Draft"})
        db.edit("customers", customer_id)["bill_ids"].append(draft_id)
    bill = db.edit("bills", draft_id)
    bill["line_items"].append({"description": description, "amount": amount, "date": str(TODAY),
                               "item_type": "Credit" if amount < 0 else "Charge"})
    bill["total_due"] += amount


# -- tools --------------------------------------------------------------------------------
@tool()
def get_customer_by_phone(db, phone_number: Annotated[str, "The phone number to search for."]):
    """Finds a customer by their primary contact or line phone number."""
    return customer_by_phone(db, phone_number)


@tool()
def get_customer_by_id(db, customer_id: Annotated[str, "The unique identifier of the customer."]):
    """Retrieves a customer directly by their unique ID."""
    return _customer(db, customer_id)


@tool()
def get_customer_by_name(db, full_name: Annotated[str, "The full name of the customer."],
                         dob: Annotated[str, "Date of birth for verification, in the format YYYY-MM-DD."]):
    """Searches for customers by name and DOB. May return multiple matches if names are similar,
DOB helps disambiguate."""
    return [c for _, c in db.items("customers")
            if c["full_name"].lower() == full_name.lower() and c["date_of_birth"] == dob]


@tool()
def get_details_by_id(db, id: Annotated[str, "The ID of the object to retrieve."]):  # noqa: A002 (tau2's name)
    """Retrieves the details for a given ID.
The ID must be a valid ID for a Customer, Line, Device, Bill, or Plan."""
    lookup = {"L": _line, "D": _device, "B": _bill, "C": _customer, "P": _plan}.get(id[:1])
    if lookup is None:
        raise ToolError(f"Unknown ID format or type: {id}")
    return lookup(db, id)


@tool(mutates=True)
def suspend_line(db, customer_id: CustomerId, line_id: Annotated[str, "ID of the line to suspend."],
                 reason: Annotated[str, "Reason for suspension."]):
    """Suspends a specific line (max 6 months).
Checks: Line status must be Active.
Logic: Sets line status to Suspended, records suspension_start_date."""
    if _target_line(db, customer_id, line_id)["status"] != "Active":
        raise ToolError("Line must be active to suspend")
    line = db.edit("lines", line_id)
    line["status"] = "Suspended"
    line["suspension_start_date"] = str(TODAY)
    return {"message": "Line suspended successfully. $5/month holding fee will apply.", "line": line}


@tool(mutates=True)
def resume_line(db, customer_id: CustomerId, line_id: Annotated[str, "ID of the line to resume."]):
    """Resumes a suspended line.
Checks: Line status must be Suspended or Pending Activation.
Logic: Sets line status to Active, clears suspension_start_date."""
    if _target_line(db, customer_id, line_id)["status"] not in ("Suspended", "Pending Activation"):
        raise ToolError("Line must be suspended to resume")
    line = db.edit("lines", line_id)
    line["status"] = "Active"
    line["suspension_start_date"] = None
    return {"message": "Line resumed successfully", "line": line}


@tool()
def get_bills_for_customer(db, customer_id: Annotated[str, "ID of the customer."],
                           limit: Annotated[int, "Maximum number of bills to return."] = 12):
    """Retrieves a list of the customer's bills, most recent first."""
    bills = [_bill(db, i) for i in _customer(db, customer_id)["bill_ids"]]
    return sorted(bills, key=lambda b: b["issue_date"], reverse=True)[:int(limit)]


@tool(mutates=True)
def send_payment_request(db, customer_id: Annotated[str, "ID of the customer who owns the bill."],
                         bill_id: Annotated[str, "ID of the bill to send payment request for."]):
    """Sends a payment request to the customer for a specific bill.
Checks:
    - Customer exists
    - Bill exists and belongs to the customer
    - No other bills are already awaiting payment for this customer
Logic: Sets bill status to AWAITING_PAYMENT and notifies customer.
Warning: This method does not check if the bill is already PAID.
Always check the bill status before calling this method."""
    customer = _customer(db, customer_id)
    if bills_awaiting_payment(db, customer):
        raise ToolError("A bill is already awaiting payment for this customer")
    if bill_id not in customer["bill_ids"]:
        raise ToolError(f"Bill {bill_id} not found for customer {customer_id}")
    _bill(db, bill_id)
    db.edit("bills", bill_id)["status"] = "Awaiting Payment"
    return f"Payment request sent to the customer for bill {bill_id}"


@tool()
def get_data_usage(db, customer_id: CustomerId, line_id: Annotated[str, "ID of the line to check usage for."]):
    """Retrieves current billing cycle data usage for a line, including data
refueling amount, data limit, and cycle end date."""
    line = _target_line(db, customer_id, line_id)
    plan = _plan(db, line["plan_id"])
    # tau2 turns the numbers of a returned dict into strings (Environment.to_json_str)
    return {"line_id": line_id, "data_used_gb": str(line["data_used_gb"]), "data_limit_gb": str(plan["data_limit_gb"]),
            "data_refueling_gb": str(line["data_refueling_gb"]),
            "cycle_end_date": str(_month_after(TODAY) - dt.timedelta(days=1))}


@tool(mutates=True)
def enable_roaming(db, customer_id: CustomerId, line_id: Annotated[str, "ID of the line to enable roaming for."]):
    """Enables international roaming on a line."""
    if _target_line(db, customer_id, line_id)["roaming_enabled"]:
        return "Roaming was already enabled"
    db.edit("lines", line_id)["roaming_enabled"] = True
    return "Roaming enabled successfully"


@tool(mutates=True)
def disable_roaming(db, customer_id: CustomerId, line_id: Annotated[str, "ID of the line to disable roaming for."]):
    """Disables international roaming on a line."""
    if not _target_line(db, customer_id, line_id)["roaming_enabled"]:
        return "Roaming was already disabled"
    db.edit("lines", line_id)["roaming_enabled"] = False
    return "Roaming disabled successfully"


@tool()
def transfer_to_human_agents(db, summary: Annotated[str, "A summary of the user's issue."]):
    """Transfer the user to a human agent, with a summary of the user's issue.
Only transfer if
 -  the user explicitly asks for a human agent
 -  given the policy and the available tools, you cannot solve the user's issue."""
    return "Transfer successful"


@tool(mutates=True)
def refuel_data(db, customer_id: CustomerId, line_id: Annotated[str, "ID of the line to refuel data for."],
                gb_amount: Annotated[float, "Amount of data to add in gigabytes."]):
    """Refuels data for a specific line, adding to the customer's bill.
Checks: Line status must be Active, Customer owns the line.
Logic: Adds data to the line and charges customer based on the plan's refueling rate."""
    line = _target_line(db, customer_id, line_id)
    if gb_amount <= 0:
        raise ToolError("Refuel amount must be positive")
    price = _plan(db, line["plan_id"])["data_refueling_price_per_gb"]
    charge = gb_amount * price
    line = db.edit("lines", line_id)
    line["data_refueling_gb"] += gb_amount
    _apply_one_time_charge(db, customer_id, charge, f"Data refueling: {gb_amount} GB at ${price}/GB")
    return {"message": f"Successfully added {gb_amount} GB of data for line {line_id} for ${charge:.2f}",
            "new_data_refueling_gb": str(line["data_refueling_gb"]), "charge": str(charge)}


TOOLS = (get_customer_by_phone, get_customer_by_id, get_customer_by_name, get_details_by_id, suspend_line,
         resume_line, get_bills_for_customer, send_payment_request, get_data_usage, enable_roaming,
         disable_roaming, transfer_to_human_agents, refuel_data)


# -- functions tasks call (initial states, env assertions) ------------------------------------
def set_data_usage(db: DBView, customer_id: str, line_id: str, data_used_gb: float) -> str:
    _target_line(db, customer_id, line_id)
    db.edit("lines", line_id)["data_used_gb"] = data_used_gb
    return f"Data usage set to {data_used_gb} GB for line {line_id}"


def suspend_line_for_overdue_bill(db: DBView, customer_id: str, line_id: str, new_bill_id: str,
                                  contract_ended: bool) -> str:
    line = _line(db, line_id)
    if line["status"] != "Active":
        raise ToolError("Line must be active to suspend for unpaid bill")
    amount = _plan(db, line["plan_id"])["price_per_month"]
    if amount <= 0:
        raise ToolError("Amount must be positive for overdue bill")
    customer = _customer(db, customer_id)
    if any(_bill(db, i)["status"] == "Overdue" for i in customer["bill_ids"]):
        raise ToolError("Customer already has an overdue bill")
    last_day = TODAY.replace(day=1) - dt.timedelta(days=1)
    first_day = last_day.replace(day=1)
    db.put("bills", new_bill_id, {
        "bill_id": new_bill_id, "customer_id": customer_id, "period_start": str(first_day),
        "period_end": str(last_day), "issue_date": str(first_day), "total_due": 0.0 + amount,
        "due_date": str(first_day + dt.timedelta(days=14)),
        "line_items": [{"description": f"Charge for line {line_id}", "amount": amount, "date": str(TODAY),
                        "item_type": "Charge"}],
        "status": "Overdue"})
    db.edit("customers", customer_id)["bill_ids"].append(new_bill_id)
    line = db.edit("lines", line_id)
    line["status"] = "Suspended"
    line["suspension_start_date"] = str(TODAY)
    if contract_ended:
        line["contract_end_date"] = str(last_day)
    return f"Line {line_id} suspended for unpaid bill {new_bill_id}. Contract ended: {contract_ended}"


def assert_data_refueling_amount(db: DBView, customer_id: str, line_id: str, expected_amount: float) -> bool:
    return abs(_target_line(db, customer_id, line_id)["data_refueling_gb"] - expected_amount) < 1e-6


def assert_line_status(db: DBView, customer_id: str, line_id: str, expected_status: str) -> bool:
    return _target_line(db, customer_id, line_id)["status"] == expected_status


def assert_overdue_bill_exists(db: DBView, customer_id: str, overdue_bill_id: str) -> bool:
    if overdue_bill_id not in _customer(db, customer_id)["bill_ids"]:
        raise ToolError(f"Overdue bill {overdue_bill_id} not found")
    if _bill(db, overdue_bill_id)["status"] != "Overdue":
        raise ToolError(f"Overdue bill {overdue_bill_id} is not overdue")
    return True


def assert_no_overdue_bill(db: DBView, overdue_bill_id: str) -> bool:
    bill = db.get("bills", overdue_bill_id)
    return bill is None or bill["status"] == "Paid"


FUNCTIONS: dict[str, Any] = {
    **{t.name: t.effect for t in TOOLS},
    "set_data_usage": set_data_usage, "suspend_line_for_overdue_bill": suspend_line_for_overdue_bill,
    "assert_data_refueling_amount": assert_data_refueling_amount, "assert_line_status": assert_line_status,
    "assert_overdue_bill_exists": assert_overdue_bill_exists, "assert_no_overdue_bill": assert_no_overdue_bill,
}
