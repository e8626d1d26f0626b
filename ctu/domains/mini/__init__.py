"""``mini``: a small store generated from a seed, for learning tool use on a CPU in minutes.

One table of orders, four tools, a policy under 150 words, and a few hundred one-line
requests (status, cancel, change address, return), about a third of which the policy says
to refuse. The scripted user says its request, then ends the conversation after the
agent's first message to it. Everything is deterministic in the seed.
"""

from __future__ import annotations

import random
from functools import partial
from typing import Annotated

from ctu.domains.base import TWIN, Action, Domain, Task, ToolError, tool

POLICY = """You help customers of a small store.
- First look up the order with get_order.
- Cancel or change the address only if the order is pending.
- Return only if the order is delivered.
- If a request is not allowed, change nothing and tell the user the order status.
- When asked about an order, tell the user its status.
- Then answer the user in one short message."""

# shorter than tau2's agent instruction (74 SmolLM2 tokens), for short prompts on a CPU
AGENT_INSTRUCTION = ("You are a customer service agent. Follow the policy. "
                     "In each turn, either call one tool or send the user one message.")

OrderId = str
NAMES = ("Ana", "Ben", "Chloe", "Dev", "Eva", "Finn", "Gia", "Hugo", "Ines", "Jon", "Kai", "Lena", "Milo", "Nora")
ITEMS = ("lamp", "mug", "chair", "kettle", "backpack", "jacket", "clock", "blender", "desk", "scarf", "camera", "vase")
STREETS = ("Oak St", "Pine Ave", "Elm Rd", "Maple Ln", "Cedar Way", "Birch Blvd", "Lake Dr", "Hill Ct")
STATUSES = ("pending", "shipped", "delivered", "cancelled")


def _order(db, order_id: str) -> dict:
    order = db.get("orders", order_id)
    if order is None:
        raise ToolError("Order not found")
    return order


@tool()
def get_order(db, order_id: OrderId):
    """Look up an order: item, status, address."""
    return _order(db, order_id)


@tool(mutates=True)
def cancel_order(db, order_id: OrderId):
    """Cancel a pending order."""
    if _order(db, order_id)["status"] != "pending":
        raise ToolError("Only pending orders can be cancelled")
    order = db.edit("orders", order_id)
    order["status"] = "cancelled"
    return order


@tool(mutates=True)
def change_address(db, order_id: OrderId, address: Annotated[str, "like '12 Oak St'"]):
    """Change the address of a pending order."""
    if _order(db, order_id)["status"] != "pending":
        raise ToolError("Only pending orders can change address")
    order = db.edit("orders", order_id)
    order["address"] = address
    return order


@tool(mutates=True)
def return_order(db, order_id: OrderId):
    """Return a delivered order."""
    if _order(db, order_id)["status"] != "delivered":
        raise ToolError("Only delivered orders can be returned")
    order = db.edit("orders", order_id)
    order["status"] = "returned"
    return order


TOOLS = (get_order, cancel_order, change_address, return_order)

REQUESTS = {
    "status": ("Hi, what is the status of my order {oid}?", "Where is my order {oid}?",
               "Can you check order {oid} for me?"),
    "cancel": ("Hi, please cancel my order {oid}.", "I want to cancel order {oid}.",
               "Cancel order {oid}, I no longer need it."),
    "change_address": ("Please send order {oid} to {address} instead.", "Change the address of order {oid} to {address}.",
                       "I moved. Ship order {oid} to {address}, please."),
    "return": ("I want to return my order {oid}.", "Please return order {oid}, it is not what I wanted.",
               "Hi, can I return order {oid}?"),
}
# which statuses make a request allowed; the others are refusals
ALLOWED = {"cancel": "pending", "change_address": "pending", "return": "delivered"}
WRITE_TOOL = {"cancel": "cancel_order", "change_address": "change_address", "return": "return_order"}


def _make_db(rng: random.Random, n_orders: int) -> dict:
    orders = {}
    for i in range(n_orders):
        oid = f"O{1001 + i}"
        orders[oid] = {"order_id": oid, "customer": rng.choice(NAMES), "item": rng.choice(ITEMS),
                       "status": STATUSES[i % len(STATUSES)],
                       "address": f"{rng.randint(1, 99)} {rng.choice(STREETS)}"}
    return {"orders": orders}


def _make_task(rng: random.Random, n: int, kind: str, order: dict, requests: dict[str, tuple]) -> Task:
    """Task ``n``: a ``kind`` request of ``order``; what its twin is built from goes to ``requests``."""
    oid = order["order_id"]
    address = f"{rng.randint(1, 99)} {rng.choice(STREETS)}"
    while address == order["address"]:
        address = f"{rng.randint(1, 99)} {rng.choice(STREETS)}"
    request = rng.choice(REQUESTS[kind]).format(oid=oid, address=address)
    requests[f"mini-{n:04d}"] = (n, kind, oid, order["status"], request, address)
    return _build_task(f"mini-{n:04d}", n, kind, oid, order["status"], request, address)


def _build_task(task_id: str, n: int, kind: str, oid: str, status: str, request: str, address: str,
                initial_state: dict | None = None) -> Task:
    """A task asking ``request`` of order ``oid`` whose status is ``status`` when the episode starts."""
    actions = [Action("get_order", {"order_id": oid}, action_id=f"mini-{n}-0")]
    communicate: tuple[str, ...] = ()
    basis: tuple[str, ...] = ("DB",)
    refused = kind != "status" and status != ALLOWED[kind]
    if kind == "status" or refused:
        communicate = (status,)
        basis = ("DB", "COMMUNICATE")
    else:
        args = {"order_id": oid, "address": address} if kind == "change_address" else {"order_id": oid}
        actions.append(Action(WRITE_TOOL[kind], args, action_id=f"mini-{n}-1"))
    scenario = {"instructions": {"domain": "mini", "reason_for_call": request, "known_info": f"Your order id is {oid}.",
                                 "task_instructions": ""}, "script": [request]}
    purpose = f"{kind} ({'refuse: order is ' + status if refused else 'allowed'})"
    return Task(id=task_id, user_scenario=scenario, actions=tuple(actions), communicate_info=communicate,
                reward_basis=basis,
                description={"purpose": purpose, "kind": kind, "refusal": refused, "status": status},
                initial_state=initial_state)


def set_order_status(db, order_id: str, status: str) -> None:
    """An initialization function (a twin task's starting state): order ``order_id`` has ``status``."""
    if status not in STATUSES:
        raise ValueError(f"unknown order status {status!r} (known: {', '.join(STATUSES)})")
    db.edit("orders", _order(db, order_id)["order_id"])["status"] = status


def _twin(requests: dict[str, tuple], task: Task) -> Task | None:
    """The contrast task of a write request (``trainer.contrast_pairs``): the same request, words and order, with
    the order's status set at the start to one that calls for the other outcome (a refused request's twin is
    allowed, an allowed one's refused); None for a status request."""
    if task.id not in requests:
        return None
    n, kind, oid, status, request, address = requests[task.id]
    if kind == "status":
        return None
    if status == ALLOWED[kind]:
        others = [s for s in STATUSES if s != ALLOWED[kind]]
        status = others[n % len(others)]
    else:
        status = ALLOWED[kind]
    start = {"initialization_actions": [{"env_type": "assistant", "func_name": "set_order_status",
                                         "arguments": {"order_id": oid, "status": status}}]}
    return _build_task(f"{task.id}{TWIN}", n, kind, oid, status, request, address, initial_state=start)


def _closing(task: Task) -> str:
    """mini's last gold message: the order status for status requests and refusals, else a confirmation."""
    if task.communicate_info:
        return f"The order status is {', '.join(task.communicate_info)}."
    return "Done, your request is complete."


_DOING = {"cancel_order": "I will cancel it", "change_address": "I will change the address",
          "return_order": "I will return it"}


def _reason(task: Task, call) -> str:
    """A gold write's reason, stated in its turn: the order status the lookup returned, which allows it."""
    status = (task.description or {}).get("status")
    if call.name not in _DOING or status is None:
        return ""
    return f"The order status is {status}, so {_DOING[call.name]}."


def load(data_dir: str | None = None, seed: int = 0, n_tasks: int = 300, test_fraction: float = 0.2) -> Domain:
    """The mini domain for ``seed`` (``data_dir`` is unused: everything is generated)."""
    rng = random.Random(seed)
    db = _make_db(rng, n_orders=120)
    orders = list(db["orders"].values())
    kinds = ["status", "cancel", "change_address", "return"]
    tasks: list[Task] = []
    requests: dict[str, tuple] = {}  # what a twin task is built from
    for n in range(n_tasks):
        kind = kinds[n % len(kinds)]
        if kind == "status":
            pool = orders
        elif rng.random() < 0.35:  # a refusal: the order's status does not allow the request
            pool = [o for o in orders if o["status"] != ALLOWED[kind]]
        else:
            pool = [o for o in orders if o["status"] == ALLOWED[kind]]
        tasks.append(_make_task(rng, n, kind, rng.choice(pool), requests))
    ids = [t.id for t in tasks]
    rng.shuffle(ids)
    n_test = int(len(ids) * test_fraction)
    splits = {"train": tuple(sorted(ids[n_test:])), "test": tuple(sorted(ids[:n_test]))}
    return Domain(name="mini", policy=POLICY, tools=TOOLS, db=db, tasks=tuple(tasks), splits=splits,
                  transfer_tool=None, agent_instruction=AGENT_INSTRUCTION, closing=_closing,
                  functions={"assistant": {"set_order_status": set_order_status}}, twin=partial(_twin, requests),
                  reason=_reason, communicate_to_user=True)
