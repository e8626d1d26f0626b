"""Write docs/config.md, the config reference, from ctu/config/fields.py.

Every key of every section: its type (the annotation as written), its default, where it applies (an engine or a
placement, read from the comment's leading ``hf:`` / ``remote, served:`` or from APPLIES below) and what it does (the
field's comment: on its line, or the comment lines just above it; else DESCRIBED below). tests/unit/test_config_reference.py
regenerates the page and compares, so a field added, renamed or re-commented without rerunning this fails there::

    python scripts/config_reference.py          # rewrite docs/config.md
    python scripts/config_reference.py --check  # exit 1 if docs/config.md is stale
"""

from __future__ import annotations

import ast
import dataclasses
import io
import json
import re
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIELDS = ROOT / "ctu" / "config" / "fields.py"
PAGE = ROOT / "docs" / "config.md"
ENGINES = ("hf", "remote", "vllm", "served")

# What a field without a comment in fields.py does. A key here that also has a comment, or that no longer exists, is
# an error (the comment wins; say it there).
DESCRIBED: dict[str, str] = {
    "model.path": "the policy model: `smollm2-135m` (embedded), `tiny-random` (tests), a hub id such as "
                  "`Qwen/Qwen3-4B` (downloaded once into the Hugging Face cache) or a local directory",
    "model.dtype": "the weights' dtype; auto: bf16 on CUDA, fp32 on CPU (the trainer autocasts, `trainer.autocast`)",
    "engine.kind": "where rollouts are sampled: in-process transformers, an OpenAI-compatible server (evaluation "
                   "only), in-process vLLM, or training through a vLLM server ([engines](engines.md))",
    "engine.max_batch_size": "sequences one generation call decodes at once",
    "engine.gpu_memory_utilization": "vllm, served (launched): the share of GPU memory vLLM takes for weights and KV cache",
    "engine.parity_probe_tokens": "tokens in the parity probe scored after every weight sync",
    "engine.launch_timeout_s": "served: seconds a launched server may take to answer its health check",
    "sampling.temperature": "rollout sampling temperature (the trainer's logprobs use the same)",
    "sampling.top_p": "nucleus sampling in rollouts",
    "sampling.seed": "the sampler's seed (each episode derives its own from it)",
    "user.kind": "the simulated customer: scripted (deterministic, where the domain has one) or an LLM",
    "user.model": "llm user: the chat model playing the customer",
    "user.base_url": "llm user: an OpenAI-compatible server (null: api.openai.com)",
    "user.api_key_env": "llm user: name of the environment variable holding the key (never the key itself)",
    "user.strategy": "llm user: tau2's user prompting strategy",
    "user.temperature": "llm user: sampling temperature",
    "env.domains": "domains to train and evaluate on: mini, retail, airline, telecom, banking_knowledge, or "
                   "`package.module:function` ([your own domain](your-domain.md))",
    "env.tau2_data_dir": "a tau2-bench checkout's data/tau2/domains (null: found as in [domains](domains.md#where-ctu-finds-tau2s-data))",
    "env.max_turns": "assistant turns before an episode stops (stop reason max_turns)",
    "env.max_errors": "tool errors before an episode stops",
    "env.max_context_tokens": "prompt + response tokens an episode may reach (stop reason length)",
    "filters.zero_reward_on_length_stop": "an episode that hit a token limit earns 0",
    "filters.mask_length_stop": "an episode that hit a token limit is left out of the loss",
    "eval.splits": "task splits `ctu eval` and the trainer's evaluations run",
    "eval.temperature": "evaluation sampling temperature (0: greedy)",
    "eval.save_tokens": "write token ids into the evaluation's trajectories.jsonl",
    "eval.concurrency": "episodes played at once in an evaluation",
    "judge.enabled": "score episodes with an LLM judge besides the reward (in the report; `shaping` trains on one)",
    "judge.model": "the judge's chat model",
    "judge.base_url": "the judge's OpenAI-compatible server (null: api.openai.com)",
    "judge.api_key_env": "name of the environment variable holding the judge's key",
    "run.dir": "where the run writes config.yaml, metrics.jsonl, checkpoints/, eval/, examples/, export/",
    "run.seed": "seeds task sampling, rollouts and updates",
    "lora.enabled": "train LoRA adapters (false: every weight)",
    "lora.rank": "LoRA rank r",
    "lora.alpha": "LoRA scale alpha (the update is scaled by alpha / r)",
    "lora.dropout": "LoRA dropout (0 keeps one optimizer step on-policy without a scoring pass)",
    "lora.target_modules": "the linear layers that get adapters",
    "trainer.max_steps": "RL steps (one step: rollouts, rewards, advantages, update, weight sync)",
    "trainer.tasks_per_step": "tasks drawn per step (GRPO groups)",
    "trainer.lr": "RL learning rate (AdamW)",
    "trainer.warmup_steps": "linear learning-rate warmup, in optimizer updates",
    "trainer.schedule": "the learning rate after warmup",
    "trainer.weight_decay": "AdamW weight decay",
    "trainer.ppo_epochs": "passes over one step's episodes",
    "trainer.clip_low": "PPO ratio clip below 1 (1 - clip_low)",
    "trainer.clip_high": "PPO ratio clip above 1 (1 + clip_high; larger: clip-higher)",
    "trainer.dual_clip": "dual-clip PPO's bound for negative advantages (null: off)",
    "trainer.loss_aggregation": "how token losses are averaged into one (GRPO: token_mean; Dr.GRPO: seq_mean_token_sum_norm)",
    "trainer.kl_coef": "weight of the KL to the reference (the base model, or the warm start)",
    "trainer.kl_estimator": "the KL estimator (Schulman's k1, k2, k3)",
    "trainer.kl_in_reward": "subtract kl_coef x the episode's KL from its reward instead of adding a loss term",
    "trainer.dynamic_sampling": "DAPO's dynamic sampling: keep drawing until tasks_per_step groups have both outcomes",
    "trainer.entropy_coef": "weight of an entropy bonus in the loss",
    "trainer.gradient_checkpointing": "recompute activations in the backward pass (less activation memory, more compute)",
    "trainer.sft_lr": "the warm start's learning rate",
    "trainer.sft_batch_size": "demonstrations per warm-start step",
    "trainer.sft_replay_advantage": "the advantage a replayed demonstration is trained with",
    "trainer.ckpt_interval": "steps between checkpoints (the last step always writes one)",
    "trainer.keep_checkpoints": "checkpoints kept (older ones deleted)",
    "trainer.eval_before_train": "evaluate the base model first (and again after the warm start)",
    "trainer.eval_max_tasks": "tasks per domain and split in the trainer's evaluations (null: all)",
    "trainer.examples_interval": "steps between writes of example episodes to examples/",
    "trainer.examples_count": "episodes written each time",
    "trainer.export": "write export/ (the adapter and merged weights) at the end",
    "wandb.enabled": "mirror metrics.jsonl to Weights & Biases ([metrics](metrics.md))",
    "wandb.project": "the W&B project",
    "wandb.mode": "online (needs `wandb login` or WANDB_API_KEY), offline (`wandb sync` later) or disabled",
    "shaping.enabled": "add the judge's bounded bonus to the training reward",
    "shaping.model": "the shaping judge's chat model",
    "shaping.base_url": "the shaping judge's server (null: api.openai.com)",
    "shaping.api_key_env": "name of the environment variable holding its key",
    "shaping.max_bonus": "the bonus or penalty's largest size",
}
# Where a key applies when its comment does not say (the rest: every engine and placement).
APPLIES: dict[str, str] = {
    "engine.gpu_memory_utilization": "vllm, served", "engine.weight_sync": "vllm, served",
    "engine.colocated": "vllm", "engine.launch_timeout_s": "served", "engine.decode_dtype": "hf",
    "engine.parity_tolerance": "hf, vllm, served", "engine.parity_probe_tokens": "hf, vllm, served",
    "trainer.inflight": "hf, async", "trainer.max_staleness": "async",
    "distributed.rollout_workers": "Ray", "distributed.trainer_workers": "Ray, FSDP2", "distributed.placement": "Ray",
    "distributed.address": "Ray", "distributed.worker_cpus": "Ray", "distributed.trainer_cpus": "Ray, FSDP2",
    "distributed.cpu_offload": "FSDP2", "distributed.placement_timeout_s": "Ray", "distributed.start_timeout_s": "Ray",
    "agent.command": "your agent", "agent.concurrency": "your agent", "agent.timeout_s": "your agent",
    "agent.pass_env": "your agent", "user.patience": "scripted user",
    "engine.api_key_env": "remote, served", "engine.launch_python": "served", "engine.launch_args": "served",
    **{f"user.{k}": "llm user" for k in ("max_retries", "backoff_initial", "backoff_max", "timeout", "max_tokens",
                                         "model", "base_url", "api_key_env", "strategy", "temperature")},
}
PREFIX = re.compile(r"^((?:hf|remote|vllm|served)(?:,\s*(?:hf|remote|vllm|served))*)(?: on CPU)?\s*(?:\([^)]*\))?:\s*")


def _comments(source: str, tree: ast.Module) -> dict[tuple[str, str], str]:
    """(class, field) -> its comment: the comment lines just above it, then the one on its own last line."""
    lines = source.splitlines()
    on_line = {t.start[0]: t.string.lstrip("#").strip()
               for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT}
    out: dict[tuple[str, str], str] = {}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        for node in cls.body:
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            above: list[str] = []
            i = node.lineno - 1  # the line above, 1-based
            while i >= 1 and lines[i - 1].strip().startswith("#"):
                above.insert(0, on_line[i])
                i -= 1
            trailing = on_line.get(node.end_lineno or node.lineno, "")
            out[(cls.name, node.target.id)] = " ".join([*above, trailing]).strip()
    return out


def _annotations(source: str, tree: ast.Module) -> dict[tuple[str, str], str]:
    return {(cls.name, n.target.id): ast.get_source_segment(source, n.annotation) or ""
            for cls in tree.body if isinstance(cls, ast.ClassDef)
            for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def _default(f: dataclasses.Field) -> str:
    value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default  # type: ignore[misc]
    if value is None:
        return "null"
    if isinstance(value, float) and value == float("inf"):
        return ".inf"
    return json.dumps(value) if isinstance(value, (str, list, dict)) else str(value).lower() \
        if isinstance(value, bool) else str(value)


def rows() -> list[dict[str, str]]:
    """One row per config key, in the sections' and fields' order."""
    from ctu.config import fields as module

    source = FIELDS.read_text(encoding="utf-8")
    tree = ast.parse(source)
    comments, annotations = _comments(source, tree), _annotations(source, tree)
    out = []
    for section in dataclasses.fields(module.Config):
        cls = section.type if isinstance(section.type, type) else getattr(module, str(section.type))
        for f in dataclasses.fields(cls):
            owner = next(c.__name__ for c in cls.__mro__ if (c.__name__, f.name) in annotations)
            key = f"{section.name}.{f.name}"
            comment = comments.get((owner, f.name), "")
            applies = ""
            if found := PREFIX.match(comment):
                applies = ", ".join(e for e in ENGINES if re.search(rf"\b{e}\b", found.group(1)))
            out.append({"section": section.name, "key": key, "type": annotations[(owner, f.name)],
                        "default": _default(f), "applies": APPLIES.get(key, applies) or "all",
                        "comment": comment, "described": DESCRIBED.get(key, "")})
    return out


def problems(table: list[dict[str, str]]) -> list[str]:
    """Keys with no description, with two, and DESCRIBED/APPLIES entries for keys that do not exist."""
    keys = {r["key"] for r in table}
    out = [f"{r['key']}: no comment in ctu/config/fields.py and none in scripts/config_reference.py DESCRIBED"
           for r in table if not r["comment"] and not r["described"]]
    out += [f"{r['key']}: described twice (its comment in fields.py and DESCRIBED); drop the DESCRIBED entry"
            for r in table if r["comment"] and r["described"]]
    out += [f"{k}: in DESCRIBED or APPLIES but not a config key" for k in sorted((set(DESCRIBED) | set(APPLIES)) - keys)]
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(table: list[dict[str, str]]) -> str:
    sections: dict[str, list[dict[str, str]]] = {}
    for r in table:
        sections.setdefault(r["section"], []).append(r)
    lines = [
        "# Config reference", "",
        "[ctu](../README.md) › [docs](README.md) › config", "",
        "<!-- generated by scripts/config_reference.py from ctu/config/fields.py; do not edit by hand -->", "",
        "Every key a config may set, generated from the config's dataclasses: its type, its default, where it "
        "applies (an engine:", "`hf`, `remote`, `vllm`, `served`; a placement: Ray, FSDP2, async; `all`: "
        "everywhere) and what it does. Set a key in the", "YAML (`trainer: {lr: 1.0e-6}`) or on the command line "
        "(`trainer.lr=1e-6`); an unknown key, a wrong type or a value", "out of range is refused before any work, "
        "in one line naming the key ([commands](commands.md)). `ctu train` writes", "the whole resolved config to "
        "`run.dir/config.yaml`.", "",
        "Sections: " + ", ".join(f"[{s}](#{s})" for s in sections) + ".",
    ]
    for name, section in sections.items():
        lines += ["", f"## {name}", "", "| key | type | default | applies to | what it does |", "|---|---|---|---|---|"]
        for r in section:
            text = r["comment"] or r["described"]
            lines.append(f"| `{r['key']}` | `{_cell(r['type'])}` | `{_cell(r['default'])}` | {r['applies']} | "
                         f"{_cell(text)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT))
    table = rows()
    if bad := problems(table):
        print("\n".join(bad), file=sys.stderr)
        return 1
    text = render(table)
    if "--check" in argv:
        if PAGE.read_text(encoding="utf-8") != text:
            print(f"{PAGE.relative_to(ROOT)} is stale: run python scripts/config_reference.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)} ({len(table)} keys)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
