"""Peak memory of one policy_update for a Qwen2.5-shaped model with the real 151,936-token vocabulary.

Each configuration runs in its own subprocess, which reports its own peak RSS
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``) and, on CUDA, ``torch.cuda.max_memory_allocated``.
``before`` emulates the old path (one lm_head chunk over every position: full fp32 [rows, positions, vocab]
logits); ``after`` uses the default chunking (``ctu.train.logprobs.LOGIT_BUDGET``).

    python benchmarks/update_memory.py [--tokens 4096] [--layers 2] [--hidden 896]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile


def child(args) -> None:
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    import ctu.train.logprobs as logprobs
    from ctu.config.schema import load_config
    from ctu.engines.hf.models import smollm2_tokenizer_dir
    from ctu.train.policy import build_policy
    from ctu.train.update import policy_update, to_sample

    if args.mode == "before":
        logprobs.LOGIT_BUDGET = 1 << 62  # one chunk: every position's logits at once, as the old path
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with tempfile.TemporaryDirectory() as path:
        cfg = Qwen2Config(vocab_size=151936, hidden_size=args.hidden, intermediate_size=args.hidden * 27 // 5,
                          num_hidden_layers=args.layers, num_attention_heads=14, num_key_value_heads=2,
                          max_position_embeddings=32768, tie_word_embeddings=True)
        torch.manual_seed(0)
        Qwen2ForCausalLM(cfg).save_pretrained(path)
        AutoTokenizer.from_pretrained(smollm2_tokenizer_dir()).save_pretrained(path)
        dtype = "bfloat16" if device == "cuda" else "float32"
        config = load_config(None, [f"model.path={path}", f"model.dtype={dtype}",
                                    f"trainer.micro_batch_tokens={args.tokens}"])
        policy = build_policy(config, device=device)
        opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-5)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        rows, length = 4, args.tokens // 4
        g = torch.Generator().manual_seed(0)
        samples = [to_sample(torch.randint(0, 151936, (length // 2,), generator=g).tolist(),
                             torch.randint(0, 151936, (length - length // 2,), generator=g).tolist(),
                             [1] * (length - length // 2), [-5.0] * (length - length // 2), adv)
                   for adv in (1.0, -1.0, 0.5, -0.5)[:rows]]
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        policy_update(policy, opt, sched, samples, config.trainer, temperature=1.0)
        cuda_peak = torch.cuda.max_memory_allocated() if device == "cuda" else None
    print(json.dumps({"cuda_max_allocated": cuda_peak,
                      "rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["before", "after"])
    parser.add_argument("--tokens", type=int, default=4096, help="tokens in the micro-batch (4 rows)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=896)
    args = parser.parse_args()
    if args.mode:
        child(args)
        return
    for mode in ("before", "after"):
        out = subprocess.run([sys.executable, __file__, "--mode", mode, "--tokens", str(args.tokens),
                              "--layers", str(args.layers), "--hidden", str(args.hidden)],
                             capture_output=True, text=True, check=True)
        result = json.loads(out.stdout.strip().splitlines()[-1])
        rss_kib, cuda = result["rss_kib"], result["cuda_max_allocated"]  # the child's own peak RSS
        line = f"{mode:6s} peak RSS {rss_kib / 2**20:.2f} GiB"
        if cuda is not None:
            line += f", CUDA max_memory_allocated {cuda / 2**30:.2f} GiB"
        print(line + f" (vocab 151936, hidden {args.hidden}, {args.layers} layers, {args.tokens} tokens)", flush=True)


if __name__ == "__main__":
    main()
