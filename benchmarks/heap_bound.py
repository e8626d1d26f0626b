"""What fixing glibc's mmap threshold (``CTU_HEAP_BOUND=1``: ``ctu.engines.cpu.host_memory.bound_heap``, in every
process that loads a model) costs and saves: RL updates of the quickstart's policy (SmolLM2-135M + LoRA, fp32, ``trainer.*`` of
``configs/quickstart.yaml``) on synthetic episodes of the quickstart's shape, each setting in its own process
(without it: glibc's dynamic default; both trim the heap after every micro-batch), run
alternately so that a busy machine slows both alike. Prints seconds per update and the update's peak RSS.

    python benchmarks/heap_bound.py [--updates 3] [--rounds 2] [--threads 1] [--episodes 20]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import json, random, sys, time
    import torch
    from ctu.config.schema import load_config
    from ctu.train.policy import build_policy
    from ctu.train.update import policy_update, to_sample

    def high_water_gib():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20

    torch.set_num_threads(int(sys.argv[2]))
    config = load_config("configs/quickstart.yaml", [])
    policy = build_policy(config, device="cpu")
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    rng = random.Random(0)
    vocab = policy.model.config.vocab_size
    # episodes (20: a step of the preset, 16 sampled + 4 replayed) of a 300-700 token prompt and up to four
    # agent turns of 20-64 tokens between user/tool turns, every agent token trained
    samples = []
    for i in range(int(sys.argv[3])):
        prompt = [rng.randrange(vocab) for _ in range(rng.randrange(300, 700))]
        response, mask = [], []
        for _ in range(rng.randrange(1, 5)):
            turn = rng.randrange(20, 65)
            response += [rng.randrange(vocab) for _ in range(turn)]
            mask += [1] * turn
            other = rng.randrange(20, 80)
            response += [rng.randrange(vocab) for _ in range(other)]
            mask += [0] * other
        keep = max(0, 1023 - len(prompt))
        response, mask = response[:keep], mask[:keep]
        mask[0] = 1
        samples.append(to_sample(prompt, response, mask, [-1.0] * len(response), (-1) ** i * 0.5))
    times = []
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    for u in range(int(sys.argv[1])):
        began = time.perf_counter()
        policy_update(policy, opt, sched, samples, config.trainer, temperature=1.3, seed=u)
        times.append(time.perf_counter() - began)
    print(json.dumps({"seconds": times, "peak_gib": high_water_gib()}))
""")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--updates", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--episodes", type=int, default=20, help="episodes an update (the preset's step: 20)")
    args = ap.parse_args()
    results: dict[str, list] = {"bounded": [], "glibc default": []}
    for _ in range(args.rounds):
        for label in results:
            env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "CTU_HEAP_BOUND"}
            if label == "bounded":
                env["CTU_HEAP_BOUND"] = "1"
            out = subprocess.run([sys.executable, "-c", CHILD, str(args.updates), str(args.threads),
                                  str(args.episodes)],
                                 capture_output=True, text=True, env=env, check=True)
            results[label].append(json.loads(out.stdout.strip().splitlines()[-1]))
            r = results[label][-1]
            print(f"{label}: updates {', '.join(f'{s:.1f}' for s in r['seconds'])} s, peak RSS {r['peak_gib']:.2f} "
                  f"GiB", flush=True)
    for label, runs in results.items():
        seconds = [s for r in runs for s in r["seconds"][1:]] or [s for r in runs for s in r["seconds"]]
        print(f"{label}: {sum(seconds) / len(seconds):.1f} s per update (after the first), peak RSS "
              f"{max(r['peak_gib'] for r in runs):.2f} GiB")


if __name__ == "__main__":
    main()
