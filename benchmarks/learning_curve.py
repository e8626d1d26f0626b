"""Is RL better than more SFT? From one supervised warm start, equal training wall time spent on each arm,
held-out success on every test task at fixed intervals, for several seeds; a PNG and a JSON of the numbers.

Arms (any number, each ``name`` or ``name:key=value,key=value``; the overrides apply to that arm only):
  sft     more supervised steps on the gold demonstrations (the warm start's optimizer settings, a fresh AdamW);
  grpo    GRPO steps (``ctu train``'s ``train_step``: rollouts, advantages, update, weight sync);
  replay  the control of ``trainer.sft_replay``: each step updates on its replayed demonstrations alone (no rollout,
          no RL term) with the RL step's optimizer, schedule and draws: what RL adds over them is grpo - replay.
Every arm of a seed starts from the same warm-started weights (the warm start runs once per seed and is kept in
memory, or on disk with ``--cache``); the clock counts training only (rollouts, updates, syncs), not evaluation,
and an evaluation (greedy, ``eval.*``, all of ``trainer.eval_max_tasks``) runs whenever ``--eval-every`` seconds of
training have passed and at the end.

    python benchmarks/learning_curve.py [configs/quickstart.yaml] [--seeds 0 1 2] [--minutes 10]
        [--eval-every 150] [--arms sft grpo] [--steps sft=16 grpo=4 [--evals 2]] [--out runs/learning_curve]
        [--cache DIR] [key=value ...]

Does RL learn what no demonstration showed? The quickstart leaves refusals out of its warm start
(``trainer.sft_exclude: [refusal]``); per seed, RL for 6 steps, the replay-only control for 6, and more SFT for as
long as that seed's RL trained (``sft=match``), then refusals (of 14), allowed writes (of 34) and status requests
(of 12) held out, before and after:

    python benchmarks/learning_curve.py --arms grpo replay sft --steps grpo=6 replay=6 sft=match --evals 1 \
        --seeds 0 1 2 --cache runs/rl_discovers/cache --out runs/rl_discovers
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from ctu.app.evaluate import episode_specs, progress_bar, write_report
from ctu.app.trainer import Trainer
from ctu.config.schema import load_config
from ctu.distributed.group import sft_batches
from ctu.engines.cpu import kernel_cache
from ctu.engines.cpu.host_memory import release_memory
from ctu.observe.report import task_successes
from ctu.observe.stats import bootstrap_ci, paired_change_ci, seeds_summary
from ctu.train.demos import gold_samples, warm_start_samples

kernel_cache.bound()  # oneDNN's kernel caches as ``ctu`` bounds them (before the first bf16 product)


def parse_arm(text: str) -> tuple[str, str, list[str]]:
    """``grpo:trainer.lr=3e-4,sampling.temperature=1.1`` -> (label, kind, overrides)."""
    label, _, rest = text.partition(":")
    kind = label.split("@")[0]
    if kind not in ("sft", "grpo", "replay"):
        raise SystemExit(f"--arms: unknown arm kind '{kind}' in '{text}' (sft, grpo or replay)")
    return label, kind, [o for o in rest.split(",") if o]


def success(trainer: Trainer, tag: str) -> dict:
    """Greedy success on the held-out tasks (the trainer's own evaluation settings) with its 95% bootstrap interval
    over tasks and each task's rate (for paired intervals of a change); the episodes and report go to
    ``run.dir/eval/<tag>``."""
    cfg = trainer.config
    specs = episode_specs(trainer.domains, cfg.eval.splits, cfg.eval.samples_per_task, cfg.trainer.eval_max_tasks)
    with progress_bar(len(specs), "eval") as on_done:
        done = trainer._rollout(specs, cfg.eval.temperature, seed=10_000, on_done=on_done)
    release_memory()
    out = Path(cfg.run.dir) / "eval" / tag
    write_report(out, done)
    tasks = task_successes(out) or {}
    ci = bootstrap_ci(list(tasks.values())) if tasks else None
    return {"success": ci.mean if ci else 0.0, "ci": [ci.low, ci.high] if ci else None, "tasks": tasks}


def task_kind(task) -> str:
    """``kind/allowed`` or ``kind/refusal`` from a task's description (mini's kinds: status, cancel, change_address,
    return; a refusal is a request the order's status does not allow)."""
    description = task.description if isinstance(task.description, dict) else {}
    if "kind" not in description:
        raise SystemExit(f"--demo-kinds: task {task.id} has no kind in its description (mini's tasks have one)")
    return f"{description['kind']}/{'refusal' if description.get('refusal') else 'allowed'}"


def covered(task, kinds) -> bool:
    """Whether ``--demo-kinds`` gives ``task`` demonstrations: an entry ``cancel`` covers both cancel/allowed and
    cancel/refusal, ``cancel/refusal`` only the refusals."""
    kind = task_kind(task)
    return any(kind == k or kind.split("/")[0] == k for k in kinds)


def kinds_of(domains) -> dict[str, str] | None:
    """Each held-out task's ``kind/allowed|refusal`` (None when some task has no kind: not ``mini``)."""
    tasks = [(f"{d.name}/{t.id}", t) for d in domains for t in d.tasks]
    if not all(isinstance(t.description, dict) and "kind" in t.description for _, t in tasks):
        return None
    return {key: task_kind(t) for key, t in tasks}


def behaviours(tasks: dict[str, float], kinds: dict[str, str]) -> dict[str, tuple[float, int]]:
    """Successes (summed rates) and tasks of each behaviour: refusals, allowed writes, status requests."""
    groups = {"refusals": lambda k: k.endswith("/refusal"), "allowed writes": lambda k: k.endswith("/allowed")
              and not k.startswith("status/"), "status requests": lambda k: k.startswith("status/")}
    return {name: (sum(r for key, r in tasks.items() if test(kinds[key])), sum(1 for key in tasks if test(kinds[key])))
            for name, test in groups.items()}


def demo_tasks(domain, kinds) -> list:
    """The train tasks (all if no train split) whose gold demonstrations the warm start and the SFT arm see."""
    tasks = domain.split("train") if "train" in domain.splits else list(domain.tasks)
    known = {task_kind(t) for t in tasks}
    unknown = [k for k in kinds if k not in known and k not in {x.split("/")[0] for x in known}]
    if unknown:
        raise SystemExit(f"--demo-kinds: {unknown} not among {domain.name}'s kinds {sorted(known)}")
    return [t for t in tasks if covered(t, kinds)]


def by_coverage(tasks: dict[str, float], coverage: dict[str, bool]) -> dict[str, float | None]:
    """Held-out success on the tasks of kinds with demonstrations and on the others (None for no such task)."""
    groups: dict[str, list[float]] = {"with_demos": [], "without_demos": []}
    for key, rate in tasks.items():
        groups["with_demos" if coverage[key] else "without_demos"].append(rate)
    return {k: sum(v) / len(v) if v else None for k, v in groups.items()}


def snapshot(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.policy.model.state_dict().items()}


def refusals_drawn(trajectories, kinds: dict[str, str] | None) -> tuple[int, int] | None:
    """A training step's (refusals drawn, episodes of refused requests): an episode of a request its order's status
    does not allow that scored full reward refused it. None without task kinds (not ``mini``)."""
    if kinds is None:
        return None
    drawn = [t for t in trajectories if kinds.get(f"{t.domain}/{t.task_id}", "").endswith("/refusal")]
    return sum(t.success for t in drawn), len(drawn)


def replay_step(trainer: Trainer) -> tuple[int, float]:
    """One step of the replay-only control: the step's replayed demonstrations alone, with the RL step's optimizer,
    schedule and draws; (demonstrations, loss)."""
    trainer.step += 1
    demos = trainer.replay_demos()
    stats = trainer.group.update(demos, trainer.config.sampling.temperature,
                                 seed=trainer.config.run.seed * 1_000_003 + trainer.step)
    trainer.sync_weights()
    return len(demos), stats["loss"]


def run_arm(trainer: Trainer, label: str, kind: str, seconds: float, eval_every: float, demos, seed: int,
            max_steps: int | None = None, evals: int = 2) -> list[dict]:
    """Train for ``seconds`` of wall time (or ``max_steps`` steps, then ``evals`` evenly spaced evaluations);
    (train seconds, steps, success) at every evaluation and at the end."""
    points = []
    clock, steps, next_eval = 0.0, 0, eval_every
    eval_at = {round(max_steps * (k + 1) / evals) for k in range(evals)} if max_steps else set()
    t = trainer.config.trainer
    sft_optimizer = torch.optim.AdamW(trainer.policy.trainable_parameters(), lr=t.sft_lr, weight_decay=0.0)
    batches = iter(sft_batches(demos, 100_000, t.sft_batch_size, seed + 1) if kind == "sft" else [])
    kinds, drawn_per_step = kinds_of(trainer.domains), []
    while (steps < max_steps) if max_steps else (clock < seconds):
        started = time.perf_counter()
        if kind == "grpo":
            trainer.step += 1
            out = trainer.train_step()
            metrics, drawn = out["metrics"], refusals_drawn(out["trajectories"], kinds)
            r, tm = metrics["rollout"], metrics["timing"]
            note = (f"reward {r['reward']:.3f}, {r['episodes']} episodes ({r['dynamic_extra_draws']} extra draws), "
                    f"rollout {tm['rollout_s']:.0f}s, update {tm['update_s']:.0f}s, "
                    f"entropy {metrics['train']['entropy']:.3f}")
            if drawn is not None:
                drawn_per_step.append(drawn)
                note += f", refusals drawn {drawn[0]} in {drawn[1]} episodes of refused requests"
        elif kind == "replay":
            replayed, loss = replay_step(trainer)
            note = f"{replayed} demonstrations replayed alone, loss {loss:.3f}"
        else:
            from ctu.train.update import sft_update

            loss = sft_update(trainer.policy, sft_optimizer, [demos[i] for i in next(batches)], t.micro_batch_tokens,
                              share_prefix=t.pack_shared_prefix)
            release_memory()
            note = f"loss {loss:.3f}"
        clock += time.perf_counter() - started
        steps += 1
        print(f"  {kind} step {steps}: {clock:.0f}s, {note}", flush=True)
        if (steps in eval_at) if max_steps else (clock >= next_eval or clock >= seconds):
            points.append({"seconds": clock, "steps": steps, **success(trainer, f"{label}_{steps}"),
                           **({"refusals_drawn": list(drawn_per_step)} if drawn_per_step else {})})
            print(f"  {kind} @ {clock:.0f}s ({steps} steps): success {points[-1]['success']:.3f} "
                  f"(95% CI {points[-1]['ci']})", flush=True)
            next_eval += eval_every
    return points


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", nargs="?", default="configs/quickstart.yaml")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--eval-every", type=float, default=150.0, help="seconds of training between evaluations")
    ap.add_argument("--arms", nargs="+", default=["sft", "grpo"])
    ap.add_argument("--steps", nargs="*", default=[], metavar="KIND=N",
                    help="step budgets instead of --minutes, e.g. sft=16 grpo=4 (the same training time on a quiet machine; "
                         "the times are measured and printed); sft=match: the seconds this seed's grpo arm trained")
    ap.add_argument("--evals", type=int, default=2, help="with --steps: evaluations per arm, evenly spaced")
    ap.add_argument("--out", default="runs/learning_curve")
    ap.add_argument("--cache", default=None, help="keep each seed's warm start here and reuse it")
    ap.add_argument("--demo-kinds", nargs="+", default=None, metavar="KIND[/allowed|/refusal]",
                    help="RL vs imitation where imitation lacks something: the warm start and the sft arm see gold "
                         "demonstrations of these task kinds only (mini: status cancel change_address return), GRPO "
                         "trains on every kind; success is also reported on the kinds with and without demonstrations")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    kinds = sorted(args.demo_kinds) if args.demo_kinds else None
    mixed = {r.get("demo_kinds") for r in results.values()} - {None if kinds is None else " ".join(kinds)}
    if mixed:
        raise SystemExit(f"{results_path} holds runs with --demo-kinds {sorted(map(str, mixed))}: choose another --out")
    arms = [parse_arm(a) for a in args.arms]
    warm: dict[int, tuple[dict, dict]] = {}  # seed -> (warm-started weights, its time and success)
    for seed in args.seeds:
        base = [f"run.seed={seed}", f"run.dir={out / f'seed_{seed}'}", "run.overwrite=true", "trainer.eval_before_train=false",
                "trainer.eval_interval=0"]
        for label, kind, overrides in arms:
            key = f"{label}/seed_{seed}"
            if key in results:
                print(f"{key}: done before ({results_path})")
                continue
            config = load_config(args.config, [*args.overrides, *base, *overrides])
            trainer = Trainer(config)
            suffix = "_" + "+".join(k.replace("/", "-") for k in kinds) if kinds else ""
            suffix += f"_sft{config.trainer.sft_steps}" + "".join(f"-no-{k}" for k in config.trainer.sft_exclude)
            suffix += "-reasons" if config.trainer.sft_reasons else ""
            cache = Path(args.cache) / f"warm_start_seed{seed}{suffix}.pt" if args.cache else None
            if kinds:
                demos = [s for d in trainer.domains for s in gold_samples(trainer.chat, d, demo_tasks(d, kinds),
                                                                             config.trainer.sft_reasons)]
            else:
                demos = warm_start_samples(trainer.chat, trainer.domains, config.trainer.sft_data,
                                           exclude=config.trainer.sft_exclude,
                                           reasons=config.trainer.sft_reasons)  # as ctu train
            print(f"seed {seed}, {label}: {len(demos)} demonstrations"
                  + (f" of kinds {' '.join(kinds)}" if kinds else ""), flush=True)
            if seed not in warm and cache is not None and cache.exists():
                warm[seed] = torch.load(cache, weights_only=True), json.loads(cache.with_suffix(".json").read_text())
            if seed in warm:
                state, start = warm[seed]
                trainer.policy.model.load_state_dict(state["model"])
                trainer.policy.load_reference_state(state["rebased"])
                trainer.sync.base_changed = True
                trainer.sync_weights()  # a warm start syncs the engine itself (weight versions never repeat)
            else:
                began = time.perf_counter()
                trainer.warm_start(demos)
                start = {"warm_start_s": time.perf_counter() - began, **success(trainer, "warm_start")}
                state = {"model": snapshot(trainer),  # copies: the arms after this one start from them
                         "rebased": {n: t.clone() for n, t in trainer.policy.reference_state().items()}}
                if cache is not None:
                    cache.parent.mkdir(parents=True, exist_ok=True)
                    torch.save(state, cache)
                    cache.with_suffix(".json").write_text(json.dumps(start))
                warm[seed] = state, start
            print(f"seed {seed}: warm start success {start['success']:.3f} (95% CI {start.get('ci')})", flush=True)
            budget = dict(x.split("=") for x in args.steps).get(kind)
            seconds, eval_every = args.minutes * 60, args.eval_every
            if budget == "match":  # as long as this seed's grpo arm trained, one evaluation at the end
                rl = results.get(f"grpo/seed_{seed}")
                if rl is None:
                    raise SystemExit(f"--steps {kind}=match: run the grpo arm of seed {seed} first (--arms grpo ...)")
                seconds = eval_every = rl["points"][-1]["seconds"]
                budget = None
            points = run_arm(trainer, label, kind, seconds, eval_every, demos, seed,
                             max_steps=int(budget) if budget else None, evals=args.evals)
            points = [{"seconds": 0.0, "steps": 0, "success": start["success"], "ci": start.get("ci"),
                       "tasks": start.get("tasks", {})}, *points]
            if kinds:
                coverage = {f"{d.name}/{t.id}": covered(t, kinds) for d in trainer.domains for t in d.tasks}
                for p in points:
                    p["by_demos"] = by_coverage(p["tasks"], coverage)
            results[key] = {"arm": label, "kind": kind, "seed": seed, "overrides": overrides, "points": points,
                            "demo_kinds": " ".join(kinds) if kinds else None,
                            "task_kinds": kinds_of(trainer.domains)}
            results_path.write_text(json.dumps(results, indent=1))
            trainer.pool.close()
            trainer.group.close()
            del trainer
            release_memory()
    draw(results, out / "learning_curve.png")
    table(results)


def arm_summary(runs: list[dict]) -> dict:
    """One arm over its seeds: each seed's change from the warm start to its last evaluation with a paired bootstrap
    interval over the same tasks, and across seeds mean/min/max with a t interval (see ctu/observe/stats.py)."""
    seeds = []
    for r in runs:
        first, last = r["points"][0], r["points"][-1]
        shared = sorted(set(first.get("tasks") or {}) & set(last.get("tasks") or {}))
        change = (paired_change_ci({k: first["tasks"][k] for k in shared}, {k: last["tasks"][k] for k in shared})
                  if shared else None)
        seeds.append({"seed": r["seed"], "change": last["success"] - first["success"],
                      "ci": [change.low, change.high] if change else None, "tasks": len(shared)})
    return {"seeds": seeds, "across_seeds": seeds_summary([s["change"] for s in seeds])}


def rl_own_part(results: dict, arm: str = "grpo") -> dict | None:
    """RL's own part, what the grpo-kind ``arm`` ends with over the ``replay`` control of the same seed: per seed the
    change with a paired bootstrap interval over the tasks both evaluated last, and across seeds as
    :func:`arm_summary`. None without a seed that ran both arms."""
    ends = {(r["arm"], r["seed"]): r["points"][-1] for r in results.values() if r["arm"] in (arm, "replay")}
    seeds = []
    for seed in sorted({s for a, s in ends if a == arm and ("replay", s) in ends}):
        rl, replay = ends[arm, seed], ends["replay", seed]
        shared = sorted(set(rl.get("tasks") or {}) & set(replay.get("tasks") or {}))
        change = (paired_change_ci({k: replay["tasks"][k] for k in shared}, {k: rl["tasks"][k] for k in shared})
                  if shared else None)
        seeds.append({"seed": seed, "change": rl["success"] - replay["success"],
                      "ci": [change.low, change.high] if change else None, "tasks": len(shared)})
    return {"seeds": seeds, "across_seeds": seeds_summary([s["change"] for s in seeds])} if seeds else None


def table(results: dict) -> None:
    by_arm: dict[str, list] = {}
    for r in results.values():
        by_arm.setdefault(r["arm"], []).append(r)
    for arm, runs in by_arm.items():
        summary = arm_summary(runs)
        s = summary["across_seeds"]
        cells = ", ".join(f"seed {r['seed']}: " + " ".join(f"{p['success']:.3f}@{p['seconds']:.0f}s" for p in r["points"])
                          for r in runs)
        spread = f"95% t interval over {s['n']} seeds [{s['low']:+.3f}, {s['high']:+.3f}]" if s["n"] > 1 else "one seed"
        print(f"{arm}: mean gain {s['mean']:+.3f} (min {s['min']:+.3f}, max {s['max']:+.3f}, {spread}) ({cells})")
        for group in ("with_demos", "without_demos"):
            gains = [r["points"][-1]["by_demos"][group] - r["points"][0]["by_demos"][group] for r in runs
                     if "by_demos" in r["points"][0] and r["points"][0]["by_demos"][group] is not None]
            if gains:
                print(f"  held-out kinds {group.replace('_', ' ')}: mean gain {sum(gains) / len(gains):+.3f} "
                      f"(min {min(gains):+.3f}, max {max(gains):+.3f})")
        for seed, run in zip(summary["seeds"], runs, strict=True):
            if seed["ci"]:
                print(f"  seed {seed['seed']}: {seed['change']:+.3f} [{seed['ci'][0]:+.3f}, {seed['ci'][1]:+.3f}] "
                      f"(paired bootstrap over {seed['tasks']} tasks)")
            if run.get("task_kinds"):
                before, after = (behaviours(run["points"][i]["tasks"], run["task_kinds"]) for i in (0, -1))
                print("    " + ", ".join(f"{name} {before[name][0]:g} -> {after[name][0]:g} of {after[name][1]}"
                                         for name in after))
    for arm in sorted({r["arm"] for r in results.values() if r.get("kind") == "grpo"}):
        own = rl_own_part(results, arm)
        if own:
            s = own["across_seeds"]
            print(f"RL's own part ({arm} over replay, same seed): mean {s['mean']:+.3f} over {s['n']} seeds; "
                  + ", ".join(f"seed {x['seed']} {x['change']:+.3f}"
                              + (f" [{x['ci'][0]:+.3f}, {x['ci'][1]:+.3f}]" if x["ci"] else "") for x in own["seeds"]))


def draw(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = {}
    for r in results.values():
        color = colors.setdefault(r["arm"], f"C{len(colors)}")
        xs = [p["seconds"] / 60 for p in r["points"]]
        ys = [p["success"] for p in r["points"]]
        ax.plot(xs, ys, marker="o", color=color, alpha=0.8,
                label=r["arm"] if r["seed"] == min(x["seed"] for x in results.values() if x["arm"] == r["arm"]) else None)
        bars = [(x, y, p["ci"]) for x, y, p in zip(xs, ys, r["points"], strict=True) if p.get("ci")]
        if bars:  # 95% bootstrap interval over the held-out tasks
            ax.errorbar([b[0] for b in bars], [b[1] for b in bars], yerr=[[b[1] - b[2][0] for b in bars],
                        [b[2][1] - b[1] for b in bars]], fmt="none", color=color, alpha=0.35, capsize=2)
    ax.set_xlabel("training wall time after the warm start (min, evaluation excluded)")
    ax.set_ylabel("held-out success (greedy)")
    ax.set_title("more SFT vs GRPO from the same warm start (one line per seed, 95% CI over tasks)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
