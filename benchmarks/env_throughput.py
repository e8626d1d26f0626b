"""Environment throughput: episodes per second for reset -> gold replay -> reward, one process.

Each episode is a full ``Episode``: reset (system prompt, greeting, scripted user's first
message), one agent turn per gold action (executed on the episode's copy-on-write DB; in
telecom the agent asks the scripted user for the user-side ones, which the user performs on
their phone), a final message with the facts to communicate, the user's reply, and the tau2 reward.
banking_knowledge (bm25 variant, data from $TAU2_DATA_DIR or --data-dir) starts each episode with --searches
KB_search calls (BM25 over the 698 documents; queries: the task's instructions, 12 words at a time); its task with
an NL assertion is left out. With --tau2 (in a venv holding tau2-bench 1.0.1, e.g. .nox/oracle_banking) the same
banking episodes also run on tau2's own environment and evaluator (benchmarks/tau2_episodes.py), as tau2 builds
them and with its knowledge base and BM25 index built once.

    python benchmarks/env_throughput.py [--episodes 3000] [--domains mini retail airline telecom banking_knowledge]
    .nox/oracle_banking/bin/python benchmarks/env_throughput.py --domains banking_knowledge --tau2
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import time

from ctu.domains import get_domain
from ctu.episode.data.conversations import gold_turns
from ctu.episode.env import AgentTurn, Episode, ToolCall
from ctu.episode.users.scripted import ScriptedUser


def queries(task, searches: int) -> list[str]:
    """``searches`` KB_search queries from the task's instructions, 12 words each."""
    scenario = task.user_scenario  # ctu's: a dict; tau2's: a pydantic model
    words = str(scenario.get("instructions", "") if isinstance(scenario, dict) else scenario.instructions).split()
    return [" ".join(words[12 * i:12 * (i + 1)]) for i in range(searches)]


async def run_episodes(domain, tasks, n: int, concurrency: int, searches: int = 0) -> int:
    user = ScriptedUser(patience=64)
    perfect = 0

    async def one(i: int) -> float:
        task = tasks[i % len(tasks)]
        ep = Episode(domain, task, user.start(domain, task), max_turns=len(task.actions) + searches + 5)
        await ep.reset()
        search = [AgentTurn(tool_calls=(ToolCall("KB_search", {"query": q}),)) for q in queries(task, searches)]
        for turn in [*search, *gold_turns(task)]:
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
    parser.add_argument("--data-dir", default=None, help="tau2-bench data folder (banking_knowledge)")
    parser.add_argument("--searches", type=int, default=2, help="KB_search calls per banking_knowledge episode")
    parser.add_argument("--tau2", action="store_true", help="also run banking_knowledge episodes on tau2's code")
    parser.add_argument("--tau2-episodes", type=int, default=20)
    args = parser.parse_args()
    print(f"cpu cores visible: {os.cpu_count()}; one process, one core; {args.episodes} episodes per domain")
    for name in args.domains:
        banking = name == "banking_knowledge"
        t0 = time.perf_counter()
        domain = get_domain(name, args.data_dir) if banking else get_domain(name)
        load_s = time.perf_counter() - t0
        tasks = [t for t in domain.tasks if not (banking and t.nl_assertions)]
        searches = args.searches if banking else 0
        asyncio.run(run_episodes(domain, tasks, len(tasks), args.concurrency, searches))  # warm the gold cache
        t0 = time.perf_counter()
        perfect = asyncio.run(run_episodes(domain, tasks, args.episodes, args.concurrency, searches))
        elapsed = time.perf_counter() - t0
        rate = args.episodes / elapsed
        extra = f"; {searches} KB_search each" if banking else ""
        print(f"{name:8s} load {load_s:5.2f}s  {rate:8.0f} episodes/s  "
              f"({elapsed * 1e3 / args.episodes:.2f} ms/episode; tasks {len(tasks)}{extra}; "
              f"reward 1.0 on {perfect}/{args.episodes}; NL_ASSERTION skipped)")
        if banking and args.tau2:
            from benchmarks import tau2_episodes

            for cached in (False, True):
                tau2_rate, tau2_perfect = tau2_episodes.throughput(
                    args.tau2_episodes, functools.partial(queries, searches=searches), cached)
                how = "knowledge base and BM25 index built once" if cached else "as tau2 runs it"
                print(f"  tau2 1.0.1 ({how}): {tau2_rate:8.2f} episodes/s ({1e3 / tau2_rate:.0f} ms/episode; "
                      f"reward 1.0 on {tau2_perfect}/{args.tau2_episodes}); ctu is {rate / tau2_rate:,.0f}x")


if __name__ == "__main__":
    main()
