"""One xgrammar compile at a time in a child process that can be killed.

xgrammar compiles in C++ and cannot be interrupted; one runaway schema used to keep a thread busy
(and its memory growing) in the server until the compile finished, however long that took. Here
each compile runs in a child process holding its own `xgr.GrammarCompiler`, built once from the
tokenizer info the parent serializes. The child answers with the compiled grammar's
`serialize_json()` text; the parent deserializes it with its own TokenizerInfo
(`grammar.cache.grammar_from_json`) and can write the same text to the disk cache.

- Past its deadline the compile is killed (SIGKILL) and `GrammarCompileTimeout` raised.
- The child runs under an address-space limit (RLIMIT_AS, set to what it holds once ready plus
  `memory_limit_bytes`; None: no limit), so a compile that eats memory fails (or the child dies)
  instead of growing until the machine runs out: `GrammarCompileMemoryError`, a 400.
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

from grammar.errors import GrammarCompileMemoryError, GrammarCompileTimeout, GrammarServiceBusy, GrammarSpecError

log = logging.getLogger("jumpgate.grammar.compile")

START_TIMEOUT_S = 120.0  # a child deserializes the tokenizer info (tens of ms); a loaded CPU is slower
POLL_S = 0.05  # how often a waiting compile rereads its deadline (waiters that join extend it)

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
        process = _context.Process(target=_child_main, name="jumpgate-grammar-compile", daemon=True,
                                   args=(child_conn, self._tokenizer_json, self.memory_limit_bytes))
        process.start()
        child_conn.close()
        self._process, self._conn, self._ready = process, parent_conn, False

    def compile(self, spec: Any, deadline: Callable[[], float]) -> str:
        """`spec` compiled by the child, as `CompiledGrammar.serialize_json()` text.

        `deadline()` is read again while waiting (it may move later). Raises GrammarSpecError for a
        spec xgrammar refuses, GrammarCompileTimeout past the deadline, GrammarCompileMemoryError
        when the child runs out of memory or dies, GrammarServiceBusy when no child starts."""
        if self._process is not None and not self._process.is_alive():  # died while idle (killed from outside)
            log.warning("grammar compile process %s died while idle (exit code %s); starting another",
                        self._process.pid, self._process.exitcode)
            self._replace()
        self.wait_ready()
        assert self._conn is not None
        self._conn.send((spec.kind, spec.payload, spec.strict))
        while not self._conn.poll(max(0.0, min(POLL_S, deadline() - time.monotonic()))):
            if time.monotonic() >= deadline():
                self._replace()
                raise GrammarCompileTimeout("grammar compile killed at its time limit", "", spec.param)
        try:
            status, *detail = self._conn.recv()
        except (EOFError, OSError):
            code = self._exit_code()
            self._replace()
            raise self._memory_error(spec, f"the compile process died (exit code {code})") from None
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
                f"compiling this {_kind_what(spec)} crashed the grammar compiler ({why}); simplify it",
                "", spec.param)
        return GrammarCompileMemoryError(
            f"compiling this {_kind_what(spec)} exceeded the grammar compiler's memory limit of "
            f"{_gib(self.memory_limit_bytes)} GiB ({why}); simplify it (fewer alternatives, smaller "
            "bounds, shallower nesting)", "", spec.param)


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
    from grammar.compile import compile_spec
    from grammar.spec import GrammarSpec

    try:
        compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.deserialize_json(tokenizer_json),
                                       max_threads=1, cache_enabled=False)
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
        try:
            reply: tuple = ("ok", compile_spec(compiler, GrammarSpec(kind, payload, strict)).serialize_json())
        except BaseException as e:  # noqa: BLE001 - the parent names it
            if _out_of_memory(e) or _out_of_memory(e.__cause__):  # compile_spec wraps xgrammar's bad_alloc
                reply = ("memory", "an allocation failed")
            elif isinstance(e, GrammarSpecError):
                reply = ("spec_error", e.message, e.pointer, e.param)
            else:
                reply = ("error", f"{type(e).__name__}: {e}")
        try:
            conn.send(reply)
        except MemoryError:
            conn.send(("memory", "the compiled grammar did not fit to be sent"))
        del reply


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
