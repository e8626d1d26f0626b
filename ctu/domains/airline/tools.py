"""The tau2 airline tools (see :mod:`ctu.domains.airline` for the quirks they reproduce)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypedDict

from ctu.domains.base import DBView, ToolError, tool
from ctu.domains.base.arith import evaluate

NOW = "2024-05-15T15:00:00"
NEW_RESERVATION_IDS = ("HATHAT", "HATHAU", "HATHAV")
NEW_CERTIFICATE_IDS = tuple(f"certificate_{n}" for n in (3221322, 3221323, 3221324))
INSURANCE_FEE = 30  # per passenger
BAG_FEE = 50  # per non-free bag
AIRPORTS = (("SFO", "San Francisco"), ("JFK", "New York"), ("LAX", "Los Angeles"), ("ORD", "Chicago"),
            ("DFW", "Dallas"), ("DEN", "Denver"), ("SEA", "Seattle"), ("ATL", "Atlanta"), ("MIA", "Miami"),
            ("BOS", "Boston"), ("PHX", "Phoenix"), ("IAH", "Houston"), ("LAS", "Las Vegas"), ("MCO", "Orlando"),
            ("EWR", "Newark"), ("CLT", "Charlotte"), ("MSP", "Minneapolis"), ("DTW", "Detroit"),
            ("PHL", "Philadelphia"), ("LGA", "LaGuardia"))

Cabin = Literal["business", "economy", "basic_economy"]  # tau2's CabinClass, same order
ReservationId = Annotated[str, "The reservation ID, such as 'ZFA04Y'."]
UpdatePaymentId = Annotated[str, "The payment id stored in user profile, such as 'credit_card_7815826', "
                                 "'gift_card_7815826', 'certificate_7815826'."]
Origin = Annotated[str, "The origin city airport in three letters, such as 'JFK'."]
Destination = Annotated[str, "The destination city airport in three letters, such as 'LAX'."]


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


# -- pydantic-equivalent record builders (field order and types of tau2's models) -----------
def _flight_info(f: Mapping[str, Any]) -> FlightInfo:
    return {"flight_number": f["flight_number"], "date": f["date"]}


def _passenger(p: Mapping[str, Any]) -> Passenger:
    return {"first_name": p["first_name"], "last_name": p["last_name"], "dob": p["dob"]}


def _payment(payment_id: str, amount) -> dict:
    return {"payment_id": payment_id, "amount": int(amount)}  # Payment.amount: int (lax: 100.0 -> 100)


def reservation_flight(flight: dict, date: str, price: int) -> dict:
    return {"flight_number": flight["flight_number"], "origin": flight["origin"],
            "destination": flight["destination"], "date": date, "price": price}


# -- lookups (tau2's _get_* helpers, same messages) -------------------------------------------
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


def _bookable(db: DBView, info: Mapping[str, Any], cabin: str, seats_needed: int) -> tuple[dict, dict]:
    """The flight and its date record, checked as tau2 checks a new segment."""
    flight = _flight(db, info["flight_number"])
    day = _flight_instance(db, info["flight_number"], info["date"])
    if day["status"] != "available":
        raise ToolError(f"Flight {info['flight_number']} not available on date {info['date']}")
    if day["available_seats"][cabin] < seats_needed:
        raise ToolError(f"Not enough seats on flight {info['flight_number']}")
    return flight, day


def _search_direct(db: DBView, date: str, origin: str | None = None, destination: str | None = None,
                   leave_after: str | None = None) -> list[dict]:
    """tau2's ``_search_direct_flight``: available flights in DB order, as DirectFlight dumps."""
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
    """tau2's ``_payment_for_update``: checks, then debits a gift card (credits it if negative)."""
    method = _user(db, user_id)["payment_methods"].get(payment_id)
    if method is None:
        raise ToolError("Payment method not found")
    if method["source"] == "certificate":
        raise ToolError("Certificate cannot be used to update reservation")
    if method["source"] == "gift_card" and method["amount"] < total_price:
        raise ToolError("Gift card balance is not enough")
    if method["source"] == "gift_card":
        db.edit("users", user_id)["payment_methods"][payment_id]["amount"] -= total_price
    return _payment(payment_id, total_price) if total_price != 0 else None


# -- tools ------------------------------------------------------------------------------------
@tool(mutates=True)
def book_reservation(
    db: DBView,
    user_id: Annotated[str, "The ID of the user to book the reservation such as 'sara_doe_496'`."],
    origin: Annotated[str, "The IATA code for the origin city such as 'SFO'."],
    destination: Annotated[str, "The IATA code for the destination city such as 'JFK'."],
    flight_type: Annotated[Literal["round_trip", "one_way"], "The type of flight such as 'one_way' or 'round_trip'."],
    cabin: Annotated[Cabin, "The cabin class such as 'basic_economy', 'economy', or 'business'."],
    flights: Annotated[list[FlightInfo], "An array of objects containing details about each piece of flight."],
    passengers: Annotated[list[Passenger], "An array of objects containing details about each passenger."],
    payment_methods: Annotated[list[Payment], "An array of objects containing details about each payment method."],
    total_baggages: Annotated[int, "The total number of baggage items to book the reservation."],
    nonfree_baggages: Annotated[int, "The number of non-free baggage items to book the reservation."],
    insurance: Annotated[Literal["yes", "no"], "Whether the reservation has insurance."],
):
    """Book a reservation."""
    flights = [_flight_info(f) for f in flights]
    passengers = [_passenger(p) for p in passengers]
    payments = [_payment(p["payment_id"], p["amount"]) for p in payment_methods]
    user = _user(db, user_id)
    reservation_id = next((r for r in NEW_RESERVATION_IDS if db.get("reservations", r) is None), None)
    if reservation_id is None:
        raise ToolError("Too many reservations")
    reservation: dict[str, Any] = {
        "reservation_id": reservation_id, "user_id": user_id, "origin": origin, "destination": destination,
        "flight_type": flight_type, "cabin": cabin, "flights": [], "passengers": passengers,
        "payment_history": [dict(p) for p in payments], "created_at": NOW,
        "total_baggages": int(total_baggages), "nonfree_baggages": int(nonfree_baggages),
        "insurance": insurance, "status": None,
    }
    n = len(passengers)
    total_price = 0
    seats_taken: list[tuple[str, str]] = []
    for info in flights:
        flight, day = _bookable(db, info, cabin, n)
        price = day["prices"][cabin]
        reservation["flights"].append(reservation_flight(flight, info["date"], price))
        seats_taken.append((info["flight_number"], info["date"]))
        total_price += price * n
    if insurance == "yes":
        total_price += INSURANCE_FEE * n
    total_price += BAG_FEE * nonfree_baggages  # the raw argument, as tau2 (1.0 makes the total a float)
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
        if method is None:  # a certificate listed twice was already removed: tau2 fails with KeyError
            raise ToolError(repr(payment["payment_id"]))
        if method["source"] == "gift_card":
            method["amount"] -= payment["amount"]
        elif method["source"] == "certificate":
            del user["payment_methods"][payment["payment_id"]]
    for flight_number, date in seats_taken:
        db.edit("flights", flight_number)["dates"][date]["available_seats"][cabin] -= n
    db.put("reservations", reservation_id, reservation)
    user["reservations"].append(reservation_id)
    return reservation


@tool()
def calculate(
    db: DBView,
    expression: Annotated[str, "The mathematical expression to calculate, such as '2 + 2'. The expression can "
                               "contain numbers, operators (+, -, *, /), parentheses, and spaces."],
):
    """Calculate the result of a mathematical expression."""
    try:  # tau2 reports any failure (syntax, division by zero, a tuple, overflow) as "Error: <exc>"
        return evaluate(expression)  # eval's answers, with products and powers bounded (ctu.domains.base.arith)
    except Exception as exc:  # noqa: BLE001
        raise ToolError(str(exc)) from None


@tool(mutates=True)
def cancel_reservation(db: DBView, reservation_id: ReservationId):
    """Cancel the whole reservation."""
    _reservation(db, reservation_id)
    reservation = db.edit("reservations", reservation_id)
    refunds = [_payment(p["payment_id"], -p["amount"]) for p in reservation["payment_history"]]
    reservation["payment_history"].extend(refunds)
    reservation["status"] = "cancelled"
    return reservation


@tool()
def get_reservation_details(db: DBView, reservation_id: Annotated[str, "The reservation ID, such as '8JX2WO'."]):
    """Get the details of a reservation."""
    return _reservation(db, reservation_id)


@tool()
def get_user_details(db: DBView, user_id: Annotated[str, "The user ID, such as 'sara_doe_496'."]):
    """Get the details of a user, including their reservations."""
    return _user(db, user_id)


@tool()
def list_all_airports(db: DBView):
    """Returns a list of all available airports."""
    return [{"iata": iata, "city": city} for iata, city in AIRPORTS]


@tool()
def search_direct_flight(
    db: DBView, origin: Origin, destination: Destination,
    date: Annotated[str, "The date of the flight in the format 'YYYY-MM-DD', such as '2024-01-01'."],
):
    """Search for direct flights between two cities on a specific date."""
    return _search_direct(db, date=date, origin=origin, destination=destination)


@tool()
def search_onestop_flight(
    db: DBView, origin: Origin, destination: Destination,
    date: Annotated[str, "The date of the flight in the format 'YYYY-MM-DD', such as '2024-05-01'."],
):
    """Search for one-stop flights between two cities on a specific date."""
    results = []
    for first in _search_direct(db, date=date, origin=origin):
        first["date"] = date
        date2 = date
        if "+1" in first["scheduled_arrival_time_est"]:
            try:
                date2 = f"2024-05-{int(date[-2:]) + 1}"  # tau2 quirk: fixed month, no zero padding
            except ValueError as exc:
                raise ToolError(str(exc)) from None
        for second in _search_direct(db, date=date2, origin=first["destination"], destination=destination,
                                     leave_after=first["scheduled_arrival_time_est"]):
            second["date"] = date2
            results.append([first, second])
    return results


@tool(mutates=True)
def send_certificate(
    db: DBView,
    user_id: Annotated[str, "The ID of the user to book the reservation, such as 'sara_doe_496'."],
    amount: Annotated[int, "The amount of the certificate to send."],
):
    """Send a certificate to a user. Be careful!"""
    user = _user(db, user_id)
    for payment_id in NEW_CERTIFICATE_IDS:
        if payment_id not in user["payment_methods"]:
            db.edit("users", user_id)["payment_methods"][payment_id] = {
                "source": "certificate", "id": payment_id, "amount": float(amount)}  # Certificate.amount: float
            return f"Certificate {payment_id} added to user {user_id} with amount {amount}."
    raise ToolError("Too many certificates")


@tool()
def transfer_to_human_agents(db: DBView, summary: Annotated[str, "A summary of the user's issue."]):
    """Transfer the user to a human agent, with a summary of the user's issue.

    Only transfer if
     -  the user explicitly asks for a human agent
     -  given the policy and the available tools, you cannot solve the user's issue.
    """
    return "Transfer successful"


@tool(mutates=True)
def update_reservation_baggages(
    db: DBView,
    reservation_id: Annotated[str, "The reservation ID, such as 'ZFA04Y'"],
    total_baggages: Annotated[int, "The updated total number of baggage items included in the reservation."],
    nonfree_baggages: Annotated[int, "The updated number of non-free baggage items included in the reservation."],
    payment_id: UpdatePaymentId,
):
    """Update the baggage information of a reservation."""
    reservation = _reservation(db, reservation_id)
    _user(db, reservation["user_id"])
    total_price = BAG_FEE * max(0, nonfree_baggages - reservation["nonfree_baggages"])
    payment = _pay_for_update(db, reservation["user_id"], payment_id, total_price)
    reservation = db.edit("reservations", reservation_id)
    if payment is not None:
        reservation["payment_history"].append(payment)
    # plain attribute assignment in tau2: stored as given (4.0 stays a float)
    reservation["total_baggages"] = total_baggages
    reservation["nonfree_baggages"] = nonfree_baggages
    return reservation


@tool(mutates=True)
def update_reservation_flights(
    db: DBView,
    reservation_id: ReservationId,
    cabin: Annotated[Cabin, "The cabin class of the reservation"],
    flights: Annotated[list[FlightInfo], "An array of objects containing details about each piece of flight in the "
                                         "ENTIRE new reservation. Even if the a flight segment is not changed, it "
                                         "should still be included in the array."],
    payment_id: UpdatePaymentId,
):
    """Update the flight information of a reservation."""
    flights = [_flight_info(f) for f in flights]
    reservation = _reservation(db, reservation_id)
    _user(db, reservation["user_id"])
    n = len(reservation["passengers"])
    total_price = 0
    new_flights = []
    for info in flights:
        kept = next((f for f in reservation["flights"] if f["flight_number"] == info["flight_number"]
                     and f["date"] == info["date"] and cabin == reservation["cabin"]), None)
        if kept is not None:  # an unchanged segment keeps the price paid
            new_flights.append(dict(kept))
            total_price += kept["price"] * n
            continue
        flight, day = _bookable(db, info, cabin, n)
        new_flights.append(reservation_flight(flight, info["date"], day["prices"][cabin]))
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
def update_reservation_passengers(
    db: DBView,
    reservation_id: ReservationId,
    passengers: Annotated[list[Passenger], "An array of objects containing details about each passenger."],
):
    """Update the passenger information of a reservation."""
    passengers = [_passenger(p) for p in passengers]
    reservation = _reservation(db, reservation_id)
    if len(passengers) != len(reservation["passengers"]):
        raise ToolError("Number of passengers does not match")
    reservation = db.edit("reservations", reservation_id)
    reservation["passengers"] = passengers
    return reservation


@tool()
def get_flight_status(
    db: DBView,
    flight_number: Annotated[str, "The flight number."],
    date: Annotated[str, "The date of the flight."],
):
    """Get the status of a flight."""
    return _flight_instance(db, flight_number, date)["status"]


# tau2's order (the toolkit's definition order)
TOOLS = (book_reservation, calculate, cancel_reservation, get_reservation_details, get_user_details,
         list_all_airports, search_direct_flight, search_onestop_flight, send_certificate, transfer_to_human_agents,
         update_reservation_baggages, update_reservation_flights, update_reservation_passengers, get_flight_status)
