"""Environment throughput: episodes per second for reset -> gold replay -> reward, one process.

Each episode is a full ``Episode``: reset (system prompt, greeting, scripted user's first
message), one agent turn per gold action (executed on the episode's copy-on-write DB; in
telecom the agent asks the scripted user for the user-side ones, which the user performs on
their phone), a final message with the facts to communicate, the user's reply, and the tau2 reward.

    python benchmarks/env_throughput.py [--episodes 3000] [--domains mini retail airline telecom]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from ctu.domains import get_domain
from ctu.episode.env import AgentTurn, Episode
from ctu.episode.users.scripted import ScriptedUser
from ctu.train.demos import gold_turns


async def run_episodes(domain, tasks, n: int, concurrency: int) -> int:
    user = ScriptedUser(patience=64)
    perfect = 0

    async def one(i: int) -> float:
        task = tasks[i % len(tasks)]
        ep = Episode(domain, task, user.start(domain, task), max_turns=len(task.actions) + 5)
        await ep.reset()
        for turn in gold_turns(task):
            if ep.done:
                break
            await ep.step(turn)
        if not ep.done:
            await ep.step(AgentTurn(content="Done. " + "; ".join(task.communicate_info)))
        return ep.reward().reward if ep.termination in ("user_stop", "agent_stop") else -1.0

    for start in range(0, n, concurrency):
        rewards = await asyncio.gather(*(one(i) for i in range(start, min(n, start + concurrency))))
        perfect += sum(r == 1.0 for r in rewards)
    return perfect


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--domains", nargs="+", default=["mini", "retail", "airline"])
    args = parser.parse_args()
    print(f"cpu cores visible: {os.cpu_count()}; one process, one core; {args.episodes} episodes per domain")
    for name in args.domains:
        t0 = time.perf_counter()
        domain = get_domain(name)
        load_s = time.perf_counter() - t0
        tasks = list(domain.tasks)
        asyncio.run(run_episodes(domain, tasks, len(tasks), args.concurrency))  # warm the gold cache
        t0 = time.perf_counter()
        perfect = asyncio.run(run_episodes(domain, tasks, args.episodes, args.concurrency))
        elapsed = time.perf_counter() - t0
        print(f"{name:8s} load {load_s:5.2f}s  {args.episodes / elapsed:8.0f} episodes/s  "
              f"({elapsed * 1e3 / args.episodes:.2f} ms/episode; tasks {len(tasks)}; "
              f"reward 1.0 on {perfect}/{args.episodes}; NL_ASSERTION skipped)")


if __name__ == "__main__":
    main()
