"""The ``ctu`` command line (also ``python -m ctu``)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from ctu.domains import DOMAINS, get_domain


def _fmt_components(components: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.1f}" for k, v in components.items()) or "-"


def cmd_env_check(args: argparse.Namespace) -> int:
    """Replay every task's gold actions; exit 0 only if every deterministic component is 1.0."""
    from ctu.reward import score_transcript
    from ctu.transcripts import gold_transcript

    domain = get_domain(args.domain, args.data_dir)
    tasks = domain.split(args.split)
    failed = 0
    skipped_nl = 0
    for task in tasks:
        reward = score_transcript(domain, task, gold_transcript(domain, task), "user_stop")
        ok = all(v == 1.0 for v in reward.components.values())
        failed += not ok
        skipped_nl += "NL_ASSERTION" in reward.skipped
        note = f"  skipped: {','.join(reward.skipped)}" if reward.skipped else ""
        why = f"  {'; '.join(reward.reasons)}" if reward.reasons else ""
        print(f"{args.domain} task {task.id}: {'ok' if ok else 'FAIL'}  reward={reward.reward:.1f}  "
              f"{_fmt_components(reward.components)}{note}{why}")
    print(f"{args.domain}: {len(tasks) - failed}/{len(tasks)} tasks pass on gold actions"
          f" ({failed} failed; NL_ASSERTION skipped on {skipped_nl} without a judge)")
    return 0 if failed == 0 else 1


def cmd_score(args: argparse.Namespace) -> int:
    """Score recorded transcripts by re-executing their tool calls on a fresh DB."""
    from ctu.reward import score_transcript
    from ctu.transcripts import TranscriptError, ending, parse_line

    bad = 0
    total = 0.0
    scored = 0
    with open(args.file, encoding="utf-8") as handle:
        for line_no, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            try:
                record = parse_line(text)
                domain_name = record.domain or args.domain
                if domain_name is None:
                    raise TranscriptError("no domain: pass --domain or give a 'domain' field")
                try:
                    domain = get_domain(domain_name, args.data_dir)
                    task = domain.task(record.task_id)
                except KeyError as exc:
                    raise TranscriptError(str(exc.args[0])) from None
                reward = score_transcript(domain, task, record.messages, ending(record.messages, record.termination))
            except TranscriptError as exc:
                bad += 1
                print(f"{args.file}:{line_no}: error: {exc}", file=sys.stderr)
                if args.json:
                    print(json.dumps({"line": line_no, "error": str(exc)}))
                continue
            scored += 1
            total += reward.reward
            if args.json:
                print(json.dumps({"line": line_no, "task_id": record.task_id, "reward": reward.reward,
                                  "components": reward.components, "skipped": list(reward.skipped),
                                  "termination": reward.termination, "reasons": list(reward.reasons)}))
            else:
                why = f"  {'; '.join(reward.reasons)}" if reward.reasons else ""
                note = f"  skipped: {','.join(reward.skipped)}" if reward.skipped else ""
                print(f"line {line_no} task {record.task_id}: reward={reward.reward:.1f}  "
                      f"{_fmt_components(reward.components)}{note}{why}")
    mean = total / scored if scored else 0.0
    print(f"scored {scored} transcript(s), mean reward {mean:.3f}; {bad} bad line(s)",
          file=sys.stderr if args.json else sys.stdout)
    return 1 if bad else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ctu", description="Train and evaluate tool-using agents with RL.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    env = sub.add_parser("env", help="inspect and check domains", description="Inspect and check domains.")
    env_sub = env.add_subparsers(dest="env_command", required=True, metavar="SUBCOMMAND")
    check = env_sub.add_parser("check", help="replay every task's gold actions and check the reward",
                               description="Replay every task's gold actions; exit 0 only if every "
                                           "deterministic reward component is 1.0.")
    check.add_argument("domain", choices=DOMAINS)
    check.add_argument("--split", default="all", help="task split to check (default: all)")
    check.add_argument("--data-dir", default=None, help="tau2 data directory (default: installed packages)")
    check.set_defaults(func=cmd_env_check)

    score = sub.add_parser("score", help="score recorded transcripts (JSONL)",
                           description="Score transcripts, one JSON object per line with task_id and "
                                       "OpenAI-format messages; tool calls are re-executed on a fresh DB.")
    score.add_argument("file", help="JSONL file of transcripts")
    score.add_argument("--domain", choices=DOMAINS, default=None, help="domain (a per-line 'domain' field wins)")
    score.add_argument("--json", action="store_true", help="one JSON result per input line")
    score.add_argument("--data-dir", default=None, help="tau2 data directory (default: installed packages)")
    score.set_defaults(func=cmd_score)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
