"""The airline domain: ctu's implementation of tau2-bench's airline tools over tau2's data files.

Semantics follow tau2-bench's ``domains/airline/tools.py`` exactly, quirks included:
new reservations get the fixed ids HATHAT, HATHAU, HATHAV and the fixed timestamp
2024-05-15T15:00:00; certificates are removed when used to book; gift cards are debited
(``amount``); cancelling refunds with negative payments but neither credits gift cards nor
releases seats; changing flights neither takes nor releases seats, and a negative price
difference paid with a gift card credits it; one-stop searches build the next day's date
without zero padding; certificates sent are ``certificate_3221322`` and on.
"""

from __future__ import annotations

import copy
from typing import Annotated, Literal, TypedDict

from ctu.domains.base import DBView, Domain, ToolError, tool
from ctu.domains.retail import calculate, transfer_to_human_agents
from ctu.domains.tau2_data import read_domain_files

NOW = "2024-05-15T15:00:00"
NEW_RESERVATION_IDS = ("HATHAT", "HATHAU", "HATHAV")
NEW_PAYMENT_IDS = (3221322, 3221323, 3221324)
Cabin = Literal["business", "economy", "basic_economy"]
ReservationId = Annotated[str, "The reservation ID, such as 'ZFA04Y'."]
UpdatePaymentId = Annotated[str, "The payment id stored in user profile, such as 'credit_card_7815826', "
                                 "'gift_card_7815826', 'certificate_7815826'."]
AIRPORTS = (("SFO", "San Francisco"), ("JFK", "New York"), ("LAX", "Los Angeles"), ("ORD", "Chicago"),
            ("DFW", "Dallas"), ("DEN", "Denver"), ("SEA", "Seattle"), ("ATL", "Atlanta"), ("MIA", "Miami"),
            ("BOS", "Boston"), ("PHX", "Phoenix"), ("IAH", "Houston"), ("LAS", "Las Vegas"), ("MCO", "Orlando"),
            ("EWR", "Newark"), ("CLT", "Charlotte"), ("MSP", "Minneapolis"), ("DTW", "Detroit"),
            ("PHL", "Philadelphia"), ("LGA", "LaGuardia"))


class FlightInfo(TypedDict):
    flight_number: Annotated[str, "Flight number, such as 'HAT001'."]
    date: Annotated[str, "The date for the flight in the format 'YYYY-MM-DD', such as '2024-05-01'."]


class Passenger(TypedDict):
    first_name: Annotated[str, "Passenger's first name"]
    last_name: Annotated[str, "Passenger's last name"]
    dob: Annotated[str, "Date of birth in YYYY-MM-DD format"]


class Payment(TypedDict):
    payment_id: Annotated[str, "Unique identifier for the payment"]
    amount: Annotated[int, "Payment amount in dollars"]


def _flight_info(f: dict) -> dict:
    return {"flight_number": f["flight_number"], "date": f["date"]}


def _passenger(p: dict) -> dict:
    return {"first_name": p["first_name"], "last_name": p["last_name"], "dob": p["dob"]}


def _payment(p: dict) -> dict:
    return {"payment_id": p["payment_id"], "amount": int(p["amount"])}


# -- lookups --------------------------------------------------------------------------------
def _user(db: DBView, user_id: str) -> dict:
    user = db.get("users", user_id)
    if user is None:
        raise ToolError(f"User {user_id} not found")
    return user


def _reservation(db: DBView, reservation_id: str) -> dict:
    reservation = db.get("reservations", reservation_id)
    if reservation is None:
        raise ToolError(f"Reservation {reservation_id} not found")
    return reservation


def _flight(db: DBView, flight_number: str) -> dict:
    flight = db.get("flights", flight_number)
    if flight is None:
        raise ToolError(f"Flight {flight_number} not found")
    return flight


def _flight_instance(db: DBView, flight_number: str, date: str) -> dict:
    flight = _flight(db, flight_number)
    if date not in flight["dates"]:
        raise ToolError(f"Flight {flight_number} not found on date {date}")
    return flight["dates"][date]


def _search_direct(db: DBView, date: str, origin=None, destination=None, leave_after=None) -> list[dict]:
    results = []
    for _, flight in db.items("flights"):
        day = flight["dates"].get(date)
        if ((origin is None or flight["origin"] == origin)
                and (destination is None or flight["destination"] == destination)
                and day is not None and day["status"] == "available"
                and (leave_after is None or flight["scheduled_departure_time_est"] >= leave_after)):
            results.append({
                "flight_number": flight["flight_number"], "origin": flight["origin"],
                "destination": flight["destination"], "status": "available",
                "scheduled_departure_time_est": flight["scheduled_departure_time_est"],
                "scheduled_arrival_time_est": flight["scheduled_arrival_time_est"], "date": None,
                "available_seats": dict(day["available_seats"]), "prices": dict(day["prices"]),
            })
    return results


def _pay_for_update(db: DBView, user_id: str, payment_id: str, total_price) -> dict | None:
    """tau2's ``_payment_for_update``: checks, debits a gift card (credits it if negative)."""
    method = _user(db, user_id)["payment_methods"].get(payment_id)
    if method is None:
        raise ToolError("Payment method not found")
    if method["source"] == "certificate":
        raise ToolError("Certificate cannot be used to update reservation")
    if method["source"] == "gift_card" and method["amount"] < total_price:
        raise ToolError("Gift card balance is not enough")
    if method["source"] == "gift_card":
        db.edit("users", user_id)["payment_methods"][payment_id]["amount"] -= total_price
    return {"payment_id": payment_id, "amount": total_price} if total_price != 0 else None


# -- tools --------------------------------------------------------------------------------------
@tool(mutates=True)
def book_reservation(db, user_id: Annotated[str, "The ID of the user to book the reservation such as 'sara_doe_496'`."],
                     origin: Annotated[str, "The IATA code for the origin city such as 'SFO'."],
                     destination: Annotated[str, "The IATA code for the destination city such as 'JFK'."],
                     flight_type: Annotated[Literal["round_trip", "one_way"], "The type of flight such as 'one_way' or 'round_trip'."],
                     cabin: Annotated[Cabin, "The cabin class such as 'basic_economy', 'economy', or 'business'."],
                     flights: Annotated[list[FlightInfo], "An array of objects containing details about each piece of flight."],
                     passengers: Annotated[list[Passenger], "An array of objects containing details about each passenger."],
                     payment_methods: Annotated[list[Payment], "An array of objects containing details about each payment method."],
                     total_baggages: Annotated[int, "The total number of baggage items to book the reservation."],
                     nonfree_baggages: Annotated[int, "The number of non-free baggage items to book the reservation."],
                     insurance: Annotated[Literal["yes", "no"], "Whether the reservation has insurance."]):
    """Book a reservation."""
    flights = [_flight_info(f) for f in flights]
    passengers = [_passenger(p) for p in passengers]
    payments = [_payment(p) for p in payment_methods]
    user = _user(db, user_id)
    reservation_id = next((r for r in NEW_RESERVATION_IDS if db.get("reservations", r) is None), None)
    if reservation_id is None:
        raise ToolError("Too many reservations")
    reservation = {
        "reservation_id": reservation_id, "user_id": user_id, "origin": origin, "destination": destination,
        "flight_type": flight_type, "cabin": cabin, "flights": [], "passengers": copy.deepcopy(passengers),
        "payment_history": copy.deepcopy(payments), "created_at": NOW, "total_baggages": int(total_baggages),
        "nonfree_baggages": int(nonfree_baggages), "insurance": insurance, "status": None,
    }
    total_price = 0
    booked: list[tuple[str, str]] = []
    for info in flights:
        flight = _flight(db, info["flight_number"])
        day = _flight_instance(db, info["flight_number"], info["date"])
        if day["status"] != "available":
            raise ToolError(f"Flight {info['flight_number']} not available on date {info['date']}")
        if day["available_seats"][cabin] < len(passengers):
            raise ToolError(f"Not enough seats on flight {info['flight_number']}")
        price = day["prices"][cabin]
        reservation["flights"].append({"flight_number": info["flight_number"], "origin": flight["origin"],
                                       "destination": flight["destination"], "date": info["date"], "price": price})
        booked.append((info["flight_number"], info["date"]))
        total_price += price * len(passengers)
    if insurance == "yes":
        total_price += 30 * len(passengers)
    total_price += 50 * int(nonfree_baggages)
    for payment in payments:
        method = user["payment_methods"].get(payment["payment_id"])
        if method is None:
            raise ToolError(f"Payment method {payment['payment_id']} not found")
        if method["source"] in ("gift_card", "certificate") and method["amount"] < payment["amount"]:
            raise ToolError(f"Not enough balance in payment method {payment['payment_id']}")
    total_payment = sum(p["amount"] for p in payments)
    if total_payment != total_price:
        raise ToolError(f"Payment amount does not add up, total price is {total_price}, but paid {total_payment}")
    user = db.edit("users", user_id)
    for payment in payments:
        method = user["payment_methods"].get(payment["payment_id"])
        if method is None:  # a certificate listed twice was already removed: tau2 raises KeyError here
            raise ToolError(f"'{payment['payment_id']}'")
        if method["source"] == "gift_card":
            method["amount"] -= payment["amount"]
        elif method["source"] == "certificate":
            user["payment_methods"].pop(payment["payment_id"])
    for flight_number, date in booked:
        db.edit("flights", flight_number)["dates"][date]["available_seats"][cabin] -= len(passengers)
    db.put("reservations", reservation_id, reservation)
    user["reservations"].append(reservation_id)
    return reservation


@tool(mutates=True)
def cancel_reservation(db, reservation_id: ReservationId):
    """Cancel the whole reservation."""
    _reservation(db, reservation_id)
    reservation = db.edit("reservations", reservation_id)
    refunds = [{"payment_id": p["payment_id"], "amount": -p["amount"]} for p in reservation["payment_history"]]
    reservation["payment_history"].extend(refunds)
    reservation["status"] = "cancelled"
    return reservation


@tool()
def get_reservation_details(db, reservation_id: Annotated[str, "The reservation ID, such as '8JX2WO'."]):
    """Get the details of a reservation."""
    return _reservation(db, reservation_id)


@tool()
def get_user_details(db, user_id: Annotated[str, "The user ID, such as 'sara_doe_496'."]):
    """Get the details of a user, including their reservations."""
    return _user(db, user_id)


@tool()
def list_all_airports(db):
    """Returns a list of all available airports."""
    return [{"iata": iata, "city": city} for iata, city in AIRPORTS]


_SEARCH_DOC = {"origin": "The origin city airport in three letters, such as 'JFK'.",
               "destination": "The destination city airport in three letters, such as 'LAX'."}


@tool()
def search_direct_flight(db, origin: Annotated[str, _SEARCH_DOC["origin"]],
                         destination: Annotated[str, _SEARCH_DOC["destination"]],
                         date: Annotated[str, "The date of the flight in the format 'YYYY-MM-DD', such as '2024-01-01'."]):
    """Search for direct flights between two cities on a specific date."""
    return _search_direct(db, date=date, origin=origin, destination=destination)


@tool()
def search_onestop_flight(db, origin: Annotated[str, _SEARCH_DOC["origin"]],
                          destination: Annotated[str, _SEARCH_DOC["destination"]],
                          date: Annotated[str, "The date of the flight in the format 'YYYY-MM-DD', such as '2024-05-01'."]):
    """Search for one-stop flights between two cities on a specific date."""
    results = []
    for first in _search_direct(db, date=date, origin=origin):
        first["date"] = date
        try:
            next_day = f"2024-05-{int(date[-2:]) + 1}"  # tau2 quirk: no zero padding
        except ValueError as exc:
            raise ToolError(str(exc)) from None
        date2 = next_day if "+1" in first["scheduled_arrival_time_est"] else date
        for second in _search_direct(db, date=date2, origin=first["destination"], destination=destination,
                                     leave_after=first["scheduled_arrival_time_est"]):
            second["date"] = date2
            results.append([first, second])
    return results


@tool(mutates=True)
def send_certificate(db, user_id: Annotated[str, "The ID of the user to book the reservation, such as 'sara_doe_496'."],
                     amount: Annotated[int, "The amount of the certificate to send."]):
    """Send a certificate to a user. Be careful!"""
    user = _user(db, user_id)
    for payment_id in (f"certificate_{n}" for n in NEW_PAYMENT_IDS):
        if payment_id not in user["payment_methods"]:
            db.edit("users", user_id)["payment_methods"][payment_id] = {
                "source": "certificate", "id": payment_id, "amount": float(amount)}
            return f"Certificate {payment_id} added to user {user_id} with amount {amount}."
    raise ToolError("Too many certificates")


@tool(mutates=True)
def update_reservation_baggages(db, reservation_id: Annotated[str, "The reservation ID, such as 'ZFA04Y'"],
                                total_baggages: Annotated[int, "The updated total number of baggage items included in the reservation."],
                                nonfree_baggages: Annotated[int, "The updated number of non-free baggage items included in the reservation."],
                                payment_id: UpdatePaymentId):
    """Update the baggage information of a reservation."""
    reservation = _reservation(db, reservation_id)
    _user(db, reservation["user_id"])
    total_price = 50 * max(0, int(nonfree_baggages) - reservation["nonfree_baggages"])
    payment = _pay_for_update(db, reservation["user_id"], payment_id, total_price)
    reservation = db.edit("reservations", reservation_id)
    if payment is not None:
        reservation["payment_history"].append(payment)
    reservation["total_baggages"] = int(total_baggages)
    reservation["nonfree_baggages"] = int(nonfree_baggages)
    return reservation


@tool(mutates=True)
def update_reservation_flights(db, reservation_id: ReservationId,
                               cabin: Annotated[Cabin, "The cabin class of the reservation"],
                               flights: Annotated[list[FlightInfo], "An array of objects containing details about each piece of flight in the ENTIRE new reservation. Even if the a flight segment is not changed, it should still be included in the array."],
                               payment_id: UpdatePaymentId):
    """Update the flight information of a reservation."""
    flights = [_flight_info(f) for f in flights]
    reservation = _reservation(db, reservation_id)
    _user(db, reservation["user_id"])
    n = len(reservation["passengers"])
    total_price = 0
    new_flights = []
    for info in flights:
        same = next((f for f in reservation["flights"] if f["flight_number"] == info["flight_number"]
                     and f["date"] == info["date"] and cabin == reservation["cabin"]), None)
        if same is not None:
            total_price += same["price"] * n
            new_flights.append(copy.deepcopy(same))
            continue
        flight = _flight(db, info["flight_number"])
        day = _flight_instance(db, info["flight_number"], info["date"])
        if day["status"] != "available":
            raise ToolError(f"Flight {info['flight_number']} not available on date {info['date']}")
        if day["available_seats"][cabin] < n:
            raise ToolError(f"Not enough seats on flight {info['flight_number']}")
        new_flights.append({"flight_number": info["flight_number"], "origin": flight["origin"],
                            "destination": flight["destination"], "date": info["date"], "price": day["prices"][cabin]})
        total_price += day["prices"][cabin] * n
    total_price -= sum(f["price"] for f in reservation["flights"]) * n
    payment = _pay_for_update(db, reservation["user_id"], payment_id, total_price)
    reservation = db.edit("reservations", reservation_id)
    if payment is not None:
        reservation["payment_history"].append(payment)
    reservation["flights"] = new_flights
    reservation["cabin"] = cabin
    return reservation


@tool(mutates=True)
def update_reservation_passengers(db, reservation_id: ReservationId,
                                  passengers: Annotated[list[Passenger], "An array of objects containing details about each passenger."]):
    """Update the passenger information of a reservation."""
    passengers = [_passenger(p) for p in passengers]
    reservation = _reservation(db, reservation_id)
    if len(passengers) != len(reservation["passengers"]):
        raise ToolError("Number of passengers does not match")
    db.edit("reservations", reservation_id)["passengers"] = copy.deepcopy(passengers)
    return db.get("reservations", reservation_id)


@tool()
def get_flight_status(db, flight_number: Annotated[str, "The flight number."],
                      date: Annotated[str, "The date of the flight."]):
    """Get the status of a flight."""
    return _flight_instance(db, flight_number, date)["status"]


TOOLS = (book_reservation, calculate, cancel_reservation, get_reservation_details, get_user_details,
         list_all_airports, search_direct_flight, search_onestop_flight, send_certificate, transfer_to_human_agents,
         update_reservation_baggages, update_reservation_flights, update_reservation_passengers, get_flight_status)


def _as_dumped(db: dict) -> dict:
    """Records in the field order and with the defaults of tau2's pydantic models."""
    for flight in db.get("flights", {}).values():
        for key in ("flight_number", "origin", "destination", "scheduled_departure_time_est",
                    "scheduled_arrival_time_est", "dates"):
            flight[key] = flight.pop(key)
    for reservation in db.get("reservations", {}).values():
        reservation["flights"] = [{"flight_number": f["flight_number"], "origin": f["origin"],
                                   "destination": f["destination"], "date": f["date"], "price": f["price"]}
                                  for f in reservation["flights"]]
        reservation.setdefault("status", None)
    return db


def load(data_dir: str | None = None) -> Domain:
    files = read_domain_files("airline", data_dir)
    return Domain(name="airline", policy=files["policy"], tools=TOOLS, db=_as_dumped(files["db"]),
                  tasks=files["tasks"], splits=files["splits"], transfer_tool="transfer_to_human_agents")
