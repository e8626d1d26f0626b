"""A lending library: your own domain for ctu, in one file (docs/your-domain.md).

    python -m ctu env check examples.library.domain:load        # every task's gold actions earn reward 1.0
    ctu train configs/quickstart.yaml "env.domains=[examples.library.domain:load]" "trainer.sft_exclude=[]"

A domain is tools (functions of a database), a database (plain dicts: table -> key -> record), tasks (what the
simulated customer asks, the gold actions that do it, what the agent must say) and a policy the agent reads. The
reward is tau2-bench's, computed by ctu: the episode's final database must equal the one the gold actions produce
(``DB``), the agent must have said each ``communicate_info`` string (``COMMUNICATE``), and every env assertion
must hold on the final database (``ENV_ASSERTION``).
"""

from __future__ import annotations

from typing import Annotated

from ctu.domains.base import Action, Domain, EnvAssertion, Task, ToolError, tool

MAX_LOANS = 2
POLICY = (f"You are the library's assistant. Identify the member by member id before acting. A member may hold at "
          f"most {MAX_LOANS} books at once and may not borrow while owing fees. Only an available book can be lent. "
          "Confirm what you did in one sentence. Transfer to a human agent what you cannot do.")


# -- tools: ``fn(db, **params)``; the docstring and the ``Annotated`` descriptions become the tool's JSON schema ----
@tool()
def get_member(db, member_id: Annotated[str, "the member id, e.g. m1"]):
    """Look up a member: name, fees owed, books on loan."""
    member = db.get("members", member_id)
    if member is None:
        raise ToolError("Member not found")  # the agent sees the error as the tool's result
    return member


@tool()
def find_book(db, title: Annotated[str, "words of the title"]):
    """Find books whose title contains the given words (case-insensitive)."""
    words = title.lower().split()
    found = [book for _, book in db.items("books") if all(w in book["title"].lower() for w in words)]
    if not found:
        raise ToolError("No book matches")
    return found


@tool(mutates=True)
def lend_book(db, member_id: Annotated[str, "the member id"], book_id: Annotated[str, "the book id"]):
    """Lend an available book to a member (policy: at most two loans, no fees owed)."""
    member, book = db.get("members", member_id), db.get("books", book_id)
    if member is None or book is None:
        raise ToolError("Member or book not found")
    if not book["available"]:
        raise ToolError("Book is on loan")
    if member["fees"] > 0 or len(member["loans"]) >= MAX_LOANS:
        raise ToolError("Member may not borrow")
    db.edit("books", book_id)["available"] = False
    db.edit("members", member_id)["loans"].append(book_id)
    return f"{book['title']} lent to {member['name']}"


@tool(mutates=True)
def return_book(db, member_id: Annotated[str, "the member id"], book_id: Annotated[str, "the book id"]):
    """Record a book's return."""
    member = db.get("members", member_id)
    if member is None or book_id not in member["loans"]:
        raise ToolError("That member does not have that book")
    db.edit("members", member_id)["loans"].remove(book_id)
    db.edit("books", book_id)["available"] = True
    return "returned"


@tool()
def transfer_to_human_agents(db, summary: Annotated[str, "what the customer needs"]):
    """Transfer the customer to a human librarian."""
    return "Transfer successful"


# -- the database: the base every episode starts from (each episode writes to its own copy-on-write view) --------
DB = {
    "members": {"m1": {"id": "m1", "name": "Ada", "fees": 0, "loans": []},
                "m2": {"id": "m2", "name": "Ben", "fees": 3, "loans": ["b3"]},
                "m3": {"id": "m3", "name": "Cy", "fees": 0, "loans": ["b3", "b4"]}},
    "books": {"b1": {"id": "b1", "title": "The Left Hand of Darkness", "available": True},
              "b2": {"id": "b2", "title": "Dune", "available": True},
              "b3": {"id": "b3", "title": "Middlemarch", "available": False},
              "b4": {"id": "b4", "title": "Moby Dick", "available": False}},
}


def book_available(db, book_id: str, available: bool) -> bool:
    """An env assertion: ``fn(db, **arguments) -> bool`` on the episode's final database."""
    return (db.get("books", book_id) or {}).get("available") == available


def _task(task_id: str, script: list[str], actions: list[Action], say: tuple[str, ...] = (),
          asserts: tuple[EnvAssertion, ...] = ()) -> Task:
    """A task: the scripted customer says ``script`` one message per agent reply; success is the database the gold
    ``actions`` leave, the ``say`` facts in the agent's messages and the env assertions."""
    basis = ("DB", "COMMUNICATE", *(("ENV_ASSERTION",) if asserts else ()))
    return Task(id=task_id, user_scenario={"script": script}, actions=tuple(actions), communicate_info=say,
                env_assertions=asserts, reward_basis=basis if say else tuple(b for b in basis if b != "COMMUNICATE"))


def lend(member: str, book: str) -> list[Action]:
    return [Action("get_member", {"member_id": member}), Action("lend_book", {"member_id": member, "book_id": book})]


TASKS = (
    _task("lend-dune", ["I'm member m1. Can I borrow Dune, book b2?"], lend("m1", "b2"),
          asserts=(EnvAssertion("book_available", {"book_id": "b2", "available": False}),)),
    _task("lend-left-hand", ["Member m1 here, I'd like The Left Hand of Darkness (b1)."], lend("m1", "b1")),
    _task("refuse-fees", ["I'm m2 and want to borrow b2."], [Action("get_member", {"member_id": "m2"})],
          say=("3",)),  # owes 3 in fees: refuse and say how much (the database must stay as it was)
    _task("refuse-limit", ["I'm m3, can I take b1 too?"], [Action("get_member", {"member_id": "m3"})]),
    _task("return-middlemarch", ["Member m2: I'm returning Middlemarch, b3."],
          [Action("get_member", {"member_id": "m2"}), Action("return_book", {"member_id": "m2", "book_id": "b3"})],
          asserts=(EnvAssertion("book_available", {"book_id": "b3", "available": True}),)),
    _task("return-then-lend", ["I'm m3. I'm returning Moby Dick (b4) and want Dune (b2)."],
          [Action("get_member", {"member_id": "m3"}), Action("return_book", {"member_id": "m3", "book_id": "b4"}),
           Action("lend_book", {"member_id": "m3", "book_id": "b2"})]),
    _task("find-dune", ["Do you have Dune? Is it in?"], [Action("find_book", {"title": "dune"})], say=("b2",)),
    _task("fees-of-m2", ["I'm m2. How much do I owe?"], [Action("get_member", {"member_id": "m2"})], say=("3",)),
)


def load(data_dir: str | None = None) -> Domain:
    """The entry point ``env.domains`` names (``examples.library.domain:load``); ``data_dir`` is env.tau2_data_dir,
    unused here (read your data files from it if your domain has any)."""
    return Domain(name="library", policy=POLICY,
                  tools=(get_member, find_book, lend_book, return_book, transfer_to_human_agents),
                  db=DB, tasks=TASKS, assertions={"book_available": book_available},
                  splits={"train": ("lend-dune", "refuse-fees", "return-middlemarch", "find-dune", "fees-of-m2"),
                          "test": ("lend-left-hand", "refuse-limit", "return-then-lend")})
