"""Turn a validated GrammarSpec into an xgrammar CompiledGrammar, by its kind (grammar/kinds/).

Every kind compiles from its canonical payload, so two specs that share a cache key always share
a grammar; xgrammar's refusals become GrammarSpecErrors that name the kind.
"""

from __future__ import annotations

from typing import Any

import xgrammar as xgr

from grammar.errors import XGRAMMAR_ERRORS, GrammarSpecError, xgrammar_message
from grammar.kinds import kind_for

# Bump when the way specs are compiled changes: it is part of the cache key, so grammars
# compiled under an older policy are never loaded from disk.
COMPILE_POLICY_VERSION = 9  # 2: length-bounded JSON strings refuse raw control characters; 3: the exact
# rewrites of grammar/rewrites/lowering.py; 4: optional regex groups as {0,1} (grammar/validation/regex_check.py);
# 5: an allOf of object schemas as one object, keywords beside an anyOf in its branches (grammar/rewrites/all_of.py);
# 6: unevaluatedProperties false beside an allOf closes the union of its parts (all_of.py `_closed_union`)
# 7: xgrammar's mask narrows a property both branches of an if declare (conditionals.py `narrow_by_branches`)
# 8: an allOf part naming only a closed part's properties merges; xgrammar's mask distributes a left-out oneOf
# 9: xgrammar's mask also takes a presence/listed conditional and an exclusive oneOf as alternatives; listings intersect


def compile_spec(compiler: xgr.GrammarCompiler, spec: Any) -> xgr.CompiledGrammar:
    """Compile a spec already checked by `validate_spec`; xgrammar refusals become GrammarSpecError."""
    kind = kind_for(spec.kind, spec.param)
    try:
        return kind.compile(compiler, spec)
    except GrammarSpecError:
        raise
    except XGRAMMAR_ERRORS as e:
        raise GrammarSpecError(f"{kind.what} cannot be compiled: {xgrammar_message(e)}", "", spec.param) from e
