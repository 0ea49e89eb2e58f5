"""One xgrammar compile at a time in a child process that can be killed.

xgrammar compiles in C++ and cannot be interrupted; one runaway schema used to keep a thread busy
(and its memory growing) in the server until the compile finished, however long that took. Here
each compile runs in a child process holding its own `xgr.GrammarCompiler`, built once from the
tokenizer info the parent serializes. The child answers with the compiled grammar's
`serialize_json()` text; the parent deserializes it with its own TokenizerInfo
(`grammar.service.cache.grammar_from_json`) and can write the same text to the disk cache.

Serializing can cost far more than compiling: xgrammar 0.2.9 writes the grammar's whole FSM once
per rule (`per_rule_fsms`), so a schema with n required properties serializes to O(n^2) text (1000
properties: 0.1 s to compile, 2 MB in memory, 7 s and ~2.4 GB to serialize to 176 MB; 4000: 1.4 s
to compile, past 3 GB to serialize). So the child reports `compiled` (with the compile's seconds) as
soon as the compile is done, and serializes under a tighter soft address-space limit
(`SERIALIZE_MIN_BYTES`, or `SERIALIZE_FACTOR` times the grammar's size if more, never above the
compile's limit). A serialization that fails that limit, or would leave the parent too little of the
deadline to compile the spec itself, or take longer than compiling it again (`SERIALIZE_WORTH_*`:
reading the text back would cost more than that too), raises `GrammarUnserializable`: not a refusal, the service then
compiles the spec in-process (the child has just shown the compile fits the limits) and keeps the
grammar in memory only.

- Past its deadline the compile is killed (SIGKILL) and `GrammarCompileTimeout` raised.
- The child runs under an address-space limit (RLIMIT_AS, set to what it holds once ready plus
  `memory_limit_bytes`; None: no limit), so a compile that eats memory fails (or the child dies)
  instead of growing until the machine runs out: `GrammarCompileMemoryError`, a 400. A failed
  allocation is caught in the child and reported; a child that dies instead (the kernel's OOM killer,
  a kill from outside), while compiling or serializing, is a `GrammarCompileMemoryError` too.
- A killed or dead child is replaced at once, so the next compile does not wait for its start.
- A child never outlives the server: a thread in it waits on the parent's sentinel (a pipe that
  reaches EOF when the parent dies, however it dies) and exits the child then, even mid-compile.

Children come from multiprocessing's forkserver (never a plain fork of the server, whose torch and
OpenMP threads a fork would break): the fork server imports this module, and with it xgrammar, once
per server process, so a child starts in tens of milliseconds instead of the seconds an import takes.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import resource
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

import xgrammar as xgr

from grammar.errors import (
    GrammarCompileMemoryError,
    GrammarCompileTimeout,
    GrammarServiceBusy,
    GrammarSpecError,
    GrammarUnserializable,
)

log = logging.getLogger("jumpgate.grammar.compile")

START_TIMEOUT_S = 120.0  # a child deserializes the tokenizer info (tens of ms); a loaded CPU is slower
POLL_S = 0.05  # how often a waiting compile rereads its deadline (waiters that join extend it)
# The address space serializing a compiled grammar may add (serialize_json peaks near 18x its text,
# e.g. ~840 MB for a 20k-value enum of 62 MB): past it the grammar is compiled in-process instead.
SERIALIZE_MIN_BYTES = 1 << 30
SERIALIZE_FACTOR = 24  # times CompiledGrammar.memory_size_bytes
# The parent stops waiting for the serialized text when less than this many times the compile's own
# seconds are left before the deadline (it needs about that long to compile the spec itself).
FALLBACK_MARGIN = 1.5
# ... and once the text is later than this many times the compile's seconds (at least the floor):
# reading it back would then cost more than compiling again (SchemaStore's bitbucket-pipelines:
# 0.2 s to compile, 5.7 s to serialize to 56 MB and 2.6 s to read back, past the 10 s limit on a
# loaded machine). Such a grammar is compiled in-process and kept in memory only.
SERIALIZE_WORTH_FACTOR = 2.0
SERIALIZE_WORTH_FLOOR_S = 0.5

_context = multiprocessing.get_context("forkserver")
_context.set_forkserver_preload([__name__])  # has effect only before the fork server first starts


class CompileProcess:
    """The parent's handle on one compile child; one caller at a time (a compile worker thread)."""

    def __init__(self, tokenizer_json: str, memory_limit_bytes: int | None) -> None:
        self._tokenizer_json = tokenizer_json
        self.memory_limit_bytes = memory_limit_bytes
        self._process: Any = None
        self._conn: Connection | None = None
        self._ready = False
        self.replaced = 0  # children killed or found dead and started again

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self) -> None:
        """Start the child if none is running (`wait_ready` waits until it can compile)."""
        if self._process is not None:
            return
        parent_conn, child_conn = _context.Pipe()
        process = _context.Process(
            target=_child_main,
            name="jumpgate-grammar-compile",
            daemon=True,
            args=(child_conn, self._tokenizer_json, self.memory_limit_bytes),
        )
        process.start()
        child_conn.close()
        self._process, self._conn, self._ready = process, parent_conn, False

    def compile(self, spec: Any, deadline: Callable[[], float]) -> str:
        """`spec` compiled by the child, as `CompiledGrammar.serialize_json()` text.

        `deadline()` is read again while waiting (it may move later). Raises GrammarSpecError for a
        spec xgrammar refuses, GrammarCompileTimeout past the deadline, GrammarCompileMemoryError
        when the child runs out of memory or dies, GrammarServiceBusy when no child starts, and
        GrammarUnserializable when the spec compiled but its grammar cannot be sent back (too much
        memory to serialize, or serializing would leave too little time to compile it here)."""
        if self._process is not None and not self._process.is_alive():  # died while idle (killed from outside)
            log.warning(
                "grammar compile process %s died while idle (exit code %s); starting another",
                self._process.pid,
                self._process.exitcode,
            )
            self._replace()
        self.wait_ready()
        assert self._conn is not None
        self._conn.send((spec.kind, spec.payload, spec.strict))
        reply = self._reply(spec, deadline)
        if reply is None:
            raise GrammarCompileTimeout("grammar compile killed at its time limit", "", spec.param)
        status, *detail = reply
        if status == "compiled":  # now serializing; the text (or why not) comes next
            compile_s = detail[0]
            margin = FALLBACK_MARGIN * compile_s
            worth_until = time.monotonic() + max(SERIALIZE_WORTH_FLOOR_S, SERIALIZE_WORTH_FACTOR * compile_s)
            # Wait for the text while the parent could still compile the spec itself in time and
            # the text is worth more than a compile here; when not even that time is left, only
            # the text can make it: wait for it until the deadline.
            fallback = deadline() - margin > time.monotonic()
            until = (lambda: min(deadline() - margin, worth_until)) if fallback else deadline
            reply = self._reply(spec, until, " while serializing")
            if reply is None:
                if fallback:
                    raise GrammarUnserializable("serializing the grammar costs more than compiling it again", compile_s)
                raise GrammarCompileTimeout("grammar compile killed at its time limit", "", spec.param)
            status, *detail = reply
            if status == "unserializable":
                self._replace()  # it held gigabytes a moment ago: start clean
                raise GrammarUnserializable(detail[0], compile_s)
        if status == "ok":
            return detail[0]
        if status == "spec_error":
            raise GrammarSpecError(*detail)
        if status == "memory":
            self._replace()  # a failed allocation may have left the compiler in any state
            raise self._memory_error(spec, detail[0])
        raise GrammarSpecError(f"{_kind_what(spec)} cannot be compiled: {detail[0]}", "", spec.param)

    def kill(self) -> None:
        """Stop the child now (SIGKILL) and reap it; `start` makes a new one."""
        process, conn = self._process, self._conn
        self._process, self._conn, self._ready = None, None, False
        if conn is not None:
            conn.close()
        if process is not None:
            if process.is_alive():
                process.kill()
            process.join(10)
            process.close()

    def wait_ready(self) -> None:
        """Start the child if needed and wait until it is ready (GrammarServiceBusy if it fails)."""
        self.start()
        if self._ready:
            return
        assert self._conn is not None
        try:
            if self._conn.poll(START_TIMEOUT_S):
                status, detail = self._conn.recv()
                if status == "ready":
                    self._ready = True
                    return
            else:
                status, detail = "timeout", f"not ready after {START_TIMEOUT_S:g} s"
        except (EOFError, OSError) as e:
            status, detail = "died", f"exit code {self._exit_code()} ({e.__class__.__name__})"
        self.kill()
        log.error("grammar compile process failed to start: %s %s", status, detail)
        raise GrammarServiceBusy(f"the grammar compile process failed to start ({detail})")

    # -- internals -------------------------------------------------------------------------

    def _reply(self, spec: Any, until: Callable[[], float], during: str = "") -> tuple | None:
        """The child's next message, or None (the child killed and replaced) once `until()` passed."""
        assert self._conn is not None
        while not self._conn.poll(max(0.0, min(POLL_S, until() - time.monotonic()))):
            if time.monotonic() >= until():
                self._replace()
                return None
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            code = self._exit_code()
            self._replace()
            raise self._memory_error(spec, f"the compile process died{during} (exit code {code})") from None

    def _replace(self) -> None:
        """Kill the child and start the next one now, so the next compile need not wait for it."""
        self.kill()
        self.replaced += 1
        try:
            self.start()
        except Exception:  # the next compile starts one again (and reports why it cannot)
            log.exception("could not start a grammar compile process")

    def _exit_code(self) -> int | None:
        if self._process is None:
            return None
        self._process.join(1)
        return self._process.exitcode

    def _memory_error(self, spec: Any, why: str) -> GrammarCompileMemoryError:
        log.warning("grammar compile of a %s spec failed: %s", spec.kind, why)
        if self.memory_limit_bytes is None:
            return GrammarCompileMemoryError(
                f"compiling this {_kind_what(spec)} crashed the grammar compiler ({why}); simplify it", "", spec.param
            )
        return GrammarCompileMemoryError(
            f"compiling this {_kind_what(spec)} exceeded the grammar compiler's memory limit of "
            f"{_gib(self.memory_limit_bytes)} GiB ({why}); simplify it (fewer alternatives, smaller "
            "bounds, shallower nesting)",
            "",
            spec.param,
        )


def warm_up() -> None:
    """Start the fork server now (in the background), so the first child starts fast."""
    from multiprocessing import forkserver

    forkserver.ensure_running()


def _kind_what(spec: Any) -> str:
    from grammar.kinds import KINDS

    kind = KINDS.get(spec.kind)
    return kind.what if kind is not None else "grammar"


def _gib(n: int) -> str:
    return f"{n / (1 << 30):g}"


# -- the child ---------------------------------------------------------------------------------


def _child_main(conn: Connection, tokenizer_json: str, memory_limit_bytes: int | None) -> None:
    _exit_with_parent()
    from grammar.service.compile import compile_spec
    from grammar.spec import GrammarSpec

    try:
        compiler = xgr.GrammarCompiler(
            xgr.TokenizerInfo.deserialize_json(tokenizer_json), max_threads=1, cache_enabled=False
        )
        if memory_limit_bytes is not None:
            limit = _address_space_bytes() + memory_limit_bytes
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which logs it
        conn.send(("failed", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready", None))
    while True:
        try:
            kind, payload, strict = conn.recv()
        except (EOFError, OSError):  # the parent closed the pipe or died
            return
        started = time.perf_counter()
        try:
            compiled = compile_spec(compiler, GrammarSpec(kind, payload, strict))
        except BaseException as e:  # noqa: BLE001 - the parent names it
            if _out_of_memory(e) or _out_of_memory(e.__cause__):  # compile_spec wraps xgrammar's bad_alloc
                reply: tuple = ("memory", "an allocation failed")
            elif isinstance(e, GrammarSpecError):
                reply = ("spec_error", e.message, e.pointer, e.param)
            else:
                reply = ("error", f"{type(e).__name__}: {e}")
        else:
            conn.send(("compiled", time.perf_counter() - started))
            reply = _serialized(compiled)
            del compiled
        try:
            conn.send(reply)
        except MemoryError:
            conn.send(("unserializable", "the serialized grammar did not fit to be sent"))
        del reply


def _serialized(compiled: xgr.CompiledGrammar) -> tuple:
    """("ok", serialize_json() text), or ("unserializable", why) when serializing fails its memory
    limit: a soft RLIMIT_AS lowered to what the process holds plus the serialization budget for this
    grammar, and restored after (the hard limit, the compile's, stays: it can be lowered only)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    budget = max(SERIALIZE_MIN_BYTES, SERIALIZE_FACTOR * compiled.memory_size_bytes)
    limit = _address_space_bytes() + budget
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    try:
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
        return ("ok", compiled.serialize_json())
    except BaseException as e:  # noqa: BLE001 - the parent names it
        if _out_of_memory(e):
            return ("unserializable", f"serializing the grammar needs more than {_gib(budget)} GiB")
        return ("error", f"{type(e).__name__}: {e}")
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _out_of_memory(e: BaseException | None) -> bool:
    return isinstance(e, MemoryError) or (isinstance(e, RuntimeError) and "bad_alloc" in str(e))


def _exit_with_parent() -> None:
    """A daemon thread that ends this process as soon as the parent is gone."""
    parent = multiprocessing.parent_process()
    if parent is None or parent.sentinel is None:
        return

    def watch() -> None:
        wait([parent.sentinel])
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _address_space_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
