"""`validate_spec`: any GrammarSpec checked by its kind before it is compiled.

Each kind's checks live with the kind (grammar/kinds/); this module adds the memo that makes a
repeated spec cost one dict lookup.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Any

from grammar.kinds import kind_for


def validate_spec(spec: Any) -> None:
    """Validate any GrammarSpec by kind (raises GrammarSpecError).

    Validity depends only on the canonical spec, so passing specs are remembered: a request that
    repeats the same tools does not pay for meta-schema validation again (~1 ms per schema).
    """
    memo_key = hashlib.sha256(spec.canonical.encode()).digest()  # also: kind, size, depth limits
    with _validated_lock:
        if memo_key in _validated:
            _validated.move_to_end(memo_key)
            return
    kind_for(spec.kind, spec.param).validate(spec)
    with _validated_lock:
        _validated[memo_key] = None
        while len(_validated) > _VALIDATED_MAX:
            _validated.popitem(last=False)


_VALIDATED_MAX = 4096
_validated: OrderedDict[bytes, None] = OrderedDict()
_validated_lock = threading.Lock()
