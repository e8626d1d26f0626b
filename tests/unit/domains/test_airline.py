"""The airline domain against tau2-bench's rules; expected records are computed by hand from db.json.

Fixtures used (db.json): mia_li_3668 (credit_card_4421486, certificate_4856383 = 100.0, reservation
NO6JO3: business, 1 passenger, HAT083 483 + HAT221 1991 on 2024-05-16, paid 2504, 0 non-free bags);
sophia_davis_8874 (gift_card_5896248 = 264.0, gift_card_6874494 = 134.0, certificate_9507611 = 250.0,
reservation NVLFIW: economy, 2 passengers, HAT212 142 (2024-05-09, landed) + HAT263 184 (2024-05-21),
paid 652 by gift_card_2075462 = 199.0); HAT014 on 2024-05-20: economy 143, 9 seats, basic_economy 3 seats;
HAT240 (DTW-JFK) on 2024-05-21: economy 177, 19 seats, basic_economy 1 seat; HAT001 on 2024-05-03: cancelled.
"""

import hashlib
import json

import pytest

from ctu.domains import get_domain
from ctu.domains.base import canonical, run_tool

MIA, SOPHIA = "mia_li_3668", "sophia_davis_8874"
MIA_PAX = [{"first_name": "Mia", "last_name": "Li", "dob": "1990-04-05"},
           {"first_name": "Amelia", "last_name": "Ahmed", "dob": "1957-03-21"}]
SOPHIA_PAX = [{"first_name": "Sophia", "last_name": "Davis", "dob": "1997-04-14"}]

# sha256(json([tool outputs, sorted changed records]))[:16] of each task's gold replay, computed by running
# tau2-bench's own AirlineTools on the same db.json (the replay must reproduce them byte for byte).
TAU2_GOLD_DIGESTS = {
    "0": "a683096011db3975", "1": "3452d3b913f47e7d", "2": "12a172e8af72317c", "3": "67441156bb131da1",
    "4": "f92a4c9a00e7f700", "5": "5d5c41d75df32708", "6": "c14589b423811299", "7": "1fcc84c21364bef5",
    "8": "57b30ddcc492c718", "9": "94d08808932d0676", "10": "a683096011db3975", "11": "dbb995c7df4183e0",
    "12": "664c4ad8d174bb4a", "13": "8c1ad722f707a99f", "14": "f226852deab39443", "15": "2b75d23ed78493ce",
    "16": "2b75d23ed78493ce", "17": "4e8501d039b81f07", "18": "b6b0ccbb2e51f3e6", "19": "249e53dedc31e816",
    "20": "1943041744051db6", "21": "4381fef3b30b4d17", "22": "4e8501d039b81f07", "23": "3292902819c2f3ab",
    "24": "3237e016a5fbb18e", "25": "201a5b6f392bdf70", "26": "a683096011db3975", "27": "06f8b8f88e161207",
    "28": "a683096011db3975", "29": "ea37616d41f6a9f8", "30": "902c129e87e5ee37", "31": "a683096011db3975",
    "32": "8266d206d6417992", "33": "5f421f30ea2d888b", "34": "a683096011db3975", "35": "8cd664f639ef5ee6",
    "36": "1cc6106c64b44459", "37": "2a75fa38bf78c039", "38": "bee298a2a989034e", "39": "577d551e9fab0ea4",
    "40": "135ac4f9643a0776", "41": "b6c3068b4051f83b", "42": "dc4c9f7126391ef1", "43": "d9d37dbf31f4921c",
    "44": "fd4fdd9490f0c741", "45": "c14589b423811299", "46": "a683096011db3975", "47": "d3b2b19e34ba6576",
    "48": "dea5fbfc5b89b620", "49": "dea5fbfc5b89b620",
}


@pytest.fixture(scope="module")
def airline():
    return get_domain("airline")


def call(domain, view, name, **args):
    return run_tool(domain.tool(name), view, args, name)


def seats(view, flight_number, date, cabin):
    return view.get("flights", flight_number)["dates"][date]["available_seats"][cabin]


def mia_booking(**overrides):  # 2 x 143 + insurance 2 x 30 + 1 bag x 50 = 396
    args = dict(user_id=MIA, origin="JFK", destination="MIA", flight_type="one_way", cabin="economy",
                flights=[{"flight_number": "HAT014", "date": "2024-05-20"}], passengers=MIA_PAX,
                payment_methods=[{"payment_id": "certificate_4856383", "amount": 100},
                                 {"payment_id": "credit_card_4421486", "amount": 296}],
                total_baggages=3, nonfree_baggages=1, insurance="yes")
    return {**args, **overrides}


def sophia_booking(payments, **overrides):  # 1 x 177, no insurance, no paid bag = 177
    args = dict(user_id=SOPHIA, origin="DTW", destination="JFK", flight_type="one_way", cabin="economy",
                flights=[{"flight_number": "HAT240", "date": "2024-05-21"}], passengers=SOPHIA_PAX,
                payment_methods=[{"payment_id": p, "amount": a} for p, a in payments],
                total_baggages=0, nonfree_baggages=0, insurance="no")
    return {**args, **overrides}


# -- schemas ---------------------------------------------------------------------------------------------
TAU2_REQUIRED = {
    "book_reservation": ["user_id", "origin", "destination", "flight_type", "cabin", "flights", "passengers",
                         "payment_methods", "total_baggages", "nonfree_baggages", "insurance"],
    "calculate": ["expression"],
    "cancel_reservation": ["reservation_id"],
    "get_reservation_details": ["reservation_id"],
    "get_user_details": ["user_id"],
    "list_all_airports": [],
    "search_direct_flight": ["origin", "destination", "date"],
    "search_onestop_flight": ["origin", "destination", "date"],
    "send_certificate": ["user_id", "amount"],
    "transfer_to_human_agents": ["summary"],
    "update_reservation_baggages": ["reservation_id", "total_baggages", "nonfree_baggages", "payment_id"],
    "update_reservation_flights": ["reservation_id", "cabin", "flights", "payment_id"],
    "update_reservation_passengers": ["reservation_id", "passengers"],
    "get_flight_status": ["flight_number", "date"],
}
WRITE_TOOLS = {"book_reservation", "cancel_reservation", "send_certificate", "update_reservation_baggages",
               "update_reservation_flights", "update_reservation_passengers"}


def test_tool_names_parameters_and_mutates_flags_match_tau2(airline):
    assert [t.name for t in airline.tools] == list(TAU2_REQUIRED)
    for t in airline.tools:
        params = t.openai_schema()["function"]["parameters"]
        assert list(params["properties"]) == TAU2_REQUIRED[t.name], t.name  # every parameter is required in tau2
        assert params["required"] == TAU2_REQUIRED[t.name], t.name
        assert t.mutates == (t.name in WRITE_TOOLS), t.name
        assert all(p.get("description") for p in params["properties"].values()), t.name
    assert airline.transfer_tool == "transfer_to_human_agents" and airline.assertions == {}


def test_enums_nested_objects_and_descriptions(airline):
    book = airline.tool("book_reservation").parameters["properties"]
    assert book["flight_type"]["enum"] == ["round_trip", "one_way"]
    assert book["cabin"]["enum"] == ["business", "economy", "basic_economy"]
    assert book["insurance"]["enum"] == ["yes", "no"]
    assert airline.tool("update_reservation_flights").parameters["properties"]["cabin"]["enum"] == book["cabin"]["enum"]
    flight, pax, pay = (book[k]["items"] for k in ("flights", "passengers", "payment_methods"))
    assert flight["required"] == ["flight_number", "date"] and flight["properties"]["date"]["type"] == "string"
    assert pax["required"] == ["first_name", "last_name", "dob"]
    assert pay["required"] == ["payment_id", "amount"] and pay["properties"]["amount"]["type"] == "integer"
    assert book["total_baggages"]["type"] == "integer"
    assert book["user_id"]["description"] == "The ID of the user to book the reservation such as 'sara_doe_496'`."
    assert airline.tool("send_certificate").description == "Send a certificate to a user. Be careful!"
    assert airline.tool("transfer_to_human_agents").description == (
        "Transfer the user to a human agent, with a summary of the user's issue.\n\nOnly transfer if\n"
        " -  the user explicitly asks for a human agent\n"
        " -  given the policy and the available tools, you cannot solve the user's issue.")


@pytest.mark.parametrize("name,args,message", [
    ("cancel_reservation", {}, "missing required argument 'reservation_id'"),
    ("cancel_reservation", {"reservation_id": 123}, "'reservation_id' must be of type string"),
    ("cancel_reservation", {"reservation_id": "NO6JO3", "reason": "x"}, "unexpected argument 'reason'"),
    ("send_certificate", {"user_id": MIA, "amount": "100"}, "'amount' must be of type integer"),
    ("send_certificate", {"user_id": MIA, "amount": 10.5}, "'amount' must be of type integer"),
    ("update_reservation_flights", {"reservation_id": "NO6JO3", "cabin": "first", "flights": [],
                                    "payment_id": "credit_card_4421486"}, "'cabin' must be one of"),
    ("update_reservation_passengers", {"reservation_id": "NO6JO3", "passengers": [{"first_name": "Mia"}]},
     "missing required argument 'passengers[0].last_name'"),
    ("update_reservation_baggages", {"reservation_id": "NO6JO3", "total_baggages": True, "nonfree_baggages": 0,
                                     "payment_id": "credit_card_4421486"}, "'total_baggages' must be of type integer"),
    ("book_reservation", mia_booking(flight_type="multi_city"), "'flight_type' must be one of"),
    ("book_reservation", mia_booking(flights={"flight_number": "HAT014"}), "'flights' must be of type array"),
    ("book_reservation", mia_booking(payment_methods=[{"payment_id": "credit_card_4421486", "amount": "396"}]),
     "'payment_methods[0].amount' must be of type integer"),
])
def test_invalid_arguments_are_errors_and_change_nothing(airline, name, args, message):
    view = airline.new_db()
    out = call(airline, view, name, **args)
    assert out.error and out.content.startswith("Error: ") and message in out.content, out.content
    assert view.touched() == set()


# -- gold replay -----------------------------------------------------------------------------------------
def test_gold_replay_matches_tau2_and_leaves_the_shared_db_untouched(airline):
    before = hashlib.sha256(canonical(airline.db).encode()).hexdigest()
    for task in airline.tasks:
        view = airline.new_db()
        outputs = []
        for a in task.actions:
            out = run_tool(airline.tool(a.name), view, a.arguments, a.name)
            assert not out.error, (task.id, a.name, out.content)  # tau2 raises on no gold action either
            outputs.append(out.content)
        changed = sorted([t, k, canonical(view.get(t, k))] for t, k in view.touched()
                         if canonical(view.get(t, k)) != canonical(airline.db.get(t, {}).get(k)))
        digest = hashlib.sha256(json.dumps([outputs, changed]).encode()).hexdigest()[:16]
        assert digest == TAU2_GOLD_DIGESTS[task.id], task.id
    assert hashlib.sha256(canonical(airline.db).encode()).hexdigest() == before


def test_views_do_not_see_each_others_writes(airline):
    a, b = airline.new_db(), airline.new_db()
    assert not call(airline, a, "book_reservation", **mia_booking()).error
    assert not call(airline, b, "cancel_reservation", reservation_id="NO6JO3").error
    assert a.get("reservations", "NO6JO3")["status"] is None and b.get("reservations", "HATHAT") is None
    assert "certificate_4856383" in b.get("users", MIA)["payment_methods"]
    assert (seats(a, "HAT014", "2024-05-20", "economy"), seats(b, "HAT014", "2024-05-20", "economy")) == (7, 9)
    assert airline.db["flights"]["HAT014"]["dates"]["2024-05-20"]["available_seats"]["economy"] == 9
    assert "HATHAT" not in airline.db["reservations"] and airline.db["reservations"]["NO6JO3"]["status"] is None


# -- book_reservation ------------------------------------------------------------------------------------
def test_book_with_certificate_and_card(airline):
    view = airline.new_db()
    out = call(airline, view, "book_reservation", **mia_booking())
    expected = {
        "reservation_id": "HATHAT", "user_id": MIA, "origin": "JFK", "destination": "MIA", "flight_type": "one_way",
        "cabin": "economy",
        "flights": [{"flight_number": "HAT014", "origin": "JFK", "destination": "MIA", "date": "2024-05-20",
                     "price": 143}],
        "passengers": MIA_PAX,
        "payment_history": [{"payment_id": "certificate_4856383", "amount": 100},
                            {"payment_id": "credit_card_4421486", "amount": 296}],
        "created_at": "2024-05-15T15:00:00", "total_baggages": 3, "nonfree_baggages": 1, "insurance": "yes",
        "status": None,
    }
    assert not out.error and out.content == json.dumps(expected)  # field order of tau2's Reservation dump
    assert view.get("reservations", "HATHAT") == expected
    user = view.get("users", MIA)
    assert list(user["payment_methods"]) == ["credit_card_4421486", "certificate_7504069", "credit_card_1955700"]
    assert user["reservations"] == ["NO6JO3", "AIXC49", "HKEG34", "HATHAT"]
    assert seats(view, "HAT014", "2024-05-20", "economy") == 9 - 2
    assert seats(view, "HAT014", "2024-05-20", "business") == 9
    assert view.touched() == {("reservations", "HATHAT"), ("users", MIA), ("flights", "HAT014")}


def test_book_debits_gift_card_and_drops_the_rest_of_a_certificate(airline):
    view = airline.new_db()
    out = call(airline, view, "book_reservation",
               **sophia_booking([("gift_card_5896248", 100), ("certificate_9507611", 77)]))
    assert not out.error, out.content
    methods = view.get("users", SOPHIA)["payment_methods"]
    assert methods["gift_card_5896248"] == {"source": "gift_card", "id": "gift_card_5896248", "amount": 164.0}
    assert "certificate_9507611" not in methods and methods["certificate_1654224"]["amount"] == 500.0
    assert '"amount": 164.0' in call(airline, view, "get_user_details", user_id=SOPHIA).content
    assert view.get("reservations", "HATHAT")["payment_history"] == [
        {"payment_id": "gift_card_5896248", "amount": 100}, {"payment_id": "certificate_9507611", "amount": 77}]
    assert seats(view, "HAT240", "2024-05-21", "economy") == 18
    # the search now shows the seat taken
    found = json.loads(call(airline, view, "search_direct_flight", origin="DTW", destination="JFK",
                            date="2024-05-21").content)
    assert [f["available_seats"]["economy"] for f in found if f["flight_number"] == "HAT240"] == [18]


def test_book_fixed_ids_then_too_many(airline):
    view = airline.new_db()
    card = [("credit_card_4801844", 177)]
    ids = [json.loads(call(airline, view, "book_reservation", **sophia_booking(card)).content)["reservation_id"]
           for _ in range(3)]
    assert ids == ["HATHAT", "HATHAU", "HATHAV"] and seats(view, "HAT240", "2024-05-21", "economy") == 16
    assert call(airline, view, "book_reservation", **sophia_booking(card)).content == "Error: Too many reservations"
    assert view.get("users", SOPHIA)["reservations"][-3:] == ids


def test_book_the_same_flight_twice_takes_seats_twice(airline):
    view = airline.new_db()
    flights = [{"flight_number": "HAT240", "date": "2024-05-21"}] * 2
    out = call(airline, view, "book_reservation", **sophia_booking([("credit_card_4801844", 354)], flights=flights))
    assert not out.error and seats(view, "HAT240", "2024-05-21", "economy") == 17


def test_book_with_float_counts(airline):
    # integral floats pass; the total uses the raw bag count (tau2 prints 193.0), the reservation stores ints
    view = airline.new_db()
    out = call(airline, view, "book_reservation", **sophia_booking([("credit_card_4801844", 1)], nonfree_baggages=1.0))
    assert out.content == "Error: Payment amount does not add up, total price is 227.0, but paid 1"
    out = call(airline, view, "book_reservation", **sophia_booking([("credit_card_4801844", 227.0)],
                                                                    nonfree_baggages=1.0, total_baggages=2.0))
    r = view.get("reservations", "HATHAT")
    assert not out.error and (r["total_baggages"], r["nonfree_baggages"]) == (2, 1)
    assert r["payment_history"] == [{"payment_id": "credit_card_4801844", "amount": 227}]
    assert '"total_baggages": 2, "nonfree_baggages": 1,' in out.content


@pytest.mark.parametrize("args,message", [
    (mia_booking(user_id="nobody"), "User nobody not found"),
    (mia_booking(flights=[{"flight_number": "HAT999", "date": "2024-05-20"}]), "Flight HAT999 not found"),
    (mia_booking(flights=[{"flight_number": "HAT014", "date": "2024-06-20"}]),
     "Flight HAT014 not found on date 2024-06-20"),
    (mia_booking(flights=[{"flight_number": "HAT001", "date": "2024-05-03"}]),
     "Flight HAT001 not available on date 2024-05-03"),
    (mia_booking(cabin="basic_economy", passengers=MIA_PAX * 2), "Not enough seats on flight HAT014"),
    (mia_booking(payment_methods=[{"payment_id": "gift_card_1", "amount": 396}]),
     "Payment method gift_card_1 not found"),
    (mia_booking(payment_methods=[{"payment_id": "certificate_4856383", "amount": 396}]),
     "Not enough balance in payment method certificate_4856383"),
    (sophia_booking([("gift_card_6874494", 177)]), "Not enough balance in payment method gift_card_6874494"),
    (mia_booking(payment_methods=[{"payment_id": "credit_card_4421486", "amount": 395}]),
     "Payment amount does not add up, total price is 396, but paid 395"),
])
def test_book_errors_change_nothing(airline, args, message):
    view = airline.new_db()
    assert call(airline, view, "book_reservation", **args).content == f"Error: {message}"
    assert view.touched() == set()


def test_book_certificate_listed_twice_fails_after_partial_debits(airline):
    # tau2 checks each entry against the balance, then pops the certificate and hits KeyError on its repeat
    view = airline.new_db()
    args = sophia_booking([("gift_card_5896248", 10), ("certificate_9507611", 100), ("certificate_9507611", 67)])
    assert call(airline, view, "book_reservation", **args).content == "Error: 'certificate_9507611'"
    methods = view.get("users", SOPHIA)["payment_methods"]
    assert methods["gift_card_5896248"]["amount"] == 254.0 and "certificate_9507611" not in methods
    assert view.get("reservations", "HATHAT") is None and ("flights", "HAT240") not in view.touched()
    assert view.get("users", SOPHIA)["reservations"] == ["ZVWQ08", "HFMJKS", "NVLFIW"]


# -- cancel_reservation ----------------------------------------------------------------------------------
def test_cancel_refunds_with_negative_payments_only(airline):
    view = airline.new_db()
    out = call(airline, view, "cancel_reservation", reservation_id="NVLFIW")
    r = view.get("reservations", "NVLFIW")
    assert not out.error and json.loads(out.content) == r and r["status"] == "cancelled"
    assert r["payment_history"] == [{"payment_id": "gift_card_2075462", "amount": 652},
                                    {"payment_id": "gift_card_2075462", "amount": -652}]
    # no gift card credit, no seats released: only the reservation changed
    assert view.touched() == {("reservations", "NVLFIW")}
    # tau2 does not refuse a cancelled reservation: a second cancel refunds the refund too
    call(airline, view, "cancel_reservation", reservation_id="NVLFIW")
    assert [p["amount"] for p in view.get("reservations", "NVLFIW")["payment_history"]] == [652, -652, -652, 652]
    missing = airline.new_db()
    assert call(airline, missing, "cancel_reservation", reservation_id="XXXXXX").content == \
        "Error: Reservation XXXXXX not found"
    assert missing.touched() == set()


# -- update_reservation_baggages -------------------------------------------------------------------------
def test_update_baggages_charges_new_paid_bags(airline):
    view = airline.new_db()
    out = call(airline, view, "update_reservation_baggages", reservation_id="NO6JO3", total_baggages=4,
               nonfree_baggages=2, payment_id="credit_card_4421486")
    r = view.get("reservations", "NO6JO3")
    assert not out.error and json.loads(out.content) == r
    assert r["payment_history"] == [{"payment_id": "credit_card_1955700", "amount": 2504},
                                    {"payment_id": "credit_card_4421486", "amount": 100}]
    assert (r["total_baggages"], r["nonfree_baggages"]) == (4, 2)
    # fewer paid bags: no charge, no refund, no payment recorded
    call(airline, view, "update_reservation_baggages", reservation_id="NO6JO3", total_baggages=1,
         nonfree_baggages=0, payment_id="credit_card_4421486")
    r = view.get("reservations", "NO6JO3")
    assert len(r["payment_history"]) == 2 and (r["total_baggages"], r["nonfree_baggages"]) == (1, 0)


def test_update_baggages_gift_card_debit_and_float_counts_kept_as_given(airline):
    view = airline.new_db()
    out = call(airline, view, "update_reservation_baggages", reservation_id="NVLFIW", total_baggages=5.0,
               nonfree_baggages=2.0, payment_id="gift_card_5896248")
    assert not out.error
    assert view.get("users", SOPHIA)["payment_methods"]["gift_card_5896248"]["amount"] == 164.0
    r = view.get("reservations", "NVLFIW")
    assert r["payment_history"][-1] == {"payment_id": "gift_card_5896248", "amount": 100}
    assert '"total_baggages": 5.0, "nonfree_baggages": 2.0,' in out.content  # tau2 assigns without validation


@pytest.mark.parametrize("reservation_id,payment_id,message", [
    ("XXXXXX", "credit_card_4421486", "Reservation XXXXXX not found"),
    ("NO6JO3", "credit_card_0000000", "Payment method not found"),
    ("NO6JO3", "certificate_4856383", "Certificate cannot be used to update reservation"),
    ("NVLFIW", "gift_card_6874494", "Gift card balance is not enough"),  # 3 bags = 150 > 134.0
])
def test_update_baggages_errors_change_nothing(airline, reservation_id, payment_id, message):
    view = airline.new_db()
    out = call(airline, view, "update_reservation_baggages", reservation_id=reservation_id, total_baggages=3,
               nonfree_baggages=3, payment_id=payment_id)
    assert out.content == f"Error: {message}" and view.touched() == set()


# -- update_reservation_flights --------------------------------------------------------------------------
KEEP_OUT = {"flight_number": "HAT212", "date": "2024-05-09"}


def test_update_flights_negative_difference_credits_the_gift_card(airline):
    # keep HAT212 at 142 (landed, but kept segments are not checked); HAT263 184 -> HAT240 177: 2 x (-7) = -14
    view = airline.new_db()
    out = call(airline, view, "update_reservation_flights", reservation_id="NVLFIW", cabin="economy",
               flights=[KEEP_OUT, {"flight_number": "HAT240", "date": "2024-05-21"}], payment_id="gift_card_5896248")
    assert not out.error, out.content
    r = view.get("reservations", "NVLFIW")
    assert r["flights"] == [
        {"flight_number": "HAT212", "origin": "JFK", "destination": "DTW", "date": "2024-05-09", "price": 142},
        {"flight_number": "HAT240", "origin": "DTW", "destination": "JFK", "date": "2024-05-21", "price": 177}]
    assert r["payment_history"][-1] == {"payment_id": "gift_card_5896248", "amount": -14}
    assert view.get("users", SOPHIA)["payment_methods"]["gift_card_5896248"]["amount"] == 278.0
    # seats are neither taken on the new flight nor released on the old one
    assert ("flights", "HAT240") not in view.touched() and ("flights", "HAT263") not in view.touched()


def test_update_flights_unchanged_costs_nothing_and_records_no_payment(airline):
    view = airline.new_db()
    flights = [KEEP_OUT, {"flight_number": "HAT263", "date": "2024-05-21"}]
    out = call(airline, view, "update_reservation_flights", reservation_id="NVLFIW", cabin="economy",
               flights=flights, payment_id="credit_card_4801844")
    assert not out.error
    assert view.get("reservations", "NVLFIW") == airline.db["reservations"]["NVLFIW"]  # old price 184 kept


def test_update_flights_cabin_change_reprices_every_segment(airline):
    # NO6JO3 (1 passenger, business 483 + 1991): same flights in economy, priced today for 2024-05-16
    view = airline.new_db()
    new = [{"flight_number": "HAT083", "date": "2024-05-16"}, {"flight_number": "HAT221", "date": "2024-05-16"}]
    prices = [airline.db["flights"][f["flight_number"]]["dates"]["2024-05-16"]["prices"]["economy"] for f in new]
    out = call(airline, view, "update_reservation_flights", reservation_id="NO6JO3", cabin="economy", flights=new,
               payment_id="credit_card_4421486")
    r = view.get("reservations", "NO6JO3")
    assert not out.error and r["cabin"] == "economy" and [f["price"] for f in r["flights"]] == prices
    assert r["payment_history"][-1] == {"payment_id": "credit_card_4421486", "amount": sum(prices) - 2474}


@pytest.mark.parametrize("cabin,flights,payment_id,message", [
    ("economy", [KEEP_OUT], "credit_card_0000000", "Payment method not found"),
    ("economy", [KEEP_OUT, {"flight_number": "HAT169", "date": "2024-05-21"}], "certificate_9507611",
     "Certificate cannot be used to update reservation"),
    ("economy", [{"flight_number": "HAT169", "date": "2024-05-21"}] * 3, "gift_card_6874494",
     "Gift card balance is not enough"),  # 6 x 191 - 652 = 494 > 134.0
    ("business", [KEEP_OUT], "credit_card_4801844", "Flight HAT212 not available on date 2024-05-09"),
    ("basic_economy", [{"flight_number": "HAT240", "date": "2024-05-21"}], "credit_card_4801844",
     "Not enough seats on flight HAT240"),
    ("economy", [{"flight_number": "HAT240", "date": "2024-06-01"}], "credit_card_4801844",
     "Flight HAT240 not found on date 2024-06-01"),
    ("economy", [{"flight_number": "HAT999", "date": "2024-05-21"}], "credit_card_4801844", "Flight HAT999 not found"),
])
def test_update_flights_errors_change_nothing(airline, cabin, flights, payment_id, message):
    view = airline.new_db()
    out = call(airline, view, "update_reservation_flights", reservation_id="NVLFIW", cabin=cabin, flights=flights,
               payment_id=payment_id)
    assert out.content == f"Error: {message}" and view.touched() == set()


# -- update_reservation_passengers / send_certificate ----------------------------------------------------
def test_update_passengers(airline):
    view = airline.new_db()
    new = [{"first_name": "Mia", "last_name": "Lee", "dob": "1990-04-05", "extra": "ignored"}]
    out = call(airline, view, "update_reservation_passengers", reservation_id="NO6JO3", passengers=new)
    assert not out.error
    assert view.get("reservations", "NO6JO3")["passengers"] == [
        {"first_name": "Mia", "last_name": "Lee", "dob": "1990-04-05"}]
    for rid, pax, message in [("NO6JO3", MIA_PAX, "Number of passengers does not match"),
                              ("XXXXXX", MIA_PAX, "Reservation XXXXXX not found")]:
        fresh = airline.new_db()
        out = call(airline, fresh, "update_reservation_passengers", reservation_id=rid, passengers=pax)
        assert out.content == f"Error: {message}" and fresh.touched() == set()


def test_send_certificate_fixed_ids_then_too_many(airline):
    view = airline.new_db()
    texts = [call(airline, view, "send_certificate", user_id=MIA, amount=a).content for a in (150, 50, 25.0)]
    assert texts == [f"Certificate certificate_3221322 added to user {MIA} with amount 150.",
                     f"Certificate certificate_3221323 added to user {MIA} with amount 50.",
                     f"Certificate certificate_3221324 added to user {MIA} with amount 25.0."]
    methods = view.get("users", MIA)["payment_methods"]
    assert methods["certificate_3221322"] == {"source": "certificate", "id": "certificate_3221322", "amount": 150.0}
    assert list(methods)[-3:] == ["certificate_3221322", "certificate_3221323", "certificate_3221324"]
    assert call(airline, view, "send_certificate", user_id=MIA, amount=1).content == "Error: Too many certificates"
    assert call(airline, view, "send_certificate", user_id="nobody", amount=1).content == "Error: User nobody not found"


# -- read and generic tools ------------------------------------------------------------------------------
def test_search_direct_flight(airline):
    view = airline.new_db()
    found = json.loads(call(airline, view, "search_direct_flight", origin="JFK", destination="DTW",
                            date="2024-05-20").content)
    assert [f["flight_number"] for f in found] == ["HAT033", "HAT088", "HAT092", "HAT212"]
    assert found[0] == {"flight_number": "HAT033", "origin": "JFK", "destination": "DTW", "status": "available",
                        "scheduled_departure_time_est": "00:00:00", "scheduled_arrival_time_est": "02:00:00",
                        "date": None, "available_seats": {"basic_economy": 5, "economy": 16, "business": 7},
                        "prices": {"basic_economy": 95, "economy": 140, "business": 327}}
    # landed / cancelled dates are not offered
    assert json.loads(call(airline, view, "search_direct_flight", origin="JFK", destination="DTW",
                           date="2024-05-09").content) == []


def test_search_onestop_flight_and_next_day_quirk(airline):
    view = airline.new_db()

    def pairs(date):
        out = json.loads(call(airline, view, "search_onestop_flight", origin="LGA", destination="SEA", date=date).content)
        return [(a["flight_number"], a["date"], b["flight_number"], b["date"]) for a, b in out]

    d, n = "2024-05-20", "2024-05-21"  # HAT002 / HAT114 arrive at 01:30:00+1: second leg the next day
    assert pairs(d) == [("HAT002", d, "HAT045", n), ("HAT002", d, "HAT156", n), ("HAT002", d, "HAT251", n),
                        ("HAT114", d, "HAT045", n), ("HAT114", d, "HAT156", n), ("HAT114", d, "HAT251", n),
                        ("HAT201", d, "HAT045", d), ("HAT201", d, "HAT251", d), ("HAT219", d, "HAT045", d),
                        ("HAT245", d, "HAT045", d), ("HAT245", d, "HAT156", d), ("HAT245", d, "HAT251", d)]
    # on 2024-05-30 the "next day" is 2024-05-31, which has no flights
    assert [p[0] for p in pairs("2024-05-30")] == ["HAT201", "HAT201", "HAT219", "HAT245", "HAT245", "HAT245"]


def test_flight_status_airports_details_calculate_transfer(airline):
    view = airline.new_db()
    assert call(airline, view, "get_flight_status", flight_number="HAT001", date="2024-05-03").content == "cancelled"
    assert call(airline, view, "get_flight_status", flight_number="HAT014", date="2024-05-20").content == "available"
    assert call(airline, view, "get_flight_status", flight_number="HAT001", date="2025-01-01").content == \
        "Error: Flight HAT001 not found on date 2025-01-01"
    assert call(airline, view, "get_flight_status", flight_number="HAT999", date="2024-05-20").content == \
        "Error: Flight HAT999 not found"
    airports = json.loads(call(airline, view, "list_all_airports").content)
    assert len(airports) == 20 and airports[0] == {"iata": "SFO", "city": "San Francisco"}
    assert airports[-1] == {"iata": "LGA", "city": "LaGuardia"}
    assert json.loads(call(airline, view, "get_reservation_details", reservation_id="NO6JO3").content) == \
        airline.db["reservations"]["NO6JO3"]
    assert call(airline, view, "get_user_details", user_id="nobody").content == "Error: User nobody not found"
    assert call(airline, view, "get_reservation_details", reservation_id="X").content == "Error: Reservation X not found"
    assert [call(airline, view, "calculate", expression=e).content for e in ("2 + 2", "10 / 3", "(1 + 2) * 3.5")] == \
        ["4.0", "3.33", "10.5"]
    assert call(airline, view, "calculate", expression="1 / 0").content == "Error: division by zero"
    assert call(airline, view, "calculate", expression="2 ^ 3").content == "Error: Invalid characters in expression"
    assert call(airline, view, "calculate", expression="()").error  # a tuple: tau2's float() fails
    assert call(airline, view, "transfer_to_human_agents", summary="wants a human").content == "Transfer successful"
    assert view.touched() == set()
