"""In-process vs Ray trainer ranks + rollout workers: the largest relative difference of each per-step metric.

    python benchmarks/distributed_equivalence.py [--steps 3]

Runs `ctu train` (tiny-random, the e2e test's settings, fp32 on CPU) in process, with 1 trainer rank + 1 rollout
worker (split) and with 2 FSDP2 trainer ranks (gloo) + 2 rollout workers (colocated) on a local 2-CPU Ray
cluster, and prints, per metric, the largest |a - b| over the steps "of" the largest in-process |a|. A tiny-random agent earns no
task reward, so a deterministic stand-in judge (respx, as in tests/e2e/test_train.py) shapes the rewards: the
advantages, and so the updates, are not zero.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KEYS = ("rollout/shaped_reward", "rollout/response_tokens", "train/trained_tokens", "train/loss", "train/pg_loss",
        "train/grad_norm", "train/entropy", "train/clip_fraction", "sync/logprob_max_abs_diff")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    import respx
    import torch

    from ctu.app.trainer import Trainer
    from ctu.config.schema import load_config
    from ctu.observe.tracking import read_metrics
    from tests.e2e.test_train import JUDGE, judge_reply

    torch.cuda.is_available = lambda: False  # the CPU path
    os.environ["SHAPING_KEY"] = "sk-benchmark"
    mock = respx.mock(assert_all_called=False)
    mock.post(JUDGE).mock(side_effect=judge_reply)
    mock.start()
    base = ["model.path=tiny-random", "trainer.tasks_per_step=2", "trainer.samples_per_task=2", "trainer.sft_steps=0",
            "trainer.eval_max_tasks=2", "sampling.max_tokens=8", "env.max_turns=2", "trainer.ckpt_interval=1",
            "trainer.lr=1e-3", f"trainer.max_steps={args.steps}", "trainer.eval_before_train=false",
            "trainer.export=false", "shaping.enabled=true", "shaping.base_url=http://shaping-judge.test/v1",
            "shaping.api_key_env=SHAPING_KEY"]
    runs = {"in-process": [], "ray 1+1 split": ["distributed.trainer_workers=1", "distributed.rollout_workers=1",
                                                "distributed.placement=split"],
            "ray 2+2 colocated": ["distributed.trainer_workers=2", "distributed.rollout_workers=2",
                                  "distributed.worker_cpus=0.5", "distributed.trainer_cpus=0.5"]}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    rows, seconds = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in runs.items():
            torch.manual_seed(0)
            run_dir = Path(tmp) / name.replace(" ", "_")
            started = time.perf_counter()
            Trainer(load_config("configs/quickstart.yaml", [*base, f"run.dir={run_dir}", *extra])).run()
            seconds[name] = time.perf_counter() - started
            rows[name] = read_metrics(run_dir)
    ray.shutdown()
    ref = rows["in-process"]
    print(f"{args.steps} steps; seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in seconds.items()))
    print(f"{'metric':28s}" + "".join(f"{k:>23s}" for k in runs if k != "in-process"))
    for key in KEYS:
        line = f"{key:28s}"
        for name in runs:
            if name == "in-process":
                continue
            diff = max(abs(a[key] - b[key]) for a, b in zip(ref, rows[name], strict=True))
            scale = max(abs(a[key]) for a in ref)
            line += f"{diff:>12.1e} of {scale:<7.1e}"
        print(line)


if __name__ == "__main__":
    main()
