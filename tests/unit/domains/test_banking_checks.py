"""banking_knowledge's shared tool plumbing: refusals (checks.py) and tools written as table rows (toolkit.py).

The tools themselves are compared with tau2's by the oracle (``nox -s oracle_banking``); these tests pin the
helpers the tools are built from, without tau2-bench's data where they can.
"""

from __future__ import annotations

import inspect

import pytest

from ctu.domains.banking_knowledge.checks import Refusal, ensure, json_arguments, one_of
from ctu.domains.banking_knowledge.store import Bank
from ctu.domains.banking_knowledge.toolkit import AGENT, Method, docstring, schema, tool_function, tool_info
from ctu.domains.base import DBView


def _refusing_write(self: Bank, user_id: str) -> str:
    self.put("users", user_id, {"user_id": user_id})
    ensure(user_id == "ok", f"Error: User '{user_id}' refused.")
    return "done"


def test_a_refusal_is_the_tools_normal_answer_and_keeps_what_was_written_before_it():
    method = Method("refusing_write", _refusing_write, "KnowledgeTools", "write", True, True)
    view = DBView({"users": {}})
    assert method(Bank(view), {"user_id": "u1"}) == "Error: User 'u1' refused."
    assert view.get("users", "u1") == {"user_id": "u1"}  # tau2 returns after its writes too
    assert method(Bank(view), {"user_id": "ok"}) == "done"


def test_the_shared_checks_word_tau2s_refusals():
    with pytest.raises(Refusal) as refused:
        one_of("reason", "bad", ["lost", "stolen"])
    assert refused.value.text == "Error: Invalid reason. Must be one of: ['lost', 'stolen']"
    one_of("reason", "lost", ["lost", "stolen"])
    with pytest.raises(Refusal) as refused:
        json_arguments("{oops")
    assert refused.value.text.startswith("Error: Invalid JSON in arguments: Expecting property name")
    assert json_arguments('{"n": 1}', parse_int=float) == {"n": 1.0}
    with pytest.raises(TypeError):  # not text at all: Python's own error, as tau2's json.loads raises it
        json_arguments(5)


def _written_out():
    """Retrieve something for a user.

    Args:
        user_id (string): The user's unique identifier in the system

    Returns:
        Retrieved successfully.
    """


def _two_paragraphs():
    """Get all credit card accounts for a user.

    Returns information about each credit card account including card type,
    date opened, current balance, and reward points.

    Args:
        user_id: The ID of the user to look up credit card accounts for
    """


def test_a_built_docstring_is_laid_out_as_a_written_one():
    built = docstring("Retrieve something for a user.",
                      ("user_id (string): The user's unique identifier in the system",), "Retrieved successfully.")
    assert built == _written_out.__doc__
    built = docstring("Get all credit card accounts for a user.\n\nReturns information about each credit card "
                      "account including card type,\ndate opened, current balance, and reward points.",
                      ("user_id: The ID of the user to look up credit card accounts for",))
    assert built == _two_paragraphs.__doc__
    assert docstring("Report.", returns="Reported.") == '''Report.

    Returns:
        Reported.
    '''


def test_a_table_tool_is_a_real_function_with_its_own_name_parameters_and_docs():
    doc = docstring("Find a user.", ("user_id (string): The ID",), "Found.")
    fn = tool_function("find_user_1234", ("user_id",), lambda self, value: f"user {value}", doc, __name__)
    assert (fn.__name__, fn.__qualname__, fn.__module__) == ("find_user_1234", "find_user_1234", __name__)
    assert str(inspect.signature(fn)) == "(self: 'Bank', user_id: 'str') -> 'str'"
    assert schema(fn) == ("Find a user.", {"type": "object", "properties": {"user_id": {
        "type": "string", "description": "The ID"}}, "required": ["user_id"]})
    assert tool_info(fn)["parameters"] == {"user_id": {"type": "string", "description": "The ID", "required": True}}
    assert fn(None, user_id="u1") == "user u1"
    method = Method("find_user_1234", fn, "KnowledgeTools", "read", False, True)
    for arguments, error in (({}, "missing 1 required positional argument: 'user_id'"),
                             ({"user_id": "u", "x": 1}, "got an unexpected keyword argument 'x'")):
        with pytest.raises(TypeError) as raised:
            method(Bank(DBView({})), arguments)
        assert str(raised.value) == f"KnowledgeTools.find_user_1234() {error}"
    none = tool_function("report_0000", (), lambda self: "reported", docstring("Report."), __name__)
    assert str(inspect.signature(none)) == "(self: 'Bank') -> 'str'" and none(None) == "reported"


def test_the_table_written_tools_read_as_tau2s_methods():
    """A lookup and a history tool, as tau2's KnowledgeTools methods: names, parameters and argument errors."""
    lookup, history = AGENT["get_user_information_by_name"], AGENT["get_debit_dispute_status_7483"]
    assert list(inspect.signature(lookup.fn).parameters) == ["self", "customer_name"]
    assert schema(lookup.fn)[0] == ("Get the information (date of birth, email, phone number, address) for a user by "
                                    "their name. Case Sensitive.")
    assert tool_info(history.fn)["description"].startswith("Retrieve a user's debit card dispute history")
    with pytest.raises(TypeError) as raised:
        history(Bank(DBView({})), {"user": "u1"})
    assert str(raised.value) == ("KnowledgeTools.get_debit_dispute_status_7483() got an unexpected keyword "
                                 "argument 'user'")
    assert history(Bank(DBView({})), {"user_id": ""}) == "Error: Missing required parameter: user_id"


def test_a_refusal_under_call_discoverable_agent_tool_is_a_result_and_the_call_is_logged(tau2_bench_data):
    from ctu.domains import get_domain

    bank = get_domain("banking_knowledge", tau2_bench_data)
    db = bank.new_db()
    bank.call("assistant", "unlock_discoverable_agent_tool", {"agent_tool_name": "freeze_debit_card_3892"}, db)
    result = bank.call("assistant", "call_discoverable_agent_tool",
                       {"agent_tool_name": "freeze_debit_card_3892", "arguments": '{"card_id": "dbc_x"}'}, db)
    assert (result.content, result.error) == ("Error: Debit card 'dbc_x' not found.", False)
    assert [r["tool_name"] for _, r in db.items("agent_discoverable_tools")] == ["freeze_debit_card_3892"]
    unknown = bank.call("assistant", "unlock_discoverable_agent_tool", {"agent_tool_name": "nope_1"}, db)
    assert unknown.content == "Error: Unknown agent tool 'nope_1'. This tool is not available." and not unknown.error
