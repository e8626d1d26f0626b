"""The airline domain: ctu's implementation of tau2-bench's airline tools over tau2's data files.

Semantics follow tau2-bench's ``domains/airline/tools.py`` exactly, quirks included:

* new reservations get the fixed ids HATHAT, HATHAU, HATHAV (then "Too many reservations") and
  the fixed timestamp 2024-05-15T15:00:00; certificates used to book are removed from the user,
  gift cards are debited; a certificate listed twice fails with ``'<id>'`` (tau2's KeyError)
  *after* the first one was removed and earlier gift cards were debited;
* cancelling appends a negative payment for every payment so far (twice if cancelled twice),
  credits no gift card and releases no seat;
* changing flights neither takes nor releases seats; a segment is kept at its old price only if
  the cabin is unchanged; a negative difference paid with a gift card credits it;
* baggage and flight updates refuse certificates and short gift cards; a zero price records no
  payment; ``update_reservation_baggages`` stores the counts as given (no pydantic validation on
  assignment), while ``book_reservation`` stores them as ints (the Reservation model validates);
* one-stop searches build the next day as ``2024-05-{day + 1}`` (no zero padding, no month roll);
* certificates sent are ``certificate_3221322``, ``…323``, ``…324`` (then "Too many certificates").

Records are the plain dicts tau2's pydantic models dump to (same field order, floats for gift
card and certificate amounts), so a tool's JSON text and the DB hash are tau2's.
"""

from __future__ import annotations

from ctu.domains.airline.tools import TOOLS, reservation_flight
from ctu.domains.base import Domain
from ctu.domains.tau2_data import read_domain_files

__all__ = ["TOOLS", "load"]


def _as_dumped(db: dict) -> dict:
    """Give the freshly loaded records the field order and defaults of tau2's model dumps."""
    for flight in db.get("flights", {}).values():
        for key in ("flight_number", "origin", "destination", "scheduled_departure_time_est",
                    "scheduled_arrival_time_est", "dates"):
            flight[key] = flight.pop(key)
    for reservation in db.get("reservations", {}).values():
        reservation["flights"] = [reservation_flight(f, f["date"], f["price"]) for f in reservation["flights"]]
        reservation.setdefault("status", None)
    for user in db.get("users", {}).values():
        for method in user["payment_methods"].values():
            if method.get("source") in ("gift_card", "certificate"):
                method["amount"] = float(method["amount"])  # GiftCard/Certificate.amount: float
    return db


def load(data_dir: str | None = None) -> Domain:
    files = read_domain_files("airline", data_dir)
    return Domain(name="airline", policy=files["policy"], tools=TOOLS, db=_as_dumped(files["db"]),
                  tasks=files["tasks"], splits=files["splits"], assertions={},
                  transfer_tool="transfer_to_human_agents")
