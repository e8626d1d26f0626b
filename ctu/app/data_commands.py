"""``ctu data export`` and ``ctu data import``: the subcommand's arguments and what each does."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from ctu.episode.data.conversations import DataError

EXPORT_FORMATS = ("openai", "sharegpt", "parquet")


def refuse_empty(args: argparse.Namespace, count: int, what: str) -> None:
    """Nothing to export is an error (``--out`` untouched) unless ``--allow-empty``."""
    if count == 0 and not args.allow_empty:
        raise DataError(f"nothing to export: {what}; {args.out} is left as it was (--allow-empty writes an empty "
                        "file)")


def cmd_export(args: argparse.Namespace) -> int:
    """Gold demonstrations of a domain's split, or the successful episodes of an eval run, to a file."""
    from ctu.domains import get_domain, registered_domain

    if (args.domain is None) == (args.trajectories is None):
        raise DataError("give either --domain (gold demonstrations / tasks) or --trajectories (an eval run)")
    if not math.isfinite(args.min_reward):  # NaN compares false with every reward: it would keep them all
        raise DataError(f"--min-reward: must be a finite number, got {args.min_reward}")
    if args.trajectories is not None:
        if args.format == "parquet":
            raise DataError("parquet holds tasks (prompts), not conversations: export it with --domain")
        from ctu.episode.data.conversations import successful_conversations

        known = {}  # the custom domains --domain-spec names, by their spec and by their name
        for spec in args.domain_spec:
            custom = get_domain(spec, args.data_dir, args.retrieval_variant)
            known[spec] = known[custom.name] = custom

        def domain_of(name: object):
            if isinstance(name, str) and name in known:
                return known[name]
            try:  # a trajectory names a built-in domain or one of --domain-spec: nothing it says is imported
                return registered_domain(name, args.data_dir, args.retrieval_variant)
            except KeyError:
                raise KeyError(f"domain {repr(name)[:200]} is not built in; name it with --domain-spec "
                               "package.module:function") from None

        conversations, total = successful_conversations(args.trajectories, domain_of, args.min_reward)
        what = f"{len(conversations)} of {total} episodes (reward >= {args.min_reward}) of {args.trajectories}"
    else:
        domain = get_domain(args.domain, args.data_dir, args.retrieval_variant)
        tasks = domain.split(args.split)
        if args.format == "parquet":
            from ctu.episode.data.prompts import task_rows, write_prompts

            refuse_empty(args, len(tasks), f"0 tasks of {domain.name} (split {args.split})")
            info = write_prompts(args.out, task_rows(domain, tasks), allow_empty=True)
            print(f"wrote {info['records']} {domain.name} tasks (split {args.split}) to {info['path']} as a parquet "
                  "prompt dataset (verl / SkyRL: prompt, env_class, reward_spec, reward_model, extra_info)")
            print("score it in verl with reward.custom_reward_function.path=pkg://ctu.app.integrations.verl_reward "
                  "(name=compute_score); in SkyRL call ctu.app.integrations.skyrl_env.register() for its env_class")
            return 0
        from ctu.episode.data.conversations import gold_conversations

        conversations = gold_conversations(domain, tasks)
        what = f"{len(conversations)} gold demonstrations of {domain.name} (split {args.split})"
    from ctu.episode.data.sft import write_conversations

    refuse_empty(args, len(conversations), what)
    info = write_conversations(args.out, conversations, args.format, args.name, allow_empty=True)
    print(f"wrote {what} to {info['path']} as {args.format}")
    if args.format == "sharegpt":
        dropped = f"; {info['dropped_texts']} assistant text(s) beside tool calls dropped" if info["dropped_texts"] else ""
        print(f"LLaMA-Factory: dataset '{info['name']}' in {info['dataset_info']}{dropped}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    """A parquet prompt dataset of tau2 tasks back to tau2 tasks.json (+ split_tasks.json) per domain."""
    from ctu.episode.data.prompts import read_prompts
    from ctu.episode.data.task_import import write_task_folders

    entries = read_prompts(args.file)  # every row is checked before anything is written
    paths = write_task_folders(Path(args.out), entries)  # every domain is written, or none
    for domain, entry in entries.items():
        path = paths[domain]
        splits = ", ".join(f"{k} {len(v)}" for k, v in entry["splits"].items()) or "none"
        print(f"{domain}: {len(entry['tasks'])} tasks -> {path} (splits: {splits}); "
              f"use them with env.tasks.{domain}={path}")
    return 0


def add_parser(sub) -> list[argparse.ArgumentParser]:
    """Add ``data export`` / ``data import`` to the ``ctu`` subparsers; returns the leaf parsers."""
    data = sub.add_parser("data", help="export and import datasets",
                          description="Datasets in and out: SFT/RFT conversations and task prompt datasets.")
    data_sub = data.add_subparsers(dest="data_command", required=True, metavar="SUBCOMMAND")
    export = data_sub.add_parser(
        "export", help="write gold demonstrations, an eval run's successes, or tasks to a file",
        description="Write a domain's gold demonstrations (--domain) or the successful episodes of an eval run "
                    "(--trajectories, for rejection-sampling fine-tuning) as OpenAI chat JSONL or LLaMA-Factory "
                    "sharegpt; or a domain's tasks (--domain, --format parquet) as the parquet prompt dataset "
                    "verl and SkyRL read.")
    export.add_argument("--domain", default=None, help="domain name or package.module:function")
    export.add_argument("--split", default="train", help="task split (default: train; 'all' for every task)")
    export.add_argument("--trajectories", default=None,
                        help="an eval run directory or its trajectories.jsonl (ctu eval, or run.dir/eval/TAG of train)")
    export.add_argument("--min-reward", type=float, default=1.0, help="keep episodes with at least this reward")
    export.add_argument("--domain-spec", action="append", default=[],
                        help="with --trajectories: a custom domain (package.module:function) the episodes name")
    export.add_argument("--format", required=True, choices=EXPORT_FORMATS)
    export.add_argument("--out", required=True, help="output file (.jsonl for openai/sharegpt, .parquet)")
    export.add_argument("--name", default=None, help="sharegpt: the dataset's name in dataset_info.json "
                                                     "(default: the file's stem)")
    export.add_argument("--data-dir", default=None, help="tau2 data directory (default: installed packages)")
    export.add_argument("--retrieval-variant", default="bm25",
                        help="banking_knowledge's knowledge-base access (default bm25; see `ctu env check --help`)")
    export.add_argument("--allow-empty", action="store_true",
                        help="write the file even when nothing qualifies (default: refuse, --out untouched)")
    export.set_defaults(func=cmd_export)
    imp = data_sub.add_parser(
        "import", help="read a parquet prompt dataset of tau2 tasks back into tasks.json",
        description="Read a parquet prompt dataset whose reward_spec/reward_model ground truth is a tau2 task "
                    "(as `ctu data export --format parquet` writes) and write OUT/<domain>/tasks.json and "
                    "split_tasks.json; train or evaluate on them with env.tasks.<domain>=OUT/<domain>/tasks.json.")
    imp.add_argument("file", help="parquet file")
    imp.add_argument("--out", required=True, help="output directory")
    imp.set_defaults(func=cmd_import)
    return [export, imp]
