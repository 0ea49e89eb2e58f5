"""The engine: the client interface and the step loop over scheduler, model runner and decoder.

One background thread runs `step()` = schedule -> run -> process in a loop; callers talk to it
through an inbox of typed messages (`Add`, `Abort`, `Call`) and get `StreamEvent`s back, so an
HTTP event loop never waits on model compute. Each step runs one forward pass holding every
running request's new tokens: one token (plus an optional jump-forward draft) for decoding
requests, a chunk of prompt for prefilling ones.

Ownership: everything below `Engine` (scheduler, cache manager, model runner, decoder, counters,
every `Req`) belongs to the engine thread. Other threads only enqueue inbox messages; anything
that must read engine state (`stats`, `explain_prefix`, pins) runs as a `Call` between steps.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import hashlib
import logging
import queue
import threading
import time
import weakref
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import torch

from runtime.api import (
    ENGINE_STOPPED,
    EngineError,
    EngineInfo,
    EngineStats,
    GenerateRequest,
    GenerateResult,
    PrefixExplanation,
    StreamEvent,
)
from runtime.counters import EngineCounters
from runtime.decode.decoding import Decoder
from runtime.decode.sampling import SamplingParams
from runtime.engine.client_io import Emit, collect_results, stream_events
from runtime.engine.intake import Limits, LookupSettings, new_request, validate
from runtime.engine.policies import SchedulePolicy
from runtime.engine.scheduler import RequestCounts, Scheduler
from runtime.engine.torch_thread import TorchThread
from runtime.engine_config import EngineConfig
from runtime.kvcache.cache_manager import CACHE_PROGRESS_EVERY, CacheManager
from runtime.kvcache.prefix_cache import BasePrefixCache, NoPrefixCache
from runtime.kvcache.radix_cache import RadixCache
from runtime.model.loader import load_tokenizer, read_config, resolve_model_dir
from runtime.model.runner import ModelRunner, PassOutput, pick_device, pick_dtype
from runtime.request import Req

log = logging.getLogger("jumpgate.engine")


# ---------------------------------------------------------------------- inbox messages


@dataclass
class Add:
    spec: GenerateRequest  # validated
    emit: Emit


@dataclass
class Abort:
    rid: str


@dataclass
class Call:
    fn: Callable[[], Any]
    future: concurrent.futures.Future


class Engine:
    def __init__(self, config: EngineConfig | None = None, **overrides: Any):
        cfg = replace(config or EngineConfig(), **overrides)
        # Values and cross-field rules were checked once, by EngineConfig itself (runtime/engine_config.py).
        self.config = cfg
        # Loads the model and later runs the loop: one OpenMP team (runtime/engine/torch_thread.py).
        self._torch = TorchThread("jumpgate-engine")
        self._loop_future: concurrent.futures.Future | None = None
        self._closed = False
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        try:
            self._load(cfg)
        except BaseException:  # a model that cannot load: nothing is left running, nothing to shut down at exit
            self._closed = True
            if hasattr(self, "runner"):  # its tensor-parallel workers
                self.runner.close()
            self._torch.close()
            if hasattr(self, "cache"):
                self.cache.close()
            raise
        _LIVE.add(self)  # only a whole engine: exit's shutdown() needs every part

    def _load(self, cfg: EngineConfig) -> None:
        """Model, tokenizer, runner, caches, scheduler and decoder (on failure __init__ releases them)."""
        self.device = pick_device(cfg.device)
        self.dtype = pick_dtype(cfg.dtype, self.device)
        self.model_dir = resolve_model_dir(cfg.model)
        self.model_config = mc = read_config(self.model_dir)
        self.model_name = _model_name(cfg.model, self.model_dir)
        self.tokenizer = load_tokenizer(self.model_dir)
        self.max_context = min(cfg.max_context or mc.max_position_embeddings, mc.max_position_embeddings)
        self.runner = self._torch.run(self._build_runner)
        self.kv_pool_tokens = self.runner.kv_pool_tokens
        self.limits = Limits(self.max_context, self.kv_pool_tokens, mc.vocab_size)

        self.counters = EngineCounters()
        self.cache = CacheManager(self._build_prefix_cache(), self.runner.req_table, self.counters)
        self.counts = RequestCounts(cfg.max_running_requests + cfg.max_waiting_requests)
        self.scheduler = Scheduler(
            SchedulePolicy(cfg.schedule_policy, seed=cfg.seed),
            self.cache,
            self.counters,
            self.counts,
            cfg.chunked_prefill_tokens,
        )
        eos = set(mc.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.decoder = Decoder(
            eos, cfg.max_jump_forward_tokens, self.counters, self.cache.free_positions, self.cache.truncate
        )
        self.lookup_settings = LookupSettings.of(cfg)
        self.info = EngineInfo(
            model_name=self.model_name,
            device=str(self.device),
            dtype=str(self.dtype).removeprefix("torch."),
            weights=self.runner.model.weights,
            weights_reason=self.runner.model.weights_reason,
            attention_backend=self.runner.attn.name,
            kv_pool_tokens=self.kv_pool_tokens,
            max_context=self.max_context,
            vocab_size=mc.vocab_size,
            eos_token_ids=tuple(sorted(eos)),
        )

    def _build_runner(self) -> ModelRunner:
        cfg = self.config
        if cfg.num_threads:  # OpenMP's thread count is per calling thread: set it on this one
            torch.set_num_threads(cfg.num_threads)
        return ModelRunner(cfg, self.model_dir, self.model_config, self.device, self.dtype, self.max_context)

    def _build_prefix_cache(self) -> BasePrefixCache:
        cfg, allocator = self.config, self.runner.kv.allocator
        if not cfg.radix_cache:
            return NoPrefixCache(allocator)
        if cfg.host_pool_tokens > 0:
            from runtime.kvcache.hiradix_cache import build_hiradix_cache

            numerics = f"{self.runner.model.weights} {self.runner.attn.name}"
            return build_hiradix_cache(cfg, self.runner.kv, self.model_dir, numerics)
        return RadixCache(allocator, page_size=cfg.page_size)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Engine:
        if self._loop_future is None:
            self._loop_future = self._torch.submit(self._loop)
        return self

    @property
    def is_running(self) -> bool:
        return self._loop_future is not None and not self._loop_future.done() and not self._stop.is_set()

    def shutdown(self) -> None:
        """Stop the loop (requests in flight end with an error), its thread, and the cache tiers.
        Idempotent; engines still open at interpreter exit are shut down then (see _LIVE)."""
        if self._closed:
            return
        self._closed = True
        _LIVE.discard(self)
        self._stop.set()
        self._wake.set()
        if self._loop_future is not None:
            try:
                self._loop_future.result(timeout=30)
            except concurrent.futures.TimeoutError:
                log.error("engine loop did not stop within 30 s")
            self._loop_future = None
        self.runner.close()  # tensor-parallel workers, if any
        self._torch.close()
        self.cache.close()

    def __enter__(self) -> Engine:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ requests

    def validate(self, spec: GenerateRequest) -> GenerateRequest:
        """`spec` as the engine will run it (output budget clamped), or EngineError."""
        return validate(spec, self.limits)

    def new_request(self, spec: GenerateRequest, emit: Emit) -> Req:
        """The engine's state for a validated `spec` (its matcher, strict guard, generator)."""
        return new_request(
            spec,
            emit,
            self.tokenizer,
            default_jump_forward=self.config.jump_forward,
            loop_breaking=self.config.loop_breaking,
            max_number_digits=self.config.max_number_digits,
            lookup=self.lookup_settings,
        )

    def enqueue(self, spec: GenerateRequest, emit: Emit) -> None:
        """Queue `spec`; `emit` gets its events on the engine thread. Refusals raise EngineError
        here, before anything is queued (for callers with their own event plumbing: benches)."""
        spec = self.validate(spec)
        if self._stop.is_set():  # stopped on its own (a tensor-parallel rank lost): nothing would run it
            raise EngineError(f"{ENGINE_STOPPED}; retry the request on another server", code="engine_stopped")
        if not self.counts.try_submit():
            raise EngineError("server overloaded: the waiting queue is full; retry later", code="overloaded")
        self._post(Add(spec, emit))

    def submit(self, spec: GenerateRequest) -> AsyncIterator[StreamEvent]:
        """Queue a request from async code; iterate the result for its events. Refusals raise
        EngineError here, before anything is queued. Leaving the iteration early aborts."""
        return stream_events(self.enqueue, self.abort, spec)

    def abort(self, rid: str) -> None:
        self._post(Abort(rid))

    def generate(self, prompt: str | list[int], sampling=None, **fields: Any) -> GenerateResult:
        """Blocking convenience for library users and tests: one request, whole result."""
        ids = prompt if isinstance(prompt, list) else self.tokenizer.encode(prompt, add_special_tokens=False)
        kwargs = {"sampling": sampling} if sampling is not None else {}
        return self.generate_many([GenerateRequest(prompt_ids=ids, **kwargs, **fields)])[0]

    def generate_many(self, specs: list[GenerateRequest], timeout: float | None = None) -> list[GenerateResult]:
        """Submit all at once (so they batch), wait for all."""
        self.start()
        return collect_results(self.enqueue, specs, timeout)

    # ------------------------------------------------------------------ introspection and pins

    def call(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        """Run `fn` on the engine thread between steps (or here, if the engine is not running or
        this is the engine thread)."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        if self._loop_future is None or threading.current_thread() is self._torch.thread:
            try:
                fut.set_result(fn())
            except Exception as e:
                fut.set_exception(e)
            return fut
        self._post(Call(fn, fut))
        return fut

    def stats(self) -> EngineStats:
        """A snapshot of gauges and counters, made on the engine thread (blocking)."""
        return self.call(self._snapshot).result(timeout=60)

    def _snapshot(self) -> EngineStats:
        return EngineStats(
            running_requests=len(self.scheduler.running),
            waiting_requests=self.counts.queued,
            lookup_row_cost=self.lookup_settings.row_cost.share,
            **self.cache.gauges(),
            **self.counters.copy_values(),
        )

    def explain_prefix(self, prompt_ids: list[int], namespace: str = "") -> PrefixExplanation:
        """Cached length of `prompt_ids` per tier (computed on the engine thread)."""
        tiers = self.call(lambda: self.cache.tier_lengths(prompt_ids, namespace)).result(timeout=30)
        return PrefixExplanation(prompt_tokens=len(prompt_ids), cached_tokens=sum(tiers.values()), by_tier=tiers)

    def pin_prefix(self, token_ids: list[int], namespace: str = "", name: str | None = None) -> int:
        """Prefill `token_ids` and keep their KV resident in L1 until `unpin_prefix` (a schema's
        system prompt + schema text). Returns the pinned length (whole cache pages). Refused with
        EngineError(code="pin_budget_exceeded") beyond `pin_budget_tokens` in all."""
        ids = list(token_ids)
        key = (namespace, name or _ids_name(ids))

        def check() -> int | None:
            pinned = self.cache.pinned(key)
            if pinned is None:
                self.cache.check_pin_budget(len(ids), self.config.pin_budget_tokens)
            return pinned

        pinned = self.call(check).result(timeout=60)
        if pinned is not None:
            return pinned
        self.generate(ids, SamplingParams(max_new_tokens=1, temperature=0.0), namespace=namespace)

        def lock() -> int:
            again = check()  # a concurrent pin may have used the budget meanwhile
            return again if again is not None else self.cache.pin(key, ids, namespace)

        return self.call(lock).result(timeout=60)

    def unpin_prefix(self, token_ids: list[int] | None = None, namespace: str = "", name: str | None = None) -> int:
        """Release a pin made by `pin_prefix` (by the same name, or the same token ids); returns
        the tokens released (0 if nothing was pinned under that key)."""
        key = (namespace, name or _ids_name(list(token_ids or [])))
        return self.call(lambda: self.cache.unpin(key)).result(timeout=60)

    def flush_cache(self) -> None:
        """Drop every unlocked prefix from the cache and zero the counters (benchmarks, admin)."""

        def flush() -> None:
            self.cache.evict_all()
            self.counters.reset()

        self.call(flush).result(timeout=60)

    def check_invariant(self) -> None:
        """free + tree-held + request-only slots == pool size (and the tree's own checks)."""
        self.cache.check_invariant(sum(r.owned_slots for r in self.scheduler.running))

    # ------------------------------------------------------------------ the loop

    def _post(self, message: Add | Abort | Call) -> None:
        self._inbox.put(message)
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._drain_inbox()
            except Exception:  # the thread must outlive any one bad item
                log.exception("engine intake failed")
            if self.scheduler.idle:
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            try:
                self._timed_step()
            except Exception as e:  # never leave callers hanging: fail what was in flight, keep serving
                log.exception("engine step failed")
                fatal = getattr(e, "fatal", False)  # a tensor-parallel rank lost: stop (runtime/parallel/launch.py)
                for r in self.scheduler.running + self.scheduler.waiting:
                    self._finish(r, "error", error=f"{ENGINE_STOPPED}: {e}" if fatal else f"engine error: {e}")
                if fatal:
                    self._stop.set()
        for r in self.scheduler.running + self.scheduler.waiting:
            self._finish(r, "error", error=ENGINE_STOPPED)
        self._drain_inbox(stopping=True)

    def _drain_inbox(self, stopping: bool = False) -> None:
        while True:
            try:
                msg = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(msg, Add):
                self._add(msg, stopping)
            elif isinstance(msg, Abort):
                for r in self.scheduler.running + self.scheduler.waiting:
                    if r.rid == msg.rid:
                        self._finish(r, "abort")
            else:
                try:
                    msg.future.set_result(msg.fn())
                except Exception as e:  # delivered to the caller
                    msg.future.set_exception(e)

    def _add(self, msg: Add, stopping: bool) -> None:
        try:
            req = self.new_request(msg.spec, msg.emit)
        except Exception as e:  # e.g. the constraint's new_matcher raised: fail this request only
            log.exception("setting up request %s failed", msg.spec.rid)
            self.counts.finished(was_queued=True)
            msg.emit(
                StreamEvent(
                    rid=msg.spec.rid,
                    finished=True,
                    finish_reason="error",
                    prompt_tokens=len(msg.spec.prompt_ids),
                    error=f"engine error: {e}",
                )
            )
            return
        if stopping:
            self._finish(req, "error", error=ENGINE_STOPPED)
        else:
            self.scheduler.add(req)

    def _timed_step(self) -> None:
        """`step`, timed: a pass's whole time goes to `engine_seconds` and a decode step's to the
        drafts' row cost too; then the invariants are checked where `debug_invariants` asks."""
        started, made = time.perf_counter(), self.lookup_settings.made(self.scheduler.running)
        if plan := self.step():
            self.counters.engine_seconds += (seconds := time.perf_counter() - started)
            self.lookup_settings.observe(plan, made, seconds)
            if self.config.debug_invariants:
                self.check_invariant()

    def step(self) -> list[tuple[Req, int]]:
        """One forward pass: schedule -> run -> process; its plan, empty when there was nothing to run."""
        plan = self._schedule()
        if plan:
            self._process(self._run(plan))
        return plan

    def _schedule(self) -> list[tuple[Req, int]]:
        """The next pass's (request, new tokens) rows; a request that can never fit fails here."""
        schedule = self.scheduler.schedule()
        if schedule.unservable is not None:
            self._finish(schedule.unservable, "error", error="request does not fit the KV pool")
        return schedule.plan

    def _run(self, plan: list[tuple[Req, int]]) -> PassOutput:
        """The forward pass of `plan`, timed and counted."""
        started = time.perf_counter()
        out = self.runner.run(plan)
        self.counters.forward_seconds += time.perf_counter() - started
        self.counters.forward_passes += 1
        self.counters.forward_tokens += sum(n for _, n in plan)
        return out

    def _process(self, out: PassOutput) -> None:
        """Choose and accept tokens for every request whose logits this pass produced; account
        the KV of the others (prefill chunks that did not reach the end of the prompt)."""
        with_logits = [(w.req, w.first_row) for w in out.rows if w.first_row >= 0]
        failed: dict[str, Exception] = {}
        # greedy choices from the device logits: the grammar mask is applied where they live
        first_choices = self.decoder.first_choices(out.logits if with_logits else None, with_logits, failed)
        host_logits, host_at = self.runner.rows_to_host(out, first_choices)
        for w in out.rows:
            r = w.req
            if r.finished:  # aborted meanwhile cannot happen inside a step, but keep it safe
                continue
            if w.first_row < 0:
                r.kv_len += w.fed
                r.pass_end = None
                self.cache.cache_progress(r)
                continue
            real_fed = w.fed - len(r.draft)
            try:
                if r.rid in failed:
                    raise failed[r.rid]
                at = host_at.get(r.rid)
                rows = host_logits[at : at + w.num_rows] if at is not None else None
                finish = self.decoder.accept_from_logits(r, rows, w.fed, first_choices.get(r.rid))
            except Exception as e:  # its grammar matcher raised: fail this request, not the batch
                log.exception("request %s failed", r.rid)
                self._finish(r, "error", error=f"engine error: {e}")
                continue
            if finish is not None:
                self._finish(r, *finish)
                continue
            event = r.progress_event()
            if event is not None:
                r.emit(event)
            # A finished prefill goes into the cache now, so waiting requests with the same prefix hit it.
            if real_fed > 1 or len(r.output_ids) % CACHE_PROGRESS_EVERY == 0:
                self.cache.cache_progress(r)

    def _finish(self, r: Req, reason: str, error: str | None = None) -> None:
        if r.finished:
            return
        r.finished = True
        r.finish_reason = reason
        r.draft = []
        self.scheduler.remove(r)
        try:
            self.cache.release(r)
        except Exception:  # bookkeeping must not keep the caller waiting
            log.exception("releasing KV of %s failed", r.rid)
        self.counters.count_finished(reason)
        self.counters.closed_at_budget += r.closed_at_budget
        r.emit(r.final_event(error))


# Engines not shut down by their owner are shut down at interpreter exit, before Python finalizes:
# a daemon thread still polling then is stopped by force in the middle of a C++ call (torch), which
# aborts the process ("terminate called without an active exception") after everything passed.
_LIVE: weakref.WeakSet[Engine] = weakref.WeakSet()


@atexit.register
def _shutdown_live_engines() -> None:
    for engine in list(_LIVE):
        try:
            engine.shutdown()
        except Exception:  # exiting anyway; one engine must not keep the others running
            log.exception("shutting down an engine at exit failed")


def _ids_name(ids: list[int]) -> str:
    return "ids:" + hashlib.sha256(repr(ids).encode()).hexdigest()[:24]


def _model_name(requested: str | None, model_dir: Path) -> str:
    if requested is None:
        return "SmolLM2-135M-Instruct"
    p = Path(requested)
    return p.stem if p.suffix.lower() == ".gguf" else p.name
