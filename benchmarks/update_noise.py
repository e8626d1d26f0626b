"""How much of one RL step is signal: the policy gradients of independent rollout batches, compared.

From a cached warm start (``rl_levers.py --cache``), N batches of ``trainer.tasks_per_step`` tasks are played at the
training temperature, each with one greedy episode per task (ReMax's baseline), and the update's gradient (the
trainer's own ``policy_update`` loss, no clipping, no optimizer step) is taken for each batch under each advantage
estimator. Independent batches of the same policy share the expected gradient and differ by noise, so

- the mean cosine between two batches' gradients, rho, is the share of one step that is signal:
  rho = |E g|^2 / (|E g|^2 + noise), and a batch k times larger has rho_k = k rho / (1 - rho + k rho);
- the same for sign(g), the direction of Adam's first steps (each weight moves by about lr, whatever its gradient);
- the cosine between the estimators' gradients on the same episodes.

    python benchmarks/update_noise.py --cache runs/levers/ws10_s0_fp32.pt --batches 6 --out runs/noise/s0 [key=value ...]
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rl_levers import from_cache  # noqa: E402

from ctu.app.trainer import Trainer  # noqa: E402
from ctu.config.schema import load_config  # noqa: E402
from ctu.rl.advantages import scored_advantages  # noqa: E402
from ctu.rollout.loop import EpisodeSpec  # noqa: E402
from ctu.rollout.stitch import trajectory_samples  # noqa: E402
from ctu.train.update import policy_update, to_sample  # noqa: E402

ESTIMATORS = ("reinforce_pp", "remax")


class GradientRecorder:
    """Stands in for the optimizer in ``policy_update``: keeps the gradient instead of stepping."""

    def __init__(self, params):
        self.params = list(params)
        self.grad: torch.Tensor | None = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        self.grad = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().double().flatten()
                               for p in self.params])


class NoSchedule:
    def step(self) -> None:
        pass


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    na, nb = float(a.norm()), float(b.norm())
    return float(a @ b) / (na * nb) if na and nb else float("nan")


def mean_pairwise(vectors: list[torch.Tensor]) -> float:
    values = [cosine(a, b) for a, b in itertools.combinations(vectors, 2)]
    values = [v for v in values if not math.isnan(v)]
    return sum(values) / len(values) if values else float("nan")


def episodes_for(rho: float, per_batch: int, target: float = 0.5) -> float:
    """Episodes a batch needs for two batches' gradients to agree to cosine ``target`` (rho at ``per_batch``)."""
    if not rho > 0:
        return float("inf")
    k = target * (1 - rho) / (rho * (1 - target))
    return max(1.0, k) * per_batch


def gradient(trainer: Trainer, trajectories, advantages: dict[int, float]) -> torch.Tensor | None:
    samples = [to_sample(p, r, m, lp, adv) for i, adv in sorted(advantages.items())
               for p, r, m, lp in trajectory_samples(trajectories[i])]
    samples = [s for s in samples if any(s.mask)]
    if not samples:
        return None
    recorder = GradientRecorder(trainer.policy.trainable_parameters())
    cfg = replace(trainer.config.trainer, grad_clip=float("inf"))
    policy_update(trainer.policy, recorder, NoSchedule(), samples, cfg, trainer.config.sampling.temperature)
    return recorder.grad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/quickstart.yaml")
    ap.add_argument("--cache", required=True, help="the warm start's weights (.pt) and evaluation (.json)")
    ap.add_argument("--batches", type=int, default=6)
    ap.add_argument("--out", required=True, help="run directory")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    config = load_config(args.config, [f"run.dir={args.out}", "run.overwrite=true", "trainer.eval_before_train=false",
                                       *args.overrides])
    trainer = Trainer(config)
    start = from_cache(trainer, Path(args.cache))
    print(f"warm start: {start['success']:.3f}", flush=True)
    t = config.trainer
    grads: dict[str, list[torch.Tensor]] = {name: [] for name in ESTIMATORS}
    for b in range(args.batches):
        picks = trainer.sampler.sample(t.tasks_per_step)
        seed = config.run.seed * 1_000_003 + (b + 1) * 7919
        batch = trainer._rollout([EpisodeSpec(d, task, 0) for d, task in picks], config.sampling.temperature, seed=seed)
        rewards = trainer.rewards(batch).shaped
        baselines = trainer.greedy_baselines(picks, seed)
        errored = [tr.stop_reason == "error" for tr in batch]
        line = [f"batch {b + 1}: reward {sum(rewards) / len(rewards):.3f}, greedy "
                f"{sum(x or 0.0 for x in baselines) / len(baselines):.3f}"]
        for name in ESTIMATORS:
            adv = scored_advantages(name, rewards, [f"{i}" for i in range(len(batch))], errored, baselines=baselines)
            g = gradient(trainer, batch, adv)
            if g is not None:
                grads[name].append(g)
            line.append(f"{name}: {len(adv)} episodes, |g| {float(g.norm()) if g is not None else 0.0:.4f}")
        if all(len(grads[n]) == b + 1 for n in ESTIMATORS):
            line.append(f"cos(reinforce_pp, remax) {cosine(grads['reinforce_pp'][-1], grads['remax'][-1]):+.3f}")
        print("; ".join(line), flush=True)
    n = t.tasks_per_step
    for name in ESTIMATORS:
        rho = mean_pairwise(grads[name])
        sign_rho = mean_pairwise([torch.sign(g) for g in grads[name]])
        print(f"{name}: {len(grads[name])} batches of {n} episodes; gradients agree to cosine {rho:+.3f} "
              f"(sign: {sign_rho:+.3f}); cosine 0.5 would take ~{episodes_for(rho, n):.0f} episodes a step", flush=True)


if __name__ == "__main__":
    main()
