"""Value checks for :mod:`ctu.config.schema`: each problem is one line naming its key.

``config_problems`` holds the checks every command runs when a config is loaded (``ctu.config.schema.validate``);
``training_problems`` what ``ctu train`` additionally needs of the config alone (the warm start's data file is
read by :func:`ctu.train.demos.prepared_samples`). Both return lists of messages; raising is the caller's
business (``ctu.config.schema.validate``, the trainer).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctu.config.derived import max_staleness, weight_sync_mode

if TYPE_CHECKING:
    from ctu.config.fields import ChatAPIBudget, Config

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vllm/config/lora.py: MaxLoRARanks


# The floats that may be ``inf``, and what it means there. Every other float of the config must be finite: NaN
# compares false with every bound (so ``lr: nan`` passed ``lr > 0``) and an infinity is no usable setting.
UNLIMITED = {"trainer.grad_clip": "no gradient clipping"}
SEED_KEYS = ("run.seed", "sampling.seed")
MAX_SEED = 2**32 - 1  # numpy's bound; run.seed is also scaled into per-step seeds that must stay within 64 bits


def nonfinite_problems(node: Any, key: str = "") -> list[str]:
    """Every NaN or infinite float in a config (dataclasses, lists and dicts, walked to the leaves), one line each
    naming its dotted key; ``inf`` passes only at the keys of :data:`UNLIMITED`."""
    if isinstance(node, float):
        if math.isfinite(node) or (node == math.inf and key in UNLIMITED):
            return []
        unlimited = f" or inf ({UNLIMITED[key]})" if key in UNLIMITED else ""
        return [f"{key}: must be a finite number{unlimited}, got {node}"]
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        children = [(f"{key}.{f.name}" if key else f.name, getattr(node, f.name)) for f in dataclasses.fields(node)]
    elif isinstance(node, dict):
        children = [(f"{key}.{k}", v) for k, v in node.items()]
    elif isinstance(node, (list, tuple)):
        children = [(f"{key}[{i}]", v) for i, v in enumerate(node)]
    else:
        return []
    return [problem for child_key, child in children for problem in nonfinite_problems(child, child_key)]


def input_problems(config: Config) -> list[str]:
    """Integers beyond 64 bits (no setting needs one; torch and numpy cannot take one), seeds outside
    ``[0, 2**32 - 1]``, a domain listed twice (its episodes would count twice), a URL port out of range."""
    out = []
    for key in SEED_KEYS:
        section, name = key.split(".")
        value = getattr(getattr(config, section), name)
        if not 0 <= value <= MAX_SEED:
            out.append(f"{key}: must be in [0, {MAX_SEED}], got {_shown(value)}")
    out += [p for p in int_problems(config) if p.split(":")[0] not in SEED_KEYS]
    for i, name in enumerate(config.env.domains):
        if name in config.env.domains[:i]:
            out.append(f"env.domains[{i}]: '{name}' is already env.domains[{config.env.domains.index(name)}]; each "
                       "domain is listed once (env.weights sets how often one is drawn)")
    return out + port_problems(config)


def int_problems(node: Any, key: str = "") -> list[str]:
    """Every integer of a config outside the 64-bit range, one line each naming its dotted key."""
    if isinstance(node, int) and not isinstance(node, bool):
        if -(2**63) <= node < 2**63:
            return []
        return [f"{key}: must be at most {2**63 - 1} (64 bits), got {_shown(node)}"]
    return [p for child_key, child in _children(node, key) for p in int_problems(child, child_key)]


def _shown(value: int) -> str:
    text = str(value)
    return text if len(text) <= 40 else f"an integer of {len(text.lstrip('-'))} digits"


def _children(node: Any, key: str) -> list[tuple[str, Any]]:
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        return [(f"{key}.{f.name}" if key else f.name, getattr(node, f.name)) for f in dataclasses.fields(node)]
    if isinstance(node, dict):
        return [(f"{key}.{k}", v) for k, v in node.items()]
    if isinstance(node, (list, tuple)):
        return [(f"{key}[{i}]", v) for i, v in enumerate(node)]
    return []


def port_problems(config: Config) -> list[str]:
    """A URL whose port is not a number in 0-65535 fails when the first request is made; name its key now."""
    from urllib.parse import urlsplit

    out = []
    for key in URL_KEYS:
        section, name = key.split(".")
        url = getattr(getattr(config, section), name)
        if not url:
            continue
        try:
            urlsplit(url).port  # noqa: B018 - raises ValueError for a bad port
        except ValueError:
            out.append(f"{key}: the port must be a number in 0-65535 (the URL is not shown: it may hold a password)")
    return out


def config_problems(config: Config) -> list[str]:
    """Everything wrong with ``config`` (unknown domains, missing files, out-of-range values), in key order.
    A NaN or infinite float is reported alone: every range check below would pass NaN."""
    problems = nonfinite_problems(config) or input_problems(config)
    if problems:
        return problems
    from ctu.domains import DOMAINS

    for i, name in enumerate(config.env.domains):
        if ":" in name:
            module_name, _, attr = name.partition(":")
            if not module_name or not attr:
                problems.append(f"env.domains[{i}]: '{name}' is not 'package.module:function'")
        elif name not in DOMAINS:
            problems.append(f"env.domains[{i}]: unknown domain '{name}' (known: {', '.join(DOMAINS)}, "
                            "or 'package.module:function')")
    if not config.env.domains:
        problems.append("env.domains: at least one domain is needed")
    if "banking_knowledge" in config.env.domains:
        from ctu.domains.banking_knowledge.retrieval import resolve_variant

        try:
            resolve_variant(config.env.retrieval_variant)
        except ValueError as exc:
            problems.append(f"env.retrieval_variant: {exc}")
    for name, path in config.env.tasks.items():
        if name not in config.env.domains:
            problems.append(f"env.tasks.{name}: not one of env.domains")
        elif not Path(path).is_file():
            problems.append(f"env.tasks.{name}: tasks file {path} does not exist")
    if config.trainer.sft_data is not None and not Path(config.trainer.sft_data).is_file():
        problems.append(f"trainer.sft_data: file {config.trainer.sft_data} does not exist")
    if config.trainer.sft_data is not None and config.trainer.sft_balance:
        problems.append("trainer.sft_balance: balances gold demonstrations by their task; trainer.sft_data (a file) "
                        "has no tasks: set trainer.sft_balance=[]")
    if config.trainer.sft_data is not None and config.trainer.sft_reasons:
        problems.append("trainer.sft_reasons: states reasons in gold demonstrations; trainer.sft_data (a file) is "
                        "used as written: set trainer.sft_reasons=false")
    if config.trainer.sft_data is not None and config.trainer.sft_exclude:
        problems.append("trainer.sft_exclude: selects gold demonstrations; it cannot filter trainer.sft_data (a file): "
                        "set trainer.sft_exclude=[]")
    for name, weight in config.env.weights.items():
        if name not in config.env.domains:
            problems.append(f"env.weights.{name}: not one of env.domains")
        elif weight < 0:
            problems.append(f"env.weights.{name}: must be >= 0")
    for key, weight in config.env.task_weights.items():
        if not weight > 0:
            problems.append(f"env.task_weights.{key}: must be > 0")
    positive = {"env.max_turns": config.env.max_turns, "env.max_errors": config.env.max_errors,
                "sampling.max_tokens": config.sampling.max_tokens, "eval.samples_per_task": config.eval.samples_per_task,
                "eval.concurrency": config.eval.concurrency, "engine.max_batch_size": config.engine.max_batch_size,
                "engine.kv_cache_tokens": config.engine.kv_cache_tokens,
                "env.max_context_tokens": config.env.max_context_tokens,
                **({"engine.max_loras": config.engine.max_loras} if config.engine.max_loras is not None else {})}
    problems += [f"{k}: must be >= 1, got {v}" for k, v in positive.items() if v < 1]
    if not 0 < config.sampling.top_p <= 1:
        problems.append(f"sampling.top_p: must be in (0, 1], got {config.sampling.top_p}")
    if config.sampling.top_k < 0:
        problems.append(f"sampling.top_k: must be >= 0 (0: all tokens), got {config.sampling.top_k}")
    if config.sampling.temperature < 0 or config.eval.temperature < 0:
        problems.append("sampling.temperature / eval.temperature: must be >= 0")
    if not config.engine.timeout > 0:
        problems.append(f"engine.timeout: must be > 0, got {config.engine.timeout}")
    if config.engine.max_retries < 0:
        problems.append(f"engine.max_retries: must be >= 0, got {config.engine.max_retries}")
    if config.engine.kind == "remote" and not config.engine.base_url:
        problems.append("engine.base_url: required when engine.kind is 'remote'")
    problems += served_problems(config)
    t = config.trainer
    train_positive = {"trainer.max_steps": t.max_steps, "trainer.tasks_per_step": t.tasks_per_step,
                      "trainer.samples_per_task": t.samples_per_task, "trainer.mini_batches": t.mini_batches,
                      "trainer.ppo_epochs": t.ppo_epochs, "trainer.micro_batch_tokens": t.micro_batch_tokens,
                      "trainer.logit_chunk_mib": t.logit_chunk_mib,
                      "trainer.ckpt_interval": t.ckpt_interval, "trainer.keep_checkpoints": t.keep_checkpoints}
    problems += [f"{k}: must be >= 1, got {v}" for k, v in train_positive.items() if v < 1]
    episodes = t.tasks_per_step * t.samples_per_task
    if t.mini_batches >= 1 and episodes % t.mini_batches:
        problems.append(f"trainer.mini_batches: {t.mini_batches} does not divide the rollout batch of "
                        f"{episodes} episodes (trainer.tasks_per_step x trainer.samples_per_task)")
    if t.advantage not in ("rloo", "reinforce_pp", "rft", "remax") and t.samples_per_task < 2 and not t.contrast_pairs:
        problems.append("trainer.samples_per_task: group advantages need at least 2 samples per task")
    if t.contrast_pairs:  # a pair is one group, played and scored by the synchronous loop
        if t.advantage not in ("grpo", "dr_grpo", "rloo"):
            problems.append(f"trainer.contrast_pairs: a pair is a group, so it needs a group advantage (grpo, dr_grpo "
                            f"or rloo); trainer.advantage is {t.advantage}")
        if t.tasks_per_step % 2:
            problems.append(f"trainer.tasks_per_step: contrast pairs are two tasks each, so it must be even, "
                            f"got {t.tasks_per_step}")
        clash = {"trainer.max_staleness": t.max_staleness > 0, "trainer.dynamic_sampling": t.dynamic_sampling}
        problems += [f"trainer.contrast_pairs: cannot be combined with {k} (pairs are drawn by the synchronous "
                     "loop)" for k, on in clash.items() if on]
    if t.contrast_pairs_all and not t.contrast_pairs:
        problems.append("trainer.contrast_pairs_all: draws contrast pairs from every task, so it needs "
                        "trainer.contrast_pairs: true")
    if t.baseline_by is not None and t.advantage != "reinforce_pp":
        problems.append(f"trainer.baseline_by: a baseline per class of tasks is reinforce_pp's (batch baseline); "
                        f"trainer.advantage is {t.advantage}")
    if t.advantage == "remax":  # the greedy baseline episodes are played by the synchronous loop only
        clash = {"trainer.max_staleness": t.max_staleness > 0, "trainer.dynamic_sampling": t.dynamic_sampling,
                 "trainer.kl_in_reward": t.kl_in_reward and t.kl_coef > 0}
        problems += [f"trainer.advantage: remax cannot be combined with {k} (its greedy baselines are played by the "
                     "synchronous loop, one per task, with the environment's reward)" for k, on in clash.items() if on]
    if t.lr <= 0:
        problems.append(f"trainer.lr: must be > 0, got {t.lr}")
    if t.sft_replay and not t.sft_replay_advantage > 0:
        problems.append(f"trainer.sft_replay_advantage: must be > 0 (a gold turn is never pushed down), "
                        f"got {t.sft_replay_advantage}")
    if t.resume not in (None, "latest") and not Path(t.resume).is_dir():
        problems.append(f"trainer.resume: '{t.resume}' is neither 'latest' nor a checkpoint directory")
    if config.lora.rank < 1:
        problems.append(f"lora.rank: must be >= 1, got {config.lora.rank}")
    for section in ("user", "judge", "shaping"):
        problems += _budget_problems(section, getattr(config, section))
    problems += _update_problems(config)
    problems += _branch_problems(config)
    problems += _count_problems(config)
    problems += _agent_problems(config)
    problems += url_problems(config)
    return problems


def _branch_problems(config: Config) -> list[str]:
    """Branched rollouts and step credit: forks are played by ctu's own loop on the trainer's engine, now."""
    t = config.trainer
    if t.branch_k < 1:
        return [f"trainer.branch_k: must be >= 1 (1: no branching), got {t.branch_k}"]
    if not t.step_advantage_weight >= 0:
        return [f"trainer.step_advantage_weight: must be >= 0, got {t.step_advantage_weight}"]
    if t.branch_k == 1:
        return []
    clash = {"trainer.max_staleness": (t.max_staleness > 0, "the background producer plays whole episodes"),
             "distributed.rollout_workers": (config.distributed.rollout_workers > 0, "Ray workers play whole episodes"),
             "agent.command": (config.agent.command is not None, "an outside agent's state cannot be copied"),
             "user.kind": (config.user.kind == "llm", "an LLM user's session is not copied"),
             "trainer.advantage": (t.advantage == "remax", "remax's greedy baselines are one per spec")}
    return [f"trainer.branch_k: {t.branch_k} cannot be combined with {k} ({why}): branch in process, synchronously"
            for k, (on, why) in clash.items() if on]


def _count_problems(config: Config) -> list[str]:
    """Counts not checked above: how many tasks to evaluate (null: all; 0 or a negative slice bound would
    evaluate none or silently drop tasks), the scripted user's patience."""
    out = [f"{key}: must be >= 1 (or null for every task), got {value}"
           for key, value in (("eval.max_tasks", config.eval.max_tasks),
                              ("trainer.eval_max_tasks", config.trainer.eval_max_tasks))
           if value is not None and value < 1]
    if config.user.patience < 1:
        out.append(f"user.patience: must be >= 1, got {config.user.patience}")
    return out


def _agent_problems(config: Config) -> list[str]:
    """The ``agent`` section (bring your own agent, docs/agents.md)."""
    a, out = config.agent, []
    if a.concurrency < 1:
        out.append(f"agent.concurrency: must be >= 1, got {a.concurrency}")
    if a.timeout_s <= 0:
        out.append(f"agent.timeout_s: must be > 0, got {a.timeout_s}")
    if a.command is not None and not a.command.strip():
        out.append("agent.command: empty; give the command that runs one episode (or null for ctu's own loop)")
    return out


def _budget_problems(section: str, b: ChatAPIBudget) -> list[str]:
    out = [f"{section}.{k}: must be >= 0, got {v}" for k, v in (("max_retries", b.max_retries),
                                                                 ("backoff_initial", b.backoff_initial)) if v < 0]
    out += [f"{section}.{k}: must be > 0, got {v}" for k, v in (("timeout", b.timeout), ("max_tokens", b.max_tokens))
            if v <= 0]
    if b.backoff_max < b.backoff_initial:
        out.append(f"{section}.backoff_max: must be >= {section}.backoff_initial ({b.backoff_initial}), "
                   f"got {b.backoff_max}")
    return out


def _update_problems(config: Config) -> list[str]:
    """Values that would otherwise fail (or silently misbehave) inside the first update, after a full rollout."""
    t, e, out = config.trainer, config.engine, []
    if not 0 <= t.clip_low < 1:
        out.append(f"trainer.clip_low: must be in [0, 1) (the ratio's lower bound is 1 - clip_low), got {t.clip_low}")
    if t.clip_high < 0:
        out.append(f"trainer.clip_high: must be >= 0, got {t.clip_high}")
    if t.dual_clip is not None and t.dual_clip <= 1:
        out.append(f"trainer.dual_clip: must be > 1 (or null), got {t.dual_clip}")
    if t.tis_cap is not None and not t.tis_cap >= 1:  # a replayed demo's weight is min(1, cap): below 1 it shrinks
        out.append(f"trainer.tis_cap: must be >= 1 (or null): a cap below 1 down-weights every on-policy token and "
                   f"every replayed demonstration, got {t.tis_cap}")
    non_negative = {"trainer.warmup_steps": t.warmup_steps, "trainer.kl_coef": t.kl_coef,
                    "trainer.entropy_coef": t.entropy_coef, "trainer.weight_decay": t.weight_decay,
                    "trainer.sft_steps": t.sft_steps, "trainer.eval_interval": t.eval_interval,
                    "trainer.examples_count": t.examples_count, "trainer.sft_replay": t.sft_replay,
                    "trainer.dynamic_sampling_max_draws": t.dynamic_sampling_max_draws}
    out += [f"{k}: must be >= 0, got {v}" for k, v in non_negative.items() if v < 0]
    positive = {"trainer.grad_clip": t.grad_clip, "trainer.sft_lr": t.sft_lr, "trainer.sft_batch_size": t.sft_batch_size,
                "trainer.examples_interval": t.examples_interval, "lora.alpha": config.lora.alpha,
                "engine.parity_probe_tokens": e.parity_probe_tokens,
                **({"engine.parity_tolerance": e.parity_tolerance} if e.parity_tolerance is not None else {})}
    out += [f"{k}: must be > 0, got {v}" for k, v in positive.items() if v <= 0]
    if not 0 <= config.lora.dropout < 1:
        out.append(f"lora.dropout: must be in [0, 1), got {config.lora.dropout}")
    if not 0 < e.gpu_memory_utilization <= 1:
        out.append(f"engine.gpu_memory_utilization: must be in (0, 1], got {e.gpu_memory_utilization}")
    if config.filters.max_assistant_tokens is not None and config.filters.max_assistant_tokens < 1:
        out.append(f"filters.max_assistant_tokens: must be >= 1 (or null), got {config.filters.max_assistant_tokens}")
    if e.weight_sync == "adapter" and (e.kind not in ("vllm", "served") or not config.lora.enabled):
        out.append("engine.weight_sync: 'adapter' needs engine.kind=vllm or served and lora.enabled=true")
    if e.kind in ("vllm", "served") and config.lora.enabled and weight_sync_mode(config) == "adapter":
        if config.lora.rank not in VLLM_LORA_RANKS:
            out.append(f"lora.rank: vLLM serves LoRA adapters of rank {', '.join(map(str, VLLM_LORA_RANKS))} "
                       f"(its max_lora_rank), got {config.lora.rank}; pick one or use engine.weight_sync=merged")
    d = config.distributed
    out += _async_problems(config)
    if d.rollout_workers < 0:
        out.append(f"distributed.rollout_workers: must be >= 0, got {d.rollout_workers}")
    if d.rollout_workers and (e.kind not in ("hf", "vllm", "served")
                              or (e.kind != "served" and weight_sync_mode(config) != "merged")):
        out.append("distributed.rollout_workers: Ray rollout workers run the hf or vllm engine with merged weights, "
                   "or a served engine (engine.kind=hf or vllm with engine.weight_sync=merged, or engine.kind=served)")
    if d.rollout_workers > 1 and e.kind == "served" and e.base_url:
        out.append(f"distributed.rollout_workers: {d.rollout_workers} workers would each load every version into the "
                   "one server at engine.base_url; use 1 worker, or engine.launch=true (a server per worker)")
    if d.rollout_workers and e.kind == "vllm" and not d.trainer_workers:
        out.append("distributed.rollout_workers: vLLM rollout workers get their GPU from the trainer ranks' placement "
                   "group: set distributed.trainer_workers >= 1")
    if d.trainer_workers < 0:
        out.append(f"distributed.trainer_workers: must be >= 0, got {d.trainer_workers}")
    if d.placement not in ("colocated", "split"):
        out.append(f"distributed.placement: must be colocated or split, got {d.placement!r}")
    for key in ("worker_cpus", "trainer_cpus", "placement_timeout_s", "start_timeout_s"):
        if getattr(d, key) <= 0:
            out.append(f"distributed.{key}: must be > 0, got {getattr(d, key)}")

    return out


def _async_problems(config: Config) -> list[str]:
    """``trainer.max_staleness``: k > 0 runs a background rollout producer beside any placement (in-process hf, vllm
    or served engine, Ray rollout workers, FSDP2 trainer ranks, an agent program); off-policy tokens need a cap."""
    k = config.trainer.max_staleness
    if k < 0:
        return [f"trainer.max_staleness: must be >= 0, got {k}"]
    if config.trainer.inflight != "finish" and config.engine.kind not in ("hf", "served"):
        return [f"trainer.inflight: {config.trainer.inflight} stops a generation call at a weight load, which the hf "
                f"and served engines do; engine.kind={config.engine.kind} finishes its calls first (vLLM's "
                "in-process LLM.generate drives its engine from the calling thread and has no pause to stop it from "
                "the trainer's: trainer.inflight=finish, or engine.kind=served)"]
    if k and config.trainer.tis_cap is None:  # without it one epoch's update is on-policy for the trainer only
        return [f"trainer.tis_cap: trainer.max_staleness={k} trains on tokens sampled by older weights; set a cap "
                "(e.g. trainer.tis_cap=2.0) so the loss weighs each token by min(pi_old / pi_sampler, cap)"]
    return []


def training_problems(config: Config) -> list[str]:
    """What ``ctu train`` cannot do with an otherwise valid config (checked before any model is loaded)."""
    out = []
    if config.engine.kind == "remote":
        out.append("engine.kind: 'remote' cannot be trained: ctu cannot push weights into a remote server, so every "
                   "step after the first would sample from stale weights; use engine.kind=hf or vllm for training "
                   "(remote serves ctu eval)")
    return out


def served_problems(config: Config) -> list[str]:
    """``engine.kind=served``: attach (``engine.base_url``) or launch, and room for every version in use."""
    e, out = config.engine, list[str]()
    host = launch_host(e.launch_args)
    if host is not None and not (host == "localhost" or host == "::1" or host.startswith("127.")):
        out.append(f"engine.launch_args: --host {host[:60]!r} would open the launched vLLM server beyond this machine, "
                   "in dev mode (/pause, /sleep, /collective_rpc: no key guards them); ctu's listens on 127.0.0.1")
    if e.kind != "served":
        return out
    if e.launch == bool(e.base_url):
        out.append("engine.base_url: engine.kind=served attaches to engine.base_url or starts a server "
                   "(engine.launch=true): set exactly one")
    if e.launch_timeout_s <= 0:
        out.append(f"engine.launch_timeout_s: must be > 0, got {e.launch_timeout_s}")
    need = max_staleness(config) + 1
    if e.max_loras is not None and e.max_loras < need:
        out.append(f"engine.max_loras: must be >= trainer.max_staleness + 1 = {need} (every version a step may "
                   f"train on is served at once), got {e.max_loras}")
    return out


def launch_host(args: list[str]) -> str | None:
    """The host a ``--host`` in ``engine.launch_args`` gives the server (the last wins, as in argparse), else None;
    ``--host`` without a value is the empty host (every interface)."""
    host = None
    for i, arg in enumerate(args):
        if arg == "--host":
            host = args[i + 1] if i + 1 < len(args) else ""
        elif arg.startswith("--host="):
            host = arg.split("=", 1)[1]
    return host


URL_KEYS = ("engine.base_url", "user.base_url", "judge.base_url", "shaping.base_url")


def url_problems(config: Config) -> list[str]:
    """Every URL the config gives must be one whose credentials ``ctu.config.redact`` can find: an http(s) URL without
    whitespace whose password holds no raw '/', '?', '#' or '@' (else a URL parser quotes pieces of it back:
    ``Invalid port: 's3cr'``). The message names the key, never the value."""
    from ctu.config.redact import url_problem

    out = []
    for key in URL_KEYS:
        section, name = key.split(".")
        url = getattr(getattr(config, section), name)
        problem = url_problem(url) if url is not None else None
        if problem:
            out.append(f"{key}: {problem}")
    return out
