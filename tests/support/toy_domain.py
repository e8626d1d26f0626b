"""A tiny domain for testing env/reward mechanics independently of retail/airline/mini."""

from __future__ import annotations

from typing import Annotated, Literal, TypedDict

from ctu.domains.base import Action, Domain, EnvAssertion, Task, ToolError, tool


class Line(TypedDict):
    sku: Annotated[str, "stock keeping unit"]
    qty: Annotated[int, "how many"]


@tool()
def get_box(db, box_id: Annotated[str, "the box id"]):
    """Look up a box."""
    box = db.get("boxes", box_id)
    if box is None:
        raise ToolError("Box not found")
    return box


@tool(mutates=True)
def paint_box(db, box_id: Annotated[str, "the box id"], color: Annotated[Literal["red", "blue"], "new color"],
              note: Annotated[str | None, "optional note"] = None):
    """Paint a box."""
    if db.get("boxes", box_id) is None:
        raise ToolError("Box not found")
    box = db.edit("boxes", box_id)
    box["color"] = color
    if note is not None:
        box["note"] = note
    return box


@tool(mutates=True)
def fill_box(db, box_id: Annotated[str, "the box id"], lines: Annotated[list[Line], "what to put in"]):
    """Fill a box; fails after recording the attempt when a line has qty 0 (a partial-mutation quirk)."""
    box = db.edit("boxes", box_id)
    box.setdefault("attempts", 0)
    box["attempts"] += 1
    for line in lines:
        if line["qty"] == 0:
            raise ToolError("qty must be positive")
    box["contents"] = [dict(x) for x in lines]
    return "filled"


@tool()
def transfer_to_human_agents(db, summary: Annotated[str, "summary"]):
    """Transfer the user to a human agent."""
    return "Transfer successful"


def _box_is(db, box_id: str, color: str) -> bool:
    return (db.get("boxes", box_id) or {}).get("color") == color


def make_toy_domain() -> Domain:
    db = {"boxes": {"b1": {"id": "b1", "color": "green"}, "b2": {"id": "b2", "color": "red"}}}
    tasks = (
        Task(id="paint", user_scenario={"script": ["Paint b1 blue please."]},
             actions=(Action("get_box", {"box_id": "b1"}), Action("paint_box", {"box_id": "b1", "color": "blue"})),
             communicate_info=("blue",), reward_basis=("DB", "COMMUNICATE")),
        Task(id="refuse", user_scenario={"script": ["Paint b2 purple."]},
             actions=(Action("get_box", {"box_id": "b2"}),), reward_basis=("DB",)),
        Task(id="actions", user_scenario={"script": ["Check b1."]},
             actions=(Action("get_box", {"box_id": "b1"}, compare_args=("box_id",)),), reward_basis=("ACTION",)),
        Task(id="assert", user_scenario={"script": ["Paint b1 red."]},
             actions=(Action("paint_box", {"box_id": "b1", "color": "red"}),),
             env_assertions=(EnvAssertion("box_is", {"box_id": "b1", "color": "red"}),),
             reward_basis=("DB", "ENV_ASSERTION")),
        Task(id="judged", user_scenario={"script": ["Hi."]}, actions=(), nl_assertions=("Agent is polite.",),
             reward_basis=("DB", "NL_ASSERTION")),
    )
    return Domain(name="toy", policy="Be nice.", tools=(get_box, paint_box, fill_box, transfer_to_human_agents),
                  db=db, tasks=tasks, splits={"train": ("paint", "refuse"), "test": ("actions",)},
                  assertions={"box_is": _box_is})
