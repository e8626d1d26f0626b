"""What running the system prompt once a step saves: the quickstart's supervised steps with and without it.

Each variant runs in a fresh process (its own peak RSS): it builds the quickstart's policy (SmolLM2-135M + LoRA, in
the precision ``ctu train`` picks for this CPU, threads and OpenMP waits as ``ctu`` sets them), takes the warm
start's gold demonstrations, and times ``--steps`` supervised steps of 8 after one untimed step. ``off`` runs every
micro-batch's rows whole, as the trainer did before (and as data-parallel ranks still do).

    python benchmarks/step_prefix.py [--steps 3] [--variants on off] [k=v ...]   # e.g. trainer.micro_batch_tokens=768
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys


def child(variant: str, steps: int, overrides: list[str]) -> None:
    import resource
    import time

    from ctu.engines.cpu import cpu_threads
    cpu_threads.apply()
    import torch

    import ctu.train.update as update
    from ctu.app.trainer import build_trainer_group
    from ctu.config.schema import load_config
    from ctu.rollout import components as build
    from ctu.train.demos import warm_start_samples

    if variant == "off":
        update.step_prefix_length = lambda *a, **k: 0
    config = load_config("configs/quickstart.yaml", overrides)
    trainer = build_trainer_group(config)
    t = config.trainer
    chat = build.build_chat(config, tokenizer=trainer.tokenizer)
    demos = warm_start_samples(chat, build.build_domains(config), t.sft_data, config.env.max_context_tokens,
                               exclude=t.sft_exclude, reasons=t.sft_reasons)
    optimizer = torch.optim.AdamW(trainer.policy.trainable_parameters(), lr=t.sft_lr)
    seconds = []
    for step in range(steps + 1):
        batch = demos[8 * step: 8 * step + 8]
        start = time.perf_counter()
        update.sft_update(trainer.policy, optimizer, batch, t.micro_batch_tokens)
        if step:  # the first step warms up (and runs ctu's thread checks' code paths once)
            seconds.append(time.perf_counter() - start)
    print(json.dumps({"variant": variant, "seconds": seconds,
                      "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                      "precision": trainer.precision_note}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--variants", nargs="+", choices=["on", "off"], default=["on", "off"])
    ap.add_argument("--child", choices=["on", "off"], help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*", help="config overrides, key=value")
    args = ap.parse_args()
    if args.child:
        child(args.child, args.steps, args.overrides)
        return
    for variant in args.variants:
        out = subprocess.run([sys.executable, __file__, "--child", variant, "--steps", str(args.steps),
                              *args.overrides], capture_output=True, text=True, check=True).stdout
        row = json.loads(out.strip().splitlines()[-1])
        s = row["seconds"]
        print(f"{variant:>3}: {sum(s) / len(s):.1f} s a step (min {min(s):.1f}, max {max(s):.1f}, {len(s)} steps of 8 "
              f"demonstrations), peak RSS {row['peak_rss_gib']:.2f} GiB  [{row['precision']}]", flush=True)


if __name__ == "__main__":
    main()
