"""An agent with a tool of its own beside the domain's (docs/agents.md): ctu trains and evaluates it as any agent.

    ctu train configs/quickstart.yaml agent.command="python examples/byo_agent/agent_with_tools.py"

As examples/byo_agent/agent.py (OpenAI SDK and the standard library only), plus ``calculate``: the model sees the
domain's tools and this one; a reply that calls only ``calculate`` is answered here, by the agent, and the model is
asked again; any other reply goes to the episode's environment. ctu records every token the model sampled either
way, so the calls to the agent's own tool are trained on as well (their results, like every tool result, are not).
"""

from __future__ import annotations

import ast
import json
import operator
import os
import urllib.request

from openai import OpenAI

OWN_TOOLS = [{"type": "function", "function": {
    "name": "calculate", "description": "Evaluate an arithmetic expression, e.g. a refund's total: 2 * 19.99 + 5.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string", "description": "+ - * / ( ) and numbers"}},
                   "required": ["expression"]}}}]
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
             ast.USub: operator.neg, ast.UAdd: operator.pos}


def calculate(expression: str) -> str:
    """The value of an arithmetic expression of numbers (the model's text: parsed, never ``eval``'d), or why not."""
    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.operand))
        raise ValueError("only numbers and + - * / ( )")

    try:
        return f"{value(ast.parse(expression[:200], mode='eval').body):g}"
    except (SyntaxError, ValueError, ZeroDivisionError, TypeError) as exc:
        return f"Error: {exc}"


def env(action: str, payload: dict | None = None) -> dict:
    """POST to the episode's environment (tools, the simulated user): plain HTTP, JSON in and out."""
    request = urllib.request.Request(f"{os.environ['CTU_ENV_URL']}/{action}", data=json.dumps(payload or {}).encode(),
                                     headers={"content-type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.load(response)


def own_calls(message: dict) -> list[dict]:
    """The reply's tool calls when every one of them is to the agent's own tools, else []."""
    calls = message.get("tool_calls") or []
    own = {t["function"]["name"] for t in OWN_TOOLS}
    return calls if calls and all(c["function"]["name"] in own for c in calls) else []


def main() -> None:
    client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment: ctu's endpoint
    episode = os.environ["CTU_EPISODE_ID"]
    start = env("start")
    messages, tools = list(start["messages"]), start["tools"] + OWN_TOOLS
    done = start["done"]
    while not done:
        reply = client.chat.completions.create(model=os.environ.get("CTU_MODEL", "ctu"), messages=messages,
                                               tools=tools, extra_headers={"X-Episode-Id": episode})
        message = reply.choices[0].message.model_dump(exclude_none=True)
        messages.append(message)
        if calls := own_calls(message):  # the agent's own tool: answered here, then the model goes on
            for call in calls:
                arguments = json.loads(call["function"]["arguments"] or "{}")
                messages.append({"role": "tool", "tool_call_id": call["id"],
                                 "content": calculate(str(arguments.get("expression", "")))})
            continue
        step = env("step", {"message": message})  # the domain's tools, or text to the customer
        messages += step["observations"]
        done = step["done"]


if __name__ == "__main__":
    main()
