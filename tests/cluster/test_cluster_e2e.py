"""Two replicas of the real SmolLM2 on a local Ray Serve instance (small KV pools, half a CPU each):
prefix affinity, tenant separation, grammars and the registry through the gateway, and a replica
killed mid-request. One cluster for the module (start-up is most of the cost); the kill test is last.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

ray = pytest.importorskip("ray", reason="the jumpgate[cluster] extra (Ray Serve) is not installed")

from gateway.cluster.client import ClusterEngineClient  # noqa: E402
from gateway.cluster.grammar_bridge import ClusterGrammarService  # noqa: E402
from gateway.cluster.ingress import create_cluster_app  # noqa: E402
from gateway.cluster.launch import start_replicas, stop_replicas  # noqa: E402
from gateway.cluster.routing_log import ROUTING_LOG  # noqa: E402
from gateway.cluster.settings import ClusterSettings  # noqa: E402
from gateway.settings import Settings  # noqa: E402
from gateway.startup import build_grammar_service  # noqa: E402
from grammar.settings import GrammarSettings  # noqa: E402
from runtime.api import EngineError, GenerateRequest  # noqa: E402
from runtime.decode.sampling import SamplingParams  # noqa: E402
from runtime.engine_config import EngineConfig  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

ENGINE = EngineConfig(kv_pool_tokens=3072, num_threads=1, max_running_requests=4, max_waiting_requests=16)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from ray import serve

    shared = tmp_path_factory.mktemp("cluster-shared")
    grammar = GrammarSettings(cache_dir=str(shared / "grammars"))
    handle = start_replicas(ENGINE, grammar, ClusterSettings(replicas=2, replica_cpus=0.5, routing_stats_period_s=0.5))
    client = ClusterEngineClient(handle, ENGINE, 2)
    grammar_service = ClusterGrammarService(build_grammar_service(client, grammar))
    yield client, grammar_service, shared
    grammar_service.close()
    stop_replicas()
    serve.shutdown()
    ray.shutdown()


def generate(client, prompt_ids, namespace="", max_new_tokens=4):
    async def run():
        req = GenerateRequest(
            prompt_ids=prompt_ids,
            sampling=SamplingParams(max_new_tokens=max_new_tokens, temperature=0),
            namespace=namespace,
        )
        return [e async for e in client.submit(req)][-1]

    return asyncio.run(run())


def decisions_since(before):
    now, _ = ROUTING_LOG.snapshot()
    return {k: v - before.get(k, 0) for k, v in now.items() if v - before.get(k, 0)}


def system_prompt(client, name):
    return client.tokenizer.encode(f"You are agent {name}. Follow the {name} procedure carefully. " * 12)


def test_each_prefix_sticks_to_one_replica_and_hits_its_cache(cluster):
    client, _, _ = cluster
    before, _ = ROUTING_LOG.snapshot()
    prompts = {name: system_prompt(client, name) for name in ("alpha", "beta")}
    cached = {name: [] for name in prompts}
    for turn in range(3):
        for name, system in prompts.items():
            last = generate(client, system + client.tokenizer.encode(f" Task {turn}: go."))
            assert last.finish_reason == "length"
            cached[name].append(last.cached_tokens)
    routed = decisions_since(before)
    replicas_of = {}
    for replica, reason in routed:
        replicas_of.setdefault(reason, set()).add(replica)
    assert sum(routed.values()) == 6
    assert sum(n for (_, reason), n in routed.items() if reason == "prefix") == 4  # every repeat by prefix
    assert len({r for r, _ in routed}) == 2  # the two prefixes went to different replicas (the idler one)
    for name, system in prompts.items():
        assert all(c >= len(system) - 32 for c in cached[name][1:]), (name, cached[name])


def test_tenants_share_no_prefix(cluster):
    client, _, _ = cluster
    system = system_prompt(client, "gamma")
    first = generate(client, system + [11, 12], namespace="tenant-one")
    again = generate(client, system + [13, 14], namespace="tenant-one")
    other = generate(client, system + [11, 12], namespace="tenant-two")
    assert first.cached_tokens == 0 and again.cached_tokens >= len(system) - 32
    assert other.cached_tokens == 0  # same text, another namespace: nothing reused


def test_gateway_serves_grammars_and_registry_through_the_cluster(cluster):
    from litestar.testing import TestClient

    client, grammar_service, shared = cluster
    app = create_cluster_app(client, grammar_service, Settings(registry_dir=str(shared / "registry")))
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": False,
    }
    with TestClient(app) as http:
        reg = http.post("/v1/schemas", json={"name": "place", "schema": schema})
        assert reg.status_code in (200, 201), reg.text
        schema_id = reg.json()["id"]
        for constraint in (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "place", "schema": schema}}},
            {"schema_id": schema_id},
        ):
            r = http.post(
                "/v1/chat/completions",
                json={
                    "model": client.info.model_name,
                    "max_tokens": 40,
                    "temperature": 0,
                    "messages": [{"role": "user", "content": "Name a city."}],
                    **constraint,
                },
            )
            assert r.status_code == 200, r.text
            assert set(json.loads(r.json()["choices"][0]["message"]["content"])) == {"city"}
        time.sleep(1.5)  # replicas report their stats every 0.5 s
        metrics = http.get("/metrics").text
        replicas = {
            line.split('replica="')[1].split('"')[0]
            for line in metrics.splitlines()
            if line.startswith("jumpgate_replica_prompt_tokens_total{")
        }
        assert len(replicas) == 2  # one series per replica
        assert any(
            line.startswith("jumpgate_router_decisions_total{") and 'reason="prefix"' in line
            for line in metrics.splitlines()
        )
        assert "jumpgate_replica_prefix_cache_hit_rate{" in metrics
        total = [float(line.split()[-1]) for line in metrics.splitlines() if line.startswith("jumpgate_engine_prompt")]
        assert total and total[0] > 0  # the cluster-wide totals


def test_a_killed_replica_fails_its_requests_and_the_survivor_serves(cluster):
    client, _, _ = cluster
    system = system_prompt(client, "delta")
    before, _ = ROUTING_LOG.snapshot()

    async def stream_then_kill():
        req = GenerateRequest(
            prompt_ids=system, sampling=SamplingParams(max_new_tokens=400, temperature=0, ignore_eos=True)
        )
        events = client.submit(req)
        first = await events.__anext__()
        assert not first.finished
        ((replica, _),) = decisions_since(before)
        kill_replica(replica)
        async for _ in events:
            pass

    with pytest.raises(EngineError) as err:
        asyncio.run(stream_then_kill())
    assert err.value.code == "engine_stopped"
    deadline = time.time() + 60
    while True:  # until the router learns the replica is gone, a request may still be sent to it
        try:
            last = generate(client, system + [5, 6])
            break
        except EngineError as exc:
            assert exc.code == "engine_stopped" and time.time() < deadline
            time.sleep(1)
    assert last.finish_reason in ("stop", "length") and last.error is None
    assert wait_for_running_replicas(2, timeout_s=300)  # Ray Serve replaced the killed one


def wait_for_running_replicas(n: int, timeout_s: float) -> bool:
    from ray import serve

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        states = serve.status().applications["jumpgate"].deployments["engine"].replica_states
        if states.get("RUNNING", 0) >= n:
            return True
        time.sleep(2)
    return False


def kill_replica(replica_id: str) -> None:
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if replica_id in actor["name"] and "REPLICA" in actor["name"]:
            ray.kill(ray.get_actor(actor["name"], namespace=actor["namespace"]), no_restart=True)
            return
    raise AssertionError(f"no actor for replica {replica_id}")
