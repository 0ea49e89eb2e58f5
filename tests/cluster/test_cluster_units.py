"""Cluster pieces that need no running cluster: the CLI hook (and that single-process serving never
imports Ray), grammars travelling as their spec, stats aggregation, replica error mapping."""

from __future__ import annotations

import asyncio
import pickle
import subprocess
import sys

import pytest

from gateway.cli import build_parser
from gateway.cluster import grammar_bridge
from gateway.cluster.settings import ClusterSettings, with_shared_folders
from runtime.settings_fields import from_args


def test_single_process_serving_imports_no_ray():
    code = (
        "import sys, gateway.cli, gateway.app\n"
        "from gateway.cli import build_parser, serve_settings\n"
        "serve_settings(build_parser().parse_args(['serve']), environ={})\n"
        "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_cluster_flags_map_through():
    args = build_parser().parse_args(
        [
            "serve",
            "--replicas",
            "3",
            "--ray-address",
            "ray://h:10001",
            "--replica-cpus",
            "0.5",
            "--replica-gpus",
            "1",
            "--routing-policy",
            "power_of_two",
            "--router-cache-threshold",
            "0.3",
            "--router-balance-abs-threshold",
            "8",
            "--router-balance-rel-threshold",
            "2",
            "--router-stats-period",
            "0.25",
            "--gateway-replicas",
            "2",
            "--gateway-cpus",
            "0.5",
        ]
    )
    c = from_args(ClusterSettings, args)
    assert (c.replicas, c.ray_address, c.replica_cpus, c.replica_gpus, c.routing_stats_period_s) == (
        3,
        "ray://h:10001",
        0.5,
        1.0,
        0.25,
    )
    assert (c.gateway_replicas, c.gateway_cpus) == (2, 0.5)
    assert c.router_kwargs() == {
        "policy": "power_of_two",
        "cache_threshold": 0.3,
        "balance_abs_threshold": 8,
        "balance_rel_threshold": 2.0,
    }
    default = from_args(ClusterSettings, build_parser().parse_args(["serve"]))
    assert default.replicas is None and (default.gateway_replicas, default.gateway_cpus) == (1, 0.0)


def test_replicas_get_the_shared_folders_as_absolute_paths(tmp_path, monkeypatch):
    """A replica runs in another working directory: a relative --disk-cache-dir must still name
    the one folder every replica shares (and the gateway's grammar folder likewise)."""
    from gateway.cli import serve_settings

    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(
        [
            "serve",
            "--replicas",
            "2",
            "--host-pool-tokens",
            "1024",
            "--disk-cache-dir",
            "shared/kv",
            "--grammar-cache-dir",
            "shared/grammars",
        ]
    )
    config = serve_settings(args, environ={})
    engine, grammar = with_shared_folders(config.engine, config.grammar)
    assert engine.disk_cache_dir == str(tmp_path / "shared" / "kv")
    assert grammar.cache_dir == str(tmp_path / "shared" / "grammars")
    assert engine.host_pool_tokens == 1024 and config.engine.disk_cache_dir == "shared/kv"  # a copy
    untouched, _ = with_shared_folders(
        from_args(type(config.engine), build_parser().parse_args(["serve"])), config.grammar
    )
    assert untouched.disk_cache_dir is None


@pytest.mark.parametrize(
    "bad",
    [
        ["--replicas", "0"],
        ["--routing-policy", "random"],
        ["--router-cache-threshold", "1.5"],
        ["--gateway-replicas", "0"],
    ],
)
def test_bad_cluster_flags_are_refused(bad, capsys):
    from gateway.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["serve", *bad])
    assert exit_.value.code == 2 and bad[0] in capsys.readouterr().err


class FakeHandle:
    def __init__(self, name):
        self.name = name

    def new_matcher(self):
        return f"matcher of {self.name}"

    def min_completion_tokens(self):
        return 3


class FakeGrammarService:
    def __init__(self):
        self.compiled = []

    def compile(self, spec):
        self.compiled.append(spec)
        return FakeHandle(spec)

    def stats(self):
        return "stats"


def test_a_constraint_travels_as_its_spec_and_is_rebuilt_by_the_replicas_service():
    gateway_side = grammar_bridge.ClusterGrammarService(FakeGrammarService())
    constraint = gateway_side.compile("spec-1")
    assert constraint.new_matcher() == "matcher of spec-1" and constraint.min_completion_tokens() == 3
    assert gateway_side.stats() == "stats"
    # what the gateway awaits: the same compile, on a worker thread
    awaited = asyncio.run(gateway_side.compile_async("spec-0"))
    assert awaited.new_matcher() == "matcher of spec-0" and awaited.spec == "spec-0"
    replica_side = FakeGrammarService()
    try:
        grammar_bridge.use_replica_grammar(None)  # a process that is not a replica
        with pytest.raises(RuntimeError):
            pickle.loads(pickle.dumps(constraint))
        grammar_bridge.use_replica_grammar(replica_side)
        rebuilt = pickle.loads(pickle.dumps(constraint))
        assert isinstance(rebuilt, FakeHandle) and replica_side.compiled == ["spec-1"]
    finally:
        grammar_bridge.use_replica_grammar(None)


def test_stats_add_up_and_the_hit_rate_is_recomputed():
    pytest.importorskip("ray")
    from gateway.cluster.client import sum_stats

    total = sum_stats(
        [
            {"prompt_tokens": 100, "cached_prompt_tokens": 90, "requests_finished": {"stop": 2}, "x": "a"},
            {"prompt_tokens": 100, "cached_prompt_tokens": 10, "requests_finished": {"stop": 1, "length": 4}},
            {"lookup_row_cost": 0.2},
            {"lookup_row_cost": 0.4},
        ]
    )
    assert (total.prompt_tokens, total.cached_prompt_tokens, total.prefix_hit_rate) == (200, 100, 0.5)
    assert total.lookup_row_cost == pytest.approx(0.3)  # a share: the replicas' mean, not their sum
    assert total.requests_finished == {"stop": 3, "length": 4}


def test_replica_failures_become_engine_errors():
    pytest.importorskip("ray")
    from ray.exceptions import ActorDiedError

    from gateway.cluster.client import engine_error_of
    from runtime.api import EngineError

    refused = EngineError("too long", "context_length_exceeded", "messages")
    assert vars(engine_error_of(refused)) == vars(refused)
    wrapped = RuntimeError("wrapped")
    wrapped.cause = refused  # how Ray's RayTaskError carries the replica's exception
    assert engine_error_of(wrapped).code == "context_length_exceeded"
    assert engine_error_of(ActorDiedError()).code == "engine_stopped"


class FakeReplica:
    """What PrefixAwareRouter reads of a ray.serve.request_router.RunningReplica."""

    def __init__(self, name, routing_stats=None):
        self.replica_id = type("ReplicaID", (), {"unique_id": name})()
        self.routing_stats = routing_stats or {}


def pending(method, *args):
    meta = type("Metadata", (), {"call_method": method})()
    return type("PendingRequest", (), {"args": list(args), "kwargs": {}, "metadata": meta})()


def make_router(**kwargs):
    pytest.importorskip("ray")
    from gateway.cluster.router import PrefixAwareRouter

    router = PrefixAwareRouter.__new__(PrefixAwareRouter)  # the state alone; Ray's plumbing is not needed
    router.initialize_state(**kwargs)
    return router


def choose(router, replicas, request):
    import asyncio

    ranks = asyncio.run(router.choose_replicas(replicas, request))
    return ranks[0][0].replica_id.unique_id


def test_router_sends_a_conversation_back_where_its_prefix_went():
    from gateway.cluster.prefix_keys import prefix_keys
    from runtime.api import GenerateRequest

    router = make_router()
    replicas = [FakeReplica("r0"), FakeReplica("r1")]
    system = list(range(500, 628))
    first = choose(router, replicas, pending("generate", GenerateRequest(prompt_ids=system + [1])))
    router.on_request_routed(None, replicas[0 if first == "r0" else 1].replica_id, None)
    turn_two = GenerateRequest(prompt_ids=system + [1, 2, 3] * 20)
    assert choose(router, replicas, pending("generate", turn_two)) == first  # sticks though it is busier
    assert choose(router, replicas, pending("unpin_prefix", system, "")) == first
    other = GenerateRequest(prompt_ids=system + [1], namespace="tenant-b")
    assert choose(router, replicas, pending("generate", other)) != first  # idler one: no shared prefix
    # a replica's own report counts too (e.g. what another gateway's router sent it)
    reported = FakeReplica("r2", {"prefix_keys": prefix_keys(list(range(900, 1028)))})
    assert (
        choose(router, [*replicas, reported], pending("generate", GenerateRequest(prompt_ids=list(range(900, 1028)))))
        == "r2"
    )


def test_router_forgets_a_replica_that_is_gone_and_honours_its_policy():
    from runtime.api import GenerateRequest

    router = make_router()
    system = GenerateRequest(prompt_ids=list(range(64)))
    assert choose(router, [FakeReplica("r0")], pending("generate", system)) == "r0"
    assert "r0" in router.sent
    choose(router, [FakeReplica("r1")], pending("generate", system))
    assert "r0" not in router.sent  # a restarted replica comes back empty, under another id
    rr = make_router(policy="round_robin")
    replicas = [FakeReplica("a"), FakeReplica("b")]
    assert [choose(rr, replicas, pending("generate", system)) for _ in range(3)] == ["a", "b", "a"]
    with pytest.raises(ValueError):
        make_router(policy="sticky")
