"""Policy-update throughput: one GRPO update (old/ref logprobs + PPO-clip backward) on a random model.

Builds a random Qwen2-shaped model from a config (no download), wraps it like ``ctu train`` does (LoRA or full,
one dtype), feeds it synthetic samples and prints trained tokens per second and peak GPU memory.

    python benchmarks/update_throughput.py --shape tiny --device cpu
    python benchmarks/update_throughput.py --shape qwen2.5-0.5b --device cuda --dtype bfloat16 --seq-len 2048
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time

import torch

SHAPES = {  # hidden, intermediate, layers, heads, kv heads
    "tiny": (64, 128, 2, 4, 2),
    "smollm2-135m": (576, 1536, 30, 9, 3),
    "qwen2.5-0.5b": (896, 4864, 24, 14, 2),
    "qwen2.5-1.5b": (1536, 8960, 28, 12, 2),
    "qwen2.5-3b": (2048, 11008, 36, 16, 2),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--micro-batch-tokens", type=int, default=8192)
    ap.add_argument("--full", action="store_true", help="full fine-tuning instead of LoRA")
    ap.add_argument("--kl", type=float, default=0.01)
    ap.add_argument("--grad-ckpt", action="store_true", help="gradient checkpointing")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from ctu.config.schema import load_config
    from ctu.distributed.group import lr_schedule
    from ctu.engines.hf.models import smollm2_tokenizer_dir
    from ctu.train.policy import assert_precision_policy, build_policy
    from ctu.train.update import policy_update, to_sample

    hidden, inter, layers, heads, kv = SHAPES[args.shape]
    tok = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir())
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Qwen2Config(vocab_size=len(tok), hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                          num_attention_heads=heads, num_key_value_heads=kv, eos_token_id=tok.eos_token_id,
                          max_position_embeddings=max(4096, args.seq_len))
        torch.manual_seed(0)
        Qwen2ForCausalLM(cfg).save_pretrained(tmp)
        tok.save_pretrained(tmp)
        config = load_config(None, [f"model.path={tmp}", f"model.dtype={args.dtype}", f"trainer.kl_coef={args.kl}",
                                    f"trainer.micro_batch_tokens={args.micro_batch_tokens}",
                                    f"lora.enabled={str(not args.full).lower()}",
                                    f"trainer.gradient_checkpointing={str(args.grad_ckpt).lower()}"])
        policy = build_policy(config, device=args.device)
    dtype = assert_precision_policy(policy.model, policy.compute_dtype, policy.reference)
    params = sum(p.numel() for p in policy.model.parameters())
    trainable = sum(p.numel() for p in policy.trainable_parameters())
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_schedule(config.trainer, 10 * args.repeats))
    rng = random.Random(0)
    prompt_len = args.seq_len // 2
    samples = []
    for i in range(args.samples):
        prompt = [rng.randrange(100, len(tok)) for _ in range(prompt_len)]
        response = [rng.randrange(100, len(tok)) for _ in range(args.seq_len - prompt_len)]
        samples.append(to_sample(prompt, response, [1] * len(response), [-5.0] * len(response),
                                 1.0 if i % 2 else -1.0))
    tokens = args.samples * args.seq_len
    print(f"shape={args.shape} params={params / 1e6:.1f}M trainable={trainable / 1e6:.2f}M dtype={dtype} "
          f"device={args.device} samples={args.samples}x{args.seq_len} tokens")
    for r in range(args.repeats + 1):
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        stats = policy_update(policy, opt, sched, samples, config.trainer, temperature=1.0)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        mem = f" peak_mem={torch.cuda.max_memory_allocated() / 2**30:.1f}GiB" if args.device.startswith("cuda") else ""
        label = "warm-up" if r == 0 else f"run {r}"
        print(f"{label}: {dt:.2f}s  {tokens / dt:,.0f} tokens/s  loss={stats['loss']:.4f} "
              f"grad_norm={stats['grad_norm']:.3f}{mem}")


if __name__ == "__main__":
    main()
