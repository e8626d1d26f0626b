"""Retail tools against tau2-bench's rules, with expectations computed by hand from db.json."""

import hashlib

import pytest

from ctu.domains import get_domain
from ctu.domains.base import canonical, run_tool


@pytest.fixture(scope="module")
def retail():
    return get_domain("retail")


def call(domain, view, name, **args):
    return run_tool(domain.tool(name), view, args, name)


def test_tool_set_and_schemas_match_tau2(retail):
    names = {t.name for t in retail.tools}
    assert names == {"calculate", "cancel_pending_order", "exchange_delivered_order_items", "find_user_id_by_name_zip",
                     "find_user_id_by_email", "get_order_details", "get_product_details", "get_item_details",
                     "get_user_details", "list_all_product_types", "modify_pending_order_address",
                     "modify_pending_order_items", "modify_pending_order_payment", "modify_user_address",
                     "return_delivered_order_items", "transfer_to_human_agents"}
    writes = {t.name for t in retail.tools if t.mutates}
    assert writes == {"cancel_pending_order", "exchange_delivered_order_items", "modify_pending_order_address",
                      "modify_pending_order_items", "modify_pending_order_payment", "modify_user_address",
                      "return_delivered_order_items"}
    params = retail.tool("exchange_delivered_order_items").openai_schema()["function"]["parameters"]
    assert params["required"] == ["order_id", "item_ids", "new_item_ids", "payment_method_id"]
    assert params["properties"]["item_ids"]["type"] == "array"
    reason = retail.tool("cancel_pending_order").parameters["properties"]["reason"]
    assert reason["enum"] == ["no longer needed", "ordered by mistake"]


# Gold writes that fail under tau2's own rules too (the data's gold actions include them):
# task 64 exchanges items of a *pending* order before modifying it; task 105's price difference
# (101.12 + 109.58 - 2 * 94.8 = 21.1) exceeds the 17.0 gift card balance.
KNOWN_FAILING_GOLD_WRITES = {
    ("64", "exchange_delivered_order_items"): "Error: Non-delivered order cannot be exchanged",
    ("105", "exchange_delivered_order_items"): "Error: Insufficient gift card balance to pay for the price difference",
}


def test_gold_replay_leaves_the_shared_db_untouched(retail):
    before = hashlib.sha256(canonical(retail.db).encode()).hexdigest()
    failing = {}
    for task in retail.tasks:
        view = retail.new_db()
        for a in task.actions:
            result = call(retail, view, a.name, **a.arguments)
            if retail.tool(a.name).mutates and result.error:
                failing[(task.id, a.name)] = result.content
    assert failing == KNOWN_FAILING_GOLD_WRITES
    assert hashlib.sha256(canonical(retail.db).encode()).hexdigest() == before


def test_cancel_refunds_gift_card_immediately(retail):
    view = retail.new_db()
    out = call(retail, view, "cancel_pending_order", order_id="#W6779827", reason="no longer needed")
    assert not out.error
    order = view.get("orders", "#W6779827")
    assert order["status"] == "cancelled" and order["cancel_reason"] == "no longer needed"
    assert order["payment_history"][-1] == {"transaction_type": "refund", "amount": 4079.45,
                                            "payment_method_id": "gift_card_7219486"}
    assert view.get("users", "ethan_lopez_6291")["payment_methods"]["gift_card_7219486"]["balance"] == round(49.0 + 4079.45, 2)


def test_cancel_errors_leave_db_unchanged(retail):
    cases = [({"order_id": "#W6304490", "reason": "no longer needed"}, "Error: Non-pending order cannot be cancelled"),
             ({"order_id": "#W0000000", "reason": "no longer needed"}, "Error: Order not found"),
             ({"order_id": "#W6779827", "reason": "too expensive"}, "'reason' must be one of"),
             ({"order_id": "#W6779827"}, "missing required argument 'reason'")]
    for args, message in cases:
        view = retail.new_db()
        out = call(retail, view, "cancel_pending_order", **args)
        assert out.error and message in out.content
        assert view.touched() == set()


def test_modify_items_uses_the_last_variant_price_for_every_item_quirk(retail):
    view = retail.new_db()
    order = retail.db["orders"]["#W6779827"]
    a, b = order["items"][0], order["items"][3]
    new_a = next(k for k, v in retail.db["products"][a["product_id"]]["variants"].items()
                 if v["available"] and k != a["item_id"])
    new_b = next(k for k, v in retail.db["products"][b["product_id"]]["variants"].items()
                 if v["available"] and k != b["item_id"])
    va = retail.db["products"][a["product_id"]]["variants"][new_a]
    vb = retail.db["products"][b["product_id"]]["variants"][new_b]
    diff = 0 + (va["price"] - a["price"]) + (vb["price"] - b["price"])
    out = call(retail, view, "modify_pending_order_items", order_id="#W6779827", item_ids=[a["item_id"], b["item_id"]],
               new_item_ids=[new_a, new_b], payment_method_id="credit_card_9789590")
    assert not out.error, out.content
    items = view.get("orders", "#W6779827")["items"]
    assert items[0]["item_id"] == new_a and items[0]["price"] == vb["price"] and items[0]["options"] == vb["options"]
    assert items[3]["item_id"] == new_b and items[3]["price"] == vb["price"]
    last = view.get("orders", "#W6779827")["payment_history"][-1]
    assert last == {"transaction_type": "payment" if diff > 0 else "refund", "amount": abs(diff),
                    "payment_method_id": "credit_card_9789590"}
    assert view.get("orders", "#W6779827")["status"] == "pending (item modified)"


def test_modify_items_errors(retail):
    order = retail.db["orders"]["#W6779827"]
    a = order["items"][0]
    cases = [
        ({"item_ids": [a["item_id"]], "new_item_ids": [a["item_id"]]}, "The new item id should be different"),
        ({"item_ids": ["123"], "new_item_ids": ["456"]}, "123 not found"),
        ({"item_ids": [a["item_id"]], "new_item_ids": []}, "The number of items to be exchanged should match"),
        ({"item_ids": [a["item_id"]], "new_item_ids": ["0000000000"]}, "Variant not found"),
    ]
    for args, message in cases:
        view = retail.new_db()
        out = call(retail, view, "modify_pending_order_items", order_id="#W6779827",
                   payment_method_id="credit_card_9789590", **args)
        assert out.error and message in out.content, out.content
        assert view.touched() == set()


def test_gift_card_balance_checks(retail):
    view = retail.new_db()
    out = call(retail, view, "modify_pending_order_payment", order_id="#W6779827", payment_method_id="credit_card_9789590")
    assert not out.error
    history = view.get("orders", "#W6779827")["payment_history"]
    assert [h["transaction_type"] for h in history] == ["payment", "payment", "refund"]
    assert view.get("users", "ethan_lopez_6291")["payment_methods"]["gift_card_7219486"]["balance"] == round(49.0 + 4079.45, 2)
    again = call(retail, view, "modify_pending_order_payment", order_id="#W6779827", payment_method_id="gift_card_7219486")
    assert again.content == "Error: There should be exactly one payment for a pending order"


def test_return_and_exchange_on_delivered_orders(retail):
    view = retail.new_db()
    bad = call(retail, view, "return_delivered_order_items", order_id="#W6304490", item_ids=["6956751343"],
               payment_method_id="paypal_0000")
    assert bad.content == "Error: Payment method not found"
    out = call(retail, view, "return_delivered_order_items", order_id="#W6304490",
               item_ids=["9375701158", "6956751343"], payment_method_id="credit_card_4420174")
    order = view.get("orders", "#W6304490")
    assert not out.error and order["status"] == "return requested"
    assert order["return_items"] == ["6956751343", "9375701158"] and order["return_payment_method_id"] == "credit_card_4420174"
    again = call(retail, view, "exchange_delivered_order_items", order_id="#W6304490", item_ids=["6956751343"],
                 new_item_ids=["6956751343"], payment_method_id="credit_card_4420174")
    assert again.content == "Error: Non-delivered order cannot be exchanged"
    view2 = retail.new_db()
    dup = call(retail, view2, "return_delivered_order_items", order_id="#W6304490",
               item_ids=["9375701158", "9375701158"], payment_method_id="credit_card_4420174")
    assert dup.content == "Error: Some item not found" and view2.touched() == set()


def test_exchange_rounds_the_price_difference(retail):
    view = retail.new_db()
    item = retail.db["orders"]["#W6304490"]["items"][0]
    new = next(k for k, v in retail.db["products"][item["product_id"]]["variants"].items()
               if v["available"] and k != item["item_id"])
    out = call(retail, view, "exchange_delivered_order_items", order_id="#W6304490", item_ids=[item["item_id"]],
               new_item_ids=[new], payment_method_id="credit_card_4420174")
    assert not out.error
    expected = round(0 + retail.db["products"][item["product_id"]]["variants"][new]["price"] - item["price"], 2)
    assert view.get("orders", "#W6304490")["exchange_price_difference"] == expected


def test_reads_and_outputs(retail):
    view = retail.new_db()
    assert call(retail, view, "find_user_id_by_email", email="NOAH.BROWN7922@example.com").content == "noah_brown_6181"
    assert call(retail, view, "find_user_id_by_name_zip", first_name="noah", last_name="BROWN", zip="80279").content == "noah_brown_6181"
    assert call(retail, view, "calculate", expression="2 + 2").content == "4.0"
    assert call(retail, view, "calculate", expression="import os").content == "Error: Invalid characters in expression"
    assert call(retail, view, "calculate", expression="1/0").error
    assert '"cancel_reason": null' in call(retail, view, "get_order_details", order_id="#W6304490").content
    assert call(retail, view, "get_item_details", item_id="6956751343").content.startswith('{"item_id": "6956751343"')
    assert call(retail, view, "transfer_to_human_agents", summary="x").content == "Transfer successful"
    assert view.touched() == set()


def test_views_do_not_see_each_others_writes(retail):
    a, b = retail.new_db(), retail.new_db()
    call(retail, a, "modify_user_address", user_id="noah_brown_6181", address1="1 A St", address2="", city="X",
         state="CA", country="USA", zip="00000")
    assert a.get("users", "noah_brown_6181")["address"]["zip"] == "00000"
    assert b.get("users", "noah_brown_6181")["address"]["zip"] == "80279"
