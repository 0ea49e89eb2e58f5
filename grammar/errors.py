"""Errors raised by `grammar/`: every refusal says what is wrong and where.

`pointer` is a JSON pointer (RFC 6901) into the offending request parameter (`param`), so the
gateway can answer a 400 that names the exact part of a schema to fix, e.g.
`param="response_format", pointer="/properties/age/minimum"`.
"""

from __future__ import annotations

import re

# xgrammar raises these for input it refuses (its own errors subclass RuntimeError)
XGRAMMAR_ERRORS = (RuntimeError, ValueError, TypeError)
_XGRAMMAR_LOG_PREFIX = re.compile(r"^\s*\[[\d:]+\]\s+\S+:\d+:\s*")


def escape_pointer_token(token: object) -> str:
    """One JSON-pointer reference token (`~` and `/` escaped as RFC 6901 says)."""
    return str(token).replace("~", "~0").replace("/", "~1")


def xgrammar_message(error: BaseException) -> str:
    """xgrammar's message without its log prefix ("[08:47:33] /project/cpp/x.cc:94: ")."""
    text = str(error).strip()
    return _XGRAMMAR_LOG_PREFIX.sub("", text).strip() or type(error).__name__


def join_pointer(base: str, *tokens: object) -> str:
    return base + "".join("/" + escape_pointer_token(t) for t in tokens)


class GrammarError(Exception):
    """Base of every error raised by `grammar/`."""


class GrammarSpecError(GrammarError, ValueError):
    """A grammar spec (schema, regex, EBNF, tools) that Jumpgate refuses; a client error (400)."""

    def __init__(self, message: str, pointer: str = "", param: str | None = None) -> None:
        self.message = message
        self.pointer = pointer
        self.param = param
        super().__init__(self.__str__())

    def __str__(self) -> str:
        where = ""
        if self.param or self.pointer:
            where = f" (at {self.param or ''}{self.pointer or ''})" if self.pointer else f" (in {self.param})"
        return f"{self.message}{where}"

    def with_context(self, param: str | None = None, pointer_prefix: str = "") -> GrammarSpecError:
        """The same error re-rooted under a larger document (e.g. a tool's parameters)."""
        return type(self)(self.message, pointer_prefix + self.pointer, param or self.param)


class GrammarCompileTimeout(GrammarSpecError):
    """Compiling took longer than the service's limit; the spec is refused as too complex.

    The compile is killed at the limit (grammar/service/compile_process.py), so it never occupies a
    worker, the CPU or memory after its request has been answered.
    """


class GrammarCompileMemoryError(GrammarSpecError):
    """Compiling needed more memory than a compile process may use (or crashed it); the spec is
    refused as too complex (400)."""


class GrammarServiceBusy(GrammarError):
    """The compile workers cannot take a job (shut down, or a compile process would not start);
    a server-side condition (503)."""


class GrammarUnserializable(GrammarError):
    """A compile process compiled the spec but could not send the grammar back: xgrammar's
    `serialize_json()` ran past the memory the process allows for it, or past the time left for it
    (grammar/service/compile_process.py). Not a refusal: the service compiles the spec in-process instead
    (grammar/service/service.py). `compile_s` is how long the compile itself took in the child."""

    def __init__(self, why: str, compile_s: float) -> None:
        super().__init__(why)
        self.why = why
        self.compile_s = compile_s
        self.waited_s = 0.0  # set by the worker pool: time spent waiting for the process to start
