"""In-process transformers engine: batched, KV-cached sampling from token-id prompts.

Prompts are batched (prompt x n rows; their shared prefix, e.g. the system prompt, is prefilled once and
the rest left-padded after it), decoded step by step with the model's KV cache, and sampled with temperature and
top-k/top-p from a seeded generator (:mod:`ctu.engines.hf.sampling`, which also takes each sampled token's logprob,
from the truncated distribution it was drawn from). With ``kv_reuse`` (default) each row's KV cache is kept after
generation, so the next turn of the same conversation runs only its new tokens (:mod:`ctu.engines.hf.kv_reuse`);
without it every prompt is prefilled whole (:func:`ctu.engines.hf.shared_prefix.prefill`). Both give the same tokens
and logprobs up to float rounding.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Iterable, Sequence

import torch

from ctu.engines.base import Completion, Engine, SamplingParams
from ctu.engines.cpu import cpu_share, cpu_threads
from ctu.engines.cpu.host_memory import trim_heap
from ctu.engines.cpu.precision import compute_context
from ctu.engines.hf import kv_reuse as kvr
from ctu.engines.hf.decode_copy import DecodeCopy, resolve_decode_dtype
from ctu.engines.hf.hf_api import cache_of, with_cache
from ctu.engines.hf.kv_buffer import adopt, plain_layers, preallocate, release_layer
from ctu.engines.hf.llama_step import plan, step, supports
from ctu.engines.hf.sampling import sample_next
from ctu.engines.hf.shared_prefix import last_logits, prefill


def _eos_ids(model, tokenizer) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        eos = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, (list, tuple)):
            ids.update(int(e) for e in eos)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids


class HFEngine(Engine):
    """Generation with a Hugging Face causal LM in this process (CPU or CUDA)."""

    def __init__(self, model_or_name, tokenizer=None, device: str | None = None, dtype=None, max_batch_size: int = 64,
                 kv_reuse: bool = True, kv_cache_tokens: int = 32768, inflight: str = "finish",
                 decode_dtype: str = "float32"):
        if isinstance(model_or_name, str):
            from ctu.engines.hf.models import load_model, load_tokenizer

            self.model = load_model(model_or_name, dtype=dtype, device=device)
            tokenizer = tokenizer if tokenizer is not None else load_tokenizer(model_or_name)
        else:
            self.model = model_or_name
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        copy_dtype, self.decode_note = resolve_decode_dtype(decode_dtype, self.device.type)
        self.decode_copy = DecodeCopy(copy_dtype) if copy_dtype is not None else None  # engine.decode_dtype
        self._net = self.model  # what a call's forwards run: the model, or its decode copy
        self.eos_ids = _eos_ids(self.model, tokenizer)
        pad = getattr(tokenizer, "pad_token_id", None) if tokenizer is not None else None
        self.pad_id = int(pad if pad is not None else next(iter(self.eos_ids), 0))
        self._lock = threading.Lock()
        self.kv_reuse = kv_reuse
        self.kv_store = kvr.KVStore(kv_cache_tokens) if kv_reuse else None
        self._weights_seen: int | None = None
        self._released: deque[tuple[int, ...]] = deque()
        self.rows_retired = 0  # rows that left a batch early (finished before the others): not decoded further
        # a weight load during a generation call (trainer.inflight): "finish" waits for the call; "abort" stops its
        # unfinished rows at the next token, loads, and samples them again; "continue" loads, then goes on from
        # the tokens sampled so far (each token stamped with the version that sampled it)
        self.inflight = inflight
        self._loads = threading.Condition()
        self._pending_loads = 0  # update_weights calls waiting for the lock
        self.interrupted_rows = 0  # rows stopped by a load (abort / continue)
        self.decode_steps = 0
        self._share: cpu_share.Share | None = None  # a generation's thread count beside other programs (CPU)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    async def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                       seeds: Sequence[int] | None = None) -> list[list[Completion]]:
        if not prompts:
            return []
        return await asyncio.to_thread(self.generate_sync, prompts, params, seeds)

    def generate_sync(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                      seeds: Sequence[int] | None = None) -> list[list[Completion]]:
        rows = [(i, list(p)) for i, p in enumerate(prompts) for _ in range(params.n)]
        for i, p in rows:
            if not p:
                raise ValueError(f"prompt {i} is empty: generation needs at least one token")
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts")
        generator: torch.Generator | list[torch.Generator] | None = None
        if seeds is not None:  # one generator per row: seeds[i] + j for completion j of prompt i (as vLLM)
            generator = [torch.Generator(device=self.device).manual_seed(int(seeds[i]) + j)
                         for i in range(len(prompts)) for j in range(params.n)]
        elif params.seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(params.seed)
        done: dict[int, Completion] = {}
        sampled: dict[int, tuple[list[int], list[float], list[int]]] = {}  # continue: tokens before a load
        pending = list(range(len(rows)))
        while pending:
            pending = self._generate_rows(rows, pending, params, generator, done, sampled)
            if pending:  # stopped by a load: it goes first, then the rows go on (or start again)
                with self._loads:
                    self._loads.wait_for(lambda: self._pending_loads == 0)
        results: list[list[Completion]] = [[] for _ in prompts]
        for k, (i, _) in enumerate(rows):
            results[i].append(done[k])
        return results

    def _generate_rows(self, rows, pending: list[int], params: SamplingParams, generator, done: dict,
                       sampled: dict) -> list[int]:
        """Generate ``pending`` rows under the lock, in batches; returns the rows a weight load stopped (with every
        batch not yet started), to be generated after it."""
        interruptible = self.inflight in ("abort", "continue")
        with self._lock:
            was_training = self.model.training
            self.model.eval()
            self._share = None
            try:
                self._tidy_cache()
                self._net = self.model  # an outdated decode copy is dropped before the new one is made
                if self.decode_copy is not None:
                    self._net = self.decode_copy.get(self.model, self._weights_version())
                # the trainer's compute dtype when the policy's model is shared; its trainer-pass hook stands aside
                with compute_context(self._net), cpu_share.generating():
                    if self.device.type == "cpu":
                        self._check_sharing()
                        self._share = cpu_threads.generation_share()
                        cpu_threads.own_threads()  # not the count a shared update left
                        cpu_share.pace(self._share)
                    for start in range(0, len(pending), self.max_batch_size):
                        if interruptible and self._pending_loads:
                            return pending[start:]
                        chunk = pending[start:start + self.max_batch_size]
                        before = [sampled.get(k, ([], [], [])) for k in chunk]
                        gens = [generator[k] for k in chunk] if isinstance(generator, list) else generator
                        completions, cut = self._generate_batch(
                            [rows[k][1] + b[0] for k, b in zip(chunk, before, strict=True)], params, gens,
                            [params.max_tokens - len(b[0]) for b in before], interruptible)
                        version = self.weights_version
                        for j, (k, c) in enumerate(zip(chunk, completions, strict=True)):
                            ids, lps, vs = before[j]
                            ids, lps = ids + list(c.token_ids), lps + list(c.logprobs)
                            vs = vs + [-1 if version is None else version] * len(c.token_ids)
                            if j in cut:
                                self.interrupted_rows += 1
                                sampled[k] = (ids, lps, vs) if self.inflight == "continue" else ([], [], [])
                                continue
                            sampled.pop(k, None)
                            mixed = len(set(vs)) > 1  # else one version: its tokens' (a re-sent row's may be older)
                            stamp = min(vs) if vs and (mixed or vs[0] >= 0) else version
                            done[k] = Completion(tuple(ids), tuple(lps), c.finish_reason, stamp,
                                                 tuple(vs) if mixed else None)
                        if cut:
                            return [k for j, k in enumerate(chunk) if j in cut] + pending[start + len(chunk):]
            finally:
                self.model.train(was_training)
                cpu_share.settle(self._share)
                if self.device.type == "cpu":  # the freed KV of this call's batch: its holes back to the OS now
                    trim_heap()
        return []

    def _check_sharing(self) -> None:
        """Once per process, the first time other programs are busy: whether this engine's decode gives the same
        tokens and logprobs with fewer threads, so that generation may share the CPUs
        (:func:`ctu.engines.cpu.cpu_threads.check`, what it runs: :func:`ctu.engines.hf.share_probe.decode_probe`)."""
        if not cpu_threads.due("generation"):  # checked already, or nothing else is busy (yet)
            return
        from ctu.engines.hf.share_probe import decode_probe

        store, steps, share = self.kv_store, self.decode_steps, self._share
        self.kv_store = None  # the probe's prompts are not kept for reuse
        self._share = None  # its decode steps run at the count the check sets, not paced to another
        try:
            line = cpu_threads.check("generation", decode_probe(self))
        finally:
            self.kv_store, self.decode_steps, self._share = store, steps, share
        if line:
            print(line, flush=True)

    @torch.inference_mode()
    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams, generator,
                        budgets: list[int] | None = None, interruptible: bool = False) -> tuple[list[Completion], set[int]]:
        """One batch: its completions, and the rows a pending weight load stopped (``interruptible``) before they
        finished. ``budgets``: each row's token budget (default ``params.max_tokens``)."""
        budgets = budgets if budgets is not None else [params.max_tokens] * len(prompts)
        stop_ids = set(params.stop_token_ids) | self.eos_ids
        out_ids: list[list[int]] = [[] for _ in prompts]
        out_lp: list[list[float]] = [[] for _ in prompts]
        reason: list[str | None] = [None] * len(prompts)
        fed: list[list[int]] = [[] for _ in prompts]  # generated ids run through the model, row by row
        batch = None
        if self.kv_store is not None:
            batch = kvr.plan(self.kv_store, prompts, self._prefix_kv)
            ids, mask, positions, cache = kvr.assemble(batch, self.pad_id, self.device, adopt,
                                                       generate=max(budgets, default=0))
            out = self._net(input_ids=ids, attention_mask=mask, position_ids=positions, **with_cache(cache),
                             use_cache=True, **last_logits(ids))
            logits, past, positions = out.logits[:, -1, :], cache_of(out), positions[:, -1:]
        else:
            logits, past, mask, positions = prefill(self._net, prompts, self.pad_id)
        device = mask.device
        live = list(range(len(prompts)))  # the prompt row of each batch row
        # Finished rows leave the batch (their KV kept first) when no shared generator's draws depend on the
        # batch's shape; with kv_reuse off the engine decodes every row to the batch's end, as it always did.
        prune = batch is not None and (params.temperature == 0 or not isinstance(generator, torch.Generator))
        cut: set[int] = set()
        for row, budget in enumerate(budgets):
            if budget <= 0:
                reason[row] = "length"
        longest = max(budgets, default=0)
        preallocate(past, longest)  # room for every step's KV: written in place, never grown by torch.cat
        # a step without transformers' module calls, the same logits (its layers' weights read once a batch)
        direct = plan(self._net) if supports(self._net, past) else None
        for _ in range(longest):
            if all(r is not None for r in reason):
                break
            gens = [generator[r] for r in live] if isinstance(generator, list) else generator
            tokens, logprobs = sample_next(logits, params, gens)
            for row, tok, lp in zip(live, tokens.tolist(), logprobs.tolist(), strict=True):
                if reason[row] is not None:
                    continue
                out_ids[row].append(tok)
                out_lp[row].append(lp)
                if tok in stop_ids:
                    reason[row] = "stop"
                elif params.stop and self._cut_at_stop_string(out_ids[row], out_lp[row], params.stop):
                    reason[row] = "stop"
                elif len(out_ids[row]) >= budgets[row] < longest:  # a shorter budget (a continued row) ends here;
                    reason[row] = "length"  # the longest ends with the loop, its last token fed as always
            self.decode_steps += 1
            cpu_share.pace(self._share)  # fewer threads while other programs keep the CPUs busy
            if all(r is not None for r in reason):
                break
            if interruptible and self._pending_loads:  # a weight load waits: stop here (trainer.inflight)
                for row in range(len(prompts)):  # a row at its budget is done, not cut (nothing left to sample)
                    if reason[row] is None and len(out_ids[row]) >= budgets[row]:
                        reason[row] = "length"
                cut = {row for row in range(len(prompts)) if reason[row] is None}
                for row in cut:
                    reason[row] = "length"
                break
            finished = [j for j, row in enumerate(live) if reason[row] is not None]
            if prune and finished and 4 * len(finished) >= len(live):  # copying the cache pays off
                for j in finished:
                    self._keep(batch, live[j], past, mask, j, fed, out_ids)
                kept = [j for j in range(len(live)) if reason[live[j]] is None]
                index = torch.tensor(kept, device=device)
                past.batch_select_indices(index)
                mask, positions, tokens = mask[index], positions[index], tokens[index]
                live = [live[j] for j in kept]
                self.rows_retired += len(finished)
            mask = torch.cat([mask, torch.ones((len(live), 1), dtype=mask.dtype, device=device)], dim=-1)
            positions = positions[:, -1:] + 1
            for row, tok in zip(live, tokens.tolist(), strict=True):
                fed[row].append(tok)
            if direct is not None:
                logits = step(self._net, tokens, mask, positions, past, direct)
                continue
            outputs = self._net(input_ids=tokens[:, None], attention_mask=mask, position_ids=positions,
                                 **with_cache(past), use_cache=True)
            past = cache_of(outputs)
            logits = outputs.logits[:, -1, :]
        if batch is not None and self.kv_store is not None:  # the batch's KV goes layer by layer as it is kept
            layers = plain_layers(past)
            if layers is None:  # e.g. sliding-window layers: this model's cache cannot be kept
                self.kv_store = None
            else:
                picks = [(row, j, self._ran(fed[row], out_ids[row])) for j, row in enumerate(live)]
                kvr.keep_rows(self.kv_store, batch, picks, layers, mask, lambda layer: release_layer(past, layer))
            del layers
        version = self.weights_version  # read under the lock: update_weights cannot change it mid-batch
        return [Completion(tuple(ids), tuple(lps), r or "length", version)  # type: ignore[arg-type]  # 'stop' or None
                for ids, lps, r in zip(out_ids, out_lp, reason, strict=True)], cut

    def _prefix_kv(self, ids: tuple[int, ...]) -> kvr.Prefix | None:
        """The KV of a shared prefix (batch 1), or None when the model's cache cannot be reused (sliding windows)."""
        prefix = torch.tensor([list(ids)], device=self.device)
        out = self._net(input_ids=prefix, attention_mask=torch.ones_like(prefix), use_cache=True, **last_logits(prefix))
        layers = plain_layers(cache_of(out))
        return None if layers is None else kvr.Prefix(tuple(ids), layers)

    def _keep(self, batch, row: int, past, mask, j: int, fed, out_ids) -> None:
        """Store prompt row ``row`` (batch row ``j``): the KV of its prompt and of the generated ids it ran."""
        if self.kv_store is None:
            return
        layers = plain_layers(past)
        if layers is None:  # e.g. sliding-window layers: this model's cache cannot be kept; prefill whole prompts
            self.kv_store = None
            return
        kvr.keep_row(self.kv_store, batch, row, [(k[j:j + 1], v[j:j + 1]) for k, v in layers], mask[j],
                     self._ran(fed[row], out_ids[row]))

    @staticmethod
    def _ran(ran: list[int], kept: list[int]) -> list[int]:
        """The generated ids a row ran that are its own: after it stops (or a stop string cut it), the ids it ran
        are not."""
        n = 0
        while n < min(len(ran), len(kept)) and ran[n] == kept[n]:
            n += 1
        return ran[:n]

    def _weights_version(self) -> int:
        """Changes whenever a parameter is replaced or written in place (an optimizer step, a merge, a load)."""
        return hash(tuple((p.data_ptr(), p._version) for p in self.model.parameters()))

    def _tidy_cache(self) -> None:
        """Before a call: drop the caches of released conversations, and all of them if the weights changed."""
        if self.kv_store is None:
            return
        version = self._weights_version()
        if version != self._weights_seen:
            self.kv_store.clear()
            self._weights_seen = version
        while self._released:
            self.kv_store.release(self._released.popleft())

    def release(self, token_ids: Sequence[int]) -> None:
        """The conversation that ended with ``token_ids`` will not continue: its cached KV is dropped now, or at the
        next call while a generation runs (the event loop never waits for one)."""
        if self.kv_store is None:
            return
        self._released.append(tuple(token_ids))
        if self._lock.acquire(blocking=False):
            try:
                self._tidy_cache()
            finally:
                self._lock.release()

    def idle(self) -> None:
        """Free the decode copy's weights and the kept KV now (the next call makes them again from the new weights),
        unless a generation holds the engine."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            if self.decode_copy is not None:
                self.decode_copy.release()
            if self.kv_store is not None:
                self.kv_store.clear()
        finally:
            self._lock.release()

    def _cut_at_stop_string(self, ids: list[int], lps: list[float], stops: Sequence[str]) -> bool:
        """If the decoded text now contains a stop string, keep tokens through the one completing it."""
        if self.tokenizer is None:
            return False
        text = self.tokenizer.decode(ids[-32:], skip_special_tokens=False)
        if not any(s in text for s in stops):
            return False
        for keep in range(1, len(ids) + 1):
            if any(s in self.tokenizer.decode(ids[:keep], skip_special_tokens=False) for s in stops):
                del ids[keep:], lps[keep:]
                return True
        return True

    def fingerprint(self):
        from ctu.engines.checks.fingerprint import of_module

        with self._lock:
            return of_module(self.model)

    def update_weights(self, named_tensors: Iterable[tuple[str, object]], version: int | None = None) -> None:
        """Copy HF-named tensors into the model as they come (one in flight: the stream is never held whole), then
        ``version`` is :attr:`weights_version`. Unknown (e.g. PEFT) names are refused, listed, after the rest is
        loaded; the engine then serves no version (part of what it holds is new)."""
        params = dict(self.model.named_parameters())
        buffers = dict(self.model.named_buffers())
        unknown: list[str] = []
        with self._loads:  # seen by a generation call in flight (trainer.inflight=abort|continue)
            self._pending_loads += 1
        try:
            self._load(named_tensors, params, buffers, unknown, version)
        finally:
            with self._loads:
                self._pending_loads -= 1
                self._loads.notify_all()

    def _load(self, named_tensors, params, buffers, unknown: list[str], version: int | None) -> None:
        loaded = 0
        with self._lock, torch.no_grad():
            for name, tensor in named_tensors:
                target = params.get(name, buffers.get(name))
                if target is None:
                    unknown.append(name)
                    continue
                target.copy_(torch.as_tensor(tensor).to(device=target.device, dtype=target.dtype))
                loaded += 1
                del tensor
            if self.kv_store is not None:
                self.kv_store.clear()
            if unknown:
                if loaded:
                    self.weights_version = None
                shown = ", ".join(unknown[:5]) + (f" (+{len(unknown) - 5} more)" if len(unknown) > 5 else "")
                raise ValueError(f"update_weights got {len(unknown)} name(s) the model does not have: {shown}; "
                                 "send merged Hugging Face names (no base_model.model. / lora_A / base_layer)")
            self.weights_version = version
