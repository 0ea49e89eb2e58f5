"""API keys: tenants, constant-time checks, namespaces, and the guard on /v1 routes."""

from __future__ import annotations

import pytest

from gateway.auth import Authenticator, tenant_id
from gateway.errors import APIError
from gateway.pipeline.preparation import cache_namespace

MODEL = "SmolLM2-135M-Instruct"


def test_no_keys_means_default_tenant():
    assert Authenticator([]).tenant_for({}) == ""


def test_keys_map_to_stable_distinct_tenants():
    auth = Authenticator(["k1", "k2"])
    t1 = auth.tenant_for({"authorization": "Bearer k1"})
    t2 = auth.tenant_for({"authorization": "bearer k2"})
    assert t1 == tenant_id("k1") != t2 and "k1" not in t1
    assert auth.tenant_for({"x-api-key": "k2"}) == t2


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"authorization": "Bearer nope"},
        {"authorization": "Basic k1"},
        {"authorization": "Bearer "},
        {"authorization": "Bearer k1x"},
    ],
)
def test_bad_credentials_are_401(headers):
    with pytest.raises(APIError) as info:
        Authenticator(["k1"]).tenant_for(headers)
    assert info.value.status == 401 and info.value.code == "invalid_api_key"


def test_compare_is_constant_time(monkeypatch):
    import gateway.auth as auth_mod

    calls = []
    real = auth_mod.hmac.compare_digest
    monkeypatch.setattr(auth_mod.hmac, "compare_digest", lambda a, b: calls.append(1) or real(a, b))
    Authenticator(["a", "b", "c"]).tenant_for({"authorization": "Bearer a"})
    assert len(calls) == 3  # every key compared, no early exit


def test_namespace_is_tenant_plus_salt():
    assert cache_namespace("t1", None) == "t1"
    salted = cache_namespace("t1", "secret")
    assert salted.startswith("t1/") and "secret" not in salted and salted != cache_namespace("t2", "secret")


def test_tenants_isolate_registry_and_cache(gateway_client, fake_engine):
    client = gateway_client(api_keys=["alice", "bob"])
    alice, bob = {"authorization": "Bearer alice"}, {"authorization": "Bearer bob"}
    entry = client.post("/v1/schemas", json={"regex": "[a-z]+"}, headers=alice).json()
    assert client.get(f"/v1/schemas/{entry['id']}", headers=alice).status_code == 200
    assert client.get(f"/v1/schemas/{entry['id']}", headers=bob).status_code == 404
    assert client.get("/v1/schemas", headers=bob).json()["data"] == []
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    assert client.post("/v1/chat/completions", json=body, headers=alice).status_code == 200
    assert client.post("/v1/chat/completions", json=body, headers=bob).status_code == 200
    ns = [r.namespace for r in fake_engine.submitted]
    assert ns == [tenant_id("alice"), tenant_id("bob")]


def test_health_and_metrics_stay_open(gateway_client):
    client = gateway_client(api_keys=["k"])
    assert client.get("/health").status_code == 200 and client.get("/metrics").status_code == 200
    assert client.get("/v1/models").status_code == 401
    assert client.get("/v1/models", headers={"authorization": "Bearer k"}).status_code == 200
