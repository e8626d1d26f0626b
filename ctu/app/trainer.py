"""``ctu train``: tasks -> rollouts -> rewards -> (shaping) -> advantages -> updates -> sync -> eval.

One metrics record per global step. Evaluation uses the environment's rewards only: shaped
rewards exist as :class:`TrainingRewards`, which evaluation code never takes.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import torch

from ctu.app.async_loop import AsyncRollouts
from ctu.app.evaluate import (
    PHASE_WORDS,
    NothingScored,
    all_errored,
    episode_specs,
    nothing_to_evaluate,
    progress_bar,
    write_report,
)
from ctu.app.resume import prepare_resume, recorded_final
from ctu.app.stop import Interrupted, StopSignals
from ctu.app.sync_loop import TrainingRewards, collect_now, step_credit
from ctu.app.task_sampler import TaskSampler, task_weight  # noqa: F401 - task_weight: imported from here too
from ctu.config.rundir import check_run_dir, mark_run_dir, overwrite_problem, remove_run
from ctu.config.runlock import RunDirLock
from ctu.config.schema import Config, ConfigError, save_config, to_dict, training_problems
from ctu.distributed.group import LocalTrainer, TrainerGroup, sft_batches
from ctu.distributed.pool import RolloutPool
from ctu.distributed.ray_setup import preflight
from ctu.engines.cpu import cpu_threads
from ctu.engines.cpu.host_memory import release_memory
from ctu.observe.metrics import distribution, mean, peak_rss_gib
from ctu.observe.tracking import Tracker, eval_phase, record_eval
from ctu.rl.advantages import scored_advantages
from ctu.rl.filters import filter_loss_mask, filter_reward, spans_lengths
from ctu.rollout import components as build
from ctu.rollout.loop import Branching, EpisodeSpec, Trajectory, warn_prompt_budget
from ctu.rollout.stitch import trajectory_samples
from ctu.train.checkpoint import clean_stale, list_checkpoints, previous_run, resolve_resume
from ctu.train.demos import demo_tasks, prepared_samples, replay_note, replayed_demos, warm_start_samples
from ctu.train.manifest import write_folder
from ctu.train.sync import WeightSync
from ctu.train.update import to_sample


def prepare_run_dir(config: Config) -> None:
    """Refuse a ``run.dir`` that holds another run, unless told to resume it or to overwrite it (which deletes what
    a run wrote there, and only in a folder ctu created: :mod:`ctu.config.rundir`)."""
    run_dir = Path(config.run.dir)
    found = previous_run(run_dir)
    if found is None or config.trainer.resume is not None:
        return
    if not config.run.overwrite:
        raise ConfigError(f"run.dir: {run_dir} holds another run ({found}); continue it with trainer.resume=latest, "
                          "replace it with run.overwrite=true, or choose another run.dir")
    if (problem := overwrite_problem(run_dir)) is not None:  # only in a folder ctu created, only what a run wrote
        raise ConfigError(problem)
    remove_run(run_dir)


def build_trainer_group(config) -> TrainerGroup:
    """In this process (``distributed.trainer_workers=0``, the default) or N FSDP2 ranks as Ray actors."""
    if config.distributed.trainer_workers:
        from ctu.distributed.ray_trainer import RayTrainerGroup

        return RayTrainerGroup(config)
    return LocalTrainer(config)


class Trainer:
    def __init__(self, config: Config):
        for problem in training_problems(config):  # before any model is loaded
            raise ConfigError(problem)
        from ctu.app.plan import check_fits, cuda_hardware

        hardware = cuda_hardware()
        if hardware is not None:  # on CUDA: refuse what cannot fit before loading anything
            check_fits(config, None, hardware[1])  # the run's GPUs (one in process), not all visible ones
        check_run_dir(config.run.dir)  # a folder of its own: never the current one, a home or someone else's files
        self.lock = RunDirLock(config.run.dir).acquire()  # one writer per run.dir, held until run() ends
        try:
            mark_run_dir(config.run.dir)  # a new or empty folder is ctu's (run.overwrite deletes only in such a one)
            self.complete = prepare_resume(config)  # a resumed run's records repaired or refused; None: go on
            if self.complete is None:
                self._setup(config)
        except BaseException:
            self.lock.release()
            raise

    def _setup(self, config: Config) -> None:
        self.config = config
        self.run_dir = Path(config.run.dir)
        torch.manual_seed(config.run.seed)
        random.seed(config.run.seed)
        preflight(config)  # Ray set-ups that cannot work fail here, before any model is loaded
        self.domains = build.build_domains(config)  # task keys that match nothing fail before the model loads
        if why := nothing_to_evaluate(self.domains, config.eval.splits, self._eval_specs()):
            raise ConfigError(why)  # a success rate over 0 episodes: refused before any model
        self.demos = prepared_samples(config, self.domains)  # bad warm-start data: before any model or eval
        prepare_run_dir(config)  # after every check: a refused run leaves run.dir as it was
        self.sampler = TaskSampler(self.domains, [config.env.weights.get(n, 1.0) for n in config.env.domains],
                                   config.run.seed, config.env.task_weights)
        self.sampler.check_class_field(config.trainer.baseline_by)  # trainer.baseline_by names a task field
        if config.trainer.contrast_pairs:
            self.sampler.pairs(0)  # a domain without twins fails here, before any model loads
        if config.trainer.sft_steps > 0 and config.trainer.sft_data is None:
            demo_tasks(self.domains, config.trainer.sft_exclude)
        self.group = build_trainer_group(config)
        print(self.group.precision_note)
        if threads := cpu_threads.note():  # how many threads, and how OpenMP's wait: said once
            print(threads)
        if note := replay_note(config.trainer):  # trainer.sft_replay: demos in every RL update, said once
            print(note)
        self.group.release_memory()  # what building the policy cached, before an engine starts beside it
        self.chat = build.build_chat(config, tokenizer=self.group.tokenizer)
        warn_prompt_budget(self.chat, self.domains, config.env.max_context_tokens)
        self.user = build.build_user(config)
        self.judge = build.build_judge(config)
        self.engine = None
        self.pool: RolloutPool
        if config.distributed.rollout_workers:  # Ray actors, each with its own engine, domains and user
            from ctu.distributed.ray_pool import RayPool

            self.pool = RayPool(config, config.distributed.rollout_workers, config.distributed.address,
                                num_cpus=config.distributed.worker_cpus,
                                placement=getattr(self.group, "rollout_placement", None))
        else:  # this process: an in-process hf engine shares the policy's weights
            from ctu.distributed.async_rollout import engine_model  # async: an engine of its own
            from ctu.distributed.pool import LocalPool

            shared = engine_model(self.group, config) if config.engine.kind == "hf" else None
            self.engine = build.build_engine(config, model=shared, tokenizer=self.group.tokenizer)
            if getattr(self.engine, "decode_copy", None) is not None:  # engine.decode_dtype: bf16 rollouts, said
                print(self.engine.decode_note)  # type: ignore[attr-defined]  # an HFEngine's
            if config.agent.command:  # bring your own agent (docs/agents.md): its program plays each episode
                from ctu.distributed.agent_pool import AgentPool

                self.pool = AgentPool.from_config(config, self.engine, self.chat, self.user, judge=self.judge)
            else:
                self.pool = LocalPool.from_config(config, self.engine, self.chat, self.user, judge=self.judge)
        if config.trainer.max_staleness:  # a background producer beside any pool (docs/async.md)
            from ctu.distributed.async_pool import AsyncPool, sleep_refusal

            if problem := sleep_refusal(self.pool, config.trainer.max_staleness):  # nothing could overlap updates
                self.pool.close()
                self.group.close()
                raise ConfigError(problem)
            self.pool = AsyncPool(self.pool)
        self.sync = WeightSync(config, self.group, self.pool)
        warm = config.trainer.sft_steps > 0 and config.trainer.resume is None
        if warm and (problem := self.sync.base_change_problem("trainer.sft_steps", "the supervised warm start")):
            self.pool.close()  # before any work: a server ctu launched goes too
            self.group.close()
            raise ConfigError(problem)
        self.rebased = False  # the KL reference is the warm-started policy (stored in checkpoints)
        self.step = 0
        self.rollouts = AsyncRollouts.of(self)  # trainer.max_staleness > 0: the background rollout worker, else None
        self.shaper = None
        if config.shaping.enabled:
            from ctu.train.shaping import JudgeShaper

            self.shaper = JudgeShaper(config.shaping)

    @property
    def policy(self):
        """The in-process policy (:class:`~ctu.distributed.group.LocalTrainer` only)."""
        return self.group.policy

    # -- pieces ----------------------------------------------------------------------------
    def _rollout(self, specs: Sequence[EpisodeSpec], temperature: float, seed: int, judge=None,
                 on_done=None, branch: Branching | None = None) -> list[Trajectory]:
        params = replace(build.sampling_params(self.config, temperature), seed=seed)
        if branch is not None and branch.k > 1:  # training rollouts only (trainer.branch_k)
            return self.pool.run_branched(specs, params, seed, branch)
        return self.pool.run(specs, params, seed, judge_enabled=judge is not None, on_done=on_done)

    def _eval_specs(self) -> list[EpisodeSpec]:
        return episode_specs(self.domains, self.config.eval.splits, self.config.eval.samples_per_task,
                             self.config.trainer.eval_max_tasks)

    def evaluate(self, tag: str) -> dict:
        specs = self._eval_specs()
        if why := nothing_to_evaluate(self.domains, self.config.eval.splits, specs):
            raise NothingScored(f"evaluation {tag}: {why}")
        started = time.perf_counter()
        with progress_bar(len(specs), f"eval {tag}") as on_done:
            trajectories = self._rollout(specs, self.config.eval.temperature, seed=10_000 + self.step,
                                         judge=self.judge, on_done=on_done)
        release_memory()
        report = write_report(self.run_dir / "eval" / tag, trajectories)
        phase = eval_phase(tag, self.step, self.config.trainer.max_steps)
        errored = all_errored(trajectories)
        if errored:  # reported, not recorded: a 0.0 in the history would read as a result
            raise NothingScored(f"evaluation {tag} ({PHASE_WORDS.get(phase, phase)}): no episode could be scored: "
                                f"{errored}; trajectories in {self.run_dir / 'eval' / tag}")
        out = {f"eval/{scope}/success": s["success_rate"] for scope, s in report.items()}
        unscored = f"; {report['overall']['errored']} errored, not scored" if report["overall"]["errored"] else ""
        print(f"eval {tag} ({len(specs)} episodes, {time.perf_counter() - started:.0f}s, peak RSS so far "
              f"{peak_rss_gib():.2f} GiB): " + ", ".join(f"{k}={v:.3f}" for k, v in out.items()) + unscored, flush=True)
        record_eval(self.run_dir, tag=tag, phase=phase, step=self.step,
                    success={scope: s["success_rate"] for scope, s in report.items()},
                    seconds=time.perf_counter() - started, episodes=len(specs))
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

    def sync_weights(self) -> dict[str, float]:
        return self.sync.after_update(self.step)

    # -- the loop --------------------------------------------------------------------------
    def collect(self) -> tuple[list[Trajectory], list[str], TrainingRewards, set[str], int]:
        """Rollouts for one step: (trajectories, their group ids, rewards, the groups to train on, extra draws):
        from the background producer (``trainer.max_staleness > 0``) or played now (:mod:`ctu.app.sync_loop`)."""
        return self.rollouts.collect() if self.rollouts is not None else collect_now(self)

    def train_step(self) -> dict:
        t = self.config.trainer
        started = time.perf_counter()
        trajectories, groups, rewards, chosen, draws = self.collect()
        release_memory()
        self._safe_point(f"in step {self.step}, after its rollouts (nothing of the step was written)")
        errored = all_errored(trajectories)
        if errored:  # before the update: an optimizer step on nothing would still decay the weights
            raise NothingScored(f"step {self.step}: nothing to train on: {errored}")
        rollout_s = time.perf_counter() - started
        excluded = [tr.stop_reason == "error" or g not in chosen for tr, g in zip(trajectories, groups, strict=True)]
        update_started = time.perf_counter()
        self._engine_idles()
        self.sync.before_update()  # a colocated engine sleeps from here: the KL scoring below is trainer work too
        work_started = time.perf_counter()  # async: what the engines sample from here overlaps the trainer's work
        kl_penalties = [0.0] * len(trajectories)
        if t.kl_coef > 0 and t.kl_in_reward:  # KL in the reward: r - kl_coef * KL(episode)
            every = [to_sample(tr.prompt_ids, tr.response_ids, tr.loss_mask, tr.logprobs, 0.0) for tr in trajectories]
            kl_penalties = [t.kl_coef * k for k in self.group.kl(every, self.config.sampling.temperature)]
            rewards = replace(rewards, shaped=tuple(r - k for r, k in zip(rewards.shaped, kl_penalties, strict=True)))
        # errored episodes are left out before any baseline is taken
        advantages = scored_advantages(t.advantage, rewards.shaped, groups, excluded, baselines=rewards.baseline,
                                       classes=self.sampler.classes(trajectories, t.baseline_by))
        mask_length = self.config.filters.mask_length_stop
        per_token = step_credit(trajectories, advantages, rewards.shaped, groups, t)
        samples = [to_sample(prompt, response, filter_loss_mask(mask, trajectories[i].stop_reason,
                                                                mask_length_stop=mask_length), logprobs, advantage,
                             per_token.get(i))
                   for i, advantage in sorted(advantages.items())
                   for prompt, response, mask, logprobs in trajectory_samples(trajectories[i])]  # one, or an agent's several
        samples = [s for s in samples if any(s.mask)]
        replay = self.replay_demos()  # trainer.sft_replay: gold demonstrations as successful episodes
        stats = self.group.update(samples + replay, self.config.sampling.temperature,
                                  seed=self.config.run.seed * 1_000_003 + self.step)
        release_memory()
        sync = self.sync_weights()
        sync_s = sync.pop("seconds")
        tokens = sum(sum(tr.loss_mask) for tr in trajectories)
        scored = [tr for tr in trajectories if tr.stop_reason != "error"]
        timing = {"rollout_s": rollout_s, "update_s": time.perf_counter() - update_started, "sync_s": sync_s,
                  "step_s": time.perf_counter() - started, "peak_rss_gib": peak_rss_gib(),
                  "tokens_per_s": tokens / max(1e-9, time.perf_counter() - started)}
        metrics = {
            "rollout": {"reward": mean(tr.reward for tr in scored), "success": mean(float(tr.success) for tr in scored),
                        "shaped_reward": mean(rewards.shaped), "kl_penalty": mean(kl_penalties),
                        "errored": len(trajectories) - len(scored), "episodes": len(trajectories),
                        "parse_failure_rate": sum(tr.parse_failures for tr in scored) / max(1, sum(tr.turns for tr in scored)),
                        "turns": mean(tr.turns for tr in scored), "response_tokens": mean(sum(tr.loss_mask) for tr in scored),
                        "stop_reasons": distribution(tr.stop_reason for tr in trajectories),
                        "trained_episodes": len(samples), "replayed_demos": len(replay), "trained_groups": len({groups[i] for i in advantages}),
                        "dynamic_extra_draws": draws,
                        **({"greedy_reward": mean(b for b in rewards.baseline[::t.samples_per_task] if b is not None)}
                           if rewards.baseline is not None else {})},
            "per_domain": {d.name: {"reward": mean(tr.reward for tr in scored if tr.domain == d.name),
                                    "success": mean(float(tr.success) for tr in scored if tr.domain == d.name)}
                           for d in self.domains},
            "train": stats,
            "sync": sync,
            "timing": timing,
        }
        if self.rollouts is not None:
            metrics["async"] = self.rollouts.step_metrics(timing["step_s"], (work_started, time.perf_counter()))
        return {"metrics": metrics, "trajectories": trajectories}

    def replay_demos(self) -> list:
        """This step's ``trainer.sft_replay`` draw from the warm start's data (seeded by run and step)."""
        t = self.config.trainer
        if t.sft_replay and getattr(self, "replay_pool", None) is None:
            self.replay_pool = warm_start_samples(self.chat, self.domains, t.sft_data,
                                                  self.config.env.max_context_tokens, exclude=t.sft_exclude,
                                                  reasons=t.sft_reasons)
        return replayed_demos(self.replay_pool, t.sft_replay, t.sft_replay_advantage,
                              self.config.run.seed * 1_000_003 + self.step) if t.sft_replay else []

    def _engine_idles(self) -> None:
        """In the synchronous loop nothing generates through an update: the in-process engine frees what the update
        makes stale (the bf16 decode copy's weights, ~270 MB for SmolLM2-135M) and makes it again at its next call."""
        if self.rollouts is None and self.engine is not None:
            self.engine.idle()

    def warm_start(self, demos=None) -> float | None:
        """``trainer.sft_steps`` supervised steps on ``demos`` (default: :func:`warm_start_samples`)."""
        t = self.config.trainer
        if t.sft_steps <= 0:
            return None
        if problem := self.sync.base_change_problem("trainer.sft_steps", "the supervised warm start"):
            raise ConfigError(problem)  # trainer.resume found no checkpoint: the warm start would run
        if demos is None:  # the samples prepared before the model loaded serve the first warm start
            demos, self.demos = self.demos, None
        if demos is None:
            demos = warm_start_samples(self.chat, self.domains, t.sft_data, self.config.env.max_context_tokens,
                                       exclude=t.sft_exclude, balance=t.sft_balance, reasons=t.sft_reasons)
        from tqdm import tqdm

        batches = sft_batches(demos, t.sft_steps, t.sft_batch_size, self.config.run.seed,
                              strata=getattr(demos, "strata", None))
        bar = tqdm(total=t.sft_steps, desc="warm start (supervised)", unit="step", dynamic_ncols=True)

        def on_step(loss: float) -> None:
            bar.set_postfix(loss=f"{loss:.3f}")
            bar.update()

        self._engine_idles()
        self.sync.before_update()  # a colocated engine sleeps through the warm start as through an update
        try:
            loss = self.group.sft(demos, batches, on_step=on_step)  # then the KL reference is the warm-started policy
        finally:
            bar.close()
        self.rebased = self.sync.base_changed = True
        self.sync_weights()
        return loss

    def run(self, stops: StopSignals | None = None) -> dict:
        """The run; SIGINT and SIGTERM stop it at the next safe point (:mod:`ctu.app.stop`) with :class:`Interrupted`.
        ``stops``: handlers the caller installed already (``ctu train`` does, before the model loads)."""
        if self.complete is not None:  # a finished run resumed: nothing new, no second final evaluation
            self.lock.release()
            print(self.complete)
            return {"complete": self.complete}
        self.stops = StopSignals() if stops is None else stops
        try:
            with self.stops if stops is None else nullcontext():
                summary = self._run()
                self._safe_point("at the end, the run complete")  # a signal is never ignored: exit 130/143 still
                return summary
        except NothingScored as exc:  # every episode errored: stop, keeping what was written, and say how to go on
            raise NothingScored(f"{exc}; {self._kept()}") from None
        except Interrupted as exc:
            raise Interrupted(exc.signum, exc.where, self._kept(after="")) from None
        finally:
            try:
                self.pool.close()  # Ray workers (and a cluster the pool started) go away with the run
                self.group.close()
            finally:
                self.lock.release()

    def _kept(self, after: str = "after fixing the cause, ") -> str:
        """Where an interrupted run stands and how to continue it."""
        checkpoints = list_checkpoints(self.run_dir / "checkpoints")
        where = f"from checkpoint {checkpoints[-1].name}" if checkpoints else "from the start: no checkpoint yet"
        return (f"what was written is kept in {self.run_dir}; {after}continue with "
                f"trainer.resume=latest ({where})")

    def _safe_point(self, where: str) -> None:
        """Stop here if SIGINT or SIGTERM came (:meth:`run` installs the handlers; none outside it)."""
        stops = getattr(self, "stops", None)
        if stops is not None:
            stops.check(where)

    def _run(self) -> dict:
        cfg, t = self.config, self.config.trainer
        save_config(cfg, self.run_dir / "config.yaml")
        ckpt_root = self.run_dir / "checkpoints"
        clean_stale(ckpt_root)
        resume_from = resolve_resume(ckpt_root, t.resume, t.max_steps)
        if resume_from is not None:
            self.step, extra, rebased = self.group.load(resume_from)
            if rebased and (problem := self.sync.base_change_problem("trainer.resume", f"{resume_from}'s warm start")):
                raise ConfigError(problem)
            if rebased:
                self.rebased = self.sync.base_changed = True
            self.sampler.set_state(extra["sampler"])
            self.sync_weights()
            print(f"resumed from {resume_from} (step {self.step})")
        name = f"ctu-{'-'.join(cfg.env.domains)}{'-shaped' if cfg.shaping.enabled else ''}"
        summary: dict = {}
        from tqdm import tqdm

        with Tracker(self.run_dir, config=to_dict(cfg), wandb_enabled=cfg.wandb.enabled and cfg.wandb.mode != "disabled",
                     wandb_project=cfg.wandb.project, wandb_mode=cfg.wandb.mode, run_name=name,
                     resume_step=self.step) as tracker:
            self._safe_point("before training")
            if resume_from is None:
                if t.eval_before_train:  # the base model, before any warm start
                    summary["before"] = self.evaluate("step_0")
                started = time.perf_counter()
                sft = self.warm_start()
                if sft is not None:
                    summary["sft"] = {"steps": t.sft_steps, "loss": sft, "seconds": time.perf_counter() - started}
                    print(f"supervised warm start: {t.sft_steps} steps in {summary['sft']['seconds']:.1f}s, "
                          f"final loss {sft:.3f}, peak RSS so far {peak_rss_gib():.2f} GiB")
                    if t.eval_before_train:
                        self._safe_point("after the warm start, before its evaluation")
                        summary["after_sft"] = self.evaluate("after_sft")
            with tqdm(total=t.max_steps, initial=self.step, desc="train", unit="step", dynamic_ncols=True) as bar:
                while self.step < t.max_steps:
                    self._safe_point(f"before step {self.step + 1}")
                    cpu_threads.refresh()  # the CPUs this process may use, read again
                    self.step += 1
                    out = self.train_step()
                    metrics, failed = out["metrics"], None
                    if t.eval_interval and self.step % t.eval_interval == 0 and self.step < t.max_steps:
                        try:
                            metrics.update(self.evaluate(f"step_{self.step}"))  # eval/<scope>/success, as history
                        except NothingScored as exc:  # the step itself trained: record and checkpoint it first
                            failed = exc
                    tracker.log(self.step, metrics)
                    if self.step % t.examples_interval == 0:
                        tracker.examples(self.step, [tr.to_json() for tr in out["trajectories"][: t.examples_count]])
                    if self.step % t.ckpt_interval == 0 or self.step == t.max_steps or failed is not None:
                        self.group.save(ckpt_root, self.step, {"sampler": self.sampler.state()}, t.keep_checkpoints,
                                        with_reference=self.rebased)
                    bar.set_postfix(reward=f"{metrics['rollout']['reward']:.2f}", loss=f"{metrics['train']['loss']:.3f}")
                    bar.update()
                    if failed is not None:
                        raise failed
            self._safe_point("before the final evaluation")
            final = recorded_final(self.run_dir, self.step)  # resumed at the end (to export): evaluated already
            summary["after"] = self.evaluate(f"step_{self.step}") if final is None else final
            if t.export:
                self._safe_point("after the final evaluation, before the export")
                # written beside, then renamed with its manifest: "exported" means complete
                summary["export"] = write_folder(self.run_dir / "export",
                                                 lambda tmp: self.group.export(tmp, cfg.model.path))
                print(f"exported: {summary['export']}")
        from ctu.observe.report import draw_curves

        summary["curves"] = str(draw_curves(self.run_dir))
        return summary

