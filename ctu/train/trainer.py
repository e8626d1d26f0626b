"""``ctu train``: tasks -> rollouts -> rewards -> (shaping) -> advantages -> updates -> sync -> eval.

One metrics record per global step. Evaluation uses the environment's rewards only: shaped
rewards exist as :class:`TrainingRewards`, which evaluation code never takes.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ctu import components as build
from ctu.config import Config, save_config, to_dict
from ctu.env import AgentTurn, Episode, ToolCall
from ctu.evaluate import episode_specs, write_report
from ctu.metrics import distribution, mean
from ctu.rl.advantages import compute_advantages, informative_groups
from ctu.rl.filters import filter_loss_mask, filter_reward, spans_lengths
from ctu.rollout import EpisodeSpec, RolloutLimits, Trajectory, rollout
from ctu.tracking import Tracker
from ctu.train.checkpoint import load_checkpoint, resolve_resume, save_checkpoint
from ctu.train.policy import build_policy, export
from ctu.train.update import Sample, policy_update, sequence_kl, sft_update, to_sample
from ctu.users.scripted import ScriptedUser


@dataclass(frozen=True)
class TrainingRewards:
    """Rewards used for advantages: the env's, filtered, plus the optional judge shaping (training only)."""

    env: tuple[float, ...]
    shaped: tuple[float, ...]


class TaskSampler:
    """Weighted, seeded sampling of training tasks across domains; its state is the data cursor."""

    def __init__(self, domains, weights: Sequence[float], seed: int):
        self.pools = [(d, d.split("train") if "train" in d.splits else list(d.tasks)) for d in domains]
        self.weights = list(weights)
        self.rng = random.Random(seed)

    def sample(self, n: int) -> list[tuple]:
        picks = []
        for _ in range(n):
            domain, tasks = self.rng.choices(self.pools, weights=self.weights)[0]
            picks.append((domain, self.rng.choice(tasks)))
        return picks

    def state(self):
        return self.rng.getstate()

    def set_state(self, state) -> None:
        self.rng.setstate(state)


def _schedule(cfg, total_steps: int):
    def factor(update: int) -> float:
        if cfg.warmup_steps and update < cfg.warmup_steps:
            return (update + 1) / cfg.warmup_steps
        if cfg.schedule == "cosine":
            progress = (update - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps)
            return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        return 1.0
    return factor


def gold_samples(chat, domain, tasks) -> list[Sample]:
    """Token sequences of gold demonstrations (for the supervised warm start), built like rollouts."""
    samples = []
    for task in tasks:
        episode = Episode(domain, task, ScriptedUser().start(domain, task), max_turns=len(task.actions) + 2)
        messages = asyncio.run(episode.reset())
        ids = chat.prompt_ids(messages, domain.openai_tools())
        response, mask = [], []
        final = (f"The order status is {', '.join(task.communicate_info)}." if task.communicate_info
                 else "Done, your request is complete.")
        turns = [AgentTurn(tool_calls=(ToolCall(a.name, dict(a.arguments)),)) for a in task.actions]
        for turn in [*turns, AgentTurn(content=final)]:
            msg = {"role": "assistant", "content": turn.content,
                   "tool_calls": [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                                  for c in turn.tool_calls]}
            generated = chat.encode(chat.render_assistant_text(msg))
            response += generated
            mask += [1] * len(generated)
            result = asyncio.run(episode.step(turn))
            if episode.done:
                break
            observation = chat.observation_ids(result.observations)
            response += observation
            mask += [0] * len(observation)
        samples.append(to_sample(ids, response, mask, [0.0] * len(mask), 0.0))
    return samples


class Trainer:
    def __init__(self, config: Config):
        self.config = config
        self.run_dir = Path(config.run.dir)
        torch.manual_seed(config.run.seed)
        random.seed(config.run.seed)
        self.policy = build_policy(config)
        self.chat = build.build_chat(config, tokenizer=self.policy.tokenizer)
        kind = config.engine.kind
        self.engine = build.build_engine(config, model=self.policy.model if kind == "hf" else None,
                                         tokenizer=self.policy.tokenizer)
        self.shares_model = kind == "hf"
        self.domains = build.build_domains(config)
        self.user = build.build_user(config)
        self.judge = build.build_judge(config)
        self.limits = RolloutLimits(config.env.max_turns, config.env.max_errors, config.env.max_context_tokens)
        self.sampler = TaskSampler(self.domains, [config.env.weights.get(n, 1.0) for n in config.env.domains],
                                   config.run.seed)
        t = config.trainer
        self.optimizer = torch.optim.AdamW(self.policy.trainable_parameters(), lr=t.lr, weight_decay=t.weight_decay)
        total_updates = t.max_steps * t.mini_batches * t.ppo_epochs
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, _schedule(t, total_updates))
        self.step = 0
        self.shaper = None
        if config.shaping.enabled:
            from ctu.train.shaping import JudgeShaper

            self.shaper = JudgeShaper(config.shaping)

    # -- pieces ----------------------------------------------------------------------------
    def _rollout(self, specs: Sequence[EpisodeSpec], temperature: float, seed: int, judge=None) -> list[Trajectory]:
        params = replace(build.sampling_params(self.config, temperature), seed=seed)
        return asyncio.run(rollout(specs, self.chat, self.engine, self.user, params, self.limits, judge=judge,
                                   concurrency=self.config.eval.concurrency,
                                   max_batch_size=self.config.engine.max_batch_size, seed=seed))

    def evaluate(self, tag: str) -> dict:
        specs = episode_specs(self.domains, self.config.eval.splits, self.config.eval.samples_per_task,
                              self.config.trainer.eval_max_tasks)
        started = time.perf_counter()
        trajectories = self._rollout(specs, self.config.eval.temperature, seed=10_000 + self.step, judge=self.judge)
        report = write_report(self.run_dir / "eval" / tag, trajectories)
        out = {f"eval/{scope}/success": s["success_rate"] for scope, s in report.items()}
        print(f"eval {tag} ({len(specs)} episodes, {time.perf_counter() - started:.0f}s): "
              + ", ".join(f"{k}={v:.3f}" for k, v in out.items()), flush=True)
        return out

    def rewards(self, trajectories: Sequence[Trajectory]) -> TrainingRewards:
        f = self.config.filters
        env = tuple(0.0 if t.stop_reason == "error" else filter_reward(
            t.reward, spans_lengths(t.assistant_spans), t.stop_reason,
            max_assistant_tokens=f.max_assistant_tokens, zero_on_length_stop=f.zero_reward_on_length_stop)
            for t in trajectories)
        shaped = env if self.shaper is None else tuple(
            r + b for r, b in zip(env, asyncio.run(self.shaper.bonuses(trajectories)), strict=True))
        return TrainingRewards(env, shaped)

    def sync_weights(self) -> None:
        if not self.shares_model:
            self.engine.update_weights(self.policy.merged_named_tensors())

    # -- the loop --------------------------------------------------------------------------
    def train_step(self) -> dict:
        t = self.config.trainer
        started = time.perf_counter()
        picks = self.sampler.sample(t.tasks_per_step)
        specs = [EpisodeSpec(d, task, s) for d, task in picks for s in range(t.samples_per_task)]
        trajectories = self._rollout(specs, self.config.sampling.temperature, seed=self.config.run.seed * 1_000_003
                                     + self.step * 7919)
        rollout_s = time.perf_counter() - started
        rewards = self.rewards(trajectories)
        groups = [f"{tr.domain}/{tr.task_id}/{i // t.samples_per_task}" for i, tr in enumerate(trajectories)]
        kl_penalties = [0.0] * len(trajectories)
        if t.kl_coef > 0 and t.kl_in_reward:  # KL in the reward: r - kl_coef * KL(episode)
            every = [to_sample(tr.prompt_ids, tr.response_ids, tr.loss_mask, tr.logprobs, 0.0) for tr in trajectories]
            kl_penalties = [t.kl_coef * k for k in sequence_kl(self.policy, every, t, self.config.sampling.temperature)]
            rewards = TrainingRewards(rewards.env, tuple(r - k for r, k in zip(rewards.shaped, kl_penalties, strict=True)))
        advantages = compute_advantages(t.advantage, rewards.shaped, groups)
        keep = [i for i, tr in enumerate(trajectories) if tr.stop_reason != "error"]
        if t.dynamic_sampling:
            informative = set(informative_groups(rewards.shaped, groups))
            keep = [i for i in keep if i in informative]
        mask_length = self.config.filters.mask_length_stop
        samples = [to_sample(trajectories[i].prompt_ids, trajectories[i].response_ids,
                             filter_loss_mask(trajectories[i].loss_mask, trajectories[i].stop_reason,
                                              mask_length_stop=mask_length),
                             trajectories[i].logprobs, float(advantages[i])) for i in keep]
        samples = [s for s in samples if any(s.mask)]
        update_started = time.perf_counter()
        stats = policy_update(self.policy, self.optimizer, self.scheduler, samples, t, self.config.sampling.temperature)
        self.sync_weights()
        tokens = sum(sum(tr.loss_mask) for tr in trajectories)
        scored = [tr for tr in trajectories if tr.stop_reason != "error"]
        metrics = {
            "rollout": {"reward": mean(tr.reward for tr in scored), "success": mean(float(tr.success) for tr in scored),
                        "shaped_reward": mean(rewards.shaped), "kl_penalty": mean(kl_penalties),
                        "errored": len(trajectories) - len(scored),
                        "parse_failure_rate": sum(tr.parse_failures for tr in scored) / max(1, sum(tr.turns for tr in scored)),
                        "turns": mean(tr.turns for tr in scored), "response_tokens": mean(sum(tr.loss_mask) for tr in scored),
                        "stop_reasons": distribution(tr.stop_reason for tr in trajectories),
                        "trained_episodes": len(samples)},
            "per_domain": {d.name: {"reward": mean(tr.reward for tr in scored if tr.domain == d.name),
                                    "success": mean(float(tr.success) for tr in scored if tr.domain == d.name)}
                           for d in self.domains},
            "train": {**stats, "lr": self.scheduler.get_last_lr()[0]},
            "timing": {"rollout_s": rollout_s, "update_s": time.perf_counter() - update_started,
                       "step_s": time.perf_counter() - started,
                       "tokens_per_s": tokens / max(1e-9, time.perf_counter() - started)},
        }
        return {"metrics": metrics, "trajectories": trajectories}

    def warm_start(self) -> float | None:
        t = self.config.trainer
        if t.sft_steps <= 0:
            return None
        demos = [s for d in self.domains for s in gold_samples(
            self.chat, d, d.split("train") if "train" in d.splits else list(d.tasks))]
        optimizer = torch.optim.AdamW(self.policy.trainable_parameters(), lr=t.sft_lr, weight_decay=0.0)
        rng = random.Random(self.config.run.seed)
        loss = 0.0
        from tqdm import tqdm

        bar = tqdm(range(t.sft_steps), desc="warm start (supervised)", unit="step", dynamic_ncols=True)
        for _ in bar:
            batch = rng.sample(demos, min(len(demos), t.sft_batch_size))
            loss = sft_update(self.policy, optimizer, batch, t.micro_batch_tokens)
            bar.set_postfix(loss=f"{loss:.3f}")
        self.sync_weights()
        return loss

    def run(self) -> dict:
        cfg, t = self.config, self.config.trainer
        save_config(cfg, self.run_dir / "config.yaml")
        ckpt_root = self.run_dir / "checkpoints"
        resume_from = resolve_resume(ckpt_root, t.resume)
        if resume_from is not None:
            self.step, extra = load_checkpoint(resume_from, model=self.policy.model, optimizer=self.optimizer,
                                               scheduler=self.scheduler)
            self.sampler.set_state(extra["sampler"])
            self.sync_weights()
            print(f"resumed from {resume_from} (step {self.step})")
        name = f"ctu-{'-'.join(cfg.env.domains)}{'-shaped' if cfg.shaping.enabled else ''}"
        summary: dict = {}
        from tqdm import tqdm

        with Tracker(self.run_dir, config=to_dict(cfg), wandb_enabled=cfg.wandb.enabled and cfg.wandb.mode != "disabled",
                     wandb_project=cfg.wandb.project, wandb_mode=cfg.wandb.mode, run_name=name,
                     resume_step=self.step) as tracker:
            if resume_from is None:
                if t.eval_before_train:  # the base model, before any warm start
                    summary["before"] = self.evaluate("step_0")
                started = time.perf_counter()
                sft = self.warm_start()
                if sft is not None:
                    summary["sft"] = {"steps": t.sft_steps, "loss": sft, "seconds": time.perf_counter() - started}
                    print(f"supervised warm start: {t.sft_steps} steps in {summary['sft']['seconds']:.0f}s, "
                          f"final loss {sft:.3f}")
                    if t.eval_before_train:
                        summary["after_sft"] = self.evaluate("after_sft")
            bar = tqdm(total=t.max_steps, initial=self.step, desc="train", unit="step", dynamic_ncols=True)
            while self.step < t.max_steps:
                self.step += 1
                out = self.train_step()
                metrics = out["metrics"]
                if t.eval_interval and self.step % t.eval_interval == 0 and self.step < t.max_steps:
                    metrics["eval"] = self.evaluate(f"step_{self.step}")
                tracker.log(self.step, metrics)
                if self.step % t.examples_interval == 0:
                    tracker.examples(self.step, [tr.to_json() for tr in out["trajectories"][: t.examples_count]])
                if self.step % t.ckpt_interval == 0 or self.step == t.max_steps:
                    save_checkpoint(ckpt_root, self.step, model=self.policy.model, optimizer=self.optimizer,
                                    scheduler=self.scheduler, extra={"sampler": self.sampler.state()},
                                    keep=t.keep_checkpoints)
                bar.set_postfix(reward=f"{metrics['rollout']['reward']:.2f}", loss=f"{metrics['train']['loss']:.3f}")
                bar.update()
            bar.close()
            summary["after"] = self.evaluate(f"step_{self.step}")
            if t.export:
                summary["export"] = export(self.policy, self.run_dir / "export", cfg.model.path)
                print(f"exported: {summary['export']}")
        from ctu.report import draw_curves

        summary["curves"] = str(draw_curves(self.run_dir))
        return summary

