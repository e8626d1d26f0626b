"""The config's fields: one dataclass per section of the YAML, with its defaults and allowed values.

Loading, overrides and checks live in :mod:`ctu.config.schema`, which re-exports these classes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class ModelConfig:
    path: str = "smollm2-135m"
    template: str | None = None  # hermes | compact | a .jinja file; default: the model's own if tool-aware, else hermes
    enable_thinking: bool = False  # Qwen3 thinking blocks
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"


@dataclass
class EngineConfig:
    kind: Literal["hf", "remote", "vllm", "served"] = "hf"
    base_url: str | None = None  # remote, served: the OpenAI-compatible server (served: attach to it)
    # remote, served: the environment variable holding the server's key; empty: none is sent (the user's
    # OPENAI_API_KEY, for the user simulator or judge, never goes to an engine server it was not named for)
    api_key_env: str = ""
    timeout: float = 300.0  # remote, served: seconds per request to the server
    max_retries: int = 4  # remote, served: retries after the first attempt (429, 5xx, timeouts, malformed replies)
    max_batch_size: int = 64
    gpu_memory_utilization: float = 0.5
    # After every weight sync a fixed probe sequence is scored by the engine and by the trainer;
    # the run stops when the largest per-token logprob difference exceeds this.
    parity_tolerance: float | None = None  # null: from the dtypes (ctu.engines.checks.parity.default_parity_tolerance)
    parity_probe_tokens: int = 16
    # vllm: merged HF weights, or the LoRA adapter (new id per version); auto: the adapter for LoRA on vLLM
    # without Ray rollout workers, else merged (see weight_sync_mode)
    weight_sync: Literal["auto", "merged", "adapter"] = "auto"
    colocated: bool = True  # vllm shares the GPU with the trainer: sleep during updates, wake for rollouts
    kv_reuse: bool = True  # hf: keep each episode's KV cache across its turns (false: prefill every prompt whole)
    kv_cache_tokens: int = 32768  # hf: at most this many tokens' KV kept between calls (least recently used dropped)
    # hf on CPU: decode with a bf16 copy of fp32 weights (LoRA merged, remade after each update); auto: where the CPU
    # computes bf16 natively (AVX512-BF16, AMX). Other precision, other sampled tokens (ctu.engines.hf.decode_copy):
    # float32 by default until the presets' results are measured with bf16 decoding on every seed
    decode_dtype: Literal["float32", "bfloat16", "auto"] = "float32"
    # served (docs/served.md): start `python -m vllm.entrypoints.openai.api_server` (else attach to base_url)
    launch: bool = False
    launch_python: str | None = None  # the python that has vLLM; null: this one
    launch_args: list[str] = field(default_factory=list)  # more server flags
    launch_timeout_s: float = 600.0
    max_loras: int | None = None  # served: adapters the server holds (--max-loras); null: trainer staleness + 1
    weights_dir: str | None = None  # served: written here for the server to read (shared path); null: {run.dir}/engine


@dataclass
class SamplingConfig:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # the k most likely tokens only, then top_p (0: all)
    max_tokens: int = 256  # per assistant turn
    seed: int = 0


@dataclass
class ChatAPIBudget:
    """How a chat API (LLM user, judge, shaping judge) is waited for. By default a failing request is retried
    for 40-80 s in all (longer than a local server's restart), then the episode is marked errored."""

    max_retries: int = 8  # retries after the first attempt, on 429, 5xx, timeouts and connection errors
    backoff_initial: float = 1.0  # seconds before the first retry; doubles per retry up to backoff_max, x jitter [0.5, 1)
    backoff_max: float = 16.0  # also caps a server's Retry-After
    timeout: float = 60.0  # seconds per request
    max_tokens: int = 512  # per completion


@dataclass
class UserConfig(ChatAPIBudget):
    kind: Literal["scripted", "llm"] = "scripted"
    model: str = "gpt-4.1-mini"
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    strategy: Literal["llm", "react", "verify", "reflection"] = "llm"
    temperature: float = 0.0
    patience: int = 8  # scripted user: replies before it stops on tau2 tasks


@dataclass
class EnvConfig:
    domains: list[str] = field(default_factory=lambda: ["mini"])
    weights: dict[str, float] = field(default_factory=dict)  # sampling weight per domain (default equal)
    # sampling weight of training tasks by their description: "field" (truthy) or "field=value" -> weight (default 1)
    task_weights: dict[str, float] = field(default_factory=dict)
    tau2_data_dir: str | None = None
    # banking_knowledge's knowledge-base access, one of tau2's offline variants: no_knowledge, full_kb,
    # golden_retrieval, grep_only, bm25 (KB_search), bm25_grep (KB_search and grep)
    retrieval_variant: str = "bm25"
    tasks: dict[str, str] = field(default_factory=dict)  # domain -> a tau2 tasks.json replacing its tasks (ctu data import)
    max_turns: int = 12
    max_errors: int = 5
    max_context_tokens: int = 4096


@dataclass
class FilterConfig:
    max_assistant_tokens: int | None = None  # zero the reward if any single assistant message is longer
    zero_reward_on_length_stop: bool = False
    mask_length_stop: bool = False


@dataclass
class EvalConfig:
    splits: list[str] = field(default_factory=lambda: ["test"])
    samples_per_task: int = 1  # k: pass^k / pass@k for k = 1..samples_per_task
    max_tasks: int | None = None  # per domain and split; None = all
    temperature: float = 0.0
    save_tokens: bool = False
    concurrency: int = 32


@dataclass
class JudgeConfig(ChatAPIBudget):
    enabled: bool = False
    model: str = "gpt-4.1-mini"
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"


@dataclass
class RunConfig:
    dir: str = "runs/default"
    seed: int = 0
    overwrite: bool = False  # train: replace another run's checkpoints/metrics in run.dir (else refused)


@dataclass
class LoraConfig:
    enabled: bool = True
    rank: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj",
                                                                "gate_proj", "up_proj", "down_proj"])


@dataclass
class TrainerConfig:
    max_steps: int = 20
    resume: str | None = None  # "latest" or a checkpoint directory
    tasks_per_step: int = 8
    samples_per_task: int = 4  # GRPO group size n
    lr: float = 1e-5
    warmup_steps: int = 0
    schedule: Literal["constant", "cosine"] = "constant"
    weight_decay: float = 0.05
    grad_clip: float = 0.5  # max gradient norm; .inf: no clipping (the one float that may be inf; see UNLIMITED)
    mini_batches: int = 1  # optimizer updates per rollout batch (per epoch)
    ppo_epochs: int = 1
    micro_batch_tokens: int = 4096  # token budget of one forward/backward pass
    # fp32 logits one lm_head chunk of the trainer's passes may hold (MiB): the update's backward keeps about six
    # such chunks at its peak (ctu plan's "logit chunk"); smaller chunks are the same numbers in more lm_head calls
    logit_chunk_mib: int = 128
    # count the episodes' common prefix (system prompt) once when packing the micro-batches of passes that run it per
    # micro-batch (scoring, FSDP2 ranks; a single process's gradient steps run it once a step and always count it
    # once): more rows a forward, fewer prefix passes, but more attention memory (+1.1 GiB at 1024 tokens)
    pack_shared_prefix: bool = False
    # reinforce_pp: batch baseline; rft: imitate the episodes that reached the full reward (no baseline, no negatives);
    # remax: reward minus that of a greedy episode of the same task (played each step, never trained on)
    advantage: Literal["grpo", "dr_grpo", "rloo", "reinforce_pp", "rft", "remax"] = "grpo"
    baseline_by: str | None = None  # reinforce_pp: the baseline per class of tasks with equal description[field]
    # play each drawn task with its contrast twin (the same request where the state calls for the other outcome,
    # Domain.twin; mini's write requests) as one group: a group advantage then pushes only what tells them apart
    contrast_pairs: bool = False
    # with contrast_pairs: draw from every training task (as without pairs), and play a task without a twin twice
    # as its group (mini's status requests), so the pairs do not starve what has no twin
    contrast_pairs_all: bool = False
    # branched rollouts (docs/refusals.md): after an episode's first tool result (branch_at), branch_k - 1 more
    # continuations of the same tokens, DB and user state; the shared prefix is trained once. 1: no branching
    branch_k: int = 1
    branch_at: Literal["tool_result"] = "tool_result"  # where siblings fork: after the first tool result
    # A = A_episode + w * A_step: w times the step-level advantage among the episodes of a group at the same
    # token-identical state (siblings of a fork, GiGPO's anchor states; ctu.rl.step_advantages). 0: episode only
    step_advantage_weight: float = 0.0
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    loss_aggregation: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"] = "token_mean"
    kl_coef: float = 0.0
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    kl_in_reward: bool = False
    tis_cap: float | None = None  # truncated importance weights for sampler/trainer mismatch
    dynamic_sampling: bool = False
    dynamic_sampling_max_draws: int = 4  # extra rollout rounds to fill tasks_per_step informative groups
    # asynchronous RL (docs/async.md): 0 is the synchronous loop; k > 0 keeps sampling the next steps' groups in a
    # background worker while the trainer updates, and a step trains only on groups sampled at most k versions ago
    max_staleness: int = 0
    # a weight load while a generation call runs: finish it on the old weights, abort its unfinished rows and
    # sample them again on the new ones, or continue them on the new ones (hf engine; docs/async.md)
    inflight: Literal["finish", "abort", "continue"] = "finish"
    entropy_coef: float = 0.0
    gradient_checkpointing: bool = False
    # the trainer's passes (warm start, RL update) autocast to bf16 over the fp32 weights; the in-process engine
    # keeps decoding in model.dtype. auto: bf16 where the device computes it natively (CUDA, CPUs with AVX512-BF16
    # or AMX), fp32 elsewhere (emulated bf16 matmuls on an AVX2 CPU run ~60x slower); printed once at start
    autocast: Literal["auto", "off", "bfloat16"] = "auto"
    sft_steps: int = 0  # supervised warm start on gold demonstrations (train split) before RL
    sft_lr: float = 1e-4
    sft_batch_size: int = 8
    sft_data: str | None = None  # warm start on this OpenAI chat JSONL / sharegpt file instead of gold demos
    # gold demos of the train tasks whose description matches none of these keys (``field`` or ``field=value``,
    # as in env.task_weights); e.g. [refusal]: no demonstration of refusing
    sft_exclude: list[str] = field(default_factory=list)
    # warm-start batches in equal shares across the demos matching each key (first match wins) and the rest; e.g.
    # [kind=status]: half report-only demonstrations, half writes, whatever the data's mix ([]: uniform draws)
    sft_balance: list[str] = field(default_factory=list)
    # gold demonstrations say why before each call their domain gives a reason for (mini: "The order status is
    # pending, so I will cancel it." with the cancel): the decision then follows the stated status
    sft_reasons: bool = False
    # every RL update also trains on this many warm-start demonstrations (drawn anew each step) as successful
    # episodes of advantage sft_replay_advantage: PPO-ptx's supervised term, against forgetting the gold turns
    sft_replay: int = 0
    sft_replay_advantage: float = 1.0
    ckpt_interval: int = 5
    keep_checkpoints: int = 2
    eval_interval: int = 0  # 0: only before (if eval_before_train) and after training
    eval_before_train: bool = True
    eval_max_tasks: int | None = 20
    examples_interval: int = 5
    examples_count: int = 3
    export: bool = True


@dataclass
class WandbConfig:
    enabled: bool = False
    project: str = "ctu"
    mode: Literal["offline", "online", "disabled"] = "offline"


@dataclass
class ShapingConfig(ChatAPIBudget):
    """Judge shaping ("taxonomy feedback"): a bounded bonus/penalty from an LLM judge, in training only."""

    enabled: bool = False
    model: str = "gpt-4.1-mini"
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    max_bonus: float = 0.2


@dataclass
class DistributedConfig:
    """Where rollouts and updates run. 0 workers of a kind: in this process (the default, no Ray needed)."""

    rollout_workers: int = 0  # >0: that many Ray actors, each with its own engine, domains and user simulator
    trainer_workers: int = 0  # >0: that many FSDP2 trainer ranks as Ray actors (ctu/distributed/ray_trainer.py)
    placement: str = "colocated"  # colocated: rollout worker k shares trainer rank k % N's bundle (GPU); split
    address: str | None = None  # join a running Ray cluster ("auto"); None starts a local one
    worker_cpus: float = 1.0  # CPUs each rollout actor reserves
    trainer_cpus: float = 1.0  # CPUs each trainer rank reserves
    cpu_offload: bool = False  # FSDP2 CPUOffloadPolicy: sharded params, grads and optimizer state in CPU memory
    placement_timeout_s: float = 600.0  # how long to wait for the cluster to have room for the placement group
    start_timeout_s: float = 600.0  # how long actors may take to start (model loaded, process group formed)


@dataclass
class AgentConfig:
    """Bring your own agent (docs/agents.md): a program of yours plays each episode through ctu's OpenAI-compatible
    proxy instead of ctu's own loop."""

    command: str | None = None  # run once per episode, e.g. "python examples/byo_agent/agent.py"; null: ctu's loop
    concurrency: int = 8  # agent processes at once
    timeout_s: float = 600.0  # per episode: an agent still running then is stopped and its episode errored
    pass_env: list[str] = field(default_factory=list)  # more of ctu's environment variables the agent gets


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    user: UserConfig = field(default_factory=UserConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    filters: FilterConfig = field(default_factory=FilterConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    run: RunConfig = field(default_factory=RunConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    shaping: ShapingConfig = field(default_factory=ShapingConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)

