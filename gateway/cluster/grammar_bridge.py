"""Compiled grammars across processes: the gateway compiles (and so validates) a spec, a replica
rebuilds the same grammar from the spec, finding it in the shared compiled-grammar disk cache.

A compiled handle holds xgrammar objects and tokenizer closures that should not travel per request;
`SharedConstraint` pickles as its `GrammarSpec` only, and unpickles in a replica through that
replica's own GrammarService (registered with `use_replica_grammar`).
"""

from __future__ import annotations

import asyncio
from typing import Any

_replica_grammar: Any = None  # this process's GrammarService, in a replica


def use_replica_grammar(service: Any) -> None:
    """Register this process's GrammarService (a replica's; None: none, as in the gateway)."""
    global _replica_grammar
    _replica_grammar = service


def rebuild_constraint(spec: Any) -> Any:
    """Unpickling hook, run in the replica: its own compiled handle for `spec`."""
    if _replica_grammar is None:
        raise RuntimeError("a grammar-constrained request reached a process without a grammar service")
    return _replica_grammar.compile(spec)


class SharedConstraint:
    """The gateway's compiled handle (used as is in the gateway) that travels as its spec."""

    def __init__(self, spec: Any, handle: Any):
        self.spec = spec
        self.handle = handle

    def new_matcher(self) -> Any:
        return self.handle.new_matcher()

    def __getattr__(self, name: str) -> Any:  # min_completion_tokens, key, kind, ...
        if name in ("spec", "handle"):
            raise AttributeError(name)
        return getattr(self.handle, name)

    def __reduce__(self):
        return (rebuild_constraint, (self.spec,))


class ClusterGrammarService:
    """The gateway's GrammarService, returning handles that can be sent to a replica."""

    def __init__(self, inner: Any):
        self.inner = inner

    def compile(self, spec: Any) -> SharedConstraint:
        return SharedConstraint(spec, self.inner.compile(spec))

    async def compile_async(self, spec: Any) -> SharedConstraint:
        """`compile` on a worker thread (what the gateway awaits)."""
        return await asyncio.to_thread(self.compile, spec)

    def __getattr__(self, name: str) -> Any:  # stats, key, get_cached, close, ...
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)
