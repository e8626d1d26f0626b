"""The LLM user's four strategies against a real server: `transformers serve` with a real model on 127.0.0.1.

The agent side is fixed (it asks the customer for more every turn) so that only the user simulator is measured.
Each strategy plays ``--tasks`` mini test tasks for ``--turns`` turns, twice (two event loops, as two training
steps); printed per strategy: episodes errored, customer messages, completion calls, regenerated replies,
messages carrying scaffolding (must be 0), messages ending the conversation, failed attempts, wall time.

    PYTHONPATH=. python benchmarks/llm_user_server.py [--model smollm2-135m] [--tasks 3] [--turns 3] [--max-tokens 48]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ctu.domains import get_domain  # noqa: E402
from ctu.engines.base import Completion, Engine, SamplingParams  # noqa: E402
from ctu.engines.hf.models import load_tokenizer, resolve_model  # noqa: E402
from ctu.episode.users.llm import LLMUser, LLMUserConfig  # noqa: E402
from ctu.rollout.chat import ChatFormat  # noqa: E402
from ctu.rollout.loop import EpisodeSpec, RolloutLimits, rollout  # noqa: E402
from tests.support.real_server import TransformersServer  # noqa: E402

SCAFFOLDING = ("Thought:", "Reflection:", "User Response:", "Response:", "<the corrected customer reply>")


class AskingAgent(Engine):
    def __init__(self, chat: ChatFormat):
        self.ids = tuple(chat.encode("Could you tell me more about that?") + [chat.stop_token_ids[0]])

    async def generate(self, prompts, params, seeds=None):
        return [[Completion(self.ids, (-0.1,) * len(self.ids), "stop")] for _ in prompts]

    def update_weights(self, named_tensors):
        raise NotImplementedError


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tasks", type=int, default=3)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--strategies", default="llm,react,verify,reflection")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a timeout still stops the server (finally below)
    model = resolve_model(args.model)
    chat = ChatFormat(load_tokenizer(model))
    agent = AskingAgent(chat)
    mini = get_domain("mini")
    specs = [EpisodeSpec(mini, task) for task in mini.split("test")[: args.tasks]]
    with tempfile.TemporaryDirectory() as tmp:
        server = TransformersServer(model, Path(tmp))
        print(f"transformers serve {args.model}: healthy after {server.start():.1f} s", flush=True)
        try:
            for strategy in args.strategies.split(","):
                user = LLMUser(LLMUserConfig(model=model, base_url=server.base_url, api_key_env="CTU_NO_KEY",
                                             strategy=strategy, max_tokens=args.max_tokens))
                calls = []
                real = user.client.complete

                async def spy(messages, _real=real, _calls=calls, **kw):
                    _calls.append(messages)
                    return await _real(messages, **kw)

                user.client.complete = spy
                started = time.perf_counter()
                trajectories = []
                for _ in range(2):
                    trajectories += asyncio.run(rollout(specs, chat, agent, user, SamplingParams(max_tokens=16),
                                                        RolloutLimits(max_turns=args.turns)))
                sent = [m["content"] for t in trajectories for m in t.messages if m["role"] == "user"]
                regenerated = sum(1 for m in calls if m[0]["role"] == "system" and "rejected" in m[-1]["content"])
                print(f"{strategy:>10}: episodes {len(trajectories)}, errored "
                      f"{sum(t.stop_reason == 'error' for t in trajectories)}, customer messages {len(sent)}, "
                      f"calls {len(calls)}, regenerated {regenerated}, with scaffolding "
                      f"{sum(any(s in m for s in SCAFFOLDING) for m in sent)}, ending "
                      f"{sum('###' in m for m in sent)}, failed attempts {len(user.client.failures)}, "
                      f"{time.perf_counter() - started:.1f} s", flush=True)
                for t in trajectories:
                    if t.error:
                        print(f"            error: {t.error}")
        finally:
            server.kill()


if __name__ == "__main__":
    main()
