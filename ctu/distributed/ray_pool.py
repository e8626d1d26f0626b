"""Rollouts on Ray actors: each worker holds its own engine, the domains, the chat format and the user simulator.

Workers are built from the :class:`~ctu.config.schema.Config` inside the actor (domains and engines are not shipped).
A call's episodes are split into contiguous chunks, one per live worker, sent as ``(domain, task id, sample)``
keys with the chunk's start index: episode ``i`` is seeded ``seed + i`` on any worker (see
:mod:`ctu.distributed.pool`), so the Ray pool samples what the in-process pool samples.

Weights: ``update_weights`` puts the merged tensors in the object store once (``ray.put``, in the compute
dtype, one host copy: :mod:`ctu.distributed.transfer`) and every worker loads that one object. The pool keeps the last reference and version; every ``run`` carries them, and a
worker whose version differs (a restarted one) loads them before it plays anything.

Faults: workers restart (``max_restarts``). A chunk whose worker died is re-run once on the restarted worker;
if that fails too its episodes come back errored (``stop_reason="error"``, with the reason) and the worker is
no longer given episodes. ``ray`` is imported lazily: ``ctu`` imports without it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ctu.distributed.group_play import PLAY, SharedLoop, group_slots, play_on_one_worker
from ctu.distributed.pool import (
    PROBE_PROMPT,
    NamedTensors,
    ResultsEngine,
    RolloutPool,
    RunsCancelled,
    ScoreFn,
    SpecKey,
    contiguous_chunks,
    errored_trajectory,
    limits_of,
    probe_parity,
    rebuild_specs,
    run_chunk,
)
from ctu.distributed.ray_setup import check_room, import_ray, pool_demand, start_ray, wait_started
from ctu.engines.base import SamplingParams
from ctu.rollout.loop import EpisodeSpec, Trajectory

SYNC = "sync"  # the workers' concurrency group for weight loads, probes, version reads and sleep


class RolloutWorker:
    """One rollout worker (the body of a Ray actor; plain Python, so it also runs in-process).

    ``fault_file`` is for fault tests: a file holding a count; while it is positive, each ``run`` decrements it
    and kills this process (``os._exit``) after its first finished episode — a worker dying mid-step.
    """

    def __init__(self, config, fault_file: str | None = None, index: int = 0):
        import torch

        from ctu.engines.hf.models import load_model, load_tokenizer
        from ctu.rollout import components as build

        self.config = config
        self.fault_file = fault_file
        tokenizer = load_tokenizer(config.model.path)
        model = None
        if config.engine.kind == "hf":  # its own copy of the model, in the policy's compute dtype
            dtype = getattr(torch, config.model.dtype) if config.model.dtype != "auto" else None
            model = load_model(config.model.path, dtype=dtype)
        self.engine = build.build_engine(config, model=model, tokenizer=tokenizer)
        self.chat = build.build_chat(config, tokenizer=tokenizer)
        self.user = build.build_user(config)
        self.domains = build.build_domains(config)
        self.limits = limits_of(config)
        self._judge: Any = None
        self.agent = None  # agent.command: this worker's agent pool plays its episodes (docs/agents.md)
        if config.agent.command:
            from ctu.distributed.agent_pool import AgentPool

            self._judge = build.build_judge(config)
            self.agent = AgentPool.from_config(config, self.engine, self.chat, self.user, judge=self._judge,
                                               name=f"w{index}")
        self.version = -1
        self._loading = threading.Lock()  # catch-up (rollout thread) and pushed loads (sync thread): one at a time
        self.groups = SharedLoop(self.engine, self.chat, self.user, self.limits,  # the producer's groups, at once
                                 max_batch_size=config.engine.max_batch_size, concurrency=config.eval.concurrency)
        self.played = 0  # groups played whole here

    def pid(self) -> int:
        return os.getpid()

    def load_weights(self, weights, version: int) -> int:
        """``weights``: :class:`~ctu.distributed.transfer.Packed` (views of the object store's memory, copied once,
        into the engine's parameters) or a mapping of tensors."""
        from ctu.distributed.transfer import Packed, unpack

        with self._loading:
            if version <= self.version:  # a newer version arrived first (a catch-up and a push crossed): keep it
                return self.version
            self.engine.update_weights(unpack(weights) if isinstance(weights, Packed) else weights.items(),
                                       version=version)
            self.version = version
            if self.agent is not None:  # what the agent's episodes are stamped with where the engine stamps none
                self.agent.episodes.version = version
        return version

    def load_adapter(self, adapter, version: int) -> int:
        """A LoRA adapter (PEFT names -> tensors) as version ``version`` (the served engine's hot-load)."""
        with self._loading:
            if version < self.version:  # the same version follows its base weights (after a warm start)
                return self.version
            self.engine.update_adapter(adapter.items(), version)  # type: ignore[attr-defined]
            self.version = version
            if self.agent is not None:
                self.agent.episodes.version = version
        return version

    def weights_version(self) -> int | None:
        """The engine's stamped weight version (what the last completed load was)."""
        return self.engine.weights_version

    def fingerprint(self) -> list | None:
        """The engine's fingerprint of the weights it holds (:mod:`ctu.engines.checks.fingerprint`), as a list."""
        found = self.engine.fingerprint()
        return None if found is None else found.as_list()

    def catch_up(self, weights_box: list | None, version: int) -> None:
        """Load the pool's latest weights if this worker is behind them (a restarted worker starts from the base
        model); never older ones (with asynchronous rollouts a call sent before a push can run after it)."""
        if weights_box is not None and version > self.version:
            import ray

            base, adapter = weights_box  # merged weights (or a LoRA run's base), and the adapter on top of them
            if base is not None and base[1] > self.version:
                self.load_weights(ray.get(base[0]), base[1])
            if adapter is not None:
                self.load_adapter(ray.get(adapter[0]), version)

    def run(self, keys: Sequence[SpecKey], params: SamplingParams, seed: int, start: int, judge_enabled: bool,
            weights_box: list | None, version: int) -> list[Trajectory]:
        """Episodes ``start .. start + len(keys)`` of a call seeded ``seed``; first catch up to ``version``."""
        self.catch_up(weights_box, version)
        if self.agent is not None:  # episode i is seeded seed + i, as the agent pool in the trainer's process does
            return self.agent.run(rebuild_specs(keys, self.domains), params, seed + start, judge_enabled)
        judge = None
        if judge_enabled:
            if self._judge is None:
                from ctu.rollout.components import build_judge

                self._judge = build_judge(self.config)
            judge = self._judge
        on_done = (lambda _trajectory: os._exit(1)) if self._take_fault() else None
        return run_chunk(rebuild_specs(keys, self.domains), self.chat, self.engine, self.user, params, self.limits,
                         seed=seed, start=start, judge=judge, concurrency=self.config.eval.concurrency,
                         max_batch_size=self.config.engine.max_batch_size, on_done=on_done)

    def play_group(self, keys: Sequence[SpecKey], params: SamplingParams, seed: int, weights_box: list | None,
                   version: int) -> list[Trajectory]:
        """One group of the asynchronous producer, beside the others this worker plays: episode i seeded
        seed + i; first catch up to ``version``."""
        self.catch_up(weights_box, version)
        specs = rebuild_specs(keys, self.domains)
        self.played += 1
        if self.agent is not None:  # its calls may overlap
            return self.agent.run(specs, params, seed)
        return self.groups.play(specs, params, seed)

    def groups_played(self) -> int:
        return self.played

    def _take_fault(self) -> bool:
        if not self.fault_file:
            return False
        path = Path(self.fault_file)
        left = int(path.read_text().strip() or 0) if path.exists() else 0
        if left <= 0:
            return False
        path.write_text(str(left - 1))
        return True

    def generate(self, prompts: list[list[int]], params: SamplingParams, weights_box: list | None = None,
                 version: int = -1) -> list:
        self.catch_up(weights_box, version)
        sync = getattr(self.engine, "generate_sync", None)
        if sync is not None:
            return sync(prompts, params)
        import asyncio

        return asyncio.run(self.engine.generate(prompts, params))

    def frees_memory_asleep(self) -> bool:
        return bool(getattr(self.engine, "sleep_mode", False))

    def sleep(self) -> None:
        self.engine.sleep()

    def wake_up(self) -> None:
        self.engine.wake_up()

    def close(self) -> None:
        """Stop what this worker started: an agent pool's proxy (agents still running are stopped by their call),
        a vLLM server its served engine launched."""
        if self.agent is not None:
            self.agent.close()
            self.agent = None
        self.groups.close()
        close = getattr(self.engine, "close", None)
        if close is not None:
            close()


class RayPool(RolloutPool):
    """``num_workers`` :class:`RolloutWorker` Ray actors built from ``config``.

    ``address``: a running cluster to join (``"auto"``); None starts a local one unless Ray is already
    initialised. ``num_cpus``/``num_gpus``: per worker. ``max_restarts``: how often Ray restarts a dead worker;
    ``restart_timeout_s``: how long a rerun waits for the restart.
    ``fault_files``: worker index -> fault file (tests; see :class:`RolloutWorker`).
    ``placement``: ``{"pg", "bundles", "worker_gpu"}`` from :func:`ctu.distributed.ray_setup.placement_bundles`
    (worker k in bundle ``bundles[k]`` of placement group ``pg``); None: anywhere in the cluster, after checking
    the workers fit it. ``start_timeout_s`` (default ``distributed.start_timeout_s``) bounds the wait for every
    worker to start (:mod:`ctu.distributed.ray_setup`).
    """

    def __init__(self, config, num_workers: int, address: str | None = None, *, num_cpus: float = 1,
                 num_gpus: float = 0, max_restarts: int = 2, restart_timeout_s: float = 300.0,
                 fault_files: dict[int, str] | None = None, placement: dict | None = None,
                 start_timeout_s: float | None = None):
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        ray = import_ray()
        bundles, what = pool_demand(num_workers, num_cpus, num_gpus)
        if placement is None and address is None and not ray.is_initialized():
            check_room(ray, bundles, what)  # this machine, before a local cluster is started
        self.started_ray = start_ray(ray, address)  # then close() shuts the cluster it started down
        self.config = config
        self.restart_timeout_s = restart_timeout_s
        self.workers = []
        self.started = False
        self.dead: set[int] = set()  # workers that failed a chunk twice: given no more episodes
        # the newest weights in the object store, as one box: [(merged or base ref, version) or None, (adapter ref,
        # version) or None], and the newest version; set as one (the box is a list: Ray passes refs in it unresolved)
        self.latest: tuple = (None, -1)
        self.reruns = 0  # chunks re-run after a worker died (all calls)
        self.playing: dict[int, int] = {}  # worker -> the producer's groups it plays now (play_group)
        self.playing_lock = threading.Lock()
        self._cancel = threading.Event()  # cancel_runs: every call cancels its chunks and raises
        if start_timeout_s is None:
            start_timeout_s = config.distributed.start_timeout_s
        try:
            if placement is None:  # in a placement group the bundles were checked and reserved by the trainer group
                check_room(ray, bundles, what)
            # weight loads, probes and sleep run in their own thread ("sync"), beside a rollout still running
            # (asynchronous RL): the engine's lock orders them with its generation calls
            # and the producer's groups in theirs ("play", ctu.distributed.group_play), several at once
            remote = ray.remote(concurrency_groups={SYNC: 1, PLAY: group_slots(config)})(RolloutWorker)
            faults = fault_files or {}
            for k in range(num_workers):  # placement: the trainer group's placement group (placement_bundles)
                options: dict[str, Any] = {"num_cpus": num_cpus, "num_gpus": num_gpus, "max_restarts": max_restarts,
                           "max_task_retries": 0}
                if placement is not None:
                    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

                    strategy = PlacementGroupSchedulingStrategy(
                        placement["pg"], placement_group_bundle_index=placement["bundles"][k])
                    options.update(num_gpus=placement["worker_gpu"], scheduling_strategy=strategy)
                self.workers.append(remote.options(**options).remote(config, faults.get(k), k))
            wait_started(ray, [w.pid.remote() for w in self.workers],  # built (model loaded) before the first step
                         [f"rollout worker {k}" for k in range(num_workers)], start_timeout_s)
            self.started = True  # close() asks them to stop what they started (never-started workers: only killed)
        except BaseException:
            self.close()
            raise

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    def live(self) -> list[int]:
        return [k for k in range(len(self.workers)) if k not in self.dead]

    def run(self, specs: Sequence[EpisodeSpec], params: SamplingParams, seed: int,
            judge_enabled: bool = False, on_done=None) -> list[Trajectory]:
        ray = import_ray()
        from ray.exceptions import RayActorError

        keys = [SpecKey.of(s) for s in specs]
        if not keys:
            return []
        live = self.live()
        if not live:
            raise RuntimeError("every rollout worker has died: no worker left to run episodes")
        box, version = self.latest  # one read: the weights and their version together
        chunks = dict(zip(live, contiguous_chunks(len(keys), len(live)), strict=False))
        results: list[Trajectory | None] = [None] * len(keys)

        def submit(k: int):
            a, b = chunks[k]
            return self.workers[k].run.remote(keys[a:b], params, seed, a, judge_enabled, box, version)

        pending = {submit(k): (k, 0) for k in chunks}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
            if not ready:
                if self._cancel.is_set():  # the run is ending: the workers are killed after
                    for left in pending:
                        try:
                            ray.cancel(left)
                        except Exception:  # noqa: BLE001 - a task Ray cannot cancel ends with its worker
                            pass
                    raise RunsCancelled("rollout call cancelled: the run is ending")
                continue
            (ref,) = ready
            k, attempt = pending.pop(ref)
            a, b = chunks[k]
            try:
                results[a:b] = ray.get(ref)
            except RayActorError as exc:
                if attempt == 0 and self._await_restart(k):  # the rerun first loads the latest weights
                    self.reruns += 1
                    pending[submit(k)] = (k, 1)
                    continue
                self.dead.add(k)
                why = "died twice" if attempt else "died and was not restarted"
                reason = f"rollout worker {k} {why} running these episodes: {str(exc).splitlines()[0]}"
                results[a:b] = [errored_trajectory(key, reason) for key in keys[a:b]]
            for trajectory in results[a:b] if on_done is not None else ():  # a chunk at a time
                on_done(trajectory)
        return results  # type: ignore[return-value]

    def play_group(self, specs: Sequence[EpisodeSpec], params: SamplingParams, seed: int) -> list[Trajectory]:
        """One group of the asynchronous producer, whole on one worker (:mod:`ctu.distributed.group_play`)."""
        return play_on_one_worker(self, specs, params, seed)

    def _await_restart(self, k: int) -> bool:
        """Wait until Ray has restarted worker ``k`` (True), or it is dead for good or not back in time (False)."""
        ray = import_ray()
        from ray.exceptions import ActorUnavailableError, RayActorError

        deadline = time.monotonic() + self.restart_timeout_s
        died = 0
        while time.monotonic() < deadline:
            try:
                ray.get(self.workers[k].pid.remote(), timeout=max(1.0, deadline - time.monotonic()))
                return True
            except ActorUnavailableError:  # restarting
                time.sleep(0.2)
            except RayActorError:  # dead: for good once Ray has no restart left (a few tries cover the hand-over)
                died += 1
                if died >= 10:
                    return False
                time.sleep(0.5)
            except ray.exceptions.GetTimeoutError:
                break
        return False

    def update_weights(self, named_tensors: NamedTensors, version: int) -> None:
        """Put the weights in the object store once, in the compute dtype (:mod:`ctu.distributed.transfer`: one
        host copy, out-of-band buffers); weights trainer rank 0 already put (a ``PackedRef``) are passed on as
        they are. Every live worker loads that object. A worker that died meanwhile is skipped here: Ray
        restarts it and its next call loads these weights first."""
        from ctu.distributed.transfer import PackedRef, pack, wire_dtype

        ray = import_ray()
        if isinstance(named_tensors, PackedRef):
            ref = named_tensors.ref
        else:
            ref = ray.put(pack(named_tensors, wire_dtype(self.config)))  # type: ignore[arg-type]
        self.latest = ([(ref, version), None], version)
        self._broadcast("load_weights", ref, version, tolerate_deaths=True)

    def update_adapter(self, named_tensors: NamedTensors, version: int) -> None:
        """The LoRA adapter (small: put as a dict) to every live worker's engine (a served engine's hot-load). A
        restarted worker loads the newest base weights sent (a warm start merged into them), then this."""
        ray = import_ray()
        adapter = {name: tensor.detach().cpu() for name, tensor in named_tensors}  # type: ignore[attr-defined]
        ref = ray.put(adapter)
        box = self.latest[0]
        self.latest = ([None if box is None else box[0], (ref, version)], version)
        self._broadcast("load_adapter", ref, version, tolerate_deaths=True)

    @property
    def version(self) -> int:
        return self.latest[1]

    @property
    def weights_ref(self):
        """The newest merged (or base) weights' object ref; None before any were sent."""
        box = self.latest[0]
        return None if box is None or box[0] is None else box[0][0]

    def parity(self, score_fn: ScoreFn, *, temperature: float = 1.0, tokens: int = 16, seed: int = 0,
               prompt_ids: Sequence[int] = PROBE_PROMPT) -> list[float]:
        """One probe diff per worker, each on the latest weights (workers no longer given episodes: NaN, which
        fails ``check_parity``)."""
        ray = import_ray()
        params = SamplingParams(temperature=temperature, top_p=1.0, max_tokens=tokens, seed=seed)
        live = self.live()
        box, version = self.latest
        refs = [self.workers[k].generate.options(concurrency_group=SYNC).remote([list(prompt_ids)], params, box,
                                                                                 version) for k in live]
        samples = dict(zip(live, ray.get(refs), strict=True))
        out = []
        for k in range(len(self.workers)):
            if k not in samples:
                out.append(float("nan"))
                continue
            engine = ResultsEngine(lambda _prompts, _params, got=samples[k]: got)  # type: ignore[misc]
            out.append(probe_parity(engine, score_fn, prompt_ids, temperature=temperature, tokens=tokens, seed=seed))
        return out

    def versions(self) -> list[int | None]:
        return self._broadcast("weights_version")

    def fingerprints(self) -> list:
        from ctu.engines.checks.fingerprint import Fingerprint

        return [Fingerprint.of(f) for f in self._broadcast("fingerprint")]

    def frees_memory_asleep(self) -> bool:
        return any(self._broadcast("frees_memory_asleep"))

    def cancel_runs(self) -> None:
        self._cancel.set()

    def sleep(self) -> None:
        self._broadcast("sleep")

    def wake_up(self) -> None:
        self._broadcast("wake_up")

    def _broadcast(self, method: str, *args, tolerate_deaths: bool = False) -> list:
        ray = import_ray()
        from ray.exceptions import RayActorError

        refs = [getattr(self.workers[k], method).options(concurrency_group=SYNC).remote(*args) for k in self.live()]
        if not tolerate_deaths:
            return ray.get(refs)
        out = []
        for ref in refs:
            try:
                out.append(ray.get(ref))
            except RayActorError:
                out.append(None)
        return out

    def close(self) -> None:
        ray = import_ray()
        if self.started:  # what each worker started (an agent pool's proxy, a server), then the workers
            try:
                ray.get([w.close.options(concurrency_group=SYNC).remote() for w in self.workers], timeout=30)
            except Exception:  # noqa: BLE001 - a dead or stuck worker is killed below all the same
                pass
        self.started = False
        for worker in self.workers:
            ray.kill(worker, no_restart=True)
        self.workers = []
        self.latest = (None, -1)
        if self.started_ray:
            ray.shutdown()
            self.started_ray = False

