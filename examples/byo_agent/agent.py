"""A customer-service agent written against the OpenAI SDK only (no ctu import): ctu can train it (docs/agents.md).

    ctu train configs/quickstart.yaml agent.command="python examples/byo_agent/agent.py"

ctu runs this program once per episode with, in its environment:
  OPENAI_BASE_URL / OPENAI_API_KEY  ctu's OpenAI-compatible endpoint (the policy being trained); the key is the
                                    episode's token, which the SDK sends with every request
  CTU_EPISODE_TOKEN                 the same token, for the environment's requests (Authorization: Bearer ...)
  CTU_EPISODE_ID                    the episode's id
  CTU_ENV_URL                       the episode's environment: /start, /step (tools and the simulated user), /reward

The loop is any agent's loop: ask the model, run the tool calls it makes (or send its text to the customer),
append what comes back, until the environment says the conversation is over. The reward is the environment's.
"""

from __future__ import annotations

import json
import os
import urllib.request

from openai import OpenAI


def env(action: str, payload: dict | None = None) -> dict:
    """POST to the episode's environment (tools, the simulated user): plain HTTP, JSON in and out."""
    request = urllib.request.Request(f"{os.environ['CTU_ENV_URL']}/{action}", data=json.dumps(payload or {}).encode(),
                                     headers={"content-type": "application/json",
                                              "authorization": f"Bearer {os.environ['CTU_EPISODE_TOKEN']}"},
                                     method="POST")
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.load(response)


def main() -> None:
    client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY (the episode's token) from the environment
    start = env("start")
    messages, tools = list(start["messages"]), start["tools"]
    done = start["done"]
    while not done:
        reply = client.chat.completions.create(model=os.environ.get("CTU_MODEL", "ctu"), messages=messages,
                                               tools=tools)
        message = reply.choices[0].message.model_dump(exclude_none=True)
        messages.append(message)
        step = env("step", {"message": message})  # runs its tool calls, or sends its text to the customer
        messages += step["observations"]
        done = step["done"]


if __name__ == "__main__":
    main()
