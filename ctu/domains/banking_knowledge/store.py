"""The bank's records as the tools see them: tau2's 23 tables over an episode's copy-on-write DB, and its queries.

ctu keeps each table's ``data`` (record id -> record); tau2's per-table ``notes`` never change and are not
kept. :class:`Bank` is what every tool receives as ``self``: reads return the stored record (never mutate it),
``edit`` returns the episode's own copy. Beside the tables, an episode keeps state tau2 keeps on its toolkit
objects, outside the hashed DB (the unlocked agent tools, the read-log allowlist): it lives in the ``_session``
table, which DB comparisons leave out.

:func:`query_db` and :func:`query_database_tool` are tau2's constraint queries (``field__op`` keys) with their
outputs and their Python errors: a constraint named ``db`` or ``limit`` binds that parameter, as in tau2.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from typing import Any

from ctu.domains.base import DBView

# tau2's TransactionalDB fields, in its order (the order its database listing names them in)
TABLES = ("users", "accounts", "debit_cards", "referrals", "credit_card_applications", "user_discoverable_tools",
          "user_discoverable_tool_calls", "verification_history", "credit_card_transaction_history",
          "cash_back_disputes", "bank_account_transaction_history", "credit_card_accounts",
          "agent_discoverable_tools", "task_config", "human_transfer_requests", "transaction_disputes",
          "credit_card_orders", "debit_card_orders", "credit_card_closure_reasons", "credit_card_account_flags",
          "credit_limit_increase_requests", "payment_history", "debit_card_disputes")
# the tables tau2's query helper lists, in its order
QUERYABLE = ("users", "accounts", "referrals", "credit_card_applications", "user_discoverable_tools",
             "user_discoverable_tool_calls", "agent_discoverable_tools", "task_config", "verification_history",
             "credit_card_transaction_history", "cash_back_disputes", "bank_account_transaction_history",
             "credit_card_accounts", "human_transfer_requests", "transaction_disputes", "credit_card_orders",
             "credit_card_closure_reasons", "credit_card_account_flags", "debit_cards", "debit_card_orders",
             "debit_card_disputes", "credit_limit_increase_requests", "payment_history")
SESSION = "_session"
TAU2_QUERY_DB = "tau2.domains.banking_knowledge.db_query.query_db()"


class Bank:
    """One episode's bank: table reads and writes through its DBView, and its session state."""

    __slots__ = ("view",)

    def __init__(self, view: DBView):
        self.view = view

    # -- reads (tau2: ``db.<table>.data`` as a dict) --------------------------------------
    def get(self, table: str, key: Any) -> dict | None:
        return self.view.get(table, key)

    def has(self, table: str, key: Any) -> bool:
        return self.view.get(table, key) is not None

    def rows(self, table: str) -> Iterator[tuple[str, dict]]:
        return self.view.items(table)

    def values(self, table: str) -> Iterator[dict]:
        return (record for _, record in self.view.items(table))

    def any(self, table: str) -> bool:
        return next(iter(self.view.keys(table)), None) is not None

    # -- writes --------------------------------------------------------------------------
    def edit(self, table: str, key: Any) -> dict:
        return self.view.edit(table, key)

    def put(self, table: str, key: Any, record: dict) -> None:
        """``data[key] = record``: add or replace."""
        self.view.put(table, key, record)

    def add(self, table: str, key: Any, record: dict) -> bool:
        """tau2's ``add_to_db``: False for an unknown table or an existing id, else stored."""
        if table not in TABLES or self.has(table, key):
            return False
        self.view.put(table, key, record)
        return True

    def update(self, table: str, key: Any, updates: dict[str, Any]) -> bool:
        """tau2's ``update_record_in_db``: set fields of an existing record; False if there is none."""
        if table not in TABLES or not self.has(table, key):
            return False
        record = self.view.edit(table, key)
        for name, value in updates.items():
            record[name] = value
        return True

    # -- the episode's state beside the DB ---------------------------------------------------
    def session(self) -> dict[str, Any]:
        state = self.view.get(SESSION, "state")
        if state is None:
            state = {"unlocked": {}, "allowlist": frozenset()}
            self.view.put(SESSION, "state", state)
        return state


def start_session(view: DBView, allowlist: frozenset[str]) -> None:
    """An episode's fresh session: nothing unlocked; ``allowlist`` names the read tools whose calls are logged."""
    view.put(SESSION, "state", {"unlocked": {}, "allowlist": allowlist})


# -- queries ----------------------------------------------------------------------------------
def _contains(a: Any, b: Any) -> bool:
    return b in a if a is not None else False


def _startswith(a: Any, b: Any) -> bool:
    return str(a).startswith(str(b)) if a is not None else False


def _endswith(a: Any, b: Any) -> bool:
    return str(a).endswith(str(b)) if a is not None else False


OPERATORS = {"eq": operator.eq, "ne": operator.ne, "gt": operator.gt, "gte": operator.ge, "lt": operator.lt,
             "lte": operator.le, "contains": _contains, "startswith": _startswith, "endswith": _endswith,
             "in": lambda a, b: a in b, "nin": lambda a, b: a not in b}


def matches(record: dict, constraints: dict[str, Any]) -> bool:
    """Every ``field`` / ``field__op`` constraint holds (an unknown op is ``eq``; a comparison that raises fails)."""
    for key, expected in constraints.items():
        field, op = key.rsplit("__", 1) if "__" in key else (key, "eq")
        compare = OPERATORS.get(op, operator.eq)
        try:
            if not compare(record.get(field), expected):
                return False
        except (TypeError, ValueError):
            return False
    return True


def query_db(db_name: str, db: Bank, return_ids: bool = False, limit: int | None = None,
             **constraints: Any) -> list:
    """Matching records (``(id, record)`` pairs with ``return_ids``) in table order, at most ``limit``."""
    if db_name not in QUERYABLE:
        return []
    results: list = []
    for record_id, record in db.rows(db_name):
        if matches(record, constraints):
            results.append((record_id, record) if return_ids else record)
            if limit is not None and len(results) >= limit:
                break
    return results


def format_records(table: str, results: list[tuple[str, dict]]) -> str:
    lines = [f"Found {len(results)} record(s) in '{table}':\n"]
    for i, (record_id, record) in enumerate(results, 1):
        lines.append(f"{i}. Record ID: {record_id}")
        lines.extend(f"   {name}: {value}" for name, value in record.items())
        lines.append("")
    return "\n".join(lines)


def query_database_tool(db: Bank, database_name: str, constraints: str = "{}") -> str:
    """tau2's text answer to a query: the records, "No records found", or the reason it failed."""
    import json

    try:
        if database_name not in QUERYABLE:
            return f"Error: Database '{database_name}' not found. Available: {list(QUERYABLE)}"
        try:
            parsed = json.loads(constraints) if constraints else {}
        except json.JSONDecodeError as exc:
            return f"Error: Invalid JSON: {exc}"
        results = query_db(database_name, db=db, return_ids=True, **parsed)
        if not results:
            return f"No records found in '{database_name}'."
        return format_records(database_name, results)
    except Exception as exc:  # tau2 answers any failure in text (Python names the function by its module)
        return f"Error querying database: {str(exc).replace(f'{__name__}.query_db()', TAU2_QUERY_DB)}"


def lookup(db: Bank, table: str, field: str, value: Any) -> str:
    """The query tau2's tools build by formatting a value into ``{"field": "value"}`` JSON (quotes unescaped)."""
    return query_database_tool(db, table, f'{{"{field}": "{value}"}}')


def found(result: str) -> bool:
    """tau2's test on a query's text: it holds records."""
    return "No records found" not in result and "No results found" not in result


def parse_balance(value: Any) -> float:
    """A balance given as a number or as text like ``"$2,850.00"``; anything else is 0."""
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        return float(value.replace("$", "").replace(",", ""))
    return 0.0


def dollars(value: Any) -> float:
    """An amount of money given as a number or as text like ``"$2,850.00"``; 0 when it does not parse."""
    try:
        return float(str(value).replace("$", "").replace(",", ""))
    except (ValueError, TypeError):
        return 0.0


def account_balance(account: dict) -> float:
    """A bank account's balance: ``current_holdings``, else ``balance``, else 0."""
    return parse_balance(account.get("current_holdings", account.get("balance", 0)))
