"""The coupling between the carrier's records and the user's phone (tau2's ``TelecomEnvironment.sync_tools``).

Run after every successful tool call (either side) and every initial-state action. Once the user's
phone number is known: the line's status says whether the line is active, its roaming flag whether
the user may roam, its usage against the plan's allowance plus refuels whether data is used up; a
payment request the user paid marks its bill paid and is cleared; then, if none is pending, the
customer's first bill awaiting payment becomes the user's payment request.
"""

from __future__ import annotations

from ctu.domains.base import DBView
from ctu.domains.telecom.tools import bills_awaiting_payment, customer_by_phone, line_by_phone, set_bill_paid


def _set(db: DBView, **values) -> None:
    current = db.get("user", "surroundings")
    if any(current[k] != v for k, v in values.items()):
        db.edit("user", "surroundings").update(values)


def sync(db: DBView) -> None:
    phone = db.get("user", "surroundings")["phone_number"]
    if phone is None:
        return
    line = line_by_phone(db, phone)
    plan = db.get("plans", line["plan_id"])
    if plan is None:
        raise ValueError(f"Wrong scenario, invalid plan id ({line['plan_id']}) for the phone number {phone}")
    _set(db, line_active=line["status"] == "Active", roaming_allowed=bool(line["roaming_enabled"]),
         mobile_data_usage_exceeded=line["data_used_gb"] >= plan["data_limit_gb"] + line["data_refueling_gb"])
    request = db.get("user", "surroundings")["payment_request"]
    if request is not None and request["paid"]:
        set_bill_paid(db, request["bill_id"])
        _set(db, payment_request=None)
    if db.get("user", "surroundings")["payment_request"] is None:
        bills = bills_awaiting_payment(db, customer_by_phone(db, phone))
        if bills:
            _set(db, payment_request={"bill_id": bills[0]["bill_id"], "amount_due": bills[0]["total_due"],
                                      "paid": False})
