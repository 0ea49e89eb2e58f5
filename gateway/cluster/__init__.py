"""Scale-out: N engine replicas on Ray Serve behind a prefix-aware router (`jumpgate serve --replicas N`).

Only `jumpgate serve --replicas` imports this package's Ray-facing modules; single-process serving
never imports Ray. `prefix_keys` and `routing_policy` are pure Python (unit-tested without Ray).
"""
