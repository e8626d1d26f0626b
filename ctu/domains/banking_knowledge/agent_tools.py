"""The agent's 14 base tools (tau2's ``KnowledgeTools``); the discoverable ones are in the modules listed in
:data:`DISCOVERABLE_MODULES` and reached through ``unlock_discoverable_agent_tool`` and
``call_discoverable_agent_tool``.

Unlocking is remembered by the episode (not in the compared DB); a call to an unlocked tool is logged in
``agent_discoverable_tools`` when the tool mutates, or when it is a read the task's gold actions call (the
read-log allowlist of tau2 1.0.1), so extra reads never change the DB comparison.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
from typing import Any, Literal, get_args

from ctu.domains.banking_knowledge import ids
from ctu.domains.banking_knowledge.checks import ensure, json_arguments
from ctu.domains.banking_knowledge.store import Bank, lookup, query_database_tool
from ctu.domains.banking_knowledge.toolkit import (
    AGENT,
    Method,
    describe_for_agent,
    docstring,
    register,
    tool_function,
    tool_info,
    user_discoverable,
)

DISCOVERABLE_MODULES = ("misc_tools", "credit_cards", "credit_limits", "bank_accounts", "debit_cards", "debit_card_status",
                        "debit_card_security")

TransferReason = Literal[
    "fraud_or_security_concern", "account_closure_request", "deceased_account_holder", "legal_or_regulatory_matter",
    "account_ownership_dispute", "complex_billing_dispute", "abusive_customer_behavior", "third_party_inquiry",
    "technical_system_error", "unconfirmed_external_communication", "customer_demands_after_unavailable_offer_refusal",
    "kb_search_unsuccessful_customer_requests_transfer", "specialized_department_required",
    "accessibility_or_special_needs", "customer_frustrated_demands_human", "supervisor_request_service_complaint",
    "customer_requests_human_no_specific_reason", "request_completed_customer_wants_human_followup", "other"]
TRANSFER_REASONS = list(get_args(TransferReason))



@register(AGENT, "KnowledgeTools", "generic")
def transfer_to_human_agents(self: Bank, summary: str, reason: TransferReason = "other") -> str:
    """Transfer the user to a human agent.

    The proper transfer reason enum can be found in the knowledge base: search it before calling this tool to select the proper applicable reason.

    Args:
        summary: A summary of the user's issue and what was attempted before transfer.
        reason: The specific reason code for the transfer.
    """
    ensure(reason in TRANSFER_REASONS,
           f"Error: Invalid transfer reason '{reason}'. Must be one of: {', '.join(TRANSFER_REASONS)}")
    return f"Transfer successful (reason: {reason}). A human agent will assist you shortly."


@register(AGENT, "KnowledgeTools", "read")
def get_current_time(self: Bank) -> str:
    """Get the current time. Use this to get the current timestamp for logging verification records.

    Returns:
        The current time in the format "YYYY-MM-DD HH:MM:SS TZ"
    """
    return f"The current time is {ids.CURRENT_TIME}."


def _lookup_tools(rows: tuple[tuple[str, str, str, str, str, str], ...]) -> None:
    """Register tau2's lookups: one argument, answered with its query of one table on one field."""
    for name, parameter, about, table, field, description in rows:
        run = functools.partial(_lookup, table=table, field=field)
        doc = docstring(description, (f"{parameter}: {about}",))
        register(AGENT, "KnowledgeTools", "read")(tool_function(name, (parameter,), run, doc, __name__))


def _lookup(self: Bank, value: object, table: str, field: str) -> str:
    return lookup(self, table, field, value)


USER_INFO = "Get the information (date of birth, email, phone number, address) for a user by their"
# (tool, its parameter, the parameter's description, the table and field it queries, the tool's description)
_lookup_tools((
    ("get_user_information_by_id", "user_id", "The ID of the user", "users", "user_id", f"{USER_INFO} user id."),
    ("get_user_information_by_name", "customer_name", "The name of the user", "users", "name",
     f"{USER_INFO} name. Case Sensitive."),
    ("get_user_information_by_email", "email", "The email of the user", "users", "email", f"{USER_INFO} email."),
))


@register(AGENT, "KnowledgeTools", "write")
def change_user_email(self: Bank, user_id: str, new_email: str) -> str:
    """Change the email address for a user.

    Args:
        user_id: The ID of the user whose email should be changed
        new_email: The new email address to set for the user
    """
    ensure(self.update("users", user_id, {"email": new_email}), f"Error: User with ID '{user_id}' not found.")
    return f"Email updated successfully.\n  - User ID: {user_id}\n  - New Email: {new_email}"


_lookup_tools((
    ("get_referrals_by_user", "user_id", "The ID of the user (referrer) to look up referrals for", "referrals",
     "referrer_id", "Get all referrals made by a user."),
    ("get_credit_card_transactions_by_user", "user_id", "The ID of the user to look up transactions for",
     "credit_card_transaction_history", "user_id", "Get all credit card transactions for a user."),
    ("get_credit_card_accounts_by_user", "user_id", "The ID of the user to look up credit card accounts for",
     "credit_card_accounts", "user_id", "Get all credit card accounts for a user.\n\nReturns information about each "
     "credit card account including card type,\ndate opened, current balance, and reward points."),
))


@register(AGENT, "KnowledgeTools", "write")
def log_verification(self: Bank, name: str, user_id: str, address: str, email: str, phone_number: str,
                     date_of_birth: str, time_verified: str) -> str:
    """Log a verification record after successfully verifying a user's identity.

    Call this tool after you have verified a user by confirming 2 out of 4 identity fields
    (date of birth, email, phone number, address). This creates an audit record of the verification.

    Args:
        name: The verified user's full name
        user_id: The verified user's ID
        address: The verified user's address
        email: The verified user's email
        phone_number: The verified user's phone number
        date_of_birth: The verified user's date of birth (MM/DD/YYYY format)
        time_verified: The timestamp of the verification (e.g., "2025-11-14 03:40:00 EST")
    """
    record_id = ids.verification_id(user_id, time_verified)
    record = {"name": name, "user_id": user_id, "address": address, "email": email, "phone_number": phone_number,
              "date_of_birth": date_of_birth, "time_verified": time_verified}
    ensure(self.add("verification_history", record_id, record), "Failed to log verification: Record may already exist.")
    return f"Verification logged successfully.\n  - User: {name} (ID: {user_id})\n  - Verified at: {time_verified}"


@register(AGENT, "KnowledgeTools", "generic", mutates=True)
def give_discoverable_user_tool(self: Bank, discoverable_tool_name: str, arguments: str = "{}") -> str:
    """Pass a tool to the user so they can execute it themselves.

    Use this when the knowledge base indicates that the user should perform
    an action themselves (e.g., "to do X, have the user call tool_name(args)").

    The user will then be able to call `call_discoverable_tool` with the same
    tool name and arguments to simulate executing the action.

    Args:
        discoverable_tool_name: The name of the discoverable tool (e.g., "open_webpage", "navigate_to_section")
        arguments: JSON string of arguments for the tool (e.g., '{"url": "https://example.com"}')

    Returns:
        A confirmation message with instructions for the user
    """
    if not isinstance(discoverable_tool_name, str):  # tau2 looks the name up with hasattr
        raise TypeError(f"attribute name must be string, not '{type(discoverable_tool_name).__name__}'")
    method = user_discoverable(discoverable_tool_name)
    given = json_arguments(arguments)
    parameters = dict.fromkeys(inspect.signature(method.fn).parameters)  # "self" included, as on tau2's class
    for name in given:
        ensure(name in parameters or name == "self", f"Error: Unexpected parameter: {name}")
    info = tool_info(method.fn)
    self.add("user_discoverable_tools", ids.user_tool_record_id(discoverable_tool_name),
             {"tool_name": discoverable_tool_name, "status": "GIVEN"})
    shown = json.dumps(given, indent=2) if given else "(no arguments)"
    return (f"Tool given to user: {discoverable_tool_name}\nDescription: {info['description']}\nArguments: {shown}\n\n"
            f"The user can now execute this action by calling `call_discoverable_user_tool` "
            f"with discoverable_tool_name='{discoverable_tool_name}' and the same arguments.")


@register(AGENT, "KnowledgeTools", "generic", mutates=True)
def unlock_discoverable_agent_tool(self: Bank, agent_tool_name: str) -> str:
    """Unlock an agent discoverable tool that was found in the knowledge base.

    Use this when the knowledge base indicates that you have access to a specialized
    internal tool. The knowledge base will tell you the tool name to unlock.

    After unlocking, you can use the tool by calling `call_discoverable_agent_tool` with
    the tool name and required arguments.

    Args:
        agent_tool_name: The name of the agent discoverable tool to unlock
                        (e.g., "calculate_apr_adjustment_7842")

    Returns:
        A confirmation message with the tool's description and parameters
    """
    info = tool_info(_discoverable(agent_tool_name).fn)
    self.session()["unlocked"][agent_tool_name] = ids.NOW.isoformat()
    return (f"Tool unlocked: {agent_tool_name}\nDescription: {info['description']}\n\n{describe_for_agent(info)}\n\n"
            f"You can now use this tool by calling `call_discoverable_agent_tool` with "
            f"agent_tool_name='{agent_tool_name}' and the required arguments.")


@register(AGENT, "KnowledgeTools", "write")
def call_discoverable_agent_tool(self: Bank, agent_tool_name: str, arguments: str = "{}") -> str:
    """Call an agent discoverable tool that you have previously unlocked.

    Use this after unlocking a tool with `unlock_discoverable_agent_tool`. The knowledge base
    will tell you which tool to use and what arguments to provide.

    Args:
        agent_tool_name: The name of the agent discoverable tool to call
        arguments: JSON string of arguments for the tool (e.g., '{"user_id": "abc123"}')

    Returns:
        The result of executing the agent tool
    """
    method = _discoverable(agent_tool_name)
    session = self.session()
    ensure(agent_tool_name in session["unlocked"], f"Error: Tool '{agent_tool_name}' has not been unlocked. You must "
                                                   f"first use `unlock_discoverable_agent_tool` to unlock this tool "
                                                   f"before calling it.")
    # numbers all become floats, so ids and hashes do not depend on how a number was spelled
    given = json_arguments(arguments, parse_int=float)
    try:
        result = method(self, given)
    except TypeError as exc:
        return f"Error: Invalid arguments: {exc}"
    if method.mutates or agent_tool_name in session["allowlist"]:
        self.add("agent_discoverable_tools", ids.agent_tool_record_id(agent_tool_name),
                 {"tool_name": agent_tool_name, "status": "CALLED"})
    return result


@register(AGENT, "KnowledgeTools", "read")
def list_discoverable_agent_tools(self: Bank) -> str:
    """List all agent discoverable tools that you have called.

    Use this to see what specialized tools you have used.

    Returns:
        A list of tools that you have called
    """
    result = query_database_tool(self, "agent_discoverable_tools", "{}")
    if "No results found" in result:  # never true (an empty table answers "No records found"): tau2's test
        return "No agent tools have been called yet. Search the knowledge base to discover available tools."
    return f"Your called agent tools:\n{result}"


def _discoverable(name: object) -> Method:
    """The agent's discoverable tool ``name``, refused as unknown otherwise (tau2 looks it up in a dict: an
    unhashable name raises)."""
    method: Any = AGENT.get(name)  # type: ignore[call-overload]
    ensure(method is not None and method.discoverable,
           f"Error: Unknown agent tool '{name}'. This tool is not available.")
    return method


BASE_TOOLS = tuple(AGENT)
for _module in (*DISCOVERABLE_MODULES, "user_tools"):
    importlib.import_module(f"ctu.domains.banking_knowledge.{_module}")
DISCOVERABLE_TOOLS = tuple(name for name in AGENT if name not in BASE_TOOLS)
