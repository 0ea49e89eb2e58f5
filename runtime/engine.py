"""The engine: continuous batching over the KV pool, prefix cache, grammar masks and jump-forward.

One background thread runs `step()` in a loop; callers talk to it through a queue (`submit`,
`abort`) and get `StreamEvent`s back, so an HTTP event loop never waits on model compute.
Each step builds one forward pass holding every running request's new tokens: one token (plus an
optional jump-forward draft) for decoding requests, a chunk of prompt for prefilling ones.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections import defaultdict
from dataclasses import replace
from typing import Any, AsyncIterator, Callable

import torch

from runtime.api import EngineError, GenerateRequest, GenerateResult, StreamEvent
from runtime.attention import make_attention_backend
from runtime.completeness import CompletionGuard
from runtime.detokenizer import IncrementalDetokenizer
from runtime.engine_config import EngineConfig
from runtime.forward_batch import ForwardBatch
from runtime.kv_pool import KVPool, ReqToTokenTable
from runtime.loader import load_tokenizer, read_config, resolve_model_dir
from runtime.model import load_model
from runtime.prefix_cache import BasePrefixCache, NoPrefixCache
from runtime.radix_cache import RadixCache
from runtime.request import Req
from runtime.sampler import apply_token_bitmask, sample_token
from runtime.sampling import SamplingParams
from runtime.scheduler import SHARED_PREFIX_WAIT_TOKENS, SchedulePolicy, common_prefix_len

log = logging.getLogger("jumpgate.engine")

JUMP_FORWARD_MODES = ("verify", "direct", "off")
# Long decodes hand their KV to the prefix cache every this many tokens, so a request arriving
# mid-way (a retry, a fork) reuses it.
CACHE_PROGRESS_EVERY = 128
# Strict requests: choices re-drawn at most this often when they would overrun the budget
# (then the shortest completion path's next token is taken).
MAX_VETTED_CHOICES = 8


CUDA_KV_FRACTION = 0.85  # of the device memory free once the weights are loaded
CUDA_RESERVE_BYTES = 2 << 30  # activations, logits, CUDA-graph pools


def default_pool_tokens(bytes_per_token: int, device: torch.device) -> int:
    """KV pool size when none is given. CUDA: most of the device memory left after the weights
    (as SGLang's static memory fraction does). CPU: 15% of available host memory, within
    4k..64k tokens (the CPU attention gathers each request's K/V, so a bigger pool buys little)."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        budget = free * CUDA_KV_FRACTION - CUDA_RESERVE_BYTES
        return int(max(4096, budget // bytes_per_token))
    try:
        with open("/proc/meminfo") as f:
            avail_kb = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable"))
        budget = avail_kb * 1024 * 0.15
    except (OSError, StopIteration):
        budget = 2 << 30
    return int(max(4096, min(65536, budget // bytes_per_token)))


class Engine:
    def __init__(self, config: EngineConfig | None = None, **overrides: Any):
        cfg = replace(config or EngineConfig(), **overrides)
        if cfg.jump_forward not in JUMP_FORWARD_MODES:
            raise ValueError(f"jump_forward: must be one of {', '.join(JUMP_FORWARD_MODES)}")
        self.config = cfg
        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        self.device = torch.device("cuda" if cfg.device == "auto" and torch.cuda.is_available() else
                                   ("cpu" if cfg.device == "auto" else cfg.device))
        dtype_name = cfg.dtype if cfg.dtype != "auto" else ("bfloat16" if self.device.type == "cuda" else "float32")
        self.dtype = getattr(torch, dtype_name)

        self.model_dir = resolve_model_dir(cfg.model)
        self.model_config = mc = read_config(self.model_dir)
        self.model_name = _model_name(cfg.model, self.model_dir)
        self.tokenizer = load_tokenizer(self.model_dir)
        self.model = load_model(self.model_dir, mc, cfg.weights, self.device, self.dtype)

        bpt = KVPool.bytes_per_token(mc.num_layers, mc.num_kv_heads, mc.head_dim, self.dtype)
        self.kv_pool_tokens = cfg.kv_pool_tokens or default_pool_tokens(bpt, self.device)
        self.kv = KVPool(mc.num_layers, self.kv_pool_tokens, mc.num_kv_heads, mc.head_dim, self.dtype, self.device)
        self.max_context = min(cfg.max_context or mc.max_position_embeddings, mc.max_position_embeddings)
        self.req_table = ReqToTokenTable(cfg.max_running_requests, self.max_context + cfg.max_jump_forward_tokens + 2)
        self.cache: BasePrefixCache = (
            RadixCache(self.kv.allocator, page_size=cfg.page_size) if cfg.radix_cache else NoPrefixCache(self.kv.allocator)
        )
        if cfg.disk_cache_dir and not cfg.host_pool_tokens:
            raise ValueError("disk_cache_dir needs the host tier: set host_pool_tokens > 0")
        if cfg.radix_cache and cfg.host_pool_tokens > 0:
            from runtime.hiradix_cache import build_hiradix_cache

            self.cache = build_hiradix_cache(cfg, self.kv, self.model_dir)
        self._pins: dict[tuple[str, str], tuple[Any, int]] = {}  # (namespace, name) -> (locked node, tokens)
        self.attn = make_attention_backend(cfg.attention_backend, self.device)
        self.cuda_graphs = None  # decode passes replayed from CUDA graphs (CUDA + triton only)
        if cfg.cuda_graphs and self.device.type == "cuda" and self.attn.name == "triton":
            from runtime.cuda_graphs import DecodeCudaGraphs

            self.cuda_graphs = DecodeCudaGraphs(self.model, self.kv, cfg.max_running_requests,
                                                self.req_table.table.shape[1])
        self.policy = SchedulePolicy(cfg.schedule_policy, seed=cfg.seed)
        eos = set(mc.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos_ids = eos

        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.counters: dict[str, float] = defaultdict(float)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._queued = 0  # submitted, not yet admitted or finished
        # Submitted and not finished. Bounded by max_running + max_waiting, so that a burst on an idle
        # engine is not refused before the loop had a chance to admit it, while the queue that
        # actually waits stays bounded by max_waiting once every running row is taken.
        self._unfinished = 0
        self._queued_lock = threading.Lock()

    # ------------------------------------------------------------------ client interface

    def start(self) -> "Engine":
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="jumpgate-engine", daemon=True)
            self._thread.start()
        return self

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    def shutdown(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        self.cache.close()

    def __enter__(self) -> "Engine":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def submit(self, spec: GenerateRequest) -> AsyncIterator[StreamEvent]:
        """Queue a request from async code; iterate the result for its events. Refusals raise
        EngineError here, before anything is queued. Leaving the iteration early aborts."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[StreamEvent] = asyncio.Queue()

        def emit(ev: StreamEvent) -> None:
            try:
                loop.call_soon_threadsafe(events.put_nowait, ev)
            except RuntimeError:  # the caller's loop is gone: nobody is listening
                self.abort(ev.rid)

        self._enqueue(spec, emit)
        return self._events(spec.rid, events)

    async def _events(self, rid: str, events: asyncio.Queue) -> AsyncIterator[StreamEvent]:
        done = False
        try:
            while not done:
                ev = await events.get()
                done = ev.finished
                yield ev
        finally:
            if not done:  # the consumer stopped listening (client disconnect): free its KV now
                self.abort(rid)

    def abort(self, rid: str) -> None:
        self._inbox.put(("abort", rid))
        self._wake.set()

    def generate(self, prompt: str | list[int], sampling=None, **fields: Any) -> GenerateResult:
        """Blocking convenience for library users and tests: one request, whole result."""
        ids = prompt if isinstance(prompt, list) else self.tokenizer.encode(prompt, add_special_tokens=False)
        kwargs = {"sampling": sampling} if sampling is not None else {}
        return self.generate_many([GenerateRequest(prompt_ids=ids, **kwargs, **fields)])[0]

    def generate_many(self, specs: list[GenerateRequest], timeout: float | None = None) -> list[GenerateResult]:
        """Submit all at once (so they batch), wait for all."""
        self.start()
        results: dict[str, GenerateResult] = {}
        parts: dict[str, list[StreamEvent]] = defaultdict(list)
        done = threading.Semaphore(0)

        def make_emit(rid):
            def emit(ev: StreamEvent) -> None:
                parts[rid].append(ev)
                if ev.finished:
                    done.release()
            return emit

        for spec in specs:
            self._enqueue(spec, make_emit(spec.rid))
        for _ in specs:
            if not done.acquire(timeout=timeout):
                raise TimeoutError("generate_many: timed out")
        for spec in specs:
            evs = parts[spec.rid]
            last = evs[-1]
            if last.finish_reason == "error":
                raise EngineError(last.error or "engine error", code="engine_error")
            results[spec.rid] = GenerateResult(
                rid=spec.rid, text="".join(e.text for e in evs), token_ids=[t for e in evs for t in e.token_ids],
                finish_reason=last.finish_reason, prompt_tokens=last.prompt_tokens,
                cached_tokens=last.cached_tokens, completion_tokens=last.completion_tokens,
            )
        return [results[s.rid] for s in specs]

    def stats(self) -> dict[str, Any]:
        a = self.kv.allocator
        tree = self.cache.total_size
        out = dict(self.counters)
        out.update(
            running_requests=len(self.running), waiting_requests=self._queued,
            kv_slots_total=a.num_slots, kv_slots_free=a.num_free, kv_slots_tree=tree,
            kv_slots_evictable=self.cache.evictable_size,
            kv_slots_request_only=a.num_slots - a.num_free - tree,
            evicted_tokens=getattr(self.cache, "evicted_tokens", 0),
        )
        out.update(self.cache.tier_stats())
        return out

    def explain_prefix(self, prompt_ids: list[int], namespace: str = "") -> dict[str, Any]:
        """Cached length of `prompt_ids` per tier, computed on the engine thread (the tree is
        only ever touched there)."""
        tiers = self.call(lambda: self.cache.tier_lengths(prompt_ids, namespace)).result(timeout=30)
        return {"prompt_tokens": len(prompt_ids), "cached_tokens": sum(tiers.values()), "tiers": tiers}

    def pin_prefix(self, token_ids: list[int], namespace: str = "", name: str | None = None) -> int:
        """Prefill `token_ids` and keep their KV resident in L1 until `unpin_prefix` (a schema's
        system prompt + schema text). Returns the pinned length (whole cache pages). Refused with
        EngineError(code="pin_budget_exceeded") beyond `pin_budget_tokens` in all."""
        ids = list(token_ids)
        pin_key = (namespace, name or _ids_name(ids))
        budget = self.config.pin_budget_tokens

        def check() -> int | None:
            if pin_key in self._pins:
                return self._pins[pin_key][1]
            if not self.config.radix_cache:
                raise EngineError("pinning needs the prefix cache (radix_cache is off)", code="pinning_unavailable")
            used = sum(n for _, n in self._pins.values())
            if used + len(ids) > budget:
                raise EngineError(
                    f"pinning {len(ids)} tokens would exceed the pin budget: {used} of {budget} tokens are "
                    "pinned already" + ("" if budget else " (pinning is off: set pin_budget_tokens)"),
                    code="pin_budget_exceeded", param="pin")
            return None

        pinned = self.call(check).result(timeout=60)
        if pinned is not None:
            return pinned
        self.generate(ids, SamplingParams(max_new_tokens=1, temperature=0.0), namespace=namespace)

        def lock() -> int:
            again = check()  # a concurrent pin may have used the budget meanwhile
            if again is not None:
                return again
            m = self.cache.match_prefix(ids, namespace)
            self.cache.lock(m.node)
            self._pins[pin_key] = (m.node, m.length)
            return m.length

        return self.call(lock).result(timeout=60)

    def unpin_prefix(self, token_ids: list[int] | None = None, namespace: str = "", name: str | None = None) -> int:
        """Release a pin made by `pin_prefix` (by the same name, or the same token ids); returns
        the tokens released (0 if nothing was pinned under that key)."""
        pin_key = (namespace, name or _ids_name(list(token_ids or [])))

        def release() -> int:
            node, n = self._pins.pop(pin_key, (None, 0))
            if node is not None:
                self.cache.unlock(node)
            return n

        return self.call(release).result(timeout=60)

    def flush_cache(self) -> None:
        """Drop every unlocked prefix from the cache and zero the counters (benchmarks, admin)."""
        def flush():
            self.cache.evict(self.cache.evictable_size)
            self.counters.clear()
        self.call(flush).result(timeout=60)

    def call(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        """Run `fn` on the engine thread between steps (or here, if the engine is not running)."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        if self._thread is None:
            fut.set_result(fn())
            return fut
        self._inbox.put(("call", (fn, fut)))
        self._wake.set()
        return fut

    # ------------------------------------------------------------------ intake

    def _enqueue(self, spec: GenerateRequest, emit: Callable[[StreamEvent], None]) -> None:
        spec = self._validated(spec)
        with self._queued_lock:
            if self._unfinished >= self.config.max_running_requests + self.config.max_waiting_requests:
                raise EngineError("server overloaded: the waiting queue is full; retry later", code="overloaded")
            self._queued += 1
            self._unfinished += 1
        self._inbox.put(("add", (spec, emit)))
        self._wake.set()

    def _validated(self, spec: GenerateRequest) -> GenerateRequest:
        n = len(spec.prompt_ids)
        if n == 0:
            raise EngineError("prompt is empty", param="messages")
        try:
            spec.sampling.validate()
        except ValueError as e:
            field, _, why = str(e).partition(":")
            raise EngineError(str(e), param=field.strip()) from e
        limit = min(self.max_context, self.kv_pool_tokens)
        if n >= limit:
            where = "context length" if self.max_context <= self.kv_pool_tokens else "KV pool size"
            raise EngineError(
                f"prompt is {n} tokens, over the {where} of {limit} tokens (one more is needed to answer)",
                code="context_length_exceeded", param="messages",
            )
        if spec.jump_forward is not None and spec.jump_forward not in JUMP_FORWARD_MODES:
            raise EngineError(f"jump_forward: must be one of {', '.join(JUMP_FORWARD_MODES)}", param="jump_forward")
        if not all(0 <= t < self.model_config.vocab_size for t in spec.prompt_ids):
            raise EngineError("prompt holds token ids outside the vocabulary", param="prompt")
        # The output may use whatever room the context leaves.
        max_new = min(spec.sampling.max_new_tokens, limit - n)
        if spec.strict and spec.constraint is not None and hasattr(spec.constraint, "min_completion_tokens"):
            need = spec.constraint.min_completion_tokens()
            if need is not None and max_new < need:
                raise EngineError(
                    f"max_tokens is {max_new}, but the smallest output the schema allows needs {need} tokens; "
                    f"raise max_tokens to at least {need}", param="max_tokens",
                )
        return replace(spec, sampling=replace(spec.sampling, max_new_tokens=max_new))

    def _new_req(self, spec: GenerateRequest, emit) -> Req:
        gen = None
        if not spec.sampling.greedy:
            gen = torch.Generator().manual_seed(spec.sampling.seed if spec.sampling.seed is not None
                                                else int(torch.randint(0, 2**62, (1,))))
        matcher = spec.constraint.new_matcher() if spec.constraint is not None else None
        guard = None
        if matcher is not None and spec.strict and hasattr(matcher, "completion_bound"):
            guard = CompletionGuard(loop_breaking=self.config.loop_breaking)
        return Req(
            spec=spec, emit=emit, detok=IncrementalDetokenizer(self.tokenizer, spec.sampling.stop),
            matcher=matcher, guard=guard,
            jump_forward=(spec.jump_forward or self.config.jump_forward) if spec.constraint is not None else "off",
            generator=gen,
        )

    # ------------------------------------------------------------------ loop

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._drain_inbox()
            except Exception:  # the thread must outlive any one bad item
                log.exception("engine intake failed")
            if not self.waiting and not self.running:
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            try:
                self.step()
            except Exception as e:  # never leave callers hanging: fail what was in flight, keep serving
                log.exception("engine step failed")
                for r in list(self.running) + list(self.waiting):
                    self._finish(r, "error", error=f"engine error: {e}")
        for r in list(self.running) + list(self.waiting):
            self._finish(r, "error", error="engine stopped")
        self._drain_inbox(stopping=True)

    def _drain_inbox(self, stopping: bool = False) -> None:
        while True:
            try:
                kind, item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                spec, emit = item
                try:
                    req = self._new_req(spec, emit)
                except Exception as e:  # e.g. the constraint's new_matcher raised: fail this request only
                    log.exception("setting up request %s failed", spec.rid)
                    with self._queued_lock:
                        self._queued -= 1
                        self._unfinished -= 1
                    emit(StreamEvent(rid=spec.rid, finished=True, finish_reason="error",
                                     prompt_tokens=len(spec.prompt_ids), error=f"engine error: {e}"))
                    continue
                if stopping:
                    self._finish(req, "error", error="engine stopped")
                else:
                    self.waiting.append(req)
                    self.cache.prefetch(req.all_ids()[:-1], req.namespace)
            elif kind == "abort":
                for r in self.running + self.waiting:
                    if r.rid == item:
                        self._finish(r, "abort")
            elif kind == "call":
                fn, fut = item
                try:
                    fut.set_result(fn())
                except Exception as e:  # delivered to the caller
                    fut.set_exception(e)

    # ------------------------------------------------------------------ one step

    def step(self) -> None:
        t_step = time.perf_counter()
        budget = self.config.chunked_prefill_tokens
        plan: list[tuple[Req, int]] = []  # (request, new tokens this pass)

        decoding = [r for r in self.running if not r.in_prefill]
        if not self._ensure_free(sum(len(r.pending_ids()) for r in decoding)):
            for r in decoding:  # drafts are optional: drop them before retracting anyone
                r.draft = []
        while decoding and not self._ensure_free(sum(len(r.pending_ids()) for r in decoding)):
            if not self._retract_one(decoding):
                break
            decoding = [r for r in self.running if not r.in_prefill]
        for r in decoding:
            plan.append((r, len(r.pending_ids())))
        reserved = sum(n for _, n in plan)

        prefilling = [r for r in self.running if r.in_prefill]
        for r in prefilling:
            n = min(budget, len(r.pending_ids()))
            if n <= 0 or not self._ensure_free(reserved + n):
                break
            plan.append((r, n))
            reserved += n
            budget -= n
        if self.waiting and budget > 0:
            budget, reserved = self._admit(plan, budget, reserved)
        if not plan:
            if self.waiting and not self.running:
                # Nothing runs and nothing fits: the head request can never be served.
                self._finish(self.waiting[0], "error", error="request does not fit the KV pool")
            return
        self._run(plan)
        self.counters["engine_time_s"] += time.perf_counter() - t_step
        if self.config.debug_invariants:
            self.check_invariant()

    def _admit(self, plan: list[tuple[Req, int]], budget: int, reserved: int) -> tuple[int, int]:
        t0 = time.perf_counter()
        order = self.policy.order(self.waiting, lambda r: self.cache.prefix_match_length(r.all_ids()[:-1], r.namespace))
        in_prefill = [r for r, _ in plan if r.in_prefill]
        for r in order:
            if budget <= 0 or self.req_table.num_free_rows == 0:
                break
            if self.running and self.cache.loading(r.all_ids()[:-1], r.namespace):
                continue  # its prefix is being read from disk: admit it once the pages are in memory
            m = self.cache.match_prefix(r.all_ids()[:-1], r.namespace)
            # Another request is prefilling the same long prefix: wait a step and hit the cache.
            if any(p.namespace == r.namespace and
                   common_prefix_len(p.prompt_ids, r.prompt_ids) >= m.length + SHARED_PREFIX_WAIT_TOKENS
                   for p in in_prefill):
                continue
            self.cache.lock(m.node)
            pending = r.seq_len - m.length
            n = min(budget, pending)
            if not self._ensure_free(reserved + n):
                self.cache.unlock(m.node)
                self._ensure_free(reserved)  # a tiered match may have loaded into slots the plan reserved
                break
            r.row = self.req_table.alloc_row()
            r.node, r.kv_len, r.cached_len = m.node, m.length, m.length
            if m.length:
                self.req_table.write(r.row, 0, m.slots)
            if r.prompt_cached_tokens is None:
                r.prompt_cached_tokens = m.length
                self.counters["prompt_tokens"] += len(r.prompt_ids)
                self.counters["cached_prompt_tokens"] += m.length
            self.waiting.remove(r)
            with self._queued_lock:
                self._queued -= 1
            self.running.append(r)
            plan.append((r, n))
            in_prefill.append(r)
            reserved += n
            budget -= n
        self.counters["tree_time_s"] += time.perf_counter() - t0
        return budget, reserved

    def _run(self, plan: list[tuple[Req, int]]) -> None:
        ids, positions, out_slots, ext_lens, seq_lens, rows, logits_index = [], [], [], [], [], [], []
        wanted: list[tuple[Req, int, int, int]] = []  # (req, first logits row, number of rows, tokens fed)
        offset = 0
        for r, n in plan:
            pending = r.pending_ids()[:n]
            slots = self.kv.allocator.alloc(n)
            assert slots is not None, "slots were reserved before the pass"
            self.req_table.write(r.row, r.kv_len, slots)
            r.pass_end = r.kv_len + n
            ids.extend(pending)
            positions.extend(range(r.kv_len, r.kv_len + n))
            out_slots.append(slots)
            ext_lens.append(n)
            seq_lens.append(r.kv_len + n)
            rows.append(self.req_table.slots(r.row, r.kv_len + n))
            if n == len(r.pending_ids()):  # reaches the end: logits for the last real token and each draft token
                k = len(r.draft) + 1
                wanted.append((r, len(logits_index), k, n))
                logits_index.extend(range(offset + n - k, offset + n))
            else:
                wanted.append((r, -1, 0, n))
            offset += n
        batch = ForwardBatch(
            input_ids=torch.tensor(ids, dtype=torch.int64, device=self.device),
            positions=torch.tensor(positions, dtype=torch.int64, device=self.device),
            # on the model's device: every layer indexes its K/V pool with it
            out_slots=torch.cat(out_slots).to(self.device, non_blocking=True), extend_lens=ext_lens,
            seq_lens=seq_lens, slot_rows=rows,
            logits_index=torch.tensor(logits_index, dtype=torch.int64, device=self.device),
        )
        # Always run the pass, even when no row's logits are wanted (a pass of only mid-prompt
        # prefill chunks): the forward is what writes this pass's K/V into the pool.
        if self.cuda_graphs is not None and self.cuda_graphs.can_run(batch):
            out = self.cuda_graphs.run(batch)
        else:
            out = self.model.forward(batch, self.kv, self.attn)
        self.counters["forward_passes"] += 1
        self.counters["forward_tokens"] += len(ids)

        # greedy choices from the device logits: the grammar mask is applied where they live
        failed: dict[str, Exception] = {}
        first_choices = self._first_choices(out if logits_index else None,
                                            [(r, row) for r, row, k, _ in wanted if row >= 0], failed)
        # Only rows still to be read one by one come to the host (draft verification, sampling):
        # a greedy decode batch copies nothing (on CUDA the whole [B, vocab] logits would be
        # megabytes per step).
        host_rows: dict[str, int] = {}
        index: list[int] = []
        for r, row, k, _ in wanted:
            if row >= 0 and (k > 1 or r.rid not in first_choices):
                host_rows[r.rid] = len(index)
                index.extend(range(row, row + k))
        logits = None
        if len(index) == out.shape[0] and out.device.type == "cpu":
            logits = out  # every row, in order, already on the host
        elif index:
            logits = out[torch.tensor(index, device=out.device)].cpu()
        for r, row, k, n in wanted:
            if r.finished:  # aborted meanwhile cannot happen inside a step, but keep it safe
                continue
            if row < 0:
                r.kv_len += n
                r.pass_end = None
                self._cache_progress(r)
                continue
            try:
                if r.rid in failed:
                    raise failed[r.rid]
                at = host_rows.get(r.rid)
                rows = logits[at : at + k] if at is not None else None
                self._accept_from_logits(r, rows, n, first_choices.get(r.rid))
            except Exception as e:  # its grammar matcher raised: fail this request, not the batch
                log.exception("request %s failed", r.rid)
                self._finish(r, "error", error=f"engine error: {e}")

    def _first_choices(self, logits: torch.Tensor | None, reqs: list[tuple[Req, int]],
                       failed: dict[str, Exception]) -> dict[str, int]:
        """Batched choice for greedy requests at their first logits row (the common decode path).
        A request whose matcher raises is left out and its error put in `failed`."""
        greedy = [(r, row) for r, row in reqs if r.spec.sampling.greedy]
        if logits is None or not greedy:
            return {}
        sel = logits[torch.tensor([row for _, row in greedy], device=logits.device)]
        constrained = [i for i, (r, _) in enumerate(greedy) if r.matcher is not None]
        if constrained:
            mask = torch.full((len(greedy), (sel.shape[-1] + 31) // 32), -1, dtype=torch.int32)
            for i in constrained:
                try:
                    self._fill_mask(greedy[i][0], mask, i)
                except Exception as e:
                    failed[greedy[i][0].rid] = e
            apply_token_bitmask(sel, mask, torch.tensor(constrained))
        choices = sel.argmax(dim=-1).tolist()
        for i, (r, _) in enumerate(greedy):
            if r.guard is not None and r.rid not in failed:
                choices[i] = self._vetted(r, sel[i], int(choices[i]))
        return {r.rid: int(t) for (r, _), t in zip(greedy, choices) if r.rid not in failed}

    def _vetted(self, r: Req, row: torch.Tensor, tok: int) -> int:
        """Strict requests: re-choose (from the same masked `row`, changed in place) while the
        choice would commit the output to more than the remaining budget can complete."""
        remaining = r.spec.sampling.max_new_tokens - len(r.output_ids)
        for _ in range(MAX_VETTED_CHOICES):
            if r.guard.allows(r.matcher, tok, remaining):
                return tok
            row[tok] = float("-inf")
            if not torch.isfinite(row).any():
                break
            tok = sample_token(row, r.spec.sampling, r.generator)
        if r.guard.allows(r.matcher, tok, remaining):
            return tok
        fallback = r.guard.fallback_token(r.matcher)
        return tok if fallback is None else fallback

    def _fill_mask(self, r: Req, mask: torch.Tensor, row: int) -> None:
        """The grammar's mask for `r`'s next token, narrowed by closing / loop breaking if active."""
        if r.guard is None:
            r.matcher.fill_bitmask(mask, row)
            return
        r.guard.before_choice(r.matcher, len(r.output_ids), r.spec.sampling.max_new_tokens)
        r.guard.fill_mask(r.matcher, mask, row)

    def _choose(self, r: Req, logits_row: torch.Tensor) -> int:
        row = logits_row.clone().unsqueeze(0)
        if r.matcher is not None:
            mask = torch.full((1, (row.shape[-1] + 31) // 32), -1, dtype=torch.int32)
            self._fill_mask(r, mask, 0)
            apply_token_bitmask(row, mask)
        tok = sample_token(row[0], r.spec.sampling, r.generator)
        return tok if r.guard is None else self._vetted(r, row[0], tok)

    def _accept_from_logits(self, r: Req, rows: torch.Tensor | None, fed: int, first_choice: int | None) -> None:
        """After a pass that reached the end of `r`'s pending tokens: verify its draft (if any),
        choose the next token, roll back KV of rejected draft tokens, then plan the next draft.
        Finishing waits until the KV bookkeeping is done, so no slot is left behind.

        Verifying a draft token is choosing at its position exactly as without a draft (masked,
        vetted, sampled with the request's generator) and keeping it if the choice equals it.
        Under sampling that accepts with the masked probability of the draft token and otherwise
        yields the residual distribution, as speculative sampling with a one-hot draft does; and
        since every position draws once, as it would without drafts, a seed gives the same output
        whatever was drafted."""
        draft, r.draft = r.draft, []
        kv_before = r.kv_len
        r.kv_len += fed - len(draft)  # real tokens now have KV; drafts count only once accepted
        accepted_draft = 0
        finish: tuple[str, str | None] | None = None
        for i in range(len(draft) + 1):
            if i == 0 and first_choice is not None:
                tok = first_choice
            else:
                tok = self._choose(r, rows[i])
            finish = self._accept_token(r, tok)
            if i < len(draft) and tok == draft[i] and finish is None:
                accepted_draft += 1
                continue
            if i < len(draft) and tok == draft[i]:
                accepted_draft += 1
            break
        r.kv_len += accepted_draft
        rejected = len(draft) - accepted_draft
        if rejected:
            start = kv_before + fed - rejected
            self.kv.allocator.free(self.req_table.slots(r.row, start + rejected)[start:].clone())
        r.pass_end = None
        self.counters["jump_forward_tokens"] += accepted_draft
        self.counters["jump_forward_rejected"] += rejected
        r.jump_forward_tokens += accepted_draft
        if r.first_token_at is None:
            r.first_token_at = time.monotonic()
            self.counters["ttft_s_sum"] += r.first_token_at - r.arrival
        if finish is None:
            finish = self._plan_jump_forward(r)
        if finish is not None:
            self._finish(r, *finish)
            return
        self._emit_progress(r)
        # A finished prefill goes into the cache now, so waiting requests with the same prefix hit it.
        if fed - len(draft) > 1 or len(r.output_ids) % CACHE_PROGRESS_EVERY == 0:
            self._cache_progress(r)

    def _accept_token(self, r: Req, tok: int) -> tuple[str, str | None] | None:
        """Append one output token, advance the grammar, check finish conditions. Returns
        (finish_reason, error) when the request is done; the caller finishes it."""
        if r.matcher is not None and not r.matcher.accept(tok):
            return "error", f"grammar rejected token {tok}"
        r.output_ids.append(tok)
        r.unsent_ids.append(tok)
        self.counters["generated_tokens"] += 1
        p = r.spec.sampling
        # A value completed by budget closing was still cut short: that is `length`.
        done = "length" if r.guard is not None and r.guard.closing else "stop"
        if (tok in self.eos_ids and not p.ignore_eos) or tok in p.stop_token_ids:
            return done, None
        if r.matcher is not None and r.matcher.is_terminated():
            return done, None
        r.pending_text += r.detok.add([tok])
        if r.guard is not None:
            r.guard.after_token(r.output_ids, r.detok.text[-32:], r.matcher.closes_value(tok))
        if r.detok.stopped:
            return "stop", None
        if len(r.output_ids) >= p.max_new_tokens:
            return "length", None
        return None

    def _plan_jump_forward(self, r: Req) -> tuple[str, str | None] | None:
        """Queue the grammar's forced tokens: as a draft (verify) or as output (direct)."""
        if r.jump_forward == "off" or r.matcher is None:
            return None
        room = r.spec.sampling.max_new_tokens - len(r.output_ids) - 1
        cap = min(self.config.max_jump_forward_tokens, room)
        if cap <= 0:
            return None
        forced = r.matcher.jump_forward_tokens(learn=r.jump_forward == "verify")[:cap]
        if not forced:
            return None
        if r.jump_forward == "verify":
            r.draft = forced
            return None
        for tok in forced:  # direct: the grammar's tokens go in unverified (SGLang 2024)
            if r.guard is not None:
                # Strict: a forced span can be split into more tokens than its shortest form, so
                # near the budget the guard's closing plan, not the draft, chooses the next token.
                max_new = r.spec.sampling.max_new_tokens
                r.guard.before_choice(r.matcher, len(r.output_ids), max_new)
                if not r.guard.allows_unchosen(r.matcher, tok, max_new - len(r.output_ids)):
                    break
            self.counters["jump_forward_tokens"] += 1
            r.jump_forward_tokens += 1
            finish = self._accept_token(r, tok)
            if finish is not None:
                return finish
        return None

    def _emit_progress(self, r: Req) -> None:
        if r.finished or not r.unsent_ids:
            return
        ids, text = r.unsent_ids, r.pending_text
        r.unsent_ids, r.pending_text = [], ""
        r.emit(StreamEvent(rid=r.rid, text=text, token_ids=ids, prompt_tokens=len(r.prompt_ids),
                           cached_tokens=r.prompt_cached_tokens or 0, completion_tokens=len(r.output_ids)))

    # ------------------------------------------------------------------ KV bookkeeping

    def _ensure_free(self, n: int) -> bool:
        a = self.kv.allocator
        if a.num_free < n:
            t0 = time.perf_counter()
            self.cache.evict(n - a.num_free)
            self.counters["tree_time_s"] += time.perf_counter() - t0
        return a.num_free >= n

    def _cache_progress(self, r: Req) -> None:
        """Hand the computed part of a running request to the prefix cache and re-lock it."""
        if isinstance(self.cache, NoPrefixCache) or r.row is None:
            return
        t0 = time.perf_counter()
        key = r.all_ids()[: r.kv_len]
        slots = self.req_table.slots(r.row, r.kv_len).clone()
        cached = self.cache.insert(key, slots, r.namespace)
        self.kv.allocator.free(slots[r.cached_len : cached])
        m = self.cache.match_prefix(key, r.namespace)
        self.req_table.write(r.row, 0, m.slots)
        self.cache.lock(m.node)
        self.cache.unlock(r.node)
        r.node, r.cached_len = m.node, m.length
        self.counters["tree_time_s"] += time.perf_counter() - t0

    def _release_kv(self, r: Req) -> None:
        """Give the request's KV to the cache (or free it) and its row back."""
        if r.row is None:
            return
        t0 = time.perf_counter()
        if r.pass_end is not None and r.pass_end > r.kv_len:  # a failed step left this pass's slots behind
            self.kv.allocator.free(self.req_table.slots(r.row, r.pass_end)[r.kv_len:].clone())
        r.pass_end = None
        key = r.all_ids()[: r.kv_len]
        slots = self.req_table.slots(r.row, r.kv_len).clone()
        self.cache.cache_finished(key, slots, r.node, r.cached_len, r.namespace)
        self.req_table.free_row(r.row)
        r.row, r.node, r.kv_len, r.cached_len = None, None, 0, 0
        self.counters["tree_time_s"] += time.perf_counter() - t0

    def _retract_one(self, decoding: list[Req]) -> bool:
        """Out of slots while decoding: send the request holding most private slots back to the
        queue. Its computed prefix stays in the cache, so resuming it is mostly a cache hit."""
        if len(self.running) <= 1:
            return False
        victim = max(self.running, key=lambda r: (r.owned_slots, r.arrival))
        victim.draft = []
        self._release_kv(victim)
        self.running.remove(victim)
        self.waiting.insert(0, victim)
        with self._queued_lock:
            self._queued += 1
        self.counters["retractions"] += 1
        return True

    def _finish(self, r: Req, reason: str, error: str | None = None) -> None:
        if r.finished:
            return
        r.finished = True
        with self._queued_lock:
            self._unfinished -= 1
        r.finish_reason = reason
        r.draft = []
        if r in self.running:
            self.running.remove(r)
        elif r in self.waiting:
            self.waiting.remove(r)
            with self._queued_lock:
                self._queued -= 1
        else:  # never queued (refused while stopping)
            with self._queued_lock:
                self._queued -= 1
        try:
            self._release_kv(r)
        except Exception:  # bookkeeping must not keep the caller waiting
            log.exception("releasing KV of %s failed", r.rid)
        self.counters[f"requests_{reason}"] += 1
        text = r.pending_text + r.detok.flush()
        ids, r.unsent_ids, r.pending_text = r.unsent_ids, [], ""
        r.emit(StreamEvent(
            rid=r.rid, text=text, token_ids=ids, finished=True, finish_reason=reason,
            prompt_tokens=len(r.prompt_ids), cached_tokens=r.prompt_cached_tokens or 0,
            completion_tokens=len(r.output_ids), error=error,
        ))

    def check_invariant(self) -> None:
        """free + tree-held + request-only slots == pool size (and the tree's own checks)."""
        self.cache.check_invariant(running_only_slots=sum(r.owned_slots for r in self.running))


def _ids_name(ids: list[int]) -> str:
    import hashlib

    return "ids:" + hashlib.sha256(repr(ids).encode()).hexdigest()[:24]


def _model_name(requested: str | None, model_dir) -> str:
    if requested is None:
        return "SmolLM2-135M-Instruct"
    from pathlib import Path

    p = Path(requested)
    return p.stem if p.suffix.lower() == ".gguf" else p.name
