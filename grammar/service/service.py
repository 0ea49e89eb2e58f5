"""GrammarService: spec -> compiled grammar, through memory LRU, disk cache and compile workers.

Lookups go memory -> disk -> compile. Everything slower than a dict lookup (validation, disk
read, compile) runs on the compile workers under a time limit, so neither the HTTP event loop
nor other requests wait on a slow schema. Identical specs compiling at the same time share one
compile (single flight); a waiter that joins extends the compile's deadline to its own.

xgrammar compiles run in the workers' child processes (grammar/service/worker_pool.py,
grammar/service/compile_process.py): a compile past its deadline is killed, and one that needs more than
`compile_memory_bytes` fails with a clear refusal, so no schema can keep the server's CPU or grow
its memory after its request has been answered.

A process sends its grammar back as `serialize_json()` text, which for some grammars costs far more
memory and time than the compile (grammar/service/compile_process.py). When a spec compiled in the process
but its grammar could not be sent back (GrammarUnserializable), the worker compiles it again here,
in-process, with a compiler of its own (created on first need): the process has just shown that the
compile fits the time and memory limits, so this compile is bounded by them too. It cannot be killed,
though: it runs on the worker thread, and the waiter keeps its deadline (the process gives up on the
text while 1.5x the compile's seconds are still left, so it normally finishes in time; a waiter
whose deadline passes first gets the usual timeout, and the grammar still lands in memory for the
next request). Such a grammar is kept in the memory LRU only, never on disk; its key is remembered
(bounded), so a later miss compiles it here directly instead of trying the process and serializing
again. Counted in `compile_unserializable`.

Two engines compile: xgrammar (the default, with the disk cache) and llguidance, for JSON schemas
whose keywords xgrammar would only approximate and llguidance enforces exactly (the fidelity
report decides: grammar/validation/fidelity.py). An llguidance grammar's cache key is the spec's key with the
engine appended; llguidance grammars live in memory only (llguidance compiles lazily, in ms).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import xgrammar as xgr

from grammar.checks.closing import ClosingVocab
from grammar.checks.plan_names import name_hint
from grammar.checks.rollback import (
    DEFAULT_VALUE_RETRIES,
    RollbackCheck,
    RollbackRules,
    RollbackVocab,
    TagCallRollbackRules,
    ToolCallRollbackRules,
)
from grammar.checks.value_check import ValueCheck
from grammar.checks.value_rules import (
    VALUE_CHECK_KINDS,
    SchemaNavigator,
    navigator_for,
    value_check_begin,
    value_checked,
)
from grammar.checks.value_text import ValueCheckVocab
from grammar.engines.draft_split import DraftSplitter
from grammar.engines.llguidance.matcher import LLGuidanceHandle, compile_llguidance
from grammar.engines.llguidance.schema import llguidance_grammar
from grammar.engines.llguidance.tokenizer import LLGuidanceTokenizer
from grammar.engines.xgrammar.matcher import XGrammarMatcher
from grammar.engines.xgrammar.tokenizer import build_tokenizer_info, make_encoder, marker_token_ids, special_token_ids
from grammar.errors import GrammarCompileMemoryError, GrammarCompileTimeout, GrammarSpecError, GrammarUnserializable
from grammar.kinds.tool_calls.format import HERMES_TOOL_CALL_FORMAT, get_tool_call_format
from grammar.kinds.tool_calls.grammar import arguments_schema
from grammar.service.cache import DiskGrammarCache, MemoryLRU, disk_namespace, grammar_from_json
from grammar.service.compile import COMPILE_POLICY_VERSION, compile_spec
from grammar.service.compile_process import CompileProcess
from grammar.service.stats import GrammarServiceStats
from grammar.service.worker_pool import CompileFn, CompileJob, CompileWorkerPool
from grammar.spec import GrammarSpec, tokenizer_fingerprint
from grammar.validate import validate_spec
from grammar.validation.fidelity import LLGUIDANCE, XGRAMMAR, FidelityReport, spec_fidelity, uses_rollback

log = logging.getLogger("jumpgate.grammar")


@dataclass(frozen=True, eq=False)
class CompiledGrammarHandle:
    """A compiled grammar shared by every request with the same spec (a CompiledConstraint)."""

    key: str
    kind: str
    compiled: xgr.CompiledGrammar
    _encode: Any = field(repr=False)
    _special_ids: frozenset[int] = field(repr=False)
    _closing: ClosingVocab | None = field(default=None, repr=False)
    _memo: dict = field(default_factory=dict, repr=False)
    _splitter: DraftSplitter | None = field(default=None, repr=False)
    # which schema keywords the mask enforces (grammar/validation/fidelity.py); None when the spec is unknown
    fidelity: FidelityReport | None = None
    # the value check (grammar/checks/value_check.py) for JSON kinds and tool calls; None for others
    value_check: ValueCheckVocab | None = field(default=None, repr=False)
    navigator: SchemaNavigator | None = field(default=None, repr=False)
    value_check_begin: bytes | None = field(default=None, repr=False)  # tool calls: where each call's JSON starts
    # check-and-roll-back of keywords no mask enforces (grammar/checks/rollback.py); None: none
    rollback_rules: RollbackRules | None = field(default=None, repr=False)

    def new_matcher(self) -> XGrammarMatcher:
        values = (
            ValueCheck(self.value_check, self.navigator, self.value_check_begin)
            if self.value_check is not None
            else None
        )
        rechecks = RollbackCheck(self.rollback_rules) if self.rollback_rules is not None else None
        names = name_hint(self._memo, self.navigator, self.value_check, self._closing)
        return XGrammarMatcher(
            self.compiled, self._encode, self._special_ids, self._closing, self._splitter, values, rechecks, names
        )

    def without_value_check(self) -> CompiledGrammarHandle:
        """The same grammar with its matchers not followed by the value check (for comparisons)."""
        return replace(self, value_check=None, navigator=None, _memo={})

    def min_completion_tokens(self) -> int | None:
        """Tokens of the smallest output the grammar allows (computed once per grammar)."""
        if "min_tokens" not in self._memo:
            self._memo["min_tokens"] = self.new_matcher().completion_bound()
        return self._memo["min_tokens"]

    @property
    def memory_size_bytes(self) -> int:
        return self.compiled.memory_size_bytes


class GrammarService:
    def __init__(
        self,
        hf_tokenizer: Any,
        vocab_size: int,
        cache_dir: Path | str | None = None,
        max_memory_entries: int = 256,
        max_memory_bytes: int | None = 512 << 20,
        compile_timeout_s: float = 10.0,
        workers: int = 2,
        *,
        stop_token_ids: list[int] | None = None,
        max_disk_bytes: int | None = None,
        compile_memory_bytes: int | None = 4 << 30,
        value_retries: int = DEFAULT_VALUE_RETRIES,
    ) -> None:
        self.value_retries = value_retries  # rewrites per output for check-and-roll-back (0: refuse instead)
        self.tokenizer_info = build_tokenizer_info(hf_tokenizer, vocab_size, stop_token_ids)
        self.stop_token_ids = list(self.tokenizer_info.stop_token_ids)
        self.compile_timeout_s = compile_timeout_s
        self.compile_memory_bytes = compile_memory_bytes or None  # 0: no limit
        # the key covers everything a compiled grammar depends on besides the spec
        self.fingerprint = hashlib.sha256(
            f"{tokenizer_fingerprint(hf_tokenizer)}|vocab={vocab_size}|stop={self.stop_token_ids}"
            f"|policy={COMPILE_POLICY_VERSION}".encode()
        ).hexdigest()
        self._encode = make_encoder(hf_tokenizer)
        self._special_ids = frozenset(special_token_ids(hf_tokenizer))
        # Token classes for strict-mode closing (grammar/checks/closing.py), shared by every grammar.
        markers = frozenset(marker_token_ids(hf_tokenizer))
        self._closing_vocab = ClosingVocab(hf_tokenizer, vocab_size, self.stop_token_ids, self._special_ids, markers)
        # How the model splits forced text, learned while it writes (grammar/engines/draft_split.py);
        # shared by every grammar: the preference is the model's.
        self.draft_splitter = DraftSplitter(self._encode, self.tokenizer_info.decoded_vocab)
        # Token texts for the value check (grammar/checks/value_check.py), shared by every JSON grammar.
        self._value_vocab = ValueCheckVocab(self.tokenizer_info.decoded_vocab, self._special_ids)
        self._rollback_vocab = RollbackVocab(self._value_vocab.texts)  # and for check-and-roll-back
        # Bounded in bytes too: one 20k-value enum compiles to ~60 MB of token masks.
        self._memory: MemoryLRU[CompiledGrammarHandle] = MemoryLRU(
            max_memory_entries, max_memory_bytes, size_of=lambda h: h.memory_size_bytes
        )
        # the disk folder may be shared with other models: ours is the namespace of our fingerprint
        self._disk = (
            DiskGrammarCache(Path(cache_dir), self.tokenizer_info, disk_namespace(self.fingerprint), max_disk_bytes)
            if cache_dir is not None
            else None
        )
        self._tokenizer_json: str | None = None  # what a compile process builds its compiler from
        self._pool = CompileWorkerPool(workers, self._new_compile_process)
        self._inflight: dict[str, CompileJob] = {}
        self._lock = threading.Lock()
        self._stats = GrammarServiceStats()
        self._llg_tokenizer = LLGuidanceTokenizer(hf_tokenizer, vocab_size, self.stop_token_ids)
        self._engines: dict[str, str] = {}  # spec key -> engine (bounded; the choice walks the schema)
        self._local_compiler: xgr.GrammarCompiler | None = None  # for grammars that cannot be serialized
        self._unserializable: dict[str, None] = {}  # their keys (bounded): compiled here directly

    # -- public ----------------------------------------------------------------------------

    def key(self, spec: GrammarSpec) -> str:
        base = spec.key(self.fingerprint)
        if self._engine_for(base, spec) == XGRAMMAR:
            return base
        return hashlib.sha256(f"{base}|engine={LLGUIDANCE}".encode()).hexdigest()

    def compile(self, spec: GrammarSpec) -> CompiledGrammarHandle:
        """Blocking lookup/compile under the time limit (don't call it on an event loop)."""
        key = self._checked_key(spec)
        handle = self._memory_hit(key, spec)
        if handle is not None:
            return handle
        deadline = time.monotonic() + self.compile_timeout_s
        job = self._submit(key, spec, deadline)
        try:
            while True:
                try:
                    return job.future.result(timeout=max(0.0, job.remaining_s(deadline)))
                except TimeoutError:
                    if job.remaining_s(deadline) <= 0:  # else a process start moved the deadline
                        raise
        except (TimeoutError, GrammarCompileTimeout):
            raise self._timed_out(spec) from None

    async def compile_async(self, spec: GrammarSpec) -> CompiledGrammarHandle:
        """Like `compile`, awaiting the worker instead of blocking the event loop."""
        # canonicalizing walks the whole payload (seconds for a hostile body of a few MB): off the loop
        key = await asyncio.to_thread(self._checked_key, spec)
        handle = self._memory_hit(key, spec)
        if handle is not None:
            return handle
        deadline = time.monotonic() + self.compile_timeout_s
        job = self._submit(key, spec, deadline)
        result = asyncio.wrap_future(job.future)
        try:
            while True:
                try:
                    # shield: our caller being cancelled must not cancel a compile others may share
                    return await asyncio.wait_for(asyncio.shield(result), max(0.0, job.remaining_s(deadline)))
                except TimeoutError:
                    if job.remaining_s(deadline) <= 0:  # else a process start moved the deadline
                        raise
        except (TimeoutError, GrammarCompileTimeout):
            raise self._timed_out(spec) from None

    def get_cached(self, spec: GrammarSpec) -> CompiledGrammarHandle | None:
        """Memory-only lookup (no disk, no compile)."""
        key = self.key(spec)
        return self._with_spec(key, self._memory.get(key), spec)

    @property
    def disk_folder(self) -> Path | None:
        """This service's own folder of the disk cache (its namespace under the cache root), or None."""
        return self._disk.directory if self._disk is not None else None

    def warm_from_disk(self, max_entries: int | None = None) -> int:
        """Load the newest disk entries into memory (e.g. at start-up); returns how many."""
        if self._disk is None:
            return 0
        loaded = 0
        limit = self._memory.max_entries if max_entries is None else max_entries
        for key in reversed(self._disk.keys_newest_first()[:limit]):  # newest ends most recent
            compiled = self._disk.load(key)
            if compiled is not None:
                self._memory.put(key, self._handle(key, "unknown", compiled))
                loaded += 1
        with self._lock:
            self._stats.disk_loaded += loaded
        return loaded

    def stats(self) -> GrammarServiceStats:
        with self._lock:
            snapshot = GrammarServiceStats(**self._stats.as_dict())
        snapshot.memory_entries = len(self._memory)
        snapshot.memory_bytes = self._memory.total_bytes
        snapshot.compile_processes_replaced = self._pool.processes_replaced
        return snapshot

    def start(self, wait: bool = False, timeout_s: float | None = None) -> None:
        """Start the compile workers and their processes now rather than on the first compile (a
        server does at start-up); with `wait`, return once they are ready (or `timeout_s` has
        passed), else at once."""
        self._pool.start(wait=wait, timeout_s=timeout_s)

    def compile_process_pids(self) -> list[int]:
        return self._pool.pids()

    def close(self) -> None:
        """Kill running compiles and stop the compile processes."""
        self._pool.shutdown()

    # -- internals -------------------------------------------------------------------------

    def _engine_for(self, base_key: str, spec: GrammarSpec) -> str:
        engine = self._engines.get(base_key)
        if engine is None:
            engine = XGRAMMAR
            if spec.kind == "json_schema":
                try:
                    engine = spec_fidelity(spec.kind, spec.payload, spec.strict, self.value_retries).engine
                except Exception:  # not validated yet: xgrammar's path then refuses it with its message
                    engine = XGRAMMAR
            if len(self._engines) >= 4096:
                self._engines.clear()
            self._engines[base_key] = engine
        return engine

    def _checked_key(self, spec: GrammarSpec) -> str:
        try:
            return self.key(spec)  # canonicalizing checks the size and depth limits
        except GrammarSpecError:
            with self._lock:
                self._stats.compile_errors += 1
            raise

    def _memory_hit(self, key: str, spec: GrammarSpec) -> CompiledGrammarHandle | None:
        handle = self._memory.get(key)
        if handle is not None:
            with self._lock:
                self._stats.memory_hits += 1
        return self._with_spec(key, handle, spec)

    def _with_spec(self, key: str, handle, spec: GrammarSpec):
        """A handle warmed from disk lacks what its spec gives (fidelity, value check): add it."""
        if handle is not None and handle.kind == "unknown":
            handle = self._handle(key, spec.kind, handle.compiled, spec)
            self._memory.put(key, handle)
        return handle

    def _submit(self, key: str, spec: GrammarSpec, deadline: float) -> CompileJob:
        with self._lock:
            job = self._inflight.get(key)
            if job is not None and not job.future.done():
                job.extend_deadline(deadline)
                return job
            job = self._pool.submit(lambda compile_fn: self._load_or_compile(key, spec, compile_fn), deadline)
            self._inflight[key] = job
        job.future.add_done_callback(lambda _f, key=key, job=job: self._forget(key, job))
        return job

    def _forget(self, key: str, job: CompileJob) -> None:
        with self._lock:
            if self._inflight.get(key) is job:
                del self._inflight[key]

    def _timed_out(self, spec: GrammarSpec) -> GrammarCompileTimeout:
        with self._lock:
            self._stats.compile_timeouts += 1
        log.warning("grammar compile of a %s spec exceeded %.1f s", spec.kind, self.compile_timeout_s)
        return GrammarCompileTimeout(
            f"compiling the {spec.kind} grammar took longer than {self.compile_timeout_s:g} s; "
            "simplify it (fewer alternatives, smaller bounds, shallower nesting)",
            "",
            spec.param,
        )

    def _new_compile_process(self) -> CompileProcess:
        if self._tokenizer_json is None:
            self._tokenizer_json = self.tokenizer_info.serialize_json()
        return CompileProcess(self._tokenizer_json, self.compile_memory_bytes)

    def _load_or_compile(self, key: str, spec: GrammarSpec, compile_fn: CompileFn) -> CompiledGrammarHandle:
        """Runs on a compile worker: memory again (a racing job may have filled it), disk, compile
        (xgrammar's in the worker's process: `compile_fn`)."""
        handle = self._with_spec(key, self._memory.get(key), spec)
        if handle is not None:
            return handle
        if self._disk is not None:
            compiled = self._disk.load(key)
            if compiled is not None:
                handle = self._handle(key, spec.kind, compiled, spec)
                self._memory.put(key, handle)
                with self._lock:
                    self._stats.disk_hits += 1
                return handle
        with self._lock:
            self._stats.misses += 1
        started = time.perf_counter()
        try:
            validate_spec(spec)
            fidelity = spec_fidelity(spec.kind, spec.payload, spec.strict, self.value_retries)
            if fidelity is not None and fidelity.engine == LLGUIDANCE:
                return self._compile_llguidance(key, spec, fidelity, started)
            if key in self._unserializable:
                return self._compile_in_process(key, spec, fidelity, started)
            text, waited_s = compile_fn(spec)
            started += waited_s  # the compile process's start is not the grammar's compile time
        except GrammarUnserializable as e:
            log.info(
                "a %s grammar compiled in %.2f s could not be sent back by its compile process (%s); "
                "compiling it in-process, for memory only",
                spec.kind,
                e.compile_s,
                e.why,
            )
            return self._compile_in_process(key, spec, fidelity, started + e.waited_s)
        except GrammarCompileTimeout:
            raise  # counted by each waiter
        except GrammarSpecError as e:
            with self._lock:
                self._stats.compile_errors += 1
                if isinstance(e, GrammarCompileMemoryError):
                    self._stats.compile_memory_errors += 1
            raise
        compiled = grammar_from_json(text, self.tokenizer_info)
        self._count_compile(started)
        handle = self._handle(key, spec.kind, compiled, spec, fidelity)
        self._memory.put(key, handle)
        if self._disk is not None:
            self._disk.store(key, text)
        return handle

    def _compile_in_process(
        self, key: str, spec: GrammarSpec, fidelity: FidelityReport | None, started: float
    ) -> CompiledGrammarHandle:
        """A spec whose grammar a compile process could not serialize, compiled on this worker thread
        (bounded: the process compiled it within the limits) and kept in memory only."""
        with self._lock:
            if self._local_compiler is None:
                self._local_compiler = xgr.GrammarCompiler(self.tokenizer_info, max_threads=1, cache_enabled=False)
            compiler = self._local_compiler
            if len(self._unserializable) >= 4096:
                self._unserializable.clear()
            self._unserializable[key] = None
        compiled = compile_spec(compiler, spec)
        self._count_compile(started)
        with self._lock:
            self._stats.compile_unserializable += 1
        handle = self._handle(key, spec.kind, compiled, spec, fidelity)
        self._memory.put(key, handle)
        return handle

    def _compile_llguidance(
        self, key: str, spec: GrammarSpec, fidelity: FidelityReport, started: float
    ) -> LLGuidanceHandle:
        grammar = llguidance_grammar(spec.payload, strict=spec.strict)
        start = compile_llguidance(self._llg_tokenizer.get(), grammar, "JSON schema", spec.param)
        self._count_compile(started)
        rules = self._rollback_rules(spec, fidelity)
        handle = LLGuidanceHandle(
            key,
            spec.kind,
            grammar,
            start,
            frozenset(self.stop_token_ids),
            fidelity,
            value_check=self._value_vocab,
            rollback_rules=rules,
            navigator=navigator_for(spec.kind, spec.payload, spec.strict),
            closing=self._closing_vocab,
            encode=self._encode,
        )
        self._memory.put(key, handle)
        return handle

    def _count_compile(self, started: float) -> None:
        elapsed = time.perf_counter() - started
        with self._lock:
            self._stats.compile_seconds_total += elapsed
            self._stats.compile_seconds_max = max(self._stats.compile_seconds_max, elapsed)

    def _rollback_rules(self, spec: GrammarSpec | None, fidelity: FidelityReport | None) -> RollbackRules | None:
        """Check-and-roll-back for a JSON schema or tools whose report counts on it (keywords only
        validation detects, with `value_retries` > 0: grammar/validation/fidelity.py's `spec_fidelity`)."""
        if spec is None or not uses_rollback(fidelity):
            return None
        self._rollback_vocab.index()  # else the first rewrite builds it, inside one answer's decode
        if spec.kind == "tool_calls":
            functions = [t["function"] for t in spec.payload.get("tools") or []]
            fmt = get_tool_call_format(spec.payload.get("format", HERMES_TOOL_CALL_FORMAT.name))
            schemas = {f["name"]: arguments_schema(f) for f in functions}
            if fmt is HERMES_TOOL_CALL_FORMAT:
                return ToolCallRollbackRules(schemas, fmt.call_begin, self._rollback_vocab, self.value_retries)
            if not fmt.value_checked:
                return None  # markup arguments: the mask only (docs/tool-formats.md)
            return TagCallRollbackRules(schemas, fmt.header_re(), self._rollback_vocab, self.value_retries)
        return RollbackRules(spec.payload, self._rollback_vocab, self.value_retries)

    def _handle(
        self,
        key: str,
        kind: str,
        compiled: xgr.CompiledGrammar,
        spec: GrammarSpec | None = None,
        fidelity: FidelityReport | None = None,
    ) -> CompiledGrammarHandle:
        if fidelity is None and spec is not None:
            fidelity = spec_fidelity(spec.kind, spec.payload, spec.strict, self.value_retries)
        rules = self._rollback_rules(spec, fidelity)
        json_kind = kind in VALUE_CHECK_KINDS and (spec is None or value_checked(kind, spec.payload))
        return CompiledGrammarHandle(
            key,
            kind,
            compiled,
            self._encode,
            self._special_ids,
            self._closing_vocab,
            _splitter=self.draft_splitter,
            fidelity=fidelity,
            rollback_rules=rules,
            value_check=self._value_vocab if json_kind else None,
            navigator=(navigator_for(kind, spec.payload, spec.strict) if json_kind and spec else None),
            value_check_begin=value_check_begin(kind, spec.payload) if spec else None,
        )
