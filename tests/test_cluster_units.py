"""Cluster pieces that need no running cluster: the CLI hook (and that single-process serving never
imports Ray), grammars travelling as their spec, stats aggregation, replica error mapping."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest

from gateway.cli import build_parser
from gateway.cluster import grammar_bridge
from gateway.cluster.settings import ClusterSettings
from runtime.settings_fields import from_args


def test_single_process_serving_imports_no_ray():
    code = ("import sys, gateway.cli, gateway.app\n"
            "from gateway.cli import build_parser, serve_settings\n"
            "serve_settings(build_parser().parse_args(['serve']), environ={})\n"
            "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_cluster_flags_map_through():
    args = build_parser().parse_args(["serve", "--replicas", "3", "--ray-address", "ray://h:10001",
                                      "--replica-cpus", "0.5", "--replica-gpus", "1", "--routing-policy",
                                      "power_of_two", "--router-cache-threshold", "0.3",
                                      "--router-balance-abs-threshold", "8", "--router-balance-rel-threshold", "2",
                                      "--router-stats-period", "0.25"])
    c = from_args(ClusterSettings, args)
    assert (c.replicas, c.ray_address, c.replica_cpus, c.replica_gpus, c.routing_stats_period_s) == (
        3, "ray://h:10001", 0.5, 1.0, 0.25)
    assert c.router_kwargs() == {"policy": "power_of_two", "cache_threshold": 0.3, "balance_abs_threshold": 8,
                                 "balance_rel_threshold": 2.0}
    assert from_args(ClusterSettings, build_parser().parse_args(["serve"])).replicas is None


@pytest.mark.parametrize("bad", [["--replicas", "0"], ["--routing-policy", "random"],
                                 ["--router-cache-threshold", "1.5"]])
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


def test_a_constraint_travels_as_its_spec_and_is_rebuilt_by_the_replicas_service(monkeypatch):
    gateway_side = grammar_bridge.ClusterGrammarService(FakeGrammarService())
    constraint = gateway_side.compile("spec-1")
    assert constraint.new_matcher() == "matcher of spec-1" and constraint.min_completion_tokens() == 3
    assert gateway_side.stats() == "stats" and gateway_side.compile_async is None
    replica_side = FakeGrammarService()
    monkeypatch.setattr(grammar_bridge, "_replica_grammar", None)
    with pytest.raises(RuntimeError):
        pickle.loads(pickle.dumps(constraint))
    grammar_bridge.use_replica_grammar(replica_side)
    rebuilt = pickle.loads(pickle.dumps(constraint))
    assert isinstance(rebuilt, FakeHandle) and replica_side.compiled == ["spec-1"]


def test_stats_add_up_and_the_hit_rate_is_recomputed():
    pytest.importorskip("ray")
    from gateway.cluster.client import sum_stats

    total = sum_stats([{"prompt_tokens": 100, "cached_prompt_tokens": 90, "prefix_hit_rate": 0.9, "x": "a"},
                       {"prompt_tokens": 100, "cached_prompt_tokens": 10, "prefix_hit_rate": 0.1}])
    assert total == {"prompt_tokens": 200, "cached_prompt_tokens": 100, "prefix_hit_rate": 0.5}


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
