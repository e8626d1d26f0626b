"""Airline tools against tau2-bench's rules, with expectations computed by hand from db.json."""

import hashlib
import json

import pytest

from ctu.domains import get_domain
from ctu.domains.base import canonical, run_tool

MIA = "mia_li_3668"


@pytest.fixture(scope="module")
def airline():
    return get_domain("airline")


def call(domain, view, name, **args):
    return run_tool(domain.tool(name), view, args, name)


def booking(**overrides):
    args = dict(user_id=MIA, origin="JFK", destination="MIA", flight_type="one_way", cabin="economy",
                flights=[{"flight_number": "HAT014", "date": "2024-05-20"}],
                passengers=[{"first_name": "Mia", "last_name": "Li", "dob": "1990-04-05"},
                            {"first_name": "Amelia", "last_name": "Ahmed", "dob": "1957-03-21"}],
                payment_methods=[{"payment_id": "certificate_4856383", "amount": 100},
                                 {"payment_id": "credit_card_4421486", "amount": 2 * 143 + 60 + 50 - 100}],
                total_baggages=3, nonfree_baggages=1, insurance="yes")
    args.update(overrides)
    return args


def test_tools_and_schemas(airline):
    assert {t.name for t in airline.tools if t.mutates} == {
        "book_reservation", "cancel_reservation", "send_certificate", "update_reservation_baggages",
        "update_reservation_flights", "update_reservation_passengers"}
    assert len(airline.tools) == 14
    params = airline.tool("book_reservation").parameters
    assert params["required"] == ["user_id", "origin", "destination", "flight_type", "cabin", "flights", "passengers",
                                  "payment_methods", "total_baggages", "nonfree_baggages", "insurance"]
    assert params["properties"]["cabin"]["enum"] == ["business", "economy", "basic_economy"]
    assert params["properties"]["passengers"]["items"]["required"] == ["first_name", "last_name", "dob"]


def test_gold_replay_has_no_errors_and_leaves_the_shared_db_untouched(airline):
    before = hashlib.sha256(canonical(airline.db).encode()).hexdigest()
    for task in airline.tasks:
        view = airline.new_db()
        for a in task.actions:
            assert not call(airline, view, a.name, **a.arguments).error, (task.id, a.name)
    assert hashlib.sha256(canonical(airline.db).encode()).hexdigest() == before


def test_book_reservation_fixed_id_timestamp_certificate_removal_and_seats(airline):
    view = airline.new_db()
    out = call(airline, view, "book_reservation", **booking())
    assert not out.error, out.content
    r = view.get("reservations", "HATHAT")
    assert r["created_at"] == "2024-05-15T15:00:00" and r["status"] is None
    assert r["flights"] == [{"flight_number": "HAT014", "origin": "JFK", "destination": "MIA", "date": "2024-05-20",
                             "price": 143}]
    assert r["payment_history"] == [{"payment_id": "certificate_4856383", "amount": 100},
                                    {"payment_id": "credit_card_4421486", "amount": 296}]
    user = view.get("users", MIA)
    assert "certificate_4856383" not in user["payment_methods"] and user["reservations"][-1] == "HATHAT"
    assert view.get("flights", "HAT014")["dates"]["2024-05-20"]["available_seats"]["economy"] == 9 - 2
    assert json.loads(out.content)["reservation_id"] == "HATHAT"
    second = call(airline, view, "book_reservation", **booking(payment_methods=[
        {"payment_id": "credit_card_4421486", "amount": 396}]))
    assert not second.error and view.get("reservations", "HATHAU") is not None


def test_book_reservation_errors_leave_db_unchanged(airline):
    cases = [
        (booking(user_id="nobody"), "Error: User nobody not found"),
        (booking(flights=[{"flight_number": "HAT999", "date": "2024-05-20"}]), "Error: Flight HAT999 not found"),
        (booking(flights=[{"flight_number": "HAT014", "date": "2024-06-20"}]), "not found on date 2024-06-20"),
        (booking(cabin="basic_economy", passengers=[{"first_name": "A", "last_name": "B", "dob": "2000-01-01"}] * 4),
         "Error: Not enough seats on flight HAT014"),
        (booking(payment_methods=[{"payment_id": "certificate_4856383", "amount": 396}]),
         "Error: Not enough balance in payment method certificate_4856383"),
        (booking(payment_methods=[{"payment_id": "credit_card_4421486", "amount": 1}]),
         "Error: Payment amount does not add up, total price is 396, but paid 1"),
        (booking(payment_methods=[{"payment_id": "gift_card_1", "amount": 396}]), "Error: Payment method gift_card_1 not found"),
        (booking(insurance="maybe"), "'insurance' must be one of"),
        (booking(flights=[{"flight_number": "HAT014"}]), "missing required argument 'flights[0].date'"),
    ]
    for args, message in cases:
        view = airline.new_db()
        out = call(airline, view, "book_reservation", **args)
        assert out.error and message in out.content, out.content
        assert view.touched() == set()


def test_cancel_refunds_with_negative_payments_and_keeps_seats(airline):
    view = airline.new_db()
    out = call(airline, view, "cancel_reservation", reservation_id="NO6JO3")
    r = view.get("reservations", "NO6JO3")
    assert not out.error and r["status"] == "cancelled"
    assert r["payment_history"] == [{"payment_id": "credit_card_1955700", "amount": 2504},
                                    {"payment_id": "credit_card_1955700", "amount": -2504}]
    assert view.touched() == {("reservations", "NO6JO3")}
    assert call(airline, airline.new_db(), "cancel_reservation", reservation_id="XXXXXX").content == \
        "Error: Reservation XXXXXX not found"


def test_update_baggages_and_certificate_rules(airline):
    view = airline.new_db()
    out = call(airline, view, "update_reservation_baggages", reservation_id="NO6JO3", total_baggages=4,
               nonfree_baggages=2, payment_id="credit_card_4421486")
    r = view.get("reservations", "NO6JO3")
    assert not out.error and r["payment_history"][-1] == {"payment_id": "credit_card_4421486", "amount": 100}
    assert (r["total_baggages"], r["nonfree_baggages"]) == (4, 2)
    view2 = airline.new_db()
    bad = call(airline, view2, "update_reservation_baggages", reservation_id="NO6JO3", total_baggages=4,
               nonfree_baggages=2, payment_id="certificate_4856383")
    assert bad.content == "Error: Certificate cannot be used to update reservation" and view2.touched() == set()


def test_update_flights_prices_the_difference_without_touching_seats(airline):
    view = airline.new_db()
    new = [{"flight_number": "HAT083", "date": "2024-05-16"}, {"flight_number": "HAT221", "date": "2024-05-16"}]
    out = call(airline, view, "update_reservation_flights", reservation_id="NO6JO3", cabin="economy", flights=new,
               payment_id="credit_card_4421486")
    assert not out.error, out.content
    r = view.get("reservations", "NO6JO3")
    prices = [airline.db["flights"][f["flight_number"]]["dates"]["2024-05-16"]["prices"]["economy"] for f in new]
    assert [f["price"] for f in r["flights"]] == prices and r["cabin"] == "economy"
    assert r["payment_history"][-1] == {"payment_id": "credit_card_4421486", "amount": sum(prices) - (483 + 1991)}
    assert ("flights", "HAT083") not in view.touched()


def test_send_certificate_ids_and_passenger_updates(airline):
    view = airline.new_db()
    assert call(airline, view, "send_certificate", user_id=MIA, amount=150).content == \
        f"Certificate certificate_3221322 added to user {MIA} with amount 150."
    assert call(airline, view, "send_certificate", user_id=MIA, amount=50).content.startswith(
        "Certificate certificate_3221323")
    assert view.get("users", MIA)["payment_methods"]["certificate_3221322"] == {
        "source": "certificate", "id": "certificate_3221322", "amount": 150.0}
    mismatch = call(airline, view, "update_reservation_passengers", reservation_id="NO6JO3", passengers=[])
    assert mismatch.content == "Error: Number of passengers does not match"
    ok = call(airline, view, "update_reservation_passengers", reservation_id="NO6JO3",
              passengers=[{"first_name": "Mia", "last_name": "Lee", "dob": "1990-04-05", "extra": "ignored"}])
    assert not ok.error
    assert view.get("reservations", "NO6JO3")["passengers"] == [{"first_name": "Mia", "last_name": "Lee", "dob": "1990-04-05"}]


def test_searches_and_status(airline):
    view = airline.new_db()
    direct = json.loads(call(airline, view, "search_direct_flight", origin="JFK", destination="MIA", date="2024-05-20").content)
    assert any(f["flight_number"] == "HAT014" and f["date"] is None for f in direct)
    assert list(direct[0]) == ["flight_number", "origin", "destination", "status", "scheduled_departure_time_est",
                               "scheduled_arrival_time_est", "date", "available_seats", "prices"]
    onestop = json.loads(call(airline, view, "search_onestop_flight", origin="JFK", destination="SEA", date="2024-05-20").content)
    for first, second in onestop:
        assert first["destination"] == second["origin"] and first["date"] == "2024-05-20"
        assert second["scheduled_departure_time_est"] >= first["scheduled_arrival_time_est"] or "+1" in first["scheduled_arrival_time_est"]
    assert call(airline, view, "get_flight_status", flight_number="HAT001", date="2024-05-03").content == "cancelled"
    assert call(airline, view, "get_flight_status", flight_number="HAT001", date="2025-01-01").content == \
        "Error: Flight HAT001 not found on date 2025-01-01"
    assert len(json.loads(call(airline, view, "list_all_airports").content)) == 20
    assert view.touched() == set()
