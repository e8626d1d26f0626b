"""The ``ctu`` command line (also ``python -m ctu``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from ctu.config.atomic import FULL_ERRNOS, space_hint
from ctu.config.redact import redact
from ctu.domains import DOMAINS, get_domain, registered_domain


def _fmt_components(components: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.1f}" for k, v in components.items()) or "-"


def cmd_env_check(args: argparse.Namespace) -> int:
    """Replay every task's gold actions; exit 0 only if every deterministic component is 1.0."""
    from ctu.episode.reward import score_transcript
    from ctu.episode.transcripts import gold_transcript

    domain = get_domain(args.domain, args.data_dir, args.retrieval_variant)
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


def _domain_name(name: str) -> str:
    """A built-in domain or ``package.module:function`` (your own, as in env.domains); else argparse's error."""
    if name in DOMAINS or ":" in name:
        return name
    raise argparse.ArgumentTypeError(f"invalid choice: {name!r} (choose from {', '.join(DOMAINS)}, or "
                                     "package.module:function)")


def _open_transcripts(path: str):
    """The transcript file, opened for reading bytes line by line; a one-line error if it cannot be."""
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise SystemExit(f"ctu: error: transcript file {path} does not exist") from None
    except IsADirectoryError:
        raise SystemExit(f"ctu: error: {path} is a directory, not a transcript file (JSONL)") from None
    except OSError as exc:
        raise SystemExit(f"ctu: error: cannot read transcript file {path}: {exc.strerror}") from None


def cmd_score(args: argparse.Namespace) -> int:
    """Score recorded transcripts by re-executing their tool calls on a fresh DB."""
    from ctu.episode.reward import score_transcript
    from ctu.episode.transcripts import TranscriptError, ending, parse_line

    bad = 0
    total = 0.0
    scored = 0
    with _open_transcripts(args.file) as handle:
        for line_no, raw in enumerate(handle, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                bad += 1
                why = f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start} of the line)"
                print(f"{args.file}:{line_no}: error: {why}", file=sys.stderr)
                if args.json:
                    print(json.dumps({"line": line_no, "error": why}))
                continue
            if not text.strip():
                continue
            try:
                record = parse_line(text)
                domain_name = record.domain or args.domain
                if domain_name is None:
                    raise TranscriptError("no domain: pass --domain or give a 'domain' field")
                try:
                    # a line names a built-in domain only: nothing a data file says is imported
                    domain = registered_domain(domain_name, args.data_dir, args.retrieval_variant)
                    task = domain.task(record.task_id)
                except KeyError as exc:
                    raise TranscriptError(str(exc.args[0])) from None
                reward = score_transcript(domain, task, record.messages, ending(record.messages, record.termination))
            except (TranscriptError, RecursionError) as exc:  # this line only: the others are still scored
                bad += 1
                why = str(exc) if isinstance(exc, TranscriptError) else "nested too deeply to score"
                print(f"{args.file}:{line_no}: error: {why}", file=sys.stderr)
                if args.json:
                    print(json.dumps({"line": line_no, "error": why}))
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
    if scored + bad == 0:  # nothing to score is no success: one line, exit 1
        print(f"{args.file}: error: no transcript in it (empty, or blank lines only)", file=sys.stderr)
        return 1
    mean = total / scored if scored else 0.0
    print(f"scored {scored} transcript(s), mean reward {mean:.3f}; {bad} bad line(s)",
          file=sys.stderr if args.json else sys.stdout)
    return 1 if bad else 0


def _load(args: argparse.Namespace):
    from ctu.config.schema import ConfigError, load_config

    config_path, overrides = args.config, list(args.overrides)
    if config_path is not None and "=" in config_path:  # only overrides were given
        config_path, overrides = None, [config_path, *overrides]
    try:
        return load_config(config_path, overrides)
    except ConfigError as exc:
        raise SystemExit(_one_line(f"ctu: config error: {exc}")) from None


def cmd_eval(args: argparse.Namespace) -> int:
    """k samples per task over the configured domains and splits; reports into run.dir."""
    from ctu.config.rundir import check_run_dir, mark_run_dir
    from ctu.config.runlock import RunDirLock

    config = _load(args)
    _check_export(config.model.path)
    check_run_dir(config.run.dir)  # a folder of its own: never the current one, a home or someone else's files
    with RunDirLock(config.run.dir):  # one writer per run.dir (a live train or eval there refuses this one)
        mark_run_dir(config.run.dir)
        return _evaluate(config)


def _check_export(model_path: str) -> None:
    """A model that is a ctu export is loaded only whole: each file as its manifest says."""
    from ctu.train.manifest import export_problem

    if problem := export_problem(model_path):
        raise SystemExit(_one_line(f"ctu: error: model.path: {model_path} is a damaged export: {problem}"))


def _evaluate(config) -> int:
    from ctu.app.evaluate import all_errored, episode_specs, nothing_to_evaluate, play_episodes, write_report
    from ctu.config.schema import save_config
    from ctu.rollout import components as build
    from ctu.rollout.loop import warn_prompt_budget

    domains = build.build_domains(config)
    specs = episode_specs(domains, config.eval.splits, config.eval.samples_per_task, config.eval.max_tasks)
    if why := nothing_to_evaluate(domains, config.eval.splits, specs):  # before any model, and nothing written
        raise SystemExit(_one_line(f"ctu: error: {why}"))
    save_config(config, f"{config.run.dir}/config.yaml")
    user, judge = build.build_user(config), build.build_judge(config)  # a missing API key fails before the model loads
    chat = build.build_chat(config)
    warn_prompt_budget(chat, domains, config.env.max_context_tokens)
    engine = build.build_engine(config, tokenizer=chat.tokenizer)
    trajectories = play_episodes(config, specs, chat, engine, user, judge)  # closes the engine
    report = write_report(config.run.dir, trajectories, config.eval.save_tokens)
    errored = all_errored(trajectories)
    if errored:
        raise SystemExit(_one_line(f"ctu: error: no episode could be scored: {errored}; trajectories in {config.run.dir}"))
    for scope, s in report.items():
        print(f"{scope}: success {s['success_rate']:.3f} over {s['episodes']} episodes "
              f"({s['tasks']} tasks; pass^1 {s['pass^k'].get('1', 0.0):.3f}; errored {s['errored']}; "
              f"parse failures {s['parse_failure_rate']:.3f}; mean turns {s['mean_turns']:.1f})")
    print(f"wrote {config.run.dir}/report.json, report.md, trajectories.jsonl, pass_k.png")
    return 0


def cmd_play(args: argparse.Namespace) -> int:
    """One episode, printed turn by turn: a model or you as the agent."""
    import asyncio

    from ctu.app.play import print_trajectory, run_human
    from ctu.rollout import components as build
    from ctu.rollout.loop import EpisodeSpec, RolloutLimits, rollout, warn_prompt_budget

    if args.model:
        args.overrides = [*args.overrides, f"model.path={args.model}"]
    config = _load(args)
    if not args.human:
        _check_export(config.model.path)
    domain = get_domain(args.domain, config.env.tau2_data_dir, config.env.retrieval_variant)
    try:
        task = domain.task(args.task)
    except KeyError as exc:
        raise SystemExit(f"ctu: error: {exc.args[0]}") from None
    user = build.build_user(config)
    if args.human:
        return run_human(domain, task, user, config.env.max_turns)
    chat = build.build_chat(config)
    warn_prompt_budget(chat, [domain], config.env.max_context_tokens)
    engine = build.build_engine(config, tokenizer=chat.tokenizer)
    limits = RolloutLimits(config.env.max_turns, config.env.max_errors, config.env.max_context_tokens)
    try:
        (trajectory,) = asyncio.run(rollout([EpisodeSpec(domain, task)], chat, engine, user,
                                            build.sampling_params(config), limits))
    finally:
        engine.close()
    print_trajectory(trajectory)
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    """GRPO/LoRA training; see configs/ for presets."""
    from ctu.app.stop import StopSignals
    from ctu.app.trainer import Trainer
    from ctu.observe.report import before_after_table

    config = _load(args)
    _check_export(config.model.path)  # training on from an export: only a whole one
    with StopSignals() as stops:  # from here SIGINT/SIGTERM stop the run at its next safe point (exit 130/143)
        summary = Trainer(config).run(stops)
    if "complete" in summary:  # a finished run resumed: its one line is all there is to say
        return 0
    print(before_after_table(config.run.dir))
    print(f"done: run directory {config.run.dir} (metrics.jsonl, eval/, checkpoints/, export/, curves.png)")
    return 0 if summary else 1


def cmd_plan(args: argparse.Namespace) -> int:
    """Per-GPU memory plan of a training config; exit 0 if it fits."""
    import math

    from ctu.app.plan import plan

    if args.gpus is not None and args.gpus < 1:
        raise SystemExit(f"ctu: error: --gpus: must be >= 1, got {args.gpus}")
    if not math.isfinite(args.gpu_memory) or args.gpu_memory <= 0:
        raise SystemExit(f"ctu: error: --gpu-memory: must be a finite number of GiB > 0, got {args.gpu_memory:g}")
    config = _load(args)
    result = plan(config, args.gpus, args.gpu_memory)
    result.notes += _prompt_notes(config)
    print(result.render())
    return 0 if result.fits else 1


def _prompt_notes(config) -> list[str]:
    """How much of the context each domain's prompt takes (with the model's tokenizer); a note if unmeasurable."""
    from ctu.rollout import components as build
    from ctu.rollout.loop import prompt_notes

    try:
        return prompt_notes(build.build_chat(config), build.build_domains(config), config.env.max_context_tokens)
    except Exception as exc:  # the memory plan stands without it (no tokenizer or data here)
        return [f"prompt sizes not measured: {_one_line(str(exc))}"]


def cmd_report(args: argparse.Namespace) -> int:
    from ctu.observe.records import RecordError
    from ctu.observe.report import draw_curves

    try:
        print(f"wrote {draw_curves(args.run_dir)}")
    except (FileNotFoundError, RecordError) as exc:
        raise SystemExit(_one_line(f"ctu: error: {exc}")) from None
    return 0


RETRIEVAL_HELP = ("banking_knowledge's knowledge-base access: no_knowledge, full_kb, golden_retrieval, grep_only, "
                  "bm25 (default), bm25_grep")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ctu", description="Train and evaluate tool-using agents with RL.")
    parser.add_argument("--debug", action="store_true",
                        help="on failure, show the full traceback instead of a one-line error")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    env = sub.add_parser("env", help="inspect and check domains", description="Inspect and check domains.")
    env_sub = env.add_subparsers(dest="env_command", required=True, metavar="SUBCOMMAND")
    check = env_sub.add_parser("check", help="replay every task's gold actions and check the reward",
                               description="Replay every task's gold actions; exit 0 only if every "
                                           "deterministic reward component is 1.0.")
    check.add_argument("domain", type=_domain_name, metavar="DOMAIN",
                       help=f"{', '.join(DOMAINS)}, or your own as package.module:function")
    check.add_argument("--split", default="all", help="task split to check (default: all)")
    check.add_argument("--data-dir", default=None, help="tau2 data directory (default: installed packages)")
    check.add_argument("--retrieval-variant", default="bm25", help=RETRIEVAL_HELP)
    check.set_defaults(func=cmd_env_check)

    score = sub.add_parser("score", help="score recorded transcripts (JSONL)",
                           description="Score transcripts, one JSON object per line with task_id and "
                                       "OpenAI-format messages; tool calls are re-executed on a fresh DB.")
    score.add_argument("file", help="JSONL file of transcripts")
    score.add_argument("--domain", choices=DOMAINS, default=None, help="domain (a per-line 'domain' field wins)")
    score.add_argument("--json", action="store_true", help="one JSON result per input line")
    score.add_argument("--data-dir", default=None, help="tau2 data directory (default: installed packages)")
    score.add_argument("--retrieval-variant", default="bm25", help=RETRIEVAL_HELP)
    score.set_defaults(func=cmd_score)

    ev = sub.add_parser("eval", help="evaluate a model: pass^k, pass@k, reports",
                        description="Run k samples per task over the configured domains and splits; write "
                                    "report.json, report.md, trajectories.jsonl and pass_k.png to run.dir.")
    ev.add_argument("config", nargs="?", default=None, help="YAML config (default: built-in defaults)")
    ev.add_argument("overrides", nargs="*", help="dotted overrides, e.g. model.path=tiny-random eval.samples_per_task=4")
    ev.set_defaults(func=cmd_eval)

    play = sub.add_parser("play", help="play one episode in the terminal",
                          description="Play one episode turn by turn, with a model or yourself as the agent.")
    play.add_argument("--domain", required=True, choices=DOMAINS)
    play.add_argument("--task", required=True, help="task id")
    who = play.add_mutually_exclusive_group()
    who.add_argument("--model", default=None, help="model id or directory (default: model.path of the config)")
    who.add_argument("--human", action="store_true", help="you are the agent")
    play.add_argument("--config", default=None, help="YAML config")
    play.add_argument("overrides", nargs="*", help="dotted overrides")
    play.set_defaults(func=cmd_play)

    train = sub.add_parser("train", help="train with GRPO (LoRA or full fine-tuning)",
                           description="Train a policy with GRPO on the configured domains; writes metrics, "
                                       "checkpoints, evaluations, an export and curves to run.dir.")
    train.add_argument("config", nargs="?", default=None, help="YAML config, e.g. configs/quickstart.yaml")
    train.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.max_steps=3 model.path=tiny-random")
    train.set_defaults(func=cmd_train)

    plan = sub.add_parser("plan", help="per-GPU memory plan of a training config",
                          description="Per-GPU memory (weights, gradients, optimizer, activations with and without "
                                      "checkpointing, logit chunks, engine weights and KV cache); exit 0 if it fits.")
    plan.add_argument("config", nargs="?", default=None, help="YAML config, e.g. configs/qwen2.5-7b-multidomain.yaml")
    plan.add_argument("overrides", nargs="*", help="dotted overrides")
    plan.add_argument("--gpus", type=int, default=None,
                      help="GPUs; default: what the config uses (1 unless distributed.trainer_workers is set)")
    plan.add_argument("--gpu-memory", type=float, default=80.0,
                      help="GiB per GPU as torch reports it (an 80 GB H100 has ~79.2, a 141 GB H200 ~139.8)")
    plan.set_defaults(func=cmd_plan)

    report = sub.add_parser("report", help="draw training curves", description="Draw RUN_DIR/metrics.jsonl to curves.png.")
    report.add_argument("run_dir")
    report.set_defaults(func=cmd_report)
    from ctu.app.data_commands import add_parser as add_data_parser

    for command in (check, score, ev, play, train, plan, report, *add_data_parser(sub)):  # --debug also after the command's name
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help="on failure, show the full traceback")
    return parser


def _one_line(message: str) -> str:
    return " ".join(message.split())


def _describe(exc: BaseException) -> str:
    """One line naming what failed: the exception's own message (ctu's errors name the model, data, key,
    file or field), with the path for OS errors that carry one."""
    if isinstance(exc, KeyError) and exc.args and isinstance(exc.args[0], str):
        message = exc.args[0]
    elif isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        message = f"{exc.filename}: {exc.strerror}"
    else:
        message = str(exc)
    if not message.strip() or not isinstance(exc, (OSError, ValueError, KeyError, RuntimeError)):
        message = f"{type(exc).__name__}: {message}" if message.strip() else type(exc).__name__
    if isinstance(exc, OSError) and exc.errno in FULL_ERRNOS and exc.strerror == os.strerror(exc.errno):
        hint = space_hint(os.path.dirname(os.fspath(exc.filename)) or "." if exc.filename else ".")
        message += f" ({hint})" if hint else ""
    return _one_line(message)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. A failure exits non-zero with one line on stderr naming the problem; ``--debug``
    shows the traceback instead. Everything written to the console goes through ``ctu.config.redact.redact``; run as the
    ``ctu`` program (``argv`` None), its command line is redacted once parsed, and both stay so until it exits
    (a ``--debug`` traceback included)."""
    from ctu.config.redact_io import redact_argv, redact_stream, redacted_console
    from ctu.engines.cpu import cpu_threads, kernel_cache
    cpu_threads.apply()  # OpenMP reads its wait policy when torch loads: before any command imports torch
    kernel_cache.bound()  # oneDNN reads its cache sizes when it first computes
    if argv is None:
        redact_stream(sys.stdout)
        redact_stream(sys.stderr)
        return _main(None, after_parse=redact_argv)
    with redacted_console():
        return _main(argv)


def _main(argv: Sequence[str] | None, after_parse=None) -> int:
    args = build_parser().parse_args(argv)
    if after_parse is not None:
        after_parse()
    try:
        return int(args.func(args) or 0)
    except SystemExit as exc:  # ctu's own one-line errors
        if args.debug or exc.code is None or isinstance(exc.code, int):
            raise
        print(redact(_one_line(str(exc.code))), file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        if args.debug:
            raise
        from ctu.app.stop import Interrupted

        if isinstance(exc, Interrupted):  # stopped at a safe point by SIGINT or SIGTERM: 130 or 143
            print(redact(_one_line(f"ctu: interrupted: {exc}")), file=sys.stderr)
            return exc.status
        print("ctu: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.debug:
            raise
        print(f"ctu: error: {redact(_describe(exc))}", file=sys.stderr)
        return 1

if __name__ == "__main__":
    sys.exit(main())
