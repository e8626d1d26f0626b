"""The retail domain's agent tools (tau2-bench's ``domains/retail/tools.py`` semantics, see the package docstring)."""

from __future__ import annotations

import json
from typing import Annotated, Literal

from ctu.domains.base import DBView, ToolError, tool
from ctu.domains.base.arith import evaluate

OrderId = Annotated[str, "The order id, such as '#W0000000'. Be careful there is a '#' symbol at the beginning of the order id."]
UserId = Annotated[str, "The user id, such as 'sara_doe_496'."]
PaymentId = Annotated[str, "The payment method id to pay or receive refund for the item price difference, such as "
                           "'gift_card_0000000' or 'credit_card_0000000'. These can be looked up from the user or order details."]
ORDER_OPTIONAL_FIELDS = ("cancel_reason", "exchange_items", "exchange_new_items", "exchange_payment_method_id",
                         "exchange_price_difference", "return_items", "return_payment_method_id")


# -- lookups (tau2's private helpers) ---------------------------------------------------
def _order(db: DBView, order_id: str) -> dict:
    if db.get("orders", order_id) is None:
        raise ToolError("Order not found")
    return db.get("orders", order_id)


def _user(db: DBView, user_id: str) -> dict:
    user = db.get("users", user_id)
    if user is None:
        raise ToolError("User not found")
    return user


def _product(db: DBView, product_id: str) -> dict:
    product = db.get("products", product_id)
    if product is None:
        raise ToolError("Product not found")
    return product


def _variant(db: DBView, product_id: str, variant_id: str) -> dict:
    product = _product(db, product_id)
    if variant_id not in product["variants"]:
        raise ToolError("Variant not found")
    return product["variants"][variant_id]


def _payment_method(db: DBView, user_id: str, payment_method_id: str) -> dict:
    user = _user(db, user_id)
    if payment_method_id not in user["payment_methods"]:
        raise ToolError("Payment method not found")
    return user["payment_methods"][payment_method_id]


def _is_gift_card(method: dict) -> bool:
    return method.get("source") == "gift_card"


def _edit_payment_method(db: DBView, user_id: str, payment_method_id: str) -> dict:
    return db.edit("users", user_id)["payment_methods"][payment_method_id]


def _check_items_exist(order: dict, item_ids: list[str], message) -> None:
    present = [item["item_id"] for item in order["items"]]
    for item_id in item_ids:
        if item_ids.count(item_id) > present.count(item_id):
            raise ToolError(message(item_id))


def _price_difference(db: DBView, order: dict, item_ids: list[str], new_item_ids: list[str],
                      reject_same: bool) -> tuple[float, dict | None]:
    """Sum of (new - old) prices in tau2's order of operations; also the last variant seen."""
    diff_price = 0
    variant = None
    for item_id, new_item_id in zip(item_ids, new_item_ids, strict=False):
        if reject_same and item_id == new_item_id:
            raise ToolError("The new item id should be different from the old item id")
        item = next((i for i in order["items"] if i["item_id"] == item_id), None)
        if item is None:
            raise ToolError(f"Item {item_id} not found")
        variant = _variant(db, item["product_id"], new_item_id)
        if not variant["available"]:
            raise ToolError(f"New item {new_item_id} not found or available")
        diff_price += variant["price"] - item["price"]
    return diff_price, variant


def _address(address1, address2, city, state, country, zip) -> dict:
    # tau2's UserAddress field order (its model_dump is what the agent reads): country before state
    return {"address1": address1, "address2": address2, "city": city, "country": country, "state": state, "zip": zip}


# -- tools --------------------------------------------------------------------------------
@tool()
def calculate(db, expression: Annotated[str, "The mathematical expression to calculate, such as '2 + 2'. The expression can contain numbers, operators (+, -, *, /), parentheses, and spaces."]):
    """Calculate the result of a mathematical expression."""
    try:  # tau2 reports any failure (syntax, division by zero, a tuple, overflow) as "Error: <exc>"
        return evaluate(expression)  # eval's answers, with products and powers bounded (ctu.domains.base.arith)
    except Exception as exc:  # noqa: BLE001
        raise ToolError(str(exc)) from None


@tool(mutates=True)
def cancel_pending_order(db, order_id: OrderId, reason: Annotated[Literal["no longer needed", "ordered by mistake"], "The reason for cancellation, which should be either 'no longer needed' or 'ordered by mistake'."]):
    """Cancel a pending order. If the order is already processed or delivered, it cannot be cancelled. The agent needs to explain the cancellation detail and ask for explicit user confirmation (yes/no) to proceed. If the user confirms, the order status will be changed to 'cancelled' and the payment will be refunded. The refund will be added to the user's gift card balance immediately if the payment was made using a gift card, otherwise the refund would take 5-7 business days to process. The function returns the order details after the cancellation."""
    order = _order(db, order_id)
    if order["status"] != "pending":
        raise ToolError("Non-pending order cannot be cancelled")
    refunds = []
    for payment in order["payment_history"]:
        refunds.append({"transaction_type": "refund", "amount": payment["amount"],
                        "payment_method_id": payment["payment_method_id"]})
        user = _user(db, order["user_id"])
        method = _payment_method(db, user["user_id"], payment["payment_method_id"])
        if _is_gift_card(method):
            card = _edit_payment_method(db, user["user_id"], payment["payment_method_id"])
            card["balance"] = round(card["balance"] + payment["amount"], 2)
    order = db.edit("orders", order_id)
    order["status"] = "cancelled"
    order["cancel_reason"] = reason
    order["payment_history"].extend(refunds)
    return order


@tool(mutates=True)
def exchange_delivered_order_items(db, order_id: OrderId,
                                   item_ids: Annotated[list[str], "The item ids to be exchanged, each such as '1008292230'. There could be duplicate items in the list."],
                                   new_item_ids: Annotated[list[str], "The item ids to be exchanged for, each such as '1008292230'. There could be duplicate items in the list. Each new item id should match the item id in the same position and be of the same product."],
                                   payment_method_id: PaymentId):
    """Exchange items in a delivered order to new items of the same product type. For a delivered order, return or exchange can be only done once by the agent. The agent needs to explain the exchange detail and ask for explicit user confirmation (yes/no) to proceed."""
    order = _order(db, order_id)
    if order["status"] != "delivered":
        raise ToolError("Non-delivered order cannot be exchanged")
    _check_items_exist(order, item_ids, lambda i: f"Number of {i} not found.")
    if len(item_ids) != len(new_item_ids):
        raise ToolError("The number of items to be exchanged should match.")
    diff_price, _ = _price_difference(db, order, item_ids, new_item_ids, reject_same=False)
    diff_price = round(diff_price, 2)
    method = _payment_method(db, order["user_id"], payment_method_id)
    if _is_gift_card(method) and method["balance"] < diff_price:
        raise ToolError("Insufficient gift card balance to pay for the price difference")
    order = db.edit("orders", order_id)
    order["status"] = "exchange requested"
    order["exchange_items"] = sorted(item_ids)
    order["exchange_new_items"] = sorted(new_item_ids)
    order["exchange_payment_method_id"] = payment_method_id
    order["exchange_price_difference"] = diff_price
    return order


@tool()
def find_user_id_by_name_zip(db, first_name: Annotated[str, "The first name of the customer, such as 'John'."],
                             last_name: Annotated[str, "The last name of the customer, such as 'Doe'."],
                             zip: Annotated[str, "The zip code of the customer, such as '12345'."]):
    """Find user id by first name, last name, and zip code. If the user is not found, the function will return an error message. By default, find user id by email, and only call this function if the user is not found by email or cannot remember email."""
    for user_id, user in db.items("users"):
        if (user["name"]["first_name"].lower() == first_name.lower()
                and user["name"]["last_name"].lower() == last_name.lower() and user["address"]["zip"] == zip):
            return user_id
    raise ToolError("User not found")


@tool()
def find_user_id_by_email(db, email: Annotated[str, "The email of the user, such as 'something@example.com'."]):
    """Find user id by email. If the user is not found, the function will return an error message."""
    for user_id, user in db.items("users"):
        if user["email"].lower() == email.lower():
            return user_id
    raise ToolError("User not found")


@tool()
def get_order_details(db, order_id: OrderId):
    """Get the status and details of an order."""
    return _order(db, order_id)


@tool()
def get_product_details(db, product_id: Annotated[str, "The product id, such as '6086499569'. Be careful the product id is different from the item id."]):
    """Get the inventory details of a product."""
    return _product(db, product_id)


@tool()
def get_item_details(db, item_id: Annotated[str, "The item id, such as '6086499569'. Be careful the item id is different from the product id."]):
    """Get the inventory details of an item."""
    for _, product in db.items("products"):
        if item_id in product["variants"]:
            return product["variants"][item_id]
    raise ToolError("Item not found")


@tool()
def get_user_details(db, user_id: UserId):
    """Get the details of a user, including their orders."""
    return _user(db, user_id)


@tool()
def list_all_product_types(db):
    """List the name and product id of all product types. Each product type has a variety of different items with unique item ids and options. There are only 50 product types in the store."""
    return json.dumps({p["name"]: p["product_id"] for _, p in db.items("products")}, sort_keys=True)


_ADDRESS_DOC = {
    "address1": "The first line of the address, such as '123 Main St'.",
    "address2": "The second line of the address, such as 'Apt 1' or ''.",
    "city": "The city, such as 'San Francisco'.", "state": "The state, such as 'CA'.",
    "country": "The country, such as 'USA'.", "zip": "The zip code, such as '12345'.",
}


@tool(mutates=True)
def modify_pending_order_address(db, order_id: OrderId, address1: Annotated[str, _ADDRESS_DOC["address1"]],
                                 address2: Annotated[str, _ADDRESS_DOC["address2"]], city: Annotated[str, _ADDRESS_DOC["city"]],
                                 state: Annotated[str, _ADDRESS_DOC["state"]], country: Annotated[str, _ADDRESS_DOC["country"]],
                                 zip: Annotated[str, _ADDRESS_DOC["zip"]]):
    """Modify the shipping address of a pending order. The agent needs to explain the modification detail and ask for explicit user confirmation (yes/no) to proceed."""
    if "pending" not in _order(db, order_id)["status"]:
        raise ToolError("Non-pending order cannot be modified")
    order = db.edit("orders", order_id)
    order["address"] = _address(address1, address2, city, state, country, zip)
    return order


@tool(mutates=True)
def modify_pending_order_items(db, order_id: OrderId,
                               item_ids: Annotated[list[str], "The item ids to be modified, each such as '1008292230'. There could be duplicate items in the list."],
                               new_item_ids: Annotated[list[str], "The item ids to be modified for, each such as '1008292230'. There could be duplicate items in the list. Each new item id should match the item id in the same position and be of the same product."],
                               payment_method_id: PaymentId):
    """Modify items in a pending order to new items of the same product type. For a pending order, this function can only be called once. The agent needs to explain the exchange detail and ask for explicit user confirmation (yes/no) to proceed."""
    order = _order(db, order_id)
    if order["status"] != "pending":
        raise ToolError("Non-pending order cannot be modified")
    _check_items_exist(order, item_ids, lambda i: f"{i} not found")
    if len(item_ids) != len(new_item_ids):
        raise ToolError("The number of items to be exchanged should match")
    diff_price, variant = _price_difference(db, order, item_ids, new_item_ids, reject_same=True)
    method = _payment_method(db, order["user_id"], payment_method_id)
    if _is_gift_card(method) and method["balance"] < diff_price:
        raise ToolError("Insufficient gift card balance to pay for the new item")
    order = db.edit("orders", order_id)
    order["payment_history"].append({"transaction_type": "payment" if diff_price > 0 else "refund",
                                     "amount": abs(diff_price), "payment_method_id": payment_method_id})
    if _is_gift_card(method):
        card = _edit_payment_method(db, order["user_id"], payment_method_id)
        card["balance"] = round(card["balance"] - diff_price, 2)
    for item_id, new_item_id in zip(item_ids, new_item_ids, strict=False):
        item = next((i for i in order["items"] if i["item_id"] == item_id), None)
        if item is None:
            raise ToolError(f"Item {item_id} not found")
        item["item_id"] = new_item_id
        item["price"] = variant["price"]  # type: ignore[index]  # tau2 quirk: the last variant of the loop above
        item["options"] = dict(variant["options"])  # type: ignore[index]
    order["status"] = "pending (item modified)"
    return order


@tool(mutates=True)
def modify_pending_order_payment(db, order_id: OrderId, payment_method_id: PaymentId):
    """Modify the payment method of a pending order. The agent needs to explain the modification detail and ask for explicit user confirmation (yes/no) to proceed."""
    order = _order(db, order_id)
    if "pending" not in order["status"]:
        raise ToolError("Non-pending order cannot be modified")
    method = _payment_method(db, order["user_id"], payment_method_id)
    history = order["payment_history"]
    if len(history) != 1 or history[0]["transaction_type"] != "payment":
        raise ToolError("There should be exactly one payment for a pending order")
    if history[0]["payment_method_id"] == payment_method_id:
        raise ToolError("The new payment method should be different from the current one")
    amount = history[0]["amount"]
    if _is_gift_card(method) and method["balance"] < amount:
        raise ToolError("Insufficient gift card balance to pay for the order")
    order = db.edit("orders", order_id)
    old_id = order["payment_history"][0]["payment_method_id"]
    order["payment_history"].extend([
        {"transaction_type": "payment", "amount": amount, "payment_method_id": payment_method_id},
        {"transaction_type": "refund", "amount": amount, "payment_method_id": old_id},
    ])
    if _is_gift_card(method):
        card = _edit_payment_method(db, order["user_id"], payment_method_id)
        card["balance"] = round(card["balance"] - amount, 2)
    if _is_gift_card(_payment_method(db, order["user_id"], old_id)):
        card = _edit_payment_method(db, order["user_id"], old_id)
        card["balance"] = round(card["balance"] + amount, 2)
    return order


@tool(mutates=True)
def modify_user_address(db, user_id: UserId, address1: Annotated[str, _ADDRESS_DOC["address1"]],
                        address2: Annotated[str, _ADDRESS_DOC["address2"]], city: Annotated[str, _ADDRESS_DOC["city"]],
                        state: Annotated[str, _ADDRESS_DOC["state"]], country: Annotated[str, _ADDRESS_DOC["country"]],
                        zip: Annotated[str, _ADDRESS_DOC["zip"]]):
    """Modify the default address of a user. The agent needs to explain the modification detail and ask for explicit user confirmation (yes/no) to proceed."""
    _user(db, user_id)
    user = db.edit("users", user_id)
    user["address"] = _address(address1, address2, city, state, country, zip)
    return user


@tool(mutates=True)
def return_delivered_order_items(db, order_id: OrderId,
                                 item_ids: Annotated[list[str], "The item ids to be returned, each such as '1008292230'. There could be duplicate items in the list."],
                                 payment_method_id: Annotated[str, "The payment method id to pay or receive refund for the item price difference, such as 'gift_card_0000000' or 'credit_card_0000000'. These can be looked up from the user or order details."]):
    """Return some items of a delivered order. The order status will be changed to 'return requested'. The agent needs to explain the return detail and ask for explicit user confirmation (yes/no) to proceed. The user will receive follow-up email for how and where to return the item."""
    order = _order(db, order_id)
    if order["status"] != "delivered":
        raise ToolError("Non-delivered order cannot be returned")
    user = _user(db, order["user_id"])
    method = _payment_method(db, user["user_id"], payment_method_id)
    if not _is_gift_card(method) and payment_method_id != order["payment_history"][0]["payment_method_id"]:
        raise ToolError("Payment method should be the original payment method")
    _check_items_exist(order, item_ids, lambda i: "Some item not found")
    order = db.edit("orders", order_id)
    order["status"] = "return requested"
    order["return_items"] = sorted(item_ids)
    order["return_payment_method_id"] = payment_method_id
    return order


@tool()
def transfer_to_human_agents(db, summary: Annotated[str, "A summary of the user's issue."]):
    """Transfer the user to a human agent, with a summary of the user's issue. Only transfer if
 -  the user explicitly asks for a human agent
 -  given the policy and the available tools, you cannot solve the user's issue."""
    return "Transfer successful"


TOOLS = (calculate, cancel_pending_order, exchange_delivered_order_items, find_user_id_by_name_zip,
         find_user_id_by_email, get_order_details, get_product_details, get_item_details, get_user_details,
         list_all_product_types, modify_pending_order_address, modify_pending_order_items,
         modify_pending_order_payment, modify_user_address, return_delivered_order_items, transfer_to_human_agents)
