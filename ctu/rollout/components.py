"""Build the running parts (engine, chat format, user simulator, judge, domains) from a Config."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ctu.config.schema import Config, engines_sleep, weight_sync_mode
from ctu.domains import get_domain
from ctu.domains.base import Domain
from ctu.engines.base import Engine, SamplingParams
from ctu.episode.users.base import UserSimulator

if TYPE_CHECKING:
    from ctu.episode.judge import LLMJudge
    from ctu.episode.llm_api import ChatAPIConfig
    from ctu.rollout.chat import ChatFormat


def build_domains(config: Config) -> list[Domain]:
    """The configured domains; ``env.tasks.<name>`` replaces a domain's tasks (and splits, from the
    ``split_tasks.json`` beside the file) with a tau2 tasks file, e.g. one written by ``ctu data import``."""
    domains = [get_domain(name, config.env.tau2_data_dir, config.env.retrieval_variant) for name in config.env.domains]
    if not config.env.tasks:
        return domains
    import dataclasses

    from ctu.episode.data.prompts import load_tasks

    out = []
    for spec, domain in zip(config.env.domains, domains, strict=True):
        path = config.env.tasks.get(spec)
        if path is not None:
            tasks, splits = load_tasks(path)
            ids = {t.id for t in tasks}
            splits = splits or {}  # without split_tasks.json: split "all" only
            for split, members in splits.items():
                missing = [i for i in members if i not in ids]
                if missing:
                    raise ValueError(f"{path}: split '{split}' names task '{missing[0]}', which the file does not hold")
            domain = dataclasses.replace(domain, tasks=tasks, splits=splits)
        out.append(domain)
    return out


def build_chat(config: Config, tokenizer: Any = None) -> ChatFormat:
    from ctu.engines.hf.models import load_tokenizer
    from ctu.rollout.chat import ChatFormat

    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config.model.path)
    return ChatFormat(tokenizer, template=config.model.template, enable_thinking=config.model.enable_thinking)


def build_engine(config: Config, model: Any = None, tokenizer: Any = None) -> Engine:
    """The configured engine; ``model`` lets the trainer share its in-process policy with the hf engine."""
    from ctu.engines.registry import make_engine

    kind = config.engine.kind
    if kind == "hf":
        return make_engine("hf", model_or_name=model if model is not None else config.model.path,
                           tokenizer=tokenizer, max_batch_size=config.engine.max_batch_size,
                           kv_reuse=config.engine.kv_reuse, kv_cache_tokens=config.engine.kv_cache_tokens,
                           inflight=config.trainer.inflight, decode_dtype=config.engine.decode_dtype)
    if kind == "remote":
        return make_engine("remote", base_url=config.engine.base_url, model=config.model.path,
                           api_key_env=config.engine.api_key_env, timeout=config.engine.timeout,
                           max_retries=config.engine.max_retries)
    if kind == "served":
        from ctu.engines.vllm.served_setup import served_engine

        return served_engine(config)
    import torch

    from ctu.engines.vllm.engine import sleep_level_for, vllm_dtype

    return make_engine("vllm", model_path=config.model.path, dtype=vllm_dtype(config.model.dtype, torch.cuda.is_available()),
                       gpu_memory_utilization=config.engine.gpu_memory_utilization, seed=config.run.seed,
                       max_model_len=config.env.max_context_tokens, enable_lora=weight_sync_mode(config) == "adapter",
                       max_lora_rank=config.lora.rank, lora_alpha=config.lora.alpha, sampling_temperature=config.sampling.temperature,
                       sampling_top_p=config.sampling.top_p, sleep_level=sleep_level_for(weight_sync_mode(config)),
                       enable_sleep_mode=None if engines_sleep(config) else False)  # split engines never sleep


def build_user(config: Config) -> UserSimulator:
    if config.user.kind == "scripted":
        from ctu.episode.users.scripted import ScriptedUser

        return ScriptedUser(patience=config.user.patience)
    from ctu.episode.users.llm import LLMUser, LLMUserConfig

    u = config.user
    return LLMUser(LLMUserConfig(model=u.model, base_url=u.base_url, api_key_env=u.api_key_env, strategy=u.strategy,
                                 temperature=u.temperature, max_tokens=u.max_tokens, max_retries=u.max_retries,
                                 backoff_initial=u.backoff_initial, backoff_max=u.backoff_max, timeout=u.timeout))


def build_judge(config: Config) -> LLMJudge | None:
    """The NL-assertion judge for evaluation, or None (NL_ASSERTION is then reported as skipped)."""
    if not config.judge.enabled:
        return None
    from ctu.episode.judge import LLMJudge

    return LLMJudge(chat_api(config.judge), max_tokens=config.judge.max_tokens)


def chat_api(section: Any) -> ChatAPIConfig:
    """A ChatAPIConfig from a config section with model, base_url, api_key_env and the retry budget."""
    from ctu.episode.llm_api import ChatAPIConfig

    return ChatAPIConfig(model=section.model, base_url=section.base_url, api_key_env=section.api_key_env,
                         max_retries=section.max_retries, backoff_initial=section.backoff_initial,
                         backoff_max=section.backoff_max, timeout=section.timeout)


def sampling_params(config: Config, temperature: float | None = None) -> SamplingParams:
    return SamplingParams(
        temperature=config.sampling.temperature if temperature is None else temperature,
        top_p=config.sampling.top_p, top_k=config.sampling.top_k, max_tokens=config.sampling.max_tokens,
        seed=config.sampling.seed,
    )
